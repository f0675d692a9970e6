//! Every key a tenant's owner writes, in one place: intended items, current
//! items, registered type specs, the tenant record and its event log.
//!
//! Each owner commit is built from these functions into one [`WriteBatch`].
//! This is the seam where a replicated store's fencing (DESIGN section 11:
//! every commit conditional on the owner still holding the tenant) hooks
//! in. The directory's own keys (names, ids, tombstones, purges) are the
//! directory's, in `tenant/directory.rs`.

use serde::{Deserialize, Serialize};

use super::error::TenantError;
use super::record::{StoredIntended, TenantRecord, encode};
use crate::engine::exec::TypeSpec;
use crate::graph::{CurrentItem, ItemRef};
use crate::store::WriteBatch;
use crate::store::keys;
use reconciled_proto::v1;

/// A registered item type as stored: the spec and the epoch of its owner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredSpec {
    /// The spec the last registration declared.
    pub spec: TypeSpec,
    /// The epoch granted to that registration.
    pub epoch: u64,
}

/// Stores an intended item of tenant `tenant`.
pub fn put_intended(
    batch: &mut WriteBatch,
    tenant: u64,
    stored: &StoredIntended,
) -> Result<(), TenantError> {
    let key = keys::intended_item_key(tenant, &stored.item.item_type, &stored.item.name);
    batch.put(key, encode(stored)?);
    Ok(())
}

/// Removes an intended item of tenant `tenant`.
pub fn delete_intended(batch: &mut WriteBatch, tenant: u64, item: &ItemRef) {
    batch.delete(keys::intended_item_key(tenant, &item.item_type, &item.name));
}

/// Stores `value` as `item`'s current record (`None` deletes it).
pub fn put_current(
    batch: &mut WriteBatch,
    tenant: u64,
    item: &ItemRef,
    value: Option<&CurrentItem>,
) -> Result<(), TenantError> {
    let key = keys::current_item_key(tenant, &item.item_type, &item.name);
    match value {
        Some(current) => {
            batch.put(key, encode(current)?);
        }
        None => {
            batch.delete(key);
        }
    }
    Ok(())
}

/// Stores the spec of a registered item type.
pub fn put_type_spec(
    batch: &mut WriteBatch,
    tenant: u64,
    stored: &StoredSpec,
) -> Result<(), TenantError> {
    batch.put(
        keys::type_spec_key(tenant, &stored.spec.item_type),
        encode(stored)?,
    );
    Ok(())
}

/// Stores the tenant record (every owner commit writes it: its revision is
/// the commit's).
pub fn put_record(batch: &mut WriteBatch, record: &TenantRecord) -> Result<(), TenantError> {
    batch.put(keys::tenant_record_key(record.id), encode(record)?);
    Ok(())
}

/// Stores the events of revision `revision` in the tenant's event log.
pub fn put_events(batch: &mut WriteBatch, tenant: u64, revision: u64, events: &[v1::Event]) {
    crate::watch::history::write_revision(batch, tenant, revision, events);
}
