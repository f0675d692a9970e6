//! Unit tests of the executor, driven directly: no store, no runtime, no
//! clock. Each test plays the owner: it hands inputs with the time, reads
//! the effects, and says whether their commit became durable.

use crate::engine::exec::effects::{Effects, OperationOutcome, TenantEvent};
use crate::engine::exec::port::{
    AgentOutcome, ExternalChange, OperationOrder, Outstanding, Registration, ToAgent,
};
use crate::engine::exec::{
    AgentResult, Executor, ExecutorSettings, Now, RetryPolicy, StoredSpec, TenantProgress, TypeSpec,
};
use crate::engine::intent::ValidatedSubmit;
use crate::engine::plan::retry_by;
use crate::engine::testkit::on;
use crate::graph::{
    CurrentGraph, IntendedGraph, Item, ItemRef, ItemState, OperationError, OperationKind, code,
};
use reconciled_proto::v1;

const WALL_START: u64 = 1_700_000_000_000;
const TIMEOUT_MS: u64 = 10_000;

fn at(ms: u64) -> Now {
    Now {
        wall_ms: WALL_START + ms,
        mono_ms: ms,
    }
}

fn spec() -> TypeSpec {
    spec_of("t")
}

/// [`spec`] for another item type.
fn spec_of(item_type: &str) -> TypeSpec {
    let mut spec = TypeSpec::new(item_type);
    spec.operation_timeout_ms = TIMEOUT_MS;
    spec.retry = RetryPolicy::Static { wait_ms: 1_000 };
    spec
}

fn executor() -> Executor {
    Executor::load(
        IntendedGraph::default(),
        CurrentGraph::default(),
        TenantProgress::default(),
        Vec::new(),
        settings(),
        at(0),
    )
}

fn settings() -> ExecutorSettings {
    ExecutorSettings {
        tenant_id: 7,
        max_items: 0,
        default_max_items: 1_000,
        max_operations_in_flight: 0,
        configurator_grace_ms: 300_000,
        resync_interval_ms: 3_600_000,
        cancel_timeout_ms: 5_000,
        seed: 1,
    }
}

/// The executor a restarted server loads from `executor`'s state (its
/// journaled operations as stored), with type `t` registered before and
/// held by `agent`'s session when the server stopped.
fn reloaded(executor: &Executor, now: Now) -> Executor {
    reloaded_held_by(executor, Some("agent"), now)
}

/// [`reloaded`], with type `t` held by `holder` when the server stopped.
fn reloaded_held_by(executor: &Executor, holder: Option<&str>, now: Now) -> Executor {
    let model = executor.model();
    Executor::load(
        model.intended.clone(),
        model.current.clone(),
        model.progress().clone(),
        vec![StoredSpec {
            spec: spec(),
            epoch: 1,
            held_by: holder.map(str::to_owned),
        }],
        settings(),
        now,
    )
}

/// The agent events a commit carries: connected or not, agent, types.
fn agent_events(effects: &Effects) -> Vec<(bool, String, Vec<String>)> {
    effects
        .commit
        .events
        .iter()
        .filter_map(|event| match event {
            TenantEvent::AgentConnected {
                agent_id,
                item_types,
                ..
            } => Some((true, agent_id.clone(), item_types.clone())),
            TenantEvent::AgentDisconnected {
                agent_id,
                item_types,
                ..
            } => Some((false, agent_id.clone(), item_types.clone())),
            _ => None,
        })
        .collect()
}

/// The type specs a commit stores: type and holder.
fn holders(effects: &Effects) -> Vec<(String, Option<String>)> {
    effects
        .commit
        .specs
        .iter()
        .map(|stored| (stored.spec.item_type.clone(), stored.held_by.clone()))
        .collect()
}

/// The state changes a commit carries to watchers: item, state before,
/// state after.
fn status_changes(effects: &Effects) -> Vec<(String, Option<ItemState>, Option<ItemState>)> {
    effects
        .commit
        .events
        .iter()
        .filter_map(|event| match event {
            TenantEvent::ItemChanged(change) => Some((
                change.item.to_string(),
                change.before.as_ref().map(|before| before.state),
                change.after.as_ref().map(|after| after.state),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn a_restart_tells_watchers_which_operations_it_lost() {
    let mut executor = connected();
    submit(&mut executor, vec![item("a", 1)], at(10));
    let mut restarted = reloaded(&executor, at(20));
    assert_eq!(state_of(&restarted, "a"), Some(ItemState::Unknown));
    // The first pass's commit fails: what loading found still goes out
    // with the next one.
    restarted.reconcile(false, at(21));
    restarted.commit_failed(at(21));
    assert_eq!(state_of(&restarted, "a"), Some(ItemState::Unknown));
    let (effects, _) = restarted.reconcile(false, at(22));
    assert_eq!(
        status_changes(&effects),
        vec![(
            "t/a".to_owned(),
            Some(ItemState::Creating),
            Some(ItemState::Unknown)
        )],
        "the item went UNKNOWN: the commit stores it and tells watchers"
    );
    assert_eq!(
        agent_events(&effects),
        vec![(false, "agent".to_owned(), vec!["t".to_owned()])],
        "no session outlives the process: watchers learn the agent is gone"
    );
    assert_eq!(
        holders(&effects),
        vec![("t".to_owned(), None)],
        "and the store no longer says it holds its type"
    );
    restarted.committed(at(22));
    let (effects, _) = restarted.reconcile(false, at(23));
    assert!(status_changes(&effects).is_empty(), "told once");
    assert!(agent_events(&effects).is_empty(), "told once");
    assert!(effects.commit.is_empty(), "nothing left to store");
}

#[test]
fn a_retry_time_a_restart_brings_nearer_is_stored_by_its_first_commit() {
    let mut executor = connected();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    // The agent asks for an hour; the type's policy waits at most 1 s.
    let wait = AgentOutcome::Wait {
        retry_after_ms: 3_600_000,
    };
    answer(&mut executor, &orders(&effects.sends)[0], wait, at(20));
    let retry_at = |executor: &Executor| {
        executor
            .model()
            .current
            .get(&ItemRef::new("t", "a"))
            .and_then(|entry| entry.rare.next_attempt_at_ms)
    };
    assert_eq!(retry_at(&executor), Some(WALL_START + 3_600_020));

    let mut restarted = reloaded(&executor, at(100));
    assert_eq!(
        retry_at(&restarted),
        Some(WALL_START + 1_100),
        "at most the policy's longest wait from the restart"
    );
    let (effects, _) = restarted.reconcile(false, at(101));
    let stored: Vec<Option<u64>> = effects
        .commit
        .items
        .iter()
        .filter(|write| write.item == ItemRef::new("t", "a"))
        .map(|write| {
            write
                .after
                .as_ref()
                .and_then(|after| after.rare.next_attempt_at_ms)
        })
        .collect();
    assert_eq!(
        stored,
        vec![Some(WALL_START + 1_100)],
        "what the status shows is what the store keeps"
    );
}

#[test]
fn a_restart_with_no_session_open_and_nothing_in_flight_stores_nothing() {
    let mut executor = executor();
    submit(&mut executor, vec![item("a", 1)], at(10));
    executor.committed(at(10));
    let mut restarted = reloaded_held_by(&executor, None, at(20));
    let (effects, _) = restarted.reconcile(false, at(21));
    assert!(
        effects.commit.is_empty(),
        "a start moves no revision when nothing changed: {:?}",
        effects.commit
    );
}

#[test]
fn the_store_knows_which_agent_holds_a_type_and_a_failed_commit_loses_no_disconnect() {
    let mut executor = executor();
    let effects = register(&mut executor, 1, "agent", at(0));
    assert_eq!(
        holders(&effects),
        vec![("t".to_owned(), Some("agent".to_owned()))]
    );
    executor.committed(at(0));

    let effects = executor.session_closed(1, "the stream ended", at(10));
    assert_eq!(
        agent_events(&effects),
        vec![(false, "agent".to_owned(), vec!["t".to_owned()])]
    );
    assert_eq!(holders(&effects), vec![("t".to_owned(), None)]);
    // The store refuses the commit: the session ended all the same, and
    // the next commit says so.
    executor.commit_failed(at(10));
    let (effects, _) = executor.reconcile(false, at(11));
    assert_eq!(
        agent_events(&effects),
        vec![(false, "agent".to_owned(), vec!["t".to_owned()])]
    );
    assert_eq!(holders(&effects), vec![("t".to_owned(), None)]);
    executor.commit_failed(at(11));

    // Another agent takes the type in the next commit: the disconnect
    // comes first, and the type is stored once, held by the newcomer.
    let effects = register(&mut executor, 2, "other", at(12));
    assert_eq!(
        agent_events(&effects),
        vec![
            (false, "agent".to_owned(), vec!["t".to_owned()]),
            (true, "other".to_owned(), vec!["t".to_owned()]),
        ]
    );
    assert_eq!(
        holders(&effects),
        vec![("t".to_owned(), Some("other".to_owned()))]
    );
    executor.committed(at(12));
    let (effects, _) = executor.reconcile(false, at(13));
    assert!(agent_events(&effects).is_empty(), "told once");
    assert!(holders(&effects).is_empty(), "stored once");
}

/// The executor with an agent on session 1 for type `t`.
fn connected() -> Executor {
    let mut executor = executor();
    register(&mut executor, 1, "agent", at(0));
    executor
}

fn register(executor: &mut Executor, session_id: u64, agent_id: &str, now: Now) -> Effects {
    register_with(
        executor,
        session_id,
        agent_id,
        spec(),
        Outstanding::Unsaid,
        now,
    )
}

fn register_with(
    executor: &mut Executor,
    session_id: u64,
    agent_id: &str,
    spec: TypeSpec,
    outstanding: Outstanding,
    now: Now,
) -> Effects {
    let (effects, _) = executor
        .register(
            Registration {
                session_id,
                agent_id: agent_id.into(),
                types: vec![spec],
                outstanding,
            },
            now,
        )
        .expect("registered");
    executor.committed(now);
    effects
}

/// Registers `spec` for `agent_id` on `session_id`, the agent saying it
/// runs nothing.
fn register_listed(
    executor: &mut Executor,
    session_id: u64,
    agent_id: &str,
    spec: TypeSpec,
    now: Now,
) -> Effects {
    register_with(
        executor,
        session_id,
        agent_id,
        spec,
        Outstanding::Listed(Default::default()),
        now,
    )
}

/// [`spec`] for a type that supports READ.
fn readable() -> TypeSpec {
    let mut readable = spec();
    readable.supports_read = true;
    readable
}

/// The executor with an agent for `spec`'s type on session 1, one
/// operation in flight at a time, the agent saying it runs nothing.
fn connected_with_one_slot(mut spec: TypeSpec) -> Executor {
    spec.max_in_flight = 1;
    let mut executor = executor();
    register_listed(&mut executor, 1, "agent", spec, at(0));
    executor
}

/// The other of the items `a` and `b`.
fn other_than(name: &str) -> &'static str {
    if name == "a" { "b" } else { "a" }
}

fn item(name: &str, version: i64) -> Item {
    item_of("t", name, version)
}

/// [`item`] of another item type.
fn item_of(item_type: &str, name: &str, version: i64) -> Item {
    let mut item = Item::new(item_type, name, Default::default());
    item.properties.insert("v".into(), version.into());
    item
}

/// Submits `items` as subgraph `subgraph`; the commit becomes durable.
fn submit_subgraph(executor: &mut Executor, subgraph: &str, items: Vec<Item>, now: Now) -> Effects {
    let request = crate::engine::testkit::validated_submit(subgraph, items);
    let (effects, _) = executor.submit(request, now).expect("accepted");
    executor.committed(now);
    effects
}

/// Submits `items` as the whole intent; the commit becomes durable.
fn submit(executor: &mut Executor, items: Vec<Item>, now: Now) -> Effects {
    submit_subgraph(executor, "", items, now)
}

/// Session 1's answer to `order`; the commit becomes durable.
fn answer(
    executor: &mut Executor,
    order: &OperationOrder,
    outcome: AgentOutcome,
    now: Now,
) -> Effects {
    answer_on(executor, 1, order, outcome, now)
}

fn done() -> AgentOutcome {
    AgentOutcome::Done {
        observed: None,
        needs_recreate: false,
    }
}

/// A FAILED answer that says nothing of what exists (the agent is busy).
fn busy() -> AgentOutcome {
    AgentOutcome::Failed(OperationError {
        code: code::UNAVAILABLE,
        message: "busy".into(),
    })
}

/// DONE, reporting `observed`.
fn done_observing(observed: crate::graph::Properties) -> AgentOutcome {
    AgentOutcome::Done {
        observed: Some(observed),
        needs_recreate: false,
    }
}

fn orders(messages: &[crate::engine::exec::effects::Message]) -> Vec<OperationOrder> {
    messages
        .iter()
        .filter_map(|message| match &message.message {
            ToAgent::Operation(order) => Some(order.clone()),
            _ => None,
        })
        .collect()
}

fn state_of(executor: &Executor, name: &str) -> Option<ItemState> {
    executor
        .model()
        .current
        .get(&ItemRef::new("t", name))
        .map(|entry| entry.state)
}

#[test]
fn an_operation_is_journaled_in_the_commit_and_sent_only_after_it() {
    let mut executor = connected();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    assert!(
        effects.immediate.is_empty(),
        "nothing goes out before the commit"
    );
    let journaled = effects
        .commit
        .items
        .iter()
        .find(|write| write.item == ItemRef::new("t", "a"))
        .and_then(|write| write.after.as_ref())
        .and_then(|after| after.in_flight.clone())
        .expect("the Create is journaled in the commit");
    let sent = orders(&effects.sends);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].op_id, journaled.op_id);
    assert_eq!(sent[0].kind, OperationKind::Create);
    assert!(
        effects
            .commit
            .events
            .iter()
            .any(|event| matches!(event, TenantEvent::IntentChanged { generation: 1, .. }))
    );
    assert_eq!(effects.started.len(), 1);
}

/// The item state changes a commit shows a watcher (as on the wire): item
/// name, old state, new state.
fn viewed_changes(effects: &Effects) -> Vec<(String, v1::ItemState, v1::ItemState)> {
    crate::wire::events_to_proto(&effects.commit.events)
        .into_iter()
        .filter_map(|event| match event.body {
            Some(v1::event::Body::ItemStatusChanged(change)) => Some((
                change
                    .item
                    .as_ref()
                    .map(|item| item.name.clone())
                    .unwrap_or_default(),
                change.old_state(),
                change.new_state(),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn a_watcher_sees_an_item_pending_from_its_intent_until_it_leaves_it() {
    use v1::ItemState::{Created, Creating, Pending, Unspecified};
    // No agent holds the type: the items stay PENDING.
    let mut executor = executor();
    let effects = submit(&mut executor, vec![item("a", 1), item("b", 1)], at(10));
    assert_eq!(
        viewed_changes(&effects),
        [
            ("a".to_string(), Unspecified, Pending),
            ("b".to_string(), Unspecified, Pending)
        ]
    );
    // A new value of a pending item: still PENDING, nothing to say.
    let effects = submit(&mut executor, vec![item("a", 2), item("b", 1)], at(20));
    assert_eq!(viewed_changes(&effects), []);
    // Leaving the intent before it was ever created.
    let effects = submit(&mut executor, vec![item("a", 2)], at(30));
    assert_eq!(
        viewed_changes(&effects),
        [("b".to_string(), Pending, Unspecified)]
    );
    // Its first current entry follows PENDING; one created in the same
    // commit as its intent never was PENDING to a watcher.
    let mut executor = connected();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    assert_eq!(
        viewed_changes(&effects),
        [("a".to_string(), Unspecified, Creating)]
    );
    let order = orders(&effects.sends).remove(0);
    let effects = answer(&mut executor, &order, done(), at(20));
    assert_eq!(
        viewed_changes(&effects),
        [("a".to_string(), Creating, Created)]
    );
}

#[test]
fn a_dependent_is_dispatched_by_its_dependencys_result_and_acknowledged_after() {
    let mut executor = connected();
    let dependent = item("a", 1).depends_on(on("t/b"));
    let effects = submit(&mut executor, vec![dependent, item("b", 1)], at(10));
    let first = orders(&effects.sends);
    assert_eq!(first.len(), 1, "only the dependency runs first");
    assert_eq!(&**first[0].item.name(), "b");
    assert_eq!(
        executor
            .model()
            .waiting
            .get(&ItemRef::new("t", "a"))
            .map(|w| w.operation),
        Some(OperationKind::Create)
    );

    let effects = answer(&mut executor, &first[0], done(), at(20));
    let next = orders(&effects.sends);
    assert_eq!(next.len(), 1);
    assert_eq!(&**next[0].item.name(), "a");
    let ack = effects
        .sends
        .iter()
        .position(|message| matches!(&message.message, ToAgent::Ack { op_id, .. } if *op_id == first[0].op_id))
        .expect("the result is acknowledged");
    let order = effects
        .sends
        .iter()
        .position(|message| matches!(message.message, ToAgent::Operation(_)))
        .expect("the dependent is sent");
    assert!(
        order < ack,
        "what the result unblocks is sent with its commit"
    );
    assert_eq!(effects.finished.len(), 1);
    assert_eq!(effects.finished[0].outcome, OperationOutcome::Done);
    assert_eq!(state_of(&executor, "b"), Some(ItemState::Created));
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Creating));
}

#[test]
fn a_failed_commit_undoes_its_transaction_and_a_full_pass_tries_again_a_second_later() {
    let mut executor = connected();
    let before = executor.model().counts().clone();
    let request = ValidatedSubmit {
        subgraph: String::new(),
        items: vec![(item("a", 1), Vec::new())],
        expected_generation: None,
        dry_run: false,
    };
    let (effects, submitted) = executor.submit(request, at(10)).expect("accepted");
    assert_eq!(submitted.generation, 1);
    assert!(!effects.commit.is_empty());
    executor.commit_failed(at(10));
    assert_eq!(executor.model().progress().generation, 0);
    assert!(executor.model().intended.is_empty());
    assert!(executor.model().current.is_empty());
    assert_eq!(executor.model().counts(), &before);
    assert_eq!(executor.next_wakeup(at(10)), Some(1_010));

    // The intent was not stored: the owner answered the submit with an
    // error, and the client submits again.
    let effects = submit(&mut executor, vec![item("a", 1)], at(1_010));
    assert_eq!(orders(&effects.sends).len(), 1);
    assert_eq!(executor.model().progress().generation, 1);
}

#[test]
fn a_retry_keeps_its_op_id_and_counts_an_attempt_and_a_wait_keeps_both() {
    let mut executor = connected();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    let first = orders(&effects.sends).remove(0);
    let failure = AgentOutcome::Failed(OperationError {
        code: code::UNAVAILABLE,
        message: "busy".into(),
    });
    let effects = answer(&mut executor, &first, failure, at(20));
    assert!(
        orders(&effects.sends).is_empty(),
        "the retry waits for its backoff"
    );
    assert_eq!(effects.finished[0].outcome, OperationOutcome::Failed);
    assert_eq!(executor.next_wakeup(at(20)), Some(1_020));

    let effects = executor.on_timer(at(1_020));
    executor.committed(at(1_020));
    let retry = orders(&effects.sends).remove(0);
    assert_eq!(retry.op_id, first.op_id);
    assert_eq!(retry.attempt, 2);

    let effects = answer(
        &mut executor,
        &retry,
        AgentOutcome::Wait {
            retry_after_ms: 500,
        },
        at(1_030),
    );
    assert!(orders(&effects.sends).is_empty());
    let effects = executor.on_timer(at(1_530));
    executor.committed(at(1_530));
    let again = orders(&effects.sends).remove(0);
    assert_eq!(
        (again.op_id.as_str(), again.attempt),
        (first.op_id.as_str(), 2)
    );
}

/// A failed operation that a later intent makes unneeded is settled (the
/// item shows CREATED), and if the intent needs it again it is a retry of
/// the same operation: it keeps its op id and counts an attempt, and it
/// waits the backoff its failure set (seed 56203: the retry of a settled
/// Delete went out at once).
#[test]
fn a_settled_failure_needed_again_still_waits_for_its_backoff() {
    let mut executor = connected();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    answer(&mut executor, &orders(&effects.sends)[0], done(), at(20));
    let effects = submit(&mut executor, Vec::new(), at(30));
    let delete = orders(&effects.sends).remove(0);
    assert_eq!(delete.kind, OperationKind::Delete);
    answer(&mut executor, &delete, busy(), at(40));

    // Back in the intent as it is: the Delete is not needed, and the
    // failure is settled.
    let effects = submit(&mut executor, vec![item("a", 1)], at(50));
    assert!(orders(&effects.sends).is_empty());
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Created));

    // Out again before the backoff (1 s from the failure) is over.
    let effects = submit(&mut executor, Vec::new(), at(60));
    assert!(
        orders(&effects.sends).is_empty(),
        "the Delete needed again waits for the backoff its failure set"
    );
    assert_eq!(executor.next_wakeup(at(60)), Some(1_040));

    let effects = executor.on_timer(at(1_040));
    executor.committed(at(1_040));
    let retry = orders(&effects.sends).remove(0);
    assert_eq!(
        (retry.kind, retry.op_id.as_str(), retry.attempt),
        (OperationKind::Delete, delete.op_id.as_str(), 2)
    );
}

#[test]
fn an_intent_change_marks_the_running_operation_cancelled_and_sends_the_cancel_after_the_commit() {
    let mut executor = connected();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    let running = orders(&effects.sends).remove(0);
    let effects = submit(&mut executor, vec![item("a", 2)], at(20));
    assert!(effects.immediate.is_empty());
    let marked = effects
        .commit
        .items
        .iter()
        .find_map(|write| write.after.as_ref()?.in_flight.clone())
        .expect("the running operation's record is in the commit");
    assert!(marked.cancel_requested);
    assert!(effects.sends.iter().any(
        |message| matches!(&message.message, ToAgent::Cancel { op_id } if *op_id == running.op_id)
    ));
}

#[test]
fn a_result_of_a_stale_attempt_is_acknowledged_at_once_and_changes_nothing() {
    let mut executor = connected();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    let mut stale = orders(&effects.sends).remove(0);
    stale.attempt += 5;
    let effects = answer(&mut executor, &stale, done(), at(20));
    assert!(effects.commit.is_empty());
    assert_eq!(effects.immediate.len(), 1);
    assert!(matches!(effects.immediate[0].message, ToAgent::Ack { .. }));
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Creating));
}

#[test]
fn operations_time_out_on_the_monotonic_clock_whatever_the_wall_clock_does() {
    let mut executor = connected();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    let running = orders(&effects.sends).remove(0);
    assert_eq!(executor.next_wakeup(at(10)), Some(10 + TIMEOUT_MS));
    // The wall clock jumps a day ahead; the monotonic clock barely moves.
    let jumped = Now {
        wall_ms: WALL_START + 86_400_000,
        mono_ms: 20,
    };
    let effects = executor.on_timer(jumped);
    executor.committed(jumped);
    assert!(effects.finished.is_empty());
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Creating));

    let effects = executor.on_timer(at(10 + TIMEOUT_MS));
    executor.committed(at(10 + TIMEOUT_MS));
    assert!(effects.immediate.iter().any(
        |message| matches!(&message.message, ToAgent::Cancel { op_id } if *op_id == running.op_id)
    ));
    assert_eq!(effects.finished.len(), 1);
    assert_eq!(
        effects.finished[0].error.as_ref().map(|e| e.code),
        Some(code::DEADLINE_EXCEEDED)
    );
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Failed));
}

