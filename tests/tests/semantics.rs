//! The planning semantics of DESIGN section 3 and the op-id contract of
//! section 4, one behaviour per test, end to end: the real binary, a real
//! SDK agent whose [`Recorder`] logs every operation in the order it
//! arrives, and the tenant's graph and conditions afterwards.
//!
//! Each test asserts the exact sequence of operations the agent received.
//! Where the contract lets operations run in parallel (they share no
//! dependency path), the expected sequence is written as phases: the
//! operations of one phase may arrive in any order, phases arrive in order.
//!
//! Item names are chosen so that the expected order is not simply the order
//! by identity (the order the planner gives independent operations).
//!
//! Whether an operation waited for another is checked on the server's side:
//! while a long-running operation runs (after the server acknowledged its
//! `IN_PROGRESS`), GetGraph must show the items that wait for it with no
//! operation in flight. Answers the [`Recorder`] cannot give (`WAIT`,
//! observed properties, a NEEDS_RECREATE answer) come from [`Scripted`],
//! which records through a recorder too.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reconciled_client::agent::{
    AgentEvent, Configurator, Item, ItemRef, OperationContext, OperationKind, Outcome, TypeSpec,
};
use reconciled_tests::agents::{
    DEADLINE, Gate, Recorder, RunningAgent, Step, TestTenant, condition, condition_holds,
    external_put,
};
use reconciled_tests::api;
use reconciled_tests::proto::v1;
use serde_json::{Map, Value, json};
use tonic::Code;

// ---------------------------------------------------------------------------
// Items
// ---------------------------------------------------------------------------

/// Splits `type/name`.
fn split(reference: &str) -> (&str, &str) {
    reference
        .split_once('/')
        .unwrap_or_else(|| panic!("{reference:?} is not type/name"))
}

/// The SDK identity of `type/name`.
fn r(reference: &str) -> ItemRef {
    let (item_type, name) = split(reference);
    ItemRef::new(item_type, name)
}

/// Item `type/name` with `properties` and `dependencies`.
fn item(reference: &str, properties: Value, dependencies: Vec<v1::Dependency>) -> v1::Item {
    let (item_type, name) = split(reference);
    let mut item = api::item(item_type, name, properties);
    item.dependencies = dependencies;
    item
}

/// Item `type/name` with `properties` and no dependencies.
fn plain(reference: &str, properties: Value) -> v1::Item {
    item(reference, properties, Vec::new())
}

/// External item `type/name` as listed in an intent.
fn external(reference: &str) -> v1::Item {
    let mut item = plain(reference, json!({}));
    item.external = true;
    item
}

/// A plain dependency on `type/name`.
fn on(reference: &str) -> v1::Dependency {
    let (item_type, name) = split(reference);
    api::dependency(item_type, name)
}

/// `dependency` with `recreate_when_modified`.
fn recreating(mut dependency: v1::Dependency) -> v1::Dependency {
    dependency.recreate_when_modified = true;
    dependency
}

/// `dependency` with `auto_deleted_by_external`.
fn auto_deleted(mut dependency: v1::Dependency) -> v1::Dependency {
    dependency.auto_deleted_by_external = true;
    dependency
}

/// `dependency` with the predicate `must_satisfy`.
fn satisfying(mut dependency: v1::Dependency, must_satisfy: &str) -> v1::Dependency {
    dependency.must_satisfy = must_satisfy.into();
    dependency
}

/// A report that external item `type/name` exists with `properties`,
/// marked modified or not.
fn external_report(reference: &str, properties: Value, modified: bool) -> v1::ExternalReport {
    let (item_type, name) = split(reference);
    let mut report = external_put(item_type, name, properties);
    report.modified = modified;
    report
}

/// A report that external item `type/name` is gone.
fn external_gone(reference: &str) -> v1::ExternalReport {
    let (item_type, name) = split(reference);
    v1::ExternalReport {
        change: Some(v1::external_report::Change::Delete(v1::ItemRef {
            r#type: item_type.into(),
            name: name.into(),
        })),
        modified: false,
    }
}

