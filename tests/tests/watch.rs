//! Reconciler.Watch and Tenants.WatchFleet against the real binary: the
//! snapshot and `Synced`, live groups, exact resumption (also across a
//! restart), compaction, bookmarks, slow consumers, limits, and a
//! property check with several writers and watchers that disconnect and
//! resume at random points.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::Rng;
use reconciled_client::agent::TypeSpec;
use reconciled_client::{Client, Resumed, ResumingWatch, WatchKind};
use reconciled_tests::agents::{DEADLINE, Recorder, RunningAgent, TestTenant, external_put};
use reconciled_tests::api::{self, error_metadata, error_reason, item};
use reconciled_tests::proto::v1;
use reconciled_tests::proto::v1::event::Body;
use reconciled_tests::watch::{Group, Watcher, event_item, events, watch_request};
use reconciled_tests::{ServerOptions, ServerProcess};
use serde_json::json;
use tonic::Code;
use tonic_types::StatusExt as _;

fn kinds(group: &Group) -> Vec<v1::EventKind> {
    group
        .events
        .iter()
        .map(|event| v1::EventKind::try_from(event.kind).expect("known kind"))
        .collect()
}

async fn tenant_with_agent(options: ServerOptions, types: &[&str]) -> (TestTenant, RunningAgent) {
    let tenant = TestTenant::start_with(options, "acme").await;
    let mut builder = tenant.agent("agent-1");
    for item_type in types {
        builder = builder.item_type(TypeSpec::new(*item_type), Recorder::new());
    }
    let mut agent = RunningAgent::start(builder);
    agent.connected().await;
    (tenant, agent)
}

