//! The owner of one tenant: a task that alone changes the tenant's state.
//!
//! Every change goes through its command queue: it computes the change,
//! commits it durably to the store, then applies it in memory, re-plans and
//! publishes a new snapshot. Readers use snapshots and never wait for it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use reconciled_proto::v1;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, instrument, warn};

use crate::engine::exec::port::{
    ExternalChange, FromAgent, Grant, Outstanding, Registration, SessionLink,
};
use crate::engine::exec::{Room, TypeRegistry};
use crate::engine::plan::{
    BlockedBy, Plan, PlanEnvironment, TypeRules, WaitReason, WaitingItem, plan_operations,
};
use crate::engine::transition::{
    CurrentUpdates, apply_updates, bookkeeping_updates, coalesce, mark_gone_with_externals,
};
use crate::graph::{CurrentItem, IntendedItem, ItemRef, OperationKind};
use crate::store::{Store, WriteBatch};
use crate::watch::TenantEvents;
use crate::watch::events::{ItemChange, conditions_changed, intent_changed, stamp};
use crate::watch::fleet::FleetLog;
use crate::watch::history::{self, Retention};

use super::clock::{Clock, SystemClock, system_now_ms};
use super::error::TenantError;
use super::persist;
use super::record::{StoredIntended, TenantRecord};
use super::snapshot::{SnapshotHistory, TenantSnapshot};
use super::state::TenantState;
use crate::engine::conditions::{Progress, compute_conditions};
use crate::engine::intent::{IntentChange, ValidatedSubmit, apply_change, prepare_submit};
use crate::engine::schema;

/// Settings every tenant owner shares.
#[derive(Clone, Debug)]
pub struct OwnerSettings {
    /// Default for tenants whose `max_items` is 0.
    pub default_max_items: usize,
    /// How long items may wait for a configurator before the tenant stalls.
    pub configurator_grace: Duration,
    /// Period of full passes over every unconverged item (with ±10% jitter).
    pub resync_interval: Duration,
    /// How long a cancelled operation may take to report before its outcome
    /// is considered unknown.
    pub cancel_timeout: Duration,
    /// Where passes and operations are counted.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// How long events are kept.
    pub event_retention: Retention,
    /// Events a tenant's live ring holds while it has watchers.
    pub watch_ring_events: usize,
    /// The fleet log, told of every change of a tenant's conditions (absent
    /// in engine tests).
    pub fleet: Option<Arc<FleetLog>>,
    /// Where owners read the time: wall clock for what is stored or shown,
    /// monotonic time for deadlines.
    pub clock: Arc<dyn Clock>,
    /// Seed of each owner's random numbers (its boot number, retry and
    /// resync jitter); `None`: a random seed. A simulation sets it so that
    /// one seed replays a run exactly.
    pub rng_seed: Option<u64>,
}

impl Default for OwnerSettings {
    fn default() -> Self {
        Self {
            default_max_items: 1_000_000,
            configurator_grace: Duration::from_secs(300),
            resync_interval: Duration::from_secs(600),
            cancel_timeout: Duration::from_secs(60),
            metrics: Arc::default(),
            event_retention: Retention::default(),
            watch_ring_events: DEFAULT_RING_EVENTS,
            fleet: None,
            clock: Arc::new(SystemClock),
            rng_seed: None,
        }
    }
}

/// Default of [`OwnerSettings::watch_ring_events`].
pub const DEFAULT_RING_EVENTS: usize = 10_000;

/// Why a registration was refused.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RegistrationError {
    /// Another live agent holds a type.
    #[error("item type {item_type:?} is held by agent {holder:?}")]
    TypeHeld {
        /// The type.
        item_type: String,
        /// The holding agent.
        holder: String,
    },
    /// The registration could not be stored.
    #[error(transparent)]
    Tenant(#[from] TenantError),
}

/// What a SubmitIntent did.
#[derive(Clone, Debug)]
pub struct SubmitOutcome {
    /// The tenant's generation afterwards.
    pub generation: u64,
    /// Whether anything was stored (false for an identical resubmission).
    pub changed: bool,
    /// The plan after the submit (for a dry run: the plan it would give).
    pub plan: Plan,
    /// The tenant's revision afterwards.
    pub revision: u64,
}

/// How long a failed timer pass waits before the timer fires again.
const TIMER_RETRY: Duration = Duration::from_secs(1);

/// Results taken into one pass (and one commit) at most.
const MAX_RESULTS_PER_PASS: usize = 256;

/// Passes over more seeds than this run with `block_in_place`, so a big
/// tenant's planning does not hold up small tenants on the same worker.
const LARGE_PASS_SEEDS: usize = 2_000;

type Reply<T> = oneshot::Sender<Result<T, TenantError>>;

/// A command with the time it was queued (for the queue wait metric).
struct Queued {
    at: std::time::Instant,
    command: Command,
}

impl Queued {
    fn now(command: Command) -> Self {
        Self {
            at: std::time::Instant::now(),
            command,
        }
    }
}

enum Command {
    SetTokenHash(String, Reply<()>),
    Submit(ValidatedSubmit, Reply<SubmitOutcome>),
    ReportExternal(Vec<ExternalChange>, Reply<u64>),
    Reconcile(bool, Reply<Plan>),
    Register(
        Registration,
        oneshot::Sender<Result<Vec<Grant>, RegistrationError>>,
    ),
    FromAgent(u64, FromAgent),
    SessionClosed(u64, String),
}

