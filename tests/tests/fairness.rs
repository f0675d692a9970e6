//! Tenants share the server fairly: a 3-item tenant converges promptly
//! while another tenant works through 50,000 items on the same server.

use std::time::Duration;

use reconciled_client::agent::{Agent, TypeSpec};
use reconciled_tests::agents::{Recorder, RunningAgent, TestTenant, condition_holds, item_needing};
use reconciled_tests::api::{create_tenant, reconciler, status_of};
use serde_json::json;

const BIG: usize = 50_000;
const PER_REQUEST: usize = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_tenant_converges_while_a_big_one_works_through_fifty_thousand_items() {
    let big = TestTenant::start("big").await;
    let big_agent_recorder = Recorder::new();
    let mut big_agent = RunningAgent::start(
        big.agent("big-agent")
            .item_type(TypeSpec::new("t"), big_agent_recorder.clone()),
    );
    big_agent.connected().await;

    let small_token = create_tenant(&big.channel, &big.server.admin_token(), "small").await;
    let small_recorder = Recorder::new();
    let mut small_agent = RunningAgent::start(
        Agent::builder(big.server.endpoint(), "small", &small_token)
            .agent_id("small-agent")
            .item_type(TypeSpec::new("s"), small_recorder.clone()),
    );
    small_agent.connected().await;

    // The big tenant's intent, in subgraphs of 10,000 items per request.
    let mut client = reconciler(&big.channel, &big.token);
    for part in 0..BIG / PER_REQUEST {
        let items = (0..PER_REQUEST)
            .map(|i| {
                let mut item = item_needing("t", &format!("p{part}-i{i:05}"), json!({"i": i}), &[]);
                item.subgraph = format!("part{part}");
                item
            })
            .collect();
        let mut request = reconciled_tests::api::submit("big", items);
        request.subgraph = format!("part{part}");
        client
            .submit_intent(request)
            .await
            .expect("big intent accepted");
    }

    // The small tenant's intent goes in while the big one is busy.
    let small_items = (0..3)
        .map(|i| item_needing("s", &format!("x{i}"), json!({}), &[]))
        .collect();
    reconciler(&big.channel, &small_token)
        .submit_intent(reconciled_tests::api::submit("small", small_items))
        .await
        .expect("small intent accepted");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let small_status = status_of(&big.channel, &small_token, "small").await;
        if condition_holds(&small_status, "Ready") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the small tenant never converged: {small_status:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let big_status = status_of(&big.channel, &big.token, "big").await;
    let created = big_status
        .items_by_state
        .get("CREATED")
        .copied()
        .unwrap_or(0);
    assert!(
        !condition_holds(&big_status, "Ready") && created < BIG as u64,
        "the small tenant converged while the big one was still working ({created} of {BIG} created)"
    );
    eprintln!("big tenant: {created} of {BIG} created when the small one converged");
    assert_eq!(small_recorder.received().len(), 3);
}
