//! The executor's rooms, pure: what a configurator declares for a type
//! ([`spec`]) and the tenant's registered types ([`registry`]); room for
//! operations under the type and tenant limits ([`room`]); what becomes of
//! an operation whose outcome was lost ([`lost`]); the messages between the
//! executor and the agents' sessions ([`port`]). The tenant's owner
//! (`tenant/owner.rs`, `tenant/sessions.rs`) applies their decisions;
//! `api/configurators.rs` adapts the port to the wire.

pub mod lost;
pub mod port;
pub mod registry;
pub mod room;
pub mod spec;

pub use registry::{RegisteredType, TypeRegistry};
pub use room::{Limits, Room, Running};
pub use spec::{DEFAULT_MAX_IN_FLIGHT, DEFAULT_OPERATION_TIMEOUT_MS, RetryPolicy, TypeSpec};
