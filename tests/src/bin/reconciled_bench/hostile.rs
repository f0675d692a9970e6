//! `reconciled-bench hostile`: what hostile tenants cost a bystander.
//!
//! ```text
//! cargo build --release -p reconciled
//! RECONCILED_BIN=target/release/reconciled \
//!     cargo run --release -p reconciled-tests --bin reconciled-bench -- hostile
//! ```
//!
//! One server (default options), a bystander tenant and `--hostile`
//! hostile tenants. The bystander runs two clients at once for
//! `--seconds`: GetStatus in a loop (its latency) and SubmitIntent of 10
//! items, each changing one property (its throughput). It does so twice:
//! alone (the baseline), then while every hostile tenant runs the worst
//! cases of the hostile suite in a loop:
//!
//! - an intent whose predicate is a nested `all` over a 1,000-element list
//!   (stopped by the evaluation budget every pass);
//! - 10,000 tiny items, alternating between two contents (a full commit
//!   and a full pass each time);
//! - a 4 MB message of 2M empty items (refused before decoding) and an
//!   anonymous 16 MB one (refused before reading);
//! - GetGraph pages of 5,000 items and 10,000-item external reports;
//! - an agent that registers, is sent 2,000 operations and never reads,
//!   and a Watch that is never read (both opened once per tenant).
//!
//! Targets (issue 12): the bystander's p99 GetStatus latency within 2× the
//! baseline, its SubmitIntent throughput at least 0.8× the baseline.
//!
//! `--only busy` runs a control instead: the same number of tenants that
//! behave, each sending what the bystander sends as fast as it is
//! answered. What they cost the bystander is what sharing the machine
//! costs; what the hostile tenants cost beyond it is what isolation can
//! still remove.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use clap::{Args, ValueEnum};
use prost::Message as _;
use prost::bytes::Bytes;
use reconciled_tests::api::{self, Bearer};
use reconciled_tests::proto::v1;
use reconciled_tests::proto::v1::configurators_client::ConfiguratorsClient;
use reconciled_tests::raw;
use reconciled_tests::{ServerOptions, ServerProcess};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::process_cpu;

/// Options of `reconciled-bench hostile`.
#[derive(Debug, Args)]
pub struct HostileArgs {
    /// Hostile tenants running the worst cases at once.
    #[arg(long, default_value_t = 10)]
    hostile: usize,
    /// Seconds of each phase (baseline, then under attack).
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Leave out the bulk calls (10,000-item intents and external reports,
    /// 5,000-item pages): what is left is only what the server refuses or
    /// bounds (predicates, dense and anonymous messages, the deaf agent).
    #[arg(long)]
    without_bulk: bool,
    /// Run only these attacks, comma separated (to find which one costs
    /// the bystander): predicates, flood, dense, anonymous, pages, reports;
    /// or `busy`, the control. Default: every attack (less the bulk ones
    /// with `--without-bulk`), not the control.
    #[arg(long, value_delimiter = ',')]
    only: Vec<Attack>,
}

/// One of the hostile tenant's worst cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Attack {
    /// An intent of 20 predicates asking for a million steps each.
    Predicates,
    /// 10,000 tiny items changing every round, 2,000 for a deaf agent.
    Flood,
    /// A 4 MB message of 2M empty items.
    Dense,
    /// An anonymous 16 MB message.
    Anonymous,
    /// 5,000-item GetGraph pages.
    Pages,
    /// 10,000-item external reports.
    Reports,
    /// The control, not an attack: a busy tenant that behaves, sending what
    /// the bystander sends (a 10-item SubmitIntent changing one property,
    /// and a GetStatus) as fast as it is answered, and holding no unread
    /// stream. What ten of these cost the bystander is what sharing the
    /// machine costs, with nothing hostile in it.
    Busy,
}

