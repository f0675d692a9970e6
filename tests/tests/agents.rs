//! Reconciliation end to end with real SDK agents: the order in which an
//! agent receives operations, failures, retries, timeouts, cancellation,
//! lost outcomes and type ownership, all observed through the real binary.
//!
//! Item names are chosen so that the expected order differs from the order
//! by identity (the order the planner gives independent operations): an
//! ordering rule that broke would show up as a different order.

use reconciled_client::agent::{AgentEvent, ItemRef, OperationKind, ResultKind, TypeSpec};
use reconciled_tests::agents::{
    Gate, Received, Recorder, RunningAgent, Step, TestTenant, condition, condition_holds,
    external_put, item_needing,
};
use reconciled_tests::api::item;
use reconciled_tests::proto::v1;
use serde_json::json;
use std::time::Duration;
use tonic::Code;

fn labels(received: &[Received]) -> Vec<String> {
    received.iter().map(Received::label).collect()
}

fn t_ref(name: &str) -> ItemRef {
    ItemRef::new("t", name)
}

/// A tenant with one agent (id `agent-1`) that handles type `spec` with
/// `recorder`, registered.
async fn tenant_with_agent(spec: TypeSpec, recorder: &Recorder) -> (TestTenant, RunningAgent) {
    let tenant = TestTenant::start("acme").await;
    let mut agent = RunningAgent::start(tenant.agent("agent-1").item_type(spec, recorder.clone()));
    agent.connected().await;
    (tenant, agent)
}

#[tokio::test]
async fn a_chain_is_created_dependencies_first() {
    let recorder = Recorder::new();
    let (tenant, _agent) = tenant_with_agent(TypeSpec::new("t"), &recorder).await;

    // a needs b, b needs c: by identity the order would be a, b, c.
    tenant
        .submit(vec![
            item_needing("t", "a", json!({}), &["t/b"]),
            item_needing("t", "b", json!({}), &["t/c"]),
            item("t", "c", json!({})),
        ])
        .await;

    let received = recorder.wait_for_operations(3).await;
    assert_eq!(
        labels(&received),
        ["create t/c", "create t/b", "create t/a"]
    );
    let status = tenant.wait_until_ready().await;
    assert_eq!(status.connected_item_types, ["t"], "the agent's type");
    assert_eq!(
        status.items_by_state.get("CREATED"),
        Some(&3),
        "{status:#?}"
    );
    assert_eq!(recorder.received().len(), 3, "nothing else ran");
}

#[tokio::test]
async fn an_emptied_intent_deletes_dependents_first() {
    let recorder = Recorder::new();
    let (tenant, _agent) = tenant_with_agent(TypeSpec::new("t"), &recorder).await;
    // c needs b, b needs a: deleting by identity would go a, b, c.
    tenant
        .submit(vec![
            item("t", "a", json!({})),
            item_needing("t", "b", json!({}), &["t/a"]),
            item_needing("t", "c", json!({}), &["t/b"]),
        ])
        .await;
    recorder.wait_for_operations(3).await;
    tenant.wait_until_ready().await;

    tenant.submit(vec![]).await;

    let received = recorder.wait_for_operations(6).await;
    assert_eq!(
        labels(&received[3..]),
        ["delete t/c", "delete t/b", "delete t/a"]
    );
    let status = tenant.wait_until_ready().await;
    assert!(status.items_by_state.is_empty(), "{status:#?}");
    assert!(tenant.current().await.is_empty(), "every item is gone");
}

