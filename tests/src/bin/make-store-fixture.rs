//! `make-store-fixture`: writes a store fixture for the upgrade test
//! (`tests/tests/upgrade.rs`) with a released `reconciled` binary: a real
//! data directory written by that binary through its API and real SDK
//! agents, and what the binary answered about it.
//!
//! ```text
//! RECONCILED_BIN=/tmp/reconciled-v1 \
//!     cargo run -p reconciled-tests --bin make-store-fixture -- tests/fixtures/store-v1
//! ```
//!
//! `RECONCILED_BIN` must name the release binary whose store format the
//! fixture captures (build it from the release's commit); the directory
//! should be named after the schema version it writes (`store-v<N>`, which
//! `expected.json` records). Run it when the next format change needs a
//! fixture of today's format; an existing fixture is the format of its
//! release and is never regenerated with a newer binary.
//!
//! It needs `tar` and `gzip` on `PATH` (the test needs `tar`), and builds
//! this crate (so the workspace must compile), but runs only the binary
//! `RECONCILED_BIN` names.
//!
//! What it does, against that binary with a real sled data directory:
//!
//! 1. creates tenant `acme`, and tenant `globex-ß` with limits;
//! 2. `acme`: agent `net-agent` (spec with a static retry policy, a JSON
//!    Schema, `recreate_on_change`) and agent `svc-agent` register; the net
//!    agent reports the external item `uplink/wan`; generation 1 is a
//!    diamond four levels deep (`net/d` on `net/b` and `net/c`, both on
//!    `net/a`; `net/e` on `net/d` and the external item) with a
//!    `must_satisfy` predicate over observed values, a
//!    `recreate_when_modified` dependency, nested objects, a big integer,
//!    unicode, and `svc/y`, a 40 KB item; all created, with observed
//!    values;
//! 3. generation 2 modifies `net/a` (new observed values): what depends
//!    on it is deleted first and created again after (`net/b` because its
//!    predicate reads an observed value the new intended value lacks,
//!    `net/c` for `recreate_when_modified`, and their dependents, `svc/y`
//!    among them), which leaves modification counters and dependency marks;
//! 4. generation 3 adds `net/flaky`, whose Create fails (UNAVAILABLE, with
//!    a message): FAILED with its error and a retry under the same op id;
//!    the net agent then stops, and the retry waits for a configurator.
//!    It also adds `svc/x` and changes `svc/y`: the svc agent holds that
//!    Create and that Modify (a current record of two 40 KB values, stored
//!    in chunks) without answering;
//! 5. `globex-ß`: three items in a subgraph, no agent (pending), and a
//!    relabel (a new revision, not a new generation);
//! 6. reads every answer (`before_stop`), stops the server with SIGTERM
//!    while the svc agent still holds its operations (the release ends the
//!    agent's stream on SIGTERM, so they are stored UNKNOWN with their
//!    journaled operation: kind, op id, attempt, target, dispatch marks),
//!    prints what each agent received, and packs the data directory into
//!    `data.tar.gz` (a gzipped tar: sled's files are over 1 MB);
//! 7. unpacks the archive again, checks `migrate --status` (kept in
//!    `expected.json`), starts the same binary on it without agents and
//!    reads every answer once they settle (`after_restart`): the journaled
//!    operations are UNKNOWN with their op ids.
//!
//! `expected.json` holds both readings, the tenants' tokens, the failed
//! operation's op id, and the binary's version. The upgrade test compares
//! a newer server on the migrated store with `after_restart` (a restart
//! without agents, like its own), less the fields that differ between two
//! starts (see `fixture::comparable`), and checks against `before_stop`
//! that nothing acknowledged is lost.
#![forbid(unsafe_code)]

#[path = "make_store_fixture/fixture.rs"]
mod fixture;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use reconciled_client::agent::{
    Configurator, ExternalReport, Item, OperationContext, OperationKind, Outcome,
};
use reconciled_tests::agents::{RunningAgent, TestTenant, condition_holds};
use reconciled_tests::api::{self, dependency, item};
use reconciled_tests::proto::v1;
use reconciled_tests::{RECONCILED_BIN_ENV, ServerOptions, ServerProcess, reconciled_binary};
use serde_json::{Map, Value, json};
use tokio::sync::Notify;
use tonic::Code;

