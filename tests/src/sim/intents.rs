//! What a run works with: the scenario fixed by its seed (item types and
//! their specs, a pool of identities in a fixed dependency order, agents),
//! the generator of intents over it, and the model of the acknowledged
//! intent that submits are checked against.
//!
//! Dependencies only ever point to identities earlier in the pool's order,
//! so no generated intent, however submits and subgraphs combine, has a
//! cycle.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use reconciled::engine::exec::{RetryPolicy, TypeSpec};
use reconciled::graph::{Dependency, Item, ItemRef, Properties, subgraph_contains};
use serde_json::json;

/// An identity of the pool: an item type and name, and whether the item
/// is external (fixed for the whole run).
#[derive(Clone, Debug)]
pub struct Identity {
    /// `type/name`.
    pub item: ItemRef,
    /// Reported by ReportExternal, never operated on.
    pub external: bool,
}

/// An agent of the scenario and the item types it registers.
#[derive(Clone, Debug)]
pub struct AgentPlan {
    /// Its stable agent id.
    pub id: String,
    /// Indexes into [`Scenario::types`].
    pub types: Vec<usize>,
}

/// Everything a seed fixes before the first step.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The run's seed.
    pub seed: u64,
    /// Item types as the agents register them.
    pub types: Vec<TypeSpec>,
    /// Identities in dependency order: an item only depends on earlier ones.
    pub pool: Vec<Identity>,
    /// The agents; each type belongs to exactly one.
    pub agents: Vec<AgentPlan>,
    /// The tenant's limit of operations in flight (0: none).
    pub max_operations_in_flight: u64,
    /// The owner's cancel timeout.
    pub cancel_timeout_ms: u64,
    /// The owner's periodic resync interval.
    pub resync_interval_ms: u64,
    /// An agent that stays down for good in the final phase (VOPR's
    /// liveness phase): everything its types do not hold up must still
    /// converge. Drawn apart from the scenario's generator, so that a seed's
    /// steps do not depend on it.
    pub down_for_good: Option<usize>,
}

/// Predicates dependencies may carry: over properties the generator flips.
/// The last one reads a field no item has: it never holds (an evaluation
/// error counts as false).
const PREDICATES: &[&str] = &[
    "self.state == \"up\"",
    "self.mtu >= 1500",
    "has(self.vlan) && self.vlan.id >= 2",
    "self.v != 3",
    "self.nosuch == 1",
];

/// Subgraph paths items are listed in, and the scopes of subgraph submits.
const SUBGRAPHS: &[&str] = &["", "a", "a/b", "c"];
const SCOPES: &[&str] = &["a", "c"];

impl Scenario {
    /// The scenario of `seed`.
    pub fn generate(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5ce7_a110);
        let type_count = rng.random_range(2..=4);
        let types: Vec<TypeSpec> = (0..type_count).map(|i| type_spec(&mut rng, i)).collect();
        let pool_size = rng.random_range(5..=20);
        let external_count = rng.random_range(0..=3usize.min(pool_size / 3));
        let mut pool: Vec<Identity> = (0..pool_size)
            .map(|i| {
                let spec = types
                    .choose(&mut rng)
                    .map_or("t0", |s| s.item_type.as_str());
                Identity {
                    item: ItemRef::new(spec, format!("n{i}")),
                    external: false,
                }
            })
            .collect();
        // Externals sit early in the order, so that many items can depend
        // on them.
        for identity in pool.iter_mut().take(external_count * 2).step_by(2) {
            identity.external = true;
        }
        let agent_count = rng.random_range(1..=type_count.min(3));
        let mut agents: Vec<AgentPlan> = (0..agent_count)
            .map(|i| AgentPlan {
                id: format!("agent-{i}"),
                types: Vec::new(),
            })
            .collect();
        for index in 0..type_count {
            let owner = if index < agent_count {
                index
            } else {
                rng.random_range(0..agent_count)
            };
            agents[owner].types.push(index);
        }
        // A third of the scenarios with two agents or more keep one down.
        let draw = splitmix(seed ^ 0xd0_77_f0_9d);
        let down_for_good =
            (agent_count >= 2 && draw.is_multiple_of(3)).then(|| (draw / 3) as usize % agent_count);
        Self {
            seed,
            types,
            pool,
            agents,
            down_for_good,
            max_operations_in_flight: if rng.random_bool(0.3) {
                rng.random_range(2..=6)
            } else {
                0
            },
            cancel_timeout_ms: rng.random_range(5..=60) * 1_000,
            resync_interval_ms: if rng.random_bool(0.7) {
                600_000
            } else {
                3_600_000
            },
        }
    }

    /// The item types of the agent that stays down for good, if any.
    pub fn down_types(&self) -> std::collections::BTreeSet<String> {
        self.down_for_good
            .and_then(|agent| self.agents.get(agent))
            .into_iter()
            .flat_map(|agent| agent.types.iter())
            .filter_map(|index| self.types.get(*index))
            .map(|spec| spec.item_type.clone())
            .collect()
    }

    /// The spec of `item_type`, if the scenario has it.
    pub fn spec(&self, item_type: &str) -> Option<&TypeSpec> {
        self.types.iter().find(|spec| spec.item_type == item_type)
    }

    /// The pool's rank of `item` (its position in dependency order).
    pub fn rank(&self, item: &ItemRef) -> Option<usize> {
        self.pool.iter().position(|identity| identity.item == *item)
    }

    /// The identities that are external.
    pub fn externals(&self) -> impl Iterator<Item = &Identity> {
        self.pool.iter().filter(|identity| identity.external)
    }

    /// The longest wait of any retry policy, operation timeout or the
    /// cancel timeout: a tenant that stays silent longer than this is quiet.
    pub fn longest_wait_ms(&self) -> u64 {
        self.types
            .iter()
            .map(|spec| spec.retry.max_delay_ms().max(spec.operation_timeout_ms))
            .chain(Some(self.cancel_timeout_ms))
            .max()
            .unwrap_or(60_000)
    }
}

