//! Upgrade: a store written by the release before the change of record
//! encoding (schema version 1, JSON records) migrates to the binary
//! records of schema version 2 and loses nothing.
//!
//! The store is `tests/fixtures/store-v1/data.tar.gz`, written through the
//! API by the v1 release and real SDK agents (see
//! `tests/src/bin/make-store-fixture.rs`, which also says how to write
//! it again); `expected.json` next to it holds what that release answered
//! just before SIGTERM (`before_stop`) and after a restart on the store
//! without agents (`after_restart`).
//!
//! Both tests run the binary under test (`RECONCILED_BIN` or the
//! workspace's) on an unpacked copy, migrated either by `reconciled
//! migrate` or by `serve` at start, and check:
//!
//! - nothing is lost since `before_stop` (`fixture::losses`): tenants,
//!   tokens, generations, the intended graph, every current item with its
//!   applied and observed values, state, error and counters, the journaled
//!   operations (UNKNOWN with their op ids), the item type specs;
//! - the answers are those of the release after its own restart
//!   (`after_restart`), less when conditions last changed and the owner;
//! - agents then finish the journaled operations under their op ids, the
//!   failed Create is retried under its op id, nothing acknowledged runs
//!   again, and the tenant converges to Ready.

#[path = "../src/bin/make_store_fixture/fixture.rs"]
mod fixture;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use reconciled_client::agent::OperationKind;
use reconciled_tests::agents::{Received, Recorder, RunningAgent, TestTenant, condition_holds};
use reconciled_tests::api;
use reconciled_tests::proto::v1;
use reconciled_tests::{ServerOptions, ServerProcess, reconciled_binary};
use serde_json::{Value, json};
use tonic::Code;

use fixture::{ACME, FLAKY, GLOBEX, NET, NET_AGENT, SVC_AGENT};

/// The migration that changes the encoding, as `migrate` lists it.
const BINARY_RECORDS: &str = "0002 binary records";

/// `expected.json` of the v1 fixture, checked for its format.
fn expected() -> Value {
    let path = fixture::store_v1_dir().join(fixture::EXPECTED);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
    let expected: Value = serde_json::from_str(&text)
        .unwrap_or_else(|error| panic!("{} is not JSON: {error}", path.display()));
    assert_eq!(
        expected["format"],
        fixture::EXPECTED_FORMAT,
        "{}",
        path.display()
    );
    assert_eq!(
        expected["schema_version"], 1,
        "the store-v1 fixture holds a store of schema version 1"
    );
    expected
}

fn tokens(expected: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(expected["tokens"].clone()).expect("expected.json names the tokens")
}

fn options() -> ServerOptions {
    fixture::SERVER_ARGS
        .iter()
        .fold(ServerOptions::default(), |options, arg| options.arg(*arg))
}

/// A stopped server whose data directory is a fresh copy of the fixture's
/// store (the server's first start, before the copy, only made an empty
/// store of its own, now replaced).
async fn server_on_fixture() -> ServerProcess {
    let mut server = ServerProcess::start(options())
        .await
        .expect("the server starts");
    server.terminate().await.expect("the server stops");
    let data = server.data_dir();
    std::fs::remove_dir_all(&data).expect("removes the empty store");
    fixture::unpack(&fixture::store_v1_dir().join(fixture::ARCHIVE), &data)
        .unwrap_or_else(|error| panic!("cannot unpack the fixture: {error:#}"));
    server
}

fn migrate(data: &Path, flags: &[&str]) -> String {
    fixture::migrate(&reconciled_binary(), data, flags).unwrap_or_else(|error| panic!("{error:#}"))
}

fn versions(report: &str) -> (u32, u32) {
    fixture::schema_versions(report).unwrap_or_else(|error| panic!("{error:#}"))
}

/// `migrate --status` or `--dry-run` on the fixture: version 1, 0001
/// applied, 0002 pending, nothing done.
fn assert_pending(report: &str, verb: &str) {
    let (current, latest) = versions(report);
    assert_eq!(current, 1, "{report}");
    assert!(latest >= 2, "this build knows the binary records: {report}");
    assert!(
        report
            .lines()
            .any(|line| line == "applied: 0001 create layout"),
        "{report}"
    );
    assert!(
        report
            .lines()
            .any(|line| line.starts_with(&format!("{verb}: {BINARY_RECORDS}"))),
        "`{verb}: {BINARY_RECORDS}` is listed: {report}"
    );
    assert!(
        !report.contains("backup:"),
        "nothing is backed up: {report}"
    );
}