#[test]
fn a_lost_session_leaves_its_operation_unknown_and_the_next_holder_gets_it_again() {
    let mut executor = connected();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    let running = orders(&effects.sends).remove(0);
    let effects = executor.session_closed(1, "the stream ended", at(20));
    executor.committed(at(20));
    assert!(
        effects
            .commit
            .events
            .iter()
            .any(|event| matches!(event, TenantEvent::AgentDisconnected { .. }))
    );
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Unknown));
    assert!(executor.connected_item_types().is_empty());

    let effects = register(&mut executor, 2, "agent", at(30));
    let resent = orders(&effects.sends);
    assert_eq!(resent.len(), 1);
    assert_eq!(
        (resent[0].op_id.as_str(), resent[0].attempt),
        (running.op_id.as_str(), 1)
    );
    assert_eq!(effects.sends[0].session_id, 2);
}

#[test]
fn another_agent_is_refused_while_the_type_is_held_and_a_reconnect_takes_it_over() {
    let mut executor = connected();
    let refused = executor.register(
        Registration {
            session_id: 2,
            agent_id: "other".into(),
            types: vec![spec()],
            outstanding: Default::default(),
        },
        at(10),
    );
    assert!(refused.is_err());
    let effects = submit(&mut executor, vec![item("a", 1)], at(20));
    let running = orders(&effects.sends).remove(0);

    // The same agent on a new session: the operation in flight on the old
    // one is sent again there, and a late result on the old session is
    // acknowledged without changing anything.
    let effects = register(&mut executor, 3, "agent", at(30));
    let resent = orders(&effects.sends);
    assert_eq!(resent[0].op_id, running.op_id);
    assert!(resent[0].epoch > running.epoch);
    let late = executor.results(
        vec![AgentResult {
            session_id: 1,
            op_id: running.op_id.clone(),
            attempt: running.attempt,
            outcome: done(),
        }],
        at(40),
    );
    executor.committed(at(40));
    assert!(late.commit.is_empty());
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Creating));
    assert!(
        late.immediate
            .iter()
            .any(|message| message.session_id == 3
                && matches!(message.message, ToAgent::Operation(_))),
        "the holder of the type gets the operation again"
    );
}

#[test]
fn items_wait_for_a_configurator_and_its_registration_dispatches_them() {
    let mut executor = executor();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    assert!(orders(&effects.sends).is_empty());
    assert_eq!(
        executor
            .model()
            .waiting
            .get(&ItemRef::new("t", "a"))
            .map(|w| w.reason),
        Some(crate::engine::plan::WaitReason::NoConfigurator)
    );
    let effects = register(&mut executor, 1, "agent", at(20));
    assert_eq!(orders(&effects.sends).len(), 1);
    assert_eq!(effects.commit.specs.len(), 1);
}

#[test]
fn a_dry_run_plans_on_the_changed_intent_and_changes_nothing() {
    let mut executor = connected();
    let request = ValidatedSubmit {
        subgraph: String::new(),
        items: vec![(item("a", 1), Vec::new())],
        expected_generation: None,
        dry_run: true,
    };
    let (effects, submitted) = executor.submit(request, at(10)).expect("accepted");
    assert!(effects.commit.is_empty() && effects.sends.is_empty());
    assert_eq!(submitted.plan.operations.len(), 1);
    assert_eq!(submitted.generation, 0);
    assert!(executor.model().intended.is_empty());
}

/// An item of a READ-capable type whose Create was lost with its session,
/// and the agent back on session 2 saying it runs nothing: the READ that
/// resolves it, and the lost Create.
fn lost_create_read_back() -> (Executor, OperationOrder, OperationOrder) {
    let mut executor = connected_readable();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    let lost = orders(&effects.sends).remove(0);
    executor.session_closed(1, "gone", at(20));
    executor.committed(at(20));
    let effects = register_listed(&mut executor, 2, "agent", readable(), at(30));
    let read = orders(&effects.sends).remove(0);
    (executor, lost, read)
}

/// `session_id`'s answer to `order`; the commit becomes durable.
fn answer_on(
    executor: &mut Executor,
    session_id: u64,
    order: &OperationOrder,
    outcome: AgentOutcome,
    now: Now,
) -> Effects {
    let effects = executor.results(
        vec![AgentResult {
            session_id,
            op_id: order.op_id.clone(),
            attempt: order.attempt,
            outcome,
        }],
        now,
    );
    executor.committed(now);
    effects
}

#[test]
fn an_unknown_item_of_a_readable_type_is_read_when_its_lost_operation_runs_nowhere() {
    let (executor, lost, read) = lost_create_read_back();
    assert_eq!(read.kind, OperationKind::Read);
    assert_ne!(read.op_id, lost.op_id);
    assert_eq!(
        read.item.properties, lost.item.properties,
        "the READ names the lost Create's value"
    );
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Unknown));
    assert_eq!(
        executor.next_wakeup(at(30)),
        Some(30 + TIMEOUT_MS),
        "the READ has a deadline"
    );
}

#[test]
fn a_tenant_is_reconciling_while_a_read_resolves_a_lost_operation() {
    use crate::engine::conditions::ConditionKind;
    let (executor, _, read) = lost_create_read_back();
    assert_eq!(read.kind, OperationKind::Read);
    assert!(
        holds(&executor, ConditionKind::Reconciling),
        "the READ settling an UNKNOWN item is work, not a drift READ"
    );
    assert!(!ready(&executor));
}

#[test]
fn a_read_showing_the_lost_creates_value_resolves_it_as_applied() {
    let (mut executor, lost, read) = lost_create_read_back();
    let observed = lost.item.properties.clone();
    let effects = answer_on(&mut executor, 2, &read, done_observing(observed), at(40));
    assert!(orders(&effects.sends).is_empty(), "nothing more to do");
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Created));
    assert_eq!(executor.model().counts().get(ItemState::Created), 1);
}

#[test]
fn a_read_that_finds_nothing_lets_the_item_be_created_again() {
    let (mut executor, lost, read) = lost_create_read_back();
    let effects = answer_on(&mut executor, 2, &read, not_found(), at(40));
    let create = orders(&effects.sends).remove(0);
    assert_eq!(create.kind, OperationKind::Create);
    assert_ne!(
        create.op_id, lost.op_id,
        "a new operation: the lost one did not apply"
    );
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Creating));
}

#[test]
fn a_read_that_cannot_tell_sends_the_lost_operation_again() {
    let (mut executor, lost, read) = lost_create_read_back();
    let effects = answer_on(&mut executor, 2, &read, busy(), at(40));
    let again = orders(&effects.sends).remove(0);
    assert_eq!(
        (again.op_id.as_str(), again.attempt, again.kind),
        (lost.op_id.as_str(), 1, OperationKind::Create)
    );
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Creating));

    // A READ that times out does the same.
    let (mut executor, lost, _) = lost_create_read_back();
    let effects = executor.on_timer(at(30 + TIMEOUT_MS));
    executor.committed(at(30 + TIMEOUT_MS));
    let again = orders(&effects.sends).remove(0);
    assert_eq!(again.op_id, lost.op_id);
}

/// DESIGN 3 rule 8 for a lost Create sent again afresh: `a`'s Create was
/// lost, the READ that was to resolve it cannot tell, and meanwhile `b`
/// (same type) is being deleted. Sent again now, the Create would race
/// that Delete at an agent that does not run it: it waits for the
/// Delete's result (then a READ asks again), and goes under its op id.
/// DESIGN 4: a lost operation is re-issued only while its target is
/// intended. One lost with its session whose item left the intent is not
/// started afresh at the next registration (seed 56317); one whose item
/// came back with the same content is (seed 282742), under its op id.
#[test]
fn a_lost_create_is_sent_again_only_while_its_target_is_intended() {
    for (intent_at_registration, sent_again) in [
        (Vec::new(), false),
        (vec![item("a", 2)], false),
        (vec![item("a", 1)], true),
    ] {
        let mut executor = connected();
        let lost = orders(&submit(&mut executor, vec![item("a", 1)], at(10)).sends).remove(0);
        executor.session_closed(1, "gone", at(20));
        executor.committed(at(20));
        submit(&mut executor, Vec::new(), at(25));
        if !intent_at_registration.is_empty() {
            submit(&mut executor, intent_at_registration.clone(), at(30));
        }
        let sent = orders(&register_listed(&mut executor, 2, "agent", spec(), at(40)).sends);
        let resent = sent.iter().any(|order| order.op_id == lost.op_id);
        assert_eq!(
            resent, sent_again,
            "intent {intent_at_registration:?}: sent {sent:?}"
        );
        if !sent_again {
            // What the lost Create may have done is not forgotten: the
            // item may exist, so the intent's operation goes under a new
            // op id, a Delete if it left the intent.
            let next = sent.first().expect("the operation the intent needs");
            assert_ne!(next.op_id, lost.op_id);
            let kind = if intent_at_registration.is_empty() {
                OperationKind::Delete
            } else {
                OperationKind::Create
            };
            assert_eq!(next.kind, kind, "{sent:?}");
        }
    }
}

#[test]
fn a_lost_create_is_not_sent_again_once_an_item_it_relies_on_left_the_intent() {
    let mut executor = connected();
    let b = orders(&submit(&mut executor, vec![item("b", 1)], at(5)).sends).remove(0);
    answer_on(&mut executor, 1, &b, done(), at(6));
    let a_on_b = || item("a", 1).depends_on(on("t/b"));
    let lost = orders(&submit(&mut executor, vec![a_on_b(), item("b", 1)], at(10)).sends)
        .into_iter()
        .find(|order| order.item.item_ref() == ItemRef::new("t", "a"))
        .expect("a is created");
    executor.session_closed(1, "gone", at(20));
    executor.committed(at(20));
    // a keeps its value; b, which it relies on, leaves the intent: b is
    // planned for deletion, an unsatisfied dependency (DESIGN 2).
    submit(&mut executor, vec![a_on_b()], at(25));
    let sent = orders(&register_listed(&mut executor, 2, "agent", spec(), at(40)).sends);
    assert!(
        sent.iter().all(|order| order.op_id != lost.op_id),
        "the lost Create is not sent again: {sent:?}"
    );
    assert!(
        sent.iter().all(|order| order.kind != OperationKind::Create),
        "nothing is created on an item planned for deletion: {sent:?}"
    );
}

