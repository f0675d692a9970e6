//! Crash recovery: the server is killed with SIGKILL in the middle of passes
//! with operations in flight, at random moments, several times. After every
//! restart nothing acknowledged is lost, journaled operations are resolved
//! (re-delivered with the same op id to the agent when it reconnects), and
//! the tenant converges.

use std::time::Duration;

use rand::Rng;
use reconciled_client::agent::TypeSpec;
use reconciled_tests::agents::{Recorder, RunningAgent, TestTenant, item_needing};
use reconciled_tests::proto::v1;
use serde_json::json;

const ITEMS: usize = 40;

/// Items in chains of four (i00 <- i01 <- i02 <- i03, ...), all carrying
/// `round`, so a pass has both independent and dependent operations.
fn intent(round: u32) -> Vec<v1::Item> {
    (0..ITEMS)
        .map(|i| {
            let name = format!("i{i:02}");
            let requires = if i % 4 == 0 {
                vec![]
            } else {
                vec![format!("t/i{:02}", i - 1)]
            };
            let requires: Vec<&str> = requires.iter().map(String::as_str).collect();
            item_needing("t", &name, json!({ "round": round }), &requires)
        })
        .collect()
}

#[tokio::test]
async fn the_tenant_converges_after_sigkills_in_the_middle_of_passes() {
    let recorder = Recorder::new();
    let mut tenant = TestTenant::start("acme").await;
    let mut agent = RunningAgent::start(
        tenant
            .agent("agent-1")
            .item_type(TypeSpec::new("t").max_in_flight(4), recorder.clone()),
    );
    agent.connected().await;

    let rounds = 4u32;
    for round in 0..rounds {
        let seen = recorder.received().len();
        let accepted = tenant.submit(intent(round)).await;
        assert!(accepted.changed);
        // Kill while this round's operations are flowing.
        recorder
            .wait_for_operations(seen + 1 + round as usize)
            .await;
        let pause = rand::rng().random_range(0..20);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        tenant.server.kill9().expect("SIGKILL");
        tenant
            .server
            .start_again()
            .await
            .expect("restarts after SIGKILL");
        tenant.channel = tenant.server.channel().await.expect("connects");

        // The acknowledged intent survived the kill.
        let graph = tenant
            .reconciler()
            .get_graph(v1::GetGraphRequest {
                tenant: "acme".into(),
                view: v1::GraphView::Intended.into(),
                page_size: 1_000,
                ..Default::default()
            })
            .await
            .expect("graph")
            .into_inner();
        assert_eq!(graph.generation, u64::from(round) + 1, "round {round}");
        assert!(
            graph
                .intended
                .iter()
                .filter_map(|i| i.item.as_ref())
                .all(|i| i
                    .properties
                    .as_ref()
                    .and_then(|p| p.fields.get("round"))
                    .is_some())
        );
    }

    // The agent reconnects by itself; journaled operations are resolved and
    // the last intent is applied everywhere.
    let status = tenant.wait_until_ready().await;
    assert_eq!(
        status.items_by_state.get("CREATED").copied(),
        Some(ITEMS as u64),
        "{status:#?}"
    );
    let current = tenant.current().await;
    let last = f64::from(rounds - 1);
    for item in &current {
        let applied = item.applied.as_ref().and_then(|a| a.properties.as_ref());
        let round = applied
            .and_then(|p| p.fields.get("round"))
            .and_then(|v| match v.kind {
                Some(prost_types::value::Kind::NumberValue(n)) => Some(n),
                _ => None,
            });
        assert_eq!(round, Some(last), "{item:?}");
    }
}

