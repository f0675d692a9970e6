//! Limits that protect the server: global ones (connections, request rate,
//! unary calls running at once with load shedding, call timeouts, message
//! size) applied by one tower layer in front of every service, and the
//! per-tenant count of connected agents.
//!
//! What exceeds a limit is refused with `RESOURCE_EXHAUSTED`: with a
//! `RetryInfo` when waiting helps (rate, load, connections), with a
//! `QuotaFailure` naming the setting when the request itself is too big.
//! Health checks are never limited, so probes keep working under load.

use std::collections::{HashMap, HashSet};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prost::Message as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Code;
use tonic::body::Body;
use tonic::codegen::BoxFuture;
use tonic::codegen::http::{Request, Response};
use tonic::transport::server::{Connected, TlsConnectInfo};
use tonic_types::{ErrorDetails, StatusExt as _};
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt as _};

/// How long a refused client is asked to wait when the server is busy.
const BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Path prefix of the health service, which no limit applies to.
const HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";

/// Streaming methods outside our own descriptor set (reflection is a
/// bidirectional stream).
const OTHER_STREAMING_PATHS: [&str; 2] = [
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// The global limits, as configured.
#[derive(Clone, Debug)]
pub struct GlobalLimits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Unary calls running at once; more are shed.
    pub max_concurrent_requests: usize,
    /// Calls accepted per second, all clients together; `None`: no limit.
    pub max_requests_per_second: Option<u64>,
    /// Longest a unary call may run.
    pub request_timeout: Duration,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ---------------------------------------------------------------------------
// Connections

/// The server's connection slots. A connection takes a slot with its first
/// call and keeps it until it closes; calls on a connection that finds no
/// free slot are refused (and it tries again with its next call), so a
/// client refused under a burst recovers without reconnecting.
#[derive(Clone, Debug)]
pub struct ConnectionSlots {
    semaphore: Arc<Semaphore>,
}

impl ConnectionSlots {
    /// `max` slots.
    pub fn new(max: usize) -> Self {
        Self {
            semaphore: Arc::new(Semaphore::new(max)),
        }
    }

    /// Wraps an accepted connection so that it can hold a slot.
    pub fn wrap<T>(&self, io: T) -> LimitedConnection<T> {
        LimitedConnection {
            inner: io,
            slot: ConnectionSlot {
                semaphore: self.semaphore.clone(),
                permit: Arc::default(),
            },
        }
    }
}

/// One connection's claim on a slot (shared with its calls' extensions).
#[derive(Clone, Debug)]
pub struct ConnectionSlot {
    semaphore: Arc<Semaphore>,
    permit: Arc<Mutex<Option<OwnedSemaphorePermit>>>,
}

impl ConnectionSlot {
    /// Whether the connection holds a slot, taking a free one if it has none.
    fn admit(&self) -> bool {
        let mut permit = lock(&self.permit);
        if permit.is_none() {
            *permit = self.semaphore.clone().try_acquire_owned().ok();
        }
        permit.is_some()
    }

    fn release(&self) {
        lock(&self.permit).take();
    }
}

/// An accepted connection that may hold one of the [`ConnectionSlots`];
/// the slot is freed when the connection is dropped.
#[derive(Debug)]
pub struct LimitedConnection<T> {
    inner: T,
    slot: ConnectionSlot,
}

impl<T> Drop for LimitedConnection<T> {
    fn drop(&mut self) {
        self.slot.release();
    }
}

/// What calls on a [`LimitedConnection`] see of it: the transport's own
/// connection info and the connection's slot.
#[derive(Clone, Debug)]
pub struct LimitedConnectInfo<C> {
    /// The transport's connection info (addresses).
    pub inner: C,
    slot: ConnectionSlot,
}

impl<T: Connected> Connected for LimitedConnection<T> {
    type ConnectInfo = LimitedConnectInfo<T::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        LimitedConnectInfo {
            inner: self.inner.connect_info(),
            slot: self.slot.clone(),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for LimitedConnection<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for LimitedConnection<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The slot of the connection a call came on (plain or TLS), if any.
fn connection_slot<B>(request: &Request<B>) -> Option<&ConnectionSlot> {
    type Tcp = tonic::transport::server::TcpConnectInfo;
    let extensions = request.extensions();
    extensions
        .get::<LimitedConnectInfo<Tcp>>()
        .map(|info| &info.slot)
        .or_else(|| {
            extensions
                .get::<TlsConnectInfo<LimitedConnectInfo<Tcp>>>()
                .map(|info| &info.get_ref().slot)
        })
}

// ---------------------------------------------------------------------------
// Request rate

/// A token bucket: `rate` calls per second, bursts of up to `rate`.
#[derive(Debug)]
struct RateLimiter {
    rate: f64,
    bucket: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    fn new(rate: u64) -> Self {
        let rate = rate.max(1) as f64;
        Self {
            rate,
            bucket: Mutex::new((rate, Instant::now())),
        }
    }

    /// Takes a token, or says how long until one is available.
    fn try_acquire(&self) -> Result<(), Duration> {
        let mut bucket = lock(&self.bucket);
        let now = Instant::now();
        let refilled = bucket.0 + now.duration_since(bucket.1).as_secs_f64() * self.rate;
        *bucket = (refilled.min(self.rate), now);
        if bucket.0 >= 1.0 {
            bucket.0 -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.0) / self.rate))
        }
    }
}

