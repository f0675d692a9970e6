//! The etcd primitives replicas build membership and ownership on
//! (DESIGN section 11): leases, keys claimed under a lease, reads with
//! their revisions, conditional deletes, watches, and a lock.
//!
//! Keys here are relative to the store's prefix and may not start with
//! `store/` (the store's own records). Their revisions are what a
//! [`Fence`](crate::store::Fence) compares.

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, LockOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use tokio::sync::mpsc;

use crate::store::StoreError;
use crate::store::batch::printable_key;
use crate::store::etcd::EtcdStore;
use crate::store::etcd::connect::etcd_error;
use crate::store::etcd::layout::prefix_end;

/// An etcd lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(pub i64);

/// A key's value and revisions, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// The value.
    pub value: Vec<u8>,
    /// The revision of the key's last change (what fences compare).
    pub mod_revision: i64,
    /// The revision that created the key.
    pub create_revision: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyEvent {
    /// `key` was set to `value` at `mod_revision`.
    Put {
        /// The key, relative to the prefix.
        key: Vec<u8>,
        /// Its new value.
        value: Vec<u8>,
        /// The revision of the change.
        mod_revision: i64,
        /// The lease the key is attached to (0: none).
        lease: i64,
    },
    /// `key` was deleted (or its lease expired) at `revision`.
    Delete {
        /// The key, relative to the prefix.
        key: Vec<u8>,
        /// The revision of the deletion.
        revision: i64,
    },
}

/// A change of a store record seen by [`EtcdStore::watch_records`]: keys
/// are store keys (as the
/// [`Store`](crate::store::Store) trait sees them), with the value before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordChange {
    /// The store key.
    pub key: Vec<u8>,
    /// Its new value (`None`: deleted).
    pub value: Option<Vec<u8>>,
    /// Its value before the change (`None`: it did not exist).
    pub previous: Option<Vec<u8>>,
    /// The etcd revision of the change (one per transaction).
    pub revision: i64,
}

/// Events a watch buffers before etcd's stream is paused.
const WATCH_BUFFER: usize = 1024;

fn cluster_key(store: &EtcdStore, key: &[u8]) -> Result<Vec<u8>, StoreError> {
    store.layout().cluster(key).ok_or_else(|| StoreError::Etcd {
        operation: "use a cluster key",
        message: format!(
            "key {} lies under store/, the store's own records; choose another key",
            printable_key(key)
        ),
    })
}

fn seconds(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX)
}

