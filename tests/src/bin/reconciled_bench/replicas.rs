//! `reconciled-bench replicas`: replicas on one etcd (DESIGN section 11),
//! measured against raw etcd transactions of the same bytes in the same
//! run, on one etcd member started for the run (loopback, fsync on,
//! default limits), with 1 and with 3 replicas:
//!
//! 1. **SubmitIntent**: `--tenants` clients, one per tenant, each on the
//!    replica `k mod N` (so with 3 replicas two calls in three are
//!    forwarded to the tenant's owner), submitting N changed items per
//!    request. Raw: as many writers, each putting its tenant's N intended
//!    records with plain transactions of at most 128 puts.
//! 2. **Operations through agents**: a tenant per SDK agent (every agent
//!    given every replica's address), each round changing every item of
//!    every tenant and waiting until all are applied (Modify operations,
//!    each acknowledged only once its result is committed). Raw: as many
//!    writers, each putting its tenant's current-item records of the round
//!    with transactions of at most 128 puts, the cheapest durable record
//!    of as many results.
//! 3. **Failover** (3 replicas, `--failover-rounds`): `kill -9` of the
//!    replica serving a tenant, under the agents' load, until every tenant
//!    it served is served again (a call through a survivor answers, from a
//!    new owner); the killed replica is started again between rounds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use clap::Args;
use etcd_client::Client;
use reconciled::graph::CurrentItem;
use reconciled::store::keys;
use reconciled::tenant::record::encode;
use reconciled_client::agent::{Agent, TypeSpec};
use reconciled_tests::NO_BYTE_BUDGET;
use reconciled_tests::agents::{Recorder, RunningAgent};
use reconciled_tests::api;
use reconciled_tests::cluster::Replicas;
use reconciled_tests::etcd::EtcdCluster;
use reconciled_tests::proto::v1;

use super::etcd::transactions;
use super::{
    ITEM_TYPE, MAX_SECONDS, Measurement, RAW_TENANT_ID, RawRecords, Run, Submitter, WriterRun,
    proto_items, report, subgraph_of, thousands,
};

/// The lease TTL of the replicas: the default.
const LEASE_SECS: u64 = 5;

/// Options of `reconciled-bench replicas`.
#[derive(Debug, Args)]
pub(super) struct ReplicasArgs {
    /// Items per SubmitIntent, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10,1000")]
    items: Vec<usize>,
    /// Tenants (and clients, and agents) of every run.
    #[arg(long, default_value_t = 6)]
    tenants: usize,
    /// Items per tenant of the operations runs.
    #[arg(long, default_value_t = 200)]
    operation_items: usize,
    /// Seconds each measurement runs.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Bytes of filler text in every item's properties.
    #[arg(long, default_value_t = 64)]
    padding: usize,
    /// Rounds of the failover measurement (0: none).
    #[arg(long, default_value_t = 20)]
    failover_rounds: usize,
}

/// One row of the throughput tables.
struct Row {
    what: String,
    replicas: usize,
    raw: f64,
    ours: f64,
    latency: String,
}

