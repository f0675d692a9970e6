//! The vocabulary of a run: what one step does, and how the next step is
//! drawn from the seed's generator.
//!
//! A step is plain data: everything random about it is decided when it is
//! drawn (choices that depend on the state at the time it runs are indexes
//! taken modulo what exists then, or seeds of their own). So a run can be
//! replayed from its seed, and a failing run can be shrunk by dropping
//! steps and replaying the rest.

use std::fmt;

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use reconciled::graph::{ItemRef, Properties};

use super::faults;
use super::intents::{
    IntentModel, Scenario, SubmitPlan, generate_submit, mutate_properties, random_properties,
};
use super::invariants::MAX_WAIT_RETRY_AFTER_MS;

/// One step of a run.
#[derive(Clone, Debug)]
pub enum Step {
    /// SubmitIntent.
    Submit(SubmitPlan),
    /// ReportExternal: external items appear, change or vanish.
    Report(Vec<Report>),
    /// An agent answers one of the operations it holds (`pick` modulo
    /// how many all agents hold).
    Answer {
        /// Which operation.
        pick: u64,
        /// How it answers.
        answer: Answer,
    },
    /// An agent sends a progress heartbeat for an operation it holds.
    Progress {
        /// Which operation.
        pick: u64,
    },
    /// An agent sends its unacknowledged results again (duplicates).
    Resend {
        /// Which agent.
        agent: usize,
    },
    /// An agent sends one of its past results again (late, duplicated).
    Replay {
        /// Which agent.
        agent: usize,
        /// Which past result.
        pick: u64,
    },
    /// An agent's sessions end (`session_closed`); what it was running
    /// either finishes (its result waits for a reconnect) or is dropped.
    Disconnect {
        /// Which agent.
        agent: usize,
        /// Seed of the finish-or-drop choices.
        luck: u64,
    },
    /// An agent's process restarts: its sessions end as for
    /// [`Step::Disconnect`], and it forgets the results it had not reported
    /// (those finished as the sessions ended too) and its de-duplication
    /// cache, as an agent of our SDK does. Drawn only in runs with
    /// [`super::AgentFaults::ProcessesRestart`].
    AgentRestart {
        /// Which agent.
        agent: usize,
        /// Seed of the finish-or-drop choices.
        luck: u64,
    },
    /// An agent registers (again): with a live session, a takeover by the
    /// same agent id, which is immediate.
    Connect {
        /// Which agent.
        agent: usize,
    },
    /// An agent's superseded sessions (left by takeovers) end.
    CloseSuperseded {
        /// Which agent.
        agent: usize,
        /// Seed of the finish-or-drop choices.
        luck: u64,
    },
    /// Another agent id registers a type a live agent holds: refused.
    Impostor {
        /// Whose type.
        agent: usize,
    },
    /// Simulated time passes (timeouts, backoff, resync).
    Advance {
        /// How long.
        ms: u64,
    },
    /// The wall clock is stepped (NTP, an operator); monotonic time is not.
    ClockStep {
        /// By how much (negative: back).
        ms: i64,
    },
    /// The server dies between two commands and restarts from the store's
    /// bytes.
    Crash {
        /// Seed of the new owner.
        owner_seed: u64,
        /// Seed of what the agents had finished when it died.
        luck: u64,
    },
    /// An item changes behind the server's back (drift, DESIGN 4): one
    /// property of an applied item of a type that supports `READ` takes
    /// another value. Drawn only in runs with drift
    /// ([`View::drift`]).
    Drift {
        /// Which item (modulo the items that can drift then).
        pick: u64,
        /// Seed of which property changes, and to what.
        luck: u64,
    },
    /// The store dies at the next commit (before or after applying it);
    /// the server then restarts from the store's bytes.
    ArmStoreDeath {
        /// Whether the fatal commit is applied.
        after_apply: bool,
        /// Seed of the new owner.
        owner_seed: u64,
        /// Seed of what the agents had finished when it died.
        luck: u64,
    },
}

/// A change of an external item, as ReportExternal carries it.
#[derive(Clone, Debug)]
pub enum Report {
    /// The item exists with these properties.
    Put {
        /// Which item.
        item: ItemRef,
        /// Its properties.
        properties: Properties,
        /// Whether dependents must see it as modified.
        modified: bool,
    },
    /// The item is gone.
    Delete {
        /// Which item.
        item: ItemRef,
    },
}

