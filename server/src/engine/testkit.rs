//! A simulated world for testing the planner: in-memory graphs, scripted
//! configurator outcomes, and invariant checks at every dispatch.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use super::plan::{Plan, PlanEnvironment, TypeRules, plan_everything, plan_operations};
use super::transition::{Completion, apply_bookkeeping, begin_operation, complete_operation};
use crate::graph::{
    CurrentGraph, CurrentItem, Dependency, InFlight, IntendedGraph, IntendedItem, Item, ItemRef,
    OperationError, OperationKind, Properties,
};

/// Builds an item `type/name` from "type/name" with properties.
pub fn item(identity: &str, properties: serde_json::Value) -> Item {
    let reference = parse_ref(identity);
    Item::new(
        reference.item_type(),
        reference.name(),
        Properties::try_from(properties).unwrap_or_default(),
    )
}

/// An external item "type/name" as an intent lists it (no properties).
pub fn external(identity: &str) -> Item {
    let mut external = item(identity, serde_json::json!({}));
    external.external = true;
    external
}

/// Parses "type/name".
pub fn parse_ref(identity: &str) -> ItemRef {
    let (item_type, name) = identity.split_once('/').unwrap_or(("t", identity));
    ItemRef::new(item_type, name)
}

/// A plain dependency on "type/name".
pub fn on(identity: &str) -> Dependency {
    Dependency::on(parse_ref(identity))
}

/// A validated SubmitIntent of `items` (no predicates) as subgraph
/// `subgraph` ("": the whole intent).
pub fn validated_submit(subgraph: &str, items: Vec<Item>) -> super::intent::ValidatedSubmit {
    super::intent::ValidatedSubmit {
        subgraph: subgraph.into(),
        items: items
            .into_iter()
            .map(|item| {
                let predicates = vec![None; item.dependencies.len()];
                (item, predicates)
            })
            .collect(),
        expected_generation: None,
        dry_run: false,
    }
}

/// A plan names each item at most once per operation kind, never gives an
/// item both a Modify and a Create or Delete, never lists an operation it
/// plans as waiting too, and orders every operation after earlier ones only.
pub fn check_plan_shape(plan: &Plan) {
    let mut seen = std::collections::BTreeMap::<&ItemRef, Vec<OperationKind>>::new();
    for (index, operation) in plan.operations.iter().enumerate() {
        let kinds = seen.entry(&operation.item).or_default();
        assert!(
            !kinds.contains(&operation.kind),
            "{} {} planned twice: {:?}",
            operation.kind.as_str(),
            operation.item,
            plan.operations
        );
        kinds.push(operation.kind);
        assert!(
            operation.after.iter().all(|&before| before < index),
            "operation {index} ordered after a later one: {:?}",
            plan.operations
        );
    }
    for (item, kinds) in &seen {
        assert!(
            !(kinds.contains(&OperationKind::Modify) && kinds.len() > 1),
            "{item} has a Modify and another operation: {kinds:?}"
        );
    }
    for waiting in &plan.waiting {
        assert!(
            !seen
                .get(&waiting.item)
                .is_some_and(|kinds| kinds.contains(&waiting.operation)),
            "{} {} both planned and waiting",
            waiting.operation.as_str(),
            waiting.item
        );
    }
}

/// The world outside the graphs, as the planner sees it.
#[derive(Default)]
pub struct TestEnvironment {
    /// Recreate rules by type.
    pub rules: HashMap<String, TypeRules>,
    /// Types with no configurator connected.
    pub disconnected: HashSet<String>,
    /// The clock.
    pub now_ms: u64,
}

impl PlanEnvironment for TestEnvironment {
    fn type_rules(&self, item_type: &str) -> Option<&TypeRules> {
        self.rules.get(item_type)
    }
    fn has_configurator(&self, item_type: &str) -> bool {
        !self.disconnected.contains(item_type)
    }
    fn now_ms(&self) -> u64 {
        self.now_ms
    }
}

/// One operation the simulated agents ran.
#[derive(Clone, Debug, PartialEq)]
pub struct Executed {
    /// What ran.
    pub kind: OperationKind,
    /// On which item.
    pub item: ItemRef,
    /// Whether it failed.
    pub failed: bool,
}

impl Executed {
    /// "create t/a" style label.
    pub fn label(&self) -> String {
        format!("{} {}", self.kind.as_str(), self.item)
    }
}

