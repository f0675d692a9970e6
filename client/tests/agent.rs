//! The agent against a scripted in-process `Configurators` server: the real
//! network path (tonic channel, bidirectional stream, reconnects) with the
//! server side played by the test.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reconciled_client::agent::{
    Agent, AgentError, AgentEvent, Configurator, Item, OperationContext, Outcome, Token, TypeSpec,
};
use reconciled_client::convert::properties_to_struct;
use reconciled_client::proto as v1;
use reconciled_client::proto::agent_message::Message as FromAgent;
use reconciled_client::proto::configurators_server::{Configurators, ConfiguratorsServer};
use reconciled_client::proto::server_message::Message as ToAgent;
use tokio::sync::{Notify, broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::{Code, Request, Response, Status, Streaming};

/// How long any single wait in these tests may take.
const DEADLINE: Duration = Duration::from_secs(10);

const TOKEN: &str = "rcd_test_token";

/// One agent connection, as the fake server sees it.
struct Connection {
    authorization: Option<String>,
    inbound: Streaming<v1::AgentMessage>,
    outbound: mpsc::UnboundedSender<Result<v1::ServerMessage, Status>>,
}

impl Connection {
    /// The next message that is not a heartbeat.
    async fn next(&mut self) -> FromAgent {
        loop {
            let message = tokio::time::timeout(DEADLINE, self.inbound.message())
                .await
                .expect("the agent sent nothing in time")
                .expect("the stream failed")
                .expect("the agent closed the stream");
            match message.message {
                Some(FromAgent::Heartbeat(_)) | None => continue,
                Some(other) => return other,
            }
        }
    }

    async fn next_result(&mut self) -> v1::OperationResult {
        match self.next().await {
            FromAgent::Result(result) => result,
            other => panic!("expected a result, got {other:?}"),
        }
    }

    fn send(&self, message: ToAgent) {
        self.outbound
            .send(Ok(v1::ServerMessage {
                message: Some(message),
            }))
            .expect("the agent's stream is open");
    }

    /// Reads `Register` and answers `Registered`.
    async fn accept(&mut self, heartbeat: Duration, lease: Duration) -> v1::Register {
        let register = match self.next().await {
            FromAgent::Register(register) => register,
            other => panic!("expected Register first, got {other:?}"),
        };
        self.send(ToAgent::Registered(v1::Registered {
            session_id: "session-1".into(),
            granted: register
                .item_types
                .iter()
                .map(|spec| v1::TypeGrant {
                    item_type: spec.item_type.clone(),
                    epoch: 1,
                })
                .collect(),
            heartbeat_interval: Some(heartbeat.try_into().expect("small duration")),
            lease: Some(lease.try_into().expect("small duration")),
        }));
        register
    }
}

#[derive(Clone, Default)]
struct FakeServer {
    connections: Arc<Mutex<Option<mpsc::UnboundedSender<Connection>>>>,
    refusals: Arc<Mutex<VecDeque<Status>>>,
}

#[tonic::async_trait]
impl Configurators for FakeServer {
    type ConnectStream = UnboundedReceiverStream<Result<v1::ServerMessage, Status>>;

    async fn connect(
        &self,
        request: Request<Streaming<v1::AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        if let Some(status) = self.refusals.lock().expect("lock").pop_front() {
            return Err(status);
        }
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let (outbound, receiver) = mpsc::unbounded_channel();
        let connection = Connection {
            authorization,
            inbound: request.into_inner(),
            outbound,
        };
        if let Some(connections) = self.connections.lock().expect("lock").as_ref() {
            let _ = connections.send(connection);
        }
        Ok(Response::new(UnboundedReceiverStream::new(receiver)))
    }
}

/// A running fake server and the connections agents open to it.
struct Harness {
    address: String,
    connections: mpsc::UnboundedReceiver<Connection>,
    refusals: Arc<Mutex<VecDeque<Status>>>,
}

impl Harness {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a port");
        let address = format!("http://{}", listener.local_addr().expect("local address"));
        let (sender, connections) = mpsc::unbounded_channel();
        let server = FakeServer::default();
        *server.connections.lock().expect("lock") = Some(sender);
        let refusals = Arc::clone(&server.refusals);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ConfiguratorsServer::new(server))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        Self {
            address,
            connections,
            refusals,
        }
    }

    async fn next_connection(&mut self) -> Connection {
        tokio::time::timeout(DEADLINE, self.connections.recv())
            .await
            .expect("the agent did not connect in time")
            .expect("the server is running")
    }

    fn refuse_next(&self, status: Status) {
        self.refusals.lock().expect("lock").push_back(status);
    }
}

