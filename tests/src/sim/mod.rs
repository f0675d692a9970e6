//! A deterministic simulator of one tenant's engine.
//!
//! The real tenant owner (planner, executor, persistence through the real
//! record encoding and store keys) runs on a current-thread tokio runtime
//! with paused time, over an in-memory store; simulated agents, a simulated
//! clock and injected faults surround it. One seed drives everything: the
//! scenario (item types, their specs, a pool of identities, the agents),
//! every step, and the owner's own randomness, so a failing seed replays
//! exactly. Invariants written from DESIGN are checked after every step,
//! and a final phase checks that the tenant converges.
//!
//! - [`intents`]: the scenario and the generator of intents, with the
//!   model of the acknowledged intent.
//! - [`steps`]: what a step is, and how the next one is drawn.
//! - [`world`]: what exists, and the simulated agents.
//! - [`faults`]: a store that dies at a commit, crashes, clock steps.
//! - [`drift`]: items changed behind the server's back, and what the
//!   server has not seen of it.
//! - [`invariants`]: the checks.
//! - [`counts`]: operation counts against a fault-free run of the same
//!   steps.
//! - [`runner`]: the loop that drives the owner.
//! - [`watcher`]: a Watch that follows the whole run, and what DESIGN 7
//!   promises it.
//! - [`trace`]: the record of a run, printed on failure.
//!
//! ```text
//! let outcome = reconciled_tests::sim::run_seed(7, 300);
//! ```

pub mod counts;
pub mod drift;
pub mod faults;
pub mod intents;
pub mod invariants;
pub mod runner;
pub mod steps;
pub mod trace;
pub mod watcher;
pub mod world;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use self::counts::OpCounts;
use self::intents::Scenario;
use self::invariants::Violation;
use self::runner::{Sim, Stats};
use self::steps::{Step, next_step};
use self::trace::Trace;

/// How long one seed may take in real time before it counts as hung (a
/// busy loop in the owner never lets paused time move).
pub const WATCHDOG: Duration = Duration::from_secs(120);

/// A failed run: enough to replay it and to read what happened.
#[derive(Debug)]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// The steps run, the failing one last (empty when the run hung).
    pub steps: Vec<Step>,
    /// The index of the failing step; `None` when the final phase failed.
    pub failed_at: Option<usize>,
    /// What broke.
    pub violation: Violation,
    /// What happened.
    pub trace: Trace,
    /// The faults the run's agents could suffer.
    pub agent_faults: AgentFaults,
    /// Whether items could drift.
    pub drift: Drift,
}

impl Failure {
    /// A report: the seed, the broken invariant, how to replay, and the
    /// last `lines` lines of the trace.
    pub fn report(&self, steps: usize, lines: usize) -> String {
        format!(
            "seed {seed} failed {at}: {violation}\n\
             replay: cargo run --release -p reconciled-tests --bin reconciled-sim -- --seed {seed} --steps {steps}{restarts}{drift}\n\
             trace (last {lines} lines):\n{trace}",
            seed = self.seed,
            restarts = match self.agent_faults {
                AgentFaults::SessionsEnd => "",
                AgentFaults::ProcessesRestart => " --agent-restarts",
            },
            drift = match self.drift {
                Drift::Off => "",
                Drift::On => " --drift",
            },
            at = match self.failed_at {
                Some(step) => format!("at step {step}"),
                None => "in the final phase".into(),
            },
            violation = self.violation,
            trace = self.trace.render(lines),
        )
    }
}

/// What a passing run did.
#[derive(Clone, Debug)]
pub struct Passed {
    /// Its counters.
    pub stats: Stats,
    /// Its operations per item.
    pub counts: OpCounts,
    /// What happened.
    pub trace: Trace,
}

/// What the simulated agents may suffer, besides slow and failed answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AgentFaults {
    /// Their sessions end (they keep their results and de-duplication
    /// cache, and report them after reconnecting). The seed tests and the
    /// sweeps recorded in docs/testing.md run this way.
    #[default]
    SessionsEnd,
    /// Also, an agent's process restarts: it loses the results it had not
    /// reported and its de-duplication cache, as an agent of our SDK does
    /// (it keeps them in memory), and runs a re-delivered operation again.
    ProcessesRestart,
}

/// Whether items change behind the server's back during a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Drift {
    /// Never: what the agents applied stays as they applied it. The seed
    /// tests and the sweeps recorded in docs/testing.md before drift run
    /// this way.
    #[default]
    Off,
    /// Now and then ([`Step::Drift`]): a property of an applied item takes
    /// another value, for the periodic READ to find and the server to
    /// correct (DESIGN 4).
    On,
}

/// Which steps a run takes.
#[derive(Clone, Debug)]
enum Steps {
    /// Drawn from the seed's generator, this many, with these agent faults
    /// and drift.
    Generated(usize, AgentFaults, Drift),
    /// Exactly these (a replay of a shrunk run).
    Given(Vec<Step>),
}

