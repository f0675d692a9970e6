//! The store a tenant's owner commits through when replicas share etcd.
//!
//! It does two things to every commit, and the owner learns of neither
//! (it writes to a [`Store`] as on sled):
//!
//! - **Fencing.** Every batch gets the owner's [`Fence`]: the owner key
//!   `owners/<tenant>` at the revision this replica claimed it. etcd
//!   compares it in the transaction that makes the commit real, so a
//!   replica that lost the tenant (its lease expired while it was paused,
//!   another replica claimed it) writes nothing: its commit fails with
//!   [`StoreError::Fenced`] and the owner stops.
//! - **The directory entry.** When a batch writes the tenant record and
//!   what other replicas must know of it changed (token, conditions,
//!   limits; see [`TenantEntry`]), the batch also writes the tenant's
//!   entry, or deletes it with the tombstone: the entry can never
//!   disagree with a committed record.

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::store::{CommitHandle, Fence, Record, Store, StoreError, Write, WriteBatch, keys};
use crate::tenant::TenantRecord;
use crate::tenant::owner::now_ms;
use crate::tenant::record::decode;

use super::catalog::TenantEntry;

/// What the directory entry holds as far as this store knows.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Known {
    /// Nothing known: the next record write writes the entry.
    Unknown,
    /// The entry committed last.
    Entry(TenantEntry),
}

/// A tenant owner's view of the store, fenced on its owner key.
pub struct OwnerStore {
    inner: Arc<dyn Store>,
    fence: Fence,
    record_key: Vec<u8>,
    known: Arc<Mutex<Known>>,
}

impl std::fmt::Debug for OwnerStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerStore")
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

impl OwnerStore {
    /// The store of tenant `tenant`'s owner, committing into `inner` under
    /// `fence`; `entry` is its directory entry as the catalog has it.
    pub fn new(
        inner: Arc<dyn Store>,
        tenant: u64,
        fence: Fence,
        entry: Option<TenantEntry>,
    ) -> Self {
        Self {
            inner,
            fence,
            record_key: keys::tenant_record_key(tenant),
            known: Arc::new(Mutex::new(entry.map_or(Known::Unknown, Known::Entry))),
        }
    }

    /// The fence every commit carries.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Adds the entry's write to `batch` if the batch writes a record that
    /// changes it; returns what the entry holds once the batch commits.
    fn keep_entry(&self, batch: &mut WriteBatch) -> Option<Known> {
        let record = batch.writes().iter().rev().find_map(|write| match write {
            Write::Put { key, value } if *key == self.record_key => Some(value.clone()),
            _ => None,
        })?;
        let record: TenantRecord = decode(&self.record_key, &record).ok()?;
        let entry_key = keys::tenant_entry_key(&record.name);
        if record.deleted {
            batch.delete(entry_key);
            return Some(Known::Unknown);
        }
        let known = self
            .known
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let entry = match &known {
            Known::Entry(old) if old.conditions == record.conditions => {
                TenantEntry::of(&record, old.conditions_changed_ms)
            }
            _ => TenantEntry::of(&record, now_ms()),
        };
        if matches!(&known, Known::Entry(old) if old.same_as(&entry)) {
            return None;
        }
        batch.put(entry_key, entry.encode());
        Some(Known::Entry(entry))
    }

    /// Records what the entry holds once `handle` resolves successfully
    /// (and forgets it if the commit failed: the next one writes it).
    fn remember(&self, handle: CommitHandle, outcome: Known) -> CommitHandle {
        let known = self.known.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            *known.lock().unwrap_or_else(|p| p.into_inner()) = outcome;
            return handle;
        };
        let (sender, answer) = CommitHandle::pending();
        runtime.spawn(async move {
            let result = handle.await;
            *known.lock().unwrap_or_else(|p| p.into_inner()) = match &result {
                Ok(()) => outcome,
                Err(_) => Known::Unknown,
            };
            let _ = sender.send(result);
        });
        answer
    }
}

impl Store for OwnerStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(key)
    }

    fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.inner.scan(prefix, start_after, limit)
    }

    fn scan_keys(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        self.inner.scan_keys(prefix, start_after, limit)
    }

    fn commit(&self, mut batch: WriteBatch) -> CommitHandle {
        let outcome = self.keep_entry(&mut batch);
        batch.set_fence(Some(self.fence.clone()));
        let handle = self.inner.commit(batch);
        match outcome {
            Some(outcome) => self.remember(handle, outcome),
            None => handle,
        }
    }

    fn commit_blocking(&self, mut batch: WriteBatch) -> Result<(), StoreError> {
        let outcome = self.keep_entry(&mut batch);
        batch.set_fence(Some(self.fence.clone()));
        let result = self.inner.commit_blocking(batch);
        if let Some(outcome) = outcome {
            *self.known.lock().unwrap_or_else(|p| p.into_inner()) = match &result {
                Ok(()) => outcome,
                Err(_) => Known::Unknown,
            };
        }
        result
    }

    fn backup_to(&self, path: &Path) -> Result<(), StoreError> {
        self.inner.backup_to(path)
    }

    fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.inner.size_on_disk()
    }

    fn max_value_bytes(&self) -> usize {
        self.inner.max_value_bytes()
    }

    fn writes_per_step(&self) -> Option<usize> {
        self.inner.writes_per_step()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::InMemoryStore;
    use crate::tenant::TenantLimits;
    use crate::tenant::record::encode;

    fn record(token: &str, deleted: bool) -> TenantRecord {
        TenantRecord {
            id: 3,
            name: "acme".into(),
            created_at_ms: 1,
            generation: 0,
            observed_generation: 0,
            revision: 1,
            limits: TenantLimits::default(),
            token_hash: token.into(),
            deleted,
            conditions: Vec::new(),
            compact_revision: None,
            history_bytes: None,
        }
    }

    fn write_record(store: &OwnerStore, record: &TenantRecord) {
        let mut batch = WriteBatch::new();
        batch.put(keys::tenant_record_key(3), encode(record).expect("encodes"));
        store.commit_blocking(batch).expect("commits");
    }

    #[test]
    fn the_entry_follows_the_record_and_goes_with_its_tombstone() {
        let inner: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let fence = Fence {
            key: b"owners/3".to_vec(),
            mod_revision: 9,
        };
        let store = OwnerStore::new(inner.clone(), 3, fence, None);
        let entry_key = keys::tenant_entry_key("acme");
        write_record(&store, &record("aa", false));
        let first = inner.get(&entry_key).expect("reads").expect("written");
        assert_eq!(
            TenantEntry::decode(&first).map(|e| e.token_hash),
            Some("aa".to_owned())
        );

        // Nothing of the entry changed: it is not written again.
        inner
            .commit_blocking({
                let mut batch = WriteBatch::new();
                batch.delete(entry_key.clone());
                batch
            })
            .expect("clears");
        write_record(&store, &record("aa", false));
        assert_eq!(inner.get(&entry_key).expect("reads"), None);

        write_record(&store, &record("bb", false));
        assert!(inner.get(&entry_key).expect("reads").is_some());
        write_record(&store, &record("bb", true));
        assert_eq!(inner.get(&entry_key).expect("reads"), None);
    }
}
