//! The gRPC edge: the services, tenant views, and the one place where
//! internal errors become `tonic::Status`. The conversions between proto and
//! internal types live one room below, in [`crate::wire`], so that
//! [`crate::watch`] and [`crate::tenant`] can use them without importing
//! from here. Proto types stop here; everything inward speaks the engine's
//! own types, with one exception: watch and fleet events are built, stored
//! and streamed in their wire form (see [`crate::watch`]).

pub mod configurators;
pub mod context;
pub mod paging;
pub mod reconciler;
pub mod status;
pub mod tenants;
pub mod views;
pub mod watch;

pub use configurators::ConfiguratorsService;
pub use context::ApiContext;
pub use reconciler::ReconcilerService;
pub use tenants::TenantsService;
