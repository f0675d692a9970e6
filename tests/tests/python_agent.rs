//! The Python example agent (`examples/python/kv_agent.py`, only `grpcio`
//! and stubs generated from `proto/`) against the real server: it
//! registers, applies items, answers WAIT and reports progress of a
//! long-running operation, all checked through the server's API; with
//! replicas on etcd, given a replica that does not serve its tenant, it
//! follows the `NOT_OWNER` redirect. Fails (does not skip) without python3
//! and pip.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use reconciled_tests::agents::{DEADLINE, TestTenant, item_needing};
use reconciled_tests::api;
use reconciled_tests::cluster::Replicas;
use reconciled_tests::etcd::EtcdCluster;
use reconciled_tests::proto::v1;
use reconciled_tests::watch::{Watcher, events, watch_request};
use reconciled_tests::{generate_python_stubs, python_grpc_site, workspace_root};
use serde_json::json;

/// Kills the agent when the test ends, however it ends.
struct PythonAgent(Child);

impl Drop for PythonAgent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_python_agent(tenant: &TestTenant, root: &Path, stubs: &Path) -> PythonAgent {
    let addr = tenant.server.addr().to_string();
    run_python_agent(&addr, &tenant.name, &tenant.token, root, stubs)
}

fn run_python_agent(
    addr: &str,
    tenant: &str,
    token: &str,
    root: &Path,
    stubs: &Path,
) -> PythonAgent {
    let site = python_grpc_site();
    let script = workspace_root().join("examples/python/kv_agent.py");
    let pythonpath = std::env::join_paths([stubs, &site]).expect("a PYTHONPATH");
    let child = Command::new("python3")
        .arg(&script)
        .args(["--addr", addr, "--tenant", tenant, "--agent-id", "pykv-1"])
        .arg("--root")
        .arg(root)
        .env("RECONCILED_TOKEN", token)
        .env("PYTHONPATH", pythonpath)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot run python3 {}: {error}", script.display()));
    PythonAgent(child)
}

