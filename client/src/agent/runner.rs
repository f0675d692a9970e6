//! [`Agent`]: the run loop around the pure [`SessionState`]: connections,
//! registration, heartbeats, reconnects, operation tasks and shutdown.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use reconciled_proto::v1;
use reconciled_proto::v1::configurators_client::ConfiguratorsClient;
use reconciled_proto::v1::server_message::Message as Incoming;
use tokio::sync::{Semaphore, broadcast, mpsc};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Code;
use tonic::codec::Streaming;
use tonic::transport::Endpoint;
use tracing::Instrument;

use super::configurator::{Configurator, DynConfigurator};
use super::context::{OperationContext, OperationEvent};
use super::error::{AgentError, Disposition, classify, error_reason};
use super::events::AgentEvent;
use super::item::ExternalReport;
use super::outcome::{Answer, Outcome, ReadOutcome, result_message};
use super::session::{Action, SessionState, StartOperation, Work, heartbeat_interval, lease};
use super::spec::TypeSpec;
use super::targets::{Next, Targets};
use super::token::Token;
use crate::auth::BearerToken;
use crate::backoff::Backoff;
use crate::chain::error_chain;
use crate::client::MAX_MESSAGE_BYTES;
use crate::endpoint::{Undialable, dialable};
use crate::tls::ClientTls;

/// How many events an [`Agent::events`] subscriber may fall behind before it
/// misses the oldest.
pub const EVENT_CAPACITY: usize = 1024;

const DEFAULT_RECONNECT_INITIAL: Duration = Duration::from_millis(100);
const DEFAULT_RECONNECT_MAX: Duration = Duration::from_secs(5);
const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// After the drain timeout, how long a shutting-down agent waits for the
/// operations it cancelled to answer (CANCELLED: handed back) and for the
/// server to acknowledge them, before it closes its stream.
const HAND_BACK_GRACE: Duration = Duration::from_secs(2);
/// How long a cancelled operation's configurator may go on before the
/// agent's log says that it does not stop ([`warn_cancel_ignored`]).
const CANCEL_IGNORED_AFTER: Duration = Duration::from_secs(1);
const DEFAULT_REGISTER_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Builds an [`Agent`]; see [`Agent::builder`].
#[must_use = "call build() to get an Agent"]
pub struct AgentBuilder {
    endpoint: String,
    more_endpoints: Vec<String>,
    tenant: String,
    token: Token,
    agent_id: Option<String>,
    types: Vec<(TypeSpec, Arc<dyn DynConfigurator>)>,
    reconnect_initial: Duration,
    reconnect_max: Duration,
    drain_timeout: Duration,
    register_timeout: Duration,
    tls: Option<ClientTls>,
}