#[tokio::test]
async fn changing_a_recreate_property_recreates_the_item_and_its_dependents_around_it() {
    let recorder = Recorder::new();
    let (tenant, _agent) =
        tenant_with_agent(TypeSpec::new("t").recreate_on_change(["/id"]), &recorder).await;
    let intent = |id: u32| {
        vec![
            item("t", "base", json!({"id": id, "mtu": 1500})),
            item_needing("t", "app", json!({"port": 80}), &["t/base"]),
        ]
    };
    tenant.submit(intent(1)).await;
    let created = recorder.wait_for_operations(2).await;
    assert_eq!(labels(&created), ["create t/base", "create t/app"]);
    tenant.wait_until_ready().await;

    tenant.submit(intent(2)).await;

    let received = recorder.wait_for_operations(6).await;
    assert_eq!(
        labels(&received[2..]),
        [
            "delete t/app",
            "delete t/base",
            "create t/base",
            "create t/app"
        ],
        "a change under /id is a delete + create, never a modify"
    );
    assert_eq!(
        received[3].property("id"),
        Some(&json!(1)),
        "deletes the old"
    );
    assert_eq!(
        received[4].property("id"),
        Some(&json!(2)),
        "creates the new"
    );
    tenant.wait_until_ready().await;
    let base = tenant.item("t", "base").await.expect("base exists");
    let applied = base.applied.and_then(|a| a.properties).expect("applied");
    assert_eq!(
        applied.fields.get("id").and_then(|v| v.kind.clone()),
        Some(prost_types::value::Kind::NumberValue(2.0))
    );
    assert_eq!(recorder.received().len(), 6, "nothing else ran");
}

#[tokio::test]
async fn a_dependent_waits_until_its_missing_dependency_is_intended_and_created() {
    let recorder = Recorder::new();
    let (tenant, _agent) = tenant_with_agent(TypeSpec::new("t"), &recorder).await;

    // a needs z, which nobody intends yet.
    tenant
        .submit(vec![item_needing("t", "a", json!({}), &["t/z"])])
        .await;
    let waiting = tenant
        .wait_for_item("t", "a", "waiting for t/z", |status| {
            status.state == v1::ItemState::Pending as i32
                && status.pending_operation == v1::OperationKind::Create as i32
                && status.reason == v1::WaitReason::Dependency as i32
        })
        .await;
    assert!(
        waiting
            .blocked_by
            .iter()
            .any(|b| b.item.as_ref().is_some_and(|r| r.name == "z")),
        "{waiting:#?}"
    );
    tenant.wait_until_quiescent().await;
    assert!(
        recorder.received().is_empty(),
        "nothing may run while the dependency is missing: {:?}",
        recorder.labels()
    );

    tenant
        .submit(vec![
            item_needing("t", "a", json!({}), &["t/z"]),
            item("t", "z", json!({})),
        ])
        .await;

    let received = recorder.wait_for_operations(2).await;
    assert_eq!(labels(&received), ["create t/z", "create t/a"]);
    tenant.wait_until_ready().await;
}

#[tokio::test]
async fn a_dependent_of_an_external_item_is_created_once_the_item_is_reported() {
    let recorder = Recorder::new();
    let (tenant, _agent) = tenant_with_agent(TypeSpec::new("t"), &recorder).await;
    let mut uplink = item("link", "uplink", json!({}));
    uplink.external = true;
    tenant
        .submit(vec![
            uplink,
            item_needing("t", "a", json!({}), &["link/uplink"]),
        ])
        .await;
    tenant
        .wait_for_item("t", "a", "waiting for link/uplink", |status| {
            status.reason == v1::WaitReason::Dependency as i32
        })
        .await;
    tenant.wait_until_quiescent().await;
    assert!(
        recorder.received().is_empty(),
        "nothing may run before the external item is reported: {:?}",
        recorder.labels()
    );

    tenant
        .report_external(vec![external_put("link", "uplink", json!({"up": true}))])
        .await;

    let received = recorder.wait_for_operations(1).await;
    assert_eq!(labels(&received), ["create t/a"]);
    tenant
        .wait_for_state("t", "a", v1::ItemState::Created)
        .await;
    tenant.wait_until_ready().await;
    assert_eq!(
        recorder.received().len(),
        1,
        "the external item is never operated on"
    );
}

