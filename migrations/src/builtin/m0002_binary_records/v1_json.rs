//! The JSON records of store schema version 1, frozen.
//!
//! A copy of how the server encoded a tenant's records up to version 1
//! (`serde_json` of `TenantRecord`, `StoredIntended`, `CurrentItem` and
//! `StoredSpec`, with the types they hold), kept here so that the migration
//! reads exactly what was written whatever those server types become. Every
//! serde attribute that changes what a record may contain is copied (field
//! defaults, the `marks_as_pairs` encoding, externally tagged enums); like
//! the server, unknown fields are ignored. Only deserialization is needed.
//!
//! Never change this file: it describes data already on disk.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// An item's properties: a JSON object (keys in sorted order).
pub(super) type Properties = serde_json::Map<String, Value>;

/// An item identity (`ItemRef`).
///
/// The derived order (type, then name, by bytes) is the server's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub(super) struct ItemRef {
    /// The item type.
    pub(super) item_type: String,
    /// The item name.
    pub(super) name: String,
}

/// A dependency of an item (`Dependency`); every field is required.
#[derive(Debug, Deserialize)]
pub(super) struct Dependency {
    /// The required item.
    pub(super) requires: ItemRef,
    /// A CEL predicate over the required item; empty: none.
    pub(super) must_satisfy: String,
    /// For humans.
    pub(super) description: String,
    /// Recreate the dependent when the required item is modified.
    pub(super) recreate_when_modified: bool,
    /// The dependent goes away with the required external item.
    pub(super) auto_deleted_by_external: bool,
}

/// An item value (`Item`); every field is required.
#[derive(Debug, Deserialize)]
pub(super) struct Item {
    /// The item type.
    pub(super) item_type: String,
    /// The item name.
    pub(super) name: String,
    /// The properties object.
    pub(super) properties: Properties,
    /// The items it requires.
    pub(super) dependencies: Vec<Dependency>,
    /// Reported by an agent, never operated on.
    pub(super) external: bool,
    /// The subgraph that lists it.
    pub(super) subgraph: String,
    /// A display label.
    pub(super) label: String,
    /// For humans.
    pub(super) description: String,
}

/// Where a current item stands (`ItemState`): a unit variant's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(super) enum ItemState {
    /// Intended, not created yet (never stored, accepted anyway).
    Pending,
    /// A Create is in flight.
    Creating,
    /// A Modify is in flight.
    Modifying,
    /// A Delete is in flight.
    Deleting,
    /// Exists.
    Created,
    /// The last operation failed.
    Failed,
    /// The outcome of an operation is not known.
    Unknown,
}

/// An operation (`OperationKind`): a unit variant's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(super) enum OperationKind {
    /// Create.
    Create,
    /// Modify.
    Modify,
    /// Delete.
    Delete,
    /// Read.
    Read,
}

/// A failure an agent reported (`OperationError`).
#[derive(Debug, Deserialize)]
pub(super) struct OperationError {
    /// A `google.rpc.Code`.
    pub(super) code: i32,
    /// What went wrong.
    pub(super) message: String,
}

/// An operation in flight (`InFlight`).
///
/// Fields of type `Option` without `default` may still be absent: serde
/// reads a missing `Option` as `None`.
#[derive(Debug, Deserialize)]
pub(super) struct InFlight {
    /// What the operation does.
    pub(super) kind: OperationKind,
    /// The operation's id.
    pub(super) op_id: String,
    /// 1 for the first try.
    pub(super) attempt: u32,
    /// The intent generation it applies.
    pub(super) target_generation: u64,
    /// When it was dispatched (unix ms).
    pub(super) started_at_ms: u64,
    /// How long the agent has for it.
    pub(super) timeout_ms: u64,
    /// The last progress report (unix ms).
    pub(super) last_progress_ms: Option<u64>,
    /// A cancel was sent.
    pub(super) cancel_requested: bool,
    /// When the cancel was sent (unix ms).
    #[serde(default)]
    pub(super) cancel_requested_at_ms: Option<u64>,
    /// Re-deliveries after a lost outcome.
    #[serde(default)]
    pub(super) redeliveries: u32,
    /// A "needs recreate?" question rather than a change.
    #[serde(default)]
    pub(super) question: bool,
    /// The value a Create or Modify applies.
    pub(super) target: Option<Item>,
    /// Counters of the required items at the first dispatch.
    #[serde(default, deserialize_with = "marks_as_pairs::deserialize")]
    pub(super) dispatch_marks: BTreeMap<ItemRef, u64>,
    /// The message of the last progress report.
    #[serde(default)]
    pub(super) progress_message: Option<String>,
    /// For a READ resolving a lost operation: that operation.
    #[serde(default)]
    pub(super) resolves: Option<Box<InFlight>>,
}