#[test]
fn a_lost_create_the_read_cannot_settle_waits_for_a_delete_of_its_type() {
    let mut executor = connected_readable();
    let b = orders(&submit(&mut executor, vec![item("b", 1)], at(5)).sends).remove(0);
    answer_on(&mut executor, 1, &b, done(), at(6));
    let lost = orders(&submit(&mut executor, vec![item("a", 1), item("b", 1)], at(10)).sends)
        .into_iter()
        .find(|order| order.item.item_ref() == ItemRef::new("t", "a"))
        .expect("a is created");
    executor.session_closed(1, "gone", at(20));
    executor.committed(at(20));
    let read =
        orders(&register_listed(&mut executor, 2, "agent", readable(), at(30)).sends).remove(0);
    assert_eq!(read.kind, OperationKind::Read);
    let delete = orders(&submit(&mut executor, vec![item("a", 1)], at(35)).sends).remove(0);
    assert_eq!(
        (delete.kind, delete.item.item_ref()),
        (OperationKind::Delete, ItemRef::new("t", "b"))
    );

    let effects = answer_on(&mut executor, 2, &read, busy(), at(40));
    assert!(
        orders(&effects.sends).is_empty(),
        "the lost Create is not sent while b's Delete runs: {:?}",
        orders(&effects.sends)
    );
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Unknown));

    answer_on(&mut executor, 2, &delete, done(), at(50));
    let read_again = redelivered(
        &mut executor,
        at(50),
        "the Delete's result lets the lost Create be settled",
    );
    assert_eq!(
        read_again.kind,
        OperationKind::Read,
        "the agent runs nothing: a READ asks again what exists"
    );
    let effects = answer_on(&mut executor, 2, &read_again, busy(), at(60));
    let again = orders(&effects.sends).remove(0);
    assert_eq!(
        (again.op_id.as_str(), again.kind),
        (lost.op_id.as_str(), OperationKind::Create),
        "no Delete of its type runs now: the lost Create goes under its op id"
    );
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Creating));
}

/// Rule 8 among lost operations sent again together: `a`'s Create and
/// `b`'s Delete (same type) were both lost with their session, and the
/// agent back says it runs neither. The Delete goes first; the Create
/// follows its result, under its op id.
#[test]
fn lost_operations_sent_again_together_send_a_create_after_a_delete_of_its_type() {
    let mut executor = connected();
    let b = orders(&submit(&mut executor, vec![item("b", 1)], at(5)).sends).remove(0);
    answer_on(&mut executor, 1, &b, done(), at(6));
    let create =
        orders(&submit(&mut executor, vec![item("a", 1), item("b", 1)], at(10)).sends).remove(0);
    assert_eq!(create.item.item_ref(), ItemRef::new("t", "a"));
    let delete = orders(&submit(&mut executor, vec![item("a", 1)], at(15)).sends).remove(0);
    assert_eq!(
        (delete.kind, delete.item.item_ref()),
        (OperationKind::Delete, ItemRef::new("t", "b"))
    );
    executor.session_closed(1, "gone", at(20));
    executor.committed(at(20));

    let effects = register_listed(&mut executor, 2, "agent", spec(), at(30));
    let sent: Vec<(String, OperationKind)> = orders(&effects.sends)
        .into_iter()
        .map(|order| (order.op_id, order.kind))
        .collect();
    assert_eq!(sent, [(delete.op_id.clone(), OperationKind::Delete)]);

    answer_on(&mut executor, 2, &delete, done(), at(40));
    let again = redelivered(
        &mut executor,
        at(40),
        "the Delete's result sends the lost Create",
    );
    assert_eq!(
        (again.op_id.as_str(), again.kind),
        (create.op_id.as_str(), OperationKind::Create)
    );
}

/// Seed 127716: `a`'s Create (on `b`) runs when `b` goes with its external
/// item `x`; `x` comes back, `b`'s Create goes, and the session ends with
/// both outcomes lost. The agent back runs neither: `b`'s lost Create goes
/// again and answers WAIT. `a`'s lost Create waits for `b`'s next attempt
/// (its target is still intended, DESIGN 4) rather than being given up,
/// and goes under its op id once `b` is created.
#[test]
fn a_lost_create_waits_for_its_dependencys_create_asked_again_later() {
    let mut executor = connected();
    let mut x = item("x", 1);
    x.external = true;
    let b = item("b", 1).depends_on(on("t/x").with_auto_deleted_by_external(true));
    let a = item("a", 1).depends_on(on("t/b"));
    submit(&mut executor, vec![x.clone(), b, a], at(10));
    let effects = external_put(&mut executor, &x, at(20));
    let create_b = orders(&effects.sends).remove(0);
    let effects = answer(&mut executor, &create_b, done(), at(30));
    let create_a = orders(&effects.sends).remove(0);
    assert_eq!(create_a.item.identity.name().as_ref(), "a");
    external_delete(&mut executor, &x, at(40));
    let effects = external_put(&mut executor, &x, at(50));
    let create_b = orders(&effects.sends).remove(0);
    assert_eq!(create_b.item.identity.name().as_ref(), "b");
    executor.session_closed(1, "gone", at(60));
    executor.committed(at(60));

    let effects = register_listed(&mut executor, 2, "agent", spec(), at(70));
    let sent: Vec<String> = orders(&effects.sends)
        .into_iter()
        .map(|order| order.op_id)
        .collect();
    assert_eq!(
        sent,
        std::slice::from_ref(&create_b.op_id),
        "a waits for b's outcome"
    );
    let wait = AgentOutcome::Wait {
        retry_after_ms: 500,
    };
    answer_on(&mut executor, 2, &create_b, wait, at(80));
    assert!(
        executor.redeliver_deferred(at(80)).is_none(),
        "a's lost Create waits for b's Create, asked again at its backoff"
    );
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Unknown));

    let effects = executor.on_timer(at(580));
    executor.committed(at(580));
    let again = orders(&effects.sends).remove(0);
    assert_eq!(again.op_id, create_b.op_id, "b's Create is asked again");
    assert!(executor.redeliver_deferred(at(580)).is_none());
    answer_on(&mut executor, 2, &again, done(), at(590));
    let resent = redelivered(&mut executor, at(590), "b is created: a's lost Create goes");
    assert_eq!(
        (resent.op_id.as_str(), resent.kind),
        (create_a.op_id.as_str(), OperationKind::Create),
        "under its op id"
    );
}

/// The first operation the deferred re-deliveries send at `now` (which
/// `why` says there must be), its commit durable.
fn redelivered(executor: &mut Executor, now: Now, why: &str) -> OperationOrder {
    let effects = executor.redeliver_deferred(now).expect(why);
    executor.committed(now);
    orders(&effects.sends).remove(0)
}

/// The executor with a READ-capable agent for type `t` on session 1.
fn connected_readable() -> Executor {
    let mut executor = executor();
    register_listed(&mut executor, 1, "agent", readable(), at(0));
    executor
}

fn ready(executor: &Executor) -> bool {
    holds(executor, crate::engine::conditions::ConditionKind::Ready)
}

/// Whether the tenant's condition `kind` is true.
fn holds(executor: &Executor, kind: crate::engine::conditions::ConditionKind) -> bool {
    executor
        .model()
        .progress()
        .conditions
        .iter()
        .any(|condition| condition.kind == kind && condition.status)
}

/// Reports one external change at `now` and commits it.
fn external_report(executor: &mut Executor, change: ExternalChange, now: Now) -> Effects {
    let effects = executor.report_external(vec![change], now);
    executor.committed(now);
    effects
}

fn external_put(executor: &mut Executor, item: &Item, now: Now) -> Effects {
    let put = ExternalChange::Put {
        item: item.clone(),
        modified: false,
    };
    external_report(executor, put, now)
}

fn external_delete(executor: &mut Executor, item: &Item, now: Now) -> Effects {
    let delete = ExternalChange::Delete {
        item: item.item_ref(),
    };
    external_report(executor, delete, now)
}

/// Re-reporting an external item exactly as stored (or the vanishing of
/// one that is not there) writes and plans nothing, as periodic full
/// re-reports of an inventory do; a changed value or a `modified` mark is
/// still recorded.
#[test]
fn an_unchanged_external_report_writes_nothing() {
    let mut executor = connected_readable();
    let mut x = item("x", 1);
    x.external = true;
    let d = item("d", 1).depends_on(on("t/x"));
    submit(&mut executor, vec![d], at(10));
    let first = external_put(&mut executor, &x, at(20));
    assert!(!first.commit.is_empty(), "the first report is stored");
    let create_d = orders(&first.sends).remove(0);
    answer(&mut executor, &create_d, done(), at(30));
    assert!(ready(&executor));

    let again = external_put(&mut executor, &x, at(40));
    assert!(
        again.commit.is_empty(),
        "nothing changed: {:?}",
        again.commit
    );
    assert!(again.sends.is_empty() && again.immediate.is_empty());
    let absent = external_delete(&mut executor, &item("y", 1), at(45));
    assert!(absent.commit.is_empty(), "y was never there");

    let marked = ExternalChange::Put {
        item: x.clone(),
        modified: true,
    };
    let modified = external_report(&mut executor, marked, at(50));
    assert_eq!(modified.commit.items.len(), 1, "a modification counts");
    let mut changed = x.clone();
    changed.properties = item("x", 2).properties;
    let changed = external_put(&mut executor, &changed, at(60));
    assert_eq!(changed.commit.items.len(), 1, "a new value is stored");
}

/// `m` goes with the external item `x` (`auto_deleted_by_external`) and
/// `b` depends on `m`: `x` goes, taking `m` with it, and `b`'s Delete is
/// answered WAIT; `x` comes back and `m` is created again before `b` is
/// asked again. Returns the executor, `x`, `b` and the Delete that waits.
fn delete_waiting_when_its_reason_went() -> (Executor, Item, Item, OperationOrder) {
    let mut executor = connected_readable();
    let mut x = item("x", 1);
    x.external = true;
    let m = item("m", 1).depends_on(on("t/x").with_auto_deleted_by_external(true));
    let b = item("b", 1).depends_on(on("t/m"));
    submit(&mut executor, vec![x.clone(), m, b.clone()], at(10));
    let effects = external_put(&mut executor, &x, at(20));
    let create_m = orders(&effects.sends).remove(0);
    let effects = answer(&mut executor, &create_m, done(), at(30));
    let create_b = orders(&effects.sends).remove(0);
    answer(&mut executor, &create_b, done(), at(40));
    assert!(ready(&executor), "m on x, b on m");

    let effects = external_delete(&mut executor, &x, at(50));
    let delete = orders(&effects.sends).remove(0);
    assert_eq!(
        (delete.kind, delete.item.identity.name().as_ref()),
        (OperationKind::Delete, "b")
    );
    answer(
        &mut executor,
        &delete,
        AgentOutcome::Wait {
            retry_after_ms: 60_000,
        },
        at(60),
    );
    assert!(!ready(&executor), "b's Delete waits to be asked again");

    let effects = external_put(&mut executor, &x, at(70));
    let create_m = orders(&effects.sends).remove(0);
    assert_eq!(create_m.item.identity.name().as_ref(), "m");
    let effects = answer(&mut executor, &create_m, done(), at(80));
    assert!(
        orders(&effects.sends).is_empty(),
        "b exists on m again: nothing to do"
    );
    (executor, x, b, delete)
}

#[test]
fn a_dependent_whose_waiting_delete_is_no_longer_needed_is_ready_at_once() {
    let (executor, _, b, _) = delete_waiting_when_its_reason_went();
    assert!(
        executor.model().waiting.get(&b.item_ref()).is_none(),
        "the pass that reached b replaced what the earlier one said of it"
    );
    assert!(
        ready(&executor),
        "converged: Ready without waiting for the retry time"
    );
}

#[test]
fn a_read_in_between_keeps_the_op_id_of_a_delete_answered_wait() {
    let (mut executor, x, b, delete) = delete_waiting_when_its_reason_went();
    let (effects, _) = executor.reconcile(true, at(90));
    executor.committed(at(90));
    let read = orders(&effects.sends).remove(0);
    assert_eq!(read.kind, OperationKind::Read);
    answer(
        &mut executor,
        &read,
        done_observing(b.properties.clone()),
        at(100),
    );

    // x goes again: the Delete that answered WAIT is asked again (DESIGN 4:
    // a re-ask after WAIT keeps op id and attempt), after its retry time.
    external_delete(&mut executor, &x, at(110));
    let effects = executor.on_timer(at(60 + 60_000));
    executor.committed(at(60 + 60_000));
    let again = orders(&effects.sends).remove(0);
    assert_eq!(
        (again.kind, again.op_id.as_str(), again.attempt),
        (OperationKind::Delete, delete.op_id.as_str(), delete.attempt)
    );
}

/// Session 1 ends at 40 with its operations' outcomes lost; the agent
/// comes back on session 2 at 50 holding nothing: the READ that resolves
/// the lost operation.
fn lose_and_read_back(executor: &mut Executor) -> OperationOrder {
    executor.session_closed(1, "gone", at(40));
    executor.committed(at(40));
    let effects = register_listed(executor, 2, "agent", readable(), at(50));
    let read = orders(&effects.sends).remove(0);
    assert_eq!(read.kind, OperationKind::Read);
    read
}

/// A lost Modify that gave `a` a dependency on `b` may have applied even
/// when the READ resolving it shows `a`'s old properties (drift may have
/// taken them back, and a READ cannot see dependencies). With the intent
/// back at the old value and `b` gone from it, `b` is deleted only after a
/// Modify of `a` (its previous value uncertain) settles what `a` holds.
#[test]
fn a_read_showing_the_old_value_does_not_free_the_lost_modifys_dependency() {
    let mut executor = connected_readable();
    let (a, b) = (item("a", 1), item("b", 1));
    let effects = submit(&mut executor, vec![a.clone(), b.clone()], at(10));
    for (index, create) in orders(&effects.sends).iter().enumerate() {
        answer(&mut executor, create, done(), at(20 + index as u64));
    }
    let mut a_on_b = item("a", 2);
    a_on_b
        .dependencies
        .push(crate::graph::Dependency::on(b.item_ref()));
    let effects = submit(&mut executor, vec![a_on_b, b.clone()], at(30));
    let modify = orders(&effects.sends).remove(0);
    assert_eq!(modify.kind, OperationKind::Modify);
    let read = lose_and_read_back(&mut executor);
    submit(&mut executor, vec![a.clone()], at(60));

    let effects = answer_on(
        &mut executor,
        2,
        &read,
        done_observing(a.properties.clone()),
        at(70),
    );
    let sent = orders(&effects.sends);
    assert!(
        !sent
            .iter()
            .any(|order| order.kind == OperationKind::Delete
                && order.item.item_ref() == b.item_ref()),
        "b waits: a may rely on it ({sent:?})"
    );
    let settle = sent
        .iter()
        .find(|order| order.item.item_ref() == a.item_ref())
        .expect("a is modified to its intent");
    assert_eq!(settle.kind, OperationKind::Modify);
    assert!(settle.previous_uncertain, "a may hold either value");

    let effects = answer_on(&mut executor, 2, settle, done(), at(80));
    let delete = orders(&effects.sends).remove(0);
    assert_eq!(
        (delete.kind, delete.item.item_ref()),
        (OperationKind::Delete, b.item_ref())
    );
}

/// `y` at `version`, to be recreated whenever `x` is modified.
fn recreated_with(x: &Item, version: i64) -> Item {
    let mut y = item("y", version);
    y.dependencies
        .push(crate::graph::Dependency::on(x.item_ref()).with_recreate_when_modified(true));
    y
}

/// Submits `x` and [`recreated_with`] it at `at(10)`; both are created.
fn x_and_its_dependent_created(executor: &mut Executor, x: &Item) {
    let effects = submit(executor, vec![x.clone(), recreated_with(x, 1)], at(10));
    let create_x = orders(&effects.sends).remove(0);
    let effects = answer(executor, &create_x, done(), at(20));
    let create_y = orders(&effects.sends).remove(0);
    answer(executor, &create_y, done(), at(30));
}

/// The READ of `item` a refreshing reconcile at `now` sends.
fn read_of(executor: &mut Executor, item: &Item, now: Now) -> OperationOrder {
    let (effects, _) = executor.reconcile(true, now);
    executor.committed(now);
    orders(&effects.sends)
        .into_iter()
        .find(|order| order.item.item_ref() == item.item_ref())
        .expect("the item is read")
}