impl EtcdStore {
    /// Grants a lease of `ttl` (whole seconds, at least 1; etcd may raise
    /// very short TTLs to its minimum).
    pub async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        let ttl = seconds(ttl);
        self.thread()
            .call(move |shared| async move {
                let mut client = shared.client.clone();
                let granted = client
                    .lease_grant(ttl, None)
                    .await
                    .map_err(etcd_error("grant a lease"))?;
                Ok(LeaseId(granted.id()))
            })
            .await
    }

    /// Renews `lease` once; returns the TTL it has now. A lease that has
    /// expired answers [`StoreError::Etcd`] (keys attached to it are gone).
    pub async fn keep_lease_alive(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        self.thread()
            .call(move |shared| async move {
                let mut client = shared.client.clone();
                let renew = etcd_error("renew a lease");
                let (mut keeper, mut replies) =
                    client.lease_keep_alive(lease.0).await.map_err(&renew)?;
                keeper.keep_alive().await.map_err(&renew)?;
                match replies.message().await.map_err(&renew)? {
                    Some(reply) if reply.ttl() > 0 => {
                        Ok(Duration::from_secs(u64::try_from(reply.ttl()).unwrap_or(0)))
                    }
                    _ => Err(StoreError::Etcd {
                        operation: "renew a lease",
                        message: format!("lease {:x} has expired", lease.0),
                    }),
                }
            })
            .await
    }

    /// Renews `lease` once: the TTL it has now, or `None` if it has
    /// expired (etcd revoked it, and every key attached to it is gone).
    /// An `Err` says nothing about the lease (etcd did not answer).
    pub async fn renew_lease(&self, lease: LeaseId) -> Result<Option<Duration>, StoreError> {
        self.thread()
            .call(move |shared| async move {
                let mut client = shared.client.clone();
                let renew = etcd_error("renew a lease");
                let (mut keeper, mut replies) =
                    client.lease_keep_alive(lease.0).await.map_err(&renew)?;
                keeper.keep_alive().await.map_err(&renew)?;
                match replies.message().await.map_err(&renew)? {
                    Some(reply) if reply.ttl() > 0 => Ok(Some(Duration::from_secs(
                        u64::try_from(reply.ttl()).unwrap_or(0),
                    ))),
                    Some(_) => Ok(None),
                    None => Err(StoreError::Etcd {
                        operation: "renew a lease",
                        message: "etcd closed the keep-alive stream".to_owned(),
                    }),
                }
            })
            .await
    }

    /// Revokes `lease`: every key attached to it is deleted.
    pub async fn revoke_lease(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.thread()
            .call(move |shared| async move {
                let mut client = shared.client.clone();
                client
                    .lease_revoke(lease.0)
                    .await
                    .map_err(etcd_error("revoke a lease"))?;
                Ok(())
            })
            .await
    }

    /// Creates `key` = `value` (attached to `lease`, if given) only if the
    /// key does not exist; its mod revision if it was created, `None` if
    /// the key exists.
    pub async fn put_if_absent(
        &self,
        key: &[u8],
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Option<i64>, StoreError> {
        let key = cluster_key(self, key)?;
        self.thread()
            .call(move |shared| async move {
                let options = lease.map(|lease| PutOptions::new().with_lease(lease.0));
                let txn = Txn::new()
                    .when(vec![Compare::version(key.clone(), CompareOp::Equal, 0)])
                    .and_then(vec![TxnOp::put(key, value, options)]);
                let mut kv = shared.kv.clone();
                let response = kv.txn(txn).await.map_err(etcd_error("claim a key"))?;
                shared.saw(response.header());
                Ok(response
                    .succeeded()
                    .then(|| response.header().map_or(0, |h| h.revision())))
            })
            .await
    }

    /// The highest revision at which a store record under `prefix` was
    /// written after revision `after` (`None`: none was), read
    /// linearizably, keys only. Deletions leave no record and are not
    /// seen. etcd filters the prefix's keys by revision itself, so the
    /// reply holds only what changed.
    pub async fn latest_write_after(
        &self,
        prefix: &[u8],
        after: i64,
    ) -> Result<Option<i64>, StoreError> {
        let start = self.layout().data(prefix);
        self.thread()
            .call(move |shared| async move {
                let mut kv = shared.kv.clone();
                let options = GetOptions::new()
                    .with_range(prefix_end(&start))
                    .with_keys_only()
                    .with_min_mod_revision(after.saturating_add(1));
                let reply = kv
                    .get(start, Some(options))
                    .await
                    .map_err(etcd_error("read what changed under a prefix"))?;
                Ok(reply.kvs().iter().map(|kv| kv.mod_revision()).max())
            })
            .await
    }

    /// Reads `key`; also returns the etcd revision the read saw.
    pub async fn get_versioned(&self, key: &[u8]) -> Result<(Option<Versioned>, i64), StoreError> {
        let key = cluster_key(self, key)?;
        self.thread()
            .call(move |shared| async move {
                let mut kv = shared.kv.clone();
                let reply = kv.get(key, None).await.map_err(etcd_error("read a key"))?;
                let revision = reply.header().map_or(0, |h| h.revision());
                let found = reply.kvs().first().map(|kv| Versioned {
                    value: kv.value().to_vec(),
                    mod_revision: kv.mod_revision(),
                    create_revision: kv.create_revision(),
                    lease: kv.lease(),
                });
                Ok((found, revision))
            })
            .await
    }

    /// Every key under `prefix` with its value and revisions, and the
    /// revision they were read at (to watch from the next one).
    pub async fn list_versioned(
        &self,
        prefix: &[u8],
    ) -> Result<(Vec<(Vec<u8>, Versioned)>, i64), StoreError> {
        let start = cluster_key(self, prefix)?;
        self.thread()
            .call(move |shared| async move {
                let mut kv = shared.kv.clone();
                let end = prefix_end(&start);
                let reply = kv
                    .get(start, Some(GetOptions::new().with_range(end)))
                    .await
                    .map_err(etcd_error("list keys"))?;
                let revision = reply.header().map_or(0, |h| h.revision());
                let found = reply
                    .kvs()
                    .iter()
                    .map(|kv| {
                        (
                            shared.layout.relative(kv.key()).to_vec(),
                            Versioned {
                                value: kv.value().to_vec(),
                                mod_revision: kv.mod_revision(),
                                create_revision: kv.create_revision(),
                                lease: kv.lease(),
                            },
                        )
                    })
                    .collect();
                Ok((found, revision))
            })
            .await
    }

    /// Deletes `key` only if its mod revision is still `mod_revision`
    /// (a hand-off releasing what it claimed); true if it was deleted.
    pub async fn delete_if(&self, key: &[u8], mod_revision: i64) -> Result<bool, StoreError> {
        let key = cluster_key(self, key)?;
        self.thread()
            .call(move |shared| async move {
                let txn = Txn::new()
                    .when(vec![Compare::mod_revision(
                        key.clone(),
                        CompareOp::Equal,
                        mod_revision,
                    )])
                    .and_then(vec![TxnOp::delete(key, None)]);
                let mut kv = shared.kv.clone();
                let response = kv.txn(txn).await.map_err(etcd_error("release a key"))?;
                Ok(response.succeeded())
            })
            .await
    }

    /// Watches every key under `prefix` from `from_revision` (0: from now).
    /// The receiver yields events in revision order; an `Err` ends it (the
    /// revision was compacted, etcd cancelled the watch or was lost), and
    /// so does dropping the store.
    pub async fn watch_prefix(
        &self,
        prefix: &[u8],
        from_revision: i64,
    ) -> Result<mpsc::Receiver<Result<KeyEvent, StoreError>>, StoreError> {
        let start = cluster_key(self, prefix)?;
        let (events, receiver) = mpsc::channel(WATCH_BUFFER);
        self.thread()
            .call(move |shared| async move {
                let mut client = shared.client.clone();
                let options = WatchOptions::new()
                    .with_range(prefix_end(&start))
                    .with_start_revision(from_revision);
                let mut stream = client
                    .watch(start, Some(options))
                    .await
                    .map_err(etcd_error("watch keys"))?;
                tokio::spawn(async move {
                    loop {
                        let reply = match stream.message().await {
                            Ok(Some(reply)) => reply,
                            Ok(None) => {
                                let _ = events.send(Err(watch_ended("the stream ended"))).await;
                                return;
                            }
                            Err(error) => {
                                let _ = events.send(Err(etcd_error("watch keys")(error))).await;
                                return;
                            }
                        };
                        if reply.canceled() {
                            let reason = format!(
                                "etcd cancelled the watch (compacted at revision {}): {}",
                                reply.compact_revision(),
                                reply.cancel_reason()
                            );
                            let _ = events.send(Err(watch_ended(&reason))).await;
                            return;
                        }
                        for event in reply.events() {
                            let Some(kv) = event.kv() else { continue };
                            let key = shared.layout.relative(kv.key()).to_vec();
                            let event = match event.event_type() {
                                EventType::Put => KeyEvent::Put {
                                    key,
                                    value: kv.value().to_vec(),
                                    mod_revision: kv.mod_revision(),
                                    lease: kv.lease(),
                                },
                                EventType::Delete => KeyEvent::Delete {
                                    key,
                                    revision: kv.mod_revision(),
                                },
                            };
                            if events.send(Ok(event)).await.is_err() {
                                return;
                            }
                        }
                    }
                });
                Ok(())
            })
            .await?;
        Ok(receiver)
    }

    /// Every store record under the store-key prefix `prefix` (raw values,
    /// as written: use it for small records that are never chunked), and
    /// the etcd revision they were read at, to watch from the next one.
    pub async fn list_records(
        &self,
        prefix: &[u8],
    ) -> Result<(Vec<crate::store::Record>, i64), StoreError> {
        self.list_records_at(prefix, 0).await
    }

    /// [`list_records`](Self::list_records) as of etcd revision `at` (0:
    /// now); fails with [`StoreError::Compacted`] if etcd no longer keeps
    /// that revision.
    pub async fn list_records_at(
        &self,
        prefix: &[u8],
        at: i64,
    ) -> Result<(Vec<crate::store::Record>, i64), StoreError> {
        let start = self.layout().data(prefix);
        self.thread()
            .call(move |shared| async move {
                let end = prefix_end(&start);
                let mut found = Vec::new();
                let mut from = start;
                let mut revision = at;
                loop {
                    let mut options = GetOptions::new().with_range(end.clone()).with_limit(512);
                    if revision > 0 {
                        options = options.with_revision(revision);
                    }
                    let mut kv = shared.kv.clone();
                    let reply = kv.get(from.clone(), Some(options)).await.map_err(|error| {
                        match compacted_at(&error) {
                            Some(compact_revision) => StoreError::Compacted {
                                requested: revision,
                                compact_revision,
                            },
                            None => etcd_error("list records")(error),
                        }
                    })?;
                    if revision == 0 {
                        revision = reply.header().map_or(0, |h| h.revision());
                    }
                    for kv in reply.kvs() {
                        if let Some(key) = shared.layout.store_key(kv.key()) {
                            found.push((key.to_vec(), kv.value().to_vec()));
                        }
                    }
                    match reply.kvs().last() {
                        Some(last) if reply.more() => {
                            from = last.key().to_vec();
                            from.push(0);
                        }
                        _ => return Ok((found, revision)),
                    }
                }
            })
            .await
    }

    /// Watches the store records under the store-key prefix `prefix` from
    /// `from_revision`, with each record's previous value. The receiver
    /// yields changes in revision order, in batches that never split the
    /// changes of one revision (one transaction); an `Err` ends it
    /// ([`StoreError::Compacted`] if `from_revision` is no longer kept),
    /// and so does dropping the store.
    pub async fn watch_records(
        &self,
        prefix: &[u8],
        from_revision: i64,
    ) -> Result<mpsc::Receiver<Result<Vec<RecordChange>, StoreError>>, StoreError> {
        let start = self.layout().data(prefix);
        let (events, receiver) = mpsc::channel(WATCH_BUFFER);
        self.thread()
            .call(move |shared| async move {
                let mut client = shared.client.clone();
                let options = WatchOptions::new()
                    .with_range(prefix_end(&start))
                    .with_start_revision(from_revision)
                    .with_prev_key();
                let mut stream = client
                    .watch(start, Some(options))
                    .await
                    .map_err(etcd_error("watch records"))?;
                tokio::spawn(async move {
                    loop {
                        let reply = match stream.message().await {
                            Ok(Some(reply)) => reply,
                            Ok(None) => {
                                let _ = events.send(Err(watch_ended("the stream ended"))).await;
                                return;
                            }
                            Err(error) => {
                                let _ = events.send(Err(etcd_error("watch records")(error))).await;
                                return;
                            }
                        };
                        if reply.canceled() {
                            let _ = events.send(Err(cancelled(&reply, from_revision))).await;
                            return;
                        }
                        let changes = record_changes_of(&shared, &reply);
                        if !changes.is_empty() && events.send(Ok(changes)).await.is_err() {
                            return;
                        }
                    }
                });
                Ok(())
            })
            .await?;
        Ok(receiver)
    }

    /// Takes the etcd lock `name` (a cluster key) for `lease`, waiting
    /// while another holder has it; returns the key that holds it (pass
    /// it to [`unlock`](Self::unlock)). The lock ends with the lease too.
    pub async fn lock(&self, name: &[u8], lease: LeaseId) -> Result<Vec<u8>, StoreError> {
        let name = cluster_key(self, name)?;
        self.thread()
            .call(move |shared| async move {
                let mut client = shared.client.clone();
                let held = client
                    .lock(name, Some(LockOptions::new().with_lease(lease.0)))
                    .await
                    .map_err(etcd_error("take a lock"))?;
                Ok(held.key().to_vec())
            })
            .await
    }

    /// Takes the etcd lock `name` like [`lock`](Self::lock), and returns
    /// with the key that holds it a [`Fence`](crate::store::Fence) on that
    /// key: a commit under the fence lands only while the lock is still
    /// held (a holder paused past its lease writes nothing).
    pub async fn lock_fenced(
        &self,
        name: &[u8],
        lease: LeaseId,
    ) -> Result<(Vec<u8>, crate::store::Fence), StoreError> {
        let held = self.lock(name, lease).await?;
        let relative = self.layout().relative(&held).to_vec();
        let (found, _) = self.get_versioned(&relative).await?;
        let Some(found) = found else {
            return Err(StoreError::Etcd {
                operation: "take a lock",
                message: "the lock was lost right after it was taken (its lease expired)"
                    .to_owned(),
            });
        };
        Ok((
            held,
            crate::store::Fence {
                key: relative,
                mod_revision: found.mod_revision,
            },
        ))
    }

    /// Releases a lock taken with [`lock`](Self::lock).
    pub async fn unlock(&self, held: Vec<u8>) -> Result<(), StoreError> {
        self.thread()
            .call(move |shared| async move {
                let mut client = shared.client.clone();
                client
                    .unlock(held)
                    .await
                    .map_err(etcd_error("release a lock"))?;
                Ok(())
            })
            .await
    }
}

