//! Prometheus metrics: counters kept in atomics by the engine, exposed in
//! the text exposition format on `--metrics-listen`. No per-tenant labels:
//! label values are bounded (operation kinds, outcomes, states).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::graph::OperationKind;

/// Gauges read at each scrape from the parts of the server that own them
/// (tenants, agent sessions, the store).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Items by displayed state, all tenants.
    pub items_by_state: std::collections::BTreeMap<&'static str, u64>,
    /// Operations in flight, all tenants.
    pub operations_in_flight: u64,
    /// Live tenants.
    pub tenants: u64,
    /// Tenants not served because their records could not be read.
    pub tenants_quarantined: u64,
    /// Commands queued for the tenant owners.
    pub queued_commands: u64,
    /// Open Watch streams.
    pub watchers: u64,
    /// Agents connected (distinct agent ids per tenant).
    pub agents_connected: u64,
    /// Store size on disk, in bytes.
    pub store_bytes: u64,
}

/// Reads the current [`Gauges`]; called once per scrape.
pub type GaugeSource = Arc<dyn Fn() -> Gauges + Send + Sync>;

/// Upper bounds (seconds) of the pass duration histogram.
const PASS_BUCKETS: [f64; 8] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0];

/// Upper bounds (seconds) of the operation latency histogram: from a quick
/// agent on the same host to long-running operations.
const OPERATION_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 300.0];

const KINDS: [OperationKind; 4] = [
    OperationKind::Create,
    OperationKind::Modify,
    OperationKind::Delete,
    OperationKind::Read,
];
const OUTCOMES: [&str; 5] = ["done", "failed", "wait", "lost", "other"];

/// Upper bounds (seconds) of the histogram of the time commands wait in a
/// tenant owner's queue.
const QUEUE_WAIT_BUCKETS: [f64; 8] = [0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0];

/// A Prometheus histogram over fixed bucket bounds, in seconds.
#[derive(Debug)]
struct Histogram<const N: usize> {
    bounds: [f64; N],
    buckets: [AtomicU64; N],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl<const N: usize> Histogram<N> {
    fn new(bounds: [f64; N]) -> Self {
        Self {
            bounds,
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    fn observe(&self, seconds: f64) {
        let seconds = seconds.max(0.0);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.count();
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {}\n{name}_count {count}",
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
    }
}

/// Renders a section of exposition text that another room keeps (see
/// [`Metrics::append_section`]).
pub type Section = Arc<dyn Fn(&mut String) + Send + Sync>;

/// The server's counters.
pub struct Metrics {
    passes: Histogram<{ PASS_BUCKETS.len() }>,
    dispatched: [AtomicU64; KINDS.len()],
    finished: [[AtomicU64; OUTCOMES.len()]; KINDS.len()],
    operations: Histogram<{ OPERATION_BUCKETS.len() }>,
    queue_wait: Histogram<{ QUEUE_WAIT_BUCKETS.len() }>,
    /// Sections other rooms render themselves (the cluster's).
    sections: std::sync::Mutex<Vec<Section>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            passes: Histogram::new(PASS_BUCKETS),
            dispatched: Default::default(),
            finished: Default::default(),
            operations: Histogram::new(OPERATION_BUCKETS),
            queue_wait: Histogram::new(QUEUE_WAIT_BUCKETS),
            sections: std::sync::Mutex::default(),
        }
    }
}

fn kind_index(kind: OperationKind) -> usize {
    KINDS.iter().position(|k| *k == kind).unwrap_or(0)
}

impl Metrics {
    /// Records one reconcile pass and how long it took.
    pub fn pass(&self, seconds: f64) {
        self.passes.observe(seconds);
    }

    /// Records how long a command waited in a tenant owner's queue.
    pub fn queue_wait(&self, seconds: f64) {
        self.queue_wait.observe(seconds);
    }

    /// Records dispatched operations.
    pub fn dispatched(&self, kind: OperationKind) {
        self.dispatched[kind_index(kind)].fetch_add(1, Ordering::Relaxed);
    }

    /// Records a finished operation with its outcome ("done", "failed",
    /// "wait", "lost") and how long it ran.
    pub fn finished(&self, kind: OperationKind, outcome: &str, seconds: f64) {
        let outcome = OUTCOMES
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(OUTCOMES.len() - 1);
        self.finished[kind_index(kind)][outcome].fetch_add(1, Ordering::Relaxed);
        self.operations.observe(seconds);
    }

    /// Adds a section of metrics that another room keeps and renders
    /// (exposition text, appended to every scrape).
    pub fn append_section(&self, section: impl Fn(&mut String) + Send + Sync + 'static) {
        self.sections
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Arc::new(section));
    }

