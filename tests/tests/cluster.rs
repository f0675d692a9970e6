//! Replicas on etcd (DESIGN section 11), end to end with real etcd and
//! real replicas: tenants spread over the replicas, each served by exactly
//! one; any replica answers any call (forwarded, with the owner's status
//! and details); agents are redirected to the owner; a joining replica
//! takes its share by clean hand-offs; tenant administration works from
//! any replica; the fleet stream is one order on every replica; a replica
//! is not ready until it has joined.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use reconciled::cluster::placement;
use reconciled::store::{EtcdOptions, EtcdStore, Store, keys};
use reconciled_client::agent::{Agent, TypeSpec};
use reconciled_tests::agents::{DEADLINE, Recorder, RunningAgent, item_needing};
use reconciled_tests::api::{self, error_metadata, error_reason};
use reconciled_tests::cluster::Replicas;
use reconciled_tests::etcd::EtcdCluster;
use reconciled_tests::proto::v1;
use reconciled_tests::{ServerProcess, successful_stdout};
use serde_json::json;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Waits until `check` passes, polling every 25 ms, for at most the test
/// deadline.
async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The owner keys in etcd: tenant id (hex) -> (replica id, lease).
async fn owner_keys(etcd: &EtcdCluster, prefix: &str) -> BTreeMap<String, (String, i64)> {
    let mut client = etcd.client().await.expect("etcd client");
    let owners = format!("{prefix}owners/");
    client
        .get(
            owners.clone(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .expect("lists owner keys")
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key())
                    .trim_start_matches(&owners)
                    .to_owned(),
                (String::from_utf8_lossy(kv.value()).into_owned(), kv.lease()),
            )
        })
        .collect()
}

fn chain(count: usize, round: u32) -> Vec<v1::Item> {
    (0..count)
        .map(|i| {
            let requires = (i > 0).then(|| format!("t/i{:02}", i - 1));
            let requires: Vec<&str> = requires.iter().map(String::as_str).collect();
            item_needing(
                "t",
                &format!("i{i:02}"),
                json!({ "round": round }),
                &requires,
            )
        })
        .collect()
}