/// A running agent.
struct Running {
    events: broadcast::Receiver<AgentEvent>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), AgentError>>,
}

impl Running {
    fn start(agent: Agent) -> Self {
        let events = agent.events();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(agent.run(async move {
            let _ = stopped.await;
        }));
        Self {
            events,
            stop: Some(stop),
            task,
        }
    }

    /// Waits for the first event that `select` accepts.
    async fn wait_for<T>(&mut self, mut select: impl FnMut(&AgentEvent) -> Option<T>) -> T {
        tokio::time::timeout(DEADLINE, async {
            loop {
                match self.events.recv().await {
                    Ok(event) => {
                        if let Some(found) = select(&event) {
                            return found;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => panic!("the agent stopped"),
                }
            }
        })
        .await
        .expect("the expected event did not come in time")
    }

    async fn stop(mut self) -> Result<(), AgentError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("the agent did not stop in time")
            .expect("the agent task did not panic")
    }

    async fn finished(self) -> Result<(), AgentError> {
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("the agent did not stop in time")
            .expect("the agent task did not panic")
    }
}

fn builder(address: &str) -> reconciled_client::agent::AgentBuilder {
    Agent::builder(address, "acme", TOKEN)
        .agent_id("agent-under-test")
        .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(50))
        .drain_timeout(Duration::from_secs(2))
}

fn request(op_id: &str, attempt: u32, kind: v1::OperationKind, name: &str) -> ToAgent {
    let properties = serde_json::json!({"path": name});
    ToAgent::Operation(v1::OperationRequest {
        op_id: op_id.into(),
        attempt,
        epoch: 1,
        operation: kind as i32,
        item: Some(v1::Item {
            r#type: "file".into(),
            name: name.into(),
            properties: properties.as_object().map(properties_to_struct),
            ..v1::Item::default()
        }),
        previous: None,
        timeout: None,
        generation: 1,
        previous_uncertain: false,
    })
}

fn ack(op_id: &str, attempt: u32) -> ToAgent {
    ToAgent::ResultAck(v1::ResultAck {
        op_id: op_id.into(),
        attempt,
    })
}

const HEARTBEAT: Duration = Duration::from_secs(5);
const LEASE: Duration = Duration::from_secs(15);

/// Counts creates; everything succeeds.
#[derive(Default)]
struct Counting {
    creates: AtomicUsize,
}

impl Configurator for Counting {
    async fn create(&self, _ctx: &OperationContext, item: &Item) -> Outcome {
        self.creates.fetch_add(1, Ordering::SeqCst);
        Outcome::done_observed(item.properties.clone())
    }
    async fn modify(&self, _ctx: &OperationContext, _previous: &Item, _item: &Item) -> Outcome {
        Outcome::done()
    }
    async fn delete(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
        Outcome::done()
    }
}

