//! A fleet controller written against the typed client
//! (`reconciled_client::Client`) only, as the README and the crate docs
//! show it: tenants created with the admin token, intents submitted with
//! `expected_generation`, paged listings, watches resumed after a
//! disconnect, and `Reconcile` with `wait`.

use std::time::Duration;

use reconciled_client::agent::TypeSpec;
use reconciled_client::{Client, convert, proto as v1};
use reconciled_tests::agents::{Recorder, RunningAgent, TestTenant};
use reconciled_tests::api::{error_metadata, error_reason, item};
use reconciled_tests::{ServerOptions, ServerProcess};
use serde_json::json;
use tonic::Code;

/// How long a step of a test may take before it counts as hung.
const STEP: Duration = Duration::from_secs(30);

async fn admin(server: &ServerProcess) -> Client {
    Client::connect(server.endpoint(), &server.admin_token())
        .await
        .expect("the admin client connects")
}

/// Creates tenant `acme` and connects a client with its token.
async fn acme_client(server: &ServerProcess) -> Client {
    let token = admin(server)
        .await
        .create_tenant(v1::CreateTenantRequest {
            name: "acme".into(),
            limits: None,
        })
        .await
        .expect("creates the tenant")
        .token;
    Client::connect(server.endpoint(), &token)
        .await
        .expect("the tenant client connects")
}

fn submit(tenant: &str, items: Vec<v1::Item>, expected: Option<u64>) -> v1::SubmitIntentRequest {
    v1::SubmitIntentRequest {
        tenant: tenant.into(),
        items,
        expected_generation: expected,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_controller_drives_tenants_through_the_client() {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("the server starts");
    let admin = admin(&server).await;

    // Tenants, created concurrently from clones of one client.
    let names: Vec<String> = (0..7).map(|n| format!("site-{n}")).collect();
    let mut tasks = Vec::new();
    for name in &names {
        let admin = admin.clone();
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            admin
                .create_tenant(v1::CreateTenantRequest {
                    name: name.clone(),
                    limits: None,
                })
                .await
                .map(|reply| (name, reply.token))
        }));
    }
    let mut tokens = Vec::new();
    for task in tasks {
        tokens.push(task.await.expect("task").expect("creates a tenant"));
    }

    // Every tenant, page by page: each once.
    let listed = admin
        .list_tenants(v1::ListTenantsRequest {
            page_size: 2,
            page_token: String::new(),
        })
        .await
        .expect("lists tenants");
    let listed: Vec<String> = listed.tenants.into_iter().map(|t| t.name).collect();
    assert_eq!(listed, names);

    let (tenant, token) = tokens[0].clone();
    let client = Client::connect(server.endpoint(), &token)
        .await
        .expect("the tenant client connects");

    // Intents with expected_generation; a stale one says the generation.
    let first = client
        .submit_intent(submit(
            &tenant,
            (0..5)
                .map(|n| item("t", &format!("i{n}"), json!({"n": n})))
                .collect(),
            Some(0),
        ))
        .await
        .expect("the first intent");
    assert_eq!(first.generation, 1);
    let stale = client
        .submit_intent(submit(&tenant, vec![], Some(0)))
        .await
        .expect_err("generation 0 is stale");
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale:?}");
    assert_eq!(error_reason(&stale).as_deref(), Some("GENERATION_MISMATCH"));
    assert_eq!(error_metadata(&stale, "actual").as_deref(), Some("1"));

    // The whole graph, page by page, from one revision.
    let graph = client
        .get_graph(v1::GetGraphRequest {
            tenant: tenant.clone(),
            view: v1::GraphView::Both as i32,
            page_size: 2,
            ..Default::default()
        })
        .await
        .expect("reads the graph");
    assert_eq!(graph.intended.len(), 5);
    assert_eq!(graph.generation, 1);
    assert!(graph.next_page_token.is_empty());
    let properties = convert::properties_from_struct(
        graph.intended[3]
            .item
            .clone()
            .and_then(|item| item.properties)
            .expect("properties"),
    );
    assert_eq!(properties.get("n"), Some(&json!(3)));

    // A watch from the graph's revision sees the next intent.
    let mut stream = client
        .watch(v1::WatchRequest {
            tenant: tenant.clone(),
            start_revision: graph.revision,
            ..Default::default()
        })
        .await
        .expect("the watch opens");
    let second = client
        .submit_intent(submit(&tenant, vec![], Some(1)))
        .await
        .expect("the second intent");
    let group = loop {
        let message = tokio::time::timeout(STEP, stream.message())
            .await
            .expect("an event in time")
            .expect("the stream stays up")
            .expect("the stream goes on");
        if let Some(v1::watch_response::Message::Events(group)) = message.message
            && group.revision == second.revision
        {
            break group;
        }
    };
    assert!(!group.events.is_empty());

    // Reconcile with wait, bounded by the request's timeout.
    let reconciled = tokio::time::timeout(
        STEP,
        client.reconcile(v1::ReconcileRequest {
            tenant: tenant.clone(),
            wait: true,
            timeout: Some(convert::duration_to_proto(Duration::from_secs(2))),
            ..Default::default()
        }),
    )
    .await
    .expect("reconcile returns in time")
    .expect("reconcile answers");
    assert!(reconciled.converged, "{reconciled:?}");
}

