//! `reconciled-bench scale`: one server holding many tenants and many
//! agents — resident memory, start-up time, and the time until every
//! tenant is Ready again after a restart.
//!
//! ```text
//! cargo build --release -p reconciled
//! RECONCILED_BIN=target/release/reconciled \
//!     cargo run --release -p reconciled-tests --bin reconciled-bench -- scale
//! ```
//!
//! 1. Starts the server once on a fresh data directory (so its schema is
//!    current), stops it, and writes `--tenants` converged tenants of
//!    `--items` items each straight into the store with the server's own
//!    record types (what SubmitIntent and the operations would have left).
//! 2. Starts the server: time to SERVING, then to every tenant Ready
//!    (watched with WatchFleet), resident memory.
//! 3. Connects `--agents` SDK agents (one per tenant, no-op
//!    configurators): time until all are registered, resident memory.
//! 4. Restarts the server with the agents connected (they reconnect on
//!    their own): time to SERVING, to every tenant Ready, to every agent
//!    registered again, resident memory.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, ensure};
use clap::Args;
use reconciled::graph::{CurrentItem, Item};
use reconciled::store::{SledOptions, Store as _, WriteBatch, keys, open_and_migrate};
use reconciled::tenant::record::{StoredIntended, TenantLimits, TenantRecord, encode};
use reconciled_client::agent::{
    Agent, AgentEvent, Configurator, Item as AgentItem, OperationContext, Outcome, TypeSpec,
};
use reconciled_tests::api;
use reconciled_tests::proto::v1;
use reconciled_tests::{ServerOptions, ServerProcess};

use super::find_child_pid;

/// The item type of every scale item.
const ITEM_TYPE: &str = "bench.if";

/// How long each phase may take.
const PHASE_DEADLINE: Duration = Duration::from_secs(900);

/// Options of `reconciled-bench scale`.
#[derive(Debug, Args)]
pub struct ScaleArgs {
    /// Tenants stored.
    #[arg(long, default_value_t = 10_000)]
    tenants: usize,
    /// Items per tenant.
    #[arg(long, default_value_t = 100)]
    items: usize,
    /// Agents connected (one per tenant, the first tenants).
    #[arg(long, default_value_t = 1_000)]
    agents: usize,
    /// Seconds the server idles with its agents before "RSS settled" is
    /// read: past the moment it first gives freed memory back (10 s after
    /// loading).
    #[arg(long, default_value_t = 15)]
    settle_secs: u64,
}

/// A configurator that does nothing and succeeds.
struct Noop;

impl Configurator for Noop {
    async fn create(&self, _ctx: &OperationContext, _item: &AgentItem) -> Outcome {
        Outcome::done()
    }

    async fn modify(
        &self,
        _ctx: &OperationContext,
        _previous: &AgentItem,
        _item: &AgentItem,
    ) -> Outcome {
        Outcome::done()
    }

    async fn delete(&self, _ctx: &OperationContext, _item: &AgentItem) -> Outcome {
        Outcome::done()
    }
}

fn tenant_name(index: usize) -> String {
    format!("tenant-{index:05}")
}

fn tenant_token(index: usize) -> String {
    format!("rcdt_scale_bench_token_{index:05}")
}

/// Writes `args.tenants` converged tenants into the store at `dir`.
fn write_tenants(dir: &std::path::Path, args: &ScaleArgs) -> anyhow::Result<()> {
    let (store, _) = open_and_migrate(dir, SledOptions::default(), false)?;
    let first_id = store
        .get(keys::next_tenant_id_key())?
        .and_then(|bytes| bytes.get(..8).and_then(|b| b.try_into().ok()))
        .map_or(1, u64::from_be_bytes);
    for index in 0..args.tenants {
        let id = first_id + index as u64;
        let name = tenant_name(index);
        let token_hash: String = reconciled::auth::TokenHash::of(&tenant_token(index))
            .0
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        let record = TenantRecord {
            id,
            name: name.clone(),
            created_at_ms: 0,
            generation: 1,
            observed_generation: 1,
            revision: 2,
            limits: TenantLimits::default(),
            token_hash,
            deleted: false,
            conditions: Vec::new(),
            compact_revision: Some(2),
            history_bytes: Some(0),
        };
        let mut batch = WriteBatch::new();
        batch.put(keys::tenant_name_key(&name), id.to_be_bytes().to_vec());
        batch.put(keys::tenant_record_key(id), encode(&record)?);
        for item_index in 0..args.items {
            let mut properties = reconciled::graph::Properties::new();
            properties.insert("mtu".into(), 1500.into());
            properties.insert("index".into(), item_index.into());
            let item = Item::new(ITEM_TYPE, format!("if-{item_index:04}"), properties);
            batch.put(
                keys::intended_item_key(id, ITEM_TYPE, item.name()),
                encode(&StoredIntended {
                    item: item.clone(),
                    generation: 1,
                })?,
            );
            batch.put(
                keys::current_item_key(id, ITEM_TYPE, item.name()),
                encode(&CurrentItem::created(Arc::new(item), 1))?,
            );
        }
        batch.put(
            keys::next_tenant_id_key().to_vec(),
            (id + 1).to_be_bytes().to_vec(),
        );
        store.commit_blocking(batch)?;
    }
    Ok(())
}

/// Resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let bytes = reconciled::process_memory::status_bytes(&format!("/proc/{pid}/status"), "VmRSS")
        .map_err(|error| anyhow!(error))?;
    Ok(bytes as f64 / (1024.0 * 1024.0))
}

