//! Replicas on etcd (DESIGN section 11): N `reconciled` processes share
//! one etcd; each tenant is served by exactly one live replica, any
//! replica answers any call.
//!
//! - [`membership`]: this replica's etcd lease and member key, and the
//!   live member set.
//! - [`placement`]: who should serve each tenant (rendezvous hashing; pure).
//! - [`ownership`]: claims, loads and hand-offs that make it so; where a
//!   tenant is served now ([`Route`]).
//! - [`owner_store`]: the store an owner commits through: every commit
//!   fenced on its owner key, the tenant's directory entry kept in step.
//! - [`catalog`]: the fleet-wide tenant directory (names, ids, token
//!   hashes, conditions) every replica keeps from etcd; with `tokens`, it
//!   authenticates tenant tokens on every replica, catching up with etcd
//!   before it refuses one.
//! - [`forward`]: tenant-scoped calls reach the owner.
//! - [`fleet`]: `WatchFleet` in etcd's order, the same on every replica.
//! - [`admin`]: creating tenants atomically across replicas.
//! - [`metrics`]: what `/metrics` shows of all this.
//!
//! See docs/scale-out.md for the topology, the settings and what each
//! failure costs.

pub mod admin;
pub mod catalog;
pub mod fleet;
mod follow;
pub mod forward;
pub mod membership;
pub mod metrics;
mod mirror;
pub mod owner_store;
pub mod ownership;
pub mod placement;
mod tokens;

use std::sync::Arc;
use std::time::Duration;

use reconciled_proto::v1;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::ClientTlsConfig;

use crate::auth::TokenDirectory;
use crate::status::ApiError;
use crate::store::{EtcdStore, Store, StoreError};
use crate::tenant::{TenantDirectory, TenantLimits, TenantRecord};

pub use catalog::{Catalog, TenantEntry};
pub use fleet::ClusterFleet;
pub use forward::{ForwardLayer, Peers};
pub use membership::Membership;
pub use metrics::ClusterMetrics;
pub use ownership::{Ownership, Route};
use tokens::{CatchUps, ClusterTokens};

/// How this replica takes part in the cluster.
#[derive(Clone, Debug)]
pub struct ClusterSettings {
    /// This replica's id: the name of its member key and the input of
    /// placement. Stable across restarts, so a restarted replica gets its
    /// tenants back.
    pub replica_id: String,
    /// The address (`HOST:PORT`) other replicas and agents reach it at.
    pub advertise: String,
    /// The TTL of its etcd lease (renewed every third of it).
    pub lease_ttl: Duration,
    /// Events the fleet stream keeps in memory while watched.
    pub ring_events: usize,
    /// How much of the fleet stream's history is kept for watchers that
    /// resume.
    pub fleet_retention: crate::watch::Retention,
    /// How to dial the other replicas when the server speaks TLS.
    pub peer_tls: Option<ClientTlsConfig>,
}

/// This replica's part in the cluster.
pub struct Cluster {
    settings: ClusterSettings,
    directory: Arc<TenantDirectory>,
    store: Arc<EtcdStore>,
    records: Arc<dyn Store>,
    catalog: Arc<Catalog>,
    membership: Arc<Membership>,
    ownership: Arc<Ownership>,
    fleet: Arc<ClusterFleet>,
    metrics: Arc<ClusterMetrics>,
    peers: Peers,
    /// Catch-ups of the catalog before an unknown token is refused.
    catch_ups: Arc<CatchUps>,
    /// Stops the watches and the ownership controller.
    stop: CancellationToken,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("replica", &self.settings.replica_id)
            .field("advertise", &self.settings.advertise)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Joins the cluster: reads the tenant directory, the members and the
    /// owner keys, and starts the membership and the ownership controller,
    /// which adopts into `directory` the tenants this replica should
    /// serve. `store` is the etcd store, `records` the same wrapped for
    /// large values (what tenants are loaded from and written to).
    pub async fn start(
        settings: ClusterSettings,
        store: Arc<EtcdStore>,
        records: Arc<dyn Store>,
        directory: Arc<TenantDirectory>,
    ) -> Result<Arc<Self>, StoreError> {
        let stop = CancellationToken::new();
        let metrics = Arc::new(ClusterMetrics::default());
        let fleet = ClusterFleet::start(
            store.clone(),
            settings.fleet_retention,
            settings.ring_events,
            stop.clone(),
        );
        let catalog = Catalog::start(store.clone(), stop.clone()).await?;
        let membership = Membership::start(
            store.clone(),
            settings.replica_id.clone(),
            settings.advertise.clone(),
            settings.lease_ttl,
            metrics.clone(),
        )
        .await?;
        let ownership = Ownership::start(
            store.clone(),
            records.clone(),
            directory.clone(),
            catalog.clone(),
            membership.clone(),
            metrics.clone(),
            stop.clone(),
        )
        .await?;
        Ok(Arc::new(Self {
            peers: Peers::new(settings.peer_tls.clone(), settings.lease_ttl),
            catch_ups: Arc::new(CatchUps::new(catalog.clone(), store.clone())),
            settings,
            directory,
            store,
            records,
            catalog,
            membership,
            ownership,
            fleet,
            metrics,
            stop,
        }))
    }

