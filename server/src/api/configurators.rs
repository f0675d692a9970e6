//! The `reconciled.v1.Configurators` service: one bidirectional stream per
//! agent session. This module only translates between the stream and the
//! tenant's owner, which decides everything (ownership, dispatch, results).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reconciled_proto::PROTOCOL_VERSION;
use reconciled_proto::pointer::check_recreate_path;
use reconciled_proto::v1;
use reconciled_proto::v1::configurators_server::Configurators;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, warn};

use crate::engine::exec::TypeHeld;
use crate::engine::exec::port::{AgentOutcome, FromAgent, Outstanding, Registration, ToAgent};
use crate::engine::exec::{
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_OPERATION_TIMEOUT_MS, RetryPolicy, TypeSpec,
};
use crate::engine::schema::TypeSchema;
use crate::graph::validate::{FieldViolation, ValidationLimits, validate_name};
use crate::graph::{OperationError, code};
use crate::status::ApiError;
use crate::tenant::{RegistrationError, TenantHandle};
use crate::wire::{
    duration_from_ms, duration_to_ms, item_to_proto, operation_error_from_status,
    operation_kind_to_proto, properties_from_struct,
};

use super::context::{ApiContext, credentials_revoked, invalid};
use super::externals::validate_external_reports;

/// How long an agent has to send Register after opening the stream.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages buffered toward one agent in the stream's channel, and again
/// in the session's backlog behind it. An agent whose stream stays full
/// for longer than its lease loses the session (it is not reading).
const OUTBOUND_BUFFER: usize = 1_024;
/// How long a closing status may wait for room in a full stream.
const CLOSING_SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// What an agent is told when the server closes its stream at shutdown.
pub const SHUTTING_DOWN: &str =
    "the server is shutting down; reconnect after it restarts (the SDK agent does so by itself)";

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// The Configurators service.
#[derive(Clone)]
pub struct ConfiguratorsService {
    context: ApiContext,
}

impl ConfiguratorsService {
    /// A service over the shared API context.
    pub fn new(context: ApiContext) -> Self {
        Self { context }
    }
}

type ServerStream = Pin<Box<dyn Stream<Item = Result<v1::ServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Configurators for ConfiguratorsService {
    type ConnectStream = ServerStream;

    async fn connect(
        &self,
        request: Request<Streaming<v1::AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let caller = self.context.caller(request.metadata())?;
        let revoked = self.context.revocation(caller, request.metadata())?;
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(REGISTER_TIMEOUT, inbound.message())
            .await
            .map_err(|_| ApiError::DeadlineExceeded {
                message: String::from("send Register as the first message within 10 s"),
            })??
            .ok_or(ApiError::StreamEndedBeforeRegister)?;
        let Some(v1::agent_message::Message::Register(register)) = first.message else {
            return Err(invalid("message", "the first message on Connect must be Register").into());
        };
        if register.protocol_version != PROTOCOL_VERSION {
            return Err(ApiError::UnsupportedProtocol {
                requested: register.protocol_version,
                supported: PROTOCOL_VERSION,
            }
            .into());
        }
        self.await_owner(caller, &register.tenant).await?;
        let handle = self.context.tenant(caller, &register.tenant)?;
        let (types, outstanding) = self.validated(&register)?;
        let max_agents = handle.snapshots.latest().record.limits.max_agents;
        let agent_slot = self
            .context
            .agents
            .admit(handle.id, max_agents, &register.agent_id)
            .map_err(|refused| ApiError::QuotaExceeded {
                subject: "max_agents".into(),
                description: refused.to_string(),
            })?;

        let (sender, outbox) = mpsc::unbounded_channel();
        let session_id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
        // From here until the session task runs, a cancelled call (the
        // client went away: this future is dropped) or a failed
        // registration must not leave the owner holding the types for a
        // session that no task serves.
        let mut unclaimed = UnclaimedSession::new(handle.clone(), session_id);
        let grants = handle
            .register(
                Registration {
                    session_id,
                    agent_id: register.agent_id.clone(),
                    types,
                    outstanding,
                },
                sender,
            )
            .await
            .map_err(|error| match error {
                RegistrationError::TypeHeld(TypeHeld { item_type, holder }) => {
                    ApiError::TypeHeld { item_type, holder }
                }
                // The owner stopped while the registration waited in its
                // queue (the tenant moved: a hand-off, a fenced commit):
                // NOT_OWNER, which the agent retries, and never NOT_FOUND,
                // which an agent takes as final and stops on.
                RegistrationError::Tenant(error) => {
                    self.context.owner_failed(&register.tenant, error)
                }
            })?;

        let (outbound, stream) = mpsc::channel(OUTBOUND_BUFFER);
        let registered = v1::ServerMessage {
            message: Some(v1::server_message::Message::Registered(v1::Registered {
                session_id: session_id.to_string(),
                granted: grants
                    .iter()
                    .map(|grant| v1::TypeGrant {
                        item_type: grant.item_type.clone(),
                        epoch: grant.epoch,
                    })
                    .collect(),
                heartbeat_interval: Some(duration_from_ms(millis(self.context.heartbeat_interval))),
                lease: Some(duration_from_ms(millis(self.context.lease))),
            })),
        };
        // A fresh channel: this cannot wait.
        let _ = outbound.try_send(Ok(registered));
        let session = Session {
            id: session_id,
            handle,
            inbound,
            outbox,
            outbound,
            heartbeat_interval: self.context.heartbeat_interval,
            lease: self.context.lease,
            shutdown: self.context.shutdown.clone(),
            revoked,
            limits: self.context.limits.clone(),
            default_max_items: self.context.default_max_items,
            _agent_slot: agent_slot,
            backlog: VecDeque::new(),
            blocked_since: None,
            cluster: self.context.cluster.clone(),
        };
        // The session task closes the session from now on.
        unclaimed.claim();
        tokio::spawn(session.run());
        Ok(Response::new(Box::pin(ReceiverStream::new(stream))))
    }
}

