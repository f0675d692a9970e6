//! What every service needs: the tenant directory, the admin token, the
//! request limits; authentication; and the mapping from tenant errors to
//! API errors.

use std::sync::Arc;

use tonic::metadata::MetadataMap;

use reconciled_proto::v1;

use crate::auth::{AdminToken, Caller, TokenDirectory, authenticate};
use crate::cluster::Cluster;
use crate::engine::intent::IntentError;
use crate::graph::validate::{FieldViolation, ValidationLimits};
use crate::status::{ApiError, reason};
use crate::store::StoreError;
use crate::tenant::{
    DirectoryError, Revocation, Revoked, TenantDirectory, TenantError, TenantHandle, TenantSnapshot,
};
use crate::watch::FollowSettings;
use crate::watch::fleet::FleetLog;

/// Shared state of the gRPC services.
#[derive(Clone)]
pub struct ApiContext {
    /// Every live tenant this process serves.
    pub directory: Arc<TenantDirectory>,
    /// The tenant tokens accepted: the directory's, or with replicas on
    /// etcd every tenant's (the cluster's catalog).
    pub tokens: Arc<dyn TokenDirectory + Send + Sync>,
    /// With replicas on etcd: this replica's part in the cluster.
    pub cluster: Option<Arc<Cluster>>,
    /// The admin token.
    pub admin: Arc<AdminToken>,
    /// Limits applied to submitted items.
    pub limits: ValidationLimits,
    /// `max_items` of tenants whose own limit is 0.
    pub default_max_items: usize,
    /// How often configurator sessions exchange heartbeats.
    pub heartbeat_interval: std::time::Duration,
    /// How long a session may stay silent before it is closed.
    pub lease: std::time::Duration,
    /// Cancelled when the server shuts down: every server stream (Connect
    /// sessions, watches) ends with `UNAVAILABLE` so the drain can finish.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// Agents connected per tenant, against the tenants' `max_agents`.
    pub agents: Arc<crate::limits::AgentCounts>,
    /// The fleet log, for `WatchFleet`.
    pub fleet: Arc<FleetLog>,
    /// How watch streams behave.
    pub watch: WatchSettings,
    /// The most bytes a unary reply may encode to: a little under the
    /// server's `max_message_bytes`, so that GetGraph pages and plans are
    /// cut to fit instead of failing with `OUT_OF_RANGE`.
    pub reply_bytes: usize,
    /// The seats of heavy work, shared fairly by tenants with their
    /// owners: large requests are validated and large pages built on one.
    pub workers: Arc<crate::tenant::FairWorkers>,
}

/// A request or reply of more items than this is validated or built on a
/// seat of the [`ApiContext::workers`].
pub const LARGE_REQUEST_ITEMS: usize = 1_000;

/// What a unary reply keeps free below `max_message_bytes`, for the
/// fields outside the part that is cut to fit.
pub const REPLY_HEADROOM: usize = 4 * 1024;

/// How watch streams behave.
#[derive(Clone, Copy, Debug)]
pub struct WatchSettings {
    /// Bookmarks, message sizes, slow-consumer advice.
    pub follow: FollowSettings,
    /// Open Watch streams per tenant whose own limit is 0.
    pub max_watchers_per_tenant: usize,
}

impl ApiContext {
    /// Authenticates the caller from the request metadata.
    pub fn caller(&self, metadata: &MetadataMap) -> Result<Caller, ApiError> {
        authenticate(metadata, &self.admin, &*self.tokens)
    }

    /// The tenant `name`, if the caller may see it; otherwise NOT_FOUND
    /// (whether it exists or not, so tenants cannot probe each other).
    /// With replicas on etcd, a tenant another replica serves (calls reach
    /// it here only while it moves) answers `UNAVAILABLE` `NOT_OWNER`.
    pub fn tenant(&self, caller: Caller, name: &str) -> Result<TenantHandle, ApiError> {
        if let Some(cluster) = &self.cluster
            && self.directory.get(name).is_none()
            && self.directory.quarantined(name).is_none()
            && let Some(id) = cluster.catalog().id_of(name)
            && caller.may_access(id)
        {
            return Err(cluster.not_owner(name));
        }
        match self.directory.get(name) {
            Some(handle) if caller.may_access(handle.id) => Ok(handle),
            None if caller == Caller::Admin
                && let Some(quarantined) = self.directory.quarantined(name) =>
            {
                Err(ApiError::TenantQuarantined {
                    name: name.to_string(),
                    error: quarantined.error,
                })
            }
            _ => Err(ApiError::NotFound {
                what: format!("tenant {name:?}"),
            }),
        }
    }

    /// What ends a stream opened by `caller` (with the credentials in
    /// `metadata`) once those credentials are revoked: a tenant token's
    /// rotation or the tenant's deletion. The admin token is never revoked
    /// while the server runs. Authenticates again after taking the signal,
    /// so a rotation that raced the first check is refused here.
    pub fn revocation(
        &self,
        caller: Caller,
        metadata: &MetadataMap,
    ) -> Result<Revocation, ApiError> {
        match caller {
            Caller::Admin => Ok(Revocation::default()),
            Caller::Tenant { tenant_id } => {
                let revocation = self.directory.credential_revoked(tenant_id);
                if self.caller(metadata)? != caller {
                    return Err(credentials_revoked(revocation.why()));
                }
                Ok(revocation)
            }
        }
    }

