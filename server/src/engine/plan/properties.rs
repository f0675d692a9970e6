//! Property tests of the planner over random graphs and random changes.
//!
//! (a) with configurators that always succeed, operations executed in a
//!     random order that respects the partial order (several in flight at
//!     once) converge current to intended, except items that must stay
//!     pending, within a bounded number of steps;
//! (b) no Create or Modify runs before its dependencies are created, and no
//!     Delete before its dependents are gone (checked at every dispatch by
//!     the test world);
//! (c) equal graphs give an empty plan;
//! (d) planning is deterministic, and planning from the dirty set gives the
//!     same operations as planning everything.

use std::collections::BTreeSet;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::{TypeRules, plan_everything};
use crate::engine::testkit::{World, item, on};
use crate::graph::{Item, ItemRef, OperationKind};

/// A generated item: index, type, properties and dependencies on lower
/// indices (so every generated graph is acyclic).
#[derive(Clone, Debug)]
struct Spec {
    index: usize,
    item_type: &'static str,
    value: u8,
    id: u8,
    dependencies: Vec<(usize, bool)>,
    external: bool,
}

fn identity(index: usize, item_type: &str) -> String {
    format!("{item_type}/i{index:02}")
}

fn build(specs: &[Spec], types: &[&'static str]) -> Vec<Item> {
    specs
        .iter()
        .map(|spec| {
            let mut built = item(
                &identity(spec.index, spec.item_type),
                json!({"v": spec.value, "id": spec.id}),
            );
            built.external = spec.external;
            if !spec.external {
                for (target, recreate) in &spec.dependencies {
                    let target_type = types[*target];
                    built = built.depends_on(
                        on(&identity(*target, target_type)).with_recreate_when_modified(*recreate),
                    );
                }
            }
            built
        })
        .collect()
}

const SIZE: usize = 10;

/// Types of the SIZE possible items (fixed per index, so identities match
/// between the two graphs).
fn types() -> Vec<&'static str> {
    (0..SIZE)
        .map(|i| if i % 3 == 0 { "u" } else { "t" })
        .collect()
}

fn spec_strategy(index: usize) -> impl Strategy<Value = Option<Spec>> {
    let types = types();
    let item_type = types[index];
    (
        proptest::bool::weighted(0.8),
        0u8..3,
        0u8..2,
        proptest::collection::vec((0..index.max(1), proptest::bool::weighted(0.2)), 0..3),
        proptest::bool::weighted(0.1),
    )
        .prop_map(move |(present, value, id, dependencies, external)| {
            let mut dependencies: Vec<(usize, bool)> =
                if index == 0 { vec![] } else { dependencies };
            dependencies.sort();
            dependencies.dedup_by_key(|(target, _)| *target);
            present.then_some(Spec {
                index,
                item_type,
                value,
                id,
                dependencies,
                external,
            })
        })
}

fn graph_strategy() -> impl Strategy<Value = Vec<Spec>> {
    (0..SIZE)
        .map(spec_strategy)
        .collect::<Vec<_>>()
        .prop_map(|specs| specs.into_iter().flatten().collect())
}

/// Items that must stay pending: a dependency is missing, or is an external
/// item that is not reported, transitively.
fn must_stay_pending(world: &World) -> BTreeSet<ItemRef> {
    let mut pending = BTreeSet::new();
    let mut order: Vec<(ItemRef, Vec<ItemRef>)> = world
        .intended
        .iter()
        .map(|(key, entry)| (key.clone(), entry.item.required_items().cloned().collect()))
        .collect();
    order.sort_by_key(|(key, _)| key.name().clone());
    for (key, required) in order {
        let reported = |r: &ItemRef| {
            world
                .current
                .get(r)
                .and_then(|c| c.applied.as_ref())
                .is_some_and(|a| a.external)
        };
        let blocked = required.iter().any(|r| {
            pending.contains(r)
                || match world.intended.get(r) {
                    None => !reported(r),
                    Some(entry) if entry.item.external => world.current.get(r).is_none(),
                    Some(_) => false,
                }
        });
        if blocked {
            pending.insert(key);
        }
    }
    pending
}

