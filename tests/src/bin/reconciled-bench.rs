//! `reconciled-bench`: measures the real server against raw limits, in one
//! run on one machine. Two subcommands:
//!
//! - `submit` (below): durable SubmitIntent throughput against the raw
//!   limits of its store;
//! - `etcd` (see the [`etcd`] module): SubmitIntent on `--store etcd`
//!   against raw etcd transactions of the same records;
//! - `replicas` (see the [`replicas`] module): 1 and 3 replicas on one
//!   etcd, SubmitIntent and operations through agents against raw etcd
//!   transactions of the same bytes, and the failover time;
//! - `operations` (see the [`operations`] module): operations per second
//!   dispatched to agents built with our SDK, against a bare tonic
//!   bidirectional echo and SledStore 1-record commits;
//! - `hostile` (see the [`hostile`] module): a bystander tenant's latency
//!   and throughput alone and while hostile tenants run the hostile
//!   suite's worst cases (`watch` and `scale` have modules of their own
//!   too).
//!
//! ```text
//! cargo build --release -p reconciled
//! RECONCILED_BIN=target/release/reconciled \
//!     cargo run --release -p reconciled-tests --bin reconciled-bench -- submit
//! RECONCILED_BIN=target/release/reconciled \
//!     cargo run --release -p reconciled-tests --bin reconciled-bench -- operations
//! ```
//!
//! `submit`: for every request size N (`--items`, default `10,1000,10000`) it measures,
//! each for `--seconds`:
//!
//! 1. **raw sled**: plain `sled` opened like the store opens it (8 MiB
//!    segments), one `apply_batch` of N records, `flush()` and an fsync of the
//!    log file `<dir>/db/db` per commit, one commit at a time;
//! 2. **SledStore**: our store with default options (fsync on), one
//!    `commit_blocking` of N records at a time, then with `--clients`
//!    threads committing at once (group commit);
//! 3. **reconciled**: the real server (default options, fsync on) started
//!    with [`ServerProcess`], one tenant, SubmitIntent of N items as fast as
//!    possible from one client, from `--clients` clients on the same tenant
//!    (each owning subgraph `c{k}`), and from `--clients` clients on a tenant
//!    each.
//!
//! The raw records are the server's own: keys from
//! `store::keys::intended_item_key`, values `StoredIntended` encoded with the
//! server's `tenant::record::encode`, items converted from the same protobuf
//! items with the server's `wire::item_from_proto`. Every timed
//! submit changes a property of every item (`round`), so every request
//! stores N items; the raw runs alternate between two pre-encoded rounds so
//! that encoding is not charged to the raw path. Everything runs on
//! loopback, bounded by `--seconds` per measurement.
//!
//! CPU columns are CPU time divided by wall time (cores busy), read from
//! `/proc`: "server" is the reconciled process, "bench" this process (for the
//! raw runs that is the store itself; for the server runs it is the client).
#![forbid(unsafe_code)]

use std::fs::OpenOptions;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use clap::{Args, Parser, Subcommand};
use reconciled::store::{SledOptions, SledStore, Store as _, WriteBatch, keys};
use reconciled::tenant::record::{StoredIntended, encode};
use reconciled_tests::api::{self, Reconciler};
use reconciled_tests::proto::v1;
use reconciled_tests::{ServerOptions, ServerProcess};

#[path = "reconciled_bench/etcd.rs"]
mod etcd;
#[path = "reconciled_bench/hostile.rs"]
mod hostile;
#[path = "reconciled_bench/operations.rs"]
mod operations;
#[path = "reconciled_bench/replicas.rs"]
mod replicas;
#[path = "reconciled_bench/scale.rs"]
mod scale;
#[path = "reconciled_bench/watch.rs"]
mod watch;

/// The most items the server accepts in one request by default.
const MAX_REQUEST_ITEMS: usize = 10_000;

/// The longest measurement allowed per run, in seconds.
const MAX_SECONDS: u64 = 120;

/// The most concurrent clients allowed.
const MAX_CLIENTS: usize = 64;

/// sled's segment size as the store configures it (see `sled_files.rs`).
const SEGMENT_SIZE: usize = 8 * 1024 * 1024;

/// The tenant id the raw runs put in their keys (fixed width, so any id
/// gives the same key size).
const RAW_TENANT_ID: u64 = 1;

