//! Real agents for black-box tests: a [`Recorder`] configurator that logs
//! every operation it receives, in order, and answers as scripted; a
//! [`RunningAgent`] that runs an SDK [`Agent`] in a task and waits for its
//! events; and a [`TestTenant`] that starts a server with a tenant and waits
//! on its status and graph. Every wait has a deadline ([`DEADLINE`]) and
//! panics with what it saw last; nothing here sleeps to synchronise.
//!
//! ```text
//! let tenant = TestTenant::start("acme").await;
//! let recorder = Recorder::new();
//! let mut agent = RunningAgent::start(
//!     tenant.agent("agent-1").item_type(TypeSpec::new("t"), recorder.clone()),
//! );
//! agent.connected().await;
//! tenant.submit(vec![item("t", "a", json!({}))]).await;
//! recorder.wait_for_operations(1).await;
//! ```

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use reconciled_client::agent::{
    Agent, AgentBuilder, AgentError, AgentEvent, Configurator, Grant, Item, ItemRef,
    OperationContext, OperationKind, Outcome,
};
use reconciled_proto::v1;
use serde_json::{Map, Value};
use tokio::sync::{Notify, broadcast, oneshot, watch};
use tokio::task::JoinHandle;
use tonic::Code;
use tonic::transport::Channel;

use crate::api::{self, Reconciler};
use crate::{ServerOptions, ServerProcess};

/// How long any wait in these helpers may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(15);

/// How often the server's status and graph are polled while waiting.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// One operation as the configurator received it.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    /// Create, Modify or Delete.
    pub kind: OperationKind,
    /// The item operated on.
    pub item: ItemRef,
    /// The item's properties: intended for Create/Modify, current for Delete.
    pub properties: Map<String, Value>,
    /// For a Modify, the applied properties it changes from.
    pub previous: Option<Map<String, Value>>,
    /// The operation id.
    pub op_id: String,
    /// The attempt number.
    pub attempt: u32,
}

impl Received {
    /// `"create t/a"`: the kind and the item, for order assertions.
    pub fn label(&self) -> String {
        format!("{} {}", self.kind, self.item)
    }

    /// The property `key` of the item operated on.
    pub fn property(&self, key: &str) -> Option<&Value> {
        self.properties.get(key)
    }
}

/// A latch a held operation waits on until the test opens it.
#[derive(Debug, Clone)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Default for Gate {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(false)))
    }
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens the gate: every operation held on it answers.
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    /// Completes once the gate is open.
    pub async fn opened(&self) {
        let mut receiver = self.0.subscribe();
        // The sender lives in `self`, so the channel cannot close.
        let _ = receiver.wait_for(|open| *open).await;
    }
}

/// What the [`Recorder`] does with one operation.
#[derive(Debug, Clone)]
pub enum Step {
    /// Answers `DONE` at once.
    Done,
    /// Answers `FAILED` with this code at once.
    Fail(Code),
    /// Answers `FAILED` with this code and message at once.
    FailWith(Code, String),
    /// Holds the operation open until the gate opens, then answers `DONE`
    /// (a cancellation meanwhile is recorded, and the operation still
    /// finishes: the result of a cancelled operation is authoritative).
    Hold(Gate),
    /// Answers `IN_PROGRESS` at once (`finish_later`), then `DONE` once the
    /// gate opens.
    LongRunning(Gate),
    /// Never answers (a cancellation is still recorded).
    Hang,
    /// Answers nothing until cancelled, then ends with `CANCELLED`, as a
    /// configurator that honours cancellation does.
    UntilCancelled,
}

#[derive(Debug, Default)]
struct Journal {
    received: Vec<Received>,
    cancelled: Vec<String>,
}

#[derive(Debug)]
struct Inner {
    journal: Mutex<Journal>,
    changed: Notify,
    scripts: Mutex<HashMap<(OperationKind, ItemRef), VecDeque<Step>>>,
    default: Step,
}

/// A configurator that logs every operation it receives, in order, and
/// answers each as scripted per (kind, item), falling back to a default
/// [`Step`]. Clones share the log and the scripts, so one recorder can serve
/// several item types, and the test keeps a clone to inspect it.
#[derive(Debug, Clone)]
pub struct Recorder {
    inner: Arc<Inner>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::answering(Step::Done)
    }
}