/// A current item (`CurrentItem`, stored as `StoredCurrent`).
///
/// `dependency_marks` has no default: a record without it is corrupt, as
/// it is for the server.
#[derive(Debug, Deserialize)]
pub(super) struct CurrentItem {
    /// Where the item stands.
    pub(super) state: ItemState,
    /// The value of the last successful operation.
    pub(super) applied: Option<Item>,
    /// The generation of `applied`.
    pub(super) applied_generation: u64,
    /// Properties the agent last reported.
    pub(super) observed: Option<Properties>,
    /// The last operation that finished.
    pub(super) last_operation: Option<OperationKind>,
    /// The error of the last operation.
    pub(super) last_error: Option<OperationError>,
    /// Failed attempts since the last success.
    pub(super) attempts: u32,
    /// No new attempt before this time (unix ms).
    pub(super) next_attempt_at_ms: Option<u64>,
    /// The intent generation of the last failure.
    pub(super) failed_generation: u64,
    /// The operation in flight.
    pub(super) in_flight: Option<InFlight>,
    /// Completed Modifies.
    pub(super) modifications: u64,
    /// Counters of the required items when this item was created.
    #[serde(deserialize_with = "marks_as_pairs::deserialize")]
    pub(super) dependency_marks: BTreeMap<ItemRef, u64>,
    /// For `Unknown`: whether the item was created before.
    pub(super) unknown_was_created: bool,
    /// `[generation, needs recreate]`.
    pub(super) needs_recreate_answer: Option<(u64, bool)>,
    /// The operation the next attempt continues.
    #[serde(default)]
    pub(super) retry_of: Option<RetryOf>,
    /// No further attempt until the intent changes.
    #[serde(default)]
    pub(super) gave_up: bool,
    /// Went with a vanished external item.
    #[serde(default)]
    pub(super) gone_with_external: bool,
    /// A lost Create may or may not have created it.
    #[serde(default)]
    pub(super) existence_uncertain: bool,
    /// A value a lost Modify may have applied.
    #[serde(default)]
    pub(super) maybe_applied: Option<Item>,
}

/// The operation an item's next attempt continues (`RetryOf`).
#[derive(Debug, Deserialize)]
pub(super) struct RetryOf {
    /// What the operation does.
    pub(super) kind: OperationKind,
    /// The intent generation it applies.
    pub(super) target_generation: u64,
    /// Its op id.
    pub(super) op_id: String,
}

/// `BTreeMap<ItemRef, u64>` stored as a list of `[item, counter]` pairs, or
/// as the empty map `{}` written before pairs existed.
mod marks_as_pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer};

    use super::ItemRef;

    /// The two stored forms.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Stored {
        /// `[[{"item_type": .., "name": ..}, counter], ...]`.
        Pairs(Vec<(ItemRef, u64)>),
        /// `{}` (a non-empty map was never written).
        EmptyMap(BTreeMap<String, u64>),
    }

    /// Reads either form; a later pair for the same item wins, as it did.
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<ItemRef, u64>, D::Error> {
        match Stored::deserialize(deserializer)? {
            Stored::Pairs(pairs) => Ok(pairs.into_iter().collect()),
            Stored::EmptyMap(map) if map.is_empty() => Ok(BTreeMap::new()),
            Stored::EmptyMap(_) => Err(serde::de::Error::custom(
                "dependency marks must be a list of [item, counter] pairs",
            )),
        }
    }
}

/// An intended item as stored (`StoredIntended`).
#[derive(Debug, Deserialize)]
pub(super) struct StoredIntended {
    /// The intended value.
    pub(super) item: Item,
    /// The generation that last changed its content.
    pub(super) generation: u64,
}