/// Waits (WatchFleet) until `tenants` tenants are Ready.
async fn all_ready(server: &ServerProcess, tenants: usize) -> anyhow::Result<()> {
    let channel = server.channel().await?;
    let mut stream = api::tenants(&channel, &server.admin_token())
        .watch_fleet(v1::WatchFleetRequest { start_revision: 0 })
        .await?
        .into_inner();
    let mut ready: BTreeMap<String, bool> = BTreeMap::new();
    let is_ready = |event: &v1::FleetEvent| {
        event.conditions.iter().any(|condition| {
            condition.r#type == "Ready" && condition.status == v1::ConditionStatus::True as i32
        })
    };
    while ready.values().filter(|ready| **ready).count() < tenants {
        let message = tokio::time::timeout(PHASE_DEADLINE, stream.message())
            .await
            .context("tenants did not become Ready in time")??
            .ok_or_else(|| anyhow!("the fleet stream ended"))?;
        if let Some(v1::watch_fleet_response::Message::Events(group)) = message.message {
            for event in group.events {
                ready.insert(event.tenant.clone(), is_ready(&event));
            }
        }
    }
    Ok(())
}

/// Starts `count` agents; returns them with a counter of registrations.
fn start_agents(
    server: &ServerProcess,
    count: usize,
) -> anyhow::Result<(Vec<tokio::task::JoinHandle<()>>, Arc<AtomicUsize>)> {
    let registered = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for index in 0..count {
        let agent = Agent::builder(server.endpoint(), tenant_name(index), tenant_token(index))
            .agent_id(format!("agent-{index:05}"))
            .reconnect_backoff(Duration::from_millis(100), Duration::from_secs(1))
            .item_type(TypeSpec::new(ITEM_TYPE), Noop)
            .build()
            .context("agent settings")?;
        let mut events = agent.events();
        let counter = registered.clone();
        tasks.push(tokio::spawn(async move {
            tokio::spawn(agent.run(std::future::pending::<()>()));
            while let Ok(event) = events.recv().await {
                if matches!(event, AgentEvent::Connected { .. }) {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    Ok((tasks, registered))
}

async fn registrations(counter: &AtomicUsize, target: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + PHASE_DEADLINE;
    while counter.load(Ordering::SeqCst) < target {
        ensure!(Instant::now() < deadline, "agents did not register in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Runs the scale benchmark and prints its figures.
pub fn scale_benchmark(args: &ScaleArgs) -> anyhow::Result<()> {
    ensure!(
        args.agents <= args.tenants,
        "--agents must not exceed --tenants"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async {
        let options = ServerOptions::default()
            .arg("--resync-interval-secs")
            .arg("86400");
        let mut server = ServerProcess::start(options).await?;
        server.terminate().await?;
        let written = Instant::now();
        write_tenants(&server.data_dir(), args)?;
        println!(
            "wrote {} tenants × {} items in {:.1} s",
            args.tenants,
            args.items,
            written.elapsed().as_secs_f64()
        );

        let started = Instant::now();
        server.start_again().await?;
        let serving = started.elapsed();
        all_ready(&server, args.tenants).await?;
        let ready = started.elapsed();
        let pid = find_child_pid(&server)?;
        let rss_idle = rss_mib(pid)?;
        println!(
            "start: SERVING after {:.2} s, all {} tenants Ready after {:.2} s, RSS {:.0} MiB",
            serving.as_secs_f64(),
            args.tenants,
            ready.as_secs_f64(),
            rss_idle
        );

        let connecting = Instant::now();
        let (_agents, registered) = start_agents(&server, args.agents)?;
        registrations(&registered, args.agents).await?;
        let connected = connecting.elapsed();
        let rss_agents = rss_mib(pid)?;
        println!(
            "{} agents registered after {:.2} s, RSS {:.0} MiB",
            args.agents,
            connected.as_secs_f64(),
            rss_agents
        );

        // Idle: what the server keeps once start-up has settled (it gives
        // freed memory back to the system some seconds after loading).
        tokio::time::sleep(Duration::from_secs(args.settle_secs)).await;
        let rss_settled = rss_mib(pid)?;
        println!(
            "{} s later, idle: RSS {:.0} MiB",
            args.settle_secs, rss_settled
        );

        let restarted = Instant::now();
        server.restart().await?;
        let serving_again = restarted.elapsed();
        all_ready(&server, args.tenants).await?;
        let ready_again = restarted.elapsed();
        registrations(&registered, 2 * args.agents).await?;
        let agents_again = restarted.elapsed();
        let pid = find_child_pid(&server)?;
        let rss_after = rss_mib(pid)?;
        println!(
            "restart: SERVING after {:.2} s, all tenants Ready after {:.2} s, all agents registered after {:.2} s, RSS {:.0} MiB",
            serving_again.as_secs_f64(),
            ready_again.as_secs_f64(),
            agents_again.as_secs_f64(),
            rss_after
        );
        println!();
        println!("| tenants × items | agents | start → SERVING | start → all Ready | RSS idle | agents registered | RSS with agents | RSS settled | restart → SERVING | restart → all Ready | restart → agents back | RSS after restart |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        println!(
            "| {} × {} | {} | {:.2} s | {:.2} s | {:.0} MiB | {:.2} s | {:.0} MiB | {:.0} MiB | {:.2} s | {:.2} s | {:.2} s | {:.0} MiB |",
            args.tenants,
            args.items,
            args.agents,
            serving.as_secs_f64(),
            ready.as_secs_f64(),
            rss_idle,
            connected.as_secs_f64(),
            rss_agents,
            rss_settled,
            serving_again.as_secs_f64(),
            ready_again.as_secs_f64(),
            agents_again.as_secs_f64(),
            rss_after
        );
        Ok(())
    })
}