use fixture::{ACME, DEV, FLAKY, GLOBEX, NET, NET_AGENT, SVC, SVC_AGENT, UPLINK};

/// How long the generator waits for any one thing.
const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let out = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .context("usage: make-store-fixture <fixture directory, e.g. tests/fixtures/store-v1>")?;
    if std::env::var_os(RECONCILED_BIN_ENV).is_none() {
        bail!(
            "set {RECONCILED_BIN_ENV} to the released reconciled binary whose store the fixture \
             captures (a fixture is never written with the binary under development)"
        );
    }
    let binary = reconciled_binary();
    let version = String::from_utf8_lossy(
        &Command::new(&binary)
            .arg("--version")
            .output()
            .context("reconciled --version")?
            .stdout,
    )
    .trim()
    .to_owned();
    eprintln!(
        "writing a store fixture into {} with {version}",
        out.display()
    );
    std::fs::create_dir_all(&out)?;
    let archive = out.join(fixture::ARCHIVE);

    let (tokens, failed_op, before_stop) = write_store(&archive).await?;
    let (migrate_status, after_restart) = restart_on_copy(&archive, &tokens).await?;
    let (schema_version, _) = fixture::schema_versions(&migrate_status)?;
    check_recovery(&before_stop, &after_restart)?;

    let expected = json!({
        "format": fixture::EXPECTED_FORMAT,
        "about": "Written by tests/src/bin/make-store-fixture.rs: what the binary below answered \
                  about the store in data.tar.gz just before SIGTERM (before_stop) and after a \
                  restart on it without agents (after_restart); tokens of the tenants; the op id \
                  of the failed operation that is retried under the same id.",
        "generated_with": version,
        "schema_version": schema_version,
        "migrate_status": migrate_status,
        "server_args": fixture::SERVER_ARGS,
        "tokens": tokens,
        "failed_operation": failed_op,
        "before_stop": before_stop,
        "after_restart": after_restart,
    });
    let path = out.join(fixture::EXPECTED);
    std::fs::write(&path, serde_json::to_string_pretty(&expected)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!(
        "wrote {} ({} bytes) and {} (schema version {schema_version})",
        archive.display(),
        std::fs::metadata(&archive)?.len(),
        path.display()
    );
    Ok(())
}

fn options() -> ServerOptions {
    fixture::SERVER_ARGS
        .iter()
        .fold(ServerOptions::default(), |options, arg| options.arg(*arg))
        // The held operations never end by themselves: do not wait for them.
        .arg("--shutdown-grace-secs")
        .arg("2")
}

