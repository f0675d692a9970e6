//! Randomized end to end: a seeded generator builds a random DAG of 8–15
//! items over 2–3 types and edits it at random (items added and removed,
//! properties changed, dependencies added, removed and flagged, always
//! acyclic); every edit is submitted to the real binary, served by an SDK
//! agent that checks the safety of each operation as it arrives:
//!
//! - a Create or Modify only when every dependency of the value it applies
//!   exists on the agent's side, with nothing in flight on it;
//! - a Modify only when no dependent has an operation in flight, and with the
//!   `previous` value the agent holds;
//! - a Delete only when no existing item depends on it.
//!
//! After every edit the tenant must become Ready; then the agent's world must
//! equal the intent (same items, same properties, same dependencies) and so
//! must GetGraph's current graph. A failure names its seed; rerun one seed
//! with `RANDOMIZED_SEED=<seed>`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng as _, SeedableRng as _};
use reconciled_client::agent::{
    Configurator, Item, ItemRef, OperationContext, OperationKind, Outcome, TypeSpec,
};
use reconciled_tests::agents::{DEADLINE, RunningAgent, TestTenant, condition, condition_holds};
use reconciled_tests::api;
use reconciled_tests::proto::v1;
use serde_json::{Map, Value, json};

/// How long one seed may keep editing; the edit that runs over finishes.
const BUDGET: Duration = Duration::from_secs(20);

/// The most edits per seed.
const EDITS: usize = 200;

/// Bounds on the number of intended items.
const MIN_ITEMS: usize = 8;
const MAX_ITEMS: usize = 15;

/// The item types; a seed uses the first two or all three. `beta` items are
/// recreated when their `/id` changes.
const TYPES: [&str; 3] = ["alpha", "beta", "gamma"];

#[tokio::test]
async fn random_dags_and_edits_converge_safely_seed_1() {
    run(seed_or(0x5EED_0001)).await;
}

#[tokio::test]
async fn random_dags_and_edits_converge_safely_seed_2() {
    run(seed_or(0xC0FF_EE02)).await;
}

#[tokio::test]
async fn random_dags_and_edits_converge_safely_seed_3() {
    run(seed_or(0x0BAD_F00D)).await;
}

/// `RANDOMIZED_SEED` if set (to rerun one failing seed), else `seed`.
fn seed_or(seed: u64) -> u64 {
    std::env::var("RANDOMIZED_SEED")
        .ok()
        .and_then(|s| {
            let s = s.trim();
            s.strip_prefix("0x")
                .map_or_else(|| s.parse().ok(), |hex| u64::from_str_radix(hex, 16).ok())
        })
        .unwrap_or(seed)
}

/// Prints the seed if the test panics.
struct SeedGuard(u64);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "randomized test failed with seed {:#x}; rerun it with RANDOMIZED_SEED={:#x}",
                self.0, self.0
            );
        }
    }
}

// ---------------------------------------------------------------------------
// The intent model
// ---------------------------------------------------------------------------

/// One dependency of a model item.
#[derive(Debug, Clone, PartialEq)]
struct Edge {
    recreate_when_modified: bool,
    must_satisfy: String,
}

/// One intended item. Dependencies only point to items of lower rank, so
/// the graph stays acyclic whatever the edits.
#[derive(Debug, Clone, PartialEq)]
struct Node {
    rank: u32,
    item_type: &'static str,
    name: String,
    properties: Map<String, Value>,
    requires: BTreeMap<String, Edge>,
}

impl Edge {
    /// ` (recreate_when_modified, must_satisfy ...)`, or nothing.
    fn describe(&self) -> String {
        let mut flags = Vec::new();
        if self.recreate_when_modified {
            flags.push("recreate_when_modified".to_owned());
        }
        if !self.must_satisfy.is_empty() {
            flags.push(format!("must_satisfy {}", self.must_satisfy));
        }
        if flags.is_empty() {
            String::new()
        } else {
            format!(" ({})", flags.join(", "))
        }
    }
}

impl Node {
    fn reference(&self) -> String {
        format!("{}/{}", self.item_type, self.name)
    }

    /// `[a/b, c/d (recreate_when_modified)]`.
    fn describe_requires(&self) -> String {
        let edges: Vec<String> = self
            .requires
            .iter()
            .map(|(reference, edge)| format!("{reference}{}", edge.describe()))
            .collect();
        format!("[{}]", edges.join(", "))
    }

