//! `reconciled-bench operations`: operations per second from intent to
//! converged tenant, through agents built with our SDK, against the raw
//! limits of the transport and of the store, all measured in one run.
//!
//! ```text
//! cargo build --release -p reconciled
//! RECONCILED_BIN=target/release/reconciled \
//!     cargo run --release -p reconciled-tests --bin reconciled-bench -- operations
//! ```
//!
//! It measures, in this order, on loopback:
//!
//! 1. **tonic echo** (the transport's raw limit): this binary started again
//!    as a *child process* (`reconciled-bench echo-server`, a multi-threaded
//!    tokio runtime like the server's, `TCP_NODELAY` like the server's)
//!    serving `Configurators.Connect` with no logic: every `AgentMessage`
//!    is answered by one prebuilt `ServerMessage` (an `OperationRequest`
//!    of the benchmark's item shape carrying the incoming op id). The
//!    client, on this process's single-threaded runtime like the agents,
//!    keeps `W` messages outstanding on one stream (`W` = each
//!    `--in-flight` value) for `--echo-seconds` and counts round trips.
//! 2. **SledStore** (the store's raw limit): `SledStore` with default
//!    options (fsync on), 1-record commits (`commit_blocking`, a current-item
//!    key and a [`RECORD_VALUE_BYTES`] value), from 1 thread and from
//!    `--committers` threads, for `--store-seconds` each. Every operation
//!    costs the server two durable commits (the journal of the dispatch,
//!    then the result), so the store bounds operations at commits/s ÷ 2.
//! 3. **reconciled**: for every `--agents` K and `--in-flight` M, a fresh
//!    server (default options: fsync on), one tenant, K agents built with
//!    the SDK (agent `k` registers type `t{k}` with `max_in_flight` M and a
//!    configurator that answers `Outcome::done()` at once), then three
//!    timed phases of N items `t{n % K}/i{n}` (N = `--items-serial` for
//!    M = 1, `--items-concurrent` otherwise): an intent creating them, an
//!    intent changing a property of each (N modifies), an empty intent (N
//!    deletes). Each phase runs from the SubmitIntent until GetStatus
//!    (polled every [`POLL_INTERVAL`]) says Ready = True for the submitted
//!    generation with nothing in flight; the configurators count what they
//!    were asked to do, and the table shows it. The growth of the tenant's
//!    revision (one per durable tenant commit) over the phase gives the
//!    commits the server actually made per operation.
//!
//! `--chain` makes item n depend on items n+1 to n+10 (EVE's benchmark
//! shape); `--hub` makes every item depend on item 0, and its modify phase
//! changes item 0 alone (sent alone, in a subgraph of its own): one Modify
//! of an item with N − 1 dependents that
//! only need it to exist, timed from SubmitIntent to Ready like the rest;
//! its delete phase removes the dependents, then the hub (`--hub-first`:
//! the hub, then the dependents).
//!
//! Ratios: reconciled ops/s over echo round trips/s at the same
//! concurrency (M in flight ↔ M outstanding), and over the store's
//! operation bound (commits/s ÷ 2) with 1 and with `--committers`
//! committers. Server CPU is read from `/proc` (cores busy, and CPU
//! milliseconds per operation).
//!
//! `--perf FILE` records `perf record -g` of the server process during the
//! three phases of the configuration with the most agents and the highest
//! in-flight limit (those figures are then perturbed by the profiler).
//!
//! Every measurement is bounded: echo and store runs by their seconds,
//! each phase by `--phase-timeout` (the run fails past it), counts by
//! [`MAX_ITEMS`], [`MAX_AGENTS`] and [`MAX_IN_FLIGHT`].

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use clap::Args;
use futures::{Stream, StreamExt as _};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use reconciled::store::{SledOptions, SledStore, Store as _, WriteBatch, keys};
use reconciled_client::agent::{
    Agent, AgentError, AgentEvent, Configurator, Item, OperationContext, Outcome, TypeSpec,
};
use reconciled_tests::api::{self, Reconciler};
use reconciled_tests::proto::v1;
use reconciled_tests::proto::v1::configurators_client::ConfiguratorsClient;
use reconciled_tests::proto::v1::configurators_server::{Configurators, ConfiguratorsServer};
use reconciled_tests::{ServerOptions, ServerProcess};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Endpoint;
use tonic::{Request, Response, Status, Streaming};

use super::{
    ChildServer, bench_dir, decimal, drive_threads, find_child_pid, process_cpu, serve_baseline,
    thousands,
};

/// The most items of a configuration (the server's default per-tenant
/// limit).
pub const MAX_ITEMS: usize = 1_000_000;

/// Items per SubmitIntent (the server's default per-request limit): a
/// larger intent is submitted as one subgraph per this many items.
const REQUEST_ITEMS: usize = 10_000;

/// The most agents per configuration.
pub const MAX_AGENTS: usize = 128;

/// The highest `max_in_flight` (and echo window).
pub const MAX_IN_FLIGHT: u32 = 1024;

/// The most concurrent store committers.
const MAX_COMMITTERS: usize = 64;

/// The longest echo or store measurement, and the longest phase, in seconds.
const MAX_SECONDS: u64 = 600;

