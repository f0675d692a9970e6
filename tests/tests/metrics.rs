//! Prometheus metrics on `--metrics-listen`: a scrape during and after a
//! reconcile sees the counters move.

use std::net::TcpListener as StdListener;

use reconciled_client::agent::TypeSpec;
use reconciled_tests::ServerOptions;
use reconciled_tests::agents::{Recorder, RunningAgent, TestTenant, item_needing};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn scrape(addr: &str) -> String {
    let response = get(addr, "/metrics", "localhost").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

/// The whole response to `GET path` on `addr`, with `Host: host`.
async fn get(addr: &str, path: &str, host: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("port reachable");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("request sent");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response read");
    response
}

/// A free loopback address.
fn free_address() -> String {
    let probe = StdListener::bind("127.0.0.1:0").expect("free port");
    probe.local_addr().expect("address").to_string()
}

/// The value of one sample line, e.g. `reconciled_items{state="CREATED"}`.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            line.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
}

#[tokio::test]
async fn a_scrape_sees_passes_operations_and_items_move() {
    let addr = {
        let probe = StdListener::bind("127.0.0.1:0").expect("free port");
        probe.local_addr().expect("address").to_string()
    };
    let tenant = TestTenant::start_with(
        ServerOptions::default().arg("--metrics-listen").arg(&addr),
        "acme",
    )
    .await;
    let before = scrape(&addr).await;
    assert_eq!(
        sample(
            &before,
            "reconciled_operations_total{kind=\"create\",outcome=\"done\"}"
        ),
        0.0
    );

    assert_eq!(sample(&before, "reconciled_agents_connected"), 0.0);
    assert_eq!(sample(&before, "reconciled_operation_seconds_count"), 0.0);

    let recorder = Recorder::new();
    let mut agent = RunningAgent::start(
        tenant
            .agent("agent-1")
            .item_type(TypeSpec::new("t"), recorder.clone()),
    );
    agent.connected().await;
    tenant
        .submit(
            (0..5)
                .map(|i| item_needing("t", &format!("i{i}"), json!({}), &[]))
                .collect(),
        )
        .await;
    tenant.wait_until_ready().await;
    let _watch = tenant
        .reconciler()
        .watch(reconciled_tests::watch::watch_request(&tenant.name, 0))
        .await
        .expect("a watch opens");

    let after = scrape(&addr).await;
    assert!(
        sample(&after, "reconciled_reconcile_passes_total")
            > sample(&before, "reconciled_reconcile_passes_total")
    );
    assert_eq!(
        sample(
            &after,
            "reconciled_operations_dispatched_total{kind=\"create\"}"
        ),
        5.0
    );
    assert_eq!(
        sample(
            &after,
            "reconciled_operations_total{kind=\"create\",outcome=\"done\"}"
        ),
        5.0
    );
    assert_eq!(sample(&after, "reconciled_items{state=\"CREATED\"}"), 5.0);
    assert_eq!(sample(&after, "reconciled_tenants"), 1.0);
    assert_eq!(sample(&after, "reconciled_watchers"), 1.0);
    assert_eq!(sample(&after, "reconciled_agents_connected"), 1.0);
    assert_eq!(sample(&after, "reconciled_operation_seconds_count"), 5.0);
    assert_eq!(
        sample(&after, "reconciled_operation_seconds_bucket{le=\"+Inf\"}"),
        5.0
    );
    assert_eq!(
        sample(&after, "reconciled_operation_seconds_bucket{le=\"300\"}"),
        5.0,
        "every operation took less than 300 s"
    );
    assert!(
        sample(&after, "reconciled_tenant_queue_wait_seconds_count") >= 5.0,
        "at least the five results waited in the queue"
    );
    assert_eq!(
        sample(&after, "reconciled_tenant_queue_depth"),
        0.0,
        "a Ready tenant has nothing queued"
    );
    assert!(sample(&after, "reconciled_store_bytes") > 0.0);
    assert!(!after.contains("tenant=\""), "no per-tenant labels");
}

#[tokio::test]
async fn metrics_share_the_dashboard_port_when_both_listen_on_one_address() {
    let addr = free_address();
    let _tenant = TestTenant::start_with(
        ServerOptions::default()
            .arg("--metrics-listen")
            .arg(&addr)
            .arg("--ui-listen")
            .arg(&addr),
        "acme",
    )
    .await;
    let metrics = scrape(&addr).await;
    assert_eq!(sample(&metrics, "reconciled_tenants"), 1.0);
    assert_eq!(sample(&metrics, "reconciled_tenants_quarantined"), 0.0);
    assert!(
        metrics.contains("# TYPE reconciled_operations_total counter"),
        "{metrics}"
    );
    // The same port still serves the dashboard.
    let page = get(&addr, "/", "localhost").await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(
        page.to_lowercase().contains("content-type: text/html"),
        "{page}"
    );
}

#[tokio::test]
async fn loopback_ports_answer_only_requests_addressed_to_a_loopback_name() {
    let (metrics, dashboard) = (free_address(), free_address());
    let _tenant = TestTenant::start_with(
        ServerOptions::default()
            .arg("--metrics-listen")
            .arg(&metrics)
            .arg("--ui-listen")
            .arg(&dashboard),
        "acme",
    )
    .await;
    let port = |addr: &str| addr.rsplit(':').next().expect("a port").to_string();
    for (addr, path) in [
        (&metrics, "/metrics"),
        (&dashboard, "/"),
        (&dashboard, "/schema.json"),
    ] {
        // What a page of another site sends once its name points at
        // 127.0.0.1 (DNS rebinding): its own host name.
        let rebound = get(addr, path, &format!("rebinder.example:{}", port(addr))).await;
        assert!(rebound.starts_with("HTTP/1.1 403"), "{path}: {rebound}");
        assert!(
            !rebound.contains("reconciled_tenants") && !rebound.contains("<html"),
            "{path}: nothing of the page or the metrics: {rebound}"
        );
        for host in [
            format!("localhost:{}", port(addr)),
            format!("127.0.0.1:{}", port(addr)),
        ] {
            let response = get(addr, path, &host).await;
            assert!(
                response.starts_with("HTTP/1.1 200"),
                "{path} {host}: {response}"
            );
        }
    }
}
