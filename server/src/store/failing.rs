//! A store for unit tests whose commits can be made to fail.

use crate::store::{InMemoryStore, Store};

/// A store whose commits can be made to fail, counting attempts and
/// noting the largest commit; `writes_per_step` is what it reports of
/// itself (as etcd reports its operations per transaction).
#[derive(Debug, Default)]
pub struct FailingStore {
    /// Where commits that do not fail go.
    pub inner: InMemoryStore,
    /// While set, every commit fails (as a closed store).
    pub failing: std::sync::atomic::AtomicBool,
    /// Commits tried.
    pub attempts: std::sync::atomic::AtomicUsize,
    /// Writes in the largest commit tried.
    pub largest: std::sync::atomic::AtomicUsize,
    /// What it reports as [`Store::writes_per_step`].
    pub writes_per_step: Option<usize>,
}

impl Store for FailingStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, crate::store::StoreError> {
        self.inner.get(key)
    }
    fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<crate::store::Record>, crate::store::StoreError> {
        self.inner.scan(prefix, start_after, limit)
    }
    fn commit(&self, batch: crate::store::WriteBatch) -> crate::store::CommitHandle {
        crate::store::CommitHandle::ready(self.commit_blocking(batch))
    }
    fn commit_blocking(
        &self,
        batch: crate::store::WriteBatch,
    ) -> Result<(), crate::store::StoreError> {
        use std::sync::atomic::Ordering;
        self.attempts.fetch_add(1, Ordering::SeqCst);
        self.largest
            .fetch_max(batch.writes().len(), Ordering::SeqCst);
        if self.failing.load(Ordering::SeqCst) {
            Err(crate::store::StoreError::Closed)
        } else {
            self.inner.commit_blocking(batch)
        }
    }
    fn backup_to(&self, path: &std::path::Path) -> Result<(), crate::store::StoreError> {
        self.inner.backup_to(path)
    }
    fn size_on_disk(&self) -> Result<u64, crate::store::StoreError> {
        self.inner.size_on_disk()
    }
    fn writes_per_step(&self) -> Option<usize> {
        self.writes_per_step
    }
}