#[tokio::test]
async fn a_retryable_failure_holds_back_dependents_until_the_retry_succeeds() {
    let recorder = Recorder::new();
    recorder.fail_times(OperationKind::Create, t_ref("a"), 1, Code::Unavailable);
    let (tenant, _agent) = tenant_with_agent(
        TypeSpec::new("t").retry_static(Duration::from_millis(100)),
        &recorder,
    )
    .await;

    tenant
        .submit(vec![
            item("t", "a", json!({})),
            item_needing("t", "b", json!({}), &["t/a"]),
        ])
        .await;

    let received = recorder.wait_for_operations(3).await;
    assert_eq!(
        labels(&received),
        ["create t/a", "create t/a", "create t/b"],
        "b waits for a's retry"
    );
    assert_eq!(
        (received[0].attempt, received[1].attempt),
        (1, 2),
        "the retry is attempt 2"
    );
    assert_eq!(received[2].attempt, 1);
    tenant.wait_until_ready().await;
    let a = tenant.item("t", "a").await.expect("a exists");
    assert_eq!(a.last_error, None, "a success clears the error: {a:#?}");
}

#[tokio::test]
async fn a_terminal_failure_stalls_the_tenant_until_the_intent_changes() {
    let recorder = Recorder::new();
    recorder.fail_times(OperationKind::Create, t_ref("a"), 1, Code::InvalidArgument);
    let (tenant, _agent) = tenant_with_agent(
        TypeSpec::new("t").retry_static(Duration::from_millis(100)),
        &recorder,
    )
    .await;
    let intent = |size: u32| {
        vec![
            item("t", "a", json!({"size": size})),
            item_needing("t", "b", json!({}), &["t/a"]),
        ]
    };
    tenant.submit(intent(1)).await;

    let status = tenant
        .wait_for_status("Stalled", |status| condition_holds(status, "Stalled"))
        .await;
    let stalled = condition(&status, "Stalled").expect("Stalled");
    assert_eq!(stalled.reason, "TerminalFailure", "{status:#?}");
    assert_eq!(
        condition(&status, "Reconciling").map(|c| c.status),
        Some(v1::ConditionStatus::False as i32),
        "Stalled and Reconciling never hold together: {status:#?}"
    );
    let a = tenant.item("t", "a").await.expect("a is current");
    assert_eq!(a.state, v1::ItemState::Failed as i32, "{a:#?}");
    assert_eq!(
        a.last_error.as_ref().map(|e| e.code),
        Some(Code::InvalidArgument as i32)
    );
    assert_eq!(
        recorder.labels(),
        ["create t/a"],
        "no retry, and b is never created against a failed a"
    );

    tenant.submit(intent(2)).await;

    let received = recorder.wait_for_operations(3).await;
    assert_eq!(labels(&received[1..]), ["create t/a", "create t/b"]);
    assert_eq!(received[1].property("size"), Some(&json!(2)));
    let status = tenant.wait_until_ready().await;
    assert_eq!(
        condition(&status, "Stalled").map(|c| c.status),
        Some(v1::ConditionStatus::False as i32),
        "{status:#?}"
    );
}

#[tokio::test]
async fn a_scoped_reconcile_wait_stops_as_stalled_when_its_item_waits_on_a_failure_two_levels_down()
{
    let recorder = Recorder::new();
    recorder.fail_times(OperationKind::Create, t_ref("c"), 1, Code::InvalidArgument);
    let (tenant, _agent) = tenant_with_agent(TypeSpec::new("t"), &recorder).await;
    // a (in subgraph `top`) needs b, b needs c; c fails for good. a's own
    // blocker is b, which is merely "not created": only b shows c's failure.
    let mut a = item_needing("t", "a", json!({}), &["t/b"]);
    a.subgraph = "top".into();
    tenant
        .submit(vec![
            a,
            item_needing("t", "b", json!({}), &["t/c"]),
            item("t", "c", json!({})),
        ])
        .await;
    tenant
        .wait_for_status("Stalled", |status| condition_holds(status, "Stalled"))
        .await;

    // However many idle passes it may run, a wait on `top` ends as stalled
    // (nothing runs until the intent changes), not as "work remains".
    let reply = wait_for_top(&tenant, u32::MAX, 30).await;
    assert!(!reply.converged, "{reply:#?}");
    assert!(
        !reply.require_rerun,
        "a stalled scope needs an intent change, not another pass: {reply:#?}"
    );
    assert_eq!(reply.iterations, 1, "it stops at once: {reply:#?}");
}