/// The item type of every benchmark item.
const ITEM_TYPE: &str = "bench.interface";

/// Linux reports process CPU times in `/proc` in units of 1/100 s.
const PROC_TICKS_PER_SECOND: f64 = 100.0;

/// Measures reconciled against the raw limits of its store.
#[derive(Debug, Parser)]
#[command(name = "reconciled-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// What to measure.
#[derive(Debug, Subcommand)]
enum Command {
    /// Durable SubmitIntent throughput versus raw sled and SledStore commits
    /// of the same records.
    Submit(SubmitArgs),
    /// Operations per second through agents built with the SDK, versus a
    /// bare tonic bidirectional echo and SledStore 1-record commits.
    Operations(operations::OperationsArgs),
    /// Events per second delivered to 1, 100 and 1000 watchers, and the
    /// delay from commit to delivery, versus a bare tonic fan-out.
    Watch(watch::WatchArgs),
    /// SubmitIntent on the etcd store versus raw etcd transactions of the
    /// same records, against one real etcd started for the run.
    Etcd(etcd::EtcdArgs),
    /// Replicas on one etcd (1 and 3): SubmitIntent and operations through
    /// agents versus raw etcd transactions of the same bytes, and the
    /// failover time after `kill -9` of an owner.
    Replicas(replicas::ReplicasArgs),
    /// Many tenants and agents on one server: resident memory, start-up
    /// time, and the time until every tenant is Ready after a restart.
    Scale(scale::ScaleArgs),
    /// A bystander tenant's GetStatus latency and SubmitIntent throughput,
    /// alone and while hostile tenants run the hostile suite's worst cases.
    Hostile(hostile::HostileArgs),
    /// Every ratio against its raw limit in one run: `submit`, then
    /// `operations` with 1, 10 and 100 agents (1 and 64 in flight, a
    /// 10,000-item create at 64), then `watch` with 1, 100 and 1000
    /// watchers.
    All,
    /// Internal: the bare tonic echo server `operations` starts as a child
    /// process; prints its address on stdout, exits when stdin closes.
    #[command(hide = true)]
    EchoServer,
    /// Internal: the bare tonic fan-out server `watch` starts as a child
    /// process; prints its address on stdout, exits when stdin closes.
    #[command(hide = true)]
    FanoutServer,
}

/// Options of `reconciled-bench submit`.
#[derive(Debug, Args)]
struct SubmitArgs {
    /// Items per request (and records per raw commit), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10,1000,10000")]
    items: Vec<usize>,
    /// Seconds each measurement runs.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Concurrent clients (and raw writer threads) of the concurrent runs.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Bytes of filler text in every item's properties.
    #[arg(long, default_value_t = 64)]
    padding: usize,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Submit(args) => submit_benchmark(&args),
        Command::Operations(args) => operations::operations_benchmark(&args),
        Command::Watch(args) => watch::watch_benchmark(&args),
        Command::Scale(args) => scale::scale_benchmark(&args),
        Command::Etcd(args) => etcd::etcd_benchmark(&args),
        Command::Hostile(args) => hostile::hostile_benchmark(&args),
        Command::Replicas(args) => replicas::replicas_benchmark(&args),
        Command::All => {
            for args in [
                &["submit", "--seconds", "3"][..],
                &[
                    "operations",
                    "--agents",
                    "1,10,100",
                    "--in-flight",
                    "1,64",
                    "--items-concurrent",
                    "10000",
                ],
                &["watch", "--watchers", "1,100,1000", "--commits", "20"],
            ] {
                println!("\n===== reconciled-bench {} =====\n", args.join(" "));
                let cli = Cli::try_parse_from(
                    std::iter::once("reconciled-bench").chain(args.iter().copied()),
                )?;
                match cli.command {
                    Command::Submit(args) => submit_benchmark(&args)?,
                    Command::Operations(args) => operations::operations_benchmark(&args)?,
                    Command::Watch(args) => watch::watch_benchmark(&args)?,
                    other => anyhow::bail!("not a benchmark of `all`: {other:?}"),
                }
            }
            Ok(())
        }
        Command::EchoServer => operations::echo_server_main(),
        Command::FanoutServer => watch::fanout_server_main(),
    }
}