/// Steps 1 to 6: returns the tokens, the failed operation and the answers
/// just before SIGTERM, and leaves the packed data directory in `archive`.
async fn write_store(archive: &Path) -> anyhow::Result<(BTreeMap<String, String>, Value, Value)> {
    let server = ServerProcess::start(options()).await?;
    let channel = server.channel().await?;
    let admin = server.admin_token();
    let mut tenants = api::tenants(&channel, &admin);
    let acme_token = tenants
        .create_tenant(v1::CreateTenantRequest {
            name: ACME.into(),
            limits: None,
        })
        .await?
        .into_inner()
        .token;
    let globex_token = tenants
        .create_tenant(v1::CreateTenantRequest {
            name: GLOBEX.into(),
            limits: Some(v1::TenantLimits {
                max_items: 50,
                max_request_items: 20,
                max_agents: 2,
                max_watchers: 3,
                max_operations_in_flight: 4,
            }),
        })
        .await?
        .into_inner()
        .token;
    let tokens: BTreeMap<String, String> = [
        (ACME.to_owned(), acme_token.clone()),
        (GLOBEX.to_owned(), globex_token.clone()),
    ]
    .into();
    let mut acme = TestTenant {
        server,
        channel: channel.clone(),
        name: ACME.into(),
        token: acme_token,
    };

    // Tenant B: pending items, then a relabel (revision, not generation).
    let mut globex = api::reconciler(&channel, &globex_token);
    globex
        .submit_intent(api::submit(GLOBEX, globex_intent("Access point")))
        .await?;
    let relabel = globex
        .submit_intent(api::submit(GLOBEX, globex_intent("Lobby AP ☕")))
        .await?
        .into_inner();
    ensure!(
        relabel.generation == 1,
        "a relabel is no new generation: {relabel:?}"
    );

    // Tenant A, generation 1.
    let net = Scripted::default();
    let svc = Scripted::default();
    let net_agent = acme
        .agent(NET_AGENT)
        .item_type(fixture::net_spec(), net.clone())
        .build()?;
    let net_handle = net_agent.handle();
    let mut net_agent = RunningAgent::run(net_agent);
    net_agent.connected().await;
    let mut svc_agent = RunningAgent::start(
        acme.agent(SVC_AGENT)
            .item_type(fixture::svc_spec(), svc.clone()),
    );
    svc_agent.connected().await;
    let mut uplink = Item::new(UPLINK, "wan")
        .with_property("speed", 10_000)
        .with_property("carrier", "Überlandwerk Nord");
    uplink.description = "reported by net-agent".into();
    net_handle
        .report_external([ExternalReport::put(uplink)])
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    acme.wait_for_item(UPLINK, "wan", "reported", |s| s.external)
        .await;

    acme.submit(acme_intent(1)).await;
    wait_until_ready_at(&acme, 1).await;

    // Generation 2: a Modify of net/a; its recreate_when_modified
    // dependent net/c is recreated, and net/d and net/e with it.
    acme.submit(acme_intent(2)).await;
    wait_until_ready_at(&acme, 2).await;
    let a = acme.item(NET, "a").await.context("net/a")?;
    ensure!(a.modifications == 1, "net/a was modified once: {a:?}");
    net.wait_for("the recreate of net/c", |seen| {
        seen.iter()
            .any(|s| s.kind == OperationKind::Delete && s.item == "net/c")
    })
    .await?;

    // Generation 3: a failure, and operations held over the shutdown.
    acme.submit(acme_intent(3)).await;
    let flaky_item = format!("{NET}/{FLAKY}");
    let failed = net
        .wait_for("the failing Create of net/flaky", |seen| {
            seen.iter().any(|s| s.item == flaky_item)
        })
        .await?
        .into_iter()
        .find(|s| s.item == flaky_item)
        .context("the Create of net/flaky")?;
    acme.wait_for_state(NET, FLAKY, v1::ItemState::Failed).await;
    // The retry (3 s later) finds no configurator.
    net_agent
        .stop()
        .await
        .map_err(|e| anyhow::anyhow!("stopping net-agent: {e}"))?;
    svc.wait_for("the held Create of svc/x and Modify of svc/y", |seen| {
        seen.iter()
            .any(|s| s.item == "svc/x" && s.kind == OperationKind::Create)
            && seen
                .iter()
                .any(|s| s.item == "svc/y" && s.kind == OperationKind::Modify)
    })
    .await?;
    acme.wait_for_state(SVC, "x", v1::ItemState::Creating).await;
    acme.wait_for_state(SVC, "y", v1::ItemState::Modifying)
        .await;
    acme.wait_for_item(NET, FLAKY, "waiting for a configurator", |s| {
        s.reason == v1::WaitReason::NoConfigurator as i32 && s.last_error.is_some()
    })
    .await;

    let before_stop = steady(&acme.channel, &admin, &tokens).await?;
    let status = acme.server.terminate().await?;
    ensure!(status.success(), "SIGTERM is a clean shutdown: {status}");
    svc_agent.kill().await;
    let held = svc.seen();
    for (kind, item) in [
        (OperationKind::Create, "svc/x"),
        (OperationKind::Modify, "svc/y"),
    ] {
        ensure!(
            held.iter()
                .filter(|s| s.kind == kind && s.item == item)
                .count()
                == 1,
            "svc-agent received the {kind} of {item} once: {held:?}"
        );
    }

    for (agent, log) in [(NET_AGENT, &net), (SVC_AGENT, &svc)] {
        let ran: Vec<String> = log
            .seen()
            .iter()
            .map(|s| {
                format!(
                    "{} {} (op {} attempt {})",
                    s.kind, s.item, s.op_id, s.attempt
                )
            })
            .collect();
        eprintln!("{agent} received, in order:\n  {}", ran.join("\n  "));
    }
    fixture::pack(&acme.server.data_dir(), archive)?;
    let failed_op = json!({
        "tenant": ACME,
        "item": flaky_item,
        "kind": "OPERATION_KIND_CREATE",
        "op_id": failed.op_id,
        "attempt": failed.attempt,
    });
    Ok((tokens, failed_op, before_stop))
}

