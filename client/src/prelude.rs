//! Everything an agent author needs, in one import:
//!
//! ```
//! use reconciled_client::prelude::*;
//! ```
//!
//! It holds the SDK's types and the few foreign types its API exposes, as
//! this crate's own re-exports, so an agent needs no version-matched
//! `tonic`, `serde_json` or `tokio-util` dependency of its own:
//!
//! | name | what it is | exposed by |
//! |---|---|---|
//! | [`Code`] | `tonic::Code`, a gRPC status code | [`Outcome::failed`], [`ReadOutcome::Failed`] |
//! | [`Properties`], [`Value`], [`json!`] | `serde_json` object, value and macro | [`Item::properties`], [`Outcome::done_observed`] |
//! | [`CancellationToken`] | `tokio_util::sync::CancellationToken` | [`OperationContext::cancellation_token`] |
//! | [`tokio`] | the runtime crate | [`Agent::events`] (a `tokio::sync::broadcast::Receiver`) |
//! | [`tracing`] | the logging crate | the SDK's own log (connections, retries, panics) |
//! | [`JsonSchema`] | `schemars::JsonSchema`, trait and derive | [`TypeSpec::schema_of`] |
//!
//! The crates themselves are re-exported at the crate root
//! ([`crate::tonic`], [`crate::serde_json`], [`crate::tokio`],
//! [`crate::tokio_util`], [`crate::serde`], [`crate::schemars`],
//! [`crate::tracing`]) for anything beyond that.
//!
//! A whole agent, written only against the prelude (it is compiled and run
//! as a doc test; `examples/kv-agent` is the same agent as a crate whose only
//! dependency is `reconciled-client` with `default-features = false`):
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::Mutex;
//! use reconciled_client::prelude::*;
//!
//! /// Keeps `kv` items in memory: `{"key": "k", "value": "v"}`.
//! #[derive(Default)]
//! struct Store(Mutex<HashMap<String, Value>>);
//!
//! impl Store {
//!     fn put(&self, item: &Item) -> Outcome {
//!         let Some(key) = item.property("key").and_then(Value::as_str) else {
//!             return Outcome::invalid_argument("set \"key\" to a string");
//!         };
//!         let value = item.property("value").cloned().unwrap_or(Value::Null);
//!         self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(key.into(), value);
//!         Outcome::done()
//!     }
//! }
//!
//! impl Configurator for Store {
//!     async fn create(&self, _ctx: &OperationContext, item: &Item) -> Outcome {
//!         self.put(item)
//!     }
//!     async fn modify(&self, _ctx: &OperationContext, _previous: &Item, item: &Item) -> Outcome {
//!         self.put(item)
//!     }
//!     async fn delete(&self, ctx: &OperationContext, item: &Item) -> Outcome {
//!         if ctx.is_cancelled() {
//!             return Outcome::cancelled();
//!         }
//!         let key = item.property("key").and_then(Value::as_str).unwrap_or_default();
//!         self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
//!         Outcome::done()
//!     }
//! }
//!
//! fn agent(endpoint: &str, token: &str) -> Result<Agent, AgentError> {
//!     Agent::builder(endpoint, "acme", token)
//!         .agent_id("kv-1")
//!         .item_type(
//!             TypeSpec::new("kv").recreate_on_change(["/key"]).max_attempts(5),
//!             Store::default(),
//!         )
//!         .build()
//! }
//!
//! assert!(agent("http://127.0.0.1:50051", "rcd_token").is_ok());
//! // A path that is not a JSON Pointer is refused before anything connects.
//! let refused = Agent::builder("http://127.0.0.1:50051", "acme", "rcd_token")
//!     .item_type(TypeSpec::new("kv").recreate_on_change(["key"]), Store::default())
//!     .build();
//! assert!(matches!(refused, Err(AgentError::InvalidRecreatePath { .. })));
//! ```

pub use crate::agent::{
    Agent, AgentBuilder, AgentError, AgentEvent, AgentHandle, Completion, Configurator, Dependency,
    EnvError, ExternalReport, Grant, Item, ItemRef, OperationContext, OperationKind, Outcome,
    PropertiesError, ReadOutcome, ResultKind, Token, TypeSpec, is_terminal_code, shutdown_signal,
};
pub use crate::{Client, ClientTls};

/// A gRPC status code (`tonic::Code`): what [`Outcome::failed`] and
/// [`ReadOutcome::Failed`] take. See [`is_terminal_code`] for which codes
/// the server retries.
pub use tonic::Code;

/// An item's properties: a JSON object (`serde_json::Map<String, Value>`).
pub type Properties = serde_json::Map<String, serde_json::Value>;

/// A JSON value (`serde_json::Value`), e.g. one property.
pub use serde_json::Value;

/// Builds a [`Value`] from JSON syntax (`serde_json::json!`).
pub use serde_json::json;

/// The async runtime the SDK runs on (the crate `tokio`), for `tokio::fs`,
/// `tokio::select!`, `tokio::spawn` and friends in configurators.
pub use tokio;

/// The logging facade the SDK reports through (the crate `tracing`), for
/// `tracing::info!` and friends in an agent. Nothing is printed until the
/// agent installs a subscriber, e.g. `tracing_subscriber::fmt::init()`.
pub use tracing;

/// Derives the JSON Schema of a properties struct for
/// [`TypeSpec::schema_of`] (`schemars::JsonSchema`, the trait and its
/// derive macro). Without a `schemars` dependency of your own, add
/// `#[schemars(crate = "reconciled_client::schemars")]` to the struct.
pub use schemars::JsonSchema;

/// The token behind [`OperationContext::cancelled`]
/// (`tokio_util::sync::CancellationToken`), e.g. to hand to other tasks.
pub use tokio_util::sync::CancellationToken;