/// The reply to a `Reconcile{wait}` of subgraph `top` with at most
/// `max_no_progress` idle passes and a timeout of `timeout_secs`.
async fn wait_for_top(
    tenant: &TestTenant,
    max_no_progress: u32,
    timeout_secs: i64,
) -> v1::ReconcileResponse {
    let request = v1::ReconcileRequest {
        tenant: tenant.name.clone(),
        subgraph: "top".into(),
        wait: true,
        timeout: Some(prost_types::Duration {
            seconds: timeout_secs,
            nanos: 0,
        }),
        max_no_progress_iterations: max_no_progress,
        ..Default::default()
    };
    tenant
        .reconciler()
        .reconcile(request)
        .await
        .expect("Reconcile succeeds")
        .into_inner()
}

/// `a` in subgraph `top`, needing `b` outside it.
fn top_needing_b() -> Vec<v1::Item> {
    let mut a = item_needing("t", "a", json!({}), &["t/b"]);
    a.subgraph = "top".into();
    vec![a, item("t", "b", json!({}))]
}

#[tokio::test]
async fn a_scoped_reconcile_wait_waits_for_a_retry_of_what_its_items_wait_on() {
    let recorder = Recorder::new();
    recorder.fail_times(OperationKind::Create, t_ref("b"), 1, Code::Unavailable);
    let (tenant, _agent) = tenant_with_agent(
        TypeSpec::new("t").retry_static(Duration::from_secs(5)),
        &recorder,
    )
    .await;
    tenant.submit(top_needing_b()).await;
    recorder.wait_for_operations(1).await;

    // b's retry comes 5 s after its failure, long after one idle pass (1 s)
    // would have given up: a retry to come is work under way, as in the
    // tenant's Reconciling condition.
    let reply = wait_for_top(&tenant, 1, 60).await;
    assert!(reply.converged, "{reply:#?}");
    assert_eq!(
        recorder.labels(),
        ["create t/b", "create t/b", "create t/a"]
    );
}

#[tokio::test]
async fn a_scoped_reconcile_wait_runs_no_idle_pass_while_what_its_items_wait_on_runs() {
    let gate = Gate::new();
    let recorder = Recorder::new();
    recorder.script(
        OperationKind::Create,
        t_ref("b"),
        [Step::Hold(gate.clone())],
    );
    let (tenant, _agent) = tenant_with_agent(TypeSpec::new("t"), &recorder).await;
    tenant.submit(top_needing_b()).await;
    recorder.wait_for_operations(1).await;

    // b's Create runs (outside `top`) for the whole wait: the wait follows
    // it to its timeout instead of counting idle passes and giving up.
    let reply = wait_for_top(&tenant, 1, 3).await;
    assert!(!reply.converged && reply.require_rerun, "{reply:#?}");
    assert_eq!(
        reply.iterations, 1,
        "no idle pass while an operation it waits on runs: {reply:#?}"
    );
    gate.open();
    tenant.wait_until_ready().await;
}

#[tokio::test]
async fn independent_items_are_dispatched_in_parallel() {
    const ITEMS: usize = 20;
    let gate = Gate::new();
    let recorder = Recorder::answering(Step::Hold(gate.clone()));
    let (tenant, _agent) = tenant_with_agent(TypeSpec::new("t"), &recorder).await;

    tenant
        .submit(
            (0..ITEMS)
                .map(|i| item("t", &format!("item-{i:02}"), json!({"i": i})))
                .collect(),
        )
        .await;

    // Nothing answers before all of them arrived: they are in flight at once.
    let received = recorder.wait_for_operations(ITEMS).await;
    assert!(received.iter().all(|r| r.kind == OperationKind::Create));
    let status = tenant
        .wait_for_status("every operation in flight", |status| {
            status.operations_in_flight == ITEMS as u64
        })
        .await;
    assert_eq!(status.items_by_state.get("CREATING"), Some(&(ITEMS as u64)));

    gate.open();
    let status = tenant.wait_until_ready().await;
    assert_eq!(status.items_by_state.get("CREATED"), Some(&(ITEMS as u64)));
    assert_eq!(
        recorder.received().len(),
        ITEMS,
        "each item was created once"
    );
}