/// The mark `y` keeps on `x`'s modification counter.
fn mark_of_y_on(executor: &Executor, x: &Item) -> Option<u64> {
    executor
        .model()
        .current
        .get(&ItemRef::new("t", "y"))
        .and_then(|entry| entry.rare.dependency_marks.get(&x.item_ref()).copied())
}

/// The agent has no such item.
fn not_found() -> AgentOutcome {
    AgentOutcome::Failed(OperationError {
        code: code::NOT_FOUND,
        message: "no such item".into(),
    })
}

/// An item its agent finds gone (here a READ answered NOT_FOUND) is
/// another item once it is created again, its modification counter
/// starting over: a dependent to be recreated when it is modified
/// (`recreate_when_modified`) forgets the counter it recorded, as when an
/// external item vanishes (DESIGN 3, rule 4). Kept, the old counter could
/// be reached again by the new item's Modifies while the dependent waits
/// (its Delete failing or its agent away), and the dependent would never
/// be recreated.
#[test]
fn a_dependent_forgets_its_mark_on_an_item_found_gone() {
    let mut executor = connected_readable();
    let x = item("x", 1);
    x_and_its_dependent_created(&mut executor, &x);
    assert_eq!(
        mark_of_y_on(&executor, &x),
        Some(0),
        "created on x's counter 0"
    );

    let read_x = read_of(&mut executor, &x, at(40));
    answer(&mut executor, &read_x, not_found(), at(50));
    assert_eq!(
        mark_of_y_on(&executor, &x),
        Some(crate::engine::transition::ABSENT_DEPENDENCY_MARK),
        "whatever appears under x's name later counts as modified"
    );
}

/// [`a_dependent_forgets_its_mark_on_an_item_found_gone`] when the
/// dependent's own result comes in the same batch: the value that result
/// gives it forgets the mark too.
#[test]
fn a_dependent_answering_in_the_same_batch_forgets_its_mark_on_an_item_found_gone() {
    let mut executor = connected_readable();
    let x = item("x", 1);
    x_and_its_dependent_created(&mut executor, &x);

    let effects = submit(
        &mut executor,
        vec![x.clone(), recreated_with(&x, 2)],
        at(40),
    );
    let modify_y = orders(&effects.sends).remove(0);
    assert_eq!(modify_y.kind, OperationKind::Modify);
    let read_x = read_of(&mut executor, &x, at(50));
    let result = |order: &OperationOrder, outcome| AgentResult {
        session_id: 1,
        op_id: order.op_id.clone(),
        attempt: order.attempt,
        outcome,
    };
    executor.results(
        vec![result(&modify_y, done()), result(&read_x, not_found())],
        at(60),
    );
    executor.committed(at(60));
    assert_eq!(
        mark_of_y_on(&executor, &x),
        Some(crate::engine::transition::ABSENT_DEPENDENCY_MARK),
        "y's new value forgets its mark on x"
    );
}

/// A READ resolving a lost Modify that only takes a property away cannot
/// tell whether it applied (agents may report properties the intent does
/// not set): the Modify is asked again under its op id, not taken as
/// applied while the item still has the property.
#[test]
fn a_read_cannot_confirm_a_lost_modify_that_only_removes_a_property() {
    let mut executor = connected_readable();
    let mut with_extra = item("a", 1);
    with_extra.properties.insert("extra".into(), 7.into());
    let effects = submit(&mut executor, vec![with_extra.clone()], at(10));
    let create = orders(&effects.sends).remove(0);
    answer(&mut executor, &create, done(), at(20));

    let effects = submit(&mut executor, vec![item("a", 1)], at(30));
    let modify = orders(&effects.sends).remove(0);
    assert_eq!(modify.kind, OperationKind::Modify);
    let read = lose_and_read_back(&mut executor);

    // The item still has the property the Modify takes away.
    let effects = answer_on(
        &mut executor,
        2,
        &read,
        done_observing(with_extra.properties.clone()),
        at(60),
    );
    let again = orders(&effects.sends).remove(0);
    assert_eq!(
        (again.kind, again.op_id.as_str()),
        (OperationKind::Modify, modify.op_id.as_str())
    );
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Modifying));
}

/// A ready operation that found no room (a READ holds its type's only
/// slot) keeps the tenant from Ready through later passes that do not
/// plan it, until it runs (seed 23389: Ready while a retry waited for
/// room).
#[test]
fn an_operation_waiting_for_room_keeps_the_tenant_from_ready() {
    let mut executor = connected_with_one_slot(readable());
    let mut x = item("x", 1);
    x.external = true;
    let effects = submit(
        &mut executor,
        vec![x.clone(), item("a", 1), item("b", 1)],
        at(10),
    );
    let create = orders(&effects.sends).remove(0);
    let effects = answer(&mut executor, &create, done(), at(20));
    let create = orders(&effects.sends).remove(0);
    answer(&mut executor, &create, done(), at(30));
    external_put(&mut executor, &x, at(40));
    assert!(ready(&executor));

    let (effects, _) = executor.reconcile(true, at(50));
    executor.committed(at(50));
    let read = orders(&effects.sends).remove(0);
    assert_eq!(read.kind, OperationKind::Read);
    let other = other_than(read.item.identity.name());
    let effects = submit(
        &mut executor,
        vec![
            x.clone(),
            item(read.item.identity.name(), 1),
            item(other, 2),
        ],
        at(60),
    );
    assert!(
        orders(&effects.sends).is_empty(),
        "the Modify waits for the READ's slot"
    );
    assert!(!ready(&executor));

    // A pass about something else (an operation of another type ends)
    // leaves the Modify waiting for room.
    register_listed(&mut executor, 2, "other agent", spec_of("u"), at(70));
    let c = |version: i64| item_of("u", "c", version);
    let intent = |c: Item| {
        vec![
            x.clone(),
            item(read.item.identity.name(), 1),
            item(other, 2),
            c,
        ]
    };
    let effects = submit(&mut executor, intent(c(1)), at(80));
    let create_c = orders(&effects.sends).remove(0);
    assert_eq!(create_c.item.identity.name().as_ref(), "c");
    answer_on(&mut executor, 2, &create_c, done(), at(90));
    assert!(!ready(&executor), "the Modify still waits for room");

    // The READ ends: the Modify runs.
    let effects = answer(
        &mut executor,
        &read,
        done_observing(read.item.properties.clone()),
        at(100),
    );
    let modify = orders(&effects.sends).remove(0);
    assert_eq!(
        (modify.kind, modify.item.identity.name().as_ref()),
        (OperationKind::Modify, other)
    );
}

/// Operations waiting for room when their agent leaves wait for a
/// configurator instead (and the tenant can stall), not for room that no
/// session will free.
#[test]
fn operations_waiting_for_room_wait_for_a_configurator_when_their_agent_leaves() {
    let mut executor = connected_with_one_slot(spec());
    let effects = submit(&mut executor, vec![item("a", 1), item("b", 1)], at(10));
    let sent = orders(&effects.sends);
    assert_eq!(sent.len(), 1, "one slot");
    let queued = other_than(sent[0].item.identity.name());
    executor.session_closed(1, "gone", at(20));
    executor.committed(at(20));
    let waits = |name: &str| {
        executor
            .model()
            .waiting
            .get(&ItemRef::new("t", name))
            .map(|waiting| waiting.reason)
    };
    assert_eq!(
        waits(queued),
        Some(crate::engine::plan::WaitReason::NoConfigurator)
    );
}

/// `p` and `n` are of type `t`, `d` of type `u` relies on `p`. Removing
/// `p` and `d` while adding `n`: `d`'s Delete runs first, `p`'s waits for
/// it, and `n`'s Create waits for `p`'s (a Create waits for its plan's
/// Deletes of the same type, DESIGN 3 rule 8). `d`'s Delete then fails
/// for good, so `p`'s cannot run: `n`, which only `p`'s result would have
/// woken, is planned again and created, as a plan made afresh would.
#[test]
fn a_create_behind_a_delete_that_can_no_longer_run_is_planned_again() {
    let mut executor = connected();
    register_with(
        &mut executor,
        2,
        "agent-u",
        spec_of("u"),
        Outstanding::Unsaid,
        at(0),
    );
    let d = item_of("u", "d", 1).depends_on(on("t/p"));
    let effects = submit(&mut executor, vec![item("p", 1), d], at(10));
    let create_p = orders(&effects.sends).remove(0);
    let effects = answer(&mut executor, &create_p, done(), at(20));
    let create_d = orders(&effects.sends).remove(0);
    answer_on(&mut executor, 2, &create_d, done(), at(30));
    assert!(ready(&executor), "p, and d on p");

    let effects = submit(&mut executor, vec![item("n", 1)], at(40));
    let delete_d = orders(&effects.sends).remove(0);
    assert_eq!(
        (delete_d.kind, delete_d.item.identity.name().as_ref()),
        (OperationKind::Delete, "d"),
        "only d's Delete runs first"
    );
    let n = ItemRef::new("t", "n");
    let waits_for_p = |executor: &Executor| {
        executor
            .model()
            .waiting
            .get(&n)
            .is_some_and(|w| w.blocked_by.iter().any(|b| b.item.name().as_ref() == "p"))
    };
    assert!(waits_for_p(&executor), "n's Create waits for p's Delete");

    let failed = AgentOutcome::Failed(OperationError {
        code: code::FAILED_PRECONDITION,
        message: "d is in use".into(),
    });
    let mut sent = orders(&answer_on(&mut executor, 2, &delete_d, failed, at(50)).sends);
    if let Some(effects) = executor.follow_up(at(50)) {
        executor.committed(at(50));
        sent.extend(orders(&effects.sends));
    }
    assert!(
        sent.iter()
            .any(|o| o.kind == OperationKind::Create && o.item.name().as_ref() == "n"),
        "n is created: p's Delete waits behind d's failure and holds nothing; sent {sent:?}"
    );
    assert!(!waits_for_p(&executor));
}

/// Session 1's DONE to every order of `batch`, in one batch of results;
/// the commit becomes durable.
fn answer_all(executor: &mut Executor, batch: &[OperationOrder], now: Now) -> Effects {
    let results = batch
        .iter()
        .map(|order| AgentResult {
            session_id: 1,
            op_id: order.op_id.clone(),
            attempt: order.attempt,
            outcome: done(),
        })
        .collect();
    let effects = executor.results(results, now);
    executor.committed(now);
    effects
}

/// Answers DONE to `batch` and to every order that follows, each batch
/// 10 ms after the one before, from `now` (ms) until none comes. Returns
/// the time of the last batch.
fn answer_until_quiet(
    executor: &mut Executor,
    mut batch: Vec<OperationOrder>,
    mut now: u64,
) -> u64 {
    while !batch.is_empty() {
        now += 10;
        batch = orders(&answer_all(executor, &batch, at(now)).sends);
    }
    now
}

/// [`answer_until_quiet`] with each order answered on the session
/// `session_of` names, one order at a time.
fn answer_until_quiet_on(
    executor: &mut Executor,
    mut batch: Vec<OperationOrder>,
    mut now: u64,
    session_of: impl Fn(&OperationOrder) -> u64,
) -> u64 {
    while !batch.is_empty() {
        now += 10;
        let mut next = Vec::new();
        for order in &batch {
            let answered = answer_on(executor, session_of(order), order, done(), at(now));
            next.extend(orders(&answered.sends));
        }
        batch = next;
    }
    now
}

/// What `item` waits for, as "blocker: why" lines in order; empty when it
/// does not wait.
fn why_waits(executor: &Executor, item: &ItemRef) -> Vec<String> {
    executor
        .model()
        .waiting
        .get(item)
        .map(|waiting| {
            let mut why: Vec<String> = waiting
                .blocked_by
                .iter()
                .map(|blocker| format!("{}: {}", blocker.item, blocker.why))
                .collect();
            why.sort();
            why
        })
        .unwrap_or_default()
}

/// If `hub`'s Delete waits, it names exactly the dependents left.
fn assert_names_the_dependents_left(executor: &Executor, hub: &ItemRef) {
    let Some(waiting) = executor.model().waiting.get(hub) else {
        return;
    };
    let mut named: Vec<String> = waiting
        .blocked_by
        .iter()
        .map(|blocker| blocker.item.name().to_string())
        .collect();
    named.sort();
    let left: Vec<String> = executor
        .model()
        .current
        .dependents_of(hub)
        .map(|dependent| dependent.name().to_string())
        .collect();
    assert_eq!(named, left, "{hub}'s Delete names the dependents left");
}

/// Deleting a hub's dependents costs each of them its own neighbours. The
/// hub's Delete waits for them all and names those left, and it is planned
/// again once, when the last is gone, not on every dependent's Delete: each
/// such pass examined every dependent left, O(N²) for the whole.
#[test]
fn a_hubs_delete_names_the_dependents_left_and_is_planned_again_when_the_last_is_gone() {
    const DEPENDENTS: usize = 200;
    let mut spec = spec();
    spec.max_in_flight = 4;
    let mut executor = executor();
    register_listed(&mut executor, 1, "agent", spec, at(0));
    let hub = item("hub", 1);
    let hub_ref = hub.item_ref();
    let mut intent = vec![hub];
    intent.extend((0..DEPENDENTS).map(|i| item(&format!("d{i:03}"), 1).depends_on(on("t/hub"))));
    let created = orders(&submit(&mut executor, intent, at(10)).sends);
    let mut now = answer_until_quiet(&mut executor, created, 10);
    assert!(ready(&executor), "the hub and its dependents are created");

    let examined_before = executor.items_examined();
    now += 10;
    let mut effects = submit(&mut executor, Vec::new(), at(now));
    let mut deleted = 0;
    loop {
        let batch = orders(&effects.sends);
        assert!(
            !batch.is_empty(),
            "the Deletes stopped with {deleted} of {DEPENDENTS} dependents deleted"
        );
        if batch.iter().any(|order| order.item.item_ref() == hub_ref) {
            assert_eq!(batch.len(), 1, "the hub goes last, alone");
            break;
        }
        now += 10;
        effects = answer_all(&mut executor, &batch, at(now));
        deleted += batch.len();
        if deleted == DEPENDENTS / 2 {
            // A full pass plans the hub again while some Deletes run: it
            // still names them all, the running ones and those to come.
            let (full, _) = executor.reconcile(false, at(now));
            executor.committed(at(now));
            assert!(orders(&full.sends).is_empty(), "the room is full");
        }
        if deleted < DEPENDENTS {
            assert!(
                executor.model().waiting.get(&hub_ref).is_some(),
                "the hub's Delete waits"
            );
            assert_names_the_dependents_left(&executor, &hub_ref);
        }
    }
    assert_eq!(deleted, DEPENDENTS);
    let examined = executor.items_examined() - examined_before;
    assert!(
        examined <= 5 * DEPENDENTS as u64,
        "{examined} items examined to delete a hub's {DEPENDENTS} dependents"
    );
}

/// A hub removed from the intent before its dependents (a controller that
/// tears down a network, then its ports, each in a request of its own):
/// the hub's Delete takes its dependents along, and those still intended
/// wait to be created again. Each batch of their Deletes costs the pass
/// its own items: it neither examines the hub again (and, through its
/// Delete, every dependent left) nor wakes every waiting Create with the
/// Delete of their type that just ran (rule 8 cannot let them run while
/// their dependency is out of the intent). O(N) per batch, O(N²) in all,
/// before.
#[test]
fn a_hub_removed_first_costs_each_batch_of_its_dependents_their_own_items() {
    const DEPENDENTS: usize = 400;
    const PARTS: usize = 4;
    let mut spec = spec();
    spec.max_in_flight = 4;
    let mut executor = executor();
    register_listed(&mut executor, 1, "agent", spec, at(0));
    let part = |p: usize| -> Vec<Item> {
        (p * DEPENDENTS / PARTS..(p + 1) * DEPENDENTS / PARTS)
            .map(|i| item(&format!("d{i:03}"), 1).depends_on(on("t/hub")))
            .collect()
    };
    let now = 10;
    let mut batch =
        orders(&submit_subgraph(&mut executor, "hub", vec![item("hub", 1)], at(now)).sends);
    for p in 0..PARTS {
        batch.extend(orders(
            &submit_subgraph(&mut executor, &format!("part-{p}"), part(p), at(now)).sends,
        ));
    }
    let mut now = answer_until_quiet(&mut executor, batch, now);
    assert!(ready(&executor), "the hub and its dependents are created");

    let examined_before = executor.items_examined();
    let hub_ref = ItemRef::new("t", "hub");
    now += 10;
    let mut batch = orders(&submit_subgraph(&mut executor, "hub", Vec::new(), at(now)).sends);
    let mut parts_removed = 0;
    let mut batches = 0;
    while !batch.is_empty() {
        now += 10;
        batch = orders(&answer_all(&mut executor, &batch, at(now)).sends);
        if let Some(effects) = executor.follow_up(at(now)) {
            executor.committed(at(now));
            batch.extend(orders(&effects.sends));
        }
        batches += 1;
        if batches == 21 {
            // A dependent planned for deletion along with the hub (again,
            // after the second part left the intent), while others'
            // Deletes run, waits to be created again for the hub alone,
            // not for the Deletes of its type.
            let waiting = executor
                .model()
                .waiting
                .get(&ItemRef::new("t", "d200"))
                .expect("d200 waits to be created again");
            let blockers: Vec<(&str, &str)> = waiting
                .blocked_by
                .iter()
                .map(|blocker| (blocker.item.name().as_ref(), blocker.why.as_ref()))
                .collect();
            assert_eq!(blockers, [("hub", "planned for deletion")]);
        }
        if batches % 10 == 0 && parts_removed < PARTS {
            let removed = format!("part-{parts_removed}");
            batch.extend(orders(
                &submit_subgraph(&mut executor, &removed, Vec::new(), at(now)).sends,
            ));
            parts_removed += 1;
        }
        // The hub's Delete, planned again or not, names the dependents left.
        assert_names_the_dependents_left(&executor, &hub_ref);
    }
    assert_eq!(
        parts_removed, PARTS,
        "every part was removed before the end"
    );
    assert!(ready(&executor), "everything is gone");
    assert_eq!(executor.model().current.iter().count(), 0);
    let examined = executor.items_examined() - examined_before;
    assert!(
        examined <= 6 * DEPENDENTS as u64,
        "{examined} items examined to delete a hub and its {DEPENDENTS} dependents, hub first"
    );
}