/// Per-tenant limits (`TenantLimits`); every field is required.
#[derive(Debug, Deserialize)]
pub(super) struct TenantLimits {
    /// Intended items.
    pub(super) max_items: u64,
    /// Items per SubmitIntent.
    pub(super) max_request_items: u64,
    /// Agents at once.
    pub(super) max_agents: u64,
    /// Watchers at once.
    pub(super) max_watchers: u64,
    /// Operations in flight at once.
    pub(super) max_operations_in_flight: u64,
}

/// Which condition (`ConditionKind`): a unit variant's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(super) enum ConditionKind {
    /// Ready.
    Ready,
    /// Reconciling.
    Reconciling,
    /// Stalled.
    Stalled,
}

/// One condition of a tenant (`Condition`).
#[derive(Debug, Deserialize)]
pub(super) struct Condition {
    /// Which condition.
    pub(super) kind: ConditionKind,
    /// Whether it holds.
    pub(super) status: bool,
    /// A CamelCase reason code.
    pub(super) reason: String,
    /// A sentence for humans.
    pub(super) message: String,
    /// The intent generation it describes.
    pub(super) observed_generation: u64,
    /// When `status` last changed (unix ms).
    pub(super) last_transition_ms: u64,
}

/// The tenant record (`TenantRecord`).
#[derive(Debug, Deserialize)]
pub(super) struct TenantRecord {
    /// Internal id.
    pub(super) id: u64,
    /// The tenant's name.
    pub(super) name: String,
    /// Creation time (unix ms).
    pub(super) created_at_ms: u64,
    /// Intent generation.
    pub(super) generation: u64,
    /// The newest generation the tenant was quiescent at.
    pub(super) observed_generation: u64,
    /// Committed changes.
    pub(super) revision: u64,
    /// Limits set at creation.
    pub(super) limits: TenantLimits,
    /// SHA-256 of the token, hex.
    pub(super) token_hash: String,
    /// A tombstone.
    pub(super) deleted: bool,
    /// Ready / Reconciling / Stalled.
    #[serde(default)]
    pub(super) conditions: Vec<Condition>,
    /// The event log's compaction floor.
    #[serde(default)]
    pub(super) compact_revision: Option<u64>,
}

/// How a type waits between attempts (`RetryPolicy`): externally tagged,
/// e.g. `{"Static": {"wait_ms": 10}}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(super) enum RetryPolicy {
    /// Always the same wait.
    Static {
        /// The wait.
        wait_ms: u64,
    },
    /// A uniformly random wait in `[min_ms, max_ms]`.
    Random {
        /// Shortest wait.
        min_ms: u64,
        /// Longest wait.
        max_ms: u64,
    },
    /// `initial * multiplier^(failures - 1)`, capped.
    Exponential {
        /// The first wait.
        initial_ms: u64,
        /// Growth per failure.
        multiplier: f64,
        /// The cap.
        max_ms: u64,
    },
}

/// An item type's spec (`TypeSpec`); `schema` is the JSON Schema as
/// declared (`TypeSchema` is stored as its JSON value).
#[derive(Debug, Deserialize)]
pub(super) struct TypeSpec {
    /// The item type.
    pub(super) item_type: String,
    /// What needs a recreate.
    pub(super) recreate_on_change: Vec<String>,
    /// Ask the agent whether a change needs a recreate.
    pub(super) ask_needs_recreate: bool,
    /// Waits between attempts.
    pub(super) retry: RetryPolicy,
    /// Failed attempts before an item is terminal (0 = unlimited).
    pub(super) max_attempts: u32,
    /// How long an operation may run.
    pub(super) operation_timeout_ms: u64,
    /// Whether the agent answers READ.
    pub(super) supports_read: bool,
    /// Operations of this type in flight at once.
    pub(super) max_in_flight: u32,
    /// The JSON Schema (`None` when absent or `null`: any properties).
    #[serde(default)]
    pub(super) schema: Option<Value>,
}

/// A stored type spec (`StoredSpec`).
#[derive(Debug, Deserialize)]
pub(super) struct StoredSpec {
    /// The spec.
    pub(super) spec: TypeSpec,
    /// The epoch of the registration that declared it.
    pub(super) epoch: u64,
}
