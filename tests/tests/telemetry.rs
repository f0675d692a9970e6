//! OpenTelemetry: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, the server exports
//! its spans over OTLP/gRPC. A tiny collector in the test (the OTLP
//! `TraceService` on a loopback port) receives a span per RPC, named after
//! the method, whose handler span carries the tenant, and the spans of the
//! pass and the operation that followed.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use reconciled_client::agent::TypeSpec;
use reconciled_tests::ServerOptions;
use reconciled_tests::agents::{DEADLINE, Recorder, RunningAgent, TestTenant};
use reconciled_tests::api::item;
use reconciled_tests::proto::v1;
use serde_json::json;
use tokio::sync::Notify;
use tonic::{Request, Response, Status};

/// Every span the collector received.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
    received: Arc<Notify>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let spans = request
            .into_inner()
            .resource_spans
            .into_iter()
            .flat_map(|resource| resource.scope_spans)
            .flat_map(|scope| scope.spans);
        self.spans
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .extend(spans);
        self.received.notify_waiters();
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    /// Serves the collector on a free loopback port; returns its endpoint.
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("collector port");
        let addr = listener.local_addr().expect("collector address");
        let service = TraceServiceServer::new(self.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        format!("http://{addr}")
    }

    /// Waits until `check` finds what it looks for in the spans received.
    async fn wait_for<T>(&self, what: &str, mut check: impl FnMut(&[Span]) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let received = self.received.notified();
            {
                let spans = self
                    .spans
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                if let Some(found) = check(&spans) {
                    return found;
                }
            }
            if tokio::time::timeout_at(deadline, received).await.is_err() {
                let spans = self
                    .spans
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                let names: Vec<&str> = spans.iter().map(|span| span.name.as_str()).collect();
                panic!(
                    "the collector did not receive {what} within {DEADLINE:?}; spans: {names:?}"
                );
            }
        }
    }
}

/// The string attribute `key` of a span.
fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    span.attributes
        .iter()
        .find(|attribute| attribute.key == key)
        .and_then(|attribute| attribute.value.as_ref())
        .and_then(|value| match &value.value {
            Some(Value::StringValue(text)) => Some(text.as_str()),
            _ => None,
        })
}

#[tokio::test]
async fn spans_of_rpcs_passes_and_operations_reach_an_otlp_collector() {
    let collector = Collector::default();
    let endpoint = collector.start().await;
    let options = ServerOptions::default()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100");
    let tenant = TestTenant::start_with(options, "acme").await;
    let recorder = Recorder::new();
    let mut agent = RunningAgent::start(
        tenant
            .agent("agent-1")
            .item_type(TypeSpec::new("t"), recorder.clone()),
    );
    agent.connected().await;
    tenant.submit(vec![item("t", "a", json!({}))]).await;
    tenant
        .wait_for_state("t", "a", v1::ItemState::Created)
        .await;
    let op_id = recorder.received()[0].op_id.clone();

    collector
        .wait_for(
            "a SubmitIntent span with a child carrying the tenant",
            |spans| {
                let rpc = spans
                    .iter()
                    .find(|span| span.name == "reconciled.v1.Reconciler/SubmitIntent")?;
                assert_eq!(attribute(rpc, "rpc.method"), Some("SubmitIntent"));
                spans
                    .iter()
                    .find(|span| {
                        span.parent_span_id == rpc.span_id
                            && attribute(span, "tenant") == Some("acme")
                    })
                    .map(|_| ())
            },
        )
        .await;
    collector
        .wait_for("a pass span of tenant acme", |spans| {
            spans
                .iter()
                .find(|span| span.name == "pass" && attribute(span, "tenant") == Some("acme"))
                .map(|_| ())
        })
        .await;
    collector
        .wait_for("the operation's spans with item and op id", |spans| {
            let of_operation = |name: &str| {
                spans.iter().any(|span| {
                    span.name == name
                        && attribute(span, "tenant") == Some("acme")
                        && attribute(span, "item") == Some("t/a")
                        && attribute(span, "op_id") == Some(op_id.as_str())
                })
            };
            (of_operation("operation") && of_operation("operation_result")).then_some(())
        })
        .await;
}
