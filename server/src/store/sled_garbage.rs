//! Freeing what a large sled batch replaced, as the batch ends.
//!
//! sled frees the node versions an insert replaces through crossbeam's
//! epochs: each is deferred into a bag of 64, and a collection frees at
//! most 8 bags, once every 128 pins of a thread. `apply_batch` pins once
//! for the whole batch, so a 10,000-record commit leaves hundreds of bags,
//! and the pins that would free them come far slower than the server's
//! large commits: measured, the server's memory grew by about 17 MB per
//! 10,000-item SubmitIntent, to 2.4 GB within 25 seconds of one client,
//! and over half of its CPU went to the kernel handing it fresh pages.
//! Collecting after each commit, as many times as the commit can have
//! filled bags, frees them while they are few.

/// Records in a bag of crossbeam's (`MAX_OBJECTS`).
const BAG: usize = 64;
/// Bags one collection frees at most (`COLLECT_STEPS`).
const BAGS_PER_COLLECTION: usize = 8;
/// Deferred frees per record written to collect for: the replaced leaf,
/// and now and then the index nodes a split replaces. Too few would only
/// leave the rest to the collections after the next commit, which free
/// the oldest bags first.
const FREES_PER_WRITE: usize = 2;
/// Collections that advance the epoch far enough for the newest bags to
/// expire (two epochs) before any is freed.
const EPOCHS_TO_EXPIRE: usize = 2;

/// Frees the node versions a batch of `writes` records replaced (and what
/// earlier batches left), on the calling thread. A collection with nothing
/// to free is a pin and a look at the epoch.
pub(crate) fn collect_after(writes: usize) {
    let bags = (writes * FREES_PER_WRITE).div_ceil(BAG);
    let collections = EPOCHS_TO_EXPIRE + bags.div_ceil(BAGS_PER_COLLECTION);
    for _ in 0..collections {
        crossbeam_epoch::pin().flush();
    }
}
