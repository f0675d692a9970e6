//! Watch: the per-tenant event stream (`Reconciler.Watch`) and the fleet
//! stream (`Tenants.WatchFleet`), DESIGN section 7.
//!
//! Every commit of a tenant bumps its revision once and stores the
//! commit's events in the same atomic write ([`history`]); after the commit
//! is durable they are published to the tenant's [`hub::Hub`], a bounded
//! ring that writers never wait on. A watcher ([`stream::follow`]) reads
//! history until it reaches the ring, then follows the ring; a watcher that
//! falls out of the ring is ended with `RESOURCE_EXHAUSTED`. The fleet log
//! ([`fleet`]) is one sequence for all tenants' condition changes,
//! assigned in commit order.
//!
//! Events travel and are stored in their wire form (`reconciled.v1`), so a
//! resumed stream carries exactly what the live one did.

pub mod error;
pub mod fleet;
pub mod history;
pub mod hub;
pub mod stream;
pub mod tenant;

pub use error::WatchError;
pub use history::Retention;
pub use stream::FollowSettings;
pub use tenant::{TenantEvents, TenantFilter};
