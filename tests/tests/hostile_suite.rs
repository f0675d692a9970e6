//! The hostile-tenant suite (issue 12): property-based generation of
//! adversarial input for every entry point a tenant or an agent controls,
//! against the real binary.
//!
//! Entry points: SubmitIntent (structured, and raw bytes with invalid UTF-8),
//! ReportExternal, Connect (register, results, progress, external updates,
//! cancel acks, a second Register, and an abrupt disconnect at any step),
//! Watch (any start revision, filters, reading a few messages then going
//! away) and GetGraph paging (any page size, malformed page tokens).
//! Inputs: sizes at and over every limit (items per request, item size,
//! names of 253 and 254 bytes), deep and wide properties, NaN and
//! infinities, dependency cycles, expensive and malformed predicates,
//! control characters and NUL, huge counts and numbers.
//!
//! After every case:
//! - the hostile call ended within its deadline with success or a client
//!   error (`INVALID_ARGUMENT`, `RESOURCE_EXHAUSTED`, `FAILED_PRECONDITION`,
//!   `NOT_FOUND`, `OUT_OF_RANGE`, `ABORTED`, `UNAUTHENTICATED`,
//!   `CANCELLED`), never
//!   `INTERNAL`, `UNKNOWN` or `UNAVAILABLE`;
//! - a bystander tenant's GetStatus and SubmitIntent succeed within
//!   [`BYSTANDER_DEADLINE`];
//! - the health check answers SERVING.
//!
//! At the end the server restarts and every acknowledged write of both
//! tenants is there.
//!
//! `cargo test -p reconciled-tests --test integration hostile_suite::` runs
//! [`DEFAULT_CASES`] cases (about a minute on 2 cores, debug build);
//! `HOSTILE_CASES=500` runs more. A failure prints the shrunk case.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use prost::Message as _;
use reconciled_tests::api::{self, Bearer};
use reconciled_tests::proto::v1;
use reconciled_tests::proto::v1::configurators_client::ConfiguratorsClient;
use reconciled_tests::raw;
use reconciled_tests::{ServerOptions, ServerProcess};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Cases run by `cargo test`.
const DEFAULT_CASES: u32 = 40;

/// How long the bystander's calls may take after a hostile case.
const BYSTANDER_DEADLINE: Duration = Duration::from_secs(5);

/// How long one hostile call may take (a large intent in a debug build).
const HOSTILE_DEADLINE: Duration = Duration::from_secs(60);

/// Item types the hostile tenant uses; its agent registers `mal`.
const TYPES: [&str; 3] = ["mal", "ext", "other"];

// ---- generated input ----

/// A string from the edges of what names and texts may be.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z]{1,8}",
        1 => Just(String::new()),
        1 => Just("n".repeat(253)),
        1 => Just("n".repeat(254)),
        1 => Just("a\0b".to_owned()),
        1 => Just("bell\u{7}\nnew\tline".to_owned()),
        1 => Just("\u{202e}rtl \u{1f600} \u{fffd}".to_owned()),
        1 => Just("x".repeat(5_000)),
        1 => "\\PC{0,24}",
        1 => Just("/".to_owned()),
        1 => Just("a//b/../c".to_owned()),
    ]
}

/// A protobuf `Value` of bounded depth, with the awkward cases.
fn value(depth: u32) -> BoxedStrategy<prost_types::Value> {
    use prost_types::value::Kind;
    let leaf = prop_oneof![
        Just(Kind::NullValue(0)),
        any::<bool>().prop_map(Kind::BoolValue),
        prop_oneof![
            any::<f64>(),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(9_007_199_254_740_993.0),
            Just(-0.0),
        ]
        .prop_map(Kind::NumberValue),
        text().prop_map(Kind::StringValue),
    ]
    .prop_map(|kind| prost_types::Value { kind: Some(kind) });
    if depth == 0 {
        return leaf.boxed();
    }
    prop_oneof![
        4 => leaf,
        1 => prop::collection::vec(value(depth - 1), 0..6).prop_map(|values| prost_types::Value {
            kind: Some(prost_types::value::Kind::ListValue(prost_types::ListValue { values })),
        }),
        1 => prop::collection::btree_map(text(), value(depth - 1), 0..6).prop_map(|fields| {
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StructValue(prost_types::Struct { fields })),
            }
        }),
    ]
    .boxed()
}