impl std::fmt::Debug for AgentBuilder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("AgentBuilder")
            .field("endpoint", &self.endpoint)
            .field("tenant", &self.tenant)
            .field("agent_id", &self.agent_id)
            .field(
                "types",
                &self
                    .types
                    .iter()
                    .map(|(spec, _)| spec.item_type())
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl AgentBuilder {
    /// The agent's stable id. A reconnect with the same id takes its types
    /// over at once; another id waits until the old session's lease expires.
    /// Defaults to `<program>@<host>`: set it when one host runs several
    /// instances of one agent program for the same types, or when an
    /// agent's id must survive a rename of its executable.
    pub fn agent_id(mut self, agent_id: impl Into<String>) -> Self {
        self.agent_id = Some(agent_id.into());
        self
    }

    /// Handles items of `spec`'s type with `configurator` (any
    /// [`Configurator`], or an `Arc` of one to share it between types).
    pub fn item_type(mut self, spec: TypeSpec, configurator: impl Configurator) -> Self {
        self.types.push((spec, Arc::new(configurator)));
        self
    }

    /// Reconnect delays: from `initial`, doubling after each failure up to
    /// `max`, each drawn from the upper half of that (default 100 ms to 5 s).
    /// They start over from `initial` after a session that lasted at least
    /// `max`.
    pub fn reconnect_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.reconnect_initial = initial;
        self.reconnect_max = max;
        self
    }

    /// How long [`Agent::run`] lets running operations finish, and waits for
    /// their results to be acknowledged, after shutdown was requested
    /// (default 10 s); then it cancels what still runs and returns.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Other addresses of the same deployment (its replicas, with the
    /// scheme of the first endpoint), tried in turn when the current one
    /// cannot be reached. A replica that does not serve the agent's tenant
    /// redirects the agent to the one that does (which it dials at once),
    /// so any one reachable address is enough; several survive the loss of
    /// one.
    pub fn endpoints(mut self, endpoints: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.more_endpoints
            .extend(endpoints.into_iter().map(Into::into));
        self
    }

    /// Connects over TLS with these settings (the server's CA and, for
    /// mutual TLS, the agent's certificate); use an `https://` endpoint.
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// How long to wait for `Registered` after connecting (default 30 s).
    pub fn register_timeout(mut self, timeout: Duration) -> Self {
        self.register_timeout = timeout;
        self
    }

    /// Checks the settings (the endpoint, the token, one configurator per
    /// type, every type's [`TypeSpec::validate`]) and builds the agent.
    /// Nothing connects until [`Agent::run`].
    pub fn build(self) -> Result<Agent, AgentError> {
        let mut endpoints = Vec::new();
        for address in std::iter::once(&self.endpoint).chain(&self.more_endpoints) {
            let mut endpoint = dialable(address)
                .map_err(|undialable| match undialable {
                    Undialable::Invalid(source) => AgentError::InvalidEndpoint {
                        endpoint: address.clone(),
                        source,
                    },
                    Undialable::Unusable(problem) => AgentError::UnusableEndpoint {
                        endpoint: address.clone(),
                        problem,
                    },
                    Undialable::NoScheme => AgentError::EndpointWithoutScheme {
                        endpoint: address.clone(),
                    },
                })?
                .connect_timeout(CONNECT_TIMEOUT);
            if let Some(tls) = &self.tls {
                endpoint = tls.apply(endpoint).map_err(|source| AgentError::Tls {
                    endpoint: address.clone(),
                    source,
                })?;
            }
            endpoints.push(endpoint);
        }
        let endpoint = endpoints[0].clone();
        let targets = Targets::new(endpoints, self.tls.clone(), CONNECT_TIMEOUT);
        let bearer = self.token.read()?;
        if self.types.is_empty() {
            return Err(AgentError::NoItemTypes);
        }
        let mut types = HashMap::new();
        let mut specs = Vec::new();
        for (spec, configurator) in self.types {
            spec.validate()?;
            let limit = match spec.in_flight_limit() {
                0 => None,
                limit => Some(Arc::new(Semaphore::new(limit as usize))),
            };
            let item_type = spec.item_type().to_owned();
            specs.push(spec.to_proto());
            if types
                .insert(
                    item_type.clone(),
                    TypeRuntime {
                        configurator,
                        limit,
                    },
                )
                .is_some()
            {
                return Err(AgentError::DuplicateItemType(item_type));
            }
        }
        let agent_id = self.agent_id.unwrap_or_else(default_agent_id);
        let register = v1::AgentMessage {
            message: Some(v1::agent_message::Message::Register(v1::Register {
                tenant: self.tenant.clone(),
                agent_id: agent_id.clone(),
                protocol_version: reconciled_proto::PROTOCOL_VERSION,
                item_types: specs,
                ..Default::default()
            })),
        };
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        let (external_sender, external_receiver) = mpsc::unbounded_channel();
        Ok(Agent {
            endpoint,
            targets,
            tenant: self.tenant,
            agent_id,
            token: self.token,
            bearer,
            register,
            types,
            reconnect_initial: self.reconnect_initial,
            reconnect_max: self.reconnect_max,
            drain_timeout: self.drain_timeout,
            register_timeout: self.register_timeout,
            events,
            external_sender,
            external_receiver,
        })
    }
}

/// `<program>@<host>`: the executable's name (else `agent`) at the host
/// name (`$HOSTNAME`, else `/etc/hostname`, else `localhost`). Two agent
/// programs on one host get two ids, so one cannot take the other's types
/// over by registering them; the same program restarted gets its id back
/// and takes its types over at once.
fn default_agent_id() -> String {
    let program = std::env::current_exe()
        .ok()
        .and_then(|path| {
            path.file_stem()
                .map(|stem| stem.to_string_lossy().into_owned())
        })
        .filter(|program| !program.is_empty())
        .unwrap_or_else(|| "agent".to_owned());
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{program}@{host}")
}

/// One item type's configurator and in-flight limit.
struct TypeRuntime {
    configurator: Arc<dyn DynConfigurator>,
    limit: Option<Arc<Semaphore>>,
}