/// The `type/name` of a status.
fn reference_of(status: &v1::ItemStatus) -> String {
    status
        .r#ref
        .as_ref()
        .map(|r| format!("{}/{}", r.r#type, r.name))
        .unwrap_or_default()
}

/// The applied properties of a current item, as JSON.
fn applied_properties(status: &v1::ItemStatus) -> Map<String, Value> {
    status
        .applied
        .as_ref()
        .and_then(|item| item.properties.clone())
        .map(reconciled_tests::proto::json::properties_from_struct)
        .unwrap_or_default()
}

/// The `type/name` each applied dependency of a current item requires.
fn applied_requires(status: &v1::ItemStatus) -> Vec<String> {
    status
        .applied
        .as_ref()
        .map(|item| {
            item.dependencies
                .iter()
                .filter_map(|d| d.requires.as_ref())
                .map(|r| format!("{}/{}", r.r#type, r.name))
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// Agents
// ---------------------------------------------------------------------------

/// A type spec whose failed operations are retried after 100 ms.
fn spec(item_type: &str) -> TypeSpec {
    TypeSpec::new(item_type).retry_static(Duration::from_millis(100))
}

/// Registers one agent (`agent-1`) for every spec, each served by a clone of
/// `configurator`, and waits until it is connected.
async fn connect_agent<C: Configurator + Clone>(
    tenant: &TestTenant,
    specs: Vec<TypeSpec>,
    configurator: &C,
) -> RunningAgent {
    let mut builder = tenant.agent("agent-1");
    for spec in specs {
        builder = builder.item_type(spec, configurator.clone());
    }
    let mut agent = RunningAgent::start(builder);
    agent.connected().await;
    agent
}

/// A tenant with one agent handling `specs` with `recorder`.
async fn start(specs: Vec<TypeSpec>, recorder: &Recorder) -> (TestTenant, RunningAgent) {
    let tenant = TestTenant::start("acme").await;
    let agent = connect_agent(&tenant, specs, recorder).await;
    (tenant, agent)
}

/// A tenant with one agent handling types `types` (quick retries) with
/// `recorder`.
async fn start_types(types: &[&str], recorder: &Recorder) -> (TestTenant, RunningAgent) {
    start(types.iter().map(|t| spec(t)).collect(), recorder).await
}

/// A configurator that records through a [`Recorder`] and then changes the
/// answer: the first `waits` operations answer `WAIT`, a `DONE` carries
/// `observed` properties, and `needs_recreate` says yes when the property
/// `size` shrinks.
#[derive(Debug)]
struct Scripted {
    recorder: Recorder,
    waits: AtomicUsize,
    retry_after: Duration,
    observed: Option<Map<String, Value>>,
}

impl Scripted {
    fn new(recorder: &Recorder) -> Self {
        Self {
            recorder: recorder.clone(),
            waits: AtomicUsize::new(0),
            retry_after: Duration::from_millis(200),
            observed: None,
        }
    }

    fn answer(&self, outcome: Outcome) -> Outcome {
        let waited = self
            .waits
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if waited {
            return Outcome::wait(self.retry_after);
        }
        match (outcome, &self.observed) {
            (Outcome::Done { .. }, Some(observed)) => Outcome::done_observed(observed.clone()),
            (outcome, _) => outcome,
        }
    }
}

impl Configurator for Scripted {
    async fn create(&self, ctx: &OperationContext, item: &Item) -> Outcome {
        let outcome = Configurator::create(&self.recorder, ctx, item).await;
        self.answer(outcome)
    }

    async fn modify(&self, ctx: &OperationContext, previous: &Item, item: &Item) -> Outcome {
        let outcome = Configurator::modify(&self.recorder, ctx, previous, item).await;
        self.answer(outcome)
    }

    async fn delete(&self, ctx: &OperationContext, item: &Item) -> Outcome {
        let outcome = Configurator::delete(&self.recorder, ctx, item).await;
        self.answer(outcome)
    }

    fn needs_recreate(&self, previous: &Item, item: &Item) -> bool {
        let size = |item: &Item| item.property("size").and_then(Value::as_i64);
        size(item) < size(previous)
    }
}

// ---------------------------------------------------------------------------
// Waiting and asserting
// ---------------------------------------------------------------------------

/// Whether the tenant is quiescent: Reconciling False, nothing in flight.
fn quiescent(status: &v1::TenantStatus) -> bool {
    condition(status, "Reconciling").is_some_and(|c| c.status == v1::ConditionStatus::False as i32)
        && status.operations_in_flight == 0
}

/// How often [`wait_status`] polls.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Polls the tenant's status until `check` accepts it, for at most
/// [`DEADLINE`].
///
/// # Panics
/// At the deadline, with `what`, every operation the agent received, the
/// last status and the current graph.
async fn wait_status(
    tenant: &TestTenant,
    recorder: &Recorder,
    what: &str,
    mut check: impl FnMut(&v1::TenantStatus) -> bool,
) -> v1::TenantStatus {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let status = tenant.status().await;
        if check(&status) {
            return status;
        }
        if tokio::time::Instant::now() >= deadline {
            let received: Vec<String> = recorder
                .received()
                .iter()
                .map(|r| format!("{} (op {} attempt {})", r.label(), r.op_id, r.attempt))
                .collect();
            panic!(
                "the server did not show {what} within {DEADLINE:?}; the agent received \
                 {received:#?}; last status: {status:#?}; current graph: {:#?}",
                tenant.current().await
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Waits until the tenant is quiescent at `generation` (or newer).
async fn settled(tenant: &TestTenant, recorder: &Recorder, generation: u64) -> v1::TenantStatus {
    wait_status(
        tenant,
        recorder,
        &format!("quiescent at generation {generation}"),
        |s| s.observed_generation >= generation && quiescent(s),
    )
    .await
}

/// Waits until the tenant is quiescent and Ready at `generation` (or newer).
async fn ready(tenant: &TestTenant, recorder: &Recorder, generation: u64) -> v1::TenantStatus {
    wait_status(
        tenant,
        recorder,
        &format!("Ready and quiescent at generation {generation}"),
        |s| s.observed_generation >= generation && quiescent(s) && condition_holds(s, "Ready"),
    )
    .await
}

/// Waits until the tenant is Stalled.
async fn stalled(tenant: &TestTenant, recorder: &Recorder) -> v1::TenantStatus {
    wait_status(tenant, recorder, "Stalled", |s| {
        condition_holds(s, "Stalled")
    })
    .await
}

/// Submits `items` as the whole intent; returns the new generation.
async fn submit(tenant: &TestTenant, items: Vec<v1::Item>) -> u64 {
    tenant.submit(items).await.generation
}

/// Asserts that a quiescent tenant is neither Ready nor Stalled and has
/// nothing in flight: it waits.
#[track_caller]
fn assert_not_ready(status: &v1::TenantStatus) {
    assert!(!condition_holds(status, "Ready"), "not Ready: {status:#?}");
    assert!(
        !condition_holds(status, "Stalled"),
        "waiting for a dependency is not a stall: {status:#?}"
    );
    assert!(!condition_holds(status, "Reconciling"), "{status:#?}");
    assert_eq!(status.operations_in_flight, 0, "{status:#?}");
}

/// Asserts that a quiescent tenant waits for dependencies: not Ready, not
/// Stalled, Ready's reason `WaitingForDependencies`.
#[track_caller]
fn assert_waiting_for_dependencies(status: &v1::TenantStatus) {
    assert_not_ready(status);
    let reason = condition(status, "Ready").map(|c| c.reason.as_str());
    assert_eq!(
        reason,
        Some("WaitingForDependencies"),
        "DESIGN section 5: a quiescent tenant that is not Ready carries its items' waiting \
         reason, in CamelCase: {status:#?}"
    );
}

/// Asserts that the tenant is Stalled with reason `TerminalFailure` and not
/// Reconciling.
#[track_caller]
fn assert_stalled(status: &v1::TenantStatus) {
    let stalled = condition(status, "Stalled").expect("a Stalled condition");
    assert_eq!(
        stalled.status,
        v1::ConditionStatus::True as i32,
        "{status:#?}"
    );
    assert_eq!(stalled.reason, "TerminalFailure", "{status:#?}");
    assert!(
        !condition_holds(status, "Reconciling"),
        "Stalled and Reconciling never hold together: {status:#?}"
    );
    assert!(!condition_holds(status, "Ready"), "{status:#?}");
}

/// Asserts the operations received as phases: each phase's labels in any
/// order, the phases in order, nothing else.
#[track_caller]
fn assert_phases(labels: &[String], phases: &[&[&str]]) {
    let mut at = 0;
    for (index, phase) in phases.iter().enumerate() {
        let end = at + phase.len();
        assert!(
            end <= labels.len(),
            "expected phases {phases:?}; the agent received only {labels:#?}"
        );
        let mut got: Vec<&str> = labels[at..end].iter().map(String::as_str).collect();
        got.sort_unstable();
        let mut want = phase.to_vec();
        want.sort_unstable();
        assert_eq!(
            got, want,
            "phase {index} differs: expected phases {phases:?}; the agent received {labels:#?}"
        );
        at = end;
    }
    assert_eq!(
        at,
        labels.len(),
        "operations beyond the expected phases {phases:?}; the agent received {labels:#?}"
    );
}

/// The current status of `type/name`.
///
/// # Panics
/// If the item is not in the current graph.
async fn current(tenant: &TestTenant, reference: &str) -> v1::ItemStatus {
    let graph = tenant.current().await;
    graph
        .iter()
        .find(|s| reference_of(s) == reference)
        .cloned()
        .unwrap_or_else(|| panic!("{reference} is not in the current graph: {graph:#?}"))
}

/// Asserts `type/name` is current in `state`.
async fn assert_state(tenant: &TestTenant, reference: &str, state: v1::ItemState) {
    let status = current(tenant, reference).await;
    assert_eq!(
        status.state, state as i32,
        "{reference} should be {state:?}: {status:#?}"
    );
}

/// Asserts `type/name` is not in the current graph.
async fn assert_absent(tenant: &TestTenant, reference: &str) {
    let graph = tenant.current().await;
    assert!(
        !graph.iter().any(|s| reference_of(s) == reference),
        "{reference} should be gone from the current graph: {graph:#?}"
    );
}

/// Asserts `type/name` is intended but does not exist: PENDING, no applied
/// value, nothing in flight, waiting to be created because of a dependency
/// on `blocked_by`.
async fn assert_pending_on(tenant: &TestTenant, reference: &str, blocked_by: &str) {
    check_pending_on(&current(tenant, reference).await, blocked_by);
}

/// [`assert_pending_on`] for a status taken earlier.
#[track_caller]
fn check_pending_on(status: &v1::ItemStatus, blocked_by: &str) {
    let reference = reference_of(status);
    assert_eq!(
        status.state,
        v1::ItemState::Pending as i32,
        "{reference} should be PENDING: {status:#?}"
    );
    assert_eq!(
        status.applied, None,
        "{reference} does not exist: {status:#?}"
    );
    assert_eq!(status.operation, None, "nothing in flight: {status:#?}");
    assert_eq!(
        status.pending_operation,
        v1::OperationKind::Create as i32,
        "{reference} waits to be created (DESIGN section 2: an item that needs an operation \
         it cannot get yet carries pending_operation and reason): {status:#?}"
    );
    assert_eq!(
        status.reason,
        v1::WaitReason::Dependency as i32,
        "{reference} waits on a dependency: {status:#?}"
    );
    assert!(
        status.blocked_by.iter().any(|b| b
            .item
            .as_ref()
            .is_some_and(|i| format!("{}/{}", i.r#type, i.name) == blocked_by)),
        "{reference} should be blocked by {blocked_by}: {status:#?}"
    );
}

/// Waits until `type/name` needs `operation` and waits for it.
async fn wait_pending_operation(
    tenant: &TestTenant,
    reference: &str,
    operation: v1::OperationKind,
) -> v1::ItemStatus {
    let (item_type, name) = split(reference);
    tenant
        .wait_for_item(
            item_type,
            name,
            &format!("waiting for its {operation:?}"),
            |s| s.pending_operation == operation as i32,
        )
        .await
}

/// Waits until the server acknowledged a result of operation `op_id`.
async fn wait_for_ack(agent: &mut RunningAgent, op_id: &str) {
    agent
        .wait_for_event(&format!("an acknowledged result of {op_id}"), |event| {
            matches!(event, AgentEvent::ResultAcked { op_id: acked, .. } if acked == op_id)
                .then_some(())
        })
        .await;
}

/// Waits until the recorder has received the operation `label`; returns it.
async fn wait_for_label(recorder: &Recorder, label: &str) -> reconciled_tests::agents::Received {
    recorder
        .wait_until(label, |received, _| {
            received.iter().find(|r| r.label() == label).cloned()
        })
        .await
}

// ---------------------------------------------------------------------------
// Rule 1 and 2: creates go dependencies first, deletes dependents first
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_chain_across_types_is_created_bottom_up_and_removed_top_down() {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t", "u"], &recorder).await;
    let chain = vec![
        item("t/top", json!({}), vec![on("u/upper")]),
        item("u/upper", json!({}), vec![on("t/lower")]),
        item("t/lower", json!({}), vec![on("u/base")]),
        plain("u/base", json!({})),
    ];

    let generation = submit(&tenant, chain).await;
    recorder.wait_for_operations(4).await;
    let status = ready(&tenant, &recorder, generation).await;
    assert_eq!(
        status.items_by_state.get("CREATED"),
        Some(&4),
        "{status:#?}"
    );

    let generation = submit(&tenant, Vec::new()).await;
    recorder.wait_for_operations(8).await;
    let status = ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels(),
        [
            "create u/base",
            "create t/lower",
            "create u/upper",
            "create t/top",
            "delete t/top",
            "delete u/upper",
            "delete t/lower",
            "delete u/base"
        ]
    );
    assert!(status.items_by_state.is_empty(), "{status:#?}");
    assert!(tenant.current().await.is_empty());
}

// ---------------------------------------------------------------------------
// Rule 3 and 4: recreates
// ---------------------------------------------------------------------------

#[tokio::test]
async fn changing_a_recreate_property_at_the_bottom_of_a_chain_recreates_the_whole_chain_around_it()
{
    let recorder = Recorder::new();
    let (tenant, _agent) = start(vec![spec("t").recreate_on_change(["/id"])], &recorder).await;
    let intent = |id: u32| {
        vec![
            item("t/top", json!({"v": "x"}), vec![on("t/middle")]),
            item("t/middle", json!({"v": "x"}), vec![on("t/bottom")]),
            plain("t/bottom", json!({"id": id})),
        ]
    };
    let generation = submit(&tenant, intent(1)).await;
    recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, intent(2)).await;
    let received = recorder.wait_for_operations(9).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels()[3..],
        [
            "delete t/top",
            "delete t/middle",
            "delete t/bottom",
            "create t/bottom",
            "create t/middle",
            "create t/top"
        ],
        "the middle items are still intended and unchanged, yet recreated around the bottom"
    );
    assert_eq!(
        received[5].property("id"),
        Some(&json!(1)),
        "deletes the old"
    );
    assert_eq!(
        received[6].property("id"),
        Some(&json!(2)),
        "creates the new"
    );
    for name in ["t/top", "t/middle", "t/bottom"] {
        assert_state(&tenant, name, v1::ItemState::Created).await;
    }
}

#[tokio::test]
async fn a_type_that_cannot_be_modified_in_place_is_recreated_for_any_change() {
    let recorder = Recorder::new();
    let (tenant, _agent) = start(vec![spec("t").recreate_on_change(["*"])], &recorder).await;
    let generation = submit(&tenant, vec![plain("t/a", json!({"note": "one"}))]).await;
    recorder.wait_for_operations(1).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, vec![plain("t/a", json!({"note": "two"}))]).await;
    recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels(),
        ["create t/a", "delete t/a", "create t/a"]
    );
    let a = current(&tenant, "t/a").await;
    assert_eq!(applied_properties(&a).get("note"), Some(&json!("two")));
}

#[tokio::test]
async fn the_agents_needs_recreate_answer_decides_between_a_modify_and_a_recreate() {
    let recorder = Recorder::new();
    let configurator = Arc::new(Scripted::new(&recorder));
    let tenant = TestTenant::start("acme").await;
    let _agent = connect_agent(
        &tenant,
        vec![spec("t").ask_needs_recreate(true)],
        &configurator,
    )
    .await;
    let intent = |size: u32| {
        vec![
            plain("t/disk", json!({"size": size})),
            item("t/app", json!({}), vec![on("t/disk")]),
        ]
    };
    let generation = submit(&tenant, intent(10)).await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    // Growing: the agent says no, so the disk is modified in place.
    let generation = submit(&tenant, intent(20)).await;
    recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;

    // Shrinking: the agent says yes, so the disk and its dependent are
    // recreated around it.
    let generation = submit(&tenant, intent(5)).await;
    recorder.wait_for_operations(7).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels(),
        [
            "create t/disk",
            "create t/app",
            "modify t/disk",
            "delete t/app",
            "delete t/disk",
            "create t/disk",
            "create t/app"
        ]
    );
}

#[tokio::test]
async fn a_dependent_with_recreate_when_modified_is_created_and_the_tenant_becomes_ready() {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t1", "t2"], &recorder).await;

    let generation = submit(
        &tenant,
        vec![
            plain("t2/c", json!({"v": "1"})),
            item("t1/a", json!({}), vec![recreating(on("t2/c"))]),
        ],
    )
    .await;

    recorder.wait_for_operations(2).await;
    let status = ready(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels(), ["create t2/c", "create t1/a"]);
    assert_state(&tenant, "t1/a", v1::ItemState::Created).await;
    assert_state(&tenant, "t2/c", v1::ItemState::Created).await;
    assert_eq!(
        status.items_by_state.get("CREATED"),
        Some(&2),
        "{status:#?}"
    );
}

#[tokio::test]
async fn a_dependent_with_recreate_when_modified_added_after_its_dependency_was_modified_is_created_once()
 {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t1", "t2"], &recorder).await;
    let generation = submit(&tenant, vec![plain("t2/c", json!({"v": "1"}))]).await;
    recorder.wait_for_operations(1).await;
    ready(&tenant, &recorder, generation).await;
    let generation = submit(&tenant, vec![plain("t2/c", json!({"v": "2"}))]).await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(
        &tenant,
        vec![
            plain("t2/c", json!({"v": "2"})),
            item("t1/a", json!({}), vec![recreating(on("t2/c"))]),
        ],
    )
    .await;
    recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels(),
        ["create t2/c", "modify t2/c", "create t1/a"],
        "a is created against c as c is now: nothing to recreate"
    );
    assert_state(&tenant, "t1/a", v1::ItemState::Created).await;
}

#[tokio::test]
async fn a_dependent_with_recreate_when_modified_on_a_reported_external_item_is_created_and_the_tenant_becomes_ready()
 {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t1"], &recorder).await;
    let generation = submit(
        &tenant,
        vec![
            external("link/e"),
            item("t1/a", json!({}), vec![recreating(on("link/e"))]),
        ],
    )
    .await;
    wait_pending_operation(&tenant, "t1/a", v1::OperationKind::Create).await;

    tenant
        .report_external(vec![external_report("link/e", json!({"up": true}), false)])
        .await;

    recorder.wait_for_operations(1).await;
    tenant
        .wait_for_state("t1", "a", v1::ItemState::Created)
        .await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels(), ["create t1/a"]);
}

#[tokio::test]
async fn a_dependent_with_recreate_when_modified_on_an_external_item_already_reported_modified_is_created_once()
 {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t1"], &recorder).await;
    tenant
        .report_external(vec![external_report("link/e", json!({"v": 1}), false)])
        .await;
    tenant
        .report_external(vec![external_report("link/e", json!({"v": 2}), true)])
        .await;

    let generation = submit(
        &tenant,
        vec![
            external("link/e"),
            item("t1/a", json!({}), vec![recreating(on("link/e"))]),
        ],
    )
    .await;
    recorder.wait_for_operations(1).await;
    tenant
        .wait_for_state("t1", "a", v1::ItemState::Created)
        .await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels(), ["create t1/a"]);
}

#[tokio::test]
async fn modifying_an_item_recreates_its_recreate_when_modified_dependents_around_the_modify() {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t1", "t2"], &recorder).await;
    let intent = |v: &str| {
        vec![
            plain("t2/c", json!({"v": v})),
            item("t1/a", json!({}), vec![recreating(on("t2/c"))]),
            item("t1/b", json!({}), vec![on("t2/c")]),
        ]
    };
    let generation = submit(&tenant, intent("1")).await;
    recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, intent("2")).await;
    recorder.wait_for_operations(6).await;
    ready(&tenant, &recorder, generation).await;
    assert_phases(
        &recorder.labels(),
        &[
            &["create t2/c"],
            &["create t1/a", "create t1/b"],
            &["delete t1/a"],
            &["modify t2/c"],
            &["create t1/a"],
        ],
    );
    let c = current(&tenant, "t2/c").await;
    assert_eq!(c.modifications, 1, "a completed Modify counts: {c:#?}");
    assert_state(&tenant, "t1/a", v1::ItemState::Created).await;
    assert_state(&tenant, "t1/b", v1::ItemState::Created).await;
}

#[tokio::test]
async fn a_modify_waits_for_the_running_delete_of_the_dependent_it_recreates() {
    let recorder = Recorder::new();
    let gate = Gate::new();
    recorder.script(
        OperationKind::Delete,
        r("t1/a"),
        [Step::LongRunning(gate.clone())],
    );
    let (tenant, mut agent) = start_types(&["t1", "t2"], &recorder).await;
    let intent = |v: &str| {
        vec![
            plain("t2/c", json!({"v": v})),
            item("t1/a", json!({}), vec![recreating(on("t2/c"))]),
        ]
    };
    let generation = submit(&tenant, intent("1")).await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, intent("2")).await;
    let delete = wait_for_label(&recorder, "delete t1/a").await;
    wait_for_ack(&mut agent, &delete.op_id).await;
    let c = current(&tenant, "t2/c").await;
    assert_eq!(
        (c.state, c.operation.as_ref()),
        (v1::ItemState::Created as i32, None),
        "c is not modified while the delete of its dependent runs: {c:#?}"
    );
    assert_eq!(recorder.labels()[2..], ["delete t1/a"]);

    gate.open();
    recorder.wait_for_operations(5).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels()[2..],
        ["delete t1/a", "modify t2/c", "create t1/a"]
    );
}

#[tokio::test]
async fn an_external_item_reported_modified_recreates_only_its_recreate_when_modified_dependents() {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let generation = submit(
        &tenant,
        vec![
            external("link/e"),
            item("t/a", json!({}), vec![recreating(on("link/e"))]),
            item("t/b", json!({}), vec![on("link/e")]),
        ],
    )
    .await;
    tenant
        .report_external(vec![external_report("link/e", json!({"v": 1}), false)])
        .await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    // New content not marked modified: nothing to recreate.
    tenant
        .report_external(vec![external_report("link/e", json!({"v": 2}), false)])
        .await;
    // Marked modified: a is recreated, b is left alone.
    tenant
        .report_external(vec![external_report("link/e", json!({"v": 3}), true)])
        .await;

    recorder.wait_for_operations(4).await;
    tenant
        .wait_for_item("t", "a", "recreated", |s| {
            s.state == v1::ItemState::Created as i32 && s.operation.is_none()
        })
        .await;
    ready(&tenant, &recorder, generation).await;
    assert_phases(
        &recorder.labels(),
        &[
            &["create t/a", "create t/b"],
            &["delete t/a"],
            &["create t/a"],
        ],
    );
    let e = current(&tenant, "link/e").await;
    assert_eq!(e.modifications, 1, "one report marked it modified: {e:#?}");
    assert!(e.external, "{e:#?}");
}

// ---------------------------------------------------------------------------
// Rule 5: a modify whose new dependencies are unsatisfied becomes a delete
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_modify_whose_new_dependency_is_missing_deletes_the_item_which_waits_for_it() {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let generation = submit(&tenant, vec![plain("t/app", json!({"v": "1"}))]).await;
    recorder.wait_for_operations(1).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(
        &tenant,
        vec![item("t/app", json!({"v": "2"}), vec![on("t/lib")])],
    )
    .await;
    recorder.wait_for_operations(2).await;
    let status = settled(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels(), ["create t/app", "delete t/app"]);
    assert_pending_on(&tenant, "t/app", "t/lib").await;
    assert_not_ready(&status);

    let generation = submit(
        &tenant,
        vec![
            item("t/app", json!({"v": "2"}), vec![on("t/lib")]),
            plain("t/lib", json!({})),
        ],
    )
    .await;
    recorder.wait_for_operations(4).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels()[2..], ["create t/lib", "create t/app"]);
}

