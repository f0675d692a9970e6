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
use crate::tenant::{FairWorkers, RegistrationError, TenantHandle, fairly};
use crate::wire::{
    duration_from_ms, duration_to_ms, item_to_proto, operation_error_from_status,
    operation_kind_to_proto, properties_from_struct,
};

use super::context::{ApiContext, LARGE_REQUEST_ITEMS, credentials_revoked, invalid};
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
        // Compiling schemas is heavy work of the tenant's, like validating
        // an intent: on a seat, off the async workers (or charged to it).
        let large = register.item_types.len() > LARGE_REQUEST_ITEMS
            || register.item_types.iter().any(|spec| spec.schema.is_some());
        let (types, outstanding) = fairly(&self.context.workers, handle.id, large, || {
            self.validated(&register)
        })
        .await?;
        check_item_types(&handle.snapshots.latest(), &types)?;
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
            workers: self.context.workers.clone(),
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
        if register.item_types.len() > MAX_ITEM_TYPES_PER_TENANT {
            // Refused before any schema of them is compiled.
            return Err(invalid(
                "register.item_types",
                format!(
                    "{} item types listed; a tenant may have at most {MAX_ITEM_TYPES_PER_TENANT}",
                    register.item_types.len()
                ),
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
                        format!("item type {:?} is listed twice", spec.item_type),
                    ))
                }
                Ok(spec) => specs.push(spec),
                Err(mut problems) => {
                    name_the_type(&mut problems, &spec.item_type, &field);
                    violations.append(&mut problems);
                }
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

/// Puts the item type `item_type` in front of each problem's description
/// (`item type "user": the schema does not compile ...`), unless its name
/// is one of the problems. The field paths count the types in
/// registration order, which an agent's author never wrote down, and an
/// agent in any language shows the server's message as it is.
fn name_the_type(problems: &mut [FieldViolation], item_type: &str, field: &str) {
    let name_field = format!("{field}.item_type");
    if problems.iter().any(|problem| problem.field == name_field) {
        return;
    }
    for problem in problems {
        problem.description = format!("item type {item_type:?}: {}", problem.description);
    }
}

/// Most item types a tenant may have registered: every type registered
/// is kept (DESIGN 4: its last spec is used while no agent holds it), so
/// without a bound a tenant's agents would grow its registry and stored
/// specs without end, outside `max_items`.
pub const MAX_ITEM_TYPES_PER_TENANT: usize = 1_000;

