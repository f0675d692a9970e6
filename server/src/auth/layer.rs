//! Authentication before decoding: a tower layer in front of every service
//! that checks the bearer token from the request headers before the body is
//! read. An unauthenticated call is answered `UNAUTHENTICATED` without
//! decoding a byte of its message, so a 16 MB anonymous request costs the
//! server nothing beyond the transport's flow-control window.
//!
//! The handlers still authorise (which tenant a token may see) as before;
//! this layer only refuses what no handler would accept. Health checks
//! never need a token; reflection needs one unless `--reflection=public`.

use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::BoxFuture;
use tonic::codegen::http::{Request, Response};
use tonic::metadata::MetadataMap;
use tower::{Layer, Service, ServiceExt as _};

use super::{AdminToken, Caller, TokenDirectory, authenticate};
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

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        match self.shared.check(&request) {
            Ok(caller) => {
                if let Some(caller) = caller {
                    request.extensions_mut().insert(caller);
                }
                Box::pin(inner.oneshot(request))
            }
            Err(refused) => {
                // The body is dropped unread: the transport resets the stream.
                Box::pin(async move { Ok(*refused) })
            }
        }
    }
}

impl Shared {
    /// The caller of an authenticated request (`None`: no token needed), or
    /// the response refusing it.
    fn check(&self, request: &Request<Body>) -> Result<Option<Caller>, Box<Response<Body>>> {
        let path = request.uri().path();
        let public = path.starts_with(HEALTH_PREFIX)
            || (path.starts_with(REFLECTION_PREFIX) && self.reflection == Reflection::Public);
        if public {
            return Ok(None);
        }
        let metadata = MetadataMap::from_headers(request.headers().clone());
        authenticate(&metadata, &self.admin, &*self.directory)
            .map(Some)
            .map_err(|error| Box::new(tonic::Status::from(error).into_http()))
    }
}