/// A session registered (or being registered) with the owner that no
/// session task serves yet; dropped unclaimed, it tells the owner the
/// session closed, so the item types it may hold are released.
struct UnclaimedSession {
    handle: Option<TenantHandle>,
    session_id: u64,
}

impl UnclaimedSession {
    fn new(handle: TenantHandle, session_id: u64) -> Self {
        Self {
            handle: Some(handle),
            session_id,
        }
    }

    /// The session task has the session now.
    fn claim(&mut self) {
        self.handle = None;
    }
}

impl Drop for UnclaimedSession {
    fn drop(&mut self) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        let session_id = self.session_id;
        // The owner handles commands in order: this comes after the
        // Register it may already have received, and releases what it
        // granted (nothing if it refused the registration).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                handle
                    .session_closed(
                        session_id,
                        "the agent went away or was refused during registration".to_owned(),
                    )
                    .await;
            });
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl ConfiguratorsService {
    /// With replicas on etcd, agents' sessions live on the replica that
    /// serves their tenant: waits while none does (a hand-off, a
    /// failover), and refuses with `NOT_OWNER` and the owner's address
    /// (which the SDK dials at once) when another one does. Callers that
    /// may not see the tenant learn nothing here (the tenant lookup
    /// answers them `NOT_FOUND`).
    async fn await_owner(&self, caller: crate::auth::Caller, tenant: &str) -> Result<(), ApiError> {
        let Some(cluster) = &self.context.cluster else {
            return Ok(());
        };
        if !cluster
            .catalog()
            .id_of(tenant)
            .is_some_and(|id| caller.may_access(id))
        {
            return Ok(());
        }
        match cluster.await_route(tenant).await {
            crate::cluster::Route::Here | crate::cluster::Route::Unknown => Ok(()),
            crate::cluster::Route::Elsewhere(owner) => Err(ApiError::NotOwner {
                tenant: tenant.to_owned(),
                owner: Some(owner),
            }),
            crate::cluster::Route::Nowhere => Err(ApiError::NotOwner {
                tenant: tenant.to_owned(),
                owner: None,
            }),
        }
    }

    /// Validates and converts the item type specs of a Register.
    /// The item type specs and the outstanding operations of `register`,
    /// or every problem with them.
    fn validated(&self, register: &v1::Register) -> Result<(Vec<TypeSpec>, Outstanding), ApiError> {
        let mut violations = Vec::new();
        if let Err(problem) = validate_name(&register.agent_id, &self.context.limits) {
            violations.push(FieldViolation::new(
                "register.agent_id",
                format!("the agent id {problem}"),
            ));
        }
        if register.item_types.is_empty() {
            violations.push(FieldViolation::new(
                "register.item_types",
                "register at least one item type",
            ));
        }
        let mut specs = Vec::new();
        for (index, spec) in register.item_types.iter().enumerate() {
            let field = format!("register.item_types[{index}]");
            match type_spec_from_proto(spec, &field, &self.context) {
                Ok(spec)
                    if specs
                        .iter()
                        .any(|s: &TypeSpec| s.item_type == spec.item_type) =>
                {
                    violations.push(FieldViolation::new(
                        format!("{field}.item_type"),
                        "this item type is listed twice",
                    ))
                }
                Ok(spec) => specs.push(spec),
                Err(mut problems) => violations.append(&mut problems),
            }
        }
        let outstanding = outstanding_from_proto(register, &mut violations);
        if violations.is_empty() {
            Ok((specs, outstanding))
        } else {
            Err(ApiError::invalid_argument(violations))
        }
    }
}