#[tokio::test]
async fn results_are_deduplicated_and_resent_after_a_reconnect_until_acknowledged() {
    let mut harness = Harness::start().await;
    let configurator = Arc::new(Counting::default());
    let agent = builder(&harness.address)
        .item_type(
            TypeSpec::new("file")
                .recreate_on_change(["/path"])
                .max_in_flight(4),
            Arc::clone(&configurator),
        )
        .build()
        .expect("a valid agent");
    let mut running = Running::start(agent);

    let mut first = harness.next_connection().await;
    assert_eq!(
        first.authorization.as_deref(),
        Some("Bearer rcd_test_token")
    );
    let register = first.accept(HEARTBEAT, LEASE).await;
    assert_eq!(register.tenant, "acme");
    assert_eq!(register.agent_id, "agent-under-test");
    assert_eq!(
        register.protocol_version,
        reconciled_client::PROTOCOL_VERSION
    );
    assert_eq!(register.item_types.len(), 1);
    assert_eq!(register.item_types[0].recreate_on_change, ["/path"]);
    running
        .wait_for(|event| matches!(event, AgentEvent::Connected { .. }).then_some(()))
        .await;

    first.send(request("op-1", 1, v1::OperationKind::Create, "a"));
    let result = first.next_result().await;
    assert_eq!((result.op_id.as_str(), result.attempt), ("op-1", 1));
    assert_eq!(result.outcome(), v1::Outcome::Done);
    assert!(
        result
            .observed
            .is_some_and(|observed| observed.fields.contains_key("path"))
    );

    // A re-delivery is answered from the held result, not run again.
    first.send(request("op-1", 1, v1::OperationKind::Create, "a"));
    let again = first.next_result().await;
    assert_eq!(again.outcome(), v1::Outcome::Done);
    assert_eq!(configurator.creates.load(Ordering::SeqCst), 1);

    // The server goes away without acknowledging.
    drop(first);
    running
        .wait_for(|event| matches!(event, AgentEvent::Disconnected { .. }).then_some(()))
        .await;
    let mut second = harness.next_connection().await;
    second.accept(HEARTBEAT, LEASE).await;
    let resent = second.next_result().await;
    assert_eq!(
        (resent.op_id.as_str(), resent.outcome()),
        ("op-1", v1::Outcome::Done)
    );

    second.send(ack("op-1", 1));
    running
        .wait_for(|event| {
            matches!(event, AgentEvent::ResultAcked { op_id, attempt: 1 } if op_id == "op-1")
                .then_some(())
        })
        .await;
    assert_eq!(configurator.creates.load(Ordering::SeqCst), 1);
    running.stop().await.expect("a clean shutdown");
}

/// Waits for cancellation and reports it.
struct WaitsForCancel;

impl Configurator for WaitsForCancel {
    async fn create(&self, ctx: &OperationContext, _item: &Item) -> Outcome {
        ctx.cancelled().await;
        Outcome::failed(Code::Cancelled, "stopped on request")
    }
    async fn modify(&self, _ctx: &OperationContext, _previous: &Item, _item: &Item) -> Outcome {
        Outcome::done()
    }
    async fn delete(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
        Outcome::done()
    }
}

#[tokio::test]
async fn a_cancel_stops_the_operation_and_is_acknowledged_after_its_result() {
    let mut harness = Harness::start().await;
    let agent = builder(&harness.address)
        .item_type(TypeSpec::new("file"), WaitsForCancel)
        .build()
        .expect("a valid agent");
    let mut running = Running::start(agent);
    let mut connection = harness.next_connection().await;
    connection.accept(HEARTBEAT, LEASE).await;

    connection.send(request("op-7", 1, v1::OperationKind::Create, "slow"));
    running
        .wait_for(|event| matches!(event, AgentEvent::OperationReceived { .. }).then_some(()))
        .await;
    connection.send(ToAgent::Cancel(v1::CancelOperation {
        op_id: "op-7".into(),
    }));

    let result = connection.next_result().await;
    assert_eq!(result.outcome(), v1::Outcome::Failed);
    assert_eq!(
        result.status.map(|status| status.code),
        Some(Code::Cancelled as i32)
    );
    match connection.next().await {
        FromAgent::CancelAck(cancel_ack) => assert_eq!(cancel_ack.op_id, "op-7"),
        other => panic!("expected CancelAck, got {other:?}"),
    }
    connection.send(ack("op-7", 1));
    running.stop().await.expect("a clean shutdown");
}

