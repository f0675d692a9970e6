//! Any replica answers any call: a tower layer that sends tenant-scoped
//! calls for a tenant another replica serves to that replica, unchanged.
//!
//! The layer sits behind authentication and the limits, in front of the
//! services. For the unary and server-streaming calls that name one tenant
//! (`Reconciler.*` but `Connect`, which agents open on the owner itself;
//! `Tenants.GetTenant`, `DeleteTenant`, `RotateToken`) it reads the
//! request's single message, takes the tenant from its field 1 (every such
//! request has it there), and:
//!
//! - this replica serves the tenant, or no tenant has that name: the call
//!   goes on to the local service;
//! - another replica serves it: the HTTP/2 request (headers, the caller's
//!   metadata, the message) goes to that replica over a pooled channel,
//!   and its response (status, details, trailers, a Watch's whole stream)
//!   comes back as it is. The request is marked, so that it is never
//!   forwarded twice (a tenant that moved meanwhile answers `NOT_OWNER`);
//! - nobody serves it right now (a hand-off, a failover): the call waits
//!   until somebody does, up to about twice the lease TTL, then answers
//!   `UNAVAILABLE` with `NOT_OWNER`.
//!
//! A relayed response whose owner stops answering midway (it died, or was
//! paused until its connection timed out) ends with `UNAVAILABLE`, so that
//! a Watch resumes and a call is retried through any replica. So does a
//! relayed Watch when this replica shuts down, as its own watches do.

use std::collections::HashMap;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::Frame;
use http_body_util::{BodyExt as _, Full};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::body::Body;
use tonic::codegen::http::{HeaderMap, HeaderValue, Request, Response};
use tonic::codegen::{BoxFuture, Bytes};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tower::{Layer, Service, ServiceExt as _};
use tracing::{debug, warn};

use crate::status::ApiError;

use super::Cluster;
use super::ownership::Route;

/// How long a forwarded call may still answer once its tenant left the
/// replica it was sent to (a DeleteTenant ends the tenant before its
/// answer is on the way back).
const MOVED_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The header that marks a forwarded call; its value names the replica
/// that forwarded it.
pub const FORWARDED_BY: &str = "x-reconciled-forwarded-by";

/// The calls that name one tenant in field 1 of their request and are
/// served by the tenant's owner.
const TENANT_SCOPED: [&str; 9] = [
    "/reconciled.v1.Reconciler/SubmitIntent",
    "/reconciled.v1.Reconciler/Reconcile",
    "/reconciled.v1.Reconciler/Watch",
    "/reconciled.v1.Reconciler/GetGraph",
    "/reconciled.v1.Reconciler/GetStatus",
    "/reconciled.v1.Reconciler/ReportExternal",
    "/reconciled.v1.Tenants/GetTenant",
    "/reconciled.v1.Tenants/DeleteTenant",
    "/reconciled.v1.Tenants/RotateToken",
];

/// HTTP/1.1 headers that HTTP/2 forbids (they concern one connection).
const CONNECTION_HEADERS: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// How long dialling another replica may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Field 1 of a tenant-scoped request: the tenant's name.
#[derive(Clone, PartialEq, prost::Message)]
struct TenantField {
    #[prost(string, tag = "1")]
    tenant: String,
}

/// The tenant named by a gRPC request body holding one uncompressed
/// message, if it does.
fn tenant_of(body: &[u8]) -> Option<String> {
    let (&compressed, rest) = body.split_first()?;
    let (length, message) = rest.split_first_chunk::<4>()?;
    let length = usize::try_from(u32::from_be_bytes(*length)).ok()?;
    if compressed != 0 || message.len() != length {
        return None;
    }
    let field = <TenantField as prost::Message>::decode(message).ok()?;
    (!field.tenant.is_empty()).then_some(field.tenant)
}

/// Channels to the other replicas, one per address, opened on first use.
pub struct Peers {
    tls: Option<ClientTlsConfig>,
    /// HTTP/2 keepalive: a peer that stops answering is given up after
    /// about a lease TTL, as the cluster gives up its tenants.
    keepalive: Duration,
    channels: Mutex<HashMap<String, Channel>>,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers").finish_non_exhaustive()
    }
}

impl Peers {
    /// Peers dialled over TLS with `tls`, or in plain text, given up
    /// after about `lease_ttl` of silence.
    pub fn new(tls: Option<ClientTlsConfig>, lease_ttl: Duration) -> Self {
        Self {
            tls,
            keepalive: lease_ttl.max(Duration::from_secs(1)),
            channels: Mutex::new(HashMap::new()),
        }
    }

