//! Configurator sessions as the engine sees them: what the server sends to
//! an agent and what an agent reports, without proto types. The gRPC
//! stream itself lives in `api::configurators`; the tenant owner decides.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::engine::exec::TypeSpec;
use crate::graph::{Item, OperationError, OperationKind, Properties};
use crate::tenant::ExternalChange;

/// An operation for an agent to run.
#[derive(Clone, Debug)]
pub struct OperationOrder {
    /// Names one operation on one item toward one target generation.
    pub op_id: String,
    /// 1 for the first try.
    pub attempt: u32,
    /// The type's epoch when the operation was sent.
    pub epoch: u64,
    /// What to do.
    pub kind: OperationKind,
    /// Intended value (Create/Modify) or current value (Delete).
    pub item: Arc<Item>,
    /// The applied value, for a Modify.
    pub previous: Option<Arc<Item>>,
    /// How long the agent has.
    pub timeout_ms: u64,
    /// The target generation.
    pub generation: u64,
    /// The applied value may not be what exists (an earlier outcome was lost).
    pub previous_uncertain: bool,
    /// Ask whether the change needs a recreate (NEEDS_RECREATE) instead of
    /// applying it.
    pub question: bool,
}

/// A message from the server to an agent.
#[derive(Clone, Debug)]
pub enum ToAgent {
    /// Run an operation.
    Operation(OperationOrder),
    /// Stop an operation whose target was superseded.
    Cancel {
        /// The operation.
        op_id: String,
    },
    /// A result was durably recorded.
    Ack {
        /// The operation.
        op_id: String,
        /// Its attempt.
        attempt: u32,
    },
}

/// What an agent says an operation did.
#[derive(Clone, Debug, PartialEq)]
pub enum AgentOutcome {
    /// Applied.
    Done {
        /// Observed properties, if reported.
        observed: Option<Properties>,
        /// The answer to a NEEDS_RECREATE question.
        needs_recreate: bool,
    },
    /// Accepted; a second result follows.
    InProgress,
    /// Failed with a gRPC code.
    Failed(OperationError),
    /// Ask again later without counting an attempt.
    Wait {
        /// How long to wait.
        retry_after_ms: u64,
    },
}

/// A message from an agent to the server.
#[derive(Clone, Debug)]
pub enum FromAgent {
    /// An operation's outcome.
    Result {
        /// The operation.
        op_id: String,
        /// Its attempt.
        attempt: u32,
        /// What happened.
        outcome: AgentOutcome,
    },
    /// A long-running operation is alive.
    Progress {
        /// The operation.
        op_id: String,
        /// Its attempt.
        attempt: u32,
    },
    /// The agent saw a cancel.
    CancelAck {
        /// The operation.
        op_id: String,
    },
    /// External items changed.
    External(Vec<ExternalChange>),
}

/// A live session as its tenant's owner knows it.
#[derive(Clone, Debug)]
pub struct SessionLink {
    /// Unique per server process.
    pub session_id: u64,
    /// The agent's stable id (a reconnect keeps it).
    pub agent_id: String,
    /// Messages to the agent.
    pub sender: mpsc::UnboundedSender<ToAgent>,
}

/// A registration request.
#[derive(Clone, Debug)]
pub struct Registration {
    /// The session.
    pub link: SessionLink,
    /// The item types it handles.
    pub types: Vec<TypeSpec>,
}

/// Why a registration was refused.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RegistrationError {
    /// Another live agent holds a type.
    #[error("item type {item_type:?} is held by agent {holder:?}")]
    TypeHeld {
        /// The type.
        item_type: String,
        /// The holding agent.
        holder: String,
    },
    /// The registration could not be stored.
    #[error(transparent)]
    Tenant(#[from] crate::tenant::TenantError),
}

/// A granted type with its epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The type.
    pub item_type: String,
    /// The epoch of this session's ownership.
    pub epoch: u64,
}
