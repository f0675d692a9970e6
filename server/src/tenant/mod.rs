//! Tenants at run time: each tenant's state lives with one owner task that
//! alone changes it; readers use published snapshots.

pub mod clock;
#[cfg(test)]
mod corrupt_records;
pub mod directory;
pub mod error;
pub mod fair;
pub mod oplog;
pub mod owner;
pub mod persist;
pub mod record;
pub mod repair;
pub mod revision_floor;
pub mod revocation;
pub mod snapshot;
pub mod state;

pub use crate::engine::exec::port::ExternalChange;
pub use crate::engine::intent::ValidatedSubmit;
pub use clock::{Clock, SimulatedClock, SystemClock};
pub use directory::{DirectoryError, Quarantined, TenantDirectory};
pub use error::TenantError;
pub use fair::{FairWorkers, fairly, off_async_workers};
pub use owner::{OwnerSettings, RegistrationError, SubmitOutcome, TenantHandle};
pub use record::{TenantLimits, TenantRecord};
pub use revocation::{Revocation, Revoked};
pub use snapshot::{SnapshotHistory, TenantSnapshot};
pub use state::TenantState;