/// How often a phase polls GetStatus for convergence.
pub const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Bytes of the value of every store-baseline record (about a current-item
/// record of the benchmark's items).
pub const RECORD_VALUE_BYTES: usize = 256;

/// Echo warm-up before each timed echo run.
const ECHO_WARMUP: Duration = Duration::from_millis(500);

/// How long agents, the echo server and perf may take to start or stop.
const START_DEADLINE: Duration = Duration::from_secs(30);

/// How long a stopping agent may take to drain.
const AGENT_DRAIN: Duration = Duration::from_secs(2);

/// The tenant of every configuration.
const TENANT: &str = "ops";

/// Options of `reconciled-bench operations`.
#[derive(Debug, Args)]
pub struct OperationsArgs {
    /// Agent counts to measure, comma separated; agent k registers item
    /// type `t{k}`.
    #[arg(long, value_delimiter = ',', default_value = "1,10")]
    agents: Vec<usize>,
    /// `max_in_flight` of every type, comma separated; the echo baseline
    /// runs with each as its window.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    in_flight: Vec<u32>,
    /// Items per intent when `max_in_flight` is 1.
    #[arg(long, default_value_t = 500)]
    items_serial: usize,
    /// Items per intent for every other `max_in_flight`.
    #[arg(long, default_value_t = 2000)]
    items_concurrent: usize,
    /// Seconds of each echo measurement.
    #[arg(long, default_value_t = 3)]
    echo_seconds: u64,
    /// Seconds of each store measurement.
    #[arg(long, default_value_t = 3)]
    store_seconds: u64,
    /// Threads of the concurrent store measurement.
    #[arg(long, default_value_t = 16)]
    committers: usize,
    /// The longest a phase may take; the run fails past it.
    #[arg(long, default_value_t = 300)]
    phase_timeout: u64,
    /// Record `perf record -g` of the server into this file during the
    /// configuration with the most agents and the highest in-flight limit.
    #[arg(long)]
    perf: Option<PathBuf>,
    /// perf's `--call-graph` mode: `fp` (what `-g` does) or `dwarf` (for
    /// binaries without frame pointers, like ours; larger files).
    #[arg(long, default_value = "fp")]
    perf_call_graph: String,
    /// perf's sampling frequency, in Hz.
    #[arg(long, default_value_t = 999)]
    perf_frequency: u32,
    /// Deep dependency chains of EVE's benchmark shape: item n depends on
    /// items n+1 to n+10, so operations run one after another. Compare with
    /// the same number of items without dependencies at `--in-flight 1`
    /// (the inherent bound: one round trip and one commit each).
    #[arg(long, conflicts_with = "hub")]
    chain: bool,
    /// One hub every other item depends on (a network and its ports, say);
    /// the modify phase changes the hub alone, so it measures one Modify
    /// of an item with N − 1 settled dependents (one operation); the
    /// delete phase removes the dependents from the intent, then the hub.
    #[arg(long)]
    hub: bool,
    /// With `--hub`: the delete phase removes the hub first, then its
    /// dependents, as a controller that tears down a network before its
    /// ports would. The hub's Delete takes the dependents along, and those
    /// still intended wait to be created again until they leave the intent.
    #[arg(long, requires = "hub")]
    hub_first: bool,
}

impl OperationsArgs {
    fn check(&self) -> anyhow::Result<()> {
        ensure!(!self.agents.is_empty(), "--agents needs at least one count");
        ensure!(
            !self.in_flight.is_empty(),
            "--in-flight needs at least one limit"
        );
        for &agents in &self.agents {
            ensure!(
                (1..=MAX_AGENTS).contains(&agents),
                "--agents {agents} is outside 1..={MAX_AGENTS}"
            );
        }
        for &limit in &self.in_flight {
            ensure!(
                (1..=MAX_IN_FLIGHT).contains(&limit),
                "--in-flight {limit} is outside 1..={MAX_IN_FLIGHT}"
            );
        }
        for (flag, items) in [
            ("--items-serial", self.items_serial),
            ("--items-concurrent", self.items_concurrent),
        ] {
            ensure!(
                (1..=MAX_ITEMS).contains(&items),
                "{flag} {items} is outside 1..={MAX_ITEMS} (the server's per-tenant limit)"
            );
        }
        for (flag, seconds) in [
            ("--echo-seconds", self.echo_seconds),
            ("--store-seconds", self.store_seconds),
            ("--phase-timeout", self.phase_timeout),
        ] {
            ensure!(
                (1..=MAX_SECONDS).contains(&seconds),
                "{flag} must be within 1..={MAX_SECONDS}"
            );
        }
        ensure!(
            matches!(self.perf_call_graph.as_str(), "fp" | "dwarf"),
            "--perf-call-graph must be fp or dwarf"
        );
        ensure!(
            (1..=10_000).contains(&self.perf_frequency),
            "--perf-frequency must be within 1..=10000"
        );
        ensure!(
            (1..=MAX_COMMITTERS).contains(&self.committers),
            "--committers must be within 1..={MAX_COMMITTERS}"
        );
        Ok(())
    }

    fn shape(&self) -> Shape {
        if self.hub {
            Shape::Hub {
                removed_first: self.hub_first,
            }
        } else if self.chain {
            Shape::Chain
        } else {
            Shape::Independent
        }
    }

    fn items_for(&self, in_flight: u32) -> usize {
        if in_flight == 1 {
            self.items_serial
        } else {
            self.items_concurrent
        }
    }

    /// Every configuration, by in-flight limit then agent count, so the
    /// largest one (the one profiled) runs last.
    fn configurations(&self) -> Vec<Configuration> {
        let mut limits = self.in_flight.clone();
        limits.sort_unstable();
        limits.dedup();
        let mut agent_counts = self.agents.clone();
        agent_counts.sort_unstable();
        agent_counts.dedup();
        let mut configurations = Vec::new();
        for &in_flight in &limits {
            for &agents in &agent_counts {
                configurations.push(Configuration {
                    agents,
                    in_flight,
                    items: self.items_for(in_flight),
                    shape: self.shape(),
                });
            }
        }
        configurations
    }
}

/// One reconciled configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Configuration {
    agents: usize,
    in_flight: u32,
    items: usize,
    shape: Shape,
}

/// How the items of a configuration depend on one another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Not at all.
    Independent,
    /// Each on the next ten (see [`OperationsArgs::chain`]).
    Chain,
    /// Each on item 0 (see [`OperationsArgs::hub`]); `removed_first`:
    /// the delete phase removes the hub first (see
    /// [`OperationsArgs::hub_first`]).
    Hub { removed_first: bool },
}

