//! Agent SDK and typed client for reconciled.
//!
//! - [`agent`]: write a remote configurator: implement
//!   [`agent::Configurator`] for your item types and run an [`agent::Agent`],
//!   which speaks the `Configurators.Connect` protocol (registration,
//!   de-duplication, acknowledgements, cancellation, heartbeats, reconnects).
//! - [`Client`]: a typed client for the `Reconciler` and `Tenants` services
//!   with the bearer token attached to every call.
//! - [`Client::watch_resuming`] and [`Client::watch_fleet_resuming`]:
//!   watch streams that reconnect and resume by themselves
//!   ([`ResumingWatch`]), losing and repeating nothing.
//! - [`retry_after`]: whether a failed call is worth sending again, and
//!   after how long (the server's `RetryInfo`, or a lost connection).
//! - [`ClientTls`]: the CA and, for mutual TLS, the client certificate both
//!   use to reach a server that serves TLS.
//! - [`proto`]: the generated types of package `reconciled.v1` (a re-export
//!   of `reconciled_proto::v1`), and [`convert`] between JSON and the
//!   `google.protobuf` types they use.
//! - [`prelude`]: one import for agent authors (`use
//!   reconciled_client::prelude::*;`), including the foreign types the API
//!   exposes (`Code`, JSON values, `CancellationToken`).
//! - `testkit` (feature `testkit`): end-to-end tests of an agent against the
//!   real `reconciled` binary.
//! - [`cli`]: the `reconctl` command-line tool (feature `cli`, on by
//!   default).
//!
//! # Features
//!
//! - `cli` (default): the `reconctl` binary and [`cli`]. An agent turns it
//!   off: `reconciled-client = { path = "../reconciled/client",
//!   default-features = false }` builds the SDK, the typed client and the
//!   prelude only (the crate is not on crates.io: depend on a checkout by
//!   path, or on the repository by `git`).
//! - `testkit`: the `testkit` module, for an agent's
//!   `[dev-dependencies]`: `reconciled-client = { path =
//!   "../reconciled/client", default-features = false, features =
//!   ["testkit"] }`.
//!
//! The crates whose types the API exposes are re-exported ([`tonic`],
//! [`tonic_types`], [`tokio`], [`tokio_util`], [`serde`], [`serde_json`],
//! [`schemars`]), and so is [`tracing`], which the SDK logs through, so an
//! agent or a controller can use exactly the versions this SDK was built
//! with.
#![forbid(unsafe_code)]

pub mod agent;
mod auth;
mod backoff;
mod chain;
#[cfg(feature = "cli")]
pub mod cli;
mod client;
mod connection_env;
pub mod convert;
mod endpoint;
pub mod prelude;
mod resuming;
mod retry;
#[cfg(feature = "testkit")]
pub mod testkit;
mod tls;
mod transport;

/// JSON Schemas of Rust types ([`agent::TypeSpec::schema_of`]); derive
/// `JsonSchema` with `#[schemars(crate = "reconciled_client::schemars")]` if
/// the agent does not depend on `schemars` itself.
pub use schemars;
/// Serialization; derive with `#[serde(crate = "reconciled_client::serde")]`
/// if the agent does not depend on `serde` itself.
pub use serde;
/// JSON values: item properties are `serde_json` objects.
pub use serde_json;
/// The async runtime of this SDK; an agent's `main` may use
/// `#[reconciled_client::tokio::main(crate = "reconciled_client::tokio")]`.
pub use tokio;
/// Cancellation tokens ([`agent::CancellationToken`]).
pub use tokio_util;
/// The gRPC library of this SDK (the version its API is built on).
pub use tonic;
/// The `google.rpc` error details of a [`tonic::Status`] (DESIGN's error
/// table: `ErrorInfo` reasons such as `GENERATION_MISMATCH` with their
/// metadata, `RetryInfo`, `BadRequest`, `QuotaFailure`): decode them with
/// `use reconciled_client::tonic_types::StatusExt as _;` and
/// `status.get_error_details()`, in the version that matches [`tonic`].
pub use tonic_types;
/// The logging facade the SDK reports through (connection failures,
/// `TYPE_HELD` retries, panics in configurators); an agent logs with
/// `reconciled_client::tracing::info!` without a `tracing` dependency of
/// its own. Its output needs a subscriber, e.g. `tracing-subscriber`'s
/// `tracing_subscriber::fmt::init()` in `main`.
pub use tracing;

pub use auth::InvalidToken;
pub use client::{Client, ClientError, MAX_MESSAGE_BYTES};
/// The configurator protocol version this SDK speaks.
pub use reconciled_proto::PROTOCOL_VERSION;
/// The generated types of package `reconciled.v1` (messages, enums and gRPC
/// clients).
pub use reconciled_proto::v1 as proto;
pub use resuming::{Fleet, FleetWatch, Resumed, ResumingWatch, Tenant, TenantWatch, WatchKind};
pub use retry::{UNAVAILABLE_RETRY_DELAY, retry_after};
pub use tls::ClientTls;