/// A Watch of acme read up to its `Synced`: what follows is live.
async fn synced_watch(client: &Client) -> tonic::Streaming<v1::WatchResponse> {
    let mut stream = client
        .watch(v1::WatchRequest {
            tenant: "acme".into(),
            ..Default::default()
        })
        .await
        .expect("the watch opens");
    loop {
        let message = tokio::time::timeout(STEP, stream.message())
            .await
            .expect("the snapshot in time")
            .expect("the stream stays up")
            .expect("the stream goes on");
        if let Some(v1::watch_response::Message::Synced(_)) = message.message {
            return stream;
        }
    }
}

/// Reads `stream` to its end: `Ok` if the server ended it, else the status
/// it failed with.
async fn end_of(stream: &mut tonic::Streaming<v1::WatchResponse>) -> Result<(), tonic::Status> {
    while stream.message().await?.is_some() {}
    Ok(())
}

/// A server that stops answering (a frozen process, a host gone behind a
/// partition) must not leave a controller's watch waiting forever: the
/// stream ends with an error the controller resumes from.
#[tokio::test]
async fn a_watch_ends_when_the_server_stops_answering() {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("the server starts");
    let client = acme_client(&server).await;
    let mut stream = synced_watch(&client).await;

    let frozen = Frozen::stop(&server);
    let ended = tokio::time::timeout(Duration::from_secs(60), end_of(&mut stream)).await;
    drop(frozen);
    // It ends with the code a controller resumes on (tonic's own UNKNOWN,
    // "h2 protocol error", is mapped by the client).
    let status = ended
        .expect("the watch of a frozen server ends within 60 s")
        .expect_err("the stream ends with an error");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
}

/// A controller resumes on `UNAVAILABLE` (docs/controllers.md): when the
/// client's keepalive gives up on a server that stopped answering, a Watch
/// and a call in flight on that connection both end with `UNAVAILABLE`,
/// saying the connection was lost, not with `UNKNOWN` ("h2 protocol
/// error") or `CANCELLED`, which a controller would take for final.
#[tokio::test]
async fn a_connection_lost_to_keepalive_ends_watches_and_calls_unavailable() {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("the server starts");
    let client = acme_client(&server).await;
    let mut stream = synced_watch(&client).await;

    let frozen = Frozen::stop(&server);
    let call = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .get_status(v1::GetStatusRequest {
                    tenant: "acme".into(),
                })
                .await
        }
    });
    let watch_ended = tokio::time::timeout(Duration::from_secs(60), end_of(&mut stream)).await;
    let call_ended = tokio::time::timeout(Duration::from_secs(60), call).await;
    drop(frozen);
    let watch_status = watch_ended
        .expect("the watch of a frozen server ends within 60 s")
        .expect_err("the stream ends with an error");
    let call_status = call_ended
        .expect("a call to a frozen server ends within 60 s")
        .expect("the call's task")
        .expect_err("the call fails");
    for (what, status) in [("the watch", watch_status), ("the call", call_status)] {
        println!("{what} ended with {status:?}");
        assert_eq!(status.code(), Code::Unavailable, "{what}: {status:?}");
        assert!(
            status
                .message()
                .contains("connection to the server was lost"),
            "{what}: {status:?}"
        );
    }
}

/// A server process stopped with SIGSTOP until this is dropped (SIGCONT).
struct Frozen(nix::unistd::Pid);

