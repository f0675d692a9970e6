//! `reconciled-bench watch`: events per second delivered to 1, 100 and 1000
//! watchers and the delay from commit to delivery, against a raw tonic
//! server-streaming fan-out, in one run.
//!
//! ```text
//! cargo build --release -p reconciled
//! RECONCILED_BIN=target/release/reconciled \
//!     cargo run --release -p reconciled-tests --bin reconciled-bench -- watch
//! ```
//!
//! Both sides get the same client workload: N watchers open, then one
//! writer sends `--commits` ReportExternal requests of `--events` external
//! items each (every item changed each time), one after the other.
//!
//! - **raw fan-out**: this binary's hidden `fanout-server` child, whose
//!   ReportExternal turns the request into one event group (an
//!   ItemStatusChanged per item, as reconciled builds them) and broadcasts
//!   it to every open Watch stream; no store, no logic.
//! - **reconciled**: the real server (fsync on); every request is a durable
//!   commit whose events go to the watchers.
//!
//! Delivered events/s = watchers × commits × events / (time from the first
//! request to the last watcher receiving the last event). The delay is
//! measured per group, from the event's commit time (server clock, same
//! machine) to its arrival at the watcher.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, anyhow, ensure};
use clap::Args;
use futures::{Stream, StreamExt as _};
use reconciled_tests::api::{self, Reconciler};
use reconciled_tests::proto::v1;
use reconciled_tests::proto::v1::reconciler_server::{
    Reconciler as ReconcilerService, ReconcilerServer,
};
use reconciled_tests::{ServerOptions, ServerProcess};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use super::{ChildServer, serve_baseline};

/// Watch streams per connection (below HTTP/2's usual stream limits).
const STREAMS_PER_CONNECTION: usize = 100;

/// How long any one run may take.
const RUN_DEADLINE: Duration = Duration::from_secs(300);

/// Options of `reconciled-bench watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Watcher counts, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
    watchers: Vec<usize>,
    /// ReportExternal requests (commits) per run.
    #[arg(long, default_value_t = 100)]
    commits: usize,
    /// External items (events) per request.
    #[arg(long, default_value_t = 100)]
    events: usize,
}

/// One run's figures.
struct Figure {
    watchers: usize,
    events_delivered: u64,
    elapsed: Duration,
    delays_ms: Vec<u64>,
}

