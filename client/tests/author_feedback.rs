//! What an agent's author is told when something goes wrong in the first
//! hour: a refused agent's error as a test or `main` prints it, two
//! processes sharing one agent id, a configurator slower than its type's
//! operation timeout. Each runs the real server through the testkit.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use reconciled_client::prelude::*;
use reconciled_client::testkit::TestServer;
use tokio::sync::{Notify, watch};

mod support;
use support::Instant;

/// How long a test waits for what it expects.
const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_refused_agent_prints_what_to_do_also_with_debug() {
    let server = TestServer::start().await.expect("server");
    let tenant = server.tenant("acme").await.expect("tenant");
    // The tenant's own token, but a tenant name with a typo.
    let builder = Agent::builder(tenant.endpoint(), "acmee", tenant.token())
        .agent_id("typo")
        .item_type(TypeSpec::new("kv"), Instant);
    let error = tenant
        .start_agent(builder)
        .await
        .expect_err("an unknown tenant is refused");
    // `fn main() -> Result<(), Box<dyn Error>>` and a test returning one
    // print the error with Debug: it must say what to do, not only name
    // the variant.
    let printed = format!("{error:?}");
    assert!(
        printed.contains("the server refused tenant \"acmee\" (no such tenant"),
        "{printed}"
    );
    let reconciled_client::testkit::TestkitError::Agent(error) = error else {
        panic!("not the agent's own error: {error}");
    };
    let boxed: Box<dyn std::error::Error> = Box::new(error);
    assert_eq!(format!("{boxed:?}"), printed);
}

#[tokio::test]
async fn two_processes_sharing_an_agent_id_are_told_why_they_lose_their_session() {
    let server = TestServer::start().await.expect("server");
    let tenant = server.tenant("acme").await.expect("tenant");
    let first = tenant
        .agent("accounts")
        .item_type(TypeSpec::new("user"), Instant)
        .build()
        .expect("agent");
    let mut events = first.events();
    let (stop_first, stopped) = tokio::sync::oneshot::channel::<()>();
    let first = tokio::spawn(first.run(async {
        let _ = stopped.await;
    }));
    tokio::time::timeout(DEADLINE, async {
        while !matches!(events.recv().await, Ok(AgentEvent::Connected { .. })) {}
    })
    .await
    .expect("the first agent registers");

    // A second process with the same agent id takes the type over.
    let second = tenant
        .start_agent(
            tenant
                .agent("accounts")
                .item_type(TypeSpec::new("user"), Instant),
        )
        .await
        .expect("the second agent registers");
    let reason = tokio::time::timeout(DEADLINE, async {
        loop {
            if let Ok(AgentEvent::Disconnected { reason, .. }) = events.recv().await {
                return reason;
            }
        }
    })
    .await
    .expect("the first agent loses its session");
    assert!(
        reason.contains("another session with agent id \"accounts\"")
            && reason.contains("give each its own with AgentBuilder::agent_id"),
        "{reason}"
    );

    second.stop().await.expect("the second agent stops");
    let _ = stop_first.send(());
    first
        .await
        .expect("the first agent's task")
        .expect("the first agent stops");
}

/// Log lines written while a test runs, with a signal at every write.
#[derive(Clone)]
struct CapturedLog {
    text: Arc<Mutex<Vec<u8>>>,
    written: watch::Sender<usize>,
}

impl std::io::Write for CapturedLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut text = self.text.lock().expect("lock");
        text.extend_from_slice(bytes);
        self.written.send_replace(text.len());
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLog {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.text.lock().expect("lock")).into_owned()
    }

    /// Waits until the log holds `needle`, at most [`DEADLINE`].
    async fn wait_for(&self, needle: &str) -> String {
        let mut written = self.written.subscribe();
        tokio::time::timeout(DEADLINE, async {
            loop {
                let text = self.text();
                if text.contains(needle) {
                    return text;
                }
                written.changed().await.expect("the log lives");
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no {needle:?} in the log:\n{}", self.text()))
    }
}

/// A Create that ignores its cancellation until the test releases it.
struct Stubborn(Arc<Notify>);

impl Configurator for Stubborn {
    async fn create(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
        self.0.notified().await;
        Outcome::done()
    }
    async fn modify(&self, _ctx: &OperationContext, _previous: &Item, _item: &Item) -> Outcome {
        Outcome::done()
    }
    async fn delete(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
        Outcome::done()
    }
}

#[tokio::test]
async fn a_configurator_slower_than_its_timeout_is_named_in_the_agents_log() {
    let (written, _) = watch::channel(0);
    let log = CapturedLog {
        text: Arc::default(),
        written,
    };
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // A current-thread runtime: the agent's tasks log to this subscriber.
    let _default = tracing::subscriber::set_default(subscriber);

    let server = TestServer::start().await.expect("server");
    let tenant = server.tenant("acme").await.expect("tenant");
    let release = Arc::new(Notify::new());
    let slow = TypeSpec::new("slow")
        .operation_timeout(Duration::from_secs(1))
        .max_attempts(1);
    let agent = tenant
        .start_agent(
            tenant
                .agent("slow-1")
                .item_type(slow, Stubborn(Arc::clone(&release))),
        )
        .await
        .expect("agent");
    tenant
        .submit([Item::new("slow", "a")])
        .await
        .expect("submit");

    let text = log.wait_for("its configurator still runs").await;
    assert!(text.contains("item=slow/a"), "{text}");
    assert!(text.contains("its 1s operation_timeout"), "{text}");
    assert!(
        text.contains("raise the type's operation_timeout"),
        "{text}"
    );

    release.notify_one();
    agent.stop().await.expect("the agent stops");
}

#[tokio::test]
async fn a_refused_schema_names_its_item_type() {
    let server = TestServer::start().await.expect("server");
    let tenant = server.tenant("acme").await.expect("tenant");
    let builder = tenant
        .agent("accounts")
        .item_type(TypeSpec::new("group"), Instant)
        .item_type(
            TypeSpec::new("user").schema(json!({"type": "bogus"})),
            Instant,
        );
    let error = tenant
        .start_agent(builder)
        .await
        .expect_err("a schema that does not compile is refused");
    let printed = error.to_string();
    assert!(
        printed.contains(
            "register.item_types[1].schema: item type \"user\": the schema does not compile"
        ),
        "{printed}"
    );
}