/// Runs the benchmark and prints its tables.
pub(super) fn replicas_benchmark(args: &ReplicasArgs) -> anyhow::Result<()> {
    ensure!((1..=64).contains(&args.tenants), "--tenants must be 1..=64");
    ensure!(
        (1..=MAX_SECONDS).contains(&args.seconds),
        "--seconds must be within 1..={MAX_SECONDS}"
    );
    let seconds = Duration::from_secs(args.seconds);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async {
        let etcd = EtcdCluster::single().await?;
        println!(
            "reconciled-bench replicas: sizes {:?}, {} tenants, {} items per tenant for operations, {} s per run, one etcd member at {}",
            args.items,
            args.tenants,
            args.operation_items,
            args.seconds,
            etcd.endpoints_arg()
        );
        let mut rows = Vec::new();
        let mut run = 0;
        for count in [1usize, 3] {
            let replicas = Replicas::start_with(&etcd, count, LEASE_SECS, &[NO_BYTE_BUDGET]).await;
            for &items in &args.items {
                run += 1;
                println!("\n## SubmitIntent, {items} items, {count} replica(s)");
                let records = RawRecords::build(items, args.tenants, args.padding)?;
                let raw = report(run_raw(&etcd, &records.per_client_rounds(), run, seconds).await?);
                let ours = report(
                    run_submits(&replicas, run, items, args.tenants, args.padding, seconds)
                        .await?,
                );
                rows.push(Row {
                    what: format!("SubmitIntent, {items} items/req"),
                    replicas: count,
                    raw: raw.items_per_second(),
                    ours: ours.items_per_second(),
                    latency: format!("{:.1} / {:.1}", ours.latency_ms(0.5), ours.latency_ms(0.99)),
                });
            }
            run += 1;
            println!("\n## Operations through agents, {count} replica(s)");
            let current = current_records(args.tenants, args.operation_items, args.padding)?;
            let raw = report(run_raw(&etcd, &current, run, seconds).await?);
            let (ops, per_round) =
                run_operations(&replicas, run, args.tenants, args.operation_items, seconds)
                    .await?;
            println!(
                "reconciled operations through agents: {} ops/s, {:.1} ms per round of {} operations",
                thousands(ops),
                per_round.as_secs_f64() * 1e3,
                args.tenants * args.operation_items
            );
            rows.push(Row {
                what: "operations through agents".to_owned(),
                replicas: count,
                raw: raw.items_per_second(),
                ours: ops,
                latency: format!("{:.1} per round", per_round.as_secs_f64() * 1e3),
            });
            if count == 3 && args.failover_rounds > 0 {
                let mut replicas = replicas;
                println!("\n## Failover, {} rounds", args.failover_rounds);
                let times = run_failover(&mut replicas, run, args.tenants, args.failover_rounds)
                    .await?;
                print_failover(&times);
            }
        }
        println!("\n## Replicas on etcd against raw etcd transactions (one member, loopback, same run)\n");
        println!("| workload | replicas | raw etcd (records/s) | reconciled (items or ops/s) | p50 / p99 (ms) | ratio |");
        println!("|---|---:|---:|---:|---:|---:|");
        for row in &rows {
            println!(
                "| {} | {} | {} | {} | {} | {:.2} |",
                row.what,
                row.replicas,
                thousands(row.raw),
                thousands(row.ours),
                row.latency,
                row.ours / row.raw.max(f64::MIN_POSITIVE)
            );
        }
        anyhow::Ok(())
    })
}

/// Per writer, two rounds of records to put (alternated).
type WriterRecords = Vec<[Vec<(Vec<u8>, Vec<u8>)>; 2]>;

impl RawRecords {
    /// Every client's two rounds of records.
    fn per_client_rounds(&self) -> WriterRecords {
        self.per_client.clone()
    }
}

/// The current-item records an operation's result commits, per tenant,
/// for two rounds: the applied value of every item, encoded by the
/// server's code.
fn current_records(tenants: usize, items: usize, padding: usize) -> anyhow::Result<WriterRecords> {
    (0..tenants)
        .map(|tenant| {
            let round = |round: u64| -> anyhow::Result<Vec<(Vec<u8>, Vec<u8>)>> {
                proto_items(tenant, items, round, padding)
                    .into_iter()
                    .enumerate()
                    .map(|(index, proto)| {
                        let item = reconciled::wire::item_from_proto(proto, index).map_err(
                            |violations| {
                                anyhow::anyhow!("benchmark item is invalid: {violations:?}")
                            },
                        )?;
                        let key = keys::current_item_key(RAW_TENANT_ID, ITEM_TYPE, item.name());
                        let value = encode(&CurrentItem::created(Arc::new(item), round))?;
                        Ok((key, value))
                    })
                    .collect()
            };
            Ok([round(1)?, round(2)?])
        })
        .collect()
}