/// A configurator agent: connects to the server, registers its item types
/// and runs the operations the server sends, until shutdown (see the
/// [module docs](super)).
pub struct Agent {
    endpoint: Endpoint,
    targets: Targets,
    tenant: String,
    agent_id: String,
    token: Token,
    /// The token last read (see [`Token::file`]).
    bearer: BearerToken,
    register: v1::AgentMessage,
    types: HashMap<String, TypeRuntime>,
    reconnect_initial: Duration,
    reconnect_max: Duration,
    drain_timeout: Duration,
    register_timeout: Duration,
    events: broadcast::Sender<AgentEvent>,
    external_sender: mpsc::UnboundedSender<v1::ExternalUpdate>,
    external_receiver: mpsc::UnboundedReceiver<v1::ExternalUpdate>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Agent")
            .field("endpoint", &self.endpoint.uri())
            .field("tenant", &self.tenant)
            .field("agent_id", &self.agent_id)
            .field("types", &self.types.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Starts building an agent for `tenant` that dials `endpoint` (e.g.
    /// `http://127.0.0.1:50051`) with the tenant's `token`: the token
    /// itself, or [`Token::file`] to read it from a file before every
    /// connection (a rotated token then reaches the running agent).
    pub fn builder(
        endpoint: impl Into<String>,
        tenant: impl Into<String>,
        token: impl Into<Token>,
    ) -> AgentBuilder {
        AgentBuilder {
            endpoint: endpoint.into(),
            more_endpoints: Vec::new(),
            tenant: tenant.into(),
            token: token.into(),
            agent_id: None,
            types: Vec::new(),
            reconnect_initial: DEFAULT_RECONNECT_INITIAL,
            reconnect_max: DEFAULT_RECONNECT_MAX,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            register_timeout: DEFAULT_REGISTER_TIMEOUT,
            tls: None,
        }
    }

    /// The agent id sent in `Register`.
    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    /// Subscribes to the agent's [`AgentEvent`]s (from now on).
    pub fn events(&self) -> broadcast::Receiver<AgentEvent> {
        self.events.subscribe()
    }

    /// A handle that stays usable while [`Agent::run`] owns the agent.
    pub fn handle(&self) -> AgentHandle {
        AgentHandle {
            events: self.events.clone(),
            external: self.external_sender.clone(),
        }
    }

    /// Runs the agent until `shutdown` completes, reconnecting as needed.
    ///
    /// On shutdown it stops starting operations, lets running ones finish
    /// and waits for their results to be acknowledged (at most the
    /// [drain timeout](AgentBuilder::drain_timeout)), then cancels whatever
    /// still runs and hands it back: an operation that honours its
    /// cancellation token and answers [`Outcome::cancelled`](super::Outcome::cancelled)
    /// within 2 s more is reported as WAIT (not done: the server uses no
    /// attempt and asks again, under the same op id and attempt, whoever
    /// holds the type next). It then closes its stream and returns `Ok`. It returns an error only when the server
    /// refuses the agent for good (see [`AgentError`]).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
        let shutdown = std::pin::pin!(shutdown);
        Runner::new(self).run(shutdown).await
    }
}

/// A cheap, cloneable handle to a (possibly running) [`Agent`].
#[derive(Debug, Clone)]
pub struct AgentHandle {
    events: broadcast::Sender<AgentEvent>,
    external: mpsc::UnboundedSender<v1::ExternalUpdate>,
}

/// The agent's run loop has ended; there is nothing to report to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the agent has stopped (Agent::run returned or the Agent was dropped); start it again to report"
)]
pub struct AgentStopped;

impl AgentHandle {
    /// Subscribes to the agent's [`AgentEvent`]s (from now on).
    pub fn events(&self) -> broadcast::Receiver<AgentEvent> {
        self.events.subscribe()
    }

    /// Sends reports about external items as one `ExternalUpdate` (applied
    /// in order in one commit). While disconnected, updates are queued and
    /// sent after the next registration (the oldest are dropped beyond
    /// 1,024); the server does not acknowledge them.
    pub fn report_external(
        &self,
        reports: impl IntoIterator<Item = ExternalReport>,
    ) -> Result<(), AgentStopped> {
        let update = v1::ExternalUpdate {
            reports: reports.into_iter().map(v1::ExternalReport::from).collect(),
        };
        self.external.send(update).map_err(|_| AgentStopped)
    }
}

/// A registered session.
struct Session {
    outbound: mpsc::UnboundedSender<v1::AgentMessage>,
    inbound: Streaming<v1::ServerMessage>,
    registered: v1::Registered,
}

/// Why a session (or an attempt to open one) ended.
#[derive(Debug)]
enum SessionFailure {
    Transport(tonic::transport::Error),
    Status(tonic::Status),
    Closed,
    Protocol(String),
    RegisterTimeout(Duration),
    Silent(Duration),
}

impl SessionFailure {
    fn describe(&self) -> (String, Option<Code>) {
        match self {
            Self::Transport(error) => (format!("cannot connect: {}", error_chain(error)), None),
            Self::Status(status) => {
                let reason = error_reason(status)
                    .map(|reason| format!(" ({reason})"))
                    .unwrap_or_default();
                (
                    format!("{:?}{reason}: {}", status.code(), status.message()),
                    Some(status.code()),
                )
            }
            Self::Closed => ("the server closed the stream".to_owned(), None),
            Self::Protocol(what) => (format!("protocol error: {what}"), None),
            Self::RegisterTimeout(timeout) => (
                format!("no Registered within {timeout:?} of connecting"),
                None,
            ),
            Self::Silent(lease) => (format!("the server sent nothing for {lease:?}"), None),
        }
    }
}

/// What a registered session ended without a status most likely means: the
/// server ends a session that way when another session of the same agent
/// id took over every type it held. Two processes sharing one agent id do
/// that to each other at every reconnect, and the author saw only "the
/// server closed the stream" in both logs.
fn replaced_session_hint(agent_id: &str) -> String {
    format!(
        " (the server does that when another session with agent id {agent_id:?} takes over \
         this session's item types: if two processes run with this agent id, give each its \
         own with AgentBuilder::agent_id)"
    )
}