fn converged_except_pending(world: &World) -> Result<(), String> {
    let pending = must_stay_pending(world);
    for (key, entry) in world.intended.iter() {
        if entry.item.external || pending.contains(key) {
            continue;
        }
        let current = world
            .current
            .get(key)
            .ok_or(format!("{key} was never created"))?;
        let equal = current.holds_only(&entry.item);
        if current.state != crate::graph::ItemState::Created || !equal {
            return Err(format!("{key} is {:?}, equal={equal}", current.state));
        }
    }
    for (key, current) in world.current.iter() {
        let external = current.applied.as_ref().is_some_and(|a| a.external);
        if external {
            continue;
        }
        if world.intended.get(key).is_none() {
            return Err(format!("{key} exists but is not intended"));
        }
        if pending.contains(key) {
            return Err(format!("{key} exists but its dependencies cannot be"));
        }
    }
    Ok(())
}

fn world_for(first: &[Spec]) -> World {
    let types = types();
    let mut world = World::new();
    world.environment.rules.insert(
        "u".into(),
        TypeRules {
            recreate_on_change: vec!["/id".into()],
            ask_needs_recreate: false,
        },
    );
    for spec in first.iter().filter(|s| s.external) {
        world.report_external(&identity(spec.index, spec.item_type), json!({}));
    }
    world.intend(build(first, &types));
    world
}

/// Runs the world with a random interleaving of dispatches and completions.
fn run_randomly(world: &mut World, rng: &mut StdRng) -> Result<(), String> {
    let mut in_flight: Vec<(ItemRef, OperationKind)> = Vec::new();
    for _step in 0..2_000 {
        let plan = world.plan();
        let incremental: Vec<_> = plan
            .operations
            .iter()
            .map(|o| (o.item.clone(), o.kind, o.after.clone()))
            .collect();
        let full = plan_everything(&world.intended, &world.current, &world.environment);
        let everything: Vec<_> = full
            .operations
            .iter()
            .map(|o| (o.item.clone(), o.kind, o.after.clone()))
            .collect();
        if incremental != everything {
            return Err(format!(
                "incremental plan {incremental:?} differs from full plan {everything:?}"
            ));
        }
        world.absorb(&plan);
        let ready: Vec<usize> = plan.ready().collect();
        let dispatch = !ready.is_empty() && (in_flight.is_empty() || rng.random_bool(0.5));
        if dispatch {
            let chosen = &plan.operations[ready[rng.random_range(0..ready.len())]];
            world.dispatch(&chosen.item, chosen.kind, chosen.target_generation);
            in_flight.push((chosen.item.clone(), chosen.kind));
        } else if !in_flight.is_empty() {
            let (item, kind) = in_flight.swap_remove(rng.random_range(0..in_flight.len()));
            world.finish(&item, kind);
        } else {
            return Ok(());
        }
    }
    Err("no quiescence within 2000 steps".into())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn random_changes_converge_in_any_valid_order(
        first in graph_strategy(),
        second in graph_strategy(),
        seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut world = world_for(&first);
        run_randomly(&mut world, &mut rng).map_err(TestCaseError::fail)?;
        converged_except_pending(&world).map_err(TestCaseError::fail)?;

        world.intend(build(&second, &types()));
        run_randomly(&mut world, &mut rng).map_err(TestCaseError::fail)?;
        converged_except_pending(&world).map_err(TestCaseError::fail)?;

        // (c) once converged, planning everything gives nothing to do.
        let plan = plan_everything(&world.intended, &world.current, &world.environment);
        prop_assert!(plan.operations.is_empty(), "{:?}", plan.operations);
    }

    #[test]
    fn planning_is_deterministic_for_random_graphs(first in graph_strategy(), second in graph_strategy()) {
        let mut world = world_for(&first);
        let mut rng = StdRng::seed_from_u64(7);
        run_randomly(&mut world, &mut rng).map_err(TestCaseError::fail)?;
        world.intend(build(&second, &types()));
        let once = world.plan();
        let twice = world.plan();
        prop_assert_eq!(once, twice);
    }
}
