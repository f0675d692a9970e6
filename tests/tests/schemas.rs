//! Typed properties: an SDK agent registers a JSON Schema derived from its
//! properties struct, and the real server refuses intents that do not
//! satisfy it (with field paths into the items, nothing stored), accepts
//! and converges valid ones, refuses a schema that does not compile at
//! Register, and shows it with `reconctl type get`. A type without a schema
//! behaves as before.

use std::path::Path;
use std::time::Duration;

use reconciled_client::agent::{AgentError, TypeSpec};
use reconciled_client::schemars::JsonSchema;
use reconciled_tests::agents::{Recorder, RunningAgent, TestTenant};
use reconciled_tests::api::{item, submit, violated_fields};
use reconciled_tests::proto::v1;
use reconciled_tests::workspace_binary;
use serde::Deserialize;
use serde_json::{Value, json};
use tonic::Code;
use tonic_types::StatusExt as _;

/// The properties of a `listener` item, as its configurator reads them.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "reconciled_client::schemars")]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Listener {
    /// The host name to bind.
    host: String,
    /// The TCP port.
    port: u16,
    /// Protocol options.
    #[serde(default)]
    tls: Option<Tls>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "reconciled_client::schemars")]
#[allow(dead_code)]
struct Tls {
    certificate: String,
}

/// A tenant `acme` with an agent for `listener` (schema derived from
/// [`Listener`]) and `plain` (no schema).
async fn tenant_with_agent(recorder: &Recorder) -> (TestTenant, RunningAgent) {
    let tenant = TestTenant::start("acme").await;
    let mut agent = RunningAgent::start(
        tenant
            .agent("listeners-1")
            .item_type(
                TypeSpec::new("listener").schema_of::<Listener>(),
                recorder.clone(),
            )
            .item_type(TypeSpec::new("plain"), recorder.clone()),
    );
    agent.connected().await;
    (tenant, agent)
}