/// Step 7: `migrate --status` and the answers of the same binary restarted
/// on an unpacked copy of `archive`, without agents.
async fn restart_on_copy(
    archive: &Path,
    tokens: &BTreeMap<String, String>,
) -> anyhow::Result<(String, Value)> {
    let mut server = ServerProcess::start(options()).await?;
    server.terminate().await?;
    let data = server.data_dir();
    std::fs::remove_dir_all(&data)?;
    fixture::unpack(archive, &data)?;
    let status = fixture::migrate(&reconciled_binary(), &data, &["--status"])?;
    let (current, latest) = fixture::schema_versions(&status)?;
    ensure!(
        current == latest && status.contains("nothing to do"),
        "the binary that wrote the store finds it up to date:\n{status}"
    );
    server.start_again().await?;
    let channel = server.channel().await?;
    let after = fixture::settled(&channel, &server.admin_token(), tokens).await?;
    server.terminate().await?;
    Ok((status, after))
}

/// Reads the server until two readings in a row agree.
async fn steady(
    channel: &tonic::transport::Channel,
    admin: &str,
    tokens: &BTreeMap<String, String>,
) -> anyhow::Result<Value> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut last = fixture::read_server(channel, admin, tokens).await?;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = fixture::read_server(channel, admin, tokens).await?;
        if fixture::comparable(&now) == fixture::comparable(&last) {
            return Ok(now);
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "the answers kept changing: {:#?}",
                fixture::differences(&last, &now)
            );
        }
        last = now;
    }
}

/// The fixture is only useful if it holds what it is meant to: checks the
/// readings before SIGTERM and after the restart.
fn check_recovery(before: &Value, after: &Value) -> anyhow::Result<()> {
    let current = |snapshot: &Value, item: &str| {
        snapshot["per_tenant"][ACME]["graph"]["current"][item].clone()
    };
    for (item, state) in [
        ("svc/x", "ITEM_STATE_CREATING"),
        ("svc/y", "ITEM_STATE_MODIFYING"),
    ] {
        let held = current(before, item);
        ensure!(held["state"] == state, "{item} before SIGTERM: {held:#}");
        let lost = current(after, item);
        ensure!(
            lost["state"] == "ITEM_STATE_UNKNOWN"
                && lost["operation"]["op_id"] == held["operation"]["op_id"]
                && !held["operation"]["op_id"]
                    .as_str()
                    .unwrap_or_default()
                    .is_empty(),
            "{item} after the restart is UNKNOWN with its journaled op id: {lost:#} (was {held:#})"
        );
    }
    let flaky = current(before, &format!("{NET}/{FLAKY}"));
    ensure!(
        flaky["state"] == "ITEM_STATE_FAILED"
            && flaky["last_error"]["code"] == Code::Unavailable as i32,
        "net/flaky failed: {flaky:#}"
    );
    let a = current(before, "net/a");
    ensure!(
        a["observed"]["oper"] == "up",
        "net/a has observed values: {a:#}"
    );
    let lost = fixture::losses(before, after);
    ensure!(
        lost.is_empty(),
        "the release's own restart fails the upgrade test's checks:\n{}",
        lost.join("\n")
    );
    Ok(())
}

