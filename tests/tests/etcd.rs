//! The real server on etcd (`--store etcd`), end to end: a tenant converges
//! through an SDK agent and everything survives restarts and SIGKILL; a
//! 10,000-item intent is one atomic commit even when the server dies
//! during it; a stale fence is refused; `reconciled store copy` moves a
//! deployment from sled to etcd and back.

use std::process::Command;
use std::time::Duration;

use rand::Rng as _;
use reconciled::store::{EtcdOptions, EtcdStore, Fence, Store, StoreError, WriteBatch};
use reconciled_client::agent::TypeSpec;
use reconciled_tests::agents::{Recorder, RunningAgent, TestTenant, item_needing};
use reconciled_tests::etcd::EtcdCluster;
use reconciled_tests::proto::v1;
use reconciled_tests::{ServerOptions, ServerProcess, api, reconciled_binary, successful_stdout};
use serde_json::json;

fn prefix() -> String {
    format!("/reconciled-test-{:016x}/", rand::random::<u64>())
}

fn on_etcd(etcd: &EtcdCluster, prefix: &str) -> ServerOptions {
    ServerOptions::default()
        .arg("--store")
        .arg("etcd")
        .arg("--etcd-endpoints")
        .arg(etcd.endpoints_arg())
        .arg("--etcd-prefix")
        .arg(prefix)
}

fn chain(count: usize, round: u32) -> Vec<v1::Item> {
    (0..count)
        .map(|i| {
            let requires = if i % 5 == 0 {
                vec![]
            } else {
                vec![format!("t/i{:03}", i - 1)]
            };
            let requires: Vec<&str> = requires.iter().map(String::as_str).collect();
            item_needing(
                "t",
                &format!("i{i:03}"),
                json!({ "round": round }),
                &requires,
            )
        })
        .collect()
}

async fn intended_count(tenant: &TestTenant) -> (u64, usize) {
    let mut count = 0;
    let mut page_token = String::new();
    loop {
        let page = tenant
            .reconciler()
            .get_graph(v1::GetGraphRequest {
                tenant: tenant.name.clone(),
                view: v1::GraphView::Intended.into(),
                page_size: 1_000,
                page_token: page_token.clone(),
                ..Default::default()
            })
            .await
            .expect("graph")
            .into_inner();
        count += page.intended.len();
        if page.next_page_token.is_empty() {
            return (page.generation, count);
        }
        page_token = page.next_page_token;
    }
}

#[tokio::test]
async fn a_server_on_etcd_converges_a_tenant_and_keeps_it_across_restarts_and_sigkill() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let mut tenant = TestTenant::start_with(on_etcd(&etcd, &prefix()), "acme").await;
    let recorder = Recorder::new();
    let mut agent = RunningAgent::start(
        tenant
            .agent("agent-1")
            .item_type(TypeSpec::new("t").max_in_flight(4), recorder.clone()),
    );
    agent.connected().await;
    assert!(tenant.submit(chain(20, 1)).await.changed);
    let status = tenant.wait_until_ready().await;
    assert_eq!(status.items_by_state.get("CREATED").copied(), Some(20));

    tenant.server.restart().await.expect("restarts");
    tenant.channel = tenant.server.channel().await.expect("connects");
    let status = tenant.wait_until_ready().await;
    assert_eq!(status.items_by_state.get("CREATED").copied(), Some(20));
    assert_eq!(intended_count(&tenant).await, (1, 20));

    // A second round, killed while its operations flow.
    let seen = recorder.received().len();
    assert!(tenant.submit(chain(20, 2)).await.changed);
    recorder.wait_for_operations(seen + 1).await;
    tenant.server.kill9().expect("SIGKILL");
    tenant.server.start_again().await.expect("starts again");
    tenant.channel = tenant.server.channel().await.expect("connects");
    let status = tenant.wait_until_ready().await;
    assert_eq!(
        status.items_by_state.get("CREATED").copied(),
        Some(20),
        "{status:#?}"
    );
    assert_eq!(intended_count(&tenant).await, (2, 20));
    for item in tenant.current().await {
        let round = item
            .applied
            .as_ref()
            .and_then(|a| a.properties.as_ref())
            .and_then(|p| p.fields.get("round"))
            .and_then(|v| match v.kind {
                Some(prost_types::value::Kind::NumberValue(n)) => Some(n),
                _ => None,
            });
        assert_eq!(round, Some(2.0), "{item:?}");
    }
    agent.stop().await.expect("the agent stops");
}

#[tokio::test]
async fn a_ten_thousand_item_intent_is_one_atomic_commit_even_when_the_server_dies_in_it() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let prefix = prefix();
    // About 9 MiB in one request: over the tenant default of 4 MiB, which
    // the operator raises for such intents (up to max_message_bytes). A
    // short staging lease: chunks the killed server staged are discarded
    // 2 s after it died, by the restarted server while it runs.
    let options = on_etcd(&etcd, &prefix)
        .arg("--max-tenant-message-bytes")
        .arg("16777216")
        .arg("--etcd-staging-lease-secs")
        .arg("2");
    let mut tenant = TestTenant::start_with(options, "big").await;
    let payload = "x".repeat(900);
    let items: Vec<v1::Item> = (0..10_000)
        .map(|i| item_needing("t", &format!("n{i:05}"), json!({ "payload": payload }), &[]))
        .collect();

    // Killed at a random moment of the commit: all or nothing.
    let submitting = {
        let (mut reconciler, request) = (tenant.reconciler(), api::submit("big", items.clone()));
        tokio::spawn(async move { reconciler.submit_intent(request).await })
    };
    let pause = rand::rng().random_range(200..1_500);
    tokio::time::sleep(Duration::from_millis(pause)).await;
    tenant.server.kill9().expect("SIGKILL");
    let acknowledged = submitting.await.expect("joined").is_ok();
    tenant.server.start_again().await.expect("starts again");
    tenant.channel = tenant.server.channel().await.expect("connects");
    let (generation, count) = intended_count(&tenant).await;
    assert!(
        (generation, count) == (1, 10_000) || (!acknowledged && (generation, count) == (0, 0)),
        "half a commit: generation {generation}, {count} items (acknowledged: {acknowledged})"
    );

    // And whole, with nothing of the staging left in etcd once the dead
    // writer's staging lease is over.
    let accepted = tenant.submit(items).await;
    assert_eq!(accepted.generation, 1);
    assert_eq!(intended_count(&tenant).await, (1, 10_000));
    let mut client = etcd.client().await.expect("etcd client");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let internal = staging_keys(&mut client, &prefix).await;
        if internal.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "staging keys still there 30 s after the server that left them died: {internal:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Keys of the store that are not records: staging headers, chunks and