/// A dependent whose Delete an earlier pass planned along with its
/// dependency's (the dependency left the intent while the dependent's new
/// dependency was not created yet) is retargeted when a later pass finds
/// it can be (rule 7), not deleted as that earlier pass had it: the pass
/// on the new dependency's Create examines the dependency that goes.
#[test]
fn a_dependent_deleted_along_with_its_dependency_is_retargeted_once_it_can_be() {
    let mut executor = executor();
    register_listed(&mut executor, 1, "agent", spec(), at(0));
    // x is of another type: its Create does not wait for t's Deletes.
    register_listed(&mut executor, 2, "agent-u", spec_of("u"), at(0));
    let (hub, d, e, x) = (
        || item("hub", 1),
        |on_what: &str| item("d", 1).depends_on(on(on_what)),
        || item("e", 1).depends_on(on("t/d")),
        || item_of("u", "x", 1),
    );
    let created = orders(&submit(&mut executor, vec![hub(), d("t/hub"), e()], at(10)).sends);
    let mut now = answer_until_quiet(&mut executor, created, 10);
    assert!(ready(&executor));

    // The hub leaves the intent and d moves to x, which does not exist yet:
    // d cannot be retargeted, so it goes with the hub, after e.
    now += 10;
    let sent = orders(&submit(&mut executor, vec![d("u/x"), e(), x()], at(now)).sends);
    let labels = |orders: &[OperationOrder]| -> Vec<String> {
        let mut labels: Vec<String> = orders
            .iter()
            .map(|o| format!("{} {}", o.kind.as_str(), o.item.item_ref()))
            .collect();
        labels.sort();
        labels
    };
    assert_eq!(labels(&sent), ["create u/x", "delete t/e"]);
    let create_x = sent
        .iter()
        .find(|o| o.kind == OperationKind::Create)
        .expect("x");
    let delete_e = sent
        .iter()
        .find(|o| o.kind == OperationKind::Delete)
        .expect("e");

    // x exists now, and e's Delete still runs: d can keep existing,
    // modified to rely on x once e is gone, and the hub waits for it.
    now += 10;
    let sent = orders(&answer_on(&mut executor, 2, create_x, done(), at(now)).sends);
    assert!(sent.is_empty(), "{:?}", labels(&sent));
    let d_waits = executor
        .model()
        .waiting
        .get(&ItemRef::new("t", "d"))
        .expect("d waits for e");
    assert_eq!(d_waits.operation, OperationKind::Modify, "{d_waits:?}");
    now += 10;
    let sent = orders(&answer(&mut executor, delete_e, done(), at(now)).sends);
    assert_eq!(labels(&sent), ["modify t/d"]);
}

/// A dependent's Delete that fails wakes the Delete waiting for it, even
/// though the dependent left the intent (a dependent that only left the
/// intent, idle, does not): the waiting Delete shows what became of it.
#[test]
fn a_failed_delete_of_a_dependent_out_of_the_intent_wakes_the_delete_waiting_for_it() {
    let mut executor = executor();
    register_listed(&mut executor, 1, "agent", spec(), at(0));
    let intent = vec![
        item("hub", 1),
        item("d1", 1).depends_on(on("t/hub")),
        item("d2", 1).depends_on(on("t/hub")),
    ];
    let created = orders(&submit(&mut executor, intent, at(10)).sends);
    let mut now = answer_until_quiet(&mut executor, created, 10);
    assert!(ready(&executor));

    now += 10;
    let deletes = orders(&submit(&mut executor, Vec::new(), at(now)).sends);
    assert_eq!(deletes.len(), 2, "both dependents' Deletes run first");
    let hub = ItemRef::new("t", "hub");
    let why_for = |executor: &Executor, name: &str| -> String {
        let waiting = executor.model().waiting.get(&hub).expect("the hub waits");
        waiting
            .blocked_by
            .iter()
            .find(|blocker| blocker.item.name().as_ref() == name)
            .map(|blocker| blocker.why.to_string())
            .unwrap_or_default()
    };
    let d1 = deletes
        .iter()
        .find(|order| order.item.item_ref().name().as_ref() == "d1")
        .expect("d1's Delete");
    let failed = AgentOutcome::Failed(OperationError {
        code: code::UNAVAILABLE,
        message: "try again".into(),
    });
    now += 10;
    answer(&mut executor, d1, failed, at(now));
    let why = why_for(&executor, "d1");
    assert!(
        why.contains("wait") || why.contains("fail"),
        "the hub shows d1's failed Delete, not {why:?}"
    );
}

/// Lost operations sent again, and the READs that resolve them, take room
/// like any other operation (DESIGN 4, `max_in_flight`): an agent back
/// with less room than it had operations in flight gets the rest as room
/// frees, each lost operation under its own op id.
#[test]
fn lost_operations_sent_again_wait_for_room() {
    for readable in [false, true] {
        let mut spec = spec();
        spec.supports_read = readable;
        spec.max_in_flight = 2;
        let mut executor = executor();
        register_listed(&mut executor, 1, "agent", spec.clone(), at(0));
        let effects = submit(&mut executor, vec![item("a", 1), item("b", 1)], at(10));
        let lost = orders(&effects.sends);
        assert_eq!(lost.len(), 2);
        executor.session_closed(1, "gone", at(20));
        executor.committed(at(20));

        spec.max_in_flight = 1;
        let effects = register_listed(&mut executor, 2, "agent", spec, at(30));
        let sent = orders(&effects.sends);
        assert_eq!(sent.len(), 1, "one slot, one of the two goes out");
        let first = sent[0].item.name().to_string();
        let other = other_than(&first);
        assert_eq!(state_of(&executor, other), Some(ItemState::Unknown));
        assert!(
            executor.redeliver_deferred(at(31)).is_none(),
            "no room until the first one ends"
        );

        // The first one ends (DONE; a READ finding the lost Create's value).
        let outcome = if readable {
            done_observing(sent[0].item.properties.clone())
        } else {
            done()
        };
        answer_on(&mut executor, 2, &sent[0], outcome, at(40));
        assert_eq!(state_of(&executor, &first), Some(ItemState::Created));
        let effects = executor
            .redeliver_deferred(at(41))
            .expect("room for the other one");
        executor.committed(at(41));
        let next = orders(&effects.sends);
        assert_eq!(next.len(), 1);
        assert_eq!(&**next[0].item.name(), other);
        if readable {
            assert_eq!(next[0].kind, OperationKind::Read);
        } else {
            let lost_other = lost.iter().find(|order| **order.item.name() == *other);
            assert_eq!(
                Some(next[0].op_id.as_str()),
                lost_other.map(|order| order.op_id.as_str()),
                "sent again under its op id"
            );
        }
    }
}

/// An item whose lost operation runs again on a live session gets no READ
/// when that operation's cancel goes unanswered, even if a registration
/// had put off its READ for room earlier: DESIGN 4, no new operation until
/// the old one reports or its session ends (simulator seed 145486, where
/// the READ found nothing while the Create still ran, and a dependency was
/// deleted under it).
#[test]
fn a_read_put_off_for_room_is_not_sent_while_the_lost_operation_runs_again() {
    let mut spec = readable();
    spec.max_in_flight = 1;
    let mut executor = executor();
    register_listed(&mut executor, 1, "agent", spec.clone(), at(0));
    submit(&mut executor, vec![item("a", 1)], at(10));
    executor.session_closed(1, "gone", at(20));
    executor.committed(at(20));
    // Session 2 gets a READ to resolve the lost Create.
    let effects = register_listed(&mut executor, 2, "agent", spec.clone(), at(30));
    assert_eq!(orders(&effects.sends)[0].kind, OperationKind::Read);

    // Session 3 replaces it: session 2's READ still holds the one slot, so
    // the READ session 3 would need is put off.
    let effects = register_listed(&mut executor, 3, "agent", spec.clone(), at(40));
    let sent = orders(&effects.sends);
    assert!(sent.is_empty(), "no room yet: {sent:?}");

    // Session 2's READ times out: it cannot tell, so the lost Create is
    // sent again, to session 3. Then the item's intent changes, which
    // cancels it, and the cancel goes unanswered: the item is UNKNOWN
    // again.
    let effects = executor.on_timer(at(30 + TIMEOUT_MS));
    executor.committed(at(30 + TIMEOUT_MS));
    let again = orders(&effects.sends);
    assert_eq!(again.len(), 1);
    assert_eq!(
        again[0].kind,
        OperationKind::Create,
        "the lost Create again"
    );
    let changed_at = 31 + TIMEOUT_MS;
    submit(&mut executor, vec![item("a", 2)], at(changed_at));
    executor.committed(at(changed_at));
    let cancel_expired_at = changed_at + 5_000;
    executor.on_timer(at(cancel_expired_at));
    executor.committed(at(cancel_expired_at));
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Unknown));

    // There is room now, but session 3 may still run the Create: nothing
    // is sent for the item before it reports or session 3 ends.
    let sent = executor
        .redeliver_deferred(at(cancel_expired_at + 1))
        .map(|effects| orders(&effects.sends))
        .unwrap_or_default();
    assert!(sent.is_empty(), "{sent:?}");

    // Once session 3 ends, the next registration reads it.
    executor.session_closed(3, "gone", at(cancel_expired_at + 2));
    executor.committed(at(cancel_expired_at + 2));
    let effects = register_listed(&mut executor, 4, "agent", spec, at(cancel_expired_at + 3));
    let read = orders(&effects.sends);
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].kind, OperationKind::Read);
}

/// A lost operation the agent lists as still running goes out at once,
/// room or not: sending it again attaches to what already runs there.
#[test]
fn lost_operations_the_agent_still_runs_are_sent_again_whatever_the_room() {
    let mut spec = spec();
    spec.max_in_flight = 2;
    let mut executor = executor();
    register_listed(&mut executor, 1, "agent", spec.clone(), at(0));
    let effects = submit(&mut executor, vec![item("a", 1), item("b", 1)], at(10));
    let lost = orders(&effects.sends);
    executor.session_closed(1, "gone", at(20));
    executor.committed(at(20));

    spec.max_in_flight = 1;
    let still_running = lost.iter().map(|order| order.op_id.clone()).collect();
    let effects = register_with(
        &mut executor,
        2,
        "agent",
        spec,
        Outstanding::Listed(still_running),
        at(30),
    );
    let mut sent: Vec<String> = orders(&effects.sends)
        .into_iter()
        .map(|order| order.op_id)
        .collect();
    sent.sort();
    let mut expected: Vec<String> = lost.into_iter().map(|order| order.op_id).collect();
    expected.sort();
    assert_eq!(sent, expected, "both attach to what the agent runs");
}

/// An item kept behind another's Delete waiting for room ("its delete
/// runs first") while it also waits for something else is planned again
/// when that Delete, taken from the queue, no longer runs: here its retry
/// time is ahead again after the wall clock stepped back. The waiter must
/// show the backoff, not a Delete that no result will end (seed 150801).
#[test]
fn a_waiter_behind_a_queued_delete_that_waits_again_shows_what_it_waits_for() {
    let mut executor = connected_with_one_slot(spec());
    let intent = vec![
        item("p", 1),
        item("d", 1).depends_on(on("t/p")),
        item("e", 1).depends_on(on("t/p")),
        item("x", 1),
    ];
    let created = orders(&submit(&mut executor, intent, at(10)).sends);
    let mut now = answer_until_quiet(&mut executor, created, 10);
    assert!(ready(&executor));

    // p, d and e leave the intent: d's and e's Deletes run first (one at
    // a time), p's waits for them. The agent answers WAIT to both: d's
    // retries after 1 s, e's after 10 minutes.
    now += 10;
    let delete_d = orders(&submit(&mut executor, vec![item("x", 1)], at(now)).sends).remove(0);
    assert_eq!(delete_d.item.item_ref(), ItemRef::new("t", "d"));
    let wait = |retry_after_ms| AgentOutcome::Wait { retry_after_ms };
    now += 10;
    let d_retry_at = now + 1_000;
    let delete_e = orders(&answer(&mut executor, &delete_d, wait(1_000), at(now)).sends).remove(0);
    assert_eq!(delete_e.item.item_ref(), ItemRef::new("t", "e"));
    now += 10;
    answer(&mut executor, &delete_e, wait(600_000), at(now));
    // x's Modify takes the one slot.
    now += 10;
    let modify_x = orders(&submit(&mut executor, vec![item("x", 2)], at(now)).sends).remove(0);

    // d's retry time comes: its Delete is ready and waits for room. p's
    // Delete waits for it to run first, and for e's backoff.
    let effects = executor.on_timer(at(d_retry_at));
    executor.committed(at(d_retry_at));
    assert!(orders(&effects.sends).is_empty(), "no room for d's Delete");
    let p = ItemRef::new("t", "p");
    let why_p = |executor: &Executor| why_waits(executor, &p);
    assert_eq!(
        why_p(&executor),
        [
            "t/d: its delete runs first",
            "t/e: its delete waits (backoff)"
        ]
    );

    // The wall clock steps back 30 s; then x's Modify ends and frees the
    // slot. d's Delete, taken from the queue, waits for its retry time
    // again.
    let stepped_back = |mono_ms: u64| Now {
        wall_ms: WALL_START + mono_ms - 30_000,
        mono_ms,
    };
    now = d_retry_at + 10;
    let mut sent = orders(&answer(&mut executor, &modify_x, done(), stepped_back(now)).sends);
    while let Some(effects) = executor.follow_up(stepped_back(now)) {
        executor.committed(stepped_back(now));
        sent.extend(orders(&effects.sends));
    }
    assert!(
        sent.is_empty(),
        "d's Delete waits for its retry time: {sent:?}"
    );
    let d_waits = executor
        .model()
        .waiting
        .get(&ItemRef::new("t", "d"))
        .map(|waiting| waiting.reason);
    assert_eq!(d_waits, Some(crate::engine::plan::WaitReason::Backoff));
    assert_eq!(
        why_p(&executor),
        [
            "t/d: its delete waits (backoff)",
            "t/e: its delete waits (backoff)"
        ],
        "p shows the backoff d's Delete waits for"
    );

    // When the wall clock reaches the retry time, d's Delete runs.
    let wake = executor
        .next_wakeup(stepped_back(now))
        .expect("a wake-up for d's retry");
    let effects = executor.on_timer(stepped_back(wake));
    executor.committed(stepped_back(wake));
    let sent = orders(&effects.sends);
    assert!(
        sent.iter()
            .any(|order| order.kind == OperationKind::Delete && order.item.name().as_ref() == "d"),
        "d's Delete runs at its retry time: {sent:?}"
    );
}

