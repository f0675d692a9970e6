//! Hostile input (issue 12): what one tenant, agent or anonymous client
//! sends cannot hurt another tenant or the server. Every test goes through
//! the real binary; each checks the refusal's status and details, that
//! nothing of a refused request was stored, and that bystanders are served.

use std::time::{Duration, Instant};

use reconciled_tests::agents::{DEADLINE, TestTenant, external_put};
use reconciled_tests::api::{self, Bearer, error_reason, item, violated_fields};
use reconciled_tests::proto::v1;
use reconciled_tests::proto::v1::configurators_client::ConfiguratorsClient;
use reconciled_tests::raw;
use reconciled_tests::{ServerOptions, ServerProcess};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_types::StatusExt as _;

/// A raw agent session: what it sends, and what the server answers.
struct RawSession {
    outgoing: mpsc::Sender<v1::AgentMessage>,
    incoming: tonic::Streaming<v1::ServerMessage>,
}

impl RawSession {
    /// Opens Connect for `tenant` with `token`, registers `item_type` and
    /// waits for Registered.
    async fn open(channel: &Channel, token: &str, tenant: &str, item_type: &str) -> RawSession {
        let (outgoing, receiver) = mpsc::channel(16);
        let register = v1::AgentMessage {
            message: Some(v1::agent_message::Message::Register(v1::Register {
                tenant: tenant.into(),
                agent_id: "hostile-agent".into(),
                protocol_version: reconciled_tests::proto::PROTOCOL_VERSION,
                item_types: vec![v1::ItemTypeSpec {
                    item_type: item_type.into(),
                    ..Default::default()
                }],
                ..Default::default()
            })),
        };
        outgoing.send(register).await.expect("queue open");
        let mut incoming =
            ConfiguratorsClient::with_interceptor(channel.clone(), Bearer::new(token))
                .connect(ReceiverStream::new(receiver))
                .await
                .expect("Connect is accepted")
                .into_inner();
        let first = tokio::time::timeout(DEADLINE, incoming.message())
            .await
            .expect("Registered within the deadline")
            .expect("the stream is healthy")
            .expect("the stream is open");
        assert!(
            matches!(
                first.message,
                Some(v1::server_message::Message::Registered(_))
            ),
            "{first:?}"
        );
        RawSession { outgoing, incoming }
    }

    /// Sends an ExternalUpdate with `reports`.
    async fn report(&self, reports: Vec<v1::ExternalReport>) {
        let update = v1::AgentMessage {
            message: Some(v1::agent_message::Message::ExternalUpdate(
                v1::ExternalUpdate { reports },
            )),
        };
        self.outgoing.send(update).await.expect("queue open");
    }

    /// Reads until the server ends the stream with an error, within the
    /// deadline (heartbeats and other messages are skipped).
    async fn ended_with(mut self) -> Status {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            match tokio::time::timeout_at(deadline, self.incoming.message()).await {
                Err(_) => panic!("the server did not end the session within {DEADLINE:?}"),
                Ok(Err(status)) => return status,
                Ok(Ok(None)) => panic!("the session ended without an error status"),
                Ok(Ok(Some(_))) => continue,
            }
        }
    }
}

/// An external report whose item is `item` as given (external set).
fn put(mut reported: v1::Item) -> v1::ExternalReport {
    reported.external = true;
    v1::ExternalReport {
        change: Some(v1::external_report::Change::Put(reported)),
        modified: false,
    }
}

/// Reports that ReportExternal refuses, with the field each refusal names
/// (under `reports[0]`).
fn invalid_reports() -> Vec<(&'static str, v1::ExternalReport, &'static str)> {
    let mut with_dependency = item("ext", "with-dep", json!({}));
    with_dependency
        .dependencies
        .push(api::dependency("ext", "other"));
    vec![
        (
            "an empty type",
            put(item("", "nameless-type", json!({}))),
            "put.type",
        ),
        (
            "a NUL in the name",
            put(item("ext", "bad\u{0}name", json!({}))),
            "put.name",
        ),
        (
            "a control character in the type",
            put(item("ext\u{7}", "bell", json!({}))),
            "put.type",
        ),
        (
            "an oversized value",
            put(item("ext", "huge", json!({"blob": "x".repeat(70 * 1024)}))),
            "put",
        ),
        ("a dependency", put(with_dependency), "put.dependencies"),
        (
            "an empty delete",
            v1::ExternalReport {
                change: Some(v1::external_report::Change::Delete(v1::ItemRef {
                    r#type: String::new(),
                    name: "x".into(),
                })),
                modified: false,
            },
            "delete.type",
        ),
    ]
}

async fn report_external(
    tenant: &TestTenant,
    reports: Vec<v1::ExternalReport>,
) -> Result<u64, Status> {
    tenant
        .reconciler()
        .report_external(v1::ReportExternalRequest {
            tenant: tenant.name.clone(),
            reports,
        })
        .await
        .map(|response| response.into_inner().revision)
}