/// The store in `data` is at the newest version, with 0002 applied.
fn assert_up_to_date(data: &Path) {
    let report = migrate(data, &["--status"]);
    let (current, latest) = versions(&report);
    assert_eq!(current, latest, "{report}");
    assert!(current >= 2, "{report}");
    assert!(
        report
            .lines()
            .any(|line| line.starts_with(&format!("applied: {BINARY_RECORDS}"))),
        "{report}"
    );
    assert!(report.contains("nothing to do"), "{report}");
}

/// The backup `path` holds the store as it was: version 1.
fn assert_v1_backup(data: &Path, backup: &Path) {
    assert!(
        backup.starts_with(data.join("backups")),
        "the backup {} is under <data-dir>/backups/",
        backup.display()
    );
    let name = backup
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    assert!(
        name.starts_with("pre-migration-v1-"),
        "{}",
        backup.display()
    );
    assert!(
        backup.join("db").is_dir(),
        "{} holds a store",
        backup.display()
    );
    let report = migrate(backup, &["--status"]);
    assert_eq!(
        versions(&report).0,
        1,
        "the backup is the v1 store: {report}"
    );
}

/// What the v1 release answered, with what has changed since on purpose:
/// every difference this build may show is listed here, with its reason.
///
/// - Ready's reason names what a quiet tenant's waits come down to, not
///   the most common wait: globex-ß's router has no configurator and its
///   switch and access point wait on it, so it is not Ready for want of a
///   configurator (docs/planning.md, Conditions). The new condition is
///   committed at start-up, so globex-ß is one revision further on.
fn changed_since_v1(answered: &Value) -> Value {
    let mut answered = answered.clone();
    let globex = &mut answered["per_tenant"][GLOBEX];
    for view in ["graph", "item_types", "status"] {
        let revision = globex[view]["revision"]
            .as_u64()
            .expect("the v1 release answered a revision");
        globex[view]["revision"] = json!(revision + 1);
    }
    let conditions = answered["per_tenant"][GLOBEX]["status"]["conditions"]
        .as_array_mut()
        .expect("the v1 release answered globex-ß's conditions");
    let ready = conditions
        .iter_mut()
        .find(|condition| condition["type"] == "Ready")
        .expect("a Ready condition");
    assert_eq!(
        ready["reason"], "WaitingForDependencies",
        "the fixture is the one this change was made against"
    );
    ready["reason"] = json!("WaitingForConfigurator");
    ready["message"] =
        json!("3 item(s) waiting, 1 with reason WaitingForConfigurator, 2 on their dependencies");
    answered
}

/// The server (running on the migrated store, no agent connected) answers
/// what the v1 release answered: nothing lost since before SIGTERM, the
/// same answers as the release's own restart, the tokens still bound to
/// their tenants.
async fn answers_as_before(server: &ServerProcess, expected: &Value) {
    let tokens = tokens(expected);
    let channel = server.channel().await.expect("connects");
    let now = fixture::settled(&channel, &server.admin_token(), &tokens)
        .await
        .unwrap_or_else(|error| panic!("{error:#}"));

    let lost = fixture::losses(&expected["before_stop"], &now);
    assert!(
        lost.is_empty(),
        "the upgraded server lost what the v1 release answered before SIGTERM:\n{}",
        lost.join("\n")
    );
    let differences = fixture::differences(
        &fixture::comparable(&changed_since_v1(&expected["after_restart"])),
        &fixture::comparable(&now),
    );
    assert!(
        differences.is_empty(),
        "the upgraded server answers otherwise than the v1 release after its own restart:\n{}",
        differences.join("\n")
    );

    // The condition times may be recomputed, but not lost.
    for (name, tenant) in now["per_tenant"].as_object().into_iter().flatten() {
        let created = now["tenants"][name]["created_at"]["seconds"]
            .as_i64()
            .unwrap_or_default();
        for condition in tenant["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let changed = condition["last_transition_time"]["seconds"]
                .as_i64()
                .unwrap_or_default();
            assert!(
                changed >= created,
                "tenant {name}: condition {condition} changed before the tenant existed"
            );
        }
    }

    // A token still opens its own tenant only, and a made-up one nothing.
    let status = api::reconciler(&channel, &tokens[GLOBEX])
        .get_status(v1::GetStatusRequest {
            tenant: ACME.into(),
        })
        .await
        .expect_err("globex's token does not open acme");
    assert!(
        matches!(status.code(), Code::NotFound | Code::PermissionDenied),
        "{status:?}"
    );
    let status = api::reconciler(&channel, "rcd_not-a-token-of-this-store")
        .get_status(v1::GetStatusRequest {
            tenant: ACME.into(),
        })
        .await
        .expect_err("a made-up token opens nothing");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
}

