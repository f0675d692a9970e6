//! An operator's session with grpcurl only: list, describe, create a
//! tenant, submit an intent as JSON, read the graph back.

use reconciled_tests::{ServerOptions, ServerProcess, successful_stdout};

#[tokio::test]
async fn an_operator_can_drive_the_server_with_grpcurl_alone() {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("starts");
    let admin = format!("authorization: Bearer {}", server.admin_token());

    // Reflection needs a token (--reflection=authenticated, the default).
    let services = successful_stdout(&server.grpcurl(&["-H", &admin], &["list"]));
    for service in [
        "reconciled.v1.Reconciler",
        "reconciled.v1.Tenants",
        "reconciled.v1.Configurators",
        "grpc.health.v1.Health",
    ] {
        assert!(services.contains(service), "{services}");
    }
    let described = successful_stdout(
        &server.grpcurl(&["-H", &admin], &["describe", "reconciled.v1.Reconciler"]),
    );
    assert!(described.contains("rpc SubmitIntent"), "{described}");
    let message =
        successful_stdout(&server.grpcurl(&["-H", &admin], &["describe", "reconciled.v1.Item"]));
    assert!(
        message.contains("must_satisfy") || message.contains("dependencies"),
        "{message}"
    );

    let created = successful_stdout(&server.grpcurl(
        &["-H", &admin, "-d", r#"{"name": "acme"}"#],
        &["reconciled.v1.Tenants/CreateTenant"],
    ));
    let created: serde_json::Value = serde_json::from_str(&created).expect("JSON reply");
    let token = created["token"]
        .as_str()
        .expect("token in reply")
        .to_string();
    let tenant_auth = format!("authorization: Bearer {token}");

    let intent = r#"{
        "tenant": "acme",
        "items": [
            {"type": "directory", "name": "etc", "properties": {"path": "etc"}},
            {"type": "file", "name": "conf", "properties": {"path": "etc/app.conf", "mode": 420},
             "dependencies": [{"requires": {"type": "directory", "name": "etc"}}]}
        ]
    }"#;
    let submitted = successful_stdout(&server.grpcurl(
        &["-H", &tenant_auth, "-d", intent],
        &["reconciled.v1.Reconciler/SubmitIntent"],
    ));
    let submitted: serde_json::Value = serde_json::from_str(&submitted).expect("JSON reply");
    assert_eq!(
        submitted["generation"], "1",
        "uint64 prints as a string: {submitted}"
    );
    assert_eq!(submitted["changed"], true);

    let graph = successful_stdout(&server.grpcurl(
        &[
            "-H",
            &tenant_auth,
            "-d",
            r#"{"tenant": "acme", "view": "GRAPH_VIEW_BOTH"}"#,
        ],
        &["reconciled.v1.Reconciler/GetGraph"],
    ));
    let graph: serde_json::Value = serde_json::from_str(&graph).expect("JSON reply");
    assert_eq!(
        graph["intended"].as_array().map(Vec::len),
        Some(2),
        "{graph}"
    );
    assert_eq!(
        graph["current"][1]["state"], "ITEM_STATE_PENDING",
        "{graph}"
    );

    let refused = server.grpcurl(
        &[
            "-H",
            &tenant_auth,
            "-format-error",
            "-d",
            r#"{"tenant": "acme", "items": [{"type": "t", "name": ""}]}"#,
        ],
        &["reconciled.v1.Reconciler/SubmitIntent"],
    );
    assert_eq!(
        refused.status.code(),
        Some(64 + 3),
        "INVALID_ARGUMENT exits 67"
    );
    let shown = String::from_utf8_lossy(&refused.stdout).into_owned()
        + &String::from_utf8_lossy(&refused.stderr);
    assert!(
        shown.contains("items[0].name"),
        "the field violation is decoded: {shown}"
    );
}

