//! The planner against the oracle (`oracle.rs`), on random graphs and
//! random reachable current states.
//!
//! A random case is a set of item types (with recreate rules), a choice of
//! external items, and successive intents over the same identities:
//! chains, diamonds and deeper cascades (every item may depend on lower
//! indices), predicates that flip as the required item's values change,
//! `recreate_when_modified` and `auto_deleted_by_external` dependencies. A
//! [`World`] is driven through the intents by a random mix of dispatching
//! ready operations (several at once, left in flight), finishing in-flight
//! operations with random outcomes (done, retryable and terminal failures,
//! WAIT, lost outcomes that leave items UNKNOWN), clock steps past backoff,
//! configurators leaving and coming back, external items reported,
//! modified and withdrawn, and NEEDS_RECREATE answers. At every step:
//!
//! (1) `plan_everything` and the oracle agree on the operations in the plan,
//!     the operations ready now, the items that wait (with the operation
//!     they wait to run and the reason), and the items dropped;
//! (2) a plan seeded, as the engine seeds its passes, with the items
//!     changed since the last pass and a random subset of the other dirty
//!     items (the rest counted converged) agrees with the full plan on
//!     everything it reports: each of its operations is in the full plan
//!     with the same readiness, and each item it says waits, waits there.
//!
//! The worlds of both also decide lost operations as the engine does when
//! an agent holds their type again (`exec::lost::redelivery`: sent again,
//! given up, with the values they may have applied kept as `maybe_applied`
//! or the item's existence uncertain), and (3) every operation so sent
//! again must respect the ordering rules re-delivery promises
//! ([`check_resend`]).
//!
//! (4) Once the weather clears after a case (every type served, retry
//!     times passed, lost operations decided, every operation succeeding),
//!     the world settles within a bounded number of rounds, and what still
//!     waits, waits only for what an intent change or a report moves
//!     ([`check_settles`]): the liveness the first three do not ask.
//!
//! Each property runs on two kinds of world: everyday ones ([`EVERYDAY`])
//! and uncertain ones ([`UNCERTAIN`]: many short intents, most steps losing
//! an operation), which catch mutants that undo the fixes of simulator
//! seeds 3400 and 10544 and of the seeded pass's upstream walk
//! (docs/testing.md, "Ninth round").
//!
//! Every disagreement found, where the oracle followed DESIGN and the
//! planner did not, is kept below as a named, deterministic regression test
//! (`planner_bug_*`), and all are fixed:
//! - bug 1: a retargeted dependent was deleted as well as modified;
//! - bug 2: a Modify did not wait for the Delete of a dependent whose
//!   predicate it breaks unless that predicate alone deleted it;
//! - bug 3: a seeded pass missed Deletes of the same type on items it did
//!   not examine, so a Create raced them;
//! - bug 4: a modified `recreate_when_modified` dependency did not force a
//!   recreate when the dependent's own value changed too;
//! - bug 5: between drop and delete, the first gone dependency in
//!   declaration order decided;
//! - bug 6: a Modify's order after a dependent's Delete depended on the
//!   order the planner visited items (seeded and full plans disagreed);
//! - bug 7: rule 7's "new dependencies satisfied" was judged before every
//!   deletion was known.
//!
//! Cases per property: 250 (about 50 checked states each), or
//! `ORACLE_PROPTEST_CASES` for a longer search (run 20,000 in release after
//! a change to planning or re-delivery).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::oracle::{Decision, Needs, OperationId, OraclePlan, OwnNeed, oracle_plan};
use super::{BlockedBy, Plan, TypeRules, WaitReason, WaitingItem, plan_everything};
use crate::engine::exec::lost::{Redelivery, redelivery, runs_a_delete, superseded};
use crate::engine::testkit::{World, external, item, on, parse_ref};
use crate::engine::transition::Completion;
use crate::engine::waiting::WaitingSet;
use crate::graph::{
    CurrentItem, InFlight, Item, ItemRef, ItemState, OperationError, OperationKind, Properties,
    code,
};

use OperationKind::{Create, Delete, Modify};

// ----- normalized plans ----------------------------------------------------------

/// What both planners are compared on.
#[derive(Debug, PartialEq, Eq)]
struct Normal {
    planned: BTreeSet<OperationId>,
    ready: BTreeSet<OperationId>,
    waiting: BTreeSet<ItemRef>,
    dropped: BTreeSet<ItemRef>,
    /// For each waiting item: the operation it waits to run and why.
    reasons: BTreeSet<(ItemRef, OperationKind, WaitReason)>,
}

fn normal_of_plan(plan: &Plan) -> Normal {
    let id = |index: usize| {
        let operation = &plan.operations[index];
        (operation.item.clone(), operation.kind)
    };
    Normal {
        planned: (0..plan.operations.len()).map(id).collect(),
        ready: plan.ready().map(id).collect(),
        waiting: plan.waiting.iter().map(|w| w.item.clone()).collect(),
        reasons: plan
            .waiting
            .iter()
            .map(|w| (w.item.clone(), w.operation, w.reason))
            .collect(),
        dropped: plan
            .forget
            .iter()
            .filter(|(_, reason)| *reason == super::ForgetReason::DeletedWithExternal)
            .map(|(item, _)| item.clone())
            .collect(),
    }
}

fn normal_of_oracle(plan: &OraclePlan) -> Normal {
    Normal {
        planned: plan.planned(),
        ready: plan.ready(),
        waiting: plan.waiting(),
        dropped: plan.dropped(),
        reasons: plan.reasons(),
    }
}

fn difference<T: Ord + std::fmt::Debug>(
    name: &str,
    real: &BTreeSet<T>,
    oracle: &BTreeSet<T>,
) -> String {
    let only_real: Vec<_> = real.difference(oracle).collect();
    let only_oracle: Vec<_> = oracle.difference(real).collect();
    if only_real.is_empty() && only_oracle.is_empty() {
        String::new()
    } else {
        format!("{name}: only planner {only_real:?}, only oracle {only_oracle:?}\n")
    }
}

