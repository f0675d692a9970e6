//! Replicas on etcd under failure, with real etcd and real replicas, under
//! load (writers submitting intents through any replica, SDK agents
//! applying operations, watchers following every tenant):
//!
//! - `kill -9` of the replica serving a tenant, 20 rounds: another replica
//!   serves it within 10 s; no acknowledged intent or result is lost; the
//!   watchers resume with no gap and no duplicate.
//! - An owner paused with SIGSTOP past its lease: another replica takes
//!   over, and when the old one wakes up not one stale write lands (etcd's
//!   history of the tenant's record never goes back), and it drops the
//!   tenants it lost.
//! - One member of a three-member etcd killed: nothing is lost, and
//!   nothing stalls beyond a leader election.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reconciled_client::agent::CancellationToken;
use reconciled_client::agent::{Agent, AgentEvent, TypeSpec};
use reconciled_tests::agents::{DEADLINE, Recorder, RunningAgent, item_needing, poll};
use reconciled_tests::api;
use reconciled_tests::cluster::{Replicas, TEST_LEASE_SECS};
use reconciled_tests::etcd::EtcdCluster;
use reconciled_tests::proto::v1;
use reconciled_tests::watch::{Watcher, watch_request};
use serde_json::json;
use tonic::transport::{Channel, Endpoint};

/// Items per tenant: small tenants keep the rounds quick.
const ITEMS: usize = 6;

/// The failover budget of DESIGN section 11.
const FAILOVER_BUDGET: Duration = Duration::from_secs(10);