// ---------------------------------------------------------------------------
// Rule 6: predicates that fail for the new value of a dependency
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_dependent_whose_predicate_changes_with_its_dependency_is_deleted_before_the_modify_and_created_after()
 {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let intent = |val: &str| {
        vec![
            item(
                "t/app",
                json!({}),
                vec![satisfying(on("t/net"), &format!("self.val == \"{val}\""))],
            ),
            plain("t/net", json!({"val": val})),
        ]
    };
    let generation = submit(&tenant, intent("42")).await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, intent("53")).await;
    let received = recorder.wait_for_operations(5).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels(),
        [
            "create t/net",
            "create t/app",
            "delete t/app",
            "modify t/net",
            "create t/app"
        ],
        "the old predicate fails for net's new value and the new one for its old value"
    );
    assert_eq!(received[3].property("val"), Some(&json!("53")));
    let net = current(&tenant, "t/net").await;
    assert_eq!(applied_properties(&net).get("val"), Some(&json!("53")));
}

#[tokio::test]
async fn a_dependent_whose_unchanged_predicate_fails_for_the_new_value_is_deleted_and_waits() {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let intent = |val: &str| {
        vec![
            item(
                "t/app",
                json!({}),
                vec![satisfying(on("t/net"), "self.val == \"42\"")],
            ),
            plain("t/net", json!({"val": val})),
        ]
    };
    let generation = submit(&tenant, intent("42")).await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, intent("53")).await;
    recorder.wait_for_operations(4).await;
    let status = settled(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels()[2..], ["delete t/app", "modify t/net"]);
    assert_pending_on(&tenant, "t/app", "t/net").await;
    let app = current(&tenant, "t/app").await;
    assert!(
        app.blocked_by.iter().any(|b| b.why.contains("predicate")),
        "blocked_by says the predicate is false: {app:#?}"
    );
    assert_not_ready(&status);

    let generation = submit(&tenant, intent("42")).await;
    recorder.wait_for_operations(6).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels()[4..], ["modify t/net", "create t/app"]);
}

