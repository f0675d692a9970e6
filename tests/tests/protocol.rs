//! The configurator protocol at the wire level: a raw gRPC stream plays the
//! agent, so every message the server sends and expects is checked.

use std::time::Duration;

use reconciled_tests::api::{
    Bearer, create_tenant, dependency, error_reason, item, reconciler, submit, violated_fields,
};
use reconciled_tests::proto::v1;
use reconciled_tests::proto::v1::configurators_client::ConfiguratorsClient;
use reconciled_tests::{ServerOptions, ServerProcess};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic_types::StatusExt as _;

/// A raw agent: the outgoing queue and the incoming stream.
struct RawAgent {
    outgoing: mpsc::Sender<v1::AgentMessage>,
    incoming: tonic::Streaming<v1::ServerMessage>,
    /// Operations that arrived while waiting for something else.
    queued: std::collections::VecDeque<v1::OperationRequest>,
    /// The heartbeat task.
    heartbeats: tokio::task::JoinHandle<()>,
}

fn register(tenant: &str, agent_id: &str, types: &[&str], version: u32) -> v1::AgentMessage {
    v1::AgentMessage {
        message: Some(v1::agent_message::Message::Register(v1::Register {
            tenant: tenant.into(),
            agent_id: agent_id.into(),
            protocol_version: version,
            item_types: types
                .iter()
                .map(|t| v1::ItemTypeSpec {
                    item_type: (*t).into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })),
    }
}

async fn connect(
    channel: &tonic::transport::Channel,
    token: &str,
    first: v1::AgentMessage,
) -> Result<RawAgent, tonic::Status> {
    let (outgoing, receiver) = mpsc::channel(64);
    outgoing.send(first).await.expect("queue open");
    let beats = outgoing.clone();
    let heartbeats = tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(2));
        loop {
            every.tick().await;
            let beat = v1::AgentMessage {
                message: Some(v1::agent_message::Message::Heartbeat(v1::Heartbeat {})),
            };
            if beats.send(beat).await.is_err() {
                return;
            }
        }
    });
    let mut client = ConfiguratorsClient::with_interceptor(channel.clone(), Bearer::new(token));
    let incoming = client
        .connect(ReceiverStream::new(receiver))
        .await?
        .into_inner();
    Ok(RawAgent {
        outgoing,
        incoming,
        queued: Default::default(),
        heartbeats,
    })
}

impl RawAgent {
    /// Ends the session from the agent's side: its stream closes.
    fn hang_up(self) {
        self.heartbeats.abort();
    }

    /// The next message that is not a heartbeat.
    async fn next(&mut self) -> v1::server_message::Message {
        loop {
            let message = tokio::time::timeout(Duration::from_secs(10), self.incoming.message())
                .await
                .expect("a message within 10 s")
                .expect("stream healthy")
                .expect("stream open");
            match message.message {
                Some(v1::server_message::Message::Heartbeat(_)) | None => continue,
                Some(other) => return other,
            }
        }
    }

    async fn next_operation(&mut self) -> v1::OperationRequest {
        if let Some(queued) = self.queued.pop_front() {
            return queued;
        }
        match self.next().await {
            v1::server_message::Message::Operation(request) => request,
            other => panic!("expected an operation, got {other:?}"),
        }
    }

    async fn answer(&mut self, request: &v1::OperationRequest, outcome: v1::Outcome) {
        self.answer_with(request, outcome, false).await;
    }

    async fn answer_with(
        &mut self,
        request: &v1::OperationRequest,
        outcome: v1::Outcome,
        needs_recreate: bool,
    ) {
        let result = v1::OperationResult {
            op_id: request.op_id.clone(),
            attempt: request.attempt,
            outcome: outcome.into(),
            needs_recreate,
            ..Default::default()
        };
        self.outgoing
            .send(v1::AgentMessage {
                message: Some(v1::agent_message::Message::Result(result)),
            })
            .await
            .expect("queue open");
        loop {
            match self.next().await {
                v1::server_message::Message::ResultAck(ack) => {
                    assert_eq!(
                        (ack.op_id.as_str(), ack.attempt),
                        (request.op_id.as_str(), request.attempt)
                    );
                    return;
                }
                v1::server_message::Message::Operation(operation) => {
                    self.queued.push_back(operation)
                }
                other => panic!("expected a ResultAck, got {other:?}"),
            }
        }
    }
}