#[tokio::test]
async fn an_operation_that_keeps_losing_its_agent_fails_after_five_redeliveries() {
    use reconciled_tests::agents::Step;
    let tenant = TestTenant::start("acme").await;
    let recorder = Recorder::answering(Step::Hang);
    let spec = || TypeSpec::new("t").retry_static(Duration::from_secs(3_600));
    tenant
        .submit(vec![item_needing("t", "poison", json!({}), &[])])
        .await;

    // Six agents in a row receive the operation and die before answering:
    // the original delivery and five re-deliveries, all with one op id.
    for delivery in 0..6 {
        let mut agent =
            RunningAgent::start(tenant.agent("agent-1").item_type(spec(), recorder.clone()));
        agent.connected().await;
        recorder.wait_for_operations(delivery + 1).await;
        agent.kill().await;
        tenant
            .wait_for_state("t", "poison", v1::ItemState::Unknown)
            .await;
    }
    let received = recorder.received();
    assert!(
        received
            .windows(2)
            .all(|pair| pair[0].op_id == pair[1].op_id),
        "{received:?}"
    );

    // The sixth loss counts as an UNAVAILABLE failure instead of a seventh
    // re-delivery.
    let mut agent =
        RunningAgent::start(tenant.agent("agent-1").item_type(spec(), recorder.clone()));
    agent.connected().await;
    let failed = tenant
        .wait_for_state("t", "poison", v1::ItemState::Failed)
        .await;
    let error = failed.last_error.expect("the failure is shown");
    assert_eq!(error.code, 14, "{error:?}");
    assert!(error.message.contains("lost 6 times"), "{error:?}");
    assert_eq!(failed.attempts, 1);
    assert_eq!(recorder.received().len(), 6, "no seventh delivery");
}

#[tokio::test]
async fn an_unanswered_cancel_makes_the_item_unknown_until_the_old_operation_reports() {
    use reconciled_tests::ServerOptions;
    use reconciled_tests::agents::{Gate, Step};
    let tenant = TestTenant::start_with(
        ServerOptions::default()
            .arg("--cancel-timeout-secs")
            .arg("1"),
        "acme",
    )
    .await;
    let gate = Gate::new();
    let recorder = Recorder::answering(Step::Hold(gate.clone()));
    let mut agent = RunningAgent::start(
        tenant
            .agent("agent-1")
            .item_type(TypeSpec::new("t"), recorder.clone()),
    );
    agent.connected().await;

    tenant
        .submit(vec![item_needing("t", "a", json!({"v": 1}), &[])])
        .await;
    let create = recorder.wait_for_operations(1).await.remove(0);
    tenant
        .submit(vec![item_needing("t", "a", json!({"v": 2}), &[])])
        .await;
    recorder.wait_for_cancellation(&create.op_id).await;

    // No answer within the cancel timeout: UNKNOWN, and no second operation.
    let unknown = tenant
        .wait_for_state("t", "a", v1::ItemState::Unknown)
        .await;
    assert_eq!(
        unknown.operation.as_ref().map(|o| o.op_id.as_str()),
        Some(create.op_id.as_str())
    );
    assert_eq!(recorder.received().len(), 1);

    // The old operation reports after all: its result is authoritative, and
    // the item is then modified to the new intent.
    gate.open();
    let received = recorder.wait_for_operations(2).await;
    assert_eq!(received[1].label(), "modify t/a");
    let done = tenant.wait_until_ready().await;
    assert_eq!(done.items_by_state.get("CREATED"), Some(&1));
}

#[tokio::test]
async fn a_backoff_survives_a_restart() {
    use reconciled_tests::agents::Step;
    let mut tenant = TestTenant::start("acme").await;
    let recorder = Recorder::answering(Step::Fail(tonic::Code::Unavailable));
    let spec = || TypeSpec::new("t").retry_static(Duration::from_secs(3_600));
    let mut agent =
        RunningAgent::start(tenant.agent("agent-1").item_type(spec(), recorder.clone()));
    agent.connected().await;
    tenant
        .submit(vec![item_needing("t", "a", json!({}), &[])])
        .await;
    let failed = tenant.wait_for_state("t", "a", v1::ItemState::Failed).await;
    let retry_at = failed.next_attempt_at.expect("a retry time");
    assert_eq!(failed.attempts, 1);
    agent.kill().await;

    tenant.server.restart().await.expect("restarts");
    tenant.channel = tenant.server.channel().await.expect("connects");
    let mut agent =
        RunningAgent::start(tenant.agent("agent-1").item_type(spec(), recorder.clone()));
    agent.connected().await;
    let after = tenant.item("t", "a").await.expect("still known");
    assert_eq!(after.state, v1::ItemState::Failed as i32);
    assert_eq!(after.attempts, 1);
    let kept = after.next_attempt_at.expect("the retry time is kept");
    assert!(
        kept.seconds <= retry_at.seconds && kept.seconds > retry_at.seconds - 60,
        "{kept:?} vs {retry_at:?}"
    );
    // A pending backoff keeps the tenant Reconciling (DESIGN section 5).
    let status = tenant.status().await;
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.r#type == "Reconciling" && c.status == v1::ConditionStatus::True as i32),
        "{status:#?}"
    );
    assert_eq!(recorder.received().len(), 1, "no retry before its time");
}
