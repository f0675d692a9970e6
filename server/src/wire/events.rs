//! Watch events in their wire form (`reconciled.v1.Event`), from the
//! executor's [`TenantEvent`]s. The stored history is then byte for byte
//! what watchers receive, live or resumed. [`stamp`] gives a commit's
//! events its revision and time.

use std::sync::Arc;

use prost::Message;
use reconciled_proto::v1;
use reconciled_proto::v1::event::Body;

use crate::engine::conditions::Condition;
use crate::engine::exec::effects::{ItemChange, OperationOutcome, TenantEvent};
use crate::graph::{CurrentItem, ItemRef, OperationError, OperationKind};
use crate::wire::{
    condition_to_proto, item_ref_to_proto, item_state_to_proto, item_status,
    operation_error_to_status, operation_kind_to_proto, timestamp_from_ms,
};

/// An item status larger than this travels without its full `status`
/// (state and error still do): stored events stay under the store's value
/// limit. GetGraph shows the whole status.
const MAX_STATUS_BYTES: usize = 48 * 1024;

fn event(kind: v1::EventKind, body: Body) -> v1::Event {
    v1::Event {
        revision: 0,
        kind: kind.into(),
        time: None,
        body: Some(body),
    }
}

/// Gives every event the commit's revision and time.
pub fn stamp(events: &mut [v1::Event], revision: u64, time_ms: u64) {
    let time = timestamp_from_ms(time_ms);
    for event in events {
        event.revision = revision;
        event.time = Some(time);
    }
}

/// The events of one commit, in order: each [`TenantEvent`] gives one
/// event, except an item change, which gives a status change and an
/// operation start, each when it happened.
pub fn events_to_proto(events: &[TenantEvent]) -> Vec<v1::Event> {
    let mut out = Vec::with_capacity(events.len());
    for event in events {
        match event {
            TenantEvent::ItemChanged(change) => item_change_events(change, &mut out),
            TenantEvent::IntentChanged {
                generation,
                count,
                items,
            } => out.push(intent_changed(*generation, *count, items)),
            TenantEvent::OperationFinished {
                item,
                kind,
                op_id,
                attempt,
                outcome,
                error,
            } => out.push(operation_finished(
                item,
                *kind,
                op_id,
                *attempt,
                *outcome,
                error.as_ref(),
            )),
            TenantEvent::ConditionsChanged {
                conditions,
                observed_generation,
            } => out.push(conditions_changed(conditions, *observed_generation)),
            TenantEvent::AgentConnected {
                agent_id,
                item_types,
                epoch,
            } => out.push(agent_connected(agent_id, item_types.clone(), *epoch)),
            TenantEvent::AgentDisconnected {
                agent_id,
                item_types,
                reason,
            } => out.push(agent_disconnected(agent_id, item_types.clone(), reason)),
            TenantEvent::DriftDetected { item, paths } => {
                out.push(drift_detected(item, paths.clone()));
            }
        }
    }
    out
}

/// What an item's change says, as events: its status changed (state,
/// error, applied or observed value, presence), and an operation started
/// (a new op id or attempt in flight). States are a watcher's view, as in
/// a snapshot: an intended item without a current entry is PENDING, and
/// an item neither current nor intended is UNSPECIFIED.
fn item_change_events(change: &ItemChange, out: &mut Vec<v1::Event>) {
    let before = change.before.as_deref();
    let after = change.after.as_deref();
    let old_state = viewed_state(before, change.was_intended);
    let new_state = viewed_state(after, change.intended.is_some());
    if status_differs(before, after) || old_state != new_state {
        let mut status = (new_state != v1::ItemState::Unspecified).then(|| {
            item_status(
                &change.item,
                after,
                change.intended.as_deref(),
                change.waiting.as_deref(),
            )
        });
        if status
            .as_ref()
            .is_some_and(|status| status.encoded_len() > MAX_STATUS_BYTES)
        {
            status = None;
        }
        out.push(event(
            v1::EventKind::ItemStatusChanged,
            Body::ItemStatusChanged(v1::ItemStatusChanged {
                item: Some(item_ref_to_proto(&change.item)),
                old_state: old_state.into(),
                new_state: new_state.into(),
                error: after
                    .and_then(|a| a.rare.last_error.as_ref())
                    .map(operation_error_to_status),
                status,
            }),
        ));
    }
    let started = after.and_then(|a| a.in_flight.as_ref()).filter(|now| {
        before
            .and_then(|b| b.in_flight.as_ref())
            .is_none_or(|was| was.op_id != now.op_id || was.attempt != now.attempt)
    });
    if let Some(operation) = started {
        out.push(event(
            v1::EventKind::OperationStarted,
            Body::OperationStarted(v1::OperationStarted {
                item: Some(item_ref_to_proto(&change.item)),
                kind: operation_kind_to_proto(operation.kind).into(),
                op_id: operation.op_id.clone(),
                attempt: operation.attempt,
                epoch: change.epoch,
            }),
        ));
    }
}

