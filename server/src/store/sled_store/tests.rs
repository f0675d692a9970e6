use std::path::Path;
use std::sync::Arc;

use crate::store::conformance;
use crate::store::{CommitStats, SledOptions, SledStore, Store, StoreError, WriteBatch};

fn open(dir: &Path) -> SledStore {
    SledStore::open(
        dir,
        SledOptions {
            cache_capacity_bytes: 16 << 20,
            ..SledOptions::default()
        },
    )
    .expect("open store")
}

/// Opens a store that another handle just closed. sled releases its file
/// lock from a background thread shortly after the last handle is dropped,
/// so the first attempts may find it still locked.
fn open_once_released(dir: &Path) -> SledStore {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match SledStore::open(
            dir,
            SledOptions {
                cache_capacity_bytes: 16 << 20,
                ..SledOptions::default()
            },
        ) {
            Ok(store) => return store,
            Err(error)
                if error.to_string().contains("lock") && std::time::Instant::now() < deadline =>
            {
                std::thread::yield_now();
            }
            Err(error) => panic!("open store: {error}"),
        }
    }
}

fn one_put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> WriteBatch {
    let mut batch = WriteBatch::new();
    batch.put(key, value);
    batch
}

#[test]
fn scans_are_ordered_bounded_and_resumable() {
    let dir = tempfile::tempdir().expect("tempdir");
    conformance::scans_are_ordered_bounded_and_resumable(&open(dir.path()));
}

#[test]
fn a_batch_applies_its_writes_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    conformance::a_batch_applies_its_writes_in_order(&open(dir.path()));
}

#[tokio::test]
async fn commits_queued_together_apply_in_queue_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    conformance::commits_queued_together_apply_in_queue_order(&open(dir.path())).await;
}

#[tokio::test]
async fn an_oversized_value_rejects_the_whole_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    conformance::an_oversized_value_rejects_the_whole_batch(&store).await;
    assert_eq!(
        store.commit_stats().commits,
        1,
        "only the batch at the limit reached the writer"
    );
}

#[tokio::test]
async fn a_batch_is_applied_as_one_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let mut batch = WriteBatch::new();
    for i in 0..500u32 {
        batch.put(i.to_be_bytes(), vec![1; 100]);
    }
    store.commit(batch).await.expect("commit");
    assert_eq!(store.scan(b"", None, 1000).expect("scan").len(), 500);
    assert_eq!(
        store.commit_stats(),
        CommitStats {
            commits: 1,
            writes: 500,
            flushes: 1
        }
    );
}

#[tokio::test]
async fn concurrent_commits_share_flushes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(open(dir.path()));
    let threads: Vec<_> = (0..4u32)
        .map(|thread| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                (0..50u32)
                    .map(|i| {
                        store.commit(one_put(
                            [thread.to_be_bytes(), i.to_be_bytes()].concat(),
                            b"v".to_vec(),
                        ))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for thread in threads {
        for handle in thread.join().expect("thread") {
            handle.await.expect("commit");
        }
    }

    let stats = store.commit_stats();
    assert_eq!((stats.commits, stats.writes), (200, 200));
    assert!(
        stats.flushes < 50,
        "200 commits took {} flushes",
        stats.flushes
    );
    assert_eq!(store.scan(b"", None, 1000).expect("scan").len(), 200);
}

#[tokio::test]
async fn a_group_holds_at_most_max_commit_items_but_a_larger_batch_stays_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = SledOptions {
        cache_capacity_bytes: 16 << 20,
        max_commit_items: 10,
        fsync: false,
    };
    let store = SledStore::open(dir.path(), options).expect("open");
    let mut large = WriteBatch::new();
    for i in 0..25u32 {
        large.put(i.to_be_bytes(), b"large".to_vec());
    }
    let mut handles = vec![store.commit(large)];
    handles
        .extend((100..140u32).map(|i| store.commit(one_put(i.to_be_bytes(), b"small".to_vec()))));
    for handle in handles {
        handle.await.expect("commit");
    }

    let stats = store.commit_stats();
    assert_eq!((stats.commits, stats.writes), (41, 65));
    // The large batch alone, then at least 4 groups of at most 10.
    assert!(stats.flushes >= 5, "{stats:?}");
}

#[test]
fn committed_data_survives_reopening() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = open(dir.path());
        store
            .commit_blocking(one_put(b"kept".to_vec(), b"yes".to_vec()))
            .expect("commit");
        let mut delete = WriteBatch::new();
        delete
            .delete(b"kept".to_vec())
            .put(b"kept2".to_vec(), b"also".to_vec());
        store.commit_blocking(delete).expect("commit");
    }
    let store = open(dir.path());
    assert_eq!(store.get(b"kept").expect("get"), None);
    assert_eq!(store.get(b"kept2").expect("get"), Some(b"also".to_vec()));
    assert!(
        dir.path().join("db").join("db").is_file(),
        "sled's log lives at <dir>/db/db"
    );
}

#[test]
fn a_backup_opens_as_a_store_with_the_same_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let mut batch = WriteBatch::new();
    for i in 0..50u32 {
        batch.put(i.to_be_bytes(), i.to_le_bytes());
    }
    store.commit_blocking(batch).expect("commit");
    let target = dir.path().join("backups").join("first");

    store.backup_to(&target).expect("backup");
    let copy = open_once_released(&target);
    assert_eq!(
        copy.scan(b"", None, 100).expect("scan"),
        store.scan(b"", None, 100).expect("scan")
    );

    let err = store.backup_to(&target).expect_err("target exists");
    assert!(matches!(err, StoreError::Backup { .. }), "{err}");
    assert!(err.to_string().contains("does not exist yet"), "{err}");
}

#[test]
fn a_second_open_of_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _store = open(dir.path());
    let err = SledStore::open(dir.path(), SledOptions::default()).expect_err("locked");
    assert!(matches!(err, StoreError::Open { .. }), "{err}");
}

#[test]
fn size_on_disk_grows_with_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let empty = store.size_on_disk().expect("size");
    let mut batch = WriteBatch::new();
    for i in 0..200u32 {
        batch.put(i.to_be_bytes(), vec![3; 1024]);
    }
    store.commit_blocking(batch).expect("commit");
    assert!(store.size_on_disk().expect("size") > empty);
}
