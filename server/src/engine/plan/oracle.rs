//! A deliberately simple reference planner ("oracle") for tests.
//!
//! It implements DESIGN section 3 straight from the text, over the whole of
//! both graphs every time, with no seeds, no indexes kept between calls and
//! no incremental tricks: every decision is recomputed from the graphs. It
//! is slow in the ways the real planner must not be (whole-graph fixpoints,
//! `BTreeMap`s keyed by identity, recursion with memo tables) and simple in
//! the ways that make it easy to check against the text.
//!
//! What it decides, per item:
//! - its **own need** from equality alone (DESIGN §2 "Equality", rule 4 for
//!   recreates: `recreate_on_change` pointers and `*`, `ask_needs_recreate`
//!   with the agent's answer for the intended generation, and
//!   `recreate_when_modified` dependencies whose modification counter moved
//!   since the dependent recorded it, whatever else changed);
//! - whether it is **dropped** (rule 9: an `auto_deleted_by_external`
//!   dependency on an item that is gone) or **planned for deletion**: it
//!   left the intent, needs a recreate, relies on an item that is gone,
//!   sits above an item planned for deletion or dropped along current edges
//!   (rules 2, 3, 7 and 9), holds a predicate that fails for its
//!   dependency's next value (rule 6), has a `recreate_when_modified`
//!   dependency about to be modified (rule 4), or is a Modify whose new
//!   dependencies cannot be satisfied (rule 5; the whole computation is
//!   repeated until this set stops growing). Rule 7's exception spares a
//!   dependent that the intent moves off the deleted item with a Modify,
//!   when every one of its new dependencies is satisfied now;
//! - the **schedule** of its Delete (dependents first, along current edges)
//!   and of its Create or Modify (dependencies first, along intended edges):
//!   in the plan after a set of other operations, or waiting with a reason
//!   (rule 8: busy items, UNKNOWN outcomes, terminal failures at the intended
//!   generation, backoff, no configurator, unsatisfied dependencies, busy
//!   dependents of a Modify, dependents whose Delete must come first, a
//!   same-type Delete in flight for a Create). Creates also wait for the
//!   plan's Deletes of their type ([`OraclePlan::predecessors`]).
//!
//! "Satisfied" is DESIGN §2's definition: the required item exists in
//! current state, is created, is not planned for deletion, has no Modify
//! planned, in flight or failed, and its predicate holds. For a Create or
//! Modify (rules 1 and 5), a dependency whose Create or Modify is in this
//! plan counts as satisfied *after* that operation (its predicate checked
//! against the intended value); rule 7's exception asks for dependencies
//! satisfied now.
//!
//! Readings chosen where DESIGN leaves room:
//! - a Modify waits for the Delete of every current dependent that this
//!   plan deletes, whatever the reason (rule 8: "a Modify waits for
//!   in-flight operations of its dependents", and a plan's ready operations
//!   are dispatched together; rules 4 and 6 ask for that order for the
//!   dependents they take down);
//! - rule 5 ("not satisfied") means "cannot be satisfied within this plan":
//!   the dependency does not exist and its Create is not in the plan, is not
//!   intended, is an unreported external item, or its predicate fails for
//!   the value it will have. A dependency that exists but is busy, or whose
//!   Modify waits, only makes the dependent's Modify wait;
//! - the own need of an existing item comes from its applied value (DESIGN:
//!   "Equality and planning use the applied value"), also while a Delete of
//!   it is in flight; an item that does not exist yet (its Create is in
//!   flight or failed) and left the intent needs no Delete;
//! - items that are busy, in backoff or failed terminally keep their
//!   Modify waiting on that first: rule 5 applies once the Modify could run;
//! - rule 6 and the proactive part of `recreate_when_modified` look at a
//!   dependency's next value only when neither side is busy (an item with an
//!   operation in flight has no "next value" to plan against yet);
//! - an item that relies on an item that is gone is deleted even if its
//!   intent no longer needs that item (rule 9: "other dependents are
//!   deleted"; rule 7's exception is about items this plan deletes), and
//!   one with an `auto_deleted_by_external` dependency on a gone item is
//!   dropped whatever its other dependencies (it is gone with it);
//! - a Delete that must wait for a dependent's retargeting Modify (rule 7)
//!   waits (reason Blocked) rather than being ordered after that Modify.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::{PlanEnvironment, WaitReason};
use crate::graph::{
    CurrentGraph, CurrentItem, Dependency, IntendedGraph, IntendedItem, Item, ItemRef, ItemState,
    OperationKind, Predicate, Properties, properties_after_modify,
};

/// An operation, named by its item and kind.
pub(super) type OperationId = (ItemRef, OperationKind);

/// What an item needs judged from its two values alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OwnNeed {
    /// Equal, external, or nothing to do.
    Nothing,
    /// Intended, does not exist.
    Create,
    /// Exists, differs, can change in place (`ask`: a NEEDS_RECREATE question).
    Modify { ask: bool },
    /// Exists, needs Delete + Create.
    Recreate,
    /// Exists, no longer intended.
    Delete,
}