#[tokio::test]
async fn a_dependent_whose_predicate_still_holds_for_the_new_value_is_left_alone() {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let intent = |v: &str| {
        vec![
            plain("t/net", json!({"v": v})),
            item(
                "t/app",
                json!({}),
                vec![satisfying(on("t/net"), "self.v != \"\"")],
            ),
        ]
    };
    let generation = submit(&tenant, intent("1")).await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, intent("2")).await;
    recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels(),
        ["create t/net", "create t/app", "modify t/net"],
        "app's predicate holds for net's new value: app is neither deleted nor recreated"
    );
}

#[tokio::test]
async fn a_dependent_deleted_for_its_predicate_is_gone_before_its_dependency_is_modified() {
    let recorder = Recorder::new();
    let gate = Gate::new();
    recorder.script(
        OperationKind::Delete,
        r("t/app"),
        [Step::LongRunning(gate.clone())],
    );
    let (tenant, mut agent) = start_types(&["t"], &recorder).await;
    let intent = |val: &str| {
        vec![
            item(
                "t/app",
                json!({}),
                vec![satisfying(on("t/net"), "self.val == \"42\"")],
            ),
            plain("t/net", json!({"val": val})),
        ]
    };
    let generation = submit(&tenant, intent("42")).await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, intent("53")).await;
    let delete = wait_for_label(&recorder, "delete t/app").await;
    wait_for_ack(&mut agent, &delete.op_id).await;
    let net = current(&tenant, "t/net").await;
    assert_eq!(
        (net.state, net.operation.as_ref()),
        (v1::ItemState::Created as i32, None),
        "net is not modified while the delete of app runs: {net:#?}"
    );

    gate.open();
    recorder.wait_for_operations(4).await;
    settled(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels()[2..], ["delete t/app", "modify t/net"]);
    assert_pending_on(&tenant, "t/app", "t/net").await;
}

#[tokio::test]
async fn a_predicate_sees_the_properties_the_agent_observed() {
    let recorder = Recorder::new();
    let mut scripted = Scripted::new(&recorder);
    scripted.observed = Some(
        json!({"state": "up"})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    );
    let observing = Arc::new(scripted);
    let tenant = TestTenant::start("acme").await;
    let _observing_agent = connect_agent(&tenant, vec![spec("link")], &observing).await;
    let mut plain_agent = RunningAgent::start(
        tenant
            .agent("agent-2")
            .item_type(spec("t"), recorder.clone()),
    );
    plain_agent.connected().await;

    // `state` is not in the intent: only the observed value can satisfy it.
    let generation = submit(
        &tenant,
        vec![
            plain("link/eth0", json!({"mtu": 1500})),
            item(
                "t/app",
                json!({}),
                vec![satisfying(
                    on("link/eth0"),
                    "self.state == \"up\" && self.mtu >= 1500",
                )],
            ),
        ],
    )
    .await;

    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels(), ["create link/eth0", "create t/app"]);
}

// ---------------------------------------------------------------------------
// Rule 7: removals cascade to dependents at every depth
// ---------------------------------------------------------------------------

/// `top` needs `middle`, `middle` needs `bottom`, all of type `t` (by
/// identity: bottom, middle, top).
fn three_level_chain(with_bottom: bool) -> Vec<v1::Item> {
    let mut items = vec![
        item("t/top", json!({}), vec![on("t/middle")]),
        item("t/middle", json!({}), vec![on("t/bottom")]),
    ];
    if with_bottom {
        items.push(plain("t/bottom", json!({})));
    }
    items
}

#[tokio::test]
async fn removing_the_bottom_of_a_three_level_chain_deletes_all_three_and_the_rest_waits() {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let generation = submit(&tenant, three_level_chain(true)).await;
    recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, three_level_chain(false)).await;
    recorder.wait_for_operations(6).await;
    let status = settled(&tenant, &recorder, generation).await;

    assert_eq!(
        recorder.labels()[3..],
        ["delete t/top", "delete t/middle", "delete t/bottom"]
    );
    assert_absent(&tenant, "t/bottom").await;
    assert_pending_on(&tenant, "t/middle", "t/bottom").await;
    assert_pending_on(&tenant, "t/top", "t/middle").await;
    assert_eq!(
        status.items_by_state.get("PENDING"),
        Some(&2),
        "{status:#?}"
    );
    assert_waiting_for_dependencies(&status);
}

#[tokio::test]
async fn removing_the_bottom_of_a_three_level_chain_with_long_running_deletes_deletes_one_level_at_a_time()
 {
    let recorder = Recorder::new();
    let gates: Vec<Gate> = (0..3).map(|_| Gate::new()).collect();
    for (name, gate) in ["t/top", "t/middle", "t/bottom"].iter().zip(&gates) {
        recorder.script(
            OperationKind::Delete,
            r(name),
            [Step::LongRunning(gate.clone())],
        );
    }
    let (tenant, mut agent) = start_types(&["t"], &recorder).await;
    let generation = submit(&tenant, three_level_chain(true)).await;
    recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, three_level_chain(false)).await;

    for (level, (name, below)) in [
        ("t/top", Some("t/middle")),
        ("t/middle", Some("t/bottom")),
        ("t/bottom", None),
    ]
    .into_iter()
    .enumerate()
    {
        let delete = wait_for_label(&recorder, &format!("delete {name}")).await;
        // Once the server has taken the IN_PROGRESS, whatever it would
        // dispatch next is in flight too.
        wait_for_ack(&mut agent, &delete.op_id).await;
        let deleting = current(&tenant, name).await;
        assert_eq!(
            (
                deleting.state,
                deleting.operation.as_ref().map(|o| o.op_id.as_str())
            ),
            (v1::ItemState::Deleting as i32, Some(delete.op_id.as_str())),
            "{deleting:#?}"
        );
        if let Some(below) = below {
            let waiting = current(&tenant, below).await;
            assert_eq!(
                (waiting.state, waiting.operation.as_ref()),
                (v1::ItemState::Created as i32, None),
                "{below} is not deleted while the delete of {name} runs: {waiting:#?}"
            );
        }
        assert_eq!(
            recorder.labels().len(),
            4 + level,
            "nothing below {name} is deleted while its delete runs: {:?}",
            recorder.labels()
        );
        gates[level].open();
    }

    recorder.wait_for_operations(6).await;
    let status = settled(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels()[3..],
        ["delete t/top", "delete t/middle", "delete t/bottom"]
    );
    assert_absent(&tenant, "t/bottom").await;
    assert_pending_on(&tenant, "t/middle", "t/bottom").await;
    assert_pending_on(&tenant, "t/top", "t/middle").await;
    assert_waiting_for_dependencies(&status);
}