#[tokio::test]
async fn an_operation_lost_with_its_agent_is_redelivered_to_the_agent_that_comes_back() {
    let tenant = TestTenant::start("acme").await;
    let lost = Recorder::answering(Step::Hang);
    let mut first = RunningAgent::start(
        tenant
            .agent("agent-1")
            .item_type(TypeSpec::new("t"), lost.clone()),
    );
    first.connected().await;
    tenant.submit(vec![item("t", "a", json!({"v": 1}))]).await;
    let sent = lost.wait_for_operations(1).await.remove(0);
    assert_eq!(sent.label(), "create t/a");

    first.kill().await;

    let unknown = tenant
        .wait_for_state("t", "a", v1::ItemState::Unknown)
        .await;
    assert_eq!(
        unknown.operation.as_ref().map(|o| o.op_id.as_str()),
        Some(sent.op_id.as_str()),
        "the unknown item keeps its journaled operation: {unknown:#?}"
    );

    let recorder = Recorder::new();
    let mut second = RunningAgent::start(
        tenant
            .agent("agent-1")
            .item_type(TypeSpec::new("t"), recorder.clone()),
    );
    second.connected().await;
    let redelivered = recorder.wait_for_operations(1).await.remove(0);
    assert_eq!(redelivered.label(), "create t/a");
    assert_eq!(
        (redelivered.op_id.as_str(), redelivered.attempt),
        (sent.op_id.as_str(), sent.attempt),
        "a re-delivery keeps the op id and the attempt"
    );
    assert_eq!(redelivered.property("v"), Some(&json!(1)));

    let created = tenant
        .wait_for_state("t", "a", v1::ItemState::Created)
        .await;
    assert_eq!(created.operation, None, "{created:#?}");
    tenant.wait_until_ready().await;
    assert_eq!(recorder.received().len(), 1, "nothing else ran");
}

#[tokio::test]
async fn an_agent_shutting_down_hands_back_what_it_could_not_finish() {
    // The operation honours cancellation; the agent's drain timeout runs
    // out while it still runs. Handed back, it is not UNKNOWN at the server
    // (nothing may have happened), and the next agent gets it under the
    // same op id and attempt.
    let tenant = TestTenant::start("acme").await;
    let slow = Recorder::answering(Step::UntilCancelled);
    let mut first = RunningAgent::start(
        tenant
            .agent("agent-1")
            .item_type(TypeSpec::new("t"), slow.clone())
            .drain_timeout(Duration::from_millis(200)),
    );
    first.connected().await;
    tenant.submit(vec![item("t", "a", json!({"v": 1}))]).await;
    let sent = slow.wait_for_operations(1).await.remove(0);

    first.stop().await.expect("the agent shuts down cleanly");
    assert_eq!(
        slow.cancelled(),
        std::slice::from_ref(&sent.op_id),
        "it was cancelled"
    );
    let handed_back = tenant
        .wait_for_status("the agent's session gone", |status| {
            !status.connected_item_types.iter().any(|t| t == "t")
        })
        .await;
    let a = tenant.item("t", "a").await.expect("t/a is listed");
    assert_ne!(a.state(), v1::ItemState::Unknown, "handed back: {a:#?}");
    assert_eq!(a.attempts, 0, "no attempt used: {a:#?}");
    assert!(!condition_holds(&handed_back, "Ready"));

    let recorder = Recorder::new();
    let mut second = RunningAgent::start(
        tenant
            .agent("agent-1")
            .item_type(TypeSpec::new("t"), recorder.clone()),
    );
    second.connected().await;
    let again = recorder.wait_for_operations(1).await.remove(0);
    assert_eq!(
        (again.label().as_str(), again.op_id.as_str(), again.attempt),
        ("create t/a", sent.op_id.as_str(), sent.attempt),
        "asked again as the same operation"
    );
    tenant.wait_until_ready().await;
}

