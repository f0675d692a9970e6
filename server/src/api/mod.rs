//! The gRPC edge: the services and tenant views. The conversions between
//! proto and internal types live one room below, in [`crate::wire`], so that
//! [`crate::watch`] and [`crate::tenant`] can use them without importing
//! from here; the one place where errors become `tonic::Status` is
//! [`crate::status`], below this room and below [`crate::auth`] and
//! [`crate::limits`], which refuse calls too. Proto types stop here; everything inward speaks the engine's
//! own types, with one exception: watch and fleet events are built, stored
//! and streamed in their wire form (see [`crate::watch`]).

pub mod configurators;
pub mod context;
pub mod externals;
pub mod fleet_list;
#[cfg(test)]
mod fuzz;
pub mod paging;
pub mod reconciler;
pub mod tenants;
pub mod views;
pub mod watch;

pub use configurators::ConfiguratorsService;
pub use context::ApiContext;
pub use reconciler::ReconcilerService;
pub use tenants::TenantsService;