impl Steps {
    /// The agent faults of these steps.
    fn agent_faults(&self) -> AgentFaults {
        match self {
            Self::Generated(_, faults, _) => *faults,
            Self::Given(steps) if steps.iter().any(Step::restarts_an_agent) => {
                AgentFaults::ProcessesRestart
            }
            Self::Given(_) => AgentFaults::SessionsEnd,
        }
    }

    /// Whether items drift in these steps.
    fn drift(&self) -> Drift {
        match self {
            Self::Generated(_, _, drift) => *drift,
            Self::Given(steps) if steps.iter().any(Step::drifts) => Drift::On,
            Self::Given(_) => Drift::Off,
        }
    }
}

/// Runs seed `seed` for `steps` steps, then the final phase.
pub fn run_seed(seed: u64, steps: usize) -> Result<Passed, Box<Failure>> {
    run(
        seed,
        Steps::Generated(steps, AgentFaults::SessionsEnd, Drift::Off),
        Trace::new(),
    )
}

/// Runs seed `seed`'s scenario with exactly `steps` (a replay of a shrunk
/// run), then the final phase.
pub fn run_steps(seed: u64, steps: Vec<Step>) -> Result<Passed, Box<Failure>> {
    run(seed, Steps::Given(steps), Trace::new())
}

/// [`run_seed`] on a thread of its own, failing after [`WATCHDOG`] of real
/// time (the thread of a hung run is left behind).
pub fn run_seed_watched(seed: u64, steps: usize) -> Result<Passed, Box<Failure>> {
    run_seed_watched_for(seed, steps, WATCHDOG)
}

/// [`run_seed_watched`] with a watchdog of `limit`.
pub fn run_seed_watched_for(
    seed: u64,
    steps: usize,
    limit: Duration,
) -> Result<Passed, Box<Failure>> {
    run_seed_watched_with(seed, steps, limit, AgentFaults::SessionsEnd)
}

/// [`run_seed_watched_for`] with agents that may suffer `agent_faults`.
pub fn run_seed_watched_with(
    seed: u64,
    steps: usize,
    limit: Duration,
    agent_faults: AgentFaults,
) -> Result<Passed, Box<Failure>> {
    run_seed_watched_with_drift(seed, steps, limit, agent_faults, Drift::Off)
}

/// [`run_seed_watched_with`] where items may also `drift`.
pub fn run_seed_watched_with_drift(
    seed: u64,
    steps: usize,
    limit: Duration,
    agent_faults: AgentFaults,
    drift: Drift,
) -> Result<Passed, Box<Failure>> {
    watched(seed, Steps::Generated(steps, agent_faults, drift), limit)
}

fn watched(seed: u64, steps: Steps, limit: Duration) -> Result<Passed, Box<Failure>> {
    let agent_faults = steps.agent_faults();
    let drift = steps.drift();
    let trace = Trace::new();
    let shared = trace.clone();
    let (done, outcome) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("sim-{seed}"))
        .spawn(move || {
            let trace = shared.clone();
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(seed, steps, shared)))
                    .unwrap_or_else(|panic| {
                        let message = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                            .unwrap_or_default();
                        Err(Box::new(Failure {
                            seed,
                            steps: Vec::new(),
                            failed_at: trace.current_step(),
                            violation: Violation::new("the engine does not panic", message),
                            trace,
                            agent_faults,
                            drift,
                        }))
                    });
            let _ = done.send(result);
        })
        .expect("a thread for the simulation");
    match outcome.recv_timeout(limit) {
        Ok(result) => result,
        Err(_) => Err(Box::new(Failure {
            seed,
            steps: Vec::new(),
            failed_at: None,
            violation: Violation::new(
                "the engine keeps simulated time moving",
                format!(
                    "no result after {} s of real time: the owner never went idle (a busy loop?)",
                    limit.as_secs()
                ),
            ),
            trace,
            agent_faults,
            drift,
        })),
    }
}

/// Whether a run has its faults, or is the fault-free run its operation
/// counts are compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Faults {
    On,
    Off,
}

/// Runs a seed, then its fault-free run, and compares their operation
/// counts.
fn run(seed: u64, steps: Steps, trace: Trace) -> Result<Passed, Box<Failure>> {
    let agent_faults = steps.agent_faults();
    let drift = steps.drift();
    let (passed, taken) = run_once(seed, steps, trace.clone(), Faults::On, drift)?;
    let calm = counts::fault_free(&taken);
    // RECONCILED_SIM_TRACE_FAULT_FREE=1 traces the fault-free run too
    // (after the run's own trace), to see why its counts differ.
    let calm_trace = if std::env::var_os("RECONCILED_SIM_TRACE_FAULT_FREE").is_some() {
        trace.clone()
    } else {
        Trace::new()
    };
    // (Without the drift, but with the same resyncs.)
    let (baseline, _) = run_once(
        seed,
        Steps::Given(calm.clone()),
        calm_trace,
        Faults::Off,
        drift,
    )
    .map_err(|mut failure| {
        failure.violation.detail = format!(
            "the fault-free run of these steps failed: {}",
            failure.violation.detail
        );
        failure
    })?;
    if let Err(violation) = counts::compare(&passed.counts, &baseline.counts) {
        return Err(Box::new(Failure {
            seed,
            steps: taken,
            failed_at: None,
            violation,
            trace,
            agent_faults,
            drift,
        }));
    }
    Ok(passed)
}

