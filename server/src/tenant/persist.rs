//! Every key a tenant's owner writes, in one place: a commit of the
//! executor ([`Commit`]) becomes one [`WriteBatch`] here, with the tenant
//! record and the commit's events. This is the seam where a replicated
//! store fences an owner's writes.

use super::error::TenantError;
use super::record::{TenantRecord, encode, encode_intended};
use crate::engine::exec::Commit;
use crate::engine::intent::IntentChange;
use crate::graph::{CurrentItem, ItemRef};
use crate::store::WriteBatch;
use crate::store::keys;
use reconciled_proto::v1;

/// Adds the writes of an executor's commit (items, intent, type specs)
/// for tenant `tenant` to `batch`.
pub fn write_commit(
    batch: &mut WriteBatch,
    tenant: u64,
    commit: &Commit,
) -> Result<(), TenantError> {
    for write in &commit.items {
        put_current(batch, tenant, &write.item, write.after.as_deref())?;
    }
    if let Some(change) = &commit.intent {
        write_intent(batch, tenant, change)?;
    }
    for stored in &commit.specs {
        batch.put(
            keys::type_spec_key(tenant, &stored.spec.item_type),
            encode(stored)?,
        );
    }
    Ok(())
}

/// Adds the writes that store an intent change.
fn write_intent(
    batch: &mut WriteBatch,
    tenant: u64,
    change: &IntentChange,
) -> Result<(), TenantError> {
    for entry in &change.upserts {
        let key = keys::intended_item_key(tenant, entry.item.item_type(), entry.item.name());
        batch.put(key, encode_intended(&entry.item, entry.generation)?);
    }
    for key in &change.removals {
        batch.delete(keys::intended_item_key(tenant, key.item_type(), key.name()));
    }
    Ok(())
}

/// Writes `item`'s current value (`None`: deletes it).
fn put_current(
    batch: &mut WriteBatch,
    tenant: u64,
    item: &ItemRef,
    value: Option<&CurrentItem>,
) -> Result<(), TenantError> {
    let key = keys::current_item_key(tenant, item.item_type(), item.name());
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

/// Writes the tenant record.
pub fn put_record(batch: &mut WriteBatch, record: &TenantRecord) -> Result<(), TenantError> {
    batch.put(keys::tenant_record_key(record.id), encode(record)?);
    Ok(())
}

/// Writes the events of revision `revision`; returns the bytes they store.
pub fn put_events(batch: &mut WriteBatch, tenant: u64, revision: u64, events: &[v1::Event]) -> u64 {
    crate::watch::history::write_revision(batch, tenant, revision, events)
}