/// The fate of one operation an item needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Decision {
    /// In the plan, after these operations of the plan (plus, for a
    /// Create, the plan's Deletes of the same type).
    Planned { after: BTreeSet<OperationId> },
    /// Cannot run yet.
    Waiting { reason: WaitReason },
}

/// The operations an item needs, as a user would name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Needs {
    Nothing,
    Create,
    Modify,
    Delete,
    /// Delete + Create.
    Recreate,
    /// Removed from current state without a call.
    Drop,
}

/// The oracle's decision for one item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ItemDecision {
    /// From equality alone.
    pub own_need: OwnNeed,
    /// Removed from current state without a Delete call (rule 9).
    pub dropped: bool,
    /// An operation of it runs or its outcome is unknown (a dropped busy
    /// item is forgotten once that operation reports).
    pub busy: bool,
    /// Planned for deletion (rule 8: follows from the diff).
    pub planned_for_deletion: bool,
    /// Its Delete, if one is needed.
    pub delete: Option<Decision>,
    /// Its Create or Modify, if one is needed.
    pub change: Option<(OperationKind, Decision)>,
}

impl ItemDecision {
    /// The operations the item needs.
    pub fn needs(&self) -> Needs {
        if self.dropped {
            return Needs::Drop;
        }
        match (&self.delete, &self.change) {
            (Some(_), Some(_)) => Needs::Recreate,
            (Some(_), None) => Needs::Delete,
            (None, Some((OperationKind::Modify, _))) => Needs::Modify,
            (None, Some(_)) => Needs::Create,
            (None, None) => Needs::Nothing,
        }
    }
}

/// The oracle's plan: a decision for every item of either graph.
#[derive(Clone, Debug, Default)]
pub(super) struct OraclePlan {
    pub items: BTreeMap<ItemRef, ItemDecision>,
}

impl OraclePlan {
    /// Every operation with its decision.
    pub fn operations(&self) -> impl Iterator<Item = (OperationId, &Decision)> + '_ {
        self.items.iter().flat_map(|(item, decision)| {
            let delete = decision
                .delete
                .as_ref()
                .map(|d| ((item.clone(), OperationKind::Delete), d));
            let change = decision
                .change
                .as_ref()
                .map(|(kind, d)| ((item.clone(), *kind), d));
            delete.into_iter().chain(change)
        })
    }

    /// The operations in the plan (ready now or after others of the plan).
    pub fn planned(&self) -> BTreeSet<OperationId> {
        self.operations()
            .filter(|(_, decision)| matches!(decision, Decision::Planned { .. }))
            .map(|(id, _)| id)
            .collect()
    }

    /// Everything operation `id` must wait for within the plan: its own
    /// predecessors and, for a Create, the plan's Deletes of its type.
    pub fn predecessors(&self, id: &OperationId) -> BTreeSet<OperationId> {
        let Some(Decision::Planned { after }) = self
            .operations()
            .find(|(other, _)| other == id)
            .map(|(_, d)| d.clone())
        else {
            return BTreeSet::new();
        };
        let mut all = after;
        if id.1 == OperationKind::Create {
            all.extend(self.planned().into_iter().filter(|(item, kind)| {
                *kind == OperationKind::Delete
                    && item.item_type() == id.0.item_type()
                    && *item != id.0
            }));
        }
        all
    }

    /// The operations that can be dispatched now.
    pub fn ready(&self) -> BTreeSet<OperationId> {
        let planned = self.planned();
        let deleted_types: BTreeSet<&str> = planned
            .iter()
            .filter(|(_, kind)| *kind == OperationKind::Delete)
            .map(|(item, _)| &**item.item_type())
            .collect();
        self.operations()
            .filter_map(|(id, decision)| match decision {
                Decision::Planned { after } if after.is_empty() => Some(id),
                _ => None,
            })
            .filter(|(item, kind)| {
                *kind != OperationKind::Create || !deleted_types.contains(&**item.item_type())
            })
            .collect()
    }

    /// Items needing an operation that cannot run yet.
    pub fn waiting(&self) -> BTreeSet<ItemRef> {
        self.items
            .iter()
            .filter(|(_, decision)| {
                let waits = |d: &Decision| matches!(d, Decision::Waiting { .. });
                decision.delete.as_ref().is_some_and(waits)
                    || decision.change.as_ref().is_some_and(|(_, d)| waits(d))
            })
            .map(|(item, _)| item.clone())
            .collect()
    }

    /// For each waiting item: the operation it waits to run (its Delete
    /// if that waits, else its Create or Modify) and the reason.
    pub fn reasons(&self) -> BTreeSet<(ItemRef, OperationKind, WaitReason)> {
        self.items
            .iter()
            .filter_map(|(item, decision)| {
                let delete = match &decision.delete {
                    Some(Decision::Waiting { reason }) => Some((OperationKind::Delete, *reason)),
                    _ => None,
                };
                let change = match &decision.change {
                    Some((kind, Decision::Waiting { reason })) => Some((*kind, *reason)),
                    _ => None,
                };
                delete
                    .or(change)
                    .map(|(kind, reason)| (item.clone(), kind, reason))
            })
            .collect()
    }

    /// Items removed from current state without a call, now (a busy one
    /// once its operation reports).
    pub fn dropped(&self) -> BTreeSet<ItemRef> {
        self.items
            .iter()
            .filter(|(_, decision)| decision.dropped && !decision.busy)
            .map(|(item, _)| item.clone())
            .collect()
    }
}