impl Shape {
    /// How the phase's heading describes the shape.
    fn described(self) -> &'static str {
        match self {
            Self::Independent => "",
            Self::Chain => ", each depending on the next ten",
            Self::Hub {
                removed_first: false,
            } => ", each depending on the first; the modify phase changes it alone",
            Self::Hub {
                removed_first: true,
            } => {
                ", each depending on the first; the modify phase changes it alone; \
                 the delete phase removes it first"
            }
        }
    }
}

/// Runs `reconciled-bench operations`.
pub fn operations_benchmark(args: &OperationsArgs) -> anyhow::Result<()> {
    args.check()?;
    let configurations = args.configurations();
    let profiled = args
        .perf
        .as_ref()
        .and_then(|_| configurations.last().copied());
    println!(
        "reconciled-bench operations: agents {:?}, in-flight {:?}, {} items at in-flight 1, {} otherwise; server binary {}",
        args.agents,
        args.in_flight,
        args.items_serial,
        args.items_concurrent,
        reconciled_tests::reconciled_binary().display()
    );
    // The client side (echo client, agents, submitter) runs on one thread,
    // as in the `submit` benchmark: the machine is shared with the server.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;

    println!("\n## Raw limits");
    let mut windows: Vec<u32> = args.in_flight.clone();
    windows.sort_unstable();
    windows.dedup();
    let echo = EchoProcess::start()?;
    let mut echoes = Vec::new();
    for &window in &windows {
        let figure = runtime
            .block_on(echo.measure(window as usize, Duration::from_secs(args.echo_seconds)))?;
        println!("{}", figure.line());
        echoes.push(figure);
    }
    drop(echo);
    let store_seconds = Duration::from_secs(args.store_seconds);
    let store_one = store_commits(1, store_seconds)?;
    println!("{}", store_one.line());
    let store_many = store_commits(args.committers, store_seconds)?;
    println!("{}", store_many.line());

    let mut reports = Vec::new();
    for configuration in configurations {
        println!(
            "\n## {} agent(s), max_in_flight {}, {} items{}",
            configuration.agents,
            configuration.in_flight,
            configuration.items,
            configuration.shape.described()
        );
        let perf = args
            .perf
            .as_deref()
            .filter(|_| profiled == Some(configuration))
            .map(|path| PerfSettings {
                path,
                call_graph: &args.perf_call_graph,
                frequency: args.perf_frequency,
            });
        let phases = runtime.block_on(run_configuration(
            configuration,
            Duration::from_secs(args.phase_timeout),
            perf,
        ))?;
        reports.push((configuration, phases));
    }

    print_tables(&echoes, &store_one, &store_many, &reports);
    Ok(())
}

// ---- the echo baseline ----

/// The bare echo server, a child process running this binary's hidden
/// `echo-server` subcommand.
struct EchoProcess {
    server: ChildServer,
}

impl EchoProcess {
    fn start() -> anyhow::Result<Self> {
        Ok(Self {
            server: ChildServer::start("echo-server")?,
        })
    }

    /// Round trips per second with `window` messages outstanding on one
    /// stream.
    async fn measure(&self, window: usize, seconds: Duration) -> anyhow::Result<EchoFigure> {
        let channel = Endpoint::from_shared(self.server.endpoint.clone())
            .context("invalid echo endpoint")?
            .connect_timeout(START_DEADLINE)
            .connect()
            .await
            .context("cannot connect to the echo server")?;
        let (sender, receiver) = mpsc::unbounded_channel();
        let mut client = ConfiguratorsClient::new(channel);
        // The first window goes out with the request headers.
        for id in 0..window as u64 {
            sender
                .send(echo_request(id))
                .map_err(|_| anyhow!("the echo stream closed"))?;
        }
        let inbound = client
            .connect(UnboundedReceiverStream::new(receiver))
            .await
            .context("Connect to the echo server failed")?
            .into_inner();
        let mut stream = EchoStream {
            sender,
            inbound,
            next_id: window as u64,
        };
        stream.run(ECHO_WARMUP).await?;
        let cpu_before = process_cpu(self.server.pid())?;
        let bench_before = process_cpu(std::process::id())?;
        let (round_trips, elapsed) = stream.run(seconds).await?;
        let server_cpu = process_cpu(self.server.pid())?.saturating_sub(cpu_before);
        let bench_cpu = process_cpu(std::process::id())?.saturating_sub(bench_before);
        Ok(EchoFigure {
            window,
            round_trips,
            elapsed,
            server_cpu,
            bench_cpu,
        })
    }
}

/// One echo stream with a full window of messages outstanding.
struct EchoStream {
    sender: mpsc::UnboundedSender<v1::AgentMessage>,
    inbound: Streaming<v1::ServerMessage>,
    next_id: u64,
}

impl EchoStream {
    /// Counts replies for `seconds`, sending a new message for each one so
    /// that the window stays full (it stays full afterwards too).
    async fn run(&mut self, seconds: Duration) -> anyhow::Result<(u64, Duration)> {
        let start = Instant::now();
        let deadline = start + seconds;
        let mut received = 0;
        loop {
            self.inbound
                .message()
                .await
                .context("the echo stream failed")?
                .ok_or_else(|| anyhow!("the echo server closed the stream"))?;
            received += 1;
            self.sender
                .send(echo_request(self.next_id))
                .map_err(|_| anyhow!("the echo stream closed"))?;
            self.next_id += 1;
            let now = Instant::now();
            if now >= deadline {
                return Ok((received, now - start));
            }
        }
    }
}

/// What the echo client sends: a result, as an agent would.
fn echo_request(id: u64) -> v1::AgentMessage {
    v1::AgentMessage {
        message: Some(v1::agent_message::Message::Result(v1::OperationResult {
            op_id: format!("1-5eed-{id}"),
            attempt: 1,
            outcome: v1::Outcome::Done as i32,
            ..v1::OperationResult::default()
        })),
    }
}

