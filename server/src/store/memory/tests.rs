use crate::store::conformance;
use crate::store::{InMemoryStore, SledOptions, SledStore, Store, WriteBatch};

#[test]
fn scans_are_ordered_bounded_and_resumable() {
    conformance::scans_are_ordered_bounded_and_resumable(&InMemoryStore::new());
}

#[test]
fn a_batch_applies_its_writes_in_order() {
    conformance::a_batch_applies_its_writes_in_order(&InMemoryStore::new());
}

#[tokio::test]
async fn an_oversized_value_rejects_the_whole_batch() {
    conformance::an_oversized_value_rejects_the_whole_batch(&InMemoryStore::new()).await;
}

#[test]
fn a_backup_is_a_sled_store_with_the_same_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = InMemoryStore::new();
    let mut batch = WriteBatch::new();
    batch
        .put(b"a".to_vec(), b"1".to_vec())
        .put(b"b".to_vec(), b"2".to_vec());
    store.commit_blocking(batch).expect("commit");

    let target = dir.path().join("backup");
    store.backup_to(&target).expect("backup");
    let restored = SledStore::open(&target, SledOptions::default()).expect("open backup");
    assert_eq!(
        restored.scan(b"", None, 10).expect("scan"),
        store.scan(b"", None, 10).expect("scan")
    );
}
