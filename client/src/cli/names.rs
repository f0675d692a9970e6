//! Short display names of the API's enums and references: `CREATED` for
//! `ITEM_STATE_CREATED`, `file/config` for an item reference.

use crate::proto as v1;

/// `prefix` stripped from a generated enum name; `"?"`-style fallback for
/// values this build does not know.
fn short(name: Option<&'static str>, prefix: &str, value: i32) -> String {
    match name {
        Some(name) => name.strip_prefix(prefix).unwrap_or(name).to_owned(),
        None => format!("UNKNOWN_VALUE_{value}"),
    }
}

/// An item state, e.g. `CREATED`.
pub(crate) fn item_state(value: i32) -> String {
    short(
        v1::ItemState::try_from(value)
            .ok()
            .map(|state| state.as_str_name()),
        "ITEM_STATE_",
        value,
    )
}

/// An operation kind, e.g. `CREATE`.
pub(crate) fn operation_kind(value: i32) -> String {
    short(
        v1::OperationKind::try_from(value)
            .ok()
            .map(|kind| kind.as_str_name()),
        "OPERATION_KIND_",
        value,
    )
}

/// A wait reason, e.g. `DEPENDENCY`.
pub(crate) fn wait_reason(value: i32) -> String {
    short(
        v1::WaitReason::try_from(value)
            .ok()
            .map(|reason| reason.as_str_name()),
        "WAIT_REASON_",
        value,
    )
}

/// A condition status, e.g. `True`.
pub(crate) fn condition_status(value: i32) -> String {
    match v1::ConditionStatus::try_from(value) {
        Ok(v1::ConditionStatus::True) => "True".to_owned(),
        Ok(v1::ConditionStatus::False) => "False".to_owned(),
        Ok(v1::ConditionStatus::Unknown) => "Unknown".to_owned(),
        _ => "Unspecified".to_owned(),
    }
}

/// Conditions on one line, e.g. `Ready=False(Stalled) Reconciling=True`.
pub(crate) fn conditions_line(conditions: &[v1::Condition]) -> String {
    conditions
        .iter()
        .map(|condition| {
            let status = condition_status(condition.status);
            if condition.reason.is_empty() {
                format!("{}={status}", condition.r#type)
            } else {
                format!("{}={status}({})", condition.r#type, condition.reason)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// An operation outcome, e.g. `DONE`.
pub(crate) fn outcome(value: i32) -> String {
    short(
        v1::Outcome::try_from(value)
            .ok()
            .map(|outcome| outcome.as_str_name()),
        "OUTCOME_",
        value,
    )
}

/// A watch event kind, e.g. `ITEM_STATUS_CHANGED`.
pub(crate) fn event_kind(value: i32) -> String {
    short(
        v1::EventKind::try_from(value)
            .ok()
            .map(|kind| kind.as_str_name()),
        "EVENT_KIND_",
        value,
    )
}

/// A gRPC code number as its name, e.g. `INVALID_ARGUMENT`.
pub(crate) fn code(value: i32) -> String {
    let name = match tonic::Code::from_i32(value) {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "CANCELLED",
        tonic::Code::Unknown => "UNKNOWN",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::AlreadyExists => "ALREADY_EXISTS",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::Aborted => "ABORTED",
        tonic::Code::OutOfRange => "OUT_OF_RANGE",
        tonic::Code::Unimplemented => "UNIMPLEMENTED",
        tonic::Code::Internal => "INTERNAL",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::DataLoss => "DATA_LOSS",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
    };
    name.to_owned()
}

/// An item reference as `type/name`.
pub(crate) fn item_ref(reference: Option<&v1::ItemRef>) -> String {
    match reference {
        Some(reference) => format!("{}/{}", reference.r#type, reference.name),
        None => "?/?".to_owned(),
    }
}

/// A `google.rpc.Status` as `CODE: message`.
pub(crate) fn rpc_status(status: &reconciled_proto::google::rpc::Status) -> String {
    format!("{}: {}", code(status.code), status.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_names_lose_their_prefix() {
        assert_eq!(item_state(v1::ItemState::Created as i32), "CREATED");
        assert_eq!(operation_kind(v1::OperationKind::Delete as i32), "DELETE");
        assert_eq!(wait_reason(v1::WaitReason::Dependency as i32), "DEPENDENCY");
        assert_eq!(
            event_kind(v1::EventKind::IntentChanged as i32),
            "INTENT_CHANGED"
        );
        assert_eq!(item_state(99), "UNKNOWN_VALUE_99");
        assert_eq!(code(3), "INVALID_ARGUMENT");
    }
}