/// `p`, `e` and `g` are of type `t` (one operation at a time, recreated on
/// any change), `d` and `s` of type `u`, `h` of type `v`; `d` and `h` rely
/// on `p`, `e` on `d`. `p`, `d` and `h` leave the intent and `e` changes to
/// rely on a new `s`, which relies on `d`, while `g`'s Delete holds `t`'s
/// slot and `v` has no agent. `e`'s Delete (of its recreate) waits for
/// room, `d`'s for `e`'s, `h`'s for a configurator. `p`'s Delete waits for
/// both: "its delete runs first" of `d`. `u`'s agent leaves; then `g`'s Delete ends. The plan
/// that takes `e`'s Delete from the queue reaches `d` through `e`'s new
/// value and `s`, and `d`'s Delete now waits for a configurator: `p`,
/// which that plan did not reach, is planned again and shows it, not that
/// `d`'s Delete runs first (seed 24248).
#[test]
fn a_waiter_of_a_delete_that_loses_its_configurator_shows_what_it_waits_for() {
    let mut spec = spec();
    spec.max_in_flight = 1;
    spec.recreate_on_change = vec!["*".into()];
    let mut executor = executor();
    register_listed(&mut executor, 1, "agent", spec, at(0));
    register_listed(&mut executor, 2, "agent-u", spec_of("u"), at(0));
    register_listed(&mut executor, 3, "agent-v", spec_of("v"), at(0));
    let session_of = |order: &OperationOrder| match order.item.item_type().as_ref() {
        "u" => 2,
        "v" => 3,
        _ => 1,
    };
    let intent = vec![
        item("p", 1),
        item_of("u", "d", 1).depends_on(on("t/p")),
        item_of("v", "h", 1).depends_on(on("t/p")),
        item("e", 1).depends_on(on("u/d")),
        item("g", 1),
    ];
    let created = orders(&submit(&mut executor, intent.clone(), at(10)).sends);
    let mut now = answer_until_quiet_on(&mut executor, created, 10, session_of);
    assert!(ready(&executor), "p, d and h on p, e on d, and g");

    now += 10;
    let without_g = intent[..4].to_vec();
    let delete_g = orders(&submit(&mut executor, without_g, at(now)).sends).remove(0);
    assert_eq!(delete_g.item.item_ref(), ItemRef::new("t", "g"));
    now += 10;
    executor.session_closed(3, "gone", at(now));
    executor.committed(at(now));
    let changed = vec![
        item("e", 2).depends_on(on("u/s")),
        item_of("u", "s", 1).depends_on(on("u/d")),
    ];
    let sent = orders(&submit(&mut executor, changed, at(now)).sends);
    assert!(sent.is_empty(), "g's Delete holds t's slot: {sent:?}");
    let p = ItemRef::new("t", "p");
    let why_p = |executor: &Executor| why_waits(executor, &p);
    assert_eq!(
        why_p(&executor),
        [
            "u/d: its delete runs first",
            "v/h: its delete waits (no configurator)"
        ]
    );

    now += 10;
    executor.session_closed(2, "gone", at(now));
    executor.committed(at(now));
    now += 10;
    answer(&mut executor, &delete_g, done(), at(now));
    while executor.follow_up(at(now)).is_some() {
        executor.committed(at(now));
    }
    let d_waits = executor
        .model()
        .waiting
        .get(&ItemRef::new("u", "d"))
        .map(|waiting| waiting.reason);
    assert_eq!(
        d_waits,
        Some(crate::engine::plan::WaitReason::NoConfigurator),
        "the plan of e's Delete reached d"
    );
    assert!(
        !why_p(&executor).contains(&"u/d: its delete runs first".to_owned()),
        "p shows what d's Delete waits for, not that it runs first: {:?}",
        why_p(&executor)
    );
}

/// A chain `f` → `e` → `d` (type `t`) → `c` (type `u`, recreated on any
/// change). `c` changes: its recreate deletes `d`, `e` and `f` first, and
/// `f`'s Delete fails for good. Then the intent takes `c`'s change back:
/// nothing needs deleting any more, and `f` is planned again and no longer
/// shows the failure of a Delete no plan would make, though the change
/// named neither `f` nor what it relies on (the shape of seed 233954,
/// whose planner rule `a_dependent_whose_delete_failed_for_good_learns_that_its_cause_went`
/// pins).
#[test]
fn a_delete_failed_for_good_is_planned_again_when_its_cause_goes() {
    let mut executor = connected();
    let mut recreated = spec_of("u");
    recreated.recreate_on_change = vec!["*".into()];
    register_with(
        &mut executor,
        2,
        "agent-u",
        recreated,
        Outstanding::Unsaid,
        at(0),
    );
    let intent = |c_version| {
        vec![
            item_of("u", "c", c_version),
            item("d", 1).depends_on(on("u/c")),
            item("e", 1).depends_on(on("t/d")),
            item("f", 1).depends_on(on("t/e")),
        ]
    };
    let session_of = |order: &OperationOrder| {
        if order.item.item_type().as_ref() == "u" {
            2
        } else {
            1
        }
    };
    let created = orders(&submit(&mut executor, intent(1), at(10)).sends);
    let mut now = answer_until_quiet_on(&mut executor, created, 10, session_of);
    assert!(ready(&executor), "c, d on c, e on d, f on e");

    now += 10;
    let sent = orders(&submit(&mut executor, intent(2), at(now)).sends);
    let [delete_f] = sent.as_slice() else {
        panic!("c's recreate deletes f first: {sent:?}");
    };
    assert_eq!(
        (delete_f.kind, delete_f.item.name().as_ref()),
        (OperationKind::Delete, "f")
    );
    now += 10;
    let refused = AgentOutcome::Failed(OperationError {
        code: code::INVALID_ARGUMENT,
        message: "f is in use".into(),
    });
    answer(&mut executor, delete_f, refused, at(now));
    let f = ItemRef::new("t", "f");
    let f_waits = |executor: &Executor| executor.model().waiting.get(&f).map(|w| w.reason);
    assert_eq!(
        f_waits(&executor),
        Some(crate::engine::plan::WaitReason::TerminalFailure)
    );

    now += 10;
    let sent = orders(&submit(&mut executor, intent(1), at(now)).sends);
    while executor.follow_up(at(now)).is_some() {
        executor.committed(at(now));
    }
    assert!(sent.is_empty(), "nothing to do: {sent:?}");
    assert_eq!(
        f_waits(&executor),
        None,
        "f's Delete is no longer needed: it waits for nothing"
    );
    assert!(ready(&executor), "every item holds its intent");
}

/// `x` goes with the external item `e` (`auto_deleted_by_external`), and
/// `y` is recreated whenever `x` is modified. Both created; then a
/// refreshing reconcile at 40 reads them, `y`'s READ answered at once, and
/// `x`'s still running. Returns the executor, `e`, `x` and `y`.
fn x_on_e_read_while_y_relies_on_it() -> (Executor, Item, Item, Item) {
    let mut executor = connected_readable();
    let mut e = item("e", 1);
    e.external = true;
    let x = item("x", 1).depends_on(on("t/e").with_auto_deleted_by_external(true));
    let y = recreated_with(&x, 1);
    submit(&mut executor, vec![e.clone(), x.clone(), y.clone()], at(10));
    let effects = external_put(&mut executor, &e, at(20));
    let create_x = orders(&effects.sends).remove(0);
    let effects = answer(&mut executor, &create_x, done(), at(25));
    let create_y = orders(&effects.sends).remove(0);
    answer(&mut executor, &create_y, done(), at(30));
    assert!(ready(&executor), "x on e, y on x");
    assert_eq!(mark_of_y_on(&executor, &x), Some(0));

    let (effects, _) = executor.reconcile(true, at(40));
    executor.committed(at(40));
    let reads = orders(&effects.sends);
    assert!(
        reads
            .iter()
            .any(|order| order.item.item_ref() == x.item_ref()),
        "x is read"
    );
    if let Some(read_y) = reads
        .iter()
        .find(|order| order.item.item_ref() == y.item_ref())
    {
        answer(
            &mut executor,
            read_y,
            done_observing(y.properties.clone()),
            at(41),
        );
    }
    (executor, e, x, y)
}

/// [`x_on_e_read_while_y_relies_on_it`], then `e` vanishes while `x`'s
/// READ runs: `x` went with it whatever the READ finds, and `y`'s Delete
/// goes out (returned).
fn e_vanishes_while_x_is_read() -> (Executor, Item, Item, OperationOrder) {
    let (mut executor, e, x, y) = x_on_e_read_while_y_relies_on_it();
    let effects = external_delete(&mut executor, &e, at(50));
    let delete_y = orders(&effects.sends)
        .into_iter()
        .find(|order| order.item.item_ref() == y.item_ref())
        .expect("y goes: x no longer holds");
    assert_eq!(delete_y.kind, OperationKind::Delete);
    (executor, e, x, delete_y)
}

/// `x` left current state, and `y` forgot its mark on it (DESIGN 3, rule
/// 4; planning.md: "an item that goes ... is another item if it comes
/// back, its counter starting over").
fn assert_forgotten_with_x(executor: &Executor, x: &Item) {
    assert!(
        executor.model().current.get(&x.item_ref()).is_none(),
        "x went with e"
    );
    assert_eq!(
        mark_of_y_on(executor, x),
        Some(crate::engine::transition::ABSENT_DEPENDENCY_MARK),
        "whatever appears under x's name later counts as modified"
    );
}

/// `x`'s READ times out after `e` vanished, and `x` leaves current state:
/// `y` must forget its mark on `x`. Kept, `y` (its Delete failed
/// meanwhile) is settled once `e` and a new `x` are back, and never
/// recreated on the new `x`.
#[test]
fn a_dependent_forgets_its_mark_on_an_item_removed_when_its_read_times_out() {
    let (mut executor, _e, x, _delete_y) = e_vanishes_while_x_is_read();
    executor.on_timer(at(40 + TIMEOUT_MS));
    executor.committed(at(40 + TIMEOUT_MS));
    assert_forgotten_with_x(&executor, &x);
}

/// [`a_dependent_forgets_its_mark_on_an_item_removed_when_its_read_times_out`]
/// played to the end: `y`'s Delete fails, `e` comes back, `x` is created
/// again; `y` was created against the `x` that went, and must be
/// recreated, not taken as converged.
#[test]
fn a_dependent_of_an_item_gone_while_read_is_recreated_when_it_comes_back() {
    let (mut executor, e, x, delete_y) = e_vanishes_while_x_is_read();
    let y = delete_y.item.item_ref();
    executor.on_timer(at(40 + TIMEOUT_MS));
    executor.committed(at(40 + TIMEOUT_MS));
    answer(&mut executor, &delete_y, busy(), at(41 + TIMEOUT_MS));

    let effects = external_put(&mut executor, &e, at(42 + TIMEOUT_MS));
    let create_x = orders(&effects.sends)
        .into_iter()
        .find(|order| order.item.item_ref() == x.item_ref())
        .expect("x is created again");
    assert_eq!(create_x.kind, OperationKind::Create);
    let mut y_orders = Vec::new();
    let mut batch = orders(&answer(&mut executor, &create_x, done(), at(43 + TIMEOUT_MS)).sends);
    let mut now = 44 + TIMEOUT_MS;
    for _ in 0..10 {
        now += 2_000;
        batch.extend(orders(
            &{
                let effects = executor.on_timer(at(now));
                executor.committed(at(now));
                effects
            }
            .sends,
        ));
        y_orders.extend(
            batch
                .iter()
                .filter(|order| order.item.item_ref() == y)
                .map(|order| order.kind),
        );
        if batch.is_empty() {
            continue;
        }
        batch = orders(&answer_all(&mut executor, &batch, at(now + 1)).sends);
    }
    assert!(
        y_orders.contains(&OperationKind::Create),
        "y, created against the x that went, is recreated on the new x: {y_orders:?}"
    );
}

/// [`a_dependent_forgets_its_mark_on_an_item_removed_when_its_read_times_out`]
/// when the READ's session ends instead: `x` leaves current state then.
#[test]
fn a_dependent_forgets_its_mark_on_an_item_removed_when_its_reads_session_ends() {
    let (mut executor, _e, x, _delete_y) = e_vanishes_while_x_is_read();
    executor.session_closed(1, "gone", at(60));
    executor.committed(at(60));
    assert_forgotten_with_x(&executor, &x);
}

/// [`a_dependent_forgets_its_mark_on_an_item_removed_when_its_read_times_out`]
/// when the server restarts instead: the READ's outcome is lost with it,
/// and `x` leaves current state as the restarted server loads, `y`'s
/// Delete lost beside it.
#[test]
fn a_dependent_forgets_its_mark_on_an_item_a_restart_takes_for_gone() {
    let (executor, _e, x, _delete_y) = e_vanishes_while_x_is_read();
    let restarted = reloaded(&executor, at(60));
    assert_forgotten_with_x(&restarted, &x);
}

/// [`lost_operations_sent_again_together_send_a_create_after_a_delete_of_its_type`]
/// when a result of the lost Create comes late on the ended session 1
/// (an older epoch): it changes no state and only schedules a
/// re-delivery (DESIGN 4), which waits for `b`'s Delete like the one the
/// registration put off (DESIGN 3, rule 8: two items contending for one
/// resource never race).
#[test]
fn a_stale_result_of_a_lost_create_does_not_send_it_past_a_delete_of_its_type() {
    let mut executor = connected();
    let b = orders(&submit(&mut executor, vec![item("b", 1)], at(5)).sends).remove(0);
    answer_on(&mut executor, 1, &b, done(), at(6));
    let create =
        orders(&submit(&mut executor, vec![item("a", 1), item("b", 1)], at(10)).sends).remove(0);
    let delete = orders(&submit(&mut executor, vec![item("a", 1)], at(15)).sends).remove(0);
    assert_eq!(delete.kind, OperationKind::Delete);
    executor.session_closed(1, "gone", at(20));
    executor.committed(at(20));
    let effects = register_listed(&mut executor, 2, "agent", spec(), at(30));
    assert_eq!(orders(&effects.sends).len(), 1, "the Delete alone");

    let effects = answer_on(&mut executor, 1, &create, busy(), at(35));
    let sent: Vec<(String, OperationKind)> = orders(&effects.immediate)
        .into_iter()
        .chain(orders(&effects.sends))
        .map(|order| (order.op_id, order.kind))
        .collect();
    assert!(
        sent.is_empty(),
        "b's Delete still runs: a's Create waits for it ({sent:?})"
    );
}

// Time, cancels, room and failed commits.

/// Whether `messages` hold a cancel of `op_id`.
fn cancels(messages: &[crate::engine::exec::effects::Message], op_id: &str) -> bool {
    messages
        .iter()
        .any(|message| matches!(&message.message, ToAgent::Cancel { op_id: id } if id == op_id))
}

/// docs/agents.md §7 (the contract the SDK is written to): progress
/// reports reset the server's operation timeout, so a long-running
/// operation (IN_PROGRESS, DESIGN 4) that reports more often than
/// `operation_timeout` is not timed out and cancelled.
#[test]
fn a_progress_report_extends_the_operations_timeout() {
    let mut executor = connected();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    let running = orders(&effects.sends).remove(0);
    answer(&mut executor, &running, AgentOutcome::InProgress, at(20));
    // Progress every 6 s, within the 10 s timeout.
    for ms in [6_000, 12_000, 18_000] {
        assert!(executor.progress(1, &running.op_id, running.attempt, "working".into(), at(ms)));
        let effects = executor.on_timer(at(ms + 1));
        executor.committed(at(ms + 1));
        assert!(
            effects.finished.is_empty() && !cancels(&effects.immediate, &running.op_id),
            "timed out at {} although it reported progress at {ms}: {:?}",
            ms + 1,
            effects.finished
        );
    }
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Creating));
}

/// Progress speaks for an operation only from the session that holds its
/// type, as results do: an older session of the agent, taken over, still
/// sending progress for the operation would keep it from timing out while
/// the session that holds the type now does not run it.
#[test]
fn progress_from_a_session_taken_over_changes_nothing() {
    let mut executor = connected();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    let running = orders(&effects.sends).remove(0);
    answer(&mut executor, &running, AgentOutcome::InProgress, at(20));
    register(&mut executor, 2, "agent", at(30));
    executor.committed(at(30));
    assert!(
        !executor.progress(1, &running.op_id, running.attempt, "old".into(), at(40)),
        "progress from the session taken over was taken"
    );
    assert!(executor.progress(2, &running.op_id, running.attempt, "new".into(), at(50)));
}