fn type_spec(rng: &mut StdRng, index: usize) -> TypeSpec {
    let mut spec = TypeSpec::new(format!("t{index}"));
    spec.recreate_on_change = match rng.random_range(0..10) {
        0..=4 => Vec::new(),
        5..=6 => vec!["/vlan".into()],
        7 => vec!["/mtu".into(), "/vlan/id".into()],
        _ => vec!["*".into()],
    };
    spec.ask_needs_recreate = rng.random_bool(0.25);
    spec.supports_read = rng.random_bool(0.4);
    spec.retry = match rng.random_range(0..3) {
        0 => RetryPolicy::Static {
            wait_ms: rng.random_range(200..=3_000),
        },
        1 => RetryPolicy::Random {
            min_ms: 100,
            max_ms: rng.random_range(500..=8_000),
        },
        _ => RetryPolicy::Exponential {
            initial_ms: rng.random_range(100..=1_000),
            multiplier: 2.0,
            max_ms: rng.random_range(5_000..=30_000),
        },
    };
    spec.max_attempts = if rng.random_bool(0.3) {
        rng.random_range(3..=6)
    } else {
        0
    };
    spec.operation_timeout_ms = rng.random_range(5..=30) * 1_000;
    spec.max_in_flight = if rng.random_bool(0.4) {
        rng.random_range(1..=3)
    } else {
        64
    };
    spec
}

/// A SubmitIntent as the simulator sends it (validated through the API's
/// own validation before it reaches the owner).
#[derive(Clone, Debug)]
pub struct SubmitPlan {
    /// The subgraph the request owns (`""`: the whole graph).
    pub scope: String,
    /// The items listed.
    pub items: Vec<Item>,
    /// `expected_generation`, if set.
    pub expected_generation: Option<u64>,
    /// Validate and plan only.
    pub dry_run: bool,
}

impl SubmitPlan {
    /// One line for the trace.
    pub fn describe(&self) -> String {
        let mut items: Vec<String> = self.items.iter().map(describe_item).collect();
        items.sort();
        format!(
            "submit scope={:?}{}{} [{}]",
            self.scope,
            match self.expected_generation {
                Some(generation) => format!(" expected_generation={generation}"),
                None => String::new(),
            },
            if self.dry_run { " dry_run" } else { "" },
            items.join(", ")
        )
    }
}

