//! Authentication before decoding: a tower layer in front of every service
//! that checks the bearer token from the request headers before the body is
//! read. An unauthenticated call is answered `UNAUTHENTICATED` without
//! decoding a byte of its message, so a 16 MB anonymous request costs the
//! server nothing beyond the transport's flow-control window.
//!
//! The handlers still authorise (which tenant a token may see) as before;
//! this layer only refuses what no handler would accept. Health checks
//! never need a token; reflection needs one unless `--reflection=public`.
//!
//! With replicas, a token this replica does not know may belong to a
//! tenant created (or a token rotated) through another replica a moment
//! ago: before refusing it, the layer waits until the replica's directory
//! has caught up with etcd ([`TokenDirectory::catch_up`]), so a client
//! behind a load balancer can use a new token at once.

use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::BoxFuture;
use tonic::codegen::http::{Request, Response};
use tonic::metadata::MetadataMap;
use tower::{Layer, Service, ServiceExt as _};

use super::{AdminToken, Caller, TokenDirectory, authenticate, bearer_token};
use crate::config::Reflection;

/// Paths served without a token.
const HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";

/// Paths of server reflection (v1 and v1alpha).
const REFLECTION_PREFIX: &str = "/grpc.reflection.";

/// Refuses calls without a valid admin or tenant token before their body is
/// decoded. Built once per server; cheap to clone.
#[derive(Clone)]
pub struct AuthLayer {
    shared: Arc<Shared>,
}

struct Shared {
    admin: Arc<AdminToken>,
    directory: Arc<dyn TokenDirectory + Send + Sync>,
    reflection: Reflection,
}

impl AuthLayer {
    /// A layer accepting the admin token and the tokens `directory` knows;
    /// `reflection` says whether reflection needs a token.
    pub fn new(
        admin: Arc<AdminToken>,
        directory: Arc<dyn TokenDirectory + Send + Sync>,
        reflection: Reflection,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                admin,
                directory,
                reflection,
            }),
        }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of [`AuthLayer`].
#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Service<Request<Body>> for AuthService<S>
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
        match self.shared.check(&request) {
            Ok(caller) => Box::pin(inner.oneshot(with_caller(request, caller))),
            Err(refused) if refused.known_later => {
                let shared = self.shared.clone();
                Box::pin(async move {
                    shared.directory.catch_up().await;
                    match shared.check(&request) {
                        Ok(caller) => inner.oneshot(with_caller(request, caller)).await,
                        Err(_) => Ok(*refused.response),
                    }
                })
            }
            Err(refused) => {
                // The body is dropped unread: the transport resets the stream.
                Box::pin(async move { Ok(*refused.response) })
            }
        }
    }
}

/// `request` with its authenticated caller, if it needed one, for the
/// handlers.
fn with_caller(mut request: Request<Body>, caller: Option<Caller>) -> Request<Body> {
    if let Some(caller) = caller {
        request.extensions_mut().insert(caller);
    }
    request
}

/// Why [`Shared::check`] refused a request.
struct Refusal {
    /// The answer refusing it.
    response: Box<Response<Body>>,
    /// It carries a well-formed bearer token that the directory, which
    /// may lag, could know after catching up.
    known_later: bool,
}