#[tokio::test]
async fn removing_the_middle_of_a_chain_deletes_the_items_above_it_and_leaves_the_item_below() {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let generation = submit(&tenant, three_level_chain(true)).await;
    recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(
        &tenant,
        vec![
            item("t/top", json!({}), vec![on("t/middle")]),
            plain("t/bottom", json!({})),
        ],
    )
    .await;
    recorder.wait_for_operations(5).await;
    let status = settled(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels()[3..], ["delete t/top", "delete t/middle"]);
    assert_pending_on(&tenant, "t/top", "t/middle").await;
    assert_absent(&tenant, "t/middle").await;
    assert_state(&tenant, "t/bottom", v1::ItemState::Created).await;
    assert_not_ready(&status);
}

#[tokio::test]
async fn removing_the_base_of_a_four_level_chain_deletes_every_level_and_rebuilds_them_when_it_returns()
 {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t", "u"], &recorder).await;
    let chain = |with_base: bool| {
        let mut items = vec![
            item("t/top", json!({}), vec![on("u/upper")]),
            item("u/upper", json!({}), vec![on("t/lower")]),
            item("t/lower", json!({}), vec![on("u/base")]),
        ];
        if with_base {
            items.push(plain("u/base", json!({})));
        }
        items
    };
    let generation = submit(&tenant, chain(true)).await;
    recorder.wait_for_operations(4).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, chain(false)).await;
    recorder.wait_for_operations(8).await;
    let status = settled(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels()[4..],
        [
            "delete t/top",
            "delete u/upper",
            "delete t/lower",
            "delete u/base"
        ]
    );
    assert_pending_on(&tenant, "t/lower", "u/base").await;
    assert_pending_on(&tenant, "u/upper", "t/lower").await;
    assert_pending_on(&tenant, "t/top", "u/upper").await;
    assert_not_ready(&status);

    let generation = submit(&tenant, chain(true)).await;
    recorder.wait_for_operations(12).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels()[8..],
        [
            "create u/base",
            "create t/lower",
            "create u/upper",
            "create t/top"
        ]
    );
}

#[tokio::test]
async fn retargeting_an_item_away_from_a_removed_dependency_leaves_its_own_dependents_alone() {
    let recorder = Recorder::new();
    // Should app's delete come (it should not), it runs long: net must not
    // be modified meanwhile.
    let gate = Gate::new();
    recorder.script(
        OperationKind::Delete,
        r("t/app"),
        [Step::LongRunning(gate.clone())],
    );
    let (tenant, mut agent) = start_types(&["t"], &recorder).await;
    let app = || item("t/app", json!({}), vec![on("t/net")]);
    let generation = submit(
        &tenant,
        vec![
            plain("t/extra", json!({})),
            item("t/net", json!({"v": "1"}), vec![on("t/extra")]),
            app(),
        ],
    )
    .await;
    recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;

    // extra leaves; net no longer needs it, so net is modified (rule 7),
    // and app, which needs only net, has no reason to go.
    let generation = submit(&tenant, vec![plain("t/net", json!({"v": "2"})), app()]).await;
    let first = recorder
        .wait_until("the first operation on app or net", |received, _| {
            received[3..]
                .iter()
                .find(|r| r.label() == "delete t/app" || r.label() == "modify t/net")
                .cloned()
        })
        .await;
    if first.label() == "delete t/app" {
        wait_for_ack(&mut agent, &first.op_id).await;
        let net = current(&tenant, "t/net").await;
        assert_eq!(
            (net.state, net.operation.as_ref().map(|o| o.kind)),
            (v1::ItemState::Created as i32, None),
            "app was deleted, and net is modified while that delete still runs \
             (rule 8): {:?}",
            recorder.labels()
        );
    }
    gate.open();
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels(),
        [
            "create t/extra",
            "create t/net",
            "create t/app",
            "modify t/net",
            "delete t/extra"
        ],
        "app still has what it needs: it is neither deleted nor recreated"
    );
}

#[tokio::test]
async fn retargeting_a_dependent_to_an_existing_item_modifies_it_and_then_deletes_the_old_dependency()
 {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let generation = submit(
        &tenant,
        vec![
            item("t/app", json!({}), vec![on("t/old")]),
            plain("t/old", json!({})),
            plain("t/new", json!({})),
        ],
    )
    .await;
    recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(
        &tenant,
        vec![
            item("t/app", json!({}), vec![on("t/new")]),
            plain("t/new", json!({})),
        ],
    )
    .await;
    recorder.wait_for_operations(5).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels()[3..],
        ["modify t/app", "delete t/old"],
        "app no longer needs old and its new dependency exists: it is modified, never deleted"
    );
    let app = current(&tenant, "t/app").await;
    assert_eq!(applied_requires(&app), ["t/new"], "{app:#?}");
    assert_absent(&tenant, "t/old").await;
}

#[tokio::test]
async fn retargeting_a_dependent_to_an_item_the_same_intent_creates_recreates_it_after_the_new_item()
 {
    // Rule 7 modifies a retargeted dependent only when its new dependencies
    // are satisfied (DESIGN 2: they exist now). v/fresh does not exist yet,
    // so app is deleted with u/old and created again once v/fresh exists
    // (docs/planning.md says why: waiting for fresh could close a cycle).
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t", "u", "v"], &recorder).await;
    let generation = submit(
        &tenant,
        vec![
            item("t/app", json!({}), vec![on("u/old")]),
            plain("u/old", json!({})),
        ],
    )
    .await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(
        &tenant,
        vec![
            item("t/app", json!({}), vec![on("v/fresh")]),
            plain("v/fresh", json!({})),
        ],
    )
    .await;
    recorder.wait_for_operations(6).await;
    ready(&tenant, &recorder, generation).await;
    let labels = recorder.labels()[2..].to_vec();
    let mut sorted = labels.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            "create t/app",
            "create v/fresh",
            "delete t/app",
            "delete u/old"
        ],
        "{labels:?}"
    );
    let at = |label: &str| labels.iter().position(|l| l == label);
    assert!(at("delete t/app") < at("delete u/old"), "{labels:?}");
    assert!(at("delete t/app") < at("create t/app"), "{labels:?}");
    assert!(at("create v/fresh") < at("create t/app"), "{labels:?}");
    let app = current(&tenant, "t/app").await;
    assert_eq!(applied_requires(&app), ["v/fresh"], "{app:#?}");
}

// ---------------------------------------------------------------------------
// Rule 8: planned for deletion, and blocking
// ---------------------------------------------------------------------------

#[tokio::test]
async fn nothing_is_created_against_an_item_planned_for_deletion_while_its_dependents_are_deleted()
{
    let recorder = Recorder::new();
    let gate = Gate::new();
    recorder.script(
        OperationKind::Delete,
        r("t/user"),
        [Step::Hold(gate.clone())],
    );
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let generation = submit(
        &tenant,
        vec![
            plain("t/old", json!({})),
            item("t/user", json!({}), vec![on("t/old")]),
        ],
    )
    .await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    // old and user leave; app arrives needing old.
    let generation = submit(&tenant, vec![item("t/app", json!({}), vec![on("t/old")])]).await;
    wait_for_label(&recorder, "delete t/user").await;
    let app = wait_pending_operation(&tenant, "t/app", v1::OperationKind::Create).await;
    assert_eq!(app.reason, v1::WaitReason::Dependency as i32, "{app:#?}");
    let old = current(&tenant, "t/old").await;
    assert_eq!(
        (old.state, old.operation.as_ref()),
        (v1::ItemState::Created as i32, None),
        "old waits for the delete of user: {old:#?}"
    );
    assert_eq!(
        recorder.labels()[2..],
        ["delete t/user"],
        "app is not created against old while old is planned for deletion"
    );

    gate.open();
    recorder.wait_for_operations(4).await;
    let status = settled(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels()[2..], ["delete t/user", "delete t/old"]);
    assert_pending_on(&tenant, "t/app", "t/old").await;
    assert_not_ready(&status);
}

#[tokio::test]
async fn a_failing_delete_of_a_dependent_holds_back_the_delete_of_its_dependency_until_it_succeeds()
{
    let recorder = Recorder::new();
    recorder.fail_times(OperationKind::Delete, r("t/app"), 2, Code::Unavailable);
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let generation = submit(
        &tenant,
        vec![
            plain("t/base", json!({})),
            item("t/app", json!({}), vec![on("t/base")]),
        ],
    )
    .await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, Vec::new()).await;
    let received = recorder.wait_for_operations(6).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels()[2..],
        [
            "delete t/app",
            "delete t/app",
            "delete t/app",
            "delete t/base"
        ]
    );
    assert_eq!(
        received[2..5].iter().map(|r| r.attempt).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert!(tenant.current().await.is_empty());
}

