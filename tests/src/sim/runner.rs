//! The simulator proper: the real tenant owner (planner, executor,
//! persistence through the real record encoding and store keys) on a
//! current-thread tokio runtime with paused time, driven one step at a
//! time, with the agents' side played by [`Agents`].
//!
//! After each step the simulator lets the owner finish everything it can
//! do now (a 1 ms sleep: paused time only moves once every task is idle),
//! delivers what the owner sent to the agents (checking each operation as
//! it arrives), sends back what the agents answer at once, and repeats
//! until the exchange stops; then it checks the published snapshot.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reconciled::engine::exec::TypeSpec;
use reconciled::engine::exec::port::{AgentOutcome, FromAgent, Registration, ToAgent};
use reconciled::engine::intent::IntentError;
use reconciled::graph::validate::{ValidationLimits, validate_items};
use reconciled::graph::{ItemRef, ItemState, OperationKind};
use reconciled::store::Store as _;
use reconciled::store::keys;
use reconciled::tenant::record::{decode, encode};
use reconciled::tenant::{
    Clock as _, ExternalChange, OwnerSettings, RegistrationError, SimulatedClock, TenantError,
    TenantHandle, TenantLimits, TenantRecord, TenantState, ValidatedSubmit,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::counts::OpCounts;
use super::drift::Drifts;
use super::faults::FaultyStore;
use super::intents::{Expected, IntentModel, Scenario, SubmitPlan, external_value};
use super::invariants::{
    Ledger, Violation, check_converged, check_crash_kept,
    check_create_waits_for_deletes_of_its_type, check_dependencies_settled,
    check_given_up_for_cause, check_item_generations, check_modify_spares_recreate_paths,
    check_order, check_order_content, check_quiescent_has_no_work, check_restart, check_room,
    check_snapshot, least_retry_wait, retry_pending, stays_lost, unknown_items,
};
use super::steps::{AgentView, Answer, Report, Step, View};
use super::trace::Trace;
use super::watcher::Watcher;
use super::world::{Agents, Outgoing, Received, World, describe_outcome};

/// The tenant's internal id.
const TENANT_ID: u64 = 1;
/// The simulated wall clock starts here (2024-01-01).
const EPOCH_MS: u64 = 1_704_067_200_000;
/// Exchanges between owner and agents after one step before it counts as
/// a message storm.
const MAX_EXCHANGES: usize = 200;
/// Rounds of the final phase before a tenant that never goes quiet fails.
const MAX_FINAL_ROUNDS: usize = 60;
/// Resyncs the final phase waits for the server to find drift it can see.
const MAX_DRIFT_RESYNCS: usize = 3;

/// How the simulator lets the owner run before it looks for messages.
#[derive(Clone, Copy)]
enum Pause {
    /// Sleep a millisecond of paused time: time moves only once every
    /// task waits, so after it the owner is idle.
    Millisecond,
    /// Yield without moving the clock: each yield lets the runtime poll
    /// its timers and run the tasks they wake, and a few let a pass that
    /// falls due now reach its dispatch.
    Yields,
}

impl Pause {
    /// Yields that let a due timer's pass run to its dispatch (each await
    /// in the pass takes one).
    const YIELDS: usize = 16;

    async fn wait(self) {
        match self {
            Pause::Millisecond => tokio::time::sleep(Duration::from_millis(1)).await,
            Pause::Yields => {
                for _ in 0..Self::YIELDS {
                    tokio::task::yield_now().await;
                }
            }
        }
    }
}

/// Counters of a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Steps run.
    pub steps: usize,
    /// Operations the agents received.
    pub operations: usize,
    /// Messages the agents received.
    pub messages: usize,
    /// Of `messages`: the periodic drift READs and their acks
    /// (observation, not work: a quiet tenant still sends them).
    pub observations: usize,
    /// Restarts of the server.
    pub restarts: usize,
    /// Simulated time at the end (ms).
    pub simulated_ms: u64,
    /// Submits the owner accepted.
    pub submits: usize,
    /// Rounds the final phase took.
    pub final_rounds: usize,
    /// Drifts injected.
    pub drifts: usize,
    /// Drifts the server learned of (the others were overwritten by an
    /// operation first).
    pub drifts_found: usize,
}

/// One simulated tenant with its agents.
pub struct Sim {
    /// What the seed fixed.
    pub scenario: Scenario,
    settings: OwnerSettings,
    clock: Arc<SimulatedClock>,
    store: Arc<FaultyStore>,
    handle: TenantHandle,
    /// What exists.
    pub world: World,
    /// The agents.
    pub agents: Agents,
    /// The acknowledged intent.
    pub model: IntentModel,
    ledger: Ledger,
    /// What happened.
    pub trace: Trace,
    /// A Watch that follows the whole run.
    watcher: Watcher,
    origin: Instant,
    next_session: u64,
    /// A store death armed: the new owner's seed and the agents' luck.
    armed: Option<(u64, u64)>,
    /// In the final phase: the agent that stays down for good.
    stays_down: Option<usize>,
    /// In the final phase: every agent but the one that stays down is
    /// connected, also after a restart there.
    finishing: bool,
    /// The earliest time messages being delivered can have been sent.
    sent_since_ms: u64,
    /// Items UNKNOWN in the snapshot after the last step.
    unknown: BTreeSet<ItemRef>,
    /// External reports the server did not acknowledge (its store died):
    /// the reporter sends them again once it is back.
    unreported: Vec<ExternalChange>,
    /// Counters.
    pub stats: Stats,
    /// Operations per item, and the faults that touched each.
    pub counts: OpCounts,
    /// Drift the server has not seen.
    drifts: Drifts,
    /// Op ids of the periodic drift READs sent.
    drift_reads: BTreeSet<String>,
    /// Whether items drift once the final phase finds the tenant quiet.
    drift_when_quiet: bool,
    /// The fault-free run: agents answer every operation before time
    /// moves, so none times out and no retry gives up.
    answers_before_time_moves: bool,
}