/// Both graphs and the environment, for failure messages.
fn describe(world: &World) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "now={} disconnected={:?} generation={}",
        world.environment.now_ms, world.environment.disconnected, world.generation
    );
    for (key, entry) in world.intended.iter() {
        let dependencies: Vec<String> = entry
            .item
            .dependencies
            .iter()
            .map(|d| {
                format!(
                    "{}{}{}{}",
                    d.requires,
                    if d.must_satisfy().is_empty() {
                        String::new()
                    } else {
                        format!("[{}]", d.must_satisfy())
                    },
                    if d.recreate_when_modified() {
                        "+rwm"
                    } else {
                        ""
                    },
                    if d.auto_deleted_by_external() {
                        "+auto"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "  intended {key} gen={} ext={} {} deps={dependencies:?}",
            entry.generation,
            entry.item.external,
            entry.item.properties.to_value()
        );
    }
    for (key, entry) in world.current.iter() {
        let applied = entry.applied.as_ref().map(|a| {
            let dependencies: Vec<String> = a
                .dependencies
                .iter()
                .map(|d| {
                    format!(
                        "{}{}{}",
                        d.requires,
                        if d.must_satisfy().is_empty() {
                            String::new()
                        } else {
                            format!("[{}]", d.must_satisfy())
                        },
                        if d.recreate_when_modified() {
                            "+rwm"
                        } else {
                            ""
                        }
                    )
                })
                .collect();
            format!(
                "{} ext={} deps={dependencies:?}",
                a.properties.to_value(),
                a.external
            )
        });
        let _ = writeln!(
            out,
            "  current {key} {:?} gen={} applied={applied:?} observed={:?} last={:?} err={:?} \
             failed_gen={} next={:?} in_flight={:?} mods={} marks={:?} unknown_created={} answer={:?}",
            entry.state,
            entry.applied_generation,
            entry.observed.as_ref().map(|o| o.to_value()),
            entry.last_operation,
            entry.rare.last_error.as_ref().map(|e| e.code),
            entry.rare.failed_generation,
            entry.rare.next_attempt_at_ms,
            entry
                .in_flight
                .as_ref()
                .map(|op| (op.kind, op.target_generation)),
            entry.modifications,
            entry.rare.dependency_marks,
            entry.unknown_was_created,
            entry.rare.needs_recreate_answer,
        );
    }
    out
}

/// Property (1): the full plan and the oracle agree. Known planner bugs 4
/// and 5 (see `planner_bug_4_*`, `planner_bug_5_*`) are tolerated: the plan
/// may also match the oracle under any of [`Readings::lenient`]. States of
/// bug 7 are not compared.
fn check_against_oracle(world: &World) -> Result<(), String> {
    let plan = plan_everything(&world.intended, &world.current, &world.environment);
    crate::engine::testkit::check_plan_shape(&plan);
    let oracle = oracle_plan(&world.intended, &world.current, &world.environment);
    let real = normal_of_plan(&plan);
    let expected = normal_of_oracle(&oracle);
    if real == expected {
        return Ok(());
    }
    let mut message = String::from("the planner and the oracle disagree\n");
    message += &difference("planned", &real.planned, &expected.planned);
    message += &difference("ready", &real.ready, &expected.ready);
    message += &difference("waiting", &real.waiting, &expected.waiting);
    message += &difference("dropped", &real.dropped, &expected.dropped);
    message += &difference("reasons", &real.reasons, &expected.reasons);
    message += &describe(world);
    let _ = writeln!(message, "oracle: {:#?}", oracle.items);
    let _ = writeln!(message, "planner: {:#?}", plan.operations);
    let _ = writeln!(message, "planner waiting: {:#?}", plan.waiting);
    Err(message)
}

/// Property (2): a plan seeded with a subset of the dirty items never
/// contradicts the full plan about what it reports.
fn check_incremental(
    world: &World,
    fresh: &BTreeSet<ItemRef>,
    rng: &mut StdRng,
) -> Result<(), String> {
    let dirty: Vec<ItemRef> = world.dirty.iter().cloned().collect();
    if dirty.is_empty() {
        return Ok(());
    }
    let mut seeds: Vec<String> = dirty
        .iter()
        .filter(|item| fresh.contains(*item) || rng.random_bool(0.5))
        .map(ToString::to_string)
        .collect();
    if seeds.is_empty() {
        seeds.push(dirty[rng.random_range(0..dirty.len())].to_string());
    }
    let seed_refs: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let full = plan_everything(&world.intended, &world.current, &world.environment);
    let incremental = world.plan_seeded_after(&full, &seed_refs, &world.dirty);
    let (small, large) = (normal_of_plan(&incremental), normal_of_plan(&full));
    let mut problems = String::new();
    for operation in &small.planned {
        if !large.planned.contains(operation) {
            let _ = writeln!(problems, "{operation:?} is planned only by the seeded plan");
        } else if small.ready.contains(operation) != large.ready.contains(operation) {
            let _ = writeln!(
                problems,
                "{operation:?} is ready={} in the seeded plan, ready={} in the full plan",
                small.ready.contains(operation),
                large.ready.contains(operation)
            );
        }
    }
    for item in small.waiting.difference(&large.waiting) {
        let _ = writeln!(problems, "{item} waits only in the seeded plan");
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(format!(
        "seeds {seeds:?}, dirty {dirty:?}\n{problems}{}seeded: {:#?}\nfull: {:#?}\n\
         waiting in the seeded plan: {:#?}\nwaiting in the full plan: {:#?}",
        describe(world),
        incremental.operations,
        full.operations,
        incremental.waiting,
        full.waiting
    ))
}

// ----- random cases --------------------------------------------------------------

const SIZE: usize = 8;

/// How a property's worlds are weighted.
#[derive(Clone, Copy, Debug)]
struct Profile {
    /// Successive intents of a case.
    intents: usize,
    /// Steps the world takes under each intent.
    steps_per_intent: usize,
    /// Share of steps that lose an operation in flight (or take an UNKNOWN
    /// item's) and decide it.
    lose: f64,
    /// Possible items of a case.
    size: usize,
    /// Share of items that depend on the item just below them (chains).
    chain: f64,
}

/// Everyday worlds: three intents, a fifth of the steps lose an operation.
const EVERYDAY: Profile = Profile {
    intents: 3,
    steps_per_intent: 16,
    lose: 0.2,
    size: SIZE,
    chain: 0.5,
};

/// Uncertain worlds: eight short intents, and four steps in five lose an
/// operation and decide it, so values an item may hold and items whose
/// existence is uncertain meet intent changes and UNKNOWN neighbours
/// often (the shape of simulator seeds 3400 and 10544). Measured against
/// planner and re-delivery mutants that undo those fixes: these catch each
/// within a few thousand cases, everyday worlds hardly ever
/// (docs/testing.md, "Ninth round").
const UNCERTAIN: Profile = Profile {
    intents: 8,
    steps_per_intent: 6,
    lose: 0.8,
    size: SIZE,
    chain: 0.5,
};

/// Deep worlds: more items, most of them on the one below (chains of
/// several levels, with diamonds where a second dependency joins), long
/// enough under each intent for changes to travel through every level.
const DEEP: Profile = Profile {
    intents: 3,
    steps_per_intent: 40,
    lose: 0.1,
    size: 14,
    chain: 0.85,
};

/// Predicates over the required item: some flip with `v` or `id`, one
/// reads an observed property, one always fails to evaluate.
const PREDICATES: [&str; 5] = [
    "self.v >= 1",
    "self.v != 2",
    "self.id == 0",
    "has(self.up) && self.up",
    "self.missing == 1",
];

#[derive(Clone, Debug)]
struct DependencySpec {
    target: usize,
    predicate: Option<usize>,
    recreate_when_modified: bool,
    auto_deleted: bool,
}

#[derive(Clone, Debug)]
struct ItemSpec {
    v: u8,
    id: u8,
    dependencies: Vec<DependencySpec>,
}

#[derive(Clone, Debug)]
struct CaseSpec {
    external: Vec<bool>,
    intents: Vec<Vec<Option<ItemSpec>>>,
}

/// Non-external types: `t` has no rules, `u` recreates when `/id` changes,
/// `s` is never modified in place, `q` asks NEEDS_RECREATE.
const TYPES: [&str; 4] = ["t", "u", "s", "q"];

fn type_of(spec: &CaseSpec, index: usize) -> &'static str {
    if spec.external[index] {
        "e"
    } else {
        TYPES[index % TYPES.len()]
    }
}

fn identity(spec: &CaseSpec, index: usize) -> String {
    format!("{}/i{index}", type_of(spec, index))
}

fn dependency_strategy(index: usize) -> impl Strategy<Value = DependencySpec> {
    (
        0..index,
        proptest::option::weighted(0.35, 0..PREDICATES.len()),
        proptest::bool::weighted(0.2),
        proptest::bool::weighted(0.6),
    )
        .prop_map(
            |(target, predicate, recreate_when_modified, auto_deleted)| DependencySpec {
                target,
                predicate,
                recreate_when_modified,
                auto_deleted,
            },
        )
}

fn item_strategy(index: usize, chain_weight: f64) -> BoxedStrategy<Option<ItemSpec>> {
    let dependencies = if index == 0 {
        Just(Vec::new()).boxed()
    } else {
        (
            proptest::bool::weighted(chain_weight),
            proptest::collection::vec(dependency_strategy(index), 0..3),
            dependency_strategy(index),
        )
            .prop_map(move |(chain, mut others, mut previous)| {
                if chain {
                    previous.target = index - 1;
                    others.push(previous);
                }
                others.sort_by_key(|d| d.target);
                others.dedup_by_key(|d| d.target);
                others
            })
            .boxed()
    };
    (proptest::bool::weighted(0.85), 0u8..3, 0u8..2, dependencies)
        .prop_map(|(present, v, id, dependencies)| {
            present.then_some(ItemSpec {
                v,
                id,
                dependencies,
            })
        })
        .boxed()
}

fn intent_strategy(size: usize, chain: f64) -> impl Strategy<Value = Vec<Option<ItemSpec>>> {
    (0..size)
        .map(|index| item_strategy(index, chain))
        .collect::<Vec<_>>()
}

fn case_strategy(profile: Profile) -> impl Strategy<Value = CaseSpec> {
    (
        proptest::collection::vec(proptest::bool::weighted(0.2), profile.size),
        proptest::collection::vec(
            intent_strategy(profile.size, profile.chain),
            profile.intents,
        ),
    )
        .prop_map(|(external, intents)| CaseSpec { external, intents })
}

fn build(spec: &CaseSpec, intent: &[Option<ItemSpec>]) -> Vec<Item> {
    intent
        .iter()
        .enumerate()
        .filter_map(|(index, item_spec)| item_spec.as_ref().map(|s| (index, s)))
        .map(|(index, item_spec)| {
            let mut built = item(
                &identity(spec, index),
                json!({"v": item_spec.v, "id": item_spec.id}),
            );
            if spec.external[index] {
                built.external = true;
                built.properties.clear();
                return built;
            }
            for dependency in &item_spec.dependencies {
                built = built.depends_on(
                    on(&identity(spec, dependency.target))
                        .with_must_satisfy(dependency.predicate.map_or("", |p| PREDICATES[p]))
                        .with_recreate_when_modified(dependency.recreate_when_modified)
                        .with_auto_deleted_by_external(
                            dependency.auto_deleted && spec.external[dependency.target],
                        ),
                );
            }
            built
        })
        .collect()
}

fn new_world() -> World {
    let mut world = World::new();
    let rules = [
        ("u", vec!["/id".to_string()], false),
        ("s", vec!["*".to_string()], false),
        ("q", vec![], true),
    ];
    for (item_type, recreate_on_change, ask_needs_recreate) in rules {
        world.environment.rules.insert(
            item_type.into(),
            TypeRules {
                recreate_on_change,
                ask_needs_recreate,
            },
        );
    }
    world.environment.now_ms = 1_000_000;
    world
}

/// Marks `key` and its neighbours dirty after a change made outside the
/// world's own methods.
fn touch(world: &mut World, key: &ItemRef) {
    world.dirty.insert(key.clone());
    let neighbours: Vec<ItemRef> = world
        .current
        .dependents_of(key)
        .chain(world.intended.dependents_of(key))
        .cloned()
        .collect();
    world.dirty.extend(neighbours);
}

fn random_properties(rng: &mut StdRng) -> serde_json::Value {
    json!({
        "v": rng.random_range(0..3),
        "id": rng.random_range(0..2),
        "up": rng.random_bool(0.6),
    })
}

/// A random outcome for an operation in flight.
fn random_completion(world: &World, rng: &mut StdRng) -> Completion {
    let now = world.environment.now_ms;
    match rng.random_range(0..100) {
        0..55 => Completion::Done {
            observed: rng.random_bool(0.3).then(|| {
                Properties::try_from(json!({"up": rng.random_bool(0.6)})).unwrap_or_default()
            }),
        },
        55..72 => Completion::Failed {
            error: OperationError {
                code: code::UNAVAILABLE,
                message: "random retryable failure".into(),
            },
            retry_at_ms: Some(now + rng.random_range(1..2_000)),
        },
        72..80 => Completion::Failed {
            error: OperationError {
                code: code::FAILED_PRECONDITION,
                message: "random terminal failure".into(),
            },
            retry_at_ms: None,
        },
        80..86 => Completion::Wait {
            retry_at_ms: now + rng.random_range(1..1_500),
        },
        _ => Completion::Lost,
    }
}

/// One random step of the world, after a check.
/// A full pass (plan, bookkeeping) then one random action. Returns the
/// items the action changed: the seeds the engine's next pass gets.
fn random_step(
    world: &mut World,
    spec: &CaseSpec,
    profile: Profile,
    rng: &mut StdRng,
) -> BTreeSet<ItemRef> {
    let plan = plan_everything(&world.intended, &world.current, &world.environment);
    world.absorb(&plan);
    changes(world, |world| {
        if rng.random_bool(profile.lose) && decide_a_lost_operation(world, rng) {
            return;
        }
        random_action(world, spec, rng, &plan);
    })
}

/// Loses the outcome of one operation in flight (its session ended), or
/// takes an UNKNOWN item's, and decides it as the engine does when an
/// agent holds its type again (it says whether it still runs it, or says
/// nothing); false if there was none, or it must wait.
fn decide_a_lost_operation(world: &mut World, rng: &mut StdRng) -> bool {
    let running: Vec<(ItemRef, OperationKind)> = world
        .current
        .iter()
        .filter_map(|(key, entry)| entry.in_flight.as_ref().map(|op| (key.clone(), op.kind)))
        .filter(|(_, kind)| *kind != OperationKind::Read)
        .collect();
    if running.is_empty() {
        return false;
    }
    let (key, kind) = running[rng.random_range(0..running.len())].clone();
    if world.current.get(&key).expect("listed").state != ItemState::Unknown {
        world.script(kind, &key.to_string(), Completion::Lost);
        world.finish(&key, kind);
    }
    let agent_holds = [None, Some(false), Some(true)][rng.random_range(0..3)];
    decide_lost(world, &key, agent_holds)
}

/// Decides the lost operation of UNKNOWN `key` as the engine does when an
/// agent holds its type again and says it still runs it (`Some(true)`),
/// that it does not (`Some(false)`), or nothing (`None`); false if it must
/// wait.
fn decide_lost(world: &mut World, key: &ItemRef, agent_holds: Option<bool>) -> bool {
    let key = key.clone();
    let entry = world.current.get(&key).expect("an UNKNOWN item").clone();
    let operation = entry.in_flight.as_deref().expect("listed").clone();
    let superseded = superseded(&world.intended, &world.current, &key, &operation);
    let delete_of_its_type_runs = delete_of_type_runs(world, &key);
    let now_ms = world.environment.now_ms;
    // What waits, as the engine keeps it from its passes: a dependency
    // waiting for its backoff holds the lost operation.
    let mut waiting = WaitingSet::default();
    for entry in plan_everything(&world.intended, &world.current, &world.environment).waiting {
        waiting.insert(entry);
    }
    let decided = redelivery(
        &world.current,
        &waiting,
        &key,
        &entry,
        &operation,
        agent_holds,
        false,
        delete_of_its_type_runs,
        superseded,
        now_ms,
        |_| Some(now_ms + 1_000),
    );
    if agent_holds != Some(true)
        && let Redelivery::Resend { .. } = decided
    {
        check_resend(world, &key, &entry, &operation);
    }
    match decided {
        Redelivery::Defer | Redelivery::Read => return false,
        Redelivery::GiveUp { value: None, .. } => {
            world.current.remove(&key);
        }
        Redelivery::GiveUp {
            value: Some(value), ..
        }
        | Redelivery::Resend { value, .. } => {
            world.current.insert(key.clone(), value);
        }
    }
    touch(world, &key);
    true
}

/// Whether a Delete runs on another item of `key`'s type, as the executor
/// counts them for a re-delivery ([`runs_a_delete`]). (The planner holds a
/// new Create behind a lost Delete of its type as well; see
/// docs/testing.md, "Ninth round".)
fn delete_of_type_runs(world: &World, key: &ItemRef) -> bool {
    world.current.iter().any(|(other, entry)| {
        other != key && other.item_type() == key.item_type() && runs_a_delete(entry)
    })
}

/// The ordering rules a lost operation sent again where no agent runs it
/// must respect (the engine's re-delivery decides it apart from the
/// planner, so it is checked on its own):
/// - an UNKNOWN item blocks operations on its dependents (DESIGN 4):
///   nothing that a value the item may hold, or the value the operation
///   applies, relies on is UNKNOWN;
/// - a Create or Modify runs once every dependency of the value it
///   applies is created and idle, and a Create once no Delete of its type
///   runs (DESIGN 3);
/// - a Delete runs once no dependent may exist or is busy (DESIGN 3).
fn check_resend(world: &World, key: &ItemRef, entry: &CurrentItem, operation: &InFlight) {
    let kind = operation.kind.as_str();
    let values = entry
        .values()
        .map(|value| &**value)
        .chain(operation.target.as_deref());
    for dependency in values.flat_map(|value| &value.dependencies) {
        let required = world.current.get(&dependency.requires);
        assert!(
            dependency.requires == *key || required.is_none_or(|r| r.state != ItemState::Unknown),
            "lost {kind} {key} sent again while {} it may rely on is UNKNOWN\n{}",
            dependency.requires,
            describe(world)
        );
    }
    if operation.question {
        return;
    }
    match operation.kind {
        Create | Modify => {
            assert!(
                operation.kind == Modify || !delete_of_type_runs(world, key),
                "lost create {key} sent again while a delete of its type runs\n{}",
                describe(world)
            );
            let target = operation
                .target
                .as_deref()
                .expect("a Create or Modify applies a value");
            for dependency in &target.dependencies {
                let required = world.current.get(&dependency.requires);
                assert!(
                    required.is_some_and(|r| r.is_created() && !r.is_busy()),
                    "lost {kind} {key} sent again before {} was created and idle: {required:?}\n{}",
                    dependency.requires,
                    describe(world)
                );
            }
        }
        Delete => {
            if let Some((dependent, state)) = world.dependent_in_the_way(key) {
                panic!(
                    "lost delete {key} sent again while its dependent {dependent} may exist: \
                     {state:?}\n{}",
                    describe(world)
                );
            }
        }
        OperationKind::Read => {}
    }
}

/// Runs `action` and returns the items it marks dirty (the world's dirty
/// set gains them as usual).
fn changes(world: &mut World, action: impl FnOnce(&mut World)) -> BTreeSet<ItemRef> {
    let before = std::mem::take(&mut world.dirty);
    action(world);
    let changed = std::mem::replace(&mut world.dirty, before);
    world.dirty.extend(changed.iter().cloned());
    changed
}

fn random_action(world: &mut World, spec: &CaseSpec, rng: &mut StdRng, plan: &Plan) {
    let ready: Vec<usize> = plan.ready().collect();
    let in_flight: Vec<(ItemRef, OperationKind)> = world
        .current
        .iter()
        .filter_map(|(key, c)| c.in_flight.as_ref().map(|op| (key.clone(), op.kind)))
        .collect();
    let mut roll = rng.random_range(0..100);
    if roll < 45 && ready.is_empty() {
        roll = 45;
    }
    if (45..80).contains(&roll) && in_flight.is_empty() {
        roll = if ready.is_empty() { 80 } else { 0 };
    }
    match roll {
        0..45 => {
            let mut chosen: Vec<usize> = ready
                .iter()
                .copied()
                .filter(|_| rng.random_bool(0.6))
                .collect();
            if chosen.is_empty() {
                chosen.push(ready[rng.random_range(0..ready.len())]);
            }
            for index in chosen {
                let operation = &plan.operations[index];
                world.dispatch(&operation.item, operation.kind, operation.target_generation);
            }
        }
        45..80 => {
            let (key, kind) = in_flight[rng.random_range(0..in_flight.len())].clone();
            let completion = random_completion(world, rng);
            world.script(kind, &key.to_string(), completion);
            world.finish(&key, kind);
        }
        80..88 => world.environment.now_ms += rng.random_range(0..2_500),
        88..92 => {
            let item_type = TYPES[rng.random_range(0..TYPES.len())].to_string();
            if !world.environment.disconnected.remove(&item_type) {
                world.environment.disconnected.insert(item_type);
            }
        }
        92..97 => {
            let externals: Vec<usize> = (0..spec.external.len())
                .filter(|&i| spec.external[i])
                .collect();
            if externals.is_empty() {
                return;
            }
            let index = externals[rng.random_range(0..externals.len())];
            let name = identity(spec, index);
            let key = parse_ref(&name);
            match (world.current.get(&key).cloned(), rng.random_range(0..3)) {
                (None, _) => world.report_external(&name, random_properties(rng)),
                (Some(_), 0) => world.remove_external(&name),
                (Some(existing), _) => {
                    // A report marking the item modified: new values, and
                    // its modification counter moves.
                    let mut modified = (*existing).clone();
                    let mut applied = modified.applied.as_deref().cloned().unwrap_or_default();
                    applied.properties =
                        Properties::try_from(random_properties(rng)).unwrap_or_default();
                    modified.applied = Some(std::sync::Arc::new(applied));
                    modified.modifications += 1;
                    world.current.insert(key.clone(), modified);
                    touch(world, &key);
                }
            }
        }
        _ => {
            let asking: Vec<ItemRef> = world
                .current
                .iter()
                .filter(|(key, c)| &**key.item_type() == "q" && c.in_flight.is_none())
                .map(|(key, _)| key.clone())
                .collect();
            if asking.is_empty() {
                return;
            }
            let key = asking[rng.random_range(0..asking.len())].clone();
            let Some(generation) = world.intended.get(&key).map(|i| i.generation) else {
                return;
            };
            let mut answered = (**world.current.get(&key).expect("listed")).clone();
            answered.rare.update(|rare| {
                rare.needs_recreate_answer = Some((generation, rng.random_bool(0.5)))
            });
            world.current.insert(key.clone(), answered);
            touch(world, &key);
        }
    }
}

/// Drives a world through the case's intents, checking at every step.
///
/// `check` gets the world and the items changed since the last pass (an
/// intent change, a result, a report: what the engine seeds its next pass
/// with).
fn drive(
    spec: &CaseSpec,
    profile: Profile,
    seed: u64,
    mut check: impl FnMut(&World, &BTreeSet<ItemRef>, &mut StdRng) -> Result<(), String>,
) -> Result<World, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut world = new_world();
    for index in (0..spec.external.len()).filter(|&i| spec.external[i]) {
        if rng.random_bool(0.7) {
            world.report_external(&identity(spec, index), random_properties(&mut rng));
        }
    }
    let mut fresh = world.dirty.clone();
    for (phase, intent) in spec.intents.iter().enumerate() {
        fresh.extend(changes(&mut world, |world| {
            world.intend(build(spec, intent));
        }));
        for step in 0..profile.steps_per_intent {
            check(&world, &fresh, &mut rng)
                .map_err(|message| format!("intent {phase}, step {step}: {message}"))?;
            fresh = random_step(&mut world, spec, profile, &mut rng);
        }
    }
    check(&world, &fresh, &mut rng)?;
    Ok(world)
}

// ----- settling ------------------------------------------------------------------

/// Calm rounds a world gets to settle in.
const CALM_ROUNDS: usize = 60;

/// Property (4): once the weather clears, the world settles. Every type is
/// served again, retry times pass, every lost operation is decided (its
/// agent says it runs it, that it does not, or nothing) and every
/// operation succeeds. Within
/// [`CALM_ROUNDS`] rounds nothing runs or is UNKNOWN and nothing is
/// planned, and what still waits, waits for what only an intent change or
/// a report moves ([`check_what_waits`]), never for an operation that will
/// not come.
fn check_settles(world: &mut World, rng: &mut StdRng) -> Result<(), String> {
    world.environment.disconnected.clear();
    let mut waiting = Vec::new();
    for _ in 0..CALM_ROUNDS {
        world.environment.now_ms += 3_600_000;
        let unknown: Vec<ItemRef> = items_where(world, |entry| entry.state == ItemState::Unknown);
        for key in &unknown {
            let agent_holds = [None, Some(false), Some(true)][rng.random_range(0..3)];
            decide_lost(world, key, agent_holds);
        }
        let running: Vec<(ItemRef, OperationKind)> = world
            .current
            .iter()
            .filter(|(_, entry)| entry.state != ItemState::Unknown)
            .filter_map(|(key, entry)| entry.in_flight.as_ref().map(|op| (key.clone(), op.kind)))
            .collect();
        for (key, kind) in running {
            world.finish(&key, kind);
        }
        let plan = plan_everything(&world.intended, &world.current, &world.environment);
        world.absorb(&plan);
        // Settled: the plan changes nothing (its bookkeeping, such as an
        // item forgotten, can make the next pass plan more), and nothing
        // waits for a retry time the next round's hour passes (a poison
        // operation decided this round fails with one).
        let changes_nothing = plan.operations.is_empty()
            && plan.forget.is_empty()
            && plan.settle.is_empty()
            && plan.cancel.is_empty()
            && !plan.waiting.iter().any(|w| w.reason == WaitReason::Backoff);
        if changes_nothing && items_where(world, CurrentItem::is_busy).is_empty() {
            return check_what_waits(world, &plan);
        }
        for index in plan.ready().collect::<Vec<_>>() {
            let operation = &plan.operations[index];
            world.dispatch(&operation.item, operation.kind, operation.target_generation);
        }
        waiting = plan.waiting;
    }
    Err(format!(
        "not settled after {CALM_ROUNDS} calm rounds; busy: {:?}\n{}waiting: {waiting:#?}",
        items_where(world, CurrentItem::is_busy),
        describe(world)
    ))
}

/// The current items for which `test` holds.
fn items_where(world: &World, test: impl Fn(&CurrentItem) -> bool) -> Vec<ItemRef> {
    world
        .current
        .iter()
        .filter(|(_, entry)| test(entry))
        .map(|(key, _)| key.clone())
        .collect()
}

/// In a settled world, each waiting item waits for something only an
/// intent change or a report moves: its own terminal failure, or, for
/// each thing it names, an item that is missing (neither intended nor
/// reported), failed terminally, created with a predicate on it false (or
/// not evaluable), or waiting itself for such reasons, down to one of
/// those (a least fixpoint, so a cycle of waiting items explains nothing).
fn check_what_waits(world: &World, plan: &Plan) -> Result<(), String> {
    let permanent = |item: &WaitingItem, blocker: &BlockedBy| {
        blocker.shows_terminal_failure()
            || item.reason == WaitReason::Dependency
                && match world.current.get(&blocker.item) {
                    None => world
                        .intended
                        .get(&blocker.item)
                        .is_none_or(|i| i.item.external),
                    Some(current) => current.is_created() && blocker.why.starts_with("predicate"),
                }
    };
    let mut explained: BTreeSet<&ItemRef> = BTreeSet::new();
    loop {
        let before = explained.len();
        for item in &plan.waiting {
            let reason_allows = matches!(item.reason, WaitReason::Dependency | WaitReason::Blocked);
            let every_blocker_explained = !item.blocked_by.is_empty()
                && item
                    .blocked_by
                    .iter()
                    .all(|blocker| permanent(item, blocker) || explained.contains(&blocker.item));
            if item.reason == WaitReason::TerminalFailure
                || reason_allows && every_blocker_explained
            {
                explained.insert(&item.item);
            }
        }
        if explained.len() == before {
            break;
        }
    }
    let mut problems = String::new();
    for item in plan.waiting.iter().filter(|w| !explained.contains(&w.item)) {
        let _ = writeln!(
            problems,
            "{} waits ({:?}) for {:?}, which neither needs a change nor waits for one",
            item.item,
            item.reason,
            item.blocked_by
                .iter()
                .map(|b| format!(
                    "{} ({}, {:?})",
                    b.item,
                    b.why,
                    world.current.get(&b.item).map(|c| c.state)
                ))
                .collect::<Vec<_>>()
        );
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(format!(
        "a calm world wedged\n{problems}{}waiting: {:#?}",
        describe(world),
        plan.waiting
    ))
}

/// Cases per property: 250, or `ORACLE_PROPTEST_CASES` for a longer search.
fn cases() -> u32 {
    std::env::var("ORACLE_PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(250)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    #[test]
    fn the_planner_agrees_with_the_oracle(spec in case_strategy(EVERYDAY), seed in any::<u64>()) {
        drive(&spec, EVERYDAY, seed, |world, _, _| check_against_oracle(world)).map(drop)
        .map_err(TestCaseError::fail)?;
    }

    #[test]
    fn the_planner_agrees_with_the_oracle_in_uncertain_worlds(
        spec in case_strategy(UNCERTAIN),
        seed in any::<u64>(),
    ) {
        drive(&spec, UNCERTAIN, seed, |world, _, _| check_against_oracle(world)).map(drop)
        .map_err(TestCaseError::fail)?;
    }

    #[test]
    fn worlds_settle_once_the_weather_clears(spec in case_strategy(EVERYDAY), seed in any::<u64>()) {
        let mut world = drive(&spec, EVERYDAY, seed, |_, _, _| Ok(()))
            .map_err(TestCaseError::fail)?;
        check_settles(&mut world, &mut StdRng::seed_from_u64(!seed)).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn uncertain_worlds_settle_once_the_weather_clears(
        spec in case_strategy(UNCERTAIN),
        seed in any::<u64>(),
    ) {
        let mut world = drive(&spec, UNCERTAIN, seed, |_, _, _| Ok(()))
            .map_err(TestCaseError::fail)?;
        check_settles(&mut world, &mut StdRng::seed_from_u64(!seed)).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn seeded_plans_agree_with_the_full_plan(spec in case_strategy(EVERYDAY), seed in any::<u64>()) {
        drive(&spec, EVERYDAY, seed, check_incremental).map(drop)
        .map_err(TestCaseError::fail)?;
    }

    #[test]
    fn the_planner_agrees_with_the_oracle_in_deep_worlds(spec in case_strategy(DEEP), seed in any::<u64>()) {
        drive(&spec, DEEP, seed, |world, _, _| check_against_oracle(world)).map(drop)
        .map_err(TestCaseError::fail)?;
    }

    #[test]
    fn deep_worlds_settle_once_the_weather_clears(spec in case_strategy(DEEP), seed in any::<u64>()) {
        let mut world = drive(&spec, DEEP, seed, |_, _, _| Ok(()))
            .map_err(TestCaseError::fail)?;
        check_settles(&mut world, &mut StdRng::seed_from_u64(!seed)).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn seeded_plans_agree_with_the_full_plan_in_deep_worlds(spec in case_strategy(DEEP), seed in any::<u64>()) {
        drive(&spec, DEEP, seed, check_incremental).map(drop)
        .map_err(TestCaseError::fail)?;
    }

    #[test]
    fn seeded_plans_agree_with_the_full_plan_in_uncertain_worlds(
        spec in case_strategy(UNCERTAIN),
        seed in any::<u64>(),
    ) {
        drive(&spec, UNCERTAIN, seed, check_incremental).map(drop)
        .map_err(TestCaseError::fail)?;
    }
}

// ----- the oracle on DESIGN's own examples -------------------------------------------

fn decision(plan: &OraclePlan, identity: &str) -> super::oracle::ItemDecision {
    plan.items
        .get(&parse_ref(identity))
        .cloned()
        .unwrap_or_else(|| panic!("{identity} has a decision"))
}

fn oracle_of(world: &World) -> OraclePlan {
    oracle_plan(&world.intended, &world.current, &world.environment)
}

fn ready_labels(plan: &OraclePlan) -> Vec<String> {
    plan.ready()
        .iter()
        .map(|(item, kind)| format!("{} {item}", kind.as_str()))
        .collect()
}

#[test]
fn the_oracle_deletes_a_removed_chain_bottom_last_and_keeps_the_rest_pending() {
    // A on B on C; removing C deletes A, then B, then C (rule 7).
    let a = || item("t/a", json!({})).depends_on(on("t/b"));
    let b = || item("t/b", json!({})).depends_on(on("t/c"));
    let mut world = World::converged(vec![a(), b(), item("t/c", json!({}))]);
    world.intend(vec![a(), b()]);
    let plan = oracle_of(&world);
    assert_eq!(ready_labels(&plan), ["delete t/a"]);
    assert_eq!(decision(&plan, "t/a").needs(), Needs::Recreate);
    assert_eq!(decision(&plan, "t/c").needs(), Needs::Delete);
    assert_eq!(
        plan.waiting(),
        [parse_ref("t/a"), parse_ref("t/b")].into_iter().collect()
    );
    assert_eq!(normal_of_oracle(&plan), normal_of_plan(&world.plan()));
}

#[test]
fn the_oracle_retargets_with_a_modify_before_the_delete() {
    let mut world = World::converged(vec![
        item("t/a", json!({})),
        item("t/c", json!({})),
        item("t/b", json!({})).depends_on(on("t/a")),
    ]);
    world.intend(vec![
        item("t/c", json!({})),
        item("t/b", json!({})).depends_on(on("t/c")),
    ]);
    let plan = oracle_of(&world);
    assert_eq!(ready_labels(&plan), ["modify t/b"]);
    assert_eq!(
        decision(&plan, "t/a").delete,
        Some(Decision::Waiting {
            reason: WaitReason::Blocked
        })
    );
}

#[test]
fn the_oracle_recreates_on_a_recreate_path_and_cascades() {
    let mut world = World::converged(vec![
        item("u/v", json!({"id": 1})),
        item("t/b", json!({})).depends_on(on("u/v")),
    ]);
    world.environment.rules.insert(
        "u".into(),
        TypeRules {
            recreate_on_change: vec!["/id".into()],
            ask_needs_recreate: false,
        },
    );
    world.intend(vec![
        item("u/v", json!({"id": 2})),
        item("t/b", json!({})).depends_on(on("u/v")),
    ]);
    let plan = oracle_of(&world);
    assert_eq!(decision(&plan, "u/v").own_need, OwnNeed::Recreate);
    assert_eq!(decision(&plan, "t/b").needs(), Needs::Recreate);
    assert_eq!(ready_labels(&plan), ["delete t/b"]);
    assert_eq!(plan.planned().len(), 4);
    assert_eq!(normal_of_oracle(&plan), normal_of_plan(&world.plan()));
}

#[test]
fn the_oracle_deletes_a_dependent_before_a_modify_that_breaks_its_predicate() {
    let dependent = || item("t/b", json!({})).depends_on(on("t/a").with_must_satisfy("self.up"));
    let mut world = World::converged(vec![item("t/a", json!({"up": true})), dependent()]);
    world.intend(vec![item("t/a", json!({"up": false})), dependent()]);
    let plan = oracle_of(&world);
    assert_eq!(ready_labels(&plan), ["delete t/b"]);
    assert_eq!(
        plan.predecessors(&(parse_ref("t/a"), Modify)),
        [(parse_ref("t/b"), Delete)].into_iter().collect()
    );
    assert_eq!(normal_of_oracle(&plan), normal_of_plan(&world.plan()));
}

#[test]
fn the_oracle_drops_auto_deleted_dependents_of_a_vanished_external_item() {
    let mut world = World::new();
    world.report_external("ext/e", json!({}));
    let external = external("ext/e");
    let intent = vec![
        external,
        item("t/auto", json!({})).depends_on(on("ext/e").with_auto_deleted_by_external(true)),
        item("t/plain", json!({})).depends_on(on("ext/e")),
    ];
    world.intend(intent);
    world.run_to_quiescence(5);
    world.remove_external("ext/e");
    let plan = oracle_of(&world);
    assert_eq!(decision(&plan, "t/auto").needs(), Needs::Drop);
    assert_eq!(decision(&plan, "t/plain").needs(), Needs::Recreate);
    assert_eq!(ready_labels(&plan), ["delete t/plain"]);
    assert_eq!(normal_of_oracle(&plan), normal_of_plan(&world.plan()));
}

#[test]
fn the_oracle_keeps_creates_behind_same_type_deletes() {
    let mut world = World::converged(vec![item("port/old", json!({}))]);
    world.intend(vec![item("port/new", json!({}))]);
    let plan = oracle_of(&world);
    assert_eq!(ready_labels(&plan), ["delete port/old"]);
    assert_eq!(plan.planned().len(), 2);
    assert_eq!(
        plan.predecessors(&(parse_ref("port/new"), Create)),
        [(parse_ref("port/old"), Delete)].into_iter().collect()
    );
    assert_eq!(normal_of_oracle(&plan), normal_of_plan(&world.plan()));
}

// ----- planner bugs found by the oracle --------------------------------------------
//
// Each test states what DESIGN says, with the smallest graph that shows the
// planner doing otherwise. They fail against the current planner and are
// ignored so that the suite stays usable; run them with
// `cargo test -p reconciled --lib engine::plan::oracle_properties -- --ignored`
// and drop the `ignore` once planner.rs is fixed (the properties' masks for
// the bug go at the same time).

/// The operations of a plan, as "kind item" labels, and the ready ones.
fn labels_of(plan: &Plan) -> (Vec<String>, Vec<String>) {
    let label = |index: usize| {
        let operation = &plan.operations[index];
        format!("{} {}", operation.kind.as_str(), operation.item)
    };
    (
        (0..plan.operations.len()).map(label).collect(),
        plan.ready().map(label).collect(),
    )
}

#[test]
fn planner_bug_1_a_retargeted_dependent_is_modified_not_deleted() {
    // Rule 7: "A dependent whose intended value no longer needs the removed
    // item, and whose new dependencies are satisfied, is modified instead of
    // deleted, and the Delete waits for that Modify (retargeting A from B to
    // C: Modify A, then Delete B)." b moves from a to c; a leaves.
    let mut world = World::converged(vec![
        item("t/a", json!({})),
        item("t/c", json!({})),
        item("t/b", json!({})).depends_on(on("t/a")),
    ]);
    world.intend(vec![
        item("t/c", json!({})),
        item("t/b", json!({})).depends_on(on("t/c")),
    ]);
    let oracle = oracle_of(&world);
    assert_eq!(ready_labels(&oracle), ["modify t/b"]);
    for plan in [
        world.plan(),
        plan_everything(&world.intended, &world.current, &world.environment),
    ] {
        let (planned, ready) = labels_of(&plan);
        // The planner plans "modify t/b" and "delete t/b", both ready, and
        // "delete t/a" after "delete t/b"; the engine dispatches every
        // ready operation, so b is modified and deleted at once.
        assert!(
            !planned.contains(&"delete t/b".to_string()),
            "b must be modified instead of deleted: {planned:?}"
        );
        assert_eq!(ready, ["modify t/b"]);
        assert!(
            plan.waiting.iter().any(|w| w.item == parse_ref("t/a")),
            "a's delete waits for b's modify"
        );
    }
}

#[test]
fn planner_bug_1_a_busy_retargeting_dependent_is_not_given_a_delete() {
    // The same root cause through an in-flight operation's edges: b's
    // Modify toward a value that depends on a is in flight; the intent now
    // removes a and moves b off it again. b must not be planned for
    // deletion (rule 7), and c, which depends on b, must not be deleted.
    let mut world = World::converged(vec![
        item("t/a", json!({})),
        item("t/b", json!({"v": 1})),
        item("t/c", json!({})).depends_on(on("t/b")),
    ]);
    world.intend(vec![
        item("t/a", json!({})),
        item("t/b", json!({"v": 2})).depends_on(on("t/a")),
        item("t/c", json!({})).depends_on(on("t/b")),
    ]);
    let b = parse_ref("t/b");
    world.dispatch(&b, Modify, world.generation);
    world.intend(vec![
        item("t/b", json!({"v": 3})),
        item("t/c", json!({})).depends_on(on("t/b")),
    ]);
    let oracle = oracle_of(&world);
    assert!(!decision(&oracle, "t/b").planned_for_deletion);
    assert!(!decision(&oracle, "t/c").planned_for_deletion);
    let plan = plan_everything(&world.intended, &world.current, &world.environment);
    let (planned, _) = labels_of(&plan);
    assert!(
        !planned.contains(&"delete t/c".to_string()),
        "c stays: nothing it relies on goes away: {planned:?}"
    );
    assert!(
        plan.waiting
            .iter()
            .all(|w| w.item != b || w.operation != Delete),
        "b is not planned for deletion: {:?}",
        plan.waiting
    );
}

#[test]
fn planner_bug_2_a_leaving_dependent_whose_predicate_breaks_is_deleted_before_the_modify() {
    // Rule 6: "A dependent whose predicate fails for the new value of its
    // dependency is deleted before that dependency is modified." b requires
    // a.up; a turns down and b leaves the intent in the same submit. The
    // planner readies "modify t/a" and "delete t/b" together, so a is
    // modified under a b that still exists and relies on a.up.
    let dependent = item("t/b", json!({})).depends_on(on("t/a").with_must_satisfy("self.up"));
    let mut world = World::converged(vec![item("t/a", json!({"up": true})), dependent]);
    world.intend(vec![item("t/a", json!({"up": false}))]);
    let oracle = oracle_of(&world);
    assert_eq!(ready_labels(&oracle), ["delete t/b"]);
    let plan = world.plan();
    let (planned, ready) = labels_of(&plan);
    assert_eq!(planned, ["delete t/b", "modify t/a"]);
    assert_eq!(ready, ["delete t/b"], "modify t/a waits for delete t/b");
}

#[test]
fn planner_bug_2_a_cascaded_dependent_whose_predicate_breaks_is_deleted_before_the_modify() {
    // The same with a dependent that stays intended but is deleted because
    // another dependency of it (x) leaves: c requires a.up and x; a turns
    // down and x leaves. Whether the planner orders "modify t/a" after
    // "delete t/c" depends on the order it happens to visit c and x.
    let dependent = || {
        item("t/c", json!({}))
            .depends_on(on("t/a").with_must_satisfy("self.up"))
            .depends_on(on("t/x"))
    };
    let mut world = World::converged(vec![
        item("t/a", json!({"up": true})),
        item("t/x", json!({})),
        dependent(),
    ]);
    world.intend(vec![item("t/a", json!({"up": false})), dependent()]);
    let oracle = oracle_of(&world);
    assert_eq!(ready_labels(&oracle), ["delete t/c"]);
    for plan in [
        world.plan(),
        plan_everything(&world.intended, &world.current, &world.environment),
    ] {
        let (_, ready) = labels_of(&plan);
        assert_eq!(ready, ["delete t/c"], "modify t/a waits for delete t/c");
    }
}

#[test]
fn planner_bug_3_a_create_waits_for_a_same_type_delete_in_flight_in_a_seeded_pass() {
    // Rule 8: Creates wait for Deletes of the same type (in flight, and the
    // plan's own), "two items contending for one resource never race". Two
    // submits: the first removes port/old (its Delete is dispatched), the
    // second adds port/new. The engine plans the second submit from the
    // items it changed (owner.rs: `Scope::Items(change.content_changed)`),
    // and that plan readies the Create while the Delete still runs.
    let mut world = World::converged(vec![item("port/old", json!({"port": 80}))]);
    world.intend(vec![]);
    let first = world.plan();
    world.absorb(&first);
    world.dispatch(&parse_ref("port/old"), Delete, 0);
    world.intend(vec![item("port/new", json!({"port": 80}))]);

    let full = plan_everything(&world.intended, &world.current, &world.environment);
    assert!(full.operations.is_empty(), "the full plan holds the create");
    let seeded = world.plan_seeded(&["port/new"], &world.dirty);
    let (planned, _) = labels_of(&seeded);
    assert!(
        planned.is_empty(),
        "create port/new must wait for the delete of port/old in flight: {planned:?}"
    );
    assert_eq!(
        seeded.waiting.first().map(|w| (w.item.clone(), w.reason)),
        Some((parse_ref("port/new"), WaitReason::Blocked))
    );
}

#[test]
fn planner_bug_3_a_create_waits_for_a_same_type_delete_of_the_plan_in_a_seeded_pass() {
    // The same with a Delete that is ready but not dispatched (its retry
    // time just passed, or the type's in-flight limit held it back): the
    // plan of a submit that only adds port/new readies the Create anyway.
    let mut world = World::converged(vec![item("port/old", json!({"port": 80}))]);
    world.fail(Delete, "port/old", code::UNAVAILABLE);
    world.intend(vec![]);
    world.pass();
    world.environment.now_ms += 1_000;
    world.intend(vec![item("port/new", json!({"port": 80}))]);

    let full = plan_everything(&world.intended, &world.current, &world.environment);
    let (_, full_ready) = labels_of(&full);
    assert_eq!(full_ready, ["delete port/old"]);
    let seeded = world.plan_seeded(&["port/new"], &world.dirty);
    let (_, ready) = labels_of(&seeded);
    assert_eq!(
        ready,
        ["delete port/old"],
        "create port/new must not race the delete of port/old"
    );
}

#[test]
fn planner_bug_4_a_dependent_whose_dependency_was_modified_is_recreated_even_if_it_changed() {
    // Rule 4: "A recreate is needed when ... a dependency with
    // recreate_when_modified points to an item that was modified since the
    // dependent was created." An external item is reported modified and
    // the dependent's intent changes too: the planner modifies b in place
    // (against the modified dependency), then recreates it on the next
    // pass: modify, delete, create instead of delete, create.
    let mut world = World::new();
    world.report_external("ext/e", json!({"v": 1}));
    let external = external("ext/e");
    let dependent = |v: u8| {
        item("t/b", json!({"v": v})).depends_on(on("ext/e").with_recreate_when_modified(true))
    };
    world.intend(vec![external.clone(), dependent(1)]);
    world.run_to_quiescence(5);
    world.mark_modified("ext/e");
    world.intend(vec![external, dependent(2)]);

    let oracle = oracle_of(&world);
    assert_eq!(decision(&oracle, "t/b").needs(), Needs::Recreate);
    world.run_to_quiescence(5);
    assert_eq!(
        world.labels(),
        ["create t/b", "delete t/b", "create t/b"],
        "no modify in place against a modified dependency"
    );
}

#[test]
fn planner_bug_5_an_auto_deleted_dependent_is_dropped_whatever_the_order_of_its_dependencies() {
    // Rule 9: when an external item disappears, "dependents with
    // auto_deleted_by_external are dropped from current state without a
    // Delete call". b relies on two external items, ext/plain and
    // ext/auto (auto_deleted_by_external), and both disappear. The planner
    // looks at the first gone dependency only: listed first, ext/plain
    // makes it Delete b; listed first, ext/auto makes it drop b. Equality
    // ignores dependency order, so the outcome must not depend on it.
    let externals = || ["ext/plain", "ext/auto"].map(external);
    let auto = || on("ext/auto").with_auto_deleted_by_external(true);
    let orders = [
        item("t/b", json!({}))
            .depends_on(on("ext/plain"))
            .depends_on(auto()),
        item("t/b", json!({}))
            .depends_on(auto())
            .depends_on(on("ext/plain")),
    ];
    for dependent in orders {
        let mut world = World::new();
        world.report_external("ext/plain", json!({}));
        world.report_external("ext/auto", json!({}));
        let mut intent = externals().to_vec();
        intent.push(dependent.clone());
        world.intend(intent);
        world.run_to_quiescence(5);
        world.remove_external("ext/plain");
        world.remove_external("ext/auto");

        let oracle = oracle_of(&world);
        assert_eq!(decision(&oracle, "t/b").needs(), Needs::Drop);
        let plan = world.plan();
        assert_eq!(
            plan.forget,
            [(parse_ref("t/b"), super::ForgetReason::DeletedWithExternal)],
            "b is dropped without a delete call ({:?} first)",
            dependent.dependencies[0].requires
        );
        assert!(plan.operations.is_empty(), "{:?}", plan.operations);
    }
}

#[test]
fn planner_bug_6_a_modify_is_ordered_the_same_whatever_the_seeds() {
    // q/c relies on t/a and t/x; the intent modifies a, removes x (so c is
    // deleted, and stays pending) and makes c's dependency on a
    // recreate_when_modified. c's type has no configurator, so c's Delete
    // waits. Whether a's Modify waits for c's Delete is a matter of reading
    // (c is deleted anyway), but the planner's answer depends on the order
    // it visits c and x: the full plan readies the Modify, a pass seeded
    // with a and c holds it behind c's Delete for as long as q has no
    // configurator.
    let mut world = World::converged(vec![
        item("t/a", json!({"v": 1})),
        item("t/x", json!({})),
        item("q/c", json!({}))
            .depends_on(on("t/a"))
            .depends_on(on("t/x")),
    ]);
    world.environment.disconnected.insert("q".into());
    world.intend(vec![
        item("t/a", json!({"v": 2})),
        item("q/c", json!({}))
            .depends_on(on("t/a").with_recreate_when_modified(true))
            .depends_on(on("t/x")),
    ]);
    let full = plan_everything(&world.intended, &world.current, &world.environment);
    let seeded = world.plan_seeded(&["q/c", "t/a"], &world.dirty);
    let (_, full_ready) = labels_of(&full);
    let (_, seeded_ready) = labels_of(&seeded);
    assert_eq!(
        seeded_ready, full_ready,
        "a pass must not hold what another pass over the same state dispatches"
    );
}

#[test]
fn planner_bug_2_every_modify_that_breaks_a_predicate_waits_for_the_delete() {
    // c requires a.v >= 1 and b.v != 2; both a and b are modified into
    // values that break those predicates (and c moves off both). Rule 6:
    // c is deleted before a is modified, and before b is modified. The
    // planner orders only the first of them (in declaration order) after
    // the delete and readies the other with it.
    let mut world = World::converged(vec![
        item("t/a", json!({"v": 1})),
        item("t/b", json!({"v": 0})),
        item("t/c", json!({}))
            .depends_on(on("t/a").with_must_satisfy("self.v >= 1"))
            .depends_on(on("t/b").with_must_satisfy("self.v != 2")),
    ]);
    world.intend(vec![
        item("t/a", json!({"v": 0})),
        item("t/b", json!({"v": 2})),
        item("t/c", json!({})),
    ]);
    let oracle = oracle_of(&world);
    assert_eq!(ready_labels(&oracle), ["delete t/c"]);
    let (_, ready) = labels_of(&world.plan());
    assert_eq!(ready, ["delete t/c"], "both modifies wait for delete t/c");
}

#[test]
fn planner_bug_7_a_dependent_retargeted_onto_a_removed_item_is_deleted_with_its_dependents() {
    // b relies on x and z on b. The intent removes x and s and moves b
    // from x onto s. b's new dependency is planned for deletion, so it is
    // not satisfied: rule 7's exception does not apply, and b goes with x,
    // z first (rule 7: "removing an item deletes its dependents first, at
    // every depth"). b's last Modify failed and waits for its retry time,
    // which must not matter: "planned for deletion follows from the diff,
    // not from whether the Delete can be dispatched yet" (rule 8). The
    // planner decides that b retargets away while visiting x, before it
    // has visited s, and so spares b and z: only "delete t/s" is ready.
    let b_on = |target: &str, v: u8| item("t/b", json!({"v": v})).depends_on(on(target));
    let z = || item("t/z", json!({})).depends_on(on("t/b"));
    let mut world = World::converged(vec![
        item("t/x", json!({})),
        item("t/s", json!({})),
        b_on("t/x", 1),
        z(),
    ]);
    world.fail(Modify, "t/b", code::UNAVAILABLE);
    world.intend(vec![
        item("t/x", json!({})),
        item("t/s", json!({})),
        b_on("t/x", 2),
        z(),
    ]);
    world.pass();
    assert_eq!(world.labels(), ["modify t/b"]);
    world.intend(vec![b_on("t/s", 2), z()]);

    let oracle = oracle_of(&world);
    assert!(decision(&oracle, "t/b").planned_for_deletion);
    assert_eq!(ready_labels(&oracle), ["delete t/s", "delete t/z"]);
    let plan = plan_everything(&world.intended, &world.current, &world.environment);
    let (_, ready) = labels_of(&plan);
    assert_eq!(ready, ["delete t/s", "delete t/z"]);
}

/// Found by `seeded_plans_agree_with_the_full_plan` on 2026-12-03: a
/// Modify whose new dependency's predicate fails for that dependency's
/// intended value, the dependency's Create looking ready until the pass
/// examines a Delete of its type in flight. A seeded pass deleted the item
/// (rule 5) in the round that found the Delete; the full plan and the
/// oracle have its Modify wait for the blocked Create.
#[test]
fn a_seeded_pass_does_not_delete_for_a_create_it_then_finds_blocked() {
    // The case the property shrank to, written with `item(v, id, deps)`
    // for a present item, `dep(target, predicate)` for a plain edge.
    let item = |v, id, dependencies| {
        Some(ItemSpec {
            v,
            id,
            dependencies,
        })
    };
    let dep = |target, predicate| DependencySpec {
        target,
        predicate,
        recreate_when_modified: false,
        auto_deleted: false,
    };
    let spec = CaseSpec {
        external: vec![false, true, false, true, false, false, true, true],
        intents: vec![
            vec![
                item(0, 0, vec![]),
                None,
                item(0, 0, vec![]),
                None,
                item(0, 0, vec![]),
                item(0, 0, vec![dep(4, None)]),
                None,
                None,
            ],
            vec![
                item(0, 1, vec![]),
                None,
                item(1, 0, vec![]),
                None,
                item(0, 0, vec![dep(0, None)]),
                item(0, 1, vec![]),
                None,
                None,
            ],
            vec![
                None,
                None,
                item(0, 0, vec![]),
                None,
                item(0, 0, vec![]),
                item(0, 1, vec![dep(4, Some(3))]),
                None,
                None,
            ],
        ],
    };
    let seed: u64 = 8593759099744228198;

    let oracle = drive(&spec, EVERYDAY, seed, |world, _, _| {
        check_against_oracle(world)
    });
    let incremental = drive(&spec, EVERYDAY, seed, check_incremental);
    assert!(
        oracle.is_ok() && incremental.is_ok(),
        "oracle: {:?}\nincremental: {:?}",
        oracle.err(),
        incremental.err()
    );
}
