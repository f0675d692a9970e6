//! Process plumbing around the gRPC services: health and reflection, the
//! transport settings every service shares, binding, signal handling and a
//! shutdown whose drain is bounded.
//!
//! A server is assembled as
//!
//! ```text
//! let (reporter, health, reflection_v1, reflection_v1alpha) = bootstrap::health_and_reflection()?;
//! let listener = bootstrap::bind(config.listen).await?;
//! let router = bootstrap::server_builder()
//!     .add_service(health)
//!     .add_service(reflection_v1)
//!     .add_service(reflection_v1alpha)
//!     .add_service(my_service);
//! bootstrap::serve_until(router, bootstrap::incoming(listener), bootstrap::shutdown_signal(), config.shutdown_grace).await?;
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_stream::Stream;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::{Body as HttpBody, Bytes, Service, StdError};
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::transport::server::{Connected, Router, TcpIncoming};
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};
use tonic_reflection::server::{v1, v1alpha};
use tower::Layer;

/// Interval of HTTP/2 keepalive pings on every connection: long-lived agent
/// and watch streams must notice a dead peer even when idle.
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// How long a keepalive ping may go unanswered before the connection is
/// closed.
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Idle time before TCP keepalive probes start on accepted connections.
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The reflection service rejected a descriptor set (a build defect:
    /// the sets are compiled in).
    #[error("cannot build the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The listen address could not be bound.
    #[error(
        "cannot listen on {addr}: {source}; choose another address with --listen or RECONCILED_LISTEN"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error (often "address in use"; also in the message,
        /// which the printer of fatal errors does not repeat).
        source: std::io::Error,
    },
    /// The transport failed while serving.
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// The standard services every reconciled server carries: the health
/// reporter (overall status `""` starts as `SERVING`), the
/// `grpc.health.v1.Health` service, and server reflection in both `v1` and
/// `v1alpha` (grpcurl 1.8 speaks only `v1alpha`).
///
/// Reflection knows `reconciled.v1` (with `google.rpc` error details and the
/// well-known types) and `grpc.health.v1`, so grpcurl can list, describe and
/// call everything, Health/Check included.
#[allow(clippy::type_complexity)]
pub fn health_and_reflection() -> Result<
    (
        HealthReporter,
        HealthServer<HealthService>,
        v1::ServerReflectionServer<impl v1::ServerReflection>,
        v1alpha::ServerReflectionServer<impl v1alpha::ServerReflection>,
    ),
    BootstrapError,
> {
    let reporter = HealthReporter::new();
    let health = HealthServer::new(HealthService::from_health_reporter(reporter.clone()));
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(reconciled_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    Ok((reporter, health, reflection_v1, reflection_v1alpha))
}

/// A server builder with the transport settings shared by all services:
/// HTTP/2 keepalive ([`HTTP2_KEEPALIVE_INTERVAL`], [`HTTP2_KEEPALIVE_TIMEOUT`]).
/// Message size limits are per service (`max_decoding_message_size` on each
/// generated server), not set here.
pub fn server_builder() -> Server {
    Server::builder()
        .http2_keepalive_interval(Some(HTTP2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE_TIMEOUT))
}

/// Binds the gRPC listener, with an error naming the address and the
/// setting to change.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, BootstrapError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BootstrapError::Bind { addr, source })
}

/// Installs the SIGTERM and SIGINT (Ctrl-C) handlers now, and returns a
/// future that completes on the first of them, logging which.
///
/// Call it before announcing that the server listens: a signal that arrives
/// between the announcement and the first poll of a lazily installed
/// handler would otherwise end the process uncleanly (the default action),
/// without the drain and the store flush. If a handler cannot be installed,
/// that signal is ignored (with a warning) rather than treated as a
/// shutdown request. Must be called within a tokio runtime.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::SignalKind;

    let terminate = installed(SignalKind::terminate(), "SIGTERM");
    let interrupt = installed(SignalKind::interrupt(), "SIGINT");
    async move {
        tokio::select! {
            () = received(terminate) => tracing::info!(signal = "SIGTERM", "Shutting down."),
            () = received(interrupt) => tracing::info!(signal = "SIGINT", "Shutting down."),
        }
    }
}

