//! Limits that protect the server: global ones (connections, request rate,
//! unary calls running at once with load shedding, call timeouts, message
//! size) applied by one tower layer in front of every service, each
//! tenant's budget of `Reconcile` calls (which take no unary slot: a wait
//! may last minutes), and the per-tenant count of connected agents.
//!
//! What exceeds a limit is refused with `RESOURCE_EXHAUSTED`: with a
//! `RetryInfo` when waiting helps (rate, load, connections), with a
//! `QuotaFailure` naming the setting when the request itself is too big.
//! Health checks are never limited, so probes keep working under load.

mod agents;
mod connections;
mod decode;
mod per_caller;
mod rate;
mod tenant_bytes;

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use prost::Message as _;
use tokio::sync::Semaphore;
use tonic::body::Body;
use tonic::codegen::BoxFuture;
use tonic::codegen::http::{Request, Response};
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt as _};

pub use agents::{AgentCounts, AgentSlot, TooManyAgents};
use connections::connection_slot;
pub use connections::{ConnectionSlot, ConnectionSlots, LimitedConnectInfo, LimitedConnection};
pub use decode::{
    DECODED_BYTES_FLOOR, DECODED_BYTES_PER_BYTE, DecodeLimitLayer, DecodeLimitService,
    decoded_allowance, estimate_decoded_bytes,
};
use per_caller::PerCaller;
use rate::RateLimiter;

use crate::auth::Caller;
use crate::status::ApiError;

/// Locks a mutex of the limits' bookkeeping; a poisoned lock still holds
/// consistent counts (no update panics halfway).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How long a refused client is asked to wait when the server is busy.
const BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// `Reconcile`: charged to its caller's own budget instead of a unary slot
/// (its waits may last minutes); the request timeout still applies.
const RECONCILE_PATH: &str = "/reconciled.v1.Reconciler/Reconcile";

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
    /// `Reconcile` calls one tenant (or the admin) runs at once.
    pub max_reconcile_calls_per_tenant: usize,
    /// Calls accepted per second, all clients together; `None`: no limit.
    pub max_requests_per_second: Option<u64>,
    /// Longest a unary call may run.
    pub request_timeout: Duration,
}

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
    reconciles: Arc<PerCaller>,
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
                reconciles: PerCaller::new(limits.max_reconcile_calls_per_tenant),
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

// The wrapped service cannot fail (tonic's router answers every call with a
// response), so whatever the unary stack fails with comes from its own load
// shedding or timeout.
impl<S> Service<Request<Body>> for LimitsService<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
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
        if path == RECONCILE_PATH
            && let Some(caller) = request.extensions().get::<Caller>()
        {
            let Some(permit) = self.shared.reconciles.admit(caller) else {
                let refusal = reconcile_budget_used(self.shared.reconciles.max());
                return Box::pin(async move { Ok(refusal) });
            };
            let timeout = self.shared.timeout;
            let call = ServiceBuilder::new()
                .timeout(timeout)
                .service(inner)
                .oneshot(request);
            return Box::pin(async move {
                let answer = call.await;
                drop(permit);
                Ok(match answer {
                    Ok(response) => message_too_large_as_quota(response),
                    Err(error) => unary_failure(error, timeout),
                })
            });
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
    refuse(ApiError::Overloaded {
        message: message.to_owned(),
        retry_after,
    })
}

/// The status of `error` as an HTTP response.
fn refuse(error: ApiError) -> Response<Body> {
    tonic::Status::from(error).into_http()
}

/// The answer to a `Reconcile` over its caller's budget.
fn reconcile_budget_used(max: usize) -> Response<Body> {
    refuse(ApiError::QuotaExceeded {
        subject: "max_reconcile_calls_per_tenant".into(),
        description: format!(
            "this tenant already runs {max} Reconcile calls (waits included); \
             wait for one to end, or raise max_reconcile_calls_per_tenant"
        ),
    })
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
        refuse(ApiError::DeadlineExceeded {
            message: format!(
                "the call ran longer than the server allows ({} s, request_timeout_secs)",
                timeout.as_secs()
            ),
        })
    } else {
        // The wrapped service is infallible and the concurrency limit only
        // waits, so nothing else can fail here.
        refuse(ApiError::internal(format!(
            "the limits layer failed unexpectedly: {error}"
        )))
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
        (true, Some(detail)) => refuse(ApiError::MessageTooLarge { detail }),
        _ => decode_failure_as_client_error(response),
    }
}

/// tonic answers a message prost cannot decode with `INTERNAL`; it is the
/// client's error: `INVALID_ARGUMENT`. (The decoding layer refuses what it
/// recognises first, with a field path; this catches the rest of unary
/// calls.)
fn decode_failure_as_client_error(response: Response<Body>) -> Response<Body> {
    let headers = response.headers();
    let internal = headers
        .get("grpc-status")
        .is_some_and(|status| status.as_bytes() == b"13");
    let detail = headers
        .get("grpc-message")
        .and_then(|message| message.to_str().ok())
        .map(percent_decode)
        .filter(|message| message.starts_with("failed to decode Protobuf message"));
    match (internal, detail) {
        (true, Some(detail)) => refuse(ApiError::invalid_field(
            "(message)",
            format!(
                "the request is not a valid protobuf message of its type ({detail}); fix the client's encoding"
            ),
        )),
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

#[cfg(test)]
mod tests {
    use super::*;

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
