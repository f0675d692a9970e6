//! The planner: a pure function from (intended graph, current graph) to an
//! ordered set of Create / Modify / Delete operations.
//!
//! It implements the planning rules of DESIGN section 3. No I/O, no clock
//! (the caller passes "now"), no randomness: the same inputs give the same
//! plan. The plan is a partial order: each operation lists the operations
//! that must finish before it ([`PlannedOperation::after`]), and Creates of a
//! type also wait for the plan's Deletes of that type
//! ([`Plan::predecessors`]). Operations with no predecessors are ready to
//! dispatch now; everything else is re-planned as results arrive.
//!
//! Cost: the planner looks only at the `seeds` it is given (the items that
//! changed or are not converged) and at their neighbours through the
//! dependents indexes, never at the whole graph.

mod assemble;
mod marks;
mod need;
mod planner;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::graph::{CurrentGraph, IntendedGraph, ItemRef, OperationKind};

pub use need::pointer_lookup;
pub(crate) use planner::retry_by;

/// What the planner needs to know about an item type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TypeRules {
    /// JSON Pointers (`/vlan` covers `/vlan/id`) whose change needs a
    /// recreate; `*` means the type cannot be modified in place.
    pub recreate_on_change: Vec<String>,
    /// Ask the agent whether a change needs a recreate before modifying.
    pub ask_needs_recreate: bool,
}

/// The planner's view of the world outside the two graphs.
pub trait PlanEnvironment {
    /// Recreate rules of `item_type`, if its spec is known.
    fn type_rules(&self, item_type: &str) -> Option<&TypeRules>;
    /// Whether a live configurator handles `item_type`.
    fn has_configurator(&self, item_type: &str) -> bool;
    /// Now, in unix milliseconds (compared with backoff deadlines).
    fn now_ms(&self) -> u64;
    /// Whether the last plan that looked at `item` found it converged and
    /// nothing changed it since (it is not in the caller's set of dirty
    /// items). The planner walks upstream from its seeds through items that
    /// are not converged, because a deletion planned there reaches them;
    /// a converged item has nothing planned upstream (that plan would have
    /// left it unconverged too), so the walk stops there. Answering `false`
    /// is always correct, only slower on deep graphs.
    fn is_converged(&self, item: &ItemRef) -> bool {
        let _ = item;
        false
    }
    /// Items of `item_type` whose Delete is in flight or planned, as far
    /// as the caller keeps them apart from the pass's seeds. A pass that
    /// may create an item of that type examines them too, so that its
    /// Creates wait for those Deletes (rule 8) whatever it was seeded
    /// with. None is right when every unconverged item is a seed.
    fn deletes_of_type(&self, item_type: &str) -> Vec<ItemRef> {
        let _ = item_type;
        Vec::new()
    }
    /// Whether an earlier plan may have planned a Delete of `item` that
    /// has not been dispatched yet (it waits, or waits for room). A pass
    /// leaves a dependent that only waits for an item's Modify, as it did
    /// before, unexamined; but if that dependent is to be deleted (rule 5:
    /// its own Modify can never be satisfied), the item's Modify must wait
    /// for that Delete (rule 8), and only an examined dependent tells.
    /// Answering `true` is always correct, only slower on deep graphs.
    fn may_have_pending_delete(&self, item: &ItemRef) -> bool {
        let _ = item;
        true
    }
    /// Whether `item` is a seed only because room opened for the
    /// operation an earlier plan gave it: nothing of it changed since that
    /// plan. A pass leaves what such an item relies on unexamined when it
    /// is to be deleted, as it was (its Delete is what the items it relies
    /// on wait for already). Answering `false` is always correct, only
    /// slower: a queued dependent's dispatch would examine the item it
    /// relies on and, through that item's Delete, all of its dependents.
    fn planned_again_for_room(&self, item: &ItemRef) -> bool {
        let _ = item;
        false
    }
    /// Whether an earlier plan planned a Delete of `item` that is still
    /// to complete: it runs, waits (for its dependents, or for room), or
    /// was taken from the room's queue for this pass. A pass that reaches
    /// such an item, still deleted along with an item that itself goes as
    /// an earlier plan left it, leaves that item unexamined (see
    /// `Planner::goes_with_as_before`). Answering `false` is always
    /// correct, only slower: each batch of a hub's dependents deleted
    /// along with it would examine the hub and, through its Delete, every
    /// dependent left.
    fn deletes_as_before(&self, item: &ItemRef) -> bool {
        let _ = item;
        false
    }
}