#[tokio::test]
async fn tenants_spread_over_the_replicas_each_served_by_one_and_any_replica_answers() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let replicas = Replicas::start(&etcd, 3).await;
    // With 48 tenants, placement leaves one of three replicas without a
    // tenant about once in 10^8 runs (3 x (2/3)^48); with 24 it was once in
    // 5,500.
    let names: Vec<String> = (0..48).map(|i| format!("t{i:02}")).collect();
    let mut tokens = Vec::new();
    for (index, name) in names.iter().enumerate() {
        tokens.push(replicas.create_tenant(index % 3, name).await);
    }

    // Every replica names the same owner for every tenant, one of them, and
    // every replica serves some: once each has seen the others join (a
    // replica that the others had not seen yet when the tenants were
    // created is handed its tenants after).
    let addresses: HashSet<String> = replicas
        .servers
        .iter()
        .map(|server| server.addr().to_string())
        .collect();
    eventually("the tenants spread over all three replicas", async || {
        let mut served: BTreeMap<String, usize> = BTreeMap::new();
        for name in &names {
            let owner = replicas.owner(0, name).await;
            assert!(addresses.contains(&owner), "{name} is served by {owner:?}");
            for via in 1..3 {
                if replicas.owner(via, name).await != owner {
                    return None;
                }
            }
            *served.entry(owner).or_default() += 1;
        }
        (served.len() == 3).then_some(served)
    })
    .await;

    // In etcd: one owner key per tenant, held under a lease by a replica.
    let keys = owner_keys(&etcd, &replicas.prefix).await;
    assert_eq!(keys.len(), names.len(), "{keys:?}");
    for (replica, lease) in keys.values() {
        assert!(addresses.contains(replica) && *lease != 0, "{keys:?}");
    }

    // A tenant's token, created through replica 0, works on every replica;
    // calls through a replica that does not serve the tenant are answered
    // by the one that does.
    let (name, token) = (&names[5], &tokens[5]);
    let owner = replicas
        .index_of(&replicas.owner(0, name).await)
        .expect("a replica");
    let others: Vec<usize> = (0..3).filter(|index| *index != owner).collect();
    for via in 0..3 {
        let channel = replicas.channel(via).await;
        eventually("the new token is accepted everywhere", async || {
            api::reconciler(&channel, token)
                .get_status(v1::GetStatusRequest {
                    tenant: name.clone(),
                })
                .await
                .ok()
        })
        .await;
    }
    let submitted = api::reconciler(&replicas.channel(others[0]).await, token)
        .submit_intent(api::submit(name, chain(5, 1)))
        .await
        .expect("SubmitIntent through a replica that does not serve the tenant")
        .into_inner();
    assert_eq!(submitted.generation, 1);
    let graph = api::reconciler(&replicas.channel(others[1]).await, token)
        .get_graph(v1::GetGraphRequest {
            tenant: name.clone(),
            view: v1::GraphView::Intended.into(),
            ..Default::default()
        })
        .await
        .expect("GetGraph through another one")
        .into_inner();
    assert_eq!((graph.generation, graph.intended.len()), (1, 5));

    // A tenant's token still sees only its tenant, wherever it asks.
    let foreign = api::reconciler(&replicas.channel(others[0]).await, token)
        .get_status(v1::GetStatusRequest {
            tenant: names[6].clone(),
        })
        .await
        .expect_err("another tenant");
    assert_eq!(foreign.code(), Code::NotFound, "{foreign:?}");

    // ListTenants shows the whole fleet from any replica.
    for via in 0..3 {
        let listed = api::tenants(&replicas.channel(via).await, replicas.admin_token())
            .list_tenants(v1::ListTenantsRequest::default())
            .await
            .expect("ListTenants")
            .into_inner();
        let listed: Vec<(String, String)> = listed
            .tenants
            .into_iter()
            .map(|tenant| {
                let owner = tenant.status.map(|s| s.owner).unwrap_or_default();
                (tenant.name, owner)
            })
            .collect();
        assert_eq!(listed.len(), names.len());
        assert!(
            listed.iter().all(|(_, owner)| addresses.contains(owner)),
            "{listed:?}"
        );
    }
}

#[tokio::test]
async fn a_call_to_a_replica_that_does_not_serve_the_tenant_answers_as_the_owner_does() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let replicas = Replicas::start(&etcd, 2).await;
    let token = replicas.create_tenant(0, "acme").await;
    let owner = replicas
        .index_of(&replicas.owner(0, "acme").await)
        .expect("a replica");
    let other = 1 - owner;
    api::reconciler(&replicas.channel(owner).await, &token)
        .submit_intent(api::submit("acme", chain(3, 1)))
        .await
        .expect("submits");

    let authorization = format!("authorization: Bearer {token}");
    let grpcurl = |index: usize, data: &str, method: &str| {
        replicas.servers[index].grpcurl(
            &["-H", &authorization, "-format-error", "-d", data],
            &[method],
        )
    };
    let status = r#"{"tenant": "acme"}"#;
    let from_owner = grpcurl(owner, status, "reconciled.v1.Reconciler/GetStatus");
    let from_other = grpcurl(other, status, "reconciled.v1.Reconciler/GetStatus");
    let shown = successful_stdout(&from_owner);
    assert!(shown.contains("\"owner\""), "{shown}");
    assert_eq!(shown, successful_stdout(&from_other));

    // An error with details: a dependency cycle.
    let cycle = r#"{"tenant": "acme", "dry_run": true, "items": [
        {"type": "t", "name": "a", "dependencies": [{"requires": {"type": "t", "name": "b"}}]},
        {"type": "t", "name": "b", "dependencies": [{"requires": {"type": "t", "name": "a"}}]}]}"#;
    let from_owner = grpcurl(owner, cycle, "reconciled.v1.Reconciler/SubmitIntent");
    let from_other = grpcurl(other, cycle, "reconciled.v1.Reconciler/SubmitIntent");
    assert_eq!(from_owner.status.code(), Some(64 + 3), "{from_owner:?}");
    let owner_error = String::from_utf8_lossy(&from_owner.stderr).into_owned();
    assert!(owner_error.contains("DEPENDENCY_CYCLE"), "{owner_error}");
    assert_eq!(from_owner.status.code(), from_other.status.code());
    assert_eq!(owner_error, String::from_utf8_lossy(&from_other.stderr));
    assert_eq!(from_owner.stdout, from_other.stdout);
}

