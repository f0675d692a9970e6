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
//!
//! Every item the run touches is interned once into an arena ([`Node`]):
//! its graph entries, need, flags and schedules live there and are reached
//! by index, so the per-edge work is array access, not map lookups.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use super::need::{Need, own_need};
use super::{BlockedBy, PlanEnvironment, WaitReason};
use crate::graph::{
    CurrentGraph, CurrentItem, IntendedGraph, IntendedItem, ItemRef, OperationKind, Predicate,
    Properties,
};

/// Index of an item in the planner's arena.
pub(super) type Id = u32;

/// An operation of the plan being built, named by item and kind.
pub(super) type OperationKey = (Id, OperationKind);

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

/// Everything the run knows about one item.
pub(super) struct Node<'a> {
    pub(super) item: ItemRef,
    pub(super) intended: Option<&'a Arc<IntendedItem>>,
    pub(super) current: Option<&'a Arc<CurrentItem>>,
    need: Option<Need>,
    seed: bool,
    examined: bool,
    pub(super) deleting: bool,
    pub(super) dropped: bool,
    pub(super) delete_schedule: Option<Schedule>,
    pub(super) change_schedule: Option<Schedule>,
    /// The intended dependencies, interned (filled on first use).
    required: Option<Arc<[Id]>>,
    /// Current dependents, interned (filled on first use).
    current_dependents: Option<Arc<[Id]>>,
}

impl Node<'_> {
    fn busy(&self) -> bool {
        self.current.is_some_and(|c| c.is_busy())
    }
}