    /// The channel to the replica at `address` (`HOST:PORT`).
    pub fn channel(&self, address: &str) -> Result<Channel, ApiError> {
        let mut channels = self
            .channels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let unreachable = |error: tonic::transport::Error| ApiError::Unavailable {
            message: format!("cannot reach the replica at {address}: {error}"),
        };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(unreachable)?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(self.keepalive / 2)
            .keep_alive_timeout(self.keepalive)
            .keep_alive_while_idle(true);
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone()).map_err(unreachable)?;
        }
        let channel = endpoint.connect_lazy();
        channels.insert(address.to_owned(), channel.clone());
        Ok(channel)
    }
}

/// Forwards tenant-scoped calls to the tenant's owner (see the module
/// doc); without a cluster (a single server) it passes every call on.
#[derive(Clone)]
pub struct ForwardLayer {
    cluster: Option<Arc<Cluster>>,
    stopping: CancellationToken,
}

impl ForwardLayer {
    /// A layer routing by `cluster`'s ownership, if there is a cluster;
    /// relayed streams end (`UNAVAILABLE`) once `stopping` is cancelled
    /// (the server shuts down), so that they do not hold up the drain.
    pub fn new(cluster: Option<Arc<Cluster>>, stopping: CancellationToken) -> Self {
        Self { cluster, stopping }
    }
}

impl<S> Layer<S> for ForwardLayer {
    type Service = Forward<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Forward {
            inner,
            cluster: self.cluster.clone(),
            stopping: self.stopping.clone(),
        }
    }
}

/// The service of [`ForwardLayer`].
#[derive(Clone)]
pub struct Forward<S> {
    inner: S,
    cluster: Option<Arc<Cluster>>,
    stopping: CancellationToken,
}

impl<S> Service<Request<Body>> for Forward<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let Some(cluster) = self.cluster.clone() else {
            return Box::pin(inner.oneshot(request));
        };
        let stopping = self.stopping.clone();
        if !TENANT_SCOPED.contains(&request.uri().path()) {
            return Box::pin(inner.oneshot(request));
        }
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let bytes = match body.collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(error) => {
                    let status =
                        tonic::Status::cancelled(format!("the request could not be read: {error}"));
                    return Ok(status.into_http());
                }
            };
            let rebuild = |parts| Request::from_parts(parts, Body::new(Full::new(bytes.clone())));
            let Some(tenant) = tenant_of(&bytes) else {
                return inner.oneshot(rebuild(parts)).await;
            };
            let forwarded = parts.headers.contains_key(FORWARDED_BY);
            let mut route = cluster.await_route(&tenant).await;
            let mut retried = false;
            loop {
                match route {
                    Route::Here | Route::Unknown => return inner.oneshot(rebuild(parts)).await,
                    Route::Nowhere => {
                        return Ok(not_owner(&tenant, None));
                    }
                    Route::Elsewhere(owner) if forwarded => {
                        return Ok(not_owner(&tenant, Some(owner)));
                    }
                    Route::Elsewhere(owner) => {
                        if let Ok(value) = HeaderValue::from_str(cluster.replica()) {
                            parts.headers.insert(FORWARDED_BY, value);
                        }
                        // The dashboard's gRPC-Web calls arrive over HTTP/1.1;
                        // replicas speak HTTP/2, which has no connection headers.
                        parts.version = tonic::codegen::http::Version::HTTP_2;
                        for header in CONNECTION_HEADERS {
                            parts.headers.remove(header);
                        }
                        let channel = match cluster.peers().channel(&owner) {
                            Ok(channel) => channel,
                            Err(error) => return Ok(tonic::Status::from(error).into_http()),
                        };
                        cluster.metrics().forwarded();
                        debug!(%tenant, %owner, "Forwarding a call to the tenant's owner.");
                        let call = channel.oneshot(rebuild(parts.clone()));
                        tokio::pin!(call);
                        let answered = tokio::select! {
                            biased;
                            answered = &mut call => answered,
                            // An owner that stops answering (paused, cut off)
                            // loses the tenant; the call must not hang on it.
                            // One whose call ended the tenant (DeleteTenant)
                            // answers right after: it gets a moment.
                            () = cluster.moved_from(&tenant, &owner) => {
                                if let Ok(answered) = tokio::time::timeout(MOVED_GRACE, &mut call).await {
                                    answered
                                } else {
                                let status = tonic::Status::unavailable(format!(
                                    "the replica at {owner} stopped serving tenant {tenant:?} \
                                     before it answered; whether the call took effect is \
                                     unknown; retry (any replica forwards it to the new owner)"
                                ));
                                return Ok(status.into_http());
                                }
                            }
                        };
                        match answered {
                            Ok(response) => {
                                return Ok(response.map(|body| {
                                    Body::new(Relayed::new(body, &tenant, &owner, &stopping))
                                }));
                            }
                            Err(error) if !retried && refused(&error) => {
                                // The owner is gone (not a word was sent to
                                // it): wait for the next owner, once.
                                retried = true;
                                route = cluster.await_route_other_than(&tenant, &owner).await;
                            }
                            Err(error) => {
                                warn!(%tenant, %owner, %error, "Forwarding a call failed.");
                                let status = tonic::Status::unavailable(format!(
                                    "the replica serving tenant {tenant:?} at {owner} did not \
                                     answer ({error}); retry"
                                ));
                                return Ok(status.into_http());
                            }
                        }
                    }
                }
            }
        })
    }
}