/// What the echo server answers: an operation on an item of the
/// benchmark's shape.
fn echo_reply() -> v1::OperationRequest {
    v1::OperationRequest {
        op_id: String::new(),
        attempt: 1,
        epoch: 1,
        operation: v1::OperationKind::Modify as i32,
        item: Some(bench_item(0, 1, 1)),
        previous: Some(bench_item(0, 1, 0)),
        timeout: Some(prost_types::Duration {
            seconds: 30,
            nanos: 0,
        }),
        generation: 2,
        previous_uncertain: false,
    }
}

/// The echo service: one reply per message, no other logic.
struct Echo {
    reply: v1::OperationRequest,
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<v1::ServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Configurators for Echo {
    type ConnectStream = ReplyStream;

    async fn connect(
        &self,
        request: Request<Streaming<v1::AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let reply = self.reply.clone();
        let replies = request.into_inner().map(move |message| {
            let message = message?;
            let op_id = match message.message {
                Some(v1::agent_message::Message::Result(result)) => result.op_id,
                _ => String::new(),
            };
            Ok(v1::ServerMessage {
                message: Some(v1::server_message::Message::Operation(
                    v1::OperationRequest {
                        op_id,
                        ..reply.clone()
                    },
                )),
            })
        });
        Ok(Response::new(Box::pin(replies)))
    }
}

/// The hidden `echo-server` subcommand: serves [`Echo`] on a free loopback
/// port, prints the address, and exits when stdin closes.
pub fn echo_server_main() -> anyhow::Result<()> {
    serve_baseline(|incoming| async move {
        tonic::transport::Server::builder()
            .add_service(ConfiguratorsServer::new(Echo {
                reply: echo_reply(),
            }))
            .serve_with_incoming(incoming)
            .await
            .context("the echo server failed")
    })
}

/// One echo measurement.
struct EchoFigure {
    window: usize,
    round_trips: u64,
    elapsed: Duration,
    server_cpu: Duration,
    bench_cpu: Duration,
}

impl EchoFigure {
    fn per_second(&self) -> f64 {
        self.round_trips as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    fn cores(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    fn line(&self) -> String {
        format!(
            "tonic echo, {:>4} outstanding: {:>9} round trips in {:.2} s = {:>9}/s (echo server {:.2} cores, bench {:.2} cores)",
            self.window,
            self.round_trips,
            self.elapsed.as_secs_f64(),
            thousands(self.per_second()),
            self.cores(self.server_cpu),
            self.cores(self.bench_cpu),
        )
    }
}

// ---- the store baseline ----

/// One store measurement.
struct StoreFigure {
    committers: usize,
    commits: usize,
    elapsed: Duration,
    fsyncs: u64,
    p50_ms: f64,
}

impl StoreFigure {
    fn per_second(&self) -> f64 {
        self.commits as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// Operations per second the store allows at two commits each.
    fn operation_bound(&self) -> f64 {
        self.per_second() / 2.0
    }

    fn line(&self) -> String {
        format!(
            "SledStore 1-record commits, fsync, {:>2} committer(s): {:>7} commits in {:.2} s = {:>7}/s, {} fsyncs ({:.2} commits/fsync), p50 {:.2} ms",
            self.committers,
            self.commits,
            self.elapsed.as_secs_f64(),
            thousands(self.per_second()),
            self.fsyncs,
            self.commits as f64 / self.fsyncs.max(1) as f64,
            self.p50_ms,
        )
    }
}

/// `committers` threads each committing one record at a time to a fresh
/// SledStore (default options: fsync on).
fn store_commits(committers: usize, seconds: Duration) -> anyhow::Result<StoreFigure> {
    let dir = bench_dir()?;
    let store = SledStore::open(dir.path(), SledOptions::default())?;
    let value = vec![b'v'; RECORD_VALUE_BYTES];
    let commit = |writer: usize, round: u64| -> anyhow::Result<()> {
        let mut batch = WriteBatch::new();
        let key = keys::current_item_key(1, &format!("t{writer}"), &format!("i{}", round % 2000));
        batch.put(key, value.clone());
        store.commit_blocking(batch)?;
        Ok(())
    };
    for writer in 0..committers {
        commit(writer, 0)?;
    }
    let fsyncs_before = store.commit_stats().flushes;
    let run = drive_threads(committers, seconds, commit)?;
    let fsyncs = store.commit_stats().flushes - fsyncs_before;
    let p50_ms = run
        .latencies
        .get(run.latencies.len() / 2)
        .map_or(f64::NAN, |latency| latency.as_secs_f64() * 1e3);
    Ok(StoreFigure {
        committers,
        commits: run.latencies.len(),
        elapsed: run.elapsed,
        fsyncs,
        p50_ms,
    })
}

// ---- reconciled ----

/// What the configurators were asked to do.
#[derive(Debug, Default)]
struct Counts {
    creates: AtomicU64,
    modifies: AtomicU64,
    deletes: AtomicU64,
}

impl Counts {
    fn snapshot(&self) -> [u64; 3] {
        [
            self.creates.load(Ordering::Relaxed),
            self.modifies.load(Ordering::Relaxed),
            self.deletes.load(Ordering::Relaxed),
        ]
    }
}

/// A configurator that answers every operation with `done` at once.
struct Noop(Arc<Counts>);

impl Configurator for Noop {
    async fn create(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
        self.0.creates.fetch_add(1, Ordering::Relaxed);
        Outcome::done()
    }

    async fn modify(&self, _ctx: &OperationContext, _previous: &Item, _item: &Item) -> Outcome {
        self.0.modifies.fetch_add(1, Ordering::Relaxed);
        Outcome::done()
    }

    async fn delete(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
        self.0.deletes.fetch_add(1, Ordering::Relaxed);
        Outcome::done()
    }
}

/// The phases of a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Create,
    Modify,
    Delete,
}

impl Phase {
    const ALL: [Phase; 3] = [Phase::Create, Phase::Modify, Phase::Delete];

    fn name(self) -> &'static str {
        match self {
            Phase::Create => "create",
            Phase::Modify => "modify",
            Phase::Delete => "delete",
        }
    }

    /// Index of this phase's operation kind in [`Counts::snapshot`].
    fn index(self) -> usize {
        match self {
            Phase::Create => 0,
            Phase::Modify => 1,
            Phase::Delete => 2,
        }
    }

    /// The SubmitIntent requests of this phase: the intent in subgraphs of
    /// [`REQUEST_ITEMS`] items (`part-0`, `part-1`, ...), each emptied by
    /// the Delete phase. In the hub shape the hub has a subgraph of its
    /// own (`hub`), which the modify phase sends alone, and which the
    /// Delete phase empties last, as one removes a network's ports and
    /// then the network.
    fn requests(self, configuration: Configuration) -> Vec<v1::SubmitIntentRequest> {
        let mut items = self.intent(configuration).into_iter().peekable();
        let hub = matches!(configuration.shape, Shape::Hub { .. }).then(|| {
            let hub = items.next_if(|item| item.name == "i0");
            let mut request = api::submit(TENANT, hub.into_iter().collect());
            request.subgraph = "hub".to_owned();
            request
        });
        if self == Phase::Modify && hub.is_some() {
            return hub.into_iter().collect();
        }
        let rest = configuration
            .items
            .saturating_sub(usize::from(hub.is_some()));
        let parts: Vec<v1::SubmitIntentRequest> = (0..rest.div_ceil(REQUEST_ITEMS).max(1))
            .map(|part| {
                let mut request = api::submit(TENANT, items.by_ref().take(REQUEST_ITEMS).collect());
                request.subgraph = format!("part-{part}");
                request
            })
            .collect();
        match self {
            Phase::Delete
                if configuration.shape
                    == (Shape::Hub {
                        removed_first: true,
                    }) =>
            {
                hub.into_iter().chain(parts).collect()
            }
            Phase::Delete => parts.into_iter().chain(hub).collect(),
            Phase::Create | Phase::Modify => hub.into_iter().chain(parts).collect(),
        }
    }

    /// The intent of this phase: N items with `round` 0, then 1 (the hub
    /// alone in the hub shape), then none.
    fn intent(self, configuration: Configuration) -> Vec<v1::Item> {
        let round = match self {
            Phase::Create => 0,
            Phase::Modify => 1,
            Phase::Delete => return Vec::new(),
        };
        let agents = configuration.agents;
        let on = |m: usize| api::dependency(&item_type(m % agents.max(1)), &format!("i{m}"));
        (0..configuration.items)
            .map(|n| {
                let (round, dependencies) = match configuration.shape {
                    Shape::Independent => (round, Vec::new()),
                    Shape::Chain => (
                        round,
                        (n + 1..(n + 11).min(configuration.items)).map(on).collect(),
                    ),
                    Shape::Hub { .. } if n == 0 => (round, Vec::new()),
                    Shape::Hub { .. } => (0, vec![on(0)]),
                };
                let mut item = bench_item(n, agents, round);
                item.dependencies = dependencies;
                item
            })
            .collect()
    }

    /// Operations this phase runs: one per item, or the hub's Modify.
    fn operations(self, configuration: Configuration) -> usize {
        match (self, configuration.shape) {
            (Phase::Modify, Shape::Hub { .. }) => 1,
            _ => configuration.items,
        }
    }
}

/// Item `t{n % agents}/i{n}` with `round` as a property.
fn bench_item(n: usize, agents: usize, round: u64) -> v1::Item {
    api::item(
        &item_type(n % agents.max(1)),
        &format!("i{n}"),
        serde_json::json!({ "index": n, "round": round }),
    )
}

/// The item type agent `k` registers.
fn item_type(k: usize) -> String {
    format!("t{k}")
}

/// What one phase measured.
struct PhaseFigure {
    phase: Phase,
    /// Operations of each kind the configurators ran during the phase.
    counted: [u64; 3],
    /// SubmitIntent's latency.
    submit: Duration,
    /// From SubmitIntent to the poll that saw convergence.
    elapsed: Duration,
    polls: u64,
    /// The tenant's revision grew by this much: one per durable commit.
    commits: u64,
    server_cpu: Duration,
    bench_cpu: Duration,
}

impl PhaseFigure {
    fn operations(&self) -> u64 {
        self.counted[self.phase.index()]
    }