impl Recorder {
    /// A recorder that answers `DONE` unless scripted otherwise.
    pub fn new() -> Self {
        Self::default()
    }

    /// A recorder that answers every unscripted operation with `step`.
    pub fn answering(step: Step) -> Self {
        Self {
            inner: Arc::new(Inner {
                journal: Mutex::new(Journal::default()),
                changed: Notify::new(),
                scripts: Mutex::new(HashMap::new()),
                default: step,
            }),
        }
    }

    /// The next operations of `kind` on `item` follow `steps`, one step per
    /// operation, in order; afterwards the default applies again.
    pub fn script(
        &self,
        kind: OperationKind,
        item: ItemRef,
        steps: impl IntoIterator<Item = Step>,
    ) -> &Self {
        lock(&self.inner.scripts)
            .entry((kind, item))
            .or_default()
            .extend(steps);
        self
    }

    /// The next `times` operations of `kind` on `item` fail with `code`.
    pub fn fail_times(
        &self,
        kind: OperationKind,
        item: ItemRef,
        times: usize,
        code: Code,
    ) -> &Self {
        self.script(kind, item, std::iter::repeat_n(Step::Fail(code), times))
    }

    /// Every operation received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.inner.journal).received.clone()
    }

    /// The labels (`"create t/a"`) of every operation received so far.
    pub fn labels(&self) -> Vec<String> {
        self.received().iter().map(Received::label).collect()
    }

    /// The op ids whose `OperationContext::cancelled()` fired.
    pub fn cancelled(&self) -> Vec<String> {
        lock(&self.inner.journal).cancelled.clone()
    }

    /// Waits until at least `count` operations were received; returns them
    /// all.
    pub async fn wait_for_operations(&self, count: usize) -> Vec<Received> {
        self.wait_until(&format!("{count} operation(s)"), |received, _| {
            (received.len() >= count).then(|| received.to_vec())
        })
        .await
    }

    /// Waits until the cancellation of operation `op_id` reached its
    /// configurator.
    pub async fn wait_for_cancellation(&self, op_id: &str) {
        self.wait_until(&format!("the cancellation of {op_id}"), |_, cancelled| {
            cancelled.iter().any(|id| id == op_id).then_some(())
        })
        .await;
    }

    /// Waits until `check` over (received operations, cancelled op ids)
    /// returns something, for at most [`DEADLINE`].
    ///
    /// # Panics
    /// At the deadline, with `what` and everything received.
    pub async fn wait_until<T>(
        &self,
        what: &str,
        mut check: impl FnMut(&[Received], &[String]) -> Option<T>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            // Registered before checking, so a change between the check and
            // the wait still wakes it.
            let changed = self.inner.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            {
                let journal = lock(&self.inner.journal);
                if let Some(found) = check(&journal.received, &journal.cancelled) {
                    return found;
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!(
                    "the configurator did not see {what} within {DEADLINE:?}; it received {:#?} \
                     and saw cancellations of {:?}",
                    self.labels_with_attempts(),
                    self.cancelled()
                );
            }
        }
    }

    fn labels_with_attempts(&self) -> Vec<String> {
        self.received()
            .iter()
            .map(|r| format!("{} (op {} attempt {})", r.label(), r.op_id, r.attempt))
            .collect()
    }

    fn next_step(&self, kind: OperationKind, item: &ItemRef) -> Step {
        lock(&self.inner.scripts)
            .get_mut(&(kind, item.clone()))
            .and_then(VecDeque::pop_front)
            .unwrap_or_else(|| self.inner.default.clone())
    }

    fn record(&self, received: Received) {
        lock(&self.inner.journal).received.push(received);
        self.inner.changed.notify_waiters();
    }

    fn record_cancellation(&self, op_id: &str) {
        lock(&self.inner.journal).cancelled.push(op_id.to_owned());
        self.inner.changed.notify_waiters();
    }

    async fn operate(
        &self,
        ctx: &OperationContext,
        kind: OperationKind,
        previous: Option<&Item>,
        item: &Item,
    ) -> Outcome {
        let step = self.next_step(kind, &item.item_ref());
        self.record(Received {
            kind,
            item: item.item_ref(),
            properties: item.properties.clone(),
            previous: previous.map(|p| p.properties.clone()),
            op_id: ctx.op_id().to_owned(),
            attempt: ctx.attempt(),
        });
        match step {
            Step::Done => Outcome::done(),
            Step::Fail(code) => Outcome::failed(code, format!("scripted failure {code:?}")),
            Step::FailWith(code, message) => Outcome::failed(code, message),
            Step::Hold(gate) => {
                tokio::select! {
                    () = gate.opened() => {}
                    () = ctx.cancelled() => {
                        self.record_cancellation(ctx.op_id());
                        gate.opened().await;
                    }
                }
                Outcome::done()
            }
            Step::LongRunning(gate) => {
                let completion = ctx.finish_later();
                tokio::spawn(async move {
                    gate.opened().await;
                    completion.finish(Outcome::done());
                });
                Outcome::InProgress
            }
            Step::Hang => {
                ctx.cancelled().await;
                self.record_cancellation(ctx.op_id());
                std::future::pending().await
            }
            Step::UntilCancelled => {
                ctx.cancelled().await;
                self.record_cancellation(ctx.op_id());
                Outcome::failed(Code::Cancelled, "cancelled by the server")
            }
        }
    }
}

