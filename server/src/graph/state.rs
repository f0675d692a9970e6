//! The current state of items: what exists, what is in flight, what failed.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::item::{Item, ItemRef, Properties};

/// gRPC codes (`google.rpc.Code`) the engine gives meaning to.
pub mod code {
    /// The operation was cancelled.
    pub const CANCELLED: i32 = 1;
    /// Bad input: terminal.
    pub const INVALID_ARGUMENT: i32 = 3;
    /// The operation ran out of time.
    pub const DEADLINE_EXCEEDED: i32 = 4;
    /// The item does not exist (an answer to READ).
    pub const NOT_FOUND: i32 = 5;
    /// Not allowed: terminal.
    pub const PERMISSION_DENIED: i32 = 7;
    /// The system is not in a state to run it: terminal.
    pub const FAILED_PRECONDITION: i32 = 9;
    /// The configurator cannot do this: terminal.
    pub const UNIMPLEMENTED: i32 = 12;
    /// Transient trouble, e.g. a lost agent: retryable.
    pub const UNAVAILABLE: i32 = 14;
}

/// Where an item of the current graph stands.
///
/// `Pending` is never stored: an intended item with no current entry is
/// pending by definition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ItemState {
    /// Intended, not created yet.
    Pending,
    /// A Create is in flight.
    Creating,
    /// A Modify is in flight.
    Modifying,
    /// A Delete is in flight.
    Deleting,
    /// Exists with the applied value shown.
    Created,
    /// The last operation failed.
    Failed,
    /// The outcome of an operation is not known.
    Unknown,
}

/// The operations the service runs on items.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum OperationKind {
    /// Bring a new item into existence.
    Create,
    /// Change an existing item in place.
    Modify,
    /// Remove an item.
    Delete,
    /// Ask the agent for the item's actual state.
    Read,
}

impl OperationKind {
    /// Lower-case name for messages and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Modify => "modify",
            Self::Delete => "delete",
            Self::Read => "read",
        }
    }
}

/// A failure reported by a configurator, with a gRPC status code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationError {
    /// The `google.rpc.Code` the agent (or the service) reported.
    pub code: i32,
    /// What went wrong, in the agent's words.
    pub message: String,
}

impl OperationError {
    /// Terminal codes stop retries until the item's intent changes:
    /// INVALID_ARGUMENT, FAILED_PRECONDITION, PERMISSION_DENIED, UNIMPLEMENTED.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self.code,
            code::INVALID_ARGUMENT
                | code::FAILED_PRECONDITION
                | code::PERMISSION_DENIED
                | code::UNIMPLEMENTED
        )
    }
}

/// An operation that was dispatched and has not reported its final outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InFlight {
    /// What the operation does.
    pub kind: OperationKind,
    /// Names one operation on one item toward one target generation.
    pub op_id: String,
    /// 1 for the first try, growing with every retry.
    pub attempt: u32,
    /// The intent generation the operation applies (0 for deletes of
    /// items that left the intent).
    pub target_generation: u64,
    /// When it was dispatched (unix milliseconds).
    pub started_at_ms: u64,
    /// How long the agent has for it.
    pub timeout_ms: u64,
    /// Last progress report (unix milliseconds), if any.
    pub last_progress_ms: Option<u64>,
    /// Set once the operation's target was superseded and a cancel was sent.
    pub cancel_requested: bool,
    /// When the cancel was sent (unix milliseconds).
    #[serde(default)]
    pub cancel_requested_at_ms: Option<u64>,
    /// How many times the operation was re-delivered after its outcome was
    /// lost (see `MAX_REDELIVERIES`).
    #[serde(default)]
    pub redeliveries: u32,
    /// A question, not a change: ask the agent whether the Modify toward
    /// `target_generation` needs a recreate (types with `ask_needs_recreate`).
    #[serde(default)]
    pub question: bool,
    /// The value a Create or Modify applies. Its dependencies count as edges
    /// of the current graph while the operation runs, so nothing it relies
    /// on is deleted underneath it.
    pub target: Option<Arc<Item>>,
    /// For each `recreate_when_modified` dependency of `target`: the
    /// required item's modification counter when the operation was first
    /// dispatched. The applied item records these: a modification reported
    /// while the operation ran may have come before or after the agent
    /// applied it, and the earlier counter errs on the side of a recreate.
    #[serde(
        default,
        with = "marks_as_pairs",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub dispatch_marks: BTreeMap<ItemRef, u64>,
    /// The message of the last progress report, if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_message: Option<String>,
    /// For a READ sent to resolve an UNKNOWN item (DESIGN 4: "READ
    /// resolves them"): the operation whose outcome was lost. What the READ
    /// finds settles it; if the READ cannot tell, the lost operation is
    /// sent again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolves: Option<Box<InFlight>>,
}