#[tokio::test]
async fn a_watch_from_zero_sends_a_snapshot_then_every_later_commit_as_one_group() {
    let (tenant, _agent) = tenant_with_agent(ServerOptions::default(), &["t"]).await;
    tenant
        .submit(vec![
            item("t", "a", json!({"v": 1})),
            item("t", "b", json!({})),
        ])
        .await;
    tenant.wait_until_ready().await;

    let mut watcher = Watcher::open(&mut tenant.reconciler(), watch_request("acme", 0))
        .await
        .expect("watch opens");
    let synced = watcher.until(|seen| seen.synced.is_some()).await.synced;
    let snapshot: BTreeMap<String, i32> = watcher
        .seen
        .snapshot
        .iter()
        .map(|status| {
            let item = status.r#ref.clone().expect("ref");
            (format!("{}/{}", item.r#type, item.name), status.state)
        })
        .collect();
    let created = v1::ItemState::Created as i32;
    assert_eq!(
        snapshot,
        BTreeMap::from([("t/a".into(), created), ("t/b".into(), created)])
    );
    let synced = synced.expect("synced");
    assert!(synced >= tenant.status().await.revision.min(synced));

    let submitted = tenant
        .submit(vec![
            item("t", "a", json!({"v": 2})),
            item("t", "b", json!({})),
            item("t", "c", json!({})),
        ])
        .await;
    tenant.wait_until_ready().await;
    let ready_revision = tenant.status().await.revision;
    let seen = watcher.until_revision(ready_revision).await.clone();

    // The submit's own commit is the first group after the snapshot: the
    // intent change, with the operations it dispatched.
    let first = &seen.groups[0];
    assert_eq!(first.revision, submitted.revision, "{seen:#?}");
    assert!(first.revision > synced);
    let intent = first
        .events
        .iter()
        .find_map(|event| match &event.body {
            Some(Body::IntentChanged(changed)) => Some(changed.clone()),
            _ => None,
        })
        .expect("an IntentChanged event in the submit's group");
    assert_eq!(intent.generation, 2);
    assert_eq!(intent.items_changed, 2, "a modified, c added: {intent:?}");
    assert!(
        kinds(first).contains(&v1::EventKind::OperationStarted),
        "{first:#?}"
    );

    // Every operation started is finished later, and t/c ends CREATED.
    let mut started = Vec::new();
    let mut finished = Vec::new();
    let mut c_states = Vec::new();
    for event in events(&seen.groups) {
        match &event.body {
            Some(Body::OperationStarted(op)) => started.push(op.op_id.clone()),
            Some(Body::OperationFinished(op)) => {
                assert!(
                    started.contains(&op.op_id),
                    "finished before started: {op:?}"
                );
                assert_eq!(op.outcome, v1::Outcome::Done as i32);
                finished.push(op.op_id.clone());
            }
            Some(Body::ItemStatusChanged(change))
                if event_item(event).as_deref() == Some("t/c") =>
            {
                c_states.push(change.new_state);
            }
            _ => {}
        }
    }
    started.sort();
    finished.sort();
    assert_eq!(started, finished, "{seen:#?}");
    assert_eq!(started.len(), 2, "modify t/a and create t/c: {started:?}");
    assert_eq!(c_states.last(), Some(&created), "{c_states:?}");
    // Nothing before the snapshot's revision is repeated.
    assert!(seen.groups.iter().all(|group| group.revision > synced));
}

/// Item states as a watcher folds them: a snapshot's items, then each
/// `ItemStatusChanged` of `groups` (an unspecified new state drops the
/// item).
fn folded_states(snapshot: &[v1::ItemStatus], groups: &[Group]) -> BTreeMap<String, v1::ItemState> {
    let mut states: BTreeMap<String, v1::ItemState> = snapshot
        .iter()
        .map(|status| {
            let item = status.r#ref.clone().expect("ref");
            (format!("{}/{}", item.r#type, item.name), status.state())
        })
        .collect();
    for event in events(groups) {
        if let Some(Body::ItemStatusChanged(change)) = &event.body {
            let item = event_item(event).expect("names its item");
            match change.new_state() {
                v1::ItemState::Unspecified => states.remove(&item),
                state => states.insert(item, state),
            };
        }
    }
    states
}

/// The status changes of `group`: item, old state, new state.
fn state_changes(group: &Group) -> Vec<(String, v1::ItemState, v1::ItemState)> {
    group
        .events
        .iter()
        .filter_map(|event| match &event.body {
            Some(Body::ItemStatusChanged(change)) => Some((
                event_item(event).expect("names its item"),
                change.old_state(),
                change.new_state(),
            )),
            _ => None,
        })
        .collect()
}

/// Item states folded from `watcher`'s snapshot and events up to the
/// revision of a fresh snapshot, checked equal to that snapshot's.
async fn folded_view_matches_a_fresh_snapshot(
    tenant: &TestTenant,
    watcher: &mut Watcher,
) -> BTreeMap<String, v1::ItemState> {
    let mut fresh = Watcher::open(&mut tenant.reconciler(), watch_request("acme", 0))
        .await
        .expect("watch opens");
    let seen = fresh.until(|seen| seen.synced.is_some()).await;
    let revision = seen.synced.expect("synced");
    let groups = watcher.groups_through(revision).await;
    let folded = folded_states(&watcher.seen.snapshot, &groups);
    assert_eq!(folded, folded_states(&seen.snapshot, &[]));
    folded
}

/// The status changes of the group of the commit at `revision`.
async fn state_changes_at(
    watcher: &mut Watcher,
    revision: u64,
) -> Vec<(String, v1::ItemState, v1::ItemState)> {
    let groups = watcher.groups_through(revision).await;
    let group = groups.last().expect("a group");
    assert_eq!(group.revision, revision, "{groups:#?}");
    state_changes(group)
}

#[tokio::test]
async fn an_item_is_pending_in_events_as_in_snapshots_until_it_leaves_the_intent() {
    use v1::ItemState::{Creating, Pending, Unspecified};
    // No agent holds type u: u/p stays PENDING, and t/x waits for it.
    let (tenant, _agent) = tenant_with_agent(ServerOptions::default(), &["t"]).await;
    let mut watcher = Watcher::open(&mut tenant.reconciler(), watch_request("acme", 0))
        .await
        .expect("watch opens");
    watcher.until(|seen| seen.synced.is_some()).await;
    let mut waiting = item("t", "x", json!({}));
    waiting.dependencies.push(api::dependency("u", "p"));
    let submitted = tenant
        .submit(vec![
            waiting,
            item("u", "p", json!({})),
            item("t", "y", json!({})),
        ])
        .await;
    assert_eq!(
        state_changes_at(&mut watcher, submitted.revision).await,
        [
            ("t/y".to_string(), Unspecified, Creating),
            ("t/x".to_string(), Unspecified, Pending),
            ("u/p".to_string(), Unspecified, Pending),
        ]
    );
    let folded = folded_view_matches_a_fresh_snapshot(&tenant, &mut watcher).await;
    assert_eq!(folded.get("u/p"), Some(&Pending), "{folded:?}");

    // Both leave the intent before they were ever created.
    let removed = tenant.submit(vec![item("t", "y", json!({}))]).await;
    assert_eq!(
        state_changes_at(&mut watcher, removed.revision).await,
        [
            ("t/x".to_string(), Pending, Unspecified),
            ("u/p".to_string(), Pending, Unspecified),
        ]
    );
    let folded = folded_view_matches_a_fresh_snapshot(&tenant, &mut watcher).await;
    assert!(!folded.contains_key("u/p"), "{folded:?}");
}

/// Several writers (subgraph submits, an agent applying them, external
/// reports) while watchers disconnect at random points and resume from the
/// last revision they received: each sees exactly what an uninterrupted
/// watcher saw, group for group; a filtered one sees the filtered groups.
#[tokio::test]
async fn resumed_watches_see_exactly_what_an_uninterrupted_watch_saw() {
    let options = ServerOptions::default()
        .arg("--watch-bookmark-interval-ms")
        .arg("200");
    let (tenant, _agent) = tenant_with_agent(options, &["a", "b"]).await;
    let start = tenant.status().await.revision;
    let mut reference = Watcher::open(&mut tenant.reconciler(), watch_request("acme", start))
        .await
        .expect("watch opens");

    let mut writers = Vec::new();
    for writer in 0..3 {
        let client = tenant.reconciler();
        writers.push(tokio::spawn(async move {
            let mut client = client;
            for round in 0..12 {
                let subgraph = format!("w{writer}");
                let items = (0..4)
                    .map(|index| {
                        let item_type = if index % 2 == 0 { "a" } else { "b" };
                        let mut item = item(
                            item_type,
                            &format!("w{writer}-{index}"),
                            json!({"round": round}),
                        );
                        item.subgraph = subgraph.clone();
                        item
                    })
                    .collect();
                let request = v1::SubmitIntentRequest {
                    subgraph,
                    ..api::submit("acme", items)
                };
                client.submit_intent(request).await.expect("submit");
            }
        }));
    }
    let reporter = {
        let mut client = tenant.reconciler();
        tokio::spawn(async move {
            for round in 0..10 {
                client
                    .report_external(v1::ReportExternalRequest {
                        tenant: "acme".into(),
                        reports: vec![external_put("ext", "x", json!({"round": round}))],
                    })
                    .await
                    .expect("report");
            }
        })
    };

    let flaky = |filter: Vec<String>| {
        let mut client = tenant.reconciler();
        async move {
            let mut groups: Vec<Group> = Vec::new();
            let mut cursor = start;
            let mut reconnects = 0;
            loop {
                let mut request = watch_request("acme", cursor);
                request.item_types = filter.clone();
                let mut watcher = Watcher::open(&mut client, request)
                    .await
                    .expect("watch reopens");
                let budget = rand::rng().random_range(1..12);
                for _ in 0..budget {
                    if watcher.next().await.expect("watch message").is_none() {
                        break;
                    }
                }
                groups.append(&mut watcher.seen.groups);
                cursor = watcher.seen.resume_from;
                reconnects += 1;
                if cursor >= u64::MAX / 2 {
                    unreachable!();
                }
                if reconnects > 2_000 {
                    panic!("too many reconnects");
                }
                // The final revision is known only once the writers are done.
                if let Some(done) = FINAL.get()
                    && cursor >= *done
                {
                    return (groups, reconnects);
                }
            }
        }
    };
    static FINAL: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let whole = tokio::spawn(flaky(Vec::new()));
    let filtered = tokio::spawn(flaky(vec!["a".to_string()]));

    for writer in writers {
        writer.await.expect("writer");
    }
    reporter.await.expect("reporter");
    tenant.wait_until_quiescent().await;
    let last = tenant.status().await.revision;
    FINAL.set(last).expect("set once");
    let reference = reference.until_revision(last).await.groups.clone();
    let (whole, whole_reconnects) = whole.await.expect("flaky watcher");
    let (filtered, _) = filtered.await.expect("filtered watcher");

    assert!(
        reference.len() > 20,
        "enough activity to matter: {}",
        reference.len()
    );
    assert!(
        whole_reconnects > 3,
        "the watcher did reconnect: {whole_reconnects}"
    );
    let until_last = |groups: Vec<Group>| -> Vec<Group> {
        groups
            .into_iter()
            .filter(|group| group.revision <= last)
            .collect()
    };
    assert_eq!(until_last(whole), reference);
    let expected_filtered: Vec<Group> = reference
        .iter()
        .filter_map(|group| {
            let events: Vec<v1::Event> = group
                .events
                .iter()
                .filter(|event| match &event.body {
                    Some(Body::IntentChanged(_)) | Some(Body::ConditionsChanged(_)) => true,
                    Some(Body::AgentConnected(a)) => a.item_types.iter().any(|t| t == "a"),
                    Some(Body::AgentDisconnected(a)) => a.item_types.iter().any(|t| t == "a"),
                    _ => event_item(event).is_some_and(|item| item.starts_with("a/")),
                })
                .cloned()
                .collect();
            (!events.is_empty()).then_some(Group {
                revision: group.revision,
                events,
            })
        })
        .collect();
    assert_eq!(until_last(filtered), expected_filtered);
}

#[tokio::test]
async fn history_survives_a_restart_and_resumes_exactly_after_any_revision() {
    let (mut tenant, agent) = tenant_with_agent(ServerOptions::default(), &["t"]).await;
    for round in 0..3 {
        tenant
            .submit(vec![
                item("t", "a", json!({"round": round})),
                item("t", "b", json!({})),
            ])
            .await;
        tenant.wait_until_ready().await;
    }
    let last = tenant.status().await.revision;
    let mut before = Watcher::open_from_oldest(&mut tenant.reconciler(), "acme")
        .await
        .expect("watch opens");
    let before = before.until_revision(last).await.groups.clone();
    assert!(before.len() >= 6, "{before:#?}");
    agent.stop().await.expect("agent stops");

    tenant.server.restart().await.expect("restarts");
    tenant.channel = tenant.server.channel().await.expect("connects");
    let mut after = Watcher::open_from_oldest(&mut tenant.reconciler(), "acme")
        .await
        .expect("watch opens after the restart");
    let after_groups = after.groups_through(last).await;
    assert_eq!(after_groups, before);

    let middle = before[before.len() / 2].revision;
    let mut resumed = Watcher::open(&mut tenant.reconciler(), watch_request("acme", middle))
        .await
        .expect("watch opens");
    let resumed = resumed.groups_through(last).await;
    let expected: Vec<Group> = before
        .into_iter()
        .filter(|group| group.revision > middle)
        .collect();
    assert_eq!(resumed, expected);
}

#[tokio::test]
async fn a_revision_older_than_the_history_is_out_of_range_with_the_compact_revision() {
    let options = ServerOptions::default()
        .arg("--watch-history-revisions")
        .arg("3");
    let tenant = TestTenant::start_with(options, "acme").await;
    for round in 0..12 {
        tenant
            .submit(vec![item("t", "a", json!({"round": round}))])
            .await;
    }
    let compact = compacted_from(&tenant, 1).await;
    let last = tenant.status().await.revision;
    assert!(
        compact > 1 && compact < last,
        "compact {compact}, last {last}"
    );

    // From the compact revision on, everything is there.
    let mut watcher = Watcher::open(&mut tenant.reconciler(), watch_request("acme", compact))
        .await
        .expect("the compact revision is available");
    let seen = watcher.until_revision(last).await;
    let generations: Vec<u64> = events(&seen.groups)
        .filter_map(|event| match &event.body {
            Some(Body::IntentChanged(changed)) => Some(changed.generation),
            _ => None,
        })
        .collect();
    assert!(!generations.is_empty());
    assert_eq!(*generations.last().expect("some"), 12);
    assert!(
        generations.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "{generations:?}"
    );
}

/// The compact revision a watch of `tenant` from `start` is refused with
/// (`OUT_OF_RANGE`, `REVISION_COMPACTED`).
async fn compacted_from(tenant: &TestTenant, start: u64) -> u64 {
    let status = Watcher::open(&mut tenant.reconciler(), watch_request("acme", start))
        .await
        .expect_err("the start revision is compacted");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert_eq!(error_reason(&status).as_deref(), Some("REVISION_COMPACTED"));
    error_metadata(&status, "compact_revision")
        .expect("compact_revision")
        .parse()
        .expect("a number")
}

/// One SubmitIntent of items `t/item-0` … `t/item-49` per round, each with
/// the round's number.
async fn submit_rounds(tenant: &TestTenant, rounds: std::ops::Range<u32>) {
    for round in rounds {
        let items = (0..50)
            .map(|index| item("t", &format!("item-{index}"), json!({"round": round})))
            .collect();
        tenant.submit(items).await;
    }
}

/// However few revisions a tenant commits, its history is held to
/// `--watch-history-bytes`: large changes compact the oldest revisions,
/// and a watcher resuming from before them starts over from a snapshot.
#[tokio::test]
async fn a_history_over_its_bytes_is_compacted_from_the_oldest_revision() {
    let options = ServerOptions::default()
        .arg("--watch-history-bytes")
        .arg("10000");
    let mut tenant = TestTenant::start_with(options, "acme").await;
    let first = tenant.status().await.revision;
    // Each round changes 50 items: about 1 KB of events. 30 rounds are far
    // below the 100,000 revisions kept by count.
    submit_rounds(&tenant, 0..30).await;
    let compact = compacted_from(&tenant, first).await;
    let last = tenant.status().await.revision;
    assert!(
        compact > first + 5 && compact < last,
        "first {first}, compact {compact}, last {last}"
    );

    // The count survives a restart: the history stays bounded after it.
    tenant.server.restart().await.expect("restarts");
    tenant.channel = tenant.server.channel().await.expect("connects");
    submit_rounds(&tenant, 30..40).await;
    let compact_after = compacted_from(&tenant, compact).await;
    assert!(compact_after > compact, "{compact_after} after {compact}");
    let last = tenant.status().await.revision;
    let mut watcher = Watcher::open(
        &mut tenant.reconciler(),
        watch_request("acme", compact_after),
    )
    .await
    .expect("everything after the compact revision is available");
    let groups = watcher.groups_through(last).await;
    assert!(
        groups
            .first()
            .is_some_and(|group| group.revision > compact_after),
        "{groups:?}"
    );
}

/// Revisions only grow, so a resume from one the tenant has not reached
/// comes from a tenant of that name that was deleted (or a history a
/// restore or repair took back): following it would silently skip every
/// event up to it. It is refused as a compacted revision is, so the
/// watcher starts again from a snapshot.
#[tokio::test]
async fn a_resume_from_a_revision_the_tenant_has_not_reached_is_refused_not_silently_skipped() {
    let tenant = TestTenant::start("acme").await;
    tenant.submit(vec![item("t", "a", json!({}))]).await;
    let current = tenant.status().await.revision;

    let status = Watcher::open(&mut tenant.reconciler(), watch_request("acme", current + 5))
        .await
        .expect_err("a revision ahead of the tenant");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert_eq!(error_reason(&status).as_deref(), Some("REVISION_COMPACTED"));
    assert_eq!(
        error_metadata(&status, "current_revision").as_deref(),
        Some(current.to_string().as_str())
    );
    // The revision the tenant is at, and any below it, still resume.
    Watcher::open(&mut tenant.reconciler(), watch_request("acme", current))
        .await
        .expect("the latest revision resumes");
}

#[tokio::test]
async fn a_tenant_created_again_under_its_name_refuses_a_resume_from_the_old_ones_revisions() {
    let mut tenant = TestTenant::start("acme").await;
    for round in 0..5 {
        tenant
            .submit(vec![item("t", "a", json!({"round": round}))])
            .await;
    }
    let seen = tenant.status().await.revision;

    let admin = tenant.server.admin_token();
    api::tenants(&tenant.channel, &admin)
        .delete_tenant(v1::DeleteTenantRequest {
            name: "acme".into(),
        })
        .await
        .expect("deletes");
    tenant.token = api::create_tenant(&tenant.channel, &admin, "acme").await;
    let first = tenant.status().await.revision;
    // However many changes the new tenant commits, a resume from a
    // revision of the old one never continues into them.
    let mut round = 0;
    while tenant.status().await.revision <= seen {
        assert!(
            round < 100,
            "the new tenant passes {seen} within 100 submissions"
        );
        tenant
            .submit(vec![item("t", "b", json!({"round": round}))])
            .await;
        round += 1;
    }

    let status = Watcher::open(&mut tenant.reconciler(), watch_request("acme", seen))
        .await
        .expect_err("a revision of the tenant deleted");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert_eq!(error_reason(&status).as_deref(), Some("REVISION_COMPACTED"));
    let floor: u64 = error_metadata(&status, "compact_revision")
        .and_then(|floor| floor.parse().ok())
        .expect("the error names where the new tenant's history starts");
    assert!(
        seen < floor && floor <= first,
        "the new tenant's history starts past every revision of the old one: {seen} < {floor} <= {first}"
    );
    Watcher::open(&mut tenant.reconciler(), watch_request("acme", first))
        .await
        .expect("the new tenant's own revisions resume");
}

#[tokio::test]
async fn an_idle_filtered_watch_gets_bookmarks_at_the_tenant_revision() {
    let options = ServerOptions::default()
        .arg("--watch-bookmark-interval-ms")
        .arg("200");
    let tenant = TestTenant::start_with(options, "acme").await;
    let mut request = watch_request("acme", 0);
    request.kinds = vec![v1::EventKind::DriftDetected as i32];
    let mut watcher = Watcher::open(&mut tenant.reconciler(), request)
        .await
        .expect("opens");
    watcher.until(|seen| seen.synced.is_some()).await;
    tenant.submit(vec![item("t", "a", json!({}))]).await;
    let revision = tenant.status().await.revision;
    let seen = watcher
        .until(|seen| seen.bookmark.is_some_and(|b| b >= revision))
        .await;
    assert!(
        seen.groups.is_empty(),
        "nothing matched the filter: {seen:#?}"
    );

    // A watch resumed from the bookmark starts after it.
    tenant.submit(vec![item("t", "a", json!({"v": 2}))]).await;
    let mut resumed = Watcher::open(&mut tenant.reconciler(), watch_request("acme", revision))
        .await
        .expect("opens");
    let seen = resumed.until(|seen| !seen.groups.is_empty()).await;
    assert!(seen.groups[0].revision > revision);
}

#[tokio::test]
async fn a_watcher_too_slow_for_its_buffer_is_ended_without_a_gap() {
    // 16 MB of reports in a few seconds: over the tenant's default byte
    // budget, which is not what this test is about.
    let options = ServerOptions::default()
        .arg("--watch-ring-events")
        .arg("20")
        .without_byte_budget();
    let tenant = TestTenant::start_with(options, "acme").await;
    let mut watcher = Watcher::open(&mut tenant.reconciler(), watch_request("acme", 0))
        .await
        .expect("opens");
    watcher.until(|seen| seen.synced.is_some()).await;

    // The watcher stops reading while large external reports commit.
    let big = "x".repeat(8 * 1024);
    for round in 0..40 {
        let reports = (0..50)
            .map(|index| {
                external_put(
                    "ext",
                    &format!("e{index}"),
                    json!({"round": round, "pad": big}),
                )
            })
            .collect();
        tenant
            .reconciler()
            .report_external(v1::ReportExternalRequest {
                tenant: "acme".into(),
                reports,
            })
            .await
            .expect("report");
    }
    let ended = watcher
        .until_end()
        .await
        .expect_err("the slow watcher is ended");
    assert_eq!(ended.code(), Code::ResourceExhausted, "{ended:?}");
    assert!(
        ended.get_details_retry_info().is_some(),
        "RetryInfo: {ended:?}"
    );
    // What it did receive has no gap: consecutive report rounds.
    let revisions: Vec<u64> = watcher.seen.groups.iter().map(|g| g.revision).collect();
    assert!(
        revisions.len() < 40,
        "it was ended before the end: {}",
        revisions.len()
    );
    let rounds: Vec<u64> = events(&watcher.seen.groups)
        .filter_map(|event| match &event.body {
            Some(Body::ItemStatusChanged(change))
                if event_item(event).as_deref() == Some("ext/e0") =>
            {
                change
                    .status
                    .as_ref()
                    .and_then(|s| s.applied.as_ref())
                    .and_then(|a| a.properties.as_ref())
                    .and_then(|p| p.fields.get("round"))
                    .and_then(|v| match v.kind {
                        Some(prost_types::value::Kind::NumberValue(n)) => Some(n as u64),
                        _ => None,
                    })
            }
            _ => None,
        })
        .collect();
    assert!(
        rounds.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "{rounds:?}"
    );
}

#[tokio::test]
async fn watch_limits_filters_and_deleted_tenants_answer_clearly() {
    let server = ServerProcess::start(
        ServerOptions::default()
            .arg("--max-watchers-per-tenant")
            .arg("1"),
    )
    .await
    .expect("starts");
    let channel = server.channel().await.expect("connects");
    let token = api::create_tenant(&channel, &server.admin_token(), "acme").await;
    let mut client = api::reconciler(&channel, &token);

    let mut request = watch_request("acme", 0);
    request.kinds = vec![0];
    let status = Watcher::open(&mut client, request)
        .await
        .expect_err("kind 0 is invalid");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(api::violated_fields(&status), ["kinds[0]"]);

    let status = Watcher::open(&mut client, watch_request("other", 0))
        .await
        .expect_err("unknown tenant");
    assert_eq!(status.code(), Code::NotFound);

    let mut first = Watcher::open(&mut client, watch_request("acme", 0))
        .await
        .expect("opens");
    first.until(|seen| seen.synced.is_some()).await;
    let status = Watcher::open(&mut client, watch_request("acme", 0))
        .await
        .expect_err("one watcher at most");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let quota = status.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations[0].subject, "max_watchers");

    api::tenants(&channel, &server.admin_token())
        .delete_tenant(v1::DeleteTenantRequest {
            name: "acme".into(),
        })
        .await
        .expect("deletes");
    let ended = first
        .until_end()
        .await
        .expect_err("the watch ends with the tenant");
    // Opened with the tenant's own token, which died with the tenant
    // (issue 12: deletion revokes the streams of the tenant's token).
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
}

#[tokio::test]
async fn the_fleet_watch_lists_tenants_then_streams_their_changes_and_resumes_after_a_restart() {
    let mut server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("starts");
    let channel = server.channel().await.expect("connects");
    let admin = server.admin_token();
    api::create_tenant(&channel, &admin, "alpha").await;

    let mut fleet = api::tenants(&channel, &admin)
        .watch_fleet(v1::WatchFleetRequest { start_revision: 0 })
        .await
        .expect("opens")
        .into_inner();
    let mut listed = Vec::new();
    let synced = loop {
        let message = next_fleet(&mut fleet).await;
        match message {
            v1::watch_fleet_response::Message::Events(group) => {
                listed.extend(group.events.into_iter().map(|e| e.tenant));
            }
            v1::watch_fleet_response::Message::Synced(synced) => break synced.revision,
            v1::watch_fleet_response::Message::Bookmark(_) => {}
        }
    };
    assert_eq!(listed, ["alpha"]);

    let beta_token = api::create_tenant(&channel, &admin, "beta").await;
    api::reconciler(&channel, &beta_token)
        .submit_intent(api::submit("beta", vec![item("t", "a", json!({}))]))
        .await
        .expect("submit");
    api::tenants(&channel, &admin)
        .delete_tenant(v1::DeleteTenantRequest {
            name: "alpha".into(),
        })
        .await
        .expect("deletes");
    let mut live: Vec<v1::FleetEvent> = Vec::new();
    while !live.iter().any(|e| e.tenant == "alpha" && e.deleted)
        || !live
            .iter()
            .any(|e| e.tenant == "beta" && !e.conditions.is_empty())
    {
        if let v1::watch_fleet_response::Message::Events(group) = next_fleet(&mut fleet).await {
            assert!(group.events.iter().all(|e| e.revision == group.revision));
            live.extend(group.events);
        }
    }
    let revisions: Vec<u64> = live.iter().map(|e| e.revision).collect();
    assert!(
        revisions.windows(2).all(|pair| pair[0] < pair[1]),
        "{revisions:?}"
    );
    assert!(revisions[0] > synced);
    let beta_first = live
        .iter()
        .find(|e| e.tenant == "beta")
        .expect("beta's events");
    assert!(
        beta_first.conditions.is_empty() && !beta_first.deleted,
        "creation first: {live:#?}"
    );

    // The same changes, resumed after a restart.
    server.restart().await.expect("restarts");
    let channel = server.channel().await.expect("connects");
    let mut resumed = api::tenants(&channel, &admin)
        .watch_fleet(v1::WatchFleetRequest {
            start_revision: synced,
        })
        .await
        .expect("opens")
        .into_inner();
    let mut again: Vec<v1::FleetEvent> = Vec::new();
    while again.len() < live.len() {
        if let v1::watch_fleet_response::Message::Events(group) = next_fleet(&mut resumed).await {
            again.extend(group.events);
        }
    }
    assert_eq!(again[..live.len()], live[..]);

    // Tenants may not watch the fleet.
    let denied = api::tenants(&channel, &beta_token)
        .watch_fleet(v1::WatchFleetRequest { start_revision: 0 })
        .await
        .expect_err("admin only");
    assert_eq!(denied.code(), Code::PermissionDenied);
}

async fn next_fleet(
    stream: &mut tonic::Streaming<v1::WatchFleetResponse>,
) -> v1::watch_fleet_response::Message {
    tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("a fleet message in time")
        .expect("the fleet stream is healthy")
        .and_then(|message| message.message)
        .expect("the fleet stream is open")
}

#[tokio::test]
async fn a_large_commit_arrives_as_one_group_split_into_bounded_messages() {
    let options = ServerOptions::default()
        .arg("--max-message-bytes")
        .arg("262144");
    let tenant = TestTenant::start_with(options, "acme").await;
    let mut watcher = Watcher::open(&mut tenant.reconciler(), watch_request("acme", 0))
        .await
        .expect("opens");
    watcher.until(|seen| seen.synced.is_some()).await;
    let reports = (0..1_500)
        .map(|index| external_put("ext", &format!("e{index:04}"), json!({"index": index})))
        .collect();
    tenant
        .reconciler()
        .report_external(v1::ReportExternalRequest {
            tenant: "acme".into(),
            reports,
        })
        .await
        .expect("report");
    let has_items = |group: &Group| {
        group
            .events
            .iter()
            .any(|event| matches!(event.body, Some(Body::ItemStatusChanged(_))))
    };
    let mut continued = 0;
    while !watcher.seen.groups.iter().any(has_items) {
        if let Some(v1::watch_response::Message::Events(message)) =
            watcher.next().await.expect("healthy")
        {
            assert!(
                prost::Message::encoded_len(&message) < 262_144,
                "a message within the limit"
            );
            continued += usize::from(message.continued);
        }
    }
    let group = watcher
        .seen
        .groups
        .iter()
        .find(|g| has_items(g))
        .expect("found");
    let items = group
        .events
        .iter()
        .filter(|event| matches!(event.body, Some(Body::ItemStatusChanged(_))))
        .count();
    assert_eq!(items, 1_500, "the whole commit in one group");
    assert!(continued >= 2, "split over several messages: {continued}");
}

/// The next message of a resuming watch, within the test [`DEADLINE`].
async fn next_resumed<K: WatchKind>(watch: &mut ResumingWatch<K>) -> Resumed<K::Message> {
    tokio::time::timeout(DEADLINE, watch.next())
        .await
        .unwrap_or_else(|_| panic!("no message within {DEADLINE:?} from {watch:?}"))
        .unwrap_or_else(|status| panic!("the watch ended: {status:?}"))
}

/// [`next_resumed`], with the call dropped every 20 ms and made again,
/// as a `select!` loop would: a dropped call must lose nothing.
async fn next_resumed_while_cancelled<K: WatchKind>(
    watch: &mut ResumingWatch<K>,
) -> Resumed<K::Message> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match tokio::time::timeout(Duration::from_millis(20), watch.next()).await {
            Ok(next) => return next.unwrap_or_else(|status| panic!("the watch ended: {status:?}")),
            Err(_) if tokio::time::Instant::now() < deadline => {}
            Err(_) => panic!("no message within {DEADLINE:?} from {watch:?}"),
        }
    }
}

/// The generations of the intent changes among `group`'s events.
fn intent_generations(group: &v1::EventGroup) -> impl Iterator<Item = u64> + '_ {
    group.events.iter().filter_map(|event| match &event.body {
        Some(Body::IntentChanged(changed)) => Some(changed.generation),
        _ => None,
    })
}