/// DESIGN 4: "Each item type gets a fair share of the tenant's in-flight
/// limit, so one slow type cannot starve the others." With a tenant limit
/// of 2 and two types, a slow type (long-running operations) must not hold
/// both slots while the other type's ready operation waits.
#[test]
fn a_slow_type_does_not_take_the_whole_tenant_limit() {
    let mut limited = settings();
    limited.max_operations_in_flight = 2;
    let mut executor = Executor::load(
        IntendedGraph::default(),
        CurrentGraph::default(),
        TenantProgress::default(),
        Vec::new(),
        limited,
        at(0),
    );
    executor
        .register(
            Registration {
                session_id: 1,
                agent_id: "agent".into(),
                types: vec![spec_of("a"), spec_of("b")],
                outstanding: Outstanding::Unsaid,
            },
            at(0),
        )
        .expect("registered");
    executor.committed(at(0));
    let intent = vec![
        item_of("a", "1", 1),
        item_of("a", "2", 1),
        item_of("a", "3", 1),
        item_of("b", "1", 1),
    ];
    let effects = submit(&mut executor, intent, at(10));
    let mut sent = orders(&effects.sends);
    // Type a's operations are long-running.
    for order in sent.clone() {
        if &**order.item.item_type() == "a" {
            answer(&mut executor, &order, AgentOutcome::InProgress, at(20));
        }
    }
    let (effects, _) = executor.reconcile(false, at(30));
    executor.committed(at(30));
    sent.extend(orders(&effects.sends));
    let types: Vec<String> = sent
        .iter()
        .map(|order| order.item.item_ref().to_string())
        .collect();
    assert!(
        sent.iter().any(|order| &**order.item.item_type() == "b"),
        "type b gets no share of the tenant's limit while type a's operations run: {types:?}"
    );
}

/// DESIGN 4 (`max_in_flight`, fair share) and docs/configurators.md ("one
/// the agent lists as still running goes at once: it attaches to what
/// already runs, which takes its room already"): with one slot, a lost
/// operation the agent still runs holds it, and another lost operation
/// waits instead of going out beside it.
#[test]
fn a_lost_operation_the_agent_still_runs_holds_its_room() {
    let mut spec = spec();
    spec.max_in_flight = 2;
    let mut executor = executor();
    register_listed(&mut executor, 1, "agent", spec.clone(), at(0));
    let effects = submit(&mut executor, vec![item("a", 1), item("b", 1)], at(10));
    let lost = orders(&effects.sends);
    assert_eq!(lost.len(), 2);
    executor.session_closed(1, "gone", at(20));
    executor.committed(at(20));

    spec.max_in_flight = 1;
    // The agent still runs b's Create (b sorts after a: a is decided first).
    let still_running = lost
        .iter()
        .filter(|order| &**order.item.name() == "b")
        .map(|order| order.op_id.clone())
        .collect();
    let effects = register_with(
        &mut executor,
        2,
        "agent",
        spec,
        Outstanding::Listed(still_running),
        at(30),
    );
    let sent: Vec<String> = orders(&effects.sends)
        .iter()
        .map(|order| order.item.name().to_string())
        .collect();
    assert_eq!(
        sent,
        vec!["b".to_owned()],
        "one slot: only the operation the agent still runs goes out"
    );
    assert!(executor.running_operations() <= 1);
}

/// A failed commit undoes its transaction (executor.rs: "nothing of it
/// happened"), so a lost operation whose re-delivery that commit carried
/// is still to be sent again (DESIGN 4: "Without READ, the server
/// re-issues the journaled operation if its target is still intended");
/// it must not stay UNKNOWN until its agent's session ends.
#[test]
fn a_failed_commit_of_a_put_off_redelivery_sends_it_again_later() {
    let mut spec = spec();
    spec.max_in_flight = 2;
    let mut executor = executor();
    register_listed(&mut executor, 1, "agent", spec.clone(), at(0));
    let effects = submit(&mut executor, vec![item("a", 1), item("b", 1)], at(10));
    let lost = orders(&effects.sends);
    executor.session_closed(1, "gone", at(20));
    executor.committed(at(20));
    spec.max_in_flight = 1;
    let effects = register_listed(&mut executor, 2, "agent", spec, at(30));
    let first = orders(&effects.sends).remove(0);
    let other = other_than(first.item.name().as_ref()).to_owned();
    answer_on(&mut executor, 2, &first, done(), at(40));

    // The re-delivery put off for room goes now, but its commit fails.
    let effects = executor.redeliver_deferred(at(41)).expect("room for it");
    assert_eq!(orders(&effects.sends).len(), 1);
    executor.commit_failed(at(41));
    assert_eq!(state_of(&executor, &other), Some(ItemState::Unknown));

    // A second later the timer runs a full pass; the owner then tries
    // put-off re-deliveries, as after every input.
    let mut sent = Vec::new();
    for ms in [1_041, 2_041, 60_000] {
        let effects = executor.on_timer(at(ms));
        executor.committed(at(ms));
        sent.extend(orders(&effects.sends));
        if let Some(effects) = executor.redeliver_deferred(at(ms + 1)) {
            executor.committed(at(ms + 1));
            sent.extend(orders(&effects.sends));
        }
    }
    let expected = lost
        .iter()
        .find(|order| **order.item.name() == *other)
        .map(|order| order.op_id.clone());
    assert!(
        sent.iter()
            .any(|order| Some(&order.op_id) == expected.as_ref()),
        "the lost operation of {other} is never sent again: {sent:?}, state {:?}",
        state_of(&executor, &other)
    );
}

/// A failed commit undoes its transaction; the drift READs of a periodic
/// resync (DESIGN 5: "with READ-capable types it refreshes current state
/// to detect drift") must not be dropped with it until the next resync.
#[test]
fn a_failed_commit_of_a_resync_does_not_drop_its_reads() {
    let mut executor = connected_readable();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    answer(&mut executor, &orders(&effects.sends)[0], done(), at(20));
    let resync = executor.next_wakeup(at(30)).expect("a resync");
    let effects = executor.on_timer(at(resync));
    let reads = orders(&effects.sends);
    assert_eq!(reads.len(), 1);
    assert_eq!(reads[0].kind, OperationKind::Read);
    executor.commit_failed(at(resync));

    let retry = executor.next_wakeup(at(resync)).expect("a retry");
    assert_eq!(retry, resync + 1_000);
    let effects = executor.on_timer(at(retry));
    executor.committed(at(retry));
    let again = orders(&effects.sends);
    assert!(
        again.iter().any(|order| order.kind == OperationKind::Read),
        "the resync's READ is dropped with the failed commit: {again:?}; next wakeup {:?}",
        executor.next_wakeup(at(retry))
    );
}

/// A drift READ the agent cannot answer (a type declaring READ without
/// implementing it answers UNIMPLEMENTED) changes nothing, but is reported
/// as the failure it was: it finished as DONE, with no error, in the
/// operation log, Watch and metrics, although the agent failed it.
#[test]
fn a_failed_drift_read_is_reported_failed_and_changes_nothing() {
    let mut executor = connected_readable();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    answer(&mut executor, &orders(&effects.sends)[0], done(), at(20));
    let resync = executor.next_wakeup(at(30)).expect("a resync");
    let effects = executor.on_timer(at(resync));
    executor.committed(at(resync));
    let read = orders(&effects.sends).remove(0);
    assert_eq!(read.kind, OperationKind::Read);
    let before = executor
        .model()
        .current
        .get(&ItemRef::new("t", "a"))
        .cloned();

    let unimplemented = AgentOutcome::Failed(OperationError {
        code: code::UNIMPLEMENTED,
        message: "READ is not implemented".into(),
    });
    let effects = answer(&mut executor, &read, unimplemented, at(resync + 10));
    let finished = effects.finished.first().expect("the READ finished");
    assert_eq!(finished.outcome, OperationOutcome::Failed);
    assert_eq!(
        finished.error.as_ref().map(|error| error.code),
        Some(code::UNIMPLEMENTED)
    );
    let after = executor
        .model()
        .current
        .get(&ItemRef::new("t", "a"))
        .cloned();
    assert_eq!(
        after
            .as_ref()
            .map(|item| (item.state, item.applied.clone())),
        before
            .as_ref()
            .map(|item| (item.state, item.applied.clone())),
        "a failed READ changed the item"
    );
}

/// DESIGN 5: "A quiescent tenant is `Stalled` if ... [an item] has waited
/// for a configurator longer than `configurator_grace`". Nothing else
/// happens meanwhile, so the executor must wake up when the grace ends;
/// it sleeps until the next resync (here an hour; by default 10 min, twice
/// the default grace).
#[test]
fn a_tenant_waiting_for_a_configurator_stalls_when_the_grace_ends() {
    let mut executor = executor();
    submit(&mut executor, vec![item("a", 1)], at(10));
    assert!(!holds(
        &executor,
        crate::engine::conditions::ConditionKind::Stalled
    ));
    let grace_ends = 10 + settings().configurator_grace_ms;
    let wakeup = executor.next_wakeup(at(10)).expect("a wakeup");
    assert!(
        wakeup <= grace_ends,
        "woken at {wakeup} ms, not when the grace ends at {grace_ends} ms"
    );
}

/// DESIGN 4: "deadlines run on the server's monotonic clock". The
/// configurator grace is measured on the wall clock: a step of the wall
/// clock (NTP, a VM resumed) stalls a tenant that waited 10 ms.
#[test]
fn a_wall_clock_step_does_not_end_the_configurator_grace() {
    let mut executor = executor();
    submit(&mut executor, vec![item("a", 1)], at(10));
    let jumped = Now {
        wall_ms: WALL_START + 86_400_000,
        mono_ms: 20,
    };
    executor.reconcile(false, jumped);
    executor.committed(jumped);
    assert!(
        !holds(&executor, crate::engine::conditions::ConditionKind::Stalled),
        "stalled 10 ms of monotonic time after the item began to wait"
    );
}

/// A timed-out Create is cancelled and counted as a failure, but a
/// timeout proves nothing of what the agent did: here it had applied the
/// Create, whose DONE comes after the cancel. Kept as a failed Create
/// (which "does not exist"), the item was forgotten without a Delete when
/// it left the intent (DESIGN 3, rule 2), and the agent kept an item
/// nobody would delete. It may exist, so it is deleted (once its backoff
/// is over).
#[test]
fn a_create_that_timed_out_is_deleted_when_its_item_leaves_the_intent() {
    let mut executor = connected();
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    let create = orders(&effects.sends).remove(0);
    let timed_out = 10 + TIMEOUT_MS;
    let effects = executor.on_timer(at(timed_out));
    executor.committed(at(timed_out));
    assert!(cancels(&effects.immediate, &create.op_id));
    assert_eq!(state_of(&executor, "a"), Some(ItemState::Failed));

    // The agent had applied it: its DONE comes after the cancel.
    answer(&mut executor, &create, done(), at(timed_out + 10));
    // The item leaves the intent before its retry is due.
    let effects = submit(&mut executor, Vec::new(), at(timed_out + 20));
    let mut sent = orders(&effects.sends);
    for second in 1..=120 {
        let now = at(timed_out + 20 + second * 1_000);
        let effects = executor.on_timer(now);
        executor.committed(now);
        sent.extend(orders(&effects.sends));
    }
    assert!(
        sent.iter()
            .any(|order| order.kind == OperationKind::Delete && &**order.item.name() == "a"),
        "what the agent created is never deleted: sent {sent:?}, state {:?}",
        state_of(&executor, "a")
    );
}

/// DESIGN 4: "An operation is superseded only when its own item's intended
/// value changes or the item leaves the intent; the server then sends
/// `CancelOperation{op_id}`", and docs/configurators.md: a lost operation
/// the agent lists is re-delivered, and "if it is no longer wanted the
/// usual cancel follows". The intent changed while no agent held the type,
/// so no cancel could go out then; the operation is marked cancelled all
/// the same, and when the agent comes back still running it, it is sent
/// again but never cancelled (and its item goes UNKNOWN after the cancel
/// timeout of a cancel nobody sent).
#[test]
fn a_superseded_lost_operation_the_agent_still_runs_is_cancelled() {
    let mut executor = executor();
    register_listed(&mut executor, 1, "agent", spec(), at(0));
    let effects = submit(&mut executor, vec![item("a", 1)], at(10));
    let create = orders(&effects.sends).remove(0);
    executor.session_closed(1, "gone", at(20));
    executor.committed(at(20));

    submit(&mut executor, vec![item("a", 2)], at(30));
    let effects = register_with(
        &mut executor,
        2,
        "agent",
        spec(),
        Outstanding::Listed([create.op_id.clone()].into_iter().collect()),
        at(40),
    );
    let resent = orders(&effects.sends);
    assert_eq!(
        resent
            .iter()
            .map(|order| order.op_id.as_str())
            .collect::<Vec<_>>(),
        vec![create.op_id.as_str()],
        "it attaches to what the agent runs"
    );
    let mut all = effects.immediate.clone();
    all.extend(effects.sends.clone());
    for ms in [41, 42] {
        let (effects, _) = executor.reconcile(false, at(ms));
        executor.committed(at(ms));
        all.extend(effects.immediate);
        all.extend(effects.sends);
    }
    assert!(
        cancels(&all, &create.op_id),
        "the superseded operation is never cancelled at the agent that runs it"
    );
}

// What a submission changes, and what a refused one does not.

fn submit_request(
    executor: &mut Executor,
    subgraph: &str,
    items: Vec<Item>,
    expected_generation: Option<u64>,
    now: Now,
) -> Result<(Effects, crate::engine::exec::Submitted), crate::engine::intent::IntentError> {
    let mut request = crate::engine::testkit::validated_submit(subgraph, items);
    request.expected_generation = expected_generation;
    executor.submit(request, now)
}

/// DESIGN section 2: moving an item between subgraphs "runs no
/// operation (it bumps the revision, not the generation)".
#[test]
fn moving_a_running_item_between_subgraphs_cancels_nothing() {
    let mut executor = connected();
    let mut a = item("a", 1);
    a.subgraph = "team/x".into();
    let effects = submit_subgraph(&mut executor, "team", vec![a.clone()], at(10));
    let running = orders(&effects.sends).remove(0);
    a.subgraph = "team/y".into();
    let (effects, submitted) =
        submit_request(&mut executor, "team", vec![a], None, at(20)).expect("accepted");
    executor.committed(at(20));
    assert!(submitted.changed);
    assert_eq!(submitted.generation, 1);
    assert!(
        !effects
            .sends
            .iter()
            .any(|m| matches!(&m.message, ToAgent::Cancel { op_id } if *op_id == running.op_id)),
        "a move cancels the running Create"
    );
    assert!(effects.commit.items.iter().all(|w| {
        w.after
            .as_ref()
            .and_then(|a| a.in_flight.as_ref())
            .is_none_or(|f| !f.cancel_requested)
    }));
    assert_eq!(
        executor
            .model()
            .intended
            .get(&ItemRef::new("t", "a"))
            .map(|e| e.generation),
        Some(1)
    );
}

#[test]
fn an_identical_resubmission_is_unchanged_and_keeps_the_generation() {
    let mut executor = connected();
    let effects = submit(&mut executor, vec![item("a", 1), item("b", 1)], at(10));
    let sent = orders(&effects.sends);
    let (effects, submitted) = submit_request(
        &mut executor,
        "",
        vec![item("a", 1), item("b", 1)],
        Some(1),
        at(20),
    )
    .expect("accepted");
    executor.committed(at(20));
    assert!(!submitted.changed);
    assert_eq!(submitted.generation, 1);
    assert!(effects.commit.intent.is_none());
    assert!(
        !effects
            .sends
            .iter()
            .any(|m| matches!(&m.message, ToAgent::Cancel { .. }))
    );
    assert_eq!(sent.len(), 2);
}

#[test]
fn a_generation_mismatch_changes_nothing() {
    let mut executor = connected();
    submit(&mut executor, vec![item("a", 1)], at(10));
    let before_intended = executor.model().intended.len();
    let before = executor.model().progress().clone();
    let error = submit_request(&mut executor, "", vec![item("b", 1)], Some(0), at(20))
        .expect_err("mismatch");
    assert!(matches!(
        error,
        crate::engine::intent::IntentError::GenerationMismatch { .. }
    ));
    assert_eq!(executor.model().intended.len(), before_intended);
    assert_eq!(executor.model().progress().generation, before.generation);
    assert!(!executor.model().has_staged());
}

#[test]
fn an_item_depending_on_an_unreported_external_item_of_another_subgraph_waits() {
    let mut executor = connected();
    let mut x = crate::engine::testkit::external("t/x");
    x.subgraph = "ext".into();
    submit_subgraph(&mut executor, "ext", vec![x], at(10));
    let mut a = item("a", 1).depends_on(on("t/x"));
    a.subgraph = "app".into();
    let effects = submit_subgraph(&mut executor, "app", vec![a], at(20));
    assert!(
        orders(&effects.sends).is_empty(),
        "nothing to create before x is reported"
    );
    assert!(matches!(
        state_of(&executor, "a"),
        None | Some(ItemState::Pending)
    ));
}

// Deep graphs through the executor --------------------------------------------------