/// The operation of `kind` on `item` among `received`.
fn find<'a>(received: &'a [Received], kind: OperationKind, item: &str) -> Option<&'a Received> {
    received
        .iter()
        .find(|r| r.kind == kind && r.item.to_string() == item)
}

/// Agents connect to the upgraded server: the journaled operations are
/// sent again under their op ids and attempts, the failed Create is
/// retried under its op id, nothing else runs, and acme converges to Ready
/// with every intended value applied.
async fn converges(tenant: &TestTenant, expected: &Value) {
    let before = &expected["before_stop"]["per_tenant"][ACME]["graph"];
    let journaled: Vec<(String, Value)> = before["current"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, item)| !item["operation"].is_null())
        .map(|(name, item)| (name.clone(), item["operation"].clone()))
        .collect();
    assert_eq!(
        journaled.len(),
        2,
        "the fixture holds the Create of svc/x and the Modify of svc/y in flight: {journaled:?}"
    );
    let failed = &expected["failed_operation"];
    let flaky = format!("{NET}/{FLAKY}");
    assert_eq!(failed["item"], flaky.as_str());
    let failed_attempts = before["current"][&flaky]["attempts"]
        .as_u64()
        .expect("the failed item's attempts");

    let recorder = Recorder::new();
    let mut net = RunningAgent::start(
        tenant
            .agent(NET_AGENT)
            .item_type(fixture::net_spec(), recorder.clone()),
    );
    net.connected().await;
    let mut svc = RunningAgent::start(
        tenant
            .agent(SVC_AGENT)
            .item_type(fixture::svc_spec(), recorder.clone()),
    );
    svc.connected().await;

    let received = recorder
        .wait_until("the journaled operations and the retry", |received, _| {
            let all = journaled.iter().all(|(item, operation)| {
                received
                    .iter()
                    .any(|r| r.item.to_string() == *item && r.op_id == operation["op_id"])
            }) && received.iter().any(|r| r.item.to_string() == flaky);
            all.then(|| received.to_vec())
        })
        .await;
    for (item, operation) in &journaled {
        let kind = match operation["kind"].as_str() {
            Some("OPERATION_KIND_CREATE") => OperationKind::Create,
            Some("OPERATION_KIND_MODIFY") => OperationKind::Modify,
            other => panic!("unexpected journaled operation {other:?} on {item}"),
        };
        let sent = find(&received, kind, item)
            .unwrap_or_else(|| panic!("the journaled {kind} of {item} is sent: {received:#?}"));
        assert_eq!(sent.op_id, operation["op_id"], "{item}: {sent:?}");
        assert_eq!(
            u64::from(sent.attempt),
            operation["attempt"],
            "{item}: {sent:?}"
        );
    }
    let retry = find(&received, OperationKind::Create, &flaky).expect("the retry");
    assert_eq!(
        retry.op_id, failed["op_id"],
        "the failed Create is retried under its op id (its retry survived): {retry:?}"
    );
    assert_eq!(u64::from(retry.attempt), failed_attempts + 1, "{retry:?}");

    // The Modify of svc/y carries its whole 40 KB target (a chunked record
    // in the v1 store) and the applied value it changes.
    let modify = find(&received, OperationKind::Modify, "svc/y").expect("the Modify of svc/y");
    let blob = json!(fixture::blob());
    assert_eq!(modify.property("blob"), Some(&blob));
    assert_eq!(modify.property("port"), Some(&json!(8081)));
    let previous = modify.previous.as_ref().expect("the applied value");
    assert_eq!(previous.get("blob"), Some(&blob));
    assert_eq!(previous.get("port"), Some(&json!(8080)));

    let generation = expected["before_stop"]["per_tenant"][ACME]["graph"]["generation"]
        .as_u64()
        .expect("acme's generation");
    let status = tenant
        .wait_for_status("Ready at the fixture's generation", |status| {
            status.generation == generation
                && status.observed_generation == generation
                && condition_holds(status, "Ready")
                && !condition_holds(status, "Reconciling")
        })
        .await;
    let intended_items = before["current"].as_object().map_or(0, |c| c.len()) as u64;
    assert_eq!(
        status.items_by_state.get("CREATED"),
        Some(&intended_items),
        "{status:#?}"
    );

    // Nothing that was acknowledged ran again.
    let labels = recorder.labels();
    let mut ran: Vec<&str> = labels.iter().map(String::as_str).collect();
    ran.sort_unstable();
    assert_eq!(
        ran,
        ["create net/flaky", "create svc/x", "modify svc/y"],
        "only the journaled operations and the retry run"
    );

    // Every intended value is applied.
    let graph = fixture::read_tenant(&tenant.channel, ACME, &tenant.token)
        .await
        .expect("reads acme");
    for (item, intended) in graph["graph"]["intended"].as_object().into_iter().flatten() {
        let current = &graph["graph"]["current"][item];
        assert_eq!(current["state"], "ITEM_STATE_CREATED", "{item}: {current}");
        if intended["item"]["external"] != true {
            assert_eq!(current["applied"], intended["item"], "{item}");
        }
    }

    // globex-ß, which never had an agent, is as it was.
    let globex = &expected["before_stop"]["per_tenant"][GLOBEX];
    let status = api::status_of(&tenant.channel, &tokens(expected)[GLOBEX], GLOBEX).await;
    assert_eq!(json!(status.generation), globex["status"]["generation"]);
    assert_eq!(
        status.items_by_state.get("PENDING").copied(),
        globex["status"]["items_by_state"]["PENDING"].as_u64()
    );

    net.stop().await.expect("net-agent stops");
    svc.stop().await.expect("svc-agent stops");
}