impl Configurator for Recorder {
    async fn create(&self, ctx: &OperationContext, item: &Item) -> Outcome {
        self.operate(ctx, OperationKind::Create, None, item).await
    }

    async fn modify(&self, ctx: &OperationContext, previous: &Item, item: &Item) -> Outcome {
        self.operate(ctx, OperationKind::Modify, Some(previous), item)
            .await
    }

    async fn delete(&self, ctx: &OperationContext, item: &Item) -> Outcome {
        self.operate(ctx, OperationKind::Delete, None, item).await
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An SDK [`Agent`] running in a task of its own, with its events.
#[derive(Debug)]
pub struct RunningAgent {
    events: broadcast::Receiver<AgentEvent>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), AgentError>>>,
}

impl RunningAgent {
    /// Builds the agent and runs it until [`stop`](Self::stop),
    /// [`kill`](Self::kill) or drop.
    ///
    /// # Panics
    /// If the builder's settings are invalid.
    pub fn start(builder: AgentBuilder) -> Self {
        let agent = builder.build().expect("the agent's settings are valid");
        Self::run(agent)
    }

    /// Runs a built agent (its events are subscribed before it starts).
    pub fn run(agent: Agent) -> Self {
        let events = agent.events();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(agent.run(async move {
            let _ = stopped.await;
        }));
        Self {
            events,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Waits for the next event `pick` accepts; earlier events are skipped.
    ///
    /// # Panics
    /// At the [`DEADLINE`], or if the agent's run loop ended.
    pub async fn wait_for_event<T>(
        &mut self,
        what: &str,
        mut pick: impl FnMut(&AgentEvent) -> Option<T>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let mut skipped = Vec::new();
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Err(_) => panic!(
                    "the agent did not report {what} within {DEADLINE:?}; it reported {skipped:#?}"
                ),
                Ok(Err(broadcast::error::RecvError::Lagged(missed))) => {
                    skipped.push(format!("({missed} events missed)"));
                }
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    panic!("the agent stopped before it reported {what}; it reported {skipped:#?}")
                }
                Ok(Ok(event)) => {
                    if let Some(found) = pick(&event) {
                        return found;
                    }
                    skipped.push(format!("{event:?}"));
                }
            }
        }
    }

    /// Waits until the agent is registered; returns the granted types.
    pub async fn connected(&mut self) -> Vec<Grant> {
        self.wait_for_event("a registration (Connected)", |event| match event {
            AgentEvent::Connected { granted, .. } => Some(granted.clone()),
            _ => None,
        })
        .await
    }