fn quota_subjects(status: &Status) -> Vec<String> {
    status
        .get_error_details()
        .quota_failure()
        .map(|failure| {
            failure
                .violations
                .iter()
                .map(|v| v.subject.clone())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn an_agents_external_update_is_validated_like_report_external_and_stores_nothing() {
    let mut tenant = TestTenant::start("acme").await;
    for (what, report, field) in invalid_reports() {
        let refused = report_external(&tenant, vec![report.clone()])
            .await
            .expect_err(what);
        assert_eq!(refused.code(), Code::InvalidArgument, "{what}: {refused:?}");
        assert!(
            violated_fields(&refused).contains(&format!("reports[0].{field}")),
            "{what}: {refused:?}"
        );

        let session = RawSession::open(&tenant.channel, &tenant.token, "acme", "agent-type").await;
        session.report(vec![report]).await;
        let ended = session.ended_with().await;
        assert_eq!(ended.code(), Code::InvalidArgument, "{what}: {ended:?}");
        assert!(
            violated_fields(&ended).contains(&format!("external_update.reports[0].{field}")),
            "{what}: {ended:?}"
        );
    }
    // A valid report in the same update as an invalid one is not stored
    // either: the update is refused as a whole.
    let session = RawSession::open(&tenant.channel, &tenant.token, "acme", "agent-type").await;
    session
        .report(vec![
            external_put("ext", "fine", json!({})),
            put(item("", "bad", json!({}))),
        ])
        .await;
    assert_eq!(session.ended_with().await.code(), Code::InvalidArgument);

    assert!(tenant.current().await.is_empty(), "nothing was stored");
    tenant.server.restart().await.expect("the server restarts");
    tenant.channel = tenant.server.channel().await.expect("reconnects");
    assert!(tenant.current().await.is_empty());

    // The session path still accepts a valid report.
    let session = RawSession::open(&tenant.channel, &tenant.token, "acme", "agent-type").await;
    session
        .report(vec![external_put("ext", "fine", json!({"up": true}))])
        .await;
    tenant
        .wait_for_item("ext", "fine", "reported by the agent", |_| true)
        .await;
    drop(session);
}

#[tokio::test]
async fn external_reports_are_held_to_the_tenants_item_limits_on_both_paths() {
    let tenant = TestTenant::start_with_limits(
        "small",
        v1::TenantLimits {
            max_items: 2,
            max_request_items: 3,
            ..Default::default()
        },
    )
    .await;
    let puts = |count: usize| -> Vec<v1::ExternalReport> {
        (0..count)
            .map(|i| external_put("ext", &format!("e{i}"), json!({})))
            .collect()
    };

    for (count, subject) in [(4, "max_request_items"), (3, "max_items")] {
        let refused = report_external(&tenant, puts(count))
            .await
            .expect_err("over a limit");
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
        assert_eq!(quota_subjects(&refused), [subject], "{refused:?}");

        let session = RawSession::open(&tenant.channel, &tenant.token, "small", "t").await;
        session.report(puts(count)).await;
        let ended = session.ended_with().await;
        assert_eq!(ended.code(), Code::ResourceExhausted, "{ended:?}");
        assert_eq!(quota_subjects(&ended), [subject], "{ended:?}");
    }
    assert!(tenant.current().await.is_empty(), "nothing was stored");
    report_external(&tenant, puts(2))
        .await
        .expect("two items are within the limits");
    assert_eq!(tenant.current().await.len(), 2);
}

#[tokio::test]
async fn an_external_report_may_not_name_a_managed_item() {
    let tenant = TestTenant::start("acme").await;
    tenant
        .submit(vec![item("svc", "managed", json!({"port": 80}))])
        .await;
    let delete = v1::ExternalReport {
        change: Some(v1::external_report::Change::Delete(v1::ItemRef {
            r#type: "svc".into(),
            name: "managed".into(),
        })),
        modified: false,
    };
    for (report, field) in [
        (external_put("svc", "managed", json!({"port": 81})), "put"),
        (delete, "delete"),
    ] {
        let refused = report_external(&tenant, vec![report.clone()])
            .await
            .expect_err("a managed item cannot be reported");
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert_eq!(
            violated_fields(&refused),
            [format!("reports[0].{field}")],
            "{refused:?}"
        );
        assert!(refused.message().contains("managed"), "{refused:?}");

        let session = RawSession::open(&tenant.channel, &tenant.token, "acme", "other").await;
        session.report(vec![report]).await;
        let ended = session.ended_with().await;
        assert_eq!(ended.code(), Code::InvalidArgument, "{ended:?}");
        assert_eq!(
            violated_fields(&ended),
            [format!("external_update.reports[0].{field}")]
        );
    }
    let managed = tenant
        .item("svc", "managed")
        .await
        .expect("the managed item is in the current graph");
    assert_eq!(
        managed.state,
        v1::ItemState::Pending as i32,
        "the report changed nothing: {managed:?}"
    );
}

/// The nested loop of issue 12: a million steps without a budget.
const NESTED_LOOP: &str = "self.xs.all(x, self.xs.all(y, x + y >= 0))";

#[tokio::test]
async fn an_expensive_predicate_is_stopped_by_its_budget_while_a_bystander_is_served() {
    let heavy = TestTenant::start("heavy").await;
    let bystander_token =
        api::create_tenant(&heavy.channel, &heavy.server.admin_token(), "bystander").await;
    let bystander = api::reconciler(&heavy.channel, &bystander_token);

    let list: Vec<u32> = (0..1_000).collect();
    heavy
        .report_external(vec![external_put("list", "big", json!({ "xs": list }))])
        .await;
    let mut dependent = item("svc", "a", json!({}));
    dependent.dependencies.push(v1::Dependency {
        must_satisfy: NESTED_LOOP.into(),
        ..api::dependency("list", "big")
    });

    // The bystander polls GetStatus while the heavy tenant plans.
    let polling = tokio::spawn(async move {
        let mut bystander = bystander;
        let mut slowest = Duration::ZERO;
        for _ in 0..40 {
            let started = Instant::now();
            tokio::time::timeout(
                Duration::from_secs(5),
                bystander.get_status(v1::GetStatusRequest {
                    tenant: "bystander".into(),
                }),
            )
            .await
            .expect("the bystander is answered within 5 s")
            .expect("GetStatus succeeds");
            slowest = slowest.max(started.elapsed());
        }
        slowest
    });

    let started = Instant::now();
    heavy.submit(vec![dependent]).await;
    let blocked = heavy
        .wait_for_item("svc", "a", "blocked by an expensive predicate", |status| {
            status
                .blocked_by
                .iter()
                .any(|b| b.why.contains("PREDICATE_TOO_EXPENSIVE"))
        })
        .await;
    let took = started.elapsed();
    eprintln!("nested all() over 1,000 elements: blocked after {took:?}: {blocked:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let slowest = polling.await.expect("the bystander task ends");
    eprintln!("slowest bystander GetStatus meanwhile: {slowest:?}");
    assert!(slowest < Duration::from_secs(2), "{slowest:?}");
}

#[tokio::test]
async fn predicates_beyond_the_compile_bounds_are_refused_with_their_field_path() {
    let tenant = TestTenant::start("acme").await;
    let nested = format!("{}true{}", "self.xs.all(x, ".repeat(4), ")".repeat(4));
    let literal = format!(
        "self.a in [{}]",
        (0..300)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    for source in [nested, literal] {
        let mut dependent = item("svc", "a", json!({}));
        dependent.dependencies.push(v1::Dependency {
            must_satisfy: source.clone(),
            ..api::dependency("list", "big")
        });
        let refused = tenant
            .reconciler()
            .submit_intent(api::submit("acme", vec![dependent]))
            .await
            .expect_err("over a compile bound");
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert_eq!(
            violated_fields(&refused),
            ["items[0].dependencies[0].must_satisfy"],
            "{source}: {refused:?}"
        );
    }
    assert_eq!(tenant.status().await.generation, 0, "nothing was stored");
}

/// Every directory under `root` (itself included) with its mode, and every
/// file with its mode.
fn modes_under(root: &std::path::Path) -> Vec<(std::path::PathBuf, bool, u32)> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let metadata = std::fs::symlink_metadata(&path).expect("stat");
        if metadata.is_dir() {
            for entry in std::fs::read_dir(&path).expect("list") {
                pending.push(entry.expect("entry").path());
            }
        }
        found.push((
            path,
            metadata.is_dir(),
            metadata.permissions().mode() & 0o777,
        ));
    }
    found
}

fn assert_private(root: &std::path::Path) {
    let modes = modes_under(root);
    assert!(
        modes.len() > 3,
        "the data directory holds the store: {modes:?}"
    );
    for (path, is_dir, mode) in modes {
        let expected = if is_dir { 0o700 } else { 0o600 };
        assert_eq!(mode, expected, "{} has mode {mode:o}", path.display());
    }
}

#[tokio::test]
async fn the_data_directory_and_database_are_private_even_with_an_admin_token_flag() {
    use std::os::unix::fs::PermissionsExt as _;
    // ServerOptions::default() passes --admin-token, the case of issue 12.
    let mut tenant = TestTenant::start("acme").await;
    tenant
        .submit(vec![item("svc", "a", json!({"secret": "s3cr3t"}))])
        .await;
    let data_dir = tenant.server.data_dir();
    assert_private(&data_dir);

    // Modes an earlier version (or an operator) left loose are tightened.
    tenant.server.terminate().await.expect("stops");
    for (path, is_dir, _) in modes_under(&data_dir) {
        let loose = if is_dir { 0o755 } else { 0o644 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(loose)).expect("chmod");
    }
    tenant.server.start_again().await.expect("starts again");
    assert_private(&data_dir);
}

/// `grpcurl list` on `server` with `flags`.
fn grpcurl_list(server: &ServerProcess, flags: &[&str]) -> std::process::Output {
    server.grpcurl(flags, &["list"])
}

#[tokio::test]
async fn reflection_needs_a_token_by_default_and_can_be_public_or_off() {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("starts");
    let channel = server.channel().await.expect("connects");
    let tenant_token = api::create_tenant(&channel, &server.admin_token(), "acme").await;

    let anonymous = grpcurl_list(&server, &[]);
    assert!(!anonymous.status.success(), "{anonymous:?}");
    let said = String::from_utf8_lossy(&anonymous.stderr);
    assert!(said.contains("Unauthenticated"), "{said}");
    for token in [server.admin_token(), tenant_token] {
        let header = format!("authorization: Bearer {token}");
        let listed = reconciled_tests::successful_stdout(&grpcurl_list(&server, &["-H", &header]));
        assert!(listed.contains("reconciled.v1.Reconciler"), "{listed}");
    }
    let wrong = grpcurl_list(&server, &["-H", "authorization: Bearer not-a-token"]);
    assert!(!wrong.status.success(), "{wrong:?}");

    let public = ServerProcess::start(ServerOptions::default().arg("--reflection=public"))
        .await
        .expect("starts");
    let listed = reconciled_tests::successful_stdout(&grpcurl_list(&public, &[]));
    assert!(listed.contains("reconciled.v1.Reconciler"), "{listed}");

    let off = ServerProcess::start(ServerOptions::default().env("RECONCILED_REFLECTION", "off"))
        .await
        .expect("starts");
    let header = format!("authorization: Bearer {}", off.admin_token());
    let refused = grpcurl_list(&off, &["-H", &header]);
    assert!(!refused.status.success(), "{refused:?}");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("does not support the reflection API"),
        "{said}"
    );
}

/// A SubmitIntentRequest of tenant `acme` with `items` empty items.
fn empty_items_request(items: usize) -> Vec<u8> {
    raw::empty_items_request("acme", items)
}

/// Sends `message` raw to `path` with `token` (none if empty); the
/// refusal.
async fn raw_call(channel: &Channel, path: &'static str, token: &str, message: Vec<u8>) -> Status {
    raw::raw_unary(channel, path, token, message)
        .await
        .expect_err("the call is refused")
}

/// How much more peak memory the server may take for six anonymous 16 MB
/// SubmitIntents than before them. Decoding one took 1.5 GB before
/// authentication moved in front of decoding.
const ANONYMOUS_MEMORY_BOUND: u64 = 100 * 1024 * 1024;

#[tokio::test]
async fn a_big_anonymous_submit_intent_is_refused_before_it_is_decoded() {
    let tenant = TestTenant::start("acme").await;
    tenant.submit(vec![item("svc", "warm-up", json!({}))]).await;
    let (_, peak_before) = tenant.server.memory();

    // Six in parallel, 8M empty items (16 MB) each, with no token or a
    // wrong one.
    let message = empty_items_request(8_000_000);
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let channel = tenant.channel.clone();
            let message = message.clone();
            let token = if i % 2 == 0 {
                ""
            } else {
                "rcdt_not-a-real-token"
            };
            tokio::spawn(async move {
                raw_call(
                    &channel,
                    "/reconciled.v1.Reconciler/SubmitIntent",
                    token,
                    message,
                )
                .await
            })
        })
        .collect();
    for call in calls {
        let refused = call.await.expect("the call task ends");
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    }
    let (rss_after, peak_after) = tenant.server.memory();
    let growth = peak_after.saturating_sub(peak_before);
    eprintln!(
        "peak RSS before {} MiB, after {} MiB (growth {} MiB), RSS now {} MiB",
        peak_before >> 20,
        peak_after >> 20,
        growth >> 20,
        rss_after >> 20
    );
    assert!(
        growth < ANONYMOUS_MEMORY_BOUND,
        "the server's peak memory grew by {} MiB",
        growth >> 20
    );
    // The tenant is served as before.
    assert_eq!(tenant.status().await.generation, 1);
}