/// A running tenant: its identity, its command queue and its snapshots.
#[derive(Clone, Debug)]
pub struct TenantHandle {
    /// Internal id.
    pub id: u64,
    /// Name.
    pub name: String,
    commands: mpsc::Sender<Queued>,
    /// Published snapshots.
    pub snapshots: Arc<SnapshotHistory>,
    /// Committed events, for watchers.
    pub events: Arc<TenantEvents>,
    stop: CancellationToken,
    /// Cancelled when the owner task has ended (however it ended).
    stopped: CancellationToken,
}

impl TenantHandle {
    /// Starts the owner task of a loaded tenant.
    pub fn spawn(state: TenantState, store: Arc<dyn Store>, settings: OwnerSettings) -> Self {
        let (commands, receiver) = mpsc::channel(256);
        let snapshots = Arc::new(SnapshotHistory::new(TenantSnapshot::capture(
            &state,
            0,
            Vec::new(),
        )));
        let events = Arc::new(TenantEvents::new(
            store.clone(),
            state.record.id,
            state.record.events_floor(),
            state.record.revision,
            settings.watch_ring_events,
        ));
        let stop = CancellationToken::new();
        let handle = Self {
            id: state.record.id,
            name: state.record.name.clone(),
            commands,
            snapshots: snapshots.clone(),
            events: events.clone(),
            stop: stop.clone(),
            stopped: CancellationToken::new(),
        };
        let owner = Owner::new(state, store, settings, snapshots, events);
        let finished = handle.stopped.clone().drop_guard();
        tokio::spawn(async move {
            let _finished = finished;
            owner.run(receiver, stop).await;
        });
        handle
    }

    /// Submits an intent (validated by the caller).
    pub async fn submit(&self, request: ValidatedSubmit) -> Result<SubmitOutcome, TenantError> {
        self.ask(|reply| Command::Submit(request, reply)).await
    }

    /// Records reports of external items; returns the new revision.
    pub async fn report_external(&self, changes: Vec<ExternalChange>) -> Result<u64, TenantError> {
        self.ask(|reply| Command::ReportExternal(changes, reply))
            .await
    }

    /// Runs a pass now and returns its plan. With `refresh`, first queues a
    /// READ of every created item whose type supports it (as the periodic
    /// resync does).
    pub async fn reconcile(&self, refresh: bool) -> Result<Plan, TenantError> {
        self.ask(|reply| Command::Reconcile(refresh, reply)).await
    }

    /// Registers a configurator session for item types; answers the
    /// granted types with their epochs, or why the registration is refused.
    pub async fn register(
        &self,
        registration: Registration,
    ) -> Result<Vec<Grant>, RegistrationError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Queued::now(Command::Register(registration, reply)))
            .await
            .map_err(|_| RegistrationError::Tenant(TenantError::Gone))?;
        answer
            .await
            .map_err(|_| RegistrationError::Tenant(TenantError::Gone))?
    }

    /// Forwards a message of session `session_id` to the owner.
    pub async fn from_agent(&self, session_id: u64, message: FromAgent) -> Result<(), TenantError> {
        self.commands
            .send(Queued::now(Command::FromAgent(session_id, message)))
            .await
            .map_err(|_| TenantError::Gone)
    }

    /// Tells the owner that session `session_id` ended.
    pub async fn session_closed(&self, session_id: u64, reason: String) {
        let _ = self
            .commands
            .send(Queued::now(Command::SessionClosed(session_id, reason)))
            .await;
    }

    /// Stores a new token hash in the tenant record.
    pub async fn set_token_hash(&self, token_hash: String) -> Result<(), TenantError> {
        self.ask(|reply| Command::SetTokenHash(token_hash, reply))
            .await
    }

    /// Commands waiting in the owner's queue (for metrics).
    pub fn queued_commands(&self) -> usize {
        self.commands.max_capacity() - self.commands.capacity()
    }

    /// Stops the owner; queued commands fail with [`TenantError::Gone`].
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Stops the owner and waits until its task has ended: the command it
    /// was handling is finished and committed, and it commits nothing
    /// after this returns.
    pub async fn stop_and_wait(&self) {
        self.stop.cancel();
        self.stopped.cancelled().await;
    }

    async fn ask<T>(&self, command: impl FnOnce(Reply<T>) -> Command) -> Result<T, TenantError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Queued::now(command(reply)))
            .await
            .map_err(|_| TenantError::Gone)?;
        answer.await.map_err(|_| TenantError::Gone)?
    }
}

/// Now, in unix milliseconds, on the system's wall clock (for code outside
/// an owner; owners read [`OwnerSettings::clock`]).
pub fn now_ms() -> u64 {
    system_now_ms()
}

/// The planner's view of the world, as the owner sees it.
struct Environment<'a> {
    types: &'a TypeRegistry,
    sessions: &'a BTreeMap<String, Holder>,
    unconverged: &'a BTreeSet<ItemRef>,
    state: &'a TenantState,
    operations: &'a BTreeMap<String, ItemRef>,
    room: &'a Room,
    now_ms: u64,
}

impl PlanEnvironment for Environment<'_> {
    fn type_rules(&self, item_type: &str) -> Option<&TypeRules> {
        self.types.rules(item_type)
    }
    fn has_configurator(&self, item_type: &str) -> bool {
        self.sessions.contains_key(item_type)
    }
    fn now_ms(&self) -> u64 {
        self.now_ms
    }
    fn is_converged(&self, item: &ItemRef) -> bool {
        !self.unconverged.contains(item)
    }
    fn deletes_of_type(&self, item_type: &str) -> Vec<ItemRef> {
        let in_flight = self.operations.values().filter(|item| {
            *item.item_type == *item_type
                && self
                    .state
                    .current
                    .get(item)
                    .and_then(|c| c.in_flight.as_ref())
                    .is_some_and(|operation| operation.kind == OperationKind::Delete)
        });
        let waiting = self
            .state
            .waiting
            .of_type(item_type)
            .filter(|waiting| waiting.operation == OperationKind::Delete)
            .map(|waiting| &waiting.item);
        let queued = self.room.queued_deletes_of(item_type);
        in_flight.chain(waiting).chain(queued).cloned().collect()
    }
}