/// `t0/n3{v:1,...}->[t1/n2 "pred" rwm auto]` for traces.
pub fn describe_item(item: &Item) -> String {
    let properties = item.properties.to_value().to_string();
    let mut text = format!("{}{properties}", item.item_ref());
    if item.external {
        text.push_str(" EXTERNAL");
    }
    if !item.subgraph.is_empty() {
        text.push_str(&format!(" @{}", item.subgraph));
    }
    if !item.label().is_empty() {
        text.push_str(&format!(" label={}", item.label()));
    }
    if !item.dependencies.is_empty() {
        let deps: Vec<String> = item
            .dependencies
            .iter()
            .map(|d| {
                let mut dep = d.requires.to_string();
                if !d.must_satisfy().is_empty() {
                    dep.push_str(&format!(" if {}", d.must_satisfy()));
                }
                if d.recreate_when_modified() {
                    dep.push_str(" rwm");
                }
                if d.auto_deleted_by_external() {
                    dep.push_str(" auto");
                }
                dep
            })
            .collect();
        text.push_str(&format!("->[{}]", deps.join("; ")));
    }
    text
}

/// Random properties over the keys predicates and recreate paths read.
pub fn random_properties(rng: &mut StdRng) -> Properties {
    let mut properties = Properties::new();
    properties.insert("v".into(), json!(rng.random_range(0..4)));
    properties.insert(
        "state".into(),
        json!(if rng.random_bool(0.7) { "up" } else { "down" }),
    );
    properties.insert(
        "mtu".into(),
        json!(*[1400, 1500, 9000].choose(rng).unwrap_or(&1500)),
    );
    if rng.random_bool(0.6) {
        properties.insert("vlan".into(), json!({"id": rng.random_range(1..5)}));
    }
    properties
}

/// `properties` with some keys flipped (a Modify, or a recreate when the
/// type's `recreate_on_change` covers the key).
pub fn mutate_properties(rng: &mut StdRng, properties: &Properties) -> Properties {
    let fresh = random_properties(rng);
    let mut mutated = properties.clone();
    for key in ["v", "state", "mtu", "vlan"] {
        if rng.random_bool(0.3) {
            match fresh.get(key) {
                Some(value) => {
                    mutated.insert(key.into(), value.clone());
                }
                None => {
                    mutated.remove(key);
                }
            }
        }
    }
    mutated
}

/// The intent as acknowledged so far, and what a submit must do to it.
#[derive(Clone, Debug, Default)]
pub struct IntentModel {
    /// The tenant's generation.
    pub generation: u64,
    /// The intended items, as placed (subgraphs filled in).
    pub items: BTreeMap<ItemRef, Item>,
    /// The intent of every generation, for checking what operations apply.
    pub history: BTreeMap<u64, BTreeMap<ItemRef, Item>>,
    /// A submit whose answer was lost when the store died: it may or may
    /// not have been stored, and a restart must show one or the other.
    pub uncertain: Option<(u64, BTreeMap<ItemRef, Item>)>,
    /// During a step that submits: the generation and intent before it.
    /// An operation toward that generation or an earlier one that the
    /// agents receive in that step may have been sent before the submit
    /// was applied (a retry that fell due as it arrived, say).
    pub before_this_step: Option<(u64, BTreeMap<ItemRef, Item>)>,
}

/// What a submit must answer.
#[derive(Clone, Debug)]
pub enum Expected {
    /// `expected_generation` does not match.
    GenerationMismatch,
    /// An item lies outside the scope or is listed in another subgraph.
    OutsideScope,
    /// Accepted.
    Accepted {
        /// The generation afterwards.
        generation: u64,
        /// Whether anything is stored.
        changed: bool,
        /// The intent afterwards.
        items: BTreeMap<ItemRef, Item>,
    },
}

impl IntentModel {
    /// What `plan` must do, from DESIGN sections 2 and 8: the request owns
    /// its scope and replaces the items listed there; the generation grows
    /// by one when an item's equality-relevant content changes.
    pub fn expect(&self, plan: &SubmitPlan) -> Expected {
        if plan
            .expected_generation
            .is_some_and(|expected| expected != self.generation)
        {
            return Expected::GenerationMismatch;
        }
        let mut placed = BTreeMap::new();
        for item in &plan.items {
            let mut item = item.clone();
            if item.subgraph.is_empty() {
                item.subgraph = plan.scope.as_str().into();
            }
            if !subgraph_contains(&plan.scope, &item.subgraph) {
                return Expected::OutsideScope;
            }
            if let Some(existing) = self.items.get(&item.item_ref())
                && !subgraph_contains(&plan.scope, &existing.subgraph)
            {
                return Expected::OutsideScope;
            }
            placed.insert(item.item_ref(), item);
        }
        let mut items: BTreeMap<ItemRef, Item> = self
            .items
            .iter()
            .filter(|(_, item)| !subgraph_contains(&plan.scope, &item.subgraph))
            .map(|(key, item)| (key.clone(), item.clone()))
            .collect();
        let removed = self.items.iter().any(|(key, item)| {
            subgraph_contains(&plan.scope, &item.subgraph) && !placed.contains_key(key)
        });
        let mut content_changed = removed;
        let mut changed = removed;
        for (key, item) in placed {
            match self.items.get(&key) {
                Some(existing) => {
                    content_changed |= !existing.same_content(&item);
                    changed |= *existing != item;
                }
                None => {
                    content_changed = true;
                    changed = true;
                }
            }
            items.insert(key, item);
        }
        Expected::Accepted {
            generation: self.generation + u64::from(content_changed),
            changed,
            items,
        }
    }

