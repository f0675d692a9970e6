//! The etcd store backend against real etcd: the store conformance checks,
//! atomic commits over etcd's limits, crash safety at every stage of a
//! staged commit, fences, and the cluster primitives.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reconciled::store::etcd::{CrashPoint, KeyEvent};
use reconciled::store::{EtcdOptions, EtcdStore, Fence, Store, StoreError, WriteBatch};
use reconciled_tests::etcd::EtcdCluster;

fn options(cluster: &EtcdCluster) -> EtcdOptions {
    EtcdOptions {
        endpoints: cluster.endpoints(),
        prefix: format!("/test-{:016x}/", rand::random::<u64>()),
        staging_lease: Duration::from_secs(2),
        marker_wait: Duration::from_millis(300),
        ..EtcdOptions::default()
    }
}

fn open(options: &EtcdOptions) -> EtcdStore {
    EtcdStore::open(options.clone()).expect("the store opens")
}

/// `count` puts of `size`-byte values tagged `tag`, under `prefix`.
fn big_batch(prefix: &[u8], count: u32, size: usize, tag: u8) -> WriteBatch {
    let mut batch = WriteBatch::new();
    for index in 0..count {
        let mut key = prefix.to_vec();
        key.extend_from_slice(&index.to_be_bytes());
        let mut value = vec![tag; size];
        value[..4].copy_from_slice(&index.to_be_bytes());
        batch.put(key, value);
    }
    batch
}

/// Every record under `prefix`, read page by page.
fn scan_all(store: &dyn Store, prefix: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut records: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    loop {
        let after = records.last().map(|(key, _)| key.clone());
        let page = store.scan(prefix, after.as_deref(), 1000).expect("scan");
        let done = page.len() < 1000;
        records.extend(page);
        if done {
            return records;
        }
    }
}

/// The store's own bookkeeping keys (staging, chunks, markers) left in etcd.
fn internal_keys(store: &EtcdStore) -> Vec<String> {
    let prefix = store.options().prefix.clone();
    store
        .raw_keys()
        .expect("raw keys")
        .into_iter()
        .map(|key| String::from_utf8_lossy(&key[prefix.len()..]).into_owned())
        .filter(|key| !key.starts_with("store/data/"))
        .collect()
}

#[tokio::test]
async fn the_etcd_store_passes_the_store_conformance_checks() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let fresh = || -> Box<dyn Store> { Box::new(open(&options(&etcd))) };
    // A current-thread runtime (this test's) calls the synchronous reads.
    reconciled::store::conformance::check_store(&fresh).await;
}

#[tokio::test]
async fn ten_thousand_writes_commit_atomically_as_one_staged_commit() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let options = options(&etcd);
    let store = Arc::new(open(&options));
    let before = big_batch(b"\x01i/", 10_000, 1024, 1);
    store.commit(before).await.expect("first version");
    assert!(
        internal_keys(&store).is_empty(),
        "{:?}",
        internal_keys(&store)
    );

    // A reader scanning all the while sees one version or the other, whole.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut scans = 0;
            while !stop.load(Ordering::SeqCst) {
                // One scan is one read (several pages are several reads).
                let records = store.scan(b"\x01i/", None, 10_000).expect("scan");
                let tags: std::collections::BTreeSet<u8> =
                    records.iter().map(|(_, value)| value[100]).collect();
                let whole = match records.len() {
                    10_000 => tags == [1].into(),
                    9_999 => tags == [2].into(),
                    _ => false,
                };
                assert!(
                    whole,
                    "a read saw half a commit: {} records, tags {tags:?}",
                    records.len()
                );
                scans += 1;
            }
            scans
        })
    };
    let mut after = big_batch(b"\x01i/", 10_000, 1024, 2);
    after.delete(b"\x01i/\x00\x00\x00\x00".to_vec());
    store.commit(after).await.expect("the large commit");
    stop.store(true, Ordering::SeqCst);
    let scans = reader.join().expect("the reader saw only whole commits");
    assert!(scans > 0);

    let records = scan_all(&*store, b"\x01i/");
    assert_eq!(records.len(), 9_999);
    assert!(records.iter().all(|(_, value)| value[100] == 2));
    assert!(
        internal_keys(&store).is_empty(),
        "{:?}",
        internal_keys(&store)
    );
}

/// Commits a staged batch in a store that "crashes" at `point`.
fn crash_during_a_large_commit(options: &EtcdOptions, point: CrashPoint) {
    let crashing = EtcdStore::open(EtcdOptions {
        crash_point: Some(point),
        ..options.clone()
    })
    .expect("opens");
    let error = crashing
        .commit_blocking(big_batch(b"\x01c/", 1_000, 2048, 7))
        .expect_err("the commit is cut off");
    assert!(matches!(error, StoreError::Closed), "{error}");
}

