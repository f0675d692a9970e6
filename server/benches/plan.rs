//! Planner benchmarks over graphs of 1k to 1M items, each depending on up to
//! 10 earlier items: a full create from empty, one changed item, and 1% of
//! the items changed. Run with `cargo bench -p reconciled --bench plan`.
//! Set `PLAN_BENCH_SIZES=1000,10000` to pick sizes.
//!
//! On a shared machine wall-clock figures swing with the load. With
//! `PLAN_BENCH_CPU_ITERS=N` the bench skips criterion and times N runs of
//! each case by the CPU time of its thread (Linux `schedstat`; a run includes
//! dropping its plan), printing the minimum and the median;
//! `PLAN_BENCH_CASE=full_create` picks cases.

use std::collections::BTreeSet;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reconciled::engine::plan::{PlanEnvironment, TypeRules, plan_operations};
use reconciled::graph::{
    CurrentGraph, CurrentItem, Dependency, IntendedGraph, IntendedItem, Item, ItemRef, Properties,
};
use serde_json::json;

/// The planner's view of the world: every type connected, no rules; the
/// seeds of a pass are the changed items.
struct Environment<'a> {
    changed: &'a BTreeSet<ItemRef>,
}

impl PlanEnvironment for Environment<'_> {
    fn type_rules(&self, _item_type: &str) -> Option<&TypeRules> {
        None
    }
    fn has_configurator(&self, _item_type: &str) -> bool {
        true
    }
    fn now_ms(&self) -> u64 {
        0
    }
    /// As in the server: the changed items are the only unconverged ones.
    fn is_converged(&self, item: &ItemRef) -> bool {
        !self.changed.contains(item)
    }
}

fn name(index: usize) -> String {
    format!("item-{index:07}")
}

fn make_item(index: usize, rng: &mut StdRng, version: u64) -> Item {
    let mut properties = Properties::new();
    properties.insert("index".into(), json!(index));
    properties.insert("version".into(), json!(version));
    let mut item = Item::new("node", name(index), properties);
    if index > 0 {
        let count = rng.random_range(0..=10usize.min(index));
        let mut targets = BTreeSet::new();
        for _ in 0..count {
            targets.insert(rng.random_range(0..index));
        }
        for target in targets {
            item.dependencies
                .push(Dependency::on(ItemRef::new("node", name(target))));
        }
    }
    item
}

struct Graphs {
    intended: IntendedGraph,
    current: CurrentGraph,
    all: BTreeSet<ItemRef>,
}

/// Intended graph of `size` items and a current graph where all of them are
/// created with the same value.
fn converged_graphs(size: usize) -> Graphs {
    let mut rng = StdRng::seed_from_u64(42);
    let mut intended = IntendedGraph::default();
    let mut current = CurrentGraph::default();
    let mut all = BTreeSet::new();
    for index in 0..size {
        let item = make_item(index, &mut rng, 0);
        let key = item.item_ref();
        let entry = IntendedItem {
            item: Arc::new(item),
            generation: 1,
            predicates: Arc::from(Vec::new()),
        };
        current.insert(key.clone(), CurrentItem::created(entry.item.clone(), 1));
        intended.insert(entry);
        all.insert(key);
    }
    Graphs {
        intended,
        current,
        all,
    }
}

/// Changes the `version` property of every `stride`-th item; returns the seeds.
fn change_every(graphs: &mut Graphs, stride: usize) -> BTreeSet<ItemRef> {
    let keys: Vec<ItemRef> = graphs.all.iter().step_by(stride).cloned().collect();
    for key in &keys {
        let entry = graphs.intended.get(key).expect("item exists").clone();
        let mut item = (*entry.item).clone();
        item.properties.insert("version".into(), json!(1));
        graphs.intended.insert(IntendedItem {
            item: Arc::new(item),
            generation: 2,
            predicates: entry.predicates.clone(),
        });
    }
    keys.into_iter().collect()
}

fn sizes() -> Vec<usize> {
    std::env::var("PLAN_BENCH_SIZES")
        .ok()
        .map(|list| {
            list.split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect()
        })
        .unwrap_or_else(|| vec![1_000, 10_000, 100_000, 1_000_000])
}

/// Nanoseconds of CPU time this thread has used, if the system says.
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Runs `run` `iterations` times; prints the minimum and median CPU time.
/// `PLAN_BENCH_CASE` (a part of the label) picks cases.
fn cpu_time<T>(label: &str, iterations: usize, mut run: impl FnMut() -> T) {
    if std::env::var("PLAN_BENCH_CASE").is_ok_and(|case| !label.contains(&case)) {
        return;
    }
    let mut times = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let (Some(start), output) = (thread_cpu_ns(), run()) else {
            println!("{label}: no thread CPU time on this system");
            return;
        };
        drop(black_box(output));
        if let Some(end) = thread_cpu_ns() {
            times.push(end.saturating_sub(start));
        }
    }
    times.sort_unstable();
    let ms = |ns: u64| ns as f64 / 1e6;
    if let (Some(&min), Some(&median)) = (times.first(), times.get(times.len() / 2)) {
        println!(
            "{label}: cpu min {:.3} ms, median {:.3} ms ({iterations} runs)",
            ms(min),
            ms(median)
        );
    }
}

/// The cases of [`bench_plan`], timed by CPU time.
fn cpu_plan(iterations: usize) {
    for size in sizes() {
        let mut graphs = converged_graphs(size);
        let empty = CurrentGraph::default();
        cpu_time(&format!("full_create/{size}"), iterations, || {
            plan_operations(
                &graphs.intended,
                &empty,
                &graphs.all,
                &Environment {
                    changed: &graphs.all,
                },
            )
        });
        let one = change_every(&mut graphs, size);
        cpu_time(&format!("one_changed/{size}"), iterations, || {
            plan_operations(
                &graphs.intended,
                &graphs.current,
                &one,
                &Environment { changed: &one },
            )
        });
        let mut graphs = converged_graphs(size);
        let percent = change_every(&mut graphs, 100);
        cpu_time(&format!("one_percent_changed/{size}"), iterations, || {
            plan_operations(
                &graphs.intended,
                &graphs.current,
                &percent,
                &Environment { changed: &percent },
            )
        });
    }
}

fn bench_plan(c: &mut Criterion) {
    if let Some(iterations) = std::env::var("PLAN_BENCH_CPU_ITERS")
        .ok()
        .and_then(|value| value.parse().ok())
    {
        cpu_plan(iterations);
        return;
    }
    let mut group = c.benchmark_group("plan");
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(5));
    for size in sizes() {
        let mut graphs = converged_graphs(size);
        let empty = CurrentGraph::default();
        group.bench_with_input(BenchmarkId::new("full_create", size), &size, |b, _| {
            b.iter(|| {
                black_box(plan_operations(
                    &graphs.intended,
                    &empty,
                    &graphs.all,
                    &Environment {
                        changed: &graphs.all,
                    },
                ))
            })
        });

        let one = change_every(&mut graphs, size);
        group.bench_with_input(BenchmarkId::new("one_changed", size), &size, |b, _| {
            b.iter(|| {
                black_box(plan_operations(
                    &graphs.intended,
                    &graphs.current,
                    &one,
                    &Environment { changed: &one },
                ))
            })
        });

        let mut graphs = converged_graphs(size);
        let percent = change_every(&mut graphs, 100);
        group.bench_with_input(
            BenchmarkId::new("one_percent_changed", size),
            &size,
            |b, _| {
                b.iter(|| {
                    black_box(plan_operations(
                        &graphs.intended,
                        &graphs.current,
                        &percent,
                        &Environment { changed: &percent },
                    ))
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
