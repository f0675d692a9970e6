//! The owner of one tenant: the task that alone changes the tenant's
//! state. It is a thin actor over the tenant's [`Executor`]: it takes
//! commands from its queue and wakes up when the executor asks to, hands
//! each to the executor with the time, and carries out the [`Effects`]:
//! makes the commit durable (through [`persist`], with the tenant record
//! and the watch events), tells the executor, then sends to agents, logs,
//! and publishes a snapshot. Readers use snapshots and never wait for it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use reconciled_proto::v1;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{Instrument, debug, info_span, instrument, warn};

use crate::engine::exec::port::{ExternalChange, FromAgent, Grant, Registration, ToAgent};
use crate::engine::exec::{
    AgentResult, Commit, Effects, Executor, ExecutorSettings, Now, TypeHeld,
};
use crate::engine::intent::ValidatedSubmit;
use crate::engine::plan::Plan;
use crate::store::{Store, StoreError, WriteBatch};
use crate::watch::TenantEvents;
use crate::watch::fleet::FleetLog;
use crate::watch::history::{self, Retention};

use super::clock::{Clock, SystemClock, system_now_ms};
use super::error::TenantError;
use super::fair::{FairWorkers, fairly};
use super::oplog::OperationLog;
use super::persist;
use super::record::TenantRecord;
use super::snapshot::{SnapshotHistory, TenantSnapshot};
use super::state::TenantState;

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
    /// The most bytes (keys and values) of events a tenant's log keeps; the
    /// oldest revisions beyond it are pruned, the newest always kept.
    pub event_history_bytes: u64,
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
    /// The seats of heavy work that every tenant's large passes share
    /// fairly.
    pub workers: Arc<FairWorkers>,
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
            event_history_bytes: DEFAULT_EVENT_HISTORY_BYTES,
            watch_ring_events: DEFAULT_RING_EVENTS,
            fleet: None,
            clock: Arc::new(SystemClock),
            rng_seed: None,
            workers: FairWorkers::new(FairWorkers::default_seats()),
        }
    }
}

/// Default of [`OwnerSettings::watch_ring_events`].
pub const DEFAULT_RING_EVENTS: usize = 10_000;

/// Default of [`OwnerSettings::event_history_bytes`]: 256 MiB.
pub const DEFAULT_EVENT_HISTORY_BYTES: u64 = 256 * 1024 * 1024;