    /// The exposition text: the counters kept here and `gauges`.
    pub fn render(&self, gauges: &Gauges) -> String {
        let mut out = String::new();
        let get = |value: &AtomicU64| value.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP reconciled_reconcile_passes_total Reconcile passes run.\n# TYPE reconciled_reconcile_passes_total counter\nreconciled_reconcile_passes_total {}",
            self.passes.count()
        );
        self.passes.render(
            &mut out,
            "reconciled_reconcile_pass_seconds",
            "Duration of reconcile passes.",
        );
        self.queue_wait.render(
            &mut out,
            "reconciled_tenant_queue_wait_seconds",
            "Time commands (intents, results, registrations) wait in a tenant owner's queue.",
        );
        let _ = writeln!(
            out,
            "# HELP reconciled_operations_dispatched_total Operations sent to agents.\n# TYPE reconciled_operations_dispatched_total counter"
        );
        for (kind, counter) in KINDS.iter().zip(&self.dispatched) {
            let _ = writeln!(
                out,
                "reconciled_operations_dispatched_total{{kind=\"{}\"}} {}",
                kind.as_str(),
                get(counter)
            );
        }
        let _ = writeln!(
            out,
            "# HELP reconciled_operations_total Operations finished, by kind and outcome.\n# TYPE reconciled_operations_total counter"
        );
        for (kind, row) in KINDS.iter().zip(&self.finished) {
            for (outcome, counter) in OUTCOMES.iter().zip(row) {
                let _ = writeln!(
                    out,
                    "reconciled_operations_total{{kind=\"{}\",outcome=\"{outcome}\"}} {}",
                    kind.as_str(),
                    get(counter)
                );
            }
        }
        self.operations.render(
            &mut out,
            "reconciled_operation_seconds",
            "Latency of finished operations, from dispatch to result.",
        );
        let Gauges {
            items_by_state,
            operations_in_flight: in_flight,
            tenants,
            tenants_quarantined,
            queued_commands: queued,
            watchers,
            agents_connected,
            store_bytes: size,
        } = gauges;
        let _ = writeln!(
            out,
            "# HELP reconciled_items Items by state, all tenants.\n# TYPE reconciled_items gauge"
        );
        for (state, count) in items_by_state {
            let _ = writeln!(out, "reconciled_items{{state=\"{state}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "# HELP reconciled_operations_in_flight Operations in flight (queue depth at the agents).\n# TYPE reconciled_operations_in_flight gauge\nreconciled_operations_in_flight {in_flight}"
        );
        let _ = writeln!(
            out,
            "# HELP reconciled_tenants Live tenants.\n# TYPE reconciled_tenants gauge\nreconciled_tenants {tenants}"
        );
        let _ = writeln!(
            out,
            "# HELP reconciled_tenants_quarantined Tenants not served because their stored records could not be read.\n# TYPE reconciled_tenants_quarantined gauge\nreconciled_tenants_quarantined {tenants_quarantined}"
        );
        let _ = writeln!(
            out,
            "# HELP reconciled_watchers Open Watch streams, all tenants.\n# TYPE reconciled_watchers gauge\nreconciled_watchers {watchers}"
        );
        let _ = writeln!(
            out,
            "# HELP reconciled_tenant_queue_depth Commands (intents, results, registrations) queued for the tenant owners.\n# TYPE reconciled_tenant_queue_depth gauge\nreconciled_tenant_queue_depth {queued}"
        );
        let _ = writeln!(
            out,
            "# HELP reconciled_agents_connected Agents connected (distinct agent ids per tenant).\n# TYPE reconciled_agents_connected gauge\nreconciled_agents_connected {agents_connected}"
        );
        let _ = writeln!(
            out,
            "# HELP reconciled_store_bytes Store size on disk.\n# TYPE reconciled_store_bytes gauge\nreconciled_store_bytes {size}"
        );
        let sections = self
            .sections
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        for section in sections {
            section(&mut out);
        }
        out
    }
}

/// Scrapes served at once; a connection beyond waits in the kernel's
/// accept queue until one ends.
pub const MAX_SCRAPE_CONNECTIONS: usize = 64;

/// How long a scraper may take to send its request headers before the
/// connection is closed.
pub const SCRAPE_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest a scrape connection stays open, whatever it does.
pub const SCRAPE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the accept loop pauses after an accept error (e.g. too many
/// open files), so it neither spins nor stops.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Serves `GET /metrics` on `listen` until `shutdown` is cancelled; then
/// ends the scrapes still open and returns once they have.
///
/// HTTP/1 by hyper: request headers must arrive within
/// [`SCRAPE_READ_TIMEOUT`], a connection lives at most
/// [`SCRAPE_CONNECTION_TIMEOUT`], at most [`MAX_SCRAPE_CONNECTIONS`] are
/// served at once, and an accept error is logged and retried after a short
/// pause: the endpoint outlives a descriptor shortage.
pub async fn serve(
    listen: SocketAddr,
    metrics: Arc<Metrics>,
    gauges: GaugeSource,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    debug!(addr = %listen, "Metrics endpoint listening.");
    let slots = Arc::new(Semaphore::new(MAX_SCRAPE_CONNECTIONS));
    let mut scrapes = JoinSet::new();
    loop {
        // Reap finished scrapes so the set stays small.
        while scrapes.try_join_next().is_some() {}
        let slot = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                warn!(%error, "Accepting a metrics connection failed; retrying shortly.");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => continue,
                }
            }
        };
        let (metrics, gauges) = (metrics.clone(), gauges.clone());
        let stop = shutdown.clone();
        scrapes.spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |request| {
                let response = respond(&request, &metrics, &gauges);
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(SCRAPE_READ_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                () = stop.cancelled() => {}
                served = tokio::time::timeout(SCRAPE_CONNECTION_TIMEOUT, connection) => {
                    if let Ok(Err(error)) = served {
                        debug!(%error, "A metrics connection failed.");
                    }
                }
            }
        });
    }
    scrapes.shutdown().await;
    Ok(())
}

/// The answer to one request: the exposition for `GET /metrics`, 404 for
/// any other path, 405 for another method.
fn respond<B>(
    request: &hyper::Request<B>,
    metrics: &Metrics,
    gauges: &GaugeSource,
) -> hyper::Response<Full<Bytes>> {
    let (status, content_type, body) = if request.uri().path() != "/metrics" {
        (hyper::StatusCode::NOT_FOUND, "text/plain", String::new())
    } else if request.method() != hyper::Method::GET {
        (
            hyper::StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            String::new(),
        )
    } else {
        (
            hyper::StatusCode::OK,
            "text/plain; version=0.0.4",
            metrics.render(&gauges()),
        )
    };
    let mut response = hyper::Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}