impl InFlight {
    /// Whether the intent superseded this operation: a Create or Modify
    /// toward a generation that is not the item's intended one
    /// (`intended_generation`, 0 when the item left the intent).
    pub fn superseded_at(&self, intended_generation: u64) -> bool {
        matches!(self.kind, OperationKind::Create | OperationKind::Modify)
            && self.target_generation != intended_generation
    }

    /// The operation whose outcome decides the item: this one, or, for a
    /// READ that resolves a lost operation, that lost operation (the READ
    /// only observes; the lost one may have applied).
    pub fn deciding(&self) -> &InFlight {
        self.resolves.as_deref().unwrap_or(self)
    }

    /// A fresh operation (first delivery, no progress, no cancel) started
    /// at `started_at_ms` with `timeout_ms` to report.
    pub fn new(
        kind: OperationKind,
        op_id: String,
        attempt: u32,
        target_generation: u64,
        started_at_ms: u64,
        timeout_ms: u64,
    ) -> Self {
        Self {
            kind,
            op_id,
            attempt,
            target_generation,
            started_at_ms,
            timeout_ms,
            last_progress_ms: None,
            cancel_requested: false,
            cancel_requested_at_ms: None,
            redeliveries: 0,
            question: false,
            target: None,
            dispatch_marks: BTreeMap::new(),
            progress_message: None,
            resolves: None,
        }
    }
}

/// An item of the current graph.
///
/// 64 bytes: what a settled item keeps inline, with the fields it sets only
/// while it fails, waits, retries or tracks recreate marks boxed together in
/// [`RareFields`] (a tenant may hold a million current items).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CurrentItem {
    /// Where the item stands.
    pub state: ItemState,
    /// The intended value of the last successful operation; `None` when the
    /// item has never been created (or its Create is in flight).
    pub applied: Option<Arc<Item>>,
    /// The generation of `applied`.
    pub applied_generation: u64,
    /// Properties the agent reported with its last DONE or READ.
    pub observed: Option<Arc<Properties>>,
    /// The last operation that finished (successfully or not).
    pub last_operation: Option<OperationKind>,
    /// Failed attempts of the current operation since the last success.
    pub attempts: u32,
    /// The operation in flight, if any.
    pub in_flight: Option<Box<InFlight>>,
    /// Completed Modifies (and modified reports of external items): the
    /// counter `recreate_when_modified` dependents compare against.
    pub modifications: u64,
    /// For `Unknown`: whether the item was created before the outcome got lost.
    pub unknown_was_created: bool,
    /// The last failure allows no further attempt: its code is terminal or
    /// the type's `max_attempts` is used up. Like a terminal code, only an
    /// intent change retries it.
    #[serde(default)]
    pub gave_up: bool,
    /// An external item this item is `auto_deleted_by_external` on vanished
    /// while an operation of it ran or its outcome was unknown, and the item
    /// went with it whatever that operation did (DESIGN 3, rule 9): if the
    /// operation's outcome is lost, it is not sent again and the item is
    /// forgotten. A live report clears the mark.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gone_with_external: bool,
    /// An external item this item's applied value is
    /// `auto_deleted_by_external` on vanished while a Create or Modify that
    /// unties it ran or its outcome was unknown: the item went with it
    /// unless that operation applied first (DESIGN 3, rule 9). A DONE
    /// leaves the item with the operation's value; any other live report
    /// (WAIT, a failure, NOT_FOUND) says the item went, even when the
    /// external item is back by then. A live report clears the mark.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gone_unless_applied: bool,
    /// A lost Create may or may not have created the item (its dependency
    /// no longer held when the outcome was found lost). It may exist, so it
    /// is deleted if it must go; it is not created for its dependents, and
    /// if it stays intended it is created again (agents' Creates are
    /// idempotent) before anything is built on it (DESIGN 4,
    /// `previous_uncertain`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub existence_uncertain: bool,
    /// The fields a settled item nearly never sets, boxed only while one
    /// is: read them as `item.rare.last_error`, change them with
    /// `item.rare.update(…)` or [`Self::with_rare`].
    #[serde(flatten)]
    pub rare: RareBox,
}