/// What the runs of one request size measured.
struct SizeReport {
    items: usize,
    bytes_per_item: f64,
    raw_sled: Measurement,
    sled_store: Measurement,
    sled_store_concurrent: Measurement,
    reconciled_one: Measurement,
    reconciled_subgraphs: Measurement,
    reconciled_tenants: Measurement,
}

fn submit_benchmark(args: &SubmitArgs) -> anyhow::Result<()> {
    ensure!(!args.items.is_empty(), "--items needs at least one size");
    for &items in &args.items {
        ensure!(
            (1..=MAX_REQUEST_ITEMS).contains(&items),
            "--items {items} is outside 1..={MAX_REQUEST_ITEMS} (the server's per-request limit)"
        );
    }
    ensure!(
        (1..=MAX_SECONDS).contains(&args.seconds),
        "--seconds must be within 1..={MAX_SECONDS}"
    );
    ensure!(
        (1..=MAX_CLIENTS).contains(&args.clients),
        "--clients must be within 1..={MAX_CLIENTS}"
    );
    let seconds = Duration::from_secs(args.seconds);
    // The client side runs on one thread: the machine is shared with the
    // server, and the server's figures are what we measure.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    println!(
        "reconciled-bench submit: sizes {:?}, {} s per run, {} concurrent clients, {} bytes of padding per item; server binary {}",
        args.items,
        args.seconds,
        args.clients,
        args.padding,
        reconciled_tests::reconciled_binary().display()
    );

    let mut reports = Vec::new();
    for &items in &args.items {
        println!("\n## {items} items per request");
        let records = RawRecords::build(items, args.clients, args.padding)?;
        let bytes_per_request = records.bytes_per_commit();
        println!(
            "records: {items} per commit, {bytes_per_request} bytes of keys and values per commit ({:.0} per item)",
            bytes_per_request as f64 / items as f64
        );
        let raw_sled = report(run_raw_sled(&records, seconds)?);
        let sled_store = report(run_sled_store(&records, 1, seconds)?);
        let sled_store_concurrent = report(run_sled_store(&records, args.clients, seconds)?);
        let shape = Shape {
            items,
            padding: args.padding,
            bytes_per_request,
        };
        let reconciled_one =
            report(runtime.block_on(run_reconciled(&shape, 1, Spread::Subgraphs, seconds))?);
        let reconciled_subgraphs = report(runtime.block_on(run_reconciled(
            &shape,
            args.clients,
            Spread::Subgraphs,
            seconds,
        ))?);
        let reconciled_tenants = report(runtime.block_on(run_reconciled(
            &shape,
            args.clients,
            Spread::Tenants,
            seconds,
        ))?);
        reports.push(SizeReport {
            items,
            bytes_per_item: bytes_per_request as f64 / items as f64,
            raw_sled,
            sled_store,
            sled_store_concurrent,
            reconciled_one,
            reconciled_subgraphs,
            reconciled_tenants,
        });
    }
    print_tables(&reports, args.clients);
    Ok(())
}

/// Prints one run's figures as it finishes, and passes it on.
fn report(measurement: Measurement) -> Measurement {
    println!("{}", measurement.line());
    measurement
}

// ---- the records ----

/// Store records, key and value, in commit order.
type Records = Vec<(Vec<u8>, Vec<u8>)>;

/// The intended-item records the server stores for the benchmark's intents:
/// per client, two rounds (alternated so that every commit changes values).
struct RawRecords {
    /// `per_client[k][round % 2]`: the records of client `k`'s subgraph.
    per_client: Vec<[Records; 2]>,
}