    /// This replica's id.
    pub fn replica(&self) -> &str {
        &self.settings.replica_id
    }

    /// The address this replica is reached at.
    pub fn advertise(&self) -> &str {
        &self.settings.advertise
    }

    /// The tenant tokens every replica accepts (all tenants').
    pub fn tokens(&self) -> Arc<dyn TokenDirectory + Send + Sync> {
        Arc::new(ClusterTokens {
            catalog: self.catalog.clone(),
            directory: self.directory.clone(),
            catch_ups: self.catch_ups.clone(),
        })
    }

    /// The fleet-wide tenant directory.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// The fleet stream.
    pub fn fleet(&self) -> &Arc<ClusterFleet> {
        &self.fleet
    }

    /// The cluster's metrics.
    pub fn metrics(&self) -> &Arc<ClusterMetrics> {
        &self.metrics
    }

    /// The etcd store (for its latency figures).
    pub fn store(&self) -> &Arc<EtcdStore> {
        &self.store
    }

    /// Channels to the other replicas.
    pub fn peers(&self) -> &Peers {
        &self.peers
    }

    /// True once this replica has joined and serves the tenants it should.
    pub fn readiness(&self) -> watch::Receiver<bool> {
        self.ownership.readiness()
    }

    /// Where calls for tenant `name` go now.
    pub fn route(&self, name: &str) -> Route {
        self.ownership.route(name)
    }

    /// How long a call waits for a tenant that no replica serves right now
    /// (a hand-off, a failover): a lease TTL for the old owner's keys to
    /// expire, another for the new one to load, and a margin.
    pub fn placement_wait(&self) -> Duration {
        self.settings.lease_ttl * 2 + Duration::from_secs(3)
    }

    /// [`route`](Self::route), waiting up to [`placement_wait`](Self::placement_wait)
    /// while no replica serves the tenant.
    pub async fn await_route(&self, name: &str) -> Route {
        self.ownership
            .await_route(name, self.placement_wait())
            .await
    }

    /// Waits (up to [`placement_wait`](Self::placement_wait)) until the
    /// tenant is served by a replica other than the one at `gone`, which
    /// did not answer.
    pub async fn await_route_other_than(&self, name: &str, gone: &str) -> Route {
        let deadline = tokio::time::Instant::now() + self.placement_wait();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let route = self.ownership.await_route(name, left).await;
            let same = matches!(&route, Route::Elsewhere(owner) if owner == gone);
            if !same || left.is_zero() {
                return route;
            }
            tokio::time::sleep(Duration::from_millis(50).min(left)).await;
        }
    }

    /// Completes once tenant `name` is no longer served by the replica at
    /// `owner` (it moved, or nobody serves it for the moment).
    pub async fn moved_from(&self, name: &str, owner: &str) {
        self.ownership.moved_from(name, owner).await;
    }

    /// The address of the replica serving tenant `name`, if one does.
    pub fn owner_address(&self, name: &str) -> Option<String> {
        match self.route(name) {
            Route::Here => Some(self.settings.advertise.clone()),
            Route::Elsewhere(owner) => Some(owner),
            Route::Nowhere | Route::Unknown => None,
        }
    }

    /// The error for a call about tenant `name` that this replica does
    /// not serve.
    pub fn not_owner(&self, name: &str) -> ApiError {
        ApiError::NotOwner {
            tenant: name.to_owned(),
            owner: match self.route(name) {
                Route::Elsewhere(owner) => Some(owner),
                _ => None,
            },
        }
    }

    /// Creates tenant `name` and waits (briefly) until a replica serves
    /// it; returns it as `CreateTenant` answers, with its token.
    pub async fn create_tenant(
        &self,
        name: &str,
        limits: TenantLimits,
    ) -> Result<(v1::Tenant, String), ApiError> {
        let (record, token) = admin::create_tenant(
            &self.store,
            &self.records,
            &self.membership,
            &self.catalog,
            name,
            limits,
        )
        .await?;
        // Callers expect to use the tenant right away: wait for its owner.
        let owner = match self
            .ownership
            .await_route(name, self.placement_wait())
            .await
        {
            Route::Here => self.settings.advertise.clone(),
            Route::Elsewhere(owner) => owner,
            Route::Nowhere | Route::Unknown => String::new(),
        };
        Ok((new_tenant(&record, owner), token))
    }

    /// Leaves the cluster at shutdown: stops serving (the owners have
    /// finished), then revokes the lease, which releases this replica's
    /// member and owner keys at once so that the others take over without
    /// waiting for the TTL.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        self.ownership.shutdown().await;
        self.membership.leave().await;
    }
}

/// A tenant just created, as `CreateTenant` shows it.
fn new_tenant(record: &TenantRecord, owner: String) -> v1::Tenant {
    v1::Tenant {
        name: record.name.clone(),
        created_at: Some(crate::wire::timestamp_from_ms(record.created_at_ms)),
        limits: Some(record.limits.to_proto()),
        status: Some(v1::TenantStatus {
            tenant: record.name.clone(),
            generation: record.generation,
            observed_generation: record.observed_generation,
            revision: record.revision,
            owner,
            ..v1::TenantStatus::default()
        }),
        quarantine_error: String::new(),
    }
}
