//! reconciled: keeps, for every tenant, an intended and a current graph of
//! configuration items and drives remote configurators until they match.
//!
//! The crate is organised in rooms with one job each:
//! - [`graph`]: the item model, validation, dependency indexes, predicates (pure).
//! - [`engine`]: the planner (pure) and the executor around it.
//! - [`wire`]: conversions between proto messages and the engine's types
//!   (pure), below [`api`], [`watch`] and [`tenant`].
//! - [`status`]: the one place where errors become `tonic::Status`
//!   ([`status::ApiError`]), below [`api`], [`auth`] and [`limits`].
//! - [`ui`]: the web dashboard (embedded pages, served with the gRPC-Web
//!   endpoint of the same services on `--ui-listen`).
//! - [`cluster`]: replicas on etcd: membership, tenant ownership,
//!   fencing, forwarding (`--store etcd`).
#![forbid(unsafe_code)]

pub mod api;
pub mod auth;
pub mod bootstrap;
pub mod cluster;
pub mod config;
pub mod engine;
pub mod graph;
pub mod limits;
pub mod loopback;
pub mod metrics;
pub mod process_memory;
pub mod server;
pub mod status;
pub mod store;
pub mod telemetry;
pub mod tenant;
pub mod thread_cpu;
pub mod tls;
pub mod ui;
pub mod watch;
pub mod wire;