/// The fields of a current item that a settled item nearly never sets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RareFields {
    /// The error of the last operation, while the item is failed.
    pub last_error: Option<OperationError>,
    /// No new attempt before this time (unix milliseconds).
    pub next_attempt_at_ms: Option<u64>,
    /// The intended generation the last failure happened at: a terminal
    /// failure blocks retries only while the intent is still this one.
    pub failed_generation: u64,
    /// For each `recreate_when_modified` dependency: the required item's
    /// `modifications` when this item was created. Stored as a list of
    /// pairs: JSON maps need string keys.
    #[serde(with = "marks_as_pairs")]
    pub dependency_marks: BTreeMap<ItemRef, u64>,
    /// Answer of the agent to "does this change need a recreate?", for the
    /// intent generation it was asked about.
    pub needs_recreate_answer: Option<(u64, bool)>,
    /// The operation the item's next attempt continues: after a FAILED
    /// outcome, a timeout or a WAIT, the next try of the same operation
    /// (same kind, same target generation) keeps its op id (DESIGN §4).
    pub retry_of: Option<RetryOf>,
    /// The values besides `applied` the item may hold: the targets of lost
    /// operations that may have applied (an agent that restarts forgets
    /// what it had not reported), and the value an item of uncertain
    /// existence had before a Create of it. Each one's dependencies count
    /// as edges of the current graph (nothing it may rely on is deleted
    /// under it), and its predicates must keep holding, until an operation
    /// of the item succeeds. Every one is kept: a second lost Modify does
    /// not make the first one's value impossible (seed 18627).
    #[serde(skip_serializing_if = "Vec::is_empty", with = "one_or_many")]
    pub maybe_applied: Vec<Arc<Item>>,
}

/// No rare field set: what [`CurrentItem::rare`] shows without a box.
static NO_RARE_FIELDS: RareFields = RareFields {
    last_error: None,
    next_attempt_at_ms: None,
    failed_generation: 0,
    dependency_marks: BTreeMap::new(),
    needs_recreate_answer: None,
    retry_of: None,
    maybe_applied: Vec::new(),
};

/// [`RareFields`] in a box exactly while one is set; equal by content.
///
/// Reading a field (through `Deref`) never allocates. Fields change only
/// through [`RareBox::update`], which boxes them when a change sets one
/// and drops the box when a change leaves none set, so a change that sets
/// nothing (clearing an error that is not there, the hot path of every
/// dispatch) allocates nothing.
#[derive(Clone, Debug, Default)]
pub struct RareBox(Option<Box<RareFields>>);

impl RareBox {
    fn get(&self) -> &RareFields {
        self.0.as_deref().unwrap_or(&NO_RARE_FIELDS)
    }

    /// Changes the fields with `change`.
    pub fn update(&mut self, change: impl FnOnce(&mut RareFields)) {
        match &mut self.0 {
            Some(fields) => {
                change(fields);
                if **fields == NO_RARE_FIELDS {
                    self.0 = None;
                }
            }
            None => {
                let mut fields = RareFields::default();
                change(&mut fields);
                *self = fields.into();
            }
        }
    }

    /// Whether the fields take a box.
    pub fn is_boxed(&self) -> bool {
        self.0.is_some()
    }
}

impl From<RareFields> for RareBox {
    fn from(fields: RareFields) -> Self {
        Self((fields != NO_RARE_FIELDS).then(|| Box::new(fields)))
    }
}

impl std::ops::Deref for RareBox {
    type Target = RareFields;

    fn deref(&self) -> &RareFields {
        self.get()
    }
}