// ---------------------------------------------------------------------------
// The layer

/// Applies the [`GlobalLimits`] to every call of the services it wraps
/// (use with `Server::builder().layer(...)`); the connections must come
/// through [`ConnectionSlots::wrap`] for the connection limit to apply.
#[derive(Clone, Debug)]
pub struct LimitsLayer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    rate: Option<RateLimiter>,
    unary_slots: Arc<Semaphore>,
    timeout: Duration,
    streaming: HashSet<String>,
}

impl LimitsLayer {
    /// A layer enforcing `limits`.
    pub fn new(limits: &GlobalLimits) -> Self {
        Self {
            shared: Arc::new(Shared {
                rate: limits.max_requests_per_second.map(RateLimiter::new),
                unary_slots: Arc::new(Semaphore::new(limits.max_concurrent_requests)),
                timeout: limits.request_timeout,
                streaming: streaming_paths(),
            }),
        }
    }
}

impl<S> Layer<S> for LimitsLayer {
    type Service = LimitsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LimitsService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The HTTP paths of every streaming method of `reconciled.v1` (from the
/// compiled descriptor set), and of reflection. Streams are long-lived:
/// neither the unary concurrency limit nor the call timeout applies to them.
fn streaming_paths() -> HashSet<String> {
    let mut paths: HashSet<String> = OTHER_STREAMING_PATHS
        .iter()
        .map(|path| (*path).to_owned())
        .collect();
    // The descriptor set is compiled in; if it ever failed to decode, every
    // method would count as unary, which is safe but limits streams.
    let set = prost_types::FileDescriptorSet::decode(reconciled_proto::FILE_DESCRIPTOR_SET)
        .unwrap_or_default();
    for file in &set.file {
        for service in &file.service {
            for method in &service.method {
                if method.client_streaming() || method.server_streaming() {
                    paths.insert(format!(
                        "/{}.{}/{}",
                        file.package(),
                        service.name(),
                        method.name()
                    ));
                }
            }
        }
    }
    paths
}

/// The service made by [`LimitsLayer`].
#[derive(Clone, Debug)]
pub struct LimitsService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Service<Request<Body>> for LimitsService<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // The clone is not ready; the ready one serves this call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let path = request.uri().path().to_owned();
        if path.starts_with(HEALTH_PREFIX) {
            let call = inner.oneshot(request);
            return Box::pin(async move { call.await.map_err(Into::into) });
        }
        if let Some(refusal) = self.refusal(&request) {
            return Box::pin(async move { Ok(refusal) });
        }
        if self.shared.streaming.contains(&path) {
            let call = inner.oneshot(request);
            return Box::pin(async move { call.await.map_err(Into::into) });
        }
        let unary = ServiceBuilder::new()
            .load_shed()
            .layer(GlobalConcurrencyLimitLayer::with_semaphore(
                self.shared.unary_slots.clone(),
            ))
            .timeout(self.shared.timeout)
            .service(inner);
        let timeout = self.shared.timeout;
        Box::pin(async move {
            match unary.oneshot(request).await {
                Ok(response) => Ok(message_too_large_as_quota(response)),
                Err(error) => Ok(unary_failure(error, timeout)),
            }
        })
    }
}

