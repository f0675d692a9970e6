//! Configurator sessions as the engine sees them: what the server sends to
//! an agent and what an agent reports, without proto types. The gRPC
//! stream itself lives in `api::configurators`; the executor decides.

use std::sync::Arc;

use super::spec::TypeSpec;
use crate::graph::{Item, ItemRef, OperationError, OperationKind, Properties};

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
        /// What it is doing, for humans (at most [`MAX_PROGRESS_MESSAGE`]
        /// bytes: longer ones are cut).
        message: String,
    },
    /// The agent saw a cancel.
    CancelAck {
        /// The operation.
        op_id: String,
    },
    /// External items changed.
    External(Vec<ExternalChange>),
}

/// A registration request of a session.
#[derive(Clone, Debug)]
pub struct Registration {
    /// The session: unique per server process.
    pub session_id: u64,
    /// The agent's stable id (a reconnect keeps it).
    pub agent_id: String,
    /// The item types it handles.
    pub types: Vec<TypeSpec>,
    /// What the agent still runs from earlier sessions.
    pub outstanding: Outstanding,
}

/// The operations an agent says it still runs, or holds an unacknowledged
/// result of, when it registers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Outstanding {
    /// The agent does not say (an older agent): any lost operation may
    /// still run there.
    #[default]
    Unsaid,
    /// Exactly these op ids; no other operation runs at the agent.
    Listed(std::collections::BTreeSet<String>),
}

impl Outstanding {
    /// Whether the agent holds operation `op_id`: `None` when it does not
    /// say.
    pub fn holds(&self, op_id: &str) -> Option<bool> {
        match self {
            Self::Unsaid => None,
            Self::Listed(op_ids) => Some(op_ids.contains(op_id)),
        }
    }
}

/// A granted type with its epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The type.
    pub item_type: String,
    /// The epoch of this session's ownership.
    pub epoch: u64,
}

/// A change of an external item's reported state (by `ReportExternal` or an
/// agent's external update).
#[derive(Clone, Debug)]
pub enum ExternalChange {
    /// The item exists with these properties; `modified` bumps its
    /// modification counter (dependents with `recreate_when_modified` are
    /// recreated).
    Put {
        /// The reported item (its `external` flag is forced on).
        item: Item,
        /// Whether its content changed in a way dependents must see.
        modified: bool,
    },
    /// The item no longer exists.
    Delete {
        /// Its identity.
        item: ItemRef,
    },
}

/// The longest progress message kept, in bytes; longer ones are cut at a
/// character boundary (an agent's text may not grow a stored record).
pub const MAX_PROGRESS_MESSAGE: usize = 1024;

/// `message` cut to at most [`MAX_PROGRESS_MESSAGE`] bytes.
pub fn bounded_progress_message(mut message: String) -> String {
    cut_at_char_boundary(&mut message, MAX_PROGRESS_MESSAGE);
    message
}

/// The longest error message of an agent's FAILED result kept, in bytes;
/// a longer one is cut, and says so (it is stored with the item and shown
/// in every status of it).
pub const MAX_ERROR_MESSAGE: usize = 4 * 1024;

/// `message` cut to at most [`MAX_ERROR_MESSAGE`] bytes and a note of how
/// long it was.
pub fn bounded_error_message(mut message: String) -> String {
    if message.len() > MAX_ERROR_MESSAGE {
        let length = message.len();
        cut_at_char_boundary(&mut message, MAX_ERROR_MESSAGE);
        message.push_str(&format!(" … (cut from {length} bytes)"));
    }
    message
}

fn cut_at_char_boundary(message: &mut String, limit: usize) {
    if message.len() > limit {
        let mut end = limit;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
}