/// Why an item that needs an operation cannot have it yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WaitReason {
    /// A dependency is not satisfied.
    Dependency,
    /// No live configurator handles the item's type.
    NoConfigurator,
    /// A failed operation waits for its retry time.
    Backoff,
    /// Another operation must finish first (a dependent's delete, an
    /// operation in flight on this item or a dependent, a same-type delete).
    Blocked,
    /// The last attempt failed with a terminal code; only an intent change
    /// retries it.
    TerminalFailure,
    /// The outcome of the item's last operation is not known.
    UnknownOutcome,
}

/// One thing an item waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockedBy {
    /// The item waited for (possibly the item itself).
    pub item: ItemRef,
    /// Why, in words: "missing", "not created", "being modified",
    /// "predicate false: ...", "delete in flight", ... Borrowed when the
    /// words are fixed: a Delete waiting for many dependents names each,
    /// and copies of that list then allocate nothing per entry.
    pub why: Cow<'static, str>,
}

impl BlockedBy {
    /// Whether it shows a terminal failure (the item's own, or one it
    /// waits on): only an intent change moves what waits on it.
    ///
    /// Only the engine's own words count: the item's own failure ("failed
    /// terminally: ...", "failed terminally after N attempts") or a
    /// blocker's reason ("not created (failed terminally)"). A `why` that
    /// quotes the user (a predicate's source, its evaluation error) may
    /// hold the same words and says nothing of a failure.
    pub fn shows_terminal_failure(&self) -> bool {
        let why: &str = &self.why;
        why.starts_with(FAILED_TERMINALLY)
            || why
                .strip_suffix(')')
                .and_then(|head| head.strip_suffix(FAILED_TERMINALLY))
                .and_then(|head| head.strip_suffix('('))
                .is_some_and(|head| BLOCKER_TERMINAL_PREFIXES.contains(&head))
    }

    /// Whether it says an operation of the blocker runs first ("its
    /// delete runs first"), rather than that the blocker waits for
    /// something else.
    pub fn says_runs_first(&self) -> bool {
        [
            OperationKind::Create,
            OperationKind::Modify,
            OperationKind::Delete,
        ]
        .into_iter()
        .any(|kind| self.why == runs_first(kind))
    }
}

/// An operation in a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedOperation {
    /// The item operated on.
    pub item: ItemRef,
    /// What to do.
    pub kind: OperationKind,
    /// Indices (in [`Plan::operations`]) of operations that must finish first.
    pub after: Vec<usize>,
    /// Part of a Delete + Create pair (a recreate).
    pub recreate: bool,
    /// Ask the agent whether the change needs a recreate before modifying.
    pub ask_needs_recreate: bool,
    /// The intent generation the operation applies (0: the item left the intent).
    pub target_generation: u64,
}

/// An item that needs an operation the service cannot run yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitingItem {
    /// The item.
    pub item: ItemRef,
    /// The operation it waits to run.
    pub operation: OperationKind,
    /// The main reason.
    pub reason: WaitReason,
    /// What holds it.
    pub blocked_by: Vec<BlockedBy>,
}

/// The words every `why` about a terminal failure contains, the item's
/// own ("failed terminally: ...") or a dependency's ("not created (failed
/// terminally)").
pub(crate) const FAILED_TERMINALLY: &str = "failed terminally";

/// The words before "(failed terminally)" in a `why` about a blocker whose
/// operation waits on a terminal failure (the planner's `reason_words`
/// in parentheses).
const BLOCKER_TERMINAL_PREFIXES: [&str; 4] = [
    "not created ",
    "being modified ",
    "its delete waits ",
    "its own delete waits ",
];

/// The `why` of an item that a plan keeps behind an operation of another
/// item, which runs first ("its delete runs first").
pub fn runs_first(kind: OperationKind) -> Cow<'static, str> {
    Cow::Borrowed(match kind {
        OperationKind::Create => "its create runs first",
        OperationKind::Modify => "its modify runs first",
        OperationKind::Delete => "its delete runs first",
        OperationKind::Read => "its read runs first",
    })
}

impl WaitingItem {
    /// Whether the item's own last operation failed terminally (it shows
    /// that failure), rather than only waiting on an item that did.
    pub fn failed_terminally_itself(&self) -> bool {
        self.reason == WaitReason::TerminalFailure
            || self
                .blocked_by
                .iter()
                .any(|blocker| blocker.item == self.item && blocker.shows_terminal_failure())
    }