    fn per_second(&self) -> f64 {
        self.operations() as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    fn cores(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    fn commits_per_operation(&self) -> f64 {
        self.commits as f64 / self.operations().max(1) as f64
    }

    /// Server CPU time per operation, in milliseconds.
    fn server_cpu_ms_per_operation(&self) -> f64 {
        self.server_cpu.as_secs_f64() * 1e3 / self.operations().max(1) as f64
    }

    /// Operations of other kinds than the phase's, or a count off N.
    fn anomaly(&self, expected: usize) -> Option<String> {
        let [creates, modifies, deletes] = self.counted;
        let expected_counts = match self.phase {
            Phase::Create => [expected as u64, 0, 0],
            Phase::Modify => [0, expected as u64, 0],
            Phase::Delete => [0, 0, expected as u64],
        };
        (self.counted != expected_counts)
            .then(|| format!("ran {creates} creates, {modifies} modifies, {deletes} deletes"))
    }

    fn line(&self, expected: usize) -> String {
        format!(
            "{:<6}: {:>6} ops in {:>6.2} s = {:>7} ops/s (SubmitIntent {:.1} ms, {} polls, {} tenant commits = {:.2}/op, server {:.2} cores, bench {:.2} cores){}",
            self.phase.name(),
            self.operations(),
            self.elapsed.as_secs_f64(),
            decimal(self.per_second()),
            self.submit.as_secs_f64() * 1e3,
            self.polls,
            self.commits,
            self.commits_per_operation(),
            self.cores(self.server_cpu),
            self.cores(self.bench_cpu),
            self.anomaly(expected)
                .map(|anomaly| format!(" WARNING: {anomaly}"))
                .unwrap_or_default(),
        )
    }
}

/// Starts a server, runs the configuration's phases, stops everything.
async fn run_configuration(
    configuration: Configuration,
    phase_timeout: Duration,
    perf: Option<PerfSettings<'_>>,
) -> anyhow::Result<Vec<PhaseFigure>> {
    let mut server = ServerProcess::start(ServerOptions::default().without_byte_budget()).await?;
    let outcome = measure_configuration(&server, configuration, phase_timeout, perf).await;
    let stopped = server.terminate().await;
    match (outcome, stopped) {
        (Ok(phases), Ok(_)) => Ok(phases),
        (Err(error), _) => Err(error.context(format!("server log tail:\n{}", server.log_tail()))),
        (Ok(_), Err(error)) => Err(error),
    }
}

async fn measure_configuration(
    server: &ServerProcess,
    configuration: Configuration,
    phase_timeout: Duration,
    perf: Option<PerfSettings<'_>>,
) -> anyhow::Result<Vec<PhaseFigure>> {
    let server_pid = find_child_pid(server)?;
    let channel = server.channel().await?;
    let token = api::tenants(&channel, &server.admin_token())
        .create_tenant(v1::CreateTenantRequest {
            name: TENANT.to_owned(),
            limits: None,
        })
        .await
        .context("CreateTenant failed")?
        .into_inner()
        .token;
    let counts = Arc::new(Counts::default());
    let agents = Agents::start(server, &token, configuration, &counts).await?;
    let mut client = api::reconciler(&channel, &token);
    let profiler = match perf {
        Some(settings) => Some(Profiler::start(server_pid, settings).await?),
        None => None,
    };
    let mut phases = Vec::new();
    let mut failure = None;
    for phase in Phase::ALL {
        match run_phase(
            &mut client,
            phase,
            configuration,
            &counts,
            server_pid,
            phase_timeout,
        )
        .await
        {
            Ok(figure) => {
                println!("{}", figure.line(phase.operations(configuration)));
                phases.push(figure);
            }
            Err(error) => {
                failure = Some(error.context(format!("the {} phase failed", phase.name())));
                break;
            }
        }
    }
    if let Some(profiler) = profiler {
        profiler.stop().await?;
    }
    agents.stop().await;
    match failure {
        Some(error) => Err(error),
        None => Ok(phases),
    }
}

/// Submits the phase's intent and waits until the tenant converged on it.
async fn run_phase(
    client: &mut Reconciler,
    phase: Phase,
    configuration: Configuration,
    counts: &Counts,
    server_pid: u32,
    timeout: Duration,
) -> anyhow::Result<PhaseFigure> {
    let requests = phase.requests(configuration);
    let revision_before = tenant_status(client).await?.revision;
    let counted_before = counts.snapshot();
    let server_cpu_before = process_cpu(server_pid)?;
    let bench_cpu_before = process_cpu(std::process::id())?;
    let start = Instant::now();
    let mut generation = 0;
    let mut changed = false;
    for request in requests {
        let reply = client
            .submit_intent(request)
            .await
            .context("SubmitIntent failed")?
            .into_inner();
        changed |= reply.changed;
        generation = reply.generation;
    }
    ensure!(changed, "the phase's SubmitIntents changed nothing");
    let submit = start.elapsed();
    let mut polls = 0;
    let revision_after = loop {
        let status = tenant_status(client).await?;
        polls += 1;
        if converged(&status, generation) {
            break status.revision;
        }
        if condition_holds(&status, "Stalled") {
            bail!("the tenant stalled: {status:?}");
        }
        if start.elapsed() > timeout {
            bail!(
                "not converged after {timeout:?}: {} in flight, items by state {:?}, conditions {:?}",
                status.operations_in_flight,
                status.items_by_state,
                status.conditions
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    };
    let elapsed = start.elapsed();
    let server_cpu = process_cpu(server_pid)?.saturating_sub(server_cpu_before);
    let bench_cpu = process_cpu(std::process::id())?.saturating_sub(bench_cpu_before);
    let counted_after = counts.snapshot();
    let counted = std::array::from_fn(|kind| counted_after[kind] - counted_before[kind]);
    Ok(PhaseFigure {
        phase,
        counted,
        submit,
        elapsed,
        polls,
        commits: revision_after.saturating_sub(revision_before),
        server_cpu,
        bench_cpu,
    })
}

/// The tenant's status.
async fn tenant_status(client: &mut Reconciler) -> anyhow::Result<v1::TenantStatus> {
    client
        .get_status(v1::GetStatusRequest {
            tenant: TENANT.to_owned(),
        })
        .await
        .context("GetStatus failed")?
        .into_inner()
        .status
        .ok_or_else(|| anyhow!("GetStatus returned no status"))
}

/// Whether condition `kind` is True.
fn condition_holds(status: &v1::TenantStatus, kind: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.r#type == kind && c.status == v1::ConditionStatus::True as i32)
}

/// Ready for `generation` (or later) with nothing in flight.
fn converged(status: &v1::TenantStatus, generation: u64) -> bool {
    status.observed_generation >= generation
        && status.operations_in_flight == 0
        && status.conditions.iter().any(|c| {
            c.r#type == "Ready"
                && c.status == v1::ConditionStatus::True as i32
                && c.observed_generation >= generation
        })
}

/// A running agent: what stops it, and its run task.
type RunningAgent = (oneshot::Sender<()>, JoinHandle<Result<(), AgentError>>);

/// The running agents of a configuration.
struct Agents {
    running: Vec<RunningAgent>,
}

impl Agents {
    /// Starts `configuration.agents` agents and waits until each registered.
    async fn start(
        server: &ServerProcess,
        token: &str,
        configuration: Configuration,
        counts: &Arc<Counts>,
    ) -> anyhow::Result<Self> {
        let mut agents = Agents {
            running: Vec::new(),
        };
        for k in 0..configuration.agents {
            let agent = Agent::builder(server.endpoint(), TENANT, token)
                .agent_id(format!("bench-agent-{k}"))
                .item_type(
                    TypeSpec::new(item_type(k)).max_in_flight(configuration.in_flight),
                    Noop(Arc::clone(counts)),
                )
                .drain_timeout(AGENT_DRAIN)
                .build()
                .with_context(|| format!("cannot build agent {k}"))?;
            let events = agent.events();
            let (stop, stopped) = oneshot::channel::<()>();
            let task = tokio::spawn(agent.run(async move {
                let _ = stopped.await;
            }));
            agents.running.push((stop, task));
            wait_connected(events)
                .await
                .with_context(|| format!("agent {k} did not register"))?;
        }
        println!("{} agent(s) registered", configuration.agents);
        Ok(agents)
    }

    /// Asks every agent to stop and waits (bounded) for them.
    async fn stop(mut self) {
        let running = std::mem::take(&mut self.running);
        let mut tasks = Vec::new();
        for (stop, task) in running {
            let _ = stop.send(());
            tasks.push(task);
        }
        for mut task in tasks {
            if tokio::time::timeout(START_DEADLINE, &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        for (_, task) in &self.running {
            task.abort();
        }
    }
}

/// Waits for the agent's `Connected` event.
async fn wait_connected(mut events: broadcast::Receiver<AgentEvent>) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + START_DEADLINE;
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Err(_) => bail!("no Connected event within {START_DEADLINE:?}"),
            Ok(Ok(AgentEvent::Connected { .. })) => return Ok(()),
            Ok(Ok(AgentEvent::Disconnected { reason, .. })) => {
                println!("agent disconnected while registering: {reason}");
            }
            Ok(Ok(_) | Err(broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(broadcast::error::RecvError::Closed)) => {
                bail!("the agent stopped before registering")
            }
        }
    }
}

/// How to run perf.
#[derive(Debug, Clone, Copy)]
struct PerfSettings<'a> {
    path: &'a Path,
    call_graph: &'a str,
    frequency: u32,
}

/// `perf record -g` attached to the server.
struct Profiler {
    child: tokio::process::Child,
    path: PathBuf,
}

impl Profiler {
    async fn start(server_pid: u32, settings: PerfSettings<'_>) -> anyhow::Result<Self> {
        let path = settings.path;
        let call_graph = match settings.call_graph {
            "dwarf" => "dwarf,16384",
            other => other,
        };
        let child = tokio::process::Command::new("perf")
            .args(["record", "--call-graph", call_graph, "-F"])
            .arg(settings.frequency.to_string())
            .args(["-p", &server_pid.to_string(), "-o"])
            .arg(path)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start perf record (is perf installed?)")?;
        // Give perf time to attach before the first phase.
        tokio::time::sleep(Duration::from_millis(500)).await;
        println!(
            "perf recording server pid {server_pid} into {}",
            path.display()
        );
        Ok(Self {
            child,
            path: path.to_path_buf(),
        })
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        let pid = self
            .child
            .id()
            .ok_or_else(|| anyhow!("perf exited early"))?;
        let pid = i32::try_from(pid).context("perf's pid")?;
        kill(Pid::from_raw(pid), Signal::SIGINT).context("cannot stop perf")?;
        let status = tokio::time::timeout(START_DEADLINE, self.child.wait())
            .await
            .context("perf did not stop")??;
        println!(
            "perf stopped ({status}); see `perf report -i {} --no-children`",
            self.path.display()
        );
        Ok(())
    }
}

// ---- the tables ----

fn print_tables(
    echoes: &[EchoFigure],
    store_one: &StoreFigure,
    store_many: &StoreFigure,
    reports: &[(Configuration, Vec<PhaseFigure>)],
) {
    let many = store_many.committers;
    println!("\n## Raw limits (same run, loopback)\n");
    println!(
        "| baseline | concurrency | rate | bound on ops/s | server CPU (cores) | bench CPU (cores) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for echo in echoes {
        println!(
            "| tonic bidi echo (child process) | {} outstanding | {} round trips/s | {} | {:.2} | {:.2} |",
            echo.window,
            thousands(echo.per_second()),
            thousands(echo.per_second()),
            echo.cores(echo.server_cpu),
            echo.cores(echo.bench_cpu),
        );
    }
    for store in [store_one, store_many] {
        println!(
            "| SledStore 1-record commit, fsync | {} committer(s) | {} commits/s ({:.1} per fsync) | {} (2 commits/op) | | |",
            store.committers,
            thousands(store.per_second()),
            store.commits as f64 / store.fsyncs.max(1) as f64,
            thousands(store.operation_bound()),
        );
    }

    println!("\n## Operations through the SDK (fsync on, loopback, same run)\n");
    println!(
        "| agents | max_in_flight | items | phase | ops | seconds | ops/s | ÷ echo at same concurrency | ÷ store bound, 1 committer | ÷ store bound, {many} committers | commits/op | server CPU (cores) | server CPU ms/op | bench CPU (cores) |"
    );
    println!("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (configuration, phases) in reports {
        let echo = echoes
            .iter()
            .find(|echo| echo.window == configuration.in_flight as usize)
            .map_or(f64::NAN, EchoFigure::per_second);
        for phase in phases {
            let rate = phase.per_second();
            println!(
                "| {} | {} | {} | {}{} | {} | {:.2} | {} | {:.4} | {:.2} | {:.3} | {:.2} | {:.2} | {:.2} | {:.2} |",
                configuration.agents,
                configuration.in_flight,
                configuration.items,
                phase.phase.name(),
                if phase
                    .anomaly(phase.phase.operations(*configuration))
                    .is_some()
                {
                    " (!)"
                } else {
                    ""
                },
                phase.operations(),
                phase.elapsed.as_secs_f64(),
                decimal(rate),
                rate / echo,
                rate / store_one.operation_bound(),
                rate / store_many.operation_bound(),
                phase.commits_per_operation(),
                phase.cores(phase.server_cpu),
                phase.server_cpu_ms_per_operation(),
                phase.cores(phase.bench_cpu),
            );
        }
    }
    println!(
        "\nops/s runs from SubmitIntent to the GetStatus poll (every {} ms) that saw Ready for the new generation; \
         store bound = 1-record commits/s ÷ 2 (journal before sending, result after); \
         commits/op = growth of the tenant's revision (one per durable tenant commit) per operation. \
         (!) = the configurators ran other counts than expected.",
        POLL_INTERVAL.as_millis()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(kind: &str, status: v1::ConditionStatus, generation: u64) -> v1::Condition {
        v1::Condition {
            r#type: kind.to_owned(),
            status: status as i32,
            observed_generation: generation,
            ..v1::Condition::default()
        }
    }

    #[test]
    fn convergence_needs_ready_for_the_submitted_generation() {
        let mut status = v1::TenantStatus {
            observed_generation: 2,
            conditions: vec![condition("Ready", v1::ConditionStatus::True, 2)],
            ..v1::TenantStatus::default()
        };
        assert!(converged(&status, 2));
        assert!(!converged(&status, 3), "a stale Ready does not count");
        status.operations_in_flight = 1;
        assert!(!converged(&status, 2));
        status.operations_in_flight = 0;
        status.conditions = vec![condition("Ready", v1::ConditionStatus::False, 2)];
        assert!(!converged(&status, 2));
    }

    #[test]
    fn items_spread_over_the_agents_types() {
        let configuration = Configuration {
            agents: 3,
            in_flight: 1,
            items: 7,
            shape: Shape::Independent,
        };
        let items = Phase::Create.intent(configuration);
        assert_eq!(items.len(), 7);
        assert_eq!(items[4].r#type, "t1");
        assert_eq!(items[4].name, "i4");
        assert!(items[4].dependencies.is_empty());
        let chained = Phase::Create.intent(Configuration {
            shape: Shape::Chain,
            ..configuration
        });
        let required: Vec<&str> = chained[4]
            .dependencies
            .iter()
            .filter_map(|d| d.requires.as_ref().map(|r| r.name.as_str()))
            .collect();
        assert_eq!(required, ["i5", "i6"], "the next ten, within the intent");
        assert!(Phase::Delete.intent(configuration).is_empty());
        let large = Configuration {
            items: 2 * REQUEST_ITEMS + 1,
            ..configuration
        };
        let parts: Vec<(String, usize)> = Phase::Create
            .requests(large)
            .into_iter()
            .map(|request| (request.subgraph, request.items.len()))
            .collect();
        assert_eq!(
            parts,
            [
                ("part-0".to_owned(), REQUEST_ITEMS),
                ("part-1".to_owned(), REQUEST_ITEMS),
                ("part-2".to_owned(), 1)
            ]
        );
        assert_eq!(Phase::Delete.requests(large).len(), 3);
        let changed = Phase::Modify.intent(configuration);
        assert_ne!(items[0].properties, changed[0].properties);
        let hub = Configuration {
            shape: Shape::Hub {
                removed_first: false,
            },
            ..configuration
        };
        let (created, modified) = (Phase::Create.intent(hub), Phase::Modify.intent(hub));
        assert!(created[0].dependencies.is_empty());
        let required: Vec<&str> = created[6]
            .dependencies
            .iter()
            .filter_map(|d| d.requires.as_ref().map(|r| r.name.as_str()))
            .collect();
        assert_eq!(required, ["i0"], "every other item depends on the hub");
        let changed: Vec<usize> = (0..7)
            .filter(|&n| created[n].properties != modified[n].properties)
            .collect();
        assert_eq!(changed, [0], "the modify phase changes the hub alone");
        assert_eq!(Phase::Modify.operations(hub), 1);
        let hub_alone: Vec<(String, usize)> = Phase::Modify
            .requests(hub)
            .into_iter()
            .map(|request| (request.subgraph, request.items.len()))
            .collect();
        assert_eq!(hub_alone, [("hub".to_owned(), 1)]);
        let emptied: Vec<(String, usize)> = Phase::Delete
            .requests(hub)
            .into_iter()
            .map(|request| (request.subgraph, request.items.len()))
            .collect();
        assert_eq!(emptied, [("part-0".to_owned(), 0), ("hub".to_owned(), 0)]);
        assert_eq!(Phase::Delete.operations(hub), 7);
        let hub_first = Configuration {
            shape: Shape::Hub {
                removed_first: true,
            },
            ..hub
        };
        let emptied: Vec<String> = Phase::Delete
            .requests(hub_first)
            .into_iter()
            .map(|request| request.subgraph)
            .collect();
        assert_eq!(emptied, ["hub", "part-0"], "the hub goes first");
    }

    #[test]
    fn configurations_run_the_largest_last_with_their_sizes() {
        let args = OperationsArgs {
            agents: vec![10, 1],
            in_flight: vec![64, 1],
            items_serial: 500,
            items_concurrent: 2000,
            echo_seconds: 1,
            store_seconds: 1,
            committers: 16,
            phase_timeout: 10,
            perf: None,
            perf_call_graph: "fp".to_owned(),
            perf_frequency: 999,
            chain: false,
            hub: false,
            hub_first: false,
        };
        args.check().expect("valid");
        let configurations = args.configurations();
        assert_eq!(configurations.len(), 4);
        assert_eq!(
            configurations[0],
            Configuration {
                agents: 1,
                in_flight: 1,
                items: 500,
                shape: Shape::Independent,
            }
        );
        assert_eq!(
            configurations[3],
            Configuration {
                agents: 10,
                in_flight: 64,
                items: 2000,
                shape: Shape::Independent,
            }
        );
    }

    #[test]
    fn a_phase_flags_unexpected_operations() {
        let figure = PhaseFigure {
            phase: Phase::Modify,
            counted: [0, 5, 0],
            submit: Duration::ZERO,
            elapsed: Duration::from_secs(1),
            polls: 1,
            commits: 10,
            server_cpu: Duration::ZERO,
            bench_cpu: Duration::ZERO,
        };
        assert_eq!(figure.anomaly(5), None);
        assert!(figure.anomaly(6).is_some());
        assert_eq!(figure.per_second(), 5.0);
        assert_eq!(figure.commits_per_operation(), 2.0);
    }
}