/// Plans from scratch over the whole of both graphs (see the module docs).
pub(super) fn oracle_plan(
    intended: &IntendedGraph,
    current: &CurrentGraph,
    env: &impl PlanEnvironment,
) -> OraclePlan {
    oracle_run(intended, current, env)
}

/// [`oracle_plan`], as the planner's tests call it.
fn oracle_run(
    intended: &IntendedGraph,
    current: &CurrentGraph,
    env: &impl PlanEnvironment,
) -> OraclePlan {
    Oracle::new(intended, current, env).run()
}

/// A schedule while it is being computed: waiting schedules also say
/// whether the wait can end within this plan's world (rule 5).
#[derive(Clone, Debug)]
enum Schedule {
    Planned(BTreeSet<OperationId>),
    Waiting { reason: WaitReason, hopeless: bool },
}

/// How one dependency of a Create or Modify stands.
enum Status {
    Satisfied,
    After(OperationId),
    Unsatisfied { hopeless: bool },
}

struct Oracle<'a, E> {
    intended: &'a IntendedGraph,
    current: &'a CurrentGraph,
    env: &'a E,
    /// Every identity either graph holds.
    universe: BTreeSet<ItemRef>,
    /// Current edges reversed: items whose applied value or in-flight
    /// target requires the key.
    current_dependents: BTreeMap<ItemRef, BTreeSet<ItemRef>>,
    own: BTreeMap<ItemRef, OwnNeed>,
    dropped: BTreeSet<ItemRef>,
    doomed: BTreeSet<ItemRef>,
    delete_memo: BTreeMap<ItemRef, Option<Schedule>>,
    change_memo: BTreeMap<ItemRef, Option<(OperationKind, Schedule)>>,
    in_progress: BTreeSet<OperationId>,
    predicates: RefCell<HashMap<String, Option<Predicate>>>,
}

impl<'a, E: PlanEnvironment> Oracle<'a, E> {
    fn new(intended: &'a IntendedGraph, current: &'a CurrentGraph, env: &'a E) -> Self {
        let mut universe: BTreeSet<ItemRef> = intended.iter().map(|(k, _)| k.clone()).collect();
        universe.extend(current.iter().map(|(k, _)| k.clone()));
        let mut current_dependents: BTreeMap<ItemRef, BTreeSet<ItemRef>> = BTreeMap::new();
        for (key, entry) in current.iter() {
            // Every value the item may hold, and the one an operation (or
            // the lost operation a READ resolves) applies.
            for required in entry.edges() {
                current_dependents
                    .entry(required.clone())
                    .or_default()
                    .insert(key.clone());
            }
        }
        Self {
            intended,
            current,
            env,
            universe,
            current_dependents,
            own: BTreeMap::new(),
            dropped: BTreeSet::new(),
            doomed: BTreeSet::new(),
            delete_memo: BTreeMap::new(),
            change_memo: BTreeMap::new(),
            in_progress: BTreeSet::new(),
            predicates: RefCell::new(HashMap::new()),
        }
    }

    // ----- facts about one item ---------------------------------------------

