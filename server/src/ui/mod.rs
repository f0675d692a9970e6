//! The web dashboard: static pages embedded in the binary, served on
//! `--ui-listen` together with the gRPC-Web endpoint of the same services
//! (one origin, so the browser needs no CORS and the page no second API).
//!
//! - [`assets`]: the embedded files and the headers they are served with.
//! - [`schema`]: the message schema the page's protobuf codec reads,
//!   derived from the compiled descriptor set, so it cannot drift from the
//!   `.proto` files.
//! - [`layer`]: the tower layer that answers page requests and passes gRPC
//!   and gRPC-Web calls on to the services.
//!
//! See docs/dashboard.md.

pub mod assets;
pub mod layer;
pub mod schema;

pub use layer::{DashboardLayer, MetricsPage};

use std::net::SocketAddr;
use std::time::Duration;

use reconciled_proto::v1::reconciler_server::ReconcilerServer;
use reconciled_proto::v1::tenants_server::TenantsServer;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;
use tonic::transport::ServerTlsConfig;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::HealthService;
use tracing::{error, info};

use crate::api::{ReconcilerService, TenantsService};
use crate::auth::AuthLayer;
use crate::bootstrap::{incoming, serve_until, server_builder};
use crate::limits::{ConnectionSlots, DecodeLimitLayer, LimitsLayer};
use crate::telemetry::RpcSpanLayer;

/// The services the dashboard calls. `Configurators.Connect` is left out:
/// a bidirectional stream cannot run over gRPC-Web, and agents dial the
/// gRPC port.
pub struct DashboardServices {
    /// `reconciled.v1.Reconciler` (Watch, GetGraph, GetStatus, ...).
    pub reconciler: ReconcilerServer<ReconcilerService>,
    /// `reconciled.v1.Tenants` (ListTenants, WatchFleet, ...).
    pub tenants: TenantsServer<TenantsService>,
    /// `grpc.health.v1.Health`, so a probe can check this port too.
    pub health: HealthServer<HealthService>,
}

/// How the dashboard port is served: shared with the gRPC port except for
/// its address.
pub struct DashboardSettings {
    /// Where to listen (`--ui-listen`).
    pub listen: SocketAddr,
    /// The gRPC port's TLS settings: the dashboard speaks TLS when it does.
    pub tls: Option<ServerTlsConfig>,
    /// The gRPC port's token check.
    pub authentication: AuthLayer,
    /// The gRPC port's decoding limits for non-admin callers.
    pub decode_limits: DecodeLimitLayer,
    /// The gRPC port's limits (one rate limiter and unary budget for both).
    pub limits: LimitsLayer,
    /// The gRPC port's connection slots (`--max-connections` counts both).
    pub slots: ConnectionSlots,
    /// How long open calls may drain after `shutdown`.
    pub grace: Duration,
    /// Served on `GET /metrics` too, when `--metrics-listen` is this port.
    pub metrics: Option<MetricsPage>,
    /// With replicas on etcd, the gRPC port's forwarding of tenant calls
    /// to the replica that serves the tenant (a pass-through otherwise).
    pub forward: crate::cluster::ForwardLayer,
}

/// The dashboard being served.
pub struct Dashboard {
    /// Its URL, e.g. `http://127.0.0.1:8080/`.
    pub url: String,
    /// The serving task: ends once the port has drained after `shutdown`.
    pub task: JoinHandle<()>,
}

/// Binds the dashboard port (failing the start when it cannot, like
/// `--listen`) and serves it until `shutdown` is cancelled.
pub async fn spawn(
    services: DashboardServices,
    settings: DashboardSettings,
    shutdown: CancellationToken,
) -> Result<Dashboard, DashboardError> {
    let bound = match tokio::net::TcpListener::bind(settings.listen).await {
        Ok(listener) => listener.local_addr().map(|addr| (listener, addr)),
        Err(source) => Err(source),
    };
    let (listener, addr) = bound.map_err(|source| DashboardError::Bind {
        addr: settings.listen,
        source,
    })?;
    let scheme = if settings.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let mut builder = server_builder().accept_http1(true);
    if let Some(tls) = settings.tls {
        builder = builder.tls_config(tls).map_err(DashboardError::Tls)?;
    }
    let router = builder
        .layer(RpcSpanLayer)
        .layer(DashboardLayer::new(addr, settings.metrics))
        .layer(tonic_web::GrpcWebLayer::new())
        .layer(settings.authentication)
        .layer(settings.decode_limits)
        .layer(settings.limits)
        .layer(settings.forward)
        .add_service(services.health)
        .add_service(services.reconciler)
        .add_service(services.tenants);
    let slots = settings.slots;
    let connections = incoming(listener).map(move |accepted| accepted.map(|io| slots.wrap(io)));
    info!(%addr, "Dashboard listening.");
    let grace = settings.grace;
    let task = tokio::spawn(async move {
        if let Err(failure) =
            serve_until(router, connections, shutdown.cancelled_owned(), grace).await
        {
            error!(error = %failure, %addr, "The dashboard stopped; check --ui-listen.");
        }
    });
    Ok(Dashboard {
        url: format!("{scheme}://{addr}/"),
        task,
    })
}

/// Why the dashboard port could not start.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// The address could not be bound.
    #[error(
        "cannot serve the dashboard on {addr}: {source}; choose another address with --ui-listen \
         or RECONCILED_UI_LISTEN, or turn it off with --ui-listen off"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error (often "address in use"; also in the message,
        /// which the printer of fatal errors does not repeat).
        source: std::io::Error,
    },
    /// The TLS settings were refused.
    #[error("cannot serve the dashboard with TLS: {0}")]
    Tls(tonic::transport::Error),
}
