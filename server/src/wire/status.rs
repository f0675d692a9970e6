//! Item states, operation kinds and wait reasons as proto enums; operation
//! errors <-> `google.rpc.Status`; the status of an item, its in-flight
//! operation, and tenant conditions as proto messages.

use reconciled_proto::google::rpc;
use reconciled_proto::v1;

use crate::engine::conditions::Condition;
use crate::engine::plan::{WaitReason, WaitingItem};
use crate::graph::{
    CurrentItem, InFlight, IntendedItem, ItemRef, ItemState, OperationError, OperationKind,
};

use super::items::{item_ref_to_proto, item_to_proto};
use super::properties::properties_to_struct;
use super::time::{duration_from_ms, timestamp_from_ms};

// ---------------------------------------------------------------------------
// Enums and errors
// ---------------------------------------------------------------------------

/// Converts an item state to its proto enum.
pub fn item_state_to_proto(state: ItemState) -> v1::ItemState {
    match state {
        ItemState::Pending => v1::ItemState::Pending,
        ItemState::Creating => v1::ItemState::Creating,
        ItemState::Modifying => v1::ItemState::Modifying,
        ItemState::Deleting => v1::ItemState::Deleting,
        ItemState::Created => v1::ItemState::Created,
        ItemState::Failed => v1::ItemState::Failed,
        ItemState::Unknown => v1::ItemState::Unknown,
    }
}

/// Converts an operation kind to its proto enum.
pub fn operation_kind_to_proto(kind: OperationKind) -> v1::OperationKind {
    match kind {
        OperationKind::Create => v1::OperationKind::Create,
        OperationKind::Modify => v1::OperationKind::Modify,
        OperationKind::Delete => v1::OperationKind::Delete,
        OperationKind::Read => v1::OperationKind::Read,
    }
}

/// Converts a wait reason to its proto enum.
pub fn wait_reason_to_proto(reason: WaitReason) -> v1::WaitReason {
    match reason {
        WaitReason::Dependency => v1::WaitReason::Dependency,
        WaitReason::NoConfigurator => v1::WaitReason::NoConfigurator,
        WaitReason::Backoff => v1::WaitReason::Backoff,
        WaitReason::Blocked => v1::WaitReason::Blocked,
        WaitReason::TerminalFailure => v1::WaitReason::TerminalFailure,
        WaitReason::UnknownOutcome => v1::WaitReason::UnknownOutcome,
    }
}

/// Converts a configurator's failure to a `google.rpc.Status` (code and
/// message; no details).
pub fn operation_error_to_status(error: &OperationError) -> rpc::Status {
    rpc::Status {
        code: error.code,
        message: error.message.clone(),
        details: Vec::new(),
    }
}

/// Converts a `google.rpc.Status` reported by a configurator to an
/// operation error. Details are dropped: the engine keeps the code and the
/// message, cut to [`MAX_ERROR_MESSAGE`](crate::engine::exec::port::MAX_ERROR_MESSAGE)
/// bytes.
pub fn operation_error_from_status(status: &rpc::Status) -> OperationError {
    OperationError {
        code: status.code,
        message: crate::engine::exec::port::bounded_error_message(status.message.clone()),
    }
}

// ---------------------------------------------------------------------------
// Item status
// ---------------------------------------------------------------------------

/// The status of one item, assembled from what is known about it: its
/// current entry, its intended entry and, if the planner found it waiting,
/// why.
///
/// The state is the current entry's (so an item whose Create failed shows
/// `FAILED`); with no current entry it is `PENDING` when the item is
/// intended or waits for a Create, and `UNSPECIFIED` when nothing says what
/// it is. `applied` is present only when the item has an applied value
/// (absent while `CREATING`). `external` comes from the intended value, else
/// from the applied one.
pub fn item_status(
    item: &ItemRef,
    current: Option<&CurrentItem>,
    intended: Option<&IntendedItem>,
    waiting: Option<&WaitingItem>,
) -> v1::ItemStatus {
    let mut status = v1::ItemStatus {
        r#ref: Some(item_ref_to_proto(item)),
        state: status_state(current, intended, waiting).into(),
        external: is_external(current, intended),
        ..v1::ItemStatus::default()
    };
    if let Some(current) = current {
        fill_current(&mut status, current);
    }
    if let Some(waiting) = waiting {
        fill_waiting(&mut status, waiting);
    }
    status
}