/// Graphs, environment, scripted outcomes and the log of what ran.
pub struct World {
    pub intended: IntendedGraph,
    pub current: CurrentGraph,
    pub environment: TestEnvironment,
    pub generation: u64,
    pub log: Vec<Executed>,
    pub dirty: BTreeSet<ItemRef>,
    /// Check [`World::check_design_order`] at every dispatch (off for
    /// tests that dispatch by hand, out of the planner's order).
    pub strict_order: bool,
    scripted: HashMap<(OperationKind, ItemRef), VecDeque<Completion>>,
    next_op: u64,
}

impl World {
    /// An empty world.
    pub fn new() -> Self {
        Self {
            intended: IntendedGraph::default(),
            current: CurrentGraph::default(),
            environment: TestEnvironment::default(),
            generation: 0,
            log: Vec::new(),
            dirty: BTreeSet::new(),
            strict_order: true,
            scripted: HashMap::new(),
            next_op: 0,
        }
    }

    /// A world where `items` are intended and already created.
    pub fn converged(items: Vec<Item>) -> Self {
        let mut world = Self::new();
        world.intend(items);
        let intended: Vec<_> = world
            .intended
            .iter()
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect();
        for (key, entry) in intended {
            if !entry.item.external {
                let created =
                    crate::graph::CurrentItem::created(entry.item.clone(), entry.generation);
                world.current.insert(key, created);
            }
        }
        world.dirty.clear();
        assert!(world.is_converged(), "setup is not converged");
        world
    }

    /// Replaces the whole intent with `items` (one submit = one generation).
    pub fn intend(&mut self, items: Vec<Item>) {
        let generation = self.generation + 1;
        let mut changed = false;
        let listed: BTreeSet<ItemRef> = items.iter().map(Item::item_ref).collect();
        let removed: Vec<ItemRef> = self
            .intended
            .iter()
            .map(|(key, _)| key.clone())
            .filter(|key| !listed.contains(key))
            .collect();
        for key in removed {
            self.intended.remove(&key);
            self.dirty.insert(key);
            changed = true;
        }
        for item in items {
            let key = item.item_ref();
            let same = self
                .intended
                .get(&key)
                .is_some_and(|entry| entry.item.same_content(&item));
            if same {
                continue;
            }
            let entry = IntendedItem::compile(item, generation).expect("test predicates compile");
            self.intended.insert(entry);
            self.dirty.insert(key);
            changed = true;
        }
        if changed {
            self.generation = generation;
        }
    }

    /// Makes the next `kind` operation on `identity` end with `completion`.
    pub fn script(&mut self, kind: OperationKind, identity: &str, completion: Completion) {
        self.scripted
            .entry((kind, parse_ref(identity)))
            .or_default()
            .push_back(completion);
    }

    /// Makes the next `kind` on `identity` fail with `code`; retryable codes
    /// may retry after 1 s of simulated time.
    pub fn fail(&mut self, kind: OperationKind, identity: &str, code: i32) {
        let error = OperationError {
            code,
            message: format!("scripted failure {code}"),
        };
        let retry_at_ms = (!error.is_terminal()).then_some(self.environment.now_ms + 1_000);
        self.script(kind, identity, Completion::Failed { error, retry_at_ms });
    }

    /// Plans from the dirty set (what the engine would do on a pass): the
    /// dirty items are the seeds and the only items not converged.
    pub fn plan(&self) -> Plan {
        // Every unconverged item is a seed: no Delete an earlier pass
        // planned can be left out, whatever the answer.
        self.plan_from(&self.dirty, &self.dirty, None)
    }

    /// Plans the way a pass on one result does: from `seeds` only, with
    /// `unconverged` the items the last plans left unconverged (the
    /// planner walks upstream through those).
    pub fn plan_seeded(&self, seeds: &[&str], unconverged: &BTreeSet<ItemRef>) -> Plan {
        let everything = plan_everything(&self.intended, &self.current, &self.environment);
        self.plan_seeded_after(&everything, seeds, unconverged)
    }

    /// [`Self::plan_seeded`], with `everything` a plan over the whole
    /// world: its Deletes, planned or waiting, stand for those the passes
    /// before this one left for the engine to know.
    pub fn plan_seeded_after(
        &self,
        everything: &Plan,
        seeds: &[&str],
        unconverged: &BTreeSet<ItemRef>,
    ) -> Plan {
        let seeds: BTreeSet<ItemRef> = seeds.iter().map(|s| parse_ref(s)).collect();
        let planned = everything
            .operations
            .iter()
            .filter(|operation| operation.kind == OperationKind::Delete)
            .map(|operation| operation.item.clone());
        let waiting = everything
            .waiting
            .iter()
            .filter(|waiting| waiting.operation == OperationKind::Delete)
            .map(|waiting| waiting.item.clone());
        self.plan_from(&seeds, unconverged, Some(planned.chain(waiting).collect()))
    }