    fn to_proto(&self) -> v1::Item {
        let mut item = api::item(
            self.item_type,
            &self.name,
            Value::Object(self.properties.clone()),
        );
        item.dependencies = self
            .requires
            .iter()
            .map(|(reference, edge)| {
                let (item_type, name) =
                    reference.split_once('/').expect("references are type/name");
                let mut dependency = api::dependency(item_type, name);
                dependency.recreate_when_modified = edge.recreate_when_modified;
                dependency.must_satisfy = edge.must_satisfy.clone();
                dependency
            })
            .collect();
        item
    }
}

/// The intended graph and the generator that edits it.
struct Model {
    rng: StdRng,
    types: Vec<&'static str>,
    nodes: BTreeMap<String, Node>,
    next_rank: u32,
}

impl Model {
    fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let types = TYPES[..rng.random_range(2..=3)].to_vec();
        let mut model = Self {
            rng,
            types,
            nodes: BTreeMap::new(),
            next_rank: 0,
        };
        let count = model.rng.random_range(MIN_ITEMS..=MAX_ITEMS);
        while model.nodes.len() < count {
            model.add_node();
        }
        model
    }

    fn intent(&self) -> Vec<v1::Item> {
        self.nodes.values().map(Node::to_proto).collect()
    }

    fn random_properties(&mut self) -> Map<String, Value> {
        let mut properties = Map::new();
        properties.insert(
            "v".into(),
            json!(format!("v{}", self.rng.random_range(0..5))),
        );
        properties.insert(
            "id".into(),
            json!(format!("i{}", self.rng.random_range(0..3))),
        );
        properties
    }

    fn random_edge(&mut self) -> Edge {
        Edge {
            recreate_when_modified: self.rng.random_bool(0.2),
            must_satisfy: if self.rng.random_bool(0.2) {
                "self.v != \"\"".into()
            } else {
                String::new()
            },
        }
    }

    fn add_node(&mut self) {
        let rank = self.next_rank;
        self.next_rank += 1;
        let item_type = *self.types.choose(&mut self.rng).expect("types");
        let name = format!("n{rank:02}");
        let properties = self.random_properties();
        let candidates: Vec<String> = self.nodes.keys().cloned().collect();
        let mut requires = BTreeMap::new();
        for candidate in candidates {
            if requires.len() < 3 && self.rng.random_bool(0.25) {
                let edge = self.random_edge();
                requires.insert(candidate, edge);
            }
        }
        let node = Node {
            rank,
            item_type,
            name,
            properties,
            requires,
        };
        self.nodes.insert(node.reference(), node);
    }

    fn random_key(&mut self) -> String {
        let keys: Vec<&String> = self.nodes.keys().collect();
        (*keys
            .choose(&mut self.rng)
            .expect("the graph is never empty"))
        .clone()
    }

    /// Applies 1–3 random edits; returns what they were. Never leaves the
    /// intent unchanged.
    fn edit(&mut self) -> Vec<String> {
        let before = self.nodes.clone();
        let mut done = Vec::new();
        let edits = self.rng.random_range(1..=3);
        while done.len() < edits || self.nodes == before {
            if let Some(what) = self.one_edit() {
                done.push(what);
            }
        }
        done
    }

    fn one_edit(&mut self) -> Option<String> {
        match self.rng.random_range(0..7) {
            0 if self.nodes.len() < MAX_ITEMS => {
                self.add_node();
                let added = self
                    .nodes
                    .values()
                    .max_by_key(|n| n.rank)
                    .expect("just added");
                Some(format!(
                    "add {} needing {}",
                    added.reference(),
                    added.describe_requires()
                ))
            }
            1 if self.nodes.len() > MIN_ITEMS => {
                let removed = self.random_key();
                self.nodes.remove(&removed);
                let mut retargeted = Vec::new();
                for node in self.nodes.values_mut() {
                    if node.requires.remove(&removed).is_some() {
                        retargeted.push(node.reference());
                    }
                }
                Some(format!("remove {removed} (dropped from {retargeted:?})"))
            }
            2 | 3 => {
                let key = self.random_key();
                let property = if self.rng.random_bool(0.5) { "v" } else { "id" };
                let value = if property == "v" {
                    format!("v{}", self.rng.random_range(0..5))
                } else {
                    format!("i{}", self.rng.random_range(0..3))
                };
                let node = self.nodes.get_mut(&key).expect("a key of the graph");
                node.properties.insert(property.into(), json!(value));
                Some(format!("set {key} {property}={value}"))
            }
            4 => {
                let from = self.random_key();
                let to = self.random_key();
                let (from_rank, to_rank) = (self.nodes[&from].rank, self.nodes[&to].rank);
                if from_rank <= to_rank
                    || self.nodes[&from].requires.contains_key(&to)
                    || self.nodes[&from].requires.len() >= 3
                {
                    return None;
                }
                let edge = self.random_edge();
                let flags = edge.describe();
                self.nodes
                    .get_mut(&from)
                    .expect("a key of the graph")
                    .requires
                    .insert(to.clone(), edge);
                Some(format!("{from} now needs {to}{flags}"))
            }
            5 => {
                let from = self.random_key();
                let node = self.nodes.get_mut(&from).expect("a key of the graph");
                let to = node.requires.keys().next().cloned()?;
                node.requires.remove(&to);
                Some(format!("{from} no longer needs {to}"))
            }
            6 => {
                let from = self.random_key();
                let node = self.nodes.get_mut(&from).expect("a key of the graph");
                let (to, edge) = node.requires.iter_mut().next_back()?;
                edge.recreate_when_modified = !edge.recreate_when_modified;
                Some(format!(
                    "{from} -> {to} recreate_when_modified={}",
                    edge.recreate_when_modified
                ))
            }
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------
// The checking agent
// ---------------------------------------------------------------------------

/// One item as it exists on the agent's side.
#[derive(Debug, Clone)]
struct Existing {
    properties: Map<String, Value>,
    /// What it depends on: while a Modify runs, its old and new dependencies
    /// alike (neither may be deleted meanwhile).
    requires: BTreeSet<ItemRef>,
    /// While a Modify runs, the dependencies of the value it applies.
    target: Option<BTreeSet<ItemRef>>,
    /// The operation running on it, if any.
    busy: Option<OperationKind>,
}

#[derive(Debug, Default)]
struct World {
    items: HashMap<ItemRef, Existing>,
    violations: Vec<String>,
    operations: usize,
}

impl World {
    fn violation(&mut self, message: String) {
        self.violations.push(message);
    }

    /// Checks that `requires` all exist, idle, for an operation on `item`.
    fn check_dependencies(&mut self, kind: OperationKind, item: &ItemRef, requires: &[ItemRef]) {
        for dependency in requires {
            match self.items.get(dependency).map(|e| e.busy) {
                None => self.violation(format!(
                    "{kind} {item} while its dependency {dependency} does not exist"
                )),
                Some(Some(busy)) => self.violation(format!(
                    "{kind} {item} while its dependency {dependency} has a {busy} in flight"
                )),
                Some(None) => {}
            }
        }
    }

    /// The items that depend on `item` (existing or in flight).
    fn dependents(&self, item: &ItemRef) -> Vec<(ItemRef, Option<OperationKind>)> {
        self.dependents_by(item, |existing| &existing.requires)
    }

    /// The items that depend on `item` in the value they have or are being
    /// moved to: an item whose Modify drops `item` no longer counts.
    fn target_dependents(&self, item: &ItemRef) -> Vec<(ItemRef, Option<OperationKind>)> {
        self.dependents_by(item, |existing| {
            existing.target.as_ref().unwrap_or(&existing.requires)
        })
    }

    fn dependents_by(
        &self,
        item: &ItemRef,
        edges: impl Fn(&Existing) -> &BTreeSet<ItemRef>,
    ) -> Vec<(ItemRef, Option<OperationKind>)> {
        let mut dependents: Vec<_> = self
            .items
            .iter()
            .filter(|(_, existing)| edges(existing).contains(item))
            .map(|(reference, existing)| (reference.clone(), existing.busy))
            .collect();
        dependents.sort_by(|a, b| a.0.cmp(&b.0));
        dependents
    }
}

/// A configurator that applies operations to its own [`World`] and records
/// every unsafe operation it is asked for. Answers `DONE` after a short
/// random pause (simulated work, so that parallel operations overlap).
#[derive(Debug)]
struct SafetyAgent {
    world: Mutex<World>,
    pauses: Mutex<StdRng>,
}

impl SafetyAgent {
    fn new(seed: u64) -> Self {
        Self {
            world: Mutex::new(World::default()),
            pauses: Mutex::new(StdRng::seed_from_u64(seed ^ 0xA5A5_A5A5)),
        }
    }

    fn world(&self) -> MutexGuard<'_, World> {
        self.world
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn pause(&self) {
        let micros = self
            .pauses
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .random_range(0..3_000);
        tokio::time::sleep(Duration::from_micros(micros)).await;
    }
}

fn requires_of(item: &Item) -> Vec<ItemRef> {
    item.dependencies
        .iter()
        .map(|d| d.requires.clone())
        .collect()
}

impl Configurator for SafetyAgent {
    async fn create(&self, _ctx: &OperationContext, item: &Item) -> Outcome {
        let reference = item.item_ref();
        let requires = requires_of(item);
        {
            let mut world = self.world();
            world.operations += 1;
            if world.items.contains_key(&reference) {
                world.violation(format!("create {reference} which already exists"));
            }
            world.check_dependencies(OperationKind::Create, &reference, &requires);
            world.items.insert(
                reference.clone(),
                Existing {
                    properties: item.properties.clone(),
                    requires: requires.into_iter().collect(),
                    target: None,
                    busy: Some(OperationKind::Create),
                },
            );
        }
        self.pause().await;
        if let Some(existing) = self.world().items.get_mut(&reference) {
            existing.busy = None;
        }
        Outcome::done()
    }

    async fn modify(&self, _ctx: &OperationContext, previous: &Item, item: &Item) -> Outcome {
        let reference = item.item_ref();
        let requires = requires_of(item);
        {
            let mut world = self.world();
            world.operations += 1;
            match world.items.get(&reference).cloned() {
                None => world.violation(format!("modify {reference} which does not exist")),
                Some(existing) => {
                    if let Some(busy) = existing.busy {
                        world.violation(format!("modify {reference} while its {busy} runs"));
                    }
                    if existing.properties != previous.properties {
                        world.violation(format!(
                            "modify {reference} from {:?}, but it holds {:?}",
                            previous.properties, existing.properties
                        ));
                    }
                }
            }
            world.check_dependencies(OperationKind::Modify, &reference, &requires);
            for (dependent, busy) in world.target_dependents(&reference) {
                if let Some(busy) = busy {
                    world.violation(format!(
                        "modify {reference} while its dependent {dependent} has a {busy} in \
                         flight"
                    ));
                }
            }
            if let Some(existing) = world.items.get_mut(&reference) {
                // While the modify runs the item relies on old and new
                // dependencies alike.
                existing.requires.extend(requires.iter().cloned());
                existing.target = Some(requires.iter().cloned().collect());
                existing.busy = Some(OperationKind::Modify);
            }
        }
        self.pause().await;
        if let Some(existing) = self.world().items.get_mut(&reference) {
            existing.properties = item.properties.clone();
            existing.requires = requires.into_iter().collect();
            existing.target = None;
            existing.busy = None;
        }
        Outcome::done()
    }

    async fn delete(&self, _ctx: &OperationContext, item: &Item) -> Outcome {
        let reference = item.item_ref();
        {
            let mut world = self.world();
            world.operations += 1;
            match world.items.get(&reference).map(|e| e.busy) {
                None => world.violation(format!("delete {reference} which does not exist")),
                Some(Some(busy)) => {
                    world.violation(format!("delete {reference} while its {busy} runs"));
                }
                Some(None) => {}
            }
            let dependents = world.dependents(&reference);
            if !dependents.is_empty() {
                world.violation(format!(
                    "delete {reference} while {dependents:?} depend on it"
                ));
            }
            if let Some(existing) = world.items.get_mut(&reference) {
                existing.busy = Some(OperationKind::Delete);
            }
        }
        self.pause().await;
        self.world().items.remove(&reference);
        Outcome::done()
    }
}

// ---------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------

async fn run(seed: u64) {
    let _guard = SeedGuard(seed);
    let mut model = Model::new(seed);
    let tenant = TestTenant::start("acme").await;
    let agent = Arc::new(SafetyAgent::new(seed));
    let mut builder = tenant.agent("agent-1");
    for item_type in &model.types {
        let mut spec = TypeSpec::new(*item_type).retry_static(Duration::from_millis(100));
        if *item_type == "beta" {
            spec = spec.recreate_on_change(["/id"]);
        }
        builder = builder.item_type(spec, Arc::clone(&agent));
    }
    let mut running = RunningAgent::start(builder);
    running.connected().await;

    let started = tokio::time::Instant::now();
    let mut history: Vec<String> = vec![format!(
        "initial graph over {:?}: {:?}",
        model.types,
        model
            .nodes
            .values()
            .map(|n| format!("{} needing {}", n.reference(), n.describe_requires()))
            .collect::<Vec<_>>()
    )];
    let mut edits = 0;
    loop {
        let response = tenant.submit(model.intent()).await;
        let context = Context {
            seed,
            step: edits,
            history: &history,
        };
        assert!(
            response.changed,
            "{}: the edit changed nothing: {response:#?}",
            context.header()
        );
        wait_ready(&tenant, &agent, &context, response.generation).await;
        check_world(&model, &agent, &context);
        check_current(&tenant, &model, &context).await;

        edits += 1;
        if edits > EDITS || started.elapsed() >= BUDGET {
            break;
        }
        let what = model.edit();
        history.push(format!("edit {edits}: {}", what.join("; ")));
    }
    eprintln!(
        "seed {seed:#x}: {edits} intents converged safely in {:?}, {} operations",
        started.elapsed(),
        agent.world().operations
    );
}

/// What a failure message says about where it happened.
struct Context<'a> {
    seed: u64,
    step: usize,
    history: &'a [String],
}

impl Context<'_> {
    fn header(&self) -> String {
        format!(
            "seed {:#x}, after edit {} (history: {:#?})",
            self.seed, self.step, self.history
        )
    }
}