/// Most op ids a registration may list as outstanding.
pub const MAX_OUTSTANDING_OP_IDS: usize = 65_536;
/// Longest op id a registration may list, in bytes.
pub const MAX_OP_ID_BYTES: usize = 256;

/// The operations a registering agent says it still runs; problems go to
/// `violations`.
fn outstanding_from_proto(
    register: &v1::Register,
    violations: &mut Vec<FieldViolation>,
) -> Outstanding {
    if register.outstanding_op_ids.len() > MAX_OUTSTANDING_OP_IDS {
        violations.push(FieldViolation::new(
            "register.outstanding_op_ids",
            format!(
                "{} op ids listed; at most {MAX_OUTSTANDING_OP_IDS} may be",
                register.outstanding_op_ids.len()
            ),
        ));
        return Outstanding::Unsaid;
    }
    if let Some(index) = register
        .outstanding_op_ids
        .iter()
        .position(|op_id| op_id.is_empty() || op_id.len() > MAX_OP_ID_BYTES)
    {
        violations.push(FieldViolation::new(
            format!("register.outstanding_op_ids[{index}]"),
            format!("an op id is 1 to {MAX_OP_ID_BYTES} bytes"),
        ));
        return Outstanding::Unsaid;
    }
    if !register.lists_outstanding {
        if !register.outstanding_op_ids.is_empty() {
            violations.push(FieldViolation::new(
                "register.lists_outstanding",
                "set it when listing outstanding_op_ids (the list must be complete)",
            ));
        }
        return Outstanding::Unsaid;
    }
    Outstanding::Listed(register.outstanding_op_ids.iter().cloned().collect())
}