    /// Whether the item failed terminally itself or waits on an item that
    /// did: only an intent change moves it (a quiet tenant is Stalled).
    pub fn waits_on_terminal_failure(&self) -> bool {
        self.reason == WaitReason::TerminalFailure
            || self
                .blocked_by
                .iter()
                .any(BlockedBy::shows_terminal_failure)
    }
}

/// Why the planner removes an item from current state without an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForgetReason {
    /// The external item it depends on disappeared, and the dependency says
    /// that takes the dependent with it (`auto_deleted_by_external`).
    DeletedWithExternal,
    /// It never came into existence (its Create failed) and is no longer
    /// intended.
    NeverCreated,
}

/// The result of planning.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Operations in a topological order; ties broken by item identity.
    pub operations: Vec<PlannedOperation>,
    /// Items needing an operation that cannot run yet, by identity.
    pub waiting: Vec<WaitingItem>,
    /// Items to drop from current state without an operation.
    pub forget: Vec<(ItemRef, ForgetReason)>,
    /// Items whose in-flight operation was superseded by an intent change:
    /// send them a cancel.
    pub cancel: Vec<ItemRef>,
    /// Failed items that need nothing any more (their intent went back to
    /// the applied value): they are created again.
    pub settle: Vec<ItemRef>,
    /// Every item this plan found not converged: plan it again next pass.
    pub unconverged: BTreeSet<ItemRef>,
    /// Items the plan examined without being seeded with them although the
    /// environment counted them unconverged (an earlier pass left them
    /// waiting or planned), in identity order. The plan's verdict replaces
    /// the earlier one: such an item that is in neither `unconverged` nor
    /// `waiting` is converged now, and what the earlier pass said of it no
    /// longer holds.
    pub revised: Vec<ItemRef>,
    /// For each item type: the plan's Deletes that its Creates wait for.
    pub type_barriers: BTreeMap<Arc<str>, Vec<usize>>,
    /// How many items the planner looked at (its cost, for diagnostics).
    pub examined: usize,
}

impl Plan {
    /// All operations that must finish before operation `index`: its own
    /// `after` list plus, for a Create, the plan's Deletes of the same type.
    pub fn predecessors(&self, index: usize) -> impl Iterator<Item = usize> + '_ {
        let operation = &self.operations[index];
        let barrier = match operation.kind {
            OperationKind::Create => self.type_barriers.get(operation.item.item_type()),
            _ => None,
        };
        operation.after.iter().copied().chain(
            barrier
                .into_iter()
                .flatten()
                .copied()
                .filter(move |&d| d != index),
        )
    }

    /// Indices of the operations that can be dispatched now.
    pub fn ready(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.operations.len()).filter(|&index| self.predecessors(index).next().is_none())
    }

    /// Whether the plan holds no operation and nothing waits.
    pub fn is_empty(&self) -> bool {
        self.operations.is_empty() && self.waiting.is_empty() && self.forget.is_empty()
    }

    /// Counts of the plan's operations by kind: (creates, modifies, deletes).
    pub fn counts(&self) -> (usize, usize, usize) {
        let count = |kind| self.operations.iter().filter(|o| o.kind == kind).count();
        (
            count(OperationKind::Create),
            count(OperationKind::Modify),
            count(OperationKind::Delete),
        )
    }
}

/// Plans the operations that bring `current` toward `intended`, looking at
/// `seeds` (changed or not yet converged items) and what they affect.
pub fn plan_operations(
    intended: &IntendedGraph,
    current: &CurrentGraph,
    seeds: &BTreeSet<ItemRef>,
    environment: &impl PlanEnvironment,
) -> Plan {
    let mut planner = planner::Planner::new(intended, current, environment);
    planner.run(seeds);
    assemble::assemble(&mut planner)
}

/// Plans with every item of both graphs as a seed: a full pass, used at
/// start-up and by periodic resyncs. Costs O(size of both graphs).
pub fn plan_everything(
    intended: &IntendedGraph,
    current: &CurrentGraph,
    environment: &impl PlanEnvironment,
) -> Plan {
    let seeds: BTreeSet<ItemRef> = intended
        .iter()
        .map(|(key, _)| key.clone())
        .chain(current.iter().map(|(key, _)| key.clone()))
        .collect();
    plan_operations(intended, current, &seeds, environment)
}

#[cfg(test)]
mod scenarios;

#[cfg(test)]
mod properties;

#[cfg(test)]
mod oracle;

#[cfg(test)]
mod oracle_properties;
