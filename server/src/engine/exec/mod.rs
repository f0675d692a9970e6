//! The executor of a tenant, pure: [`Executor`] takes inputs (intents,
//! results, registrations, time) and answers with [`Effects`] (one
//! durable commit, then messages to agents). Its rooms: the tenant's state
//! with staged changes ([`model`]) and the items its passes must look at
//! again ([`unconverged`]); what a configurator declares for a
//! type ([`spec`]) and the tenant's registered types ([`registry`]); room
//! for operations under the type and tenant limits ([`room`]); deadlines
//! on the monotonic clock ([`deadlines`]); what becomes of an operation
//! whose outcome was lost ([`lost`]); the messages between the executor
//! and the agents' sessions ([`port`]); what it asks the world to do
//! ([`effects`]). The tenant's owner (`tenant/owner.rs`) carries out the
//! effects; `api/configurators.rs` adapts the port to the wire.

pub mod deadlines;
pub mod effects;
mod executor;
pub mod lost;
pub mod model;
pub mod port;
pub mod registry;
pub mod room;
pub mod spec;
pub mod unconverged;

pub use effects::{Commit, Effects, OperationOutcome, TenantEvent};
pub use executor::{AgentResult, Executor, ExecutorSettings, Now, Submitted, TypeHeld};
pub use model::{ItemWrite, StateCounts, TenantModel, TenantProgress};
pub use registry::{RegisteredType, StoredSpec, TypeRegistry};
pub use room::{Limits, Room, Running};
pub use spec::{DEFAULT_MAX_IN_FLIGHT, DEFAULT_OPERATION_TIMEOUT_MS, RetryPolicy, TypeSpec};
pub use unconverged::UnconvergedSet;
