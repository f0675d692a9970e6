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
//! by index. Intended edges come from the intended graph's integer ids, so
//! following them never hashes or compares names. Everything that decides
//! the plan's shape walks the examined items in identity order, so the plan
//! does not depend on the order in which items were discovered.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::marks::{
    BUSY, CHANGE_IN_PROGRESS, CONVERGENCE_KNOWN, CREATED, ChangeMark, DELETE_IN_PROGRESS, DELETING,
    DROPPED, Mark, Marks, NEED_KNOWN, NEEDS_CHANGE, OPERABLE, UNCONVERGED,
};
use super::need::{Need, own_need};
use super::{BlockedBy, FAILED_TERMINALLY, PlanEnvironment, WaitReason};
use crate::graph::{
    CurrentGraph, CurrentItem, IntendedGraph, IntendedItem, Item, ItemId, ItemRef, ItemState,
    ItemSummary, OperationKind, Predicate, Properties, properties_after_modify,
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
    Ready { kind: OperationKind, after: Span },
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

/// A range of one of the planner's flat lists: a node's neighbours in
/// [`Planner::edges`], or a ready operation's predecessors in
/// [`Planner::afters`] (one list for all instead of a vector each).
#[derive(Clone, Copy, Debug)]
pub(super) struct Span {
    start: u32,
    len: u32,
}

impl Span {
    const EMPTY: Self = Self { start: 0, len: 0 };

    fn indexes(self) -> std::ops::Range<usize> {
        let start = self.start as usize;
        start..start + self.len as usize
    }
}

/// What the caller of [`Planner::intern`] knows of an item's current entry.
#[derive(Clone, Copy)]
enum CurrentEntry<'a> {
    /// Nothing: the current graph is asked.
    LookUp,
    /// Read with what led to the item (a dependent read from the slot
    /// that lists it): the entry, or `None` if the item is not current.
    Read(Option<&'a Arc<CurrentItem>>),
}

/// Everything the run knows about one item. What every edge reads about
/// its target is in [`Marks`] instead, so this is read once per item.
pub(super) struct Node<'a> {
    pub(super) intended: Option<&'a Arc<IntendedItem>>,
    pub(super) current: Option<&'a Arc<CurrentItem>>,
    /// Where its schedules of this round are in [`Planner::schedules`]
    /// ([`NO_SCHEDULES`] until it gets one): most nodes a pass interns are
    /// neighbours that never get one, so the arena keeps an index rather
    /// than two schedules per node (a node is 80 bytes instead of 144).
    schedules: u32,
    need: Option<Need>,
    seed: bool,
    examined: bool,
    pub(super) item: &'a ItemRef,
    /// The intended item's summary (default when not intended).
    pub(super) summary: ItemSummary,
    /// The item's id in the intended graph, if the graph mentions it.
    intended_id: Option<ItemId>,
    /// The intended dependencies, interned (filled on first use).
    required: Option<Span>,
    /// Current dependents, interned (filled on first use).
    current_dependents: Option<Span>,
}

impl Node<'_> {
    fn busy(&self) -> bool {
        self.current.is_some_and(|c| c.is_busy())
    }
}

/// A node's schedules of this round, kept apart from the node (see
/// [`Node::schedules`]).
#[derive(Default)]
struct NodeSchedules {
    delete: Option<Schedule>,
    change: Option<Schedule>,
}

/// [`Node::schedules`] of a node without schedules this round.
const NO_SCHEDULES: u32 = u32::MAX;

/// Arena indexes by intended-graph id: an array when the run covers a large
/// part of the graph, a hash map otherwise, so a small run costs nothing in
/// the size of the graph.
enum ByIntendedId {
    Dense(Vec<Id>),
    Sparse(FxHashMap<ItemId, Id>),
}

impl ByIntendedId {
    const ABSENT: Id = Id::MAX;

    fn get(&self, id: ItemId) -> Option<Id> {
        match self {
            Self::Dense(ids) => ids
                .get(id as usize)
                .copied()
                .filter(|&node| node != Self::ABSENT),
            Self::Sparse(ids) => ids.get(&id).copied(),
        }
    }

    fn insert(&mut self, id: ItemId, node: Id) {
        match self {
            Self::Dense(ids) => {
                if let Some(entry) = ids.get_mut(id as usize) {
                    *entry = node;
                }
            }
            Self::Sparse(ids) => {
                ids.insert(id, node);
            }
        }
    }
}