impl HostileArgs {
    /// The attacks to run, in the order of a round, and the tiny items of
    /// each flood: those `--only` names (all by default), less the bulk
    /// ones with `--without-bulk`.
    fn attacks(&self) -> (Vec<Attack>, usize) {
        let attacks = Attack::value_variants()
            .iter()
            .copied()
            .filter(|attack| {
                if self.only.is_empty() {
                    *attack != Attack::Busy
                } else {
                    self.only.contains(attack)
                }
            })
            .filter(|attack| {
                !(self.without_bulk && matches!(attack, Attack::Pages | Attack::Reports))
            })
            .collect();
        (attacks, if self.without_bulk { 0 } else { 10_000 })
    }
}

/// What the bystander measured in one phase.
struct Phase {
    status_latencies: Vec<Duration>,
    submits: u64,
    elapsed: Duration,
    server_cpu: Duration,
    hostile_calls: u64,
}

impl Phase {
    fn quantile(&self, quantile: f64) -> Duration {
        let mut sorted = self.status_latencies.clone();
        sorted.sort();
        let index = ((sorted.len() as f64 - 1.0) * quantile).round() as usize;
        sorted.get(index).copied().unwrap_or_default()
    }

    fn submits_per_second(&self) -> f64 {
        self.submits as f64 / self.elapsed.as_secs_f64()
    }
}

/// Runs the benchmark and prints its table.
pub fn hostile_benchmark(args: &HostileArgs) -> anyhow::Result<()> {
    ensure!(
        (1..=super::MAX_SECONDS).contains(&args.seconds),
        "--seconds must be 1..={}",
        super::MAX_SECONDS
    );
    ensure!(
        (1..=100).contains(&args.hostile),
        "--hostile must be 1..=100"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: &HostileArgs) -> anyhow::Result<()> {
    let server = ServerProcess::start(ServerOptions::default()).await?;
    let pid = server.pid().context("the server runs")?;
    let channel = server.channel().await?;
    let admin = server.admin_token();
    let bystander = api::create_tenant(&channel, &admin, "bystander").await;
    let mut hostile = Vec::new();
    for index in 0..args.hostile {
        let name = format!("hostile{index:02}");
        let token = api::create_tenant(&channel, &admin, &name).await;
        hostile.push((name, token));
    }
    let seconds = Duration::from_secs(args.seconds);

    println!("baseline: the bystander alone for {} s", args.seconds);
    let endpoint = server.endpoint();
    let baseline = measure_apart(&endpoint, &bystander, pid, seconds, Arc::default()).await?;

    println!(
        "under attack: {} hostile tenants running the worst cases for {} s",
        args.hostile, args.seconds
    );
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let attackers_runtime = attackers_runtime()?;
    let mut attackers = Vec::new();
    for (name, token) in &hostile {
        // Each hostile tenant on connections of its own, as it would be:
        // streams it never reads hold HTTP/2 windows of their connection.
        let (endpoint, name, token) = (endpoint.clone(), name.clone(), token.clone());
        let (attacks, bulk) = args.attacks();
        let (stop, calls) = (stop.clone(), calls.clone());
        attackers.push(attackers_runtime.spawn(async move {
            let connect =
                || async { anyhow::Ok(Channel::from_shared(endpoint.clone())?.connect().await?) };
            let held = if attacks == [Attack::Busy] {
                None
            } else {
                Some(hold_resources(&connect().await?, &name, &token).await?)
            };
            attack(connect().await?, name, token, attacks, bulk, stop, calls).await;
            drop(held);
            anyhow::Ok(())
        }));
    }
    // Let the attack reach its stride before measuring.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let attacked = measure_apart(&endpoint, &bystander, pid, seconds, calls.clone()).await?;
    stop.store(true, Ordering::Relaxed);
    // A round of heavy calls may take long on a loaded machine: end them.
    for attacker in &attackers {
        attacker.abort();
    }
    for attacker in attackers {
        let _ = attacker.await;
    }
    attackers_runtime.shutdown_background();
    let (rss, peak) = server.memory();

    let ms = |duration: Duration| duration.as_secs_f64() * 1_000.0;
    println!();
    println!(
        "| bystander | alone | with {} hostile tenants | ratio | target |",
        args.hostile
    );
    println!("|---|---|---|---|---|");
    for (label, quantile) in [("GetStatus p50", 0.5), ("GetStatus p99", 0.99)] {
        let (alone, attacked_latency) = (baseline.quantile(quantile), attacked.quantile(quantile));
        println!(
            "| {label} | {:.2} ms | {:.2} ms | {:.2}× | {} |",
            ms(alone),
            ms(attacked_latency),
            ms(attacked_latency) / ms(alone).max(1e-9),
            if quantile > 0.9 { "≤ 2×" } else { "" }
        );
    }
    println!(
        "| SubmitIntent (10 items) | {:.0} req/s | {:.0} req/s | {:.2}× | ≥ 0.8× |",
        baseline.submits_per_second(),
        attacked.submits_per_second(),
        attacked.submits_per_second() / baseline.submits_per_second().max(1e-9)
    );
    println!(
        "| server CPU (cores busy) | {:.2} | {:.2} | | |",
        baseline.server_cpu.as_secs_f64() / baseline.elapsed.as_secs_f64(),
        attacked.server_cpu.as_secs_f64() / attacked.elapsed.as_secs_f64()
    );
    println!(
        "| hostile calls answered | {} | {} | | |",
        baseline.hostile_calls, attacked.hostile_calls
    );
    println!(
        "\nserver RSS at the end {} MiB, peak {} MiB; GetStatus samples: {} alone, {} under attack",
        rss >> 20,
        peak >> 20,
        baseline.status_latencies.len(),
        attacked.status_latencies.len()
    );
    Ok(())
}

/// The runtime of the hostile clients: two threads at the lowest priority,
/// so that on a machine shared with the server the attack costs the
/// server what it would from other machines, not the CPU of the bench's
/// own encoding and sending.
fn attackers_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(lowest_priority)
        .enable_all()
        .build()
        .context("cannot start the hostile clients' runtime")
}