/// A list nested `levels` deep.
fn nested_list(levels: usize) -> prost_types::Value {
    let mut value = prost_types::Value { kind: None };
    for _ in 0..levels {
        value = prost_types::Value {
            kind: Some(prost_types::value::Kind::ListValue(
                prost_types::ListValue {
                    values: vec![value],
                },
            )),
        };
    }
    value
}

fn list_of(count: usize) -> prost_types::Value {
    prost_types::Value {
        kind: Some(prost_types::value::Kind::ListValue(
            prost_types::ListValue {
                values: (0..count)
                    .map(|index| prost_types::Value {
                        kind: Some(prost_types::value::Kind::NumberValue(index as f64)),
                    })
                    .collect(),
            },
        )),
    }
}

/// Properties: ordinary, deep, wide, or at and over the item size limit.
fn properties() -> impl Strategy<Value = Option<prost_types::Struct>> {
    let fields = |pairs: Vec<(String, prost_types::Value)>| {
        Some(prost_types::Struct {
            fields: pairs.into_iter().collect(),
        })
    };
    prop_oneof![
        4 => prop::collection::vec((text(), value(2)), 0..5).prop_map(fields),
        1 => Just(None),
        1 => prop_oneof![Just(10_usize), Just(64), Just(300)]
            .prop_map(move |levels| fields(vec![("deep".into(), nested_list(levels))])),
        1 => prop_oneof![Just(1_000_usize), Just(5_000)].prop_map(move |count| fields(
            (0..count)
                .map(|index| (format!("k{index}"), prost_types::Value::default()))
                .collect()
        )),
        1 => prop_oneof![Just(65_400_usize), Just(65_536), Just(70_000)].prop_map(move |size| {
            fields(vec![(
                "blob".into(),
                prost_types::Value {
                    kind: Some(prost_types::value::Kind::StringValue("x".repeat(size))),
                },
            )])
        }),
        1 => Just(fields(vec![("l".into(), list_of(1_000))])),
    ]
}

/// A predicate: valid, expensive, malformed or over the source limit.
fn predicate() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just(String::new()),
        1 => Just("self.l.all(x, self.l.all(y, self.l.all(z, x + y + z >= 0)))".to_owned()),
        1 => Just("self.l.map(x, self.l.map(y, x * y)).size() > 0".to_owned()),
        1 => Just("[1,2,3].all(x, x > 0) && self.mtu >= 1500".to_owned()),
        1 => Just("((((((((((((((((((((((((((1))))))))))))))))))))))))))".to_owned()),
        1 => Just("self.".to_owned()),
        1 => Just("1 +".repeat(2_000)),
        1 => text(),
    ]
}

#[derive(Clone, Debug)]
struct ItemShape {
    item_type: String,
    name: String,
    properties: Option<prost_types::Struct>,
    /// Indexes (into the request's items) of dependencies, with predicates.
    dependencies: Vec<(usize, String, bool)>,
    external: bool,
    subgraph: String,
}

fn item_shape() -> impl Strategy<Value = ItemShape> {
    (
        prop_oneof![4 => prop::sample::select(&TYPES[..]).prop_map(str::to_owned), 1 => text()],
        prop_oneof![4 => "[a-z]{1,6}", 1 => text()],
        properties(),
        prop::collection::vec((0usize..8, predicate(), any::<bool>()), 0..3),
        prop::bool::weighted(0.2),
        prop_oneof![4 => Just(String::new()), 1 => text()],
    )
        .prop_map(
            |(item_type, name, properties, dependencies, external, subgraph)| ItemShape {
                item_type,
                name,
                properties,
                dependencies,
                external,
                subgraph,
            },
        )
}

fn items_from(shapes: &[ItemShape]) -> Vec<v1::Item> {
    shapes
        .iter()
        .map(|shape| v1::Item {
            r#type: shape.item_type.clone(),
            name: shape.name.clone(),
            properties: shape.properties.clone(),
            dependencies: shape
                .dependencies
                .iter()
                .filter_map(|(index, must_satisfy, recreate)| {
                    let target = shapes.get(index % shapes.len().max(1))?;
                    Some(v1::Dependency {
                        requires: Some(v1::ItemRef {
                            r#type: target.item_type.clone(),
                            name: target.name.clone(),
                        }),
                        must_satisfy: must_satisfy.clone(),
                        recreate_when_modified: *recreate,
                        ..Default::default()
                    })
                })
                .collect(),
            external: shape.external,
            subgraph: shape.subgraph.clone(),
            ..Default::default()
        })
        .collect()
}