/// The state of one planning run.
pub(super) struct Planner<'a, E> {
    intended: &'a IntendedGraph,
    current: &'a CurrentGraph,
    environment: &'a E,
    now_ms: u64,
    /// Arena indexes of items the intended graph names.
    by_intended_id: ByIntendedId,
    /// Arena indexes of items the intended graph does not mention.
    by_ref: FxHashMap<&'a ItemRef, Id>,
    nodes: Vec<Node<'a>>,
    /// The flags every edge reads, indexed like `nodes`.
    marks: Marks,
    /// Neighbour lists of all nodes, back to back (see [`Span`]).
    edges: Vec<Id>,
    /// Predecessors of all ready operations, back to back (see [`Span`]).
    afters: Vec<OperationKey>,
    /// A reused buffer for the predecessors of the schedule being computed.
    scratch_after: Vec<OperationKey>,
    /// A reused buffer for an item's intended dependents
    /// ([`Self::intended_dependents_by_identity`]).
    scratch_dependents: Vec<(ItemId, &'a ItemRef)>,
    /// The schedules of the nodes that have one this round.
    schedules: Vec<NodeSchedules>,
    /// Nodes `0..seed_count` are the seeds, in identity order.
    seed_count: usize,
    /// Whether some item of the graphs is not a seed: only then do
    /// neighbours need visiting (they are all seeds otherwise).
    expand: bool,
    /// Items looked at, in the order they were first visited.
    pub(super) examined: Vec<Id>,
    /// The examined items in identity order: the order every decision
    /// that shapes the plan follows.
    pub(super) order: Vec<Id>,
    queue: Vec<Id>,
    /// One in-flight Delete per item type: Creates of that type wait.
    inflight_deletes_by_type: FxHashMap<&'a str, Id>,
    /// Dependents the cascade spared because the intent retargets them
    /// (rule 7); checked again once the cascade is complete.
    retargeted: Vec<Id>,
    /// Dependencies left unexamined because a dependent goes with them as
    /// before (`goes_with_as_before`), with that dependent: examined after
    /// all if the dependent's Delete does not run first after all.
    going_as_before: Vec<(Id, Id)>,
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
            by_intended_id: ByIntendedId::Sparse(FxHashMap::default()),
            by_ref: FxHashMap::default(),
            nodes: Vec::new(),
            marks: Marks::default(),
            edges: Vec::new(),
            afters: Vec::new(),
            scratch_after: Vec::new(),
            scratch_dependents: Vec::new(),
            schedules: Vec::new(),
            seed_count: 0,
            expand: true,
            examined: Vec::new(),
            order: Vec::new(),
            queue: Vec::new(),
            inflight_deletes_by_type: FxHashMap::default(),
            retargeted: Vec::new(),
            going_as_before: Vec::new(),
        }
    }

    /// Decides, from `seeds`, what every item it reaches needs and when;
    /// `assemble` turns the decisions into a plan.
    pub(super) fn run(&mut self, seeds: &'a BTreeSet<ItemRef>) {
        // Room for the items a pass usually reaches (each seed's neighbours),
        // so the arena is not copied as it grows; never more than both
        // graphs hold.
        let expected = seeds
            .len()
            .saturating_mul(NODES_PER_SEED)
            .min(self.intended.id_bound() + self.current.len())
            .max(seeds.len());
        self.nodes.reserve(expected);
        self.marks.reserve(expected);
        // Seeds become nodes 0..n in identity order (see `identity_order`).
        // A run that touches a good part of the graph indexes it by array
        // and finds the seeds' ids in one ordered walk.
        if seeds.len().saturating_mul(4) >= self.intended.id_bound() {
            self.by_intended_id =
                ByIntendedId::Dense(vec![ByIntendedId::ABSENT; self.intended.id_bound()]);
            let intended: &'a IntendedGraph = self.intended;
            for (seed, id) in seeds.iter().zip(intended.ids_of_sorted(seeds.iter())) {
                match id {
                    Some(id) => self.node_for_intended(id),
                    None => Some(self.id(seed)),
                };
            }
        } else {
            self.by_intended_id = ByIntendedId::Sparse(FxHashMap::with_capacity_and_hasher(
                expected,
                Default::default(),
            ));
            for seed in seeds {
                self.id(seed);
            }
        }
        self.seed_count = self.nodes.len();
        let intended_seeds = self.nodes.iter().filter(|n| n.intended.is_some()).count();
        let current_seeds = self.nodes.iter().filter(|n| n.current.is_some()).count();
        self.expand = intended_seeds < self.intended.len() || current_seeds < self.current.len();
        for id in 0..self.seed_count {
            let id = Id::try_from(id).unwrap_or(Id::MAX);
            self.node_mut(id).seed = true;
            self.visit(id);
        }

        let mut covered_types = BTreeSet::new();
        loop {
            self.process_queue();
            self.recheck_retargeted();
            self.order = self.identity_order();
            for node in &mut self.nodes {
                node.schedules = NO_SCHEDULES;
            }
            self.schedules.clear();
            self.marks.new_round();
            self.afters.clear();
            self.collect_inflight_deletes();
            self.schedule_deletes();
            self.schedule_changes();
            let doomed = self.modifies_that_must_delete();
            // Each round must examine more items or plan something more
            // for deletion (both only grow, so the loop ends); a round that
            // does neither is the end too, rather than a loop that never
            // ends.
            let fresh: Vec<Id> = doomed
                .into_iter()
                .filter(|&id| !self.is_deleting(id))
                .collect();
            let more_deletes =
                self.expand && self.visit_deletes_of_ready_creates(&mut covered_types);
            let more_upstream = self.visit_dependencies_of_waiting_deletes();
            // Rule 5's verdicts count only from a round that examined
            // nothing new: an item examined now may change the schedules
            // they rest on (a same-type Delete in flight makes a ready
            // Create of a dependency wait, and a Modify waiting for that
            // Create is then not hopeless, as a full plan finds it), and a
            // deletion, once marked, is never taken back.
            if more_deletes || more_upstream {
                continue;
            }
            if fresh.is_empty() {
                break;
            }
            for id in fresh {
                self.mark_deleting(id);
            }
        }
    }

    /// The examined nodes in identity order: the seeds are in order already
    /// (nodes `0..seed_count`), the rest is sorted and merged in.
    fn identity_order(&self) -> Vec<Id> {
        let seed_count = Id::try_from(self.seed_count).unwrap_or(Id::MAX);
        let mut others: Vec<Id> = self
            .examined
            .iter()
            .copied()
            .filter(|&id| id >= seed_count)
            .collect();
        others.sort_unstable_by(|&a, &b| self.node(a).item.cmp(self.node(b).item));
        let mut order = Vec::with_capacity(self.seed_count + others.len());
        let mut others = others.into_iter().peekable();
        for seed in 0..seed_count {
            while let Some(&other) = others.peek() {
                if self.node(other).item < self.node(seed).item {
                    order.push(other);
                    others.next();
                } else {
                    break;
                }
            }
            order.push(seed);
        }
        order.extend(others);
        order
    }

    /// Interns `item`: its arena index, looking up its graph entries once.
    fn id(&mut self, item: &'a ItemRef) -> Id {
        self.intern(item, CurrentEntry::LookUp)
    }

    /// Interns `item`, whose current entry the caller may have read
    /// already (see [`CurrentEntry`]).
    fn intern(&mut self, item: &'a ItemRef, known: CurrentEntry<'a>) -> Id {
        let intended: &'a IntendedGraph = self.intended;
        if let Some(node) = intended
            .id_of(item)
            .and_then(|id| self.intern_intended(id, known))
        {
            return node;
        }
        if let Some(&node) = self.by_ref.get(item) {
            return node;
        }
        let node = self.push_node(item, None, None, known);
        self.by_ref.insert(item, node);
        node
    }

    /// The arena index of the item the intended graph names `id`.
    fn node_for_intended(&mut self, id: ItemId) -> Option<Id> {
        self.intern_intended(id, CurrentEntry::LookUp)
    }

    /// [`Self::node_for_intended`], with the current entry if the caller
    /// knows it (see [`Self::intern`]).
    fn intern_intended(&mut self, id: ItemId, known: CurrentEntry<'a>) -> Option<Id> {
        if let Some(node) = self.by_intended_id.get(id) {
            return Some(node);
        }
        let intended: &'a IntendedGraph = self.intended;
        let item = intended.identity(id)?;
        let node = self.push_node(item, Some(id), intended.entry_by_id(id), known);
        self.by_intended_id.insert(id, node);
        Some(node)
    }

    fn push_node(
        &mut self,
        item: &'a ItemRef,
        intended_id: Option<ItemId>,
        intended: Option<(&'a Arc<IntendedItem>, ItemSummary)>,
        known: CurrentEntry<'a>,
    ) -> Id {
        let current_graph: &'a CurrentGraph = self.current;
        let id = Id::try_from(self.nodes.len()).unwrap_or(Id::MAX);
        let external = intended.is_some_and(|(_, summary)| summary.external);
        let intended_graph: &'a IntendedGraph = self.intended;
        let current = match known {
            CurrentEntry::Read(current) => current,
            CurrentEntry::LookUp if current_graph.is_empty() => None,
            CurrentEntry::LookUp => {
                match intended_id.and_then(|id| intended_graph.current_slot_hint(id)) {
                    Some(hint) => current_graph.get_hinted(item, hint),
                    None => current_graph.get(item),
                }
            }
        };
        let mut mark: Mark = 0;
        if intended.is_some() && !external {
            mark |= OPERABLE;
        }
        if current.is_some_and(|c| c.is_busy()) {
            mark |= BUSY;
        }
        if current.is_some_and(|c| c.is_created()) {
            mark |= CREATED;
        }
        self.marks.push(mark);
        self.nodes.push(Node {
            item,
            intended_id,
            intended: intended.map(|(entry, _)| entry),
            summary: intended.map(|(_, summary)| summary).unwrap_or_default(),
            current,
            need: None,
            seed: false,
            examined: false,
            schedules: NO_SCHEDULES,
            required: None,
            current_dependents: None,
        });
        id
    }

    /// The Delete schedule of `id` this round, if it has one.
    pub(super) fn delete_schedule(&self, id: Id) -> Option<&Schedule> {
        self.schedules_of(id)?.delete.as_ref()
    }

    /// The Create/Modify schedule of `id` this round, if it has one.
    pub(super) fn change_schedule(&self, id: Id) -> Option<&Schedule> {
        self.schedules_of(id)?.change.as_ref()
    }

    /// Takes both schedules of `id` (Delete, then Create/Modify).
    pub(super) fn take_schedules(&mut self, id: Id) -> (Option<Schedule>, Option<Schedule>) {
        let index = self.node(id).schedules as usize;
        match self.schedules.get_mut(index) {
            Some(schedules) => (schedules.delete.take(), schedules.change.take()),
            None => (None, None),
        }
    }

    fn schedules_of(&self, id: Id) -> Option<&NodeSchedules> {
        self.schedules.get(self.node(id).schedules as usize)
    }

    /// The schedules of `id`, given a place first if it has none (there
    /// are never more places than nodes, whose ids are `u32`s).
    fn schedules_mut(&mut self, id: Id) -> &mut NodeSchedules {
        if self.node(id).schedules == NO_SCHEDULES {
            self.node_mut(id).schedules =
                u32::try_from(self.schedules.len()).unwrap_or(NO_SCHEDULES);
            self.schedules.push(NodeSchedules::default());
        }
        let index = self.node(id).schedules as usize;
        &mut self.schedules[index]
    }

    /// The arena node of `id`.
    pub(super) fn node(&self, id: Id) -> &Node<'a> {
        &self.nodes[id as usize]
    }

    pub(super) fn node_mut(&mut self, id: Id) -> &mut Node<'a> {
        &mut self.nodes[id as usize]
    }

    /// Number of nodes in the arena.
    pub(super) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn intended_of(&self, id: Id) -> Option<&'a Arc<IntendedItem>> {
        self.node(id).intended
    }

    fn current_of(&self, id: Id) -> Option<&'a Arc<CurrentItem>> {
        self.node(id).current
    }

    /// The intended dependencies of `id` (index-aligned with its
    /// `dependencies`), interned.
    fn required(&mut self, id: Id) -> Span {
        if let Some(required) = self.node(id).required {
            return required;
        }
        let intended: &'a IntendedGraph = self.intended;
        let node = self.node(id);
        let (entry, intended_id) = (node.intended, node.intended_id);
        let start = self.edges.len();
        if let (Some(entry), Some(intended_id)) = (entry, intended_id) {
            // The graph's id list is index-aligned with the dependencies;
            // the item itself is read only if an id were ever unknown.
            for (index, &target) in intended.required_ids(intended_id).iter().enumerate() {
                let target = match self.node_for_intended(target) {
                    Some(target) => target,
                    None => match entry.item.dependencies.get(index) {
                        Some(dependency) => self.id(&dependency.requires),
                        None => continue,
                    },
                };
                self.edges.push(target);
            }
        }
        let range = self.edge_range(start);
        self.node_mut(id).required = Some(range);
        range
    }

    /// The current dependents of `id`, interned.
    fn current_dependents(&mut self, id: Id) -> Span {
        if let Some(dependents) = self.node(id).current_dependents {
            return dependents;
        }
        let current: &'a CurrentGraph = self.current;
        let range = if current.is_empty() {
            Span::EMPTY
        } else {
            let mut intended_dependents = self.intended_dependents_by_identity(id);
            let start = self.edges.len();
            let mut next = 0;
            for (dependent, entry) in current.dependents_with_items_of(self.node(id).item) {
                let entry = CurrentEntry::Read(entry);
                let node = find_shared(&intended_dependents, dependent, &mut next)
                    .and_then(|intended_id| self.intern_intended(intended_id, entry))
                    .unwrap_or_else(|| self.intern(dependent, entry));
                self.edges.push(node);
            }
            intended_dependents.clear();
            self.scratch_dependents = intended_dependents;
            self.edge_range(start)
        };
        self.node_mut(id).current_dependents = Some(range);
        range
    }

    /// The intended dependents of `id` with the identities the intended
    /// graph keeps for them, when there are few (up to
    /// [`SHARED_MATCH_LIMIT`]; none otherwise), in the planner's reused
    /// buffer. The current graph names most of them by the same shared
    /// identities, so [`Self::current_dependents`] finds their intended ids
    /// by pointer instead of a look-up by name each.
    fn intended_dependents_by_identity(&mut self, id: Id) -> Vec<(ItemId, &'a ItemRef)> {
        let intended: &'a IntendedGraph = self.intended;
        let mut found = std::mem::take(&mut self.scratch_dependents);
        found.clear();
        if let Some(intended_id) = self.node(id).intended_id {
            found.extend(
                intended
                    .dependent_ids(intended_id)
                    .take(SHARED_MATCH_LIMIT + 1)
                    .filter_map(|dependent| Some((dependent, intended.identity(dependent)?))),
            );
        }
        if found.len() > SHARED_MATCH_LIMIT {
            found.clear();
        }
        found
    }

    fn edge_range(&self, start: usize) -> Span {
        let to_u32 = |value: usize| u32::try_from(value).unwrap_or(u32::MAX);
        Span {
            start: to_u32(start),
            len: to_u32(self.edges.len() - start),
        }
    }

    /// Keeps `after` as the predecessors of a ready operation.
    fn keep_after(&mut self, after: &[OperationKey]) -> Span {
        let start = self.afters.len();
        self.afters.extend_from_slice(after);
        let to_u32 = |value: usize| u32::try_from(value).unwrap_or(u32::MAX);
        Span {
            start: to_u32(start),
            len: to_u32(after.len()),
        }
    }

    /// The predecessors of a ready operation, kept as `span`.
    pub(super) fn after(&self, span: Span) -> &[OperationKey] {
        self.afters.get(span.indexes()).unwrap_or_default()
    }

    /// The `index`-th neighbour in `range`.
    fn edge(&self, range: Span, index: usize) -> Id {
        self.edges[range.indexes()][index]
    }

    /// The item's own need (memoized).
    pub(super) fn need(&mut self, id: Id) -> Need {
        if let Some(need) = self.node(id).need {
            return need;
        }
        let node = self.node(id);
        // The common case of a full create, without reading the item.
        let need = if node.intended.is_some() && !node.summary.external && node.current.is_none() {
            Need::Create
        } else {
            own_need(
                node.intended.map(|entry| (&**entry, node.summary)),
                node.current.map(|entry| &**entry),
                self.current,
                self.environment,
            )
        };
        self.node_mut(id).need = Some(need);
        let changes = matches!(need, Need::Create | Need::Modify { .. } | Need::Recreate);
        self.marks.set(
            id,
            if changes {
                NEED_KNOWN | NEEDS_CHANGE
            } else {
                NEED_KNOWN
            },
        );
        need
    }

    /// Whether `id` is an examined item that this run was not seeded with
    /// although the environment counts it unconverged: an earlier pass left
    /// it waiting or planned, and this plan's verdict on it replaces that.
    pub(super) fn revises_earlier_verdict(&mut self, id: Id) -> bool {
        !self.node(id).seed && self.counted_unconverged(id)
    }

    /// Whether the environment counts `id` unconverged (asked once per
    /// item, then remembered in its marks).
    fn counted_unconverged(&mut self, id: Id) -> bool {
        if !self.marks.has(id, CONVERGENCE_KNOWN) {
            let converged = self.environment.is_converged(self.node(id).item);
            let answer = if converged { 0 } else { UNCONVERGED };
            self.marks.set(id, CONVERGENCE_KNOWN | answer);
        }
        self.marks.has(id, UNCONVERGED)
    }

    /// Whether `id` is planned for deletion.
    pub(super) fn is_deleting(&self, id: Id) -> bool {
        self.marks.has(id, DELETING)
    }

    /// Whether `id` is removed from current state without a call.
    pub(super) fn is_dropped(&self, id: Id) -> bool {
        self.marks.has(id, DROPPED)
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
            // What an item relies on decides whether it must go; an item
            // going already whose Delete did not change this pass (not a
            // seed, or one planned again only because room opened for its
            // Delete) learns nothing from it, and the items it relies on
            // wait for its Delete as before: a chain being deleted is not
            // walked to its bottom, and the dependents of an item being
            // deleted are dispatched without examining it again.
            let deleting_as_before = need == Need::Delete
                && (!self.node(id).seed
                    || self.environment.planned_again_for_room(self.node(id).item));
            if self.expand && !deleting_as_before {
                self.visit_unconverged_dependencies(id);
            }
            // An item planned for deletion (on its own account, or taken
            // along by a dependency's) neither settles nor keeps existing,
            // whatever its own need: its dependents learn of it.
            let going = self.is_deleting(id);
            let settled = need == Need::Nothing
                && !going
                && current.is_some_and(|c| c.is_created() && !c.is_busy());
            let absent_and_unwanted = need == Need::Nothing && current.is_none();
            // An item settled now that an earlier pass left unconverged (its
            // Delete or recreate no longer needed, say) may have been why
            // its dependents were to go: they learn it here (seed 233954: a
            // dependent's Delete, failed for good, went on waiting).
            let settled_anew = settled && self.revises_earlier_verdict(id);
            if self.expand
                && (self.node(id).seed || settled_anew || !(settled || absent_and_unwanted))
            {
                // Likewise an existing item whose planned Modify did not
                // change this pass (it is not a seed): its dependents that
                // only wait for that Modify, by a plain edge, with an own
                // Modify of their own and nothing running, wait for it as
                // before; a chain being modified is not walked to its top.
                // And whatever the item, if it exists and keeps existing
                // (a plain Modify of it, or nothing: say its Modify just
                // completed), its settled dependents stay as they are
                // (`settled_beside`).
                let modifies_in_place = need == (Need::Modify { ask: false })
                    && !going
                    && current.is_some_and(|c| c.is_created());
                let modify_as_before = !self.node(id).seed && modifies_in_place;
                let keeps_existing = modifies_in_place || settled;
                let passes_over = |planner: &mut Self, dependent: Id| {
                    (modify_as_before && planner.waits_only_for_modify_of(dependent, id))
                        || (keeps_existing && planner.settled_beside(dependent, id))
                };
                let dependents = self.current_dependents(id);
                for index in 0..dependents.len as usize {
                    let dependent = self.edge(dependents, index);
                    if !self.node(dependent).examined && passes_over(self, dependent) {
                        continue;
                    }
                    self.visit(dependent);
                }
                // An absent item that is still to be created blocks its
                // absent intended dependents as it did before this pass:
                // they wait for it, and their dependents for them, so the
                // walk stops there (completing an operation costs its direct
                // dependents, not the whole chain above). A seed's
                // dependents are always looked at: the seed changed.
                let blocks_as_before =
                    !self.node(id).seed && need == Need::Create && current.is_none();
                let intended: &'a IntendedGraph = self.intended;
                if let Some(intended_id) = self.node(id).intended_id {
                    for dependent in intended.dependent_ids(intended_id) {
                        if blocks_as_before
                            && intended
                                .identity(dependent)
                                .is_none_or(|item| self.current.get(item).is_none())
                        {
                            continue;
                        }
                        if let Some(dependent) = self.node_for_intended(dependent) {
                            if !self.node(dependent).examined && passes_over(self, dependent) {
                                continue;
                            }
                            self.visit(dependent);
                        }
                    }
                }
            }
        }
    }

    /// Whether `dependent` only waits for the Modify of `required`, as it
    /// did before this pass: it stands apart from that Modify (see
    /// [`Self::stands_apart_from_modify_of`]) and needs a plain Modify of
    /// its own.
    fn waits_only_for_modify_of(&mut self, dependent: Id, required: Id) -> bool {
        self.stands_apart_from_modify_of(dependent, required)
            && self.need(dependent) == (Need::Modify { ask: false })
    }

    /// Whether `dependent` is settled and stays so while `required` keeps
    /// existing (a plain Modify of it, or a completed one): the last pass
    /// that looked at it found it converged (and nothing changed it
    /// since), and it stands apart from a Modify of `required`. Nothing of
    /// it is to be planned because of `required`, so a pass that modifies
    /// an item with many dependents, or learns that its Modify completed,
    /// does not examine them all (DESIGN 3, rule 12).
    fn settled_beside(&mut self, dependent: Id, required: Id) -> bool {
        !self.counted_unconverged(dependent)
            && self.stands_apart_from_modify_of(dependent, required)
    }

    /// Whether a Modify of `required` cannot change what is planned for
    /// `dependent` beyond its own need: it exists, nothing of it runs, no
    /// earlier pass planned a Delete of it that is still to run, and
    /// neither its intended nor its applied value asks anything of
    /// `required` but that it exists (no predicate to check against the
    /// new value, no recreate on modification, not gone with an external
    /// item).
    fn stands_apart_from_modify_of(&self, dependent: Id, required: Id) -> bool {
        let required = self.node(required).item;
        let node = self.node(dependent);
        let (Some(intended), Some(current)) = (node.intended, node.current) else {
            return false;
        };
        if current.is_busy() || !current.is_created() {
            return false;
        }
        // Its Delete, if an earlier pass planned one, is what `required`'s
        // Modify waits for: it must be examined to be known.
        if self.environment.may_have_pending_delete(node.item) {
            return false;
        }
        // Every dependency on `required` asks only that it exists. The
        // flags are read first: the identities are compared only for a
        // dependency that asks more (nearly none), not for every one.
        let plain = |dependencies: &[crate::graph::Dependency]| {
            dependencies.iter().all(|dependency| {
                dependency.asks_only_existence() || dependency.requires != *required
            })
        };
        let intended_plain = node.summary.plain_dependencies || plain(&intended.item.dependencies);
        intended_plain
            && current.applied.as_ref().is_none_or(|applied| {
                Arc::ptr_eq(applied, &intended.item) || plain(&applied.dependencies)
            })
    }

    /// Examines the items whose Delete is in flight or planned (as the
    /// environment knows them) of every type of which this round plans a
    /// Create, and that no earlier round covered: the Create waits for
    /// them (rule 8), and the next round plans it so. Whether it examined
    /// anything new. A Create that waits for something else needs no
    /// such look: a pass on a batch of results, say, whose items wait to
    /// be created again while many Deletes of their type are pending, does
    /// not examine all of those.
    fn visit_deletes_of_ready_creates(&mut self, covered: &mut BTreeSet<&'a str>) -> bool {
        let current: &'a CurrentGraph = self.current;
        let environment = self.environment;
        let mut fresh = Vec::new();
        for &id in &self.order {
            let node = self.node(id);
            let item: &'a ItemRef = node.item;
            let creates = matches!(
                self.change_schedule(id),
                Some(Schedule::Ready {
                    kind: OperationKind::Create,
                    ..
                })
            );
            if creates && covered.insert(item.item_type()) {
                fresh.push(item.item_type());
            }
        }
        let before = self.examined.len();
        for item_type in fresh {
            for item in environment.deletes_of_type(item_type) {
                if let Some(key) = current.identity(&item) {
                    let id = self.id(key);
                    self.visit(id);
                }
            }
        }
        self.examined.len() > before
    }

    /// Examines what `id`'s fate depends on upstream: the items it relies
    /// on now (the dependencies of every value it may hold, and of the one
    /// an operation applies) and will rely on (its intended ones), where
    /// they are not converged. A deletion planned anywhere
    /// upstream then reaches `id` whatever the pass was seeded with (A on B
    /// on C, C removed: a pass seeded with A alone must still see that B
    /// goes with C). Converged items end the walk (see
    /// [`PlanEnvironment::is_converged`]).
    fn visit_unconverged_dependencies(&mut self, id: Id) {
        // Dependencies that take `id` along as an earlier plan had it are
        // not examined (see `goes_with_as_before`); they are recorded from
        // here on.
        let first_going = self.going_as_before.len();
        if let Some(applied) = self.current_of(id).and_then(|c| c.applied.as_ref()) {
            let intended = self.intended_of(id).map(|entry| &entry.item.dependencies);
            let required = self.required(id);
            let aligned = intended.filter(|intended| intended.len() == required.len as usize);
            for (index, dependency) in applied.dependencies.iter().enumerate() {
                // A dependency the intended value names by the same shared
                // identity at the same place is the node interned for it
                // already: no look-up by name (an item modified in place,
                // or whose Modify has completed).
                let required = match aligned.and_then(|intended| intended.get(index)) {
                    Some(intended) if intended.requires.ptr_eq(&dependency.requires) => {
                        self.edge(required, index)
                    }
                    _ => self.id(&dependency.requires),
                };
                if self.goes_with_as_before(id, required) {
                    self.mark_deleting(id);
                    self.going_as_before.push((id, required));
                    continue;
                }
                self.visit_if_unconverged(required);
            }
        }
        // The values lost operations may have applied, and the one an
        // operation applies, rely on their dependencies too (they are
        // edges of the current graph): a deletion upstream of one of them
        // reaches `id` whatever the pass was seeded with, as in a full
        // plan.
        if let Some(current) = self.current_of(id) {
            for required in current.edges_beyond_applied() {
                let required = self.id(required);
                self.visit_if_unconverged(required);
            }
        }
        // An absent item loses nothing upstream, and to its Create a
        // dependency that left the intent is planned for deletion (or
        // missing) whatever is planned for it: such a dependency is not
        // examined. The pass on each batch of Deletes of a hub's dependents
        // that are still intended, the hub having left the intent, would
        // otherwise take along the hub and, through its deletion cascade,
        // every dependent left.
        let absent = self.current_of(id).is_none();
        let required = self.required(id);
        for index in 0..required.len as usize {
            let dependency = self.edge(required, index);
            let going = self.going_as_before[first_going..]
                .iter()
                .any(|&(_, required)| required == dependency);
            if absent && self.node(dependency).intended.is_none() || going {
                continue;
            }
            self.visit_if_unconverged(dependency);
        }
    }

    /// Whether `dependent` goes with `required` as an earlier plan left
    /// them both, so that `required` need not be examined: `required` is
    /// not examined so far and is to be deleted on its own account (it
    /// left the intent), and `dependent`, which relies on it now and
    /// exists, has a Delete an earlier plan gave it, nothing of it changed
    /// since but its own removal from the intent, and its intent (if any)
    /// still relies on `required`, so no retargeting spares it (rule 7).
    /// Its Delete is then what `required`'s waits for already. Each batch
    /// of a hub's dependents deleted along with the hub (the hub having
    /// left the intent first) would otherwise examine the hub and, through
    /// its Delete, every dependent left.
    fn goes_with_as_before(&mut self, dependent: Id, required: Id) -> bool {
        if self.node(required).examined || self.is_dropped(required) {
            return false;
        }
        let node = self.node(dependent);
        let (item, intended, current) = (node.item, node.intended, node.current);
        let required_item = self.node(required).item;
        let unchanged =
            !node.seed || intended.is_none() || self.environment.planned_again_for_room(item);
        let still_relies =
            intended.is_none_or(|entry| entry.item.dependency_on(required_item).is_some());
        unchanged
            && still_relies
            && current.is_some_and(|c| c.may_exist() || c.is_busy())
            && self.environment.deletes_as_before(item)
            && self.need(required) == Need::Delete
    }

    /// Examines the dependencies left unexamined because a dependent goes
    /// with them as before, where this round did not find that dependent's
    /// Delete ready after all (it waits for a dependent of its own that now
    /// fails or waits, say): the dependency's Delete, which waits for it,
    /// then shows why, and is woken by it. Whether it examined anything.
    fn visit_dependencies_of_waiting_deletes(&mut self) -> bool {
        let before = self.examined.len();
        for index in 0..self.going_as_before.len() {
            let (dependent, required) = self.going_as_before[index];
            let ready = matches!(
                self.delete_schedule(dependent),
                Some(Schedule::Ready { .. })
            );
            if !ready {
                self.visit(required);
            }
        }
        self.going_as_before
            .retain(|&(_, required)| !self.nodes[required as usize].examined);
        self.examined.len() > before
    }

    /// Visits `id` if the environment says it is not converged. Each node
    /// is asked about once, and an examined node not at all: in a dense
    /// graph many edges lead to the same item.
    fn visit_if_unconverged(&mut self, id: Id) {
        if !self.node(id).examined && self.counted_unconverged(id) {
            self.visit(id);
        }
    }

    /// Plans `id` (and, transitively, its current dependents) for deletion.
    ///
    /// A dependent that the intent retargets away from `id` (its intended
    /// value no longer requires `id` and needs only a Modify) is not taken
    /// along: it is modified instead, and `id`'s Delete waits for it
    /// (rule 7). If its new dependencies cannot be satisfied, rule 5 marks
    /// it for deletion on its own.
    fn mark_deleting(&mut self, id: Id) {
        let mut stack = vec![id];
        while let Some(id) = stack.pop() {
            if self.is_deleting(id) {
                continue;
            }
            self.marks.set(id, DELETING);
            self.visit(id);
            self.visit_existing_intended_dependents(id);
            let dependents = self.current_dependents(id);
            for index in 0..dependents.len as usize {
                let dependent = self.edge(dependents, index);
                if self.is_dropped(dependent) {
                    continue;
                }
                let node = self.node(dependent);
                if !node.current.is_some_and(|c| c.may_exist() || c.is_busy()) {
                    continue;
                }
                if self.retargets_away(dependent, id) {
                    self.retargeted.push(dependent);
                } else {
                    stack.push(dependent);
                }
            }
        }
    }

    /// Examines the existing items whose intent relies on `id`, now that
    /// `id` is planned for deletion: a Modify that waited for `id`'s Modify
    /// as before (passed over while `id` was examined) waits for nothing
    /// that will come, and rule 5 deletes it instead.
    fn visit_existing_intended_dependents(&mut self, id: Id) {
        let Some(intended_id) = self.node(id).intended_id else {
            return;
        };
        let intended: &'a IntendedGraph = self.intended;
        for dependent in intended.dependent_ids(intended_id) {
            let exists = intended
                .identity(dependent)
                .is_some_and(|item| self.current.get(item).is_some());
            if exists && let Some(dependent) = self.node_for_intended(dependent) {
                self.visit(dependent);
            }
        }
    }

    /// A spared retargeted dependent whose new dependency the rest of the
    /// cascade planned for deletion (or otherwise left unsatisfied) is
    /// deleted after all; repeated until nothing changes, since that
    /// deletion cascades in turn.
    fn recheck_retargeted(&mut self) {
        loop {
            let mut doomed = Vec::new();
            for index in 0..self.retargeted.len() {
                let dependent = self.retargeted[index];
                if self.is_deleting(dependent) {
                    continue;
                }
                if !self.intended_dependencies_satisfied_now(dependent) {
                    doomed.push(dependent);
                }
            }
            if doomed.is_empty() {
                return;
            }
            for dependent in doomed {
                self.mark_deleting(dependent);
            }
            self.process_queue();
        }
    }

    /// Whether `dependent` (which relies on `required` now) is intended
    /// without `required`, needs only a Modify to get there, and every
    /// dependency of its new value is satisfied now (DESIGN §2: exists,
    /// created, no operation planned, in flight or failed on it, predicate
    /// true). Only then can it be modified before `required` is deleted
    /// without waiting on anything that could wait on that Delete.
    fn retargets_away(&mut self, dependent: Id, required: Id) -> bool {
        if !self.marks.has(dependent, OPERABLE) || self.is_deleting(dependent) {
            return false;
        }
        let Some(entry) = self.intended_of(dependent) else {
            return false;
        };
        let required_item = self.node(required).item;
        if entry.item.dependency_on(required_item).is_some()
            || !matches!(self.need(dependent), Need::Modify { .. })
        {
            return false;
        }
        self.intended_dependencies_satisfied_now(dependent)
    }

    /// Whether every dependency of `id`'s intended value is satisfied now
    /// (see [`Self::satisfied_now`]); false when `id` is not intended.
    fn intended_dependencies_satisfied_now(&mut self, id: Id) -> bool {
        let Some(entry) = self.intended_of(id) else {
            return false;
        };
        let dependencies = self.required(id);
        (0..dependencies.len as usize).all(|index| {
            let dependency = self.edge(dependencies, index);
            let predicate = entry.predicates.get(index);
            self.satisfied_now(dependency, predicate)
        })
    }

    /// Whether a dependency on `id` is satisfied as things stand, before
    /// any operation of this plan: created, not planned for deletion or
    /// dropped, nothing planned, running or failed on it, predicate true.
    /// A periodic READ running on it does not count: it changes nothing
    /// until it reports, and a dependent retargeted onto the item would
    /// otherwise be deleted (and created again) for the READ's sake
    /// (simulator seed 25651: the plan depended on whether a READ was
    /// under way).
    fn satisfied_now(&mut self, id: Id, predicate: Option<&Predicate>) -> bool {
        if self.is_deleting(id) || self.is_dropped(id) {
            return false;
        }
        let Some(current) = self.current_of(id) else {
            return false;
        };
        let busy = current.is_busy() && !current.only_a_read_runs();
        if !current.is_created() || busy || current.has_failed_modify() {
            return false;
        }
        if self.needs_change(id) {
            return false;
        }
        predicate.is_none_or(|predicate| {
            predicate
                .evaluate(&current.effective_properties())
                .unwrap_or(false)
        })
    }

    /// Removes `id` from current state without a call; what depends on it
    /// has lost a dependency and is deleted.
    fn drop_item(&mut self, id: Id) {
        if self.is_dropped(id) {
            return;
        }
        self.marks.set(id, DROPPED);
        self.visit(id);
        let dependents = self.current_dependents(id);
        for index in 0..dependents.len as usize {
            let dependent = self.edge(dependents, index);
            if self
                .current_of(dependent)
                .is_some_and(|c| c.may_exist() || c.is_busy())
            {
                self.mark_deleting(dependent);
            }
        }
    }

    /// Whether a dependency of `value` is gone: (one that is not
    /// `auto_deleted_by_external`, one that is).
    fn gone_dependencies(&mut self, id: Id, value: &'a Item) -> (bool, bool) {
        let (mut gone_plain, mut gone_auto) = (false, false);
        let as_intended = self.dependencies_as_intended(id, value);
        for (index, dependency) in value.dependencies.iter().enumerate() {
            let required = match as_intended {
                Some(span) => self.edge(span, index),
                None => self.id(&dependency.requires),
            };
            let dropped = self.is_dropped(required);
            // An item whose operation runs, or whose existence is not known
            // (a lost Create answered FAILED on its re-delivery may have
            // applied before), is not known to be gone: UNKNOWN never
            // causes a dependent's deletion (DESIGN 4; seed 125101).
            let gone = match self.node(required).current {
                Some(state) if state.is_busy() || state.existence_uncertain => false,
                Some(state) => !state.is_created() || dropped,
                None => true,
            };
            if gone {
                if dependency.auto_deleted_by_external() {
                    gone_auto = true;
                } else {
                    gone_plain = true;
                }
            }
        }
        (gone_plain, gone_auto)
    }

    /// The nodes of the dependencies of `value` (a value item `id` holds),
    /// index-aligned with them, when it relies on exactly the items its
    /// intent does, in the same order: the usual case (the value is the
    /// intended one, or a Modify changes only properties), where the
    /// intended graph's id list names them without a look-up each.
    fn dependencies_as_intended(&mut self, id: Id, value: &Item) -> Option<Span> {
        let intended = &self.intended_of(id)?.item;
        let same = std::ptr::eq(&**intended, value)
            || (intended.dependencies.len() == value.dependencies.len()
                && intended
                    .dependencies
                    .iter()
                    .zip(&value.dependencies)
                    .all(|(mine, theirs)| mine.requires == theirs.requires));
        if !same {
            return None;
        }
        let span = self.required(id);
        (span.len as usize == value.dependencies.len()).then_some(span)
    }

    /// Rules for an item that exists: a dependency it relies on is gone, a
    /// predicate fails for the dependency's next value, or a
    /// `recreate_when_modified` dependency is about to be modified.
    fn check_existing(&mut self, id: Id, current: &'a CurrentItem) {
        if current.applied.is_none() {
            return;
        }
        // Every gone dependency counts, in any order: one that takes the
        // item with it (`auto_deleted_by_external`) drops it without a
        // call, any other gone one deletes it. An item that may hold
        // other values (`maybe_applied`) is dropped only if each of them
        // goes too; otherwise it may exist, and is deleted.
        let (mut any_plain, mut any_auto, mut every_auto) = (false, false, true);
        for value in current.values() {
            let (plain, auto) = self.gone_dependencies(id, value);
            any_plain |= plain;
            any_auto |= auto;
            every_auto &= auto;
        }
        let gone_auto = every_auto;
        let gone_plain = !gone_auto && (any_plain || any_auto);
        if gone_auto {
            self.drop_item(id);
            return;
        }
        if gone_plain {
            self.mark_deleting(id);
            return;
        }
        if self.is_deleting(id) || current.is_busy() {
            return;
        }
        let Some(intended) = self.intended_of(id) else {
            return;
        };
        // While the item exists it holds its applied value, so the
        // predicates that must keep holding are the applied ones (rule 6):
        // a dependency modified into a value that fails one takes the item
        // down first, even when the new intent's predicate would hold. An
        // item that may hold other values (`maybe_applied`) keeps their
        // predicates too.
        for value in current.values() {
            if self.breaks_or_recreates(id, value, intended) {
                // The dependency's Modify waits for this Delete (see
                // `modify_waits_for_dependents`).
                self.mark_deleting(id);
                return;
            }
        }
    }

    /// Whether a dependency of `value` (a value the item holds) is about to
    /// get a value that fails its predicate (rule 6), or to be modified
    /// under a `recreate_when_modified` dependency the intent keeps.
    fn breaks_or_recreates(&mut self, id: Id, value: &'a Item, intended: &IntendedItem) -> bool {
        let as_intended = self.dependencies_as_intended(id, value);
        for (index, dependency) in value.dependencies.iter().enumerate() {
            let required = match as_intended {
                Some(span) => self.edge(span, index),
                None => self.id(&dependency.requires),
            };
            if self.node(required).busy() {
                continue;
            }
            let required_is_modified = matches!(self.need(required), Need::Modify { .. });
            let still_intended = intended
                .item
                .dependency_on_near(&dependency.requires, index);
            let predicate_fails = if dependency.must_satisfy().is_empty() {
                false
            } else {
                let compiled_now = still_intended
                    .filter(|intended| intended.must_satisfy() == dependency.must_satisfy())
                    .and_then(|_| intended.predicate_on(&dependency.requires));
                let value = self.value_after_plan(required);
                match compiled_now {
                    Some(predicate) => !predicate.evaluate(&value).unwrap_or(false),
                    None => !Predicate::compile(dependency.must_satisfy())
                        .and_then(|predicate| predicate.evaluate(&value))
                        .unwrap_or(false),
                }
            };
            let recreate = required_is_modified
                && still_intended.is_some_and(|intended| intended.recreate_when_modified());
            if predicate_fails || recreate {
                return true;
            }
        }
        false
    }

    /// The properties `id` will have once this plan ran: the intended ones
    /// if it gets an operation, else observed laid over applied.
    fn value_after_plan(&mut self, id: Id) -> Cow<'a, Properties> {
        let need = self.need(id);
        match (need, self.intended_of(id)) {
            (Need::Modify { .. }, Some(entry)) => {
                properties_after_modify(self.current_of(id), &entry.item.properties)
            }
            (Need::Create | Need::Recreate, Some(entry)) => Cow::Borrowed(&entry.item.properties),
            _ => Cow::Owned(
                self.current_of(id)
                    .map(|current| current.effective_properties())
                    .unwrap_or_default(),
            ),
        }
    }

    fn collect_inflight_deletes(&mut self) {
        self.inflight_deletes_by_type.clear();
        for &id in &self.order {
            let node = &self.nodes[id as usize];
            let deleting_now = node
                .current
                .and_then(|c| c.in_flight.as_ref())
                .is_some_and(|op| op.kind == OperationKind::Delete);
            if deleting_now {
                self.inflight_deletes_by_type
                    .entry(node.item.item_type())
                    .or_insert(id);
            }
        }
    }

    /// A failed (or WAIT-answered) operation waits for its retry time.
    fn in_backoff(&self, current: &CurrentItem) -> bool {
        !current.is_busy()
            && current
                .rare
                .next_attempt_at_ms
                .is_some_and(|at| at > self.now_ms)
    }

    // ----- Deletes ---------------------------------------------------------

    fn schedule_deletes(&mut self) {
        let roots: Vec<Id> = self
            .order
            .iter()
            .copied()
            .filter(|&id| self.is_deleting(id))
            .collect();
        for root in roots {
            self.schedule_delete_tree(root);
        }
    }

    /// Whether `id` is something a Delete must wait for: it may exist, or
    /// an operation of it runs (a dropped item too, until that operation
    /// reports).
    fn holds_a_delete(&self, id: Id) -> bool {
        self.node(id)
            .current
            .is_some_and(|c| c.is_busy() || (c.may_exist() && !self.is_dropped(id)))
    }

    /// Schedules the Delete of `root` after those of its current dependents
    /// (iterative depth-first: graphs can be deep).
    fn schedule_delete_tree(&mut self, root: Id) {
        let mut stack = vec![(root, false)];
        while let Some((id, expanded)) = stack.pop() {
            if self.delete_schedule(id).is_some() {
                continue;
            }
            if expanded {
                let schedule = self.compute_delete(id);
                self.schedules_mut(id).delete = Some(schedule);
                continue;
            }
            if self.marks.has(id, DELETE_IN_PROGRESS) {
                let schedule = cycle_in_current_state(self.node(id).item, OperationKind::Delete);
                self.schedules_mut(id).delete = Some(schedule);
                continue;
            }
            self.marks.set(id, DELETE_IN_PROGRESS);
            stack.push((id, true));
            // Only dependents planned for deletion get a Delete: one that
            // is retargeted away (rule 7) is modified instead, and this
            // Delete waits for it.
            let dependents = self.current_dependents(id);
            for index in 0..dependents.len as usize {
                let dependent = self.edge(dependents, index);
                if self.is_deleting(dependent)
                    && self.holds_a_delete(dependent)
                    && self.delete_schedule(dependent).is_none()
                {
                    stack.push((dependent, false));
                }
            }
        }
    }

    fn compute_delete(&mut self, id: Id) -> Schedule {
        let kind = OperationKind::Delete;
        let node = self.node(id);
        let item = node.item;
        let Some(current) = node.current else {
            return Schedule::NotNeeded;
        };
        if self.is_dropped(id) || !(current.may_exist() || current.is_busy()) {
            return Schedule::NotNeeded;
        }
        if current.is_busy() {
            return waiting_on_itself(item, current, kind);
        }
        let target_generation = node.intended.map_or(0, |entry| entry.generation);
        // DESIGN 4: a terminal failure gets no retry until the intent
        // changes. That covers the Delete that failed, and the recreate an
        // item needs on its own (rule 4, a dependency modified since it was
        // created) after its Modify toward this intent failed for good: the
        // Create would send the refused value again, with the item deleted.
        let recreates_the_refused_value = node.need == Some(Need::Recreate);
        let refused_again = (current.last_operation == Some(kind) || recreates_the_refused_value)
            && current.failed_terminally_at(target_generation);
        if refused_again || current.gave_up_settled_at(kind, target_generation) {
            return terminal(item, current, kind);
        }
        if self.in_backoff(current) {
            return backoff(item, current, kind);
        }
        if !self.environment.has_configurator(item.item_type()) {
            return no_configurator(item, kind);
        }
        let mut after = Vec::new();
        let mut blocked_by = Vec::new();
        // DESIGN 4: an UNKNOWN dependency blocks operations on its
        // dependents, Deletes included.
        self.waits_for_unknown_dependencies(id, false, &mut blocked_by);
        let dependents = self.current_dependents(id);
        for index in 0..dependents.len as usize {
            let dependent = self.edge(dependents, index);
            if !self.holds_a_delete(dependent) {
                continue;
            }
            let node = self.node(dependent);
            if self.is_dropped(dependent) {
                blocked_by.push(BlockedBy {
                    item: node.item.clone(),
                    why: "goes with its external item once its running operation reports".into(),
                });
                continue;
            }
            match self.delete_schedule(dependent) {
                Some(Schedule::Ready { .. }) => after.push((dependent, kind)),
                Some(Schedule::Waiting { reason, .. }) => blocked_by.push(BlockedBy {
                    item: node.item.clone(),
                    why: format!("its delete waits ({})", reason_words(*reason)).into(),
                }),
                Some(Schedule::NotNeeded) => {}
                None => {
                    let item = node.item.clone();
                    let why = if self.retargets_away(dependent, id) {
                        "its modify must first move it off this item"
                    } else {
                        "depends on it and is not planned for deletion"
                    };
                    blocked_by.push(BlockedBy {
                        item,
                        why: why.into(),
                    });
                }
            }
        }
        if blocked_by.is_empty() {
            let after = self.keep_after(&after);
            Schedule::Ready { kind, after }
        } else {
            // The Deletes that could run first are waited for too, and
            // named: the list holds every dependent's Delete still to
            // come, whether it runs, waits or is ready, as a Ready
            // schedule's `after` does when none runs yet.
            for &(dependent, _) in &after {
                blocked_by.push(BlockedBy {
                    item: self.node(dependent).item.clone(),
                    why: super::runs_first(kind),
                });
            }
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
        let mark = self.marks.get(id);
        if mark & (OPERABLE | DROPPED) != OPERABLE {
            return false;
        }
        if mark & DELETING != 0 {
            return true;
        }
        if mark & NEED_KNOWN == 0 {
            self.need(id);
        }
        self.marks.has(id, NEEDS_CHANGE)
    }

    /// Records the Create/Modify schedule of `id`.
    fn set_change_schedule(&mut self, id: Id, schedule: Schedule) {
        let mark = match &schedule {
            Schedule::NotNeeded => ChangeMark::NotNeeded,
            Schedule::Ready { kind, .. } => ChangeMark::ready(*kind),
            Schedule::Waiting { .. } => ChangeMark::Waiting,
        };
        self.marks.set_change(id, mark);
        self.schedules_mut(id).change = Some(schedule);
    }

    fn schedule_changes(&mut self) {
        // One in-progress set for all roots: a node is only re-entered while
        // its own subtree is being scheduled (finished nodes are skipped).
        for index in 0..self.order.len() {
            let root = self.order[index];
            if self.needs_change(root) {
                self.schedule_change_tree(root);
            }
        }
    }

    /// Schedules the Create/Modify of `root` after those of its intended
    /// dependencies (iterative depth-first).
    fn schedule_change_tree(&mut self, root: Id) {
        let mut stack = vec![(root, false)];
        while let Some((id, expanded)) = stack.pop() {
            if self.marks.change(id) != ChangeMark::Unknown {
                continue;
            }
            if expanded {
                let schedule = self.compute_change(id);
                self.set_change_schedule(id, schedule);
                continue;
            }
            if self.marks.has(id, CHANGE_IN_PROGRESS) {
                let schedule = cycle_in_current_state(self.node(id).item, OperationKind::Create);
                self.set_change_schedule(id, schedule);
                continue;
            }
            self.marks.set(id, CHANGE_IN_PROGRESS);
            stack.push((id, true));
            let required = self.required(id);
            for index in 0..required.len as usize {
                let required = self.edge(required, index);
                if self.marks.change(required) == ChangeMark::Unknown && self.needs_change(required)
                {
                    stack.push((required, false));
                }
            }
        }
    }

    fn compute_change(&mut self, id: Id) -> Schedule {
        let Some(entry) = self.intended_of(id) else {
            return Schedule::NotNeeded;
        };
        let item = self.node(id).item;
        let recreating = self.is_deleting(id);
        let need = self.need(id);
        let kind = if recreating || matches!(need, Need::Create | Need::Recreate) {
            OperationKind::Create
        } else {
            OperationKind::Modify
        };
        if let Some(current) = self.current_of(id) {
            if current.is_busy() {
                return waiting_on_itself(item, current, kind);
            }
            if !recreating {
                if current.failed_terminally_at(entry.generation)
                    || current.gave_up_settled_at(kind, entry.generation)
                {
                    return terminal(item, current, kind);
                }
                if self.in_backoff(current) {
                    return backoff(item, current, kind);
                }
            }
        }
        let mut after = std::mem::take(&mut self.scratch_after);
        after.clear();
        let mut waits_on_dependencies = Vec::new();
        let mut waits_on_operations = Vec::new();
        let mut hopeless = false;
        // Whether a dependency left the intent: then only a change of
        // that dependency (which wakes this item) can let it run.
        let mut waits_for_an_intent_change = false;

        if recreating {
            match self.delete_schedule(id) {
                Some(Schedule::Ready { .. }) => after.push((id, OperationKind::Delete)),
                Some(Schedule::Waiting { reason, .. }) => waits_on_operations.push(BlockedBy {
                    item: item.clone(),
                    why: format!("its own delete waits ({})", reason_words(*reason)).into(),
                }),
                Some(Schedule::NotNeeded) | None => {}
            }
        }
        let required = self.required(id);
        for index in 0..required.len as usize {
            let dependency = self.edge(required, index);
            let predicate = if self.node(id).summary.has_predicates {
                entry.predicates.get(index)
            } else {
                None
            };
            match self.dependency_status(dependency, predicate) {
                DependencyStatus::Satisfied => {}
                DependencyStatus::After(key) => after.push(key),
                DependencyStatus::Unsatisfied {
                    why,
                    hopeless: never,
                } => {
                    hopeless |= never;
                    waits_for_an_intent_change |= self.left_the_intent(dependency);
                    waits_on_dependencies.push(BlockedBy {
                        item: self.node(dependency).item.clone(),
                        why: why.into(),
                    });
                }
            }
        }
        if kind == OperationKind::Modify {
            self.modify_waits_for_dependents(id, &mut after, &mut waits_on_operations);
        }
        // An UNKNOWN item blocks its dependents (DESIGN 4), and an item
        // created again while it may still exist (its existence uncertain)
        // is one while it holds its applied value, as for a Modify.
        let may_hold_applied = !recreating && self.current_of(id).is_some_and(|c| c.may_exist());
        if kind == OperationKind::Modify || may_hold_applied {
            self.waits_for_unknown_dependencies(id, true, &mut waits_on_operations);
        }
        // Rule 8: a Create waits for a Delete of its type in flight, and is
        // woken by its result. Not one that waits for a dependency that left
        // the intent: that Delete's result cannot let it run, and each of
        // many such Creates (a hub's dependents, the hub removed first)
        // would be planned again on every Delete of their type.
        if kind == OperationKind::Create
            && !waits_for_an_intent_change
            && let Some(&deleting) = self.inflight_deletes_by_type.get(&**item.item_type())
            && deleting != id
        {
            waits_on_operations.push(BlockedBy {
                item: self.node(deleting).item.clone(),
                why: "a delete of the same type is in flight".into(),
            });
        }

        // Unsatisfied dependencies are reported before a missing configurator:
        // the dependency chain is what a user must look at first.
        let schedule = if !waits_on_dependencies.is_empty() {
            waits_on_dependencies.extend(waits_on_operations);
            Schedule::Waiting {
                kind,
                reason: WaitReason::Dependency,
                blocked_by: waits_on_dependencies,
                hopeless,
            }
        } else if !self.environment.has_configurator(item.item_type()) {
            no_configurator(item, kind)
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
            let after = self.keep_after(&after);
            Schedule::Ready { kind, after }
        };
        self.scratch_after = after;
        schedule
    }

    /// A Modify waits for the operations of its current dependents: those
    /// in flight, and the Deletes this plan gives them (whether they go for
    /// this Modify's sake, rules 4 and 6, or for their own), so that no
    /// dependent is being deleted while the item it relies on changes
    /// (rule 8).
    fn modify_waits_for_dependents(
        &mut self,
        id: Id,
        after: &mut Vec<OperationKey>,
        blocked_by: &mut Vec<BlockedBy>,
    ) {
        let dependents = self.current_dependents(id);
        for index in 0..dependents.len as usize {
            let dependent = self.edge(dependents, index);
            let deleting = self.is_deleting(dependent) && !self.is_dropped(dependent);
            let node = self.node(dependent);
            if let Some(current) = node.current
                && current.is_busy()
            {
                blocked_by.push(BlockedBy {
                    item: node.item.clone(),
                    why: busy_words(current),
                });
                continue;
            }
            if !deleting {
                continue;
            }
            match self.delete_schedule(dependent) {
                Some(Schedule::Ready { .. }) => after.push((dependent, OperationKind::Delete)),
                Some(Schedule::Waiting { reason, .. }) => blocked_by.push(BlockedBy {
                    item: node.item.clone(),
                    why: format!("its delete waits ({})", reason_words(*reason)).into(),
                }),
                Some(Schedule::NotNeeded) | None => {}
            }
        }
    }

    /// An UNKNOWN item blocks operations on its dependents (DESIGN 4): on
    /// `id`, while a value it may hold (its applied value, or one of
    /// `maybe_applied`) depends on one. For a Modify
    /// (`only_dropped`), the dependencies its intent keeps are checked with
    /// the others, so only those it drops are looked at here: it depends on
    /// them until the Modify is done.
    fn waits_for_unknown_dependencies(
        &mut self,
        id: Id,
        only_dropped: bool,
        blocked_by: &mut Vec<BlockedBy>,
    ) {
        let Some(current) = self.current_of(id) else {
            return;
        };
        let intended = self.intended_of(id);
        let first = blocked_by.len();
        // Every value the item may hold counts: the applied one and those
        // lost operations may have applied (seed 3400: a Create sent while
        // a value the item may hold relied on an UNKNOWN item).
        for value in current.values() {
            for (index, dependency) in value.dependencies.iter().enumerate() {
                let kept = intended.is_some_and(|i| {
                    i.item
                        .dependency_on_near(&dependency.requires, index)
                        .is_some()
                });
                if only_dropped && kept {
                    continue;
                }
                let required = self.id(&dependency.requires);
                let named = |blocked_by: &[BlockedBy]| {
                    blocked_by[first..]
                        .iter()
                        .any(|blocker| blocker.item == dependency.requires)
                };
                if let Some(required_current) = self.current_of(required)
                    && required_current.state == ItemState::Unknown
                    && !named(blocked_by)
                {
                    blocked_by.push(BlockedBy {
                        item: self.node(required).item.clone(),
                        why: busy_words(required_current),
                    });
                }
            }
        }
    }

    /// Whether `id` left the intent (or never was in it) and is not a
    /// reported external item: a dependency on it is satisfied only once
    /// the intent (or a report) brings it back.
    fn left_the_intent(&self, id: Id) -> bool {
        let node = self.node(id);
        node.intended.is_none()
            && !node
                .current
                .and_then(|c| c.applied.as_ref())
                .is_some_and(|applied| applied.external)
    }

    /// Whether the dependency on `required` is satisfied now, will be after
    /// an operation of this plan, or not within this plan.
    fn dependency_status(
        &mut self,
        required: Id,
        predicate: Option<&Predicate>,
    ) -> DependencyStatus {
        if predicate.is_none()
            && let Some(status) = self.plain_dependency_status(required)
        {
            return status;
        }
        if self.is_dropped(required) {
            return unsatisfied("missing", true);
        }
        let node = self.node(required);
        let intended = node.intended;
        let current = node.current;
        let external = if intended.is_some() {
            node.summary.external
        } else {
            current
                .and_then(|c| c.applied.as_ref())
                .is_some_and(|a| a.external)
        };
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
            return match self.change_schedule(required) {
                Some(Schedule::Ready { kind, .. }) => match predicate {
                    None => DependencyStatus::After((required, *kind)),
                    Some(_) => {
                        // A Modify keeps what the agent observed beyond the
                        // applied value (rule 6's "new value").
                        let after = if *kind == OperationKind::Modify {
                            properties_after_modify(current, &intended.item.properties)
                        } else {
                            Cow::Borrowed(&intended.item.properties)
                        };
                        check_predicate(predicate, &after, Some((required, *kind)))
                    }
                },
                Some(Schedule::Waiting { kind, reason, .. }) => {
                    if *kind == OperationKind::Create {
                        // An item whose existence is not known (a lost
                        // Create may have applied) may be there: its
                        // dependents wait rather than go, as for UNKNOWN.
                        let hopeless = !current.is_some_and(|c| c.existence_uncertain);
                        unsatisfied(
                            &format!("not created ({})", reason_words(*reason)),
                            hopeless,
                        )
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

    /// The common answers of [`Self::dependency_status`] for a dependency
    /// without a predicate, from the compact flags alone: an item ours to
    /// change that is scheduled in this plan, or one that is created and
    /// needs nothing. `None`: ask the full question.
    fn plain_dependency_status(&self, required: Id) -> Option<DependencyStatus> {
        let mark = self.marks.get(required);
        if mark & (OPERABLE | DROPPED | BUSY) != OPERABLE {
            return None;
        }
        let changes =
            mark & DELETING != 0 || mark & (NEED_KNOWN | NEEDS_CHANGE) == NEED_KNOWN | NEEDS_CHANGE;
        if changes {
            let kind = self.marks.change(required).ready_kind()?;
            return Some(DependencyStatus::After((required, kind)));
        }
        (mark & (NEED_KNOWN | CREATED) == NEED_KNOWN | CREATED)
            .then_some(DependencyStatus::Satisfied)
    }

    /// Rule 5: Modifies whose new dependencies cannot be satisfied within
    /// this plan become deletes; the item then waits as pending.
    fn modifies_that_must_delete(&self) -> Vec<Id> {
        self.order
            .iter()
            .copied()
            .filter(|&id| {
                !self.is_deleting(id)
                    && matches!(
                        self.change_schedule(id),
                        Some(Schedule::Waiting {
                            kind: OperationKind::Modify,
                            reason: WaitReason::Dependency,
                            hopeless: true,
                            ..
                        })
                    )
            })
            .collect()
    }
}

/// How many nodes a pass reserves room for per seed: a changed item of a
/// deep graph brings its dependencies and dependents along (about twenty
/// on EVE's chain).
const NODES_PER_SEED: usize = 24;

/// How many intended dependents an item may have for
/// [`Planner::current_dependents`] to match them by pointer (a scan per
/// current dependent); an item with more looks each one up by name.
const SHARED_MATCH_LIMIT: usize = 32;

/// The intended id in `candidates` whose identity is `item`'s own
/// allocation, scanning from `next` round to it (both graphs list an item's
/// dependents in much the same order, so a match is usually where the last
/// one left off); `next` moves past the match.
fn find_shared(
    candidates: &[(ItemId, &ItemRef)],
    item: &ItemRef,
    next: &mut usize,
) -> Option<ItemId> {
    let start = (*next).min(candidates.len());
    let (before, after) = candidates.split_at(start);
    let position = after
        .iter()
        .position(|(_, shared)| shared.ptr_eq(item))
        .map(|index| start + index)
        .or_else(|| before.iter().position(|(_, shared)| shared.ptr_eq(item)))?;
    *next = position + 1;
    candidates.get(position).map(|&(id, _)| id)
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

pub(super) fn busy_words(current: &CurrentItem) -> Cow<'static, str> {
    match &current.in_flight {
        Some(operation) if current.state == ItemState::Unknown => format!(
            "outcome of its {} (op {}) is unknown",
            operation.kind.as_str(),
            operation.op_id
        )
        .into(),
        Some(operation) => format!(
            "{} in flight (op {})",
            operation.kind.as_str(),
            operation.op_id
        )
        .into(),
        None => Cow::Borrowed("outcome of its last operation is unknown"),
    }
}

/// Short words for a reason, used inside `why` texts.
pub(super) fn reason_words(reason: WaitReason) -> &'static str {
    match reason {
        WaitReason::Dependency => "dependency",
        WaitReason::NoConfigurator => "no configurator",
        WaitReason::Backoff => "backoff",
        WaitReason::Blocked => "blocked",
        WaitReason::TerminalFailure => FAILED_TERMINALLY,
        WaitReason::UnknownOutcome => "outcome unknown",
    }
}

fn waiting_on_itself(item: &ItemRef, current: &CurrentItem, kind: OperationKind) -> Schedule {
    let reason = if current.state == ItemState::Unknown || current.in_flight.is_none() {
        WaitReason::UnknownOutcome
    } else {
        WaitReason::Blocked
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
    Schedule::Waiting {
        kind,
        reason: WaitReason::TerminalFailure,
        blocked_by: vec![terminal_failure(item, current)],
        hopeless: false,
    }
}

/// How terminally failed items are retried, `whose` ("its", "their")
/// naming them: an intent change that counts (DESIGN 4: "no retry until
/// its intent changes"; a new description or labels are not part of an
/// item's equality, so they do not).
pub(crate) fn retry_by(whose: &str) -> String {
    format!(
        "change {whose} properties or dependencies to retry (a new description or labels do not \
         count)"
    )
}

/// What a waiting item shows of its own terminal failure.
pub(super) fn terminal_failure(item: &ItemRef, current: &CurrentItem) -> BlockedBy {
    let retry = retry_by("its");
    let why = match current.rare.last_error.as_ref() {
        // A retryable code: the retries ran out (the type's max_attempts).
        Some(error) if !error.is_terminal() => format!(
            "{FAILED_TERMINALLY}: gave up after {} attempt{} (the type's max_attempts), the last \
             failed with: {}; {retry}",
            current.attempts,
            if current.attempts == 1 { "" } else { "s" },
            error.message
        ),
        Some(error) => format!("{FAILED_TERMINALLY}: {}; {retry}", error.message),
        // Settled since it failed (see `CurrentItem::gave_up_settled_at`).
        None => format!(
            "{FAILED_TERMINALLY} after {} attempt{}; {retry}",
            current.attempts,
            if current.attempts == 1 { "" } else { "s" }
        ),
    };
    BlockedBy {
        item: item.clone(),
        why: why.into(),
    }
}

fn backoff(item: &ItemRef, current: &CurrentItem, kind: OperationKind) -> Schedule {
    Schedule::Waiting {
        kind,
        reason: WaitReason::Backoff,
        blocked_by: vec![BlockedBy {
            item: item.clone(),
            why: format!("retry {} after backoff", current.attempts.saturating_add(1)).into(),
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
                item.item_type()
            )
            .into(),
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