/// commit markers.
async fn staging_keys(client: &mut etcd_client::Client, prefix: &str) -> Vec<String> {
    client
        .get(
            format!("{prefix}store/"),
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_keys_only(),
            ),
        )
        .await
        .expect("list")
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .filter(|key| !key.starts_with(&format!("{prefix}store/data/")))
        .collect()
}

#[tokio::test]
async fn a_write_under_a_stale_fence_never_lands_beside_a_running_server() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let prefix = prefix();
    let tenant = TestTenant::start_with(on_etcd(&etcd, &prefix), "acme").await;
    tenant.submit(chain(5, 1)).await;
    let store = EtcdStore::open(EtcdOptions {
        endpoints: etcd.endpoints(),
        prefix: prefix.clone(),
        ..EtcdOptions::default()
    })
    .expect("opens");
    let claimed = store
        .put_if_absent(b"owners/acme", b"me".to_vec(), None)
        .await
        .expect("claim")
        .expect("free");
    let fence = Fence {
        key: b"owners/acme".to_vec(),
        mod_revision: claimed,
    };
    assert!(
        store
            .delete_if(b"owners/acme", claimed)
            .await
            .expect("release")
    );
    store
        .put_if_absent(b"owners/acme", b"someone else".to_vec(), None)
        .await
        .expect("claim")
        .expect("free");
    let mut stale = WriteBatch::fenced(fence);
    stale.put(b"\x7fstale".to_vec(), b"must not land".to_vec());
    let error = store.commit(stale).await.expect_err("refused");
    assert!(matches!(error, StoreError::Fenced { .. }), "{error}");
    assert_eq!(store.get(b"\x7fstale").expect("get"), None);
    // The server's state is untouched.
    assert_eq!(intended_count(&tenant).await, (1, 5));
}

fn store_copy(from: &str, to: &str, prefix: &str) {
    let output = Command::new(reconciled_binary())
        .args([
            "store",
            "copy",
            "--from",
            from,
            "--to",
            to,
            "--etcd-prefix",
            prefix,
        ])
        .output()
        .expect("runs reconciled store copy");
    let stdout = successful_stdout(&output);
    assert!(stdout.starts_with("copied "), "{stdout}");
}

#[tokio::test]
async fn store_copy_moves_a_deployment_from_sled_to_etcd_and_back() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let prefix = prefix();
    let mut on_sled = TestTenant::start("acme").await;
    let recorder = Recorder::new();
    let agent = RunningAgent::start(
        on_sled
            .agent("agent-1")
            .item_type(TypeSpec::new("t"), recorder.clone()),
    );
    on_sled.submit(chain(12, 1)).await;
    on_sled.wait_until_ready().await;
    agent.stop().await.expect("the agent stops");
    on_sled.server.terminate().await.expect("stops");

    let sled_dir = on_sled.server.data_dir();
    store_copy(
        &format!("sled:{}", sled_dir.display()),
        &format!("etcd:{}", etcd.endpoints_arg()),
        &prefix,
    );
    let admin = on_sled.server.admin_token();
    let options = on_etcd(&etcd, &prefix).admin_token(admin.clone());
    let server = ServerProcess::start(options).await.expect("starts on etcd");
    let on_etcd_tenant = TestTenant {
        channel: server.channel().await.expect("connects"),
        server,
        name: "acme".to_owned(),
        token: on_sled.token.clone(),
    };
    let status = on_etcd_tenant.status().await;
    assert_eq!(
        status.items_by_state.get("CREATED").copied(),
        Some(12),
        "{status:#?}"
    );
    assert_eq!(intended_count(&on_etcd_tenant).await, (1, 12));
    let listed = api::tenants(&on_etcd_tenant.channel, &admin)
        .list_tenants(v1::ListTenantsRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert_eq!(listed.tenants.len(), 1);
    let mut on_etcd_tenant = on_etcd_tenant;
    on_etcd_tenant.server.terminate().await.expect("stops");

    // Back: into the (emptied) sled directory of the first server.
    std::fs::remove_dir_all(&sled_dir).expect("empties the sled directory");
    store_copy(
        &format!("etcd:{}", etcd.endpoints_arg()),
        &format!("sled:{}", sled_dir.display()),
        &prefix,
    );
    on_sled
        .server
        .start_again()
        .await
        .expect("starts on sled again");
    on_sled.channel = on_sled.server.channel().await.expect("connects");
    let status = on_sled.status().await;
    assert_eq!(
        status.items_by_state.get("CREATED").copied(),
        Some(12),
        "{status:#?}"
    );
    assert_eq!(intended_count(&on_sled).await, (1, 12));
}
