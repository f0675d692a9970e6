//! The planning algorithm: needs, the deletion cascade, and the schedules
//! of Deletes, Creates and Modifies.
//!
//! 1. Every seed is *visited*: its own need is computed, and items it may
//!    affect (its dependents in both graphs) are visited too while it is not
//!    converged.
//! 2. Deletions cascade along current edges: an item planned for deletion
//!    (it left the intent, or is recreated) takes every current dependent
//!    with it. Existing items also go when a dependency they rely on is gone
//!    (or are dropped without a call when `auto_deleted_by_external` says
//!    so), when a predicate fails for the value the dependency will have
//!    (rule 6), or when a `recreate_when_modified` dependency is modified.
//! 3. Deletes are scheduled dependents-first; Creates and Modifies
//!    dependencies-first. Each schedule is either ready (with the plan's
//!    operations it must follow) or waiting (with a reason and what blocks it).
//! 4. A Modify whose new dependencies cannot be satisfied within this plan
//!    turns into a delete (rule 5); the cascade and schedules are then
//!    computed again until nothing changes (the set only grows).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use super::need::{Need, own_need};
use super::{BlockedBy, PlanEnvironment, WaitReason};
use crate::graph::{
    CurrentGraph, CurrentItem, IntendedGraph, ItemRef, OperationKind, Predicate, Properties,
};

/// An operation of the plan being built, named by item and kind.
pub(super) type OperationKey = (ItemRef, OperationKind);

/// What the planner decided for one operation of one item.
#[derive(Clone, Debug)]
pub(super) enum Schedule {
    /// Nothing to do (e.g. nothing exists to delete).
    NotNeeded,
    /// Goes into the plan after the listed operations.
    Ready {
        kind: OperationKind,
        after: Vec<OperationKey>,
    },
    /// Needed but cannot run yet.
    Waiting {
        kind: OperationKind,
        reason: WaitReason,
        blocked_by: Vec<BlockedBy>,
        /// A dependency cannot be satisfied within this plan (drives rule 5).
        hopeless: bool,
    },
}

/// How one dependency of an item stands.
enum DependencyStatus {
    Satisfied,
    After(OperationKey),
    Unsatisfied { why: String, hopeless: bool },
}

/// The state of one planning run.
pub(super) struct Planner<'a, E> {
    pub(super) intended: &'a IntendedGraph,
    pub(super) current: &'a CurrentGraph,
    environment: &'a E,
    now_ms: u64,
    seeds: BTreeSet<ItemRef>,
    needs: FxHashMap<ItemRef, Need>,
    pub(super) examined: BTreeSet<ItemRef>,
    queue: Vec<ItemRef>,
    pub(super) deleting: BTreeSet<ItemRef>,
    pub(super) dropped: BTreeSet<ItemRef>,
    /// Modify(key) waits for the Deletes of these dependents (rule 6).
    deletes_before_modify: FxHashMap<ItemRef, BTreeSet<ItemRef>>,
    pub(super) delete_schedules: FxHashMap<ItemRef, Schedule>,
    pub(super) change_schedules: FxHashMap<ItemRef, Schedule>,
    /// One in-flight Delete per item type: Creates of that type wait.
    inflight_deletes_by_type: FxHashMap<Arc<str>, ItemRef>,
}

impl<'a, E: PlanEnvironment> Planner<'a, E> {
    /// A planner over the two graphs.
    pub(super) fn new(
        intended: &'a IntendedGraph,
        current: &'a CurrentGraph,
        environment: &'a E,
    ) -> Self {
        Self {
            intended,
            current,
            environment,
            now_ms: environment.now_ms(),
            seeds: BTreeSet::new(),
            needs: FxHashMap::default(),
            examined: BTreeSet::new(),
            queue: Vec::new(),
            deleting: BTreeSet::new(),
            dropped: BTreeSet::new(),
            deletes_before_modify: FxHashMap::default(),
            delete_schedules: FxHashMap::default(),
            change_schedules: FxHashMap::default(),
            inflight_deletes_by_type: FxHashMap::default(),
        }
    }

    /// Plans from `seeds`.
    pub(super) fn run(mut self, seeds: &BTreeSet<ItemRef>) -> super::Plan {
        self.seeds = seeds.clone();
        for seed in seeds {
            self.visit(seed);
        }
        loop {
            self.process_queue();
            self.delete_schedules.clear();
            self.change_schedules.clear();
            self.collect_inflight_deletes();
            self.schedule_deletes();
            self.schedule_changes();
            let doomed = self.modifies_that_must_delete();
            if doomed.is_empty() {
                break;
            }
            for item in doomed {
                self.mark_deleting(&item);
            }
        }
        super::assemble::assemble(&mut self)
    }