/// Goes long-running and finishes when told to.
struct LongRunning {
    release: Arc<Notify>,
}

impl Configurator for LongRunning {
    async fn create(&self, ctx: &OperationContext, _item: &Item) -> Outcome {
        let completion = ctx.finish_later();
        let release = Arc::clone(&self.release);
        tokio::spawn(async move {
            completion.progress("copying");
            release.notified().await;
            completion.finish(Outcome::done());
        });
        Outcome::InProgress
    }
    async fn modify(&self, _ctx: &OperationContext, _previous: &Item, _item: &Item) -> Outcome {
        Outcome::done()
    }
    async fn delete(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
        Outcome::done()
    }
}

#[tokio::test]
async fn a_long_running_operation_answers_in_progress_then_its_final_outcome() {
    let mut harness = Harness::start().await;
    let release = Arc::new(Notify::new());
    let agent = builder(&harness.address)
        .item_type(
            TypeSpec::new("file"),
            LongRunning {
                release: Arc::clone(&release),
            },
        )
        .build()
        .expect("a valid agent");
    let running = Running::start(agent);
    let mut connection = harness.next_connection().await;
    connection.accept(HEARTBEAT, LEASE).await;

    connection.send(request("op-2", 1, v1::OperationKind::Create, "big"));
    let first = connection.next_result().await;
    assert_eq!(first.outcome(), v1::Outcome::InProgress);
    connection.send(ack("op-2", 1));
    match connection.next().await {
        FromAgent::Progress(progress) => {
            assert_eq!(
                (progress.op_id.as_str(), progress.message.as_str()),
                ("op-2", "copying")
            );
        }
        other => panic!("expected progress, got {other:?}"),
    }

    release.notify_one();
    let last = connection.next_result().await;
    assert_eq!((last.op_id.as_str(), last.attempt), ("op-2", 1));
    assert_eq!(last.outcome(), v1::Outcome::Done);
    connection.send(ack("op-2", 1));
    running.stop().await.expect("a clean shutdown");
}

#[tokio::test]
async fn an_unauthenticated_agent_stops_with_an_error() {
    let harness = Harness::start().await;
    harness.refuse_next(Status::unauthenticated("unknown token"));
    let agent = builder(&harness.address)
        .item_type(TypeSpec::new("file"), Counting::default())
        .build()
        .expect("a valid agent");
    let running = Running::start(agent);
    match running.finished().await {
        Err(AgentError::Unauthenticated { message }) => assert_eq!(message, "unknown token"),
        other => panic!("expected Unauthenticated, got {other:?}"),
    }
}

/// A token read from a file is read again before every connection. After
/// the server rejects it (as `RotateToken` ends the agent's stream with
/// `UNAUTHENTICATED`), the agent keeps retrying instead of stopping, and
/// connects with the new token once the file holds it.
#[tokio::test]
async fn a_token_file_is_read_again_after_the_server_rejects_its_token() {
    let mut harness = Harness::start().await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("token");
    std::fs::write(&path, "rcd_old\n").expect("write the token file");
    let agent = Agent::builder(&harness.address, "acme", Token::file(&path))
        .agent_id("agent-under-test")
        .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(50))
        .item_type(TypeSpec::new("file"), Counting::default())
        .build()
        .expect("a valid agent");
    let mut running = Running::start(agent);

    let mut first = harness.next_connection().await;
    assert_eq!(first.authorization.as_deref(), Some("Bearer rcd_old"));
    first.accept(HEARTBEAT, LEASE).await;
    running
        .wait_for(|event| matches!(event, AgentEvent::Connected { .. }).then_some(()))
        .await;
    let rotated =
        || Status::unauthenticated("the token was rotated; reconnect with the current token");
    first
        .outbound
        .send(Err(rotated()))
        .expect("the stream is open");

    // The file still holds the old token: rejected again, and again.
    for _ in 0..2 {
        let again = harness.next_connection().await;
        assert_eq!(again.authorization.as_deref(), Some("Bearer rcd_old"));
        again
            .outbound
            .send(Err(rotated()))
            .expect("the stream is open");
    }
    assert!(
        !running.task.is_finished(),
        "the agent stopped on a token it reads from a file"
    );

    std::fs::write(&path, "rcd_new\n").expect("write the new token");
    loop {
        let mut next = harness.next_connection().await;
        match next.authorization.as_deref() {
            Some("Bearer rcd_new") => {
                next.accept(HEARTBEAT, LEASE).await;
                break;
            }
            // Sent before the file changed.
            Some("Bearer rcd_old") => next.outbound.send(Err(rotated())).expect("open"),
            other => panic!("unexpected authorization {other:?}"),
        }
    }
    running
        .wait_for(|event| matches!(event, AgentEvent::Connected { .. }).then_some(()))
        .await;
    running.stop().await.expect("a clean shutdown");
}

