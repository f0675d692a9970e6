//! Agent SDK and typed client for reconciled.
//!
//! - [`agent`]: write a remote configurator: implement
//!   [`agent::Configurator`] for your item types and run an [`agent::Agent`],
//!   which speaks the `Configurators.Connect` protocol (registration,
//!   de-duplication, acknowledgements, cancellation, heartbeats, reconnects).
//! - [`Client`]: a typed client for the `Reconciler` and `Tenants` services
//!   with the bearer token attached to every call.
//! - [`ClientTls`]: the CA and, for mutual TLS, the client certificate both
//!   use to reach a server that serves TLS.
//! - [`proto`]: the generated types of package `reconciled.v1` (a re-export
//!   of `reconciled_proto::v1`), and [`convert`] between JSON and the
//!   `google.protobuf` types they use.
//! - [`cli`]: the `reconctl` command-line tool (feature `cli`, on by
//!   default).
#![forbid(unsafe_code)]

pub mod agent;
mod auth;
#[cfg(feature = "cli")]
pub mod cli;
mod client;
pub mod convert;
mod tls;

pub use auth::InvalidToken;
pub use client::{Client, ClientError, MAX_MESSAGE_BYTES};
/// The configurator protocol version this SDK speaks.
pub use reconciled_proto::PROTOCOL_VERSION;
/// The generated types of package `reconciled.v1` (messages, enums and gRPC
/// clients).
pub use reconciled_proto::v1 as proto;
pub use tls::ClientTls;