#[tokio::test]
async fn a_terminally_failed_delete_of_a_dependent_keeps_its_dependency_and_stalls_the_tenant() {
    let recorder = Recorder::new();
    recorder.fail_times(
        OperationKind::Delete,
        r("t/app"),
        1,
        Code::FailedPrecondition,
    );
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let generation = submit(
        &tenant,
        vec![
            plain("t/base", json!({})),
            item("t/app", json!({}), vec![on("t/base")]),
        ],
    )
    .await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    submit(&tenant, Vec::new()).await;
    recorder.wait_for_operations(3).await;
    let status = stalled(&tenant, &recorder).await;
    assert_stalled(&status);
    assert_eq!(
        recorder.labels()[2..],
        ["delete t/app"],
        "no retry, and base stays"
    );
    let app = current(&tenant, "t/app").await;
    assert_eq!(app.state, v1::ItemState::Failed as i32, "{app:#?}");
    assert_eq!(
        app.last_operation,
        v1::OperationKind::Delete as i32,
        "{app:#?}"
    );
    assert_eq!(
        app.last_error.as_ref().map(|e| e.code),
        Some(Code::FailedPrecondition as i32)
    );
    let base = current(&tenant, "t/base").await;
    assert_eq!(base.state, v1::ItemState::Created as i32, "{base:#?}");
    assert_eq!(
        base.pending_operation,
        v1::OperationKind::Delete as i32,
        "base still needs its delete: {base:#?}"
    );
}

/// base exists; the next intent modifies base (long-running: it holds
/// until `gate` opens) and adds app on base. Returns once the server has
/// taken the Modify's IN_PROGRESS, with the generation of that intent.
async fn app_behind_a_running_modify_of_base() -> (TestTenant, RunningAgent, Recorder, Gate, u64) {
    let recorder = Recorder::new();
    let gate = Gate::new();
    recorder.script(
        OperationKind::Modify,
        r("t/base"),
        [Step::LongRunning(gate.clone())],
    );
    let (tenant, mut agent) = start_types(&["t"], &recorder).await;
    let generation = submit(&tenant, vec![plain("t/base", json!({"v": "1"}))]).await;
    recorder.wait_for_operations(1).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(
        &tenant,
        vec![
            plain("t/base", json!({"v": "2"})),
            item("t/app", json!({}), vec![on("t/base")]),
        ],
    )
    .await;
    let modify = wait_for_label(&recorder, "modify t/base").await;
    wait_for_ack(&mut agent, &modify.op_id).await;
    (tenant, agent, recorder, gate, generation)
}

#[tokio::test]
async fn a_create_waits_for_the_running_modify_of_its_dependency() {
    let (tenant, _agent, recorder, gate, generation) = app_behind_a_running_modify_of_base().await;
    assert_state(&tenant, "t/base", v1::ItemState::Modifying).await;
    let app = current(&tenant, "t/app").await;
    assert_eq!(
        (app.state, app.operation.as_ref()),
        (v1::ItemState::Pending as i32, None),
        "app waits for the modify of base: {app:#?}"
    );
    assert_eq!(recorder.labels(), ["create t/base", "modify t/base"]);

    gate.open();
    recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels(),
        ["create t/base", "modify t/base", "create t/app"]
    );
}

#[tokio::test]
async fn a_modify_waits_for_the_running_create_of_a_dependent() {
    let recorder = Recorder::new();
    let gate = Gate::new();
    recorder.script(
        OperationKind::Create,
        r("t/app"),
        [Step::Hold(gate.clone())],
    );
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let generation = submit(&tenant, vec![plain("t/base", json!({"v": "1"}))]).await;
    recorder.wait_for_operations(1).await;
    ready(&tenant, &recorder, generation).await;
    let with_app = |v: &str| {
        vec![
            plain("t/base", json!({"v": v})),
            item("t/app", json!({}), vec![on("t/base")]),
        ]
    };
    submit(&tenant, with_app("1")).await;
    wait_for_label(&recorder, "create t/app").await;

    // app's intent is unchanged, so its create goes on; base must wait.
    let generation = submit(&tenant, with_app("2")).await;
    let base = wait_pending_operation(&tenant, "t/base", v1::OperationKind::Modify).await;
    assert_eq!(base.reason, v1::WaitReason::Blocked as i32, "{base:#?}");
    assert_eq!(recorder.labels(), ["create t/base", "create t/app"]);
    assert!(
        recorder.cancelled().is_empty(),
        "{:?}",
        recorder.cancelled()
    );

    gate.open();
    recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels(),
        ["create t/base", "create t/app", "modify t/base"]
    );
}

#[tokio::test]
async fn a_create_waits_for_the_delete_of_its_type_in_the_same_plan_while_other_types_go_on() {
    let recorder = Recorder::new();
    let gate = Gate::new();
    recorder.script(
        OperationKind::Delete,
        r("t/old"),
        [Step::Hold(gate.clone())],
    );
    let (tenant, _agent) = start_types(&["t", "u"], &recorder).await;
    let generation = submit(&tenant, vec![plain("t/old", json!({}))]).await;
    recorder.wait_for_operations(1).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(
        &tenant,
        vec![plain("t/fresh", json!({})), plain("u/other", json!({}))],
    )
    .await;
    wait_for_label(&recorder, "delete t/old").await;
    tenant
        .wait_for_state("u", "other", v1::ItemState::Created)
        .await;
    let fresh = current(&tenant, "t/fresh").await;
    assert_eq!(
        (fresh.state, fresh.operation.as_ref()),
        (v1::ItemState::Pending as i32, None),
        "fresh waits for the delete of old: {fresh:#?}"
    );
    assert!(
        !recorder.labels().contains(&"create t/fresh".to_owned()),
        "fresh waits for the delete of old: {:?}",
        recorder.labels()
    );

    gate.open();
    recorder.wait_for_operations(4).await;
    ready(&tenant, &recorder, generation).await;
    assert_phases(
        &recorder.labels(),
        &[
            &["create t/old"],
            &["delete t/old", "create u/other"],
            &["create t/fresh"],
        ],
    );
}

#[tokio::test]
async fn a_delete_held_back_by_the_running_delete_of_a_dependent_names_it_in_its_status() {
    let recorder = Recorder::new();
    let gate = Gate::new();
    recorder.script(
        OperationKind::Delete,
        r("t/app"),
        [Step::LongRunning(gate.clone())],
    );
    let (tenant, mut agent) = start_types(&["t"], &recorder).await;
    let generation = submit(
        &tenant,
        vec![
            plain("t/base", json!({})),
            item("t/app", json!({}), vec![on("t/base")]),
        ],
    )
    .await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, Vec::new()).await;
    let delete = wait_for_label(&recorder, "delete t/app").await;
    wait_for_ack(&mut agent, &delete.op_id).await;
    let base = wait_pending_operation(&tenant, "t/base", v1::OperationKind::Delete).await;
    assert_eq!(base.reason, v1::WaitReason::Blocked as i32, "{base:#?}");
    assert!(
        base.blocked_by
            .iter()
            .any(|b| b.item.as_ref().is_some_and(|i| i.name == "app")),
        "blocked_by names the running delete of app: {base:#?}"
    );

    gate.open();
    recorder.wait_for_operations(4).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels()[2..], ["delete t/app", "delete t/base"]);
}

#[tokio::test]
async fn a_create_held_back_by_the_running_modify_of_its_dependency_names_it_in_its_status() {
    let (tenant, _agent, recorder, gate, generation) = app_behind_a_running_modify_of_base().await;
    let app = wait_pending_operation(&tenant, "t/app", v1::OperationKind::Create).await;
    assert_eq!(app.reason, v1::WaitReason::Dependency as i32, "{app:#?}");
    assert!(
        app.blocked_by
            .iter()
            .any(|b| b.item.as_ref().is_some_and(|i| i.name == "base")),
        "blocked_by names base, being modified: {app:#?}"
    );

    gate.open();
    recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;
}

// ---------------------------------------------------------------------------
// Diamonds
// ---------------------------------------------------------------------------

/// `top` needs `left` and `right`, both need `root` (by identity: left,
/// right, root, top).
fn diamond(root: Value, left_recreates: bool) -> Vec<v1::Item> {
    let left_on_root = if left_recreates {
        recreating(on("t/root"))
    } else {
        on("t/root")
    };
    vec![
        plain("t/root", root),
        item("t/left", json!({}), vec![left_on_root]),
        item("t/right", json!({}), vec![on("t/root")]),
        item("t/top", json!({}), vec![on("t/left"), on("t/right")]),
    ]
}

#[tokio::test]
async fn recreating_the_root_of_a_diamond_recreates_every_item_above_it_once_in_order() {
    let recorder = Recorder::new();
    let (tenant, _agent) = start(vec![spec("t").recreate_on_change(["/id"])], &recorder).await;
    let generation = submit(&tenant, diamond(json!({"id": 1}), false)).await;
    recorder.wait_for_operations(4).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, diamond(json!({"id": 2}), false)).await;
    recorder.wait_for_operations(12).await;
    ready(&tenant, &recorder, generation).await;
    assert_phases(
        &recorder.labels(),
        &[
            &["create t/root"],
            &["create t/left", "create t/right"],
            &["create t/top"],
            &["delete t/top"],
            &["delete t/left", "delete t/right"],
            &["delete t/root"],
            &["create t/root"],
            &["create t/left", "create t/right"],
            &["create t/top"],
        ],
    );
    let status = ready(&tenant, &recorder, generation).await;
    assert_eq!(
        status.items_by_state.get("CREATED"),
        Some(&4),
        "{status:#?}"
    );
}