/// Gives the calling thread the lowest scheduling priority (`chrt --idle`
/// on its thread id: it runs only on a core nothing else wants, and gives
/// way at once to any other thread that wakes up; `renice` where that
/// fails); a failure leaves it as it was.
fn lowest_priority() {
    let thread = std::fs::read_link("/proc/thread-self").ok();
    let Some(id) = thread
        .as_deref()
        .and_then(std::path::Path::file_name)
        .and_then(std::ffi::OsStr::to_str)
    else {
        return;
    };
    let idle = std::process::Command::new("chrt")
        .args(["--idle", "--pid", "0", id])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !idle {
        let _ = std::process::Command::new("renice")
            .args(["-n", "19", "-p", id])
            .stdout(std::process::Stdio::null())
            .status();
    }
}

/// [`measure`] on a thread and runtime of its own (with a connection of
/// its own), so that the bench's hostile clients, busy encoding their
/// payloads, do not delay the bystander's calls on the client side.
async fn measure_apart(
    endpoint: &str,
    token: &str,
    pid: u32,
    duration: Duration,
    hostile_calls: Arc<AtomicU64>,
) -> anyhow::Result<Phase> {
    let (endpoint, token) = (endpoint.to_owned(), token.to_owned());
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the bystander's runtime")?;
        runtime.block_on(async {
            let channel = Channel::from_shared(endpoint)?.connect().await?;
            measure(&channel, &token, pid, duration, hostile_calls).await
        })
    });
    tokio::task::spawn_blocking(move || thread.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the bystander's thread panicked"))?
}