/// Refuses a registration that would take the tenant's registered item
/// types past [`MAX_ITEM_TYPES_PER_TENANT`]. Checked against the latest
/// snapshot: two registrations at once may pass it by one registration's
/// new types at most.
fn check_item_types(
    snapshot: &crate::tenant::TenantSnapshot,
    types: &[TypeSpec],
) -> Result<(), ApiError> {
    let registered = snapshot.item_types.specs().count();
    let new = types
        .iter()
        .filter(|spec| snapshot.item_types.get(&spec.item_type).is_none())
        .count();
    if registered + new > MAX_ITEM_TYPES_PER_TENANT {
        return Err(ApiError::QuotaExceeded {
            subject: "max_item_types".into(),
            description: format!(
                "the tenant has {registered} item types registered and this registration adds {new}; \
                 at most {MAX_ITEM_TYPES_PER_TENANT} may be: register types it has already"
            ),
        });
    }
    Ok(())
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
    revoked: crate::tenant::Revocation,
    /// Limits that external updates are checked against.
    limits: ValidationLimits,
    /// `max_items` of tenants whose own limit is 0.
    default_max_items: usize,
    /// The seats external updates are validated on, as ReportExternal's.
    workers: std::sync::Arc<FairWorkers>,
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
            // before the owner's end (a deleted tenant stops its owner,
            // then revokes the token once the tombstone is durable).
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => {
                    // The agent keeps unacknowledged results and sends them
                    // again after reconnecting; operations stay journaled.
                    let closing = ApiError::Unavailable { message: SHUTTING_DOWN.to_owned() };
                    self.close_with(closing).await;
                    break "the server is shutting down".to_string();
                }
                () = self.revoked.revoked() => {
                    self.close_with(credentials_revoked(self.revoked.why())).await;
                    break "the session's token was revoked".to_string();
                }
                // While a backlog's worth waits for the agent (in the
                // backlog or in the owner's channel to this session) the
                // agent is not read: each of its messages may queue one
                // more answer (an acknowledgement) in that channel, which
                // has no bound of its own. Its messages wait in its own
                // transport; the session ends after the lease unless it
                // reads.
                message = self.inbound.message(), if self.backlog.len() + self.outbox.len() < OUTBOUND_BUFFER => match message {
                    Ok(Some(message)) => {
                        last_heard = Instant::now();
                        match self.forwardable(message).await {
                            Ok(Some(forward)) => {
                                if self.handle.from_agent(self.id, forward).await.is_err() {
                                    self.handle.deletion_settled().await;
                                    self.close_with_revocation_if_any().await;
                                    if let Some(cluster) = &self.cluster
                                        && !self.revoked.is_revoked()
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
                                // message was refused; nothing of it was stored.
                                let reason = format!("an agent message was refused: {refused}");
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
                        // A deletion stops the owner before its tombstone
                        // is durable: wait for its outcome.
                        self.handle.deletion_settled().await;
                        self.close_with_revocation_if_any().await;
                        if let Some(cluster) = &self.cluster
                            && !self.revoked.is_revoked()
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
        if self.revoked.is_revoked() {
            self.close_with(credentials_revoked(self.revoked.why()))
                .await;
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
    /// `ReportExternal` would refuse is refused here too, as a whole, and
    /// so is a result, progress or cancel acknowledgement naming an op id
    /// no operation can have (empty, or over [`MAX_OP_ID_BYTES`]).
    async fn forwardable(&self, message: v1::AgentMessage) -> Result<Option<FromAgent>, ApiError> {
        use v1::agent_message::Message;
        let Some(message) = message.message else {
            return Ok(None);
        };
        // Every op id names an operation the server issued (short ids);
        // a longer one names none, and would only be echoed back in an
        // acknowledgement, costing the server its size again.
        let op_id = match &message {
            Message::Result(result) => Some(("result.op_id", &result.op_id)),
            Message::Progress(progress) => Some(("progress.op_id", &progress.op_id)),
            Message::CancelAck(ack) => Some(("cancel_ack.op_id", &ack.op_id)),
            _ => None,
        };
        if let Some((field, op_id)) = op_id
            && (op_id.is_empty() || op_id.len() > MAX_OP_ID_BYTES)
        {
            return Err(invalid(
                field,
                format!(
                    "an op id is 1 to {MAX_OP_ID_BYTES} bytes (this one is {}); answer with the op_id of an OperationRequest",
                    op_id.len()
                ),
            ));
        }
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
                // Fairly, as ReportExternal validates the same reports.
                let large = update.reports.len() > LARGE_REQUEST_ITEMS;
                let changes = fairly(&self.workers, self.handle.id, large, || {
                    validate_external_reports(
                        update.reports,
                        "external_update.reports",
                        &self.handle,
                        &self.limits,
                        self.default_max_items,
                    )
                })
                .await?;
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

    /// The Configurators service of a fresh in-memory server, served on a
    /// loopback port, with tenant "alpha"; a channel to it with small
    /// HTTP/2 receive windows (an agent that stops reading backs the
    /// server's sends up soon).
    async fn served_over_loopback() -> (tonic::transport::Channel, ApiContext) {
        let (_, context) = crate::api::reconciler::handler_tests::service();
        context
            .directory
            .create("alpha", crate::tenant::TenantLimits::default())
            .await
            .expect("created");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let addr = listener.local_addr().expect("bound");
        let service = v1::configurators_server::ConfiguratorsServer::new(
            ConfiguratorsService::new(context.clone()),
        )
        .max_decoding_message_size(16 * 1024 * 1024);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .initial_stream_window_size(65_535)
            .initial_connection_window_size(65_535)
            .connect()
            .await
            .expect("connects");
        (channel, context)
    }

    /// An agent's side of a `Connect` call: what it sends through, the
    /// server's stream (or why registration failed), and how many of its
    /// messages the transport has taken.
    type ConnectedAgent = (
        mpsc::Sender<v1::AgentMessage>,
        Result<Streaming<v1::ServerMessage>, Status>,
        std::sync::Arc<AtomicU64>,
    );

    /// Opens Connect as the admin for tenant "alpha", registering
    /// `item_types` as `agent_id`; the messages the agent sends later go
    /// through the returned sender (counted as the transport takes them).
    async fn connect_registering(
        channel: &tonic::transport::Channel,
        agent_id: &str,
        item_types: Vec<String>,
    ) -> ConnectedAgent {
        connect_registering_in(channel, "alpha", agent_id, item_types).await
    }

    /// [`connect_registering`] for tenant `tenant`.
    async fn connect_registering_in(
        channel: &tonic::transport::Channel,
        tenant: &str,
        agent_id: &str,
        item_types: Vec<String>,
    ) -> ConnectedAgent {
        let specs = item_types
            .into_iter()
            .map(|item_type| v1::ItemTypeSpec {
                item_type,
                ..Default::default()
            })
            .collect();
        connect_with_specs(channel, tenant, agent_id, specs).await
    }

    /// [`connect_registering_in`] with whole specs.
    async fn connect_with_specs(
        channel: &tonic::transport::Channel,
        tenant: &str,
        agent_id: &str,
        item_types: Vec<v1::ItemTypeSpec>,
    ) -> ConnectedAgent {
        use tokio_stream::StreamExt as _;
        let (outgoing, receiver) = mpsc::channel(64);
        outgoing
            .send(v1::AgentMessage {
                message: Some(v1::agent_message::Message::Register(v1::Register {
                    tenant: tenant.into(),
                    agent_id: agent_id.into(),
                    protocol_version: PROTOCOL_VERSION,
                    item_types,
                    ..Default::default()
                })),
            })
            .await
            .expect("queue open");
        let taken = std::sync::Arc::new(AtomicU64::new(0));
        let counter = taken.clone();
        let counted = ReceiverStream::new(receiver).map(move |message| {
            counter.fetch_add(1, Ordering::Relaxed);
            message
        });
        let mut request = Request::new(counted);
        request.metadata_mut().insert(
            "authorization",
            tonic::metadata::MetadataValue::try_from("Bearer admin").expect("ascii"),
        );
        let mut client = v1::configurators_client::ConfiguratorsClient::new(channel.clone())
            .max_decoding_message_size(64 * 1024 * 1024);
        let answer = match client.connect(request).await {
            Ok(response) => {
                let mut incoming = response.into_inner();
                match tokio::time::timeout(Duration::from_secs(10), incoming.message()).await {
                    Ok(Ok(Some(v1::ServerMessage {
                        message: Some(v1::server_message::Message::Registered(_)),
                    }))) => Ok(incoming),
                    Ok(Ok(other)) => panic!("not Registered: {other:?}"),
                    Ok(Err(status)) => Err(status),
                    Err(_) => panic!("no answer to Register within 10 s"),
                }
            }
            Err(status) => Err(status),
        };
        (outgoing, answer, taken)
    }

    fn done_result(op_id: String) -> v1::AgentMessage {
        v1::AgentMessage {
            message: Some(v1::agent_message::Message::Result(v1::OperationResult {
                op_id,
                attempt: 1,
                outcome: v1::Outcome::Done.into(),
                ..Default::default()
            })),
        }
    }

    /// docs/security.md: every byte an agent sends is bounded. An op id is
    /// at most MAX_OP_ID_BYTES (the server's own are short; Register
    /// refuses longer ones), yet a result naming a 1 MiB op id is
    /// acknowledged with a copy of it: every such message an agent sends
    /// (and does not read back) costs the server its size again in queued
    /// acknowledgements.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_result_with_an_op_id_no_operation_can_have_is_not_echoed_back() {
        let (channel, _context) = served_over_loopback().await;
        let (outgoing, incoming, _) =
            connect_registering(&channel, "agent", vec!["t".to_owned()]).await;
        let mut incoming = incoming.expect("registered");
        outgoing
            .send(done_result("x".repeat(1024 * 1024)))
            .await
            .expect("queue open");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        loop {
            match tokio::time::timeout_at(deadline, incoming.message()).await {
                // Nothing came back: the result was dropped.
                Err(_) => break,
                Ok(Err(status)) => {
                    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
                    break;
                }
                Ok(Ok(None)) => break,
                Ok(Ok(Some(v1::ServerMessage {
                    message: Some(v1::server_message::Message::ResultAck(ack)),
                }))) => panic!(
                    "the server acknowledged an op id of {} bytes with a copy of it (op ids are at most {MAX_OP_ID_BYTES} bytes)",
                    ack.op_id.len()
                ),
                Ok(Ok(Some(_))) => continue,
            }
        }
    }

    /// docs/security.md, "messages queued toward an agent": 1,024 in the
    /// stream and 1,024 more in the session's backlog (protects the
    /// server's memory from agents that send but never read). An agent
    /// that stops reading and keeps sending results gets one
    /// acknowledgement queued per result without bound: the session stops
    /// taking the owner's messages once its backlog is full, but the
    /// owner's channel to it is unbounded and the agent's messages are
    /// still read and answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_agent_that_does_not_read_cannot_queue_acknowledgements_without_bound() {
        let (channel, _context) = served_over_loopback().await;
        let (outgoing, incoming, taken) =
            connect_registering(&channel, "deaf", vec!["t".to_owned()]).await;
        // Registered was read; nothing is read from now on.
        let _deaf = incoming.expect("registered");
        const SENT: u64 = 100_000;
        let op_id = "o".repeat(MAX_OP_ID_BYTES);
        let sending = tokio::spawn(async move {
            for _ in 0..SENT {
                if outgoing.send(done_result(op_id.clone())).await.is_err() {
                    break;
                }
            }
            outgoing
        });
        // Were the agent read on, all its results would be taken soon; with
        // the bound, its sends stall for good once the server stops reading.
        let finished = tokio::time::timeout(Duration::from_secs(20), sending).await;
        let last = taken.load(Ordering::Relaxed);
        assert!(
            finished.is_err(),
            "every one of {SENT} results was taken from an agent that reads nothing"
        );
        // What backs up toward the agent: its HTTP/2 window (64 KiB), the
        // stream (1,024) and the backlog (1,024); toward the server: its
        // receive window. Far fewer than 100,000 acknowledgements.
        assert!(
            last < 30_000,
            "the server took {last} of {SENT} results from an agent that reads nothing, queueing an acknowledgement for each"
        );
    }

    /// DESIGN 9: limits per tenant protect the server; every count an
    /// agent controls is bounded. A tenant's agents may register item
    /// types without end: each Register may list any number of types
    /// (only the message size bounds it), and every type is stored for
    /// good (DESIGN 4: the last spec per type is kept), so the tenant's
    /// registry and its stored specs grow with each registration of new
    /// names, outside `max_items` and every other limit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenants_agents_cannot_register_item_types_without_bound() {
        let (channel, context) = served_over_loopback().await;
        let mut registered = 0usize;
        let mut refused = None;
        for batch in 0..15 {
            let types = (0..1_000)
                .map(|index| format!("type-{batch}-{index}"))
                .collect();
            let (_outgoing, answer, _) =
                connect_registering(&channel, &format!("agent-{batch}"), types).await;
            match answer {
                Ok(_) => registered += 1_000,
                Err(status) => {
                    refused = Some(status);
                    break;
                }
            }
        }
        let stored = context
            .directory
            .get("alpha")
            .expect("alpha")
            .snapshots
            .latest()
            .item_types
            .specs()
            .count();
        assert!(
            refused.is_some() && stored <= 10_000,
            "{registered} item types registered and {stored} kept by one tenant, none refused"
        );
    }

    /// docs/security.md: a tenant's CPU is bounded. GetItemTypes filtered
    /// the registered types with a linear search of the request's
    /// `item_types` for each type, with no bound on the list: 1,000 types
    /// against 1,000,000 names was a billion string comparisons on an
    /// async worker. The list is now at most `max_request_items` names
    /// (INVALID_ARGUMENT on `item_types` beyond), looked up in a set.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn get_item_types_refuses_a_list_longer_than_any_request_and_filters_by_it() {
        use v1::reconciler_server::Reconciler as _;
        let (channel, context) = served_over_loopback().await;
        let types = (0..1_000).map(|index| format!("t-{index:04}")).collect();
        let (_outgoing, answer, _) = connect_registering(&channel, "agent", types).await;
        let _session = answer.expect("registered");
        let limit = context.limits.max_request_items;
        let reconciler = crate::api::reconciler::ReconcilerService::new(context);
        let ask = |item_types: Vec<String>| {
            reconciler.get_item_types(crate::api::reconciler::handler_tests::admin(
                v1::GetItemTypesRequest {
                    tenant: "alpha".into(),
                    item_types,
                    ..Default::default()
                },
            ))
        };

        let too_many: Vec<String> = (0..=limit).map(|index| format!("w{index:06}")).collect();
        let status = ask(too_many).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("item_types"), "{status:?}");

        let mut wanted: Vec<String> = (0..limit - 2).map(|index| format!("w{index:06}")).collect();
        wanted.extend(["t-0007".to_owned(), "t-0999".to_owned()]);
        let listed: Vec<String> = ask(wanted)
            .await
            .expect("answered")
            .into_inner()
            .item_types
            .into_iter()
            .filter_map(|registered| registered.spec.map(|spec| spec.item_type))
            .collect();
        assert_eq!(listed, ["t-0007", "t-0999"]);
    }

    /// Issue 12's rule for replies: a reply is sized by bytes, never a
    /// failure for being large. GetItemTypes answered every type in one
    /// reply (1,000 types with 32 KiB schemas would pass any message
    /// limit); it now fills a page to the reply budget and continues with
    /// `next_page_token`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn get_item_types_pages_by_bytes_and_continues_with_its_token() {
        use v1::reconciler_server::Reconciler as _;
        let (channel, mut context) = served_over_loopback().await;
        let types: Vec<String> = (0..30).map(|index| format!("t-{index:02}")).collect();
        let (_outgoing, answer, _) = connect_registering(&channel, "agent", types.clone()).await;
        let _session = answer.expect("registered");
        // Room for a few types a page beside the token's.
        context.reply_bytes = 2_048 + 600;
        let reconciler = crate::api::reconciler::ReconcilerService::new(context);
        let ask = |page_token: String| {
            reconciler.get_item_types(crate::api::reconciler::handler_tests::admin(
                v1::GetItemTypesRequest {
                    tenant: "alpha".into(),
                    page_token,
                    ..Default::default()
                },
            ))
        };
        let mut listed = Vec::new();
        let mut pages = 0;
        let mut token = String::new();
        loop {
            let reply = ask(token).await.expect("a page").into_inner();
            pages += 1;
            assert!(!reply.item_types.is_empty(), "an empty page");
            listed.extend(
                reply
                    .item_types
                    .into_iter()
                    .filter_map(|registered| registered.spec.map(|spec| spec.item_type)),
            );
            if reply.next_page_token.is_empty() {
                break;
            }
            token = reply.next_page_token;
        }
        assert_eq!(listed, types, "every type once, in order");
        assert!(pages > 1, "one page of {} types", listed.len());

        let status = ask("not-a-token".into()).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("page_token"), "{status:?}");
    }

    /// docs/security.md, "agents connected per tenant": `max_agents`
    /// protects the server's memory; "Agents are counted by distinct agent
    /// id: a reconnecting agent is always admitted, since it takes its old
    /// session over". The old session is never ended, though: a tenant
    /// limited to 2 agents opens any number of live sessions (each a task,
    /// a stream, heartbeats, a full pass at registration) under one agent
    /// id.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sessions_of_one_agent_id_do_not_escape_max_agents() {
        let (channel, context) = served_over_loopback().await;
        context
            .directory
            .create(
                "beta",
                crate::tenant::TenantLimits {
                    max_agents: 2,
                    ..Default::default()
                },
            )
            .await
            .expect("created");
        let mut sessions = Vec::new();
        for _ in 0..20 {
            let (outgoing, answer, _) =
                connect_registering_in(&channel, "beta", "same-agent", vec!["t".to_owned()]).await;
            sessions.push((outgoing, answer.expect("a reconnect is admitted")));
        }
        // Every session but the last was taken over: each ends (the last
        // one reads on).
        sessions.pop();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut live = 0;
        for (_outgoing, incoming) in &mut sessions {
            let ended = tokio::time::timeout_at(deadline, async {
                while let Ok(Some(_)) = incoming.message().await {}
            })
            .await;
            if ended.is_err() {
                live += 1;
            }
        }
        assert_eq!(
            live, 0,
            "{live} sessions taken over are still live in tenant beta (max_agents 2), all as agent \"same-agent\""
        );
    }

    /// docs/security.md, "heavy work per tenant": a tenant's large
    /// requests wait for a seat, off the async workers (SubmitIntent,
    /// ReportExternal and GetGraph go through `fairly`). A Register's
    /// schemas were compiled on the async worker that ran the Connect
    /// call, with no seat: 60 schemas of the costliest kind the bounds
    /// allow held a worker for over a second, and every call waiting for
    /// it with it. A Register with a schema now waits for a seat: with
    /// the only one taken, it is answered once the seat is free.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_register_with_schemas_compiles_them_on_a_seat() {
        let (channel, context) = served_over_loopback().await;
        let schema = serde_json::json!({"additionalProperties": {"minLength": 1}});
        let serde_json::Value::Object(schema) = schema else {
            unreachable!("an object");
        };
        let specs = vec![v1::ItemTypeSpec {
            item_type: "typed".into(),
            schema: Some(reconciled_proto::json::properties_to_struct(&schema)),
            ..Default::default()
        }];
        // The service's pool has one seat: another tenant's work holds it.
        let seat = context.workers.seat(u64::MAX).await;
        let registering =
            tokio::spawn(
                async move { connect_with_specs(&channel, "alpha", "typed", specs).await },
            );
        let mut registering = registering;
        let early = tokio::time::timeout(Duration::from_secs(1), &mut registering).await;
        assert!(
            early.is_err(),
            "a Register with a schema was answered while no seat was free"
        );
        drop(seat);
        let (_outgoing, answer, _) = registering.await.expect("ran");
        answer.expect("registered once the seat was free");
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