/// Many tiny items: at and over `max_request_items` (10,000).
fn tiny_items(count: usize) -> Vec<v1::Item> {
    (0..count)
        .map(|index| v1::Item {
            r#type: "other".into(),
            name: format!("t{index:05}"),
            ..Default::default()
        })
        .collect()
}

#[derive(Clone, Debug)]
enum AgentStep {
    Heartbeat,
    /// A result for the `n`th operation received (or an unknown op id).
    Result {
        operation: usize,
        outcome: i32,
        code: i32,
        message_bytes: usize,
        observed: Option<prost_types::Struct>,
    },
    Progress {
        operation: usize,
        message_bytes: usize,
    },
    External(Vec<ReportShape>),
    CancelAck(String),
    RegisterAgain,
    /// Read what the server sent for a moment.
    Read,
}

fn agent_step() -> impl Strategy<Value = AgentStep> {
    prop_oneof![
        Just(AgentStep::Heartbeat),
        Just(AgentStep::Read),
        (
            0usize..4,
            -1i32..6,
            0i32..18,
            prop_oneof![Just(0_usize), Just(100), Just(5_000), Just(70_000)],
            properties()
        )
            .prop_map(|(operation, outcome, code, message_bytes, observed)| {
                AgentStep::Result {
                    operation,
                    outcome,
                    code,
                    message_bytes,
                    observed,
                }
            }),
        (
            0usize..4,
            prop_oneof![Just(10_usize), Just(2_000), Just(100_000)]
        )
            .prop_map(|(operation, message_bytes)| AgentStep::Progress {
                operation,
                message_bytes
            }),
        prop::collection::vec(report_shape(), 0..4).prop_map(AgentStep::External),
        text().prop_map(AgentStep::CancelAck),
        Just(AgentStep::RegisterAgain),
    ]
}

#[derive(Clone, Debug)]
enum ReportShape {
    Put(ItemShape, bool),
    Delete(String, String),
    Empty,
}

fn report_shape() -> impl Strategy<Value = ReportShape> {
    prop_oneof![
        4 => (item_shape(), any::<bool>()).prop_map(|(mut item, modified)| {
            item.external = true;
            ReportShape::Put(item, modified)
        }),
        1 => (text(), text()).prop_map(|(t, n)| ReportShape::Delete(t, n)),
        1 => Just(ReportShape::Empty),
    ]
}

fn reports_from(shapes: &[ReportShape]) -> Vec<v1::ExternalReport> {
    shapes
        .iter()
        .map(|shape| match shape {
            ReportShape::Put(item, modified) => v1::ExternalReport {
                change: Some(v1::external_report::Change::Put(
                    items_from(std::slice::from_ref(item)).remove(0),
                )),
                modified: *modified,
            },
            ReportShape::Delete(item_type, name) => v1::ExternalReport {
                change: Some(v1::external_report::Change::Delete(v1::ItemRef {
                    r#type: item_type.clone(),
                    name: name.clone(),
                })),
                modified: false,
            },
            ReportShape::Empty => v1::ExternalReport::default(),
        })
        .collect()
}

#[derive(Clone, Debug)]
enum Case {
    Submit {
        items: Vec<ItemShape>,
        subgraph: String,
        expected_generation: Option<u64>,
        dry_run: bool,
    },
    /// 10,000 or 10,001 tiny items.
    ManyItems(usize),
    /// A SubmitIntent whose item name is not UTF-8.
    InvalidUtf8(Vec<u8>),
    Report(Vec<ReportShape>),
    Connect {
        item_types: Vec<String>,
        protocol_version: u32,
        steps: Vec<AgentStep>,
        /// Go away after this many steps (before Register when 0).
        disconnect_after: usize,
    },
    Watch {
        start_revision: u64,
        item_types: Vec<String>,
        kinds: Vec<i32>,
        read: usize,
    },
    GetGraph {
        view: i32,
        subgraph: String,
        page_size: u32,
        page_token: String,
    },
}

