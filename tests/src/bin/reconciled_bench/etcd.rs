//! `reconciled-bench etcd`: durable SubmitIntent on the etcd store against
//! raw etcd transactions of the same records, on one etcd started for the
//! run (a single member on loopback, fsync on, default limits).
//!
//! For every request size N (`--items`, default `10,1000,10000`):
//!
//! 1. **raw etcd**: the server's own records of an N-item intent
//!    (`RawRecords`, as `submit` builds them) put with plain etcd
//!    transactions of at most 128 operations and 1 MiB, one after the
//!    other, one request's records at a time. This is the cheapest way to
//!    land those bytes in etcd; it is not atomic beyond 128 records.
//! 2. **reconciled on etcd**: the real server (`--store etcd`, a prefix of
//!    its own) with one client submitting N changed items per request.
//!    Above 128 records a commit is staged (chunks, marker, roll-in), so
//!    it writes its bytes twice.

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use clap::Args;
use etcd_client::{Client, Txn, TxnOp};
use reconciled_tests::ServerOptions;
use reconciled_tests::etcd::EtcdCluster;

use super::{
    MAX_REQUEST_ITEMS, MAX_SECONDS, Measurement, RawRecords, Run, Shape, Spread, WriterRun, report,
    run_reconciled_with, thousands,
};

/// etcd's default `--max-txn-ops`.
const TXN_OPS: usize = 128;

/// The payload of one raw transaction, as the store bounds its own.
const TXN_BYTES: usize = 1024 * 1024;

/// Options of `reconciled-bench etcd`.
#[derive(Debug, Args)]
pub(super) struct EtcdArgs {
    /// Items per request (and records per raw commit), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10,1000,10000")]
    items: Vec<usize>,
    /// Seconds each measurement runs.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Bytes of filler text in every item's properties.
    #[arg(long, default_value_t = 64)]
    padding: usize,
}

/// Runs the benchmark and prints its table.
pub(super) fn etcd_benchmark(args: &EtcdArgs) -> anyhow::Result<()> {
    ensure!(!args.items.is_empty(), "--items needs at least one size");
    for &items in &args.items {
        ensure!(
            (1..=MAX_REQUEST_ITEMS).contains(&items),
            "--items {items} is outside 1..={MAX_REQUEST_ITEMS}"
        );
    }
    ensure!(
        (1..=MAX_SECONDS).contains(&args.seconds),
        "--seconds must be within 1..={MAX_SECONDS}"
    );
    let seconds = Duration::from_secs(args.seconds);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async {
        let etcd = EtcdCluster::single().await?;
        println!(
            "reconciled-bench etcd: sizes {:?}, {} s per run, one etcd member at {}",
            args.items,
            args.seconds,
            etcd.endpoints_arg()
        );
        let mut rows = Vec::new();
        for (round, &items) in args.items.iter().enumerate() {
            println!("\n## {items} items per request");
            let records = RawRecords::build(items, 1, args.padding)?;
            let raw = report(run_raw_etcd(&etcd, &records, round, seconds).await?);
            let shape = Shape {
                items,
                padding: args.padding,
                bytes_per_request: records.bytes_per_commit(),
            };
            let options = ServerOptions::default()
                .without_byte_budget()
                .arg("--store")
                .arg("etcd")
                .arg("--etcd-endpoints")
                .arg(etcd.endpoints_arg())
                .arg("--etcd-prefix")
                .arg(format!("/bench-{round}/"));
            let mut ours =
                run_reconciled_with(options, &shape, 1, Spread::Subgraphs, seconds).await?;
            ours.label = "reconciled on etcd, 1 client".to_owned();
            let ours = report(ours);
            rows.push((items, raw, ours));
        }
        println!("\n## Durable SubmitIntent on etcd (one member, loopback, same run)\n");
        println!(
            "| size (items/req) | raw etcd txns (items/s) | reconciled on etcd (items/s, req/s) | p50 / p99 (ms) | ratio |"
        );
        println!("|---:|---:|---:|---:|---:|");
        for (items, raw, ours) in &rows {
            println!(
                "| {items} | {} | {}, {:.1} | {:.1} / {:.1} | {:.2} |",
                thousands(raw.items_per_second()),
                thousands(ours.items_per_second()),
                ours.requests_per_second(),
                ours.latency_ms(0.5),
                ours.latency_ms(0.99),
                ours.items_per_second() / raw.items_per_second().max(f64::MIN_POSITIVE)
            );
        }
        anyhow::Ok(())
    })
}

/// Puts `records` (alternating rounds) with plain transactions for
/// `seconds`, one request's records at a time.
async fn run_raw_etcd(
    etcd: &EtcdCluster,
    records: &RawRecords,
    run: usize,
    seconds: Duration,
) -> anyhow::Result<Measurement> {
    let client = Client::connect(etcd.endpoints(), None).await?;
    let prefix = format!("/raw-{run}/");
    let rounds: Vec<Vec<Txn>> = (0..2u64)
        .map(|round| transactions(&prefix, records.round(0, round)))
        .collect();
    let start = Instant::now();
    let mut writer = WriterRun::default();
    let mut round = 0usize;
    while start.elapsed() < seconds {
        let began = Instant::now();
        for txn in &rounds[round % 2] {
            client.kv_client().txn(txn.clone()).await?;
        }
        writer.latencies.push(began.elapsed());
        round += 1;
    }
    writer.finished = start.elapsed();
    let run = Run::from_writers(vec![Ok(writer)])?;
    Ok(run.into_measurement("raw etcd txns".to_owned(), records, None))
}

/// `records` under `prefix` as transactions of at most [`TXN_OPS`] puts
/// and [`TXN_BYTES`].
pub(super) fn transactions(prefix: &str, records: &[(Vec<u8>, Vec<u8>)]) -> Vec<Txn> {
    let mut out = Vec::new();
    let mut puts = Vec::new();
    let mut bytes = 0;
    for (key, value) in records {
        let size = prefix.len() + key.len() + value.len();
        if !puts.is_empty() && (puts.len() == TXN_OPS || bytes + size > TXN_BYTES) {
            out.push(Txn::new().and_then(std::mem::take(&mut puts)));
            bytes = 0;
        }
        let mut full = prefix.as_bytes().to_vec();
        full.extend_from_slice(key);
        puts.push(TxnOp::put(full, value.clone(), None));
        bytes += size;
    }
    if !puts.is_empty() {
        out.push(Txn::new().and_then(puts));
    }
    out
}