impl PartialEq for RareBox {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Serialize for RareBox {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.get().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RareBox {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        RareFields::deserialize(deserializer).map(Self::from)
    }
}

/// An operation that ended without success and will be tried again under
/// the same op id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryOf {
    /// What the operation does.
    pub kind: OperationKind,
    /// The intent generation it applies.
    pub target_generation: u64,
    /// Its op id.
    pub op_id: String,
}

impl RetryOf {
    /// The op id to continue when the next operation is `kind` toward
    /// `target_generation`: only the same operation keeps its id.
    pub fn continues(&self, kind: OperationKind, target_generation: u64) -> Option<&str> {
        (self.kind == kind && self.target_generation == target_generation)
            .then_some(self.op_id.as_str())
    }
}

/// Serde for `BTreeMap<ItemRef, u64>` as a sequence of `(item, counter)`
/// pairs: serde_json refuses maps whose keys are not strings.
mod marks_as_pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serializer};

    use crate::graph::ItemRef;

    pub(super) fn serialize<S: Serializer>(
        marks: &BTreeMap<ItemRef, u64>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(marks.iter())
    }

    /// Records written before marks were stored as pairs hold an empty
    /// map (`{}`): a non-empty one could never be written.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Stored {
        Pairs(Vec<(ItemRef, u64)>),
        EmptyMap(BTreeMap<String, u64>),
    }

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

/// `maybe_applied` in JSON: one value as the item itself, as the JSON
/// records of schema version 1 held it (the single value it was then);
/// more as a list.
mod one_or_many {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::graph::Item;