/// An item type spec from the wire.
fn type_spec_from_proto(
    spec: &v1::ItemTypeSpec,
    field: &str,
    context: &ApiContext,
) -> Result<TypeSpec, Vec<FieldViolation>> {
    let mut violations = Vec::new();
    if let Err(problem) = validate_name(&spec.item_type, &context.limits) {
        violations.push(FieldViolation::new(
            format!("{field}.item_type"),
            format!("the item type {problem}"),
        ));
    }
    for (index, path) in spec.recreate_on_change.iter().enumerate() {
        // A path such as "key" (for "/key") would match nothing, and a
        // change of `key` would be planned as an in-place Modify.
        if let Err(problem) = check_recreate_path(path) {
            violations.push(FieldViolation::new(
                format!("{field}.recreate_on_change[{index}]"),
                format!("the path {path:?} {problem}"),
            ));
        }
    }
    let mut converted = TypeSpec::new(spec.item_type.clone());
    if let Some(schema) = &spec.schema {
        let path = format!("{field}.schema");
        match properties_from_struct(schema.clone(), &path) {
            Ok(json) => match TypeSchema::compile(json.into()) {
                Ok(schema) => converted.schema = Some(schema),
                Err(problem) => violations.push(FieldViolation::new(path, problem.to_string())),
            },
            Err(violation) => violations.push(violation),
        }
    }
    converted.recreate_on_change = spec.recreate_on_change.clone();
    converted.ask_needs_recreate = spec.ask_needs_recreate;
    converted.supports_read = spec.supports_read;
    converted.max_in_flight = if spec.max_in_flight == 0 {
        DEFAULT_MAX_IN_FLIGHT
    } else {
        spec.max_in_flight
    };
    converted.operation_timeout_ms = match &spec.operation_timeout {
        Some(timeout) => match duration_to_ms(timeout, &format!("{field}.operation_timeout")) {
            Ok(0) => DEFAULT_OPERATION_TIMEOUT_MS,
            Ok(ms) => ms,
            Err(violation) => {
                violations.push(violation);
                DEFAULT_OPERATION_TIMEOUT_MS
            }
        },
        None => DEFAULT_OPERATION_TIMEOUT_MS,
    };
    if let Some(policy) = &spec.retry_policy {
        converted.max_attempts = policy.max_attempts;
        let path = format!("{field}.retry_policy");
        let ms = |duration: &Option<prost_types::Duration>,
                  name: &str,
                  violations: &mut Vec<FieldViolation>| {
            match duration {
                Some(duration) => duration_to_ms(duration, &format!("{path}.{name}"))
                    .unwrap_or_else(|violation| {
                        violations.push(violation);
                        0
                    }),
                None => 0,
            }
        };
        match &policy.policy {
            Some(v1::retry_policy::Policy::StaticRetry(fixed)) => {
                converted.retry = RetryPolicy::Static {
                    wait_ms: ms(&fixed.wait, "static_retry.wait", &mut violations),
                };
            }
            Some(v1::retry_policy::Policy::Random(random)) => {
                converted.retry = RetryPolicy::Random {
                    min_ms: ms(&random.min, "random.min", &mut violations),
                    max_ms: ms(&random.max, "random.max", &mut violations),
                };
            }
            Some(v1::retry_policy::Policy::Exponential(exponential)) => {
                if !(exponential.multiplier.is_finite() && exponential.multiplier >= 1.0)
                    && exponential.multiplier != 0.0
                {
                    violations.push(FieldViolation::new(
                        format!("{path}.exponential.multiplier"),
                        "the multiplier must be a number of at least 1 (0 means 2)",
                    ));
                }
                converted.retry = RetryPolicy::Exponential {
                    initial_ms: ms(&exponential.initial, "exponential.initial", &mut violations)
                        .max(1),
                    multiplier: if exponential.multiplier == 0.0 {
                        2.0
                    } else {
                        exponential.multiplier
                    },
                    max_ms: match ms(&exponential.max, "exponential.max", &mut violations) {
                        0 => 300_000,
                        max => max,
                    },
                };
            }
            None => {}
        }
    }
    if violations.is_empty() {
        Ok(converted)
    } else {
        Err(violations)
    }
}

/// One live session: relays between the agent's stream and the owner.
struct Session {
    id: u64,
    handle: TenantHandle,
    inbound: Streaming<v1::AgentMessage>,
    outbox: mpsc::UnboundedReceiver<ToAgent>,
    outbound: mpsc::Sender<Result<v1::ServerMessage, Status>>,
    heartbeat_interval: Duration,
    lease: Duration,
    shutdown: tokio_util::sync::CancellationToken,
    /// Cancelled when the token the session was opened with is revoked.
    revoked: tokio_util::sync::CancellationToken,
    /// Limits that external updates are checked against.
    limits: ValidationLimits,
    /// `max_items` of tenants whose own limit is 0.
    default_max_items: usize,
    /// Counts this agent against the tenant's `max_agents` while it lives.
    _agent_slot: crate::limits::AgentSlot,
    /// Messages for the agent that did not fit its stream yet, at most
    /// [`OUTBOUND_BUFFER`]; the owner's messages are not taken while full.
    backlog: VecDeque<v1::ServerMessage>,
    /// Since when the agent's stream has been full (the agent is not
    /// reading); the session ends once that lasts longer than the lease.
    blocked_since: Option<tokio::time::Instant>,
    /// With replicas on etcd: where the tenant went when its owner here
    /// stops (the agent is told `NOT_OWNER`).
    cluster: Option<std::sync::Arc<crate::cluster::Cluster>>,
}