impl RawRecords {
    fn build(items: usize, clients: usize, padding: usize) -> anyhow::Result<Self> {
        let per_client = (0..clients)
            .map(|client| {
                Ok([
                    stored_records(client, items, 1, padding)?,
                    stored_records(client, items, 2, padding)?,
                ])
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self { per_client })
    }

    fn bytes_per_commit(&self) -> usize {
        self.per_client
            .first()
            .map(|rounds| rounds[1].iter().map(|(k, v)| k.len() + v.len()).sum())
            .unwrap_or(0)
    }

    fn round(&self, client: usize, round: u64) -> &[(Vec<u8>, Vec<u8>)] {
        &self.per_client[client][usize::from(round % 2 == 1)]
    }
}

/// The records the server writes for client `client`'s intent in `round`:
/// the same protobuf items, converted and encoded by the server's code.
fn stored_records(
    client: usize,
    items: usize,
    round: u64,
    padding: usize,
) -> anyhow::Result<Records> {
    proto_items(client, items, round, padding)
        .into_iter()
        .enumerate()
        .map(|(index, proto)| {
            let mut item = reconciled::wire::item_from_proto(proto, index)
                .map_err(|violations| anyhow!("benchmark item is invalid: {violations:?}"))?;
            // The server places items with no subgraph in the request's.
            item.subgraph = subgraph_of(client).into();
            let key = keys::intended_item_key(RAW_TENANT_ID, item.item_type(), item.name());
            let value = encode(&StoredIntended {
                item,
                generation: round,
            })?;
            Ok((key, value))
        })
        .collect()
}

/// The subgraph client `client` owns.
fn subgraph_of(client: usize) -> String {
    format!("c{client}")
}

/// Client `client`'s items for `round`; names are unique across clients
/// (an item may be listed in one subgraph only).
fn proto_items(client: usize, items: usize, round: u64, padding: usize) -> Vec<v1::Item> {
    let filler = "x".repeat(padding);
    (0..items)
        .map(|index| {
            api::item(
                ITEM_TYPE,
                &format!("c{client}-if-{index:05}"),
                serde_json::json!({
                    "index": index,
                    "mtu": 1500,
                    "enabled": true,
                    "round": round,
                    "note": filler,
                }),
            )
        })
        .collect()
}

/// Sets the `round` property of every item, making the request a change.
fn set_round(request: &mut v1::SubmitIntentRequest, round: u64) {
    for item in &mut request.items {
        if let Some(properties) = &mut item.properties
            && let Some(value) = properties.fields.get_mut("round")
        {
            value.kind = Some(prost_types::value::Kind::NumberValue(round as f64));
        }
    }
}

// ---- raw runs ----

/// Plain sled, opened as the store opens it, one durable commit at a time.
fn run_raw_sled(records: &RawRecords, seconds: Duration) -> anyhow::Result<Measurement> {
    let dir = bench_dir()?;
    let sled_dir = dir.path().join("db");
    let db = sled::Config::new()
        .path(&sled_dir)
        .segment_size(SEGMENT_SIZE)
        .open()
        .context("cannot open sled")?;
    let log_path = sled_dir.join("db");
    let log_file = OpenOptions::new()
        .write(true)
        .open(&log_path)
        .with_context(|| format!("cannot open {} for fsync", log_path.display()))?;
    let fsyncs = AtomicU64::new(0);
    let commit = |round: u64| -> anyhow::Result<()> {
        let mut batch = sled::Batch::default();
        for (key, value) in records.round(0, round) {
            batch.insert(key.as_slice(), value.as_slice());
        }
        db.apply_batch(batch).context("apply_batch failed")?;
        db.flush().context("flush failed")?;
        log_file.sync_all().context("fsync failed")?;
        fsyncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    };
    commit(0)?;
    fsyncs.store(0, Ordering::Relaxed);
    let run = drive_threads(1, seconds, |_, round| commit(round))?;
    Ok(run.into_measurement(
        "raw sled".to_owned(),
        records,
        Some(fsyncs.load(Ordering::Relaxed)),
    ))
}

/// SledStore with default options (fsync on): `writers` threads, each
/// committing its own records one commit at a time.
fn run_sled_store(
    records: &RawRecords,
    writers: usize,
    seconds: Duration,
) -> anyhow::Result<Measurement> {
    let dir = bench_dir()?;
    let store = SledStore::open(dir.path(), SledOptions::default())?;
    let commit = |writer: usize, round: u64| -> anyhow::Result<()> {
        let mut batch = WriteBatch::new();
        for (key, value) in records.round(writer, round) {
            batch.put(key.clone(), value.clone());
        }
        store.commit_blocking(batch)?;
        Ok(())
    };
    for writer in 0..writers {
        commit(writer, 0)?;
    }
    let fsyncs_before = store.commit_stats().flushes;
    let run = drive_threads(writers, seconds, commit)?;
    let fsyncs = store.commit_stats().flushes - fsyncs_before;
    let label = if writers == 1 {
        "SledStore, 1 writer".to_owned()
    } else {
        format!("SledStore, {writers} writers")
    };
    Ok(run.into_measurement(label, records, Some(fsyncs)))
}

/// A fresh temporary directory next to where the server's go.
fn bench_dir() -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("reconciled-bench-")
        .tempdir()
        .context("cannot create a temporary directory")
}