    /// The API error of a failed call to tenant `name`'s owner. With
    /// replicas on etcd, an owner that stopped because the tenant moved
    /// (not deleted), or whose commit was fenced out, wrote nothing:
    /// `UNAVAILABLE` `NOT_OWNER`, so that the caller retries.
    pub fn owner_failed(&self, name: &str, error: TenantError) -> ApiError {
        if let Some(cluster) = &self.cluster {
            let moved = match &error {
                TenantError::Gone => cluster.catalog().id_of(name).is_some(),
                TenantError::Store(StoreError::Fenced { .. }) => true,
                _ => false,
            };
            if moved {
                return cluster.not_owner(name);
            }
        }
        ApiError::from(error)
    }

    /// The API error of a failed `DeleteTenant` or `RotateToken` of tenant
    /// `name`. With replicas on etcd, one whose write was fenced out (this
    /// replica lost the tenant while carrying it out: nothing was written),
    /// or that found the tenant gone from here although it still exists
    /// (it moved meanwhile), answers `UNAVAILABLE` `NOT_OWNER`, so that
    /// the caller retries and reaches the new owner; not `INTERNAL` or
    /// `NOT_FOUND`, which callers take as final.
    pub fn admin_failed(&self, name: &str, error: DirectoryError) -> ApiError {
        match error {
            DirectoryError::Tenant(error) => self.owner_failed(name, error),
            DirectoryError::NotFound(_)
                if self
                    .cluster
                    .as_ref()
                    .is_some_and(|cluster| cluster.catalog().id_of(name).is_some()) =>
            {
                self.owner_failed(name, TenantError::Gone)
            }
            other => ApiError::from(other),
        }
    }

    /// A tenant's status as of `snapshot`, naming this replica as its
    /// owner when replicas share etcd.
    pub fn status_of(&self, snapshot: &TenantSnapshot) -> v1::TenantStatus {
        let mut status = super::views::tenant_status(snapshot);
        if let Some(cluster) = &self.cluster {
            status.owner = cluster.advertise().to_owned();
        }
        status
    }

    /// A tenant as of `snapshot`, naming this replica as its owner when
    /// replicas share etcd.
    pub fn tenant_of(&self, snapshot: &TenantSnapshot) -> v1::Tenant {
        let mut tenant = super::views::tenant_to_proto(snapshot);
        tenant.status = Some(self.status_of(snapshot));
        tenant
    }

    /// Refuses callers that are not the admin.
    pub fn require_admin(&self, caller: Caller) -> Result<(), ApiError> {
        if caller.is_admin() {
            Ok(())
        } else {
            Err(ApiError::PermissionDenied {
                message: String::from(
                    "this RPC needs the admin token; tenant tokens may only use their own tenant",
                ),
            })
        }
    }
}

impl From<IntentError> for ApiError {
    fn from(error: IntentError) -> Self {
        match error {
            IntentError::Invalid { violations } => ApiError::invalid_argument(violations),
            IntentError::DependencyCycle { cycle, field } => {
                ApiError::dependency_cycle(field, &cycle)
            }
            IntentError::ItemInOtherSubgraph {
                field,
                item,
                subgraph,
            } => ApiError::ItemInOtherSubgraph {
                field,
                item,
                subgraph,
            },
            IntentError::GenerationMismatch { expected, actual } => {
                ApiError::GenerationMismatch { expected, actual }
            }
            IntentError::Quota {
                subject,
                description,
            } => ApiError::QuotaExceeded {
                subject,
                description,
            },
        }
    }
}

impl From<TenantError> for ApiError {
    fn from(error: TenantError) -> Self {
        match error {
            TenantError::Intent(error) => error.into(),
            TenantError::Gone => ApiError::NotFound {
                what: "tenant".into(),
            },
            TenantError::Corrupt { .. } | TenantError::Encode { .. } | TenantError::Store(_) => {
                ApiError::internal(error.to_string())
            }
        }
    }
}

impl From<DirectoryError> for ApiError {
    fn from(error: DirectoryError) -> Self {
        match error {
            DirectoryError::AlreadyExists(name) => ApiError::AlreadyExists {
                what: format!("tenant {name:?}"),
            },
            DirectoryError::NotFound(name) => ApiError::NotFound {
                what: format!("tenant {name:?}"),
            },
            DirectoryError::Quarantined { name, error } => {
                ApiError::TenantQuarantined { name, error }
            }
            DirectoryError::Token(message) => ApiError::internal(message),
            DirectoryError::Tenant(error) => error.into(),
        }
    }
}

/// The status that ends a stream whose tenant token was rotated or whose
/// tenant was deleted (`why`, when known): `UNAUTHENTICATED`, with an
/// `ErrorInfo` reason `TOKEN_ROTATED` or `TENANT_DELETED`.
pub fn credentials_revoked(why: Option<Revoked>) -> ApiError {
    match why {
        Some(Revoked::Rotated) => ApiError::unauthenticated_because(
            "the tenant's token was rotated: the token this stream was opened with is no \
             longer valid; reconnect with the new token",
            reason::TOKEN_ROTATED,
        ),
        Some(Revoked::Deleted) => ApiError::unauthenticated_because(
            "the tenant was deleted: the token this stream was opened with is no longer \
             valid, and no token opens it again",
            reason::TENANT_DELETED,
        ),
        None => ApiError::unauthenticated(
            "the token this stream was opened with is no longer valid (the tenant's token \
             was rotated or the tenant deleted); reconnect with the current token",
        ),
    }
}

/// A single field violation as an API error.
pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> ApiError {
    ApiError::invalid_argument(vec![FieldViolation::new(field, description)])
}
