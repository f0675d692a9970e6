//! The world outside the server: what exists (the items the agents have
//! applied, and the external items), and the simulated agents themselves.
//!
//! Agents are not tasks: the simulator holds the receiving end of each
//! session's channel, drains it after every step, and decides when and how
//! each operation is answered. They follow the protocol of DESIGN section
//! 4 as an honest SDK agent would: they de-duplicate on (op id, attempt),
//! keep final results until acknowledged and resend them after
//! reconnecting, apply an operation's effect only while they may (within
//! its timeout, or once it was cancelled while still running, when its
//! result is authoritative), and answer what they cannot apply in time
//! with a failure.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reconciled::engine::exec::port::{
    AgentOutcome, FromAgent, Grant, OperationOrder, Outstanding, ToAgent,
};
use reconciled::graph::{Item, ItemRef, OperationError, OperationKind, Properties, code};
use tokio::sync::mpsc;

use super::intents::{AgentPlan, Scenario};
use super::steps::Answer;

/// An item as it exists in the world.
#[derive(Clone, Debug)]
pub struct WorldItem {
    /// The value last applied (or reported, for an external item).
    pub value: Arc<Item>,
    /// Modifies applied since it was created (and reports marking an
    /// external item modified).
    pub modifications: u64,
    /// For each `recreate_when_modified` dependency: its modification
    /// count when this item was created (or when the dependency was added).
    pub marks: BTreeMap<ItemRef, u64>,
}

/// What exists.
#[derive(Clone, Debug, Default)]
pub struct World {
    /// Items that exist, by identity.
    pub items: BTreeMap<ItemRef, WorldItem>,
}

impl World {
    /// The properties `item` has, if it exists.
    pub fn properties(&self, item: &ItemRef) -> Option<&Properties> {
        self.items.get(item).map(|w| &w.value.properties)
    }

    /// Items whose value depends on `item`.
    pub fn dependents_of<'a>(&'a self, item: &'a ItemRef) -> impl Iterator<Item = &'a WorldItem> {
        self.items
            .iter()
            .filter(move |(key, existing)| {
                *key != item && existing.value.dependency_on(item).is_some()
            })
            .map(|(_, existing)| existing)
    }

    fn modifications_of(&self, item: &ItemRef) -> u64 {
        self.items.get(item).map_or(0, |w| w.modifications)
    }

    /// A Create applied (idempotent: an existing item is replaced).
    pub fn create(&mut self, value: Arc<Item>) {
        let marks = value
            .dependencies
            .iter()
            .filter(|d| d.recreate_when_modified())
            .map(|d| (d.requires.clone(), self.modifications_of(&d.requires)))
            .collect();
        let key = value.item_ref();
        self.items.insert(
            key.clone(),
            WorldItem {
                value,
                modifications: 0,
                marks,
            },
        );
        self.vanish_if_orphaned(&key);
    }

    /// An item applied on top of an external item that is gone, and
    /// declared `auto_deleted_by_external` on it, goes with it at once.
    fn vanish_if_orphaned(&mut self, key: &ItemRef) {
        let orphaned = self.items.get(key).is_some_and(|existing| {
            existing
                .value
                .dependencies
                .iter()
                .any(|d| d.auto_deleted_by_external() && !self.items.contains_key(&d.requires))
        });
        if orphaned {
            self.items.remove(key);
        }
    }

    /// `item` changed behind the server's back: it now has `properties`
    /// (its modification count stays: nobody modified it through the
    /// server). Returns its new value, or `None` when it does not exist.
    pub fn drift(&mut self, item: &ItemRef, properties: Properties) -> Option<Arc<Item>> {
        let existing = self.items.get_mut(item)?;
        let mut value = (*existing.value).clone();
        value.properties = properties;
        existing.value = Arc::new(value);
        Some(existing.value.clone())
    }

    /// A Modify applied; `false` when the item does not exist.
    pub fn modify(&mut self, value: Arc<Item>) -> bool {
        let key = value.item_ref();
        let Some(existing) = self.items.get(&key) else {
            return false;
        };
        let mut marks = existing.marks.clone();
        for dependency in value
            .dependencies
            .iter()
            .filter(|d| d.recreate_when_modified())
        {
            let counter = self.modifications_of(&dependency.requires);
            marks.entry(dependency.requires.clone()).or_insert(counter);
        }
        marks.retain(|required, _| {
            value
                .dependency_on(required)
                .is_some_and(|d| d.recreate_when_modified())
        });
        let modifications = existing.modifications + 1;
        self.items.insert(
            key.clone(),
            WorldItem {
                value,
                modifications,
                marks,
            },
        );
        self.vanish_if_orphaned(&key);
        true
    }