/// One writer per entry of `records`, each putting its records (rounds
/// alternating) with plain transactions, for `seconds`.
async fn run_raw(
    etcd: &EtcdCluster,
    records: &WriterRecords,
    run: usize,
    seconds: Duration,
) -> anyhow::Result<Measurement> {
    let start = Instant::now();
    let mut writers = Vec::new();
    for (writer, rounds) in records.iter().enumerate() {
        let prefix = format!("/raw-{run}-{writer}/");
        let rounds: Vec<Vec<etcd_client::Txn>> = rounds
            .iter()
            .map(|records| transactions(&prefix, records))
            .collect();
        let client = Client::connect(etcd.endpoints(), None).await?;
        writers.push(tokio::spawn(async move {
            let mut run = WriterRun::default();
            let mut round = 0usize;
            while start.elapsed() < seconds {
                let began = Instant::now();
                for txn in &rounds[round % 2] {
                    client.kv_client().txn(txn.clone()).await?;
                }
                run.latencies.push(began.elapsed());
                round += 1;
            }
            run.finished = start.elapsed();
            anyhow::Ok(run)
        }));
    }
    let mut results = Vec::new();
    for writer in writers {
        results.push(writer.await.context("a raw writer panicked")?);
    }
    let run = Run::from_writers(results)?;
    Ok(Measurement {
        label: "raw etcd txns".to_owned(),
        items_per_request: records.first().map_or(0, |rounds| rounds[0].len()),
        bytes_per_request: records.first().map_or(0, |rounds| {
            rounds[1].iter().map(|(k, v)| k.len() + v.len()).sum()
        }),
        run,
        fsyncs: None,
    })
}

/// Creates `count` tenants named after `run`; returns names and tokens.
async fn tenants(
    replicas: &Replicas,
    run: usize,
    count: usize,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut created = Vec::new();
    for index in 0..count {
        let name = format!("bench{run}-{index}");
        let token = replicas
            .create_tenant(index % replicas.servers.len(), &name)
            .await;
        created.push((name, token));
    }
    Ok(created)
}