/// How much more peak memory the server may take for a tenant's dense 4 MB
/// message (2M empty items) than before it; decoding it took ~380 MB
/// before the decode budget.
const DENSE_MEMORY_BOUND: u64 = 100 * 1024 * 1024;

#[tokio::test]
async fn tenant_messages_over_the_tenant_limit_or_too_dense_are_refused_before_decoding() {
    let tenant = TestTenant::start("acme").await;
    tenant.submit(vec![item("svc", "warm-up", json!({}))]).await;
    let (_, peak_before) = tenant.server.memory();

    // Over max_tenant_message_bytes (4 MiB by default): refused from the
    // frame header, naming the setting.
    let over = raw_call(
        &tenant.channel,
        "/reconciled.v1.Reconciler/SubmitIntent",
        &tenant.token,
        empty_items_request(2_500_000),
    )
    .await;
    assert_eq!(over.code(), Code::ResourceExhausted, "{over:?}");
    assert_eq!(
        quota_subjects(&over),
        ["max_tenant_message_bytes"],
        "{over:?}"
    );
    assert!(
        over.message().contains("max_tenant_message_bytes"),
        "{over:?}"
    );

    // Under it, but two bytes per item: it would decode into ~100 times
    // its size. Refused before decoding, naming the same setting.
    let dense = raw_call(
        &tenant.channel,
        "/reconciled.v1.Reconciler/SubmitIntent",
        &tenant.token,
        empty_items_request(2_000_000),
    )
    .await;
    assert_eq!(dense.code(), Code::ResourceExhausted, "{dense:?}");
    assert_eq!(
        quota_subjects(&dense),
        ["max_tenant_message_bytes"],
        "{dense:?}"
    );
    assert!(dense.message().contains("decode into"), "{dense:?}");
    let (rss_after, peak_after) = tenant.server.memory();
    let growth = peak_after.saturating_sub(peak_before);
    eprintln!(
        "peak RSS before {} MiB, after {} MiB (growth {} MiB), RSS now {} MiB",
        peak_before >> 20,
        peak_after >> 20,
        growth >> 20,
        rss_after >> 20
    );
    assert!(
        growth < DENSE_MEMORY_BOUND,
        "the server's peak memory grew by {} MiB",
        growth >> 20
    );

    // The admin is held to max_message_bytes (16 MiB) only: 4.5 MB of real
    // items go through.
    let big: Vec<v1::Item> = (0..100)
        .map(|index| {
            item(
                "blob",
                &format!("b{index:03}"),
                json!({"pad": "p".repeat(45_000)}),
            )
        })
        .collect();
    let reply = api::reconciler(&tenant.channel, &tenant.server.admin_token())
        .max_encoding_message_size(64 * 1024 * 1024)
        .submit_intent(api::submit(&tenant.name, big.clone()))
        .await
        .expect("the admin may send 4.5 MB");
    assert!(reply.into_inner().changed);
    // The same from the tenant's token is over its limit.
    let refused = api::reconciler(&tenant.channel, &tenant.token)
        .max_encoding_message_size(64 * 1024 * 1024)
        .submit_intent(api::submit(&tenant.name, big))
        .await
        .expect_err("over the tenant limit");
    assert_eq!(quota_subjects(&refused), ["max_tenant_message_bytes"]);
    // And the tenant is served as before.
    assert_eq!(tenant.status().await.generation, 2);
}