/// Waits until the tenant is Ready and quiescent at `generation`.
async fn wait_until_ready_at(tenant: &TestTenant, generation: u64) {
    tenant
        .wait_for_status(&format!("Ready at generation {generation}"), |status| {
            status.generation == generation
                && status.observed_generation == generation
                && condition_holds(status, "Ready")
                && !condition_holds(status, "Reconciling")
        })
        .await;
}

fn with_dependency(mut item: v1::Item, dependency: v1::Dependency) -> v1::Item {
    item.dependencies.push(dependency);
    item
}

/// Tenant A's intent at `generation` (1, 2 or 3).
fn acme_intent(generation: u32) -> Vec<v1::Item> {
    let mut a = item(
        NET,
        "a",
        json!({
            "vlan": {"id": 10, "tags": ["core", "ünïcödé"]},
            "mtu": 9000,
            "big": 1_152_921_504_606_846_976_u64,
            "ratio": 0.125,
            "negative": -42,
            "enabled": true,
            "nothing": null,
            "empty_object": {},
            "empty_list": [],
            "greeting": "Grüße, 世界 🌍",
            "note": if generation >= 2 { "second" } else { "first" },
        }),
    );
    a.subgraph = "site/core".into();
    a.label = "Core ✓".into();
    a.description = "the root of the diamond".into();

    let b = with_dependency(
        item(NET, "b", json!({"vlan": {"id": 20}, "mtu": 1500})),
        v1::Dependency {
            must_satisfy: r#"self.mtu >= 1500 && self.oper == "up""#.into(),
            description: "needs jumbo frames and a live link".into(),
            ..dependency(NET, "a")
        },
    );
    let c = with_dependency(
        item(NET, "c", json!({"vlan": {"id": 30}})),
        v1::Dependency {
            recreate_when_modified: true,
            ..dependency(NET, "a")
        },
    );
    let mut d = item(
        NET,
        "d",
        json!({
            "vlan": {"id": 40},
            "nested": {"level1": {"level2": {"level3": [1, {"k": "v"}, [true, null]]}}},
        }),
    );
    d.dependencies = vec![dependency(NET, "b"), dependency(NET, "c")];
    let mut e = item(NET, "e", json!({"vlan": {"id": 50}}));
    e.dependencies = vec![
        dependency(NET, "d"),
        v1::Dependency {
            auto_deleted_by_external: true,
            ..dependency(UPLINK, "wan")
        },
    ];
    let mut wan = item(UPLINK, "wan", json!({"speed": 10_000}));
    wan.external = true;
    let mut y = with_dependency(
        item(
            SVC,
            "y",
            json!({"port": if generation >= 3 { 8081 } else { 8080 }, "blob": fixture::blob()}),
        ),
        dependency(NET, "b"),
    );
    y.subgraph = "apps".into();
    let mut items = vec![a, b, c, d, e, wan, y];
    if generation >= 3 {
        items.push(with_dependency(
            item(NET, FLAKY, json!({"vlan": {"id": 60}})),
            dependency(NET, "a"),
        ));
        let mut x = with_dependency(
            item(SVC, "x", json!({"port": 9090})),
            v1::Dependency {
                recreate_when_modified: true,
                ..dependency(NET, "c")
            },
        );
        x.label = "x-svc".into();
        x.subgraph = "apps".into();
        items.push(x);
    }
    items
}

/// Tenant B's intent; `ap_label` changes between its two submits.
fn globex_intent(ap_label: &str) -> Vec<v1::Item> {
    let mut router = item(
        DEV,
        "router",
        json!({"model": "RB5009", "serial": "ÄÖÜ-123", "ports": 10}),
    );
    router.label = "Router".into();
    let mut switch = item(DEV, "switch", json!({"ports": 48}));
    switch.dependencies.push(dependency(DEV, "router"));
    let mut ap = item(DEV, "ap", json!({"ssid": "café", "channels": [1, 6, 11]}));
    ap.dependencies.push(v1::Dependency {
        must_satisfy: "self.ports >= 24".into(),
        ..dependency(DEV, "switch")
    });
    ap.label = ap_label.into();
    let mut items = vec![router, switch, ap];
    for item in &mut items {
        item.subgraph = "lab/rack-1".into();
    }
    items
}