impl Session {
    async fn run(mut self) {
        let mut heartbeat = tokio::time::interval(self.heartbeat_interval);
        let mut last_heard = Instant::now();
        // A second handle, so a pending `reserve` does not borrow `self`.
        let outbound = self.outbound.clone();
        let reason = loop {
            let stalled_until = self
                .blocked_since
                .map(|since| since + self.lease)
                .unwrap_or_else(far_future);
            // Biased: a shutdown or a revoked token is told to the agent
            // before the owner's end (a deleted tenant both revokes the
            // token and stops its owner).
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => {
                    // The agent keeps unacknowledged results and sends them
                    // again after reconnecting; operations stay journaled.
                    let closing = ApiError::Unavailable { message: SHUTTING_DOWN.to_owned() };
                    self.close_with(closing).await;
                    break "the server is shutting down".to_string();
                }
                () = self.revoked.cancelled() => {
                    self.close_with(credentials_revoked()).await;
                    break "the session's token was revoked".to_string();
                }
                message = self.inbound.message() => match message {
                    Ok(Some(message)) => {
                        last_heard = Instant::now();
                        match self.forwardable(message) {
                            Ok(Some(forward)) => {
                                if self.handle.from_agent(self.id, forward).await.is_err() {
                                    self.close_with_revocation_if_any().await;
                                    if let Some(cluster) = &self.cluster
                                        && !self.revoked.is_cancelled()
                                    {
                                        self.close_with(cluster.not_owner(&self.handle.name)).await;
                                        break "the tenant moved to another replica".to_string();
                                    }
                                    break "the tenant was deleted".to_string();
                                }
                            }
                            Ok(None) => {}
                            Err(refused) => {
                                // The agent has no other way to learn that its
                                // report was refused; nothing of it was stored.
                                let reason = format!("an external update was refused: {refused}");
                                self.close_with(refused).await;
                                break reason;
                            }
                        }
                    }
                    Ok(None) => break "the agent closed the stream".to_string(),
                    Err(status) => break format!("the stream failed: {}", status.message()),
                },
                permit = outbound.reserve(), if !self.backlog.is_empty() => match permit {
                    Ok(permit) => {
                        if let Some(message) = self.backlog.pop_front() {
                            permit.send(Ok(message));
                        }
                        if self.backlog.is_empty() {
                            self.blocked_since = None;
                        }
                    }
                    Err(_) => break "the agent's stream is gone".to_string(),
                },
                message = self.outbox.recv(), if self.backlog.len() < OUTBOUND_BUFFER => match message {
                    Some(message) => {
                        if let Err(gone) = self.queue(to_agent(message)) {
                            break gone;
                        }
                    }
                    None => {
                        self.close_with_revocation_if_any().await;
                        if let Some(cluster) = &self.cluster
                            && !self.revoked.is_cancelled()
                        {
                            // The tenant moved to another replica.
                            self.close_with(cluster.not_owner(&self.handle.name)).await;
                            break "the tenant moved to another replica".to_string();
                        }
                        break "the server replaced this session".to_string();
                    }
                },
                () = tokio::time::sleep_until(stalled_until), if self.blocked_since.is_some() => {
                    let stalled = ApiError::DeadlineExceeded {
                        message: format!(
                            "the agent did not read its stream for longer than the lease ({} s) while {} messages waited; read the stream, then reconnect and register again",
                            self.lease.as_secs(),
                            self.backlog.len() + OUTBOUND_BUFFER,
                        ),
                    };
                    self.close_with(stalled).await;
                    break "the agent stopped reading its stream".to_string();
                }
                _ = heartbeat.tick() => {
                    if last_heard.elapsed() > self.lease {
                        let expired = ApiError::DeadlineExceeded {
                            message: String::from(
                                "no message within the lease; reconnect and register again",
                            ),
                        };
                        self.close_with(expired).await;
                        break "the lease expired".to_string();
                    }
                    // A heartbeat only matters if the stream has room.
                    if self.backlog.is_empty() {
                        let beat = v1::ServerMessage { message: Some(v1::server_message::Message::Heartbeat(v1::Heartbeat {})) };
                        if let Err(gone) = self.queue(beat) {
                            break gone;
                        }
                    }
                }
            }
        };
        debug!(session = self.id, %reason, "Configurator session ended.");
        self.handle.session_closed(self.id, reason).await;
    }

    /// Sends `message` to the agent without waiting: into the stream if it
    /// has room, else into the backlog (the stream counts as blocked from
    /// then on). `Err` when the agent's stream is gone.
    fn queue(&mut self, message: v1::ServerMessage) -> Result<(), String> {
        if self.backlog.is_empty() {
            match self.outbound.try_send(Ok(message)) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    return Err("the agent's stream is gone".to_string());
                }
                Err(mpsc::error::TrySendError::Full(Ok(message))) => {
                    self.backlog.push_back(message);
                }
                Err(mpsc::error::TrySendError::Full(Err(_))) => {}
            }
        } else {
            self.backlog.push_back(message);
        }
        self.blocked_since
            .get_or_insert_with(tokio::time::Instant::now);
        Ok(())
    }

    /// When the owner went away because the tenant was deleted, its token
    /// is revoked too: says so (UNAUTHENTICATED) rather than ending the
    /// stream without a status.
    async fn close_with_revocation_if_any(&self) {
        if self.revoked.is_cancelled() {
            self.close_with(credentials_revoked()).await;
        }
    }

    /// Ends the agent's stream with `status`, waiting at most
    /// [`CLOSING_SEND_TIMEOUT`] for room (an agent that does not read its
    /// stream may never see it; its session ends either way).
    async fn close_with(&self, status: impl Into<Status>) {
        let _ = tokio::time::timeout(CLOSING_SEND_TIMEOUT, self.outbound.send(Err(status.into())))
            .await;
    }
}