#[tokio::test]
async fn a_commit_cut_off_before_its_marker_is_never_seen_and_its_chunks_are_discarded_at_open_and_while_open()
 {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let options = options(&etcd);
    crash_during_a_large_commit(&options, CrashPoint::AfterStaging);

    let reopened = open(&options);
    assert!(scan_all(&reopened, b"").is_empty());
    // The writer's staging lease still runs: its chunks stay, unread.
    assert!(
        internal_keys(&reopened)
            .iter()
            .any(|k| k.starts_with("store/staged/"))
    );
    drop(reopened);

    // A store opened once that lease is over discards them at once.
    until_none_left("at open", || internal_keys(&open(&options))).await;

    // A store that stays open discards them too, once the lease is over,
    // without being opened again.
    let running = open(&options);
    crash_during_a_large_commit(&options, CrashPoint::AfterStaging);
    assert!(!internal_keys(&running).is_empty());
    until_none_left("by the open store", || internal_keys(&running)).await;
}

/// Waits up to 30 s until `left` lists no internal key; fails saying the
/// chunks were never discarded `how`.
async fn until_none_left(how: &str, mut left: impl FnMut() -> Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let keys = left();
        if keys.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "chunks never discarded {how}: {keys:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_commit_cut_off_after_its_marker_is_rolled_forward_when_the_store_opens() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    for point in [CrashPoint::AfterMarker, CrashPoint::DuringRollIn] {
        let options = options(&etcd);
        crash_during_a_large_commit(&options, point);
        let reopened = open(&options);
        let records = scan_all(&reopened, b"");
        assert_eq!(records.len(), 1_000, "{point:?}");
        assert!(
            records.iter().all(|(_, value)| value[100] == 7),
            "{point:?}"
        );
        assert!(internal_keys(&reopened).is_empty(), "{point:?}");
    }
}

#[tokio::test]
async fn a_reader_rolls_forward_a_marked_commit_whose_writer_died() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let options = options(&etcd);
    let reader = open(&options);
    crash_during_a_large_commit(&options, CrashPoint::AfterMarker);
    // The reader opened before the crash, so only its wait can finish it.
    assert_eq!(scan_all(&reader, b"").len(), 1_000);
    assert!(internal_keys(&reader).is_empty());
}

/// Claims `owners/t1` for "replica-a": the fence of its owner's commits.
async fn claim_t1(store: &EtcdStore) -> Fence {
    let claimed = store
        .put_if_absent(b"owners/t1", b"replica-a".to_vec(), None)
        .await
        .expect("claim")
        .expect("the key was free");
    Fence {
        key: b"owners/t1".to_vec(),
        mod_revision: claimed,
    }
}

#[tokio::test]
async fn a_commit_whose_fence_moved_on_is_refused_and_writes_nothing() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let options = options(&etcd);
    let store = open(&options);
    let fence = claim_t1(&store).await;
    let claimed = fence.mod_revision;
    let mut batch = WriteBatch::fenced(fence.clone());
    batch.put(b"\x01k".to_vec(), b"owned".to_vec());
    store.commit(batch).await.expect("the fence holds");

    // Another replica takes over: the key is deleted and claimed again.
    assert!(
        store
            .delete_if(b"owners/t1", claimed)
            .await
            .expect("release")
    );
    store
        .put_if_absent(b"owners/t1", b"replica-b".to_vec(), None)
        .await
        .expect("claim")
        .expect("free again");

    // A small commit, and an unfenced one queued with it.
    let mut stale = WriteBatch::fenced(fence.clone());
    stale.put(b"\x01k".to_vec(), b"stale".to_vec());
    let mut other = WriteBatch::new();
    other.put(b"\x01other".to_vec(), b"fine".to_vec());
    let (stale, other) = (store.commit(stale), store.commit(other));
    let error = stale.await.expect_err("refused");
    assert!(
        matches!(error, StoreError::Fenced { expected, .. } if expected == claimed),
        "{error}"
    );
    other
        .await
        .expect("an unfenced commit in the same group applies");

    // A staged commit: refused at its marker, its chunks gone.
    let mut large = big_batch(b"\x01big/", 500, 4096, 3);
    large.set_fence(Some(fence));
    let error = store.commit(large).await.expect_err("refused");
    assert!(matches!(error, StoreError::Fenced { .. }), "{error}");

    assert_eq!(store.get(b"\x01k").expect("get"), Some(b"owned".to_vec()));
    assert_eq!(
        store.get(b"\x01other").expect("get"),
        Some(b"fine".to_vec())
    );
    assert!(scan_all(&store, b"\x01big/").is_empty());
    assert!(
        internal_keys(&store)
            .iter()
            .all(|k| k.starts_with("owners/"))
    );
}

