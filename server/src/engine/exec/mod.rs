//! The executor's rooms: what a configurator declares for a type
//! ([`spec`]) and the messages between the executor and the agents'
//! sessions ([`port`]); `api/configurators.rs` adapts the port to the wire.

pub mod lost;
pub mod port;
pub mod registry;
pub mod room;
pub mod spec;

pub use registry::{RegisteredType, TypeRegistry};
pub use room::{Limits, Room, Running};
pub use spec::{DEFAULT_MAX_IN_FLIGHT, DEFAULT_OPERATION_TIMEOUT_MS, RetryPolicy, TypeSpec};
