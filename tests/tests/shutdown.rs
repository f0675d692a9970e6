//! Graceful shutdown: SIGTERM closes open agent and watch streams instead
//! of waiting for them, the process exits 0 within its grace period, and a restart
//! finds everything that was acknowledged; an operation still running at
//! the agent stays journaled and completes after the restart.

use std::time::Duration;

use reconciled_client::agent::{AgentEvent, ItemRef, OperationKind, TypeSpec};
use reconciled_tests::ServerOptions;
use reconciled_tests::agents::{Gate, Recorder, RunningAgent, Step, TestTenant};
use reconciled_tests::api::item;
use reconciled_tests::proto::v1;
use reconciled_tests::watch::{Watcher, watch_request};
use serde_json::json;
use tonic::Code;

/// Long enough that a server which waited for the open Connect stream to
/// end by itself would be noticed: the agent never closes it.
const GRACE_SECS: u64 = 20;

#[tokio::test]
async fn sigterm_with_a_connected_agent_closes_its_stream_exits_cleanly_and_keeps_acknowledged_data()
 {
    let options = ServerOptions::default()
        .arg("--shutdown-grace-secs")
        .arg(GRACE_SECS.to_string());
    let mut tenant = TestTenant::start_with(options, "acme").await;
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

    let accepted = tenant
        .submit(vec![
            item("t", "done", json!({ "v": 1 })),
            item("t", "held", json!({ "v": 2 })),
        ])
        .await;
    tenant
        .wait_for_state("t", "done", v1::ItemState::Created)
        .await;
    recorder.wait_for_operations(2).await;
    let mut watcher = Watcher::open(&mut tenant.reconciler(), watch_request("acme", 0))
        .await
        .expect("a watch opens");
    watcher.until(|seen| seen.synced.is_some()).await;

    let status = tenant
        .server
        .terminate_within(Duration::from_secs(GRACE_SECS))
        .await
        .expect("the server exits within its shutdown grace period");
    assert!(status.success(), "SIGTERM is a clean shutdown: {status}");
    let reason = agent
        .wait_for_event("the server closing the stream", |event| match event {
            AgentEvent::Disconnected { reason, code } => Some((reason.clone(), *code)),
            _ => None,
        })
        .await;
    assert_eq!(reason.1, Some(Code::Unavailable), "{reason:?}");
    assert!(
        reason.0.contains("shutting down"),
        "the agent is told why its stream ended: {reason:?}"
    );
    let ended = watcher
        .until_end()
        .await
        .expect_err("the open watch is ended, not left hanging");
    assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");
    assert!(ended.message().contains("shutting down"), "{ended:?}");

    tenant.server.start_again().await.expect("restarts");
    tenant.channel = tenant.server.channel().await.expect("connects");
    let status = tenant.status().await;
    assert_eq!(status.generation, accepted.generation);
    let done = tenant
        .item("t", "done")
        .await
        .expect("the applied item is still in the current graph");
    assert_eq!(done.state, v1::ItemState::Created as i32);

    // The agent reconnects by itself; the operation it still runs was
    // journaled and its result is taken after the restart.
    gate.open();
    tenant
        .wait_for_state("t", "held", v1::ItemState::Created)
        .await;
    let labels = recorder.labels();
    assert_eq!(
        labels
            .iter()
            .filter(|label| *label == "create t/done")
            .count(),
        1,
        "an acknowledged operation is not run again: {labels:?}"
    );
}