    pub(super) fn serialize<S: Serializer>(
        values: &[Arc<Item>],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match values {
            [one] => one.serialize(serializer),
            many => many.serialize(serializer),
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Stored {
        One(Arc<Item>),
        Many(Vec<Arc<Item>>),
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<Arc<Item>>, D::Error> {
        Ok(match Stored::deserialize(deserializer)? {
            Stored::One(one) => vec![one],
            Stored::Many(many) => many,
        })
    }
}

impl CurrentItem {
    /// A created item holding `applied` at `generation`.
    pub fn created(applied: Arc<Item>, generation: u64) -> Self {
        Self {
            state: ItemState::Created,
            applied: Some(applied),
            applied_generation: generation,
            observed: None,
            last_operation: Some(OperationKind::Create),
            attempts: 0,
            in_flight: None,
            modifications: 0,
            unknown_was_created: false,
            gave_up: false,
            gone_with_external: false,
            gone_unless_applied: false,
            existence_uncertain: false,
            rare: RareBox::default(),
        }
    }

    /// An item whose first Create has been dispatched (no applied value).
    pub fn creating(in_flight: InFlight) -> Self {
        Self {
            state: ItemState::Creating,
            applied: None,
            applied_generation: 0,
            observed: None,
            last_operation: None,
            attempts: 0,
            in_flight: Some(Box::new(in_flight)),
            modifications: 0,
            unknown_was_created: false,
            gave_up: false,
            gone_with_external: false,
            gone_unless_applied: false,
            existence_uncertain: false,
            rare: RareBox::default(),
        }
    }

    /// This item, which may also hold `value` (the target of an operation
    /// that may have applied): it joins [`RareFields::maybe_applied`]
    /// unless it is the applied value or there already.
    #[must_use]
    pub fn may_also_hold(self, value: Option<Arc<Item>>) -> Self {
        let Some(value) = value else {
            return self;
        };
        let held =
            self.applied.as_ref() == Some(&value) || self.rare.maybe_applied.contains(&value);
        if held {
            return self;
        }
        self.with_rare(|rare| rare.maybe_applied.push(value))
    }

    /// The item's edges in the current graph: what its applied value
    /// relies on, then [`CurrentItem::edges_beyond_applied`] (duplicates
    /// are harmless).
    pub fn edges(&self) -> impl Iterator<Item = &ItemRef> {
        self.applied
            .iter()
            .flat_map(|item| item.required_items())
            .chain(self.edges_beyond_applied())
    }

    /// What the other values the item may become rely on: the value its
    /// operation applies (or, while a READ resolves a lost operation, the
    /// value that one applies) and the values lost operations may have
    /// applied ([`RareFields::maybe_applied`]).
    pub fn edges_beyond_applied(&self) -> impl Iterator<Item = &ItemRef> {
        let target = self
            .in_flight
            .iter()
            .filter_map(|operation| operation.deciding().target.as_ref())
            .flat_map(|item| item.required_items());
        let maybe_applied = self
            .rare
            .maybe_applied
            .iter()
            .flat_map(|item| item.required_items());
        target.chain(maybe_applied)
    }

    /// Every value the item may hold: its applied value, then the others
    /// it may hold ([`RareFields::maybe_applied`]).
    pub fn values(&self) -> impl Iterator<Item = &Arc<Item>> {
        self.applied.iter().chain(&self.rare.maybe_applied)
    }

    /// Whether the item has an applied value and every value it may hold
    /// has `value`'s content: it holds `value` whatever lost operations did.
    pub fn holds_only(&self, value: &Item) -> bool {
        self.applied.is_some() && self.values().all(|held| held.same_content(value))
    }

    /// Whether what the item is now is not known for sure: it may not
    /// exist, or may hold a value a lost operation applied besides its
    /// applied one (an order for it says `previous_uncertain`).
    pub fn uncertain(&self) -> bool {
        self.existence_uncertain || !self.rare.maybe_applied.is_empty()
    }

    /// This item with its rarely set fields changed by `change` (builder
    /// style, boxed only if one is left set).
    pub fn with_rare(mut self, change: impl FnOnce(&mut RareFields)) -> Self {
        self.rare.update(change);
        self
    }

    /// "Created" for dependency purposes: `Created`, `Modifying`, `Failed`
    /// after a Modify or Delete, or `Unknown` when it was created before.
    /// An item whose Create failed does not exist.
    pub fn is_created(&self) -> bool {
        if self.existence_uncertain {
            return false;
        }
        match self.state {
            ItemState::Created | ItemState::Modifying => true,
            ItemState::Failed => matches!(
                self.last_operation,
                Some(OperationKind::Modify | OperationKind::Delete)
            ),
            ItemState::Unknown => self.unknown_was_created,
            ItemState::Pending | ItemState::Creating | ItemState::Deleting => false,
        }
    }

    /// Whether the item may exist on the configurator's side, so that it
    /// must be deleted when it leaves the intent.
    pub fn may_exist(&self) -> bool {
        self.existence_uncertain || self.is_created() || self.state == ItemState::Deleting
    }

    /// An operation is running or its outcome is unknown: nothing else may
    /// run on this item until that settles.
    pub fn is_busy(&self) -> bool {
        self.in_flight.is_some() || self.state == ItemState::Unknown
    }

    /// Whether what runs is only a READ of an item that is not UNKNOWN (a
    /// periodic drift READ): it changes nothing until it reports.
    pub fn only_a_read_runs(&self) -> bool {
        self.state != ItemState::Unknown
            && self
                .in_flight
                .as_ref()
                .is_some_and(|operation| operation.kind == OperationKind::Read)
    }

    /// The operation in flight runs at an agent: any operation of an item
    /// that is not UNKNOWN, and the READ that resolves an UNKNOWN one (an
    /// UNKNOWN item's own operation is lost: it waits for a report, not a
    /// clock).
    pub fn operation_runs(&self) -> bool {
        self.in_flight.as_ref().is_some_and(|operation| {
            self.state != ItemState::Unknown || operation.resolves.is_some()
        })
    }

    /// The last operation failed for good (a terminal code, or
    /// `max_attempts` used up) for the intent generation
    /// `intended_generation` (0 when the item left the intent).
    pub fn failed_terminally_at(&self, intended_generation: u64) -> bool {
        self.state == ItemState::Failed
            && self.rare.failed_generation == intended_generation
            && (self.gave_up
                || self
                    .rare
                    .last_error
                    .as_ref()
                    .is_some_and(OperationError::is_terminal))
    }

    /// A failure given up on at intent generation `intended_generation`
    /// whose operation, of kind `kind`, a pass then found unneeded and
    /// settled (the item shows what it holds, not FAILED): needed again
    /// at the same generation, it is the same operation, and like a
    /// terminal failure only an intent change retries it (DESIGN 4).
    pub fn gave_up_settled_at(&self, kind: OperationKind, intended_generation: u64) -> bool {
        self.gave_up
            && self.state != ItemState::Failed
            && self.rare.failed_generation == intended_generation
            && self
                .rare
                .retry_of
                .as_ref()
                .is_some_and(|retry| retry.kind == kind)
    }

    /// A failed Modify: blocks Creates and Modifies of dependents.
    pub fn has_failed_modify(&self) -> bool {
        self.state == ItemState::Failed && self.last_operation == Some(OperationKind::Modify)
    }

    /// The properties a predicate sees: observed values laid over applied ones.
    pub fn effective_properties(&self) -> Properties {
        let mut properties = self
            .applied
            .as_ref()
            .map(|item| item.properties.clone())
            .unwrap_or_default();
        if let Some(observed) = &self.observed {
            for (key, value) in observed.iter() {
                properties.insert(key.to_owned(), value.clone());
            }
        }
        properties
    }
}

/// The properties a predicate will see once a Modify of `current` to
/// `intended` applied, as far as can be told before its result: the
/// intended ones, laid over what the agent observed beyond the applied
/// value (a state it reports, such as `state: up`, which the Modify does
/// not set). What it observed on a property the applied value sets is an
/// echo of that value, and the Modify replaces or removes it. Borrows
/// `intended` when nothing observed lies beyond the applied value.
pub fn properties_after_modify<'p>(
    current: Option<&impl std::ops::Deref<Target = CurrentItem>>,
    intended: &'p Properties,
) -> std::borrow::Cow<'p, Properties> {
    let current = current.map(|current| &**current);
    let applied = current
        .and_then(|current| current.applied.as_ref())
        .map(|item| &item.properties);
    let beyond: Vec<(&str, &serde_json::Value)> = current
        .and_then(|current| current.observed.as_deref())
        .into_iter()
        .flat_map(|observed| observed.iter())
        .filter(|(key, _)| {
            applied.is_none_or(|applied| applied.get(key).is_none()) && intended.get(key).is_none()
        })
        .collect();
    if beyond.is_empty() {
        return std::borrow::Cow::Borrowed(intended);
    }
    let mut properties = intended.clone();
    for (key, value) in beyond {
        properties.insert(key.to_owned(), value.clone());
    }
    std::borrow::Cow::Owned(properties)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed() -> CurrentItem {
        CurrentItem {
            state: ItemState::Failed,
            ..CurrentItem::created(Arc::new(Item::new("t", "a", Properties::new())), 2)
        }
        .with_rare(|rare| {
            rare.last_error = Some(OperationError {
                code: code::UNAVAILABLE,
                message: "agent gone".into(),
            });
            rare.next_attempt_at_ms = Some(5_000);
            rare.failed_generation = 2;
        })
    }

    #[test]
    fn a_settled_item_keeps_no_box_and_stays_small() {
        assert_eq!(std::mem::size_of::<CurrentItem>(), 64);
        let settled = CurrentItem::created(Arc::new(Item::new("t", "a", Properties::new())), 2);
        assert!(!settled.rare.is_boxed());
        assert!(failed().rare.is_boxed());
        let recovered = failed().with_rare(|rare| *rare = RareFields::default());
        assert!(
            !recovered.rare.is_boxed(),
            "a box with nothing set is dropped"
        );

        // A change that sets nothing allocates nothing.
        let mut touched = settled.clone();
        touched.rare.update(|rare| rare.next_attempt_at_ms = None);
        assert!(!touched.rare.is_boxed());
        assert_eq!(touched, settled);
    }

    #[test]
    fn rare_fields_keep_their_json_shape() {
        let item = failed();
        let json = serde_json::to_value(&item).expect("encodes");
        assert_eq!(json["last_error"]["message"], "agent gone");
        assert_eq!(json["next_attempt_at_ms"], 5_000);
        assert_eq!(json["failed_generation"], 2);
        assert!(json["retry_of"].is_null() && json["dependency_marks"] == serde_json::json!([]));
        let decoded: CurrentItem = serde_json::from_value(json).expect("decodes");
        assert_eq!(decoded, item);

        let settled = CurrentItem::created(Arc::new(Item::new("t", "a", Properties::new())), 2);
        let decoded: CurrentItem =
            serde_json::from_value(serde_json::to_value(&settled).expect("encodes"))
                .expect("decodes");
        assert!(!decoded.rare.is_boxed());
    }
}