/// How a served session ended.
enum SessionEnd {
    Shutdown,
    Failed(SessionFailure),
}

/// What a wait while disconnected ended with.
enum Wake<T> {
    Done(T),
    Shutdown,
}

/// The run loop's state: the agent's settings plus the session state and
/// the channels operation tasks report through.
struct Runner {
    agent: Agent,
    state: SessionState,
    backoff: Backoff,
    operation_sender: mpsc::UnboundedSender<OperationEvent>,
    operation_receiver: mpsc::UnboundedReceiver<OperationEvent>,
    /// Shutting down: running operations finish until the deadline,
    /// across sessions (a server restarting meanwhile is reconnected to,
    /// so that their results reach it).
    drain: Option<Drain>,
}

/// A shutdown in progress.
#[derive(Clone, Copy, Debug)]
struct Drain {
    /// When the current step ends: the drain timeout, then the hand-back
    /// grace.
    deadline: Instant,
    /// Past the drain timeout: what still ran was cancelled to be handed
    /// back.
    handing_back: bool,
}

impl Runner {
    fn new(agent: Agent) -> Self {
        let state = SessionState::new(agent.types.keys().cloned());
        let backoff = Backoff::new(agent.reconnect_initial, agent.reconnect_max);
        let (operation_sender, operation_receiver) = mpsc::unbounded_channel();
        Self {
            agent,
            state,
            backoff,
            operation_sender,
            operation_receiver,
            drain: None,
        }
    }

    /// The shutdown asked for: running operations may finish for the
    /// drain timeout.
    fn begin_drain(&mut self) {
        tracing::info!("Shutting down: letting running operations finish.");
        self.state.begin_drain();
        self.drain = Some(Drain {
            deadline: Instant::now() + self.agent.drain_timeout,
            handing_back: false,
        });
    }

    /// Waits until the current step of the shutdown ends (forever when
    /// none is in progress).
    async fn drain_step_ends(drain: Option<Drain>) {
        match drain {
            Some(drain) => tokio::time::sleep_until(drain.deadline).await,
            None => std::future::pending().await,
        }
    }

    async fn run<S>(mut self, mut shutdown: Pin<&mut S>) -> Result<(), AgentError>
    where
        S: Future<Output = ()>,
    {
        loop {
            self.read_token();
            let target = self
                .agent
                .targets
                .current()
                .unwrap_or_else(|| self.agent.endpoint.clone());
            let connecting = open_session(
                target,
                self.agent.bearer.clone(),
                self.register_message(),
                self.agent.register_timeout,
            );
            let (failure, was_registered) = match self.until(connecting, shutdown.as_mut()).await {
                Wake::Shutdown => break,
                Wake::Done(Ok(session)) => {
                    let registered_at = Instant::now();
                    let end = self.serve(session, shutdown.as_mut()).await;
                    // A session that lived restarts the backoff; one the
                    // server ends right after Registered keeps it growing.
                    if registered_at.elapsed() >= self.agent.reconnect_max {
                        self.backoff.reset();
                    }
                    match end {
                        SessionEnd::Shutdown => break,
                        SessionEnd::Failed(failure) => (failure, true),
                    }
                }
                Wake::Done(Err(failure)) => (failure, false),
            };
            let next = self.agent.targets.failed(match &failure {
                SessionFailure::Status(status) => Some(status),
                _ => None,
            });
            if let Some(error) = self.session_failed(failure, was_registered) {
                self.state.cancel_all();
                return Err(error);
            }
            if next == Next::Now {
                // Redirected to the replica that serves the tenant.
                continue;
            }
            let delay = self.backoff.next_delay();
            if let Wake::Shutdown = self
                .until(tokio::time::sleep(delay), shutdown.as_mut())
                .await
            {
                break;
            }
        }
        self.state.cancel_all();
        Ok(())
    }