fn case() -> impl Strategy<Value = Case> {
    prop_oneof![
        6 => (
            prop::collection::vec(item_shape(), 0..8),
            prop_oneof![4 => Just(String::new()), 1 => text()],
            prop_oneof![3 => Just(None), 1 => any::<u64>().prop_map(Some)],
            prop::bool::weighted(0.2),
        )
            .prop_map(|(items, subgraph, expected_generation, dry_run)| Case::Submit {
                items,
                subgraph,
                expected_generation,
                dry_run,
            }),
        1 => prop_oneof![Just(10_000_usize), Just(10_001)].prop_map(Case::ManyItems),
        1 => prop::collection::vec(prop_oneof![Just(0xff_u8), Just(0xc0), Just(0x80), any::<u8>()], 1..12)
            .prop_map(Case::InvalidUtf8),
        3 => prop::collection::vec(report_shape(), 0..6).prop_map(Case::Report),
        4 => (
            prop_oneof![
                4 => Just(vec!["mal".to_owned()]),
                1 => prop::collection::vec(text(), 0..4),
            ],
            prop_oneof![4 => Just(reconciled_tests::proto::PROTOCOL_VERSION), 1 => any::<u32>()],
            prop::collection::vec(agent_step(), 0..8),
            0usize..10,
        )
            .prop_map(|(item_types, protocol_version, steps, disconnect_after)| Case::Connect {
                item_types,
                protocol_version,
                steps,
                disconnect_after,
            }),
        2 => (
            prop_oneof![Just(0_u64), Just(1), any::<u64>()],
            prop::collection::vec(text(), 0..3),
            prop::collection::vec(-2i32..12, 0..3),
            0usize..4,
        )
            .prop_map(|(start_revision, item_types, kinds, read)| Case::Watch {
                start_revision,
                item_types,
                kinds,
                read,
            }),
        2 => (
            -1i32..5,
            prop_oneof![3 => Just(String::new()), 1 => text()],
            prop_oneof![Just(0_u32), Just(1), Just(5_000), Just(5_001), any::<u32>()],
            prop_oneof![
                2 => Just(String::new()),
                1 => text(),
                1 => "[A-Za-z0-9_-]{1,80}",
                1 => Just("eyJyZXZpc2lvbiI6OTk5OTk5OTk5OX0".to_owned()),
            ],
        )
            .prop_map(|(view, subgraph, page_size, page_token)| Case::GetGraph {
                view,
                subgraph,
                page_size,
                page_token,
            }),
    ]
}

// ---- running a case ----

/// What the run has seen acknowledged, to check after the restart.
#[derive(Debug, Default)]
struct Acknowledged {
    hostile_generation: u64,
    bystander_generation: u64,
    bystander_tick: u64,
}

struct Suite {
    server: ServerProcess,
    channel: Channel,
    hostile: String,
    bystander: String,
    acknowledged: Arc<Mutex<Acknowledged>>,
}

/// Whether `status` is an answer a hostile client may get: its own error,
/// never the server's.
fn client_error(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::InvalidArgument
            | Code::ResourceExhausted
            | Code::FailedPrecondition
            | Code::NotFound
            | Code::OutOfRange
            | Code::Aborted
            | Code::Unauthenticated
            | Code::Cancelled
    )
}

fn check(status: &Status, what: &str) -> Result<(), TestCaseError> {
    if client_error(status) {
        Ok(())
    } else {
        Err(TestCaseError::fail(format!(
            "{what}: the server answered {:?}: {}",
            status.code(),
            status.message()
        )))
    }
}