/// Runs `commit(writer, round)` on `writers` threads until `seconds` have
/// passed, rounds counting from 1 on every thread.
fn drive_threads(
    writers: usize,
    seconds: Duration,
    commit: impl Fn(usize, u64) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<Run> {
    let cpu_before = process_cpu(std::process::id())?;
    let start = Instant::now();
    let deadline = start + seconds;
    let results: Vec<anyhow::Result<WriterRun>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..writers)
            .map(|writer| {
                let commit = &commit;
                scope.spawn(move || -> anyhow::Result<WriterRun> {
                    let mut run = WriterRun::default();
                    let mut round = 1;
                    while Instant::now() < deadline {
                        let began = Instant::now();
                        commit(writer, round)?;
                        run.latencies.push(began.elapsed());
                        round += 1;
                    }
                    run.finished = start.elapsed();
                    Ok(run)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|_| Err(anyhow!("a writer thread panicked")))
            })
            .collect()
    });
    let cpu_after = process_cpu(std::process::id())?;
    let mut run = Run::from_writers(results)?;
    run.bench_cpu = cpu_after.saturating_sub(cpu_before);
    Ok(run)
}

// ---- server runs ----

/// How concurrent clients are spread over the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spread {
    /// One tenant; client `k` owns subgraph `c{k}`.
    Subgraphs,
    /// A tenant per client (each still owning subgraph `c{k}`).
    Tenants,
}

/// The requests of a size.
struct Shape {
    items: usize,
    padding: usize,
    bytes_per_request: usize,
}

/// Starts a fresh server and runs `clients` SubmitIntent loops against it.
async fn run_reconciled(
    shape: &Shape,
    clients: usize,
    spread: Spread,
    seconds: Duration,
) -> anyhow::Result<Measurement> {
    run_reconciled_with(
        ServerOptions::default().without_byte_budget(),
        shape,
        clients,
        spread,
        seconds,
    )
    .await
}