/// A token file that cannot be read is refused when the agent is built,
/// naming the file.
#[test]
fn a_missing_token_file_is_refused_at_build() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("absent");
    let error = Agent::builder("http://127.0.0.1:1", "acme", Token::file(&path))
        .item_type(TypeSpec::new("file"), Counting::default())
        .build()
        .expect_err("no token file");
    assert!(matches!(error, AgentError::TokenFile { .. }), "{error}");
    assert!(error.to_string().contains("absent"), "{error}");
}

#[tokio::test]
async fn a_type_held_by_another_agent_is_retried_until_granted() {
    let mut harness = Harness::start().await;
    let held = <Status as tonic_types::StatusExt>::with_error_details(
        Code::FailedPrecondition,
        "item type file is held by agent other",
        tonic_types::ErrorDetails::with_error_info("TYPE_HELD", "reconciled.dev", []),
    );
    harness.refuse_next(held.clone());
    harness.refuse_next(held);
    let agent = builder(&harness.address)
        .item_type(TypeSpec::new("file"), Counting::default())
        .build()
        .expect("a valid agent");
    let mut running = Running::start(agent);
    let reason = running
        .wait_for(|event| match event {
            AgentEvent::Disconnected { reason, code } => Some((reason.clone(), *code)),
            _ => None,
        })
        .await;
    assert!(reason.0.contains("TYPE_HELD"), "{reason:?}");
    assert_eq!(reason.1, Some(Code::FailedPrecondition));

    let mut connection = harness.next_connection().await;
    connection.accept(HEARTBEAT, LEASE).await;
    running
        .wait_for(|event| match event {
            AgentEvent::Connected { granted, .. } => Some(granted.clone()),
            _ => None,
        })
        .await;
    running.stop().await.expect("a clean shutdown");
}