fn status_state(
    current: Option<&CurrentItem>,
    intended: Option<&IntendedItem>,
    waiting: Option<&WaitingItem>,
) -> v1::ItemState {
    match current {
        Some(current) => item_state_to_proto(current.state),
        None if intended.is_some()
            || waiting.is_some_and(|w| w.operation == OperationKind::Create) =>
        {
            v1::ItemState::Pending
        }
        None => v1::ItemState::Unspecified,
    }
}

fn is_external(current: Option<&CurrentItem>, intended: Option<&IntendedItem>) -> bool {
    match (intended, current.and_then(|c| c.applied.as_ref())) {
        (Some(intended), _) => intended.item.external,
        (None, Some(applied)) => applied.external,
        (None, None) => false,
    }
}

fn fill_current(status: &mut v1::ItemStatus, current: &CurrentItem) {
    status.applied = current.applied.as_deref().map(item_to_proto);
    status.applied_generation = current.applied_generation;
    status.observed = current.observed.as_deref().map(properties_to_struct);
    status.last_operation = current
        .last_operation
        .map_or(v1::OperationKind::Unspecified, operation_kind_to_proto)
        .into();
    status.last_error = current
        .rare
        .last_error
        .as_ref()
        .map(operation_error_to_status);
    status.attempts = current.attempts;
    status.next_attempt_at = current.rare.next_attempt_at_ms.map(timestamp_from_ms);
    status.operation = current.in_flight.as_deref().map(in_flight_to_proto);
    status.modifications = current.modifications;
}

fn fill_waiting(status: &mut v1::ItemStatus, waiting: &WaitingItem) {
    status.pending_operation = operation_kind_to_proto(waiting.operation).into();
    status.reason = wait_reason_to_proto(waiting.reason).into();
    status.blocked_by = waiting
        .blocked_by
        .iter()
        .map(|blocked| v1::BlockedBy {
            item: Some(item_ref_to_proto(&blocked.item)),
            why: blocked.why.to_string(),
        })
        .collect();
}

/// Converts an in-flight operation to its proto form.
pub fn in_flight_to_proto(operation: &InFlight) -> v1::InFlightOperation {
    v1::InFlightOperation {
        kind: operation_kind_to_proto(operation.kind).into(),
        op_id: operation.op_id.clone(),
        attempt: operation.attempt,
        target_generation: operation.target_generation,
        started_at: Some(timestamp_from_ms(operation.started_at_ms)),
        timeout: Some(duration_from_ms(operation.timeout_ms)),
        last_progress_at: operation.last_progress_ms.map(timestamp_from_ms),
        progress_message: operation.progress_message.clone().unwrap_or_default(),
    }
}

// ---------------------------------------------------------------------------
// Conditions
// ---------------------------------------------------------------------------