impl<S> LimitsService<S> {
    /// The answer to a call that the connection or rate limit refuses.
    fn refusal(&self, request: &Request<Body>) -> Option<Response<Body>> {
        if let Some(slot) = connection_slot(request)
            && !slot.admit()
        {
            return Some(retry_later(
                "the server serves as many connections as it is configured for \
                 (max_connections); retry later or reuse an open connection",
                BUSY_RETRY_AFTER,
            ));
        }
        if let Some(rate) = &self.shared.rate
            && let Err(wait) = rate.try_acquire()
        {
            return Some(retry_later(
                "the server's request rate limit (max_requests_per_second) is reached; \
                 retry after the delay in RetryInfo",
                wait,
            ));
        }
        None
    }
}

/// `RESOURCE_EXHAUSTED` with a `RetryInfo`, as an HTTP response.
fn retry_later(message: &str, retry_after: Duration) -> Response<Body> {
    tonic::Status::with_error_details(
        Code::ResourceExhausted,
        message,
        ErrorDetails::with_retry_info(Some(retry_after)),
    )
    .into_http()
}

/// Turns a failure of the unary stack (shed, timed out) into a status.
fn unary_failure(error: BoxError, timeout: Duration) -> Response<Body> {
    if error.is::<tower::load_shed::error::Overloaded>() {
        retry_later(
            "the server is running as many calls as it is configured for \
             (max_concurrent_requests); retry after the delay in RetryInfo",
            BUSY_RETRY_AFTER,
        )
    } else if error.is::<tower::timeout::error::Elapsed>() {
        tonic::Status::deadline_exceeded(format!(
            "the call ran longer than the server allows ({} s, request_timeout_secs)",
            timeout.as_secs()
        ))
        .into_http()
    } else {
        tonic::Status::from_error(error).into_http()
    }
}

/// tonic refuses an over-long message with `OUT_OF_RANGE`; the product
/// answers `RESOURCE_EXHAUSTED` with a `QuotaFailure` naming the setting.
fn message_too_large_as_quota(response: Response<Body>) -> Response<Body> {
    let headers = response.headers();
    let out_of_range = headers
        .get("grpc-status")
        .is_some_and(|status| status.as_bytes() == b"11");
    let too_large = headers
        .get("grpc-message")
        .and_then(|message| message.to_str().ok())
        .filter(|message| {
            message.contains("message%20length%20too%20large")
                || message.contains("message length too large")
        })
        .map(percent_decode);
    match (out_of_range, too_large) {
        (true, Some(message)) => tonic::Status::with_error_details(
            Code::ResourceExhausted,
            format!("the request is larger than the server accepts: {message}; split it (e.g. into subgraphs)"),
            ErrorDetails::with_quota_failure_violation("max_message_bytes", message),
        )
        .into_http(),
        _ => response,
    }
}

/// Decodes the `%XX` escapes of a `grpc-message` header.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = (bytes[index] == b'%')
            .then(|| text.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                index += 3;
            }
            None => {
                out.push(bytes[index]);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

// ---------------------------------------------------------------------------
// Agents per tenant

/// Agents connected per tenant, counted by distinct agent id (a reconnect
/// of a connected agent id is always admitted: it takes the old session
/// over).
#[derive(Debug)]
pub struct AgentCounts {
    default_limit: usize,
    live: Mutex<HashMap<u64, HashMap<String, usize>>>,
}

/// Why an agent was not admitted.
#[derive(Debug, thiserror::Error)]
#[error(
    "the tenant has {connected} agents connected, its limit (max_agents); stop one or \
     raise the tenant's limit"
)]
pub struct TooManyAgents {
    /// Agents connected now.
    pub connected: usize,
}