/// An instant no session waits for (a select branch that is off).
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400 * 365)
}

/// A server message for the wire.
fn to_agent(message: ToAgent) -> v1::ServerMessage {
    use v1::server_message::Message;
    let message = match message {
        ToAgent::Operation(order) => Message::Operation(v1::OperationRequest {
            op_id: order.op_id,
            attempt: order.attempt,
            epoch: order.epoch,
            operation: if order.question {
                v1::OperationKind::NeedsRecreate.into()
            } else {
                operation_kind_to_proto(order.kind).into()
            },
            item: Some(item_to_proto(&order.item)),
            previous: order.previous.as_deref().map(item_to_proto),
            timeout: Some(duration_from_ms(order.timeout_ms)),
            generation: order.generation,
            previous_uncertain: order.previous_uncertain,
        }),
        ToAgent::Cancel { op_id } => Message::Cancel(v1::CancelOperation { op_id }),
        ToAgent::Ack { op_id, attempt } => Message::ResultAck(v1::ResultAck { op_id, attempt }),
    };
    v1::ServerMessage {
        message: Some(message),
    }
}

impl Session {
    /// An agent message for the owner (`Ok(None)`: nothing to forward), or
    /// why the session must end: an `ExternalUpdate` that
    /// `ReportExternal` would refuse is refused here too, as a whole.
    fn forwardable(&self, message: v1::AgentMessage) -> Result<Option<FromAgent>, ApiError> {
        use v1::agent_message::Message;
        let Some(message) = message.message else {
            return Ok(None);
        };
        Ok(match message {
            Message::Result(result) => Some(FromAgent::Result {
                op_id: result.op_id.clone(),
                attempt: result.attempt,
                outcome: outcome_from_proto(result),
            }),
            Message::Progress(progress) => Some(FromAgent::Progress {
                op_id: progress.op_id,
                attempt: progress.attempt,
                message: crate::engine::exec::port::bounded_progress_message(progress.message),
            }),
            Message::CancelAck(ack) => Some(FromAgent::CancelAck { op_id: ack.op_id }),
            Message::ExternalUpdate(update) => {
                let changes = validate_external_reports(
                    update.reports,
                    "external_update.reports",
                    &self.handle,
                    &self.limits,
                    self.default_max_items,
                )?;
                Some(FromAgent::External(changes))
            }
            Message::Heartbeat(_) => None,
            Message::Register(_) => {
                warn!(
                    "A second Register on a live session was ignored; open a new stream to change types."
                );
                None
            }
        })
    }
}