/// How many times etcd has written `key` of `store` since it was created
/// (etcd's own version of the key; 0: absent).
async fn etcd_writes_of(cluster: &EtcdCluster, store: &EtcdStore, key: &[u8]) -> i64 {
    let mut client = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("connect to etcd");
    let mut etcd_key = format!("{}store/data/", store.options().prefix).into_bytes();
    etcd_key.extend_from_slice(key);
    let reply = client.get(etcd_key, None).await.expect("get");
    reply.kvs().first().map_or(0, |kv| kv.version())
}

#[tokio::test]
async fn a_commit_sent_again_lands_once_and_never_over_a_later_commit() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let mut options = options(&etcd);
    // Every transaction is sent twice at once (the first answer lost) and
    // once more after the next commit has landed, as a retry may at worst.
    options.resend_commits = true;
    let store = open(&options);
    let fence = claim_t1(&store).await;
    let mut seed = WriteBatch::new();
    seed.put(b"\x01gone".to_vec(), b"here".to_vec());
    store.commit(seed).await.expect("commit");

    for round in 1..=6u8 {
        let mut batch = if round % 2 == 0 {
            WriteBatch::fenced(fence.clone())
        } else {
            WriteBatch::new()
        };
        batch.put(b"\x01k".to_vec(), vec![round]);
        match round {
            3 => {
                batch.delete(b"\x01gone".to_vec());
            }
            4 => {
                batch.put(b"\x01gone".to_vec(), b"back".to_vec());
            }
            _ => {}
        }
        store.commit(batch).await.expect("commit");
        // The previous commit's transaction has just been sent again: it
        // must not have overwritten this one's value.
        assert_eq!(
            store.get(b"\x01k").expect("get"),
            Some(vec![round]),
            "after commit {round}"
        );
    }
    // The delete of commit 3, sent again after commit 4, did not take the
    // key commit 4 put back; and every commit wrote its keys once.
    assert_eq!(store.get(b"\x01gone").expect("get"), Some(b"back".to_vec()));
    assert_eq!(etcd_writes_of(&etcd, &store, b"\x01k").await, 6);
}

/// etcd keeps no revision for a deleted key, so "last written below the
/// revision this store had seen" alone let a held-back attempt put back a
/// key that a later commit deleted (docs/scale-out.md, Fencing).
#[tokio::test]
async fn a_commit_held_back_past_a_later_delete_does_not_put_its_key_back() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let mut options = options(&etcd);
    options.resend_commits = true;
    let store = open(&options);
    let fence = claim_t1(&store).await;

    let mut put = WriteBatch::fenced(fence.clone());
    put.put(b"\x01journal/1".to_vec(), b"entry".to_vec());
    store.commit(put).await.expect("commit");
    let mut delete = WriteBatch::fenced(fence.clone());
    delete.delete(b"\x01journal/1".to_vec());
    store.commit(delete).await.expect("commit");
    // The put's first attempt has just been sent again.
    assert_eq!(store.get(b"\x01journal/1").expect("get"), None);
}

/// The same for a staged commit's roll-in transaction, held back past a
/// later commit that deleted one of the keys it rolled in.
#[tokio::test]
async fn a_roll_in_held_back_past_a_later_delete_does_not_put_its_key_back() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let mut options = options(&etcd);
    options.resend_commits = true;
    let store = open(&options);
    let fence = claim_t1(&store).await;
    let large = big_batch(b"\x01big/", 500, 4096, 3);
    store.commit(large).await.expect("staged commit");
    let first_key = b"\x01big/\x00\x00\x00\x00".to_vec();
    let mut delete = WriteBatch::fenced(fence);
    delete.delete(first_key.clone());
    store.commit(delete).await.expect("commit");
    assert!(
        store.get(&first_key).expect("get").is_none(),
        "the roll-in sent again put back a key a later commit deleted"
    );
    assert_eq!(scan_all(&store, b"\x01big/").len(), 499);
}