async fn wait_ready(
    tenant: &TestTenant,
    agent: &SafetyAgent,
    context: &Context<'_>,
    generation: u64,
) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let status = tenant.status().await;
        let quiescent = condition(&status, "Reconciling")
            .is_some_and(|c| c.status == v1::ConditionStatus::False as i32)
            && status.operations_in_flight == 0;
        if status.observed_generation >= generation
            && quiescent
            && condition_holds(&status, "Ready")
        {
            return;
        }
        let violations = agent.world().violations.clone();
        assert!(
            violations.is_empty(),
            "{}: unsafe operations: {violations:#?}",
            context.header()
        );
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "{}: the tenant did not become Ready at generation {generation} within \
                 {DEADLINE:?}; last status: {status:#?}; current graph: {:#?}",
                context.header(),
                tenant.current().await
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn check_world(model: &Model, agent: &SafetyAgent, context: &Context<'_>) {
    let world = agent.world();
    assert!(
        world.violations.is_empty(),
        "{}: unsafe operations: {:#?}",
        context.header(),
        world.violations
    );
    let mut want: BTreeMap<String, (Map<String, Value>, BTreeSet<String>)> = BTreeMap::new();
    for node in model.nodes.values() {
        want.insert(
            node.reference(),
            (
                node.properties.clone(),
                node.requires.keys().cloned().collect(),
            ),
        );
    }
    let mut have: BTreeMap<String, (Map<String, Value>, BTreeSet<String>)> = BTreeMap::new();
    for (reference, existing) in &world.items {
        assert!(
            existing.busy.is_none(),
            "{}: {reference} still has a {:?} running on a Ready tenant",
            context.header(),
            existing.busy
        );
        have.insert(
            reference.to_string(),
            (
                existing.properties.clone(),
                existing.requires.iter().map(ToString::to_string).collect(),
            ),
        );
    }
    assert_eq!(
        have,
        want,
        "{}: the agent's world differs from the intent",
        context.header()
    );
}

