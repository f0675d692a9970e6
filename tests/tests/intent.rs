//! SubmitIntent, GetGraph, GetStatus and ReportExternal against the real
//! binary: what is stored, what is planned, and what is refused.

use reconciled_tests::api::{
    create_tenant, dependency, error_reason, item, reconciler, submit, violated_fields,
};
use reconciled_tests::proto::v1;
use reconciled_tests::{ServerOptions, ServerProcess};
use serde_json::json;
use tonic::Code;

async fn server_with_tenant(name: &str) -> (ServerProcess, tonic::transport::Channel, String) {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("server starts");
    let channel = server.channel().await.expect("connects");
    let token = create_tenant(&channel, &server.admin_token(), name).await;
    (server, channel, token)
}

fn names(statuses: &[v1::ItemStatus]) -> Vec<String> {
    statuses
        .iter()
        .map(|s| {
            s.r#ref
                .as_ref()
                .map(|r| format!("{}/{}", r.r#type, r.name))
                .unwrap_or_default()
        })
        .collect()
}

#[tokio::test]
async fn a_submitted_intent_is_stored_planned_and_shown_pending_without_configurators() {
    let (_server, channel, token) = server_with_tenant("acme").await;
    let mut client = reconciler(&channel, &token);
    let mut b = item("file", "b", json!({"content": "hi"}));
    b.dependencies.push(dependency("dir", "a"));
    let reply = client
        .submit_intent(submit(
            "acme",
            vec![b, item("dir", "a", json!({"path": "/tmp/x"}))],
        ))
        .await
        .expect("accepted")
        .into_inner();
    assert_eq!(reply.generation, 1);
    assert!(reply.changed);
    let plan = reply.plan.expect("plan");
    assert_eq!(
        plan.waiting.len(),
        2,
        "no configurator is connected: {plan:?}"
    );
    assert!(
        plan.waiting
            .iter()
            .any(|w| w.reason == v1::WaitReason::NoConfigurator as i32)
    );

    let graph = client
        .get_graph(v1::GetGraphRequest {
            tenant: "acme".into(),
            view: v1::GraphView::Both.into(),
            ..Default::default()
        })
        .await
        .expect("graph")
        .into_inner();
    assert_eq!(graph.generation, 1);
    assert_eq!(graph.intended.len(), 2);
    assert_eq!(names(&graph.current), ["dir/a", "file/b"]);
    assert!(
        graph
            .current
            .iter()
            .all(|s| s.state == v1::ItemState::Pending as i32)
    );
    let a = &graph.current[0];
    assert_eq!(a.pending_operation, v1::OperationKind::Create as i32);
    assert_eq!(a.reason, v1::WaitReason::NoConfigurator as i32);

    let status = client
        .get_status(v1::GetStatusRequest {
            tenant: "acme".into(),
        })
        .await
        .expect("status")
        .into_inner()
        .status
        .expect("status body");
    assert_eq!(status.intended_items, 2);
    assert_eq!(status.items_by_state.get("PENDING"), Some(&2));
    let ready = status
        .conditions
        .iter()
        .find(|c| c.r#type == "Ready")
        .expect("Ready condition");
    assert_eq!(ready.status, v1::ConditionStatus::False as i32);
    assert_eq!(ready.reason, "WaitingForConfigurator");
}

#[tokio::test]
async fn a_submission_that_changes_one_item_still_counts_every_item_that_waits() {
    let (_server, channel, token) = server_with_tenant("acme").await;
    let mut client = reconciler(&channel, &token);
    let mut b = item("file", "b", json!({"content": "hi"}));
    b.dependencies.push(dependency("dir", "a"));
    let intent = |c: &str| {
        vec![
            item("dir", "a", json!({"path": "/tmp/x"})),
            b.clone(),
            item("file", "c", json!({"content": c})),
        ]
    };
    client
        .submit_intent(submit("acme", intent("one")))
        .await
        .expect("accepted");

    // Only c changes: its pass plans c alone, and a and b wait as before.
    let every = || vec!["dir/a".to_owned(), "file/b".into(), "file/c".into()];
    let mut replies = Vec::new();
    for (what, dry_run, content, listed, partial) in [
        ("a change", false, "two", vec!["file/c".to_owned()], true),
        ("an unchanged submission", false, "two", every(), false),
        ("a dry run", true, "three", every(), false),
    ] {
        let mut request = submit("acme", intent(content));
        request.dry_run = dry_run;
        let reply = client
            .submit_intent(request)
            .await
            .expect("accepted")
            .into_inner();
        let plan = reply.plan.expect("plan");
        assert_eq!(
            (plan.blocked, names(&plan.waiting), plan.truncated),
            (3, listed, partial),
            "{what}: every waiting item is counted: {plan:?}"
        );
        replies.push(reply.changed);
    }
    assert_eq!(replies, [true, false, true]);
}

#[tokio::test]
async fn identical_resubmission_and_dry_runs_change_nothing() {
    let (_server, channel, token) = server_with_tenant("acme").await;
    let mut client = reconciler(&channel, &token);
    let intent = vec![item("dir", "a", json!({"path": "/x"}))];
    let first = client
        .submit_intent(submit("acme", intent.clone()))
        .await
        .expect("ok")
        .into_inner();
    let again = client
        .submit_intent(submit("acme", intent))
        .await
        .expect("ok")
        .into_inner();
    assert!(!again.changed);
    assert_eq!(again.generation, first.generation);

    let mut dry = submit(
        "acme",
        vec![
            item("dir", "a", json!({"path": "/y"})),
            item("dir", "new", json!({})),
        ],
    );
    dry.dry_run = true;
    let planned = client
        .submit_intent(dry)
        .await
        .expect("dry run")
        .into_inner();
    assert_eq!(
        planned.generation, first.generation,
        "a dry run leaves the generation unchanged"
    );
    assert!(planned.changed);
    let graph = client
        .get_graph(v1::GetGraphRequest {
            tenant: "acme".into(),
            view: v1::GraphView::Intended.into(),
            ..Default::default()
        })
        .await
        .expect("graph")
        .into_inner();
    assert_eq!(
        graph.generation, first.generation,
        "a dry run stores nothing"
    );
    assert_eq!(graph.intended.len(), 1);
}

#[tokio::test]
async fn a_stale_expected_generation_is_refused_with_generation_mismatch() {
    let (_server, channel, token) = server_with_tenant("acme").await;
    let mut client = reconciler(&channel, &token);
    client
        .submit_intent(submit("acme", vec![item("t", "a", json!({}))]))
        .await
        .expect("ok");
    let mut stale = submit("acme", vec![item("t", "b", json!({}))]);
    stale.expected_generation = Some(0);
    let error = client.submit_intent(stale).await.expect_err("refused");
    assert_eq!(error.code(), Code::FailedPrecondition);
    assert_eq!(error_reason(&error).as_deref(), Some("GENERATION_MISMATCH"));
    let mut current = submit("acme", vec![item("t", "b", json!({}))]);
    current.expected_generation = Some(1);
    let reply = client
        .submit_intent(current)
        .await
        .expect("matching generation accepted")
        .into_inner();
    assert_eq!(reply.generation, 2);
}

/// Each invalid intent, the field path it must name, and the reason.
fn invalid_intents() -> Vec<(
    &'static str,
    Vec<v1::Item>,
    &'static str,
    Option<&'static str>,
)> {
    let with_dependency = |name: &str, on: &str| {
        let mut x = item("t", name, json!({}));
        x.dependencies.push(dependency("t", on));
        x
    };
    let mut external = item("t", "e", json!({}));
    external.external = true;
    external.dependencies.push(dependency("t", "a"));
    let mut twice = item("t", "x", json!({}));
    twice.dependencies.push(dependency("t", "a"));
    twice.dependencies.push(dependency("t", "a"));
    let mut predicate = item("t", "p", json!({}));
    predicate.dependencies.push(v1::Dependency {
        must_satisfy: "self.mtu >=".into(),
        ..dependency("t", "a")
    });
    let mut missing_requires = item("t", "m", json!({}));
    missing_requires
        .dependencies
        .push(v1::Dependency::default());
    let huge = item("t", "huge", json!({"blob": "x".repeat(70 * 1024)}));
    vec![
        (
            "duplicate",
            vec![item("t", "a", json!({})), item("t", "a", json!({}))],
            "items[1].name",
            None,
        ),
        (
            "cycle",
            vec![with_dependency("a", "b"), with_dependency("b", "a")],
            "items[0].dependencies",
            Some("DEPENDENCY_CYCLE"),
        ),
        (
            "self cycle",
            vec![with_dependency("a", "a")],
            "items[0].dependencies",
            Some("DEPENDENCY_CYCLE"),
        ),
        (
            "external with dependencies",
            vec![external],
            "items[0].dependencies",
            None,
        ),
        (
            "two dependencies on one item",
            vec![twice],
            "items[0].dependencies[1].requires",
            None,
        ),
        (
            "empty name",
            vec![item("t", "", json!({}))],
            "items[0].name",
            None,
        ),
        (
            "over-long type",
            vec![item(&"t".repeat(254), "a", json!({}))],
            "items[0].type",
            None,
        ),
        (
            "control character",
            vec![item("t", "a\u{7}b", json!({}))],
            "items[0].name",
            None,
        ),
        (
            "bad predicate",
            vec![predicate],
            "items[0].dependencies[0].must_satisfy",
            None,
        ),
        (
            "missing requires",
            vec![missing_requires],
            "items[0].dependencies[0].requires",
            None,
        ),
        ("item over 64 KiB", vec![huge], "items[0]", None),
    ]
}

#[tokio::test]
async fn every_validation_error_names_its_field_and_a_rejected_intent_changes_nothing() {
    let (_server, channel, token) = server_with_tenant("acme").await;
    let mut client = reconciler(&channel, &token);
    client
        .submit_intent(submit("acme", vec![item("t", "keep", json!({}))]))
        .await
        .expect("ok");
    for (case, items, field, reason) in invalid_intents() {
        let error = client
            .submit_intent(submit("acme", items))
            .await
            .expect_err(case);
        assert_eq!(error.code(), Code::InvalidArgument, "{case}: {error:?}");
        let fields = violated_fields(&error);
        assert!(
            fields.iter().any(|f| f == field),
            "{case}: expected {field} in {fields:?} ({})",
            error.message()
        );
        assert_eq!(error_reason(&error).as_deref(), reason, "{case}");
    }
    let graph = client
        .get_graph(v1::GetGraphRequest {
            tenant: "acme".into(),
            view: v1::GraphView::Intended.into(),
            ..Default::default()
        })
        .await
        .expect("graph")
        .into_inner();
    assert_eq!(graph.generation, 1, "no rejected request changed anything");
    assert_eq!(graph.intended.len(), 1);
}

#[tokio::test]
async fn requests_over_the_item_limit_are_refused() {
    let server = ServerProcess::start(ServerOptions::default().arg("--max-request-items").arg("3"))
        .await
        .expect("server starts");
    let channel = server.channel().await.expect("connects");
    let token = create_tenant(&channel, &server.admin_token(), "acme").await;
    let items = (0..4)
        .map(|i| item("t", &format!("i{i}"), json!({})))
        .collect();
    let error = reconciler(&channel, &token)
        .submit_intent(submit("acme", items))
        .await
        .expect_err("refused");
    assert_eq!(error.code(), Code::InvalidArgument);
    assert_eq!(violated_fields(&error), ["items"]);
}

#[tokio::test]
async fn subgraph_submits_own_their_subtree_and_refuse_items_listed_elsewhere() {
    let (_server, channel, token) = server_with_tenant("acme").await;
    let mut client = reconciler(&channel, &token);
    let mut team_a = submit(
        "acme",
        vec![item("t", "x", json!({})), item("t", "y", json!({}))],
    );
    team_a.subgraph = "team/a".into();
    client.submit_intent(team_a).await.expect("ok");
    let mut team_b = submit("acme", vec![item("t", "z", json!({}))]);
    team_b.subgraph = "team/b".into();
    client.submit_intent(team_b).await.expect("ok");

    let mut steal = submit("acme", vec![item("t", "x", json!({}))]);
    steal.subgraph = "team/b".into();
    let error = client
        .submit_intent(steal)
        .await
        .expect_err("x is listed in team/a");
    assert_eq!(error.code(), Code::InvalidArgument);
    assert_eq!(
        error_reason(&error).as_deref(),
        Some("ITEM_IN_OTHER_SUBGRAPH")
    );

    let mut outside = submit("acme", vec![item("t", "w", json!({}))]);
    outside.subgraph = "team/b".into();
    outside.items[0].subgraph = "team/c".into();
    let error = client
        .submit_intent(outside)
        .await
        .expect_err("outside the subgraph");
    assert_eq!(violated_fields(&error), ["items[0].subgraph"]);

    let mut shrink = submit("acme", vec![item("t", "y", json!({}))]);
    shrink.subgraph = "team/a".into();
    client
        .submit_intent(shrink)
        .await
        .expect("team/a replaces its own items");
    let graph = client
        .get_graph(v1::GetGraphRequest {
            tenant: "acme".into(),
            view: v1::GraphView::Intended.into(),
            ..Default::default()
        })
        .await
        .expect("graph")
        .into_inner();
    let listed: Vec<(String, String)> = graph
        .intended
        .iter()
        .filter_map(|i| i.item.as_ref())
        .map(|i| (i.name.clone(), i.subgraph.clone()))
        .collect();
    assert_eq!(
        listed,
        [("y".into(), "team/a".into()), ("z".into(), "team/b".into())]
    );

    let scoped = client
        .get_graph(v1::GetGraphRequest {
            tenant: "acme".into(),
            view: v1::GraphView::Intended.into(),
            subgraph: "team/b".into(),
            ..Default::default()
        })
        .await
        .expect("graph")
        .into_inner();
    assert_eq!(scoped.intended.len(), 1);
}

#[tokio::test]
async fn graph_pages_come_from_one_revision_even_while_the_intent_changes() {
    let (_server, channel, token) = server_with_tenant("acme").await;
    let mut client = reconciler(&channel, &token);
    let items: Vec<v1::Item> = (0..5)
        .map(|i| item("t", &format!("i{i}"), json!({})))
        .collect();
    client
        .submit_intent(submit("acme", items))
        .await
        .expect("ok");
    let request = |token: String| v1::GetGraphRequest {
        tenant: "acme".into(),
        view: v1::GraphView::Both.into(),
        page_size: 2,
        page_token: token,
        ..Default::default()
    };
    let first = client
        .get_graph(request(String::new()))
        .await
        .expect("page 1")
        .into_inner();
    assert_eq!(first.intended.len(), 2);
    assert!(!first.next_page_token.is_empty());

    // More commits than a tenant keeps snapshots of when nothing reads
    // them: the listing's revision is kept for its pages.
    for round in 0..80 {
        client
            .submit_intent(submit(
                "acme",
                vec![item("t", "other", json!({"round": round}))],
            ))
            .await
            .expect("ok");
    }

    let mut seen: Vec<String> = names(&first.current);
    let mut token = first.next_page_token.clone();
    while !token.is_empty() {
        let page = client
            .get_graph(request(token))
            .await
            .expect("next page")
            .into_inner();
        assert_eq!(
            page.revision, first.revision,
            "every page comes from the first page's revision"
        );
        seen.extend(names(&page.current));
        token = page.next_page_token;
    }
    assert_eq!(seen, ["t/i0", "t/i1", "t/i2", "t/i3", "t/i4"]);

    let garbage = client
        .get_graph(request("zz".into()))
        .await
        .expect_err("bad token");
    assert_eq!(garbage.code(), Code::InvalidArgument);
}

/// A tenant keeps the revisions of the 16 listings read most recently: a
/// page token of one read less recently than 16 newer ones is refused, and
/// the listing starts over.
#[tokio::test]
async fn a_page_token_whose_revision_is_no_longer_kept_is_aborted() {
    let (_server, channel, token) = server_with_tenant("acme").await;
    let mut client = reconciler(&channel, &token);
    let items: Vec<v1::Item> = (0..3)
        .map(|i| item("t", &format!("i{i}"), json!({})))
        .collect();
    client
        .submit_intent(submit("acme", items))
        .await
        .expect("ok");
    async fn first_page(client: &mut reconciled_tests::api::Reconciler) -> v1::GetGraphResponse {
        client
            .get_graph(v1::GetGraphRequest {
                tenant: "acme".into(),
                page_size: 1,
                ..Default::default()
            })
            .await
            .expect("page")
            .into_inner()
    }
    let first = first_page(&mut client).await;
    // Sixteen listings begun later, each at a revision of its own.
    for round in 0..16 {
        let items: Vec<v1::Item> = (0..3)
            .map(|i| item("t", &format!("i{i}"), json!({"round": round})))
            .collect();
        client
            .submit_intent(submit("acme", items))
            .await
            .expect("ok");
        let page = first_page(&mut client).await;
        assert!(page.revision > first.revision);
        assert!(!page.next_page_token.is_empty(), "a listing of more pages");
    }
    let error = client
        .get_graph(v1::GetGraphRequest {
            tenant: "acme".into(),
            page_size: 1,
            page_token: first.next_page_token,
            ..Default::default()
        })
        .await
        .expect_err("revision no longer kept");
    assert_eq!(error.code(), Code::Aborted);
    assert!(
        error.message().contains("restart the listing"),
        "{}",
        error.message()
    );
}

#[tokio::test]
async fn external_reports_satisfy_dependents_and_reject_dependencies() {
    let (_server, channel, token) = server_with_tenant("acme").await;
    let mut client = reconciler(&channel, &token);
    let mut external = item("net", "uplink", json!({}));
    external.external = true;
    let mut dependent = item("t", "route", json!({}));
    dependent.dependencies.push(dependency("net", "uplink"));
    client
        .submit_intent(submit("acme", vec![external, dependent]))
        .await
        .expect("ok");

    let route_reason = |graph: &v1::GetGraphResponse| {
        graph
            .current
            .iter()
            .find(|s| s.r#ref.as_ref().is_some_and(|r| r.name == "route"))
            .map(|s| (s.reason, s.blocked_by.first().map(|b| b.why.clone())))
    };
    let get = v1::GetGraphRequest {
        tenant: "acme".into(),
        ..Default::default()
    };
    let before = client
        .get_graph(get.clone())
        .await
        .expect("graph")
        .into_inner();
    assert_eq!(
        route_reason(&before),
        Some((
            v1::WaitReason::Dependency as i32,
            Some("missing (external item not reported)".into())
        ))
    );

    let report = v1::ReportExternalRequest {
        tenant: "acme".into(),
        reports: vec![v1::ExternalReport {
            change: Some(v1::external_report::Change::Put(item(
                "net",
                "uplink",
                json!({"up": true}),
            ))),
            modified: false,
        }],
    };
    let revision = client
        .report_external(report)
        .await
        .expect("reported")
        .into_inner()
        .revision;
    assert!(revision > before.revision);
    let after = client.get_graph(get).await.expect("graph").into_inner();
    assert_eq!(
        route_reason(&after).map(|r| r.0),
        Some(v1::WaitReason::NoConfigurator as i32)
    );
    let uplink = after
        .current
        .iter()
        .find(|s| s.r#ref.as_ref().is_some_and(|r| r.name == "uplink"))
        .expect("uplink reported");
    assert_eq!(uplink.state, v1::ItemState::Created as i32);
    assert!(uplink.external);

    let mut with_dependency = item("net", "bad", json!({}));
    with_dependency.dependencies.push(dependency("t", "route"));
    let error = client
        .report_external(v1::ReportExternalRequest {
            tenant: "acme".into(),
            reports: vec![v1::ExternalReport {
                change: Some(v1::external_report::Change::Put(with_dependency)),
                modified: false,
            }],
        })
        .await
        .expect_err("dependencies refused");
    assert_eq!(violated_fields(&error), ["reports[0].put.dependencies"]);
}