impl Frozen {
    fn stop(server: &ServerProcess) -> Self {
        let pid = nix::unistd::Pid::from_raw(
            i32::try_from(server.pid().expect("the server runs")).expect("a pid"),
        );
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
        // `kill` returns before every thread has stopped: a thread running
        // on another core may still answer a call sent now (seen once on
        // a loaded machine). Wait until the kernel shows them all stopped.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !all_threads_stopped(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "the server's threads did not stop within 10 s of SIGSTOP"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        Self(pid)
    }
}

/// Whether every thread of process `pid` is stopped (state `T` in
/// `/proc/<pid>/task/<tid>/stat`).
fn all_threads_stopped(pid: nix::unistd::Pid) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // The state follows the command name, which is in parentheses.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .is_some_and(|state| state == 'T')
        })
    })
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

/// `Client::get_graph` follows the pages of one revision; a tenant that
/// keeps committing while a large graph is read (200 commits over 2,000
/// pages) must not make it fail: the server keeps the listing's revision
/// while its pages are read, and a listing it let go would be started over,
/// as `ABORTED` asks.
#[tokio::test]
async fn get_graph_reads_the_whole_graph_of_a_tenant_that_keeps_committing() {
    let server = ServerProcess::start(ServerOptions::default().without_byte_budget())
        .await
        .expect("the server starts");
    let client = acme_client(&server).await;
    let listed: Vec<v1::Item> = (0..2000)
        .map(|n| item("t", &format!("i{n:04}"), json!({})))
        .collect();
    client
        .submit_intent(v1::SubmitIntentRequest {
            tenant: "acme".into(),
            subgraph: "listed".into(),
            items: listed,
            ..Default::default()
        })
        .await
        .expect("the listed items");

    // 4 x 50 commits in other subgraphs while the graph is read.
    let churn: Vec<_> = (0..4)
        .map(|writer| {
            let client = client.clone();
            tokio::spawn(async move {
                for round in 0..50 {
                    client
                        .submit_intent(v1::SubmitIntentRequest {
                            tenant: "acme".into(),
                            subgraph: format!("churn{writer}"),
                            items: vec![item(
                                "t",
                                &format!("churn{writer}"),
                                json!({"round": round}),
                            )],
                            ..Default::default()
                        })
                        .await
                        .expect("a churn commit");
                }
            })
        })
        .collect();
    let graph = tokio::time::timeout(
        Duration::from_secs(120),
        client.get_graph(v1::GetGraphRequest {
            tenant: "acme".into(),
            view: v1::GraphView::Intended as i32,
            subgraph: "listed".into(),
            page_size: 1,
            ..Default::default()
        }),
    )
    .await
    .expect("the graph is read in time")
    .expect("the whole graph, despite the churn");
    for writer in churn {
        writer.await.expect("a churn task");
    }
    assert_eq!(graph.intended.len(), 2000);
}

/// `Client::get_item_types` answers with every registered type, however
/// many pages the server needs for their schemas (like `get_graph` and
/// `list_tenants`), not the first page alone.
#[tokio::test]
async fn get_item_types_returns_every_type_not_the_first_page() {
    let options = ServerOptions::default()
        .arg("--max-message-bytes")
        .arg("262144")
        .arg("--max-tenant-message-bytes")
        .arg("262144");
    let tenant = TestTenant::start_with(options, "acme").await;
    // 12 types of ~30 KiB schemas: more than one 256 KiB reply holds.
    let schema = json!({"type": "object", "description": "x".repeat(30_000)});
    let mut agents = Vec::new();
    for (agent_id, types) in [("a1", 0..6), ("a2", 6..12)] {
        let mut builder = tenant.agent(agent_id);
        for n in types {
            builder = builder.item_type(
                TypeSpec::new(format!("t{n:02}")).schema(schema.clone()),
                Recorder::new(),
            );
        }
        let mut agent = RunningAgent::start(builder);
        agent.connected().await;
        agents.push(agent);
    }
    let client = Client::connect(tenant.server.endpoint(), &tenant.token)
        .await
        .expect("the tenant client connects");
    let first = client
        .get_item_types(v1::GetItemTypesRequest {
            tenant: "acme".into(),
            ..Default::default()
        })
        .await
        .expect("reads the item types");
    let names: Vec<String> = first
        .item_types
        .iter()
        .filter_map(|registered| registered.spec.as_ref())
        .map(|spec| spec.item_type.clone())
        .collect();
    let expected: Vec<String> = (0..12).map(|n| format!("t{n:02}")).collect();
    assert_eq!(names, expected);
    assert!(first.next_page_token.is_empty());
}