/// Ctrl-C on the example agent (SIGINT) ends it with a line saying so and
/// exit code 130, not a Python traceback out of grpc's stream iterator.
#[tokio::test]
async fn the_python_agent_stops_on_ctrl_c_without_a_traceback() {
    let site = python_grpc_site();
    let stubs = tempfile::tempdir().expect("a stub directory");
    generate_python_stubs(&site, stubs.path());
    let tenant = TestTenant::start("acme").await;
    let root = tempfile::tempdir().expect("a root folder");
    let script = workspace_root().join("examples/python/kv_agent.py");
    let pythonpath = std::env::join_paths([stubs.path(), site.as_path()]).expect("a PYTHONPATH");
    let child = Command::new("python3")
        .arg(&script)
        .args([
            "--addr",
            &tenant.server.addr().to_string(),
            "--tenant",
            &tenant.name,
        ])
        .arg("--root")
        .arg(root.path())
        .env("RECONCILED_TOKEN", &tenant.token)
        .env("PYTHONPATH", pythonpath)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut agent = PythonAgent(child);
    tenant
        .wait_for_status("the Python agent registered pykv", |status| {
            status.connected_item_types.iter().any(|t| t == "pykv")
        })
        .await;

    let interrupted = Command::new("kill")
        .args(["-INT", &agent.0.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(interrupted.success());
    // Its output ends when it exits; the guard still kills it if not.
    let (mut out, mut err) = (
        agent.0.stdout.take().expect("piped stdout"),
        agent.0.stderr.take().expect("piped stderr"),
    );
    let (stdout, stderr) = tokio::time::timeout(
        DEADLINE,
        tokio::task::spawn_blocking(move || {
            let (mut stdout, mut stderr) = (String::new(), String::new());
            let _ = std::io::Read::read_to_string(&mut out, &mut stdout);
            let _ = std::io::Read::read_to_string(&mut err, &mut stderr);
            (stdout, stderr)
        }),
    )
    .await
    .expect("the agent exits after Ctrl-C")
    .expect("the reading task");
    let status = agent.0.wait().expect("the agent's exit status");
    assert_eq!(status.code(), Some(130), "{stdout}\n{stderr}");
    assert!(!stderr.contains("Traceback"), "{stderr}");
    assert!(stdout.contains("stopped (Ctrl-C)"), "{stdout}");
}
fn kv(name: &str, extra: serde_json::Value) -> v1::Item {
    let mut properties = json!({"key": name, "value": format!("value of {name}")});
    if let (Some(properties), Some(extra)) = (properties.as_object_mut(), extra.as_object()) {
        properties.extend(extra.clone());
    }
    item_needing("pykv", name, properties, &[])
}

#[tokio::test]
async fn the_python_agent_registers_applies_waits_and_reports_progress() {
    let site = python_grpc_site();
    let stubs = tempfile::tempdir().expect("a stub directory");
    generate_python_stubs(&site, stubs.path());
    let tenant = TestTenant::start("acme").await;
    let root = tempfile::tempdir().expect("a root folder");
    let _agent = start_python_agent(&tenant, root.path(), stubs.path());

    tenant
        .wait_for_status("the Python agent registered pykv", |status| {
            status.connected_item_types.iter().any(|t| t == "pykv")
        })
        .await;

    let mut watcher = Watcher::open(&mut tenant.reconciler(), watch_request(&tenant.name, 0))
        .await
        .expect("Watch opens");
    tenant
        .submit(vec![
            kv("plain", json!({})),
            kv("waits", json!({"needs": "go"})),
            kv("slow", json!({"await": "go"})),
        ])
        .await;

    // Applied: CREATED, with the observed value the agent reported.
    let plain = tenant
        .wait_for_state("pykv", "plain", v1::ItemState::Created)
        .await;
    let observed = plain.observed.expect("observed properties");
    assert!(
        format!("{observed:?}").contains("value of plain"),
        "{observed:?}"
    );
    assert_eq!(
        std::fs::read_to_string(root.path().join("plain"))
            .ok()
            .as_deref(),
        Some("value of plain")
    );

    // WAIT: the server records the outcome and counts no attempt.
    watcher
        .until(|seen| {
            events(&seen.groups).any(|event| match &event.body {
                Some(v1::event::Body::OperationFinished(finished)) => {
                    finished.item.as_ref().is_some_and(|i| i.name == "waits")
                        && finished.outcome == v1::Outcome::Wait as i32
                }
                _ => false,
            })
        })
        .await;
    let waits = tenant
        .item("pykv", "waits")
        .await
        .expect("waits is in the current graph");
    assert_eq!(waits.attempts, 0, "WAIT is not a failed attempt: {waits:?}");

    // Progress: the long-running Create stays in flight and reports.
    let slow = tenant
        .wait_for_item("pykv", "slow", "reporting progress", |status| {
            status
                .operation
                .as_ref()
                .is_some_and(|operation| operation.last_progress_at.is_some())
        })
        .await;
    assert_eq!(slow.state, v1::ItemState::Creating as i32, "{slow:?}");
    let shown = slow
        .operation
        .as_ref()
        .map(|operation| operation.progress_message.clone());
    assert!(
        shown
            .as_deref()
            .is_some_and(|m| m.starts_with("waiting for ")),
        "the agent's progress message is shown: {shown:?}"
    );

    // The file both wait for appears: everything converges.
    std::fs::write(root.path().join("go"), "").expect("write the flag");
    tenant.wait_until_ready().await;
    for name in ["waits", "slow"] {
        assert_eq!(
            std::fs::read_to_string(root.path().join(name)).ok(),
            Some(format!("value of {name}")),
            "{name}"
        );
    }
}

#[tokio::test]
async fn the_python_agent_follows_a_replica_to_the_one_that_serves_its_tenant() {
    let site = python_grpc_site();
    let stubs = tempfile::tempdir().expect("a stub directory");
    generate_python_stubs(&site, stubs.path());
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let replicas = Replicas::start(&etcd, 2).await;
    let token = replicas.create_tenant(0, "acme").await;
    let owner = replicas
        .index_of(&replicas.owner(0, "acme").await)
        .expect("a replica");
    let other = replicas.servers[1 - owner].addr().to_string();
    let root = tempfile::tempdir().expect("a root folder");
    let _agent = run_python_agent(&other, "acme", &token, root.path(), stubs.path());

    let channel = replicas.channel(1 - owner).await;
    api::reconciler(&channel, &token)
        .submit_intent(api::submit("acme", vec![kv("plain", json!({}))]))
        .await
        .expect("submits");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while std::fs::read_to_string(root.path().join("plain"))
        .ok()
        .as_deref()
        != Some("value of plain")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Python agent did not apply the item through the redirect"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}
