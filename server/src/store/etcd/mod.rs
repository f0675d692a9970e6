//! The etcd backend of [`Store`] (DESIGN section 11), for replicas that
//! share one etcd cluster.
//!
//! - [`layout`]: every key lives under a configurable prefix (default
//!   `/reconciled/`), store records under `store/data/`, so deployments
//!   can share an etcd and a prefix scan is one etcd range.
//! - [`runtime`]: the client runs on a thread of its own with its own
//!   tokio runtime; the trait's synchronous reads hand a job over a channel
//!   and wait, which is safe from any runtime flavour (its module doc says
//!   why this design).
//! - [`writer`]: commits apply in queue order; commits that fit one
//!   transaction together share it.
//! - [`staged`]: a commit over etcd's limits (128 operations, 1.5 MiB per
//!   request by default) is staged as chunks and made real by one small
//!   marker transaction; opening the store rolls marked commits forward.
//! - [`read`]: reads never see half a commit.
//! - [`cluster`]: leases, claims, watches and locks for the cluster room.
//!
//! A commit is durable once etcd's quorum has it. [`Fence`](crate::store::Fence)s
//! are checked inside the transaction that makes a commit real. Values are
//! at most [`MAX_VALUE_BYTES`] as on sled (wrap the store in
//! [`ChunkedValues`](crate::store::ChunkedValues) for larger records).

mod cluster;
mod codec;
mod connect;
pub mod latency;
mod layout;
mod options;
mod read;
mod runtime;
mod staged;
mod writer;

use std::path::Path;
use std::sync::mpsc::sync_channel;
use std::time::Duration;

pub use cluster::{KeyEvent, LeaseId, RecordChange, Versioned};
pub use options::{
    CrashPoint, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TXN_OPS, DEFAULT_PREFIX,
    DEFAULT_STAGING_LEASE, EtcdAuth, EtcdOptions, EtcdTls,
};

use crate::store::sled_files::write_new_store;
use crate::store::{CommitHandle, MAX_VALUE_BYTES, Record, Store, StoreError, WriteBatch};
use layout::Layout;
use runtime::EtcdThread;
use writer::{CommitRequest, Reply};

/// Records per page when the whole store is copied (a backup).
const COPY_PAGE: usize = 1_000;

/// A [`Store`] in etcd.
///
/// Opening it rolls forward every staged commit that was marked and
/// discards staged chunks that never will be, before anything reads.
/// Dropping it finishes the queued commits.
pub struct EtcdStore {
    thread: EtcdThread,
    latency: std::sync::Arc<latency::EtcdLatency>,
    layout: Layout,
    options: EtcdOptions,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.options.endpoints)
            .field("prefix", &self.options.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to etcd and recovers staged commits. Blocking: call it
    /// before starting a runtime or from `spawn_blocking` (it is safe on a
    /// runtime thread too, but blocks it).
    pub fn open(options: EtcdOptions) -> Result<Self, StoreError> {
        if options.endpoints.is_empty() {
            return Err(StoreError::Etcd {
                operation: "connect",
                message: "no endpoints given".to_owned(),
            });
        }
        let thread = EtcdThread::start(options.clone())?;
        let latency = thread.call_blocking(|shared| async move { Ok(shared.latency.clone()) })?;
        let store = Self {
            thread,
            latency,
            layout: Layout::new(&options.prefix),
            options,
        };
        store
            .thread
            .call_blocking(|shared| async move { staged::recover(&shared).await })?;
        Ok(store)
    }

    /// How long etcd has taken to answer this store's commits and reads.
    pub fn latency(&self) -> &latency::EtcdLatency {
        &self.latency
    }

    /// The settings it was opened with.
    pub fn options(&self) -> &EtcdOptions {
        &self.options
    }

    fn thread(&self) -> &EtcdThread {
        &self.thread
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Every raw etcd key under the prefix (store records and cluster
    /// keys alike), for tests and `store copy` checks.
    pub fn raw_keys(&self) -> Result<Vec<Vec<u8>>, StoreError> {
        let prefix = self.options.prefix.as_bytes().to_vec();
        self.thread.call_blocking(move |shared| async move {
            let mut kv = shared.kv.clone();
            let options = etcd_client::GetOptions::new()
                .with_range(layout::prefix_end(&prefix))
                .with_keys_only();
            let reply = kv
                .get(prefix, Some(options))
                .await
                .map_err(connect::etcd_error("list keys"))?;
            Ok(reply.kvs().iter().map(|kv| kv.key().to_vec()).collect())
        })
    }

    /// Takes the etcd lock `name` under a lease of `ttl` kept alive while
    /// the returned guard lives, waiting while another process holds it.
    /// Blocking (for start-up code such as migrations).
    pub fn hold_lock_blocking(
        &self,
        name: &[u8],
        ttl: Duration,
    ) -> Result<HeldLock<'_>, StoreError> {
        let name = self.layout.cluster(name).ok_or_else(|| StoreError::Etcd {
            operation: "take a lock",
            message: "lock names may not start with store/".to_owned(),
        })?;
        let ttl_secs = i64::try_from(ttl.as_secs().max(2)).unwrap_or(10);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (lease, key) = self.thread.call_blocking(move |shared| async move {
            let mut client = shared.client.clone();
            let lease = client
                .lease_grant(ttl_secs, None)
                .await
                .map_err(connect::etcd_error("grant a lease"))?
                .id();
            let mut keeper = client.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = staged::keep_lease_alive(&mut keeper, lease, ttl) => {}
                    _ = stopped => {}
                }
            });
            let held = client
                .lock(
                    name,
                    Some(etcd_client::LockOptions::new().with_lease(lease)),
                )
                .await
                .map_err(connect::etcd_error("take a lock"))?;
            Ok((lease, held.key().to_vec()))
        })?;
        Ok(HeldLock {
            store: self,
            lease: LeaseId(lease),
            stop: Some(stop),
            key,
        })
    }
}

