//! Prometheus metrics: counters and histograms kept by the engine in a
//! `prometheus-client` registry, gauges read from their owners at each
//! scrape through a [`GaugeSource`] (this module knows no tenant), exposed
//! in the Prometheus text format on `--metrics-listen`: on the dashboard's
//! HTTP server when both share an address, else on a hyper listener of its
//! own ([`serve`]). No per-tenant labels: label values are bounded
//! (operation kinds, outcomes, states).

use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _, prometheus_text};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::graph::OperationKind;
use crate::loopback;

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

/// The labels of an operation counter: its kind (and outcome).
type KindLabel = [(&'static str, &'static str); 1];
type KindOutcomeLabels = [(&'static str, &'static str); 2];

/// Renders a section of exposition text that another room keeps (see
/// [`Metrics::append_section`]).
pub type Section = Arc<dyn Fn(&mut String) + Send + Sync>;

/// The server's counters and histograms, in a `prometheus-client`
/// registry; the gauges come from a [`GaugeSource`] at each scrape.
pub struct Metrics {
    registry: Registry,
    passes: Counter,
    pass_seconds: Histogram,
    queue_wait: Histogram,
    dispatched: Family<KindLabel, Counter>,
    finished: Family<KindOutcomeLabels, Counter>,
    operations: Histogram,
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
        let mut registry = Registry::default();
        let passes = Counter::default();
        registry.register(
            "reconciled_reconcile_passes",
            "Reconcile passes run",
            passes.clone(),
        );
        let pass_seconds = Histogram::new(PASS_BUCKETS);
        registry.register(
            "reconciled_reconcile_pass_seconds",
            "Duration of reconcile passes",
            pass_seconds.clone(),
        );
        let queue_wait = Histogram::new(QUEUE_WAIT_BUCKETS);
        registry.register(
            "reconciled_tenant_queue_wait_seconds",
            "Time commands (intents, results, registrations) wait in a tenant owner's queue",
            queue_wait.clone(),
        );
        let dispatched = Family::<KindLabel, Counter>::default();
        registry.register(
            "reconciled_operations_dispatched",
            "Operations sent to agents",
            dispatched.clone(),
        );
        let finished = Family::<KindOutcomeLabels, Counter>::default();
        registry.register(
            "reconciled_operations",
            "Operations finished, by kind and outcome",
            finished.clone(),
        );
        let operations = Histogram::new(OPERATION_BUCKETS);
        registry.register(
            "reconciled_operation_seconds",
            "Latency of finished operations, from dispatch to result",
            operations.clone(),
        );
        // Every series exists from the start, at zero: a query sees 0, not
        // an absent series, before the first operation.
        for kind in KINDS {
            drop(dispatched.get_or_create(&[("kind", kind.as_str())]));
            for outcome in OUTCOMES {
                drop(finished.get_or_create(&[("kind", kind.as_str()), ("outcome", outcome)]));
            }
        }
        Self {
            registry,
            passes,
            pass_seconds,
            queue_wait,
            dispatched,
            finished,
            operations,
            sections: std::sync::Mutex::default(),
        }
    }
}

impl Metrics {
    /// Records one reconcile pass and how long it took.
    pub fn pass(&self, seconds: f64) {
        self.passes.inc();
        self.pass_seconds.observe(seconds.max(0.0));
    }

    /// Records how long a command waited in a tenant owner's queue.
    pub fn queue_wait(&self, seconds: f64) {
        self.queue_wait.observe(seconds.max(0.0));
    }

    /// Records dispatched operations.
    pub fn dispatched(&self, kind: OperationKind) {
        self.dispatched
            .get_or_create(&[("kind", kind.as_str())])
            .inc();
    }

    /// Records a finished operation with its outcome ("done", "failed",
    /// "wait", "lost"; anything else counts as "other") and how long it ran.
    pub fn finished(&self, kind: OperationKind, outcome: &str, seconds: f64) {
        let outcome = OUTCOMES
            .iter()
            .find(|known| **known == outcome)
            .copied()
            .unwrap_or("other");
        self.finished
            .get_or_create(&[("kind", kind.as_str()), ("outcome", outcome)])
            .inc();
        self.operations.observe(seconds.max(0.0));
    }