/// SubmitIntent from one client per tenant, client `k` on replica
/// `k mod N`, for `seconds`.
async fn run_submits(
    replicas: &Replicas,
    run: usize,
    items: usize,
    tenant_count: usize,
    padding: usize,
    seconds: Duration,
) -> anyhow::Result<Measurement> {
    let tenants = tenants(replicas, run, tenant_count).await?;
    let mut submitters = Vec::new();
    for (client, (tenant, token)) in tenants.iter().enumerate() {
        let channel = replicas.channel(client % replicas.servers.len()).await;
        let mut request = api::submit(tenant, proto_items(client, items, 0, padding));
        request.subgraph = subgraph_of(client);
        let mut submitter = Submitter {
            client: api::reconciler(&channel, token),
            request,
        };
        submitter.submit(0).await?;
        submitters.push(submitter);
    }
    let start = Instant::now();
    let tasks: Vec<_> = submitters
        .into_iter()
        .map(|mut submitter| {
            tokio::spawn(async move {
                let mut run = WriterRun::default();
                let mut round = 1;
                while start.elapsed() < seconds {
                    let began = Instant::now();
                    submitter.submit(round).await?;
                    run.latencies.push(began.elapsed());
                    round += 1;
                }
                run.finished = start.elapsed();
                anyhow::Ok(run)
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.context("a client panicked")?);
    }
    let run = Run::from_writers(results)?;
    Ok(Measurement {
        label: format!("reconciled, {} replica(s)", replicas.servers.len()),
        items_per_request: items,
        bytes_per_request: 0,
        run,
        fsyncs: None,
    })
}

/// An SDK agent per tenant, given every replica's address.
fn start_agents(
    replicas: &Replicas,
    tenants: &[(String, String)],
) -> anyhow::Result<Vec<RunningAgent>> {
    let endpoints = replicas.endpoints();
    tenants
        .iter()
        .map(|(name, token)| {
            let agent = Agent::builder(endpoints[0].clone(), name, token)
                .endpoints(endpoints[1..].to_vec())
                .agent_id(format!("agent-{name}"))
                .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
                .item_type(TypeSpec::new(ITEM_TYPE).max_in_flight(64), Recorder::new())
                .build()?;
            Ok(RunningAgent::run(agent))
        })
        .collect()
}

/// Whether every tenant shows `generation` applied to all its items.
async fn applied(
    replicas: &Replicas,
    tenants: &[(String, String)],
    items: usize,
    generation: u64,
) -> anyhow::Result<bool> {
    for (index, (name, token)) in tenants.iter().enumerate() {
        let channel = replicas.channel(index % replicas.servers.len()).await;
        let status = api::reconciler(&channel, token)
            .get_status(v1::GetStatusRequest {
                tenant: name.clone(),
            })
            .await?
            .into_inner()
            .status
            .unwrap_or_default();
        let done = status.generation >= generation
            && status.observed_generation == status.generation
            && status.operations_in_flight == 0
            && status.items_by_state.get("CREATED") == Some(&(items as u64));
        if !done {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Rounds of "change every item of every tenant, wait until applied" for
/// `seconds`; returns operations per second and the mean round time.
async fn run_operations(
    replicas: &Replicas,
    run: usize,
    tenant_count: usize,
    items: usize,
    seconds: Duration,
) -> anyhow::Result<(f64, Duration)> {
    let tenants = tenants(replicas, run, tenant_count).await?;
    let agents = start_agents(replicas, &tenants)?;
    let mut submitters = Vec::new();
    for (client, (tenant, token)) in tenants.iter().enumerate() {
        let channel = replicas.channel(client % replicas.servers.len()).await;
        submitters.push(Submitter {
            client: api::reconciler(&channel, token),
            request: api::submit(tenant, proto_items(client, items, 0, 16)),
        });
    }
    let mut round = 0u64;
    let mut timed = Duration::ZERO;
    let mut rounds = 0u32;
    let started = Instant::now();
    loop {
        let began = Instant::now();
        for submitter in &mut submitters {
            submitter.submit(round).await?;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while !applied(replicas, &tenants, items, round + 1).await? {
            ensure!(
                Instant::now() < deadline,
                "round {round} was not applied within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Round 0 creates the items; the timed rounds modify them.
        if round > 0 {
            timed += began.elapsed();
            rounds += 1;
        }
        round += 1;
        if rounds > 0 && started.elapsed() >= seconds {
            break;
        }
    }
    for agent in agents {
        agent.stop().await?;
    }
    let operations = f64::from(rounds) * (tenant_count * items) as f64;
    Ok((
        operations / timed.as_secs_f64().max(f64::MIN_POSITIVE),
        timed / rounds.max(1),
    ))
}

/// `kill -9` of the replica serving a tenant, `rounds` times, under the
/// agents' load; returns how long until every tenant it served was served
/// again.
async fn run_failover(
    replicas: &mut Replicas,
    run: usize,
    tenant_count: usize,
    rounds: usize,
) -> anyhow::Result<Vec<Duration>> {
    let tenants = tenants(replicas, run + 1_000, tenant_count).await?;
    let agents = start_agents(replicas, &tenants)?;
    let mut times = Vec::new();
    for round in 0..rounds {
        let (victim_tenant, _) = &tenants[round % tenants.len()];
        let victim_address = replicas.owner(0, victim_tenant).await;
        let victim = replicas
            .index_of(&victim_address)
            .context("the owner is a replica")?;
        let survivor = (victim + 1) % replicas.servers.len();
        let mut moved = Vec::new();
        for (name, token) in &tenants {
            if replicas.owner(survivor, name).await == victim_address {
                moved.push((name.clone(), token.clone()));
            }
        }
        let channel = replicas.channel(survivor).await;
        let killed = Instant::now();
        replicas.servers[victim].kill9()?;
        for (name, token) in &moved {
            loop {
                let mut request = tonic::Request::new(v1::GetStatusRequest {
                    tenant: name.clone(),
                });
                request.set_timeout(Duration::from_secs(15));
                if let Ok(reply) = api::reconciler(&channel, token).get_status(request).await
                    && reply
                        .into_inner()
                        .status
                        .is_some_and(|status| status.owner != victim_address)
                {
                    break;
                }
                ensure!(
                    killed.elapsed() < Duration::from_secs(30),
                    "{name} was not served again within 30 s"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let took = killed.elapsed();
        println!(
            "round {round}: {} tenant(s) moved, served again after {took:?}",
            moved.len()
        );
        times.push(took);
        replicas.servers[victim].start_again().await?;
    }
    for agent in agents {
        agent.stop().await?;
    }
    Ok(times)
}

fn print_failover(times: &[Duration]) {
    let mut sorted = times.to_vec();
    sorted.sort();
    let at = |quantile: f64| {
        let index = ((sorted.len().saturating_sub(1)) as f64 * quantile).round() as usize;
        sorted.get(index).map_or(0.0, |time| time.as_secs_f64())
    };
    println!(
        "\nFailover, kill -9 to every moved tenant served again ({} rounds, lease TTL {LEASE_SECS} s): min {:.2} s, p50 {:.2} s, p90 {:.2} s, max {:.2} s",
        sorted.len(),
        at(0.0),
        at(0.5),
        at(0.9),
        at(1.0)
    );
}
