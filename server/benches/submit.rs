//! The engine's share of a SubmitIntent: [`Executor::submit`] then
//! [`Executor::committed`], on one tenant whose whole intent a client
//! rewrites with every request (each item's `round` property changes), as
//! `reconciled-bench submit` does through the server. No agent is
//! connected, so every item stays pending, as in that benchmark.
//!
//! This is the work the tenant's seat does between decoding a request and
//! handing its records to the store; the rest of a request's time is the
//! transport and the durable commit, measured end to end by
//! `reconciled-bench submit`.
//!
//! Run with `cargo bench -p reconciled --bench submit`. It times
//! `SUBMIT_BENCH_ITERS` requests (default 20) of each size in
//! `SUBMIT_BENCH_SIZES` (default `10,1000,10000`) by the CPU time of its
//! thread ([`ThreadCpuTime`]), building each request outside the
//! timing, and prints the minimum and the median.

use std::hint::black_box;
use std::time::Duration;

use reconciled::engine::exec::{Executor, ExecutorSettings, Now, TenantProgress};
use reconciled::engine::intent::ValidatedSubmit;
use reconciled::graph::{CurrentGraph, IntendedGraph, Item, Properties};
use reconciled::thread_cpu::ThreadCpuTime;
use serde_json::json;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The item type of every benchmark item.
const ITEM_TYPE: &str = "bench.interface";

fn main() {
    let sizes = list_from_env("SUBMIT_BENCH_SIZES", vec![10, 1_000, 10_000]);
    let iterations = list_from_env("SUBMIT_BENCH_ITERS", vec![20])[0].max(1);
    for size in sizes {
        time_submits(size, iterations);
    }
}

/// A comma-separated list of numbers from `variable`, or `default`.
fn list_from_env(variable: &str, default: Vec<usize>) -> Vec<usize> {
    match std::env::var(variable) {
        Ok(text) => text
            .split(',')
            .map(|part| {
                part.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{variable}: {part:?} is not a number"))
            })
            .collect(),
        Err(_) => default,
    }
}

/// Submits `size` items `iterations` times to one executor (after one
/// untimed submit that creates the intent) and prints the CPU time each
/// took, with what it committed.
fn time_submits(size: usize, iterations: usize) {
    let mut executor = Executor::load(
        IntendedGraph::default(),
        CurrentGraph::default(),
        TenantProgress::default(),
        Vec::new(),
        settings(),
        now(0),
    );
    executor.committed(now(0));
    let mut run = |round: usize| {
        let request = request(size, round);
        let started = ThreadCpuTime::now();
        let (effects, submitted) = executor
            .submit(request, now(round as u64))
            .expect("the benchmark's intent is valid");
        executor.committed(now(round as u64));
        let spent = started.elapsed();
        assert!(submitted.changed, "every round changes the intent");
        drop(black_box(effects));
        spent
    };
    run(0);
    let mut spent: Vec<Duration> = (1..=iterations).map(&mut run).collect();
    spent.sort_unstable();
    let median = spent[spent.len() / 2];
    println!(
        "submit/{size}: min {:.2} ms, median {:.2} ms ({:.2} µs per item at the median), {iterations} runs",
        spent[0].as_secs_f64() * 1e3,
        median.as_secs_f64() * 1e3,
        median.as_secs_f64() * 1e6 / size as f64,
    );
}

fn settings() -> ExecutorSettings {
    ExecutorSettings {
        tenant_id: 1,
        max_items: 0,
        default_max_items: 1_000_000,
        max_operations_in_flight: 0,
        configurator_grace_ms: 60_000,
        resync_interval_ms: 600_000,
        cancel_timeout_ms: 30_000,
        seed: 7,
    }
}

fn now(step: u64) -> Now {
    Now {
        wall_ms: 1_700_000_000_000 + step,
        mono_ms: step,
    }
}

/// The whole intent of round `round`, as a decoded request holds it: fresh
/// texts for every identity, no predicates.
fn request(size: usize, round: usize) -> ValidatedSubmit {
    let items = (0..size)
        .map(|index| {
            let mut properties = Properties::new();
            properties.insert("index".into(), json!(index));
            properties.insert("mtu".into(), json!(1500));
            properties.insert("enabled".into(), json!(true));
            properties.insert("round".into(), json!(round));
            let item = Item::new(ITEM_TYPE, format!("c0-if-{index:05}"), properties);
            (item, Vec::new())
        })
        .collect();
    ValidatedSubmit {
        subgraph: String::new(),
        items,
        expected_generation: None,
        dry_run: false,
    }
}