/// The live session holding an item type.
#[derive(Debug)]
pub(super) struct Holder {
    pub(super) link: SessionLink,
    pub(super) epoch: u64,
    /// What the agent said it still ran from earlier sessions when it
    /// registered (shared by the types it registered together).
    pub(super) outstanding: Arc<Outstanding>,
}

/// The in-memory deadlines of one operation, on the monotonic clock
/// (DESIGN section 4): a wall-clock step must neither time out nor extend
/// every operation. The stored `started_at_ms` and `cancel_requested_at_ms`
/// are for display only.
#[derive(Clone, Copy, Debug)]
pub(super) struct Deadline {
    /// When the operation times out (its delivery plus its timeout).
    pub(super) timeout_at: Instant,
    /// When an unanswered cancel makes the outcome unknown.
    pub(super) cancel_at: Option<Instant>,
}

/// What a pass looks at.
pub(super) enum Scope {
    /// Every unconverged item.
    Full,
    /// These items (and what the planner reaches from them).
    Items(BTreeSet<ItemRef>),
}

pub(super) struct Owner {
    pub(super) state: TenantState,
    pub(super) store: Arc<dyn Store>,
    pub(super) settings: OwnerSettings,
    pub(super) snapshots: Arc<SnapshotHistory>,
    pub(super) no_configurator_since_ms: Option<u64>,
    /// Registered item types: specs, rules and epochs.
    pub(super) types: TypeRegistry,
    /// The live session of each item type. Ordered maps wherever the
    /// owner iterates, so that one seed gives one run (simulation).
    pub(super) sessions: BTreeMap<String, Holder>,
    /// In-flight (or lost) operations by op id.
    pub(super) operations: BTreeMap<String, ItemRef>,
    /// Deadlines of in-flight operations by op id (monotonic clock).
    pub(super) deadlines: HashMap<String, Deadline>,
    /// For each item: the waiting items that named it in `blocked_by`.
    pub(super) waiters: HashMap<ItemRef, BTreeSet<ItemRef>>,
    /// Room for operations by type, and the ready ones waiting for it.
    pub(super) room: Room,
    /// Completed operations, for `Reconcile` answers.
    pub(super) log: Arc<super::oplog::OperationLog>,
    pub(super) next_operation: u64,
    /// Random per owner start: op ids never repeat across restarts.
    pub(super) boot: u32,
    /// The owner's random numbers (boot number, retry and resync jitter).
    pub(super) rng: StdRng,
    /// The earliest backoff deadline among waiting items (unix ms: retry
    /// times are stored and shown).
    pub(super) next_retry_ms: Option<u64>,
    /// When the next periodic full pass is due (monotonic clock).
    pub(super) next_resync: Instant,
    /// After a failed commit: when the next full pass runs (the timer
    /// fires then, neither earlier nor later).
    pub(super) timer_retry: Option<Instant>,
    /// Items of READ-capable types to read back (periodic resync).
    pub(super) pending_reads: BTreeSet<ItemRef>,
    /// Items a pass changed without an operation (dropped with a vanished
    /// external item, or settled after a failure): the next turn of the
    /// loop plans them again, so what they now need is planned and shown.
    pub(super) follow_up: BTreeSet<ItemRef>,
    /// UNKNOWN items whose lost operation waits to be sent again until an
    /// UNKNOWN item it depends on is resolved (DESIGN 4: an UNKNOWN item
    /// blocks operations on its dependents); retried after every command.
    pub(super) deferred_redeliveries: BTreeSet<ItemRef>,
    /// Committed events, for watchers.
    pub(super) events: Arc<TenantEvents>,
    /// Events of the next commit that the commit cannot derive itself
    /// (results, agents, intent changes, drift).
    pub(super) pending_events: Vec<v1::Event>,
    /// The time of the oldest event kept, if any is.
    pub(super) oldest_event_ms: Option<u64>,
}