    /// The item's own need (memoized).
    pub(super) fn need(&mut self, item: &ItemRef) -> Need {
        if let Some(need) = self.needs.get(item) {
            return *need;
        }
        let need = own_need(
            self.intended.get(item).map(|entry| &**entry),
            self.current.get(item).map(|entry| &**entry),
            self.current,
            self.environment,
        );
        self.needs.insert(item.clone(), need);
        need
    }

    fn visit(&mut self, item: &ItemRef) {
        if !self.examined.contains(item) {
            self.examined.insert(item.clone());
            self.queue.push(item.clone());
        }
    }

    fn process_queue(&mut self) {
        while let Some(item) = self.queue.pop() {
            let need = self.need(&item);
            if matches!(need, Need::Delete | Need::Recreate) {
                self.mark_deleting(&item);
            }
            let current = self.current.get(&item).cloned();
            if let Some(current) = &current
                && current.may_exist()
            {
                self.check_existing(&item, current);
            }
            let settled = need == Need::Nothing
                && current
                    .as_ref()
                    .is_some_and(|c| c.is_created() && !c.is_busy());
            let absent_and_unwanted = need == Need::Nothing && current.is_none();
            if self.seeds.contains(&item) || !(settled || absent_and_unwanted) {
                let dependents: Vec<ItemRef> = self
                    .current
                    .dependents_of(&item)
                    .chain(self.intended.dependents_of(&item))
                    .cloned()
                    .collect();
                for dependent in &dependents {
                    self.visit(dependent);
                }
            }
        }
    }

    /// Plans `item` (and, transitively, its current dependents) for deletion.
    fn mark_deleting(&mut self, item: &ItemRef) {
        let mut stack = vec![item.clone()];
        while let Some(item) = stack.pop() {
            if !self.deleting.insert(item.clone()) {
                continue;
            }
            self.visit(&item);
            for dependent in self.current.dependents_of(&item) {
                if self.dropped.contains(dependent) {
                    continue;
                }
                if self
                    .current
                    .get(dependent)
                    .is_some_and(|c| c.may_exist() || c.is_busy())
                {
                    stack.push(dependent.clone());
                }
            }
        }
    }

    /// Removes `item` from current state without a call; what depends on it
    /// has lost a dependency and is deleted.
    fn drop_item(&mut self, item: &ItemRef) {
        if !self.dropped.insert(item.clone()) {
            return;
        }
        self.visit(item);
        let dependents: Vec<ItemRef> = self.current.dependents_of(item).cloned().collect();
        for dependent in &dependents {
            if self
                .current
                .get(dependent)
                .is_some_and(|c| c.may_exist() || c.is_busy())
            {
                self.mark_deleting(dependent);
            }
        }
    }

    /// Rules for an item that exists: a dependency it relies on is gone, a
    /// predicate fails for the dependency's next value, or a
    /// `recreate_when_modified` dependency is about to be modified.
    fn check_existing(&mut self, item: &ItemRef, current: &CurrentItem) {
        let Some(applied) = current.applied.clone() else {
            return;
        };
        for dependency in &applied.dependencies {
            let required = &dependency.requires;
            let gone = match self.current.get(required) {
                Some(state) if state.is_busy() => false,
                Some(state) => !state.is_created() || self.dropped.contains(required),
                None => true,
            };
            if gone {
                if dependency.auto_deleted_by_external {
                    self.drop_item(item);
                } else {
                    self.mark_deleting(item);
                }
                return;
            }
        }
        if self.deleting.contains(item) || current.is_busy() {
            return;
        }
        let Some(intended) = self.intended.get(item).cloned() else {
            return;
        };
        for (index, dependency) in intended.item.dependencies.iter().enumerate() {
            let required = &dependency.requires;
            if applied.dependency_on(required).is_none()
                || self.current.get(required).is_some_and(|c| c.is_busy())
            {
                continue;
            }
            let required_is_modified = matches!(self.need(required), Need::Modify { .. });
            let predicate = intended.predicates.get(index).and_then(Option::as_ref);
            let predicate_fails = predicate.is_some_and(|predicate| {
                let value = self.value_after_plan(required);
                !predicate.evaluate(&value).unwrap_or(false)
            });
            let recreate = required_is_modified && dependency.recreate_when_modified;
            if predicate_fails || recreate {
                self.mark_deleting(item);
                if required_is_modified {
                    self.deletes_before_modify
                        .entry(required.clone())
                        .or_default()
                        .insert(item.clone());
                }
                return;
            }
        }
    }