/// One condition as a proto message.
pub fn condition_to_proto(condition: &Condition) -> v1::Condition {
    let status = if condition.status {
        v1::ConditionStatus::True
    } else {
        v1::ConditionStatus::False
    };
    v1::Condition {
        r#type: condition.kind.as_str().to_string(),
        status: status.into(),
        reason: condition.reason.clone(),
        message: condition.message.clone(),
        observed_generation: condition.observed_generation,
        last_transition_time: Some(timestamp_from_ms(condition.last_transition_ms)),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::engine::plan::BlockedBy;
    use crate::graph::{Item, Properties};
    use crate::wire::properties_from_struct;
    use crate::wire::testkit::{in_flight, props, proto_ref};

    #[test]
    fn enums_map_to_their_proto_values() {
        assert_eq!(
            item_state_to_proto(ItemState::Failed),
            v1::ItemState::Failed
        );
        assert_eq!(
            item_state_to_proto(ItemState::Unknown),
            v1::ItemState::Unknown
        );
        assert_eq!(
            operation_kind_to_proto(OperationKind::Read),
            v1::OperationKind::Read
        );
        assert_eq!(
            wait_reason_to_proto(WaitReason::TerminalFailure),
            v1::WaitReason::TerminalFailure
        );
        assert_eq!(
            wait_reason_to_proto(WaitReason::NoConfigurator),
            v1::WaitReason::NoConfigurator
        );
    }

    #[test]
    fn operation_errors_become_rpc_statuses_and_back() {
        let error = OperationError {
            code: 14,
            message: "agent gone".into(),
        };
        let status = operation_error_to_status(&error);
        assert_eq!((status.code, status.message.as_str()), (14, "agent gone"));
        assert_eq!(operation_error_from_status(&status), error);
    }

    fn intended(item: Item, generation: u64) -> IntendedItem {
        IntendedItem {
            item: Arc::new(item),
            generation,
            predicates: Default::default(),
        }
    }

    #[test]
    fn an_intended_item_without_current_entry_is_pending() {
        let key = ItemRef::new("t", "a");
        let entry = intended(Item::new("t", "a", Properties::new()), 1);
        let status = item_status(&key, None, Some(&entry), None);
        assert_eq!(status.state(), v1::ItemState::Pending);
        assert_eq!(status.r#ref, Some(proto_ref("t", "a")));
        assert!(status.applied.is_none());
    }

    #[test]
    fn a_creating_item_shows_its_operation_and_no_applied_value() {
        let key = ItemRef::new("t", "a");
        let current = CurrentItem::creating(in_flight(OperationKind::Create));
        let status = item_status(&key, Some(&current), None, None);
        assert_eq!(status.state(), v1::ItemState::Creating);
        assert!(status.applied.is_none());
        let operation = status.operation.unwrap_or_default();
        assert_eq!(operation.kind(), v1::OperationKind::Create);
        assert_eq!(operation.op_id, "op-1");
        assert_eq!((operation.attempt, operation.target_generation), (2, 7));
        assert_eq!(operation.started_at, Some(timestamp_from_ms(1_000)));
        assert_eq!(operation.timeout, Some(duration_from_ms(30_000)));
        assert_eq!(operation.last_progress_at, Some(timestamp_from_ms(5_500)));
    }

    #[test]
    fn a_failed_create_keeps_its_state_and_shows_the_error_and_wait() {
        let key = ItemRef::new("t", "a");
        let mut current = CurrentItem::creating(in_flight(OperationKind::Create));
        current.state = ItemState::Failed;
        current.in_flight = None;
        current.last_operation = Some(OperationKind::Create);
        current.rare.update(|rare| {
            rare.last_error = Some(OperationError {
                code: 14,
                message: "agent gone".into(),
            });
        });
        current.attempts = 3;
        current
            .rare
            .update(|rare| rare.next_attempt_at_ms = Some(9_000));
        let entry = intended(Item::new("t", "a", Properties::new()), 4);
        let waiting = WaitingItem {
            item: key.clone(),
            operation: OperationKind::Create,
            reason: WaitReason::Backoff,
            blocked_by: vec![BlockedBy {
                item: key.clone(),
                why: "retry at 9000".into(),
            }],
        };
        let status = item_status(&key, Some(&current), Some(&entry), Some(&waiting));
        assert_eq!(status.state(), v1::ItemState::Failed);
        assert_eq!(status.last_operation(), v1::OperationKind::Create);
        assert_eq!(status.last_error.as_ref().map(|e| e.code), Some(14));
        assert_eq!(status.attempts, 3);
        assert_eq!(status.next_attempt_at, Some(timestamp_from_ms(9_000)));
        assert_eq!(status.pending_operation(), v1::OperationKind::Create);
        assert_eq!(status.reason(), v1::WaitReason::Backoff);
        assert_eq!(status.blocked_by.len(), 1);
        assert_eq!(status.blocked_by[0].why, "retry at 9000");
    }

    #[test]
    fn a_created_item_shows_applied_observed_and_external() {
        let key = ItemRef::new("t", "a");
        let mut applied = Item::new("t", "a", props(json!({"mtu": 1500})));
        applied.external = true;
        let mut current = CurrentItem::created(Arc::new(applied), 3);
        current.observed = Some(Arc::new(props(json!({"state": "up"}))));
        current.modifications = 2;
        let status = item_status(&key, Some(&current), None, None);
        assert_eq!(status.state(), v1::ItemState::Created);
        assert_eq!(status.applied_generation, 3);
        assert!(status.external);
        assert_eq!(status.modifications, 2);
        let observed = status
            .observed
            .map(|s| properties_from_struct(s, "observed"));
        assert_eq!(observed, Some(Ok(props(json!({"state": "up"})))));
        let applied = status.applied.and_then(|a| a.properties);
        assert_eq!(
            applied.map(|s| properties_from_struct(s, "applied")),
            Some(Ok(props(json!({"mtu": 1500}))))
        );
    }
}