/// The body of a response relayed from a tenant's owner. When the relay
/// breaks (the owner died, or stopped answering and its connection timed
/// out), the call ends with `UNAVAILABLE` trailers instead of the HTTP/2
/// reset of a broken body, which callers would see as `INTERNAL`, an
/// error nobody retries: a Watch resumes from its last revision and a
/// call is retried through any replica, which forwards it to the new
/// owner. A relay still open when this replica shuts down (a Watch: a
/// unary answer is whole once its headers came) ends the same way, as
/// the replica's own watches do.
struct Relayed {
    inner: Body,
    tenant: String,
    owner: String,
    /// Completes when this replica shuts down.
    stopping: Pin<Box<WaitForCancellationFutureOwned>>,
    /// The body ended (or was ended here): nothing more comes.
    done: bool,
}

impl Relayed {
    fn new(inner: Body, tenant: &str, owner: &str, stopping: &CancellationToken) -> Self {
        Self {
            inner,
            tenant: tenant.to_owned(),
            owner: owner.to_owned(),
            stopping: Box::pin(stopping.clone().cancelled_owned()),
            done: false,
        }
    }

    /// The trailers that end a relay broken by `error`.
    fn broken(&self, error: &tonic::Status) -> Frame<Bytes> {
        Self::ending(tonic::Status::unavailable(format!(
            "the replica serving tenant {:?} at {} stopped answering mid-call ({}); \
             whether the call took effect is unknown: resume a Watch from its last \
             revision, or retry the call, through any replica (it forwards to the new owner)",
            self.tenant,
            self.owner,
            error.message()
        )))
    }

    /// The trailers that end a relay at this replica's shutdown.
    fn stopped(&self) -> Frame<Bytes> {
        Self::ending(tonic::Status::unavailable(format!(
            "the replica relaying this call for tenant {:?} (served at {}) is shutting \
             down; resume a Watch from its last revision through another replica",
            self.tenant, self.owner
        )))
    }

    /// Trailers that end the call with `status`.
    fn ending(status: tonic::Status) -> Frame<Bytes> {
        let mut trailers = HeaderMap::new();
        // A status of ASCII text always makes valid headers.
        let _ = status.add_header(&mut trailers);
        Frame::trailers(trailers)
    }
}

impl http_body::Body for Relayed {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                self.done = frame.is_trailers();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                self.done = true;
                warn!(tenant = %self.tenant, owner = %self.owner, %error, "A relayed response broke off; ending the call with UNAVAILABLE.");
                Poll::Ready(Some(Ok(self.broken(&error))))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => match self.stopping.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.done = true;
                    Poll::Ready(Some(Ok(self.stopped())))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The response of a call whose tenant this replica does not serve.
fn not_owner(tenant: &str, owner: Option<String>) -> Response<Body> {
    tonic::Status::from(ApiError::NotOwner {
        tenant: tenant.to_owned(),
        owner,
    })
    .into_http()
}

/// Whether `error` says the peer could not be dialled at all (so the call
/// was not delivered and may be sent elsewhere).
fn refused(error: &tonic::transport::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::TimedOut
            )
        {
            return true;
        }
        source = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(message: &[u8]) -> Vec<u8> {
        let mut body = vec![0];
        body.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
        body.extend_from_slice(message);
        body
    }

    #[test]
    fn the_tenant_is_read_from_field_one_of_any_tenant_scoped_request() {
        use prost::Message as _;
        let submit = reconciled_proto::v1::SubmitIntentRequest {
            tenant: "acme".into(),
            subgraph: "a/b".into(),
            ..Default::default()
        };
        assert_eq!(
            tenant_of(&framed(&submit.encode_to_vec())),
            Some("acme".into())
        );
        let get = reconciled_proto::v1::GetTenantRequest {
            name: "other".into(),
        };
        assert_eq!(
            tenant_of(&framed(&get.encode_to_vec())),
            Some("other".into())
        );
        assert_eq!(tenant_of(b""), None);
        let mut compressed = framed(&get.encode_to_vec());
        compressed[0] = 1;
        assert_eq!(tenant_of(&compressed), None);
    }
}