    /// The properties `item` will have once this plan ran: the intended ones
    /// if it gets an operation, else observed laid over applied.
    fn value_after_plan(&mut self, item: &ItemRef) -> Cow<'a, Properties> {
        let need = self.need(item);
        let intended = self.intended.get(item);
        match (need, intended) {
            (Need::Create | Need::Modify { .. } | Need::Recreate, Some(entry)) => {
                Cow::Borrowed(&entry.item.properties)
            }
            _ => Cow::Owned(
                self.current
                    .get(item)
                    .map(|current| current.effective_properties())
                    .unwrap_or_default(),
            ),
        }
    }

    fn collect_inflight_deletes(&mut self) {
        self.inflight_deletes_by_type.clear();
        for item in &self.examined {
            let deleting_now = self
                .current
                .get(item)
                .and_then(|c| c.in_flight.as_ref())
                .is_some_and(|op| op.kind == OperationKind::Delete);
            if deleting_now {
                self.inflight_deletes_by_type
                    .entry(item.item_type.clone())
                    .or_insert_with(|| item.clone());
            }
        }
    }

    fn in_backoff(&self, current: &CurrentItem) -> bool {
        current.state == crate::graph::ItemState::Failed
            && current
                .next_attempt_at_ms
                .is_some_and(|at| at > self.now_ms)
    }

    // ----- Deletes ---------------------------------------------------------

    fn schedule_deletes(&mut self) {
        let roots: Vec<ItemRef> = self.deleting.iter().cloned().collect();
        for root in roots {
            self.schedule_delete_tree(root);
        }
    }

    /// Whether `item` is something a Delete must wait for.
    fn holds_a_delete(&self, item: &ItemRef) -> bool {
        !self.dropped.contains(item)
            && self
                .current
                .get(item)
                .is_some_and(|c| c.may_exist() || c.is_busy())
    }

    /// Schedules the Delete of `root` after those of its current dependents
    /// (iterative depth-first: graphs can be deep).
    fn schedule_delete_tree(&mut self, root: ItemRef) {
        let mut stack = vec![(root, false)];
        let mut in_progress = FxHashSet::default();
        while let Some((item, expanded)) = stack.pop() {
            if self.delete_schedules.contains_key(&item) {
                continue;
            }
            if expanded {
                let schedule = self.compute_delete(&item);
                self.delete_schedules.insert(item, schedule);
                continue;
            }
            if !in_progress.insert(item.clone()) {
                self.delete_schedules.insert(
                    item.clone(),
                    cycle_in_current_state(&item, OperationKind::Delete),
                );
                continue;
            }
            stack.push((item.clone(), true));
            for dependent in self.current.dependents_of(&item) {
                if self.holds_a_delete(dependent) && !self.delete_schedules.contains_key(dependent)
                {
                    stack.push((dependent.clone(), false));
                }
            }
        }
    }

    fn compute_delete(&mut self, item: &ItemRef) -> Schedule {
        let kind = OperationKind::Delete;
        let Some(current) = self.current.get(item) else {
            return Schedule::NotNeeded;
        };
        if self.dropped.contains(item) || !(current.may_exist() || current.is_busy()) {
            return Schedule::NotNeeded;
        }
        if current.is_busy() {
            return waiting_on_itself(item, current, kind);
        }
        let target_generation = self.intended.get(item).map_or(0, |entry| entry.generation);
        if current.last_operation == Some(kind) && current.failed_terminally_at(target_generation) {
            return terminal(item, current, kind);
        }
        if self.in_backoff(current) {
            return backoff(item, current, kind);
        }
        if !self.environment.has_configurator(&item.item_type) {
            return no_configurator(item, kind);
        }
        let mut after = Vec::new();
        let mut blocked_by = Vec::new();
        for dependent in self.current.dependents_of(item) {
            if !self.holds_a_delete(dependent) {
                continue;
            }
            match self.delete_schedules.get(dependent) {
                Some(Schedule::Ready { .. }) => after.push((dependent.clone(), kind)),
                Some(Schedule::Waiting { reason, .. }) => blocked_by.push(BlockedBy {
                    item: dependent.clone(),
                    why: format!("its delete waits ({})", reason_words(*reason)),
                }),
                Some(Schedule::NotNeeded) => {}
                None => blocked_by.push(BlockedBy {
                    item: dependent.clone(),
                    why: "depends on it and is not planned for deletion".into(),
                }),
            }
        }
        if blocked_by.is_empty() {
            Schedule::Ready { kind, after }
        } else {
            Schedule::Waiting {
                kind,
                reason: WaitReason::Blocked,
                blocked_by,
                hopeless: false,
            }
        }
    }

    // ----- Creates and Modifies -------------------------------------------

    /// Whether `item` needs a Create or Modify (and is ours to operate on).
    fn needs_change(&mut self, item: &ItemRef) -> bool {
        let Some(entry) = self.intended.get(item) else {
            return false;
        };
        if entry.item.external || self.dropped.contains(item) {
            return false;
        }
        self.deleting.contains(item)
            || matches!(
                self.need(item),
                Need::Create | Need::Modify { .. } | Need::Recreate
            )
    }

    fn schedule_changes(&mut self) {
        let roots: Vec<ItemRef> = self.examined.iter().cloned().collect();
        for root in roots {
            if self.needs_change(&root) {
                self.schedule_change_tree(root);
            }
        }
    }

    /// Schedules the Create/Modify of `root` after those of its intended
    /// dependencies (iterative depth-first).
    fn schedule_change_tree(&mut self, root: ItemRef) {
        let mut stack = vec![(root, false)];
        let mut in_progress = FxHashSet::default();
        while let Some((item, expanded)) = stack.pop() {
            if self.change_schedules.contains_key(&item) {
                continue;
            }
            if expanded {
                let schedule = self.compute_change(&item);
                self.change_schedules.insert(item, schedule);
                continue;
            }
            if !in_progress.insert(item.clone()) {
                self.change_schedules.insert(
                    item.clone(),
                    cycle_in_current_state(&item, OperationKind::Create),
                );
                continue;
            }
            stack.push((item.clone(), true));
            let Some(entry) = self.intended.get(&item).cloned() else {
                continue;
            };
            for required in entry.item.required_items() {
                if !self.change_schedules.contains_key(required) && self.needs_change(required) {
                    stack.push((required.clone(), false));
                }
            }
        }
    }

    fn compute_change(&mut self, item: &ItemRef) -> Schedule {
        let Some(entry) = self.intended.get(item).cloned() else {
            return Schedule::NotNeeded;
        };
        let recreating = self.deleting.contains(item);
        let need = self.need(item);
        let kind = if recreating || matches!(need, Need::Create | Need::Recreate) {
            OperationKind::Create
        } else {
            OperationKind::Modify
        };
        if let Some(current) = self.current.get(item) {
            if current.is_busy() {
                return waiting_on_itself(item, current, kind);
            }
            if !recreating {
                if current.failed_terminally_at(entry.generation) {
                    return terminal(item, current, kind);
                }
                if self.in_backoff(current) {
                    return backoff(item, current, kind);
                }
            }
        }
        let mut after = Vec::new();
        let mut waits_on_dependencies = Vec::new();
        let mut waits_on_operations = Vec::new();
        let mut hopeless = false;

        if recreating {
            match self.delete_schedules.get(item) {
                Some(Schedule::Ready { .. }) => after.push((item.clone(), OperationKind::Delete)),
                Some(Schedule::Waiting { reason, .. }) => waits_on_operations.push(BlockedBy {
                    item: item.clone(),
                    why: format!("its own delete waits ({})", reason_words(*reason)),
                }),
                Some(Schedule::NotNeeded) | None => {}
            }
        }
        for (index, dependency) in entry.item.dependencies.iter().enumerate() {
            let predicate = entry.predicates.get(index).and_then(Option::as_ref);
            match self.dependency_status(&dependency.requires, predicate) {
                DependencyStatus::Satisfied => {}
                DependencyStatus::After(key) => after.push(key),
                DependencyStatus::Unsatisfied {
                    why,
                    hopeless: never,
                } => {
                    hopeless |= never;
                    waits_on_dependencies.push(BlockedBy {
                        item: dependency.requires.clone(),
                        why,
                    });
                }
            }
        }
        if kind == OperationKind::Modify {
            self.modify_waits_for_dependents(item, &mut after, &mut waits_on_operations);
        }
        if kind == OperationKind::Create
            && let Some(deleting) = self.inflight_deletes_by_type.get(&item.item_type)
            && deleting != item
        {
            waits_on_operations.push(BlockedBy {
                item: deleting.clone(),
                why: "a delete of the same type is in flight".into(),
            });
        }

        // Unsatisfied dependencies are reported before a missing configurator:
        // the dependency chain is what a user must look at first.
        if !waits_on_dependencies.is_empty() {
            waits_on_dependencies.extend(waits_on_operations);
            Schedule::Waiting {
                kind,
                reason: WaitReason::Dependency,
                blocked_by: waits_on_dependencies,
                hopeless,
            }
        } else if !self.environment.has_configurator(&item.item_type) {
            no_configurator(item, kind)
        } else if !waits_on_operations.is_empty() {
            Schedule::Waiting {
                kind,
                reason: WaitReason::Blocked,
                blocked_by: waits_on_operations,
                hopeless: false,
            }
        } else {
            after.sort();
            after.dedup();
            Schedule::Ready { kind, after }
        }
    }

    /// A Modify waits for operations in flight on its dependents, and for the
    /// Deletes of dependents that must go before it (rule 6).
    fn modify_waits_for_dependents(
        &mut self,
        item: &ItemRef,
        after: &mut Vec<OperationKey>,
        blocked_by: &mut Vec<BlockedBy>,
    ) {
        for dependent in self.current.dependents_of(item) {
            if let Some(current) = self.current.get(dependent)
                && current.is_busy()
            {
                blocked_by.push(BlockedBy {
                    item: dependent.clone(),
                    why: busy_words(current),
                });
            }
        }
        let Some(dependents) = self.deletes_before_modify.get(item) else {
            return;
        };
        for dependent in dependents {
            match self.delete_schedules.get(dependent) {
                Some(Schedule::Ready { .. }) => {
                    after.push((dependent.clone(), OperationKind::Delete))
                }
                Some(Schedule::Waiting { reason, .. }) => {
                    let busy = self.current.get(dependent).is_some_and(|c| c.is_busy());
                    if !busy {
                        blocked_by.push(BlockedBy {
                            item: dependent.clone(),
                            why: format!("its delete waits ({})", reason_words(*reason)),
                        });
                    }
                }
                Some(Schedule::NotNeeded) | None => {}
            }
        }
    }

    /// Whether the dependency on `required` is satisfied now, will be after
    /// an operation of this plan, or not within this plan.
    fn dependency_status(
        &mut self,
        required: &ItemRef,
        predicate: Option<&Predicate>,
    ) -> DependencyStatus {
        if self.dropped.contains(required) {
            return unsatisfied("missing", true);
        }
        let intended = self.intended.get(required).cloned();
        let current = self.current.get(required).cloned();
        let external = intended.as_ref().map_or_else(
            || {
                current
                    .as_ref()
                    .and_then(|c| c.applied.as_ref())
                    .is_some_and(|a| a.external)
            },
            |entry| entry.item.external,
        );
        if external {
            return match &current {
                Some(state) if state.is_created() => {
                    check_predicate(predicate, &state.effective_properties(), None)
                }
                _ => unsatisfied("missing (external item not reported)", true),
            };
        }
        let Some(intended) = intended else {
            return if current.is_some() {
                unsatisfied("planned for deletion", true)
            } else {
                unsatisfied("missing", true)
            };
        };
        if let Some(state) = &current
            && state.is_busy()
        {
            return unsatisfied(&busy_words(state), false);
        }
        if self.needs_change(required) {
            return match self.change_schedules.get(required) {
                Some(Schedule::Ready { kind, .. }) => {
                    let key = (required.clone(), *kind);
                    check_predicate(predicate, &intended.item.properties, Some(key))
                }
                Some(Schedule::Waiting { kind, reason, .. }) => {
                    if *kind == OperationKind::Create {
                        unsatisfied(&format!("not created ({})", reason_words(*reason)), true)
                    } else {
                        unsatisfied(
                            &format!("being modified ({})", reason_words(*reason)),
                            false,
                        )
                    }
                }
                Some(Schedule::NotNeeded) | None => unsatisfied("not created", true),
            };
        }
        match &current {
            Some(state) if state.is_created() => {
                check_predicate(predicate, &state.effective_properties(), None)
            }
            _ => unsatisfied("not created", true),
        }
    }

    /// Rule 5: Modifies whose new dependencies cannot be satisfied within
    /// this plan become deletes; the item then waits as pending.
    fn modifies_that_must_delete(&mut self) -> Vec<ItemRef> {
        let mut doomed: Vec<ItemRef> = self
            .change_schedules
            .iter()
            .filter(|(item, schedule)| {
                matches!(
                    schedule,
                    Schedule::Waiting {
                        kind: OperationKind::Modify,
                        reason: WaitReason::Dependency,
                        hopeless: true,
                        ..
                    }
                ) && !self.deleting.contains(*item)
            })
            .map(|(item, _)| item.clone())
            .collect();
        doomed.sort();
        doomed
    }
}