/// Why a registration was refused.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RegistrationError {
    /// Another live agent holds a type.
    #[error(transparent)]
    TypeHeld(#[from] TypeHeld),
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

/// Results taken into one pass (and one commit) at most.
const MAX_RESULTS_PER_PASS: usize = 256;

/// Writes of a pass's commit besides its results' and dispatches' items:
/// the tenant record, its directory entry, the events.
const PASS_OVERHEAD_WRITES: usize = 8;

/// Results taken into one pass when the store applies at most
/// `writes_per_step` writes in one step: each result writes its item and
/// may free room for one dispatch, which journals another, so the pass's
/// commit stays one step (on etcd, one transaction rather than a staged
/// commit of several round trips).
fn results_per_pass(writes_per_step: Option<usize>) -> usize {
    writes_per_step.map_or(MAX_RESULTS_PER_PASS, |writes| {
        (writes.saturating_sub(PASS_OVERHEAD_WRITES) / 2).clamp(1, MAX_RESULTS_PER_PASS)
    })
}

/// Tenants with more items than this plan on a seat of the shared
/// [`FairWorkers`], on a thread the runtime may leave (`block_in_place`),
/// so that big tenants' full passes neither hold up small tenants on the
/// same worker nor, together, take every core.
const LARGE_TENANT_ITEMS: usize = 2_000;

type Reply<T> = oneshot::Sender<Result<T, TenantError>>;

/// A command with the time it was queued (for the queue wait metric).
///
/// The command is boxed: a tenant's channel keeps its first block of 32
/// slots for as long as the tenant lives, 3.9 KiB with commands inline.
struct Queued {
    at: std::time::Instant,
    command: Box<Command>,
}

impl Queued {
    fn now(command: Command) -> Self {
        Self {
            at: std::time::Instant::now(),
            command: Box::new(command),
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
        mpsc::UnboundedSender<ToAgent>,
        oneshot::Sender<Result<Vec<Grant>, RegistrationError>>,
    ),
    FromAgent(u64, FromAgent),
    SessionClosed(u64, String),
}

/// A running tenant: its identity, its command queue and its snapshots.
#[derive(Clone)]
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
    /// The store the owner commits through (with replicas on etcd, one
    /// that fences every commit on the tenant's owner key).
    store: Arc<dyn Store>,
    /// True while a deletion of the tenant is being decided (see
    /// [`TenantHandle::begin_deletion`]).
    deleting: Arc<tokio::sync::watch::Sender<bool>>,
}

/// A deletion of a tenant under way (from [`TenantHandle::begin_deletion`]);
/// dropping it says the deletion is decided, either way.
#[derive(Debug)]
pub struct DeletionUnderWay {
    deleting: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Drop for DeletionUnderWay {
    fn drop(&mut self) {
        self.deleting.send_replace(false);
    }
}

impl std::fmt::Debug for TenantHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantHandle")
            .field("id", &self.id)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl TenantHandle {
    /// Starts the owner task of a loaded tenant.
    pub fn spawn(state: TenantState, store: Arc<dyn Store>, settings: OwnerSettings) -> Self {
        let (commands, receiver) = mpsc::channel(256);
        let owner = Owner::new(state, store.clone(), settings);
        let handle = Self {
            store,
            id: owner.record.id,
            name: owner.record.name.clone(),
            commands,
            snapshots: owner.snapshots.clone(),
            events: owner.events.clone(),
            stop: CancellationToken::new(),
            stopped: CancellationToken::new(),
            deleting: Arc::new(tokio::sync::watch::Sender::new(false)),
        };
        let stop = handle.stop.clone();
        let finished = handle.stopped.clone().drop_guard();
        // Spawned as it is: an `async` block around it would keep the
        // owner twice (captured, and moved into `run`), 2.4 KiB more per
        // tenant for as long as the tenant lives. The span names the tenant
        // in every line its engine logs (which knows only the id).
        let span = info_span!("tenant", name = %handle.name, id = handle.id);
        tokio::spawn(
            Box::new(owner)
                .run(receiver, stop, finished)
                .instrument(span),
        );
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

    /// Registers a configurator session for item types; messages for the
    /// session go to `sender`. Answers the granted types with their
    /// epochs, or why the registration is refused.
    pub async fn register(
        &self,
        registration: Registration,
        sender: mpsc::UnboundedSender<ToAgent>,
    ) -> Result<Vec<Grant>, RegistrationError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Queued::now(Command::Register(registration, sender, reply)))
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

    /// The store the owner commits through: other commits of this tenant
    /// (its tombstone) go through it too.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Completes once the owner task has ended, however it ended (stopped,
    /// or fenced out when another replica took the tenant over).
    pub async fn ended(&self) {
        self.stopped.cancelled().await;
    }

    /// Marks a deletion of the tenant as under way until the returned guard
    /// is dropped. The deletion stops the owner before its tombstone is
    /// committed, which ends the owner's agent sessions; a session that
    /// sees its owner end waits ([`deletion_settled`](Self::deletion_settled))
    /// until the deletion is decided, so that it tells its agent what
    /// happened: `UNAUTHENTICATED` once the tombstone is durable and the
    /// token revoked, `NOT_OWNER` when the tombstone was fenced out (the
    /// tenant lives on elsewhere, and the old token with it). Drop the
    /// guard only after the token is revoked.
    pub fn begin_deletion(&self) -> DeletionUnderWay {
        self.deleting.send_replace(true);
        DeletionUnderWay {
            deleting: self.deleting.clone(),
        }
    }

    /// Completes once no deletion of the tenant is under way.
    pub async fn deletion_settled(&self) {
        let mut deleting = self.deleting.subscribe();
        // The sender lives in `self`: `wait_for` cannot fail.
        let _ = deleting.wait_for(|deleting| !*deleting).await;
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

/// The owner task's state.
struct Owner {
    /// The tenant record as last committed (its progress comes from the
    /// executor).
    record: TenantRecord,
    executor: Executor,
    store: Arc<dyn Store>,
    settings: OwnerSettings,
    snapshots: Arc<SnapshotHistory>,
    events: Arc<TenantEvents>,
    /// Completed operations, for `Reconcile` answers.
    log: Arc<OperationLog>,
    /// Where each live session's messages go.
    links: HashMap<u64, mpsc::UnboundedSender<ToAgent>>,
    /// The origin of the executor's monotonic milliseconds.
    origin: Instant,
    /// The time of the oldest event kept, if any is.
    oldest_event_ms: Option<u64>,
    /// Set when the store refused a commit because this process no longer
    /// owns the tenant ([`StoreError::Fenced`], replicas on etcd): the
    /// owner stops at once, before handling anything else.
    fenced_out: bool,
    /// What the last durable commit has to tell watchers, until the
    /// snapshot that shows it is published (see [`Announcement`]).
    announcement: Option<Announcement>,
}

/// The events of a durable commit, told to the tenant's watchers and the
/// fleet once the snapshot showing the commit is published: a dashboard
/// that answers an event by reading the tenant's status (GetTenant,
/// GetStatus) then reads the state the event announces, not the one
/// before it.
struct Announcement {
    revision: u64,
    events: Vec<v1::Event>,
    /// The commit's fleet revision and event, if it changed conditions.
    fleet: Option<(u64, v1::FleetEvent)>,
}

impl Drop for Owner {
    /// A fleet revision left unsettled would hold back every later one,
    /// whoever's: an owner that stops tells what it committed.
    fn drop(&mut self) {
        self.announce();
    }
}

/// The bytes of `record`'s event log, counted from the store: for a record
/// written before they were kept (or after a repair compacted the log).
/// A log that cannot be read counts as empty, with a warning: its bytes
/// are then counted from the next commit on.
fn count_history_bytes(store: &dyn Store, record: &TenantRecord) -> u64 {
    history::stored_bytes_after(store, record.id, record.events_floor()).unwrap_or_else(|error| {
        warn!(tenant = %record.name, %error, "Counting the event log's bytes failed.");
        0
    })
}

impl Owner {
    fn new(state: TenantState, store: Arc<dyn Store>, settings: OwnerSettings) -> Self {
        let origin = settings.clock.monotonic();
        let now = Now {
            wall_ms: settings.clock.now_ms(),
            mono_ms: 0,
        };
        let mut record = state.record.clone();
        if record.history_bytes.is_none() {
            record.history_bytes = Some(count_history_bytes(&*store, &record));
        }
        let executor_settings = ExecutorSettings {
            tenant_id: record.id,
            max_items: record.limits.max_items,
            default_max_items: settings.default_max_items,
            max_operations_in_flight: record.limits.max_operations_in_flight,
            configurator_grace_ms: millis(settings.configurator_grace),
            resync_interval_ms: millis(settings.resync_interval),
            cancel_timeout_ms: millis(settings.cancel_timeout),
            seed: settings.rng_seed.unwrap_or_else(|| rand::rng().random()),
        };
        let progress = state.progress();
        let executor = Executor::load(
            state.intended,
            state.current,
            progress,
            state.specs,
            executor_settings,
            now,
        );
        let snapshots = Arc::new(SnapshotHistory::new(TenantSnapshot::capture(
            record.clone(),
            executor.model(),
            0,
            Vec::new(),
        )));
        let events = Arc::new(TenantEvents::new(
            store.clone(),
            record.id,
            record.events_floor(),
            record.revision,
            settings.watch_ring_events,
        ));
        let oldest_event_ms = history::oldest_after(&*store, record.id, record.events_floor())
            .unwrap_or_else(|error| {
                warn!(tenant = %record.name, %error, "Reading the event log failed.");
                None
            });
        Self {
            log: snapshots.log(),
            record,
            executor,
            store,
            settings,
            snapshots,
            events,
            links: HashMap::new(),
            origin,
            oldest_event_ms,
            fenced_out: false,
            announcement: None,
        }
    }

    /// Runs the tenant: its first pass, then commands, timers and internal
    /// work until `stop`, the end of the command channel, or a fenced commit.
    /// `finished` is dropped when it returns.
    ///
    /// The work awaited here is boxed: a tenant's task lives as long as
    /// the tenant, and keeping these state machines inline made every
    /// tenant's task 11.4 KiB instead of 7.6 KiB.
    async fn run(
        // Boxed: an `async fn` keeps its by-value arguments twice (as
        // passed, and moved into its body), and the owner is 2.3 KiB.
        mut self: Box<Self>,
        mut commands: mpsc::Receiver<Queued>,
        stop: CancellationToken,
        _finished: DropGuard,
    ) {
        let now = self.now();
        let (effects, _) = self.executor.reconcile(false, now);
        if let Err(error) = Box::pin(self.carry_out(effects)).await {
            warn!(tenant = %self.record.name, %error, "First pass failed.");
        }
        let mut deferred: Option<Command> = None;
        let results_per_pass = results_per_pass(self.store.writes_per_step());
        loop {
            if self.fenced_out {
                break;
            }
            Box::pin(self.internal_work()).await;
            if self.fenced_out {
                break;
            }
            let command = match deferred.take() {
                Some(command) => command,
                None => {
                    let wakeup = self
                        .executor
                        .next_wakeup(self.now())
                        .map(|ms| self.origin + Duration::from_millis(ms));
                    let timer = async {
                        match wakeup {
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
                            let now = self.now();
                            let effects = Box::pin(self.large(|executor| executor.on_timer(now))).await;
                            if let Err(error) = Box::pin(self.carry_out(effects)).await {
                                warn!(tenant = %self.record.name, %error, "Timer pass failed; retrying in a second.");
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
                let mut batch = vec![AgentResult {
                    session_id,
                    op_id,
                    attempt,
                    outcome,
                }];
                while batch.len() < results_per_pass {
                    match commands.try_recv().map(|queued| self.took(queued)) {
                        Ok(Command::FromAgent(
                            session_id,
                            FromAgent::Result {
                                op_id,
                                attempt,
                                outcome,
                            },
                        )) => batch.push(AgentResult {
                            session_id,
                            op_id,
                            attempt,
                            outcome,
                        }),
                        Ok(other) => {
                            deferred = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let effects = self.executor.results(batch, self.now());
                if let Err(error) = Box::pin(self.carry_out(effects)).await {
                    warn!(tenant = %self.record.name, %error, "Recording results failed.");
                }
                continue;
            }
            Box::pin(self.handle(command)).await;
        }
        if self.fenced_out {
            warn!(tenant = %self.record.name, "This process no longer owns the tenant (a commit was fenced out); its owner stopped.");
        }
        debug!(tenant = %self.record.name, "Tenant owner stopped.");
    }

    /// Handles one command that is not a result.
    async fn handle(&mut self, command: Command) {
        let now = self.now();
        match command {
            Command::Submit(request, reply) => {
                let size = request.items.len();
                let answer = match self
                    .large_for(size, |executor| executor.submit(request, now))
                    .await
                {
                    Ok((effects, submitted)) => {
                        self.carry_out(effects).await.map(|()| SubmitOutcome {
                            generation: submitted.generation,
                            changed: submitted.changed,
                            plan: submitted.plan,
                            revision: self.record.revision,
                        })
                    }
                    Err(error) => Err(error.into()),
                };
                if answer.as_ref().is_ok_and(|outcome| outcome.changed) {
                    debug!(tenant = %self.record.name, generation = self.executor.model().progress().generation, "Intent stored.");
                }
                let _ = reply.send(answer);
            }
            Command::ReportExternal(changes, reply) => {
                let effects = self
                    .large(|executor| executor.report_external(changes, now))
                    .await;
                let answer = self.carry_out(effects).await.map(|()| self.record.revision);
                let _ = reply.send(answer);
            }
            Command::SetTokenHash(token_hash, reply) => {
                let _ = reply.send(self.set_token_hash(token_hash).await);
            }
            Command::Reconcile(refresh, reply) => {
                let (effects, plan) = self
                    .large(|executor| executor.reconcile(refresh, now))
                    .await;
                let _ = reply.send(self.carry_out(effects).await.map(|()| plan));
            }
            Command::Register(registration, sender, reply) => {
                let session_id = registration.session_id;
                let answer = match self
                    .large(|executor| executor.register(registration, now))
                    .await
                {
                    Err(held) => Err(held.into()),
                    Ok((effects, grants)) => {
                        self.links.insert(session_id, sender);
                        match self.carry_out(effects).await {
                            Ok(()) => {
                                // Sessions whose every type this one took
                                // over (a reconnect of their agent id)
                                // serve nothing: they end ("the server
                                // replaced this session") instead of living
                                // on uncounted by `max_agents`, which counts
                                // agent ids.
                                let executor = &self.executor;
                                self.links.retain(|id, _| {
                                    *id == session_id || executor.holds_a_type(*id)
                                });
                                Ok(grants)
                            }
                            Err(error) => {
                                self.links.remove(&session_id);
                                Err(error.into())
                            }
                        }
                    }
                };
                let _ = reply.send(answer);
            }
            Command::FromAgent(session_id, message) => {
                if let Err(error) = self.agent_message(session_id, message, now).await {
                    warn!(tenant = %self.record.name, %error, "Handling an agent message failed.");
                }
            }
            Command::SessionClosed(session_id, reason) => {
                let effects = self.executor.session_closed(session_id, &reason, now);
                self.links.remove(&session_id);
                if let Err(error) = self.carry_out(effects).await {
                    warn!(tenant = %self.record.name, %error, "Handling a closed session failed.");
                }
            }
        }
    }

    /// Handles a message of session `session_id` that is not a result.
    async fn agent_message(
        &mut self,
        session_id: u64,
        message: FromAgent,
        now: Now,
    ) -> Result<(), TenantError> {
        match message {
            FromAgent::Result {
                op_id,
                attempt,
                outcome,
            } => {
                let result = AgentResult {
                    session_id,
                    op_id,
                    attempt,
                    outcome,
                };
                let effects = self.executor.results(vec![result], now);
                self.carry_out(effects).await
            }
            FromAgent::Progress {
                op_id,
                attempt,
                message,
            } => {
                if self
                    .executor
                    .progress(session_id, &op_id, attempt, message, now)
                {
                    self.publish();
                }
                Ok(())
            }
            FromAgent::CancelAck { op_id } => {
                debug!(tenant = %self.record.name, %op_id, "Cancel acknowledged.");
                Ok(())
            }
            FromAgent::External(changes) => {
                let effects = self
                    .large(|executor| executor.report_external(changes, now))
                    .await;
                self.carry_out(effects).await
            }
        }
    }

    /// What the executor does between commands: lost operations whose
    /// dependency is no longer UNKNOWN are sent again, and items a pass
    /// changed without an operation are planned again, until neither has
    /// anything left.
    async fn internal_work(&mut self) {
        if let Some(effects) = self.executor.redeliver_deferred(self.now())
            && let Err(error) = self.carry_out(effects).await
        {
            warn!(tenant = %self.record.name, %error, "Sending lost operations again failed.");
        }
        while let Some(effects) = self.executor.follow_up(self.now()) {
            if let Err(error) = self.carry_out(effects).await {
                warn!(tenant = %self.record.name, %error, "Follow-up pass failed.");
                break;
            }
            if let Some(effects) = self.executor.redeliver_deferred(self.now())
                && let Err(error) = self.carry_out(effects).await
            {
                warn!(tenant = %self.record.name, %error, "Sending lost operations again failed.");
            }
        }
    }

    /// Runs `work` on the executor; when the tenant is large, on a seat of
    /// the shared [`FairWorkers`] and on a thread the runtime may leave (a
    /// long pass must not hold up other tenants' tasks on this worker).
    async fn large<T: Send>(&mut self, work: impl FnOnce(&mut Executor) -> T + Send) -> T {
        self.large_for(0, work).await
    }

    /// [`Self::large`] for an input that brings `incoming` items.
    async fn large_for<T: Send>(
        &mut self,
        incoming: usize,
        work: impl FnOnce(&mut Executor) -> T + Send,
    ) -> T {
        let model = self.executor.model();
        let size = model.intended.len().max(model.current.len()) + incoming;
        let executor = &mut self.executor;
        fairly(
            &self.settings.workers,
            self.record.id,
            size > LARGE_TENANT_ITEMS,
            || work(executor),
        )
        .await
    }

    /// Carries out an executor's effects: what does not wait for the
    /// commit is sent, the commit is made durable, the executor is told,
    /// and then what waited for it is sent, logged and published. Traced
    /// as the tenant's `pass` (the executor planned what it carries out).
    #[instrument(name = "pass", skip_all, fields(tenant = %self.record.name))]
    async fn carry_out(&mut self, effects: Effects) -> Result<(), TenantError> {
        let started = std::time::Instant::now();
        let Effects {
            immediate,
            commit,
            sends,
            started: dispatched,
            finished,
        } = effects;
        for message in immediate {
            self.send(message.session_id, message.message);
        }
        if !commit.is_empty()
            && let Err(error) = self.commit(commit).await
        {
            self.executor.commit_failed(self.now());
            return Err(error);
        }
        let now = self.now();
        self.executor.committed(now);
        for message in sends {
            self.send(message.session_id, message.message);
        }
        for operation in dispatched {
            let _span = info_span!(
                "operation",
                tenant = %self.record.name,
                item = %operation.item,
                op_id = %operation.op_id,
                kind = operation.kind.as_str(),
                attempt = operation.attempt,
            )
            .entered();
            debug!("Operation dispatched.");
            self.settings.metrics.dispatched(operation.kind);
            self.log.started(
                operation.item,
                operation.kind,
                operation.op_id,
                operation.attempt,
                operation.at_ms,
                operation.previous_error,
            );
        }
        for operation in finished {
            let seconds = operation.duration_ms as f64 / 1e3;
            let _span = info_span!(
                "operation_result",
                tenant = %self.record.name,
                item = %operation.item,
                op_id = %operation.op_id,
                kind = operation.kind.as_str(),
                outcome = operation.outcome.as_str(),
                seconds,
            )
            .entered();
            debug!("Operation result recorded.");
            self.settings
                .metrics
                .finished(operation.kind, operation.outcome.as_str(), seconds);
            self.log.ended(
                &operation.op_id,
                operation.attempt,
                operation.at_ms,
                operation.error,
            );
        }
        self.publish();
        self.settings.metrics.pass(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Sends `message` to session `session_id`, if it is still connected.
    fn send(&self, session_id: u64, message: ToAgent) {
        if let Some(link) = self.links.get(&session_id) {
            let _ = link.send(message);
        }
    }

    /// The record to store now: the last committed one with the
    /// executor's progress.
    fn current_record(&self) -> TenantRecord {
        let progress = self.executor.model().progress();
        TenantRecord {
            generation: progress.generation,
            observed_generation: progress.observed_generation,
            conditions: progress.conditions.clone(),
            ..self.record.clone()
        }
    }

    /// Makes an executor's commit durable with a new revision of the
    /// tenant record and the commit's events; prunes the event log beyond
    /// its retention and tells the fleet log of changed conditions. Once
    /// durable, the events go to watchers.
    async fn commit(&mut self, commit: Commit) -> Result<(), TenantError> {
        let mut batch = WriteBatch::new();
        persist::write_commit(&mut batch, self.record.id, &commit)?;
        let record = self.current_record();
        let events = crate::wire::events_to_proto(&commit.events);
        let fleet_event = commit.conditions_changed.then(|| {
            crate::wire::fleet_event(&record.name, &record.conditions, self.now().wall_ms, false)
        });
        self.commit_record(batch, record, events, fleet_event).await
    }

    /// Commits `batch` with `record` at the next revision and `events`.
    async fn commit_record(
        &mut self,
        mut batch: WriteBatch,
        mut record: TenantRecord,
        mut events: Vec<v1::Event>,
        fleet_event: Option<v1::FleetEvent>,
    ) -> Result<(), TenantError> {
        // Whatever an earlier commit has not told yet goes first.
        self.announce();
        let now = self.now().wall_ms;
        record.revision = self.record.revision + 1;
        crate::wire::stamp(&mut events, record.revision, now);
        let written = persist::put_events(&mut batch, record.id, record.revision, &events);
        let held = record.history_bytes.unwrap_or(0).saturating_add(written);
        let (floor, dropped) = self.prune_events(&mut batch, record.revision, now, held)?;
        record.compact_revision = Some(floor);
        record.history_bytes = Some(held.saturating_sub(dropped));
        persist::put_record(&mut batch, &record)?;
        let committed = match &self.settings.fleet {
            Some(fleet) => fleet.commit_unsettled(batch, fleet_event, now).await,
            None => self.store.commit(batch).await.map(|()| None),
        };
        let fleet_revision = match committed {
            Ok(fleet_revision) => fleet_revision,
            Err(error) => {
                self.fenced_out |= matches!(error, StoreError::Fenced { .. });
                return Err(error.into());
            }
        };
        if !events.is_empty() && self.oldest_event_ms.is_none() {
            self.oldest_event_ms = Some(now);
        }
        self.announcement = Some(Announcement {
            revision: record.revision,
            events,
            fleet: fleet_revision,
        });
        self.record = record;
        Ok(())
    }

    async fn set_token_hash(&mut self, token_hash: String) -> Result<(), TenantError> {
        let mut record = self.current_record();
        record.token_hash = token_hash;
        self.commit_record(WriteBatch::new(), record, Vec::new(), None)
            .await?;
        self.publish();
        Ok(())
    }

    /// Adds the deletes of events beyond the retention to `batch` when the
    /// log has outgrown it (`held`: its bytes with the revision `newest`
    /// being committed); returns the compaction floor to store and the
    /// bytes deleted.
    fn prune_events(
        &mut self,
        batch: &mut WriteBatch,
        newest: u64,
        now: u64,
        held: u64,
    ) -> Result<(u64, u64), TenantError> {
        let retention = self.settings.event_retention;
        let max_bytes = self.settings.event_history_bytes;
        let floor = self.record.events_floor();
        // Prune in steps, not at every commit: each step scans the log.
        let slack = (retention.max_revisions / 16).max(1);
        let too_many = newest.saturating_sub(floor) > retention.max_revisions + slack;
        let too_old = self
            .oldest_event_ms
            .is_some_and(|oldest| oldest < now.saturating_sub(retention.max_age_ms));
        let too_large = held > max_bytes.saturating_add(max_bytes / 16);
        if !too_many && !too_old && !too_large {
            return Ok((floor, 0));
        }
        let pruned = history::prune(
            &*self.store,
            batch,
            self.record.id,
            floor,
            newest,
            now,
            retention,
            held.saturating_sub(max_bytes),
        )
        .map_err(|error| TenantError::Corrupt {
            key: String::from("(event log)"),
            message: error.to_string(),
        })?;
        // Before the deletes commit: see `watch::stream::catch_up`.
        self.events.raise_floor(pruned.floor);
        self.oldest_event_ms = pruned.oldest_ms;
        Ok((pruned.floor, pruned.dropped_bytes))
    }

    /// Now, on both clocks.
    fn now(&self) -> Now {
        let mono = self
            .settings
            .clock
            .monotonic()
            .saturating_duration_since(self.origin);
        Now {
            wall_ms: self.settings.clock.now_ms(),
            mono_ms: u64::try_from(mono.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Takes a command off the queue, recording how long it waited.
    fn took(&self, queued: Queued) -> Command {
        self.settings
            .metrics
            .queue_wait(queued.at.elapsed().as_secs_f64());
        *queued.command
    }

    /// Publishes a snapshot of the tenant as it is now.
    fn publish(&mut self) {
        self.snapshots.publish(
            TenantSnapshot::capture(
                self.current_record(),
                self.executor.model(),
                self.executor.running_operations(),
                self.executor.connected_item_types(),
            )
            .with_item_types(self.executor.item_types()),
        );
        self.announce();
    }

    /// Tells watchers and the fleet what the last durable commit did, if
    /// that is still to be told (see [`Announcement`]).
    fn announce(&mut self) {
        let Some(announcement) = self.announcement.take() else {
            return;
        };
        self.events
            .hub
            .publish(announcement.revision, announcement.events);
        if let (Some(fleet), Some((revision, event))) = (&self.settings.fleet, announcement.fleet) {
            fleet.settle(revision, Some(event));
        }
    }
}

/// A duration in whole milliseconds.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
