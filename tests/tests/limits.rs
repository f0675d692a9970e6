//! Limits (DESIGN section 9): each one refuses what exceeds it with
//! `RESOURCE_EXHAUSTED` and a `QuotaFailure` or `RetryInfo`, and the server
//! keeps serving afterwards.

use std::time::Duration;

use reconciled_client::agent::{AgentEvent, ItemRef, OperationKind, TypeSpec};
use reconciled_tests::agents::{DEADLINE, Gate, Recorder, RunningAgent, Step, TestTenant};
use reconciled_tests::api::{self, item};
use reconciled_tests::proto::v1;
use reconciled_tests::{ServerOptions, ServerProcess};
use serde_json::json;
use tonic::{Code, Status};
use tonic_types::StatusExt as _;

/// The `QuotaFailure` subjects of a status.
fn quota_subjects(status: &Status) -> Vec<String> {
    status
        .get_error_details()
        .quota_failure()
        .map(|failure| {
            failure
                .violations
                .iter()
                .map(|v| v.subject.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// The `RetryInfo` delay of a status.
fn retry_delay(status: &Status) -> Option<Duration> {
    status
        .get_error_details()
        .retry_info()
        .and_then(|info| info.retry_delay)
}

fn list_tenants() -> v1::ListTenantsRequest {
    v1::ListTenantsRequest::default()
}

/// Calls ListTenants on `channel` until it succeeds, for at most the
/// [`DEADLINE`].
async fn served_again(channel: &tonic::transport::Channel, token: &str) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match api::tenants(channel, token)
            .list_tenants(list_tenants())
            .await
        {
            Ok(_) => return,
            Err(status) if tokio::time::Instant::now() >= deadline => {
                panic!("the server did not serve again within {DEADLINE:?}: {status:?}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

async fn server_with(args: &[&str]) -> ServerProcess {
    let mut options = ServerOptions::default();
    for arg in args {
        options = options.arg(*arg);
    }
    ServerProcess::start(options).await.expect("server starts")
}

#[tokio::test]
async fn calls_on_connections_over_the_limit_are_refused_until_a_connection_closes() {
    let server = server_with(&["--max-connections", "1"]).await;
    let admin = server.admin_token();
    let first = server.channel().await.expect("connects");
    api::tenants(&first, &admin)
        .list_tenants(list_tenants())
        .await
        .expect("the first connection takes the only slot");

    let second = server.channel().await.expect("connects");
    let refused = api::tenants(&second, &admin)
        .list_tenants(list_tenants())
        .await
        .expect_err("a second connection is over the limit");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("max_connections"), "{refused:?}");
    assert!(retry_delay(&refused).is_some(), "{refused:?}");

    // Health checks are never limited.
    let mut health = tonic_health::pb::health_client::HealthClient::new(second.clone());
    health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("health is served on any connection");

    drop(first);
    served_again(&second, &admin).await;
}

#[tokio::test]
async fn calls_over_the_request_rate_are_refused_with_a_retry_delay_then_served() {
    let server = server_with(&["--max-requests-per-second", "2"]).await;
    let admin = server.admin_token();
    let channel = server.channel().await.expect("connects");
    let mut refused = None;
    for _ in 0..50 {
        if let Err(status) = api::tenants(&channel, &admin)
            .list_tenants(list_tenants())
            .await
        {
            refused = Some(status);
            break;
        }
    }
    let refused = refused.expect("back-to-back calls exceed 2 per second");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let delay = retry_delay(&refused).expect("RetryInfo says when to retry");
    assert!(delay <= Duration::from_secs(1), "{delay:?}");
    served_again(&channel, &admin).await;
}

/// Submits `items` to `tenant` in subgraph `subgraph`.
async fn submit_to(
    channel: &tonic::transport::Channel,
    token: &str,
    tenant: &str,
    subgraph: &str,
    items: Vec<v1::Item>,
) -> Result<v1::SubmitIntentResponse, Status> {
    let items = items
        .into_iter()
        .map(|mut item| {
            item.subgraph = subgraph.into();
            item
        })
        .collect();
    api::reconciler(channel, token)
        .submit_intent(v1::SubmitIntentRequest {
            subgraph: subgraph.into(),
            ..api::submit(tenant, items)
        })
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn a_tenant_over_its_byte_budget_waits_its_debt_out_while_others_are_served() {
    // 25 kB per second: four seconds' worth (100 kB) saved up.
    let server = server_with(&["--max-tenant-bytes-per-second", "25000"]).await;
    let channel = server.channel().await.expect("connects");
    let admin = server.admin_token();
    let flooder = api::create_tenant(&channel, &admin, "flooder").await;
    let bystander = api::create_tenant(&channel, &admin, "bystander").await;
    // 300 kB: more than the burst, still accepted once (the budget is not
    // in debt), and the tenant is 200 kB in debt afterwards (8 s to repay).
    let big: Vec<v1::Item> = (0..30)
        .map(|index| {
            item(
                "blob",
                &format!("b{index:02}"),
                json!({ "data": "x".repeat(10_000) }),
            )
        })
        .collect();
    submit_to(&channel, &flooder, "flooder", "big", big)
        .await
        .expect("a message larger than the burst is accepted once");

    // A request over the always-admitted 4 KiB is refused while in debt.
    let late = || vec![item("svc", "late", json!({ "pad": "y".repeat(5_000) }))];
    let refused = submit_to(&channel, &flooder, "flooder", "small", late())
        .await
        .expect_err("the tenant is in debt");
    let refused_at = std::time::Instant::now();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("max_tenant_bytes_per_second"),
        "{refused:?}"
    );
    let delay = retry_delay(&refused).expect("RetryInfo says when the debt is repaid");
    assert!(
        delay > Duration::from_secs(2) && delay <= Duration::from_millis(8_100),
        "up to 200 kB of debt at 25 kB/s: {delay:?}"
    );
    // The refused request changed nothing; a small read is still served.
    let graph = api::reconciler(&channel, &flooder)
        .get_graph(v1::GetGraphRequest {
            tenant: "flooder".into(),
            view: v1::GraphView::Intended.into(),
            ..Default::default()
        })
        .await
        .expect("graph")
        .into_inner();
    assert_eq!(
        graph.intended.len(),
        30,
        "only the accepted intent is stored"
    );

    // Another tenant's budget is its own.
    submit_to(
        &channel,
        &bystander,
        "bystander",
        "small",
        vec![item("svc", "a", json!({}))],
    )
    .await
    .expect("the bystander is served at once");

    // After the delay RetryInfo named, the flooder is served again.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match submit_to(&channel, &flooder, "flooder", "small", late()).await {
            Ok(_) => break,
            Err(status)
                if status.code() == Code::ResourceExhausted
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(retry_delay(&status).unwrap_or(Duration::from_millis(100)))
                    .await;
            }
            Err(status) => panic!("the flooder is not served again: {status:?}"),
        }
    }
    assert!(
        refused_at.elapsed() >= delay.mul_f64(0.9),
        "served again only once the debt was repaid ({:?} after the refusal, delay {delay:?})",
        refused_at.elapsed()
    );
}

/// A Reconcile{wait} of `tenant` with a 60 s wait, retried while it is
/// refused (the budget's place may be taken by a short Reconcile of the
/// test for a moment).
fn spawn_reconcile_wait(
    tenant: &TestTenant,
) -> tokio::task::JoinHandle<Result<tonic::Response<v1::ReconcileResponse>, Status>> {
    let mut waiting = tenant.reconciler();
    let name = tenant.name.clone();
    tokio::spawn(async move {
        loop {
            let answer = waiting
                .reconcile(v1::ReconcileRequest {
                    tenant: name.clone(),
                    wait: true,
                    timeout: Some(prost_types::Duration {
                        seconds: 60,
                        nanos: 0,
                    }),
                    ..Default::default()
                })
                .await;
            match answer {
                Err(status) if status.code() == Code::ResourceExhausted => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => return other,
            }
        }
    })
}

#[tokio::test]
async fn unary_calls_beyond_the_concurrency_limit_are_shed() {
    let options = ServerOptions::default()
        .arg("--max-concurrent-requests")
        .arg("1");
    let tenant = TestTenant::start_with(options, "acme").await;
    let items: Vec<v1::Item> = (0..2_000)
        .map(|index| item("t", &format!("n{index}"), json!({"v": index})))
        .collect();
    // Calls that overlap: with one slot, some are shed at once.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let shed = loop {
        let calls: Vec<_> = (0..8)
            .map(|_| {
                let mut client = tenant.reconciler();
                let request = api::submit(&tenant.name, items.clone());
                tokio::spawn(async move { client.submit_intent(request).await })
            })
            .collect();
        let mut shed = None;
        for call in calls {
            if let Err(status) = call.await.expect("the task did not panic")
                && status.code() == Code::ResourceExhausted
            {
                shed = Some(status);
            }
        }
        if let Some(status) = shed {
            break status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no call was shed with one unary slot"
        );
    };
    assert!(
        shed.message().contains("max_concurrent_requests"),
        "{shed:?}"
    );
    assert!(retry_delay(&shed).is_some(), "{shed:?}");
    // The server serves again once the overlap is over.
    tenant.submit(items).await;
}

/// Issue 12, item 9: a Reconcile{wait} takes no unary slot, so one
/// tenant's long waits cannot starve other calls; each tenant has its own
/// budget of Reconcile calls, and the request timeout still ends a wait.
#[tokio::test]
async fn reconcile_waits_take_no_unary_slot_and_have_a_budget_per_tenant() {
    let options = ServerOptions::default()
        .arg("--max-concurrent-requests")
        .arg("1")
        .arg("--max-reconcile-calls-per-tenant")
        .arg("1")
        .arg("--request-timeout-secs")
        .arg("4");
    let tenant = TestTenant::start_with(options, "acme").await;
    let bravo_token =
        api::create_tenant(&tenant.channel, &tenant.server.admin_token(), "bravo").await;
    let gate = Gate::new();
    let recorder = Recorder::new();
    recorder.script(
        OperationKind::Create,
        ItemRef::new("t", "held"),
        [Step::Hold(gate.clone())],
    );
    let mut agent = RunningAgent::start(
        tenant
            .agent("agent-1")
            .item_type(TypeSpec::new("t"), recorder.clone()),
    );
    agent.connected().await;
    tenant.submit(vec![item("t", "held", json!({}))]).await;
    recorder.wait_for_operations(1).await;

    // acme's wait blocks while the operation is held; a second Reconcile of
    // acme is over its budget (which shows the first one runs).
    let waiting = spawn_reconcile_wait(&tenant);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let over_budget = loop {
        let answer = tenant
            .reconciler()
            .reconcile(v1::ReconcileRequest {
                tenant: tenant.name.clone(),
                ..Default::default()
            })
            .await;
        match answer {
            Err(status) if status.code() == Code::ResourceExhausted => break status,
            _ => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "acme's second Reconcile was never refused: {answer:?}"
                );
                // Leave the budget's place to the wait for a moment.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(
        quota_subjects(&over_budget),
        ["max_reconcile_calls_per_tenant"],
        "{over_budget:?}"
    );

    // Meanwhile the only unary slot is free for everyone, and bravo has a
    // Reconcile budget of its own.
    for _ in 0..5 {
        tenant
            .reconciler()
            .get_status(v1::GetStatusRequest {
                tenant: tenant.name.clone(),
            })
            .await
            .expect("a unary call is served while acme waits");
    }
    api::reconciler(&tenant.channel, &bravo_token)
        .reconcile(v1::ReconcileRequest {
            tenant: "bravo".into(),
            ..Default::default()
        })
        .await
        .expect("bravo's Reconcile is not held up by acme's");

    let cut = waiting
        .await
        .expect("the task did not panic")
        .expect_err("the held Reconcile runs into the request timeout");
    assert_eq!(cut.code(), Code::DeadlineExceeded, "{cut:?}");
    assert!(cut.message().contains("request_timeout_secs"), "{cut:?}");

    // Its place in the budget is free again.
    tenant
        .reconciler()
        .reconcile(v1::ReconcileRequest {
            tenant: tenant.name.clone(),
            ..Default::default()
        })
        .await
        .expect("acme's budget is free again");
    gate.open();
    tenant
        .wait_for_state("t", "held", v1::ItemState::Created)
        .await;
}

#[tokio::test]
async fn a_message_over_max_message_bytes_is_a_quota_failure_and_smaller_ones_pass() {
    let options = ServerOptions::default()
        .arg("--max-message-bytes")
        .arg("70000");
    let tenant = TestTenant::start_with(options, "acme").await;
    let big = "x".repeat(30_000);
    let items = (0..3)
        .map(|i| item("t", &format!("big{i}"), json!({ "blob": big })))
        .collect();
    let refused = tenant
        .reconciler()
        .submit_intent(api::submit(&tenant.name, items))
        .await
        .expect_err("about 90 KB is over 70000 bytes");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(
        quota_subjects(&refused),
        ["max_message_bytes"],
        "{refused:?}"
    );

    let accepted = tenant
        .submit(vec![item("t", "big0", json!({ "blob": big }))])
        .await;
    assert!(accepted.changed);
}

#[tokio::test]
async fn tenant_item_and_request_quotas_are_quota_failures() {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("server starts");
    let channel = server.channel().await.expect("connects");
    let token = api::tenants(&channel, &server.admin_token())
        .create_tenant(v1::CreateTenantRequest {
            name: "small".into(),
            limits: Some(v1::TenantLimits {
                max_items: 2,
                max_request_items: 3,
                ..Default::default()
            }),
        })
        .await
        .expect("created")
        .into_inner()
        .token;
    let items = |count: usize| -> Vec<v1::Item> {
        (0..count)
            .map(|i| item("t", &format!("i{i}"), json!({})))
            .collect()
    };
    let mut reconciler = api::reconciler(&channel, &token);

    let refused = reconciler
        .submit_intent(api::submit("small", items(4)))
        .await
        .expect_err("4 items are over max_request_items 3");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(quota_subjects(&refused), ["max_request_items"]);

    let refused = reconciler
        .submit_intent(api::submit("small", items(3)))
        .await
        .expect_err("3 items are over max_items 2");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(quota_subjects(&refused), ["max_items"]);

    let accepted = reconciler
        .submit_intent(api::submit("small", items(2)))
        .await
        .expect("2 items fit")
        .into_inner();
    assert!(accepted.changed);
}

#[tokio::test]
async fn agents_beyond_the_tenants_limit_are_refused_until_one_leaves() {
    let tenant = TestTenant::start_with_limits(
        "acme",
        v1::TenantLimits {
            max_agents: 1,
            ..Default::default()
        },
    )
    .await;

    let mut first = RunningAgent::start(
        tenant
            .agent("agent-1")
            .item_type(TypeSpec::new("a"), Recorder::new()),
    );
    first.connected().await;
    let mut second = RunningAgent::start(
        tenant
            .agent("agent-2")
            .item_type(TypeSpec::new("b"), Recorder::new()),
    );
    let (code, reason) = second
        .wait_for_event("a refusal", |event| match event {
            AgentEvent::Disconnected { reason, code } => Some((*code, reason.clone())),
            _ => None,
        })
        .await;
    assert_eq!(code, Some(Code::ResourceExhausted), "{reason}");
    assert!(reason.contains("max_agents"), "{reason}");

    // A reconnect of the connected agent id is still admitted.
    first.stop().await.expect("stops");
    second.connected().await;
}

#[tokio::test]
async fn a_tenant_never_has_more_operations_in_flight_than_its_limit() {
    let tenant = TestTenant::start_with_limits(
        "acme",
        v1::TenantLimits {
            max_operations_in_flight: 1,
            ..Default::default()
        },
    )
    .await;
    let gate = Gate::new();
    let recorder = Recorder::answering(Step::Hold(gate.clone()));
    let mut agent = RunningAgent::start(
        tenant
            .agent("agent-1")
            .item_type(TypeSpec::new("t").max_in_flight(10), recorder.clone()),
    );
    agent.connected().await;
    tenant
        .submit(
            (0..3)
                .map(|i| item("t", &format!("i{i}"), json!({})))
                .collect(),
        )
        .await;
    recorder.wait_for_operations(1).await;
    // The pass that sent the first operation would have sent all three
    // (the type allows 10): the tenant's limit holds them back.
    assert_eq!(tenant.status().await.operations_in_flight, 1);
    assert_eq!(recorder.received().len(), 1);

    gate.open();
    tenant.wait_until_ready().await;
    assert_eq!(recorder.received().len(), 3, "{:?}", recorder.labels());
}