/// An item's state as a watcher sees it: its current entry's, PENDING if
/// it has none but is intended, UNSPECIFIED if it is neither.
fn viewed_state(current: Option<&CurrentItem>, intended: bool) -> v1::ItemState {
    match current {
        Some(current) => item_state_to_proto(current.state),
        None if intended => v1::ItemState::Pending,
        None => v1::ItemState::Unspecified,
    }
}

/// How an operation ended, on the wire: a cancellation as asked is a
/// FAILED with the CANCELLED error it carries.
fn outcome_to_proto(outcome: OperationOutcome) -> v1::Outcome {
    match outcome {
        OperationOutcome::Done => v1::Outcome::Done,
        OperationOutcome::Failed | OperationOutcome::Cancelled => v1::Outcome::Failed,
        OperationOutcome::Wait => v1::Outcome::Wait,
    }
}

fn status_differs(before: Option<&CurrentItem>, after: Option<&CurrentItem>) -> bool {
    match (before, after) {
        (None, None) => false,
        (Some(before), Some(after)) => {
            before.state != after.state
                || before.rare.last_error != after.rare.last_error
                || !same(&before.applied, &after.applied)
                || !same(&before.observed, &after.observed)
        }
        _ => true,
    }
}

fn same<T: PartialEq>(a: &Option<Arc<T>>, b: &Option<Arc<T>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
        (None, None) => true,
        _ => false,
    }
}

/// An agent reported an operation's outcome.
fn operation_finished(
    item: &ItemRef,
    kind: OperationKind,
    op_id: &str,
    attempt: u32,
    outcome: OperationOutcome,
    error: Option<&OperationError>,
) -> v1::Event {
    event(
        v1::EventKind::OperationFinished,
        Body::OperationFinished(v1::OperationFinished {
            item: Some(item_ref_to_proto(item)),
            kind: operation_kind_to_proto(kind).into(),
            op_id: op_id.to_string(),
            attempt,
            outcome: outcome_to_proto(outcome).into(),
            error: error.map(operation_error_to_status),
        }),
    )
}

/// The intent changed to `generation`: `count` items changed, `changed`
/// are named.
fn intent_changed(generation: u64, count: usize, changed: &[ItemRef]) -> v1::Event {
    let items_changed = u32::try_from(count).unwrap_or(u32::MAX);
    event(
        v1::EventKind::IntentChanged,
        Body::IntentChanged(v1::IntentChanged {
            generation,
            items_changed,
            changed: changed.iter().map(item_ref_to_proto).collect(),
        }),
    )
}

/// The tenant's conditions changed.
fn conditions_changed(conditions: &[Condition], observed_generation: u64) -> v1::Event {
    event(
        v1::EventKind::ConditionsChanged,
        Body::ConditionsChanged(v1::ConditionsChanged {
            conditions: conditions.iter().map(condition_to_proto).collect(),
            observed_generation,
        }),
    )
}

/// An agent registered for `item_types` with `epoch`.
fn agent_connected(agent_id: &str, item_types: Vec<String>, epoch: u64) -> v1::Event {
    event(
        v1::EventKind::AgentConnected,
        Body::AgentConnected(v1::AgentConnected {
            agent_id: agent_id.to_string(),
            item_types,
            epoch,
        }),
    )
}

/// An agent's session ended.
fn agent_disconnected(agent_id: &str, item_types: Vec<String>, reason: &str) -> v1::Event {
    event(
        v1::EventKind::AgentDisconnected,
        Body::AgentDisconnected(v1::AgentDisconnected {
            agent_id: agent_id.to_string(),
            item_types,
            reason: reason.to_string(),
        }),
    )
}