    /// Reads the token again if it comes from a file; an unreadable file
    /// leaves the token last read in use.
    fn read_token(&mut self) {
        let Some(path) = self.agent.token.path() else {
            return;
        };
        match self.agent.token.read() {
            Ok(bearer) if bearer != self.agent.bearer => {
                tracing::info!(path = %path.display(), "Read a new tenant token from its file.");
                self.agent.bearer = bearer;
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "Connecting with the token last read.");
            }
        }
    }

    /// The registration, listing the operations still outstanding here.
    fn register_message(&self) -> v1::AgentMessage {
        let mut message = self.agent.register.clone();
        if let Some(v1::agent_message::Message::Register(register)) = message.message.as_mut() {
            register.outstanding_op_ids = self.state.outstanding_op_ids();
            register.lists_outstanding = true;
        }
        message
    }

    /// Records a failed session; returns the error to end `run` with if the
    /// failure is permanent.
    fn session_failed(
        &mut self,
        failure: SessionFailure,
        was_registered: bool,
    ) -> Option<AgentError> {
        let (mut reason, code) = failure.describe();
        if was_registered && matches!(failure, SessionFailure::Closed) {
            reason.push_str(&replaced_session_hint(&self.agent.agent_id));
        }
        let disposition = match &failure {
            SessionFailure::Status(status) => classify(status, &self.agent.tenant),
            _ => Disposition::Retry,
        };
        let actions = self.state.disconnected(reason.clone(), code);
        self.execute(actions, None);
        if let (Disposition::Permanent(AgentError::Unauthenticated { message }), Some(path)) =
            (&disposition, self.agent.token.path())
        {
            tracing::warn!(
                tenant = %self.agent.tenant,
                path = %path.display(),
                %message,
                "The server rejected the token from the file; retrying, reading the file again \
                 each time (after RotateToken, write the new token there)."
            );
            return None;
        }
        match disposition {
            Disposition::Permanent(error) => {
                tracing::error!(tenant = %self.agent.tenant, %reason, "The server refused the agent; stopping.");
                Some(error)
            }
            Disposition::Retry if was_registered => {
                tracing::warn!(tenant = %self.agent.tenant, %reason, "Configurator session lost; reconnecting.");
                None
            }
            Disposition::Retry => {
                tracing::warn!(tenant = %self.agent.tenant, %reason, "Cannot register with the server; retrying.");
                None
            }
        }
    }

    /// Waits for `future` while disconnected, still taking in operation
    /// events and external updates. A shutdown ends the wait at once if
    /// nothing runs or waits for its acknowledgement; otherwise the drain
    /// begins and the wait goes on (the agent keeps reconnecting, to hand
    /// in the results) until the drain timeout.
    async fn until<F, S>(&mut self, future: F, mut shutdown: Pin<&mut S>) -> Wake<F::Output>
    where
        F: Future,
        S: Future<Output = ()>,
    {
        let mut future = std::pin::pin!(future);
        loop {
            if self.drain.is_some() && self.state.is_idle() {
                return Wake::Shutdown;
            }
            let drain = self.drain;
            tokio::select! {
                () = shutdown.as_mut(), if drain.is_none() => {
                    if self.state.is_idle() {
                        return Wake::Shutdown;
                    }
                    self.begin_drain();
                }
                () = Self::drain_step_ends(drain) => {
                    tracing::warn!(
                        timeout = ?self.agent.drain_timeout,
                        "Shutting down while disconnected: operations still running are cancelled."
                    );
                    return Wake::Shutdown;
                }
                output = &mut future => return Wake::Done(output),
                Some(event) = self.operation_receiver.recv() => {
                    let actions = self.state.on_operation_event(event);
                    self.execute(actions, None);
                }
                Some(update) = self.agent.external_receiver.recv() => {
                    let actions = self.state.report_external(update);
                    self.execute(actions, None);
                }
            }
        }
    }

    /// Serves one registered session until it fails or the agent has shut
    /// down.
    async fn serve<S>(&mut self, session: Session, mut shutdown: Pin<&mut S>) -> SessionEnd
    where
        S: Future<Output = ()>,
    {
        let Session {
            outbound,
            mut inbound,
            registered,
        } = session;
        let interval = heartbeat_interval(&registered);
        let lease = lease(&registered);
        tracing::info!(
            tenant = %self.agent.tenant,
            session_id = %registered.session_id,
            granted = registered.granted.len(),
            "Registered as configurator."
        );
        let actions = self.state.connected(&registered);
        self.execute(actions, Some(&outbound));

        let mut heartbeat = tokio::time::interval_at(Instant::now() + interval, interval);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let silence = tokio::time::sleep(lease);
        let mut silence = std::pin::pin!(silence);
        loop {
            if self.drain.is_some() && self.state.is_idle() {
                self.shut_down_session("the agent shut down");
                return SessionEnd::Shutdown;
            }
            let drain = self.drain;
            let failure = tokio::select! {
                () = shutdown.as_mut(), if drain.is_none() => {
                    self.begin_drain();
                    None
                }
                () = Self::drain_step_ends(drain) => {
                    if drain.is_some_and(|drain| drain.handing_back) {
                        self.shut_down_session("the agent shut down before its operations finished");
                        return SessionEnd::Shutdown;
                    }
                    // Hand back what still runs: cancelled, each operation
                    // that honours its token answers CANCELLED, which the
                    // server takes as "not done, no attempt used" and sends
                    // again later. Results still missing after the hand-back
                    // grace are left to the server (UNKNOWN, re-delivered).
                    tracing::warn!(
                        timeout = ?self.agent.drain_timeout,
                        "Shutting down: operations still running after the drain timeout are cancelled and handed back."
                    );
                    self.state.hand_back();
                    self.drain = Some(Drain {
                        deadline: Instant::now() + HAND_BACK_GRACE,
                        handing_back: true,
                    });
                    None
                }
                message = inbound.message() => match message {
                    Ok(Some(message)) => {
                        silence.as_mut().reset(Instant::now() + lease);
                        let actions = self.state.on_server_message(message);
                        self.execute(actions, Some(&outbound));
                        None
                    }
                    Ok(None) => Some(SessionFailure::Closed),
                    Err(status) => Some(SessionFailure::Status(status)),
                },
                Some(event) = self.operation_receiver.recv() => {
                    let actions = self.state.on_operation_event(event);
                    self.execute(actions, Some(&outbound));
                    None
                }
                Some(update) = self.agent.external_receiver.recv() => {
                    let actions = self.state.report_external(update);
                    self.execute(actions, Some(&outbound));
                    None
                }
                _ = heartbeat.tick() => {
                    let _ = outbound.send(v1::AgentMessage {
                        message: Some(v1::agent_message::Message::Heartbeat(v1::Heartbeat {})),
                    });
                    None
                }
                () = &mut silence => Some(SessionFailure::Silent(lease)),
            };
            match failure {
                None => {}
                // Handing back: no reconnect; what is unacknowledged is lost
                // with the process, and the server re-delivers it.
                Some(failure) if self.drain.is_some_and(|drain| drain.handing_back) => {
                    let (reason, _) = failure.describe();
                    tracing::warn!(%reason, "Session lost while handing back operations.");
                    self.shut_down_session(&format!("session lost while shutting down: {reason}"));
                    return SessionEnd::Shutdown;
                }
                // Draining, or serving: reconnect (a draining agent hands in
                // the results of what still runs until its drain timeout).
                Some(failure) => return SessionEnd::Failed(failure),
            }
        }
    }

    fn shut_down_session(&mut self, reason: &str) {
        self.state.cancel_all();
        let actions = self.state.disconnected(reason.to_owned(), None);
        self.execute(actions, None);
    }

    /// Carries out what the session state decided.
    fn execute(
        &mut self,
        actions: Vec<Action>,
        outbound: Option<&mpsc::UnboundedSender<v1::AgentMessage>>,
    ) {
        for action in actions {
            match action {
                Action::Send(message) => {
                    if let Some(outbound) = outbound {
                        // A closed stream shows up as an inbound error next.
                        let _ = outbound.send(message);
                    }
                }
                Action::Start(start) => self.spawn_operation(start),
                Action::Event(event) => {
                    // No subscribers is fine.
                    let _ = self.agent.events.send(event);
                }
            }
        }
    }

    fn spawn_operation(&self, start: Box<StartOperation>) {
        let events = self.operation_sender.clone();
        let Some(runtime) = self.agent.types.get(&start.parts.item.item_type) else {
            // The session state only starts operations of registered types.
            let key = start.parts.key;
            let result = result_message(
                &key.op_id,
                key.attempt,
                Answer::Outcome(Outcome::failed(
                    Code::Unimplemented,
                    "no configurator for this type",
                )),
            );
            let _ = events.send(OperationEvent::Finished { key, result });
            return;
        };
        let span = tracing::info_span!(
            "operation",
            op_id = %start.parts.key.op_id,
            attempt = start.parts.key.attempt,
            kind = %start.parts.kind,
            item = %start.parts.item,
        );
        tokio::spawn(
            run_operation(
                Arc::clone(&runtime.configurator),
                runtime.limit.clone(),
                start,
                events,
            )
            .instrument(span),
        );
    }
}