    /// Records an acknowledged intent.
    pub fn acknowledge(&mut self, generation: u64, items: BTreeMap<ItemRef, Item>) {
        self.generation = generation;
        self.history.insert(generation, items.clone());
        self.items = items;
        self.uncertain = None;
    }

    /// Whether `item`'s intended content changed after `generation` (or it
    /// left the intent), in an acknowledged intent or in one whose answer
    /// was lost (the server may hold it).
    pub fn changed_since(&self, generation: u64, item: &ItemRef) -> bool {
        let then = self.value_at(generation, item);
        self.history
            .range(generation + 1..)
            .map(|(_, items)| items.get(item))
            .chain(self.uncertain.iter().map(|(_, items)| items.get(item)))
            .any(|later| match (then, later) {
                (Some(then), Some(later)) => !then.same_content(later),
                (None, None) => false,
                _ => true,
            })
    }

    /// Whether `item` is intended, in the acknowledged intent or in one
    /// whose answer was lost.
    pub fn intends(&self, item: &ItemRef) -> bool {
        self.items.contains_key(item)
            || self
                .uncertain
                .as_ref()
                .is_some_and(|(_, items)| items.contains_key(item))
    }

    /// The intended value of `item` at `generation` (the generation that
    /// last changed it), as far as the model knows.
    pub fn value_at(&self, generation: u64, item: &ItemRef) -> Option<&Item> {
        self.history
            .get(&generation)
            .and_then(|items| items.get(item))
            .or_else(|| {
                self.uncertain
                    .as_ref()
                    .filter(|(uncertain, _)| *uncertain == generation)
                    .and_then(|(_, items)| items.get(item))
            })
    }
}

/// Draws the next SubmitIntent: mostly small changes of the acknowledged
/// intent (items kept, modified, added, removed, retargeted, moved between
/// subgraphs), sometimes over a subgraph only, rarely one that must be
/// refused.
pub fn generate_submit(rng: &mut StdRng, scenario: &Scenario, model: &IntentModel) -> SubmitPlan {
    let scope = if rng.random_bool(0.25) {
        (*SCOPES.choose(rng).unwrap_or(&"a")).to_string()
    } else {
        String::new()
    };
    let chain_mode = rng.random_bool(0.35);
    let keep = rng.random_range(0.75..0.97);
    let add = rng.random_range(0.2..0.6);
    let mut chosen: Vec<usize> = Vec::new();
    for (rank, identity) in scenario.pool.iter().enumerate() {
        let existing = model.items.get(&identity.item);
        let in_scope = existing.is_none_or(|item| subgraph_contains(&scope, &item.subgraph));
        if !in_scope {
            // Listed in another subgraph: leave it to its owner, except
            // rarely, to check that the owner refuses it.
            if rng.random_bool(0.01) {
                chosen.push(rank);
            }
            continue;
        }
        let wanted = match existing {
            Some(_) => rng.random_bool(keep),
            None => rng.random_bool(add),
        };
        if wanted {
            chosen.push(rank);
        }
    }
    let mut items = Vec::new();
    for &rank in &chosen {
        let identity = &scenario.pool[rank];
        let existing = model.items.get(&identity.item);
        let mut item = match existing {
            Some(existing) if rng.random_bool(0.7) => {
                let mut item = existing.clone();
                if rng.random_bool(0.35) {
                    item.properties = mutate_properties(rng, &item.properties);
                }
                item
            }
            Some(existing) => {
                let mut item = existing.clone();
                item.properties = mutate_properties(rng, &item.properties);
                item.dependencies =
                    dependencies(rng, scenario, rank, &chosen, chain_mode, Some(existing));
                item
            }
            None => {
                let mut item = Item::new(
                    identity.item.item_type(),
                    identity.item.name(),
                    random_properties(rng),
                );
                item.dependencies = dependencies(rng, scenario, rank, &chosen, chain_mode, None);
                item
            }
        };
        if identity.external {
            item.external = true;
            item.dependencies.clear();
        }
        item.subgraph = subgraph_for(rng, &scope, existing).into();
        if rng.random_bool(0.05) {
            item.set_label(*["", "blue", "green"].choose(rng).unwrap_or(&""));
        }
        if rng.random_bool(0.05) {
            item.set_description(format!("note {}", rng.random_range(0..3)));
        }
        items.push(item);
    }
    // Listing order is not part of the intent.
    for index in (1..items.len()).rev() {
        let other = rng.random_range(0..=index);
        items.swap(index, other);
    }
    let expected_generation = match rng.random_range(0..20) {
        0..=1 => Some(model.generation),
        2 => Some(model.generation + 1),
        _ => None,
    };
    SubmitPlan {
        scope,
        items,
        expected_generation,
        dry_run: rng.random_bool(0.04),
    }
}