    fn intended_of(&self, item: &ItemRef) -> Option<&'a Arc<IntendedItem>> {
        self.intended.get(item)
    }

    fn current_of(&self, item: &ItemRef) -> Option<&'a Arc<CurrentItem>> {
        self.current.get(item)
    }

    /// The items whose current value (or running operation) requires
    /// `item`, as an owned list.
    fn current_dependents_of(&self, item: &ItemRef) -> Vec<ItemRef> {
        self.current_dependents
            .get(item)
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    fn busy(&self, item: &ItemRef) -> bool {
        self.current_of(item).is_some_and(|c| c.is_busy())
    }

    /// Something a Delete below it must wait for: it may exist (and is not
    /// dropped), or has an operation running (dropped or not: a dropped
    /// item goes once that operation reports).
    fn holds(&self, item: &ItemRef) -> bool {
        self.current_of(item)
            .is_some_and(|c| c.is_busy() || (c.may_exist() && !self.dropped.contains(item)))
    }

    /// Intended and not external: ours to create or modify.
    fn operable(&self, item: &ItemRef) -> bool {
        self.intended_of(item).is_some_and(|i| !i.item.external)
    }

    fn external(&self, item: &ItemRef) -> bool {
        match self.intended_of(item) {
            Some(entry) => entry.item.external,
            None => self
                .current_of(item)
                .and_then(|c| c.applied.as_ref())
                .is_some_and(|a| a.external),
        }
    }

    fn own(&self, item: &ItemRef) -> OwnNeed {
        self.own.get(item).copied().unwrap_or(OwnNeed::Nothing)
    }

    /// The dependencies of the item's applied value, and of the values lost
    /// operations may have applied (`maybe_applied`).
    fn applied_dependencies(&self, item: &ItemRef) -> Vec<Dependency> {
        self.current_of(item)
            .into_iter()
            .flat_map(|c| c.values())
            .flat_map(|value| value.dependencies.iter().cloned())
            .collect()
    }

    fn in_backoff(&self, current: &CurrentItem) -> bool {
        !current.is_busy()
            && current
                .rare
                .next_attempt_at_ms
                .is_some_and(|at| at > self.env.now_ms())
    }

    /// Whether `source` holds for `properties`; an evaluation error is false.
    fn holds_for(&self, source: &str, properties: &Properties) -> bool {
        if source.is_empty() {
            return true;
        }
        let mut cache = self.predicates.borrow_mut();
        let predicate = cache
            .entry(source.to_string())
            .or_insert_with(|| Predicate::compile(source).ok());
        predicate
            .as_ref()
            .is_some_and(|p| p.evaluate(properties).unwrap_or(false))
    }

    // ----- own needs ---------------------------------------------------------

    fn compute_own(&self, item: &ItemRef) -> OwnNeed {
        let intended = self.intended_of(item);
        let current = self.current_of(item);
        // External items are never operated on (rule 9), nor are reports of
        // external items nobody intends.
        if intended.is_some_and(|i| i.item.external) {
            return OwnNeed::Nothing;
        }
        if intended.is_none()
            && current
                .and_then(|c| c.applied.as_ref())
                .is_some_and(|a| a.external)
        {
            return OwnNeed::Nothing;
        }
        match (intended, current) {
            (None, None) => OwnNeed::Nothing,
            (None, Some(c)) => {
                // A running or UNKNOWN operation may have created it.
                if c.may_exist() || c.is_busy() {
                    OwnNeed::Delete
                } else {
                    OwnNeed::Nothing
                }
            }
            (Some(_), None) => OwnNeed::Create,
            (Some(i), Some(c)) => {
                // A Create whose outcome was uncertain is sent again.
                if !c.may_exist() || c.existence_uncertain {
                    return OwnNeed::Create;
                }
                if c.applied.is_none() {
                    return OwnNeed::Modify { ask: false };
                }
                // Rule 4: a recreate_when_modified dependency modified since
                // this item recorded its counter needs a recreate, whatever
                // else changed.
                if self.dependency_modified_since_created(&i.item, c) {
                    return OwnNeed::Recreate;
                }
                // Every value the item may hold (a lost operation's,
                // `maybe_applied`) must be the intended one; a recreate
                // from any of them wins over a Modify.
                c.values()
                    .filter(|value| !value.same_content(&i.item))
                    .map(|value| self.change_need(value, i, c))
                    .max_by_key(|need| *need == OwnNeed::Recreate)
                    .unwrap_or(OwnNeed::Nothing)
            }
        }
    }

    /// A dependency that is `recreate_when_modified` in both a value the
    /// item may hold (so the dependent recorded its counter when that value
    /// was sent) and the intent (so it still asks for it) points to an item
    /// whose modification counter moved since.
    fn dependency_modified_since_created(&self, intended: &Item, current: &CurrentItem) -> bool {
        intended
            .dependencies
            .iter()
            .filter(|d| d.recreate_when_modified())
            .filter(|d| {
                current.values().any(|value| {
                    value
                        .dependency_on(&d.requires)
                        .is_some_and(|a| a.recreate_when_modified())
                })
            })
            .any(|d| {
                let Some(required) = self.current_of(&d.requires) else {
                    return false;
                };
                match current.rare.dependency_marks.get(&d.requires) {
                    Some(&recorded) => recorded != required.modifications,
                    // Only the applied value's dependencies count from 0
                    // unmarked; another value's count only with its mark.
                    None => {
                        required.modifications != 0
                            && current.applied.as_ref().is_some_and(|applied| {
                                applied
                                    .dependency_on(&d.requires)
                                    .is_some_and(|a| a.recreate_when_modified())
                            })
                    }
                }
            })
    }

    fn change_need(&self, applied: &Item, intended: &IntendedItem, c: &CurrentItem) -> OwnNeed {
        let Some(rules) = self.env.type_rules(intended.item.item_type()) else {
            return OwnNeed::Modify { ask: false };
        };
        let as_value = |p: &Properties| p.to_value();
        let old = as_value(&applied.properties);
        let new = as_value(&intended.item.properties);
        let hits = rules
            .recreate_on_change
            .iter()
            .any(|path| path == "*" || old.pointer(path) != new.pointer(path));
        if hits {
            return OwnNeed::Recreate;
        }
        if rules.ask_needs_recreate {
            return match c.rare.needs_recreate_answer {
                Some((generation, true)) if generation == intended.generation => OwnNeed::Recreate,
                Some((generation, false)) if generation == intended.generation => {
                    OwnNeed::Modify { ask: false }
                }
                _ => OwnNeed::Modify { ask: true },
            };
        }
        OwnNeed::Modify { ask: false }
    }

    /// The properties `item` will have once this plan ran: the intended ones
    /// if it gets a Create or Modify, else what exists (observed over applied).
    fn next_value(&self, item: &ItemRef) -> Properties {
        match (self.own(item), self.intended_of(item)) {
            // A Modify keeps what the agent observed beyond the applied
            // value (a reported state the intent does not set).
            (OwnNeed::Modify { .. }, Some(entry)) => {
                properties_after_modify(self.current_of(item), &entry.item.properties).into_owned()
            }
            (OwnNeed::Create | OwnNeed::Recreate, Some(entry)) => entry.item.properties.clone(),
            _ => self
                .current_of(item)
                .map(|c| c.effective_properties())
                .unwrap_or_default(),
        }
    }

    // ----- dropped and planned for deletion ----------------------------------

    /// The required item is gone: absent from current state, or neither
    /// created, nor busy, nor of uncertain existence (UNKNOWN never causes
    /// a dependent's deletion), or dropped by this plan.
    fn gone(&self, item: &ItemRef) -> bool {
        match self.current_of(item) {
            None => true,
            Some(c) if c.is_busy() || c.existence_uncertain => false,
            Some(c) => !c.is_created() || self.dropped.contains(item),
        }
    }

    /// Rule 9: an existing item with an `auto_deleted_by_external`
    /// dependency on an item that is gone leaves current state without a
    /// Delete call (computed to a fixpoint: a dropped item is gone too).
    fn compute_dropped(&mut self) {
        loop {
            let mut changed = false;
            for (key, entry) in self.current.iter() {
                if self.dropped.contains(key) || !entry.may_exist() {
                    continue;
                }
                // Dropped when its value goes with a gone item, and so does
                // every value a lost operation may have applied.
                let ties = |value: &Item| {
                    value
                        .dependencies
                        .iter()
                        .any(|d| d.auto_deleted_by_external() && self.gone(&d.requires))
                };
                let drop = entry.applied.as_deref().is_some_and(ties)
                    && entry.rare.maybe_applied.iter().all(|value| ties(value));
                if drop {
                    self.dropped.insert(key.clone());
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
    }

    /// Rule 7's exception: `dependent` relies on `required` now, the intent
    /// no longer needs `required`, a Modify gets it there, and "its new
    /// dependencies are satisfied": every one of them, now (DESIGN §2's
    /// definition, given the items planned for deletion so far).
    fn retargets_away(
        &self,
        dependent: &ItemRef,
        required: &ItemRef,
        doomed: &BTreeSet<ItemRef>,
    ) -> bool {
        let Some(intended) = self.intended_of(dependent) else {
            return false;
        };
        self.operable(dependent)
            && intended.item.dependency_on(required).is_none()
            && matches!(self.own(dependent), OwnNeed::Modify { .. })
            && intended
                .item
                .dependencies
                .iter()
                .all(|d| self.satisfied_now(d, doomed))
    }

    /// DESIGN §2: the required item exists in current state, is created,
    /// is not planned for deletion, has no Modify (or Create) planned, in
    /// flight or failed, and the predicate holds, before any operation of
    /// this plan.
    fn satisfied_now(&self, dependency: &Dependency, doomed: &BTreeSet<ItemRef>) -> bool {
        let required = &dependency.requires;
        if doomed.contains(required) || self.dropped.contains(required) {
            return false;
        }
        let Some(current) = self.current_of(required) else {
            return false;
        };
        if !current.is_created() || current.is_busy() || current.has_failed_modify() {
            return false;
        }
        let changes = matches!(
            self.own(required),
            OwnNeed::Create | OwnNeed::Modify { .. } | OwnNeed::Recreate
        );
        if self.operable(required) && changes {
            return false;
        }
        self.holds_for(dependency.must_satisfy(), &current.effective_properties())
    }

    /// Reasons an item is planned for deletion that do not depend on other
    /// items being planned for deletion.
    fn direct_deletions(&mut self) -> BTreeSet<ItemRef> {
        let mut doomed = BTreeSet::new();
        for item in &self.universe {
            if self.dropped.contains(item) {
                continue;
            }
            if matches!(self.own(item), OwnNeed::Delete | OwnNeed::Recreate) {
                doomed.insert(item.clone());
            }
            let Some(current) = self.current_of(item) else {
                continue;
            };
            if !current.may_exist() {
                continue;
            }
            let applied = self.applied_dependencies(item);
            // It relies on an item that is gone (rule 9: "other dependents
            // are deleted"; a dependency on a dropped item is gone too).
            if applied.iter().any(|d| self.gone(&d.requires)) {
                doomed.insert(item.clone());
                continue;
            }
            // Rules 6 and 4, for items that stay intended and are not busy:
            // a predicate that fails for the dependency's next value, or a
            // recreate_when_modified dependency about to be modified.
            let Some(intended) = self.intended_of(item) else {
                continue;
            };
            if current.is_busy() {
                continue;
            }
            for dependency in &applied {
                let required = &dependency.requires;
                if self.busy(required) {
                    continue;
                }
                let next = self.next_value(required);
                let predicate_fails = !self.holds_for(dependency.must_satisfy(), &next);
                let modified = matches!(self.own(required), OwnNeed::Modify { .. });
                let recreate = modified
                    && intended
                        .item
                        .dependency_on(required)
                        .is_some_and(|d| d.recreate_when_modified());
                if predicate_fails || recreate {
                    doomed.insert(item.clone());
                }
            }
        }
        doomed
    }

    /// Closes the set of items planned for deletion along current edges:
    /// dependents of an item planned for deletion go first (except a
    /// dependent retargeted away by a Modify), and dependents of a dropped
    /// item are deleted.
    fn close_deletions(&mut self, mut doomed: BTreeSet<ItemRef>) -> BTreeSet<ItemRef> {
        for dropped in &self.dropped {
            for dependent in self.current_dependents.get(dropped).into_iter().flatten() {
                if self.holds(dependent) {
                    doomed.insert(dependent.clone());
                }
            }
        }
        // Whether a dependent retargets away depends on what is planned for
        // deletion: repeat until nothing more is taken along.
        loop {
            let mut more = Vec::new();
            for item in &doomed {
                for dependent in self.current_dependents.get(item).into_iter().flatten() {
                    if doomed.contains(dependent) || !self.holds(dependent) {
                        continue;
                    }
                    if !self.retargets_away(dependent, item, &doomed) {
                        more.push(dependent.clone());
                    }
                }
            }
            if more.is_empty() {
                return doomed;
            }
            doomed.extend(more);
        }
    }

    // ----- schedules ----------------------------------------------------------

    fn needs_change(&self, item: &ItemRef) -> bool {
        self.operable(item)
            && !self.dropped.contains(item)
            && (self.doomed.contains(item)
                || matches!(
                    self.own(item),
                    OwnNeed::Create | OwnNeed::Modify { .. } | OwnNeed::Recreate
                ))
    }

    fn busy_wait(current: &CurrentItem) -> Schedule {
        // An operation running is a block; one whose outcome is lost is
        // an unknown outcome (DESIGN 4), journaled operation or not.
        let reason = if current.state == ItemState::Unknown || current.in_flight.is_none() {
            WaitReason::UnknownOutcome
        } else {
            WaitReason::Blocked
        };
        Schedule::Waiting {
            reason,
            hopeless: false,
        }
    }

    fn wait(reason: WaitReason) -> Schedule {
        Schedule::Waiting {
            reason,
            hopeless: false,
        }
    }

    /// The Delete of `item`, if one is needed.
    fn delete_schedule(&mut self, item: &ItemRef) -> Option<Schedule> {
        if let Some(memo) = self.delete_memo.get(item) {
            return memo.clone();
        }
        let key = (item.clone(), OperationKind::Delete);
        if !self.in_progress.insert(key.clone()) {
            // A cycle in current state: nothing can go first.
            return Some(Self::wait(WaitReason::Blocked));
        }
        let schedule = self.compute_delete(item);
        self.in_progress.remove(&key);
        self.delete_memo.insert(item.clone(), schedule.clone());
        schedule
    }

    fn compute_delete(&mut self, item: &ItemRef) -> Option<Schedule> {
        if !self.doomed.contains(item) || !self.holds(item) || self.dropped.contains(item) {
            return None;
        }
        let current = self.current_of(item)?;
        if current.is_busy() {
            return Some(Self::busy_wait(current));
        }
        let generation = self.intended_of(item).map_or(0, |i| i.generation);
        // No retry until the intent changes: neither of a failed Delete,
        // nor the item's own recreate after its Modify failed for good.
        let retries_a_refusal = current.last_operation == Some(OperationKind::Delete)
            || self.own(item) == OwnNeed::Recreate;
        if retries_a_refusal
            && (current.failed_terminally_at(generation)
                || current.gave_up_settled_at(OperationKind::Delete, generation))
        {
            return Some(Self::wait(WaitReason::TerminalFailure));
        }
        if self.in_backoff(current) {
            return Some(Self::wait(WaitReason::Backoff));
        }
        if !self.env.has_configurator(item.item_type()) {
            return Some(Self::wait(WaitReason::NoConfigurator));
        }
        let mut after = BTreeSet::new();
        // DESIGN 4: an UNKNOWN dependency blocks operations on its
        // dependents, Deletes included.
        let mut blocked = self.relies_on_an_unknown_item(item);
        let dependents = self.current_dependents_of(item);
        for dependent in dependents {
            if !self.holds(&dependent) {
                continue;
            }
            if self.dropped.contains(&dependent) || !self.doomed.contains(&dependent) {
                // Dropped but still running, or staying (a retargeting
                // Modify moves it off first).
                blocked = true;
                continue;
            }
            match self.delete_schedule(&dependent) {
                Some(Schedule::Planned(_)) => {
                    after.insert((dependent, OperationKind::Delete));
                }
                Some(Schedule::Waiting { .. }) => blocked = true,
                None => {}
            }
        }
        Some(if blocked {
            Self::wait(WaitReason::Blocked)
        } else {
            Schedule::Planned(after)
        })
    }

    /// Whether `item`'s applied value depends on an item whose outcome is
    /// unknown (DESIGN 4: that blocks every operation on `item`).
    fn relies_on_an_unknown_item(&self, item: &ItemRef) -> bool {
        self.current_of(item).is_some_and(|current| {
            current.values().any(|held| {
                held.required_items().any(|required| {
                    self.current
                        .get(required)
                        .is_some_and(|c| c.state == crate::graph::ItemState::Unknown)
                })
            })
        })
    }

    /// The Create or Modify of `item`, if one is needed.
    fn change_schedule(&mut self, item: &ItemRef) -> Option<(OperationKind, Schedule)> {
        if let Some(memo) = self.change_memo.get(item) {
            return memo.clone();
        }
        if !self.needs_change(item) {
            self.change_memo.insert(item.clone(), None);
            return None;
        }
        let recreating = self.doomed.contains(item);
        let kind = if recreating || matches!(self.own(item), OwnNeed::Create | OwnNeed::Recreate) {
            OperationKind::Create
        } else {
            OperationKind::Modify
        };
        let key = (item.clone(), kind);
        if !self.in_progress.insert(key.clone()) {
            return Some((kind, Self::wait(WaitReason::Blocked)));
        }
        let schedule = self.compute_change(item, kind, recreating);
        self.in_progress.remove(&key);
        let result = Some((kind, schedule));
        self.change_memo.insert(item.clone(), result.clone());
        result
    }

    fn compute_change(
        &mut self,
        item: &ItemRef,
        kind: OperationKind,
        recreating: bool,
    ) -> Schedule {
        let Some(entry) = self.intended_of(item) else {
            return Self::wait(WaitReason::Blocked);
        };
        if let Some(current) = self.current_of(item) {
            if current.is_busy() {
                return Self::busy_wait(current);
            }
            if !recreating {
                if current.failed_terminally_at(entry.generation)
                    || current.gave_up_settled_at(kind, entry.generation)
                {
                    return Self::wait(WaitReason::TerminalFailure);
                }
                if self.in_backoff(current) {
                    return Self::wait(WaitReason::Backoff);
                }
            }
        }
        let mut after = BTreeSet::new();
        let mut blocked = false;
        let mut unsatisfied = false;
        let mut hopeless = false;
        if recreating {
            match self.delete_schedule(item) {
                Some(Schedule::Planned(_)) => {
                    after.insert((item.clone(), OperationKind::Delete));
                }
                Some(Schedule::Waiting { .. }) => blocked = true,
                None => {}
            }
        }
        for dependency in &entry.item.dependencies {
            match self.dependency_status(dependency) {
                Status::Satisfied => {}
                Status::After(operation) => {
                    after.insert(operation);
                }
                Status::Unsatisfied { hopeless: never } => {
                    unsatisfied = true;
                    hopeless |= never;
                }
            }
        }
        if kind == OperationKind::Modify {
            // Rule 8: a Modify waits for in-flight operations of its
            // dependents. The plan's ready operations are dispatched
            // together, so that includes the Deletes this plan gives them,
            // whatever the reason (rules 4 and 6 take dependents down for
            // this Modify's sake; others leave, or go with something else):
            // no dependent is being deleted while what it relies on changes.
            let dependents = self.current_dependents_of(item);
            for dependent in dependents {
                if self.busy(&dependent) {
                    blocked = true;
                    continue;
                }
                if !self.doomed.contains(&dependent) {
                    continue;
                }
                match self.delete_schedule(&dependent) {
                    Some(Schedule::Planned(_)) => {
                        after.insert((dependent, OperationKind::Delete));
                    }
                    Some(Schedule::Waiting { .. }) => blocked = true,
                    None => {}
                }
            }
            // DESIGN 4: an UNKNOWN item blocks operations on its
            // dependents, including one whose Modify drops it.
            if self.relies_on_an_unknown_item(item) {
                blocked = true;
            }
        }
        // DESIGN 4 again: an item created again while it may still exist
        // (a lost Create given up) is a dependent of what the values it
        // may hold rely on, unless it is being recreated (its Delete runs
        // first).
        if kind == OperationKind::Create
            && !recreating
            && self.current_of(item).is_some_and(|c| c.may_exist())
            && self.relies_on_an_unknown_item(item)
        {
            blocked = true;
        }
        if kind == OperationKind::Create {
            // Rule 8: a Delete of the same type in flight holds Creates.
            let same_type_delete = self.current.iter().any(|(other, c)| {
                other != item
                    && other.item_type() == item.item_type()
                    && c.in_flight
                        .as_ref()
                        .is_some_and(|op| op.kind == OperationKind::Delete)
            });
            blocked |= same_type_delete;
        }
        if unsatisfied {
            Schedule::Waiting {
                reason: WaitReason::Dependency,
                hopeless,
            }
        } else if !self.env.has_configurator(item.item_type()) {
            Self::wait(WaitReason::NoConfigurator)
        } else if blocked {
            Self::wait(WaitReason::Blocked)
        } else {
            Schedule::Planned(after)
        }
    }

    /// DESIGN §2's "satisfied", with "after this plan's operation" and
    /// whether the dependency can be satisfied within this plan at all.
    fn dependency_status(&mut self, dependency: &Dependency) -> Status {
        let required = &dependency.requires;
        let hopeless = Status::Unsatisfied { hopeless: true };
        if self.dropped.contains(required) {
            return hopeless;
        }
        let current = self.current_of(required);
        if self.external(required) {
            return match current {
                Some(c) if c.is_created() => {
                    self.check(dependency, &c.effective_properties(), None)
                }
                _ => hopeless,
            };
        }
        let Some(intended) = self.intended_of(required) else {
            // Missing, or in current state only: planned for deletion.
            return hopeless;
        };
        if current.is_some_and(|c| c.is_busy()) {
            return Status::Unsatisfied { hopeless: false };
        }
        if let Some((kind, schedule)) = self.change_schedule(required) {
            return match schedule {
                Schedule::Planned(_) => {
                    let after = if kind == OperationKind::Modify {
                        properties_after_modify(current, &intended.item.properties)
                    } else {
                        std::borrow::Cow::Borrowed(&intended.item.properties)
                    };
                    self.check(dependency, &after, Some((required.clone(), kind)))
                }
                // Not created and not going to be in this plan, unless it
                // may exist already (a lost Create may have applied): then
                // its dependents wait, as for UNKNOWN.
                Schedule::Waiting { .. } if kind == OperationKind::Create => {
                    let uncertain = current.is_some_and(|c| c.existence_uncertain);
                    Status::Unsatisfied {
                        hopeless: !uncertain,
                    }
                }
                // Exists, with a Modify that must happen first.
                Schedule::Waiting { .. } => Status::Unsatisfied { hopeless: false },
            };
        }
        match current {
            Some(c) if c.is_created() => self.check(dependency, &c.effective_properties(), None),
            _ => hopeless,
        }
    }

    fn check(
        &self,
        dependency: &Dependency,
        properties: &Properties,
        after: Option<OperationId>,
    ) -> Status {
        if !self.holds_for(dependency.must_satisfy(), properties) {
            return Status::Unsatisfied { hopeless: true };
        }
        match after {
            Some(operation) => Status::After(operation),
            None => Status::Satisfied,
        }
    }

    // ----- the whole computation --------------------------------------------

    fn run(&mut self) -> OraclePlan {
        let universe: Vec<ItemRef> = self.universe.iter().cloned().collect();
        for item in &universe {
            let need = self.compute_own(item);
            self.own.insert(item.clone(), need);
        }
        self.compute_dropped();
        let direct = self.direct_deletions();
        let mut modifies_deleted: BTreeSet<ItemRef> = BTreeSet::new();
        loop {
            let mut seed = direct.clone();
            seed.extend(modifies_deleted.iter().cloned());
            self.doomed = self.close_deletions(seed);
            self.delete_memo.clear();
            self.change_memo.clear();
            for item in &universe {
                self.delete_schedule(item);
                self.change_schedule(item);
            }
            // Rule 5: a Modify whose new dependencies cannot be satisfied
            // is a delete; the item then waits as pending.
            let more: Vec<ItemRef> = universe
                .iter()
                .filter(|item| !self.doomed.contains(*item))
                .filter(|item| {
                    matches!(
                        self.change_memo.get(*item),
                        Some(Some((
                            OperationKind::Modify,
                            Schedule::Waiting {
                                reason: WaitReason::Dependency,
                                hopeless: true
                            }
                        )))
                    )
                })
                .cloned()
                .collect();
            if more.is_empty() {
                break;
            }
            modifies_deleted.extend(more);
        }
        let decision = |schedule: Schedule| match schedule {
            Schedule::Planned(after) => Decision::Planned { after },
            Schedule::Waiting { reason, .. } => Decision::Waiting { reason },
        };
        let mut items = BTreeMap::new();
        for item in universe {
            let mut delete = self.delete_memo.get(&item).cloned().flatten();
            if self.dropped.contains(&item)
                && let Some(current) = self.current_of(&item).filter(|c| c.is_busy())
            {
                // Goes with its external item once its operation reports:
                // it waits for that operation.
                delete = Some(Self::busy_wait(current));
            }
            let mut change = self.change_memo.get(&item).cloned().flatten();
            if delete.is_none()
                && change.is_none()
                && let Some(current) = self
                    .current_of(&item)
                    .filter(|c| c.state == ItemState::Unknown)
            {
                // An UNKNOWN item waits for its outcome, whatever it needs.
                let kind = current
                    .in_flight
                    .as_ref()
                    .map_or(OperationKind::Modify, |operation| operation.kind);
                let unknown = Self::wait(WaitReason::UnknownOutcome);
                if kind == OperationKind::Delete {
                    delete = Some(unknown);
                } else {
                    change = Some((kind, unknown));
                }
            }
            items.insert(
                item.clone(),
                ItemDecision {
                    own_need: self.own(&item),
                    dropped: self.dropped.contains(&item),
                    busy: self.current_of(&item).is_some_and(|c| c.is_busy()),
                    planned_for_deletion: self.doomed.contains(&item),
                    delete: delete.map(decision),
                    change: change.map(|(kind, s)| (kind, decision(s))),
                },
            );
        }
        OraclePlan { items }
    }
}