/// One random deep intent over `size` possible items: most items on the
/// one below them (chains), some on a second lower item (diamonds), with
/// `recreate_when_modified` and predicate dependencies; type `u` recreates
/// when `/id` changes.
fn deep_intent(
    rng: &mut rand::rngs::StdRng,
    size: usize,
) -> Vec<(Item, Vec<Option<crate::graph::Predicate>>)> {
    use rand::Rng;
    const PREDICATES: [&str; 2] = ["self.v >= 1", "self.v != 2"];
    let type_of = |index: usize| if index % 3 == 1 { "u" } else { "t" };
    let present: Vec<bool> = (0..size).map(|_| rng.random_bool(0.9)).collect();
    let mut items = Vec::new();
    for index in (0..size).filter(|&i| present[i]) {
        let mut built = item_of(
            type_of(index),
            &format!("i{index:02}"),
            rng.random_range(0..3),
        );
        built
            .properties
            .insert("id".into(), rng.random_range(0..2i64).into());
        let mut targets = Vec::new();
        if index > 0 && rng.random_bool(0.85) {
            targets.push(index - 1);
        }
        if index > 1 && rng.random_bool(0.35) {
            targets.push(rng.random_range(0..index - 1));
        }
        let mut predicates = Vec::new();
        for target in targets {
            let predicate = rng
                .random_bool(0.25)
                .then(|| PREDICATES[rng.random_range(0..PREDICATES.len())]);
            let dependency = on(&format!("{}/i{target:02}", type_of(target)))
                .with_recreate_when_modified(rng.random_bool(0.25))
                .with_must_satisfy(predicate.unwrap_or(""));
            predicates
                .push(predicate.map(|p| crate::graph::Predicate::compile(p).expect("compiles")));
            built = built.depends_on(dependency);
        }
        items.push((built, predicates));
    }
    items
}

/// Sends out of `effects`, checked against the ordering rules at dispatch.
fn checked_orders(executor: &Executor, effects: &Effects) -> Vec<OperationOrder> {
    let sent = orders(&effects.sends);
    let model = executor.model();
    for order in &sent {
        if order.kind == OperationKind::Read {
            continue;
        }
        crate::engine::testkit::World::check_started(
            &model.intended,
            &model.current,
            &order.item.item_ref(),
            order.kind,
        );
    }
    sent
}

/// Answers every operation DONE, in a random order, with follow-up passes
/// in between, until nothing runs and nothing is planned; then checks that
/// a plan made afresh has nothing ready either (no wedge).
fn drive_deep(
    executor: &mut Executor,
    mut outstanding: Vec<OperationOrder>,
    rng: &mut rand::rngs::StdRng,
    now: &mut u64,
    log: &mut Vec<String>,
) {
    use rand::Rng;
    for _ in 0..2_000 {
        *now += 1;
        if let Some(effects) = executor.follow_up(at(*now)) {
            executor.committed(at(*now));
            outstanding.extend(checked_orders(executor, &effects));
        }
        if outstanding.is_empty() {
            break;
        }
        let order = outstanding.swap_remove(rng.random_range(0..outstanding.len()));
        log.push(format!("{} {}", order.kind.as_str(), order.item.item_ref()));
        let effects = answer(executor, &order, done(), at(*now));
        outstanding.extend(checked_orders(executor, &effects));
    }
    assert!(outstanding.is_empty(), "no quiescence: {outstanding:?}");
    no_wedge(executor, None, log);
}

/// A plan made afresh from the executor's graphs (as of `now_ms`, when
/// retry times matter) has nothing ready: nothing waits for an event that
/// will not come.
fn no_wedge(executor: &Executor, now_ms: Option<u64>, log: &[String]) {
    let model = executor.model();
    let environment = crate::engine::testkit::TestEnvironment {
        rules: [(
            "u".to_string(),
            crate::engine::plan::TypeRules {
                recreate_on_change: vec!["/id".into()],
                ask_needs_recreate: false,
            },
        )]
        .into(),
        now_ms: now_ms.unwrap_or_default(),
        ..Default::default()
    };
    let fresh = crate::engine::plan::plan_everything(&model.intended, &model.current, &environment);
    assert!(
        fresh.operations.is_empty(),
        "wedged: a fresh plan has {:?}\nwaiting {:#?}\nlog {log:?}",
        fresh.operations,
        fresh.waiting
    );
}

/// An executor with one agent holding types `t` and `u` (`u` recreates
/// when `/id` changes), as the deep random intents use them.
fn deep_executor() -> Executor {
    let mut executor = executor();
    let mut u = spec_of("u");
    u.recreate_on_change = vec!["/id".into()];
    executor
        .register(
            Registration {
                session_id: 1,
                agent_id: "agent".into(),
                types: vec![spec(), u],
                outstanding: Outstanding::Unsaid,
            },
            at(0),
        )
        .expect("registered");
    executor.committed(at(0));
    executor
}

#[test]
fn deep_random_intents_converge_through_the_executor_in_design_order() {
    use rand::SeedableRng;
    for seed in 0..300u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut executor = deep_executor();
        let mut now = 10;
        let mut log = Vec::new();
        for _ in 0..4 {
            let request = ValidatedSubmit {
                subgraph: String::new(),
                items: deep_intent(&mut rng, 12),
                expected_generation: None,
                dry_run: false,
            };
            now += 1;
            let (effects, _) = executor.submit(request, at(now)).expect("accepted");
            executor.committed(at(now));
            let sent = checked_orders(&executor, &effects);
            log.push(format!("-- seed {seed} submit"));
            drive_deep(&mut executor, sent, &mut rng, &mut now, &mut log);
        }
    }
}

#[test]
fn deep_random_intents_changed_mid_flight_keep_design_order_and_settle() {
    use rand::{Rng, SeedableRng};
    for seed in 0..300u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut executor = deep_executor();
        let mut now = 10;
        let mut log = vec![format!("seed {seed}")];
        let mut outstanding: Vec<OperationOrder> = Vec::new();
        let mut submits_left = 5;
        for _ in 0..3_000 {
            now += 1;
            if let Some(effects) = executor.follow_up(at(now)) {
                executor.committed(at(now));
                outstanding.extend(checked_orders(&executor, &effects));
            }
            let submit_now = submits_left > 0 && (outstanding.is_empty() || rng.random_bool(0.08));
            if submit_now {
                submits_left -= 1;
                let request = ValidatedSubmit {
                    subgraph: String::new(),
                    items: deep_intent(&mut rng, 10),
                    expected_generation: None,
                    dry_run: false,
                };
                log.push("submit".into());
                let (effects, _) = executor.submit(request, at(now)).expect("accepted");
                executor.committed(at(now));
                outstanding.extend(checked_orders(&executor, &effects));
                continue;
            }
            if outstanding.is_empty() {
                match executor.next_wakeup(at(now)) {
                    Some(wakeup) => {
                        now = now.max(wakeup);
                        let effects = executor.on_timer(at(now));
                        executor.committed(at(now));
                        outstanding.extend(checked_orders(&executor, &effects));
                        if outstanding.is_empty() && executor.running_operations() == 0 {
                            // Only a resync or nothing is left.
                            if executor
                                .next_wakeup(at(now))
                                .is_none_or(|w| w > now + 60_000)
                            {
                                break;
                            }
                        }
                        continue;
                    }
                    None => break,
                }
            }
            let order = outstanding.swap_remove(rng.random_range(0..outstanding.len()));
            let outcome = if rng.random_bool(0.15) {
                busy()
            } else {
                done()
            };
            log.push(format!(
                "{} {} {}",
                order.kind.as_str(),
                order.item.item_ref(),
                if matches!(outcome, AgentOutcome::Done { .. }) {
                    "done"
                } else {
                    "failed"
                }
            ));
            let effects = answer(&mut executor, &order, outcome, at(now));
            outstanding.extend(checked_orders(&executor, &effects));
        }
        assert!(
            outstanding.is_empty(),
            "no quiescence: {outstanding:?}\n{log:?}"
        );
        assert_eq!(executor.running_operations(), 0, "{log:?}");
        no_wedge(&executor, Some(WALL_START + now + 10_000_000), &log);
    }
}

/// Properties from JSON.
fn properties_of(value: serde_json::Value) -> crate::graph::Properties {
    crate::graph::Properties::try_from(value).expect("an object")
}

/// x, and d on x while x's observed state is up (DESIGN 2's predicate).
fn link_intent(mtu: i64) -> ValidatedSubmit {
    let source = "self.mtu >= 1500 && self.state == \"up\"";
    let mut x = item("x", 1);
    x.properties.insert("mtu".into(), mtu.into());
    let d = item("d", 1).depends_on(on("t/x").with_must_satisfy(source));
    ValidatedSubmit {
        subgraph: String::new(),
        items: vec![
            (x, vec![]),
            (
                d,
                vec![Some(
                    crate::graph::Predicate::compile(source).expect("compiles"),
                )],
            ),
        ],
        expected_generation: None,
        dry_run: false,
    }
}

#[test]
fn a_modify_that_keeps_a_dependents_predicate_leaves_it_and_one_whose_result_breaks_it_deletes_it_after()
 {
    let mut executor = connected();
    let (effects, _) = executor
        .submit(link_intent(1500), at(10))
        .expect("accepted");
    executor.committed(at(10));
    let create_x = orders(&effects.sends).remove(0);
    let effects = answer(
        &mut executor,
        &create_x,
        done_observing(properties_of(serde_json::json!({"state": "up"}))),
        at(20),
    );
    let create_d = orders(&effects.sends).remove(0);
    assert_eq!(&**create_d.item.name(), "d");
    answer(&mut executor, &create_d, done(), at(30));

    // The mtu goes up: d's predicate holds for x's new value; x alone runs.
    let (effects, _) = executor
        .submit(link_intent(9000), at(40))
        .expect("accepted");
    executor.committed(at(40));
    let sent = orders(&effects.sends);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        (sent[0].kind, &**sent[0].item.name()),
        (OperationKind::Modify, "x")
    );
    // The agent reports x down after the Modify: d no longer holds, and
    // is deleted (it waits to be created again).
    let effects = answer(
        &mut executor,
        &sent[0],
        done_observing(properties_of(serde_json::json!({"state": "down"}))),
        at(50),
    );
    let mut sent = orders(&effects.sends);
    if sent.is_empty()
        && let Some(follow_up) = executor.follow_up(at(51))
    {
        executor.committed(at(51));
        sent = orders(&follow_up.sends);
    }
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        (sent[0].kind, &**sent[0].item.name()),
        (OperationKind::Delete, "d")
    );
}

/// Whether the tenant's condition `kind` holds, and its reason.
fn condition_of(
    executor: &Executor,
    kind: crate::engine::conditions::ConditionKind,
) -> (bool, String) {
    let condition = full_condition(executor, kind);
    (condition.status, condition.reason)
}

/// The condition `kind` of the executor's tenant, with its message.
fn full_condition(
    executor: &Executor,
    kind: crate::engine::conditions::ConditionKind,
) -> crate::engine::conditions::Condition {
    executor
        .model()
        .progress()
        .conditions
        .iter()
        .find(|condition| condition.kind == kind)
        .cloned()
        .expect("every condition is computed")
}

/// Submits a on b on c to `executor` and returns c's Create, the one
/// operation that goes out.
fn chain_of_three_sends_c(executor: &mut Executor) -> OperationOrder {
    let a = item("a", 1).depends_on(on("t/b"));
    let b = item("b", 1).depends_on(on("t/c"));
    let effects = submit(executor, vec![a, b, item("c", 1)], at(10));
    let create = orders(&effects.sends).remove(0);
    assert_eq!(&**create.item.name(), "c");
    create
}

/// A dependent whose predicate is merely false waits for its dependency
/// (DESIGN 2); nothing failed, so the quiet tenant is not Stalled (DESIGN
/// 5), whatever words the user's predicate holds. The engine told a
/// terminal failure from the words of `blocked_by`, and took the
/// predicate's own text for one.
#[test]
fn a_false_predicate_that_mentions_failed_terminally_does_not_stall_the_tenant() {
    use crate::engine::conditions::ConditionKind;
    let mut executor = connected();
    let source = "self.result != \"failed terminally\"";
    let mut job = item("job", 1);
    job.external = true;
    let d = item("d", 1).depends_on(on("t/job").with_must_satisfy(source));
    let request = ValidatedSubmit {
        subgraph: String::new(),
        items: vec![
            (job.clone(), vec![]),
            (
                d,
                vec![Some(
                    crate::graph::Predicate::compile(source).expect("compiles"),
                )],
            ),
        ],
        expected_generation: None,
        dry_run: false,
    };
    executor.submit(request, at(10)).expect("accepted");
    executor.committed(at(10));
    let mut reported = job.clone();
    reported
        .properties
        .insert("result".into(), "failed terminally".into());
    external_put(&mut executor, &reported, at(20));
    while executor.follow_up(at(20)).is_some() {
        executor.committed(at(20));
    }

    let waiting = executor
        .model()
        .waiting
        .get(&ItemRef::new("t", "d"))
        .expect("d waits for its predicate");
    assert_eq!(waiting.reason, crate::engine::plan::WaitReason::Dependency);
    assert!(!waiting.waits_on_terminal_failure(), "{waiting:?}");
    assert_eq!(executor.model().waiting.summary().terminal, 0);
    assert_eq!(
        condition_of(&executor, ConditionKind::Stalled),
        (false, "NotStalled".to_owned()),
        "nothing failed: a false predicate is not a terminal failure"
    );
    assert_eq!(
        condition_of(&executor, ConditionKind::Ready),
        (false, "WaitingForDependencies".to_owned())
    );
}

/// a on b on c: c's Create runs when its agent goes and never comes
/// back. c is UNKNOWN and only an agent of its type can settle it (a READ
/// or the Create sent again, DESIGN 4), and a and b wait on it: past
/// `configurator_grace` the quiet tenant is Stalled for want of a
/// configurator, naming the type (DESIGN 5), as it is when a PENDING
/// item of a type with no agent waits; the agent's return clears it.
#[test]
fn an_unknown_item_whose_agent_is_gone_stalls_the_tenant_after_the_grace() {
    use crate::engine::conditions::{ConditionKind, NO_CONFIGURATOR};
    let mut executor = connected();
    chain_of_three_sends_c(&mut executor);
    executor.session_closed(1, "the stream ended", at(20));
    executor.committed(at(20));
    assert_eq!(state_of(&executor, "c"), Some(ItemState::Unknown));
    assert!(
        !condition_of(&executor, ConditionKind::Stalled).0,
        "within the grace"
    );

    let grace_ends = 20 + settings().configurator_grace_ms;
    let wakeup = executor.next_wakeup(at(30)).expect("a wake-up");
    assert!(
        wakeup <= grace_ends,
        "the tenant is woken when the grace ends: {wakeup} > {grace_ends}"
    );
    executor.on_timer(at(grace_ends));
    executor.committed(at(grace_ends));
    assert_eq!(
        condition_of(&executor, ConditionKind::Stalled),
        (true, NO_CONFIGURATOR.to_owned()),
        "nothing moves until an agent of type t connects"
    );
    let message = full_condition(&executor, ConditionKind::Stalled).message;
    assert!(message.contains("type(s) t"), "{message}");

    let effects = register(&mut executor, 2, "agent", at(grace_ends + 10));
    assert_eq!(orders(&effects.sends).len(), 1, "c's Create goes again");
    assert!(
        !condition_of(&executor, ConditionKind::Stalled).0,
        "an agent came back"
    );
    assert!(holds(&executor, ConditionKind::Reconciling));
}

/// a on b on c, and c's Create fails terminally: the quiet tenant is
/// Stalled (DESIGN 5), and its message names c, the item whose intent
/// must change. It said "2 item(s) failed terminally or wait on one":
/// three items are held, and none was named.
#[test]
fn a_terminal_failure_deep_in_a_chain_is_named_by_the_stalled_condition() {
    use crate::engine::conditions::ConditionKind;
    let mut executor = connected();
    let create = chain_of_three_sends_c(&mut executor);
    let refused = AgentOutcome::Failed(OperationError {
        code: code::INVALID_ARGUMENT,
        message: "no such vlan".into(),
    });
    let effects = answer(&mut executor, &create, refused, at(20));
    assert!(orders(&effects.sends).is_empty());
    assert_eq!(
        executor.model().waiting.summary().total,
        3,
        "a, b and c wait"
    );
    let stalled = full_condition(&executor, ConditionKind::Stalled);
    assert!(stalled.status);
    assert_eq!(stalled.reason, "TerminalFailure");
    assert!(
        stalled.message.contains("t/c failed terminally"),
        "{}",
        stalled.message
    );
    assert!(
        stalled
            .message
            .contains("change its properties or dependencies to retry (a new description"),
        "the message says which change retries it: {}",
        stalled.message
    );
    let waiting = executor
        .model()
        .waiting
        .get(&ItemRef::new("t", "c"))
        .expect("c waits");
    assert!(
        waiting
            .blocked_by
            .iter()
            .any(|blocked| blocked.why.ends_with(&retry_by("its"))),
        "{waiting:?}"
    );
    assert!(
        !stalled.message.contains("t/a") && !stalled.message.contains("t/b"),
        "a and b only wait: {}",
        stalled.message
    );
}
