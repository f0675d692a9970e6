//! An in-memory [`Store`] for engine unit tests.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::store::sled_files::write_new_store;
use crate::store::{CommitHandle, Record, Store, StoreError, Write, WriteBatch};

/// A [`Store`] in a `BTreeMap` behind a mutex: commits apply at once and are
/// "durable" for the life of the value. Same limits as the real stores.
#[derive(Debug, Default)]
pub struct InMemoryStore {
    records: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl InMemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of every record, in key order (for assertions).
    pub fn snapshot(&self) -> BTreeMap<Vec<u8>, Vec<u8>> {
        self.records().clone()
    }

    fn records(&self) -> MutexGuard<'_, BTreeMap<Vec<u8>, Vec<u8>>> {
        // A panic while holding the lock cannot leave a half-applied batch
        // (batches are validated first and applied without panicking paths),
        // so the map is still consistent.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Store for InMemoryStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.records().get(key).cloned())
    }

    fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let lower = super::scan_start(prefix, start_after);
        let records = self.records();
        Ok(records
            .range::<[u8], _>((lower, Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix))
            .take(limit)
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect())
    }

    fn commit(&self, batch: WriteBatch) -> CommitHandle {
        CommitHandle::ready(self.commit_blocking(batch))
    }

    fn commit_blocking(&self, batch: WriteBatch) -> Result<(), StoreError> {
        batch.validate()?;
        let mut records = self.records();
        for write in batch.into_writes() {
            match write {
                Write::Put { key, value } => records.insert(key, value),
                Write::Delete { key } => records.remove(&key),
            };
        }
        Ok(())
    }

    /// Writes a sled store at `path` (openable with
    /// [`SledStore::open`](crate::store::SledStore::open)) from a copy taken
    /// under the lock.
    fn backup_to(&self, path: &Path) -> Result<(), StoreError> {
        let copy = self.snapshot();
        write_new_store(path, copy.into_iter().map(Ok)).map_err(|message| StoreError::Backup {
            path: path.to_path_buf(),
            message,
        })
    }

    /// The total size of the keys and values.
    fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(self
            .records()
            .iter()
            .map(|(k, v)| (k.len() + v.len()) as u64)
            .sum())
    }
}

#[cfg(test)]
mod tests;