fn unsatisfied(why: &str, hopeless: bool) -> DependencyStatus {
    DependencyStatus::Unsatisfied {
        why: why.to_string(),
        hopeless,
    }
}

fn check_predicate(
    predicate: Option<&Predicate>,
    properties: &Properties,
    after: Option<OperationKey>,
) -> DependencyStatus {
    let verdict = predicate.map(|predicate| predicate.evaluate(properties));
    match verdict {
        None | Some(Ok(true)) => after.map_or(DependencyStatus::Satisfied, DependencyStatus::After),
        Some(Ok(false)) => unsatisfied(
            &format!(
                "predicate false: {}",
                predicate.map(Predicate::source).unwrap_or_default()
            ),
            true,
        ),
        Some(Err(error)) => unsatisfied(&format!("predicate error: {error}"), true),
    }
}

fn busy_words(current: &CurrentItem) -> String {
    match &current.in_flight {
        Some(operation) => format!(
            "{} in flight (op {})",
            operation.kind.as_str(),
            operation.op_id
        ),
        None => "outcome of its last operation is unknown".into(),
    }
}

/// Short words for a reason, used inside `why` texts.
pub(super) fn reason_words(reason: WaitReason) -> &'static str {
    match reason {
        WaitReason::Dependency => "dependency",
        WaitReason::NoConfigurator => "no configurator",
        WaitReason::Backoff => "backoff",
        WaitReason::Blocked => "blocked",
        WaitReason::TerminalFailure => "failed terminally",
        WaitReason::UnknownOutcome => "outcome unknown",
    }
}