/// Opens a Watch of `tenant` with `token` and reads up to `synced`.
async fn open_watch(
    channel: &Channel,
    token: &str,
    tenant: &str,
) -> tonic::Streaming<v1::WatchResponse> {
    let mut stream = api::reconciler(channel, token)
        .watch(v1::WatchRequest {
            tenant: tenant.into(),
            ..Default::default()
        })
        .await
        .expect("Watch opens")
        .into_inner();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let message = tokio::time::timeout_at(deadline, stream.message())
            .await
            .expect("synced within the deadline")
            .expect("the watch is healthy")
            .expect("the watch is open");
        if matches!(
            message.message,
            Some(v1::watch_response::Message::Synced(_))
        ) {
            return stream;
        }
    }
}

/// Reads `stream` until it fails, within the deadline.
async fn watch_ended(mut stream: tonic::Streaming<v1::WatchResponse>) -> Status {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match tokio::time::timeout_at(deadline, stream.message()).await {
            Err(_) => panic!("the watch did not end within {DEADLINE:?}"),
            Ok(Err(status)) => return status,
            Ok(Ok(None)) => panic!("the watch ended without an error status"),
            Ok(Ok(Some(_))) => continue,
        }
    }
}

#[tokio::test]
async fn rotating_a_token_or_deleting_the_tenant_ends_every_stream_opened_with_the_old_token() {
    let tenant = TestTenant::start("acme").await;
    let admin = tenant.server.admin_token();
    let watch = open_watch(&tenant.channel, &tenant.token, "acme").await;
    let session = RawSession::open(&tenant.channel, &tenant.token, "acme", "t").await;
    let admin_watch = open_watch(&tenant.channel, &admin, "acme").await;

    let new_token = api::rotate_token(&tenant.channel, &admin, "acme").await;
    let ended = watch_ended(watch).await;
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert_eq!(error_reason(&ended).as_deref(), Some("TOKEN_ROTATED"));
    assert!(
        ended
            .message()
            .starts_with("the tenant's token was rotated")
            && ended.message().ends_with("reconnect with the new token"),
        "{ended:?}"
    );
    let ended = session.ended_with().await;
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert_eq!(error_reason(&ended).as_deref(), Some("TOKEN_ROTATED"));
    assert!(
        ended
            .message()
            .starts_with("the tenant's token was rotated"),
        "{ended:?}"
    );

    // A secret submitted after the rotation reaches only new-token streams.
    let watch = open_watch(&tenant.channel, &new_token, "acme").await;
    let session = RawSession::open(&tenant.channel, &new_token, "acme", "t").await;
    api::reconciler(&tenant.channel, &new_token)
        .submit_intent(api::submit(
            "acme",
            vec![item("t", "secret", json!({"key": "s3cr3t"}))],
        ))
        .await
        .expect("submits with the new token");

    api::tenants(&tenant.channel, &admin)
        .delete_tenant(v1::DeleteTenantRequest {
            name: "acme".into(),
        })
        .await
        .expect("deletes");
    // Deleted, not rotated: there is no new token to reconnect with.
    let ended = watch_ended(watch).await;
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert_eq!(error_reason(&ended).as_deref(), Some("TENANT_DELETED"));
    assert!(
        ended.message().starts_with("the tenant was deleted"),
        "{ended:?}"
    );
    let ended = session.ended_with().await;
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert_eq!(error_reason(&ended).as_deref(), Some("TENANT_DELETED"));
    assert!(
        ended.message().starts_with("the tenant was deleted"),
        "{ended:?}"
    );
    // The admin's watch was not opened with a tenant token: it ends as
    // every watch of a deleted tenant does.
    let ended = watch_ended(admin_watch).await;
    assert_eq!(ended.code(), Code::NotFound, "{ended:?}");
}

