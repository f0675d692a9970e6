//! Persistence: a narrow key-value [`Store`] trait and its backends.
//!
//! The trait has no backend types in it, so that the embedded sled backend
//! ([`SledStore`]) can later be joined by a distributed one. Engine tests use
//! [`InMemoryStore`]. The key layout lives in [`keys`]; schema migrations are
//! applied by [`open_and_migrate`].
//!
//! Every commit is atomic. A commit is acknowledged only once durable: for
//! sled that means applied, flushed *and* fsynced by the group-commit writer.

mod batch;
mod chunked;
mod commit;
pub mod conformance;
mod copy;
mod error;
pub mod etcd;
#[cfg(test)]
pub mod failing;
pub mod keys;
mod memory;
mod migrate;
mod sled_files;
mod sled_garbage;
mod sled_store;
mod writer;

use std::path::Path;

pub use batch::{Fence, MAX_VALUE_BYTES, Write, WriteBatch};
pub use chunked::{ChunkedValues, MAX_CHUNKED_VALUE_BYTES};
pub use commit::CommitHandle;
pub use copy::{CopyError, copy_store};
pub use error::StoreError;
pub use etcd::{EtcdOptions, EtcdStore};
pub use memory::InMemoryStore;
pub use migrate::{
    MigrationAdapter, MigrationReport, migrate, open_and_migrate, open_and_migrate_etcd,
    takes_backup,
};
pub(crate) use sled_files::sled_dir;
pub use sled_store::{SledOptions, SledStore};
pub use writer::CommitStats;

/// A key and its value, as scans return them.
pub type Record = (Vec<u8>, Vec<u8>);

/// A key-value store with ordered prefix scans and atomic, durable batches.
///
/// Implementations must reject a batch holding a value over
/// [`MAX_VALUE_BYTES`] as a whole, and must acknowledge a commit only once it
/// survives a power loss.
pub trait Store: Send + Sync + 'static {
    /// Reads one key.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// Keys starting with `prefix`, in key order, strictly after `start_after`
    /// when given, at most `limit` of them, with their values.
    fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError>;

    /// The keys of [`scan`](Store::scan), without their values: a scan
    /// that cannot fail on a value it cannot read back (a chunked value
    /// with a chunk missing), for whoever must reach every key whatever
    /// it holds (purging a tenant, diagnosing damaged records).
    fn scan_keys(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        Ok(self
            .scan(prefix, start_after, limit)?
            .into_iter()
            .map(|(key, _)| key)
            .collect())
    }

    /// Queues a batch for the group-commit writer. The batch is applied
    /// atomically; the handle resolves once it is durable or has failed.
    /// Dropping the handle does not cancel the commit.
    fn commit(&self, batch: WriteBatch) -> CommitHandle;

    /// Blocking variant of [`commit`](Store::commit) for start-up code and
    /// tools. It blocks the calling thread: do not call it on an async runtime
    /// thread (use `spawn_blocking`).
    fn commit_blocking(&self, batch: WriteBatch) -> Result<(), StoreError>;

    /// Writes a consistent copy of the whole store into `path`, which must not
    /// exist yet (a backup before migrations). For the sled backends the copy
    /// is itself a store directory that [`SledStore::open`] can open.
    fn backup_to(&self, path: &Path) -> Result<(), StoreError>;

    /// Approximate size on disk in bytes (for metrics).
    fn size_on_disk(&self) -> Result<u64, StoreError>;

    /// The largest value a commit may hold.
    fn max_value_bytes(&self) -> usize {
        MAX_VALUE_BYTES
    }

    /// The most writes a commit can apply in one step, when the backend
    /// has such a bound (etcd's operations per transaction). A larger
    /// commit is still atomic, but costs several round trips: writers
    /// that may choose how much to commit at once stay below it.
    fn writes_per_step(&self) -> Option<usize> {
        None
    }
}

/// A shared store is a store (so that one backend can be wrapped, e.g. by
/// [`ChunkedValues`], and still be used directly elsewhere).
impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        (**self).get(key)
    }

    fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        (**self).scan(prefix, start_after, limit)
    }

    fn scan_keys(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        (**self).scan_keys(prefix, start_after, limit)
    }

    fn commit(&self, batch: WriteBatch) -> CommitHandle {
        (**self).commit(batch)
    }

    fn commit_blocking(&self, batch: WriteBatch) -> Result<(), StoreError> {
        (**self).commit_blocking(batch)
    }

    fn backup_to(&self, path: &Path) -> Result<(), StoreError> {
        (**self).backup_to(path)
    }

    fn size_on_disk(&self) -> Result<u64, StoreError> {
        (**self).size_on_disk()
    }

    fn max_value_bytes(&self) -> usize {
        (**self).max_value_bytes()
    }

    fn writes_per_step(&self) -> Option<usize> {
        (**self).writes_per_step()
    }
}

/// Where a [`Store::scan`] of `prefix` starts: just after `start_after` when
/// it lies at or after the prefix, else at the prefix itself.
pub(crate) fn scan_start<'a>(
    prefix: &'a [u8],
    start_after: Option<&'a [u8]>,
) -> std::ops::Bound<&'a [u8]> {
    match start_after {
        Some(after) if after >= prefix => std::ops::Bound::Excluded(after),
        _ => std::ops::Bound::Included(prefix),
    }
}