impl Owner {
    fn new(
        state: TenantState,
        store: Arc<dyn Store>,
        settings: OwnerSettings,
        snapshots: Arc<SnapshotHistory>,
        events: Arc<TenantEvents>,
    ) -> Self {
        let log = snapshots.log();
        let mut rng = match settings.rng_seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_rng(&mut rand::rng()),
        };
        let boot = rng.random();
        let next_resync = settings.clock.monotonic();
        let oldest_event_ms =
            history::oldest_after(&*store, state.record.id, state.record.events_floor())
                .unwrap_or_else(|error| {
                    warn!(tenant = %state.record.name, %error, "Reading the event log failed.");
                    None
                });
        Self {
            state,
            store,
            settings,
            snapshots,
            no_configurator_since_ms: None,
            types: TypeRegistry::default(),
            sessions: BTreeMap::new(),
            operations: BTreeMap::new(),
            deadlines: HashMap::new(),
            waiters: HashMap::new(),
            room: Room::default(),
            log,
            next_operation: 0,
            boot,
            rng,
            next_retry_ms: None,
            next_resync,
            timer_retry: None,
            pending_reads: BTreeSet::new(),
            follow_up: BTreeSet::new(),
            deferred_redeliveries: BTreeSet::new(),
            events,
            pending_events: Vec::new(),
            oldest_event_ms,
        }
    }

    async fn run(mut self, mut commands: mpsc::Receiver<Queued>, stop: CancellationToken) {
        if let Err(error) = self.load_specs_and_journal() {
            warn!(tenant = %self.state.record.name, %error, "Loading type specs failed.");
        }
        if let Err(error) = self.pass(Scope::Full).await {
            warn!(tenant = %self.state.record.name, %error, "First pass failed.");
        }
        self.schedule_resync();
        let mut deferred: Option<Command> = None;
        loop {
            if let Err(error) = self.retry_deferred_redeliveries().await {
                warn!(tenant = %self.state.record.name, %error, "Sending lost operations again failed.");
            }
            if !self.follow_up.is_empty() {
                let items = std::mem::take(&mut self.follow_up);
                if let Err(error) = self.pass(Scope::Items(items)).await {
                    warn!(tenant = %self.state.record.name, %error, "Follow-up pass failed.");
                }
                continue;
            }
            let command = match deferred.take() {
                Some(command) => command,
                None => {
                    let deadline = self.next_deadline();
                    let timer = async {
                        match deadline {
                            Some(at) => tokio::time::sleep_until(at).await,
                            None => std::future::pending::<()>().await,
                        }
                    };
                    // Biased: the order of the branches, not tokio's random
                    // pick, decides what runs first (one seed, one run).
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => break,
                        () = timer => {
                            match self.on_timer().await {
                                Ok(()) => self.timer_retry = None,
                                Err(error) => {
                                    // Nothing changed, so the deadline that
                                    // woke us is still due: wait before
                                    // trying again rather than spin.
                                    warn!(tenant = %self.state.record.name, %error, "Timer pass failed; retrying in a second.");
                                    self.timer_retry = Some(self.monotonic() + TIMER_RETRY);
                                }
                            }
                            continue;
                        }
                        command = commands.recv() => match command {
                            Some(queued) => self.took(queued),
                            None => break,
                        },
                    }
                }
            };
            // Results that arrived together coalesce into one pass and one
            // commit; the first other command waits for the next turn.
            if let Command::FromAgent(
                session_id,
                FromAgent::Result {
                    op_id,
                    attempt,
                    outcome,
                },
            ) = command
            {
                let mut batch = vec![(session_id, op_id, attempt, outcome)];
                while batch.len() < MAX_RESULTS_PER_PASS {
                    match commands.try_recv().map(|queued| self.took(queued)) {
                        Ok(Command::FromAgent(
                            session_id,
                            FromAgent::Result {
                                op_id,
                                attempt,
                                outcome,
                            },
                        )) => {
                            batch.push((session_id, op_id, attempt, outcome));
                        }
                        Ok(other) => {
                            deferred = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                if let Err(error) = self.results(batch).await {
                    warn!(tenant = %self.state.record.name, %error, "Recording results failed.");
                }
                continue;
            }
            match command {
                Command::Submit(request, reply) => {
                    let _ = reply.send(self.submit(request).await);
                }
                Command::ReportExternal(changes, reply) => {
                    let _ = reply.send(self.report_external(changes).await);
                }
                Command::SetTokenHash(token_hash, reply) => {
                    let _ = reply.send(self.set_token_hash(token_hash).await);
                }
                Command::Reconcile(refresh, reply) => {
                    if refresh {
                        self.schedule_reads();
                    }
                    let _ = reply.send(self.pass(Scope::Full).await);
                }
                Command::Register(registration, reply) => {
                    let _ = reply.send(self.register(registration).await);
                }
                Command::FromAgent(session_id, message) => {
                    if let Err(error) = self.handle_agent_message(session_id, message).await {
                        warn!(tenant = %self.state.record.name, %error, "Handling an agent message failed.");
                    }
                }
                Command::SessionClosed(session_id, reason) => {
                    if let Err(error) = self.session_closed(session_id, &reason).await {
                        warn!(tenant = %self.state.record.name, %error, "Handling a closed session failed.");
                    }
                }
            }
        }
        debug!(tenant = %self.state.record.name, "Tenant owner stopped.");
    }

    /// Takes a command off the queue, recording how long it waited.
    fn took(&self, queued: Queued) -> Command {
        self.settings
            .metrics
            .queue_wait(queued.at.elapsed().as_secs_f64());
        queued.command
    }

    fn max_items(&self) -> usize {
        match self.state.record.limits.max_items {
            0 => self.settings.default_max_items,
            limit => usize::try_from(limit).unwrap_or(usize::MAX),
        }
    }

    async fn submit(&mut self, request: ValidatedSubmit) -> Result<SubmitOutcome, TenantError> {
        let dry_run = request.dry_run;
        schema::check_items(&self.types, request.items.iter().map(|(item, _)| item))?;
        let change = prepare_submit(
            &self.state.intended,
            self.state.record.generation,
            self.max_items(),
            request,
        )?;
        if dry_run {
            let mut intended = self.state.intended.clone();
            apply_change(&mut intended, &change);
            let mut seeds = self.state.unconverged.clone();
            seeds.extend(change.content_changed.iter().cloned());
            let now = self.now();
            let plan = plan_operations(
                &intended,
                &self.state.current,
                &seeds,
                &self.environment(now),
            );
            // The contract: a dry run leaves the generation as it is and
            // says so.
            return Ok(SubmitOutcome {
                generation: self.state.record.generation,
                changed: !change.is_empty(),
                plan,
                revision: self.state.record.revision,
            });
        }
        if change.is_empty() {
            let plan = self.pass(Scope::Full).await?;
            return Ok(SubmitOutcome {
                generation: self.state.record.generation,
                changed: false,
                plan,
                revision: self.state.record.revision,
            });
        }

        let seeds = change.content_changed.clone();
        let plan = self
            .pass_with(Scope::Items(seeds), Vec::new(), Some(change))
            .await?;
        debug!(
            tenant = %self.state.record.name,
            generation = self.state.record.generation,
            "Intent stored."
        );
        Ok(SubmitOutcome {
            generation: self.state.record.generation,
            changed: true,
            plan,
            revision: self.state.record.revision,
        })
    }

    pub(super) async fn report_external(
        &mut self,
        changes: Vec<ExternalChange>,
    ) -> Result<u64, TenantError> {
        for segment in flap_segments(changes) {
            self.report_segment(segment).await?;
        }
        Ok(self.state.record.revision)
    }

    /// Records reports in which no item vanishes and comes back, in one
    /// commit and one pass (the last report of an item wins).
    async fn report_segment(&mut self, changes: Vec<ExternalChange>) -> Result<(), TenantError> {
        let mut updates: CurrentUpdates = Vec::new();
        let mut latest: BTreeMap<ItemRef, Option<CurrentItem>> = BTreeMap::new();
        for change in changes {
            match change {
                ExternalChange::Put { mut item, modified } => {
                    item.external = true;
                    item.dependencies.clear();
                    let key = item.item_ref();
                    let previous_counter = match latest.get(&key) {
                        Some(reported) => reported.as_ref().map_or(0, |r| r.modifications),
                        None => self.state.current.get(&key).map_or(0, |c| c.modifications),
                    };
                    let mut entry = CurrentItem::created(Arc::new(item), 0);
                    entry.modifications = previous_counter + u64::from(modified);
                    latest.insert(key, Some(entry));
                }
                ExternalChange::Delete { item } => {
                    latest.insert(item, None);
                }
            }
        }
        let vanished: Vec<ItemRef> = latest
            .iter()
            .filter(|(key, reported)| reported.is_none() && self.state.current.get(key).is_some())
            .map(|(key, _)| key.clone())
            .collect();
        updates.extend(latest);
        if updates.is_empty() {
            return Ok(());
        }
        updates.extend(mark_gone_with_externals(&self.state.current, vanished));
        let mut touched: BTreeSet<ItemRef> = updates.iter().map(|(key, _)| key.clone()).collect();
        // What depends on a reported item is planned again too: an external
        // item's presence or value decides its dependents' fate (rule 9,
        // predicates), and the planner does not walk down from an item it
        // finds converged.
        let dependents: Vec<ItemRef> = touched
            .iter()
            .flat_map(|key| {
                self.state
                    .current
                    .dependents_of(key)
                    .chain(self.state.intended.dependents_of(key))
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        touched.extend(dependents);
        // And every unconverged item: a dependent further down may have
        // waited on what the report settles (a Delete no longer needed once
        // an external item is back), and its wait must not outlive it.
        touched.extend(self.state.unconverged.iter().cloned());
        self.commit_current_updates(updates, None).await?;
        self.pass(Scope::Items(touched)).await?;
        Ok(())
    }

    async fn set_token_hash(&mut self, token_hash: String) -> Result<(), TenantError> {
        let mut record = self.state.record.clone();
        record.token_hash = token_hash;
        self.commit_current_updates(Vec::new(), Some(record))
            .await?;
        self.publish();
        Ok(())
    }

    /// Commits new current values (and optionally a changed record) with a
    /// new revision, then applies them in memory.
    pub(super) async fn commit_current_updates(
        &mut self,
        updates: CurrentUpdates,
        record: Option<TenantRecord>,
    ) -> Result<(), TenantError> {
        self.commit_current_updates_with(updates, record, WriteBatch::new())
            .await
    }

    /// Commits new current values, an optional new record and `extra`
    /// writes with a new revision, then applies the values in memory.
    ///
    /// The commit also stores the revision's events (the pending ones, plus
    /// what the updates and the record say: item status changes, operations
    /// started, conditions changed), prunes the event log beyond its
    /// retention, and tells the fleet log of changed conditions; once
    /// durable, the events go to watchers. On error nothing changed and the
    /// pending events are dropped.
    pub(super) async fn commit_current_updates_with(
        &mut self,
        updates: CurrentUpdates,
        record: Option<TenantRecord>,
        mut batch: WriteBatch,
    ) -> Result<(), TenantError> {
        let now = self.now();
        let updates = coalesce(updates);
        let mut record = record.unwrap_or_else(|| self.state.record.clone());
        record.revision = self.state.record.revision + 1;
        let mut events = std::mem::take(&mut self.pending_events);
        for (key, value) in &updates {
            self.state
                .write_current_value(&mut batch, key, value.as_ref())?;
            ItemChange {
                item: key,
                before: self.state.current.get(key).map(|c| &**c),
                after: value.as_ref(),
                intended: self.state.intended.get(key).map(|i| &**i),
                waiting: self.state.waiting.get(key),
                epoch: self.sessions.get(&*key.item_type).map_or(0, |h| h.epoch),
            }
            .events(&mut events);
        }
        let conditions_changed_now =
            significant_change(&self.state.record.conditions, &record.conditions)
                || record.observed_generation != self.state.record.observed_generation;
        let fleet_event = if conditions_changed_now {
            events.push(conditions_changed(
                &record.conditions,
                record.observed_generation,
            ));
            self.settings
                .fleet
                .as_ref()
                .map(|_| crate::wire::fleet_event(&record.name, &record.conditions, now, false))
        } else {
            None
        };
        stamp(&mut events, record.revision, now);
        let floor = self.prune_events(&mut batch, record.revision, now)?;
        record.compact_revision = Some(floor);
        persist::put_events(&mut batch, record.id, record.revision, &events);
        persist::put_record(&mut batch, &record)?;
        self.commit_batch(batch, fleet_event, now).await?;
        if !events.is_empty() && self.oldest_event_ms.is_none() {
            self.oldest_event_ms = Some(now);
        }
        self.events.hub.publish(record.revision, events);
        let touched: Vec<ItemRef> = updates.iter().map(|(key, _)| key.clone()).collect();
        let before: Vec<_> = touched
            .iter()
            .map(|key| self.state.displayed(key))
            .collect();
        apply_updates(&mut self.state.current, updates);
        for (key, before) in touched.iter().zip(before) {
            self.state.recount_item(key, before);
        }
        self.state.record = record;
        Ok(())
    }

    /// Commits `batch` durably, through the fleet log when the tenant's
    /// conditions changed.
    async fn commit_batch(
        &self,
        batch: WriteBatch,
        fleet_event: Option<v1::FleetEvent>,
        now: u64,
    ) -> Result<(), TenantError> {
        match &self.settings.fleet {
            Some(fleet) => fleet.commit_durably(batch, fleet_event, now).await?,
            None => self.store.commit(batch).await?,
        }
        Ok(())
    }

    /// Adds the deletes of events beyond the retention to `batch` when the
    /// log has outgrown it; returns the compaction floor to store.
    fn prune_events(
        &mut self,
        batch: &mut WriteBatch,
        newest: u64,
        now: u64,
    ) -> Result<u64, TenantError> {
        let retention = self.settings.event_retention;
        let floor = self.state.record.events_floor();
        // Prune in steps, not at every commit: each step scans the log.
        let slack = (retention.max_revisions / 16).max(1);
        let too_many = newest.saturating_sub(floor) > retention.max_revisions + slack;
        let too_old = self
            .oldest_event_ms
            .is_some_and(|oldest| oldest < now.saturating_sub(retention.max_age_ms));
        if !too_many && !too_old {
            return Ok(floor);
        }
        let pruned = history::prune(
            &*self.store,
            batch,
            self.state.record.id,
            floor,
            newest,
            now,
            retention,
        )
        .map_err(|error| TenantError::Corrupt {
            key: String::from("(event log)"),
            message: error.to_string(),
        })?;
        // Before the deletes commit: see `watch::stream::catch_up`.
        self.events.raise_floor(pruned.floor);
        self.oldest_event_ms = pruned.oldest_ms;
        Ok(pruned.floor)
    }

    /// Now on the wall clock (unix ms): for what is stored or shown.
    pub(super) fn now(&self) -> u64 {
        self.settings.clock.now_ms()
    }

    /// Now on the monotonic clock: for deadlines.
    pub(super) fn monotonic(&self) -> Instant {
        self.settings.clock.monotonic()
    }

    fn environment(&self, now_ms: u64) -> Environment<'_> {
        Environment {
            types: &self.types,
            sessions: &self.sessions,
            unconverged: &self.state.unconverged,
            state: &self.state,
            operations: &self.operations,
            room: &self.room,
            now_ms,
        }
    }

    /// Plans (all unconverged items, or the given ones and what they
    /// unblock), applies the plan's bookkeeping, dispatches what is ready,
    /// recomputes conditions, commits what changed and publishes a snapshot.
    pub(super) async fn pass(&mut self, scope: Scope) -> Result<Plan, TenantError> {
        self.pass_with(scope, Vec::new(), None).await
    }

    /// A pass that first takes `pending` (e.g. an operation's result) into
    /// account: it plans on the state with `pending` applied, then commits
    /// `pending`, the plan's bookkeeping, the journal of the operations it
    /// dispatches and the tenant record in ONE commit, then sends the
    /// operations. If the commit fails, nothing changed.
    #[instrument(name = "pass", skip_all, fields(tenant = %self.state.record.name))]
    pub(super) async fn pass_with(
        &mut self,
        scope: Scope,
        pending: CurrentUpdates,
        intent: Option<IntentChange>,
    ) -> Result<Plan, TenantError> {
        let started = std::time::Instant::now();
        let now = self.now();
        let mut seeds = match scope {
            Scope::Full => self.state.unconverged.clone(),
            Scope::Items(items) => {
                let mut seeds = items.clone();
                for item in &items {
                    if let Some(waiters) = self.waiters.remove(item) {
                        seeds.extend(waiters);
                    }
                }
                seeds
            }
        };

        // Plan on the state with `pending` applied, then put it back: the
        // commit below applies everything, counts included, in one go.
        let saved: Vec<(ItemRef, Option<Arc<CurrentItem>>)> = pending
            .iter()
            .map(|(key, _)| (key.clone(), self.state.current.get(key).cloned()))
            .collect();
        apply_updates(&mut self.state.current, pending.clone());
        self.count_in_flight();
        seeds.extend(self.take_undispatched_with_room());
        let saved_intent = intent
            .as_ref()
            .map(|change| self.apply_intent_tentatively(change));
        let plan = {
            let environment = self.environment(now);
            let plan = || {
                plan_operations(
                    &self.state.intended,
                    &self.state.current,
                    &seeds,
                    &environment,
                )
            };
            let multi_thread = tokio::runtime::Handle::try_current().is_ok_and(|handle| {
                handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
            });
            if seeds.len() > LARGE_PASS_SEEDS && multi_thread {
                // A large pass takes a while: let the runtime move other
                // tenants' tasks off this worker meanwhile.
                tokio::task::block_in_place(plan)
            } else {
                plan()
            }
        };
        let bookkeeping = bookkeeping_updates(&self.state.current, &plan);
        // The seeds were planned again: whether they still wait for room
        // is decided anew below (an item queued for room may need nothing
        // now, and would take the room of one that does).
        self.room.unqueue(&seeds);
        let (mut starts, mut journal, waiting_for_room) = self.prepare_dispatch(&plan, now);
        let (reads, read_journal) = self.prepare_reads(now, &plan, &starts);
        starts.extend(reads);
        journal.extend(read_journal);
        // Retry times and waiters are read from the state the plan saw.
        self.absorb(&seeds, &plan, now);
        for (key, value) in saved {
            match value {
                Some(value) => {
                    self.state.current.insert(key, (*value).clone());
                }
                None => {
                    self.state.current.remove(&key);
                }
            }
        }

        let record = self.conditions_record(now, waiting_for_room);
        let record = match (record, &intent) {
            (None, Some(_)) => Some(self.state.record.clone()),
            (record, _) => record,
        };
        if let Some(saved) = saved_intent {
            self.restore_intent(saved);
        }
        // Cancels are marked in this pass's commit and sent after it.
        let (cancel_marks, cancels) = self.prepare_cancels(&plan);
        let mut intent_writes = WriteBatch::new();
        if let Some(change) = &intent {
            self.write_intent(&mut intent_writes, change)?;
            let count = change.upserts.len() + change.removals.len();
            self.pending_events.push(intent_changed(
                change.generation,
                count,
                intent_keys(change),
            ));
        }
        let mut writes = pending;
        writes.extend(bookkeeping);
        writes.extend(journal);
        writes.extend(cancel_marks);
        if !writes.is_empty() || record.is_some() || !self.pending_events.is_empty() {
            // On error nothing changed in the store; the next pass recounts
            // the room the picked operations took, and looks at the seeds
            // again (the plan's bookkeeping above assumed this commit).
            if let Err(error) = self
                .commit_current_updates_with(writes, record, intent_writes)
                .await
            {
                // The seeds, and what this pass would have followed up,
                // are unconverged again: a full pass a second from now
                // looks at them (following up at once would spin while the
                // store refuses writes).
                self.state.unconverged.extend(seeds);
                self.follow_up.clear();
                self.timer_retry = Some(self.monotonic() + TIMER_RETRY);
                self.count_in_flight();
                return Err(error);
            }
        }
        if let Some(change) = &intent {
            self.apply_intent(change);
        }
        self.send_cancels(cancels);
        self.send_dispatched(starts, now);
        self.recount_in_flight();
        self.publish();
        self.settings.metrics.pass(started.elapsed().as_secs_f64());
        Ok(plan)
    }

    /// Applies an intent change in memory for planning; returns what to
    /// restore (previous entries and generation).
    fn apply_intent_tentatively(&mut self, change: &IntentChange) -> SavedIntent {
        let previous = intent_keys(change)
            .map(|key| (key.clone(), self.state.intended.get(&key).cloned()))
            .collect();
        let generation = self.state.record.generation;
        apply_change(&mut self.state.intended, change);
        self.state.record.generation = change.generation;
        (previous, generation)
    }

    /// Undoes [`Owner::apply_intent_tentatively`].
    fn restore_intent(&mut self, (previous, generation): SavedIntent) {
        for (key, entry) in previous {
            match entry {
                Some(entry) => {
                    self.state.intended.insert((*entry).clone());
                }
                None => {
                    self.state.intended.remove(&key);
                }
            }
        }
        self.state.record.generation = generation;
    }

    /// Applies a committed intent change in memory, with its counts.
    fn apply_intent(&mut self, change: &IntentChange) {
        let touched: Vec<ItemRef> = intent_keys(change).collect();
        let before: Vec<_> = touched
            .iter()
            .map(|key| self.state.displayed(key))
            .collect();
        apply_change(&mut self.state.intended, change);
        for (key, before) in touched.iter().zip(before) {
            self.state.recount_item(key, before);
        }
    }

    /// Adds the writes that store an intent change.
    fn write_intent(
        &self,
        batch: &mut WriteBatch,
        change: &IntentChange,
    ) -> Result<(), TenantError> {
        let id = self.state.record.id;
        for entry in &change.upserts {
            let stored = StoredIntended {
                item: (*entry.item).clone(),
                generation: entry.generation,
            };
            persist::put_intended(batch, id, &stored)?;
        }
        for key in &change.removals {
            persist::delete_intended(batch, id, key);
        }
        Ok(())
    }

    /// Merges a plan over `seeds` into the tenant's bookkeeping: the
    /// unconverged set, the waiting set, and who waits on whom.
    fn absorb(&mut self, seeds: &BTreeSet<ItemRef>, plan: &Plan, now: u64) {
        for seed in seeds {
            if !plan.unconverged.contains(seed) {
                self.state.unconverged.remove(seed);
            }
            self.state.waiting.remove(seed);
        }
        self.state
            .unconverged
            .extend(plan.unconverged.iter().cloned());
        for (key, _) in &plan.forget {
            self.state.unconverged.insert(key.clone());
            self.follow_up.insert(key.clone());
        }
        self.follow_up.extend(plan.settle.iter().cloned());
        // Operations that wait for other operations of the plan are woken
        // by those operations' results, like waiting items by their
        // blockers, and meanwhile show what they wait for (DESIGN 2).
        for (index, operation) in plan.operations.iter().enumerate() {
            let mut blocked_by = Vec::new();
            let mut waits_for_dependency = false;
            for predecessor in plan.predecessors(index) {
                let blocker = &plan.operations[predecessor];
                if blocker.item != operation.item {
                    self.waiters
                        .entry(blocker.item.clone())
                        .or_default()
                        .insert(operation.item.clone());
                    waits_for_dependency |= blocker.kind != OperationKind::Delete;
                    blocked_by.push(BlockedBy {
                        item: blocker.item.clone(),
                        why: format!("its {} runs first", blocker.kind.as_str()),
                    });
                }
            }
            if !blocked_by.is_empty() {
                self.state.waiting.insert(WaitingItem {
                    item: operation.item.clone(),
                    operation: operation.kind,
                    reason: if waits_for_dependency {
                        WaitReason::Dependency
                    } else {
                        WaitReason::Blocked
                    },
                    blocked_by,
                });
            }
        }
        // A retry time already due stays: the timer then fires at once and
        // plans the items whose backoff is over (dropping it stranded an
        // item this pass did not look at, after a wall-clock step forward).
        let mut next_retry = self.next_retry_ms;
        for waiting in &plan.waiting {
            for blocker in &waiting.blocked_by {
                if blocker.item != waiting.item {
                    self.waiters
                        .entry(blocker.item.clone())
                        .or_default()
                        .insert(waiting.item.clone());
                }
            }
            if waiting.reason == WaitReason::Backoff {
                let at = self
                    .state
                    .current
                    .get(&waiting.item)
                    .and_then(|c| c.next_attempt_at_ms);
                next_retry = match (next_retry, at) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            self.state.waiting.insert(waiting.clone());
        }
        self.next_retry_ms = next_retry;
        let waits_for_configurator = !self.state.waiting.summary().without_configurator.is_empty();
        self.no_configurator_since_ms =
            match (waits_for_configurator, self.no_configurator_since_ms) {
                (false, _) => None,
                (true, Some(since)) => Some(since),
                (true, None) => Some(now),
            };
    }

    /// Recomputes the conditions. Returns the record to commit when they
    /// changed in substance; a change of wording only is shown without a
    /// commit.
    fn conditions_record(&mut self, now: u64, ready_operations: usize) -> Option<TenantRecord> {
        let progress = Progress {
            generation: self.state.record.generation,
            // A drift READ is observation, not work (DESIGN section 5).
            in_flight: self.room.running_work(),
            ready_operations,
            waiting: self.state.waiting.summary(),
            no_configurator_since_ms: self.no_configurator_since_ms,
            configurator_grace_ms: u64::try_from(self.settings.configurator_grace.as_millis())
                .unwrap_or(u64::MAX),
            now_ms: now,
        };
        let (conditions, observed) = compute_conditions(
            &self.state.record.conditions,
            self.state.record.observed_generation,
            &progress,
        );
        if !significant_change(&self.state.record.conditions, &conditions)
            && observed == self.state.record.observed_generation
        {
            self.state.record.conditions = conditions;
            return None;
        }
        let mut record = self.state.record.clone();
        record.conditions = conditions;
        record.observed_generation = observed;
        Some(record)
    }

    /// Publishes a snapshot of the current state.
    pub(super) fn publish(&self) {
        self.snapshots.publish(
            TenantSnapshot::capture(
                &self.state,
                self.room.running(),
                self.connected_item_types(),
            )
            .with_item_types(self.types.clone()),
        );
    }

    /// The item types a live session holds, sorted.
    fn connected_item_types(&self) -> Vec<String> {
        let mut types: Vec<String> = self.sessions.keys().cloned().collect();
        types.sort();
        types
    }
}

/// Whether two condition sets differ in anything but their messages.
fn significant_change(
    before: &[crate::engine::conditions::Condition],
    after: &[crate::engine::conditions::Condition],
) -> bool {
    before.len() != after.len()
        || before.iter().zip(after).any(|(b, a)| {
            (
                b.kind,
                b.status,
                &b.reason,
                b.observed_generation,
                b.last_transition_ms,
            ) != (
                a.kind,
                a.status,
                &a.reason,
                a.observed_generation,
                a.last_transition_ms,
            )
        })
}

/// What a tentatively applied intent change replaced: the previous
/// entries of its items and the previous generation.
type SavedIntent = (Vec<(ItemRef, Option<Arc<IntendedItem>>)>, u64);

/// Splits reports where an item that vanished comes back: its vanishing
/// must be planned (dependents auto-deleted with it are dropped, rule 9)
/// before it exists again, not folded into "it exists".
fn flap_segments(changes: Vec<ExternalChange>) -> Vec<Vec<ExternalChange>> {
    let mut segments = Vec::new();
    let mut segment = Vec::new();
    let mut vanished: BTreeSet<ItemRef> = BTreeSet::new();
    for change in changes {
        let comes_back = matches!(&change, ExternalChange::Put { item, .. } if vanished.contains(&item.item_ref()));
        if comes_back {
            segments.push(std::mem::take(&mut segment));
            vanished.clear();
        }
        if let ExternalChange::Delete { item } = &change {
            vanished.insert(item.clone());
        }
        segment.push(change);
    }
    segments.push(segment);
    segments
}

/// Every item an intent change stores or removes.
fn intent_keys(change: &IntentChange) -> impl Iterator<Item = ItemRef> + '_ {
    change
        .upserts
        .iter()
        .map(|entry| entry.item.item_ref())
        .chain(change.removals.iter().cloned())
}

#[cfg(test)]
mod tests;
