//! Read-only views of tenant snapshots as proto messages.

use reconciled_proto::v1;

use crate::tenant::{Quarantined, TenantSnapshot};
use crate::wire::{condition_to_proto, timestamp_from_ms};

/// A tenant's status as of a snapshot.
pub fn tenant_status(snapshot: &TenantSnapshot) -> v1::TenantStatus {
    v1::TenantStatus {
        tenant: snapshot.record.name.clone(),
        generation: snapshot.record.generation,
        observed_generation: snapshot.record.observed_generation,
        revision: snapshot.record.revision,
        conditions: snapshot
            .record
            .conditions
            .iter()
            .map(condition_to_proto)
            .collect(),
        items_by_state: snapshot
            .counts
            .by_state()
            .iter()
            .map(|(state, count)| ((*state).to_string(), *count))
            .collect(),
        intended_items: snapshot.intended.len() as u64,
        operations_in_flight: snapshot.in_flight as u64,
        connected_item_types: snapshot.connected_item_types.clone(),
        // Named by the API context when replicas share etcd.
        owner: String::new(),
    }
}

/// A quarantined tenant as ListTenants shows it: its name and why its
/// records could not be read.
pub fn quarantined_to_proto(name: String, quarantined: &Quarantined) -> v1::Tenant {
    v1::Tenant {
        name,
        quarantine_error: quarantined.error.clone(),
        ..v1::Tenant::default()
    }
}

/// A tenant with its status.
pub fn tenant_to_proto(snapshot: &TenantSnapshot) -> v1::Tenant {
    v1::Tenant {
        name: snapshot.record.name.clone(),
        created_at: Some(timestamp_from_ms(snapshot.record.created_at_ms)),
        limits: Some(snapshot.record.limits.to_proto()),
        status: Some(tenant_status(snapshot)),
        quarantine_error: String::new(),
    }
}
