//! The wire room: conversions between the proto types of `reconciled.v1`
//! (and `google.rpc` / `google.protobuf`) and the engine's own types
//! (`graph::Item`, `Plan`, conditions, ...). Pure functions, no I/O.
//!
//! This room sits below [`crate::api`], [`crate::watch`] and
//! [`crate::tenant`], which all speak proto at their edges (the services,
//! stored watch events, fleet events); it depends only on the proto crate,
//! [`crate::graph`] and [`crate::engine`].
//!
//! Conversions from proto report problems as
//! [`FieldViolation`](crate::graph::validate::FieldViolation)s with the full
//! field path (`items[3].properties.foo.bar`), ready for a `BadRequest`.
//! Conversions to proto cannot fail.
//!
//! - `properties`: properties <-> `google.protobuf.Struct`.
//! - `items`: item identities, items, dependencies, intended items.
//! - `status`: item states, operation kinds, wait reasons, operation errors
//!   <-> `google.rpc.Status`, item statuses, in-flight operations, conditions.
//! - `time`: timestamps and durations.
//! - `plan`: plans.
//! - `events`: a tenant's watch events, from the executor's events.
//! - `fleet`: fleet events.
//! - `types`: registered item type specs.

mod events;
mod fleet;
mod items;
mod plan;
mod properties;
mod status;
#[cfg(test)]
mod testkit;
mod time;
mod types;

pub use events::{events_to_proto, stamp};
pub use fleet::fleet_event;
pub use items::{
    intended_item_to_proto, item_from_proto, item_from_proto_at, item_ref_from_proto,
    item_ref_to_proto, item_to_proto,
};
pub use plan::{
    PLAN_LIMIT, plan_to_proto, plan_to_proto_counting_tenant_waiting, plan_to_proto_with_items,
};
pub use properties::{properties_from_struct, properties_to_struct};
pub use status::{
    condition_to_proto, in_flight_to_proto, item_state_to_proto, item_status,
    operation_error_from_status, operation_error_to_status, operation_kind_to_proto,
    wait_reason_to_proto,
};
pub use time::{duration_from_ms, duration_to_ms, timestamp_from_ms};
pub use types::type_spec_to_proto;