/// A fresh server with tenant `acme`: the server (kept alive by the caller),
/// a channel, and the tenant's token.
async fn acme() -> (ServerProcess, tonic::transport::Channel, String) {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("starts");
    let channel = server.channel().await.expect("connects");
    let token = create_tenant(&channel, &server.admin_token(), "acme").await;
    (server, channel, token)
}

fn label(request: &v1::OperationRequest) -> String {
    let kind = v1::OperationKind::try_from(request.operation)
        .map(|k| k.as_str_name().to_string())
        .unwrap_or_default();
    let item = request
        .item
        .as_ref()
        .map(|i| format!("{}/{}", i.r#type, i.name))
        .unwrap_or_default();
    format!(
        "{} {item}",
        kind.trim_start_matches("OPERATION_KIND_").to_lowercase()
    )
}

#[tokio::test]
async fn an_agent_registers_receives_operations_in_dependency_order_and_gets_acks() {
    let (_server, channel, token) = acme().await;
    let mut agent = connect(
        &channel,
        &token,
        register("acme", "agent-1", &["dir", "file"], 1),
    )
    .await
    .expect("registers");
    match agent.next().await {
        v1::server_message::Message::Registered(registered) => {
            let mut granted: Vec<(String, u64)> = registered
                .granted
                .iter()
                .map(|g| (g.item_type.clone(), g.epoch))
                .collect();
            granted.sort();
            assert_eq!(granted, [("dir".to_string(), 1), ("file".to_string(), 1)]);
        }
        other => panic!("expected Registered, got {other:?}"),
    }

    let mut file = item("file", "conf", json!({"content": "x"}));
    file.dependencies.push(dependency("dir", "etc"));
    reconciler(&channel, &token)
        .submit_intent(submit("acme", vec![file, item("dir", "etc", json!({}))]))
        .await
        .expect("accepted");

    let first = agent.next_operation().await;
    assert_eq!(label(&first), "create dir/etc");
    assert_eq!((first.attempt, first.epoch, first.generation), (1, 1, 1));
    agent.answer(&first, v1::Outcome::Done).await;
    let second = agent.next_operation().await;
    assert_eq!(label(&second), "create file/conf");
    agent.answer(&second, v1::Outcome::Done).await;

    let status = reconciler(&channel, &token)
        .get_status(v1::GetStatusRequest {
            tenant: "acme".into(),
        })
        .await
        .expect("status")
        .into_inner()
        .status
        .expect("status");
    assert_eq!(status.items_by_state.get("CREATED"), Some(&2), "{status:?}");
    let ready = status
        .conditions
        .iter()
        .find(|c| c.r#type == "Ready")
        .expect("Ready");
    assert_eq!(ready.status, v1::ConditionStatus::True as i32, "{status:?}");

    reconciler(&channel, &token)
        .submit_intent(submit("acme", vec![]))
        .await
        .expect("accepted");
    let delete_file = agent.next_operation().await;
    assert_eq!(label(&delete_file), "delete file/conf");
    agent.answer(&delete_file, v1::Outcome::Done).await;
    let delete_dir = agent.next_operation().await;
    assert_eq!(label(&delete_dir), "delete dir/etc");
    agent.answer(&delete_dir, v1::Outcome::Done).await;
}

#[tokio::test]
async fn an_unknown_protocol_version_and_a_held_type_are_refused() {
    let (_server, channel, token) = acme().await;

    let refused = match connect(&channel, &token, register("acme", "a", &["dir"], 99)).await {
        Err(status) => status,
        Ok(mut agent) => agent.incoming.message().await.expect_err("refused"),
    };
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(
        error_reason(&refused).as_deref(),
        Some("UNSUPPORTED_PROTOCOL")
    );

    let mut holder = connect(&channel, &token, register("acme", "first", &["dir"], 1))
        .await
        .expect("registers");
    assert!(matches!(
        holder.next().await,
        v1::server_message::Message::Registered(_)
    ));
    let held = match connect(&channel, &token, register("acme", "second", &["dir"], 1)).await {
        Err(status) => status,
        Ok(mut agent) => agent.incoming.message().await.expect_err("refused"),
    };
    assert_eq!(held.code(), Code::FailedPrecondition);
    assert_eq!(error_reason(&held).as_deref(), Some("TYPE_HELD"));

    // The same agent id reconnecting takes over at once, with a new epoch.
    let mut again = connect(&channel, &token, register("acme", "first", &["dir"], 1))
        .await
        .expect("reconnects");
    match again.next().await {
        v1::server_message::Message::Registered(registered) => {
            assert_eq!(registered.granted[0].epoch, 2)
        }
        other => panic!("expected Registered, got {other:?}"),
    }
}

/// A recreate path without its leading `/` would match no property, and a
/// later change of that property would be planned as an in-place Modify:
/// the server refuses the registration with a field violation naming it.
#[tokio::test]
async fn a_recreate_path_that_is_not_a_json_pointer_is_refused_at_register() {
    let (_server, channel, token) = acme().await;
    let mut message = register("acme", "kv-1", &["kv", "other"], 1);
    if let Some(v1::agent_message::Message::Register(register)) = &mut message.message {
        register.item_types[0].recreate_on_change = vec!["/ok".into(), "key".into()];
        register.item_types[1].recreate_on_change = vec!["/a~2".into()];
    }
    let refused = match connect(&channel, &token, message).await {
        Err(status) => status,
        Ok(mut agent) => agent.incoming.message().await.expect_err("refused"),
    };
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    let violations = refused
        .get_error_details()
        .bad_request()
        .map(|bad| bad.field_violations.clone())
        .unwrap_or_default();
    let fields: Vec<&str> = violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "register.item_types[0].recreate_on_change[1]",
            "register.item_types[1].recreate_on_change[0]"
        ],
        "{refused:?}"
    );
    assert!(
        violations[0].description.contains("\"key\"")
            && violations[0].description.contains("\"/key\""),
        "the description names the path and the fix: {:?}",
        violations[0].description
    );

    // The same registration with JSON Pointers is accepted.
    let mut message = register("acme", "kv-1", &["kv"], 1);
    if let Some(v1::agent_message::Message::Register(register)) = &mut message.message {
        register.item_types[0].recreate_on_change = vec!["/key".into(), "/a~1b".into()];
    }
    let mut agent = connect(&channel, &token, message).await.expect("registers");
    assert!(matches!(
        agent.next().await,
        v1::server_message::Message::Registered(_)
    ));
}

#[tokio::test]
async fn a_type_that_asks_gets_a_needs_recreate_question_and_a_yes_recreates_the_item() {
    let (_server, channel, token) = acme().await;
    let mut first = register("acme", "agent-1", &["disk"], 1);
    if let Some(v1::agent_message::Message::Register(register)) = first.message.as_mut() {
        register.item_types[0].ask_needs_recreate = true;
    }
    let mut agent = connect(&channel, &token, first).await.expect("registers");
    assert!(matches!(
        agent.next().await,
        v1::server_message::Message::Registered(_)
    ));
    let mut client = reconciler(&channel, &token);
    client
        .submit_intent(submit("acme", vec![item("disk", "d", json!({"size": 1}))]))
        .await
        .expect("ok");
    let create = agent.next_operation().await;
    agent.answer(&create, v1::Outcome::Done).await;

    client
        .submit_intent(submit("acme", vec![item("disk", "d", json!({"size": 2}))]))
        .await
        .expect("ok");
    let question = agent.next_operation().await;
    assert_eq!(
        question.operation,
        v1::OperationKind::NeedsRecreate as i32,
        "{question:?}"
    );
    assert_eq!(
        question.previous.as_ref().map(|p| p.name.as_str()),
        Some("d")
    );
    agent.answer_with(&question, v1::Outcome::Done, true).await;
    let delete = agent.next_operation().await;
    assert_eq!(label(&delete), "delete disk/d");
    agent.answer(&delete, v1::Outcome::Done).await;
    let recreate = agent.next_operation().await;
    assert_eq!(label(&recreate), "create disk/d");
    agent.answer(&recreate, v1::Outcome::Done).await;

    client
        .submit_intent(submit("acme", vec![item("disk", "d", json!({"size": 3}))]))
        .await
        .expect("ok");
    let question = agent.next_operation().await;
    assert_eq!(question.operation, v1::OperationKind::NeedsRecreate as i32);
    agent.answer_with(&question, v1::Outcome::Done, false).await;
    let modify = agent.next_operation().await;
    assert_eq!(
        label(&modify),
        "modify disk/d",
        "a no answers with a Modify"
    );
    agent.answer(&modify, v1::Outcome::Done).await;
}

#[tokio::test]
async fn a_late_result_from_an_older_epoch_changes_nothing_and_the_operation_is_redelivered() {
    let (_server, channel, token) = acme().await;
    // The old session keeps "file", so it stays open after losing "dir".
    let mut old = connect(
        &channel,
        &token,
        register("acme", "agent-1", &["dir", "file"], 1),
    )
    .await
    .expect("registers");
    assert!(matches!(
        old.next().await,
        v1::server_message::Message::Registered(_)
    ));
    let mut client = reconciler(&channel, &token);
    client
        .submit_intent(submit("acme", vec![item("dir", "etc", json!({}))]))
        .await
        .expect("ok");
    let operation = old.next_operation().await;
    assert_eq!(operation.epoch, 1);

    // The same agent registers "dir" on a new session: it holds the type now (epoch 2).
    let mut new = connect(&channel, &token, register("acme", "agent-1", &["dir"], 1))
        .await
        .expect("reconnects");
    assert!(matches!(
        new.next().await,
        v1::server_message::Message::Registered(_)
    ));
    old.answer(&operation, v1::Outcome::Done).await;
    let graph = client
        .get_graph(v1::GetGraphRequest {
            tenant: "acme".into(),
            ..Default::default()
        })
        .await
        .expect("graph")
        .into_inner();
    assert_eq!(
        graph.current[0].state,
        v1::ItemState::Creating as i32,
        "the old epoch's result changed nothing"
    );

    let redelivered = new.next_operation().await;
    assert_eq!(
        (redelivered.op_id.as_str(), redelivered.attempt),
        (operation.op_id.as_str(), operation.attempt)
    );
    assert_eq!(redelivered.epoch, 2);
    new.answer(&redelivered, v1::Outcome::Done).await;
    let graph = client
        .get_graph(v1::GetGraphRequest {
            tenant: "acme".into(),
            ..Default::default()
        })
        .await
        .expect("graph")
        .into_inner();
    assert_eq!(graph.current[0].state, v1::ItemState::Created as i32);
}

#[tokio::test]
async fn a_wait_answer_asks_again_later_without_counting_an_attempt() {
    let (_server, channel, token) = acme().await;
    let mut agent = connect(&channel, &token, register("acme", "agent-1", &["dir"], 1))
        .await
        .expect("registers");
    assert!(matches!(
        agent.next().await,
        v1::server_message::Message::Registered(_)
    ));
    let mut client = reconciler(&channel, &token);
    client
        .submit_intent(submit("acme", vec![item("dir", "etc", json!({}))]))
        .await
        .expect("ok");

    let first = agent.next_operation().await;
    // WAIT with no retry_after: the server asks again after 1 s.
    agent.answer(&first, v1::Outcome::Wait).await;
    let again = agent.next_operation().await;
    assert_eq!(label(&again), "create dir/etc");
    assert_eq!(again.attempt, 1, "WAIT does not count an attempt");
    // DESIGN section 4: a re-ask after WAIT keeps the op id and attempt.
    assert_eq!(again.op_id, first.op_id, "the re-ask is the same operation");
    agent.answer(&again, v1::Outcome::Done).await;
    let graph = client
        .get_graph(v1::GetGraphRequest {
            tenant: "acme".into(),
            ..Default::default()
        })
        .await
        .expect("graph")
        .into_inner();
    assert_eq!(graph.current[0].state, v1::ItemState::Created as i32);
    assert_eq!(graph.current[0].attempts, 0);
}

/// The state of `tenant`'s item `app/a`.
async fn state_of_a(client: &mut reconciled_tests::api::Reconciler, tenant: &str) -> i32 {
    let graph = client
        .get_graph(v1::GetGraphRequest {
            tenant: tenant.into(),
            ..Default::default()
        })
        .await
        .expect("graph")
        .into_inner();
    graph
        .current
        .iter()
        .find(|current| {
            current
                .r#ref
                .as_ref()
                .is_some_and(|item| item.r#type == "app" && item.name == "a")
        })
        .map(|current| current.state)
        .unwrap_or_default()
}

/// In `tenant`: app/a, which depends on the external item ext/x, is being
/// created when its agent's session ends without an answer; then ext/x
/// vanishes. Returns the lost Create and the client.
async fn lose_a_create_whose_dependency_then_vanishes(
    channel: &tonic::transport::Channel,
    token: &str,
    tenant: &str,
) -> (v1::OperationRequest, reconciled_tests::api::Reconciler) {
    let mut agent = connect(channel, token, register(tenant, "agent-1", &["app"], 1))
        .await
        .expect("registers");
    assert!(matches!(
        agent.next().await,
        v1::server_message::Message::Registered(_)
    ));
    let mut client = reconciler(channel, token);
    let external = v1::Item {
        external: true,
        ..item("ext", "x", json!({}))
    };
    client
        .report_external(v1::ReportExternalRequest {
            tenant: tenant.into(),
            reports: vec![v1::ExternalReport {
                change: Some(v1::external_report::Change::Put(external.clone())),
                modified: false,
            }],
        })
        .await
        .expect("reported");
    let mut a = item("app", "a", json!({}));
    a.dependencies = vec![dependency("ext", "x")];
    client
        .submit_intent(submit(tenant, vec![external, a]))
        .await
        .expect("submitted");
    let create = agent.next_operation().await;
    assert_eq!(label(&create), "create app/a");

    // The session ends with the Create unanswered: its outcome is lost.
    agent.hang_up();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while state_of_a(&mut client, tenant).await != v1::ItemState::Unknown as i32 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "app/a never became UNKNOWN"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    client
        .report_external(v1::ReportExternalRequest {
            tenant: tenant.into(),
            reports: vec![v1::ExternalReport {
                change: Some(v1::external_report::Change::Delete(v1::ItemRef {
                    r#type: "ext".into(),
                    name: "x".into(),
                })),
                modified: false,
            }],
        })
        .await
        .expect("reported");
    (create, client)
}

/// DESIGN 4 (lost operations): an operation whose outcome the server lost
/// may still run at its agent, which lists it when it registers again. The
/// server then waits for it (the same op id and attempt, which the agent
/// de-duplicates) although its dependency vanished meanwhile, instead of
/// acting as if it never ran. An agent that lists everything it runs,
/// without it, gets what the intent needs now: the item may exist on a
/// dependency that is gone, so it is deleted.
#[tokio::test]
async fn a_lost_operation_the_agent_lists_as_running_is_waited_for() {
    let (server, channel, token) = acme().await;
    let bravo = create_tenant(&channel, &server.admin_token(), "bravo").await;

    let (lost, mut client) =
        lose_a_create_whose_dependency_then_vanishes(&channel, &token, "acme").await;
    let mut listing = register("acme", "agent-1", &["app"], 1);
    if let Some(v1::agent_message::Message::Register(register)) = &mut listing.message {
        register.outstanding_op_ids = vec![lost.op_id.clone()];
        register.lists_outstanding = true;
    }
    let mut agent = connect(&channel, &token, listing).await.expect("registers");
    assert!(matches!(
        agent.next().await,
        v1::server_message::Message::Registered(_)
    ));
    let again = agent.next_operation().await;
    assert_eq!(
        (label(&again).as_str(), again.op_id.as_str(), again.attempt),
        ("create app/a", lost.op_id.as_str(), lost.attempt),
        "the operation that still runs is waited for"
    );
    agent.answer(&again, v1::Outcome::Done).await;
    // It ran: app/a exists on a dependency that is gone, so it goes.
    let delete = agent.next_operation().await;
    assert_eq!(label(&delete), "delete app/a");
    assert_ne!(delete.op_id, lost.op_id);
    assert_eq!(
        state_of_a(&mut client, "acme").await,
        v1::ItemState::Deleting as i32
    );

    let (lost, _client) =
        lose_a_create_whose_dependency_then_vanishes(&channel, &bravo, "bravo").await;
    let mut listing = register("bravo", "agent-1", &["app"], 1);
    if let Some(v1::agent_message::Message::Register(register)) = &mut listing.message {
        register.lists_outstanding = true;
    }
    let mut agent = connect(&channel, &bravo, listing).await.expect("registers");
    assert!(matches!(
        agent.next().await,
        v1::server_message::Message::Registered(_)
    ));
    let next = agent.next_operation().await;
    assert_eq!(
        label(&next),
        "delete app/a",
        "not sent again: it runs nowhere, and may have run"
    );
    assert_ne!(next.op_id, lost.op_id);
}

/// Bad lists of outstanding operations are refused with a field path.
#[tokio::test]
async fn a_registration_with_a_bad_outstanding_list_is_refused() {
    let (_server, channel, token) = acme().await;
    let cases: [(Vec<String>, bool, &str); 3] = [
        (vec!["op-1".into()], false, "register.lists_outstanding"),
        (vec![String::new()], true, "register.outstanding_op_ids[0]"),
        (
            vec!["x".into(); 65_537],
            true,
            "register.outstanding_op_ids",
        ),
    ];
    for (op_ids, lists, field) in cases {
        let mut message = register("acme", "agent-1", &["app"], 1);
        if let Some(v1::agent_message::Message::Register(register)) = &mut message.message {
            register.outstanding_op_ids = op_ids;
            register.lists_outstanding = lists;
        }
        let refused = match connect(&channel, &token, message).await {
            Err(status) => status,
            Ok(mut agent) => agent.incoming.message().await.expect_err("refused"),
        };
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert_eq!(violated_fields(&refused), [field], "{refused:?}");
    }
}