impl AgentCounts {
    /// Counts with `default_limit` for tenants whose own limit is 0.
    pub fn new(default_limit: usize) -> Arc<Self> {
        Arc::new(Self {
            default_limit,
            live: Mutex::default(),
        })
    }

    /// Admits agent `agent_id` of tenant `tenant_id` (whose own limit is
    /// `tenant_limit`, 0 for the default); the agent counts until the
    /// returned slot is dropped.
    pub fn admit(
        self: &Arc<Self>,
        tenant_id: u64,
        tenant_limit: u64,
        agent_id: &str,
    ) -> Result<AgentSlot, TooManyAgents> {
        let limit = match tenant_limit {
            0 => self.default_limit,
            limit => usize::try_from(limit).unwrap_or(usize::MAX),
        };
        let mut live = lock(&self.live);
        let agents = live.entry(tenant_id).or_default();
        if !agents.contains_key(agent_id) && agents.len() >= limit {
            return Err(TooManyAgents {
                connected: agents.len(),
            });
        }
        *agents.entry(agent_id.to_owned()).or_default() += 1;
        Ok(AgentSlot {
            counts: self.clone(),
            tenant_id,
            agent_id: agent_id.to_owned(),
        })
    }

    /// Agents connected now, all tenants together.
    pub fn connected(&self) -> usize {
        lock(&self.live).values().map(HashMap::len).sum()
    }

    fn release(&self, tenant_id: u64, agent_id: &str) {
        let mut live = lock(&self.live);
        let Some(agents) = live.get_mut(&tenant_id) else {
            return;
        };
        if let Some(sessions) = agents.get_mut(agent_id) {
            *sessions -= 1;
            if *sessions == 0 {
                agents.remove(agent_id);
            }
        }
        if agents.is_empty() {
            live.remove(&tenant_id);
        }
    }
}

/// One session's place in [`AgentCounts`]; released on drop.
#[derive(Debug)]
pub struct AgentSlot {
    counts: Arc<AgentCounts>,
    tenant_id: u64,
    agent_id: String,
}

impl Drop for AgentSlot {
    fn drop(&mut self) {
        self.counts.release(self.tenant_id, &self.agent_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_count_by_id_and_a_reconnect_is_admitted_at_the_limit() {
        let counts = AgentCounts::new(1);
        let first = counts.admit(7, 0, "a").expect("room");
        let again = counts.admit(7, 0, "a").expect("same agent reconnects");
        assert!(counts.admit(7, 0, "b").is_err());
        assert!(counts.admit(8, 0, "b").is_ok(), "other tenants unaffected");
        drop(first);
        assert!(counts.admit(7, 0, "b").is_err(), "a still has a session");
        drop(again);
        assert!(counts.admit(7, 0, "b").is_ok());
        assert!(
            counts.admit(7, 2, "c").is_ok(),
            "the tenant's own limit wins"
        );
    }

    #[test]
    fn the_rate_limiter_allows_a_burst_then_names_the_wait() {
        let limiter = RateLimiter::new(2);
        assert!(limiter.try_acquire().is_ok());
        assert!(limiter.try_acquire().is_ok());
        let wait = limiter.try_acquire().expect_err("bucket empty");
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(500));
    }

    #[test]
    fn streaming_methods_come_from_the_descriptor_set() {
        let paths = streaming_paths();
        assert!(paths.contains("/reconciled.v1.Configurators/Connect"));
        assert!(paths.contains("/reconciled.v1.Reconciler/Watch"));
        assert!(!paths.contains("/reconciled.v1.Reconciler/SubmitIntent"));
    }

    #[test]
    fn grpc_messages_are_percent_decoded() {
        assert_eq!(percent_decode("a%20b%25c"), "a b%c");
        assert_eq!(percent_decode("bad%zz"), "bad%zz");
    }
}