/// The state of one planning run.
pub(super) struct Planner<'a, E> {
    intended: &'a IntendedGraph,
    current: &'a CurrentGraph,
    environment: &'a E,
    now_ms: u64,
    /// Item identities to arena indexes.
    ids: FxHashMap<ItemRef, Id>,
    nodes: Vec<Node<'a>>,
    /// Items looked at, in the (deterministic) order they were first visited.
    pub(super) examined: Vec<Id>,
    queue: Vec<Id>,
    /// Modify(key) waits for the Deletes of these dependents (rule 6).
    deletes_before_modify: FxHashMap<Id, BTreeSet<Id>>,
    /// One in-flight Delete per item type: Creates of that type wait.
    inflight_deletes_by_type: FxHashMap<Arc<str>, Id>,
    /// The empty list, shared (most items have no current dependents).
    no_ids: Arc<[Id]>,
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
            ids: FxHashMap::default(),
            nodes: Vec::new(),
            examined: Vec::new(),
            queue: Vec::new(),
            deletes_before_modify: FxHashMap::default(),
            inflight_deletes_by_type: FxHashMap::default(),
            no_ids: Arc::from(Vec::new()),
        }
    }

    /// Plans from `seeds`.
    pub(super) fn run(mut self, seeds: &BTreeSet<ItemRef>) -> super::Plan {
        for seed in seeds {
            let id = self.id(seed);
            self.node_mut(id).seed = true;
            self.visit(id);
        }
        loop {
            self.process_queue();
            for node in &mut self.nodes {
                node.delete_schedule = None;
                node.change_schedule = None;
            }
            self.collect_inflight_deletes();
            self.schedule_deletes();
            self.schedule_changes();
            let doomed = self.modifies_that_must_delete();
            if doomed.is_empty() {
                break;
            }
            for id in doomed {
                self.mark_deleting(id);
            }
        }
        super::assemble::assemble(&mut self)
    }

    /// Interns `item`: its arena index, looking up its graph entries once.
    fn id(&mut self, item: &ItemRef) -> Id {
        if let Some(id) = self.ids.get(item) {
            return *id;
        }
        let (intended, current): (&'a IntendedGraph, &'a CurrentGraph) =
            (self.intended, self.current);
        let id = Id::try_from(self.nodes.len()).unwrap_or(Id::MAX);
        self.nodes.push(Node {
            item: item.clone(),
            intended: intended.get(item),
            current: current.get(item),
            need: None,
            seed: false,
            examined: false,
            deleting: false,
            dropped: false,
            delete_schedule: None,
            change_schedule: None,
            required: None,
            current_dependents: None,
        });
        self.ids.insert(item.clone(), id);
        id
    }

    /// The arena node of `id`.
    pub(super) fn node(&self, id: Id) -> &Node<'a> {
        &self.nodes[id as usize]
    }

    fn node_mut(&mut self, id: Id) -> &mut Node<'a> {
        &mut self.nodes[id as usize]
    }

    fn intended_of(&self, id: Id) -> Option<&'a Arc<IntendedItem>> {
        self.node(id).intended
    }

    fn current_of(&self, id: Id) -> Option<&'a Arc<CurrentItem>> {
        self.node(id).current
    }

    /// The intended dependencies of `id`, interned.
    fn required(&mut self, id: Id) -> Arc<[Id]> {
        if let Some(required) = &self.node(id).required {
            return required.clone();
        }
        let required: Arc<[Id]> = match self.intended_of(id) {
            Some(entry) if !entry.item.dependencies.is_empty() => {
                entry.item.required_items().map(|r| self.id(r)).collect()
            }
            _ => self.no_ids.clone(),
        };
        self.node_mut(id).required = Some(required.clone());
        required
    }

    /// The current dependents of `id`, interned.
    fn current_dependents(&mut self, id: Id) -> Arc<[Id]> {
        if let Some(dependents) = &self.node(id).current_dependents {
            return dependents.clone();
        }
        let current: &'a CurrentGraph = self.current;
        let item = self.node(id).item.clone();
        let mut dependents = current.dependents_of(&item).peekable();
        let dependents: Arc<[Id]> = if dependents.peek().is_none() {
            self.no_ids.clone()
        } else {
            dependents.map(|d| self.id(d)).collect()
        };
        self.node_mut(id).current_dependents = Some(dependents.clone());
        dependents
    }

    /// The item's own need (memoized).
    pub(super) fn need(&mut self, id: Id) -> Need {
        if let Some(need) = self.node(id).need {
            return need;
        }
        let node = self.node(id);
        let need = own_need(
            node.intended.map(|entry| &**entry),
            node.current.map(|entry| &**entry),
            self.current,
            self.environment,
        );
        self.node_mut(id).need = Some(need);
        need
    }

    fn visit(&mut self, id: Id) {
        let node = self.node_mut(id);
        if !node.examined {
            node.examined = true;
            self.examined.push(id);
            self.queue.push(id);
        }
    }

    fn process_queue(&mut self) {
        while let Some(id) = self.queue.pop() {
            let need = self.need(id);
            if matches!(need, Need::Delete | Need::Recreate) {
                self.mark_deleting(id);
            }
            let current = self.current_of(id);
            if let Some(current) = current
                && current.may_exist()
            {
                self.check_existing(id, current);
            }
            let settled =
                need == Need::Nothing && current.is_some_and(|c| c.is_created() && !c.is_busy());
            let absent_and_unwanted = need == Need::Nothing && current.is_none();
            if self.node(id).seed || !(settled || absent_and_unwanted) {
                let intended: &'a IntendedGraph = self.intended;
                let item = self.node(id).item.clone();
                for dependent in self.current_dependents(id).iter() {
                    self.visit(*dependent);
                }
                for dependent in intended.dependents_of(&item) {
                    let dependent = self.id(dependent);
                    self.visit(dependent);
                }
            }
        }
    }

    /// Plans `id` (and, transitively, its current dependents) for deletion.
    fn mark_deleting(&mut self, id: Id) {
        let mut stack = vec![id];
        while let Some(id) = stack.pop() {
            if self.node(id).deleting {
                continue;
            }
            self.node_mut(id).deleting = true;
            self.visit(id);
            for dependent in self.current_dependents(id).iter() {
                let node = self.node(*dependent);
                if node.dropped {
                    continue;
                }
                if node.current.is_some_and(|c| c.may_exist() || c.is_busy()) {
                    stack.push(*dependent);
                }
            }
        }
    }

    /// Removes `id` from current state without a call; what depends on it
    /// has lost a dependency and is deleted.
    fn drop_item(&mut self, id: Id) {
        if self.node(id).dropped {
            return;
        }
        self.node_mut(id).dropped = true;
        self.visit(id);
        for dependent in self.current_dependents(id).iter() {
            if self
                .current_of(*dependent)
                .is_some_and(|c| c.may_exist() || c.is_busy())
            {
                self.mark_deleting(*dependent);
            }
        }
    }

    /// Rules for an item that exists: a dependency it relies on is gone, a
    /// predicate fails for the dependency's next value, or a
    /// `recreate_when_modified` dependency is about to be modified.
    fn check_existing(&mut self, id: Id, current: &'a CurrentItem) {
        let Some(applied) = current.applied.as_ref() else {
            return;
        };
        for dependency in &applied.dependencies {
            let required = self.id(&dependency.requires);
            let node = self.node(required);
            let gone = match node.current {
                Some(state) if state.is_busy() => false,
                Some(state) => !state.is_created() || node.dropped,
                None => true,
            };
            if gone {
                if dependency.auto_deleted_by_external {
                    self.drop_item(id);
                } else {
                    self.mark_deleting(id);
                }
                return;
            }
        }
        if self.node(id).deleting || current.is_busy() {
            return;
        }
        let Some(intended) = self.intended_of(id) else {
            return;
        };
        for (index, dependency) in intended.item.dependencies.iter().enumerate() {
            let required = self.id(&dependency.requires);
            if applied.dependency_on(&dependency.requires).is_none() || self.node(required).busy() {
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
                self.mark_deleting(id);
                if required_is_modified {
                    self.deletes_before_modify
                        .entry(required)
                        .or_default()
                        .insert(id);
                }
                return;
            }
        }
    }

    /// The properties `id` will have once this plan ran: the intended ones
    /// if it gets an operation, else observed laid over applied.
    fn value_after_plan(&mut self, id: Id) -> Cow<'a, Properties> {
        let need = self.need(id);
        match (need, self.intended_of(id)) {
            (Need::Create | Need::Modify { .. } | Need::Recreate, Some(entry)) => {
                Cow::Borrowed(&entry.item.properties)
            }
            _ => Cow::Owned(
                self.current_of(id)
                    .map(|current| current.effective_properties())
                    .unwrap_or_default(),
            ),
        }
    }

    fn collect_inflight_deletes(&mut self) {
        self.inflight_deletes_by_type.clear();
        for &id in &self.examined {
            let node = &self.nodes[id as usize];
            let deleting_now = node
                .current
                .and_then(|c| c.in_flight.as_ref())
                .is_some_and(|op| op.kind == OperationKind::Delete);
            if deleting_now {
                self.inflight_deletes_by_type
                    .entry(node.item.item_type.clone())
                    .or_insert(id);
            }
        }
    }

    /// A failed (or WAIT-answered) operation waits for its retry time.
    fn in_backoff(&self, current: &CurrentItem) -> bool {
        !current.is_busy()
            && current
                .next_attempt_at_ms
                .is_some_and(|at| at > self.now_ms)
    }

    // ----- Deletes ---------------------------------------------------------

    fn schedule_deletes(&mut self) {
        let roots: Vec<Id> = self
            .examined
            .iter()
            .copied()
            .filter(|&id| self.node(id).deleting)
            .collect();
        let mut in_progress = FxHashSet::default();
        for root in roots {
            self.schedule_delete_tree(root, &mut in_progress);
        }
    }

    /// Whether `id` is something a Delete must wait for.
    fn holds_a_delete(&self, id: Id) -> bool {
        let node = self.node(id);
        !node.dropped && node.current.is_some_and(|c| c.may_exist() || c.is_busy())
    }

    /// Schedules the Delete of `root` after those of its current dependents
    /// (iterative depth-first: graphs can be deep).
    fn schedule_delete_tree(&mut self, root: Id, in_progress: &mut FxHashSet<Id>) {
        let mut stack = vec![(root, false)];
        while let Some((id, expanded)) = stack.pop() {
            if self.node(id).delete_schedule.is_some() {
                continue;
            }
            if expanded {
                let schedule = self.compute_delete(id);
                self.node_mut(id).delete_schedule = Some(schedule);
                continue;
            }
            if !in_progress.insert(id) {
                let schedule = cycle_in_current_state(&self.node(id).item, OperationKind::Delete);
                self.node_mut(id).delete_schedule = Some(schedule);
                continue;
            }
            stack.push((id, true));
            for dependent in self.current_dependents(id).iter() {
                if self.holds_a_delete(*dependent)
                    && self.node(*dependent).delete_schedule.is_none()
                {
                    stack.push((*dependent, false));
                }
            }
        }
    }

    fn compute_delete(&mut self, id: Id) -> Schedule {
        let kind = OperationKind::Delete;
        let node = self.node(id);
        let item = node.item.clone();
        let Some(current) = node.current else {
            return Schedule::NotNeeded;
        };
        if node.dropped || !(current.may_exist() || current.is_busy()) {
            return Schedule::NotNeeded;
        }
        if current.is_busy() {
            return waiting_on_itself(&item, current, kind);
        }
        let target_generation = node.intended.map_or(0, |entry| entry.generation);
        if current.last_operation == Some(kind) && current.failed_terminally_at(target_generation) {
            return terminal(&item, current, kind);
        }
        if self.in_backoff(current) {
            return backoff(&item, current, kind);
        }
        if !self.environment.has_configurator(&item.item_type) {
            return no_configurator(&item, kind);
        }
        let mut after = Vec::new();
        let mut blocked_by = Vec::new();
        for &dependent in self.current_dependents(id).iter() {
            if !self.holds_a_delete(dependent) {
                continue;
            }
            let node = self.node(dependent);
            match &node.delete_schedule {
                Some(Schedule::Ready { .. }) => after.push((dependent, kind)),
                Some(Schedule::Waiting { reason, .. }) => blocked_by.push(BlockedBy {
                    item: node.item.clone(),
                    why: format!("its delete waits ({})", reason_words(*reason)),
                }),
                Some(Schedule::NotNeeded) => {}
                None => blocked_by.push(BlockedBy {
                    item: node.item.clone(),
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

    /// Whether `id` needs a Create or Modify (and is ours to operate on).
    fn needs_change(&mut self, id: Id) -> bool {
        let node = self.node(id);
        let Some(entry) = node.intended else {
            return false;
        };
        if entry.item.external || node.dropped {
            return false;
        }
        node.deleting
            || matches!(
                self.need(id),
                Need::Create | Need::Modify { .. } | Need::Recreate
            )
    }

    fn schedule_changes(&mut self) {
        // One in-progress set for all roots: a node is only re-entered while
        // its own subtree is being scheduled (finished nodes are skipped).
        let mut in_progress = FxHashSet::default();
        for index in 0..self.examined.len() {
            let root = self.examined[index];
            if self.needs_change(root) {
                self.schedule_change_tree(root, &mut in_progress);
            }
        }
    }

    /// Schedules the Create/Modify of `root` after those of its intended
    /// dependencies (iterative depth-first).
    fn schedule_change_tree(&mut self, root: Id, in_progress: &mut FxHashSet<Id>) {
        let mut stack = vec![(root, false)];
        while let Some((id, expanded)) = stack.pop() {
            if self.node(id).change_schedule.is_some() {
                continue;
            }
            if expanded {
                let schedule = self.compute_change(id);
                self.node_mut(id).change_schedule = Some(schedule);
                continue;
            }
            if !in_progress.insert(id) {
                let schedule = cycle_in_current_state(&self.node(id).item, OperationKind::Create);
                self.node_mut(id).change_schedule = Some(schedule);
                continue;
            }
            stack.push((id, true));
            for &required in self.required(id).iter() {
                if self.node(required).change_schedule.is_none() && self.needs_change(required) {
                    stack.push((required, false));
                }
            }
        }
    }

    fn compute_change(&mut self, id: Id) -> Schedule {
        let Some(entry) = self.intended_of(id) else {
            return Schedule::NotNeeded;
        };
        let item = self.node(id).item.clone();
        let recreating = self.node(id).deleting;
        let need = self.need(id);
        let kind = if recreating || matches!(need, Need::Create | Need::Recreate) {
            OperationKind::Create
        } else {
            OperationKind::Modify
        };
        if let Some(current) = self.current_of(id) {
            if current.is_busy() {
                return waiting_on_itself(&item, current, kind);
            }
            if !recreating {
                if current.failed_terminally_at(entry.generation) {
                    return terminal(&item, current, kind);
                }
                if self.in_backoff(current) {
                    return backoff(&item, current, kind);
                }
            }
        }
        let mut after = Vec::new();
        let mut waits_on_dependencies = Vec::new();
        let mut waits_on_operations = Vec::new();
        let mut hopeless = false;

        if recreating {
            match &self.node(id).delete_schedule {
                Some(Schedule::Ready { .. }) => after.push((id, OperationKind::Delete)),
                Some(Schedule::Waiting { reason, .. }) => waits_on_operations.push(BlockedBy {
                    item: item.clone(),
                    why: format!("its own delete waits ({})", reason_words(*reason)),
                }),
                Some(Schedule::NotNeeded) | None => {}
            }
        }
        let required = self.required(id);
        for (index, &dependency) in required.iter().enumerate() {
            let predicate = entry.predicates.get(index).and_then(Option::as_ref);
            match self.dependency_status(dependency, predicate) {
                DependencyStatus::Satisfied => {}
                DependencyStatus::After(key) => after.push(key),
                DependencyStatus::Unsatisfied {
                    why,
                    hopeless: never,
                } => {
                    hopeless |= never;
                    waits_on_dependencies.push(BlockedBy {
                        item: self.node(dependency).item.clone(),
                        why,
                    });
                }
            }
        }
        if kind == OperationKind::Modify {
            self.modify_waits_for_dependents(id, &mut after, &mut waits_on_operations);
        }
        if kind == OperationKind::Create
            && let Some(&deleting) = self.inflight_deletes_by_type.get(&item.item_type)
            && deleting != id
        {
            waits_on_operations.push(BlockedBy {
                item: self.node(deleting).item.clone(),
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
            no_configurator(&item, kind)
        } else if !waits_on_operations.is_empty() {
            Schedule::Waiting {
                kind,
                reason: WaitReason::Blocked,
                blocked_by: waits_on_operations,
                hopeless: false,
            }
        } else {
            after.sort_unstable();
            after.dedup();
            Schedule::Ready { kind, after }
        }
    }

    /// A Modify waits for operations in flight on its dependents, and for the
    /// Deletes of dependents that must go before it (rule 6).
    fn modify_waits_for_dependents(
        &mut self,
        id: Id,
        after: &mut Vec<OperationKey>,
        blocked_by: &mut Vec<BlockedBy>,
    ) {
        for &dependent in self.current_dependents(id).iter() {
            let node = self.node(dependent);
            if let Some(current) = node.current
                && current.is_busy()
            {
                blocked_by.push(BlockedBy {
                    item: node.item.clone(),
                    why: busy_words(current),
                });
            }
        }
        let Some(dependents) = self.deletes_before_modify.get(&id) else {
            return;
        };
        for &dependent in dependents {
            let node = &self.nodes[dependent as usize];
            match &node.delete_schedule {
                Some(Schedule::Ready { .. }) => after.push((dependent, OperationKind::Delete)),
                Some(Schedule::Waiting { reason, .. }) => {
                    if !node.busy() {
                        blocked_by.push(BlockedBy {
                            item: node.item.clone(),
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
        required: Id,
        predicate: Option<&Predicate>,
    ) -> DependencyStatus {
        let node = self.node(required);
        if node.dropped {
            return unsatisfied("missing", true);
        }
        let intended = node.intended;
        let current = node.current;
        let external = intended.map_or_else(
            || {
                current
                    .and_then(|c| c.applied.as_ref())
                    .is_some_and(|a| a.external)
            },
            |entry| entry.item.external,
        );
        if external {
            return match current {
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
        if let Some(state) = current
            && state.is_busy()
        {
            return unsatisfied(&busy_words(state), false);
        }
        if self.needs_change(required) {
            return match &self.node(required).change_schedule {
                Some(Schedule::Ready { kind, .. }) => check_predicate(
                    predicate,
                    &intended.item.properties,
                    Some((required, *kind)),
                ),
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
        match current {
            Some(state) if state.is_created() => {
                check_predicate(predicate, &state.effective_properties(), None)
            }
            _ => unsatisfied("not created", true),
        }
    }

    /// Rule 5: Modifies whose new dependencies cannot be satisfied within
    /// this plan become deletes; the item then waits as pending.
    fn modifies_that_must_delete(&self) -> Vec<Id> {
        let mut doomed: Vec<Id> = self
            .examined
            .iter()
            .copied()
            .filter(|&id| {
                let node = self.node(id);
                !node.deleting
                    && matches!(
                        node.change_schedule,
                        Some(Schedule::Waiting {
                            kind: OperationKind::Modify,
                            reason: WaitReason::Dependency,
                            hopeless: true,
                            ..
                        })
                    )
            })
            .collect();
        doomed.sort_by(|a, b| self.node(*a).item.cmp(&self.node(*b).item));
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