#[tokio::test]
async fn a_silent_server_is_left_and_the_agent_reconnects_while_heartbeating() {
    let mut harness = Harness::start().await;
    let agent = builder(&harness.address)
        .item_type(TypeSpec::new("file"), Counting::default())
        .build()
        .expect("a valid agent");
    let mut running = Running::start(agent);
    let mut first = harness.next_connection().await;
    first
        .accept(Duration::from_millis(100), Duration::from_millis(300))
        .await;

    // The agent heartbeats at the interval the server asked for.
    let heartbeat = tokio::time::timeout(DEADLINE, first.inbound.message())
        .await
        .expect("a heartbeat in time")
        .expect("an open stream")
        .expect("a message");
    assert!(matches!(heartbeat.message, Some(FromAgent::Heartbeat(_))));

    let reason = running
        .wait_for(|event| match event {
            AgentEvent::Disconnected { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .await;
    assert!(reason.contains("sent nothing"), "{reason}");
    let mut second = harness.next_connection().await;
    second.accept(HEARTBEAT, LEASE).await;
    running.stop().await.expect("a clean shutdown");
}

/// Panics on create.
struct Panics;

impl Configurator for Panics {
    async fn create(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
        panic!("boom");
    }
    async fn modify(&self, _ctx: &OperationContext, _previous: &Item, _item: &Item) -> Outcome {
        Outcome::done()
    }
    async fn delete(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
        Outcome::done()
    }
}

#[tokio::test]
async fn a_panicking_configurator_fails_the_operation_with_internal() {
    let mut harness = Harness::start().await;
    let agent = builder(&harness.address)
        .item_type(TypeSpec::new("file"), Panics)
        .build()
        .expect("a valid agent");
    let running = Running::start(agent);
    let mut connection = harness.next_connection().await;
    connection.accept(HEARTBEAT, LEASE).await;
    connection.send(request("op-3", 1, v1::OperationKind::Create, "x"));
    let result = connection.next_result().await;
    assert_eq!(result.outcome(), v1::Outcome::Failed);
    let status = result.status.expect("a status");
    assert_eq!(status.code, Code::Internal as i32);
    assert!(status.message.contains("boom"), "{}", status.message);
    connection.send(ack("op-3", 1));
    running.stop().await.expect("a clean shutdown");
}

/// Tracks how many creates run at once.
#[derive(Default)]
struct Concurrency {
    active: AtomicUsize,
    most: AtomicUsize,
}

impl Configurator for Concurrency {
    async fn create(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(30)).await;
        self.active.fetch_sub(1, Ordering::SeqCst);
        Outcome::done()
    }
    async fn modify(&self, _ctx: &OperationContext, _previous: &Item, _item: &Item) -> Outcome {
        Outcome::done()
    }
    async fn delete(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
        Outcome::done()
    }
}

#[tokio::test]
async fn max_in_flight_bounds_the_operations_running_at_once() {
    let mut harness = Harness::start().await;
    let configurator = Arc::new(Concurrency::default());
    let agent = builder(&harness.address)
        .item_type(
            TypeSpec::new("file").max_in_flight(2),
            Arc::clone(&configurator),
        )
        .build()
        .expect("a valid agent");
    let running = Running::start(agent);
    let mut connection = harness.next_connection().await;
    connection.accept(HEARTBEAT, LEASE).await;
    for index in 0..6 {
        connection.send(request(
            &format!("op-{index}"),
            1,
            v1::OperationKind::Create,
            "x",
        ));
    }
    for _ in 0..6 {
        let result = connection.next_result().await;
        assert_eq!(result.outcome(), v1::Outcome::Done);
        connection.send(ack(&result.op_id, result.attempt));
    }
    assert_eq!(configurator.most.load(Ordering::SeqCst), 2);
    running.stop().await.expect("a clean shutdown");
}

#[tokio::test]
async fn shutdown_waits_for_running_operations_and_their_acknowledgements() {
    let mut harness = Harness::start().await;
    let release = Arc::new(Notify::new());
    let agent = builder(&harness.address)
        .item_type(
            TypeSpec::new("file"),
            LongRunning {
                release: Arc::clone(&release),
            },
        )
        .build()
        .expect("a valid agent");
    let mut running = Running::start(agent);
    let mut connection = harness.next_connection().await;
    connection.accept(HEARTBEAT, LEASE).await;
    connection.send(request("op-5", 1, v1::OperationKind::Create, "x"));
    assert_eq!(
        connection.next_result().await.outcome(),
        v1::Outcome::InProgress
    );
    connection.send(ack("op-5", 1));
    running
        .wait_for(|event| matches!(event, AgentEvent::ResultAcked { .. }).then_some(()))
        .await;

    if let Some(stop) = running.stop.take() {
        let _ = stop.send(());
    }
    // Still running: the agent waits (progress arrives, the stream stays open).
    assert!(matches!(connection.next().await, FromAgent::Progress(_)));
    release.notify_one();
    let last = connection.next_result().await;
    assert_eq!(last.outcome(), v1::Outcome::Done);
    connection.send(ack("op-5", 1));
    running.finished().await.expect("a clean shutdown");
}

// ---------------------------------------------------------------------------
// The agent's side of the protocol.
// ---------------------------------------------------------------------------

/// The first create of an item waits for its cancel and stops as asked;
/// every later one succeeds at once.
#[derive(Default)]
struct StopsOnceAsked {
    creates: AtomicUsize,
}

impl Configurator for StopsOnceAsked {
    async fn create(&self, ctx: &OperationContext, _item: &Item) -> Outcome {
        if self.creates.fetch_add(1, Ordering::SeqCst) == 0 {
            ctx.cancelled().await;
            return Outcome::cancelled();
        }
        Outcome::done()
    }
    async fn modify(&self, _ctx: &OperationContext, _previous: &Item, _item: &Item) -> Outcome {
        Outcome::done()
    }
    async fn delete(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
        Outcome::done()
    }
}

/// "Cancelled as asked" does not settle an operation: the server counts no
/// attempt and, when the intent still needs the same operation (its item's
/// external item came back, say), asks for it again under the same op id
/// and attempt, as after a WAIT. That request must run the configurator
/// again; answering it with the cached CANCELLED makes the server re-ask at
/// once, for ever (docs/agents.md §7: "it does not count as an attempt";
/// "never return cancelled() unasked ... so it cannot loop without
/// backoff").
#[tokio::test]
async fn a_re_ask_after_cancelled_as_asked_runs_the_operation_again() {
    let mut harness = Harness::start().await;
    let configurator = Arc::new(StopsOnceAsked::default());
    let agent = builder(&harness.address)
        .item_type(TypeSpec::new("file"), Arc::clone(&configurator))
        .build()
        .expect("a valid agent");
    let mut running = Running::start(agent);
    let mut connection = harness.next_connection().await;
    connection.accept(HEARTBEAT, LEASE).await;

    connection.send(request("op-c", 1, v1::OperationKind::Create, "a"));
    running
        .wait_for(|event| matches!(event, AgentEvent::OperationReceived { .. }).then_some(()))
        .await;
    connection.send(ToAgent::Cancel(v1::CancelOperation {
        op_id: "op-c".into(),
    }));
    let cancelled = connection.next_result().await;
    assert_eq!(cancelled.outcome(), v1::Outcome::Failed);
    assert_eq!(
        cancelled.status.map(|status| status.code),
        Some(Code::Cancelled as i32)
    );
    assert!(matches!(connection.next().await, FromAgent::CancelAck(_)));
    connection.send(ack("op-c", 1));
    running
        .wait_for(|event| matches!(event, AgentEvent::ResultAcked { .. }).then_some(()))
        .await;

    // The server asks again: same op id, same attempt (no attempt counted).
    connection.send(request("op-c", 1, v1::OperationKind::Create, "a"));
    let again = connection.next_result().await;
    assert_eq!(
        configurator.creates.load(Ordering::SeqCst),
        2,
        "the re-ask must run the configurator again, not replay the cached CANCELLED"
    );
    assert_eq!(again.outcome(), v1::Outcome::Done, "{again:?}");
    connection.send(ack("op-c", 1));
    running.stop().await.expect("a clean shutdown");
}

/// Runs for a while, ignoring its token, and records whether it was
/// cancelled before it finished.
struct SlowAndWatched {
    started: Arc<Notify>,
    cancelled_early: Arc<std::sync::atomic::AtomicBool>,
    finished: Arc<std::sync::atomic::AtomicBool>,
}

impl Configurator for SlowAndWatched {
    async fn create(&self, ctx: &OperationContext, _item: &Item) -> Outcome {
        self.started.notify_one();
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.cancelled_early
            .store(ctx.is_cancelled(), Ordering::SeqCst);
        self.finished.store(true, Ordering::SeqCst);
        Outcome::done()
    }
    async fn modify(&self, _ctx: &OperationContext, _previous: &Item, _item: &Item) -> Outcome {
        Outcome::done()
    }
    async fn delete(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
        Outcome::done()
    }
}

/// docs/agents.md §8: on shutdown `run` "lets the running ones finish and
/// waits for their results to be acknowledged for at most the drain
/// timeout ... then cancels what still runs". A shutdown that comes while
/// the agent is between sessions (the server restarting, say) cancels
/// the running operation at once and returns while it still runs: its
/// result, ready well within the drain timeout, is never sent.
#[tokio::test]
async fn a_shutdown_while_disconnected_still_drains_running_operations() {
    let mut harness = Harness::start().await;
    let started = Arc::new(Notify::new());
    let cancelled_early = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let agent = builder(&harness.address)
        .item_type(
            TypeSpec::new("file"),
            SlowAndWatched {
                started: Arc::clone(&started),
                cancelled_early: Arc::clone(&cancelled_early),
                finished: Arc::clone(&finished),
            },
        )
        .build()
        .expect("a valid agent");
    let mut running = Running::start(agent);
    let mut first = harness.next_connection().await;
    first.accept(HEARTBEAT, LEASE).await;
    first.send(request("op-d", 1, v1::OperationKind::Create, "a"));
    tokio::time::timeout(DEADLINE, started.notified())
        .await
        .expect("the operation started");

    // The server goes away and refuses the next connections for a while.
    for _ in 0..5 {
        harness.refuse_next(Status::unavailable("restarting"));
    }
    drop(first);
    running
        .wait_for(|event| matches!(event, AgentEvent::Disconnected { .. }).then_some(()))
        .await;

    // Shutdown while disconnected (drain timeout: 2 s).
    if let Some(stop) = running.stop.take() {
        let _ = stop.send(());
    }
    let mut second = harness.next_connection().await;
    second.accept(HEARTBEAT, LEASE).await;
    let result = second.next_result().await;
    assert_eq!(
        (result.op_id.as_str(), result.outcome()),
        ("op-d", v1::Outcome::Done)
    );
    second.send(ack("op-d", 1));
    running.finished().await.expect("a clean shutdown");
    assert!(finished.load(Ordering::SeqCst));
    assert!(
        !cancelled_early.load(Ordering::SeqCst),
        "the operation was cancelled before the drain timeout"
    );
}

/// Log lines written while a test runs, for a `tracing` subscriber.
#[derive(Clone, Default)]
struct CapturedLog(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLog {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }
}

#[tokio::test]
async fn a_type_declaring_read_without_implementing_it_is_named_once_in_the_agents_log() {
    let log = CapturedLog::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // A current-thread runtime: the agent's tasks log to this subscriber.
    let _default = tracing::subscriber::set_default(subscriber);
    let mut harness = Harness::start().await;
    let agent = builder(&harness.address)
        .item_type(
            TypeSpec::new("readless").supports_read(true),
            Counting::default(),
        )
        .build()
        .expect("a valid agent");
    let running = Running::start(agent);
    let mut connection = harness.next_connection().await;
    connection.accept(HEARTBEAT, LEASE).await;
    for (op_id, name) in [("read-1", "a"), ("read-2", "b")] {
        let ToAgent::Operation(mut read) = request(op_id, 1, v1::OperationKind::Read, name) else {
            unreachable!("request builds an operation");
        };
        if let Some(item) = read.item.as_mut() {
            item.r#type = "readless".into();
        }
        connection.send(ToAgent::Operation(read));
        let result = connection.next_result().await;
        assert_eq!(result.outcome(), v1::Outcome::Failed);
        let status = result.status.expect("a status");
        assert_eq!(status.code, Code::Unimplemented as i32);
        connection.send(ack(op_id, 1));
    }
    running.stop().await.expect("a clean shutdown");

    let text = log.text();
    let warnings = text
        .matches("does not implement Configurator::read")
        .count();
    assert_eq!(warnings, 1, "named once, not per READ: {text}");
    assert!(text.contains("readless"), "{text}");
}