/// One operation a [`Scripted`] configurator received.
#[derive(Debug, Clone)]
struct Seen {
    kind: OperationKind,
    /// `type/name`.
    item: String,
    op_id: String,
    attempt: u32,
}

#[derive(Debug, Default)]
struct Log {
    seen: Mutex<Vec<Seen>>,
    changed: Notify,
}

/// The fixture's configurator: answers as [`answer`] says and logs every
/// operation.
#[derive(Debug, Clone, Default)]
struct Scripted(Arc<Log>);

/// How [`Scripted`] answers one operation.
enum Answer {
    Done(Option<Map<String, Value>>),
    Fail(Code, String),
    /// Never answers (the operation is held over the shutdown).
    Hold,
}

/// The script: observed values for net/a and svc/y, a failure for
/// net/flaky, the held operations of generation 3.
fn answer(kind: OperationKind, item: &Item) -> Answer {
    let observed = |value: Value| match value {
        Value::Object(map) => Answer::Done(Some(map)),
        _ => Answer::Done(None),
    };
    match (kind, item.item_type.as_str(), item.name.as_str()) {
        (OperationKind::Create, NET, "a") => {
            observed(json!({"oper": "up", "mtu": 9000, "ifindex": 7}))
        }
        (OperationKind::Modify, NET, "a") => observed(json!({
            "oper": "up",
            "mtu": 9000,
            "ifindex": 7,
            "counters": {"rx": 1_152_921_504_606_846_976_u64, "tx": 0},
            "firmware": "v2.1-ß",
        })),
        (OperationKind::Create, NET, FLAKY) => Answer::Fail(
            Code::Unavailable,
            "link negotiation failed on port ✗7: peer answered 1152921504606846976".into(),
        ),
        (OperationKind::Create, SVC, "y") => {
            observed(json!({"pid": 4242, "listening": ["0.0.0.0:8080"]}))
        }
        (OperationKind::Create, SVC, "x") | (OperationKind::Modify, SVC, "y") => Answer::Hold,
        _ => Answer::Done(None),
    }
}

impl Scripted {
    fn seen(&self) -> Vec<Seen> {
        self.0
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until `check` accepts the operations received so far.
    async fn wait_for(
        &self,
        what: &str,
        check: impl Fn(&[Seen]) -> bool,
    ) -> anyhow::Result<Vec<Seen>> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let changed = self.0.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            let seen = self.seen();
            if check(&seen) {
                return Ok(seen);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                bail!("the configurator did not see {what} within {DEADLINE:?}; it saw {seen:#?}");
            }
        }
    }

    async fn operate(&self, ctx: &OperationContext, kind: OperationKind, item: &Item) -> Outcome {
        self.0
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Seen {
                kind,
                item: format!("{}/{}", item.item_type, item.name),
                op_id: ctx.op_id().to_owned(),
                attempt: ctx.attempt(),
            });
        self.0.changed.notify_waiters();
        match answer(kind, item) {
            Answer::Done(None) => Outcome::done(),
            Answer::Done(Some(observed)) => Outcome::done_observed(observed),
            Answer::Fail(code, message) => Outcome::failed(code, message),
            Answer::Hold => std::future::pending().await,
        }
    }
}

impl Configurator for Scripted {
    async fn create(&self, ctx: &OperationContext, item: &Item) -> Outcome {
        self.operate(ctx, OperationKind::Create, item).await
    }

    async fn modify(&self, ctx: &OperationContext, _previous: &Item, item: &Item) -> Outcome {
        self.operate(ctx, OperationKind::Modify, item).await
    }

    async fn delete(&self, ctx: &OperationContext, item: &Item) -> Outcome {
        self.operate(ctx, OperationKind::Delete, item).await
    }
}