/// grpcurl takes `127.0.0.1:50051`; `Client::connect` needs a scheme. A
/// controller that passes the grpcurl form must be told so, not "could not
/// connect ... check that the server runs" while the server runs.
#[tokio::test]
async fn an_address_without_a_scheme_is_refused_saying_to_add_one() {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("the server starts");
    let address = server.addr().to_string();
    let error = Client::connect(address.clone(), &server.admin_token())
        .await
        .expect_err("an address without a scheme cannot be dialled");
    assert!(
        matches!(
            error,
            reconciled_client::ClientError::EndpointWithoutScheme { .. }
        ),
        "{error:?}"
    );
    assert!(
        error.to_string().contains(&format!("http://{address}")),
        "{error}"
    );
}

/// `http://127.0.0.1:5005l` (a mistyped port) parses as a URI, and the
/// connector took the port it could not read for 80: the controller was
/// told "connection refused" about a port it never named. It is refused
/// before anything connects, naming the port.
#[tokio::test]
async fn an_address_whose_port_is_not_a_number_is_refused_naming_the_port() {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("the server starts");
    let mistyped = format!("http://{}l", server.addr());
    let error = Client::connect(mistyped.clone(), &server.admin_token())
        .await
        .expect_err("a port that is not a number cannot be dialled");
    assert!(
        matches!(
            error,
            reconciled_client::ClientError::UnusableEndpoint { .. }
        ),
        "{error:?}"
    );
    let port = format!("\"{}l\"", server.addr().port());
    assert!(
        error.to_string().contains(&port) && error.to_string().contains("1 to 65535"),
        "{error}"
    );
}

/// A call made while the server is down (stopped, restarting) fails with
/// `UNAVAILABLE` that says where the client could not connect and why,
/// not tonic's bare "tcp connect error"; `retry_after` says to try again.
#[tokio::test]
async fn a_call_to_a_stopped_server_says_where_it_could_not_connect_and_why() {
    let mut server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("the server starts");
    let client = acme_client(&server).await;
    let status_of_acme = || {
        client.get_status(v1::GetStatusRequest {
            tenant: "acme".into(),
        })
    };
    status_of_acme().await.expect("the server answers");
    server.terminate().await.expect("the server stops");

    // A call already on its way when the connection closed may end as
    // "connection lost"; the next ones find no server to connect to.
    let mut refused = None;
    for _ in 0..5 {
        let status = status_of_acme().await.expect_err("the server is down");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        if !status.message().contains("was lost") {
            refused = Some(status);
            break;
        }
    }
    let refused = refused.expect("a call that found no server");
    let message = refused.message();
    assert!(
        message.starts_with(&format!(
            "could not connect to the server at {}",
            server.endpoint()
        )),
        "{message}"
    );
    assert!(message.contains("Connection refused"), "{message}");
    assert_eq!(
        reconciled_client::retry_after(&refused),
        Some(reconciled_client::UNAVAILABLE_RETRY_DELAY)
    );
}

/// A controller over its tenant's byte budget is refused with a
/// `RetryInfo`; `retry_after` reads the wait from it, and the same call
/// sent again after that wait is accepted.
#[tokio::test]
async fn retry_after_gives_the_wait_that_makes_a_refused_call_succeed() {
    // A 20 KB/s budget saves up 80 KB: a 120 KB intent is admitted and
    // leaves the tenant in debt for about two seconds.
    let server =
        ServerProcess::start(ServerOptions::default().arg("--max-tenant-bytes-per-second=20000"))
            .await
            .expect("the server starts");
    let client = acme_client(&server).await;
    let pad = "p".repeat(30_000);
    let intent = |version: u32| {
        submit(
            "acme",
            (0..4)
                .map(|n| item("t", &format!("i{n}"), json!({"pad": pad, "v": version})))
                .collect(),
            None,
        )
    };
    client
        .submit_intent(intent(1))
        .await
        .expect("the first intent is admitted");
    let refused = client
        .submit_intent(intent(2))
        .await
        .expect_err("the tenant is in debt");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let mut wait = reconciled_client::retry_after(&refused).expect("a RetryInfo to honour");
    assert!(
        wait > Duration::ZERO && wait < STEP,
        "{wait:?} from {refused:?}"
    );

    // Honouring the wait (a clock's rounding may ask for one more).
    let mut attempts = 0;
    let accepted = loop {
        tokio::time::sleep(wait).await;
        attempts += 1;
        match client.submit_intent(intent(2)).await {
            Ok(reply) => break reply,
            Err(status) if attempts < 3 => {
                wait = reconciled_client::retry_after(&status)
                    .unwrap_or_else(|| panic!("{status:?} is not worth a retry"));
            }
            Err(status) => panic!("still refused after {attempts} waits: {status:?}"),
        }
    };
    assert_eq!(accepted.generation, 2);
}