/// The SDK's resuming watches, read while the server is killed and
/// started again: the tenant's stream carries every intent change once,
/// in order (read with calls that are dropped every 20 ms, as in a
/// `select!` loop), and the fleet's stream the tenant created after the
/// restart once, after a listing that was not repeated.
#[tokio::test]
async fn the_sdks_resuming_watches_cross_a_kill_9_without_losing_or_repeating_an_event() {
    use reconciled_client::proto::watch_fleet_response::Message as FleetMessage;
    use reconciled_client::proto::watch_response::Message;

    let mut tenant = TestTenant::start("acme").await;
    let client = Client::connect(tenant.server.endpoint(), &tenant.token)
        .await
        .expect("connects");
    let admin = client
        .with_token(&tenant.server.admin_token())
        .expect("a valid token");
    let mut watch = client.watch_resuming(v1::WatchRequest {
        tenant: "acme".into(),
        ..Default::default()
    });
    let mut fleet = admin.watch_fleet_resuming(v1::WatchFleetRequest::default());

    // The tenant's stream is read by a task of its own, so that it is
    // waiting in `next` while the server is down.
    let (seen_sender, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        let mut generations = Vec::new();
        let mut revisions = Vec::new();
        let mut synced = false;
        while generations.last() != Some(&4) {
            match next_resumed_while_cancelled(&mut watch).await {
                Resumed::Message(Message::Events(group)) => {
                    for generation in intent_generations(&group) {
                        generations.push(generation);
                        let _ = seen_sender.send(generation);
                    }
                    if !group.continued {
                        revisions.push(group.revision);
                    }
                }
                Resumed::StartedOver(why) => panic!("the watch started over: {why:?}"),
                // A second snapshot would mean it resumed from 0.
                Resumed::Message(Message::Snapshot(_)) if synced => {
                    panic!("a snapshot after Synced")
                }
                Resumed::Message(Message::Synced(_)) => synced = true,
                Resumed::Message(_) => {}
            }
        }
        (generations, revisions)
    });
    let mut listed = Vec::new();
    loop {
        match next_resumed(&mut fleet).await {
            Resumed::Message(FleetMessage::Events(group)) => {
                listed.extend(group.events.into_iter().map(|event| event.tenant));
            }
            Resumed::Message(FleetMessage::Synced(_)) => break,
            other => panic!("before Synced: {other:?}"),
        }
    }
    assert_eq!(listed, ["acme"]);

    for generation in 1..=2 {
        tenant
            .submit(vec![item("t", "a", json!({"generation": generation}))])
            .await;
    }
    let wait_for = async |seen: &mut tokio::sync::mpsc::UnboundedReceiver<u64>, wanted: u64| {
        tokio::time::timeout(DEADLINE, async {
            while seen.recv().await.expect("the reader runs") != wanted {}
        })
        .await
        .unwrap_or_else(|_| panic!("generation {wanted} was not watched within {DEADLINE:?}"));
    };
    wait_for(&mut seen, 2).await;

    tenant.server.kill9().expect("killed");
    tenant.server.start_again().await.expect("starts again");
    tenant.channel = tenant.server.channel().await.expect("connects");
    for generation in 3..=4 {
        tenant
            .submit(vec![item("t", "a", json!({"generation": generation}))])
            .await;
    }
    let (generations, revisions) = tokio::time::timeout(DEADLINE * 2, reader)
        .await
        .expect("the reader finishes")
        .expect("the reader did not panic");
    assert_eq!(generations, [1, 2, 3, 4]);
    assert!(
        revisions.windows(2).all(|pair| pair[0] < pair[1]),
        "a revision came twice: {revisions:?}"
    );

    api::create_tenant(&tenant.channel, &tenant.server.admin_token(), "beta").await;
    let mut after = Vec::new();
    while !after.contains(&"beta".to_owned()) {
        match next_resumed(&mut fleet).await {
            Resumed::Message(FleetMessage::Events(group)) => {
                after.extend(group.events.into_iter().map(|event| event.tenant));
            }
            Resumed::StartedOver(why) => panic!("the fleet watch started over: {why:?}"),
            Resumed::Message(FleetMessage::Synced(_)) => panic!("a second listing"),
            Resumed::Message(FleetMessage::Bookmark(_)) => {}
        }
    }
    assert_eq!(
        after.iter().filter(|name| *name == "beta").count(),
        1,
        "{after:?}"
    );
}

