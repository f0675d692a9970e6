//! This replica's membership: one etcd lease (TTL default 5 s, renewed
//! every third of it) and the key `members/<replica id>` holding its
//! advertise address under that lease; and the live member set, read from
//! the `members/` keys of every replica.
//!
//! The lease is what everything this replica owns hangs on: its owner keys
//! are attached to it, so when it expires etcd deletes them all at once and
//! other replicas may claim the tenants. A replica must therefore stop
//! serving before that can happen: it counts the lease as valid only until
//! the TTL etcd last granted runs out, measured from *before* the renewal
//! was sent, and drops everything it owns as soon as that passes or etcd
//! says the lease is gone (a paused process finds this out first thing
//! after it wakes up). It then joins again with a new lease.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::store::etcd::LeaseId;
use crate::store::{EtcdStore, StoreError};

use super::metrics::ClusterMetrics;
use super::mirror::{self, Keys};

/// The prefix of the member keys.
pub const MEMBERS: &[u8] = b"members/";

/// How long a failed join waits before it tries again.
const JOIN_RETRY: Duration = Duration::from_millis(500);

/// A lease this replica holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldLease {
    /// The etcd lease.
    pub id: LeaseId,
    /// Counts the leases this process has held: a new one after each loss.
    pub epoch: u64,
}

/// This replica's lease and the live member set.
pub struct Membership {
    store: Arc<EtcdStore>,
    replica: String,
    advertise: String,
    ttl: Duration,
    lease: watch::Sender<Option<HeldLease>>,
    /// Until when the lease is surely valid (`None`: no lease).
    valid_until: Mutex<Option<Instant>>,
    members: watch::Receiver<Keys>,
    metrics: Arc<ClusterMetrics>,
    /// Ends the membership (see [`leave`](Membership::leave)).
    stop: CancellationToken,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("replica", &self.replica)
            .field("lease", &*self.lease.borrow())
            .finish_non_exhaustive()
    }
}

impl Membership {
    /// Reads the member set and starts keeping this replica a member
    /// (joining, renewing, joining again after a loss) until
    /// [`leave`](Self::leave).
    pub async fn start(
        store: Arc<EtcdStore>,
        replica: String,
        advertise: String,
        ttl: Duration,
        metrics: Arc<ClusterMetrics>,
    ) -> Result<Arc<Self>, StoreError> {
        let stop = CancellationToken::new();
        let members = mirror::mirror(store.clone(), MEMBERS, stop.clone()).await?;
        let membership = Arc::new(Self {
            store,
            replica,
            advertise,
            ttl,
            lease: watch::Sender::new(None),
            valid_until: Mutex::new(None),
            members,
            metrics,
            stop: stop.clone(),
        });
        tokio::spawn(membership.clone().run(stop));
        Ok(membership)
    }

    /// Leaves the cluster: stops renewing and revokes the lease, which
    /// deletes at once the member key and every owner key attached to it,
    /// so that the other replicas take the tenants over without waiting
    /// for the TTL. Call it once this replica has stopped serving.
    pub async fn leave(&self) {
        let held = *self.lease.borrow();
        self.stop.cancel();
        self.set_valid_until(None);
        self.lease.send_replace(None);
        if let Some(held) = held
            && let Err(error) = self.store.revoke_lease(held.id).await
        {
            warn!(%error, "Could not revoke the lease; it expires by itself.");
        }
    }

    /// This replica's id.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// The lease TTL asked of etcd.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The lease held now, if it is still surely valid.
    pub fn current(&self) -> Option<HeldLease> {
        let held = (*self.lease.borrow())?;
        self.is_valid().then_some(held)
    }

    /// Whether this replica holds a lease that etcd cannot have expired yet.
    pub fn is_valid(&self) -> bool {
        self.valid_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .is_some_and(|until| Instant::now() < until)
    }

    /// A receiver told whenever the lease changes (joined, lost).
    pub fn lease_changes(&self) -> watch::Receiver<Option<HeldLease>> {
        self.lease.subscribe()
    }

