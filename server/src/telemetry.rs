//! Traces: a span per RPC (named after the method, as OpenTelemetry's gRPC
//! conventions do: `reconciled.v1.Reconciler/SubmitIntent`), and, when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set, export of every span over OTLP/gRPC
//! to a collector.
//!
//! The exporter is configured by the standard `OTEL_*` variables
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`,
//! `OTEL_BSP_SCHEDULE_DELAY`, ...); reconciled adds no setting of its own.

use std::task::{Context, Poll};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tonic::codegen::http::Request;
use tower::{Layer, Service};
use tracing::Instrument as _;
use tracing::instrument::Instrumented;
use tracing_subscriber::registry::LookupSpan;

/// The variable that turns the OTLP export on.
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// The running exporter; [`Exporter::shutdown`] flushes what is buffered.
#[derive(Debug)]
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// Starts the OTLP/gRPC span exporter if `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// is set, and returns it with the tracing layer that feeds it. Must be
    /// called within a tokio runtime (the gRPC channel is created on it).
    pub fn from_env<S>() -> anyhow::Result<Option<(Exporter, impl tracing_subscriber::Layer<S>)>>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        if std::env::var_os(OTLP_ENDPOINT_ENV).is_none_or(|value| value.is_empty()) {
            return Ok(None);
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .map_err(|error| {
                anyhow::anyhow!(
                    "cannot start the OTLP span exporter ({OTLP_ENDPOINT_ENV}): {error}"
                )
            })?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name("reconciled")
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("reconciled"));
        Ok(Some((Exporter { provider }, layer)))
    }

    /// Exports the spans still buffered and stops the exporter.
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown() {
            eprintln!("reconciled: warning: flushing traces at exit failed: {error}");
        }
    }
}

/// Wraps every call in a span named after its gRPC method (`otel.name`),
/// with `rpc.service` and `rpc.method`; the handlers' own spans (carrying
/// the tenant) are its children.
#[derive(Clone, Copy, Debug, Default)]
pub struct RpcSpanLayer;

impl<S> Layer<S> for RpcSpanLayer {
    type Service = RpcSpan<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcSpan { inner }
    }
}

/// The service made by [`RpcSpanLayer`].
#[derive(Clone, Debug)]
pub struct RpcSpan<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for RpcSpan<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Instrumented<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let path = request.uri().path();
        let name = path.trim_start_matches('/');
        let (service, method) = name.split_once('/').unwrap_or((name, ""));
        let span = tracing::info_span!(
            "rpc",
            otel.name = %name,
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = %service,
            rpc.method = %method,
        );
        let future = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        future.instrument(span)
    }
}