/// Connects, sends `Register` and waits for `Registered`.
async fn open_session(
    endpoint: Endpoint,
    bearer: BearerToken,
    register: v1::AgentMessage,
    register_timeout: Duration,
) -> Result<Session, SessionFailure> {
    let channel = endpoint
        .connect()
        .await
        .map_err(SessionFailure::Transport)?;
    let mut client = ConfiguratorsClient::with_interceptor(channel, bearer)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let (outbound, receiver) = mpsc::unbounded_channel();
    let _ = outbound.send(register);
    let registration = async {
        let response = client
            .connect(UnboundedReceiverStream::new(receiver))
            .await
            .map_err(SessionFailure::Status)?;
        let mut inbound = response.into_inner();
        match inbound.message().await {
            Ok(Some(v1::ServerMessage {
                message: Some(Incoming::Registered(registered)),
            })) => Ok((inbound, registered)),
            Ok(Some(_)) => Err(SessionFailure::Protocol(
                "the server's first message was not Registered".to_owned(),
            )),
            Ok(None) => Err(SessionFailure::Closed),
            Err(status) => Err(SessionFailure::Status(status)),
        }
    };
    let (inbound, registered) = tokio::time::timeout(register_timeout, registration)
        .await
        .map_err(|_| SessionFailure::RegisterTimeout(register_timeout))??;
    Ok(Session {
        outbound,
        inbound,
        registered,
    })
}

