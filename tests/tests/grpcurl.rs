//! An operator's session with grpcurl only: list, describe, create a
//! tenant, submit an intent as JSON, read the graph back.

use reconciled_tests::{ServerOptions, ServerProcess, successful_stdout};

#[tokio::test]
async fn an_operator_can_drive_the_server_with_grpcurl_alone() {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("starts");
    let admin = format!("authorization: Bearer {}", server.admin_token());

    let services = successful_stdout(&server.grpcurl(&[], &["list"]));
    for service in [
        "reconciled.v1.Reconciler",
        "reconciled.v1.Tenants",
        "reconciled.v1.Configurators",
        "grpc.health.v1.Health",
    ] {
        assert!(services.contains(service), "{services}");
    }
    let described =
        successful_stdout(&server.grpcurl(&[], &["describe", "reconciled.v1.Reconciler"]));
    assert!(described.contains("rpc SubmitIntent"), "{described}");
    let message = successful_stdout(&server.grpcurl(&[], &["describe", "reconciled.v1.Item"]));
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
            {"type": "dir", "name": "etc", "properties": {"path": "/etc/app"}},
            {"type": "file", "name": "conf", "properties": {"mode": 420},
             "dependencies": [{"requires": {"type": "dir", "name": "etc"}}]}
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
