//! Planner benchmarks over graphs of 1k to 1M items of two shapes:
//!
//! - `random`: each item depends on up to 10 random earlier items (~5 on
//!   average);
//! - `chain`: EVE's own benchmark shape (its `perfTest`): item *i* depends
//!   on items *i+1 … i+10*, so the graph is one chain N deep.
//!
//! Cases: a full create from empty, one changed item, and 1% of the items
//! changed, each planned alone (`plan/…`), and planned then applied in
//! memory (`apply/…`): the plan's operations applied to the current graph in
//! plan order, then a confirming pass that must plan nothing, like one
//! `Reconcile()` of EVE's reconciler with configurators that succeed at
//! once. What a user waits for is converging, not planning alone.
//! Run with `cargo bench -p reconciled --bench plan`.
//! Set `PLAN_BENCH_SIZES=1000,10000` to pick sizes and
//! `PLAN_BENCH_SHAPES=chain` to pick shapes.
//!
//! On a shared machine wall-clock figures swing with the load. With
//! `PLAN_BENCH_CPU_ITERS=N` the bench skips criterion and times N runs of
//! each case by the CPU time of its thread (`CLOCK_THREAD_CPUTIME_ID`; a run includes
//! dropping its plan), printing the minimum and the median;
//! `PLAN_BENCH_CASE=full_create` picks cases. In that mode it also prints
//! the memory a converged graph holds per item (`memory/…`, counted by the
//! bench's allocator).

use std::cell::OnceCell;
use std::collections::BTreeSet;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reconciled::engine::plan::{Plan, PlanEnvironment, TypeRules, plan_operations};
use reconciled::graph::{
    CurrentGraph, CurrentItem, Dependency, IntendedGraph, IntendedItem, Item, ItemRef,
    OperationKind, Properties,
};
use reconciled::thread_cpu::ThreadCpuTime;
use rustc_hash::FxHashSet;
use serde_json::json;
use stats_alloc::{Region, StatsAlloc};

/// The server's allocator (mimalloc, as in `main.rs`), counted: the
/// timings are those of the allocator the server runs with.
#[global_allocator]
static ALLOCATOR: StatsAlloc<mimalloc::MiMalloc> = StatsAlloc::new(mimalloc::MiMalloc);

/// Bytes and allocations live now, as counted by [`ALLOCATOR`] (which
/// counts what a `realloc` adds or frees in the allocated and deallocated
/// bytes already; its `bytes_reallocated` repeats it).
fn live(region: &Region<'_, mimalloc::MiMalloc>) -> (isize, isize) {
    let stats = region.change();
    let bytes = stats.bytes_allocated as isize - stats.bytes_deallocated as isize;
    let allocations = stats.allocations as isize - stats.deallocations as isize;
    (bytes, allocations)
}

/// Prints what a converged tenant of `size` items of `shape` holds in
/// memory per item: its intended graph, then its current graph (whose
/// applied values share the intended ones, as after loading or applying).
/// Bytes are what was asked of the allocator (mimalloc rounds each
/// allocation up to its size class).
fn memory_per_item(shape: Shape, size: usize) {
    let label = format!("memory/{}/{size}", shape.label());
    if std::env::var("PLAN_BENCH_CASE").is_ok_and(|case| !label.contains(&case)) {
        return;
    }
    let mut rng = StdRng::seed_from_u64(42);
    let region = Region::new(&ALLOCATOR);
    let start = live(&region);
    let mut intended = IntendedGraph::default();
    for index in 0..size {
        let item = make_item(shape, size, index, &mut rng, 0);
        intended.insert(IntendedItem::compile(item, 1).expect("no predicates"));
    }
    let after_intended = live(&region);
    let mut current = CurrentGraph::default();
    for (key, entry) in intended.iter() {
        current.insert(key.clone(), CurrentItem::created(entry.item.clone(), 1));
    }
    let after_current = live(&region);
    let per_item = |from: (isize, isize), to: (isize, isize)| {
        let items = size as f64;
        (
            (to.0 - from.0) as f64 / items,
            (to.1 - from.1) as f64 / items,
        )
    };
    let (intended_bytes, intended_allocations) = per_item(start, after_intended);
    let (current_bytes, current_allocations) = per_item(after_intended, after_current);
    println!(
        "{label}: {:.0} B live per item in {:.1} allocations (intended graph {intended_bytes:.0} B \
         in {intended_allocations:.1}, current graph {current_bytes:.0} B in \
         {current_allocations:.1})",
        intended_bytes + current_bytes,
        intended_allocations + current_allocations,
    );
    drop(black_box(current));
    drop(black_box(intended));
}

/// The planner's view of the world: every type connected, no rules; the
/// seeds of a pass are the changed items, the only unconverged ones.
/// As the server's unconverged set does, it answers whether an item
/// converged by hash (the index is built on the first question, inside the
/// timing: a full create from empty asks none).
struct Environment<'a> {
    changed: &'a BTreeSet<ItemRef>,
    index: OnceCell<FxHashSet<&'a ItemRef>>,
}