#[tokio::test]
async fn a_second_agent_is_refused_a_held_type_and_takes_over_when_the_holder_leaves() {
    let tenant = TestTenant::start("acme").await;
    let first_recorder = Recorder::new();
    let mut first = RunningAgent::start(
        tenant
            .agent("first")
            .item_type(TypeSpec::new("t"), first_recorder.clone()),
    );
    let first_grants = first.connected().await;
    assert_eq!(first_grants.len(), 1);

    let second_recorder = Recorder::new();
    let mut second = RunningAgent::start(
        tenant
            .agent("second")
            .item_type(TypeSpec::new("t"), second_recorder.clone()),
    );
    let refusal = second
        .wait_for_event("a TYPE_HELD refusal", |event| match event {
            AgentEvent::Disconnected { reason, code } => Some((reason.clone(), *code)),
            AgentEvent::Connected { granted, .. } => {
                panic!("the second agent was granted {granted:?} while the first holds t")
            }
            _ => None,
        })
        .await;
    assert_eq!(refusal.1, Some(Code::FailedPrecondition), "{refusal:?}");
    assert!(refusal.0.contains("TYPE_HELD"), "{refusal:?}");

    first.stop().await.expect("the first agent stops cleanly");

    let grants = second.connected().await;
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0].item_type, "t");
    assert!(
        grants[0].epoch > first_grants[0].epoch,
        "a takeover starts a new epoch: {first_grants:?} then {grants:?}"
    );
    tenant.submit(vec![item("t", "a", json!({}))]).await;
    let received = second_recorder.wait_for_operations(1).await;
    assert_eq!(labels(&received), ["create t/a"]);
    tenant.wait_until_ready().await;
    assert!(first_recorder.received().is_empty());
}

#[tokio::test]
async fn a_changed_intent_cancels_the_running_create_accepts_its_late_result_and_then_modifies() {
    let gate = Gate::new();
    let recorder = Recorder::new();
    recorder.script(
        OperationKind::Create,
        t_ref("a"),
        [Step::Hold(gate.clone())],
    );
    let (tenant, _agent) = tenant_with_agent(TypeSpec::new("t"), &recorder).await;
    tenant.submit(vec![item("t", "a", json!({"v": 1}))]).await;
    let create = recorder.wait_for_operations(1).await.remove(0);
    assert_eq!(create.label(), "create t/a");

    tenant.submit(vec![item("t", "a", json!({"v": 2}))]).await;
    recorder.wait_for_cancellation(&create.op_id).await;
    gate.open();

    let received = recorder.wait_for_operations(2).await;
    let modify = &received[1];
    assert_eq!(
        modify.label(),
        "modify t/a",
        "the late DONE counts: the item exists and is modified, not created again"
    );
    assert_eq!(
        modify.previous.as_ref().and_then(|p| p.get("v")),
        Some(&json!(1))
    );
    assert_eq!(modify.property("v"), Some(&json!(2)));
    tenant.wait_until_ready().await;
    let a = tenant.item("t", "a").await.expect("a exists");
    let applied = a.applied.and_then(|item| item.properties).expect("applied");
    assert_eq!(
        applied.fields.get("v").and_then(|v| v.kind.clone()),
        Some(prost_types::value::Kind::NumberValue(2.0))
    );
    assert_eq!(recorder.received().len(), 2, "nothing else ran");
}

#[tokio::test]
async fn an_operation_that_outlives_its_timeout_fails_with_deadline_exceeded_and_is_retried() {
    let recorder = Recorder::new();
    // The retry keeps the op id (DESIGN 4); the SDK starts attempt 2 once
    // the cancelled attempt 1 has returned, so the configurator honours
    // the cancel here.
    recorder.script(OperationKind::Create, t_ref("a"), [Step::UntilCancelled]);
    let (tenant, _agent) = tenant_with_agent(
        TypeSpec::new("t")
            .operation_timeout(Duration::from_millis(300))
            .retry_static(Duration::from_secs(1)),
        &recorder,
    )
    .await;

    tenant.submit(vec![item("t", "a", json!({}))]).await;

    let failed = tenant.wait_for_state("t", "a", v1::ItemState::Failed).await;
    assert_eq!(
        failed.last_error.as_ref().map(|e| e.code),
        Some(Code::DeadlineExceeded as i32),
        "{failed:#?}"
    );
    assert_eq!(failed.attempts, 1, "{failed:#?}");
    let received = recorder.wait_for_operations(2).await;
    assert_eq!(labels(&received), ["create t/a", "create t/a"]);
    assert_eq!((received[0].attempt, received[1].attempt), (1, 2));
    assert_eq!(
        received[0].op_id, received[1].op_id,
        "a retry keeps its op id"
    );
    assert!(
        recorder.cancelled().contains(&received[0].op_id),
        "the timed-out attempt is cancelled on the agent"
    );
    tenant
        .wait_for_state("t", "a", v1::ItemState::Created)
        .await;
    tenant.wait_until_ready().await;
}