#[tokio::test]
async fn an_agent_given_a_replica_that_does_not_serve_its_tenant_is_redirected_and_converges() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let replicas = Replicas::start(&etcd, 2).await;
    let token = replicas.create_tenant(1, "acme").await;
    let owner = replicas
        .index_of(&replicas.owner(0, "acme").await)
        .expect("a replica");
    let other = 1 - owner;

    // The Connect refusal names the owner.
    let recorder = Recorder::new();
    let mut agent = RunningAgent::start(
        Agent::builder(replicas.servers[other].endpoint(), "acme", &token)
            .agent_id("agent-1")
            .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(250))
            .item_type(TypeSpec::new("t").max_in_flight(4), recorder.clone()),
    );
    agent.connected().await;
    let reconciler = api::reconciler(&replicas.channel(other).await, &token);
    reconciler
        .clone()
        .submit_intent(api::submit("acme", chain(6, 1)))
        .await
        .expect("submits");
    eventually("the tenant converges", async || {
        let status = reconciler
            .clone()
            .get_status(v1::GetStatusRequest {
                tenant: "acme".into(),
            })
            .await
            .ok()?
            .into_inner()
            .status?;
        (status.items_by_state.get("CREATED") == Some(&6)).then_some(())
    })
    .await;
    assert_eq!(recorder.received().len(), 6);

    // What a plain client sees when it opens Connect on the wrong replica.
    let mut configurators = v1::configurators_client::ConfiguratorsClient::with_interceptor(
        replicas.channel(other).await,
        api::Bearer::new(&token),
    );
    let register = v1::AgentMessage {
        message: Some(v1::agent_message::Message::Register(v1::Register {
            tenant: "acme".into(),
            agent_id: "plain".into(),
            protocol_version: reconciled_tests::proto::PROTOCOL_VERSION,
            item_types: vec![v1::ItemTypeSpec {
                item_type: "u".into(),
                ..Default::default()
            }],
            ..Default::default()
        })),
    };
    let refused = configurators
        .connect(tokio_stream::iter([register]))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert_eq!(error_reason(&refused).as_deref(), Some("NOT_OWNER"));
    assert_eq!(
        error_metadata(&refused, "owner"),
        Some(replicas.servers[owner].addr().to_string())
    );
    agent.stop().await.expect("the agent stops");
}