impl<'a> Environment<'a> {
    fn new(changed: &'a BTreeSet<ItemRef>) -> Self {
        Self {
            changed,
            index: OnceCell::new(),
        }
    }
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
        !self
            .index
            .get_or_init(|| self.changed.iter().collect())
            .contains(item)
    }
    /// Every case starts converged: no earlier pass left a Delete to run.
    fn may_have_pending_delete(&self, _item: &ItemRef) -> bool {
        false
    }
}

fn name(index: usize) -> String {
    format!("item-{index:07}")
}

/// The dependency shape of a benchmark graph (see the module docs).
#[derive(Clone, Copy, Debug)]
enum Shape {
    Random,
    Chain,
}

impl Shape {
    fn label(self) -> &'static str {
        match self {
            Self::Random => "random",
            Self::Chain => "chain",
        }
    }
}

fn shapes() -> Vec<Shape> {
    let wanted = std::env::var("PLAN_BENCH_SHAPES").unwrap_or_else(|_| "random,chain".into());
    [Shape::Random, Shape::Chain]
        .into_iter()
        .filter(|shape| wanted.split(',').any(|w| w.trim() == shape.label()))
        .collect()
}

fn make_item(shape: Shape, size: usize, index: usize, rng: &mut StdRng, version: u64) -> Item {
    let mut properties = Properties::new();
    properties.insert("index".into(), json!(index));
    properties.insert("version".into(), json!(version));
    let mut item = Item::new("node", name(index), properties);
    // Collected, not pushed: a decoded item's list has no spare capacity.
    let depend_on = |targets: &mut dyn Iterator<Item = usize>| -> Vec<Dependency> {
        targets
            .map(|target| Dependency::on(ItemRef::new("node", name(target))))
            .collect()
    };
    if let Shape::Chain = shape {
        item.dependencies = depend_on(&mut (index + 1..(index + 11).min(size)));
    } else if index > 0 {
        let count = rng.random_range(0..=10usize.min(index));
        let mut targets = BTreeSet::new();
        for _ in 0..count {
            targets.insert(rng.random_range(0..index));
        }
        item.dependencies = depend_on(&mut targets.into_iter());
    }
    item
}

struct Graphs {
    intended: IntendedGraph,
    current: CurrentGraph,
    all: BTreeSet<ItemRef>,
}