/// The upgraded server with acme's token, as a [`TestTenant`].
async fn acme(server: ServerProcess, expected: &Value) -> TestTenant {
    let channel = server.channel().await.expect("connects");
    TestTenant {
        server,
        channel,
        name: ACME.into(),
        token: tokens(expected)[ACME].clone(),
    }
}

#[tokio::test]
async fn reconciled_migrate_upgrades_a_v1_store_and_the_new_server_loses_nothing() {
    let expected = expected();
    let mut server = server_on_fixture().await;
    let data = server.data_dir();

    // --status and --dry-run report and change nothing.
    assert_pending(&migrate(&data, &["--status"]), "would run");
    let dry_run = migrate(&data, &["--dry-run"]);
    assert_pending(&dry_run, "would run");
    let plan = format!(
        "would back up the store first, into {}: about ",
        data.join("backups").display()
    );
    assert!(
        dry_run.contains(&plan) && dry_run.contains(" MiB free there"),
        "a dry run says where the backup goes, the store's size and the room there: {dry_run}"
    );
    assert_pending(&migrate(&data, &["--status"]), "would run");
    assert!(
        !data.join("backups").exists(),
        "--status and --dry-run take no backup"
    );

    // migrate backs the store up, then applies 0002.
    let report = migrate(&data, &[]);
    assert!(
        report
            .lines()
            .any(|line| line.starts_with(&format!("ran: {BINARY_RECORDS}"))),
        "{report}"
    );
    let backup = report
        .lines()
        .find_map(|line| line.strip_prefix("backup: "))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("migrate names its backup: {report}"));
    assert_v1_backup(&data, &backup);
    assert_up_to_date(&data);

    server
        .start_again()
        .await
        .expect("serves the migrated store");
    answers_as_before(&server, &expected).await;
    let mut tenant = acme(server, &expected).await;
    converges(&tenant, &expected).await;
    tenant.server.terminate().await.expect("stops");
    assert_up_to_date(&data);
}

#[tokio::test]
async fn serve_migrates_a_v1_store_at_start_and_loses_nothing() {
    let expected = expected();
    let mut server = server_on_fixture().await;
    let data = server.data_dir();

    server
        .start_again()
        .await
        .expect("serves the v1 store, migrating it first");
    answers_as_before(&server, &expected).await;
    let mut tenant = acme(server, &expected).await;
    converges(&tenant, &expected).await;
    tenant.server.terminate().await.expect("stops");

    let backups: Vec<PathBuf> = std::fs::read_dir(data.join("backups"))
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    assert_eq!(
        backups.len(),
        1,
        "serve backed the store up once before migrating: {backups:?}"
    );
    assert_v1_backup(&data, &backups[0]);
    assert_up_to_date(&data);
}