#[tokio::test]
async fn a_joining_replica_takes_its_share_by_clean_hand_offs_one_tenant_at_a_time() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let mut replicas = Replicas::start(&etcd, 2).await;
    let names: Vec<String> = (0..12).map(|i| format!("t{i:02}")).collect();
    let mut tokens = Vec::new();
    for name in &names {
        let token = replicas.create_tenant(0, name).await;
        api::reconciler(&replicas.channel(1).await, &token)
            .submit_intent(api::submit(name, chain(4, 1)))
            .await
            .expect("submits");
        tokens.push(token);
    }
    let before: Vec<String> = {
        let mut owners = Vec::new();
        for name in &names {
            owners.push(replicas.owner(0, name).await);
        }
        owners
    };

    let metrics = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        probe.local_addr().expect("address").to_string()
    };
    // Tenant ids are handed out from 1 in creation order. The new replica
    // listens where placement gives it at least one of them: with a free
    // port it wins none about one run in 130.
    let ids: Vec<u64> = (1..=names.len() as u64).collect();
    let joined = replicas
        .add_winning_one_of(&ids, &["--metrics-listen", &metrics])
        .await;
    let addresses: Vec<String> = replicas
        .servers
        .iter()
        .map(|server| server.addr().to_string())
        .collect();
    let expected: Vec<String> = ids
        .iter()
        .map(|&id| {
            placement::owner_of(id, addresses.iter().map(String::as_str))
                .expect("a replica")
                .to_owned()
        })
        .collect();
    for (index, name) in names.iter().enumerate() {
        let owner = replicas
            .wait_for_owner(0, name, |owner| owner == expected[index])
            .await;
        // Only the tenants the new replica wins move, and they move to it.
        if owner != before[index] {
            assert_eq!(owner, addresses[joined], "{name}");
        }
        // Nothing was lost on the way.
        let graph = api::reconciler(&replicas.channel(joined).await, &tokens[index])
            .get_graph(v1::GetGraphRequest {
                tenant: name.clone(),
                view: v1::GraphView::Intended.into(),
                ..Default::default()
            })
            .await
            .expect("GetGraph")
            .into_inner();
        assert_eq!((graph.generation, graph.intended.len()), (1, 4), "{name}");
    }
    let moved = expected
        .iter()
        .filter(|owner| **owner == addresses[joined])
        .count();
    assert!(moved > 0, "the new replica wins some tenants: {expected:?}");

    let text = scrape(&metrics).await;
    assert_eq!(
        sample(&text, "reconciled_cluster_tenants_owned"),
        moved as f64,
        "{text}"
    );
    assert_eq!(
        sample(&text, "reconciled_cluster_adoptions_total"),
        moved as f64
    );
    assert!(sample(&text, "reconciled_cluster_lease_renewals_total") >= 0.0);
    assert!(text.contains("reconciled_etcd_request_seconds_bucket{kind=\"commit\""));
    let keys = owner_keys(&etcd, &replicas.prefix).await;
    assert_eq!(keys.len(), names.len());
}

async fn scrape(addr: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("metrics endpoint reachable");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .expect("request sent");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response read");
    response
}

fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
}

#[tokio::test]
async fn tenants_are_created_rotated_and_deleted_through_any_replica() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let replicas = Replicas::start(&etcd, 2).await;

    // Two replicas creating the same name at once: one wins.
    let (first, second) = {
        let (a, b) = (replicas.channel(0).await, replicas.channel(1).await);
        let admin = replicas.admin_token();
        let create = |channel| async move {
            api::tenants(&channel, admin)
                .create_tenant(v1::CreateTenantRequest {
                    name: "same".into(),
                    limits: None,
                })
                .await
        };
        tokio::join!(create(a), create(b))
    };
    let codes: Vec<Code> = [&first, &second]
        .iter()
        .map(|answer| answer.as_ref().map_or_else(|s| s.code(), |_| Code::Ok))
        .collect();
    assert!(
        codes.contains(&Code::Ok) && codes.contains(&Code::AlreadyExists),
        "{first:?} / {second:?}"
    );

    let token = replicas.create_tenant(0, "acme").await;
    let owner = replicas
        .index_of(&replicas.owner(0, "acme").await)
        .expect("a replica");
    let other = 1 - owner;
    let status_with = |token: String, via: usize| {
        let replicas = &replicas;
        async move {
            api::reconciler(&replicas.channel(via).await, &token)
                .get_status(v1::GetStatusRequest {
                    tenant: "acme".into(),
                })
                .await
        }
    };
    let rotated = api::tenants(&replicas.channel(other).await, replicas.admin_token())
        .rotate_token(v1::RotateTokenRequest {
            name: "acme".into(),
        })
        .await
        .expect("RotateToken through the other replica")
        .into_inner()
        .token;
    for via in [owner, other] {
        // A token this replica does not know yet waits for its directory
        // to catch up with etcd: the new one is accepted at once.
        status_with(rotated.clone(), via)
            .await
            .expect("the new token is accepted at once everywhere");
        eventually("the old token is refused everywhere", async || {
            let old = status_with(token.clone(), via).await;
            old.err().filter(|s| s.code() == Code::Unauthenticated)
        })
        .await;
    }

    let last_revision = api::revision_of(&replicas.channel(owner).await, &rotated, "acme").await;
    api::tenants(&replicas.channel(other).await, replicas.admin_token())
        .delete_tenant(v1::DeleteTenantRequest {
            name: "acme".into(),
        })
        .await
        .expect("DeleteTenant through the other replica");
    for via in [owner, other] {
        let gone = replicas.tenant(via, "acme").await.expect_err("deleted");
        assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
    }
    eventually("the owner key is released", async || {
        (owner_keys(&etcd, &replicas.prefix).await.len() == 1).then_some(())
    })
    .await;
    // The deletion left its name a revision floor past its last revision.
    let store = EtcdStore::open(EtcdOptions {
        endpoints: etcd.endpoints(),
        prefix: replicas.prefix.clone(),
        ..EtcdOptions::default()
    })
    .expect("opens");
    let floor_key = keys::revision_floor_key("acme");
    let floor = store
        .get(&floor_key)
        .expect("read")
        .and_then(|value| Some(u64::from_be_bytes(value.try_into().ok()?)))
        .expect("a floor of 8 bytes");
    assert!(floor > last_revision, "{floor} > {last_revision}");
    // The name is free again; the new tenant counts past the floor and
    // clears it.
    let token = replicas.create_tenant(other, "acme").await;
    let first = api::revision_of(&replicas.channel(other).await, &token, "acme").await;
    assert!(first >= floor, "{first} >= {floor}");
    assert_eq!(store.get(&floor_key).expect("read"), None);
}