#[tokio::test]
async fn the_metrics_endpoint_closes_silent_connections_and_keeps_serving() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        probe.local_addr().expect("address").to_string()
    };
    let _tenant = TestTenant::start_with(
        ServerOptions::default().arg("--metrics-listen").arg(&addr),
        "acme",
    )
    .await;
    // More silent connections than the endpoint serves at once (64): each
    // is closed once the 5 s header timeout passes, the queued ones after
    // they get a slot.
    let started = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..80 {
        silent.push(
            tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connects"),
        );
    }
    for mut connection in silent {
        let mut byte = [0_u8; 1];
        match tokio::time::timeout(Duration::from_secs(30), connection.read(&mut byte)).await {
            Ok(Ok(0) | Err(_)) => {}
            Ok(Ok(_)) => {}
            Err(_) => panic!("a silent connection was still open after 30 s"),
        }
    }
    let took = started.elapsed();
    eprintln!("80 silent metrics connections closed within {took:?}");

    let mut scrape = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connects");
    scrape
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .expect("request sent");
    let mut response = String::new();
    tokio::time::timeout(DEADLINE, scrape.read_to_string(&mut response))
        .await
        .expect("answered within the deadline")
        .expect("response read");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("reconciled_tenants 1"), "{response}");
}

/// A scrape of `addr`'s `/metrics`: the whole HTTP response, or `None`
/// when the connection failed or closed without one.
async fn try_scrape(addr: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut scrape = tokio::net::TcpStream::connect(addr).await.ok()?;
    scrape
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .ok()?;
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        scrape.read_to_string(&mut response),
    )
    .await
    .ok()?
    .ok()?;
    response.starts_with("HTTP/1.1 200").then_some(response)
}