impl Sim {
    /// Starts the tenant's owner and connects every agent.
    pub async fn start(
        scenario: Scenario,
        owner_seed: u64,
        trace: Trace,
    ) -> Result<Self, Violation> {
        let clock = Arc::new(SimulatedClock::new(EPOCH_MS));
        let settings = OwnerSettings {
            clock: clock.clone(),
            rng_seed: Some(owner_seed),
            cancel_timeout: Duration::from_millis(scenario.cancel_timeout_ms),
            resync_interval: Duration::from_millis(scenario.resync_interval_ms),
            watch_ring_events: 64,
            ..OwnerSettings::default()
        };
        let record = TenantRecord {
            id: TENANT_ID,
            name: "sim".into(),
            created_at_ms: clock.now_ms(),
            generation: 0,
            observed_generation: 0,
            revision: 1,
            limits: TenantLimits {
                max_operations_in_flight: scenario.max_operations_in_flight,
                ..TenantLimits::default()
            },
            token_hash: String::new(),
            deleted: false,
            conditions: Vec::new(),
            compact_revision: Some(0),
            history_bytes: Some(0),
        };
        let encoded = encode(&record).expect("a tenant record encodes");
        let store = Arc::new(FaultyStore::with_records([(
            keys::tenant_record_key(TENANT_ID),
            encoded,
        )]));
        let handle = TenantHandle::spawn(TenantState::new(record), store.clone(), settings.clone());
        let agents = Agents::new(&scenario);
        let mut sim = Self {
            scenario,
            settings,
            clock,
            store,
            handle,
            world: World::default(),
            agents,
            model: IntentModel::default(),
            ledger: Ledger::default(),
            trace,
            watcher: Watcher::default(),
            origin: Instant::now(),
            next_session: 1,
            armed: None,
            stays_down: None,
            finishing: false,
            sent_since_ms: 0,
            unknown: BTreeSet::new(),
            unreported: Vec::new(),
            stats: Stats::default(),
            counts: OpCounts::default(),
            drifts: Drifts::default(),
            drift_reads: BTreeSet::new(),
            drift_when_quiet: false,
            answers_before_time_moves: false,
        };
        sim.trace.phase(
            "setup",
            0,
            &format!("scenario {}", describe_scenario(&sim.scenario)),
        );
        sim.watcher.catch_up(&sim.handle).await?;
        for agent in 0..sim.agents.agents.len() {
            sim.connect(agent).await?;
        }
        sim.settle().await?;
        Ok(sim)
    }