impl Suite {
    async fn run(&self, case: &Case) -> Result<(), TestCaseError> {
        let reconciler = api::reconciler(&self.channel, &self.hostile);
        let tenant = "mallory".to_owned();
        match case {
            Case::Submit {
                items,
                subgraph,
                expected_generation,
                dry_run,
            } => {
                let request = v1::SubmitIntentRequest {
                    tenant,
                    subgraph: subgraph.clone(),
                    items: items_from(items),
                    expected_generation: *expected_generation,
                    dry_run: *dry_run,
                };
                self.submit(request).await
            }
            Case::ManyItems(count) => {
                let request = api::submit(&tenant, tiny_items(*count));
                self.submit(request).await
            }
            Case::InvalidUtf8(name) => {
                // SubmitIntentRequest{tenant, items: [Item{type: "mal", name}]}
                let mut item = vec![0x0a, 0x03];
                item.extend_from_slice(b"mal");
                item.push(0x12);
                item.push(u8::try_from(name.len()).unwrap_or(0));
                item.extend_from_slice(name);
                let mut message = v1::SubmitIntentRequest {
                    tenant,
                    ..Default::default()
                }
                .encode_to_vec();
                message.push(0x1a);
                message.push(u8::try_from(item.len()).unwrap_or(0));
                message.extend_from_slice(&item);
                // Random bytes are sometimes valid UTF-8 and a valid name:
                // then the submit is accepted and its generation counts.
                match raw::raw_unary(&self.channel, raw::SUBMIT_INTENT, &self.hostile, message)
                    .await
                {
                    Ok(reply) => {
                        let reply = v1::SubmitIntentResponse::decode(reply.as_slice())
                            .map_err(|error| TestCaseError::fail(error.to_string()))?;
                        self.acknowledge(reply.generation);
                        Ok(())
                    }
                    Err(status) => check(&status, "SubmitIntent with invalid UTF-8"),
                }
            }
            Case::Report(reports) => {
                let answer = reconciler
                    .clone()
                    .report_external(v1::ReportExternalRequest {
                        tenant,
                        reports: reports_from(reports),
                    })
                    .await;
                match answer {
                    Ok(_) => Ok(()),
                    Err(status) => check(&status, "ReportExternal"),
                }
            }
            Case::Connect {
                item_types,
                protocol_version,
                steps,
                disconnect_after,
            } => {
                self.connect(item_types, *protocol_version, steps, *disconnect_after)
                    .await
            }
            Case::Watch {
                start_revision,
                item_types,
                kinds,
                read,
            } => {
                let opened = reconciler
                    .clone()
                    .watch(v1::WatchRequest {
                        tenant,
                        start_revision: *start_revision,
                        item_types: item_types.clone(),
                        kinds: kinds.clone(),
                    })
                    .await;
                let mut stream = match opened {
                    Ok(stream) => stream.into_inner(),
                    Err(status) => return check(&status, "Watch"),
                };
                for _ in 0..*read {
                    match tokio::time::timeout(Duration::from_millis(300), stream.message()).await {
                        Err(_) | Ok(Ok(None)) => break,
                        Ok(Ok(Some(_))) => {}
                        Ok(Err(status)) => return check(&status, "Watch stream"),
                    }
                }
                // Gone without a word.
                Ok(())
            }
            Case::GetGraph {
                view,
                subgraph,
                page_size,
                page_token,
            } => {
                let answer = reconciler
                    .clone()
                    .get_graph(v1::GetGraphRequest {
                        tenant,
                        view: *view,
                        subgraph: subgraph.clone(),
                        page_size: *page_size,
                        page_token: page_token.clone(),
                    })
                    .await;
                match answer {
                    Ok(_) => Ok(()),
                    Err(status) => check(&status, "GetGraph"),
                }
            }
        }
    }

    /// Records `generation` as the hostile tenant's last acknowledged one.
    fn acknowledge(&self, generation: u64) {
        self.acknowledged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .hostile_generation = generation;
    }

    async fn submit(&self, request: v1::SubmitIntentRequest) -> Result<(), TestCaseError> {
        let dry_run = request.dry_run;
        let answer = api::reconciler(&self.channel, &self.hostile)
            .submit_intent(request)
            .await;
        match answer {
            Ok(reply) => {
                if !dry_run {
                    self.acknowledge(reply.into_inner().generation);
                }
                Ok(())
            }
            Err(status) => check(&status, "SubmitIntent"),
        }
    }