/// An etcd lock held by [`EtcdStore::hold_lock_blocking`]; dropping it
/// releases the lock and revokes its lease.
pub struct HeldLock<'a> {
    store: &'a EtcdStore,
    lease: LeaseId,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    key: Vec<u8>,
}

impl Drop for HeldLock<'_> {
    fn drop(&mut self) {
        drop(self.stop.take());
        let (lease, key) = (self.lease, std::mem::take(&mut self.key));
        // Revoking the lease releases the lock as well.
        let released = self.store.thread.call_blocking(move |shared| async move {
            let mut client = shared.client.clone();
            let _ = client.unlock(key).await;
            client
                .lease_revoke(lease.0)
                .await
                .map_err(connect::etcd_error("release a lock"))?;
            Ok(())
        });
        if let Err(error) = released {
            tracing::warn!(%error, "Could not release an etcd lock; it ends with its lease.");
        }
    }
}

impl Store for EtcdStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let key = key.to_vec();
        self.thread
            .call_blocking(move |shared| async move { read::get(&shared, key).await })
    }

    fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let (prefix, start_after) = (prefix.to_vec(), start_after.map(<[u8]>::to_vec));
        self.thread.call_blocking(move |shared| async move {
            read::scan(&shared, prefix, start_after, limit).await
        })
    }

    fn commit(&self, batch: WriteBatch) -> CommitHandle {
        if let Err(error) = batch.validate() {
            return CommitHandle::ready(Err(error));
        }
        let (sender, handle) = CommitHandle::pending();
        self.thread.queue_commit(CommitRequest {
            batch,
            reply: Reply::Async(sender),
        });
        handle
    }

    fn commit_blocking(&self, batch: WriteBatch) -> Result<(), StoreError> {
        batch.validate()?;
        let (sender, receiver) = sync_channel(1);
        self.thread.queue_commit(CommitRequest {
            batch,
            reply: Reply::Blocking(sender),
        });
        receiver.recv().unwrap_or(Err(StoreError::Closed))
    }

    /// Writes every record, read at one etcd revision, into a new sled
    /// store at `path` (which [`SledStore::open`](crate::store::SledStore::open)
    /// opens and `reconciled store copy` copies back).
    fn backup_to(&self, path: &Path) -> Result<(), StoreError> {
        let backup_error = |message: String| StoreError::Backup {
            path: path.to_path_buf(),
            message,
        };
        let records = self.thread.call_blocking(|shared| async move {
            let mut records: Vec<Record> = Vec::new();
            loop {
                let after = records.last().map(|(key, _)| key.clone());
                let page = read::scan(&shared, Vec::new(), after, COPY_PAGE).await?;
                let done = page.len() < COPY_PAGE;
                records.extend(page);
                if done {
                    return Ok(records);
                }
            }
        });
        let records = records.map_err(|e| backup_error(e.to_string()))?;
        write_new_store(path, records.into_iter().map(Ok)).map_err(backup_error)
    }

    /// The size of etcd's database (every prefix, not this store's alone).
    fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.thread.call_blocking(|shared| async move {
            let mut client = shared.client.clone();
            let status = client
                .status()
                .await
                .map_err(connect::etcd_error("read etcd's status"))?;
            Ok(u64::try_from(status.db_size()).unwrap_or(0))
        })
    }

    fn max_value_bytes(&self) -> usize {
        MAX_VALUE_BYTES
    }

    /// A commit whose writes and fence take more than `max_txn_ops`
    /// compares (one per key, one per fence, one for the attempt key) is
    /// staged (several round trips); two are kept for the fence and the
    /// attempt key.
    fn writes_per_step(&self) -> Option<usize> {
        Some(self.options.max_txn_ops.saturating_sub(2).max(1))
    }
}