#[tokio::test]
async fn a_tenant_created_through_one_replica_is_served_through_another_at_once() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let replicas = Replicas::start(&etcd, 3).await;
    let mut channels = Vec::new();
    for via in 0..3 {
        channels.push(replicas.channel(via).await);
    }
    // A controller behind a load balancer: create through one replica,
    // submit and read through the next, with no pause between.
    for i in 0..12 {
        let name = format!("lb{i}");
        let token = replicas.create_tenant(i % 3, &name).await;
        let next = &channels[(i + 1) % 3];
        api::reconciler(next, &token)
            .submit_intent(api::submit(&name, chain(2, 1)))
            .await
            .unwrap_or_else(|status| panic!("{name} through the next replica: {status:?}"));
        api::reconciler(&channels[(i + 2) % 3], &token)
            .get_status(v1::GetStatusRequest { tenant: name })
            .await
            .expect("GetStatus through the third replica");
    }
    // Tokens nobody issued are still refused, promptly, on every replica,
    // a hundred at once: they share catch-ups with etcd.
    for channel in &channels {
        let started = std::time::Instant::now();
        let calls = (0..100).map(|i| async move {
            api::reconciler(channel, &format!("made-up-{i}"))
                .get_status(v1::GetStatusRequest {
                    tenant: "lb0".into(),
                })
                .await
        });
        let answers =
            tokio::time::timeout(Duration::from_secs(5), futures::future::join_all(calls))
                .await
                .expect("answered within 5 s");
        for answer in answers {
            let refused = answer.expect_err("an unknown token is refused");
            assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
        }
        println!("100 unknown tokens refused in {:?}", started.elapsed());
    }
}

/// The fleet groups of a WatchFleet stream until `Synced` (snapshot) or
/// until a group at `until` or later arrived.
async fn fleet_groups(
    replicas: &Replicas,
    via: usize,
    start: u64,
    until: Option<u64>,
) -> (Vec<v1::FleetEventGroup>, u64) {
    let mut stream = api::tenants(&replicas.channel(via).await, replicas.admin_token())
        .watch_fleet(v1::WatchFleetRequest {
            start_revision: start,
        })
        .await
        .expect("WatchFleet")
        .into_inner();
    let mut groups = Vec::new();
    loop {
        let message = tokio::time::timeout(DEADLINE, stream.message())
            .await
            .expect("a fleet message in time")
            .expect("the stream is healthy")
            .expect("the stream goes on");
        match message.message {
            Some(v1::watch_fleet_response::Message::Events(group)) => {
                let revision = group.revision;
                groups.push(group);
                if until.is_some_and(|until| revision >= until) {
                    return (groups, revision);
                }
            }
            Some(v1::watch_fleet_response::Message::Synced(synced)) if until.is_none() => {
                return (groups, synced.revision);
            }
            Some(v1::watch_fleet_response::Message::Bookmark(bookmark))
                if until.is_some_and(|until| bookmark.revision >= until) =>
            {
                return (groups, bookmark.revision);
            }
            _ => {}
        }
    }
}