/// The handler of `kind`, installed now; `None` (with a warning naming
/// `name`) when it cannot be.
fn installed(
    kind: tokio::signal::unix::SignalKind,
    name: &'static str,
) -> Option<tokio::signal::unix::Signal> {
    match tokio::signal::unix::signal(kind) {
        Ok(handler) => Some(handler),
        Err(error) => {
            tracing::warn!(%error, signal = name, "Cannot install the signal handler; this signal will not shut down gracefully.");
            None
        }
    }
}

/// Completes when `handler` receives its signal; never without a handler.
async fn received(handler: Option<tokio::signal::unix::Signal>) {
    match handler {
        Some(mut handler) => {
            handler.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

/// The accepted connections of `listener`, with `TCP_NODELAY` and TCP
/// keepalive ([`TCP_KEEPALIVE`]).
pub fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(TCP_KEEPALIVE))
}

/// Serves `router` on the connections of `incoming` (see [`incoming`])
/// until `shutdown` completes, then stops accepting, lets open requests and
/// streams finish for at most `grace`, and returns.
///
/// Connections still open when `grace` runs out are abandoned, not awaited:
/// they end when the tokio runtime is dropped (at process exit), so the
/// caller should cancel its own stream tasks when `shutdown` fires and
/// return promptly after this does.
pub async fn serve_until<L, ResBody, I, IO, IE>(
    router: Router<L>,
    incoming: I,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) -> Result<(), BootstrapError>
where
    L: Layer<Routes>,
    L::Service:
        Service<Request<tonic::body::Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    <L::Service as Service<Request<tonic::body::Body>>>::Future: Send,
    <L::Service as Service<Request<tonic::body::Body>>>::Error: Into<StdError> + Send,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<StdError>,
    I: Stream<Item = Result<IO, IE>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IE: Into<StdError>,
{
    let (stop_accepting, stop_requested) = tokio::sync::oneshot::channel::<()>();
    let serving = router.serve_with_incoming_shutdown(incoming, async {
        // A dropped sender also means stop.
        let _ = stop_requested.await;
    });
    tokio::pin!(serving);

    tokio::select! {
        result = &mut serving => return result.map_err(BootstrapError::from),
        () = shutdown => {}
    }
    let _ = stop_accepting.send(());
    match tokio::time::timeout(grace, serving).await {
        Ok(result) => {
            tracing::info!("All connections drained.");
            result.map_err(BootstrapError::from)
        }
        Err(_) => {
            tracing::warn!(
                grace_secs = grace.as_secs_f64(),
                "Connections still open after the shutdown grace period; closing them."
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

    #[tokio::test]
    async fn health_is_served_and_shutdown_drains_within_grace() {
        let (_reporter, health, reflection_v1, reflection_v1alpha) =
            health_and_reflection().expect("descriptor sets are valid");
        let listener = bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let router = server_builder()
            .add_service(health)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_until(
            router,
            incoming(listener),
            async {
                let _ = stopped.await;
            },
            Duration::from_secs(2),
        ));

        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("valid uri")
            .connect()
            .await
            .expect("connect");
        let mut client = HealthClient::new(channel);
        let reply = client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health check");
        assert_eq!(reply.into_inner().status(), ServingStatus::Serving);

        // An open Watch stream never ends by itself; the drain must still
        // finish within the grace period.
        let _watch = client
            .watch(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("watch");
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("serve_until returns within grace")
            .expect("task not panicked")
            .expect("serve_until succeeded");
    }

    #[tokio::test]
    async fn binding_a_busy_address_names_it_and_the_setting() {
        let taken = bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let addr = taken.local_addr().expect("addr");
        let message = bind(addr).await.expect_err("address in use").to_string();
        assert!(
            message.contains(&addr.to_string()) && message.contains("--listen"),
            "{message}"
        );
    }
}