impl Figure {
    fn per_second(&self) -> f64 {
        self.events_delivered as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    fn delay(&self, quantile: f64) -> u64 {
        let mut delays = self.delays_ms.clone();
        delays.sort_unstable();
        let index = ((delays.len() as f64 - 1.0) * quantile).round() as usize;
        delays.get(index).copied().unwrap_or(0)
    }
}

/// Runs the benchmark and prints its table.
pub fn watch_benchmark(args: &WatchArgs) -> anyhow::Result<()> {
    ensure!(
        args.watchers.iter().all(|n| (1..=5_000).contains(n)),
        "--watchers must be between 1 and 5000"
    );
    ensure!(
        (1..=10_000).contains(&args.commits),
        "--commits must be between 1 and 10000"
    );
    ensure!(
        (1..=1_000).contains(&args.events),
        "--events must be between 1 and 1000"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let fanout = ChildServer::start("fanout-server")?;
    let mut rows = Vec::new();
    for &watchers in &args.watchers {
        let raw = runtime.block_on(measure_raw(&fanout.endpoint, watchers, args))?;
        let ours = runtime.block_on(measure_reconciled(watchers, args))?;
        println!(
            "{watchers} watchers: raw {:.0} events/s, reconciled {:.0} events/s",
            raw.per_second(),
            ours.per_second()
        );
        rows.push((raw, ours));
    }
    println!();
    println!(
        "| watchers | raw fan-out (events/s) | raw delay p50 / p99 | reconciled (events/s) | reconciled delay p50 / p99 | ratio |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for (raw, ours) in &rows {
        println!(
            "| {} | {:.0} | {} / {} ms | {:.0} | {} / {} ms | {:.2} |",
            raw.watchers,
            raw.per_second(),
            raw.delay(0.5),
            raw.delay(0.99),
            ours.per_second(),
            ours.delay(0.5),
            ours.delay(0.99),
            ours.per_second() / raw.per_second().max(f64::MIN_POSITIVE)
        );
    }
    Ok(())
}

/// The writer's requests: every item changed in each.
fn reports(tenant: &str, round: usize, events: usize) -> v1::ReportExternalRequest {
    v1::ReportExternalRequest {
        tenant: tenant.to_string(),
        reports: (0..events)
            .map(|index| v1::ExternalReport {
                change: Some(v1::external_report::Change::Put(v1::Item {
                    external: true,
                    ..api::item(
                        "bench.link",
                        &format!("link-{index:04}"),
                        serde_json::json!({"round": round, "mtu": 1500, "state": "up"}),
                    )
                })),
                modified: false,
            })
            .collect(),
    }
}

async fn channels(endpoint: &str, watchers: usize) -> anyhow::Result<Vec<Channel>> {
    let mut channels = Vec::new();
    for _ in 0..watchers.div_ceil(STREAMS_PER_CONNECTION) {
        channels.push(
            Endpoint::from_shared(endpoint.to_string())?
                .connect()
                .await
                .with_context(|| format!("cannot connect to {endpoint}"))?,
        );
    }
    Ok(channels)
}

/// Counts item status events on one stream until `expected` arrived;
/// records one commit-to-arrival delay per group.
async fn drain(
    mut stream: tonic::Streaming<v1::WatchResponse>,
    expected: u64,
    delays: Arc<std::sync::Mutex<Vec<u64>>>,
    done: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let mut seen = 0u64;
    let mut local = Vec::new();
    while seen < expected {
        let message = stream
            .message()
            .await?
            .ok_or_else(|| anyhow!("a watch ended early"))?;
        if let Some(v1::watch_response::Message::Events(group)) = message.message {
            let items = group
                .events
                .iter()
                .filter(|e| e.kind == v1::EventKind::ItemStatusChanged as i32)
                .count() as u64;
            if items > 0
                && let Some(time) = group.events.first().and_then(|e| e.time)
            {
                let sent = time.seconds as u64 * 1_000 + time.nanos as u64 / 1_000_000;
                local.push(now_ms().saturating_sub(sent));
            }
            seen += items;
        }
    }
    if let Ok(mut all) = delays.lock() {
        all.extend(local);
    }
    done.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Opens `watchers` watches with `open`, runs the writer, waits for all.
async fn run(
    watchers: usize,
    args: &WatchArgs,
    mut clients: Vec<Reconciler>,
    tenant: &str,
) -> anyhow::Result<Figure> {
    let expected = (args.commits * args.events) as u64;
    let delays = Arc::new(std::sync::Mutex::new(Vec::new()));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for index in 0..watchers {
        let client = &mut clients[index / STREAMS_PER_CONNECTION];
        let mut stream = client
            .watch(v1::WatchRequest {
                tenant: tenant.to_string(),
                start_revision: 0,
                ..v1::WatchRequest::default()
            })
            .await
            .context("Watch refused")?
            .into_inner();
        // Wait for Synced (reconciled) or the stream's first message.
        loop {
            let message = stream
                .message()
                .await?
                .ok_or_else(|| anyhow!("watch ended"))?;
            if matches!(
                message.message,
                Some(v1::watch_response::Message::Synced(_))
            ) {
                break;
            }
        }
        tasks.push(tokio::spawn(drain(
            stream,
            expected,
            delays.clone(),
            done.clone(),
        )));
    }
    let mut writer = clients[0].clone();
    let started = Instant::now();
    for round in 0..args.commits {
        writer
            .report_external(reports(tenant, round + 1, args.events))
            .await
            .context("ReportExternal refused")?;
    }
    for task in tasks {
        tokio::time::timeout(RUN_DEADLINE, task)
            .await
            .context("watchers did not finish in time")???;
    }
    let elapsed = started.elapsed();
    let delays_ms = delays.lock().map(|d| d.clone()).unwrap_or_default();
    Ok(Figure {
        watchers,
        events_delivered: expected * watchers as u64,
        elapsed,
        delays_ms,
    })
}

async fn measure_raw(endpoint: &str, watchers: usize, args: &WatchArgs) -> anyhow::Result<Figure> {
    let clients = channels(endpoint, watchers)
        .await?
        .into_iter()
        .map(|channel| api::reconciler(&channel, ""))
        .collect();
    run(watchers, args, clients, "raw").await
}

async fn measure_reconciled(watchers: usize, args: &WatchArgs) -> anyhow::Result<Figure> {
    let server = ServerProcess::start(
        ServerOptions::default()
            .arg("--max-watchers-per-tenant")
            .arg("10000"),
    )
    .await?;
    let channel = server.channel().await?;
    let token = api::create_tenant(&channel, &server.admin_token(), "bench").await;
    let clients = channels(&server.endpoint(), watchers)
        .await?
        .into_iter()
        .map(|channel| api::reconciler(&channel, &token))
        .collect();
    run(watchers, args, clients, "bench").await
}

// ---- the raw fan-out ----

/// Broadcasts each ReportExternal as one event group to every Watch.
struct Fanout {
    groups: broadcast::Sender<Arc<v1::WatchResponse>>,
    revision: AtomicU64,
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<v1::WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ReconcilerService for Fanout {
    async fn submit_intent(
        &self,
        _: Request<v1::SubmitIntentRequest>,
    ) -> Result<Response<v1::SubmitIntentResponse>, Status> {
        Err(Status::unimplemented("fan-out only"))
    }

    async fn reconcile(
        &self,
        _: Request<v1::ReconcileRequest>,
    ) -> Result<Response<v1::ReconcileResponse>, Status> {
        Err(Status::unimplemented("fan-out only"))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        _: Request<v1::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let synced = v1::WatchResponse {
            message: Some(v1::watch_response::Message::Synced(v1::Synced {
                revision: 0,
            })),
        };
        let live = BroadcastStream::new(self.groups.subscribe()).map(|group| match group {
            Ok(group) => Ok((*group).clone()),
            Err(_) => Err(Status::resource_exhausted("lagged")),
        });
        Ok(Response::new(Box::pin(
            futures::stream::once(async { Ok(synced) }).chain(live),
        )))
    }

    async fn get_graph(
        &self,
        _: Request<v1::GetGraphRequest>,
    ) -> Result<Response<v1::GetGraphResponse>, Status> {
        Err(Status::unimplemented("fan-out only"))
    }

    async fn get_status(
        &self,
        _: Request<v1::GetStatusRequest>,
    ) -> Result<Response<v1::GetStatusResponse>, Status> {
        Err(Status::unimplemented("fan-out only"))
    }

    async fn get_item_types(
        &self,
        _: Request<v1::GetItemTypesRequest>,
    ) -> Result<Response<v1::GetItemTypesResponse>, Status> {
        Err(Status::unimplemented("fan-out only"))
    }

    async fn report_external(
        &self,
        request: Request<v1::ReportExternalRequest>,
    ) -> Result<Response<v1::ReportExternalResponse>, Status> {
        let revision = self.revision.fetch_add(1, Ordering::SeqCst) + 1;
        let time = prost_types::Timestamp {
            seconds: (now_ms() / 1_000) as i64,
            nanos: ((now_ms() % 1_000) * 1_000_000) as i32,
        };
        let events = request
            .into_inner()
            .reports
            .into_iter()
            .filter_map(|report| match report.change {
                Some(v1::external_report::Change::Put(item)) => Some(item),
                _ => None,
            })
            .map(|item| {
                let item_ref = v1::ItemRef {
                    r#type: item.r#type.clone(),
                    name: item.name.clone(),
                };
                v1::Event {
                    revision,
                    kind: v1::EventKind::ItemStatusChanged.into(),
                    time: Some(time),
                    body: Some(v1::event::Body::ItemStatusChanged(v1::ItemStatusChanged {
                        item: Some(item_ref.clone()),
                        old_state: v1::ItemState::Created.into(),
                        new_state: v1::ItemState::Created.into(),
                        error: None,
                        status: Some(v1::ItemStatus {
                            r#ref: Some(item_ref),
                            state: v1::ItemState::Created.into(),
                            external: true,
                            applied: Some(item),
                            ..v1::ItemStatus::default()
                        }),
                    })),
                }
            })
            .collect();
        let group = v1::WatchResponse {
            message: Some(v1::watch_response::Message::Events(v1::EventGroup {
                revision,
                events,
                continued: false,
            })),
        };
        let _ = self.groups.send(Arc::new(group));
        Ok(Response::new(v1::ReportExternalResponse { revision }))
    }
}

/// The hidden `fanout-server` subcommand: serves [`Fanout`] on a free
/// loopback port, prints the address, and exits when stdin closes.
pub fn fanout_server_main() -> anyhow::Result<()> {
    let (groups, _) = broadcast::channel(20_000);
    serve_baseline(|incoming| async move {
        tonic::transport::Server::builder()
            .add_service(
                ReconcilerServer::new(Fanout {
                    groups,
                    revision: AtomicU64::new(0),
                })
                .max_encoding_message_size(64 * 1024 * 1024),
            )
            .serve_with_incoming(incoming)
            .await
            .context("the fan-out server failed")
    })
}
