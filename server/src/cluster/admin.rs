//! Tenant administration across replicas: creating a tenant on any
//! replica, atomically.
//!
//! Two replicas creating the same name at once must not both succeed, and
//! two creating different names must not hand out the same internal id.
//! Creation therefore runs under the etcd lock `locks/tenants` (on this
//! replica's lease), and its commit is fenced on the lock's key: a replica
//! paused while holding the lock, whose lease expired meanwhile, writes
//! nothing. Under the lock: the name is checked, the next id read, and
//! the record, the name index, the next id and the directory entry are
//! written in one commit. Deleting a tenant and rotating its token go to
//! the replica that serves it (see [`forward`](super::forward)), whose
//! owner writes them through its fenced store.

use std::sync::Arc;

use tracing::{info, warn};

use crate::status::ApiError;
use crate::store::{EtcdStore, Store, keys};
use crate::tenant::directory::{creation, next_tenant_id};
use crate::tenant::owner::now_ms;
use crate::tenant::revision_floor;
use crate::tenant::{DirectoryError, TenantError, TenantLimits, TenantRecord};

use super::catalog::{Catalog, TenantEntry};
use super::membership::Membership;

/// The lock that serialises tenant creation across replicas.
const TENANTS_LOCK: &[u8] = b"locks/tenants";

/// Creates tenant `name`; returns its record and its token (shown once).
pub async fn create_tenant(
    store: &EtcdStore,
    records: &Arc<dyn Store>,
    membership: &Membership,
    catalog: &Catalog,
    name: &str,
    limits: TenantLimits,
) -> Result<(TenantRecord, String), ApiError> {
    let lease = membership.current().ok_or_else(|| ApiError::Unavailable {
        message: String::from(
            "this replica is not a member of the cluster right now (its etcd lease is being \
             renewed or replaced); retry in a moment",
        ),
    })?;
    let (held, fence) = store
        .lock_fenced(TENANTS_LOCK, lease.id)
        .await
        .map_err(|error| ApiError::Unavailable {
            message: format!("cannot take the tenant creation lock in etcd: {error}; retry"),
        })?;
    let created = async {
        if records
            .get(&keys::tenant_name_key(name))
            .map_err(TenantError::from)?
            .is_some()
        {
            return Err(DirectoryError::AlreadyExists(name.to_owned()));
        }
        let id = next_tenant_id(&**records)?;
        let floor = revision_floor::read(&**records, name)?;
        let (record, token, mut batch) = creation(id, name, limits, now_ms(), floor)?;
        let entry = TenantEntry::of(&record, now_ms());
        batch.put(keys::tenant_entry_key(name), entry.encode());
        batch.set_fence(Some(fence));
        records.commit(batch).await.map_err(TenantError::from)?;
        // The token works on this replica as soon as CreateTenant answers.
        catalog.note(name, id, entry);
        Ok((record, token))
    }
    .await;
    if let Err(error) = store.unlock(held).await {
        warn!(%error, "Releasing the tenant creation lock failed; it ends with this replica's lease.");
    }
    let (record, token) = created.map_err(|error| match error {
        DirectoryError::Tenant(TenantError::Store(crate::store::StoreError::Fenced { .. })) => {
            ApiError::Unavailable {
                message: String::from(
                    "this replica lost the tenant creation lock before the tenant was \
                     written (nothing was created); retry",
                ),
            }
        }
        other => ApiError::from(other),
    })?;
    info!(tenant = name, tenant_id = record.id, "Tenant created.");
    Ok((record, token))
}