async fn check_current(tenant: &TestTenant, model: &Model, context: &Context<'_>) {
    let current = tenant.current().await;
    let mut have = BTreeMap::new();
    for status in &current {
        let reference = status
            .r#ref
            .as_ref()
            .map(|r| format!("{}/{}", r.r#type, r.name))
            .unwrap_or_default();
        assert_eq!(
            (status.state, status.operation.as_ref()),
            (v1::ItemState::Created as i32, None),
            "{}: {reference} on a Ready tenant: {status:#?}",
            context.header()
        );
        let applied = status.applied.clone().unwrap_or_default();
        let properties = applied
            .properties
            .map(reconciled_tests::proto::json::properties_from_struct)
            .unwrap_or_default();
        let requires: BTreeSet<String> = applied
            .dependencies
            .iter()
            .filter_map(|d| d.requires.as_ref())
            .map(|r| format!("{}/{}", r.r#type, r.name))
            .collect();
        have.insert(reference, (properties, requires));
    }
    let want: BTreeMap<String, (Map<String, Value>, BTreeSet<String>)> = model
        .nodes
        .values()
        .map(|node| {
            (
                node.reference(),
                (
                    node.properties.clone(),
                    node.requires.keys().cloned().collect(),
                ),
            )
        })
        .collect();
    assert_eq!(
        have,
        want,
        "{}: GetGraph's current graph differs from the intent",
        context.header()
    );
}
