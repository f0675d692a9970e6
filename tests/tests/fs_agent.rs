//! The README quickstart with the example agent: start the server, start
//! `fs_agent`, submit an intent, see the files appear, change the intent,
//! see them change, remove it, see them go.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reconciled_tests::api::{create_tenant, reconciler};
use reconciled_tests::proto::v1;
use reconciled_tests::{ServerOptions, ServerProcess, example_binary, workspace_root};

/// Kills the agent when the test ends, however it ends.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The quickstart intent (deploy/examples/site.json) as a request.
fn site_intent() -> v1::SubmitIntentRequest {
    let text = std::fs::read_to_string(workspace_root().join("deploy/examples/site.json"))
        .expect("example intent");
    let value: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let items = value["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|entry| {
            let mut item = reconciled_tests::api::item(
                entry["type"].as_str().unwrap_or_default(),
                entry["name"].as_str().unwrap_or_default(),
                entry["properties"].clone(),
            );
            for dependency in entry["dependencies"].as_array().into_iter().flatten() {
                let requires = &dependency["requires"];
                item.dependencies.push(reconciled_tests::api::dependency(
                    requires["type"].as_str().unwrap_or_default(),
                    requires["name"].as_str().unwrap_or_default(),
                ));
            }
            item
        })
        .collect();
    reconciled_tests::api::submit(value["tenant"].as_str().unwrap_or_default(), items)
}

/// Waits until `check` holds for the root folder.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

#[tokio::test]
async fn the_example_agent_creates_changes_and_removes_real_files() {
    // Built before any connection is open: the build blocks this test's
    // runtime, and a connection that cannot answer the server's keepalive
    // pings for 20 s is closed.
    let agent_binary = example_binary("fs_agent");
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("server starts");
    let channel = server.channel().await.expect("connects");
    let token = create_tenant(&channel, &server.admin_token(), "acme").await;
    let root = tempfile::tempdir().expect("temp dir");
    let agent = Command::new(agent_binary)
        .args([
            "--addr",
            &server.endpoint(),
            "--tenant",
            "acme",
            "--agent-id",
            "fs-1",
        ])
        .arg("--root")
        .arg(root.path())
        .env("RECONCILED_TOKEN", &token)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("fs_agent starts");
    let _agent = Agent(agent);
    let mut client = reconciler(&channel, &token);

    let config = root.path().join("etc/app/app.conf");
    client
        .submit_intent(site_intent())
        .await
        .expect("intent accepted");
    eventually("the file to appear", || {
        read(&config).as_deref() == Some("listen = 8080\n")
    })
    .await;

    let mut changed = site_intent();
    changed.items[1].properties = Some(reconciled_tests::api::json_to_struct(serde_json::json!({
        "path": "etc/app/app.conf", "content": "listen = 9090\n", "mode": 420
    })));
    client
        .submit_intent(changed)
        .await
        .expect("change accepted");
    eventually("the file to change", || {
        read(&config).as_deref() == Some("listen = 9090\n")
    })
    .await;

    client
        .submit_intent(reconciled_tests::api::submit("acme", vec![]))
        .await
        .expect("removal accepted");
    let directory = root.path().join("etc/app");
    eventually("the directory to go", || !directory.exists()).await;

    let reply = client
        .reconcile(v1::ReconcileRequest {
            tenant: "acme".into(),
            wait: true,
            timeout: Some(prost_types::Duration {
                seconds: 10,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .expect("reconcile")
        .into_inner();
    assert!(reply.converged, "{reply:?}");
}
