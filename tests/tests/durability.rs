//! Acknowledged writes survive restarts and SIGKILL.

use std::time::Duration;

use rand::Rng;
use reconciled_tests::api::{create_tenant, item, reconciler, submit};
use reconciled_tests::proto::v1;
use reconciled_tests::{ServerOptions, ServerProcess};
use serde_json::json;

fn intent(count: usize) -> Vec<v1::Item> {
    (0..count)
        .map(|i| item("t", &format!("n{i:04}"), json!({"i": i})))
        .collect()
}

async fn intended_names(
    channel: &tonic::transport::Channel,
    token: &str,
    tenant: &str,
) -> (u64, Vec<String>) {
    let graph = reconciler(channel, token)
        .get_graph(v1::GetGraphRequest {
            tenant: tenant.into(),
            view: v1::GraphView::Intended.into(),
            page_size: 5_000,
            ..Default::default()
        })
        .await
        .expect("graph")
        .into_inner();
    let names = graph
        .intended
        .iter()
        .filter_map(|i| i.item.as_ref())
        .map(|i| i.name.clone())
        .collect();
    (graph.generation, names)
}

#[tokio::test]
async fn intents_survive_a_graceful_restart() {
    let mut server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("starts");
    let channel = server.channel().await.expect("connects");
    let token = create_tenant(&channel, &server.admin_token(), "acme").await;
    reconciler(&channel, &token)
        .submit_intent(submit("acme", intent(50)))
        .await
        .expect("stored");
    server.restart().await.expect("restarts");
    let channel = server.channel().await.expect("connects");
    let (generation, names) = intended_names(&channel, &token, "acme").await;
    assert_eq!(generation, 1);
    assert_eq!(names.len(), 50);
}

#[tokio::test]
async fn every_acknowledged_intent_survives_sigkill_at_random_moments() {
    let mut server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("starts");
    let channel = server.channel().await.expect("connects");
    let token = create_tenant(&channel, &server.admin_token(), "acme").await;
    let mut acknowledged = 0usize;
    for round in 0..4 {
        let channel = server.channel().await.expect("connects");
        let writer_token = token.clone();
        let start = acknowledged;
        let (acks, mut acked) = tokio::sync::watch::channel(start);
        let writer = tokio::spawn(async move {
            let mut client = reconciler(&channel, &writer_token);
            let mut count = start;
            loop {
                count += 1;
                match client.submit_intent(submit("acme", intent(count))).await {
                    Ok(_) => {
                        let _ = acks.send(count);
                    }
                    Err(_) => return,
                }
            }
        });
        // Let at least one write through, then kill at a random moment.
        acked
            .wait_for(|count| *count > start)
            .await
            .expect("writer acknowledged a write");
        let pause = rand::rng().random_range(0..150);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        server.kill9().expect("SIGKILL");
        let _ = writer.await;
        acknowledged = *acked.borrow();

        server.start_again().await.expect("restarts after SIGKILL");
        let channel = server.channel().await.expect("connects");
        let (generation, names) = intended_names(&channel, &token, "acme").await;
        assert!(
            names.len() >= acknowledged && names.len() <= acknowledged + 1,
            "round {round}: {acknowledged} items acknowledged, {} stored",
            names.len()
        );
        assert_eq!(
            generation as usize,
            names.len(),
            "one generation per accepted submit"
        );
        acknowledged = names.len();
    }
}