/// Runs one operation: waits for an in-flight slot, runs the configurator in
/// a task of its own (so a panic becomes an `INTERNAL` failure), waits for a
/// long-running operation's completion, and reports the final result.
async fn run_operation(
    configurator: Arc<dyn DynConfigurator>,
    limit: Option<Arc<Semaphore>>,
    start: Box<StartOperation>,
    events: mpsc::UnboundedSender<OperationEvent>,
) {
    let StartOperation { parts, work } = *start;
    let key = parts.key.clone();
    let _permit = match limit {
        None => None,
        Some(limit) => {
            let cancel = parts.cancel.clone();
            tokio::select! {
                permit = limit.acquire_owned() => permit.ok(),
                () = cancel.cancelled() => {
                    let result = result_message(
                        &key.op_id,
                        key.attempt,
                        Answer::Outcome(Outcome::cancelled()),
                    );
                    let _ = events.send(OperationEvent::Finished { key, result });
                    return;
                }
            }
        }
    };
    tracing::debug!("Operation started.");
    let started = Instant::now();
    let context = Arc::new(OperationContext::new(parts, events.clone()));
    let mut task = tokio::spawn({
        let context = Arc::clone(&context);
        async move { run_work(configurator.as_ref(), &context, work).await }.in_current_span()
    });
    let ignored_cancel = async {
        context.cancelled().await;
        tokio::time::sleep(CANCEL_IGNORED_AFTER).await;
    };
    let joined = tokio::select! {
        joined = &mut task => joined,
        () = ignored_cancel => {
            warn_cancel_ignored(&context, started.elapsed());
            task.await
        }
    };
    let answer = match joined {
        Ok(answer) => answer,
        Err(error) => {
            let message = panic_message(error);
            tracing::error!(%message, "Configurator panicked.");
            Answer::Outcome(Outcome::failed(Code::Internal, message))
        }
    };
    let answer = match answer {
        Answer::Outcome(Outcome::InProgress) => {
            Answer::Outcome(finish_long_running(&context).await)
        }
        other => other,
    };
    let answer = match answer {
        Answer::Outcome(Outcome::Cancelled) if !context.is_cancelled() => {
            tracing::warn!(
                "Configurator returned Outcome::cancelled() for an operation nobody cancelled."
            );
            Answer::Outcome(Outcome::failed(
                Code::Aborted,
                "the configurator returned Outcome::cancelled() but the operation was not \
                 cancelled; return cancelled() only after OperationContext::cancelled() fired",
            ))
        }
        other => other,
    };
    let result = result_message(&key.op_id, key.attempt, answer);
    tracing::debug!(outcome = ?result.outcome(), "Operation finished.");
    let _ = events.send(OperationEvent::Finished { key, result });
}

/// The final outcome of an operation whose configurator returned
/// `InProgress`.
async fn finish_long_running(context: &OperationContext) -> Outcome {
    let Some(receiver) = context.take_later() else {
        return Outcome::failed(
            Code::Internal,
            "the configurator returned Outcome::InProgress without calling \
             OperationContext::finish_later; call finish_later first",
        );
    };
    match receiver.await {
        Ok(Outcome::InProgress) => Outcome::failed(
            Code::Internal,
            "Completion::finish was given Outcome::InProgress, which is not a final outcome",
        ),
        Ok(outcome) => outcome,
        Err(_) => Outcome::failed(
            Code::Aborted,
            "the long-running operation's Completion was dropped without finish() (did its task \
             panic or return early?); ABORTED is retried under the type's retry policy",
        ),
    }
}

async fn run_work(
    configurator: &dyn DynConfigurator,
    context: &OperationContext,
    work: Work,
) -> Answer {
    match work {
        Work::Create { item } => Answer::Outcome(configurator.create(context, &item).await),
        Work::Modify { previous, item } => {
            Answer::Outcome(configurator.modify(context, &previous, &item).await)
        }
        Work::Delete { item } => Answer::Outcome(configurator.delete(context, &item).await),
        Work::Read { item } => {
            let read = configurator.read(context, &item).await;
            if read == ReadOutcome::Unsupported {
                warn_read_unimplemented(&item.item_type);
            }
            Answer::Read(read)
        }
        Work::NeedsRecreate { previous, item } => {
            Answer::NeedsRecreate(configurator.needs_recreate(&previous, &item))
        }
    }
}

/// Logs that a cancelled operation's configurator still runs
/// [`CANCEL_IGNORED_AFTER`] after the cancel. The server cancels an
/// operation past its type's `operation_timeout` (and one whose intent
/// changed); it then waits for the result, and the operation's next attempt
/// waits here until this one returns. Without this line a configurator
/// slower than its timeout left nothing in the agent's log: the author saw
/// only `DEADLINE_EXCEEDED` attempts in the item's status.
fn warn_cancel_ignored(context: &OperationContext, running_for: Duration) {
    let timeout = context
        .timeout()
        .map_or_else(|| "its".to_owned(), |timeout| format!("its {timeout:?}"));
    tracing::warn!(
        running_for = ?running_for,
        "The operation was cancelled (by the server, past {timeout} operation_timeout or because \
         its intent changed; or by the agent's shutdown) and its configurator still runs; its next \
         attempt waits until it returns. Return Outcome::cancelled() when ctx.cancelled() fires; \
         for slow work, report progress (ctx.progress) or raise the type's operation_timeout."
    );
}