#[tokio::test]
async fn modifying_the_root_of_a_diamond_recreates_the_branch_that_asks_for_it_and_the_item_on_top()
{
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let generation = submit(&tenant, diamond(json!({"v": "1"}), true)).await;
    recorder.wait_for_operations(4).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, diamond(json!({"v": "2"}), true)).await;
    recorder.wait_for_operations(9).await;
    ready(&tenant, &recorder, generation).await;
    assert_phases(
        &recorder.labels(),
        &[
            &["create t/root"],
            &["create t/left", "create t/right"],
            &["create t/top"],
            &["delete t/top"],
            &["delete t/left"],
            &["modify t/root"],
            &["create t/left"],
            &["create t/top"],
        ],
    );
}

// ---------------------------------------------------------------------------
// Rule 9: external items
// ---------------------------------------------------------------------------

#[tokio::test]
async fn an_external_item_that_disappears_deletes_its_dependents_top_down_and_they_return_with_it()
{
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t", "u"], &recorder).await;
    let generation = submit(
        &tenant,
        vec![
            external("link/e"),
            item("t/a", json!({}), vec![on("link/e")]),
            item("u/b", json!({}), vec![on("t/a")]),
        ],
    )
    .await;
    tenant
        .report_external(vec![external_report("link/e", json!({}), false)])
        .await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    tenant.report_external(vec![external_gone("link/e")]).await;
    recorder.wait_for_operations(4).await;
    tenant
        .wait_for_state("t", "a", v1::ItemState::Pending)
        .await;
    let status = settled(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels()[2..], ["delete u/b", "delete t/a"]);
    let e = current(&tenant, "link/e").await;
    assert_eq!(
        (e.state, e.applied.as_ref()),
        (v1::ItemState::Pending as i32, None),
        "the intended external item no longer exists: {e:#?}"
    );
    assert_pending_on(&tenant, "t/a", "link/e").await;
    assert_pending_on(&tenant, "u/b", "t/a").await;
    assert_not_ready(&status);

    tenant
        .report_external(vec![external_report("link/e", json!({}), false)])
        .await;
    recorder.wait_for_operations(6).await;
    tenant
        .wait_for_state("u", "b", v1::ItemState::Created)
        .await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels()[4..], ["create t/a", "create u/b"]);
}

#[tokio::test]
async fn an_external_item_that_disappears_drops_its_auto_deleted_dependents_without_a_delete() {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t", "u"], &recorder).await;
    let generation = submit(
        &tenant,
        vec![
            external("link/e"),
            item("t/a", json!({}), vec![auto_deleted(on("link/e"))]),
            item("u/c", json!({}), vec![on("link/e")]),
        ],
    )
    .await;
    tenant
        .report_external(vec![external_report("link/e", json!({}), false)])
        .await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    tenant.report_external(vec![external_gone("link/e")]).await;
    wait_for_label(&recorder, "delete u/c").await;
    tenant
        .wait_for_state("t", "a", v1::ItemState::Pending)
        .await;
    tenant
        .wait_for_state("u", "c", v1::ItemState::Pending)
        .await;
    let status = settled(&tenant, &recorder, generation).await;
    assert_phases(
        &recorder.labels(),
        &[&["create t/a", "create u/c"], &["delete u/c"]],
    );
    assert_not_ready(&status);
    assert_pending_on(&tenant, "u/c", "link/e").await;
    let dropped = current(&tenant, "t/a").await;

    tenant
        .report_external(vec![external_report("link/e", json!({}), false)])
        .await;
    recorder.wait_for_operations(5).await;
    ready(&tenant, &recorder, generation).await;
    assert_phases(
        &recorder.labels(),
        &[
            &["create t/a", "create u/c"],
            &["delete u/c"],
            &["create t/a", "create u/c"],
        ],
    );
    check_pending_on(&dropped, "link/e");
}

// ---------------------------------------------------------------------------
// Rule 10 and section 2: subgraphs and equality
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_recreate_cascades_to_dependents_listed_in_other_subgraphs() {
    let recorder = Recorder::new();
    let (tenant, _agent) = start(vec![spec("t").recreate_on_change(["/id"])], &recorder).await;
    let intent = |id: u32| {
        let mut base = plain("t/base", json!({"id": id}));
        base.subgraph = "infra".into();
        let mut app = item("t/app", json!({}), vec![on("t/base")]);
        app.subgraph = "apps/web".into();
        vec![base, app]
    };
    let generation = submit(&tenant, intent(1)).await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;

    let generation = submit(&tenant, intent(2)).await;
    recorder.wait_for_operations(6).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels()[2..],
        [
            "delete t/app",
            "delete t/base",
            "create t/base",
            "create t/app"
        ]
    );
}

#[tokio::test]
async fn moving_an_item_between_subgraphs_or_relabelling_it_runs_no_operation() {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let listed = |subgraph: &str, label: &str, description: &str| {
        let mut a = plain("t/a", json!({"v": "1"}));
        a.subgraph = subgraph.into();
        a.label = label.into();
        a.description = description.into();
        vec![a]
    };
    let first = tenant.submit(listed("x", "one", "")).await;
    recorder.wait_for_operations(1).await;
    ready(&tenant, &recorder, first.generation).await;

    let moved = tenant.submit(listed("y/z", "two", "moved")).await;
    assert_eq!(
        moved.generation, first.generation,
        "no equality-relevant change, no new generation: {moved:#?}"
    );
    assert!(
        moved
            .plan
            .as_ref()
            .is_none_or(|plan| plan.operations.is_empty()),
        "{moved:#?}"
    );
    ready(&tenant, &recorder, moved.generation).await;

    // A real change afterwards is the only other operation.
    let changed = tenant.submit(vec![plain("t/a", json!({"v": "2"}))]).await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, changed.generation).await;
    assert_eq!(recorder.labels(), ["create t/a", "modify t/a"]);
}

// ---------------------------------------------------------------------------
// Section 4: op ids, attempts, long-running operations, cancellation
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_retried_operation_keeps_its_op_id_and_counts_its_attempts() {
    let recorder = Recorder::new();
    recorder.fail_times(OperationKind::Create, r("t/a"), 2, Code::Unavailable);
    let (tenant, _agent) = start_types(&["t"], &recorder).await;

    let generation = submit(&tenant, vec![plain("t/a", json!({}))]).await;
    let received = recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels(),
        ["create t/a", "create t/a", "create t/a"]
    );
    assert_eq!(
        received.iter().map(|r| r.attempt).collect::<Vec<_>>(),
        [1, 2, 3],
        "each retry after FAILED is a new attempt"
    );
    assert!(
        received.iter().all(|r| r.op_id == received[0].op_id),
        "an op id names one operation toward one target across its retries: {:#?}",
        received
            .iter()
            .map(|r| (&r.op_id, r.attempt))
            .collect::<Vec<_>>()
    );
    let a = current(&tenant, "t/a").await;
    assert_eq!(a.attempts, 0, "a success resets the attempts: {a:#?}");
    assert_eq!(a.last_error, None, "{a:#?}");
}

#[tokio::test]
async fn a_wait_answer_is_asked_again_with_the_same_op_id_and_attempt() {
    let recorder = Recorder::new();
    let scripted = Scripted::new(&recorder);
    scripted.waits.store(1, Ordering::SeqCst);
    let configurator = Arc::new(scripted);
    let tenant = TestTenant::start("acme").await;
    let mut agent = connect_agent(&tenant, vec![spec("t")], &configurator).await;

    let generation = submit(&tenant, vec![plain("t/a", json!({}))]).await;
    let first = recorder.wait_for_operations(1).await.remove(0);

    let received = tokio::select! {
        received = recorder.wait_for_operations(2) => received,
        (op_id, attempt) = agent.wait_for_event("a de-duplicated re-ask", |event| match event {
            AgentEvent::DuplicateOperation { op_id, attempt } if *op_id == first.op_id => {
                Some((op_id.clone(), *attempt))
            }
            _ => None,
        }) => panic!(
            "the server re-asked ({op_id}, attempt {attempt}) after WAIT as DESIGN section 4 \
             says, but the SDK answered it from its result cache instead of asking the \
             configurator again"
        ),
    };
    ready(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels(), ["create t/a", "create t/a"]);
    assert_eq!(
        (received[1].op_id.as_str(), received[1].attempt),
        (first.op_id.as_str(), first.attempt),
        "a re-ask after WAIT keeps the op id and the attempt"
    );
    let a = current(&tenant, "t/a").await;
    assert_eq!(a.attempts, 0, "WAIT is not a failure: {a:#?}");
}

