//! The store frees the records a large batch replaces: a store rewritten
//! with large batches keeps its memory. A test binary of its own, since it
//! measures the memory of its process.

use reconciled::process_memory::status_bytes;
use reconciled::store::{SledOptions, SledStore, Store as _, WriteBatch};

/// Records per batch: as many as a 10,000-item SubmitIntent writes.
const RECORDS: usize = 10_000;
/// Batches after the warm-up.
const ROUNDS: usize = 20;
/// How much the process may grow over those batches. Before the store
/// freed what each batch replaced, sled kept the replaced nodes until its
/// epochs caught up, which a few pins a batch never did: about 1.7 KB per
/// record written, some 300 MiB here.
const MEMORY_BOUND: u64 = 48 * 1024 * 1024;

/// The process's resident memory, in bytes.
fn resident_bytes() -> u64 {
    status_bytes("/proc/self/status", "VmRSS").expect("this process's resident memory reads")
}

/// A batch rewriting every record with a value of `round`.
fn rewrite(round: usize) -> WriteBatch {
    let mut batch = WriteBatch::new();
    for index in 0..RECORDS {
        let key = format!("t/0001/items/svc/item-{index:05}");
        let value = format!("{{\"round\":{round},\"padding\":\"{:0>120}\"}}", index);
        batch.put(key, value);
    }
    batch
}

#[test]
fn rewriting_a_store_with_large_batches_keeps_its_memory() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let options = SledOptions {
        fsync: false,
        ..SledOptions::default()
    };
    let store = SledStore::open(dir.path(), options).expect("the store opens");
    // sled's cache and the allocator's pools fill on the first batches.
    for round in 0..3 {
        store.commit_blocking(rewrite(round)).expect("commits");
    }
    let before = resident_bytes();
    for round in 3..3 + ROUNDS {
        store.commit_blocking(rewrite(round)).expect("commits");
    }
    let after = resident_bytes();
    let growth = after.saturating_sub(before);
    eprintln!(
        "resident {} MiB before, {} MiB after {ROUNDS} batches of {RECORDS} records",
        before >> 20,
        after >> 20
    );
    assert!(
        growth < MEMORY_BOUND,
        "the process grew by {} MiB over {ROUNDS} batches of {RECORDS} records",
        growth >> 20
    );
}
