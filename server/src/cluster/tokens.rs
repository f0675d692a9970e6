//! Tenant tokens on a replica: the fleet-wide catalog's, with this
//! replica's own directory deciding for the tenants it serves, and a
//! bounded catch-up with etcd before a token is refused.
//!
//! A tenant created, or a token rotated, through another replica reaches
//! this one through etcd's watch, typically within milliseconds. A client
//! that creates a tenant on one replica and calls another at once (through
//! a load balancer) would otherwise be refused `UNAUTHENTICATED`, which
//! agents and controllers take as final. So an unknown token waits for
//! the catalog to catch up with what etcd acknowledged first
//! ([`Catalog::catch_up`]).
//!
//! What that costs is bounded whoever sends unknown tokens: one catch-up
//! runs at a time, at least [`CATCH_UP_SPACING`] after the one before,
//! and every call waiting for one is answered by the first that starts
//! after it arrived. So a flood of bad tokens costs etcd at most two
//! keys-only reads (of the name index and of the directory entries,
//! filtered by revision on etcd's side) per spacing, and each bad call
//! waits at most two catch-ups of at most [`CATCH_UP_WAIT`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::debug;

use super::catalog::Catalog;
use crate::auth::TokenDirectory;
use crate::store::EtcdStore;
use crate::tenant::TenantDirectory;

/// The longest one catch-up waits for etcd and the watches.
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(1);

/// The least time between the starts of two catch-ups: each makes etcd
/// look through every tenant's keys (it returns only what changed).
pub const CATCH_UP_SPACING: Duration = Duration::from_millis(100);

/// The tenant tokens of the whole fleet: the catalog's, except that for a
/// tenant this replica serves its owner's own directory decides (a token
/// rotated here is refused here at once, not only once etcd's watch has
/// brought the change back).
pub(super) struct ClusterTokens {
    pub(super) catalog: Arc<Catalog>,
    pub(super) directory: Arc<TenantDirectory>,
    pub(super) catch_ups: Arc<CatchUps>,
}

impl TokenDirectory for ClusterTokens {
    fn tenant_by_token_hash(&self, hash: &[u8; 32]) -> Option<u64> {
        if let Some(id) = self.directory.tenant_by_token_hash(hash) {
            return Some(id);
        }
        let id = self.catalog.tenant_by_token_hash(hash)?;
        match self.catalog.name_of(id) {
            // Served here: the owner's directory decides. Asked again, as
            // the tenant may have been adopted since the first look (its
            // token is then known there); a token refused by the catalog
            // alone would be UNAUTHENTICATED, which an agent takes as final.
            Some(name) if self.directory.get(&name).is_some() => {
                self.directory.tenant_by_token_hash(hash)
            }
            _ => Some(id),
        }
    }

    fn may_lag(&self) -> bool {
        true
    }

    fn catch_up(&self) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.catch_ups.catch_up())
    }
}

/// Catch-ups of the catalog with etcd, one at a time and spaced (see the
/// module docs).
pub(super) struct CatchUps {
    catalog: Arc<Catalog>,
    store: Arc<EtcdStore>,
    /// When the last catch-up started, held while one runs.
    last_started: Mutex<Option<Instant>>,
}

impl CatchUps {
    pub(super) fn new(catalog: Arc<Catalog>, store: Arc<EtcdStore>) -> Self {
        Self {
            catalog,
            store,
            last_started: Mutex::new(None),
        }
    }

    /// Returns once a catch-up that started after this call has ended
    /// (caught up or not).
    async fn catch_up(&self) {
        let arrived = Instant::now();
        let mut last_started = self.last_started.lock().await;
        if let Some(started) = *last_started {
            if started >= arrived {
                return;
            }
            tokio::time::sleep_until(started + CATCH_UP_SPACING).await;
        }
        let started = Instant::now();
        if !self.catalog.catch_up(&self.store, CATCH_UP_WAIT).await {
            debug!("The tenant directory did not catch up with etcd in time.");
        }
        *last_started = Some(started);
    }
}