#[tokio::test]
async fn a_commit_over_a_key_another_store_wrote_since_still_lands() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let options = options(&etcd);
    let (ours, theirs) = (open(&options), open(&options));
    let put = |value: &[u8]| {
        let mut batch = WriteBatch::new();
        batch.put(b"\x01k".to_vec(), value.to_vec());
        batch
    };
    ours.commit(put(b"ours 1")).await.expect("commit");
    // A write this store has not seen: its next commit's compare on the
    // key fails, the key holds something else, so it is sent again.
    theirs.commit(put(b"theirs")).await.expect("commit");
    ours.commit(put(b"ours 2")).await.expect("commit");
    assert_eq!(ours.get(b"\x01k").expect("get"), Some(b"ours 2".to_vec()));
    assert_eq!(etcd_writes_of(&etcd, &ours, b"\x01k").await, 3);
}

#[tokio::test]
async fn leases_claims_and_watches_work_as_the_cluster_needs_them() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let store = open(&options(&etcd));
    let lease = store
        .grant_lease(Duration::from_secs(5))
        .await
        .expect("lease");
    let (_, start) = store.get_versioned(b"members/a").await.expect("read");
    let mut events = store
        .watch_prefix(b"members/", start + 1)
        .await
        .expect("watch");

    let created = store
        .put_if_absent(b"members/a", b"127.0.0.1:1".to_vec(), Some(lease))
        .await
        .expect("put")
        .expect("created");
    assert_eq!(
        store
            .put_if_absent(b"members/a", b"127.0.0.1:2".to_vec(), None)
            .await
            .expect("put"),
        None,
        "a claimed key is not claimed twice"
    );
    let (found, _) = store.get_versioned(b"members/a").await.expect("read");
    let found = found.expect("present");
    assert_eq!((found.mod_revision, found.lease), (created, lease.0));
    assert!(store.keep_lease_alive(lease).await.expect("renewed") > Duration::ZERO);
    let (listed, _) = store.list_versioned(b"members/").await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].0, b"members/a");

    store.revoke_lease(lease).await.expect("revoke");
    assert_eq!(
        next(&mut events).await,
        KeyEvent::Put {
            key: b"members/a".to_vec(),
            value: b"127.0.0.1:1".to_vec(),
            mod_revision: created,
            lease: lease.0,
        }
    );
    assert!(matches!(next(&mut events).await, KeyEvent::Delete { key, .. } if key == b"members/a"));
    assert_eq!(
        store.get_versioned(b"members/a").await.expect("read").0,
        None
    );
    assert!(
        store.keep_lease_alive(lease).await.is_err(),
        "a revoked lease is gone"
    );
    assert!(
        store
            .put_if_absent(b"store/data/x", Vec::new(), None)
            .await
            .is_err()
    );
}

async fn next(events: &mut tokio::sync::mpsc::Receiver<Result<KeyEvent, StoreError>>) -> KeyEvent {
    tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("an event in time")
        .expect("the watch runs")
        .expect("no watch error")
}

#[tokio::test]
async fn a_three_member_cluster_keeps_committing_when_one_member_dies() {
    let mut etcd = EtcdCluster::three().await.expect("etcd starts");
    let fresh = || -> Box<dyn Store> { Box::new(open(&options(&etcd))) };
    reconciled::store::conformance::check_store(&fresh).await;

    let options = options(&etcd);
    let store = open(&options);
    store
        .commit(big_batch(b"\x01a/", 2_000, 1024, 1))
        .await
        .expect("a staged commit");
    etcd.kill_member(0).expect("kill");
    store
        .commit(big_batch(b"\x01b/", 2_000, 1024, 2))
        .await
        .expect("a staged commit with two members of three");
    assert_eq!(scan_all(&store, b"\x01").len(), 4_000);
}