impl Shared {
    /// The caller of an authenticated request (`None`: no token needed), or
    /// why it is refused.
    fn check(&self, request: &Request<Body>) -> Result<Option<Caller>, Refusal> {
        let path = request.uri().path();
        let public = path.starts_with(HEALTH_PREFIX)
            || (path.starts_with(REFLECTION_PREFIX) && self.reflection == Reflection::Public);
        if public {
            return Ok(None);
        }
        let metadata = MetadataMap::from_headers(request.headers().clone());
        authenticate(&metadata, &self.admin, &*self.directory)
            .map(Some)
            .map_err(|error| Refusal {
                response: Box::new(tonic::Status::from(error).into_http()),
                known_later: self.directory.may_lag() && bearer_token(&metadata).is_ok(),
            })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tonic::codegen::http::StatusCode;

    use super::*;
    use crate::auth::{AdminTokenSource, TokenHash};

    /// A directory that learns `later` only when it catches up, as a
    /// replica learns a token created through another one.
    struct Lagging {
        known: Mutex<HashMap<[u8; 32], u64>>,
        later: ([u8; 32], u64),
        lags: bool,
        catch_ups: AtomicUsize,
    }

    impl TokenDirectory for Lagging {
        fn tenant_by_token_hash(&self, hash: &[u8; 32]) -> Option<u64> {
            self.known.lock().expect("not poisoned").get(hash).copied()
        }

        fn may_lag(&self) -> bool {
            self.lags
        }

        fn catch_up(&self) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>> {
            self.catch_ups.fetch_add(1, Ordering::SeqCst);
            let (hash, id) = self.later;
            self.known.lock().expect("not poisoned").insert(hash, id);
            Box::pin(std::future::ready(()))
        }
    }

    fn directory(lags: bool) -> Arc<Lagging> {
        Arc::new(Lagging {
            known: Mutex::new(HashMap::new()),
            later: (*TokenHash::of("new-token").as_bytes(), 7),
            lags,
            catch_ups: AtomicUsize::new(0),
        })
    }

    /// Calls `/reconciled.v1.Reconciler/GetStatus` through the layer with
    /// `authorization`; the caller the inner service saw, and the gRPC
    /// status of the answer (`None`: the inner service answered).
    async fn call(
        directory: Arc<Lagging>,
        authorization: Option<&str>,
    ) -> (Option<Caller>, Option<String>) {
        let admin = Arc::new(AdminToken::from_secret("admin", AdminTokenSource::Config));
        let seen = Arc::new(Mutex::new(None));
        let inner = {
            let seen = seen.clone();
            tower::service_fn(move |request: Request<Body>| {
                *seen.lock().expect("not poisoned") = request.extensions().get::<Caller>().copied();
                async move { Ok::<_, std::convert::Infallible>(Response::new(Body::empty())) }
            })
        };
        let mut service = AuthLayer::new(admin, directory, Reflection::Authenticated).layer(inner);
        let mut request = Request::builder().uri("/reconciled.v1.Reconciler/GetStatus");
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        let request = request.body(Body::empty()).expect("a request");
        let response = service.call(request).await.expect("infallible");
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "gRPC answers in trailers or headers"
        );
        let status = response
            .headers()
            .get("grpc-status")
            .map(|value| value.to_str().expect("ascii").to_owned());
        let caller = *seen.lock().expect("not poisoned");
        (caller, status)
    }

    /// The layer answered UNAUTHENTICATED and the inner service saw nothing.
    fn assert_unauthenticated((caller, status): (Option<Caller>, Option<String>)) {
        assert_eq!(caller, None);
        assert_eq!(status.as_deref(), Some("16"), "UNAUTHENTICATED");
    }

    #[tokio::test]
    async fn a_token_a_lagging_directory_learns_by_catching_up_is_accepted() {
        let lagging = directory(true);
        let (caller, status) = call(lagging.clone(), Some("Bearer new-token")).await;
        assert_eq!(caller, Some(Caller::Tenant { tenant_id: 7 }));
        assert_eq!(status, None);
        assert_eq!(lagging.catch_ups.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_directory_that_never_lags_refuses_at_once() {
        let current = directory(false);
        assert_unauthenticated(call(current.clone(), Some("Bearer new-token")).await);
        assert_eq!(current.catch_ups.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_call_without_a_bearer_token_is_refused_without_catching_up() {
        let lagging = directory(true);
        for authorization in [None, Some("Basic abc")] {
            assert_unauthenticated(call(lagging.clone(), authorization).await);
        }
        assert_eq!(lagging.catch_ups.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn an_unknown_token_is_refused_after_one_catch_up() {
        let lagging = directory(true);
        assert_unauthenticated(call(lagging.clone(), Some("Bearer made-up")).await);
        assert_eq!(lagging.catch_ups.load(Ordering::SeqCst), 1);
    }
}
