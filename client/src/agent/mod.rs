//! The agent SDK: implement [`Configurator`] for your item types, describe
//! each type with a [`TypeSpec`], and [`Agent::run`] does the rest of the
//! `Configurators.Connect` protocol (DESIGN section 4):
//!
//! - connects with `authorization: Bearer <token>`, sends `Register` with
//!   [`PROTOCOL_VERSION`](reconciled_proto::PROTOCOL_VERSION) and the specs,
//!   and waits for `Registered`;
//! - runs each operation in its own task (at most the type's
//!   [`max_in_flight`](TypeSpec::max_in_flight) at once), with an
//!   [`OperationContext`] for cancellation, progress and long-running
//!   operations ([`OperationContext::finish_later`]);
//! - de-duplicates requests on (op_id, attempt), keeps every result until
//!   the server acknowledges it and resends it after reconnecting;
//! - answers `CancelOperation` by firing the operation's cancellation token
//!   and sending `CancelAck` once its result is out;
//! - runs two attempts of one operation never at once: a retry (same op_id,
//!   next attempt, e.g. after a timeout) cancels the older attempt and
//!   starts when it has returned, so a configurator must return once its
//!   context is cancelled ([`OperationContext::cancelled`]);
//! - asks the configurator again when the server re-asks after `WAIT`
//!   (same op_id and attempt);
//! - sends heartbeats every `heartbeat_interval` and reconnects when the
//!   server falls silent for its lease;
//! - reconnects with exponential backoff and jitter (100 ms doubling to 5 s
//!   by default) after any error except a permanent refusal
//!   ([`AgentError`]); a type held by another agent (`TYPE_HELD`) is retried,
//!   since that agent's lease may expire.
//!
//! A configurator that stops because it was cancelled returns
//! [`Outcome::cancelled`] ("cancelled as asked", not a failed attempt).
//! `use reconciled_client::prelude::*` imports all of this module an agent
//! needs; the guide `docs/agents.md` goes from an empty crate to a tested
//! agent. [`Agent::builder_from_env`] takes the server, tenant and token
//! from the variables reconctl reads (`RECONCILED_ADDR`,
//! `RECONCILED_TENANT`, `RECONCILED_TOKEN` or `RECONCILED_TOKEN_FILE`)
//! instead of arguments.
//!
//! ```no_run
//! use std::time::Duration;
//! use reconciled_client::agent::{Agent, Configurator, Item, OperationContext, Outcome, TypeSpec};
//!
//! struct Printer;
//!
//! impl Configurator for Printer {
//!     async fn create(&self, _ctx: &OperationContext, item: &Item) -> Outcome {
//!         println!("create {}", item.item_ref());
//!         Outcome::done()
//!     }
//!     async fn modify(&self, _ctx: &OperationContext, _previous: &Item, item: &Item) -> Outcome {
//!         println!("modify {}", item.item_ref());
//!         Outcome::done()
//!     }
//!     async fn delete(&self, _ctx: &OperationContext, item: &Item) -> Outcome {
//!         println!("delete {}", item.item_ref());
//!         Outcome::done()
//!     }
//! }
//!
//! # async fn example() -> Result<(), reconciled_client::agent::AgentError> {
//! let agent = Agent::builder("http://127.0.0.1:50051", "acme", "rcd_...")
//!     .agent_id("printer-1")
//!     .item_type(TypeSpec::new("printer").max_in_flight(4), Printer)
//!     .build()?;
//! let mut events = agent.events();
//! tokio::spawn(async move {
//!     while let Ok(event) = events.recv().await {
//!         println!("{event:?}");
//!     }
//! });
//! agent.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
//! # Ok(())
//! # }
//! ```

mod configurator;
mod context;
mod env;
mod env_error;
mod error;
mod events;
mod item;
mod outcome;
mod runner;
mod session;
mod shutdown;
mod spec;
mod targets;
mod token;

pub use configurator::Configurator;
pub use context::{Completion, OperationContext};
pub use env_error::EnvError;
pub use error::{AgentError, REASON_TYPE_HELD, REASON_UNSUPPORTED_PROTOCOL};
pub use events::{AgentEvent, Grant};
pub use item::{Dependency, ExternalReport, Item, ItemRef, PropertiesError};
pub use outcome::{OperationKind, Outcome, ReadOutcome, ResultKind, is_terminal_code};
pub use runner::{Agent, AgentBuilder, AgentHandle, AgentStopped, EVENT_CAPACITY};
pub use shutdown::shutdown_signal;
pub use spec::TypeSpec;
pub use targets::REASON_NOT_OWNER;
pub use token::Token;
/// The token behind [`OperationContext::cancelled`] (re-exported from
/// `tokio-util`, so agents need no version-matched dependency on it).
pub use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