    /// The live members: replica id -> advertise address.
    pub fn members(&self) -> BTreeMap<String, String> {
        self.members
            .borrow()
            .iter()
            .filter_map(|(id, member)| {
                Some((
                    String::from_utf8(id.clone()).ok()?,
                    String::from_utf8(member.value.clone()).ok()?,
                ))
            })
            .collect()
    }

    /// A receiver told whenever the member set changes.
    pub fn member_changes(&self) -> watch::Receiver<Keys> {
        self.members.clone()
    }

    fn set_valid_until(&self, until: Option<Instant>) {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = until;
    }

    fn member_key(&self) -> Vec<u8> {
        [MEMBERS, self.replica.as_bytes()].concat()
    }

    async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut epoch = 0;
        loop {
            let joined = tokio::select! {
                () = stop.cancelled() => return,
                joined = self.join() => joined,
            };
            let (lease, granted_at) = match joined {
                Ok(joined) => joined,
                Err(error) => {
                    warn!(%error, "Cannot join the cluster; retrying.");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(JOIN_RETRY) => continue,
                    }
                }
            };
            epoch += 1;
            self.set_valid_until(Some(granted_at + self.ttl));
            self.lease
                .send_replace(Some(HeldLease { id: lease, epoch }));
            info!(replica = %self.replica, advertise = %self.advertise, lease = format!("{:x}", lease.0), "Joined the cluster.");
            let stopped = self.keep(lease, granted_at, &stop).await;
            if stopped {
                // `leave` revokes the lease.
                return;
            }
            self.set_valid_until(None);
            self.lease.send_replace(None);
            self.metrics.lease_lost();
        }
    }

    /// Grants a lease and registers the member key under it, waiting for a
    /// key left by an earlier run of this replica to expire.
    async fn join(&self) -> Result<(LeaseId, Instant), StoreError> {
        let mut asked = Instant::now();
        let lease = self.store.grant_lease(self.ttl).await?;
        let mut warned = false;
        loop {
            if self
                .store
                .put_if_absent(
                    &self.member_key(),
                    self.advertise.clone().into_bytes(),
                    Some(lease),
                )
                .await?
                .is_some()
            {
                return Ok((lease, asked));
            }
            if !warned {
                warn!(replica = %self.replica, "A replica with this id is still registered (an earlier run whose lease has not expired yet, or another replica with the same --replica-id); waiting for its lease to end.");
                warned = true;
            }
            tokio::time::sleep(self.ttl / 5).await;
            asked = Instant::now();
            if self.store.renew_lease(lease).await?.is_none() {
                return Err(StoreError::Etcd {
                    operation: "join the cluster",
                    message: "the new lease expired while waiting".to_owned(),
                });
            }
        }
    }

    /// Renews `lease` every third of the TTL until it is lost (false) or
    /// `stop` is cancelled (true).
    async fn keep(&self, lease: LeaseId, granted_at: Instant, stop: &CancellationToken) -> bool {
        let mut valid_until = granted_at + self.ttl;
        let mut next = Instant::now() + self.ttl / 3;
        loop {
            let wake = next.min(valid_until);
            tokio::select! {
                () = stop.cancelled() => return true,
                () = tokio::time::sleep_until(wake.into()) => {}
            }
            if Instant::now() >= valid_until {
                error!(replica = %self.replica, "The cluster lease ran out before it could be renewed; this replica stops serving its tenants and joins again.");
                return false;
            }
            let sent = Instant::now();
            let renewed = tokio::time::timeout(
                valid_until.saturating_duration_since(sent),
                self.store.renew_lease(lease),
            )
            .await;
            match renewed {
                Ok(Ok(Some(ttl))) => {
                    valid_until = sent + ttl;
                    self.set_valid_until(Some(valid_until));
                    self.metrics.lease_renewed();
                    next = sent + self.ttl / 3;
                }
                Ok(Ok(None)) => {
                    error!(replica = %self.replica, "etcd expired the cluster lease; this replica stops serving its tenants and joins again.");
                    return false;
                }
                Ok(Err(error)) => {
                    warn!(%error, "Renewing the cluster lease failed; retrying.");
                    self.metrics.lease_renewal_failed();
                    next = Instant::now() + self.ttl / 10;
                }
                Err(_) => {
                    self.metrics.lease_renewal_failed();
                    next = Instant::now();
                }
            }
        }
    }
}