/// The bystander's two clients for `duration`.
async fn measure(
    channel: &Channel,
    token: &str,
    pid: u32,
    duration: Duration,
    hostile_calls: Arc<AtomicU64>,
) -> anyhow::Result<Phase> {
    let started = Instant::now();
    let cpu_before = process_cpu(pid)?;
    let calls_before = hostile_calls.load(Ordering::Relaxed);
    let until = started + duration;
    let status = {
        let reconciler = api::reconciler(channel, token);
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < until {
                let sent = Instant::now();
                reconciler
                    .clone()
                    .get_status(v1::GetStatusRequest {
                        tenant: "bystander".into(),
                    })
                    .await?;
                latencies.push(sent.elapsed());
            }
            anyhow::Ok(latencies)
        })
    };
    let submits = {
        let reconciler = api::reconciler(channel, token);
        tokio::spawn(async move {
            let mut submits = 0_u64;
            let mut round = 0_u64;
            while Instant::now() < until {
                round += 1;
                reconciler
                    .clone()
                    .submit_intent(busy_request("bystander", round))
                    .await?;
                submits += 1;
            }
            anyhow::Ok(submits)
        })
    };
    let status_latencies = status.await??;
    let submits = submits.await??;
    let elapsed = started.elapsed();
    Ok(Phase {
        status_latencies,
        submits,
        elapsed,
        server_cpu: process_cpu(pid)?.saturating_sub(cpu_before),
        hostile_calls: hostile_calls.load(Ordering::Relaxed) - calls_before,
    })
}

/// What a hostile tenant holds for the whole attack: an agent that never
/// reads its 2,000 operations, and a Watch that is never read.
struct Held {
    _agent: mpsc::Sender<v1::AgentMessage>,
    _agent_stream: tonic::Streaming<v1::ServerMessage>,
    _watch: tonic::Streaming<v1::WatchResponse>,
}