#[tokio::test]
async fn a_long_running_create_holds_back_its_dependents_until_it_finishes() {
    let gate = Gate::new();
    let recorder = Recorder::new();
    recorder.script(
        OperationKind::Create,
        t_ref("a"),
        [Step::LongRunning(gate.clone())],
    );
    let (tenant, mut agent) = tenant_with_agent(TypeSpec::new("t"), &recorder).await;
    tenant
        .submit(vec![
            item("t", "a", json!({})),
            item_needing("t", "b", json!({}), &["t/a"]),
            item("t", "c", json!({})),
        ])
        .await;
    let create_a = recorder
        .wait_until("create t/a", |received, _| {
            received.iter().find(|r| r.label() == "create t/a").cloned()
        })
        .await;
    agent
        .wait_for_event("IN_PROGRESS sent for create t/a", |event| match event {
            AgentEvent::ResultSent {
                op_id,
                outcome: ResultKind::InProgress,
                ..
            } if *op_id == create_a.op_id => Some(()),
            _ => None,
        })
        .await;

    // The independent item goes on; a stays in flight and b waits for it.
    tenant
        .wait_for_state("t", "c", v1::ItemState::Created)
        .await;
    let a = tenant.item("t", "a").await.expect("a is current");
    assert_eq!(a.state, v1::ItemState::Creating as i32, "{a:#?}");
    let b = tenant.item("t", "b").await.expect("b is current");
    assert_eq!(b.state, v1::ItemState::Pending as i32, "{b:#?}");
    assert!(
        !recorder.labels().contains(&"create t/b".to_owned()),
        "b must wait for a: {:?}",
        recorder.labels()
    );

    gate.open();
    let received = recorder.wait_for_operations(3).await;
    assert_eq!(received[2].label(), "create t/b", "{:?}", labels(&received));
    let status = tenant.wait_until_ready().await;
    assert_eq!(
        status.items_by_state.get("CREATED"),
        Some(&3),
        "{status:#?}"
    );
}

/// An agent reading its token from a file goes on after `RotateToken`
/// ends its stream: once the new token is in the file it registers again
/// and applies what was submitted meanwhile (docs/agents.md, Tokens).
#[tokio::test]
async fn an_agent_with_a_token_file_survives_a_rotation_once_the_file_holds_the_new_token() {
    use reconciled_client::agent::Token;
    let mut tenant = TestTenant::start("acme").await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("token");
    std::fs::write(&path, format!("{}\n", tenant.token)).expect("write the token file");
    let recorder = Recorder::new();
    let mut agent = RunningAgent::start(
        reconciled_client::agent::Agent::builder(
            tenant.server.endpoint(),
            "acme",
            Token::file(&path),
        )
        .agent_id("agent-1")
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(250))
        .item_type(TypeSpec::new("t"), recorder.clone()),
    );
    agent.connected().await;

    let admin = tenant.server.admin_token();
    tenant.token = reconciled_tests::api::rotate_token(&tenant.channel, &admin, "acme").await;
    agent
        .wait_for_event("the rotation ending the stream", |event| match event {
            AgentEvent::Disconnected { code, .. } => {
                (*code == Some(Code::Unauthenticated)).then_some(())
            }
            _ => None,
        })
        .await;
    tenant.submit(vec![item("t", "a", json!({}))]).await;

    std::fs::write(&path, format!("{}\n", tenant.token)).expect("write the new token");
    agent.connected().await;
    let received = recorder.wait_for_operations(1).await;
    assert_eq!(labels(&received), ["create t/a"]);
    tenant.wait_until_ready().await;
    agent.stop().await.expect("a clean shutdown");
}