    /// A Delete applied (idempotent).
    pub fn delete(&mut self, item: &ItemRef) {
        self.items.remove(item);
    }

    /// An external item reported to exist.
    pub fn report_put(&mut self, value: Item, modified: bool) {
        let key = value.item_ref();
        let modifications = self.modifications_of(&key) + u64::from(modified);
        let marks = self
            .items
            .get(&key)
            .map(|w| w.marks.clone())
            .unwrap_or_default();
        self.items.insert(
            key,
            WorldItem {
                value: Arc::new(value),
                modifications,
                marks,
            },
        );
    }

    /// An external item reported gone; its dependents that declared
    /// `auto_deleted_by_external` vanish with it. Returns those.
    pub fn report_delete(&mut self, item: &ItemRef) -> Vec<ItemRef> {
        self.items.remove(item);
        let gone: Vec<ItemRef> = self
            .items
            .iter()
            .filter(|(_, existing)| {
                existing
                    .value
                    .dependency_on(item)
                    .is_some_and(|d| d.auto_deleted_by_external())
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in &gone {
            self.items.remove(key);
        }
        gone
    }
}

/// A message for the owner from one session.
#[derive(Clone, Debug)]
pub struct Outgoing {
    /// The session it is sent on.
    pub session: u64,
    /// The message.
    pub message: FromAgent,
}

/// A message an agent received, with where it came from.
#[derive(Debug)]
pub struct Received {
    /// The agent.
    pub agent: usize,
    /// The session.
    pub session: u64,
    /// The message.
    pub message: ToAgent,
}

/// One session of an agent.
#[derive(Debug)]
pub struct Session {
    /// The id the owner knows it by.
    pub id: u64,
    /// What the owner sends on it.
    pub receiver: mpsc::UnboundedReceiver<ToAgent>,
    /// The epochs granted at registration, by type.
    pub epochs: BTreeMap<String, u64>,
}

/// An operation an agent received and has not answered finally.
#[derive(Clone, Debug)]
pub struct PendingOp {
    /// What the server asked.
    pub order: OperationOrder,
    /// The session to answer on (the last one it was delivered on).
    pub session: u64,
    /// Simulated ms after which the agent may no longer apply it.
    pub deadline_ms: u64,
    /// The earliest time it can have been sent (its delivery batch).
    pub sent_since_ms: u64,
    /// The server cancelled it while it could still run: its result is
    /// authoritative whenever it comes.
    pub cancel_mode: bool,
    /// A cancel arrived.
    pub cancelled: bool,
    /// IN_PROGRESS was sent.
    pub in_progress: bool,
}

impl PendingOp {
    /// Whether the operation changes the world when it is done.
    pub fn effectful(&self) -> bool {
        !self.order.question
            && matches!(
                self.order.kind,
                OperationKind::Create | OperationKind::Modify | OperationKind::Delete
            )
    }

    /// Whether the agent may still apply it at `now_ms`.
    pub fn may_apply(&self, now_ms: u64) -> bool {
        now_ms < self.deadline_ms || self.cancel_mode
    }
}

/// A simulated agent.
#[derive(Debug)]
pub struct Agent {
    /// Its plan (id and types).
    pub plan: AgentPlan,
    /// Its live session.
    pub live: Option<Session>,
    /// Sessions replaced by a takeover but not closed yet.
    pub superseded: Vec<Session>,
    /// Operations received and not answered finally.
    pub pending: Vec<PendingOp>,
    /// Final outcomes by (op id, attempt), for de-duplication.
    pub finished: BTreeMap<(String, u32), AgentOutcome>,
    /// Final results not acknowledged yet.
    pub unacked: BTreeMap<(String, u32), AgentOutcome>,
    /// Results sent, newest last (for replays of old results).
    pub history: VecDeque<(String, u32, AgentOutcome)>,
}

const HISTORY: usize = 32;

impl Agent {
    fn open_session(&self, id: u64) -> bool {
        self.live.as_ref().is_some_and(|s| s.id == id) || self.superseded.iter().any(|s| s.id == id)
    }

    fn live_id(&self) -> Option<u64> {
        self.live.as_ref().map(|s| s.id)
    }

    fn record(&mut self, op_id: &str, attempt: u32, outcome: &AgentOutcome) {
        let key = (op_id.to_owned(), attempt);
        if matches!(outcome, AgentOutcome::Done { .. } | AgentOutcome::Failed(_)) {
            self.finished.insert(key.clone(), outcome.clone());
            self.unacked.insert(key, outcome.clone());
        }
        // A WAIT is not replayed: the same op id and attempt are asked
        // again, so an old WAIT would read as an answer to the new request.
        if !matches!(outcome, AgentOutcome::Wait { .. }) {
            self.history
                .push_back((op_id.to_owned(), attempt, outcome.clone()));
            if self.history.len() > HISTORY {
                self.history.pop_front();
            }
        }
    }

    fn result(
        &self,
        session: u64,
        op_id: &str,
        attempt: u32,
        outcome: AgentOutcome,
    ) -> Option<Outgoing> {
        self.open_session(session).then(|| Outgoing {
            session,
            message: FromAgent::Result {
                op_id: op_id.to_owned(),
                attempt,
                outcome,
            },
        })
    }
}

/// All agents of a run.
#[derive(Debug)]
pub struct Agents {
    /// The agents, in the scenario's order.
    pub agents: Vec<Agent>,
}

fn error(code: i32, message: &str) -> AgentOutcome {
    AgentOutcome::Failed(OperationError {
        code,
        message: message.to_owned(),
    })
}

impl Agents {
    /// The scenario's agents, none connected.
    pub fn new(scenario: &Scenario) -> Self {
        Self {
            agents: scenario
                .agents
                .iter()
                .map(|plan| Agent {
                    plan: plan.clone(),
                    live: None,
                    superseded: Vec::new(),
                    pending: Vec::new(),
                    finished: BTreeMap::new(),
                    unacked: BTreeMap::new(),
                    history: VecDeque::new(),
                })
                .collect(),
        }
    }

    /// Every operation held, in a stable order (agents, then arrival).
    pub fn pending(&self) -> impl Iterator<Item = &PendingOp> {
        self.agents.iter().flat_map(|agent| agent.pending.iter())
    }

    /// The `pick`-th operation held (modulo how many are held), as
    /// [`Agents::answer`] picks it.
    pub fn picked(&self, pick: u64) -> Option<&PendingOp> {
        let total = self.pending_count() as u64;
        if total == 0 {
            return None;
        }
        self.pending()
            .nth(usize::try_from(pick % total).unwrap_or(0))
    }

    /// What `agent` lists as outstanding when it registers: the operations
    /// it still runs (on any session) and those whose result was not
    /// acknowledged, as the SDK does.
    pub fn outstanding(&self, agent: usize) -> Outstanding {
        let holder = &self.agents[agent];
        Outstanding::Listed(
            holder
                .pending
                .iter()
                .map(|pending| pending.order.op_id.clone())
                .chain(holder.unacked.keys().map(|(op_id, _)| op_id.clone()))
                .collect(),
        )
    }

    /// How many operations all agents hold.
    pub fn pending_count(&self) -> usize {
        self.agents.iter().map(|agent| agent.pending.len()).sum()
    }

    /// Takes every message waiting on every open session.
    pub fn collect(&mut self) -> Vec<Received> {
        let mut received = Vec::new();
        for (index, agent) in self.agents.iter_mut().enumerate() {
            for session in agent.superseded.iter_mut().chain(agent.live.as_mut()) {
                while let Ok(message) = session.receiver.try_recv() {
                    received.push(Received {
                        agent: index,
                        session: session.id,
                        message,
                    });
                }
            }
        }
        received
    }

    /// The epoch `session`, of whichever agent, was granted for
    /// `item_type`.
    pub fn session_epoch(&self, session: u64, item_type: &str) -> Option<u64> {
        (0..self.agents.len()).find_map(|agent| self.epoch(agent, session, item_type))
    }

    /// The epoch `session` of `agent` was granted for `item_type`.
    pub fn epoch(&self, agent: usize, session: u64, item_type: &str) -> Option<u64> {
        let agent = &self.agents[agent];
        agent
            .superseded
            .iter()
            .chain(agent.live.as_ref())
            .find(|s| s.id == session)
            .and_then(|s| s.epochs.get(item_type).copied())
    }

    /// An operation arrived. Returns what the agent sends back at once
    /// (the stored result of an operation it already finished).
    pub fn receive_order(
        &mut self,
        agent: usize,
        session: u64,
        order: OperationOrder,
        deadline_base_ms: u64,
    ) -> Option<Outgoing> {
        let agent = &mut self.agents[agent];
        let key = (order.op_id.clone(), order.attempt);
        if let Some(outcome) = agent.finished.get(&key).cloned() {
            return agent.result(session, &order.op_id, order.attempt, outcome);
        }
        let deadline_ms = deadline_base_ms.saturating_add(order.timeout_ms);
        if let Some(held) = agent
            .pending
            .iter_mut()
            .find(|p| p.order.op_id == order.op_id && p.order.attempt == order.attempt)
        {
            // A re-delivery: a fresh request of the same operation.
            held.session = session;
            held.deadline_ms = deadline_ms;
            held.sent_since_ms = deadline_base_ms;
            held.cancel_mode = false;
            held.cancelled = false;
            held.order = order;
            return None;
        }
        // A newer attempt replaces an older one still held, and the
        // unacknowledged results of older ones, as the SDK does: the server
        // no longer waits for those.
        agent
            .pending
            .retain(|p| p.order.op_id != order.op_id || p.order.attempt > order.attempt);
        agent
            .unacked
            .retain(|(op_id, attempt), _| *op_id != order.op_id || *attempt >= order.attempt);
        agent.pending.push(PendingOp {
            order,
            session,
            deadline_ms,
            sent_since_ms: deadline_base_ms,
            cancel_mode: false,
            cancelled: false,
            in_progress: false,
        });
        None
    }

    /// A cancel arrived. Returns a CancelAck when nothing runs.
    pub fn receive_cancel(
        &mut self,
        agent: usize,
        session: u64,
        op_id: &str,
        now_ms: u64,
    ) -> Option<Outgoing> {
        let agent = &mut self.agents[agent];
        let mut running = false;
        for held in agent.pending.iter_mut().filter(|p| p.order.op_id == op_id) {
            held.cancel_mode = held.may_apply(now_ms);
            held.cancelled = true;
            running = true;
        }
        (!running).then(|| Outgoing {
            session,
            message: FromAgent::CancelAck {
                op_id: op_id.to_owned(),
            },
        })
    }

    /// A result was acknowledged.
    pub fn receive_ack(&mut self, agent: usize, op_id: &str, attempt: u32) {
        self.agents[agent]
            .unacked
            .remove(&(op_id.to_owned(), attempt));
    }

    /// Answers the `pick`-th operation held (modulo how many are held).
    /// Returns what is sent and a line for the trace.
    pub fn answer(
        &mut self,
        pick: u64,
        answer: Answer,
        now_ms: u64,
        world: &mut World,
    ) -> (Vec<Outgoing>, String) {
        let total = self.pending_count();
        if total == 0 {
            return (Vec::new(), "nothing to answer".into());
        }
        let mut index = usize::try_from(pick % total as u64).unwrap_or(0);
        let mut owner = 0;
        for (agent_index, agent) in self.agents.iter().enumerate() {
            if index < agent.pending.len() {
                owner = agent_index;
                break;
            }
            index -= agent.pending.len();
        }
        let agent = &mut self.agents[owner];
        let held = agent.pending[index].clone();
        let (outcome, effect) = outcome_for(&held, answer, now_ms, world);
        let mut note = format!(
            "{} answers {} {} {} (op {} attempt {}{}{}): {}",
            agent.plan.id,
            held.order.kind.as_str(),
            if held.order.question { "question" } else { "" },
            held.order.item.item_ref(),
            held.order.op_id,
            held.order.attempt,
            if held.cancelled { ", cancelled" } else { "" },
            if held.may_apply(now_ms) { "" } else { ", late" },
            describe_outcome(&outcome),
        );
        if !effect.is_empty() {
            note.push_str(&format!(" [{effect}]"));
        }
        let mut sent = Vec::new();
        match outcome {
            AgentOutcome::InProgress => {
                agent.pending[index].in_progress = true;
            }
            _ => {
                agent.pending.remove(index);
            }
        }
        agent.record(&held.order.op_id, held.order.attempt, &outcome);
        let final_outcome = !matches!(outcome, AgentOutcome::InProgress);
        sent.extend(agent.result(held.session, &held.order.op_id, held.order.attempt, outcome));
        if final_outcome && held.cancelled && agent.open_session(held.session) {
            sent.push(Outgoing {
                session: held.session,
                message: FromAgent::CancelAck {
                    op_id: held.order.op_id.clone(),
                },
            });
        }
        if sent.is_empty() {
            note.push_str(" (its session is gone: kept for a reconnect)");
        }
        (sent, note)
    }

    /// A progress heartbeat for the `pick`-th operation held.
    pub fn progress(&self, pick: u64) -> Vec<Outgoing> {
        let held: Vec<&PendingOp> = self.pending().collect();
        if held.is_empty() {
            return Vec::new();
        }
        let held = held[usize::try_from(pick % held.len() as u64).unwrap_or(0)];
        vec![Outgoing {
            session: held.session,
            message: FromAgent::Progress {
                op_id: held.order.op_id.clone(),
                attempt: held.order.attempt,
                message: String::new(),
            },
        }]
    }

    /// The unacknowledged results of `agent`, sent again on its live session.
    pub fn resend(&self, agent: usize) -> Vec<Outgoing> {
        let agent = &self.agents[agent];
        let Some(session) = agent.live_id() else {
            return Vec::new();
        };
        agent
            .unacked
            .iter()
            .map(|((op_id, attempt), outcome)| Outgoing {
                session,
                message: FromAgent::Result {
                    op_id: op_id.clone(),
                    attempt: *attempt,
                    outcome: outcome.clone(),
                },
            })
            .collect()
    }

    /// A past result of `agent`, sent again on its live session.
    pub fn replay(&self, agent: usize, pick: u64) -> Vec<Outgoing> {
        let agent = &self.agents[agent];
        let (Some(session), false) = (agent.live_id(), agent.history.is_empty()) else {
            return Vec::new();
        };
        let index = usize::try_from(pick % agent.history.len() as u64).unwrap_or(0);
        let (op_id, attempt, outcome) = agent.history[index].clone();
        vec![Outgoing {
            session,
            message: FromAgent::Result {
                op_id,
                attempt,
                outcome,
            },
        }]
    }

    /// A registration of `agent` was granted: `session` is its live one
    /// now (a live one it had is superseded). Returns the unacknowledged
    /// results it resends on the new session.
    pub fn attach(
        &mut self,
        agent: usize,
        session: u64,
        receiver: mpsc::UnboundedReceiver<ToAgent>,
        grants: &[Grant],
    ) -> Vec<Outgoing> {
        let epochs = grants
            .iter()
            .map(|grant| (grant.item_type.clone(), grant.epoch))
            .collect();
        let target = &mut self.agents[agent];
        if let Some(previous) = target.live.take() {
            target.superseded.push(previous);
        }
        target.live = Some(Session {
            id: session,
            receiver,
            epochs,
        });
        self.resend(agent)
    }

    /// Ends the sessions of `agent` (all of them, or only the superseded
    /// ones). What ran on them either finished just before (its effect
    /// applied, its result kept for a reconnect) or is dropped, as `luck`
    /// says. Returns the ids of the ended sessions and lines for the trace.
    pub fn end_sessions(
        &mut self,
        agent: usize,
        superseded_only: bool,
        luck: u64,
        now_ms: u64,
        world: &mut World,
    ) -> (Vec<u64>, Vec<String>, Vec<OperationOrder>) {
        let mut rng = StdRng::seed_from_u64(luck);
        let mut dropped = Vec::new();
        let target = &mut self.agents[agent];
        let mut ended: Vec<u64> = target.superseded.drain(..).map(|s| s.id).collect();
        if !superseded_only && let Some(live) = target.live.take() {
            ended.push(live.id);
        }
        let mut notes = Vec::new();
        let mut kept = Vec::new();
        for held in std::mem::take(&mut target.pending) {
            if !ended.contains(&held.session) {
                kept.push(held);
                continue;
            }
            let finish = held.effectful() && held.may_apply(now_ms) && rng.random_bool(0.5);
            if finish {
                let (outcome, effect) = outcome_for(
                    &held,
                    Answer::Done {
                        needs_recreate: false,
                        observed: false,
                    },
                    now_ms,
                    world,
                );
                notes.push(format!(
                    "{} finished {} {} (op {} attempt {}) as its session ended: {} [{effect}]",
                    target.plan.id,
                    held.order.kind.as_str(),
                    held.order.item.item_ref(),
                    held.order.op_id,
                    held.order.attempt,
                    describe_outcome(&outcome)
                ));
                target.record(&held.order.op_id, held.order.attempt, &outcome);
            } else {
                notes.push(format!(
                    "{} dropped {} {} (op {} attempt {}) as its session ended",
                    target.plan.id,
                    held.order.kind.as_str(),
                    held.order.item.item_ref(),
                    held.order.op_id,
                    held.order.attempt
                ));
                dropped.push(held.order);
            }
        }
        target.pending = kept;
        (ended, notes, dropped)
    }

    /// `agent`'s process restarted: it forgets its unacknowledged results,
    /// its de-duplication cache and its past results. Returns the (op id,
    /// attempt) of each result it forgot.
    pub fn forget(&mut self, agent: usize) -> Vec<(String, u32)> {
        let target = &mut self.agents[agent];
        target.finished.clear();
        target.history.clear();
        std::mem::take(&mut target.unacked).into_keys().collect()
    }

    /// The agents' sessions all end at once (the server died).
    pub fn server_died(&mut self, luck: u64, now_ms: u64, world: &mut World) -> Vec<String> {
        let mut notes = Vec::new();
        for agent in 0..self.agents.len() {
            let (_, more, _) =
                self.end_sessions(agent, false, luck.wrapping_add(agent as u64), now_ms, world);
            notes.extend(more);
        }
        notes
    }
}

/// The outcome of answering `held` with `answer` at `now_ms`, and its
/// effect on the world (described for the trace).
fn outcome_for(
    held: &PendingOp,
    answer: Answer,
    now_ms: u64,
    world: &mut World,
) -> (AgentOutcome, String) {
    let order = &held.order;
    let item = order.item.item_ref();
    let (needs_recreate, observed) = match answer {
        Answer::InProgress => return (AgentOutcome::InProgress, String::new()),
        Answer::Wait { ms } => {
            return (AgentOutcome::Wait { retry_after_ms: ms }, String::new());
        }
        Answer::Failed { terminal } => {
            let outcome = if terminal {
                error(code::INVALID_ARGUMENT, "the agent refuses this value")
            } else {
                error(code::UNAVAILABLE, "the device is busy")
            };
            return (outcome, String::new());
        }
        Answer::Done {
            needs_recreate,
            observed,
        } => (needs_recreate, observed),
    };
    if order.question {
        return (
            AgentOutcome::Done {
                observed: None,
                needs_recreate,
            },
            String::new(),
        );
    }
    if held.effectful() && !held.may_apply(now_ms) {
        // Too late to apply: an honest agent reports that it ran out of time.
        return (
            error(code::DEADLINE_EXCEEDED, "ran out of time"),
            String::new(),
        );
    }
    let observed_value = |value: &Item| observed.then(|| value.properties.clone());
    match order.kind {
        OperationKind::Read => match world.properties(&item) {
            Some(properties) => (
                AgentOutcome::Done {
                    observed: Some(properties.clone()),
                    needs_recreate: false,
                },
                String::new(),
            ),
            None => (error(code::NOT_FOUND, "no such item"), String::new()),
        },
        OperationKind::Create => {
            world.create(order.item.clone());
            (
                AgentOutcome::Done {
                    observed: observed_value(&order.item),
                    needs_recreate: false,
                },
                format!("{item} exists"),
            )
        }
        OperationKind::Modify => {
            if world.modify(order.item.clone()) {
                (
                    AgentOutcome::Done {
                        observed: observed_value(&order.item),
                        needs_recreate: false,
                    },
                    format!("{item} modified"),
                )
            } else {
                (
                    error(code::NOT_FOUND, "no such item to modify"),
                    String::new(),
                )
            }
        }
        OperationKind::Delete => {
            world.delete(&item);
            (
                AgentOutcome::Done {
                    observed: None,
                    needs_recreate: false,
                },
                format!("{item} gone"),
            )
        }
    }
}

/// An outcome in a few words.
pub fn describe_outcome(outcome: &AgentOutcome) -> String {
    match outcome {
        AgentOutcome::Done { needs_recreate, .. } => {
            if *needs_recreate {
                "DONE (needs recreate)".into()
            } else {
                "DONE".into()
            }
        }
        AgentOutcome::InProgress => "IN_PROGRESS".into(),
        AgentOutcome::Failed(error) => format!("FAILED code {}", error.code),
        AgentOutcome::Wait { retry_after_ms } => format!("WAIT {retry_after_ms}ms"),
    }
}