/// [`run_reconciled`] on a server started with `options`.
async fn run_reconciled_with(
    options: ServerOptions,
    shape: &Shape,
    clients: usize,
    spread: Spread,
    seconds: Duration,
) -> anyhow::Result<Measurement> {
    let mut server = ServerProcess::start(options).await?;
    let server_pid = find_child_pid(&server)?;
    let admin_channel = server.channel().await?;
    let admin_token = server.admin_token();
    let tenant_count = match spread {
        Spread::Subgraphs => 1,
        Spread::Tenants => clients,
    };
    let mut tenants = Vec::with_capacity(tenant_count);
    for index in 0..tenant_count {
        let name = format!("bench{index}");
        let token = api::tenants(&admin_channel, &admin_token)
            .create_tenant(v1::CreateTenantRequest {
                name: name.clone(),
                limits: None,
            })
            .await
            .with_context(|| format!("CreateTenant {name} failed"))?
            .into_inner()
            .token;
        tenants.push((name, token));
    }

    let mut submitters = Vec::with_capacity(clients);
    for client in 0..clients {
        // A connection per client, as separate processes would have.
        let channel = server.channel().await?;
        let (tenant, token) = &tenants[client % tenant_count];
        let mut request = api::submit(tenant, proto_items(client, shape.items, 0, shape.padding));
        request.subgraph = subgraph_of(client);
        let mut submitter = Submitter {
            client: api::reconciler(&channel, token),
            request,
        };
        // Creates the items, so that the timed rounds replace them.
        submitter.submit(0).await?;
        submitters.push(submitter);
    }

    let server_cpu_before = process_cpu(server_pid)?;
    let bench_cpu_before = process_cpu(std::process::id())?;
    let start = Instant::now();
    let deadline = start + seconds;
    let tasks: Vec<_> = submitters
        .into_iter()
        .map(|mut submitter| {
            tokio::spawn(async move {
                let mut run = WriterRun::default();
                let mut round = 1;
                while Instant::now() < deadline {
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
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(
            task.await
                .unwrap_or_else(|error| Err(anyhow!("a client task failed: {error}"))),
        );
    }
    let server_cpu = process_cpu(server_pid)?.saturating_sub(server_cpu_before);
    let bench_cpu = process_cpu(std::process::id())?.saturating_sub(bench_cpu_before);
    let mut run = Run::from_writers(results)?;
    run.bench_cpu = bench_cpu;
    run.server_cpu = Some(server_cpu);
    server.terminate().await?;

    let label = match (clients, spread) {
        (1, _) => "reconciled, 1 client".to_owned(),
        (_, Spread::Subgraphs) => format!("reconciled, {clients} clients, 1 tenant"),
        (_, Spread::Tenants) => format!("reconciled, {clients} clients, {clients} tenants"),
    };
    Ok(Measurement {
        label,
        items_per_request: shape.items,
        bytes_per_request: shape.bytes_per_request,
        run,
        fsyncs: None,
    })
}

/// One client's connection and its reusable request.
struct Submitter {
    client: Reconciler,
    request: v1::SubmitIntentRequest,
}

impl Submitter {
    /// Submits the intent with every item's `round` set to `round`; fails
    /// unless the server stored it.
    async fn submit(&mut self, round: u64) -> anyhow::Result<()> {
        set_round(&mut self.request, round);
        let reply = self
            .client
            .submit_intent(self.request.clone())
            .await
            .with_context(|| format!("SubmitIntent of round {round} failed"))?
            .into_inner();
        ensure!(
            reply.changed,
            "SubmitIntent of round {round} changed nothing; the benchmark needs every request to store its items"
        );
        Ok(())
    }
}

/// A bare baseline server: this binary started again with a hidden
/// subcommand (`echo-server`, `fanout-server`) that prints its address on
/// stdout and exits when its stdin closes (or when dropped).
struct ChildServer {
    child: std::process::Child,
    endpoint: String,
}

impl ChildServer {
    fn start(subcommand: &str) -> anyhow::Result<Self> {
        use std::io::BufRead as _;
        let exe = std::env::current_exe().context("cannot find this benchmark's binary")?;
        let mut child = std::process::Command::new(&exe)
            .arg(subcommand)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot start {} {subcommand}", exe.display()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("the {subcommand} has no stdout"))?;
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .with_context(|| format!("cannot read the {subcommand}'s address"))?;
        let addr = line.trim().to_string();
        anyhow::ensure!(
            !addr.is_empty(),
            "the {subcommand} exited before printing its address"
        );
        println!("{subcommand} pid {} listening on {addr}", child.id());
        Ok(Self {
            endpoint: format!("http://{addr}"),
            child,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        // Closing stdin asks it to exit; kill makes sure.
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The body of a baseline server's hidden subcommand: a multi-threaded
/// runtime (like the server's), a free loopback port printed on stdout,
/// exit when stdin closes; `serve` runs the tonic server on the accepted
/// connections (TCP_NODELAY, like the server's).
fn serve_baseline<F, Fut>(serve: F) -> anyhow::Result<()>
where
    F: FnOnce(tonic::transport::server::TcpIncoming) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    use std::io::{Read as _, Write as _};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind a loopback port")?;
        let addr = listener.local_addr()?;
        let mut stdout = std::io::stdout();
        writeln!(stdout, "{addr}")?;
        stdout.flush()?;
        std::thread::spawn(|| {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            std::process::exit(0);
        });
        serve(tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))).await
    })
}

/// The process id of the server's child process: the child of this
/// process listening on the server's address.
fn find_child_pid(server: &ServerProcess) -> anyhow::Result<u32> {
    let listen = server.addr().to_string();
    let own_pid = std::process::id();
    for entry in std::fs::read_dir("/proc").context("cannot list /proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&byte| byte == 0).collect();
        let listens_there = args
            .windows(2)
            .any(|pair| pair[0] == b"--listen" && pair[1] == listen.as_bytes());
        if listens_there && parent_pid(pid).ok() == Some(own_pid) {
            println!("server pid {pid} listening on {listen}");
            return Ok(pid);
        }
    }
    bail!("cannot find the server process listening on {listen} in /proc")
}

/// The fields of `/proc/<pid>/stat` after the command name.
fn proc_stat_fields(pid: u32) -> anyhow::Result<Vec<String>> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    // The command name is in parentheses and may contain spaces.
    let after_name = text
        .rfind(')')
        .map(|end| &text[end + 1..])
        .ok_or_else(|| anyhow!("{path} has no command name"))?;
    Ok(after_name.split_whitespace().map(str::to_owned).collect())
}

fn parent_pid(pid: u32) -> anyhow::Result<u32> {
    // Field 4 of stat; fields after the name start at field 3.
    let fields = proc_stat_fields(pid)?;
    let parent = fields.get(1).ok_or_else(|| anyhow!("short stat line"))?;
    Ok(parent.parse()?)
}

/// User plus system CPU time of process `pid`, all threads.
fn process_cpu(pid: u32) -> anyhow::Result<Duration> {
    let fields = proc_stat_fields(pid)?;
    // utime and stime are fields 14 and 15 of stat.
    let ticks = |index: usize| -> anyhow::Result<f64> {
        let field = fields
            .get(index)
            .ok_or_else(|| anyhow!("short stat line of process {pid}"))?;
        Ok(field.parse::<u64>()? as f64)
    };
    let total = ticks(11)? + ticks(12)?;
    Ok(Duration::from_secs_f64(total / PROC_TICKS_PER_SECOND))
}

// ---- figures ----

/// What one writer (thread or client) did.
#[derive(Default)]
struct WriterRun {
    latencies: Vec<Duration>,
    finished: Duration,
}

/// What all writers of a run did together.
struct Run {
    /// Latency of every commit or request.
    latencies: Vec<Duration>,
    /// From the common start to the last writer's last completion.
    elapsed: Duration,
    bench_cpu: Duration,
    server_cpu: Option<Duration>,
}

impl Run {
    fn from_writers(results: Vec<anyhow::Result<WriterRun>>) -> anyhow::Result<Self> {
        let mut latencies = Vec::new();
        let mut elapsed = Duration::ZERO;
        for result in results {
            let writer = result?;
            latencies.extend(writer.latencies);
            elapsed = elapsed.max(writer.finished);
        }
        latencies.sort_unstable();
        Ok(Self {
            latencies,
            elapsed,
            bench_cpu: Duration::ZERO,
            server_cpu: None,
        })
    }

    fn into_measurement(
        self,
        label: String,
        records: &RawRecords,
        fsyncs: Option<u64>,
    ) -> Measurement {
        Measurement {
            label,
            items_per_request: records.per_client.first().map_or(0, |r| r[0].len()),
            bytes_per_request: records.bytes_per_commit(),
            run: self,
            fsyncs,
        }
    }
}

/// The figures of one run.
struct Measurement {
    label: String,
    items_per_request: usize,
    bytes_per_request: usize,
    run: Run,
    /// fsyncs during the run, where known.
    fsyncs: Option<u64>,
}

impl Measurement {
    fn seconds(&self) -> f64 {
        self.run.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    fn requests_per_second(&self) -> f64 {
        self.run.latencies.len() as f64 / self.seconds()
    }

    fn items_per_second(&self) -> f64 {
        self.requests_per_second() * self.items_per_request as f64
    }

    fn megabytes_per_second(&self) -> f64 {
        self.requests_per_second() * self.bytes_per_request as f64 / 1e6
    }

    fn latency_ms(&self, quantile: f64) -> f64 {
        let latencies = &self.run.latencies;
        if latencies.is_empty() {
            return f64::NAN;
        }
        let index = ((latencies.len() - 1) as f64 * quantile).round() as usize;
        latencies[index].as_secs_f64() * 1e3
    }

    fn cores(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() / self.seconds()
    }

    fn line(&self) -> String {
        format!(
            "{:<34} {:>6} req in {:>5.2} s: {:>9} req/s, {:>10} items/s, {:>7.1} MB/s, p50 {:.1} ms, p99 {:.1} ms{}",
            self.label,
            self.run.latencies.len(),
            self.seconds(),
            thousands(self.requests_per_second()),
            thousands(self.items_per_second()),
            self.megabytes_per_second(),
            self.latency_ms(0.5),
            self.latency_ms(0.99),
            self.fsyncs
                .map(|fsyncs| format!(", {fsyncs} fsyncs"))
                .unwrap_or_default(),
        )
    }
}

fn print_tables(reports: &[SizeReport], clients: usize) {
    println!("\n## Durable SubmitIntent throughput (fsync on, loopback, same run)\n");
    println!(
        "| size (items/req) | raw sled (items/s) | SledStore (items/s) | reconciled 1 client (items/s, req/s) | reconciled {clients} clients (items/s, req/s) | ratio 1 client / raw sled | ratio {clients} clients / raw sled |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for size in reports {
        let raw = size.raw_sled.items_per_second();
        println!(
            "| {} | {} | {} | {} ({} req/s) | {} ({} req/s) | {:.2} | {:.2} |",
            thousands(size.items as f64),
            thousands(raw),
            thousands(size.sled_store.items_per_second()),
            thousands(size.reconciled_one.items_per_second()),
            decimal(size.reconciled_one.requests_per_second()),
            thousands(size.reconciled_subgraphs.items_per_second()),
            decimal(size.reconciled_subgraphs.requests_per_second()),
            size.reconciled_one.items_per_second() / raw,
            size.reconciled_subgraphs.items_per_second() / raw,
        );
    }

    println!("\n## Details\n");
    println!(
        "| size | run | req/s | items/s | MB/s | p50 ms | p99 ms | server CPU (cores) | bench CPU (cores) | commits per fsync |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for size in reports {
        for measurement in [
            &size.raw_sled,
            &size.sled_store,
            &size.sled_store_concurrent,
            &size.reconciled_one,
            &size.reconciled_subgraphs,
            &size.reconciled_tenants,
        ] {
            let per_fsync = measurement
                .fsyncs
                .filter(|&fsyncs| fsyncs > 0)
                .map(|fsyncs| {
                    format!(
                        "{:.2}",
                        measurement.run.latencies.len() as f64 / fsyncs as f64
                    )
                })
                .unwrap_or_else(|| "".to_owned());
            println!(
                "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {:.2} | {} |",
                thousands(size.items as f64),
                measurement.label,
                decimal(measurement.requests_per_second()),
                thousands(measurement.items_per_second()),
                measurement.megabytes_per_second(),
                measurement.latency_ms(0.5),
                measurement.latency_ms(0.99),
                measurement
                    .run
                    .server_cpu
                    .map(|cpu| format!("{:.2}", measurement.cores(cpu)))
                    .unwrap_or_else(|| "".to_owned()),
                measurement.cores(measurement.run.bench_cpu),
                per_fsync,
            );
        }
    }
    println!(
        "\nbytes per item (key + encoded StoredIntended): {}",
        reports
            .iter()
            .map(|size| format!("{} items: {:.0} B", size.items, size.bytes_per_item))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// `1234567.8` as `1,234,568`.
fn thousands(value: f64) -> String {
    if !value.is_finite() {
        return "n/a".to_owned();
    }
    let digits = format!("{:.0}", value.abs());
    let mut grouped = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    if value < 0.0 {
        grouped.insert(0, '-');
    }
    grouped
}

/// Request rates: one decimal below 100, grouped integers above.
fn decimal(value: f64) -> String {
    if value < 100.0 {
        format!("{value:.1}")
    } else {
        thousands(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0.4), "0");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1_234_567.8), "1,234,568");
        assert_eq!(thousands(-12_345.0), "-12,345");
    }

    #[test]
    fn raw_records_match_the_server_layout() {
        let records = stored_records(3, 2, 7, 4).expect("records");
        assert_eq!(records.len(), 2);
        let (key, value) = &records[1];
        assert_eq!(
            keys::parse_item_key(key),
            Some((ITEM_TYPE.to_owned(), "c3-if-00001".to_owned()))
        );
        let stored: StoredIntended =
            reconciled::tenant::record::decode(key, value).expect("decodes");
        assert_eq!(&*stored.item.subgraph, "c3");
        assert_eq!(stored.generation, 7);
    }

    #[test]
    fn rounds_alternate_between_different_values() {
        let records = RawRecords::build(1, 1, 0).expect("records");
        assert_ne!(records.round(0, 1), records.round(0, 2));
        assert_eq!(records.round(0, 1), records.round(0, 3));
    }

    #[test]
    fn setting_the_round_changes_every_item() {
        let mut request = api::submit("t", proto_items(0, 3, 0, 0));
        set_round(&mut request, 9);
        for item in &request.items {
            let round = item
                .properties
                .as_ref()
                .and_then(|p| p.fields.get("round"))
                .and_then(|v| v.kind.clone());
            assert_eq!(round, Some(prost_types::value::Kind::NumberValue(9.0)));
        }
    }
}