    async fn connect(
        &self,
        item_types: &[String],
        protocol_version: u32,
        steps: &[AgentStep],
        disconnect_after: usize,
    ) -> Result<(), TestCaseError> {
        let (outgoing, receiver) = mpsc::channel(64);
        let register = v1::AgentMessage {
            message: Some(v1::agent_message::Message::Register(v1::Register {
                tenant: "mallory".into(),
                agent_id: "mallory-agent".into(),
                protocol_version,
                item_types: item_types
                    .iter()
                    .map(|item_type| v1::ItemTypeSpec {
                        item_type: item_type.clone(),
                        supports_read: true,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })),
        };
        let mut client =
            ConfiguratorsClient::with_interceptor(self.channel.clone(), Bearer::new(&self.hostile));
        if disconnect_after == 0 {
            // Opens the stream and goes away before registering (the server
            // answers only once Register arrives, within 10 s).
            let opening = tokio::spawn(async move {
                let _ = client.connect(ReceiverStream::new(receiver)).await;
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
            opening.abort();
            let _ = opening.await;
            drop(outgoing);
            return Ok(());
        }
        let _ = outgoing.send(register.clone()).await;
        let opened = client.connect(ReceiverStream::new(receiver)).await;
        let mut incoming = match opened {
            Ok(stream) => stream.into_inner(),
            Err(status) => return check(&status, "Connect"),
        };
        let mut operations: Vec<(String, u32)> = Vec::new();
        for step in steps.iter().take(disconnect_after - 1) {
            let message = match step {
                AgentStep::Read => {
                    match read_for(&mut incoming, Duration::from_millis(200), &mut operations).await
                    {
                        Some(status) => return check(&status, "Connect stream"),
                        None => continue,
                    }
                }
                AgentStep::Heartbeat => v1::agent_message::Message::Heartbeat(v1::Heartbeat {}),
                AgentStep::Result {
                    operation,
                    outcome,
                    code,
                    message_bytes,
                    observed,
                } => {
                    let (op_id, attempt) = operations
                        .get(*operation)
                        .cloned()
                        .unwrap_or_else(|| (format!("unknown-{operation}"), 1));
                    v1::agent_message::Message::Result(v1::OperationResult {
                        op_id,
                        attempt,
                        outcome: *outcome,
                        status: Some(reconciled_tests::proto::google::rpc::Status {
                            code: *code,
                            message: "e".repeat(*message_bytes),
                            details: Vec::new(),
                        }),
                        observed: observed.clone(),
                        ..Default::default()
                    })
                }
                AgentStep::Progress {
                    operation,
                    message_bytes,
                } => {
                    let (op_id, attempt) = operations
                        .get(*operation)
                        .cloned()
                        .unwrap_or_else(|| (format!("unknown-{operation}"), 1));
                    v1::agent_message::Message::Progress(v1::OperationProgress {
                        op_id,
                        attempt,
                        message: "p".repeat(*message_bytes),
                    })
                }
                AgentStep::External(reports) => {
                    v1::agent_message::Message::ExternalUpdate(v1::ExternalUpdate {
                        reports: reports_from(reports),
                    })
                }
                AgentStep::CancelAck(op_id) => {
                    v1::agent_message::Message::CancelAck(v1::CancelAck {
                        op_id: op_id.clone(),
                    })
                }
                AgentStep::RegisterAgain => match register.message.clone() {
                    Some(message) => message,
                    None => continue,
                },
            };
            if outgoing
                .send(v1::AgentMessage {
                    message: Some(message),
                })
                .await
                .is_err()
            {
                break;
            }
            if let Some(status) =
                read_for(&mut incoming, Duration::from_millis(20), &mut operations).await
            {
                return check(&status, "Connect stream");
            }
        }
        // Abrupt disconnect: both directions dropped here.
        Ok(())
    }
}

/// Reads the agent stream for `window`, noting operation requests; the
/// status if the server ended the stream.
async fn read_for(
    incoming: &mut tonic::Streaming<v1::ServerMessage>,
    window: Duration,
    operations: &mut Vec<(String, u32)>,
) -> Option<Status> {
    let until = tokio::time::Instant::now() + window;
    loop {
        match tokio::time::timeout_at(until, incoming.message()).await {
            Err(_) | Ok(Ok(None)) => return None,
            Ok(Err(status)) => return Some(status),
            Ok(Ok(Some(message))) => {
                if let Some(v1::server_message::Message::Operation(operation)) = message.message {
                    operations.push((operation.op_id, operation.attempt));
                }
            }
        }
    }
}

// ---- the bystander ----

impl Suite {
    /// The bystander's GetStatus and a SubmitIntent succeed within the
    /// deadline, and health is SERVING.
    async fn bystander_is_served(&self) -> Result<(), TestCaseError> {
        let reconciler = api::reconciler(&self.channel, &self.bystander);
        let status = tokio::time::timeout(
            BYSTANDER_DEADLINE,
            reconciler.clone().get_status(v1::GetStatusRequest {
                tenant: "alice".into(),
            }),
        )
        .await;
        match status {
            Ok(Ok(_)) => {}
            Ok(Err(status)) => {
                return Err(TestCaseError::fail(format!(
                    "bystander GetStatus: {status:?}"
                )));
            }
            Err(_) => {
                return Err(TestCaseError::fail(format!(
                    "bystander GetStatus took over {BYSTANDER_DEADLINE:?}"
                )));
            }
        }
        let tick = {
            let acknowledged = self
                .acknowledged
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            acknowledged.bystander_tick + 1
        };
        let submitted = tokio::time::timeout(
            BYSTANDER_DEADLINE,
            reconciler
                .clone()
                .submit_intent(api::submit("alice", bystander_intent(tick))),
        )
        .await;
        let generation = match submitted {
            Ok(Ok(reply)) => reply.into_inner().generation,
            Ok(Err(status)) => {
                return Err(TestCaseError::fail(format!(
                    "bystander SubmitIntent: {status:?}"
                )));
            }
            Err(_) => {
                return Err(TestCaseError::fail(format!(
                    "bystander SubmitIntent took over {BYSTANDER_DEADLINE:?}"
                )));
            }
        };
        {
            let mut acknowledged = self
                .acknowledged
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            acknowledged.bystander_tick = tick;
            acknowledged.bystander_generation = generation;
        }
        let health = tokio::time::timeout(
            BYSTANDER_DEADLINE,
            HealthClient::new(self.channel.clone()).check(HealthCheckRequest {
                service: String::new(),
            }),
        )
        .await;
        match health {
            Ok(Ok(reply)) if reply.get_ref().status == ServingStatus::Serving as i32 => Ok(()),
            other => Err(TestCaseError::fail(format!("health check: {other:?}"))),
        }
    }
}

fn bystander_intent(tick: u64) -> Vec<v1::Item> {
    vec![
        api::item("svc", "steady", serde_json::json!({"role": "bystander"})),
        api::item("svc", "tick", serde_json::json!({ "tick": tick })),
    ]
}

fn cases() -> u32 {
    std::env::var("HOSTILE_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

#[test]
fn no_hostile_input_hurts_a_bystander_the_health_check_or_acknowledged_writes() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let mut suite = runtime.block_on(async {
        let server = ServerProcess::start(ServerOptions::default())
            .await
            .expect("the server starts");
        let channel = server.channel().await.expect("connects");
        let admin = server.admin_token();
        let hostile = api::create_tenant(&channel, &admin, "mallory").await;
        let bystander = api::create_tenant(&channel, &admin, "alice").await;
        Suite {
            server,
            channel,
            hostile,
            bystander,
            acknowledged: Arc::new(Mutex::new(Acknowledged::default())),
        }
    });
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 64,
        ..Config::default()
    });
    let result = runner.run(&case(), |case| {
        runtime.block_on(async {
            match tokio::time::timeout(HOSTILE_DEADLINE, suite.run(&case)).await {
                Ok(outcome) => outcome?,
                Err(_) => {
                    return Err(TestCaseError::fail(format!(
                        "the hostile call took over {HOSTILE_DEADLINE:?}"
                    )));
                }
            }
            suite.bystander_is_served().await
        })
    });
    if let Err(failure) = result {
        panic!("{failure}\nserver log:\n{}", suite.server.log_tail());
    }

    // Every acknowledged write survives a restart.
    runtime.block_on(async {
        suite
            .server
            .restart()
            .await
            .expect("the server restarts cleanly");
        let channel = suite.server.channel().await.expect("connects");
        let acknowledged = suite
            .acknowledged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .hostile_generation;
        let (bystander_generation, tick) = {
            let acknowledged = suite
                .acknowledged
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            (
                acknowledged.bystander_generation,
                acknowledged.bystander_tick,
            )
        };
        let hostile = api::reconciler(&channel, &suite.hostile)
            .get_status(v1::GetStatusRequest {
                tenant: "mallory".into(),
            })
            .await
            .expect("the hostile tenant is served after the restart")
            .into_inner();
        assert_eq!(
            hostile.status.map(|status| status.generation),
            Some(acknowledged),
            "the hostile tenant's acknowledged intent"
        );
        let graph = api::reconciler(&channel, &suite.bystander)
            .get_graph(v1::GetGraphRequest {
                tenant: "alice".into(),
                view: v1::GraphView::Intended.into(),
                ..Default::default()
            })
            .await
            .expect("the bystander is served after the restart")
            .into_inner();
        assert_eq!(graph.generation, bystander_generation);
        let ticked = graph
            .intended
            .iter()
            .filter_map(|intended| intended.item.as_ref())
            .find(|item| item.name == "tick")
            .and_then(|item| item.properties.as_ref())
            .and_then(|properties| properties.fields.get("tick"))
            .and_then(|value| match value.kind {
                Some(prost_types::value::Kind::NumberValue(number)) => Some(number),
                _ => None,
            });
        assert_eq!(ticked, Some(tick as f64), "the bystander's last intent");
    });
}