/// The BadRequest field violations of `status`: (field, description).
fn violations(status: &tonic::Status) -> Vec<(String, String)> {
    status
        .get_error_details()
        .bad_request()
        .map(|bad| {
            bad.field_violations
                .iter()
                .map(|v| (v.field.clone(), v.description.clone()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn an_intent_that_violates_the_schema_is_refused_with_field_paths_and_nothing_stored() {
    let recorder = Recorder::new();
    let (tenant, _agent) = tenant_with_agent(&recorder).await;
    let bad = vec![
        item("listener", "ok", json!({"host": "a", "port": 80})),
        item("plain", "anything", json!({"port": "not checked"})),
        item(
            "listener",
            "bad",
            json!({"host": 5, "port": 70000, "tls": {"certificate": 1}, "extra": true}),
        ),
        item("listener", "short", json!({"host": "b"})),
    ];
    for dry_run in [true, false] {
        let mut request = submit(&tenant.name, bad.clone());
        request.dry_run = dry_run;
        let refused = tenant
            .reconciler()
            .submit_intent(request)
            .await
            .expect_err("the intent violates the schema");
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        let fields = violated_fields(&refused);
        for expected in [
            "items[2].properties.host",
            "items[2].properties.port",
            "items[2].properties.tls",
            "items[2].properties.extra",
            "items[3].properties.port",
        ] {
            assert!(
                fields.iter().any(|field| field == expected),
                "{expected} in {fields:?}"
            );
        }
        assert!(
            !fields
                .iter()
                .any(|f| f.starts_with("items[0]") || f.starts_with("items[1]")),
            "{fields:?}"
        );
        let port = violations(&refused)
            .into_iter()
            .find(|(field, _)| field == "items[2].properties.port")
            .map(|(_, description)| description)
            .unwrap_or_default();
        assert!(
            port.contains("70000") && port.contains("65535") && port.contains("\"listener\""),
            "{port}"
        );
    }
    let status = tenant.status().await;
    assert_eq!(status.generation, 0, "nothing was stored");
    assert_eq!(status.intended_items, 0);
    assert!(recorder.received().is_empty(), "nothing was planned");

    // The valid items converge; the type without a schema takes anything.
    let accepted = tenant
        .submit(vec![
            item("listener", "ok", json!({"host": "a", "port": 80})),
            item(
                "listener",
                "secure",
                json!({"host": "b", "port": 443, "tls": {"certificate": "pem"}}),
            ),
            item("plain", "anything", json!({"port": "not checked"})),
        ])
        .await;
    assert_eq!(accepted.generation, 1);
    tenant.wait_until_ready().await;
    let mut labels = recorder.labels();
    labels.sort();
    assert_eq!(
        labels,
        [
            "create listener/ok",
            "create listener/secure",
            "create plain/anything"
        ]
    );
}

#[tokio::test]
async fn a_schema_that_does_not_compile_is_refused_at_register() {
    let tenant = TestTenant::start("acme").await;
    let agent = tenant
        .agent("broken-1")
        .item_type(TypeSpec::new("fine"), Recorder::new())
        .item_type(
            TypeSpec::new("broken").schema(json!({"properties": {"port": {"type": "port"}}})),
            Recorder::new(),
        )
        .build()
        .expect("the SDK checks only the schema's shape");
    let stopped = tokio::time::timeout(Duration::from_secs(30), agent.run(std::future::pending()))
        .await
        .expect("a refused registration ends the agent");
    match stopped {
        Err(AgentError::RegistrationRejected { code, message }) => {
            assert_eq!(code, Code::InvalidArgument);
            assert!(
                message.contains("register.item_types[1].schema: item type \"broken\": ")
                    && message.contains("/properties/port"),
                "{message}"
            );
        }
        other => panic!("expected RegistrationRejected, got {other:?}"),
    }
    // A schema whose `$ref` points outside it is refused before anything is
    // fetched.
    let agent = tenant
        .agent("broken-2")
        .item_type(
            TypeSpec::new("remote").schema(json!({"$ref": "http://127.0.0.1:9/schema.json"})),
            Recorder::new(),
        )
        .build()
        .expect("built");
    let stopped = tokio::time::timeout(Duration::from_secs(30), agent.run(std::future::pending()))
        .await
        .expect("refused");
    assert!(
        matches!(&stopped, Err(AgentError::RegistrationRejected { message, .. }) if message.contains("points outside the schema")),
        "{stopped:?}"
    );
}

/// Runs reconctl (`binary`) for `tenant` with `args`; returns (exit code,
/// stdout, stderr).
async fn reconctl(
    binary: &Path,
    tenant: &TestTenant,
    home: &Path,
    args: &[&str],
) -> (i32, String, String) {
    let mut command = tokio::process::Command::new(binary);
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if name.starts_with("RECONCILED_") || name.starts_with("RECONCTL_") {
            command.env_remove(&name);
        }
    }
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        command
            .env("HOME", home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("RECONCILED_ADDR", tenant.server.endpoint())
            .env("RECONCILED_TOKEN", &tenant.token)
            .env("RECONCILED_TENANT", &tenant.name)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("reconctl {args:?} finishes"))
    .expect("reconctl runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn reconctl_shows_a_types_schema_and_the_refusal_of_an_intent() {
    // Built (if need be) before the agent starts: the build blocks this
    // test's runtime, and with it the agent's heartbeats.
    let binary = workspace_binary("reconctl");
    let recorder = Recorder::new();
    let (tenant, _agent) = tenant_with_agent(&recorder).await;
    let home = tempfile::tempdir().expect("a temp dir");

    let (code, stdout, stderr) = reconctl(&binary, &tenant, home.path(), &["type", "list"]).await;
    assert_eq!(code, 0, "{stderr}");
    println!("$ reconctl type list\n{stdout}");
    assert!(stdout.starts_with("TYPE"), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|line| line.starts_with("listener  yes") && line.ends_with("yes")),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|line| line.starts_with("plain") && line.ends_with("no")),
        "{stdout}"
    );

    let (code, stdout, stderr) =
        reconctl(&binary, &tenant, home.path(), &["type", "get", "listener"]).await;
    assert_eq!(code, 0, "{stderr}");
    println!("$ reconctl type get listener\n{stdout}");
    assert!(stdout.contains("\"port\""), "{stdout}");

    let (code, stdout, stderr) = reconctl(
        &binary,
        &tenant,
        home.path(),
        &["type", "get", "listener", "--schema"],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let schema: Value = serde_json::from_str(&stdout).expect("the schema is JSON");
    assert_eq!(schema["properties"]["port"]["maximum"], json!(65535));
    assert_eq!(schema["required"], json!(["host", "port"]));

    let (code, stdout, _) = reconctl(
        &binary,
        &tenant,
        home.path(),
        &["type", "get", "plain", "-o", "json"],
    )
    .await;
    assert_eq!(code, 0);
    let plain: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(plain["type"], json!("plain"));
    assert_eq!(plain["connected"], json!(true));
    assert!(plain.get("schema").is_none(), "{plain}");

    let (code, _, stderr) =
        reconctl(&binary, &tenant, home.path(), &["type", "get", "nothing"]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("reconctl type list"), "{stderr}");

    let intent = home.path().join("bad.yaml");
    std::fs::write(
        &intent,
        "items:\n  - type: listener\n    name: web\n    properties: {host: web.local, port: 70000, tls: {}}\n",
    )
    .expect("written");
    let (code, stdout, stderr) = reconctl(
        &binary,
        &tenant,
        home.path(),
        &["intent", "submit", "-f", &intent.to_string_lossy()],
    )
    .await;
    println!("$ reconctl intent submit -f bad.yaml\n{stdout}{stderr}");
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stderr.contains("items[0].properties.port"), "{stderr}");
    assert!(stderr.contains("items[0].properties.tls"), "{stderr}");
    assert_eq!(tenant.status().await.generation, 0);
}

#[tokio::test]
async fn get_item_types_lists_specs_with_schemas_and_the_last_registration_wins() {
    let recorder = Recorder::new();
    let (tenant, agent) = tenant_with_agent(&recorder).await;
    let types = tenant
        .reconciler()
        .get_item_types(v1::GetItemTypesRequest {
            tenant: tenant.name.clone(),
            ..Default::default()
        })
        .await
        .expect("GetItemTypes")
        .into_inner()
        .item_types;
    let names: Vec<&str> = types
        .iter()
        .filter_map(|t| t.spec.as_ref().map(|s| s.item_type.as_str()))
        .collect();
    assert_eq!(names, ["listener", "plain"]);
    assert!(types.iter().all(|t| t.connected && t.epoch == 1));
    assert!(types[0].spec.as_ref().is_some_and(|s| s.schema.is_some()));
    assert!(types[1].spec.as_ref().is_some_and(|s| s.schema.is_none()));

    // The agent comes back without a schema: the type takes anything again,
    // and the type is still known (and shown) while no agent holds it.
    agent.stop().await.expect("stops");
    let mut again = RunningAgent::start(
        tenant
            .agent("listeners-1")
            .item_type(TypeSpec::new("listener"), recorder.clone()),
    );
    again.connected().await;
    tenant
        .submit(vec![item("listener", "loose", json!({"port": "any"}))])
        .await;
    let types = tenant
        .reconciler()
        .get_item_types(v1::GetItemTypesRequest {
            tenant: tenant.name.clone(),
            item_types: vec!["listener".into(), "plain".into(), "unknown".into()],
            ..Default::default()
        })
        .await
        .expect("GetItemTypes")
        .into_inner()
        .item_types;
    assert_eq!(types.len(), 2);
    assert_eq!(types[0].epoch, 2);
    assert!(types[0].spec.as_ref().is_some_and(|s| s.schema.is_none()));
    assert!(!types[1].connected, "plain is no longer held");
}