fn run_once(
    seed: u64,
    steps: Steps,
    trace: Trace,
    faults: Faults,
    drift: Drift,
) -> Result<(Passed, Vec<Step>), Box<Failure>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(simulate(seed, steps, trace, faults, drift))
}

async fn simulate(
    seed: u64,
    steps: Steps,
    trace: Trace,
    faults: Faults,
    drift: Drift,
) -> Result<(Passed, Vec<Step>), Box<Failure>> {
    let mut scenario = Scenario::generate(seed);
    if faults == Faults::Off {
        scenario.down_for_good = None;
    }
    if drift == Drift::On {
        // Resyncs ten times as often (every 60 s or 6 min), so that the
        // periodic READ finds much of the drift before an operation
        // overwrites it.
        scenario.resync_interval_ms /= 10;
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let owner_seed = rng.random();
    let mut taken: Vec<Step> = Vec::new();
    let agent_faults = steps.agent_faults();
    let failure = |taken: Vec<Step>, failed_at, violation, trace: &Trace| {
        Box::new(Failure {
            seed,
            steps: taken,
            failed_at,
            violation,
            trace: trace.clone(),
            agent_faults,
            drift,
        })
    };
    let mut sim = match Sim::start(scenario, owner_seed, trace.clone()).await {
        Ok(sim) => sim,
        Err(violation) => return Err(failure(taken, Some(0), violation, &trace)),
    };
    if faults == Faults::Off {
        sim.answer_before_time_moves();
    }
    if faults == Faults::On && drift == Drift::On {
        sim.drift_when_quiet();
    }
    let count = match &steps {
        Steps::Generated(count, ..) => *count,
        Steps::Given(given) => given.len(),
    };
    for index in 0..count {
        let step = match &steps {
            Steps::Generated(_, agent_faults, drift) => {
                let mut view = sim.view();
                view.agent_restarts = *agent_faults == AgentFaults::ProcessesRestart;
                view.drift = *drift == Drift::On;
                next_step(&mut rng, &view)
            }
            Steps::Given(given) => given[index].clone(),
        };
        taken.push(step.clone());
        if let Err(violation) = sim.apply(index, &step).await {
            return Err(failure(taken, Some(index), violation, &sim.trace));
        }
    }
    if let Err(violation) = sim.finish().await {
        return Err(failure(taken, None, violation, &sim.trace));
    }
    let mut stats = sim.stats;
    stats.simulated_ms = sim.now_ms();
    let passed = Passed {
        stats,
        counts: sim.counts.clone(),
        trace: sim.trace.clone(),
    };
    Ok((passed, taken))
}

/// Shrinks a failing run: drops steps (halves, quarters, ... single steps)
/// as long as the run still fails with the same invariant, within `budget`
/// of real time. Returns the shortest failure found.
pub fn shrink(failure: &Failure, budget: Duration) -> Box<Failure> {
    let started = Instant::now();
    let invariant = failure.violation.invariant;
    let seed = failure.seed;
    let mut best: Option<Box<Failure>> = None;
    let mut steps = failure.steps.clone();
    let mut chunks = 2;
    while steps.len() > 1 && started.elapsed() < budget {
        let size = steps.len().div_ceil(chunks);
        let mut reduced = false;
        let mut start = 0;
        while start < steps.len() && started.elapsed() < budget {
            let mut candidate = steps.clone();
            candidate.drain(start..(start + size).min(steps.len()));
            match watched(
                seed,
                Steps::Given(candidate.clone()),
                Duration::from_secs(30),
            ) {
                Err(smaller) if smaller.violation.invariant == invariant => {
                    // Keep only the steps up to the failure.
                    let mut kept = smaller.steps.clone();
                    if kept.is_empty() {
                        kept = candidate;
                    }
                    steps = kept;
                    best = Some(smaller);
                    reduced = true;
                    break;
                }
                _ => start += size,
            }
        }
        if reduced {
            chunks = chunks.saturating_sub(1).max(2);
        } else if size == 1 {
            break;
        } else {
            chunks = (chunks * 2).min(steps.len());
        }
    }
    best.unwrap_or_else(|| {
        Box::new(Failure {
            seed,
            steps: failure.steps.clone(),
            failed_at: failure.failed_at,
            violation: failure.violation.clone(),
            trace: failure.trace.clone(),
            agent_faults: failure.agent_faults,
            drift: failure.drift,
        })
    })
}