/// The largest observed values of a result kept (JSON bytes): those of
/// the largest item ([`MAX_ITEM_BYTES_LIMIT`](crate::config::MAX_ITEM_BYTES_LIMIT)).
/// Larger ones are dropped (the result still counts), so that what an
/// agent reports cannot grow a stored record without bound.
const MAX_OBSERVED_BYTES: usize = 64 * 1024;

fn outcome_from_proto(result: v1::OperationResult) -> AgentOutcome {
    match v1::Outcome::try_from(result.outcome).unwrap_or(v1::Outcome::Unspecified) {
        v1::Outcome::Done => AgentOutcome::Done {
            needs_recreate: result.needs_recreate,
            observed: result
                .observed
                .and_then(|observed| properties_from_struct(observed, "observed").ok())
                .filter(|observed| {
                    // Stored with the item: no larger than an item may be.
                    let bytes = serde_json::to_vec(observed).map_or(usize::MAX, |json| json.len());
                    let fits = bytes <= MAX_OBSERVED_BYTES;
                    if !fits {
                        warn!(
                            op_id = %result.op_id,
                            bytes,
                            limit = MAX_OBSERVED_BYTES,
                            "An agent reported observed values larger than an item may be; they were dropped."
                        );
                    }
                    fits
                }),
        },
        v1::Outcome::InProgress => AgentOutcome::InProgress,
        v1::Outcome::Wait => AgentOutcome::Wait {
            retry_after_ms: result
                .retry_after
                .and_then(|d| duration_to_ms(&d, "retry_after").ok())
                .unwrap_or(1_000),
        },
        v1::Outcome::Failed => AgentOutcome::Failed(match &result.status {
            Some(status) => operation_error_from_status(status),
            None => OperationError {
                code: code::UNAVAILABLE,
                message: "the agent reported a failure without a status".into(),
            },
        }),
        v1::Outcome::Unspecified => AgentOutcome::Failed(OperationError {
            code: code::INVALID_ARGUMENT,
            message: "the agent sent a result without an outcome".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done_observing(blob_bytes: usize) -> v1::OperationResult {
        let mut fields = std::collections::BTreeMap::new();
        fields.insert(
            "blob".to_owned(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(
                    "x".repeat(blob_bytes),
                )),
            },
        );
        v1::OperationResult {
            op_id: "op".into(),
            attempt: 1,
            outcome: v1::Outcome::Done.into(),
            observed: Some(prost_types::Struct { fields }),
            ..Default::default()
        }
    }

    #[test]
    fn observed_values_larger_than_an_item_are_dropped_and_the_result_kept() {
        let AgentOutcome::Done { observed, .. } = outcome_from_proto(done_observing(100)) else {
            panic!("a DONE");
        };
        assert!(observed.is_some());
        let AgentOutcome::Done { observed, .. } =
            outcome_from_proto(done_observing(MAX_OBSERVED_BYTES))
        else {
            panic!("still a DONE");
        };
        assert!(observed.is_none(), "dropped");
    }

    #[test]
    fn an_agents_error_message_is_cut_and_says_how_long_it_was() {
        let result = v1::OperationResult {
            op_id: "op".into(),
            attempt: 1,
            outcome: v1::Outcome::Failed.into(),
            status: Some(reconciled_proto::google::rpc::Status {
                code: 3,
                message: "é".repeat(10_000),
                details: Vec::new(),
            }),
            ..Default::default()
        };
        let AgentOutcome::Failed(error) = outcome_from_proto(result) else {
            panic!("a FAILED");
        };
        assert!(
            error.message.len() <= crate::engine::exec::port::MAX_ERROR_MESSAGE + 40,
            "{}",
            error.message.len()
        );
        assert!(
            error.message.ends_with("(cut from 20000 bytes)"),
            "{}",
            &error.message[4000..]
        );
    }
}