#[tokio::test]
async fn each_operation_toward_a_new_target_gets_a_new_op_id() {
    let recorder = Recorder::new();
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let generation = submit(&tenant, vec![plain("t/a", json!({"v": "1"}))]).await;
    recorder.wait_for_operations(1).await;
    ready(&tenant, &recorder, generation).await;
    let generation = submit(&tenant, vec![plain("t/a", json!({"v": "2"}))]).await;
    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;
    let generation = submit(&tenant, Vec::new()).await;
    let received = recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;

    assert_eq!(
        recorder.labels(),
        ["create t/a", "modify t/a", "delete t/a"]
    );
    let mut op_ids: Vec<&str> = received.iter().map(|r| r.op_id.as_str()).collect();
    op_ids.sort_unstable();
    op_ids.dedup();
    assert_eq!(op_ids.len(), 3, "{received:#?}");
    assert!(received.iter().all(|r| r.attempt == 1), "{received:#?}");
}

#[tokio::test]
async fn long_running_creates_modifies_and_deletes_each_finish_with_their_later_done() {
    let recorder = Recorder::new();
    let gates: Vec<Gate> = (0..3).map(|_| Gate::new()).collect();
    for (kind, gate) in [
        OperationKind::Create,
        OperationKind::Modify,
        OperationKind::Delete,
    ]
    .into_iter()
    .zip(&gates)
    {
        recorder.script(kind, r("t/a"), [Step::LongRunning(gate.clone())]);
    }
    let (tenant, _agent) = start_types(&["t"], &recorder).await;

    let steps: [(Vec<v1::Item>, &str, v1::ItemState); 3] = [
        (
            vec![plain("t/a", json!({"v": "1"}))],
            "create t/a",
            v1::ItemState::Creating,
        ),
        (
            vec![plain("t/a", json!({"v": "2"}))],
            "modify t/a",
            v1::ItemState::Modifying,
        ),
        (Vec::new(), "delete t/a", v1::ItemState::Deleting),
    ];
    for (index, (intent, label, running)) in steps.into_iter().enumerate() {
        let generation = submit(&tenant, intent).await;
        let operation = wait_for_label(&recorder, label).await;
        let in_flight = tenant.wait_for_state("t", "a", running).await;
        assert_eq!(
            in_flight
                .operation
                .as_ref()
                .map(|o| (o.op_id.as_str(), o.attempt)),
            Some((operation.op_id.as_str(), operation.attempt)),
            "{in_flight:#?}"
        );
        if running == v1::ItemState::Creating {
            assert_eq!(in_flight.applied, None, "no applied value while CREATING");
        } else {
            assert!(in_flight.applied.is_some(), "{in_flight:#?}");
        }
        let status = tenant.status().await;
        assert!(condition_holds(&status, "Reconciling"), "{status:#?}");
        assert_eq!(status.operations_in_flight, 1, "{status:#?}");

        gates[index].open();
        ready(&tenant, &recorder, generation).await;
    }
    assert_eq!(
        recorder.labels(),
        ["create t/a", "modify t/a", "delete t/a"]
    );
    assert!(tenant.current().await.is_empty());
}

#[tokio::test]
async fn changing_the_intent_during_a_modify_cancels_it_and_modifies_again_from_its_late_result() {
    let recorder = Recorder::new();
    let gate = Gate::new();
    recorder.script(OperationKind::Modify, r("t/a"), [Step::Hold(gate.clone())]);
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let generation = submit(&tenant, vec![plain("t/a", json!({"v": "1"}))]).await;
    recorder.wait_for_operations(1).await;
    ready(&tenant, &recorder, generation).await;

    submit(&tenant, vec![plain("t/a", json!({"v": "2"}))]).await;
    let modify = wait_for_label(&recorder, "modify t/a").await;
    let generation = submit(&tenant, vec![plain("t/a", json!({"v": "3"}))]).await;
    recorder.wait_for_cancellation(&modify.op_id).await;
    gate.open();

    let received = recorder.wait_for_operations(3).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(
        recorder.labels(),
        ["create t/a", "modify t/a", "modify t/a"]
    );
    assert_eq!(
        received[2].previous.as_ref().and_then(|p| p.get("v")),
        Some(&json!("2")),
        "the cancelled modify's late DONE is authoritative"
    );
    assert_eq!(received[2].property("v"), Some(&json!("3")));
    assert_ne!(received[2].op_id, modify.op_id, "a new target, a new op id");
    let a = current(&tenant, "t/a").await;
    assert_eq!(applied_properties(&a).get("v"), Some(&json!("3")));
}

#[tokio::test]
async fn removing_an_item_while_its_create_runs_cancels_the_create_and_deletes_what_it_made() {
    let recorder = Recorder::new();
    let gate = Gate::new();
    recorder.script(OperationKind::Create, r("t/a"), [Step::Hold(gate.clone())]);
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    submit(&tenant, vec![plain("t/a", json!({}))]).await;
    let create = wait_for_label(&recorder, "create t/a").await;

    let generation = submit(&tenant, Vec::new()).await;
    recorder.wait_for_cancellation(&create.op_id).await;
    gate.open();

    recorder.wait_for_operations(2).await;
    ready(&tenant, &recorder, generation).await;
    assert_eq!(recorder.labels(), ["create t/a", "delete t/a"]);
    assert!(tenant.current().await.is_empty());
}

#[tokio::test]
async fn an_operation_is_not_cancelled_when_only_another_items_intent_changes() {
    let recorder = Recorder::new();
    let gate = Gate::new();
    recorder.script(OperationKind::Create, r("t/a"), [Step::Hold(gate.clone())]);
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    submit(
        &tenant,
        vec![plain("t/a", json!({})), plain("t/b", json!({"v": "1"}))],
    )
    .await;
    wait_for_label(&recorder, "create t/a").await;
    tenant
        .wait_for_state("t", "b", v1::ItemState::Created)
        .await;

    let generation = submit(
        &tenant,
        vec![plain("t/a", json!({})), plain("t/b", json!({"v": "2"}))],
    )
    .await;
    wait_for_label(&recorder, "modify t/b").await;
    tenant
        .wait_for_item("t", "b", "modified", |s| {
            s.state == v1::ItemState::Created as i32 && s.operation.is_none()
        })
        .await;
    assert_state(&tenant, "t/a", v1::ItemState::Creating).await;
    assert!(
        recorder.cancelled().is_empty(),
        "{:?}",
        recorder.cancelled()
    );

    gate.open();
    ready(&tenant, &recorder, generation).await;
    assert!(
        recorder.cancelled().is_empty(),
        "{:?}",
        recorder.cancelled()
    );
    assert_phases(
        &recorder.labels(),
        &[&["create t/a", "create t/b"], &["modify t/b"]],
    );
}

// ---------------------------------------------------------------------------
// Terminal failures
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_terminally_failed_modify_stalls_the_tenant_and_holds_back_new_dependents_until_the_intent_changes()
 {
    let recorder = Recorder::new();
    recorder.fail_times(OperationKind::Modify, r("t/base"), 1, Code::InvalidArgument);
    let (tenant, _agent) = start_types(&["t"], &recorder).await;
    let generation = submit(&tenant, vec![plain("t/base", json!({"v": "1"}))]).await;
    recorder.wait_for_operations(1).await;
    ready(&tenant, &recorder, generation).await;

    let with_app = |v: &str| {
        vec![
            plain("t/base", json!({"v": v})),
            item("t/app", json!({}), vec![on("t/base")]),
        ]
    };
    submit(&tenant, with_app("bad")).await;
    recorder.wait_for_operations(2).await;
    let status = stalled(&tenant, &recorder).await;
    assert_stalled(&status);
    let base = current(&tenant, "t/base").await;
    assert_eq!(base.state, v1::ItemState::Failed as i32, "{base:#?}");
    assert_eq!(base.last_operation, v1::OperationKind::Modify as i32);
    let app = current(&tenant, "t/app").await;
    assert_eq!(app.state, v1::ItemState::Pending as i32, "{app:#?}");
    assert_eq!(
        recorder.labels(),
        ["create t/base", "modify t/base"],
        "no retry, and app is not created against a failed modify"
    );

    let generation = submit(&tenant, with_app("good")).await;
    recorder.wait_for_operations(4).await;
    let status = ready(&tenant, &recorder, generation).await;
    assert!(!condition_holds(&status, "Stalled"), "{status:#?}");
    assert_eq!(recorder.labels()[2..], ["modify t/base", "create t/app"]);
}

#[tokio::test]
async fn exhausting_max_attempts_fails_the_item_terminally_and_stalls_the_tenant() {
    let recorder = Recorder::new();
    recorder.fail_times(OperationKind::Create, r("t/a"), 5, Code::Unavailable);
    let (tenant, _agent) = start(vec![spec("t").max_attempts(2)], &recorder).await;

    submit(&tenant, vec![plain("t/a", json!({}))]).await;
    recorder.wait_for_operations(2).await;
    let status = stalled(&tenant, &recorder).await;
    assert_stalled(&status);
    let a = current(&tenant, "t/a").await;
    assert_eq!(a.state, v1::ItemState::Failed as i32, "{a:#?}");
    assert_eq!(a.attempts, 2, "{a:#?}");
    assert_eq!(
        a.last_error.as_ref().map(|e| e.code),
        Some(Code::Unavailable as i32)
    );
    assert_eq!(
        recorder.labels(),
        ["create t/a", "create t/a"],
        "no third attempt"
    );
}