async fn hold_resources(channel: &Channel, name: &str, token: &str) -> anyhow::Result<Held> {
    let (agent, receiver) = mpsc::channel(4);
    agent
        .send(v1::AgentMessage {
            message: Some(v1::agent_message::Message::Register(v1::Register {
                tenant: name.into(),
                agent_id: "deaf".into(),
                protocol_version: reconciled_tests::proto::PROTOCOL_VERSION,
                item_types: vec![v1::ItemTypeSpec {
                    item_type: "deaf".into(),
                    max_in_flight: 10_000,
                    ..Default::default()
                }],
                ..Default::default()
            })),
        })
        .await?;
    let agent_stream = ConfiguratorsClient::with_interceptor(channel.clone(), Bearer::new(token))
        .connect(ReceiverStream::new(receiver))
        .await?
        .into_inner();
    let watch = api::reconciler(channel, token)
        .watch(v1::WatchRequest {
            tenant: name.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(Held {
        _agent: agent,
        _agent_stream: agent_stream,
        _watch: watch,
    })
}

/// The hostile tenant's loop over the chosen worst cases until `stop`,
/// adding the calls it had answered to `calls_answered`; each flood has
/// `bulk` tiny items.
async fn attack(
    channel: Channel,
    name: String,
    token: String,
    attacks: Vec<Attack>,
    bulk: usize,
    stop: Arc<AtomicBool>,
    calls_answered: Arc<AtomicU64>,
) {
    // Every payload is encoded once and sent as bytes, and no reply is
    // decoded: the attack is on the server, not on this process's CPU.
    // (Attackers that burn CPU here hurt the server's threads even at the
    // idle policy: a core running one does not pull the server's waiting
    // threads over until the kernel's next periodic balance; see
    // docs/performance.md, "Hostile tenants", item 16.)
    let expensive = Bytes::from(
        v1::SubmitIntentRequest {
            subgraph: "expensive".into(),
            ..expensive_intent(&name)
        }
        .encode_to_vec(),
    );
    let dense = Bytes::from(dense_request(&name, 2_000_000));
    let huge_anonymous = Bytes::from(dense_request(&name, 8_000_000));
    let floods = [0, 1].map(|round| Bytes::from(flood_request(&name, bulk, round).encode_to_vec()));
    let reports = Bytes::from(external_reports(&name).encode_to_vec());
    let page = Bytes::from(
        v1::GetGraphRequest {
            tenant: name.clone(),
            view: v1::GraphView::Both.into(),
            page_size: 5_000,
            ..Default::default()
        }
        .encode_to_vec(),
    );
    let busy = [0, 1].map(|round| Bytes::from(busy_request(&name, round).encode_to_vec()));
    let status = Bytes::from(
        v1::GetStatusRequest {
            tenant: name.clone(),
        }
        .encode_to_vec(),
    );
    let mut round = 0_u64;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let odd = usize::from(round % 2 == 1);
        let mut answered = 0_u64;
        for attack in &attacks {
            let calls: &[(&'static str, &str, &Bytes)] = match attack {
                Attack::Predicates => &[(raw::SUBMIT_INTENT, &token, &expensive)],
                Attack::Flood => &[(raw::SUBMIT_INTENT, &token, &floods[odd])],
                Attack::Dense => &[(raw::SUBMIT_INTENT, &token, &dense)],
                Attack::Anonymous => &[(raw::SUBMIT_INTENT, "", &huge_anonymous)],
                Attack::Pages => &[(raw::GET_GRAPH, &token, &page)],
                Attack::Reports => &[(raw::REPORT_EXTERNAL, &token, &reports)],
                Attack::Busy => &[
                    (raw::SUBMIT_INTENT, &token, &busy[odd]),
                    (raw::GET_STATUS, &token, &status),
                ],
            };
            for (path, token, message) in calls {
                let _ = raw::raw_unary(&channel, path, token, Bytes::clone(message)).await;
            }
            answered += calls.len() as u64;
        }
        calls_answered.fetch_add(answered, Ordering::Relaxed);
        if attacks.is_empty() {
            // Only the held resources (deaf agent, unread Watch) attack.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// 10,000 tiny items (`bulk` of them) whose content depends on `round`,
/// and 2,000 for the agent that never reads.
fn flood_request(tenant: &str, bulk: usize, round: u64) -> v1::SubmitIntentRequest {
    let items = (0..bulk)
        .map(|index| api::item("tiny", &format!("t{index:05}"), json!({ "round": round })))
        .chain((0..2_000).map(|index| api::item("deaf", &format!("d{index:04}"), json!({}))))
        .map(|mut item| {
            item.subgraph = "flood".into();
            item
        })
        .collect();
    v1::SubmitIntentRequest {
        tenant: tenant.into(),
        subgraph: "flood".into(),
        items,
        ..Default::default()
    }
}

/// The control's SubmitIntent: 10 items, the first one's property
/// depending on `round`, as the bystander sends.
fn busy_request(tenant: &str, round: u64) -> v1::SubmitIntentRequest {
    let items = (0..10)
        .map(|index| {
            api::item(
                "svc",
                &format!("s{index}"),
                json!({ "round": if index == 0 { round } else { 0 } }),
            )
        })
        .collect();
    api::submit(tenant, items)
}

/// A report of 10,000 external items.
fn external_reports(tenant: &str) -> v1::ReportExternalRequest {
    let reports = (0..10_000)
        .map(|index| v1::ExternalReport {
            change: Some(v1::external_report::Change::Put(v1::Item {
                r#type: "ext".into(),
                name: format!("e{index:05}"),
                external: true,
                ..Default::default()
            })),
            modified: false,
        })
        .collect();
    v1::ReportExternalRequest {
        tenant: tenant.into(),
        reports,
    }
}

/// An intent whose predicate asks for a million steps.
fn expensive_intent(tenant: &str) -> v1::SubmitIntentRequest {
    let list: Vec<serde_json::Value> = (0..1_000).map(|index| json!(index)).collect();
    let mut base = api::item("calc", "list", json!({ "l": list }));
    base.subgraph = "expensive".into();
    let mut dependents = Vec::new();
    for index in 0..20 {
        let mut dependent = api::item("calc", &format!("d{index:02}"), json!({}));
        dependent.subgraph = "expensive".into();
        dependent.dependencies.push(v1::Dependency {
            requires: Some(v1::ItemRef {
                r#type: "calc".into(),
                name: "list".into(),
            }),
            must_satisfy: "self.l.all(x, self.l.all(y, x + y >= 0))".into(),
            ..Default::default()
        });
        dependents.push(dependent);
    }
    let mut items = vec![base];
    items.extend(dependents);
    v1::SubmitIntentRequest {
        tenant: tenant.into(),
        items,
        ..Default::default()
    }
}

/// A SubmitIntentRequest of `items` empty items, two bytes each.
fn dense_request(tenant: &str, items: usize) -> Vec<u8> {
    raw::empty_items_request(tenant, items)
}