    /// Adds a section of metrics that another room keeps and renders
    /// (exposition text, appended to every scrape).
    pub fn append_section(&self, section: impl Fn(&mut String) + Send + Sync + 'static) {
        self.sections
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Arc::new(section));
    }

    /// The exposition text (Prometheus text format 0.0.4): the metrics kept
    /// here and `gauges`.
    pub fn render(&self, gauges: &Gauges) -> String {
        let mut out = String::new();
        let mut scrape = Registry::default();
        scrape.register_collector(Box::new(GaugeCollector(gauges.clone())));
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        let _ = prometheus_text::encode(&mut out, &scrape);
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

/// The gauges of one scrape, as a `prometheus-client` collector.
#[derive(Debug)]
struct GaugeCollector(Gauges);

impl Collector for GaugeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Gauges {
            items_by_state,
            operations_in_flight,
            tenants,
            tenants_quarantined,
            queued_commands,
            watchers,
            agents_connected,
            store_bytes,
        } = &self.0;
        {
            let mut family = encoder.encode_descriptor(
                "reconciled_items",
                "Items by state, all tenants",
                None,
                MetricType::Gauge,
            )?;
            for (state, count) in items_by_state {
                let labels = [("state", *state)];
                ConstGauge::new(gauge_value(*count)).encode(family.encode_family(&labels)?)?;
            }
        }
        let single: [(&str, &str, u64); 7] = [
            (
                "reconciled_operations_in_flight",
                "Operations in flight (queue depth at the agents)",
                *operations_in_flight,
            ),
            ("reconciled_tenants", "Live tenants", *tenants),
            (
                "reconciled_tenants_quarantined",
                "Tenants not served because their stored records could not be read",
                *tenants_quarantined,
            ),
            (
                "reconciled_watchers",
                "Open Watch streams, all tenants",
                *watchers,
            ),
            (
                "reconciled_tenant_queue_depth",
                "Commands (intents, results, registrations) queued for the tenant owners",
                *queued_commands,
            ),
            (
                "reconciled_agents_connected",
                "Agents connected (distinct agent ids per tenant)",
                *agents_connected,
            ),
            ("reconciled_store_bytes", "Store size on disk", *store_bytes),
        ];
        for (name, help, value) in single {
            let gauge = ConstGauge::new(gauge_value(value));
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

fn gauge_value(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
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

/// Serves `GET /metrics` on `listener` (bound by the caller, so that a
/// port in use stops the start) until `shutdown` is cancelled; then
/// ends the scrapes still open and returns once they have.
///
/// HTTP/1 by hyper: request headers must arrive within
/// [`SCRAPE_READ_TIMEOUT`], a connection lives at most
/// [`SCRAPE_CONNECTION_TIMEOUT`], at most [`MAX_SCRAPE_CONNECTIONS`] are
/// served at once, and an accept error is logged and retried after a short
/// pause: the endpoint outlives a descriptor shortage.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    gauges: GaugeSource,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listen = listener.local_addr()?;
    let listens_on_loopback = listen.ip().is_loopback();
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
                let response = if loopback::request_allowed(&request, listens_on_loopback) {
                    respond(&request, &metrics, &gauges)
                } else {
                    refuse_host()
                };
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

/// The answer to a request addressed to a host name a loopback port does
/// not answer (see [`crate::loopback`]).
fn refuse_host() -> hyper::Response<Full<Bytes>> {
    let mut response =
        hyper::Response::new(Full::new(Bytes::from_static(loopback::REFUSAL.as_bytes())));
    *response.status_mut() = hyper::StatusCode::FORBIDDEN;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The answer to one request: the exposition for `GET /metrics`, 404 for
/// any other path, 405 for another method.
pub fn respond<B>(
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
            prometheus_text::CONTENT_TYPE,
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