/// A READ found `item` different from its applied value at `paths`.
fn drift_detected(item: &ItemRef, paths: Vec<String>) -> v1::Event {
    event(
        v1::EventKind::DriftDetected,
        Body::DriftDetected(v1::DriftDetected {
            item: Some(item_ref_to_proto(item)),
            paths,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Item;

    fn change_events(before: &CurrentItem, after: &CurrentItem) -> Vec<v1::Event> {
        viewed_change(Some(before), Some(after), false, false)
    }

    /// The events of a change of an item's current entry from `before` to
    /// `after`, intended before and after as said.
    fn viewed_change(
        before: Option<&CurrentItem>,
        after: Option<&CurrentItem>,
        was_intended: bool,
        is_intended: bool,
    ) -> Vec<v1::Event> {
        let intended = is_intended.then(|| {
            let item = Item::new("t", "a", Default::default());
            Arc::new(crate::graph::IntendedItem::compile(item, 1).expect("no predicates"))
        });
        events_to_proto(&[TenantEvent::ItemChanged(ItemChange {
            item: ItemRef::new("t", "a"),
            before: before.cloned().map(Arc::new),
            after: after.cloned().map(Arc::new),
            intended,
            was_intended,
            waiting: None,
            epoch: 1,
        })])
    }

    /// The old and new state of the only status change in `events`, and
    /// the state its full status shows (if it carries one).
    fn states(events: &[v1::Event]) -> (v1::ItemState, v1::ItemState, Option<v1::ItemState>) {
        assert_eq!(events.len(), 1, "{events:?}");
        let Some(Body::ItemStatusChanged(change)) = &events[0].body else {
            panic!("not a status change: {events:?}");
        };
        (
            change.old_state(),
            change.new_state(),
            change.status.as_ref().map(|status| status.state()),
        )
    }

    #[test]
    fn an_intended_item_without_a_current_entry_is_pending_to_a_watcher() {
        use v1::ItemState::{Created, Creating, Pending, Unspecified};
        let creating = CurrentItem {
            state: crate::graph::ItemState::Creating,
            ..created()
        };
        // Entering the intent, and leaving it before it was ever created.
        assert_eq!(
            states(&viewed_change(None, None, false, true)),
            (Unspecified, Pending, Some(Pending))
        );
        assert_eq!(
            states(&viewed_change(None, None, true, false)),
            (Pending, Unspecified, None)
        );
        // Its first entry, and losing its entry while still intended.
        assert_eq!(
            states(&viewed_change(None, Some(&creating), true, true)),
            (Pending, Creating, Some(Creating))
        );
        assert_eq!(
            states(&viewed_change(Some(&created()), None, true, true)),
            (Created, Pending, Some(Pending))
        );
        // Intended throughout, never current: nothing a watcher sees changed.
        assert!(viewed_change(None, None, true, true).is_empty());
        // A current entry of an item the intent no longer has goes away.
        assert_eq!(
            states(&viewed_change(Some(&created()), None, true, false)),
            (Created, Unspecified, None)
        );
    }

    fn created() -> CurrentItem {
        CurrentItem::created(Arc::new(Item::new("t", "a", Default::default())), 1)
    }

    #[test]
    fn a_drift_read_that_sees_what_was_seen_before_emits_nothing() {
        let mut observed = crate::graph::Properties::default();
        observed.insert("up".into(), true.into());
        let before = CurrentItem {
            observed: Some(Arc::new(observed.clone())),
            ..created()
        };
        // The same values, read again (a new allocation), and bookkeeping
        // that no status shows.
        let after = CurrentItem {
            observed: Some(Arc::new(observed)),
            ..created()
        }
        .with_rare(|rare| rare.next_attempt_at_ms = Some(5));
        assert!(change_events(&before, &after).is_empty());
    }

    #[test]
    fn a_new_observed_value_is_a_status_change_of_a_created_item() {
        let mut observed = crate::graph::Properties::default();
        observed.insert("up".into(), false.into());
        let after = CurrentItem {
            observed: Some(Arc::new(observed)),
            ..created()
        };
        let events = change_events(&created(), &after);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind(), v1::EventKind::ItemStatusChanged);
    }
}