fn waiting_on_itself(item: &ItemRef, current: &CurrentItem, kind: OperationKind) -> Schedule {
    let reason = if current.in_flight.is_some() {
        WaitReason::Blocked
    } else {
        WaitReason::UnknownOutcome
    };
    Schedule::Waiting {
        kind,
        reason,
        blocked_by: vec![BlockedBy {
            item: item.clone(),
            why: busy_words(current),
        }],
        hopeless: false,
    }
}

fn terminal(item: &ItemRef, current: &CurrentItem, kind: OperationKind) -> Schedule {
    let message = current
        .last_error
        .as_ref()
        .map(|error| error.message.clone())
        .unwrap_or_default();
    Schedule::Waiting {
        kind,
        reason: WaitReason::TerminalFailure,
        blocked_by: vec![BlockedBy {
            item: item.clone(),
            why: format!("failed terminally: {message}; change its intent to retry"),
        }],
        hopeless: false,
    }
}

fn backoff(item: &ItemRef, current: &CurrentItem, kind: OperationKind) -> Schedule {
    Schedule::Waiting {
        kind,
        reason: WaitReason::Backoff,
        blocked_by: vec![BlockedBy {
            item: item.clone(),
            why: format!("retry {} after backoff", current.attempts.saturating_add(1)),
        }],
        hopeless: false,
    }
}

fn no_configurator(item: &ItemRef, kind: OperationKind) -> Schedule {
    Schedule::Waiting {
        kind,
        reason: WaitReason::NoConfigurator,
        blocked_by: vec![BlockedBy {
            item: item.clone(),
            why: format!(
                "no configurator for type {:?} is connected",
                &*item.item_type
            ),
        }],
        hopeless: false,
    }
}

fn cycle_in_current_state(item: &ItemRef, kind: OperationKind) -> Schedule {
    Schedule::Waiting {
        kind,
        reason: WaitReason::Blocked,
        blocked_by: vec![BlockedBy {
            item: item.clone(),
            why: "dependency cycle".into(),
        }],
        hopeless: false,
    }
}