    /// Plans from `seeds`; `pending_deletes` are the Deletes earlier passes
    /// left to run (`None`: not known, any may be).
    fn plan_from(
        &self,
        seeds: &BTreeSet<ItemRef>,
        unconverged: &BTreeSet<ItemRef>,
        pending_deletes: Option<BTreeSet<ItemRef>>,
    ) -> Plan {
        struct Seeded<'a> {
            inner: &'a TestEnvironment,
            unconverged: &'a BTreeSet<ItemRef>,
            pending_deletes: Option<BTreeSet<ItemRef>>,
        }
        impl PlanEnvironment for Seeded<'_> {
            fn type_rules(&self, item_type: &str) -> Option<&TypeRules> {
                self.inner.type_rules(item_type)
            }
            fn has_configurator(&self, item_type: &str) -> bool {
                self.inner.has_configurator(item_type)
            }
            fn now_ms(&self) -> u64 {
                self.inner.now_ms
            }
            fn is_converged(&self, item: &ItemRef) -> bool {
                !self.unconverged.contains(item)
            }
            fn deletes_of_type(&self, item_type: &str) -> Vec<ItemRef> {
                // Every unconverged item of the type: a superset is fine.
                self.unconverged
                    .iter()
                    .filter(|item| &**item.item_type() == item_type)
                    .cloned()
                    .collect()
            }
            fn may_have_pending_delete(&self, item: &ItemRef) -> bool {
                self.pending_deletes
                    .as_ref()
                    .is_none_or(|pending| pending.contains(item))
            }
            fn deletes_as_before(&self, item: &ItemRef) -> bool {
                self.pending_deletes
                    .as_ref()
                    .is_some_and(|pending| pending.contains(item))
            }
        }
        let environment = Seeded {
            inner: &self.environment,
            unconverged,
            pending_deletes,
        };
        let plan = plan_operations(&self.intended, &self.current, seeds, &environment);
        check_plan_shape(&plan);
        plan
    }

    /// One dispatch round: plan, apply bookkeeping, then run every ready
    /// operation to completion in plan order, skipping any that an earlier
    /// result of the round made unready. Returns the round's plan.
    pub fn pass(&mut self) -> Plan {
        let plan = self.plan();
        self.absorb(&plan);
        let ready: Vec<usize> = plan.ready().collect();
        for index in ready {
            let operation = plan.operations[index].clone();
            let now = self.plan();
            let still_ready = now.ready().any(|i| {
                now.operations[i].item == operation.item && now.operations[i].kind == operation.kind
            });
            if still_ready {
                self.dispatch(&operation.item, operation.kind, operation.target_generation);
                self.finish(&operation.item, operation.kind);
            }
        }
        plan
    }

    /// Applies a plan's bookkeeping and remembers what is unconverged.
    pub fn absorb(&mut self, plan: &Plan) {
        apply_bookkeeping(&mut self.current, plan);
        self.dirty = plan.unconverged.clone();
        for (item, _) in &plan.forget {
            self.dirty.insert(item.clone());
            for dependent in self.current.dependents_of(item) {
                self.dirty.insert(dependent.clone());
            }
        }
    }

    /// Starts `kind` on `item`, checking the ordering invariants first.
    pub fn dispatch(&mut self, item: &ItemRef, kind: OperationKind, target_generation: u64) {
        self.check_invariants_before(item, kind);
        self.next_op += 1;
        let in_flight = InFlight::new(
            kind,
            format!("op-{}", self.next_op),
            1,
            target_generation,
            self.environment.now_ms,
            60_000,
        );
        begin_operation(&mut self.current, &self.intended, item, in_flight);
        self.dirty.insert(item.clone());
    }

    /// Finishes the operation in flight on `item` with its scripted outcome
    /// (success when nothing is scripted).
    pub fn finish(&mut self, item: &ItemRef, kind: OperationKind) {
        let completion = self
            .scripted
            .get_mut(&(kind, item.clone()))
            .and_then(VecDeque::pop_front)
            .unwrap_or(Completion::Done { observed: None });
        let failed = matches!(completion, Completion::Failed { .. });
        assert!(complete_operation(&mut self.current, item, completion));
        self.log.push(Executed {
            kind,
            item: item.clone(),
            failed,
        });
        self.dirty.insert(item.clone());
        let neighbours: Vec<ItemRef> = self
            .current
            .dependents_of(item)
            .chain(self.intended.dependents_of(item))
            .cloned()
            .collect();
        self.dirty.extend(neighbours);
    }

    /// Runs rounds until one plans no operation (at most `max_rounds`).
    /// Returns the number of rounds that ran operations.
    pub fn run_to_quiescence(&mut self, max_rounds: usize) -> usize {
        for round in 0..max_rounds {
            let plan = self.pass();
            if plan.operations.is_empty() {
                return round;
            }
        }
        let plan = self.plan();
        panic!(
            "no quiescence after {max_rounds} rounds; {} operations and {} waiting items remain",
            plan.operations.len(),
            plan.waiting.len()
        );
    }

    /// Labels of everything executed so far ("create t/a", ...).
    pub fn labels(&self) -> Vec<String> {
        self.log.iter().map(Executed::label).collect()
    }

    /// Whether every intended, non-external item is created with its
    /// intended value (and may hold no other) and nothing else exists.
    pub fn is_converged(&self) -> bool {
        let intended_ok = self.intended.iter().all(|(key, entry)| {
            entry.item.external
                || self.current.get(key).is_some_and(|current| {
                    current.state == crate::graph::ItemState::Created
                        && current.holds_only(&entry.item)
                })
        });
        let nothing_extra = self.current.iter().all(|(key, current)| {
            self.intended.get(key).is_some()
                || current
                    .applied
                    .as_ref()
                    .is_some_and(|applied| applied.external)
        });
        intended_ok && nothing_extra
    }

    /// Reports an external item (as ReportExternal would).
    pub fn report_external(&mut self, identity: &str, properties: serde_json::Value) {
        let mut external = item(identity, properties);
        external.external = true;
        let key = external.item_ref();
        let entry = crate::graph::CurrentItem::created(std::sync::Arc::new(external), 0);
        self.current.insert(key.clone(), entry);
        self.mark_changed(&key);
    }

    /// Moves `identity`'s modification counter, as a completed Modify or
    /// a report marking an external item modified does (DESIGN 3, rule 4).
    pub fn mark_modified(&mut self, identity: &str) {
        let key = parse_ref(identity);
        let mut modified = (**self.current.get(&key).expect("the item exists")).clone();
        modified.modifications += 1;
        self.current.insert(key.clone(), modified);
        self.dirty.insert(key);
    }

    /// Removes an external item's report.
    pub fn remove_external(&mut self, identity: &str) {
        let key = parse_ref(identity);
        self.current.remove(&key);
        self.mark_changed(&key);
    }

    fn mark_changed(&mut self, key: &ItemRef) {
        self.dirty.insert(key.clone());
        let neighbours: Vec<ItemRef> = self
            .current
            .dependents_of(key)
            .chain(self.intended.dependents_of(key))
            .cloned()
            .collect();
        self.dirty.extend(neighbours);
    }

    /// Ordering invariants checked at every dispatch (property (b)).
    /// A dependent of `item` that may exist or is busy: a Delete of `item`
    /// waits for it (DESIGN 3).
    pub fn dependent_in_the_way(&self, item: &ItemRef) -> Option<(&ItemRef, &CurrentItem)> {
        self.current.dependents_of(item).find_map(|dependent| {
            self.current
                .get(dependent)
                .filter(|d| d.may_exist() || d.is_busy())
                .map(|d| (dependent, &**d))
        })
    }

    /// Ordering rules of DESIGN 3 beyond "dependencies exist, dependents
    /// gone", checked at every dispatch:
    /// - a Create or Modify waits for any planned, in-flight or failed
    ///   Modify (or recreate) of an intended item it depends on (DESIGN 2,
    ///   "satisfied"; rule 8);
    /// - a Modify waits for operations in flight on its dependents (rule 8);
    /// - a Modify runs only once every dependent that may exist and whose
    ///   held value has a predicate on the item holds it for the new value
    ///   (rule 6), or has a `recreate_when_modified` edge on it (rule 4,
    ///   deleted before the Modify: docs/planning.md).
    pub fn check_design_order(&self, item: &ItemRef, kind: OperationKind) {
        if !matches!(kind, OperationKind::Create | OperationKind::Modify) {
            return;
        }
        let Some(entry) = self.intended.get(item) else {
            return;
        };
        for dependency in &entry.item.dependencies {
            let Some(required) = self.intended.get(&dependency.requires) else {
                continue;
            };
            if required.item.external {
                continue;
            }
            let current = self.current.get(&dependency.requires);
            assert!(
                current.is_some_and(|c| c.holds_only(&required.item)),
                "{} {item} dispatched while its dependency {} still needs an operation: {:?}",
                kind.as_str(),
                dependency.requires,
                current
            );
            assert!(
                !current.is_some_and(|c| c.has_failed_modify()),
                "{} {item} dispatched while its dependency {} has a failed Modify",
                kind.as_str(),
                dependency.requires,
            );
        }
        if kind != OperationKind::Modify {
            return;
        }
        // What the agent observed beyond the applied value stays (a state
        // it reports); the Modify sets the rest.
        let new_properties =
            crate::graph::properties_after_modify(self.current.get(item), &entry.item.properties)
                .into_owned();
        for dependent in self.current.dependents_of(item) {
            let Some(state) = self.current.get(dependent) else {
                continue;
            };
            // A dependent's Create or Modify that drops the edge may run
            // beside the item's Modify: both are ready in one plan, and
            // rule 1 orders Modifies by the intended edges only.
            let drops_edge = state.state != crate::graph::ItemState::Unknown
                && state.in_flight.as_ref().is_some_and(|operation| {
                    operation.kind != OperationKind::Delete
                        && operation
                            .target
                            .as_ref()
                            .is_some_and(|target| target.dependency_on(item).is_none())
                });
            assert!(
                !state.operation_runs() || state.only_a_read_runs() || drops_edge,
                "modify {item} dispatched while an operation runs on its dependent {dependent}: \
                 {state:?}"
            );
            if !state.may_exist() {
                continue;
            }
            for value in state.values() {
                let Some(edge) = value.dependency_on(item) else {
                    continue;
                };
                // Where the intent drops the flag, DESIGN does not say
                // which value's flag counts: only both together are checked.
                let still_asks = self.intended.get(dependent).is_some_and(|intended| {
                    intended
                        .item
                        .dependency_on(item)
                        .is_some_and(|edge| edge.recreate_when_modified())
                });
                assert!(
                    !(edge.recreate_when_modified() && still_asks),
                    "modify {item} dispatched while its recreate_when_modified dependent \
                     {dependent} exists"
                );
                if edge.must_satisfy().is_empty() {
                    continue;
                }
                let predicate = crate::graph::Predicate::compile(edge.must_satisfy())
                    .expect("test predicates compile");
                assert_eq!(
                    predicate.evaluate(&new_properties),
                    Ok(true),
                    "modify {item} dispatched while its dependent {dependent} holds a predicate \
                     ({}) the new value breaks",
                    edge.must_satisfy()
                );
            }
        }
    }

    /// The ordering checks of [`World::dispatch`] for an operation another
    /// driver (the executor) has just started on `item`: everything but
    /// "nothing else runs on the item itself".
    pub fn check_started(
        intended: &IntendedGraph,
        current: &CurrentGraph,
        item: &ItemRef,
        kind: OperationKind,
    ) {
        let mut world = Self::new();
        world.intended = intended.clone();
        world.current = current.clone();
        let mut idle = (**current.get(item).expect("the started item")).clone();
        idle.in_flight = None;
        idle.state = if idle.applied.is_some() {
            crate::graph::ItemState::Created
        } else {
            crate::graph::ItemState::Pending
        };
        world.current.insert(item.clone(), idle);
        world.check_invariants_before(item, kind);
    }

    fn check_invariants_before(&self, item: &ItemRef, kind: OperationKind) {
        match kind {
            OperationKind::Create | OperationKind::Modify => {
                let entry = self
                    .intended
                    .get(item)
                    .expect("operations target intended items");
                for (index, dependency) in entry.item.dependencies.iter().enumerate() {
                    let required = self.current.get(&dependency.requires);
                    assert!(
                        required.is_some_and(|r| r.is_created() && !r.is_busy()),
                        "{} {item} dispatched before {} was created: {:?}",
                        kind.as_str(),
                        dependency.requires,
                        required
                    );
                    if let (Some(predicate), Some(required)) =
                        (entry.predicates.get(index), required)
                    {
                        assert_eq!(
                            predicate.evaluate(&required.effective_properties()),
                            Ok(true),
                            "{} {item} dispatched with a false predicate on {}",
                            kind.as_str(),
                            dependency.requires
                        );
                    }
                }
            }
            OperationKind::Delete => {
                if let Some((dependent, state)) = self.dependent_in_the_way(item) {
                    panic!(
                        "delete {item} dispatched while its dependent {dependent} exists: {state:?}"
                    );
                }
            }
            OperationKind::Read => {}
        }
        if self.strict_order {
            self.check_design_order(item, kind);
        }
        assert!(
            !self.current.get(item).is_some_and(|c| c.is_busy()),
            "{} {item} dispatched while another operation runs on it",
            kind.as_str()
        );
    }
}