/// Logs, once per item type and process, that a type asked to READ has a
/// configurator without `read`: its type declared `supports_read`, so the
/// server keeps asking (drift READs, lost outcomes), and each READ fails
/// with UNIMPLEMENTED. The server shows that failure; the agent's own log
/// said nothing, and its author did not learn why drift went unseen.
fn warn_read_unimplemented(item_type: &str) {
    static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut warned = WARNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if warned.iter().any(|warned| warned == item_type) {
        return;
    }
    warned.push(item_type.to_owned());
    tracing::warn!(
        item_type,
        "Type declares supports_read, but its configurator does not implement Configurator::read: \
         every READ fails with UNIMPLEMENTED. Implement read, or drop supports_read from the \
         type's TypeSpec."
    );
}

fn panic_message(error: tokio::task::JoinError) -> String {
    if !error.is_panic() {
        return "the operation's task was cancelled (the runtime is shutting down)".to_owned();
    }
    let payload = error.into_panic();
    let text = payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string payload".to_owned());
    format!("the configurator panicked: {text}; see the agent's log")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{Item, OperationContext, Outcome};

    struct Noop;

    impl Configurator for Noop {
        async fn create(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
            Outcome::done()
        }
        async fn modify(&self, _ctx: &OperationContext, _previous: &Item, _item: &Item) -> Outcome {
            Outcome::done()
        }
        async fn delete(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
            Outcome::done()
        }
    }

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            formatter.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|layer| layer as _)
        }
    }

    /// The default agent id names the program as well as the host: with
    /// the host name alone, a second agent program on the host took the
    /// first one's types over at once (a reconnect of "the same agent").
    #[test]
    fn the_default_agent_id_names_the_program_and_the_host() {
        let id = default_agent_id();
        let program = std::env::current_exe()
            .ok()
            .and_then(|path| {
                path.file_stem()
                    .map(|stem| stem.to_string_lossy().into_owned())
            })
            .expect("a test executable");
        let (named, host) = id.split_once('@').expect("<program>@<host>");
        assert_eq!(named, program);
        assert!(!host.is_empty(), "{id}");
    }

    /// A disconnect reason said "tcp connect error: tcp connect error:
    /// Connection refused": tonic and hyper wrap an error in one of the same
    /// text.
    #[test]
    fn an_error_chain_says_a_repeated_cause_once() {
        let error = Layer(
            "transport error",
            Some(Box::new(Layer(
                "tcp connect error",
                Some(Box::new(Layer(
                    "tcp connect error",
                    Some(Box::new(Layer("Connection refused", None))),
                ))),
            ))),
        );
        assert_eq!(
            error_chain(&error),
            "transport error: tcp connect error: Connection refused"
        );
    }

    /// `http://127.0.0.1:notaport` parses as a URI; before, `build()`
    /// accepted it and `run` dialled port 80 for ever, reporting
    /// "connection refused" about a port the author never named.
    #[test]
    fn an_endpoint_whose_port_cannot_be_dialled_is_refused_at_build() {
        for (address, named) in [
            ("http://127.0.0.1:notaport", "\"notaport\""),
            ("http://127.0.0.1:65536", "\"65536\""),
            ("ftp://127.0.0.1:50051", "\"ftp\""),
        ] {
            let error = Agent::builder(address, "acme", "rcd_token")
                .item_type(TypeSpec::new("kv"), Noop)
                .build()
                .expect_err(address);
            assert!(
                matches!(error, AgentError::UnusableEndpoint { .. }),
                "{address}: {error:?}"
            );
            assert!(error.to_string().contains(named), "{error}");
        }
    }

    /// `127.0.0.1:50051` parses as a URI but can never be dialled: before,
    /// `build()` accepted it and `run` retried "invalid URL, scheme is
    /// missing" for ever.
    #[test]
    fn an_endpoint_without_a_scheme_is_refused_at_build() {
        for address in ["127.0.0.1:50051", "localhost:50051"] {
            let error = Agent::builder(address, "acme", "rcd_token")
                .item_type(TypeSpec::new("kv"), Noop)
                .build()
                .expect_err(address);
            assert!(
                matches!(error, AgentError::EndpointWithoutScheme { .. }),
                "{address}: {error:?}"
            );
            assert!(
                error.to_string().contains(&format!("http://{address}")),
                "{error}"
            );
        }
        let more = Agent::builder("http://127.0.0.1:50051", "acme", "rcd_token")
            .endpoints(["127.0.0.1:50052"])
            .item_type(TypeSpec::new("kv"), Noop)
            .build()
            .expect_err("a second endpoint without a scheme");
        assert!(
            matches!(more, AgentError::EndpointWithoutScheme { .. }),
            "{more:?}"
        );
        assert!(
            Agent::builder("http://127.0.0.1:50051", "acme", "rcd_token")
                .item_type(TypeSpec::new("kv"), Noop)
                .build()
                .is_ok()
        );
    }
}
