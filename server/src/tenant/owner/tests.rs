//! Tests of the owner's clocks and randomness: deadlines on the monotonic
//! clock, and one seed giving one run.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::agents::{Registration, SessionLink, ToAgent};
use crate::engine::exec::{RetryPolicy, TypeSpec};
use crate::graph::{Item, ItemRef, ItemState, code};
use crate::store::InMemoryStore;
use crate::tenant::clock::{Clock, SimulatedClock};
use crate::tenant::record::{TenantLimits, TenantRecord};
use crate::tenant::{OwnerSettings, TenantHandle, TenantState, ValidatedSubmit};

const TIMEOUT_MS: u64 = 10_000;

/// A tenant with one agent session for type `t`, under a simulated clock.
struct Harness {
    store: Arc<InMemoryStore>,
    handle: TenantHandle,
    clock: Arc<SimulatedClock>,
    agent: mpsc::UnboundedReceiver<ToAgent>,
}

async fn start(seed: u64) -> Harness {
    let store = Arc::new(InMemoryStore::new());
    let record = TenantRecord {
        id: 7,
        name: "clocks".into(),
        created_at_ms: 0,
        generation: 0,
        observed_generation: 0,
        revision: 1,
        limits: TenantLimits::default(),
        token_hash: String::new(),
        deleted: false,
        conditions: Vec::new(),
        compact_revision: Some(0),
    };
    let clock = Arc::new(SimulatedClock::new(1_700_000_000_000));
    let settings = OwnerSettings {
        clock: clock.clone(),
        rng_seed: Some(seed),
        ..OwnerSettings::default()
    };
    let handle = TenantHandle::spawn(TenantState::new(record), store.clone(), settings);
    let (sender, agent) = mpsc::unbounded_channel();
    let mut spec = TypeSpec::new("t");
    spec.operation_timeout_ms = TIMEOUT_MS;
    spec.retry = RetryPolicy::Random {
        min_ms: 1_000,
        max_ms: 60_000,
    };
    handle
        .register(Registration {
            link: SessionLink {
                session_id: 1,
                agent_id: "agent".into(),
                sender,
            },
            types: vec![spec],
        })
        .await
        .expect("registered");
    Harness {
        store,
        handle,
        clock,
        agent,
    }
}

fn submit(names: &[&str]) -> ValidatedSubmit {
    ValidatedSubmit {
        subgraph: String::new(),
        items: names
            .iter()
            .map(|name| (Item::new("t", *name, Default::default()), Vec::new()))
            .collect(),
        expected_generation: None,
        dry_run: false,
    }
}

/// Waits (in paused time) until the owner has nothing left to do now.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

fn received(agent: &mut mpsc::UnboundedReceiver<ToAgent>) -> Vec<ToAgent> {
    let mut messages = Vec::new();
    while let Ok(message) = agent.try_recv() {
        messages.push(message);
    }
    messages
}

fn state_of(handle: &TenantHandle, name: &str) -> Option<ItemState> {
    handle
        .snapshots
        .latest()
        .current
        .get(&ItemRef::new("t", name))
        .map(|c| c.state)
}

#[tokio::test(start_paused = true)]
async fn a_wall_clock_step_neither_expires_nor_extends_operations() {
    let mut harness = start(1).await;
    harness.handle.submit(submit(&["a"])).await.expect("stored");
    settle().await;
    let op_id = match received(&mut harness.agent).as_slice() {
        [ToAgent::Operation(order)] => order.op_id.clone(),
        other => panic!("expected one operation, got {other:?}"),
    };

    // An hour forward on the wall clock, 4 s on the monotonic one: the
    // operation has 6 s left, whatever the wall clock says.
    harness.clock.step_wall_clock(3_600_000);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        received(&mut harness.agent).is_empty(),
        "nothing may be cancelled"
    );
    assert_eq!(state_of(&harness.handle, "a"), Some(ItemState::Creating));

    // Two hours back: the deadline does not move either.
    harness.clock.step_wall_clock(-7_200_000);
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    let cancelled = received(&mut harness.agent).into_iter().any(
        |message| matches!(message, ToAgent::Cancel { op_id: cancelled } if cancelled == op_id),
    );
    assert!(cancelled, "the operation times out 10 s after it was sent");
    let snapshot = harness.handle.snapshots.latest();
    let current = snapshot
        .current
        .get(&ItemRef::new("t", "a"))
        .expect("item recorded");
    assert_eq!(current.state, ItemState::Failed);
    assert_eq!(
        current.last_error.as_ref().map(|error| error.code),
        Some(code::DEADLINE_EXCEEDED)
    );
    assert!(harness.clock.now_ms() < 1_700_000_000_000);
}

#[tokio::test(start_paused = true)]
async fn one_seed_gives_the_same_op_ids_and_retry_times() {
    async fn run(seed: u64) -> (Vec<String>, Option<u64>) {
        let mut harness = start(seed).await;
        harness
            .handle
            .submit(submit(&["a", "b"]))
            .await
            .expect("stored");
        settle().await;
        let op_ids: Vec<String> = received(&mut harness.agent)
            .into_iter()
            .filter_map(|message| match message {
                ToAgent::Operation(order) => Some(order.op_id),
                _ => None,
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(TIMEOUT_MS)).await;
        let retry_at = harness
            .handle
            .snapshots
            .latest()
            .current
            .get(&ItemRef::new("t", "a"))
            .and_then(|c| c.next_attempt_at_ms);
        (op_ids, retry_at)
    }
    let first = run(42).await;
    assert_eq!(first.0.len(), 2);
    assert!(
        first.1.is_some(),
        "the timed-out operation waits for a retry"
    );
    assert_eq!(run(42).await, first);
    assert_ne!(
        run(43).await.0,
        first.0,
        "another seed, another boot number"
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancel_is_committed_before_it_is_sent() {
    use crate::store::Store as _;
    use crate::tenant::record::decode;

    let mut harness = start(1).await;
    let first = ValidatedSubmit {
        items: vec![(
            Item::new(
                "t",
                "a",
                serde_json::json!({"v": 1})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            ),
            Vec::new(),
        )],
        ..submit(&[])
    };
    harness.handle.submit(first).await.expect("submitted");
    settle().await;
    let Some(ToAgent::Operation(create)) = received(&mut harness.agent).pop() else {
        panic!("the create of t/a is sent");
    };
    let second = ValidatedSubmit {
        items: vec![(
            Item::new(
                "t",
                "a",
                serde_json::json!({"v": 2})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            ),
            Vec::new(),
        )],
        ..submit(&[])
    };
    harness.handle.submit(second).await.expect("submitted");
    settle().await;
    let cancels: Vec<String> = received(&mut harness.agent)
        .into_iter()
        .filter_map(|message| match message {
            ToAgent::Cancel { op_id } => Some(op_id),
            _ => None,
        })
        .collect();
    assert_eq!(
        cancels,
        [create.op_id.clone()],
        "the superseded create is cancelled"
    );
    let key = crate::store::keys::current_item_key(7, "t", "a");
    let stored = harness
        .store
        .get(&key)
        .expect("readable")
        .expect("journaled");
    let stored: crate::graph::CurrentItem = decode(&key, &stored).expect("decodes");
    let operation = stored.in_flight.expect("still in flight");
    assert_eq!(operation.op_id, create.op_id);
    assert!(
        operation.cancel_requested,
        "the cancel is in the store once sent"
    );
}