/// How an agent answers an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// DONE (for a question: whether the change needs a recreate).
    Done {
        /// The answer to a NEEDS_RECREATE question.
        needs_recreate: bool,
        /// Whether `observed` properties are reported.
        observed: bool,
    },
    /// IN_PROGRESS: a second result follows.
    InProgress,
    /// FAILED, terminal (INVALID_ARGUMENT) or retryable (UNAVAILABLE).
    Failed {
        /// Terminal.
        terminal: bool,
    },
    /// WAIT with `retry_after`.
    Wait {
        /// How long.
        ms: u64,
    },
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Done {
                needs_recreate,
                observed,
            } => write!(
                f,
                "DONE{}{}",
                if *needs_recreate {
                    " needs_recreate"
                } else {
                    ""
                },
                if *observed { " +observed" } else { "" }
            ),
            Self::InProgress => write!(f, "IN_PROGRESS"),
            Self::Failed { terminal: true } => write!(f, "FAILED terminal"),
            Self::Failed { terminal: false } => write!(f, "FAILED retryable"),
            Self::Wait { ms } => write!(f, "WAIT {ms}ms"),
        }
    }
}

impl Step {
    /// Whether this step restarts an agent's process.
    pub fn restarts_an_agent(&self) -> bool {
        matches!(self, Self::AgentRestart { .. })
    }

    /// Whether this step changes an item behind the server's back.
    pub fn drifts(&self) -> bool {
        matches!(self, Self::Drift { .. })
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Submit(plan) => write!(f, "{}", plan.describe()),
            Self::Report(reports) => {
                let parts: Vec<String> = reports
                    .iter()
                    .map(|report| match report {
                        Report::Put {
                            item,
                            properties,
                            modified,
                        } => format!(
                            "put {item}{}{}",
                            properties.to_value(),
                            if *modified { " modified" } else { "" }
                        ),
                        Report::Delete { item } => format!("delete {item}"),
                    })
                    .collect();
                write!(f, "report external [{}]", parts.join(", "))
            }
            Self::Answer { pick, answer } => write!(f, "answer op#{pick} {answer}"),
            Self::Progress { pick } => write!(f, "progress op#{pick}"),
            Self::Resend { agent } => write!(f, "agent {agent} resends unacknowledged results"),
            Self::Replay { agent, pick } => write!(f, "agent {agent} replays past result #{pick}"),
            Self::Disconnect { agent, .. } => write!(f, "agent {agent} disconnects"),
            Self::AgentRestart { agent, .. } => write!(
                f,
                "agent {agent} restarts, forgetting the results it had not reported"
            ),
            Self::Connect { agent } => write!(f, "agent {agent} connects"),
            Self::CloseSuperseded { agent, .. } => {
                write!(f, "agent {agent} closes its superseded sessions")
            }
            Self::Impostor { agent } => write!(f, "an impostor registers agent {agent}'s types"),
            Self::Advance { ms } => write!(f, "advance {ms}ms"),
            Self::ClockStep { ms } => write!(f, "wall clock steps {ms:+}ms"),
            Self::Crash { .. } => write!(f, "CRASH and restart"),
            Self::Drift { pick, .. } => write!(f, "item #{pick} drifts behind the server's back"),
            Self::ArmStoreDeath { after_apply, .. } => write!(
                f,
                "the store dies at the next commit ({} applying it)",
                if *after_apply { "after" } else { "before" }
            ),
        }
    }
}

/// What the step generator may look at.
#[derive(Debug)]
pub struct View<'a> {
    /// The seed's scenario.
    pub scenario: &'a Scenario,
    /// The acknowledged intent.
    pub model: &'a IntentModel,
    /// Operations the agents hold.
    pub pending: usize,
    /// For each agent: connected, has superseded sessions, has
    /// unacknowledged results, has past results.
    pub agents: Vec<AgentView>,
    /// External items that exist now, with their properties.
    pub externals: Vec<(ItemRef, Properties)>,
    /// Whether a store death is armed.
    pub store_death_armed: bool,
    /// Whether an agent's process may restart ([`Step::AgentRestart`]).
    pub agent_restarts: bool,
    /// Whether items may drift ([`Step::Drift`]).
    pub drift: bool,
}

/// What the generator knows of one agent.
#[derive(Clone, Copy, Debug)]
pub struct AgentView {
    /// A live session.
    pub connected: bool,
    /// Sessions left by takeovers.
    pub superseded: bool,
    /// Results waiting for an ack.
    pub unacked: bool,
    /// Results sent before.
    pub history: bool,
}