/// A resuming watch whose place in the history was compacted while it
/// was away says that it starts over, then delivers a fresh snapshot of
/// the tenant as it is now.
#[tokio::test]
async fn the_sdks_resuming_watch_starts_over_from_a_snapshot_when_its_history_was_compacted() {
    use reconciled_client::proto::watch_response::Message;

    let options = ServerOptions::default()
        .arg("--watch-history-revisions")
        .arg("3");
    let mut tenant = TestTenant::start_with(options, "acme").await;
    let client = Client::connect(tenant.server.endpoint(), &tenant.token)
        .await
        .expect("connects");
    let mut watch = client.watch_resuming(v1::WatchRequest {
        tenant: "acme".into(),
        ..Default::default()
    });
    while !matches!(
        next_resumed(&mut watch).await,
        Resumed::Message(Message::Synced(_))
    ) {}
    let synced_at = watch.resume_revision();

    // The watch is not read while the server restarts and six intents
    // move the history of three revisions past where it was.
    tenant.server.restart().await.expect("restarts");
    tenant.channel = tenant.server.channel().await.expect("connects");
    // Past every revision the stream could have sent before the restart.
    let before_restart = tenant.status().await.revision;
    for generation in 1..=6 {
        tenant
            .submit(vec![item("t", "a", json!({"generation": generation}))])
            .await;
    }
    // What the stream had sent before the restart (the first pass's
    // conditions) may still come first; nothing after it does.
    let why = loop {
        match next_resumed(&mut watch).await {
            Resumed::StartedOver(why) => break why,
            Resumed::Message(Message::Events(group)) if group.revision <= before_restart => {}
            other => panic!("expected StartedOver after compaction, got {other:?}"),
        }
    };
    assert_eq!(why.code(), Code::OutOfRange, "{why:?}");
    assert_eq!(error_reason(&why).as_deref(), Some("REVISION_COMPACTED"));
    let snapshot = match next_resumed(&mut watch).await {
        Resumed::Message(Message::Snapshot(part)) => part,
        other => panic!("expected a snapshot, got {other:?}"),
    };
    assert_eq!(snapshot.generation, 6);
    assert!(
        snapshot.revision > synced_at + 3,
        "{snapshot:?} after {synced_at}"
    );
    assert!(
        snapshot
            .intended
            .iter()
            .any(|intended| intended.item.as_ref().is_some_and(|item| item.name == "a")),
        "{snapshot:?}"
    );
}