fn chain(round: u32) -> Vec<v1::Item> {
    (0..ITEMS)
        .map(|i| {
            let requires = (i > 0).then(|| format!("t/i{}", i - 1));
            let requires: Vec<&str> = requires.iter().map(String::as_str).collect();
            item_needing("t", &format!("i{i}"), json!({ "round": round }), &requires)
        })
        .collect()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Lazily connected channels to every replica.
fn channels(endpoints: &[String]) -> Vec<Channel> {
    endpoints
        .iter()
        .map(|endpoint| {
            Endpoint::from_shared(endpoint.clone())
                .expect("uri")
                .connect_timeout(Duration::from_secs(1))
                .connect_lazy()
        })
        .collect()
}

/// What the load saw of one tenant.
#[derive(Debug, Default)]
struct Ledger {
    /// Acknowledged SubmitIntents: (generation, round).
    acked: Vec<(u64, u32)>,
    /// Revisions the watcher received, in order.
    watched: Vec<u64>,
    /// When the last acknowledgement came.
    last_ack: Option<Instant>,
    /// The longest time between two acknowledgements.
    longest_gap: Duration,
}

/// Writers and watchers on some tenants, and a fleet watcher, through
/// the replicas in turn.
struct Load {
    ledgers: HashMap<String, Arc<Mutex<Ledger>>>,
    /// Fleet revisions the fleet watcher received, in order.
    fleet: Arc<Mutex<Vec<u64>>>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(endpoints: &[String], tenants: &[(String, String)], admin: &str) -> Self {
        let stop = CancellationToken::new();
        let mut ledgers = HashMap::new();
        let fleet = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = vec![tokio::spawn(follow_fleet(
            channels(endpoints),
            admin.to_owned(),
            fleet.clone(),
            stop.clone(),
        ))];
        for (name, token) in tenants {
            let ledger = Arc::new(Mutex::new(Ledger::default()));
            ledgers.insert(name.clone(), ledger.clone());
            tasks.push(tokio::spawn(write(
                channels(endpoints),
                name.clone(),
                token.clone(),
                ledger.clone(),
                stop.clone(),
            )));
            tasks.push(tokio::spawn(follow(
                channels(endpoints),
                name.clone(),
                token.clone(),
                ledger,
                stop.clone(),
            )));
        }
        Self {
            ledgers,
            fleet,
            stop,
            tasks,
        }
    }

    /// Waits until every tenant has `more` acknowledgements beyond now.
    async fn progress(&self, more: usize) {
        let targets: Vec<(Arc<Mutex<Ledger>>, usize)> = self
            .ledgers
            .values()
            .map(|ledger| (ledger.clone(), lock(ledger).acked.len() + more))
            .collect();
        let deadline = tokio::time::Instant::now() + DEADLINE * 2;
        for (ledger, target) in targets {
            while lock(&ledger).acked.len() < target {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the writers made no progress: {:?}",
                    lock(&ledger)
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Stops the load; returns each tenant's ledger and the fleet
    /// revisions the fleet watcher saw.
    async fn stop(self) -> (HashMap<String, Ledger>, Vec<u64>) {
        self.stop.cancel();
        for task in self.tasks {
            task.await.expect("a load task did not panic");
        }
        let ledgers = self
            .ledgers
            .into_iter()
            .map(|(name, ledger)| {
                let ledger = std::mem::take(&mut *lock(&ledger));
                (name, ledger)
            })
            .collect();
        let fleet = std::mem::take(&mut *lock(&self.fleet));
        (ledgers, fleet)
    }
}

/// Submits round after round through the replicas in turn (moving on
/// after every third acknowledgement, and after every failure), retrying
/// what fails; records what was acknowledged.
async fn write(
    channels: Vec<Channel>,
    tenant: String,
    token: String,
    ledger: Arc<Mutex<Ledger>>,
    stop: CancellationToken,
) {
    let mut round = 1;
    let mut via = rand::random_range(0..channels.len());
    while !stop.is_cancelled() {
        let mut request = tonic::Request::new(api::submit(&tenant, chain(round)));
        // A replica that is paused never answers: give up on it soon.
        request.set_timeout(Duration::from_secs(3));
        let answer = api::reconciler(&channels[via], &token)
            .submit_intent(request)
            .await;
        match answer {
            Ok(reply) => {
                let now = Instant::now();
                {
                    let mut ledger = lock(&ledger);
                    if let Some(last) = ledger.last_ack {
                        ledger.longest_gap = ledger.longest_gap.max(now - last);
                    }
                    ledger.last_ack = Some(now);
                    ledger.acked.push((reply.into_inner().generation, round));
                }
                round += 1;
                if round % 3 == 0 {
                    via = (via + 1) % channels.len();
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            Err(_) => {
                via = (via + 1) % channels.len();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Watches the tenant from its first revision through random replicas,
/// resuming from the last revision after every failure; checks that
/// revisions only grow.
async fn follow(
    channels: Vec<Channel>,
    tenant: String,
    token: String,
    ledger: Arc<Mutex<Ledger>>,
    stop: CancellationToken,
) {
    // From the tenant's oldest revision until the first group arrives.
    let mut resume = None;
    let mut via = rand::random_range(0..channels.len());
    while !stop.is_cancelled() {
        // Every stream that ends resumes through the next replica.
        via = (via + 1) % channels.len();
        let mut client = api::reconciler(&channels[via], &token);
        let opened = match resume {
            Some(resume) => Watcher::open(&mut client, watch_request(&tenant, resume)).await,
            None => Watcher::open_from_oldest(&mut client, &tenant).await,
        };
        let Ok(mut watcher) = opened else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let mut taken = 0;
        loop {
            // A stream that stays silent past a bookmark interval (5 s) is
            // stuck on a replica that stopped answering: resume elsewhere.
            let next = tokio::select! {
                () = stop.cancelled() => return,
                next = tokio::time::timeout(Duration::from_secs(7), watcher.next()) => next,
            };
            let Ok(next) = next else { break };
            for group in &watcher.seen.groups[taken..] {
                let mut ledger = lock(&ledger);
                if let Some(last) = ledger.watched.last() {
                    assert!(
                        group.revision > *last,
                        "{tenant}: revision {} after {last}: a duplicate or out of order",
                        group.revision
                    );
                }
                ledger.watched.push(group.revision);
                resume = Some(group.revision);
            }
            taken = watcher.seen.groups.len();
            if !matches!(next, Ok(Some(_))) {
                break;
            }
        }
    }
}

/// Follows `WatchFleet` from its first revision through the replicas in
/// turn, resuming from the last revision after every failure; checks that
/// revisions only grow.
async fn follow_fleet(
    channels: Vec<Channel>,
    admin: String,
    seen: Arc<Mutex<Vec<u64>>>,
    stop: CancellationToken,
) {
    let mut resume = 1;
    let mut via = 0;
    while !stop.is_cancelled() {
        via = (via + 1) % channels.len();
        let opened = api::tenants(&channels[via], &admin)
            .watch_fleet(v1::WatchFleetRequest {
                start_revision: resume,
            })
            .await;
        let Ok(stream) = opened else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let mut stream = stream.into_inner();
        loop {
            let message = tokio::select! {
                () = stop.cancelled() => return,
                message = tokio::time::timeout(Duration::from_secs(7), stream.message()) => message,
            };
            let Ok(Ok(Some(message))) = message else {
                break;
            };
            match message.message {
                Some(v1::watch_fleet_response::Message::Events(group)) if !group.continued => {
                    let mut seen = lock(&seen);
                    if let Some(last) = seen.last() {
                        assert!(
                            group.revision > *last,
                            "fleet revision {} after {last}: a duplicate or out of order",
                            group.revision
                        );
                    }
                    seen.push(group.revision);
                    resume = group.revision;
                }
                Some(v1::watch_fleet_response::Message::Bookmark(bookmark)) => {
                    resume = resume.max(bookmark.revision);
                }
                _ => {}
            }
        }
    }
}

/// `WatchFleet` from `start_revision`, through `channel`.
async fn open_fleet(
    channel: &Channel,
    admin: &str,
    start_revision: u64,
) -> tonic::Streaming<v1::WatchFleetResponse> {
    api::tenants(channel, admin)
        .watch_fleet(v1::WatchFleetRequest { start_revision })
        .await
        .expect("WatchFleet opens")
        .into_inner()
}

/// The next message of a healthy fleet stream, within the deadline.
async fn next_fleet_message(
    stream: &mut tonic::Streaming<v1::WatchFleetResponse>,
) -> Option<v1::watch_fleet_response::Message> {
    tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("a fleet message in time")
        .expect("the fleet stream is healthy")
        .expect("the fleet stream goes on")
        .message
}

/// The fleet's kept history from its first revision through `through`,
/// read through `channel`.
async fn fleet_history(channel: &Channel, admin: &str, through: u64) -> Vec<u64> {
    let mut stream = open_fleet(channel, admin, 1).await;
    let mut revisions = Vec::new();
    loop {
        match next_fleet_message(&mut stream).await {
            Some(v1::watch_fleet_response::Message::Events(group)) => {
                if group.revision > through {
                    return revisions;
                }
                if !group.continued {
                    revisions.push(group.revision);
                }
            }
            Some(v1::watch_fleet_response::Message::Bookmark(bookmark))
                if bookmark.revision >= through =>
            {
                return revisions;
            }
            _ => {}
        }
    }
}

/// The whole event history of a tenant, read from its first revision.
async fn history(channel: &Channel, tenant: &str, token: &str) -> Vec<(u64, Vec<v1::Event>)> {
    let mut client = api::reconciler(channel, token);
    let status = api::status_of(channel, token, tenant).await;
    let mut watcher = Watcher::open_from_oldest(&mut client, tenant)
        .await
        .expect("Watch from the oldest revision");
    watcher
        .groups_through(status.revision)
        .await
        .into_iter()
        .map(|group| (group.revision, group.events))
        .collect()
}

/// Checks a tenant's history against what the load saw: every
/// acknowledged intent is in it, and the watcher saw it with no gap.
fn check_ledger(tenant: &str, ledger: &Ledger, history: &[(u64, Vec<v1::Event>)]) {
    let generations: HashSet<u64> = history
        .iter()
        .flat_map(|(_, events)| events)
        .filter_map(|event| match &event.body {
            Some(v1::event::Body::IntentChanged(changed)) => Some(changed.generation),
            _ => None,
        })
        .collect();
    for (generation, round) in &ledger.acked {
        assert!(
            generations.contains(generation),
            "{tenant}: acknowledged generation {generation} (round {round}) is not in the history"
        );
    }
    let last = ledger.watched.last().copied().unwrap_or(0);
    let expected: Vec<u64> = history
        .iter()
        .map(|(revision, _)| *revision)
        .filter(|revision| *revision <= last)
        .collect();
    assert_eq!(
        ledger.watched, expected,
        "{tenant}: the resumed watch missed or repeated revisions"
    );
}

/// Agents' events, collected as they come.
struct AgentLog {
    events: Arc<Mutex<Vec<AgentEvent>>>,
    task: tokio::task::JoinHandle<()>,
}

impl AgentLog {
    fn collect(agent: &Agent) -> Self {
        let mut receiver = agent.events();
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let task = tokio::spawn(async move {
            while let Ok(event) = receiver.recv().await {
                lock(&sink).push(event);
            }
        });
        Self { events, task }
    }

    /// No operation was ever delivered again after its result was
    /// acknowledged: an acknowledged result was never lost.
    fn check_no_acknowledged_result_lost(&self, tenant: &str) {
        let events = lock(&self.events);
        let mut acked: HashSet<(String, u32)> = HashSet::new();
        for event in events.iter() {
            match event {
                AgentEvent::ResultAcked { op_id, attempt, .. } => {
                    acked.insert((op_id.clone(), *attempt));
                }
                AgentEvent::OperationReceived { op_id, attempt, .. } => assert!(
                    !acked.contains(&(op_id.clone(), *attempt)),
                    "{tenant}: operation {op_id} attempt {attempt} came again after its result was acknowledged"
                ),
                _ => {}
            }
        }
        assert!(!acked.is_empty(), "{tenant}: the agent applied nothing");
    }
}

/// Starts an SDK agent for each tenant that knows every replica.
fn agents(endpoints: &[String], tenants: &[(String, String)]) -> Vec<(RunningAgent, AgentLog)> {
    tenants
        .iter()
        .map(|(name, token)| {
            let agent = Agent::builder(endpoints[0].clone(), name, token)
                .endpoints(endpoints[1..].to_vec())
                .agent_id(format!("agent-{name}"))
                .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
                .item_type(TypeSpec::new("t").max_in_flight(8), Recorder::new())
                .build()
                .expect("the agent's settings are valid");
            let log = AgentLog::collect(&agent);
            (RunningAgent::run(agent), log)
        })
        .collect()
}

/// Waits until tenant `name` shows its last round applied everywhere.
async fn wait_converged(channel: &Channel, name: &str, token: &str, generation: u64) {
    let deadline = tokio::time::Instant::now() + DEADLINE * 2;
    let mut client = api::reconciler(channel, token);
    loop {
        let status = client
            .get_status(v1::GetStatusRequest {
                tenant: name.into(),
            })
            .await
            .ok()
            .and_then(|reply| reply.into_inner().status);
        if let Some(status) = &status
            && status.generation >= generation
            && status.observed_generation == status.generation
            && status.items_by_state.get("CREATED") == Some(&(ITEMS as u64))
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} did not converge: {status:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The etcd key of tenant `id`'s record under `prefix`.
fn record_key(prefix: &str, id: u64) -> Vec<u8> {
    let mut key = format!("{prefix}store/data/").into_bytes();
    key.push(0x01);
    key.extend_from_slice(&id.to_be_bytes());
    key.push(0x01);
    key
}

/// Every value tenant `id`'s record has had, oldest first, from etcd's
/// history: the revision it carried. A stale write (a replica that lost
/// the tenant writing with its old state) would make it go back.
async fn record_revisions(etcd: &EtcdCluster, prefix: &str, id: u64) -> Vec<u64> {
    let mut client = etcd.client().await.expect("etcd client");
    let key = record_key(prefix, id);
    let now = client
        .get(key.clone(), None)
        .await
        .expect("reads the record")
        .kvs()
        .first()
        .expect("the record exists")
        .mod_revision();
    let mut stream = client
        .watch(
            key,
            Some(etcd_client::WatchOptions::new().with_start_revision(1)),
        )
        .await
        .expect("replays the record's history");
    let mut revisions = Vec::new();
    loop {
        let reply = tokio::time::timeout(DEADLINE, stream.message())
            .await
            .expect("history in time")
            .expect("the history stream is healthy")
            .expect("the history goes on");
        let mut reached = false;
        for event in reply.events() {
            if let Some(kv) = event.kv() {
                reached |= kv.mod_revision() >= now;
                if event.event_type() == etcd_client::EventType::Put {
                    let record: reconciled::tenant::TenantRecord =
                        reconciled::tenant::record::decode(kv.key(), kv.value())
                            .expect("a tenant record");
                    revisions.push(record.revision);
                }
            }
        }
        if reached {
            return revisions;
        }
    }
}

/// Asserts that a record's revision only grows. A stale write would carry
/// an older owner's revision; one revision twice would be a commit that
/// landed twice (an attempt sent again after a late answer, which every
/// key's compare now refuses: docs/scale-out.md, "Fencing").
fn assert_strictly_increasing(what: &str, values: &[u64]) {
    if let Some(pair) = values.windows(2).find(|pair| pair[0] >= pair[1]) {
        panic!(
            "{what} went from {} to {}: a stale or repeated write landed ({values:?})",
            pair[0], pair[1]
        );
    }
}

/// The index of the etcd member that leads the cluster.
async fn leader_index(etcd: &EtcdCluster) -> usize {
    for (index, endpoint) in etcd.endpoints().iter().enumerate() {
        let mut client = etcd_client::Client::connect([endpoint.clone()], None)
            .await
            .expect("connects to a member");
        let status = client.status().await.expect("a member's status");
        let member = status.header().map_or(0, |header| header.member_id());
        if status.leader() == member {
            return index;
        }
    }
    panic!("no etcd member leads the cluster");
}

/// The log tails of every replica but `victim`, for a failover that took
/// too long: what the survivors did (claims, loads, etcd retries) says why.
fn survivors_logs(replicas: &Replicas, victim: usize) -> String {
    (0..replicas.servers.len())
        .filter(|&index| index != victim)
        .map(|index| {
            format!(
                "--- replica {index} ---\n{}",
                replicas.servers[index].log_tail()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn kill_9_of_an_owner_under_load_loses_nothing_over_twenty_rounds() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let mut replicas = Replicas::start(&etcd, 3).await;
    let mut tenants = Vec::new();
    for i in 0..3 {
        let name = format!("t{i}");
        let token = replicas.create_tenant(i, &name).await;
        tenants.push((name, token));
    }
    let endpoints = replicas.endpoints();
    let running = agents(&endpoints, &tenants);
    let load = Load::start(&endpoints, &tenants, replicas.admin_token());
    load.progress(3).await;

    let mut failovers = Vec::new();
    for round in 0..20 {
        let (name, token) = &tenants[round % tenants.len()];
        let owner = replicas.owner(0, name).await;
        let victim = replicas.index_of(&owner).expect("served by a replica");
        let survivor = (victim + 1) % replicas.servers.len();
        let channel = replicas.channel(survivor).await;
        let killed = Instant::now();
        replicas.servers[victim].kill9().expect("SIGKILL");
        // Served again: a call through a survivor answers, by a new owner.
        loop {
            let mut request = tonic::Request::new(v1::GetStatusRequest {
                tenant: name.clone(),
            });
            request.set_timeout(FAILOVER_BUDGET);
            let answer = api::reconciler(&channel, token).get_status(request).await;
            if let Ok(reply) = answer
                && reply
                    .into_inner()
                    .status
                    .is_some_and(|status| status.owner != owner)
            {
                break;
            }
            assert!(
                killed.elapsed() < FAILOVER_BUDGET,
                "round {round}: {name} not served again within {FAILOVER_BUDGET:?}\n{}",
                survivors_logs(&replicas, victim)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let took = killed.elapsed();
        failovers.push(took);
        assert!(
            took < FAILOVER_BUDGET,
            "round {round}: failover took {took:?}\n{}",
            survivors_logs(&replicas, victim)
        );
        replicas.servers[victim]
            .start_again()
            .await
            .expect("the killed replica starts again");
        load.progress(2).await;
    }
    failovers.sort();
    eprintln!(
        "failover (kill -9 to serving again) over {} rounds: min {:?}, median {:?}, max {:?}",
        failovers.len(),
        failovers[0],
        failovers[failovers.len() / 2],
        failovers[failovers.len() - 1]
    );

    let (ledgers, fleet) = load.stop().await;
    let channel = replicas.channel(0).await;
    for (index, (name, token)) in tenants.iter().enumerate() {
        let ledger = &ledgers[name];
        let last = ledger.acked.last().map_or(0, |(generation, _)| *generation);
        wait_converged(&channel, name, token, last).await;
        check_ledger(name, ledger, &history(&channel, name, token).await);
        let revisions = record_revisions(&etcd, &replicas.prefix, index as u64 + 1).await;
        assert_strictly_increasing(&format!("{name}'s record revision"), &revisions);
    }
    // The fleet watcher, resumed on another replica after every kill, saw
    // the fleet's history with no gap and no duplicate.
    let last = fleet.last().copied().expect("the fleet watcher saw events");
    assert_eq!(
        fleet,
        fleet_history(&channel, replicas.admin_token(), last).await,
        "the resumed fleet watch missed or repeated revisions"
    );
    for ((agent, log), (name, _)) in running.into_iter().zip(&tenants) {
        agent.stop().await.expect("the agent stops");
        log.task.abort();
        log.check_no_acknowledged_result_lost(name);
    }
}

#[tokio::test]
async fn a_paused_owner_writes_nothing_once_another_took_its_tenant_and_drops_it() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    // Agents notice a silent (paused) server after the session lease.
    let replicas = Replicas::start_with(
        &etcd,
        2,
        TEST_LEASE_SECS,
        &["--lease-secs", "4", "--heartbeat-interval-secs", "1"],
    )
    .await;
    let token = replicas.create_tenant(0, "acme").await;
    let tenants = vec![("acme".to_owned(), token.clone())];
    let owner = replicas.owner(0, "acme").await;
    let paused = replicas.index_of(&owner).expect("a replica");
    let other = 1 - paused;
    let endpoints = replicas.endpoints();
    let running = agents(&endpoints, &tenants);
    let load = Load::start(&endpoints, &tenants, replicas.admin_token());
    load.progress(5).await;

    let pid = nix::unistd::Pid::from_raw(
        i32::try_from(replicas.servers[paused].pid().expect("runs")).expect("a pid"),
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    // Past its lease: the other replica takes the tenant over and serves
    // the writers.
    replicas
        .wait_for_owner(other, "acme", |owner| {
            owner == replicas.servers[other].addr().to_string()
        })
        .await;
    load.progress(5).await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");

    // The old owner finds out and stops serving the tenant.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let log = replicas.servers[paused].log_tail();
        if log.contains("Stopped serving every tenant.") || log.contains("fenced out") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the resumed replica did not drop its tenants:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // It joins again as a new member (and placement may well give it the
    // tenant back, by a clean hand-off); meanwhile the tenant is served.
    replicas.wait_for_owner(paused, "acme", |_| true).await;
    load.progress(5).await;

    let (ledgers, _) = load.stop().await;
    let channel = replicas.channel(other).await;
    let ledger = &ledgers["acme"];
    let last = ledger.acked.last().map_or(0, |(generation, _)| *generation);
    wait_converged(&channel, "acme", &token, last).await;
    check_ledger("acme", ledger, &history(&channel, "acme", &token).await);
    let revisions = record_revisions(&etcd, &replicas.prefix, 1).await;
    assert_strictly_increasing("the record's revision", &revisions);
    for (agent, log) in running {
        agent.stop().await.expect("the agent stops");
        log.task.abort();
        log.check_no_acknowledged_result_lost("acme");
    }
}

#[tokio::test]
async fn killing_one_etcd_member_under_load_loses_nothing_and_stalls_only_for_an_election() {
    let mut etcd = EtcdCluster::three()
        .await
        .expect("a three-member etcd starts");
    // The default lease TTL: a leader election must not cost the leases.
    let replicas = Replicas::start_with(&etcd, 2, 5, &[]).await;
    let mut tenants = Vec::new();
    for i in 0..2 {
        let name = format!("t{i}");
        let token = replicas.create_tenant(i, &name).await;
        tenants.push((name, token));
    }
    let endpoints = replicas.endpoints();
    let running = agents(&endpoints, &tenants);
    let load = Load::start(&endpoints, &tenants, replicas.admin_token());
    load.progress(5).await;
    let owners_before: BTreeMap<String, String> = {
        let mut owners = BTreeMap::new();
        for (name, _) in &tenants {
            owners.insert(name.clone(), replicas.owner(0, name).await);
        }
        owners
    };

    // The leader: its loss costs an election.
    let leader = leader_index(&etcd).await;
    etcd.kill_member(leader).expect("kills the etcd leader");
    load.progress(10).await;

    let (ledgers, _) = load.stop().await;
    let channel = replicas.channel(0).await;
    for (name, token) in &tenants {
        let ledger = &ledgers[name];
        eprintln!(
            "{name}: longest time between two acknowledged intents: {:?}",
            ledger.longest_gap
        );
        assert!(
            ledger.longest_gap < Duration::from_secs(4),
            "{name} stalled for {:?}",
            ledger.longest_gap
        );
        let last = ledger.acked.last().map_or(0, |(generation, _)| *generation);
        wait_converged(&channel, name, token, last).await;
        check_ledger(name, ledger, &history(&channel, name, token).await);
        // No replica lost its lease over it: the tenants stayed put.
        assert_eq!(replicas.owner(0, name).await, owners_before[name]);
    }
    for server in &replicas.servers {
        let log = server.log_tail();
        assert!(
            !log.contains("Stopped serving every tenant"),
            "a replica lost its lease when one etcd member died:\n{log}"
        );
    }
    for ((agent, log), (name, _)) in running.into_iter().zip(&tenants) {
        agent.stop().await.expect("the agent stops");
        log.task.abort();
        log.check_no_acknowledged_result_lost(name);
    }
}

/// Opens a Watch of `tenant` from a snapshot through `channel` and reads
/// it up to its `Synced`.
async fn synced_watch(channel: &Channel, tenant: &str, token: &str) -> Watcher {
    let mut client = api::reconciler(channel, token);
    let mut watcher = Watcher::open(&mut client, watch_request(tenant, 0))
        .await
        .expect("Watch opens");
    while watcher.seen.synced.is_none() {
        watcher
            .next()
            .await
            .expect("the snapshot streams")
            .expect("the stream goes on to Synced");
    }
    watcher
}

/// Reads `watcher` until its stream ends, within `within`; returns the
/// status it ended with (`None`: it ended cleanly).
async fn end_of(watcher: &mut Watcher, within: Duration) -> Option<tonic::Status> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let next = tokio::time::timeout_at(deadline, watcher.next())
            .await
            .unwrap_or_else(|_| panic!("the watch did not end within {within:?}"));
        match next {
            Ok(Some(_)) => {}
            Ok(None) => return None,
            Err(status) => return Some(status),
        }
    }
}

/// Creates tenant `acme` on two replicas and opens a synced Watch of it
/// through the replica that does not own it; returns the owner's index
/// and the watch.
async fn watch_through_the_other_replica(replicas: &Replicas) -> (usize, Watcher) {
    let token = replicas.create_tenant(0, "acme").await;
    let owner = replicas.owner(0, "acme").await;
    let owner = replicas.index_of(&owner).expect("a replica");
    let channel = replicas.channel(1 - owner).await;
    (owner, synced_watch(&channel, "acme", &token).await)
}

/// A Watch through a replica that forwards it to the tenant's owner ends
/// with UNAVAILABLE (which every client resumes after) when that owner is
/// killed, not with the INTERNAL of a broken HTTP/2 relay.
#[tokio::test]
async fn a_watch_forwarded_to_an_owner_that_dies_ends_unavailable() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let mut replicas = Replicas::start(&etcd, 2).await;
    let (victim, mut watcher) = watch_through_the_other_replica(&replicas).await;
    replicas.servers[victim].kill9().expect("SIGKILL");
    let status = end_of(&mut watcher, FAILOVER_BUDGET).await;
    assert_eq!(
        status.as_ref().map(tonic::Status::code),
        Some(tonic::Code::Unavailable),
        "a forwarded watch whose owner died must end UNAVAILABLE (resume anywhere): {status:?}"
    );
}

/// The same when the owner is paused: the relay times out (HTTP/2
/// keepalive, about a lease TTL) and the watch ends UNAVAILABLE within the
/// failover budget.
#[tokio::test]
async fn a_watch_forwarded_to_an_owner_that_is_paused_ends_unavailable() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let replicas = Replicas::start(&etcd, 2).await;
    let (paused, mut watcher) = watch_through_the_other_replica(&replicas).await;
    let pid = nix::unistd::Pid::from_raw(
        i32::try_from(replicas.servers[paused].pid().expect("runs")).expect("a pid"),
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    let status = end_of(&mut watcher, FAILOVER_BUDGET).await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    assert_eq!(
        status.as_ref().map(tonic::Status::code),
        Some(tonic::Code::Unavailable),
        "a forwarded watch whose owner was paused must end UNAVAILABLE: {status:?}"
    );
}

/// A tenant whose records a new owner cannot read (a bad restore) is
/// quarantined by that owner after a failover; deleting it through any
/// replica removes it from the fleet stream too (the stream follows the
/// tenants' directory entries), as it does from `ListTenants`.
#[tokio::test]
async fn a_quarantined_tenant_deleted_after_a_failover_leaves_the_fleet() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let mut replicas = Replicas::start(&etcd, 2).await;
    replicas.create_tenant(0, "bad").await;
    let owner = replicas.owner(0, "bad").await;
    let victim = replicas.index_of(&owner).expect("a replica");
    let survivor = 1 - victim;
    let admin = replicas.admin_token().to_owned();
    replicas.first_pass_committed(victim, "bad").await;
    // A torn write of the tenant's record; the owner, which holds the
    // tenant in memory, is then killed: the survivor loads it from etcd.
    let mut client = etcd.client().await.expect("etcd client");
    client
        .put(
            record_key(&replicas.prefix, 1),
            b"\xffnot a record".to_vec(),
            None,
        )
        .await
        .expect("writes the record");
    replicas.servers[victim].kill9().expect("SIGKILL");
    let channel = replicas.channel(survivor).await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let answer = api::tenants(&channel, &admin)
            .get_tenant(v1::GetTenantRequest { name: "bad".into() })
            .await;
        let quarantined = match &answer {
            Ok(tenant) => !tenant.get_ref().quarantine_error.is_empty(),
            Err(status) => status.message().contains("quarantined"),
        };
        if quarantined {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the survivor did not quarantine the tenant: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    api::tenants(&channel, &admin)
        .delete_tenant(v1::DeleteTenantRequest { name: "bad".into() })
        .await
        .expect("the quarantined tenant is deleted");
    let listed = api::tenants(&channel, &admin)
        .list_tenants(v1::ListTenantsRequest::default())
        .await
        .expect("ListTenants")
        .into_inner();
    assert!(
        listed.tenants.iter().all(|tenant| tenant.name != "bad"),
        "ListTenants still lists the deleted tenant: {listed:?}"
    );
    // The fleet stream says the same, from a snapshot, once it has
    // followed etcd past the deletion.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let mut stream = api::tenants(&channel, &admin)
            .watch_fleet(v1::WatchFleetRequest { start_revision: 0 })
            .await
            .expect("WatchFleet")
            .into_inner();
        let mut snapshot = Vec::new();
        loop {
            let message = tokio::time::timeout(DEADLINE, stream.message())
                .await
                .expect("a fleet message in time")
                .expect("the fleet stream is healthy")
                .expect("the fleet stream goes on");
            match message.message {
                Some(v1::watch_fleet_response::Message::Events(group)) => {
                    snapshot.extend(group.events);
                }
                Some(v1::watch_fleet_response::Message::Synced(_)) => break,
                _ => {}
            }
        }
        if snapshot
            .iter()
            .all(|event| event.tenant != "bad" || event.deleted)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the fleet stream still lists the deleted tenant: {snapshot:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A replica stopped with SIGTERM (a rolling upgrade) ends the watches it
/// relays to other replicas at once with UNAVAILABLE, as it ends its own:
/// they do not hold its shutdown for the whole grace period, during which
/// the tenants it serves would wait for their new owner.
#[tokio::test]
async fn a_replica_stopping_ends_the_watches_it_relays_at_once() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let mut replicas = Replicas::start(&etcd, 2).await;
    // A tenant replica 1 serves, watched through replica 0.
    let mut watched = None;
    for i in 0..20 {
        let name = format!("t{i}");
        let token = replicas.create_tenant(0, &name).await;
        if replicas.index_of(&replicas.owner(0, &name).await) == Some(1) {
            watched = Some((name, token));
            break;
        }
    }
    let (name, token) = watched.expect("replica 1 serves one of 20 tenants");
    let channel = replicas.channel(0).await;
    let mut watcher = synced_watch(&channel, &name, &token).await;
    let pid = nix::unistd::Pid::from_raw(
        i32::try_from(replicas.servers[0].pid().expect("runs")).expect("a pid"),
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    // Well within the shutdown grace period (10 s).
    let status = end_of(&mut watcher, Duration::from_secs(3)).await;
    assert_eq!(
        status.as_ref().map(tonic::Status::code),
        Some(tonic::Code::Unavailable),
        "a relayed watch must end UNAVAILABLE when the relaying replica stops: {status:?}"
    );
    replicas.servers[0]
        .terminate()
        .await
        .expect("the replica exits");
}

/// A claim that landed although its replica never learnt it did (etcd's
/// answer to the claim was lost: the replica logs the failure and goes
/// on) names that replica under its live lease, so no other replica may
/// claim the tenant. The replica itself must see the claim is its own and
/// that it does not serve the tenant, and put that right; otherwise the
/// tenant goes unserved for as long as the replica lives.
#[tokio::test]
async fn a_claim_whose_answer_was_lost_does_not_leave_the_tenant_unserved() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let replicas = Replicas::start(&etcd, 2).await;
    let mut client = etcd.client().await.expect("etcd client");
    // The state such a claim leaves: the owner key of the next tenant (id
    // 1) holding replica 0's id, under replica 0's lease.
    let replica = replicas.servers[0].addr().to_string();
    let member = client
        .get(format!("{}members/{replica}", replicas.prefix), None)
        .await
        .expect("reads the member key")
        .kvs()
        .first()
        .expect("replica 0 is a member")
        .lease();
    client
        .put(
            format!("{}owners/{:016x}", replicas.prefix, 1),
            replica.clone(),
            Some(etcd_client::PutOptions::new().with_lease(member)),
        )
        .await
        .expect("writes the claim");
    let admin = replicas.admin_token().to_owned();
    let created = api::tenants(&replicas.channel(1).await, &admin)
        .create_tenant(v1::CreateTenantRequest {
            name: "acme".into(),
            ..Default::default()
        })
        .await
        .expect("CreateTenant")
        .into_inner();
    let token = created.token;
    // Served, through either replica, within the failover budget.
    let started = Instant::now();
    for via in [0, 1] {
        let channel = replicas.channel(via).await;
        loop {
            let mut request = tonic::Request::new(v1::GetStatusRequest {
                tenant: "acme".into(),
            });
            request.set_timeout(FAILOVER_BUDGET);
            let answer = api::reconciler(&channel, &token).get_status(request).await;
            if answer.is_ok() {
                break;
            }
            assert!(
                started.elapsed() < FAILOVER_BUDGET,
                "acme is not served through replica {via}: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A DeleteTenant that its owner was still carrying out when it lost the
/// tenant (paused past its lease while the owner finished a large
/// commit) wrote nothing: it is answered UNAVAILABLE (retry; any replica
/// forwards it to the new owner), never INTERNAL, and a retry deletes it.
/// Since nothing was deleted, the streams opened with the tenant's token
/// end as the tenant moves (UNAVAILABLE, NOT_OWNER for the agent), never
/// UNAUTHENTICATED, and the token goes on working at the new owner (until
/// 2026-12-03 the deletion ended them UNAUTHENTICATED before it even
/// queued its tombstone).
#[tokio::test]
async fn a_delete_its_owner_lost_the_tenant_under_is_answered_unavailable_and_revokes_nothing() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let replicas = Replicas::start_with(
        &etcd,
        2,
        TEST_LEASE_SECS,
        &["--max-tenant-message-bytes", "16777216"],
    )
    .await;
    let token = replicas.create_tenant(0, "big").await;
    let owner = replicas.owner(0, "big").await;
    let paused = replicas.index_of(&owner).expect("a replica");
    let other = 1 - paused;
    let channel = replicas.channel(paused).await;
    let admin = replicas.admin_token().to_owned();
    let name = NameProbe::new(&etcd, &replicas.prefix, "big");
    let watch = watch_in_background(synced_watch(&channel, "big", &token).await, name.clone());
    let session = raw_session(&channel, &token, "big", name.clone()).await;
    // A large intent keeps the owner busy for a while (its commit is
    // staged: etcd shows the staging header)...
    let submitting = submit_large(&channel, "big", &token, 1);
    wait_staged(&etcd, &replicas.prefix).await;
    // ...while the deletion waits for it: the server logs that it began.
    let deleting = {
        let mut tenants = api::tenants(&channel, &admin);
        tokio::spawn(async move {
            tenants
                .delete_tenant(v1::DeleteTenantRequest { name: "big".into() })
                .await
        })
    };
    let log = replicas.servers[paused].log_path();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("Deleting a tenant")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the deletion did not begin: {}",
            replicas.servers[paused].log_tail()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pid = nix::unistd::Pid::from_raw(
        i32::try_from(replicas.servers[paused].pid().expect("runs")).expect("a pid"),
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    replicas
        .wait_for_owner(other, "big", |owner| {
            owner == replicas.servers[other].addr().to_string()
        })
        .await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    let deleted = deleting.await.expect("joined");
    let _ = submitting.await.expect("joined");
    match &deleted {
        Ok(_) => panic!("the deletion cannot have landed: another replica took the tenant"),
        Err(status) => assert_eq!(
            status.code(),
            tonic::Code::Unavailable,
            "a deletion that wrote nothing must say retry: {status:?}"
        ),
    }
    // Its streams ended as the tenant moved, not as if it were deleted.
    let (ended, _) = watch.await.expect("the watch task");
    assert_eq!(
        ended.as_ref().map(tonic::Status::code),
        Some(tonic::Code::Unavailable),
        "a deletion that wrote nothing ends no stream as deleted: {ended:?}"
    );
    let (ended, _) = session.await.expect("the session task");
    assert_eq!(
        (ended.code(), api::error_reason(&ended).as_deref()),
        (tonic::Code::Unavailable, Some("NOT_OWNER")),
        "a deletion that wrote nothing ends no session as deleted: {ended:?}"
    );
    // The tenant is still there, served by the other replica with its
    // token, and a retry through any replica deletes it.
    replicas
        .tenant(other, "big")
        .await
        .expect("the tenant still exists");
    api::reconciler(&replicas.channel(other).await, &token)
        .get_status(v1::GetStatusRequest {
            tenant: "big".into(),
        })
        .await
        .expect("the token of a tenant whose deletion failed still works");
    api::tenants(&replicas.channel(paused).await, &admin)
        .delete_tenant(v1::DeleteTenantRequest { name: "big".into() })
        .await
        .expect("the retried deletion succeeds");
}

/// Opens a raw agent session (Connect) for `tenant` with `token` through
/// `channel` and waits until it is registered. The session answers the
/// server's heartbeats until the server ends it; joining it gives the
/// status it ended with and what `probe`'s key held in etcd at that
/// moment.
async fn raw_session(
    channel: &Channel,
    token: &str,
    tenant: &str,
    probe: NameProbe,
) -> tokio::task::JoinHandle<(tonic::Status, Option<Vec<u8>>)> {
    use reconciled_tests::api::Bearer;
    use reconciled_tests::proto::v1::configurators_client::ConfiguratorsClient;
    let (outgoing, receiver) = tokio::sync::mpsc::channel(16);
    let register = v1::AgentMessage {
        message: Some(v1::agent_message::Message::Register(v1::Register {
            tenant: tenant.into(),
            agent_id: "raw-agent".into(),
            protocol_version: reconciled_tests::proto::PROTOCOL_VERSION,
            item_types: vec![v1::ItemTypeSpec {
                item_type: "t".into(),
                ..Default::default()
            }],
            ..Default::default()
        })),
    };
    outgoing.send(register).await.expect("queue open");
    let mut incoming = ConfiguratorsClient::with_interceptor(channel.clone(), Bearer::new(token))
        .connect(tokio_stream::wrappers::ReceiverStream::new(receiver))
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
    tokio::spawn(async move {
        loop {
            match incoming.message().await {
                Err(status) => return (status, probe.value().await),
                Ok(None) => panic!("the session ended without a status"),
                Ok(Some(message)) => {
                    if let Some(v1::server_message::Message::Heartbeat(_)) = message.message {
                        let beat = v1::AgentMessage {
                            message: Some(v1::agent_message::Message::Heartbeat(v1::Heartbeat {})),
                        };
                        let _ = outgoing.send(beat).await;
                    }
                }
            }
        }
    })
}

/// Reads a synced `watcher` in a task until its stream ends; joining it
/// gives the status it ended with (`None`: cleanly) and what `probe`'s
/// key held in etcd at that moment.
fn watch_in_background(
    mut watcher: Watcher,
    probe: NameProbe,
) -> tokio::task::JoinHandle<(Option<tonic::Status>, Option<Vec<u8>>)> {
    tokio::spawn(async move {
        let ended = loop {
            match watcher.next().await {
                Ok(Some(_)) => {}
                Ok(None) => break None,
                Err(status) => break Some(status),
            }
        };
        (ended, probe.value().await)
    })
}

/// Reads one store key of a tenant from etcd: its name (which a
/// deletion's tombstone removes in the same commit) or its directory
/// entry (which holds its token's hash).
#[derive(Clone)]
struct NameProbe {
    endpoints: Vec<String>,
    key: Vec<u8>,
}

impl NameProbe {
    /// Tenant `tenant`'s name key.
    fn new(etcd: &EtcdCluster, prefix: &str, tenant: &str) -> Self {
        Self::of(etcd, prefix, b"\x00tenant_name\x00", tenant)
    }

    /// Tenant `tenant`'s directory entry.
    fn entry(etcd: &EtcdCluster, prefix: &str, tenant: &str) -> Self {
        Self::of(etcd, prefix, b"\x00tenant_entry\x00", tenant)
    }

    fn of(etcd: &EtcdCluster, prefix: &str, kind: &[u8], tenant: &str) -> Self {
        let mut key = format!("{prefix}store/data/").into_bytes();
        key.extend_from_slice(kind);
        key.extend_from_slice(tenant.as_bytes());
        Self {
            endpoints: etcd.endpoints(),
            key,
        }
    }

    /// The key's value now, if it exists.
    async fn value(&self) -> Option<Vec<u8>> {
        let mut client = etcd_client::Client::connect(self.endpoints.clone(), None)
            .await
            .expect("etcd client");
        client
            .get(self.key.clone(), None)
            .await
            .expect("reads the key")
            .kvs()
            .first()
            .map(|kv| kv.value().to_vec())
    }
}

/// The token hash a directory entry holds.
fn token_hash_of(entry: Option<&[u8]>) -> Option<String> {
    let entry: serde_json::Value = serde_json::from_slice(entry?).expect("an entry is JSON");
    entry["token_hash"].as_str().map(str::to_owned)
}

/// Waits until a staged commit is under way (etcd shows its header).
async fn wait_staged(etcd: &EtcdCluster, prefix: &str) {
    let mut client = etcd.client().await.expect("etcd client");
    let staging = format!("{prefix}store/staging/");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let found = client
            .get(
                staging.clone(),
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_keys_only(),
                ),
            )
            .await
            .expect("lists staging headers")
            .count();
        if found > 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the large commit was never staged"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Submits 10,000 items of 900 bytes (a staged commit of about 9 MiB,
/// which keeps the tenant's owner busy for a while) in a task.
fn submit_large(
    channel: &Channel,
    tenant: &str,
    token: &str,
    round: u32,
) -> tokio::task::JoinHandle<Result<tonic::Response<v1::SubmitIntentResponse>, tonic::Status>> {
    let payload = "x".repeat(900);
    let items: Vec<v1::Item> = (0..10_000)
        .map(|i| {
            item_needing(
                "t",
                &format!("n{i:05}"),
                json!({ "payload": payload, "round": round }),
                &[],
            )
        })
        .collect();
    let mut reconciler = api::reconciler(channel, token);
    let request = api::submit(tenant, items);
    tokio::spawn(async move { reconciler.submit_intent(request).await })
}

/// On etcd, RotateToken and DeleteTenant end the Watch and agent Connect
/// streams opened with the old token with UNAUTHENTICATED (an admin's
/// Watch of a deleted tenant with NOT_FOUND), as docs/watch.md says, and
/// only once the change is committed: while the owner still finishes a
/// large commit ahead of it, the streams stay open. (A deletion ended them
/// before its tombstone was even queued until 2026-12-03.)
#[tokio::test]
async fn a_rotation_or_deletion_on_etcd_ends_the_old_tokens_streams_only_once_committed() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let replicas = Replicas::start_with(
        &etcd,
        1,
        TEST_LEASE_SECS,
        &[
            "--max-tenant-message-bytes",
            "16777216",
            reconciled_tests::NO_BYTE_BUDGET,
        ],
    )
    .await;
    let token = replicas.create_tenant(0, "big").await;
    let channel = replicas.channel(0).await;
    let admin = replicas.admin_token().to_owned();
    let name = NameProbe::new(&etcd, &replicas.prefix, "big");
    let entry = NameProbe::entry(&etcd, &replicas.prefix, "big");

    // A rotation queued behind a large commit.
    let old_hash = token_hash_of(entry.value().await.as_deref()).expect("an entry");
    let watch = watch_in_background(synced_watch(&channel, "big", &token).await, entry.clone());
    let session = raw_session(&channel, &token, "big", entry.clone()).await;
    let submitting = submit_large(&channel, "big", &token, 1);
    wait_staged(&etcd, &replicas.prefix).await;
    let new_token = api::rotate_token(&channel, &admin, "big").await;
    submitting
        .await
        .expect("joined")
        .expect("the intent submitted before the rotation is accepted");
    let (ended, seen) = watch.await.expect("the watch task");
    let ended = ended.expect("the watch ends with a status");
    assert_eq!(ended.code(), tonic::Code::Unauthenticated, "{ended:?}");
    let seen = token_hash_of(seen.as_deref());
    assert!(
        seen.is_some() && seen.as_deref() != Some(old_hash.as_str()),
        "the rotation ended the watch before its new token hash was committed"
    );
    let (ended, seen) = session.await.expect("the session task");
    assert_eq!(ended.code(), tonic::Code::Unauthenticated, "{ended:?}");
    let seen = token_hash_of(seen.as_deref());
    assert!(
        seen.is_some() && seen.as_deref() != Some(old_hash.as_str()),
        "the rotation ended the agent's session before its new token hash was committed"
    );
    let refused = api::reconciler(&channel, &token)
        .get_status(v1::GetStatusRequest {
            tenant: "big".into(),
        })
        .await
        .expect_err("the old token is refused");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    // A deletion queued behind a large commit.
    let watch = watch_in_background(
        synced_watch(&channel, "big", &new_token).await,
        name.clone(),
    );
    let admin_watch =
        watch_in_background(synced_watch(&channel, "big", &admin).await, name.clone());
    let session = raw_session(&channel, &new_token, "big", name.clone()).await;
    let mut submitting = submit_large(&channel, "big", &new_token, 2);
    tokio::select! {
        () = wait_staged(&etcd, &replicas.prefix) => {}
        submitted = async { (&mut submitting).await } => panic!("the second intent was answered before it was staged: {submitted:?}"),
    }
    api::tenants(&channel, &admin)
        .delete_tenant(v1::DeleteTenantRequest { name: "big".into() })
        .await
        .expect("DeleteTenant");
    let _ = submitting.await.expect("joined");
    let (watch, admin_watch, session) = (
        watch.await.expect("the watch task"),
        admin_watch.await.expect("the admin's watch task"),
        session.await.expect("the session task"),
    );
    // All three at once, so that a failure shows them all.
    let outcomes = format!(
        "watch {:?} (name still in etcd: {}), admin's watch {:?} (name still in etcd: {}), session {:?} (name still in etcd: {})",
        watch.0,
        watch.1.is_some(),
        admin_watch.0,
        admin_watch.1.is_some(),
        session.0,
        session.1.is_some()
    );
    let (ended, seen) = watch;
    let ended = ended.expect("the watch ends with a status");
    assert_eq!(ended.code(), tonic::Code::Unauthenticated, "{outcomes}");
    assert!(
        seen.is_none(),
        "the deletion ended the tenant's watch before its tombstone was committed: {outcomes}"
    );
    let (ended, seen) = admin_watch;
    let ended = ended.expect("the admin's watch ends with a status");
    assert_eq!(ended.code(), tonic::Code::NotFound, "{outcomes}");
    assert!(
        seen.is_none(),
        "the deletion ended the admin's watch before its tombstone was committed"
    );
    let (ended, seen) = session;
    assert_eq!(ended.code(), tonic::Code::Unauthenticated, "{ended:?}");
    assert!(
        seen.is_none(),
        "the deletion ended the agent's session before its tombstone was committed"
    );
}

/// Reads a fleet stream until an event of tenant `tenant` satisfies
/// `accept`, within the deadline; returns that event.
async fn fleet_event(
    stream: &mut tonic::Streaming<v1::WatchFleetResponse>,
    tenant: &str,
    mut accept: impl FnMut(&v1::FleetEvent) -> bool,
) -> v1::FleetEvent {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let message = tokio::time::timeout_at(deadline, stream.message())
            .await
            .unwrap_or_else(|_| panic!("no accepted fleet event of {tenant} within {DEADLINE:?}"))
            .expect("the fleet stream is healthy")
            .expect("the fleet stream goes on");
        if let Some(v1::watch_fleet_response::Message::Events(group)) = message.message
            && let Some(event) = group
                .events
                .into_iter()
                .find(|event| event.tenant == tenant && accept(event))
        {
            return event;
        }
    }
}

/// Opens a fleet stream from a snapshot and reads the snapshot.
async fn fleet_snapshot(
    channel: &Channel,
    admin: &str,
) -> (
    tonic::Streaming<v1::WatchFleetResponse>,
    Vec<v1::FleetEvent>,
) {
    let mut stream = open_fleet(channel, admin, 0).await;
    let mut snapshot = Vec::new();
    loop {
        match next_fleet_message(&mut stream).await {
            Some(v1::watch_fleet_response::Message::Events(group)) => {
                snapshot.extend(group.events);
            }
            Some(v1::watch_fleet_response::Message::Synced(_)) => return (stream, snapshot),
            _ => {}
        }
    }
}

/// A tenant whose records the replica that takes it over cannot read is
/// quarantined there, and every replica's fleet stream says so with the
/// error, as one server's does (live, and in a snapshot), and so do
/// `ListTenants` and `GetTenant` through any replica. Until 2026-12-03
/// only the replica holding the tenant knew: the fleet stream showed the
/// tenant's last conditions as if it were served.
#[tokio::test]
async fn a_tenant_quarantined_on_a_replica_shows_its_error_in_every_replicas_fleet_stream() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let mut replicas = Replicas::start(&etcd, 3).await;
    replicas.create_tenant(0, "bad").await;
    let owner = replicas.owner(0, "bad").await;
    let victim = replicas.index_of(&owner).expect("a replica");
    let survivors: Vec<usize> = (0..3).filter(|index| *index != victim).collect();
    let admin = replicas.admin_token().to_owned();
    // Fleet streams through the survivors, opened before the failover.
    // A replica learns of a tenant another one created from etcd's watch,
    // a moment later: a snapshot taken before that is opened again.
    let lists_the_tenant = |(_, snapshot): &(_, Vec<v1::FleetEvent>)| {
        snapshot.iter().any(|event| event.tenant == "bad")
    };
    let mut streams = Vec::new();
    for &index in &survivors {
        let channel = replicas.channel(index).await;
        let (stream, snapshot) = poll(
            &format!("the tenant in replica {index}'s fleet snapshot"),
            || fleet_snapshot(&channel, &admin),
            lists_the_tenant,
        )
        .await;
        assert!(
            snapshot
                .iter()
                .any(|event| event.tenant == "bad" && event.quarantine_error.is_empty()),
            "{snapshot:?}"
        );
        streams.push(stream);
    }
    // A torn write of the tenant's record; its owner, which holds the
    // tenant in memory, is then killed: a survivor loads it from etcd.
    let mut client = etcd.client().await.expect("etcd client");
    client
        .put(
            record_key(&replicas.prefix, 1),
            b"\xffnot a record".to_vec(),
            None,
        )
        .await
        .expect("writes the record");
    replicas.servers[victim].kill9().expect("SIGKILL");
    let mut errors = Vec::new();
    for stream in &mut streams {
        let event = fleet_event(stream, "bad", |event| !event.quarantine_error.is_empty()).await;
        assert!(!event.deleted && event.conditions.is_empty(), "{event:?}");
        errors.push(event.quarantine_error);
    }
    assert_eq!(errors[0], errors[1], "every replica shows the same error");
    for &index in &survivors {
        let channel = replicas.channel(index).await;
        let (_, snapshot) = fleet_snapshot(&channel, &admin).await;
        let listed: Vec<&v1::FleetEvent> = snapshot
            .iter()
            .filter(|event| event.tenant == "bad")
            .collect();
        assert!(
            listed.len() == 1 && listed[0].quarantine_error == errors[0],
            "replica {index}'s fleet snapshot: {snapshot:?}"
        );
        let tenants = api::tenants(&channel, &admin)
            .list_tenants(v1::ListTenantsRequest::default())
            .await
            .expect("ListTenants")
            .into_inner();
        let bad = tenants
            .tenants
            .iter()
            .find(|tenant| tenant.name == "bad")
            .expect("ListTenants lists the quarantined tenant");
        // The owner's refusal quotes the error when the catalog lags.
        assert!(
            bad.quarantine_error.contains(&errors[0]),
            "replica {index}: {bad:?}"
        );
        let got = replicas.tenant(index, "bad").await;
        let quarantined = match &got {
            Ok(tenant) => !tenant.quarantine_error.is_empty(),
            Err(status) => status.message().contains("quarantined"),
        };
        assert!(quarantined, "replica {index}'s GetTenant: {got:?}");
    }
}

/// Reads `watcher` until it has a complete group at `revision` or later,
/// within the deadline; panics with the status if the stream ends first.
async fn watch_reaches(watcher: &mut Watcher, revision: u64, what: &str) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while watcher.seen.resume_from < revision {
        let next = tokio::time::timeout_at(deadline, watcher.next())
            .await
            .unwrap_or_else(|_| panic!("{what} did not reach revision {revision} in time"));
        match next {
            Ok(Some(_)) => {}
            Ok(None) => panic!("{what} ended cleanly before revision {revision}"),
            Err(status) => panic!("{what} ended before revision {revision}: {status:?}"),
        }
    }
}

/// etcd paused as a whole (every member) for less than the replicas'
/// lease: commits wait and then land, and nothing else happens (DESIGN
/// section 11: only a replica that *loses* its lease stops serving). No
/// tenant moves, no Watch (on the owner or relayed), fleet stream or agent
/// session ends, and an intent submitted during the pause is
/// acknowledged once etcd answers again.
#[tokio::test]
async fn etcd_paused_for_less_than_the_lease_ends_no_stream_and_moves_no_tenant() {
    const LEASE_SECS: u64 = 6;
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let replicas = Replicas::start_with(&etcd, 2, LEASE_SECS, &[]).await;
    let token = replicas.create_tenant(0, "acme").await;
    let owner = replicas.owner(0, "acme").await;
    let owner_index = replicas.index_of(&owner).expect("a replica");
    let other = 1 - owner_index;
    let admin = replicas.admin_token().to_owned();
    let owner_channel = replicas.channel(owner_index).await;
    let other_channel = replicas.channel(other).await;
    let probe = NameProbe::new(&etcd, &replicas.prefix, "acme");
    let mut on_owner = synced_watch(&owner_channel, "acme", &token).await;
    let mut relayed = synced_watch(&other_channel, "acme", &token).await;
    let session = raw_session(&owner_channel, &token, "acme", probe).await;
    let (mut fleet, _) = fleet_snapshot(&other_channel, &admin).await;

    let pids: Vec<nix::unistd::Pid> = etcd
        .member_pids()
        .into_iter()
        .map(|pid| nix::unistd::Pid::from_raw(i32::try_from(pid).expect("a pid")))
        .collect();
    for pid in &pids {
        nix::sys::signal::kill(*pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    }
    let submitting = {
        let mut reconciler = api::reconciler(&other_channel, &token);
        let request = api::submit("acme", vec![item_needing("t", "a", json!({}), &[])]);
        tokio::spawn(async move { reconciler.submit_intent(request).await })
    };
    // The fault: etcd silent for half the lease (a replica renews every
    // third of it, so its lease is valid for at least two thirds more).
    tokio::time::sleep(Duration::from_secs(LEASE_SECS / 2)).await;
    for pid in &pids {
        nix::sys::signal::kill(*pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    }
    let submitted = tokio::time::timeout(DEADLINE, submitting)
        .await
        .expect("the intent is answered in time")
        .expect("joined")
        .expect("the intent submitted during the pause is acknowledged")
        .into_inner();
    watch_reaches(&mut on_owner, submitted.revision, "the owner's watch").await;
    watch_reaches(&mut relayed, submitted.revision, "the relayed watch").await;
    assert!(
        !session.is_finished(),
        "the agent's session ended: {:?}",
        session.await
    );
    // The fleet stream goes on too: its next message (an event or a
    // bookmark) arrives, no error.
    let next = tokio::time::timeout(DEADLINE, fleet.message())
        .await
        .expect("a fleet message in time");
    assert!(
        matches!(next, Ok(Some(_))),
        "the fleet stream ended: {next:?}"
    );
    assert_eq!(
        replicas.owner(other, "acme").await,
        owner,
        "the tenant moved though no lease ran out"
    );
    let log = replicas.servers[owner_index].log_tail();
    assert!(
        !log.contains("Stopped serving every tenant"),
        "the owner dropped its tenants: {log}"
    );
}

/// A replica that quarantined a tenant and then lost its lease (paused
/// past it) no longer holds the tenant: another replica may have claimed
/// it meanwhile, and loaded it if its records were repaired. Once the
/// first replica is back, calls through it reach the tenant as it is now,
/// not the quarantine it found before its lease ran out.
#[tokio::test]
async fn a_replica_that_lost_its_lease_forgets_the_tenants_it_had_quarantined() {
    let etcd = EtcdCluster::single().await.expect("etcd starts");
    let mut replicas = Replicas::start(&etcd, 2).await;
    let token = replicas.create_tenant(0, "bad").await;
    let owner = replicas.owner(0, "bad").await;
    let victim = replicas.index_of(&owner).expect("a replica");
    let keeper = 1 - victim;
    let admin = replicas.admin_token().to_owned();
    replicas.first_pass_committed(victim, "bad").await;
    let mut client = etcd.client().await.expect("etcd client");
    let key = record_key(&replicas.prefix, 1);
    let good = client
        .get(key.clone(), None)
        .await
        .expect("reads the record")
        .kvs()
        .first()
        .map(|kv| kv.value().to_vec())
        .expect("the record exists");
    // A torn record; the owner dies, the other replica quarantines it.
    client
        .put(key.clone(), b"\xffnot a record".to_vec(), None)
        .await
        .expect("writes the record");
    replicas.servers[victim].kill9().expect("SIGKILL");
    let quarantined_through = |index: usize| {
        let replicas = &replicas;
        async move {
            match replicas.tenant(index, "bad").await {
                Ok(tenant) => !tenant.quarantine_error.is_empty(),
                Err(status) => status.message().contains("quarantined"),
            }
        }
    };
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !quarantined_through(keeper).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the tenant was not quarantined"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The record is repaired (a restore with etcdctl), the dead replica
    // comes back, and the quarantining one is paused past its lease: the
    // other one claims the tenant and serves it.
    client
        .put(key.clone(), good, None)
        .await
        .expect("repairs the record");
    replicas.servers[victim]
        .start_again()
        .await
        .expect("the replica starts again");
    let pid = nix::unistd::Pid::from_raw(
        i32::try_from(replicas.servers[keeper].pid().expect("runs")).expect("a pid"),
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let mut request = tonic::Request::new(v1::GetStatusRequest {
            tenant: "bad".into(),
        });
        request.set_timeout(Duration::from_secs(2));
        if api::reconciler(&replicas.channel(victim).await, &token)
            .get_status(request)
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the repaired tenant is not served by the other replica"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    // Back, the paused replica must not answer for the tenant as
    // quarantined: it is served.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let through_keeper = api::reconciler(&replicas.channel(keeper).await, &token)
            .get_status(v1::GetStatusRequest {
                tenant: "bad".into(),
            })
            .await;
        let listed = api::tenants(&replicas.channel(keeper).await, &admin)
            .list_tenants(v1::ListTenantsRequest::default())
            .await;
        let listed_quarantined = listed.as_ref().map_or(true, |listed| {
            listed
                .get_ref()
                .tenants
                .iter()
                .any(|tenant| tenant.name == "bad" && !tenant.quarantine_error.is_empty())
        });
        if through_keeper.is_ok() && !listed_quarantined {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replica that lost its lease still answers for the tenant it had quarantined: \
             GetStatus {through_keeper:?}, ListTenants {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