#[tokio::test]
async fn one_connection_serves_every_tenant_token_and_a_rotated_one() {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("server starts");
    let admin = admin(&server).await;
    let status = |tenant: &str| v1::GetStatusRequest {
        tenant: tenant.into(),
    };
    let mut clients = Vec::new();
    for name in ["site-a", "site-b"] {
        let token = admin
            .create_tenant(v1::CreateTenantRequest {
                name: name.into(),
                limits: None,
            })
            .await
            .expect("creates the tenant")
            .token;
        clients.push(admin.with_token(&token).expect("a valid token"));
    }
    clients[0]
        .get_status(status("site-a"))
        .await
        .expect("site-a's token reads site-a");
    let refused = clients[1]
        .get_status(status("site-a"))
        .await
        .expect_err("site-b's token does not read site-a");
    // Another tenant's name reads as not found: a token does not learn
    // which tenants exist.
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");

    let rotated = admin
        .rotate_token(v1::RotateTokenRequest {
            name: "site-b".into(),
        })
        .await
        .expect("rotates")
        .token;
    let old = clients[1]
        .get_status(status("site-b"))
        .await
        .expect_err("the old token is refused");
    assert_eq!(old.code(), Code::Unauthenticated, "{old:?}");
    admin
        .with_token(&rotated)
        .expect("a valid token")
        .get_status(status("site-b"))
        .await
        .expect("the new token works on the same connection");
    assert!(
        admin.with_token("").is_err(),
        "an empty token is refused before any call"
    );
}

/// A controller may start before its server: `Client::connect_lazy`
/// returns at once, calls fail `UNAVAILABLE` while nothing listens, and a
/// resuming fleet watch opened then follows the server once it is up.
#[tokio::test]
async fn a_lazily_connected_client_waits_out_a_server_that_is_not_up_yet() {
    use reconciled_client::Resumed;
    use reconciled_client::proto::watch_fleet_response::Message;

    let addr = reconciled_tests::free_loopback_addr().expect("a free port");
    let admin_token = reconciled_tests::random_token("rcda_test_");
    let client = Client::connect_lazy(format!("http://{addr}"), &admin_token, None)
        .expect("a lazy client needs no server");
    let refused = client
        .list_tenants(v1::ListTenantsRequest::default())
        .await
        .expect_err("nothing listens yet");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");

    let mut fleet = client.watch_fleet_resuming(v1::WatchFleetRequest::default());
    let watcher = tokio::spawn(async move {
        loop {
            match fleet.next().await.expect("the watch goes on") {
                Resumed::Message(Message::Events(group)) => {
                    if group.events.iter().any(|event| event.tenant == "acme") {
                        return fleet.breaks();
                    }
                }
                Resumed::Message(_) => {}
                Resumed::StartedOver(why) => panic!("nothing was listed yet: {why:?}"),
            }
        }
    });
    let server = ServerProcess::start(
        ServerOptions::default()
            .admin_token(admin_token.clone())
            .listen(addr),
    )
    .await
    .expect("the server starts on the chosen address");
    client
        .create_tenant(v1::CreateTenantRequest {
            name: "acme".into(),
            limits: None,
        })
        .await
        .expect("the same client reaches the server now");
    let breaks = tokio::time::timeout(Duration::from_secs(60), watcher)
        .await
        .expect("the watch sees the new tenant")
        .expect("the watcher did not panic");
    assert!(
        breaks >= 1,
        "the watch was refused before the server was up"
    );
    drop(server);
}