    /// Simulated milliseconds since the start.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(Instant::now().duration_since(self.origin).as_millis()).unwrap_or(u64::MAX)
    }

    /// What the step generator may look at.
    pub fn view(&self) -> View<'_> {
        View {
            scenario: &self.scenario,
            model: &self.model,
            pending: self.agents.pending_count(),
            agents: self
                .agents
                .agents
                .iter()
                .map(|agent| AgentView {
                    connected: agent.live.is_some(),
                    superseded: !agent.superseded.is_empty(),
                    unacked: !agent.unacked.is_empty(),
                    history: !agent.history.is_empty(),
                })
                .collect(),
            externals: self
                .world
                .items
                .iter()
                .filter(|(_, w)| w.value.external)
                .map(|(key, w)| (key.clone(), w.value.properties.clone()))
                .collect(),
            store_death_armed: self.armed.is_some(),
            agent_restarts: false,
            drift: false,
        }
    }

    /// Makes this the fault-free run of operation counts: agents answer
    /// every operation DONE before time moves, as a healthy agent would,
    /// so its counts are those of every operation going through (an
    /// operation left to time out is a fault: its retries give up, and
    /// what depends on it is never created).
    pub fn answer_before_time_moves(&mut self) {
        self.answers_before_time_moves = true;
    }

    /// Makes two items drift once the final phase finds the tenant quiet
    /// (mostly items the server holds settled): it must find and correct
    /// them before it is quiet again.
    pub fn drift_when_quiet(&mut self) {
        self.drift_when_quiet = true;
    }

    /// Runs step `index`, then lets everything settle and checks the
    /// invariants.
    pub async fn apply(&mut self, index: usize, step: &Step) -> Result<(), Violation> {
        let now = self.now_ms();
        self.sent_since_ms = now;
        self.trace.step(index, now, &step.to_string());
        self.stats.steps += 1;
        self.count_faults(step);
        self.model.before_this_step = matches!(step, Step::Submit(_))
            .then(|| (self.model.generation, self.model.items.clone()));
        match step {
            Step::Submit(plan) => self.submit(plan).await?,
            Step::Report(reports) => self.report(reports).await?,
            Step::Answer { pick, answer } => {
                let (sent, note) = self.agents.answer(*pick, *answer, now, &mut self.world);
                self.trace.note(note);
                self.send(sent).await;
            }
            Step::Progress { pick } => {
                let sent = self.agents.progress(*pick);
                self.send(sent).await;
            }
            Step::Resend { agent } => {
                let sent = self.agents.resend(*agent);
                self.send(sent).await;
            }
            Step::Replay { agent, pick } => {
                let sent = self.agents.replay(*agent, *pick);
                self.send(sent).await;
            }
            Step::Disconnect { agent, luck } => self.end_sessions(*agent, false, *luck).await?,
            Step::AgentRestart { agent, luck } => self.restart_agent(*agent, *luck).await?,
            Step::CloseSuperseded { agent, luck } => self.end_sessions(*agent, true, *luck).await?,
            Step::Connect { agent } => self.connect(*agent).await?,
            Step::Impostor { agent } => self.impostor(*agent).await?,
            Step::Advance { ms } => self.advance(*ms).await?,
            Step::ClockStep { ms } => {
                self.ledger.on_wall_clock_step(*ms);
                self.clock.step_wall_clock(*ms);
            }
            Step::Crash { owner_seed, luck } => self.restart(*owner_seed, *luck).await?,
            Step::Drift { pick, luck } => self.drift(*pick, *luck),
            Step::ArmStoreDeath {
                after_apply,
                owner_seed,
                luck,
            } => {
                self.store.arm_death(*after_apply);
                self.armed = Some((*owner_seed, *luck));
            }
        }
        self.settle().await?;
        self.check().await
    }

    /// Forgets the drift the server has learned of, or an operation has
    /// overwritten, since the last call.
    fn follow_drift(&mut self) {
        let snapshot = self.handle.snapshots.latest();
        self.stats.drifts_found += self
            .drifts
            .forget_overwritten_or_learned(&self.world, &snapshot);
    }

    /// An item drifts behind the server's back. It disturbs the item and
    /// what relies on it (correcting it may recreate its dependents).
    fn drift(&mut self, pick: u64, luck: u64) {
        let snapshot = self.handle.snapshots.latest();
        let Some((item, change)) =
            self.drifts
                .inject(&mut self.world, &snapshot, &self.scenario, pick, luck)
        else {
            self.trace.note("nothing can drift");
            return;
        };
        self.trace.note(format!("{item} drifts: {change}"));
        self.stats.drifts += 1;
        let mut disturbed = BTreeSet::new();
        let mut to_visit = vec![item];
        while let Some(key) = to_visit.pop() {
            if disturbed.insert(key.clone()) {
                to_visit.extend(self.world.dependents_of(&key).map(|w| w.value.item_ref()));
            }
        }
        self.counts.on_fault(&disturbed);
    }

    /// Counts the faults `step` brings to the items it meets.
    fn count_faults(&mut self, step: &Step) {
        match step {
            Step::Answer { pick, answer } => {
                if let Some(held) = self.agents.picked(*pick) {
                    let item = held.order.item.item_ref();
                    self.counts.on_answer(item, *answer);
                }
            }
            Step::Disconnect { .. }
            | Step::AgentRestart { .. }
            | Step::CloseSuperseded { .. }
            | Step::Connect { .. }
            | Step::Crash { .. } => self.count_fault_in_flight(),
            _ => {}
        }
    }

    /// A fault meets every operation in flight.
    fn count_fault_in_flight(&mut self) {
        let snapshot = self.handle.snapshots.latest();
        let in_flight: Vec<ItemRef> = snapshot
            .current
            .iter()
            .filter(|(_, current)| current.in_flight.is_some())
            .map(|(key, _)| key.clone())
            .collect();
        self.counts.on_fault(&in_flight);
    }

    /// Restarts the server if its store died, then checks the snapshot.
    async fn check(&mut self) -> Result<(), Violation> {
        if self.store.dead() {
            self.count_fault_in_flight();
            let (owner_seed, luck) = self.armed.take().unwrap_or((0, 0));
            self.trace
                .note("the store died: the server restarts from its bytes");
            self.restart(owner_seed, luck).await?;
            self.settle().await?;
        }
        if self.armed.is_some() && !self.store.armed() {
            self.armed = None;
        }
        self.follow_drift();
        self.ledger
            .observe(&self.drifts.believed(&self.world), &self.model);
        // RECONCILED_SIM_WATCH=type/name[,type/name…] traces those items'
        // current records and waiting entries after every step (for
        // diagnosing a failing seed).
        if let Ok(watched) = std::env::var("RECONCILED_SIM_WATCH") {
            let watched: Vec<&str> = watched.split(',').collect();
            let snapshot = self.handle.snapshots.latest();
            for (key, current) in snapshot.current.iter() {
                if watched.contains(&key.to_string().as_str()) {
                    self.trace.note(format!("WATCH {key}: {current:?}"));
                }
            }
            for (key, waiting) in snapshot.waiting.iter() {
                if watched.contains(&key.to_string().as_str()) {
                    self.trace.note(format!("WATCH {key} waits: {waiting:?}"));
                }
            }
        }
        let snapshot = self.handle.snapshots.latest();
        self.ledger
            .note_retries(&snapshot, self.clock.now_ms(), &self.scenario)?;
        self.ledger.note_uncertain(&snapshot);
        self.unknown = unknown_items(&snapshot);
        check_snapshot(&snapshot, &self.model)?;
        check_quiescent_has_no_work(&snapshot, self.clock.now_ms())?;
        check_given_up_for_cause(&snapshot)?;
        check_item_generations(&snapshot, &self.model)?;
        // Catching up lets the owner run what fell due meanwhile (a WAIT's
        // retry): the view is compared with the snapshot after it.
        self.watcher.catch_up(&self.handle).await?;
        self.follow_drift();
        self.watcher
            .check_view(&self.handle, &self.handle.snapshots.latest())
    }

    /// Lets the owner finish what it can do now and exchanges messages
    /// with the agents until nobody has anything more to say.
    async fn settle(&mut self) -> Result<(), Violation> {
        self.exchange_until_quiet(Pause::Millisecond).await
    }

    /// Lets the owner run what is due at the current instant, without
    /// moving the clock, and delivers what it sends meanwhile.
    async fn run_what_is_due(&mut self) -> Result<(), Violation> {
        self.exchange_until_quiet(Pause::Yields).await
    }

    /// Pauses as `pause` says, then delivers what the owner sent, until a
    /// pause brings nothing.
    async fn exchange_until_quiet(&mut self, pause: Pause) -> Result<(), Violation> {
        for _ in 0..MAX_EXCHANGES {
            pause.wait().await;
            if !self.deliver_received().await? {
                return Ok(());
            }
        }
        Err(Violation::new(
            "the owner and its agents stop exchanging messages",
            format!("still exchanging messages after {MAX_EXCHANGES} rounds"),
        ))
    }

    /// Delivers to the agents what the owner sent them and sends their
    /// replies; whether anything had arrived.
    async fn deliver_received(&mut self) -> Result<bool, Violation> {
        let received = self.agents.collect();
        if received.is_empty() {
            return Ok(false);
        }
        let mut sent = Vec::new();
        for message in received {
            sent.extend(self.receive(message)?);
        }
        self.send(sent).await;
        Ok(true)
    }

    /// Lets `ms` of simulated time pass, delivering what the owner sends
    /// meanwhile (every simulated second); in the fault-free run the agents
    /// answer everything first and as it comes.
    async fn advance(&mut self, ms: u64) -> Result<(), Violation> {
        if self.answers_before_time_moves {
            self.answer_everything().await?;
        }
        self.advance_answering(ms, self.answers_before_time_moves)
            .await
    }

    /// [`Self::advance`], the agents answering what arrives each second
    /// when `answer` says so.
    async fn advance_answering(&mut self, ms: u64, answer: bool) -> Result<(), Violation> {
        let mut left = ms;
        while left > 0 {
            let chunk = left.min(1_000);
            self.sent_since_ms = self.now_ms();
            tokio::time::sleep(Duration::from_millis(chunk)).await;
            left -= chunk;
            self.deliver_received().await?;
            if answer {
                self.answer_everything().await?;
            }
            if self.store.dead() {
                // The process died: it restarts now, not after the rest
                // of the wait.
                break;
            }
        }
        self.sent_since_ms = self.now_ms();
        Ok(())
    }

    /// An agent receives a message: operations are checked on arrival.
    fn receive(&mut self, received: Received) -> Result<Option<Outgoing>, Violation> {
        self.stats.messages += 1;
        if self.is_observation(&received.message) {
            self.stats.observations += 1;
        }
        let now = self.now_ms();
        let Received {
            agent,
            session,
            message,
        } = received;
        match message {
            ToAgent::Operation(order) => {
                self.stats.operations += 1;
                self.counts.on_order(&order, now);
                let epoch = self.agents.epoch(agent, session, order.item.item_type());
                let key = (order.op_id.clone(), order.attempt);
                let holder = &self.agents.agents[agent];
                let known = holder.finished.contains_key(&key)
                    || holder
                        .pending
                        .iter()
                        .any(|p| p.order.op_id == order.op_id && p.order.attempt == order.attempt);
                self.trace.note(format!(
                    "{} <- {}{} {} op {} attempt {} gen {} epoch {}{}",
                    holder.plan.id,
                    order.kind.as_str(),
                    if order.question { " question" } else { "" },
                    super::intents::describe_item(&order.item),
                    order.op_id,
                    order.attempt,
                    order.generation,
                    order.epoch,
                    if known { " (again)" } else { "" }
                ));
                self.follow_drift();
                let believed = self.drifts.believed(&self.world);
                self.ledger.observe(&believed, &self.model);
                let resumed = self.ledger.resumes(&order);
                self.ledger.on_order(
                    &order,
                    epoch,
                    self.sent_since_ms,
                    now,
                    self.clock.now_ms(),
                )?;
                check_order_content(&order, self.scenario.spec(order.item.item_type()))?;
                if !known {
                    // UNKNOWN before this step and still now: an item
                    // resolved meanwhile (a resent result) no longer blocks.
                    let still_unknown: BTreeSet<ItemRef> =
                        unknown_items(&self.handle.snapshots.latest())
                            .intersection(&self.unknown)
                            .cloned()
                            .collect();
                    check_order(
                        &order,
                        &believed,
                        &self.agents,
                        &self.model,
                        &still_unknown,
                        now,
                        self.sent_since_ms,
                    )?;
                    if !resumed {
                        check_create_waits_for_deletes_of_its_type(&order, &self.agents, now)?;
                        check_dependencies_settled(&order, &believed, &self.model)?;
                        check_room(&order, &self.agents, &self.ledger, &self.scenario, now)?;
                    }
                    check_modify_spares_recreate_paths(&order, &self.scenario)?;
                    self.ledger
                        .check_no_operation_beside_a_cancelled_one(&order)?;
                    self.ledger
                        .check_modify_was_answered(&order, &self.scenario)?;
                }
                Ok(self
                    .agents
                    .receive_order(agent, session, order, self.sent_since_ms))
            }
            ToAgent::Cancel { op_id } => {
                self.counts.on_cancel(&op_id, now);
                let running_on = self.agents.agents[agent]
                    .pending
                    .iter()
                    .find(|pending| pending.order.op_id == op_id)
                    .map(|pending| pending.session);
                self.ledger
                    .check_cancel(&op_id, running_on, now, &self.model)?;
                self.trace.note(format!(
                    "{} <- cancel op {op_id}",
                    self.agents.agents[agent].plan.id
                ));
                Ok(self.agents.receive_cancel(agent, session, &op_id, now))
            }
            ToAgent::Ack { op_id, attempt } => {
                self.agents.receive_ack(agent, &op_id, attempt);
                Ok(None)
            }
        }
    }

    /// Whether `message` is a periodic drift READ (not one resolving a
    /// lost operation) or the ack of its result.
    fn is_observation(&mut self, message: &ToAgent) -> bool {
        let (op_id, read) = match message {
            ToAgent::Operation(order) => (
                &order.op_id,
                order.kind == OperationKind::Read && !order.question,
            ),
            ToAgent::Ack { op_id, .. } => (op_id, false),
            ToAgent::Cancel { .. } => return false,
        };
        if read {
            let snapshot = self.handle.snapshots.latest();
            let drift_read = snapshot
                .current
                .iter()
                .filter_map(|(_, current)| current.in_flight.as_ref())
                .any(|operation| operation.op_id == *op_id && operation.resolves.is_none());
            if drift_read {
                self.drift_reads.insert(op_id.clone());
            }
            drift_read
        } else {
            self.drift_reads.contains(op_id)
        }
    }

    /// Sends the agents' messages to the owner.
    async fn send(&mut self, sent: impl IntoIterator<Item = Outgoing>) {
        for outgoing in sent {
            // A retryable failure the server counted: its next attempt
            // waits for the type's retry policy. A WAIT: it is asked again
            // after its `retry_after`.
            let mut failure = None;
            let mut wait = None;
            if let FromAgent::Result {
                op_id,
                attempt,
                outcome,
            } = &outgoing.message
            {
                let agents = &self.agents;
                let counted = self
                    .ledger
                    .on_result(op_id, *attempt, outcome, |item_type| {
                        agents.session_epoch(outgoing.session, item_type)
                    });
                if counted
                    && let AgentOutcome::Failed(error) = outcome
                    && !error.is_terminal()
                {
                    failure = Some((op_id.clone(), *attempt));
                }
                if counted && let AgentOutcome::Wait { retry_after_ms } = outcome {
                    wait = Some((op_id.clone(), *attempt, *retry_after_ms));
                }
                self.trace.note(format!(
                    "session {} -> result op {op_id} attempt {attempt}: {}",
                    outgoing.session,
                    describe_outcome(outcome)
                ));
            }
            // A stopped owner (after a crash) refuses: the message is lost,
            // as it would be on a broken stream.
            let accepted = self
                .handle
                .from_agent(outgoing.session, outgoing.message)
                .await
                .is_ok();
            if accepted && let Some((op_id, attempt)) = failure {
                let item_type = self.ledger.item_type_of(&op_id);
                let least_wait = item_type
                    .and_then(|item_type| self.scenario.spec(&item_type))
                    .map_or(0, |spec| least_retry_wait(&spec.retry, attempt));
                let (now, wall) = (self.now_ms(), self.clock.now_ms());
                self.ledger
                    .on_failure_accepted(&op_id, attempt, now, wall, least_wait);
            }
            if accepted && let Some((op_id, attempt, retry_after_ms)) = wait {
                let (now, wall) = (self.now_ms(), self.clock.now_ms());
                self.ledger
                    .on_wait_accepted(&op_id, attempt, now, wall, retry_after_ms);
            }
        }
    }

    async fn submit(&mut self, plan: &SubmitPlan) -> Result<(), Violation> {
        let predicates = validate_items(&plan.items, &ValidationLimits::default()).unwrap_or_else(
            |violations| panic!("the simulator generated an invalid intent: {violations:?}"),
        );
        let request = ValidatedSubmit {
            subgraph: plan.scope.clone(),
            items: plan.items.iter().cloned().zip(predicates).collect(),
            expected_generation: plan.expected_generation,
            dry_run: plan.dry_run,
        };
        let expected = self.model.expect(plan);
        let answer = self.handle.submit(request).await;
        let contract = "submits are answered as DESIGN §8 says";
        match (expected, answer) {
            (expected, Err(TenantError::Store(error))) if self.store.dead() => {
                self.trace
                    .note(format!("submit failed with the store ({error})"));
                if let Expected::Accepted {
                    generation, items, ..
                } = expected
                    && !plan.dry_run
                {
                    self.model.uncertain = Some((generation, items));
                }
                Ok(())
            }
            (
                Expected::GenerationMismatch,
                Err(TenantError::Intent(IntentError::GenerationMismatch { .. })),
            ) => {
                self.trace.note("refused: generation mismatch");
                Ok(())
            }
            (
                Expected::OutsideScope,
                Err(TenantError::Intent(
                    IntentError::Invalid { .. } | IntentError::ItemInOtherSubgraph { .. },
                )),
            ) => {
                self.trace.note("refused: item outside the scope");
                Ok(())
            }
            (
                Expected::Accepted {
                    generation,
                    changed,
                    items,
                },
                Ok(outcome),
            ) => {
                if plan.dry_run {
                    if outcome.generation != self.model.generation || outcome.changed != changed {
                        return Err(Violation::new(
                            contract,
                            format!(
                                "a dry run answered generation {} changed {}; expected generation {} changed {changed}",
                                outcome.generation, outcome.changed, self.model.generation
                            ),
                        ));
                    }
                    return Ok(());
                }
                if outcome.generation != generation || outcome.changed != changed {
                    return Err(Violation::new(
                        contract,
                        format!(
                            "the submit answered generation {} changed {}; expected generation {generation} changed {changed}",
                            outcome.generation, outcome.changed
                        ),
                    ));
                }
                self.trace.note(format!(
                    "accepted: generation {generation}, changed {changed}"
                ));
                self.stats.submits += 1;
                self.model.acknowledge(generation, items);
                Ok(())
            }
            (expected, answer) => Err(Violation::new(
                contract,
                format!("expected {expected:?}, got {answer:?}"),
            )),
        }
    }

    async fn report(&mut self, reports: &[Report]) -> Result<(), Violation> {
        // What falls due at this very instant (an operation's timeout, a
        // retry) runs before the server reads the report: its orders are
        // judged against the world before the report changes it.
        self.run_what_is_due().await?;
        let mut changes = Vec::new();
        let mut dropped = Vec::new();
        for report in reports {
            match report {
                Report::Put {
                    item,
                    properties,
                    modified,
                } => {
                    let value = external_value(item, properties.clone());
                    self.world.report_put(value.clone(), *modified);
                    changes.push(ExternalChange::Put {
                        item: value,
                        modified: *modified,
                    });
                }
                Report::Delete { item } => {
                    // An item gone by a drift the server has not seen still
                    // exists for it, and goes with the external item too.
                    let unseen_gone = self.drifts.gone_unseen_relying_on(item, &self.world);
                    let mut gone = self.world.report_delete(item);
                    gone.extend(unseen_gone);
                    self.ledger.on_vanished(item, &gone);
                    dropped.push((item.clone(), gone.clone()));
                    if !gone.is_empty() {
                        self.trace.note(format!("vanished with {item}: {gone:?}"));
                    }
                    changes.push(ExternalChange::Delete { item: item.clone() });
                }
            }
        }
        match self.handle.report_external(changes.clone()).await {
            Ok(_) => {
                for (external, gone) in &dropped {
                    self.ledger.on_dropped_with_external(external, gone);
                }
                self.ledger.on_reports_acknowledged(&changes);
                Ok(())
            }
            Err(TenantError::Store(_)) if self.store.dead() => {
                self.unreported.extend(changes);
                Ok(())
            }
            Err(error) => Err(Violation::new(
                "external reports are recorded",
                format!("ReportExternal failed: {error}"),
            )),
        }
    }

    fn specs_of(&self, agent: usize) -> Vec<TypeSpec> {
        self.agents.agents[agent]
            .plan
            .types
            .iter()
            .map(|&index| self.scenario.types[index].clone())
            .collect()
    }

    /// Registers `agent` on a new session.
    async fn connect(&mut self, agent: usize) -> Result<(), Violation> {
        let session = self.next_session;
        self.next_session += 1;
        let (sender, receiver) = mpsc::unbounded_channel();
        let agent_id = self.agents.agents[agent].plan.id.clone();
        let registration = Registration {
            session_id: session,
            agent_id: agent_id.clone(),
            types: self.specs_of(agent),
            outstanding: self.agents.outstanding(agent),
        };
        match self.handle.register(registration, sender).await {
            Ok(grants) => {
                self.trace.note(format!(
                    "{agent_id} registered on session {session}: {}",
                    grants
                        .iter()
                        .map(|g| format!("{} epoch {}", g.item_type, g.epoch))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                for grant in &grants {
                    self.ledger.on_grant(&grant.item_type, grant.epoch)?;
                }
                let resent = self.agents.attach(agent, session, receiver, &grants);
                self.send(resent).await;
                Ok(())
            }
            Err(RegistrationError::Tenant(error)) if self.store.dead() => {
                self.trace
                    .note(format!("registration failed with the store ({error})"));
                Ok(())
            }
            Err(error) => Err(Violation::new(
                "a registration with the live agent id takes over at once",
                format!("{agent_id} could not register: {error}"),
            )),
        }
    }

    /// Another agent id tries to register a type a live agent holds.
    async fn impostor(&mut self, agent: usize) -> Result<(), Violation> {
        let Some(spec) = self.specs_of(agent).into_iter().next() else {
            return Ok(());
        };
        let session = self.next_session;
        self.next_session += 1;
        let (sender, _receiver) = mpsc::unbounded_channel();
        let answer = self
            .handle
            .register(
                Registration {
                    session_id: session,
                    agent_id: "impostor".into(),
                    types: vec![spec.clone()],
                    outstanding: Default::default(),
                },
                sender,
            )
            .await;
        match answer {
            Err(RegistrationError::TypeHeld(_)) => Ok(()),
            Err(RegistrationError::Tenant(_)) if self.store.dead() => Ok(()),
            other => Err(Violation::new(
                "a type held by a live session is refused to another agent",
                format!(
                    "registering {} as another agent gave {other:?}",
                    spec.item_type
                ),
            )),
        }
    }

    /// Ends sessions of `agent` and tells the owner.
    async fn end_sessions(
        &mut self,
        agent: usize,
        superseded_only: bool,
        luck: u64,
    ) -> Result<(), Violation> {
        // What falls due at this very instant (an operation's timeout) runs
        // before the sessions end: an operation that timed out is a failed
        // attempt to the server, not one lost with its session.
        self.run_what_is_due().await?;
        let now = self.now_ms();
        let (ended, notes, dropped) =
            self.agents
                .end_sessions(agent, superseded_only, luck, now, &mut self.world);
        for note in notes {
            self.trace.note(note);
        }
        // Only what the server still had in flight is lost to it.
        let snapshot = self.handle.snapshots.latest();
        for order in &dropped {
            let in_flight = snapshot
                .current
                .get(&order.item.item_ref())
                .and_then(|c| c.in_flight.as_ref())
                .is_some_and(|o| o.op_id == order.op_id && o.attempt == order.attempt);
            if in_flight {
                self.ledger.on_dropped(order);
            }
        }
        self.ledger.on_sessions_ended(&ended);
        for session in ended {
            self.handle
                .session_closed(session, "the stream ended".into())
                .await;
        }
        Ok(())
    }

    /// `agent`'s process restarts: its sessions end, and it forgets what it
    /// had not reported. An operation the server still has in flight whose
    /// result the agent forgot is lost to the server, like one dropped
    /// (whatever it applied stays applied).
    async fn restart_agent(&mut self, agent: usize, luck: u64) -> Result<(), Violation> {
        self.end_sessions(agent, false, luck).await?;
        let forgotten = self.agents.forget(agent);
        let snapshot = self.handle.snapshots.latest();
        let in_flight: BTreeSet<(&str, u32)> = snapshot
            .current
            .values()
            .filter_map(|current| current.in_flight.as_ref())
            .map(|operation| (operation.op_id.as_str(), operation.attempt))
            .collect();
        for (op_id, attempt) in &forgotten {
            if in_flight.contains(&(op_id.as_str(), *attempt)) {
                self.ledger.on_forgotten(op_id, *attempt);
            }
            self.trace.note(format!(
                "{} forgot its result of op {op_id} attempt {attempt}",
                self.agents.agents[agent].plan.id
            ));
        }
        Ok(())
    }

    /// The server dies and restarts from the store's bytes only; the
    /// agents lose their sessions and (mostly) reconnect at once.
    async fn restart(&mut self, owner_seed: u64, luck: u64) -> Result<(), Violation> {
        let now = self.now_ms();
        self.watcher.before_crash(&self.handle).await?;
        let before = self.handle.snapshots.latest();
        for note in self.agents.server_died(luck, now, &mut self.world) {
            self.trace.note(note);
        }
        self.handle.stop();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let store = Arc::new(FaultyStore::with_records(self.store.bytes()));
        let key = keys::tenant_record_key(TENANT_ID);
        let bytes = store
            .get(&key)
            .ok()
            .flatten()
            .ok_or_else(|| Violation::new("the tenant record is stored", "no tenant record"))?;
        let record: TenantRecord = decode(&key, &bytes)
            .map_err(|error| Violation::new("stored records decode", error.to_string()))?;
        let state = TenantState::load(&*store, record)
            .map_err(|error| Violation::new("stored records decode", error.to_string()))?;
        let settings = OwnerSettings {
            rng_seed: Some(owner_seed),
            ..self.settings.clone()
        };
        let handle = TenantHandle::spawn(state, store.clone(), settings);
        let loaded = handle.snapshots.latest();
        self.store = store;
        self.handle = handle;
        self.stats.restarts += 1;
        check_crash_kept(&before, &loaded)?;
        let journal = check_restart(&loaded, &mut self.model)?;
        self.watcher
            .after_restart(&self.handle, loaded.record.revision)?;
        self.trace.note(format!(
            "restarted at revision {} generation {}; journaled: {journal:?}",
            loaded.record.revision, loaded.record.generation
        ));
        self.ledger.on_restart(journal);
        // The reporter retries what was not acknowledged before anything
        // else reaches the new server.
        let unreported = std::mem::take(&mut self.unreported);
        if !unreported.is_empty() {
            self.trace.note(format!(
                "{} external report(s) sent again",
                unreported.len()
            ));
            // A Delete of an item the restarted server holds (its first
            // sending was applied before the store died) is a vanish to it
            // again, now while operations journaled at the restart are
            // lost: it may give up those tied to the item (seed 66211).
            let mut present: HashMap<ItemRef, bool> = HashMap::new();
            for change in &unreported {
                match change {
                    ExternalChange::Put { item, .. } => {
                        present.insert(item.item_ref(), true);
                    }
                    ExternalChange::Delete { item } => {
                        let held = present
                            .insert(item.clone(), false)
                            .unwrap_or_else(|| loaded.current.get(item).is_some());
                        if held {
                            self.ledger.on_vanished(item, &[]);
                        }
                    }
                }
            }
            self.handle
                .report_external(unreported.clone())
                .await
                .map_err(|error| {
                    Violation::new("external reports are recorded", error.to_string())
                })?;
            self.ledger.on_reports_acknowledged(&unreported);
        }
        let mut rng = StdRng::seed_from_u64(luck);
        for agent in 0..self.agents.agents.len() {
            // (Drawn for every agent, so that a seed replays the same.)
            let reconnects = rng.random_bool(0.7);
            let finishing = self.finishing && Some(agent) != self.stays_down;
            if reconnects || finishing {
                self.connect(agent).await?;
            }
        }
        Ok(())
    }

    /// The final phase: no more intent changes or faults; every agent
    /// connected, answering DONE at once; time passes. The tenant must go
    /// quiet (nothing exchanged through a period longer than every
    /// timeout, backoff and cancel timeout) and be converged then.
    pub async fn finish(&mut self) -> Result<(), Violation> {
        self.store.disarm();
        self.armed = None;
        let now = self.now_ms();
        let down = self.scenario.down_for_good;
        self.stays_down = down;
        self.finishing = true;
        let down_types = self.scenario.down_types();
        let what = match down {
            Some(agent) => format!(
                "faults stop; agents connect and answer DONE, but agent {agent} ({}) stays down for good",
                down_types.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
            None => "faults stop; agents connect and answer DONE".to_owned(),
        };
        self.trace.phase("final", now, &what);
        for agent in 0..self.agents.agents.len() {
            if Some(agent) == down {
                if self.agents.agents[agent].live.is_some()
                    || !self.agents.agents[agent].superseded.is_empty()
                {
                    self.end_sessions(agent, false, 0).await?;
                }
                continue;
            }
            if !self.agents.agents[agent].superseded.is_empty() {
                self.end_sessions(agent, true, 0).await?;
            }
            if self.agents.agents[agent].live.is_none() {
                self.connect(agent).await?;
            }
        }
        self.settle().await?;
        let quiet_period = self.scenario.longest_wait_ms() + 1_000;
        let mut quiet_rounds = 0;
        let mut drift_resyncs = 0;
        for round in 0..MAX_FINAL_ROUNDS {
            self.stats.final_rounds = round + 1;
            let before = self.stats.messages - self.stats.observations;
            self.answer_everything().await?;
            self.check().await?;
            let snapshot = self.handle.snapshots.latest();
            // A lost operation of a type whose agent stays down stays lost,
            // and so do those waiting for one.
            let busy =
                snapshot.current.iter().any(|(key, c)| {
                    c.in_flight.is_some() && !stays_lost(&snapshot, key, &down_types)
                }) || retry_pending(&snapshot)
                    || self.agents.pending_count() > 0
                    || self.up_agents_hold_unacked();
            let now = self.now_ms();
            self.trace.phase(
                "final",
                now,
                &format!("round {round}: {}", if busy { "busy" } else { "idle" }),
            );
            self.advance_answering(quiet_period, true).await?;
            self.check().await?;
            let worked = self.stats.messages - self.stats.observations != before;
            if !busy && !worked && self.agents.pending_count() == 0 {
                quiet_rounds += 1;
                if quiet_rounds >= 2 {
                    if self.drift_when_quiet {
                        // Drift once the tenant is quiet: the server must
                        // find it and correct it before it is quiet again.
                        self.drift_when_quiet = false;
                        let mut rng = StdRng::seed_from_u64(self.scenario.seed ^ 0xd21f_7e57);
                        for _ in 0..2 {
                            self.drift(rng.random(), rng.random());
                        }
                        quiet_rounds = 0;
                        self.check().await?;
                        continue;
                    }
                    if let Some(item) = self.drift_to_find(&down_types) {
                        // The next resync's READ finds it, and the pass
                        // after corrects it (DESIGN 4).
                        if drift_resyncs == MAX_DRIFT_RESYNCS {
                            return Err(Violation::new(
                                "the periodic READ finds drift",
                                format!(
                                    "{item} drifted, is CREATED, idle, with nothing planned, and {MAX_DRIFT_RESYNCS} \
                                     resyncs later the server's applied value still does not have the drift"
                                ),
                            ));
                        }
                        drift_resyncs += 1;
                        quiet_rounds = 0;
                        let resync = self.scenario.resync_interval_ms;
                        self.advance_answering(resync + resync / 10 + 1_000, true)
                            .await?;
                        self.check().await?;
                        continue;
                    }
                    let snapshot = self.handle.snapshots.latest();
                    let reading = snapshot.current.iter().any(|(key, c)| {
                        c.in_flight
                            .as_deref()
                            .is_some_and(|running| running.kind == OperationKind::Read)
                            && !stays_lost(&snapshot, key, &down_types)
                    });
                    if reading {
                        // A resync's READ went out as the round ended (seed
                        // 54952): an observation, not work; the next round
                        // answers it. One that never ends keeps the tenant
                        // from going quiet, which fails below.
                        quiet_rounds = 0;
                        continue;
                    }
                    let now_wall = self.clock.now_ms();
                    // Drift the server cannot see (its agent is down for
                    // good, or the item is not CREATED) is not checked.
                    return check_converged(
                        &snapshot,
                        &self.drifts.believed(&self.world),
                        &self.model,
                        &self.scenario,
                        now_wall,
                    );
                }
            } else {
                quiet_rounds = 0;
            }
        }
        let snapshot = self.handle.snapshots.latest();
        let busy: Vec<String> = snapshot
            .current
            .iter()
            .filter(|(_, c)| c.in_flight.is_some())
            .map(|(key, c)| format!("{key} {:?}", c.state))
            .collect();
        let backing_off: Vec<String> = snapshot
            .waiting
            .iter()
            .filter(|(_, waiting)| waiting.reason == reconciled::engine::plan::WaitReason::Backoff)
            .map(|(key, waiting)| {
                let record = snapshot.current.get(key).map(|c| {
                    format!(
                        "{:?}, next attempt {:?}, retry of {:?}",
                        c.state, c.rare.next_attempt_at_ms, c.rare.retry_of
                    )
                });
                format!("{key} ({:?}: {record:?})", waiting.operation)
            })
            .collect();
        Err(Violation::new(
            "the tenant goes quiet",
            format!(
                "still busy after {MAX_FINAL_ROUNDS} rounds of the final phase; in flight: {busy:?}, \
                 waiting for a backoff: {backing_off:?}, agents hold {} operation(s)",
                self.agents.pending_count()
            ),
        ))
    }

    /// An item with drift the server has not seen and can find: intended,
    /// `CREATED`, idle and with no operation planned (what the periodic
    /// READ reads: an item the server will operate on is not read, its
    /// operation writes the intended value over the drift), of a type whose
    /// agent is up.
    fn drift_to_find(&self, down_types: &BTreeSet<String>) -> Option<ItemRef> {
        let snapshot = self.handle.snapshots.latest();
        self.drifts
            .unseen()
            .find(|item| {
                !down_types.contains(&**item.item_type())
                    && self.model.items.contains_key(*item)
                    && !snapshot.waiting.contains_key(*item)
                    && snapshot.current.get(*item).is_some_and(|current| {
                        current.state == ItemState::Created && current.in_flight.is_none()
                    })
            })
            .cloned()
    }

    /// Whether an agent that is not down for good holds a result the
    /// server has not acknowledged.
    fn up_agents_hold_unacked(&self) -> bool {
        self.agents
            .agents
            .iter()
            .enumerate()
            .any(|(index, agent)| Some(index) != self.stays_down && !agent.unacked.is_empty())
    }

    /// Every agent answers DONE to everything it holds, and resends what
    /// was not acknowledged, until nothing is left.
    async fn answer_everything(&mut self) -> Result<(), Violation> {
        for _ in 0..MAX_EXCHANGES {
            let now = self.now_ms();
            self.sent_since_ms = now;
            if self.agents.pending_count() == 0 && !self.up_agents_hold_unacked() {
                return Ok(());
            }
            while self.agents.pending_count() > 0 {
                let (sent, note) = self.agents.answer(
                    0,
                    Answer::Done {
                        needs_recreate: false,
                        observed: true,
                    },
                    now,
                    &mut self.world,
                );
                self.trace.note(note);
                self.send(sent).await;
            }
            for agent in 0..self.agents.agents.len() {
                if Some(agent) == self.stays_down {
                    continue;
                }
                let sent = self.agents.resend(agent);
                self.send(sent).await;
            }
            self.settle().await?;
        }
        Err(Violation::new(
            "the tenant goes quiet",
            "the agents never stop receiving operations",
        ))
    }
}

/// The scenario in one line.
pub fn describe_scenario(scenario: &Scenario) -> String {
    let types: Vec<String> = scenario
        .types
        .iter()
        .map(|spec| {
            format!(
                "{}(recreate {:?}{}{} timeout {}s retry {:?} max_attempts {} in_flight {})",
                spec.item_type,
                spec.recreate_on_change,
                if spec.ask_needs_recreate { " ask" } else { "" },
                if spec.supports_read { " read" } else { "" },
                spec.operation_timeout_ms / 1_000,
                spec.retry,
                spec.max_attempts,
                spec.max_in_flight
            )
        })
        .collect();
    let pool: Vec<String> = scenario
        .pool
        .iter()
        .map(|identity| {
            if identity.external {
                format!("{} (external)", identity.item)
            } else {
                identity.item.to_string()
            }
        })
        .collect();
    let agents: Vec<String> = scenario
        .agents
        .iter()
        .map(|agent| {
            format!(
                "{}: {}",
                agent.id,
                agent
                    .types
                    .iter()
                    .map(|&t| scenario.types[t].item_type.as_str())
                    .collect::<Vec<_>>()
                    .join("+")
            )
        })
        .collect();
    format!(
        "types [{}]; pool in dependency order [{}]; agents [{}]; max in flight {}; cancel timeout {}s; resync {}s",
        types.join(", "),
        pool.join(", "),
        agents.join(", "),
        scenario.max_operations_in_flight,
        scenario.cancel_timeout_ms / 1_000,
        scenario.resync_interval_ms / 1_000
    )
}