/// Draws the next step.
pub fn next_step(rng: &mut StdRng, view: &View<'_>) -> Step {
    let agents = view.agents.len();
    loop {
        let roll = rng.random_range(0..1000);
        let step = match roll {
            0..=119 => Some(Step::Submit(generate_submit(
                rng,
                view.scenario,
                view.model,
            ))),
            120..=169 => report(rng, view),
            // (A guard would let a failed draw fall through to the arms
            // below; conditions go inside the arms.)
            170..=529 => (view.pending > 0).then(|| Step::Answer {
                pick: rng.random(),
                answer: answer(rng),
            }),
            530..=549 => (view.pending > 0).then(|| Step::Progress { pick: rng.random() }),
            550..=569 => {
                let agent = rng.random_range(0..agents);
                view.agents[agent].unacked.then_some(Step::Resend { agent })
            }
            570..=589 => {
                let agent = rng.random_range(0..agents);
                view.agents[agent].history.then(|| Step::Replay {
                    agent,
                    pick: rng.random(),
                })
            }
            590..=619 => {
                let agent = rng.random_range(0..agents);
                view.agents[agent].connected.then(|| {
                    let luck = rng.random();
                    // (Runs without restarts draw exactly as before they
                    // existed, so their seeds replay unchanged.)
                    if view.agent_restarts && rng.random_bool(0.4) {
                        Step::AgentRestart { agent, luck }
                    } else {
                        Step::Disconnect { agent, luck }
                    }
                })
            }
            620..=699 => {
                let agent = rng.random_range(0..agents);
                // Mostly reconnects; now and then a takeover of a live session.
                (!view.agents[agent].connected || rng.random_bool(0.15))
                    .then_some(Step::Connect { agent })
            }
            700..=714 => {
                let agent = rng.random_range(0..agents);
                view.agents[agent]
                    .superseded
                    .then(|| Step::CloseSuperseded {
                        agent,
                        luck: rng.random(),
                    })
            }
            715..=719 => {
                let agent = rng.random_range(0..agents);
                view.agents[agent]
                    .connected
                    .then_some(Step::Impostor { agent })
            }
            720..=969 => Some(Step::Advance {
                ms: advance_ms(rng),
            }),
            // (Runs without drift draw exactly as before it existed.)
            _ if view.drift && rng.random_bool(0.5) => Some(Step::Drift {
                pick: rng.random(),
                luck: rng.random(),
            }),
            _ => faults::fault_step(rng, view.store_death_armed),
        };
        if let Some(step) = step {
            return step;
        }
    }
}

/// How long to let time pass: mostly short, sometimes past timeouts and
/// backoffs, rarely past a resync.
pub fn advance_ms(rng: &mut StdRng) -> u64 {
    match rng.random_range(0..100) {
        0..=39 => rng.random_range(1..=500),
        40..=79 => rng.random_range(500..=10_000),
        80..=97 => rng.random_range(10_000..=120_000),
        _ => rng.random_range(120_000..=900_000),
    }
}

fn answer(rng: &mut StdRng) -> Answer {
    match rng.random_range(0..100) {
        0..=54 => Answer::Done {
            needs_recreate: rng.random_bool(0.3),
            observed: rng.random_bool(0.5),
        },
        55..=66 => Answer::InProgress,
        67..=78 => Answer::Failed { terminal: false },
        79..=81 => Answer::Failed { terminal: true },
        _ => Answer::Wait {
            ms: rng.random_range(1..=MAX_WAIT_RETRY_AFTER_MS),
        },
    }
}

fn report(rng: &mut StdRng, view: &View<'_>) -> Option<Step> {
    let externals: Vec<&ItemRef> = view.scenario.externals().map(|e| &e.item).collect();
    if externals.is_empty() {
        return None;
    }
    let count = rng.random_range(1..=externals.len().min(3));
    let mut reports = Vec::new();
    for _ in 0..count {
        let item = (*externals.choose(rng)?).clone();
        let present = view.externals.iter().find(|(key, _)| *key == item);
        let report = match present {
            Some(_) if rng.random_bool(0.3) => Report::Delete { item },
            Some((_, properties)) => Report::Put {
                item,
                properties: if rng.random_bool(0.7) {
                    mutate_properties(rng, properties)
                } else {
                    properties.clone()
                },
                modified: rng.random_bool(0.5),
            },
            None if rng.random_bool(0.1) => Report::Delete { item },
            None => Report::Put {
                item,
                properties: random_properties(rng),
                modified: rng.random_bool(0.2),
            },
        };
        reports.push(report);
    }
    Some(Step::Report(reports))
}