/// The fleet-wide tenant catalog, after `Catalog::catch_up`, holds every
/// tenant etcd acknowledged before the call: what lets any replica accept
/// a token created through another one a moment ago (docs/scale-out.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_catalog_catches_up_with_what_etcd_acknowledged() {
    use reconciled::auth::{TokenDirectory as _, TokenHash};
    use reconciled::cluster::{Catalog, TenantEntry};
    use reconciled::store::keys;
    use reconciled_client::agent::CancellationToken;

    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let options = options(&etcd);
    let watched = Arc::new(open(&options));
    let writer = Arc::new(open(&options));
    let stop = CancellationToken::new();
    let catalog = Catalog::start(watched.clone(), stop.clone())
        .await
        .expect("the catalog loads");
    let mut known_before_catching_up = 0;
    for id in 1..=20u64 {
        let name = format!("t{id}");
        let hash = TokenHash::of(&format!("token-{id}"));
        let entry = TenantEntry {
            id,
            token_hash: hash
                .as_bytes()
                .iter()
                .map(|byte| format!("{byte:02x}"))
                .collect(),
            created_at_ms: 1,
            limits: Default::default(),
            conditions: Vec::new(),
            conditions_changed_ms: 1,
            quarantine_error: String::new(),
        };
        let mut batch = WriteBatch::new();
        batch.put(keys::tenant_name_key(&name), id.to_be_bytes().to_vec());
        batch.put(keys::tenant_entry_key(&name), entry.encode());
        // Every other time, a write elsewhere after it: etcd's revision
        // then passes the tenant's, and the catalog's watches see no change
        // at it; the catch-up waits for the tenant's own writes.
        let elsewhere = (id % 2 == 1).then(|| {
            let mut elsewhere = WriteBatch::new();
            elsewhere.put(b"elsewhere".to_vec(), id.to_be_bytes().to_vec());
            elsewhere
        });
        let committing = writer.clone();
        tokio::task::spawn_blocking(move || {
            committing.commit_blocking(batch)?;
            elsewhere.map_or(Ok(()), |elsewhere| committing.commit_blocking(elsewhere))
        })
        .await
        .expect("the commit thread")
        .expect("the tenant and the other record are written");
        if catalog.tenant_by_token_hash(hash.as_bytes()).is_some() {
            known_before_catching_up += 1;
        }
        assert!(
            catalog.catch_up(&watched, Duration::from_secs(5)).await,
            "the catalog catches up within 5 s"
        );
        assert_eq!(
            catalog.tenant_by_token_hash(hash.as_bytes()),
            Some(id),
            "{name}'s token is known once the catalog has caught up"
        );
    }
    // How often the watch alone had delivered the tenant by then (the race
    // the catch-up closes).
    println!("known before catching up: {known_before_catching_up} of 20");
    stop.cancel();
}

/// A quarantined tenant's deletion commits under the claim the replica
/// quarantined it under. A replica that lost that claim (paused past its
/// lease while another replica took the tenant over) writes nothing: the
/// name it would free may belong to another tenant by then. With the
/// claim held, the deletion frees the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_quarantined_tenant_writes_nothing_once_its_claim_moved_on() {
    use reconciled::store::keys;
    use reconciled::tenant::{OwnerSettings, TenantDirectory, TenantError};

    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let etcd_store = Arc::new(open(&options(&etcd)));
    let store: Arc<dyn Store> = etcd_store.clone();
    let directory = TenantDirectory::empty(store.clone(), OwnerSettings::default());
    let unreadable = TenantError::Corrupt {
        key: String::from("tenants/7"),
        message: String::from("torn record"),
    };
    let name_key = keys::tenant_name_key("bad");
    let mut batch = WriteBatch::new();
    batch.put(name_key.clone(), b"7".to_vec());
    store
        .commit(batch)
        .await
        .expect("the name index is written");
    let owner_key = b"owners/7".to_vec();
    let claim = |replica: &'static str| {
        let etcd_store = etcd_store.clone();
        let owner_key = owner_key.clone();
        async move {
            let revision = etcd_store
                .put_if_absent(&owner_key, replica.as_bytes().to_vec(), None)
                .await
                .expect("claim")
                .expect("the key was free");
            Fence {
                key: owner_key,
                mod_revision: revision,
            }
        }
    };

    // Replica A quarantined the tenant under its claim; the claim moved
    // on to replica B before A carries out a DeleteTenant.
    let lost = claim("replica-a").await;
    directory.quarantine("bad".into(), 7, &unreadable, Some(lost.clone()));
    assert!(
        etcd_store
            .delete_if(&owner_key, lost.mod_revision)
            .await
            .expect("release")
    );
    let held = claim("replica-b").await;
    let refused = directory
        .delete("bad")
        .await
        .expect_err("a replica that lost the claim deletes nothing");
    assert!(
        refused.to_string().contains("fence key"),
        "refused as fenced out: {refused}"
    );
    assert_eq!(
        store.get(&name_key).expect("reads"),
        Some(b"7".to_vec()),
        "the name is not freed"
    );
    assert!(store.get(&keys::purge_key(7)).expect("reads").is_none());

    // The replica that holds the claim deletes it.
    directory.quarantine("bad".into(), 7, &unreadable, Some(held));
    directory
        .delete("bad")
        .await
        .expect("deleted under the claim");
    assert_eq!(
        store.get(&name_key).expect("reads"),
        None,
        "the name is free"
    );
    assert!(directory.quarantined("bad").is_none());
    directory.shutdown().await;
}