#[tokio::test]
async fn the_fleet_stream_has_one_order_on_every_replica_and_resumes_on_another() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let replicas = Replicas::start(&etcd, 3).await;
    for i in 0..4 {
        let name = format!("t{i}");
        let token = replicas.create_tenant(i % 3, &name).await;
        // No agent: the tenant's conditions change (waiting for one).
        // Through replica 0 whoever created the tenant: a replica that
        // does not know a token yet catches up with etcd before refusing.
        api::reconciler(&replicas.channel(0).await, &token)
            .submit_intent(api::submit(&name, chain(2, 1)))
            .await
            .expect("submits");
    }
    let (snapshot, synced) = fleet_groups(&replicas, 0, 0, None).await;
    let tenants: HashSet<String> = snapshot
        .iter()
        .flat_map(|group| group.events.iter().map(|event| event.tenant.clone()))
        .collect();
    assert_eq!(tenants.len(), 4, "{snapshot:?}");

    // The history from the first revision is the same sequence on every
    // replica, revisions strictly increasing.
    let (mut from_one, _) = fleet_groups(&replicas, 1, 1, Some(synced)).await;
    let (mut from_two, _) = fleet_groups(&replicas, 2, 1, Some(synced)).await;
    // Only what happened up to the snapshot (later changes may come in).
    from_one.retain(|group| group.revision <= synced);
    from_two.retain(|group| group.revision <= synced);
    assert_eq!(from_one, from_two);
    assert!(
        from_one
            .windows(2)
            .all(|pair| pair[0].revision < pair[1].revision),
        "{from_one:?}"
    );
    // A watcher resuming in the middle on another replica gets the rest.
    let middle = from_one[from_one.len() / 2].revision;
    let (mut resumed, _) = fleet_groups(&replicas, 0, middle, Some(synced)).await;
    resumed.retain(|group| group.revision <= synced);
    let rest: Vec<_> = from_one
        .iter()
        .filter(|group| group.revision > middle)
        .cloned()
        .collect();
    assert_eq!(resumed, rest);
}

#[tokio::test]
async fn a_replica_is_not_ready_until_it_has_joined() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let mut replicas = Replicas::start(&etcd, 1).await;
    let token = replicas.create_tenant(0, "acme").await;
    let live_id = replicas.servers[0].addr().to_string();

    // Same replica id as the live one: it cannot join while that one
    // holds the id.
    let mut waiting = ServerProcess::start(
        replicas
            .options()
            .arg("--replica-id")
            .arg(&live_id)
            .without_waiting_for_serving(),
    )
    .await
    .expect("starts");
    let health = |server: &ServerProcess| {
        let endpoint = server.endpoint();
        async move {
            let channel = tonic::transport::Endpoint::from_shared(endpoint)
                .expect("uri")
                .connect()
                .await
                .expect("connects");
            HealthClient::new(channel)
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .expect("answers")
                .into_inner()
                .status()
        }
    };
    assert_eq!(health(&waiting).await, ServingStatus::NotServing);

    // The live one leaves: the waiting one joins, loads and serves.
    replicas.servers[0].terminate().await.expect("stops");
    eventually("the waiting replica is ready", async || {
        (health(&waiting).await == ServingStatus::Serving).then_some(())
    })
    .await;
    let channel = waiting.channel().await.expect("connects");
    api::reconciler(&channel, &token)
        .get_status(v1::GetStatusRequest {
            tenant: "acme".into(),
        })
        .await
        .expect("the tenant is served");
    waiting.terminate().await.expect("stops");
    replicas.servers.clear();
}
