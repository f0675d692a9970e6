//! [`DashboardLayer`]: in front of the gRPC-Web translation on the
//! dashboard port, answers the page's own requests (`GET /`, `GET
//! /assets/...`, `GET /schema.json`) from the embedded files, `GET
//! /metrics` when the metrics endpoint shares the port, and passes
//! every gRPC or gRPC-Web call (a `POST` with an `application/grpc*`
//! content type) on to the services, which authenticate and limit it as on
//! the gRPC port.

use std::sync::Arc;
use std::task::{Context, Poll};

use http_body_util::Full;
use tonic::body::Body;
use tonic::codegen::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, HeaderValue, REFERRER_POLICY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use tonic::codegen::http::{Method, Request, Response, StatusCode};
use tonic::codegen::{BoxFuture, Bytes};
use tower::{Layer, Service, ServiceExt as _};

use super::assets::{self, CONTENT_SECURITY_POLICY as POLICY};
use super::schema::schema_json;

use crate::loopback;
use crate::metrics::{GaugeSource, Metrics};

/// Serves the dashboard's files (and the metrics, when they share the
/// port) and hands gRPC calls to the inner service. On a port listening on
/// loopback, refuses requests addressed to any other host name (see
/// [`crate::loopback`]).
#[derive(Clone, Default)]
pub struct DashboardLayer {
    metrics: Option<MetricsPage>,
    listens_on_loopback: bool,
}

/// What `GET /metrics` on the dashboard port reads.
#[derive(Clone)]
pub struct MetricsPage {
    /// The server's counters and histograms.
    pub metrics: Arc<Metrics>,
    /// The gauges, read at each scrape.
    pub gauges: GaugeSource,
}

impl DashboardLayer {
    /// A layer for a port listening on `listen`, that also serves `GET
    /// /metrics` from `metrics` when given (`--metrics-listen` equal to
    /// `--ui-listen`).
    pub fn new(listen: std::net::SocketAddr, metrics: Option<MetricsPage>) -> Self {
        Self {
            metrics,
            listens_on_loopback: listen.ip().is_loopback(),
        }
    }
}

impl std::fmt::Debug for DashboardLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DashboardLayer")
            .field("metrics", &self.metrics.is_some())
            .field("listens_on_loopback", &self.listens_on_loopback)
            .finish()
    }
}

impl<S> Layer<S> for DashboardLayer {
    type Service = DashboardService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DashboardService {
            inner,
            metrics: self.metrics.clone(),
            listens_on_loopback: self.listens_on_loopback,
        }
    }
}

/// The service of [`DashboardLayer`].
#[derive(Clone)]
pub struct DashboardService<S> {
    inner: S,
    metrics: Option<MetricsPage>,
    listens_on_loopback: bool,
}

impl<S> Service<Request<Body>> for DashboardService<S>
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
        if !loopback::request_allowed(&request, self.listens_on_loopback) {
            let response = plain(StatusCode::FORBIDDEN, loopback::REFUSAL);
            return Box::pin(async move { Ok(response) });
        }
        if is_grpc(&request) {
            let clone = self.inner.clone();
            let inner = std::mem::replace(&mut self.inner, clone);
            return Box::pin(async move {
                let mut response = inner.oneshot(request).await?;
                protect(&mut response);
                Ok(response)
            });
        }
        if let Some(page) = &self.metrics
            && request.uri().path() == "/metrics"
        {
            let mut response =
                crate::metrics::respond(&request, &page.metrics, &page.gauges).map(Body::new);
            protect(&mut response);
            return Box::pin(async move { Ok(response) });
        }
        let response = page_response(request.method(), request.uri().path());
        Box::pin(async move { Ok(response) })
    }
}

/// Whether a request is a gRPC or gRPC-Web call (for the services) rather
/// than a page request.
fn is_grpc(request: &Request<Body>) -> bool {
    request.method() == Method::POST
        && request
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("application/grpc"))
}

/// The answer to a page request: an embedded file, the schema, 404 or 405.
pub fn page_response(method: &Method, path: &str) -> Response<Body> {
    if method != Method::GET && method != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "Only GET is served here.\n");
    }
    let (content_type, body): (&'static str, Bytes) = if path == "/schema.json" {
        (
            "application/json",
            Bytes::from_static(schema_json().as_bytes()),
        )
    } else if let Some(asset) = assets::find(path) {
        (asset.content_type, Bytes::from_static(asset.body))
    } else {
        return plain(StatusCode::NOT_FOUND, "Not found. The dashboard is at /.\n");
    };
    let body = if method == Method::HEAD {
        Bytes::new()
    } else {
        body
    };
    let mut response = Response::new(Body::new(Full::new(body)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The files change only with the binary; revalidating is cheap.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    protect(&mut response);
    response
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::new(Full::new(Bytes::from_static(text.as_bytes()))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    protect(&mut response);
    response
}

/// The security headers of every response on the dashboard port.
fn protect<B>(response: &mut Response<B>) {
    let headers = response.headers_mut();
    headers.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_carry_the_policy_and_nosniff_and_never_a_cookie() {
        let response = page_response(&Method::GET, "/");
        assert_eq!(response.status(), StatusCode::OK);
        let headers = response.headers();
        assert_eq!(headers[CONTENT_SECURITY_POLICY], POLICY);
        assert_eq!(headers[X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert!(headers.get("set-cookie").is_none());
        assert!(
            headers[CONTENT_TYPE]
                .to_str()
                .expect("ascii")
                .starts_with("text/html")
        );
    }

    #[test]
    fn unknown_paths_and_methods_are_refused() {
        assert_eq!(
            page_response(&Method::GET, "/etc/passwd").status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            page_response(&Method::DELETE, "/").status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            page_response(&Method::GET, "/schema.json").status(),
            StatusCode::OK
        );
    }
}
