//! [`AgentEvent`]: what an agent did, broadcast for tests and observability.

use tonic::Code;

use super::item::Item;
use super::outcome::{OperationKind, ResultKind};

/// Ownership of one item type by this agent's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The item type.
    pub item_type: String,
    /// The type's epoch (grows with every takeover).
    pub epoch: u64,
}

/// Something the agent did or saw. Subscribe with
/// [`Agent::events`](super::Agent::events) or
/// [`AgentHandle::events`](super::AgentHandle::events); black-box tests wait
/// for these with deadlines instead of sleeping.
///
/// Events go through a `tokio::sync::broadcast` channel of
/// [`EVENT_CAPACITY`](super::EVENT_CAPACITY): a subscriber that falls further
/// behind gets `RecvError::Lagged` and misses the oldest ones.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AgentEvent {
    /// The server accepted the registration (`Registered`).
    Connected {
        /// The session id the server gave.
        session_id: String,
        /// The types the session owns, with their epochs.
        granted: Vec<Grant>,
    },
    /// A session ended, or a connection attempt failed; the agent retries
    /// unless the refusal is permanent (then `run` returns the error).
    Disconnected {
        /// Why, e.g. the status the server ended the stream with.
        reason: String,
        /// The gRPC code the server ended the stream with, if it did.
        code: Option<Code>,
    },
    /// An operation was started.
    OperationReceived {
        /// The operation id.
        op_id: String,
        /// The attempt number.
        attempt: u32,
        /// What to do.
        kind: OperationKind,
        /// The item (intended value for Create/Modify, current for Delete).
        item: Item,
    },
    /// A request for an operation already running or already answered was
    /// de-duplicated (not run again).
    DuplicateOperation {
        /// The operation id.
        op_id: String,
        /// The attempt number.
        attempt: u32,
    },
    /// An `OperationResult` was sent.
    ResultSent {
        /// The operation id.
        op_id: String,
        /// The attempt number.
        attempt: u32,
        /// What the result says.
        outcome: ResultKind,
        /// Sent again (after a reconnect, or for a repeated request).
        resent: bool,
    },
    /// The server acknowledged a result; the agent forgot it.
    ResultAcked {
        /// The operation id.
        op_id: String,
        /// The attempt number.
        attempt: u32,
    },
    /// The server cancelled an operation; its cancellation token fired.
    Cancelled {
        /// The operation id.
        op_id: String,
    },
    /// The agent answered a cancel with `CancelAck` (once the cancelled
    /// operation's result was sent).
    CancelAcked {
        /// The operation id.
        op_id: String,
    },
}