/// Where an item is listed: under the scope, moving now and then.
fn subgraph_for(rng: &mut StdRng, scope: &str, existing: Option<&Item>) -> String {
    let candidates: Vec<&str> = SUBGRAPHS
        .iter()
        .copied()
        .filter(|path| subgraph_contains(scope, path))
        .collect();
    match existing {
        Some(existing) if subgraph_contains(scope, &existing.subgraph) && rng.random_bool(0.85) => {
            existing.subgraph.to_string()
        }
        _ => (*candidates.choose(rng).unwrap_or(&scope)).to_string(),
    }
}

/// Dependencies of the item at `rank`: on earlier identities only (so no
/// cycle can form), as a chain, a random DAG (diamonds), or the previous
/// dependencies with some dropped and some added (retargeting).
fn dependencies(
    rng: &mut StdRng,
    scenario: &Scenario,
    rank: usize,
    chosen: &[usize],
    chain_mode: bool,
    existing: Option<&Item>,
) -> Vec<Dependency> {
    let mut targets: Vec<ItemRef> = Vec::new();
    if let Some(existing) = existing {
        for dependency in &existing.dependencies {
            if rng.random_bool(0.75) {
                targets.push(dependency.requires.clone());
            }
        }
    }
    if rank > 0 {
        if chain_mode {
            // The nearest earlier item of this intent (deep cascades).
            if let Some(&previous) = chosen.iter().rev().find(|&&other| other < rank) {
                targets.push(scenario.pool[previous].item.clone());
            }
        } else {
            let chance = (1.6 / rank as f64).min(0.6);
            for earlier in 0..rank {
                // Mostly on items of this intent; sometimes dangling.
                let intended = chosen.contains(&earlier);
                if rng.random_bool(if intended { chance } else { chance / 4.0 }) {
                    targets.push(scenario.pool[earlier].item.clone());
                }
            }
        }
    }
    targets.sort();
    targets.dedup();
    targets.truncate(3);
    targets
        .into_iter()
        .map(|target| {
            let previous = existing.and_then(|item| item.dependency_on(&target));
            match previous {
                Some(previous) if rng.random_bool(0.8) => previous.clone(),
                _ => new_dependency(rng, scenario, target),
            }
        })
        .collect()
}

fn new_dependency(rng: &mut StdRng, scenario: &Scenario, target: ItemRef) -> Dependency {
    let on_external = scenario
        .pool
        .iter()
        .any(|identity| identity.external && identity.item == target);
    let mut dependency = Dependency::on(target);
    if rng.random_bool(0.35) {
        let index = if rng.random_bool(0.05) {
            PREDICATES.len() - 1
        } else {
            rng.random_range(0..PREDICATES.len() - 1)
        };
        dependency.set_must_satisfy(PREDICATES[index]);
    }
    dependency.set_recreate_when_modified(rng.random_bool(0.2));
    dependency.set_auto_deleted_by_external(on_external && rng.random_bool(0.5));
    if rng.random_bool(0.1) {
        dependency.set_description("needs it");
    }
    dependency
}

/// The value an external item is reported with.
pub fn external_value(item: &ItemRef, properties: Properties) -> Item {
    let mut value = Item::new(item.item_type(), item.name(), properties);
    value.external = true;
    value
}

/// An `Arc` of a clone, for values shared with the world.
pub fn shared(item: &Item) -> Arc<Item> {
    Arc::new(item.clone())
}

/// SplitMix64: one well-mixed number from `x`.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
