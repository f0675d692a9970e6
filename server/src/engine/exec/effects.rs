//! What the executor asks the world to do: one durable commit, then
//! messages to agents, and notes for the operation log and metrics. The
//! tenant's owner carries them out in that order: nothing is sent, logged
//! or shown before its transition is durable (DESIGN 4 and 6: committed
//! before acted on).

use std::sync::Arc;

use crate::engine::conditions::Condition;
use crate::engine::exec::model::ItemWrite;
use crate::engine::exec::port::ToAgent;
use crate::engine::exec::registry::StoredSpec;
use crate::engine::intent::IntentChange;
use crate::engine::plan::WaitingItem;
use crate::graph::{CurrentItem, IntendedItem, ItemRef, OperationError, OperationKind};

/// Items an [`TenantEvent::IntentChanged`] names at most.
pub const MAX_CHANGED_REFS: usize = 100;

/// How an operation ended, as observers see it (events, metrics, the
/// operation log). The agent's own words are
/// [`AgentOutcome`](super::port::AgentOutcome); what the item becomes is
/// [`Completion`](crate::engine::transition::Completion).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperationOutcome {
    /// Applied (or read).
    Done,
    /// Failed with an error (which says whether it is terminal).
    Failed,
    /// The agent asked to be asked again later.
    Wait,
    /// The agent stopped it because the server asked it to.
    Cancelled,
}

impl OperationOutcome {
    /// The lower-case name metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Wait => "wait",
            Self::Cancelled => "cancelled",
        }
    }
}

/// Something that happened to a tenant, for its watchers. Encoded for the
/// wire (and the stored history) outside the engine.
#[derive(Clone, Debug)]
pub enum TenantEvent {
    /// The intent changed.
    IntentChanged {
        /// The new generation.
        generation: u64,
        /// How many items were stored or removed.
        count: usize,
        /// The first [`MAX_CHANGED_REFS`] of them.
        items: Vec<ItemRef>,
    },
    /// An item changed: its current entry (its status, or an operation
    /// started on it), or its place in the intent while it has no current
    /// entry (it became PENDING, or stopped being).
    ItemChanged(ItemChange),
    /// An operation's result was recorded.
    OperationFinished {
        /// The item.
        item: ItemRef,
        /// What the operation did.
        kind: OperationKind,
        /// The operation.
        op_id: String,
        /// Its attempt.
        attempt: u32,
        /// How it ended.
        outcome: OperationOutcome,
        /// The agent's error, if it reported one.
        error: Option<OperationError>,
    },
    /// The conditions changed in substance.
    ConditionsChanged {
        /// The new conditions.
        conditions: Vec<Condition>,
        /// The observed generation.
        observed_generation: u64,
    },
    /// An agent took item types.
    AgentConnected {
        /// The agent.
        agent_id: String,
        /// The types, sorted.
        item_types: Vec<String>,
        /// The epoch granted.
        epoch: u64,
    },
    /// An agent's session ended.
    AgentDisconnected {
        /// The agent.
        agent_id: String,
        /// The types it held.
        item_types: Vec<String>,
        /// Why.
        reason: String,
    },
    /// A READ found the item changed behind the service's back.
    DriftDetected {
        /// The item.
        item: ItemRef,
        /// JSON Pointers of the drifted properties.
        paths: Vec<String>,
    },
}

/// An item's change as a watcher sees it (its current entry, or PENDING
/// while it is intended without one), with what its status is made of.
#[derive(Clone, Debug)]
pub struct ItemChange {
    /// The item.
    pub item: ItemRef,
    /// Its value before the commit.
    pub before: Option<Arc<CurrentItem>>,
    /// Its value after the commit.
    pub after: Option<Arc<CurrentItem>>,
    /// Its intended entry after the commit.
    pub intended: Option<Arc<IntendedItem>>,
    /// Whether it was intended before the commit: an intended item without
    /// a current entry is PENDING to a watcher, as in a snapshot.
    pub was_intended: bool,
    /// Why it waits, if it does.
    pub waiting: Option<Arc<WaitingItem>>,
    /// The epoch of the session holding its type.
    pub epoch: u64,
}

/// One atomic, durable commit.
#[derive(Clone, Debug, Default)]
pub struct Commit {
    /// Current items written, with their values before and after.
    pub items: Vec<ItemWrite>,
    /// The intent change stored, if any.
    pub intent: Option<IntentChange>,
    /// Type specs stored, with the epoch of the registration that declared
    /// them and the agent holding them.
    pub specs: Vec<StoredSpec>,
    /// The events of the commit, in order.
    pub events: Vec<TenantEvent>,
    /// Whether the conditions changed in substance (the fleet is told).
    pub conditions_changed: bool,
}

impl Commit {
    /// Whether there is nothing to store.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
            && self.intent.is_none()
            && self.specs.is_empty()
            && self.events.is_empty()
    }
}

/// An operation handed to an agent.
#[derive(Clone, Debug)]
pub struct Started {
    /// The item.
    pub item: ItemRef,
    /// What it does.
    pub kind: OperationKind,
    /// The operation.
    pub op_id: String,
    /// Its attempt.
    pub attempt: u32,
    /// When it started (unix ms).
    pub at_ms: u64,
    /// The error of the attempt before, if any.
    pub previous_error: Option<OperationError>,
}

/// An operation whose result was recorded.
#[derive(Clone, Debug)]
pub struct Finished {
    /// The item.
    pub item: ItemRef,
    /// What it did.
    pub kind: OperationKind,
    /// The operation.
    pub op_id: String,
    /// Its attempt.
    pub attempt: u32,
    /// How it ended.
    pub outcome: OperationOutcome,
    /// How long it ran (ms, wall clock).
    pub duration_ms: u64,
    /// When it ended (unix ms).
    pub at_ms: u64,
    /// Its error, if any.
    pub error: Option<OperationError>,
}

/// A message for one agent session.
#[derive(Clone, Debug)]
pub struct Message {
    /// The session.
    pub session_id: u64,
    /// What to send.
    pub message: ToAgent,
}

/// What the owner does for one input, in this order: send `immediate`
/// (nothing it says depends on the commit), make `commit` durable, then,
/// once it is, tell the executor ([`Executor::committed`]), send `sends`,
/// log `started` and `finished`, and publish a snapshot. If the commit
/// fails, the owner tells the executor ([`Executor::commit_failed`]) and
/// does nothing else.
///
/// [`Executor::committed`]: super::Executor::committed
/// [`Executor::commit_failed`]: super::Executor::commit_failed
#[derive(Debug, Default)]
pub struct Effects {
    /// Messages to send at once.
    pub immediate: Vec<Message>,
    /// What to make durable.
    pub commit: Commit,
    /// Messages to send once the commit is durable.
    pub sends: Vec<Message>,
    /// Operations dispatched by the commit.
    pub started: Vec<Started>,
    /// Operations whose results the commit records.
    pub finished: Vec<Finished>,
}