/// The store-record changes of one watch reply.
fn record_changes_of(
    shared: &crate::store::etcd::connect::Shared,
    reply: &etcd_client::WatchResponse,
) -> Vec<RecordChange> {
    reply
        .events()
        .iter()
        .filter_map(|event| {
            let kv = event.kv()?;
            let key = shared.layout.store_key(kv.key())?.to_vec();
            let value = match event.event_type() {
                EventType::Put => Some(kv.value().to_vec()),
                EventType::Delete => None,
            };
            Some(RecordChange {
                key,
                value,
                previous: event.prev_kv().map(|prev| prev.value().to_vec()),
                revision: kv.mod_revision(),
            })
        })
        .collect()
}

/// The revision etcd compacted to, if `error` says a read asked for an
/// older one ("required revision has been compacted").
fn compacted_at(error: &etcd_client::Error) -> Option<i64> {
    let etcd_client::Error::GRpcStatus(status) = error else {
        return None;
    };
    status.message().contains("compacted").then_some(0)
}

/// Why etcd cancelled a watch that started at `requested`.
fn cancelled(reply: &etcd_client::WatchResponse, requested: i64) -> StoreError {
    if reply.compact_revision() > 0 {
        return StoreError::Compacted {
            requested,
            compact_revision: reply.compact_revision(),
        };
    }
    watch_ended(&format!(
        "etcd cancelled the watch: {}",
        reply.cancel_reason()
    ))
}

fn watch_ended(reason: &str) -> StoreError {
    StoreError::Etcd {
        operation: "watch keys",
        message: reason.to_owned(),
    }
}