    /// Shuts the agent down gracefully (it closes its stream) and waits for
    /// `run` to return.
    ///
    /// # Panics
    /// If `run` does not return within the [`DEADLINE`] or panicked.
    pub async fn stop(mut self) -> Result<(), AgentError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task.take().expect("the agent runs until stopped");
        tokio::time::timeout(DEADLINE, task)
            .await
            .expect("the agent stops within the deadline")
            .expect("the agent's task did not panic")
    }

    /// Drops the agent's run loop at once, as if its process died: no
    /// result is sent, the stream just ends. Operations already handed to
    /// the configurator keep running but can no longer report.
    pub async fn kill(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A server with one tenant, and the calls the agent tests make on it.
#[derive(Debug)]
pub struct TestTenant {
    /// The server (killed on drop).
    pub server: ServerProcess,
    /// A channel to it.
    pub channel: Channel,
    /// The tenant's name.
    pub name: String,
    /// The tenant's token.
    pub token: String,
}

impl TestTenant {
    /// Starts a server with default options and creates tenant `name`.
    pub async fn start(name: &str) -> Self {
        Self::start_with(ServerOptions::default(), name).await
    }

    /// Starts a server with `options` and creates tenant `name`.
    ///
    /// # Panics
    /// If the server does not start or the tenant cannot be created.
    pub async fn start_with(options: ServerOptions, name: &str) -> Self {
        let server = ServerProcess::start(options)
            .await
            .expect("the server starts");
        let channel = server.channel().await.expect("connects to the server");
        let token = api::create_tenant(&channel, &server.admin_token(), name).await;
        Self {
            server,
            channel,
            name: name.to_owned(),
            token,
        }
    }

    /// Starts a server with default options and creates tenant `name` with
    /// `limits`.
    ///
    /// # Panics
    /// If the server does not start or the tenant cannot be created.
    pub async fn start_with_limits(name: &str, limits: v1::TenantLimits) -> Self {
        let server = ServerProcess::start(ServerOptions::default())
            .await
            .expect("the server starts");
        let channel = server.channel().await.expect("connects to the server");
        let token = api::tenants(&channel, &server.admin_token())
            .create_tenant(v1::CreateTenantRequest {
                name: name.to_owned(),
                limits: Some(limits),
            })
            .await
            .expect("creates the tenant")
            .into_inner()
            .token;
        Self {
            server,
            channel,
            name: name.to_owned(),
            token,
        }
    }

    /// An agent builder for this tenant with id `agent_id` and quick
    /// reconnects (50 ms doubling to 250 ms).
    pub fn agent(&self, agent_id: &str) -> AgentBuilder {
        Agent::builder(self.server.endpoint(), &self.name, &self.token)
            .agent_id(agent_id)
            .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(250))
    }

    /// A Reconciler client with the tenant's token.
    pub fn reconciler(&self) -> Reconciler {
        api::reconciler(&self.channel, &self.token)
    }

    /// Submits `items` as the tenant's whole intent.
    ///
    /// # Panics
    /// If the server refuses it.
    pub async fn submit(&self, items: Vec<v1::Item>) -> v1::SubmitIntentResponse {
        self.reconciler()
            .submit_intent(api::submit(&self.name, items))
            .await
            .unwrap_or_else(|status| panic!("SubmitIntent refused: {status:?}"))
            .into_inner()
    }

    /// Reports `reports` about external items with ReportExternal.
    ///
    /// # Panics
    /// If the server refuses them.
    pub async fn report_external(&self, reports: Vec<v1::ExternalReport>) {
        self.reconciler()
            .report_external(v1::ReportExternalRequest {
                tenant: self.name.clone(),
                reports,
            })
            .await
            .unwrap_or_else(|status| panic!("ReportExternal refused: {status:?}"));
    }

    /// The tenant's status.
    ///
    /// # Panics
    /// If GetStatus fails.
    pub async fn status(&self) -> v1::TenantStatus {
        self.reconciler()
            .get_status(v1::GetStatusRequest {
                tenant: self.name.clone(),
            })
            .await
            .unwrap_or_else(|status| panic!("GetStatus failed: {status:?}"))
            .into_inner()
            .status
            .expect("GetStatus returns a status")
    }

    /// The current graph (every item's status).
    ///
    /// # Panics
    /// If GetGraph fails.
    pub async fn current(&self) -> Vec<v1::ItemStatus> {
        self.reconciler()
            .get_graph(v1::GetGraphRequest {
                tenant: self.name.clone(),
                view: v1::GraphView::Current.into(),
                ..v1::GetGraphRequest::default()
            })
            .await
            .unwrap_or_else(|status| panic!("GetGraph failed: {status:?}"))
            .into_inner()
            .current
    }

    /// The current status of `item_type/name`, if the item is in the
    /// current graph.
    pub async fn item(&self, item_type: &str, name: &str) -> Option<v1::ItemStatus> {
        self.current()
            .await
            .into_iter()
            .find(|status| is_item(status, item_type, name))
    }

    /// Polls the tenant's status until `check` accepts it.
    ///
    /// # Panics
    /// At the [`DEADLINE`], with `what` and the last status.
    pub async fn wait_for_status(
        &self,
        what: &str,
        mut check: impl FnMut(&v1::TenantStatus) -> bool,
    ) -> v1::TenantStatus {
        poll(what, || self.status(), |status| check(status)).await
    }

    /// Polls the current graph until `check` accepts the status of
    /// `item_type/name`.
    ///
    /// # Panics
    /// At the [`DEADLINE`], with `what` and the last current graph.
    pub async fn wait_for_item(
        &self,
        item_type: &str,
        name: &str,
        what: &str,
        mut check: impl FnMut(&v1::ItemStatus) -> bool,
    ) -> v1::ItemStatus {
        let graph = poll(
            &format!("{item_type}/{name} {what}"),
            || self.current(),
            |current| {
                current
                    .iter()
                    .any(|status| is_item(status, item_type, name) && check(status))
            },
        )
        .await;
        graph
            .into_iter()
            .find(|status| is_item(status, item_type, name))
            .expect("the accepted graph holds the item")
    }

    /// Waits until `item_type/name` is in `state`.
    pub async fn wait_for_state(
        &self,
        item_type: &str,
        name: &str,
        state: v1::ItemState,
    ) -> v1::ItemStatus {
        self.wait_for_item(item_type, name, &format!("in {state:?}"), |status| {
            status.state == state as i32
        })
        .await
    }

    /// Waits until the tenant is quiescent (nothing in flight, nothing
    /// ready, no backoff) and Ready.
    pub async fn wait_until_ready(&self) -> v1::TenantStatus {
        self.wait_for_status("Ready", |status| {
            condition_holds(status, "Ready") && !condition_holds(status, "Reconciling")
        })
        .await
    }

    /// Waits until the tenant is quiescent: its Reconciling condition is
    /// False and nothing is in flight.
    pub async fn wait_until_quiescent(&self) -> v1::TenantStatus {
        self.wait_for_status("quiescent (Reconciling False)", |status| {
            condition(status, "Reconciling")
                .is_some_and(|c| c.status == v1::ConditionStatus::False as i32)
                && status.operations_in_flight == 0
        })
        .await
    }
}