#[tokio::test]
async fn the_metrics_endpoint_outlives_running_out_of_file_descriptors() {
    let addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        probe.local_addr().expect("address").to_string()
    };
    let tenant = TestTenant::start_with(
        ServerOptions::default().arg("--metrics-listen").arg(&addr),
        "acme",
    )
    .await;
    let pid = tenant.server.pid().expect("the server runs");
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the server's descriptors are listed")
        .count();
    // Room for a few more descriptors only.
    let limit = format!("--nofile={}", open + 8);
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &limit])
        .status()
        .expect("prlimit runs (util-linux)");
    assert!(status.success(), "prlimit {limit} failed");
    // More connections than descriptors left: accept fails with EMFILE.
    let mut flood = Vec::new();
    for _ in 0..40 {
        if let Ok(connection) = tokio::net::TcpStream::connect(&addr).await {
            flood.push(connection);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !tenant
        .server
        .log_tail()
        .contains("Accepting a metrics connection failed")
    {
        assert!(
            Instant::now() < deadline,
            "no accept error was logged: {}",
            tenant.server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(flood);
    // Once descriptors are free again, scrapes are answered.
    let response = loop {
        if let Some(response) = try_scrape(&addr).await {
            break response;
        }
        assert!(
            Instant::now() < deadline,
            "the metrics endpoint did not answer after the flood"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(response.contains("reconciled_tenants 1"), "{response}");
    assert_eq!(tenant.status().await.generation, 0);
}

/// A `Reconcile{wait}` request for the whole of `tenant`.
fn reconcile_wait(
    tenant: &TestTenant,
    timeout: Duration,
    max_no_progress_iterations: u32,
) -> v1::ReconcileRequest {
    v1::ReconcileRequest {
        tenant: tenant.name.clone(),
        wait: true,
        timeout: Some(prost_types::Duration {
            seconds: i64::try_from(timeout.as_secs()).expect("a short timeout"),
            nanos: 0,
        }),
        max_no_progress_iterations,
        ..Default::default()
    }
}

#[tokio::test]
async fn reconcile_wait_honours_its_timeout_and_spaces_idle_passes() {
    let tenant = TestTenant::start("acme").await;
    // No agent serves type `nobody`: the tenant is idle, never converged.
    tenant
        .submit(vec![item("nobody", "waits", json!({}))])
        .await;

    // A huge no-progress count: the call ends at its 3 s timeout, having
    // run a handful of passes, instead of spinning until the request
    // timeout.
    let started = Instant::now();
    let reply = tokio::time::timeout(
        Duration::from_secs(20),
        tenant
            .reconciler()
            .reconcile(reconcile_wait(&tenant, Duration::from_secs(3), u32::MAX)),
    )
    .await
    .expect("Reconcile{wait} answers within its 3 s timeout, not at the request timeout")
    .expect("Reconcile succeeds")
    .into_inner();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(2_900) && took < Duration::from_secs(6),
        "took {took:?}"
    );
    assert!(!reply.converged);
    // Passes at 0 s, 1 s and 3 s (1 s, then 2 s of backoff): three at most.
    assert!(
        (2..=3).contains(&reply.iterations),
        "{} passes in 3 s",
        reply.iterations
    );

    // Two passes without progress: they are 1 s and 2 s apart, so giving
    // up takes about 3 s, not microseconds.
    let started = Instant::now();
    let reply = tenant
        .reconciler()
        .reconcile(reconcile_wait(&tenant, Duration::from_secs(30), 2))
        .await
        .expect("Reconcile succeeds")
        .into_inner();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(2_900) && took < Duration::from_secs(10),
        "took {took:?}"
    );
    assert_eq!(reply.iterations, 3);
    assert!(!reply.converged && reply.require_rerun);

    // The bystander health check and a GetStatus stayed quick throughout.
    let started = Instant::now();
    tenant.status().await;
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn reconcile_wait_sees_an_agent_registering_as_progress() {
    let tenant = TestTenant::start("acme").await;
    tenant
        .submit(vec![item("late", "arrives", json!({}))])
        .await;
    // The wait gives up after two passes without progress (3 s); the agent
    // that registers meanwhile creates the item, and the wait sees it.
    let waiting = tokio::spawn({
        let mut reconciler = tenant.reconciler();
        let request = reconcile_wait(&tenant, Duration::from_secs(30), 2);
        async move { reconciler.reconcile(request).await }
    });
    let recorder = reconciled_tests::agents::Recorder::new();
    let mut agent = reconciled_tests::agents::RunningAgent::start(
        tenant
            .agent("late-agent")
            .item_type(reconciled_client::agent::TypeSpec::new("late"), recorder),
    );
    agent.connected().await;
    let reply = tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("Reconcile{wait} answers")
        .expect("the call's task ran")
        .expect("Reconcile succeeds")
        .into_inner();
    assert!(reply.converged, "{reply:?}");
}

/// `count` items `big/<prefix>-<i>` of about 60 KB each, listed in
/// subgraph `prefix`, whose value says `version`.
fn big_items(prefix: &str, count: usize, version: &str) -> Vec<v1::Item> {
    (0..count)
        .map(|index| {
            let mut big = item(
                "big",
                &format!("{prefix}-{index:02}"),
                json!({"version": version, "blob": "x".repeat(60_000)}),
            );
            big.subgraph = prefix.into();
            big
        })
        .collect()
}

/// SubmitIntent of subgraph `subgraph` with `items`.
async fn submit_subgraph(
    tenant: &TestTenant,
    subgraph: &str,
    items: Vec<v1::Item>,
) -> Result<v1::SubmitIntentResponse, Status> {
    tenant
        .reconciler()
        .submit_intent(v1::SubmitIntentRequest {
            tenant: tenant.name.clone(),
            subgraph: subgraph.into(),
            items,
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn replies_are_sized_by_bytes_graph_pages_shrink_and_plans_are_cut_never_failed() {
    use prost::Message as _;
    const LIMIT: usize = 1024 * 1024;
    let tenant = TestTenant::start_with(
        ServerOptions::default().arg(format!("--max-message-bytes={LIMIT}")),
        "acme",
    )
    .await;
    // 30 items of 60 KB: 1.8 MB in all, 0.9 MB per request.
    for prefix in ["a", "b"] {
        submit_subgraph(&tenant, prefix, big_items(prefix, 15, "v1"))
            .await
            .unwrap_or_else(|status| panic!("subgraph {prefix}: {status:?}"));
    }

    // GetGraph with the default page size (500 items, 1.8 MB): pages are
    // cut by size and together list every item once.
    let mut names = Vec::new();
    let mut pages = 0;
    let mut token = String::new();
    loop {
        let page = tenant
            .reconciler()
            .get_graph(v1::GetGraphRequest {
                tenant: tenant.name.clone(),
                view: v1::GraphView::Intended.into(),
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .expect("every page fits the message limit")
            .into_inner();
        assert!(page.encoded_len() <= LIMIT, "{} bytes", page.encoded_len());
        assert!(!page.intended.is_empty(), "a page lists at least one item");
        names.extend(
            page.intended
                .iter()
                .map(|i| i.item.as_ref().expect("an intended item").name.clone()),
        );
        pages += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let mut expected: Vec<String> = big_items("a", 15, "v1")
        .into_iter()
        .chain(big_items("b", 15, "v1"))
        .map(|i| i.name)
        .collect();
    expected.sort();
    assert_eq!(names, expected);
    assert!(pages >= 2, "{pages} pages");

    // Created by an agent, then the agent leaves: every item has a 60 KB
    // applied value and waits for a configurator to be modified.
    let recorder = reconciled_tests::agents::Recorder::new();
    let spec = reconciled_client::agent::TypeSpec::new("big").max_in_flight(100);
    let mut agent = reconciled_tests::agents::RunningAgent::start(
        tenant.agent("big-agent").item_type(spec, recorder),
    );
    agent.connected().await;
    tenant.wait_until_ready().await;
    agent.stop().await.expect("the agent stops");
    tenant
        .wait_for_status("the agent gone", |status| {
            !status.connected_item_types.iter().any(|t| t == "big")
        })
        .await;
    for prefix in ["a", "b"] {
        let reply = submit_subgraph(&tenant, prefix, big_items(prefix, 15, "v2"))
            .await
            .unwrap_or_else(|status| {
                panic!("a committed change of {prefix} answers success: {status:?}")
            });
        assert!(reply.changed);
        assert!(reply.encoded_len() <= LIMIT);
    }
    // The same intent again: a full pass whose plan lists all 30 waiting
    // items with their 60 KB values (1.8 MB): cut to fit, and said so.
    let generation = tenant.status().await.generation;
    let reply = submit_subgraph(&tenant, "b", big_items("b", 15, "v2"))
        .await
        .expect("a large plan answers success");
    assert!(!reply.changed);
    assert_eq!(reply.generation, generation);
    assert!(reply.plan_truncated, "the reply says the plan was cut");
    let plan = reply.plan.as_ref().expect("a plan");
    assert!(plan.truncated);
    assert_eq!(plan.blocked, 30, "the counts cover the whole plan");
    assert!(plan.waiting.len() < 30, "{} listed", plan.waiting.len());
    assert!(
        reply.encoded_len() <= LIMIT,
        "{} bytes",
        reply.encoded_len()
    );
}

#[tokio::test]
async fn an_agent_that_stops_reading_its_stream_loses_its_types_after_the_lease() {
    let tenant = TestTenant::start_with(
        ServerOptions::default()
            .arg("--heartbeat-interval-secs=1")
            .arg("--lease-secs=2"),
        "acme",
    )
    .await;
    // A connection with small HTTP/2 windows, so the server's sends back
    // up soon after the agent stops reading.
    let small = tonic::transport::Endpoint::from_shared(tenant.server.endpoint())
        .expect("the endpoint is valid")
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .expect("the server accepts a connection");
    let (outgoing, receiver) = mpsc::channel(16);
    outgoing
        .send(v1::AgentMessage {
            message: Some(v1::agent_message::Message::Register(v1::Register {
                tenant: tenant.name.clone(),
                agent_id: "deaf-agent".into(),
                protocol_version: reconciled_tests::proto::PROTOCOL_VERSION,
                item_types: vec![v1::ItemTypeSpec {
                    item_type: "flood".into(),
                    max_in_flight: 10_000,
                    ..Default::default()
                }],
                ..Default::default()
            })),
        })
        .await
        .expect("queue open");
    let mut deaf = ConfiguratorsClient::with_interceptor(small, Bearer::new(&tenant.token))
        .connect(ReceiverStream::new(receiver))
        .await
        .expect("Connect is accepted")
        .into_inner();
    let first = tokio::time::timeout(DEADLINE, deaf.message())
        .await
        .expect("Registered within the deadline")
        .expect("the stream is healthy")
        .expect("the stream is open");
    assert!(matches!(
        first.message,
        Some(v1::server_message::Message::Registered(_))
    ));
    // The agent keeps sending heartbeats (it looks alive) but never reads
    // again, while the server sends it 3,000 operations of 1 KB.
    let beating = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(300));
        loop {
            tick.tick().await;
            let beat = v1::AgentMessage {
                message: Some(v1::agent_message::Message::Heartbeat(v1::Heartbeat {})),
            };
            if outgoing.send(beat).await.is_err() {
                break;
            }
        }
    });
    tenant
        .submit(
            (0..3_000)
                .map(|index| {
                    item(
                        "flood",
                        &format!("f{index:04}"),
                        json!({"pad": "p".repeat(1_000)}),
                    )
                })
                .collect(),
        )
        .await;

    // Another agent (another agent id) takes the type once the deaf
    // session has lost it: within the lease after its stream filled up.
    let started = Instant::now();
    let mut refusals = 0;
    loop {
        let (queue, receiver) = mpsc::channel(4);
        queue
            .send(v1::AgentMessage {
                message: Some(v1::agent_message::Message::Register(v1::Register {
                    tenant: tenant.name.clone(),
                    agent_id: "second-agent".into(),
                    protocol_version: reconciled_tests::proto::PROTOCOL_VERSION,
                    item_types: vec![v1::ItemTypeSpec {
                        item_type: "flood".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                })),
            })
            .await
            .expect("queue open");
        let attempt = ConfiguratorsClient::with_interceptor(
            tenant.channel.clone(),
            Bearer::new(&tenant.token),
        )
        .connect(ReceiverStream::new(receiver))
        .await;
        let answer = match attempt {
            Ok(stream) => stream.into_inner().message().await,
            Err(status) => Err(status),
        };
        match answer {
            Ok(Some(message)) => {
                assert!(
                    matches!(
                        message.message,
                        Some(v1::server_message::Message::Registered(_))
                    ),
                    "{message:?}"
                );
                drop(queue);
                break;
            }
            Err(status) if status.code() == Code::FailedPrecondition => {
                // TYPE_HELD: the deaf agent still holds it; ask again.
                refusals += 1;
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "the deaf agent still holds the type after {:?} ({refusals} refusals): {status:?}",
                    started.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("unexpected answer: {other:?}"),
        }
    }
    beating.abort();
    // The server stayed healthy for everyone else.
    let started = Instant::now();
    tenant.status().await;
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// Opens Connect as `agent_id` for item type `held` and answers what the
/// server sent first: Registered, or the status refusing it.
async fn register_as(
    channel: &Channel,
    token: &str,
    tenant: &str,
    agent_id: &str,
) -> (
    Result<v1::ServerMessage, Status>,
    mpsc::Sender<v1::AgentMessage>,
) {
    let (queue, receiver) = mpsc::channel(4);
    queue
        .send(v1::AgentMessage {
            message: Some(v1::agent_message::Message::Register(v1::Register {
                tenant: tenant.into(),
                agent_id: agent_id.into(),
                protocol_version: reconciled_tests::proto::PROTOCOL_VERSION,
                item_types: vec![v1::ItemTypeSpec {
                    item_type: "held".into(),
                    ..Default::default()
                }],
                ..Default::default()
            })),
        })
        .await
        .expect("queue open");
    let answer = match ConfiguratorsClient::with_interceptor(channel.clone(), Bearer::new(token))
        .connect(ReceiverStream::new(receiver))
        .await
    {
        Ok(stream) => match stream.into_inner().message().await {
            Ok(Some(message)) => Ok(message),
            Ok(None) => Err(Status::unknown("the stream ended without an answer")),
            Err(status) => Err(status),
        },
        Err(status) => Err(status),
    };
    (answer, queue)
}

#[tokio::test]
async fn a_connect_cancelled_at_any_moment_of_registration_leaves_no_ghost_holding_its_type() {
    // A minute's lease: a ghost session would hold the type for that long.
    let tenant = TestTenant::start_with(
        ServerOptions::default()
            .arg("--heartbeat-interval-secs=20")
            .arg("--lease-secs=60"),
        "acme",
    )
    .await;
    // Work for the owner, so that registrations queue behind passes.
    tenant
        .submit(
            (0..2_000)
                .map(|index| item("held", &format!("h{index:04}"), json!({})))
                .collect(),
        )
        .await;
    for round in 0..12_u64 {
        // An agent that goes away after `round` ms: before, during or after
        // its registration.
        let channel = tenant.channel.clone();
        let token = tenant.token.clone();
        let name = tenant.name.clone();
        let ghost = tokio::spawn(async move {
            register_as(&channel, &token, &name, &format!("ghost-{round}")).await
        });
        tokio::time::sleep(Duration::from_millis(round * round)).await;
        ghost.abort();
        let _ = ghost.await;

        // Another agent takes the type well within the lease.
        let started = Instant::now();
        loop {
            let (answer, queue) =
                register_as(&tenant.channel, &tenant.token, &tenant.name, "steady").await;
            match answer {
                Ok(message) => {
                    assert!(
                        matches!(
                            message.message,
                            Some(v1::server_message::Message::Registered(_))
                        ),
                        "{message:?}"
                    );
                    drop(queue);
                    break;
                }
                Err(status) if status.code() == Code::FailedPrecondition => {
                    assert!(
                        started.elapsed() < Duration::from_secs(10),
                        "round {round}: the type is still held after {:?}: {status:?}",
                        started.elapsed()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(status) => panic!("round {round}: {status:?}"),
            }
        }
    }
    assert_eq!(tenant.status().await.generation, 1);
}

/// An item of `bytes` bytes of JSON at most (its `blob` fills it), whose
/// value says `version`.
fn item_of_size(name: &str, version: &str, bytes: usize) -> v1::Item {
    let overhead = json!({"version": version, "blob": ""}).to_string().len();
    item(
        "big",
        name,
        json!({"version": version, "blob": "x".repeat(bytes - overhead)}),
    )
}

#[tokio::test]
async fn an_item_at_the_size_limit_is_created_modified_and_deleted() {
    // Issue: while an operation ran, the current record held the applied
    // and the target value, over the store's 64 KiB per value, so modifying
    // an item over ~32 KiB failed with INTERNAL and an item near the limit
    // could not even be created.
    const NEAR_LIMIT: usize = 64 * 1024 - 200;
    let tenant = TestTenant::start("acme").await;
    let recorder = reconciled_tests::agents::Recorder::new();
    let mut agent =
        reconciled_tests::agents::RunningAgent::start(tenant.agent("big-agent").item_type(
            reconciled_client::agent::TypeSpec::new("big"),
            recorder.clone(),
        ));
    agent.connected().await;

    tenant
        .submit(vec![item_of_size("a", "v1", NEAR_LIMIT)])
        .await;
    tenant.wait_until_ready().await;
    tenant
        .submit(vec![item_of_size("a", "v2", NEAR_LIMIT)])
        .await;
    let modified = tenant
        .wait_for_item("big", "a", "modified to v2", |status| {
            status.state() == v1::ItemState::Created
                && status
                    .applied
                    .as_ref()
                    .and_then(|applied| applied.properties.as_ref())
                    .is_some_and(|p| {
                        p.fields.get("version").and_then(|v| v.kind.as_ref())
                            == Some(&prost_types::value::Kind::StringValue("v2".into()))
                    })
        })
        .await;
    assert!(modified.last_error.is_none(), "{:?}", modified.last_error);
    assert_eq!(recorder.labels(), ["create big/a", "modify big/a"]);

    // Restarted, the server reads the large records back.
    drop(agent);
    let mut tenant = tenant;
    tenant.server.restart().await.expect("the server restarts");
    tenant.channel = tenant.server.channel().await.expect("reconnects");
    assert_eq!(
        tenant.item("big", "a").await.map(|s| s.state()),
        Some(v1::ItemState::Created)
    );
    let mut agent =
        reconciled_tests::agents::RunningAgent::start(tenant.agent("big-agent").item_type(
            reconciled_client::agent::TypeSpec::new("big"),
            recorder.clone(),
        ));
    agent.connected().await;
    tenant.submit(Vec::new()).await;
    tenant
        .wait_for_status("the item deleted", |status| {
            status.items_by_state.is_empty()
        })
        .await;
    assert_eq!(
        recorder.labels(),
        ["create big/a", "modify big/a", "delete big/a"]
    );
}

#[tokio::test]
async fn a_failure_with_a_huge_message_is_recorded_cut_and_does_not_wedge_the_item() {
    // Issue: a FAILED result with a 70 KB message was never stored and the
    // item stayed CREATING for ever.
    use reconciled_client::agent::OperationKind;
    use reconciled_tests::agents::Step;
    let tenant = TestTenant::start("acme").await;
    let recorder = reconciled_tests::agents::Recorder::new();
    recorder.script(
        OperationKind::Create,
        reconciled_client::agent::ItemRef::new("big", "a"),
        [Step::FailWith(
            tonic::Code::InvalidArgument,
            "é".repeat(35_000),
        )],
    );
    let mut agent =
        reconciled_tests::agents::RunningAgent::start(tenant.agent("big-agent").item_type(
            reconciled_client::agent::TypeSpec::new("big"),
            recorder.clone(),
        ));
    agent.connected().await;
    tenant.submit(vec![item("big", "a", json!({"v": 1}))]).await;
    let failed = tenant
        .wait_for_item("big", "a", "failed for good", |status| {
            status.state() == v1::ItemState::Failed
        })
        .await;
    let message = &failed.last_error.as_ref().expect("a last error").message;
    assert!(message.len() <= 4 * 1024 + 64, "{} bytes", message.len());
    assert!(message.starts_with("éé"), "{message:.40}");
    assert!(
        message.contains("70000 bytes"),
        "says it was cut: {message:.80}…"
    );

    // Not wedged: a new intent is created.
    tenant.submit(vec![item("big", "a", json!({"v": 2}))]).await;
    tenant.wait_until_ready().await;
}

#[tokio::test]
async fn nothing_commits_for_a_tenant_after_delete_tenant_returns_and_its_keys_are_all_purged() {
    use reconciled::store::{SledOptions, SledStore, Store as _, keys};
    let mut tenant = TestTenant::start("doomed").await;
    // Four clients submit as fast as they can while the tenant is deleted.
    let deleted_at = std::sync::Arc::new(std::sync::OnceLock::<Instant>::new());
    let writers: Vec<_> = (0..4)
        .map(|writer| {
            let reconciler = tenant.reconciler();
            let deleted_at = deleted_at.clone();
            tokio::spawn(async move {
                let mut late_successes = 0;
                for round in 0..2_000_u64 {
                    let sent = Instant::now();
                    let answer = reconciler
                        .clone()
                        .submit_intent(api::submit(
                            "doomed",
                            vec![item("t", &format!("w{writer}"), json!({ "round": round }))],
                        ))
                        .await;
                    let after_delete = deleted_at.get().is_some_and(|at| sent > *at);
                    match answer {
                        Ok(_) if after_delete => late_successes += 1,
                        Ok(_) => {}
                        Err(_) if after_delete => break,
                        Err(_) => {}
                    }
                }
                late_successes
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    api::tenants(&tenant.channel, &tenant.server.admin_token())
        .delete_tenant(v1::DeleteTenantRequest {
            name: "doomed".into(),
        })
        .await
        .expect("deleted");
    let _ = deleted_at.set(Instant::now());
    for writer in writers {
        assert_eq!(
            writer.await.expect("the writer ends"),
            0,
            "a SubmitIntent sent after DeleteTenant returned succeeded"
        );
    }
    // Once its purge has run, nothing of the tenant is left in the store.
    let deadline = Instant::now() + DEADLINE;
    while !tenant.server.log_tail().contains("Deleted tenant purged.") {
        assert!(Instant::now() < deadline, "the purge did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tenant.server.terminate().await.expect("stops");
    let store = SledStore::open(&tenant.server.data_dir(), SledOptions::default()).expect("opens");
    let tenant_keys = store.scan(&[keys::TENANT_SPACE], None, 10).expect("scans");
    assert!(
        tenant_keys.is_empty(),
        "keys of the deleted tenant survive: {:?}",
        tenant_keys
            .iter()
            .map(|(key, _)| String::from_utf8_lossy(key).into_owned())
            .collect::<Vec<_>>()
    );
    drop(store);
    tenant.server.start_again().await.expect("starts cleanly");
}
