//! Behaviour every [`Store`] must show, run against each backend's tests
//! (the etcd backend's from the tests crate, against a real etcd).
//! Each check expects an empty store and panics on a violation.

use crate::store::{MAX_VALUE_BYTES, Store, StoreError, WriteBatch};

fn keys(records: &[(Vec<u8>, Vec<u8>)]) -> Vec<&[u8]> {
    records.iter().map(|(key, _)| key.as_slice()).collect()
}

/// Scans honour prefix bounds, key order, `start_after` and `limit`.
pub fn scans_are_ordered_bounded_and_resumable(store: &dyn Store) {
    let mut batch = WriteBatch::new();
    for key in [
        &b"b/2"[..],
        b"a",
        b"b/10",
        b"b/1",
        b"b",
        b"b0",
        b"c",
        b"b/\xff",
        b"b/",
    ] {
        batch.put(key, b"v".to_vec());
    }
    store.commit_blocking(batch).expect("commit");

    let all = store.scan(b"b/", None, 100).expect("scan");
    assert_eq!(keys(&all), [&b"b/"[..], b"b/1", b"b/10", b"b/2", b"b/\xff"]);
    let first_two = store.scan(b"b/", None, 2).expect("scan");
    assert_eq!(keys(&first_two), [&b"b/"[..], b"b/1"]);
    let resumed = store.scan(b"b/", Some(b"b/1"), 2).expect("scan");
    assert_eq!(keys(&resumed), [&b"b/10"[..], b"b/2"]);
    let after_absent_key = store.scan(b"b/", Some(b"b/15"), 100).expect("scan");
    assert_eq!(keys(&after_absent_key), [&b"b/2"[..], b"b/\xff"]);
    assert!(
        store
            .scan(b"b/", Some(b"b/\xff"), 100)
            .expect("scan")
            .is_empty()
    );
    assert!(store.scan(b"b/", Some(b"c"), 100).expect("scan").is_empty());
    assert_eq!(
        keys(&store.scan(b"b/", Some(b"a"), 1).expect("scan")),
        [&b"b/"[..]]
    );
    assert!(store.scan(b"b/", None, 0).expect("scan").is_empty());
    assert!(store.scan(b"zz", None, 10).expect("scan").is_empty());
    assert_eq!(store.scan(b"", None, 100).expect("scan").len(), 9);
}

/// A batch applies in order (the later write to a key wins), deletes
/// included.
pub fn a_batch_applies_its_writes_in_order(store: &dyn Store) {
    let mut first = WriteBatch::new();
    first
        .put(b"k1".to_vec(), b"old".to_vec())
        .put(b"k2".to_vec(), b"gone soon".to_vec());
    store.commit_blocking(first).expect("commit");

    let mut second = WriteBatch::new();
    second
        .put(b"k1".to_vec(), b"new".to_vec())
        .delete(b"k2".to_vec())
        .put(b"k3".to_vec(), b"x".to_vec());
    second
        .put(b"k4".to_vec(), b"put then deleted".to_vec())
        .delete(b"k4".to_vec());
    second
        .delete(b"k5".to_vec())
        .put(b"k5".to_vec(), b"deleted then put".to_vec());
    store.commit_blocking(second).expect("commit");

    assert_eq!(store.get(b"k1").expect("get"), Some(b"new".to_vec()));
    assert_eq!(store.get(b"k2").expect("get"), None);
    assert_eq!(store.get(b"k3").expect("get"), Some(b"x".to_vec()));
    assert_eq!(store.get(b"k4").expect("get"), None);
    assert_eq!(
        store.get(b"k5").expect("get"),
        Some(b"deleted then put".to_vec())
    );
}

/// A batch holding one value over the limit is rejected whole; a value of
/// exactly the limit is accepted.
pub async fn an_oversized_value_rejects_the_whole_batch(store: &dyn Store) {
    let mut batch = WriteBatch::new();
    batch
        .put(b"small".to_vec(), b"fits".to_vec())
        .put(b"big".to_vec(), vec![0; MAX_VALUE_BYTES + 1]);

    let err = store.commit(batch.clone()).await.expect_err("too large");
    assert!(
        matches!(err, StoreError::ValueTooLarge { size, .. } if size == MAX_VALUE_BYTES + 1),
        "{err}"
    );
    assert!(err.to_string().contains("split the record"), "{err}");
    let err = store.commit_blocking(batch).expect_err("too large");
    assert!(matches!(err, StoreError::ValueTooLarge { .. }));
    assert_eq!(store.get(b"small").expect("get"), None);
    assert_eq!(store.get(b"big").expect("get"), None);

    let mut at_limit = WriteBatch::new();
    at_limit.put(b"big".to_vec(), vec![7; MAX_VALUE_BYTES]);
    store
        .commit(at_limit)
        .await
        .expect("a value of exactly the limit fits");
    assert_eq!(
        store.get(b"big").expect("get").map(|v| v.len()),
        Some(MAX_VALUE_BYTES)
    );
}

/// Commits queued together apply in queue order: the later commit of a
/// key wins, whatever else the store applies meanwhile; an empty commit
/// queued last resolves once every earlier one is applied.
pub async fn commits_queued_together_apply_in_queue_order(store: &dyn Store) {
    const COMMITS: usize = 300;
    const SHARED_KEYS: usize = 7;
    let mut handles = Vec::new();
    for index in 0..COMMITS {
        let mut batch = WriteBatch::new();
        batch
            .put(
                format!("shared/{}", index % SHARED_KEYS).into_bytes(),
                index.to_string().into_bytes(),
            )
            .put(format!("own/{index:04}").into_bytes(), b"x".to_vec());
        handles.push(store.commit(batch));
    }
    let flushed = store.commit(WriteBatch::new());
    flushed.await.expect("the empty commit resolves");
    for index in COMMITS - 20..COMMITS {
        assert_eq!(
            store
                .get(format!("own/{index:04}").as_bytes())
                .expect("get"),
            Some(b"x".to_vec()),
            "commit {index} is applied when the later empty commit resolves"
        );
    }
    for handle in handles {
        handle.await.expect("every commit is applied");
    }
    for key in 0..SHARED_KEYS {
        let last = (0..COMMITS).rev().find(|index| index % SHARED_KEYS == key);
        assert_eq!(
            store.get(format!("shared/{key}").as_bytes()).expect("get"),
            last.map(|index| index.to_string().into_bytes()),
            "the last commit of shared/{key} wins"
        );
    }
}

/// Runs every check above, each on a fresh empty store from `fresh`.
pub async fn check_store(fresh: &dyn Fn() -> Box<dyn Store>) {
    scans_are_ordered_bounded_and_resumable(&*fresh());
    a_batch_applies_its_writes_in_order(&*fresh());
    an_oversized_value_rejects_the_whole_batch(&*fresh()).await;
    commits_queued_together_apply_in_queue_order(&*fresh()).await;
}