/// grpcurl streams a Watch: the snapshot, `synced`, then the events of a
/// submit made while it watches, as JSON messages.
#[tokio::test]
async fn grpcurl_streams_watch_events() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("starts");
    let channel = server.channel().await.expect("connects");
    let token = reconciled_tests::api::create_tenant(&channel, &server.admin_token(), "acme").await;
    let mut child = tokio::process::Command::new(reconciled_tests::grpcurl())
        .args([
            "-plaintext",
            "-H",
            &format!("authorization: Bearer {token}"),
        ])
        .args(["-d", r#"{"tenant": "acme", "start_revision": 0}"#])
        .arg(server.addr().to_string())
        .arg("reconciled.v1.Reconciler/Watch")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("grpcurl runs");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut output = String::new();
    let mut read_until = async |needle: &str, output: &mut String| {
        let deadline = std::time::Duration::from_secs(30);
        while !output.contains(needle) {
            let line = tokio::time::timeout(deadline, lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("no {needle:?} from grpcurl in time: {output}"))
                .expect("reads grpcurl's output")
                .unwrap_or_else(|| panic!("grpcurl ended before {needle:?}: {output}"));
            output.push_str(&line);
            output.push('\n');
        }
    };
    read_until("\"synced\"", &mut output).await;

    reconciled_tests::api::reconciler(&channel, &token)
        .submit_intent(reconciled_tests::api::submit(
            "acme",
            vec![reconciled_tests::api::item("t", "a", serde_json::json!({}))],
        ))
        .await
        .expect("submit");
    read_until("\"generation\"", &mut output).await;
    assert!(output.contains("EVENT_KIND_INTENT_CHANGED"), "{output}");
    assert!(output.contains("\"generation\": \"1\""), "{output}");
    child.kill().await.expect("grpcurl stops");
}

/// The README's grpcurl recipe, run as written (against this test's
/// server address and data directory): every call succeeds and the Watch
/// streams a snapshot and `synced`.
#[tokio::test]
async fn the_readme_grpcurl_recipe_runs_as_written() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let server = ServerProcess::start(ServerOptions::default().without_admin_token())
        .await
        .expect("starts");
    let readme = std::fs::read_to_string(reconciled_tests::workspace_root().join("README.md"))
        .expect("README.md");
    let section = readme
        .split("### With grpcurl only")
        .nth(1)
        .expect("the README has a grpcurl section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a sh block in the grpcurl section");
    let block = block
        .replace("localhost:50051", &server.addr().to_string())
        .replace(
            "reconciled-data/admin.token",
            &server.data_dir().join("admin.token").display().to_string(),
        );
    let (commands, watch): (Vec<&str>, Vec<&str>) = block
        .lines()
        .filter(|line| !line.trim().is_empty())
        .partition(|line| !line.contains("Reconciler/Watch"));
    assert_eq!(watch.len(), 1, "one Watch line: {block}");
    let grpcurl_dir = reconciled_tests::grpcurl()
        .parent()
        .expect("grpcurl's directory")
        .to_path_buf();
    let path = format!(
        "{}:{}",
        grpcurl_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // Everything but the Watch, then the Watch (replacing the shell), read
    // until it has streamed `synced` and the submitted item.
    let script = format!(
        "set -euo pipefail\n{}\nexec {}\n",
        commands.join("\n"),
        watch[0]
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env("PATH", &path)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("bash runs");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut shown = String::new();
    while !(shown.contains("\"synced\"") && shown.contains("\"etc\"")) {
        let line = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("the recipe stalled: {shown}"))
            .expect("reads the output")
            .unwrap_or_else(|| panic!("the recipe ended before the Watch streamed: {shown}"));
        shown.push_str(&line);
        shown.push('\n');
    }
    assert!(shown.contains("reconciled.v1.Tenants"), "{shown}");
    assert!(shown.contains("\"changed\": true"), "{shown}");
    assert!(shown.contains("\"intended\""), "{shown}");
    child.kill().await.expect("the watch stops");
}