/// Calls `fetch` until `accept` takes its answer, every [`POLL_INTERVAL`],
/// for at most [`DEADLINE`]: for what the server shows only when asked
/// again (a status, a graph, a fleet snapshot).
///
/// # Panics
/// At the deadline, with `what` and the last answer.
pub async fn poll<T, F, Fut>(what: &str, mut fetch: F, mut accept: impl FnMut(&T) -> bool) -> T
where
    T: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let value = fetch().await;
        if accept(&value) {
            return value;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("the server did not show {what} within {DEADLINE:?}; last answer: {value:#?}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

fn is_item(status: &v1::ItemStatus, item_type: &str, name: &str) -> bool {
    status
        .r#ref
        .as_ref()
        .is_some_and(|r| r.r#type == item_type && r.name == name)
}

/// The condition `kind` ("Ready", "Reconciling", "Stalled") of a status.
pub fn condition<'a>(status: &'a v1::TenantStatus, kind: &str) -> Option<&'a v1::Condition> {
    status.conditions.iter().find(|c| c.r#type == kind)
}

/// Whether condition `kind` is True.
pub fn condition_holds(status: &v1::TenantStatus, kind: &str) -> bool {
    condition(status, kind).is_some_and(|c| c.status == v1::ConditionStatus::True as i32)
}

/// An item `item_type/name` with `properties` that depends on each item of
/// `requires` (each `type/name`).
///
/// # Panics
/// If a reference lacks the `/`.
pub fn item_needing(item_type: &str, name: &str, properties: Value, requires: &[&str]) -> v1::Item {
    let mut item = api::item(item_type, name, properties);
    for reference in requires {
        let (required_type, required_name) = reference
            .split_once('/')
            .unwrap_or_else(|| panic!("{reference:?} is not type/name"));
        item.dependencies
            .push(api::dependency(required_type, required_name));
    }
    item
}

/// An `ExternalReport` that external item `item_type/name` exists.
pub fn external_put(item_type: &str, name: &str, properties: Value) -> v1::ExternalReport {
    let mut item = api::item(item_type, name, properties);
    item.external = true;
    v1::ExternalReport {
        change: Some(v1::external_report::Change::Put(item)),
        modified: false,
    }
}
