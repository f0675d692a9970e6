//! Long runs of the deterministic simulator (see `reconciled_tests::sim`).
//!
//! ```text
//! cargo run --release -p reconciled-tests --bin reconciled-sim -- --seeds 1000
//! cargo run --release -p reconciled-tests --bin reconciled-sim -- --seed 42 --steps 300
//! cargo run --release -p reconciled-tests --bin reconciled-sim -- --seeds 1000 --agent-restarts
//! cargo run --release -p reconciled-tests --bin reconciled-sim -- --seeds 1000 --drift
//! ```
//!
//! Explores `--seeds N` seeds from `--first F` (default: a random first
//! seed, printed), or replays `--seed S` exactly. Prints steps per second
//! and seeds explored; on a failure, the seed, the broken invariant, the
//! command that replays it and the trace, then (unless `--no-shrink`) the
//! trace of the shortest run found that still breaks the same invariant.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use reconciled_tests::sim::{self, Failure};

/// Runs the deterministic simulator of a tenant's engine over many seeds.
#[derive(Debug, Parser)]
#[command(name = "reconciled-sim")]
struct Args {
    /// How many seeds to explore.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// The first seed to explore (default: random, printed).
    #[arg(long)]
    first: Option<u64>,
    /// Replay this seed only (exactly as any earlier run of it).
    #[arg(long)]
    seed: Option<u64>,
    /// Steps per seed before the final phase.
    #[arg(long, default_value_t = 300)]
    steps: usize,
    /// Keep exploring after a failure (all failing seeds are listed).
    #[arg(long)]
    keep_going: bool,
    /// Do not shrink failures.
    #[arg(long)]
    no_shrink: bool,
    /// Real time spent shrinking one failure, in seconds.
    #[arg(long, default_value_t = 120)]
    shrink_seconds: u64,
    /// Trace lines printed for a failure.
    #[arg(long, default_value_t = 400)]
    trace_lines: usize,
    /// Print the whole trace of a replayed seed even when it passes.
    #[arg(long)]
    trace: bool,
    /// Agents' processes may also restart, losing the results they had not
    /// reported and their de-duplication cache (draws other steps than a
    /// run without it: a seed replays only with the same flag).
    #[arg(long)]
    agent_restarts: bool,
    /// Items may also drift behind the server's back, for the periodic READ
    /// to find (draws other steps than a run without it: a seed replays
    /// only with the same flags).
    #[arg(long)]
    drift: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let seeds: Vec<u64> = match args.seed {
        Some(seed) => vec![seed],
        None => {
            let first = args.first.unwrap_or_else(rand::random);
            println!("exploring {} seed(s) from {first}", args.seeds);
            (0..args.seeds).map(|i| first.wrapping_add(i)).collect()
        }
    };
    let started = Instant::now();
    let mut steps = 0usize;
    let mut explored = 0u64;
    let mut failed: Vec<(u64, String)> = Vec::new();
    let mut with_an_agent_down = 0u64;
    let (mut drifts, mut drifts_found) = (0usize, 0usize);
    for seed in seeds {
        explored += 1;
        with_an_agent_down += u64::from(
            sim::intents::Scenario::generate(seed)
                .down_for_good
                .is_some(),
        );
        let agent_faults = if args.agent_restarts {
            sim::AgentFaults::ProcessesRestart
        } else {
            sim::AgentFaults::SessionsEnd
        };
        let drift = if args.drift {
            sim::Drift::On
        } else {
            sim::Drift::Off
        };
        match sim::run_seed_watched_with_drift(seed, args.steps, sim::WATCHDOG, agent_faults, drift)
        {
            Ok(passed) => {
                steps += passed.stats.steps;
                drifts += passed.stats.drifts;
                drifts_found += passed.stats.drifts_found;
                if args.seed.is_some() {
                    println!(
                        "seed {seed} passed: {} steps, {} operations received, {} restarts, {} submits accepted, \
                         {:.1} simulated minutes, final phase {} rounds, {} drift(s), {} found",
                        passed.stats.steps,
                        passed.stats.operations,
                        passed.stats.restarts,
                        passed.stats.submits,
                        passed.stats.simulated_ms as f64 / 60_000.0,
                        passed.stats.final_rounds,
                        passed.stats.drifts,
                        passed.stats.drifts_found
                    );
                    if args.trace {
                        println!("{}", passed.trace.render(usize::MAX));
                    }
                }
            }
            Err(failure) => {
                steps += failure.steps.len();
                report(&failure, &args);
                failed.push((seed, failure.violation.invariant.to_string()));
                if !args.keep_going {
                    break;
                }
            }
        }
        if explored.is_multiple_of(50) {
            print_rate(explored, steps, started.elapsed());
        }
    }
    print_rate(explored, steps, started.elapsed());
    println!("{with_an_agent_down} of them ended with an agent down for good");
    if args.drift {
        println!(
            "{drifts} drift(s) in the runs that passed, {drifts_found} found by the server (the rest overwritten by an operation)"
        );
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("failing seeds:");
        for (seed, invariant) in &failed {
            println!("  {seed}: {invariant}");
        }
        ExitCode::FAILURE
    }
}

fn print_rate(explored: u64, steps: usize, elapsed: Duration) {
    println!(
        "{explored} seed(s) explored, {steps} steps in {:.1} s: {:.0} steps/s",
        elapsed.as_secs_f64(),
        steps as f64 / elapsed.as_secs_f64().max(1e-9)
    );
}

fn report(failure: &Failure, args: &Args) {
    println!("\n{}", failure.report(args.steps, args.trace_lines));
    if args.no_shrink || failure.steps.is_empty() {
        return;
    }
    println!("shrinking (up to {} s)...", args.shrink_seconds);
    let shrunk = sim::shrink(failure, Duration::from_secs(args.shrink_seconds));
    println!(
        "shortest run found: {} of {} steps still break [{}]:\n{}",
        shrunk.steps.len(),
        failure.steps.len(),
        shrunk.violation.invariant,
        shrunk.trace.render(args.trace_lines)
    );
    println!("its steps:");
    for (index, step) in shrunk.steps.iter().enumerate() {
        println!("  {index}: {step}");
    }
}