/// Intended graph of `size` items of `shape` and a current graph where all
/// of them are created with the same value.
fn converged_graphs(shape: Shape, size: usize) -> Graphs {
    let mut rng = StdRng::seed_from_u64(42);
    let mut intended = IntendedGraph::default();
    let mut current = CurrentGraph::default();
    let mut all = BTreeSet::new();
    for index in 0..size {
        let item = make_item(shape, size, index, &mut rng, 0);
        intended.insert(IntendedItem::compile(item, 1).expect("no predicates"));
    }
    // As loading does: the intended graph first (it shares identities
    // between items and their dependencies), then the current graph keyed
    // by the same identities, its applied values sharing the intended ones.
    for (key, entry) in intended.iter() {
        current.insert(key.clone(), CurrentItem::created(entry.item.clone(), 1));
        all.insert(key.clone());
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

/// Runs `case` `iterations` times (each on a fresh copy of its start
/// graph, made outside the timing, if it changes it); prints the minimum
/// and median CPU time. `PLAN_BENCH_CASE` (a part of the label) picks cases.
fn cpu_time(case: &mut Case<'_>, iterations: usize) {
    let label = &case.label;
    if std::env::var("PLAN_BENCH_CASE").is_ok_and(|case| !label.contains(&case)) {
        return;
    }
    let mut times = Vec::with_capacity(iterations);
    let mut examined = 0;
    let mut shared = case.start.clone();
    for _ in 0..iterations {
        let mut fresh = case.mutates.then(|| case.start.clone());
        let current = fresh.as_mut().unwrap_or(&mut shared);
        let begin = ThreadCpuTime::now();
        if !begin.is_cpu_time() {
            println!("{label}: no thread CPU time on this system");
            return;
        }
        let output = (case.run)(current);
        examined = output.examined;
        drop(black_box(output));
        times.push(begin.elapsed());
    }
    times.sort_unstable();
    let ms = |time: Duration| time.as_secs_f64() * 1e3;
    if let (Some(&min), Some(&median)) = (times.first(), times.get(times.len() / 2)) {
        println!(
            "{label}: cpu min {:.3} ms, median {:.3} ms ({iterations} runs; {examined} items examined)",
            ms(min),
            ms(median)
        );
    }
}

/// Plans `seeds` (the changed items) against `current`.
fn plan(graphs: &Graphs, current: &CurrentGraph, seeds: &BTreeSet<ItemRef>) -> Plan {
    plan_operations(&graphs.intended, current, seeds, &Environment::new(seeds))
}

/// Plans `seeds`, applies the plan's operations to `current` in plan order
/// as configurators that succeed at once would, and plans again to
/// confirm. Panics if the confirming pass finds work (the apply would not
/// have converged).
fn plan_and_apply(graphs: &Graphs, current: &mut CurrentGraph, seeds: &BTreeSet<ItemRef>) -> Plan {
    let first = plan(graphs, current, seeds);
    for operation in &first.operations {
        match operation.kind {
            OperationKind::Create | OperationKind::Modify => {
                let entry = graphs
                    .intended
                    .get(&operation.item)
                    .expect("planned items are intended");
                current.insert(
                    operation.item.clone(),
                    CurrentItem::created(entry.item.clone(), entry.generation),
                );
            }
            OperationKind::Delete => {
                current.remove(&operation.item);
            }
            OperationKind::Read => {}
        }
    }
    let confirm = plan(graphs, current, &first.unconverged);
    assert!(
        confirm.operations.is_empty() && confirm.waiting.is_empty(),
        "the applied plan converges"
    );
    first
}

/// A case's work on its own copy of the current graph (made outside the
/// timing).
type Run<'a> = Box<dyn FnMut(&mut CurrentGraph) -> Plan + 'a>;

/// One benchmark case.
struct Case<'a> {
    label: String,
    /// The current graph the case starts from.
    start: &'a CurrentGraph,
    /// Whether `run` changes the graph: then every run gets a fresh copy
    /// (made outside the timing); a plan alone runs on one warm copy, as a
    /// server's pass does on its tenant's graph.
    mutates: bool,
    run: Run<'a>,
}

/// The graphs of one shape and size, with the seeds of each case.
struct Fixture {
    converged: Graphs,
    one: Graphs,
    one_seeds: BTreeSet<ItemRef>,
    percent: Graphs,
    percent_seeds: BTreeSet<ItemRef>,
    empty: CurrentGraph,
}

impl Fixture {
    fn new(shape: Shape, size: usize) -> Self {
        let converged = converged_graphs(shape, size);
        let mut one = converged_graphs(shape, size);
        let one_seeds = change_every(&mut one, size);
        let mut percent = converged_graphs(shape, size);
        let percent_seeds = change_every(&mut percent, 100);
        Self {
            converged,
            one,
            one_seeds,
            percent,
            percent_seeds,
            empty: CurrentGraph::default(),
        }
    }

    /// Every case of this fixture, labelled `{plan|apply}/{case}/{shape}/{size}`:
    /// each starting point planned alone, then planned and applied.
    fn cases(&self, shape: Shape, size: usize) -> Vec<Case<'_>> {
        let starts = [
            (
                "full_create",
                &self.converged,
                &self.empty,
                &self.converged.all,
            ),
            ("one_changed", &self.one, &self.one.current, &self.one_seeds),
            (
                "one_percent_changed",
                &self.percent,
                &self.percent.current,
                &self.percent_seeds,
            ),
        ];
        let mut cases = Vec::with_capacity(2 * starts.len());
        for apply in [false, true] {
            for (name, graphs, start, seeds) in starts {
                let (what, run): (&str, Run<'_>) = if apply {
                    (
                        "apply",
                        Box::new(move |current| plan_and_apply(graphs, current, seeds)),
                    )
                } else {
                    (
                        "plan",
                        Box::new(move |current| plan(graphs, current, seeds)),
                    )
                };
                cases.push(Case {
                    label: format!("{what}/{name}/{}/{size}", shape.label()),
                    start,
                    mutates: apply,
                    run,
                });
            }
        }
        cases
    }
}

fn bench_plan(c: &mut Criterion) {
    let iterations: Option<usize> = std::env::var("PLAN_BENCH_CPU_ITERS")
        .ok()
        .and_then(|value| value.parse().ok());
    let mut group = c.benchmark_group("plan");
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(5));
    for shape in shapes() {
        for size in sizes() {
            if iterations.is_some() {
                memory_per_item(shape, size);
            }
            let fixture = Fixture::new(shape, size);
            for mut case in fixture.cases(shape, size) {
                match iterations {
                    Some(iterations) => cpu_time(&mut case, iterations),
                    None if case.mutates => {
                        group.bench_function(BenchmarkId::from_parameter(&case.label), |b| {
                            b.iter_batched_ref(
                                || case.start.clone(),
                                |current| black_box((case.run)(current)),
                                BatchSize::LargeInput,
                            )
                        });
                    }
                    None => {
                        let mut current = case.start.clone();
                        group.bench_function(BenchmarkId::from_parameter(&case.label), |b| {
                            b.iter(|| black_box((case.run)(&mut current)))
                        });
                    }
                }
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
