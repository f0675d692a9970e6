//! What a configurator answers, and how answers become `OperationResult`s.

use std::fmt;
use std::time::Duration;

use reconciled_proto::google::rpc;
use reconciled_proto::v1;
use serde_json::{Map, Value};
use tonic::Code;

use super::item::PropertiesError;
use crate::convert::{duration_to_proto, properties_to_struct};

/// The kind of an operation the server asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperationKind {
    /// Create the item from its intended value.
    Create,
    /// Change the item in place from its applied value to its intended value.
    Modify,
    /// Delete the item.
    Delete,
    /// Read the item's actual state (types that declare `supports_read`).
    Read,
    /// Decide whether a change needs a delete + create (types that declare
    /// `ask_needs_recreate`).
    NeedsRecreate,
}

impl OperationKind {
    /// The SDK kind of a proto kind; `None` for `UNSPECIFIED` and values this
    /// SDK does not know.
    pub fn from_proto(kind: i32) -> Option<Self> {
        match v1::OperationKind::try_from(kind).ok()? {
            v1::OperationKind::Unspecified => None,
            v1::OperationKind::Create => Some(Self::Create),
            v1::OperationKind::Modify => Some(Self::Modify),
            v1::OperationKind::Delete => Some(Self::Delete),
            v1::OperationKind::Read => Some(Self::Read),
            v1::OperationKind::NeedsRecreate => Some(Self::NeedsRecreate),
        }
    }
}

impl fmt::Display for OperationKind {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Self::Create => "create",
            Self::Modify => "modify",
            Self::Delete => "delete",
            Self::Read => "read",
            Self::NeedsRecreate => "needs-recreate",
        })
    }
}

/// Whether the server treats a failure with `code` as terminal (no retry
/// until the item's intent changes): `INVALID_ARGUMENT`,
/// `FAILED_PRECONDITION`, `PERMISSION_DENIED` and `UNIMPLEMENTED`. Every
/// other code is retried with the type's retry policy.
pub fn is_terminal_code(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::PermissionDenied
            | Code::Unimplemented
    )
}

/// The outcome of a Create, Modify or Delete.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Applied. `observed` optionally reports the item's actual properties
    /// (predicates of dependents see them laid over the applied value).
    Done {
        /// The item's actual properties, if the configurator knows them.
        observed: Option<Map<String, Value>>,
    },
    /// Failed. The server decides from `code` whether to retry (see
    /// [`is_terminal_code`]).
    Failed {
        /// The gRPC code; `Ok` is sent as `UNKNOWN`.
        code: Code,
        /// What went wrong, for the item's status.
        message: String,
    },
    /// Not a failure: ask again after `retry_after`, without counting an
    /// attempt.
    Wait {
        /// How long to wait.
        retry_after: Duration,
    },
    /// The operation goes on in the background: return this after
    /// [`OperationContext::finish_later`](super::OperationContext::finish_later),
    /// and send the final outcome through the [`Completion`](super::Completion).
    InProgress,
    /// Stopped because the operation was cancelled, as asked
    /// ([`OperationContext::cancelled`](super::OperationContext::cancelled)
    /// fired: the server sent `CancelOperation`, a newer attempt replaced
    /// this one, or the agent is shutting down). Not a failure: the server
    /// must not count it as an attempt. Return it only once the operation
    /// has stopped and left the item as a later (idempotent) operation can
    /// take it over; if the work finished after all, return `Done` instead.
    ///
    /// On the wire (protocol version 1 has no outcome of its own for it) it
    /// is `OUTCOME_FAILED` with `status.code = CANCELLED` (1). Returned
    /// while the operation was *not* cancelled, the SDK sends a retryable
    /// `ABORTED` failure instead, so a mistaken `cancelled()` cannot loop
    /// without backoff.
    Cancelled,
}

impl Outcome {
    /// Applied, with no observed properties.
    pub fn done() -> Self {
        Self::Done { observed: None }
    }

    /// Applied; the item's actual properties are `observed`.
    pub fn done_observed(observed: Map<String, Value>) -> Self {
        Self::Done {
            observed: Some(observed),
        }
    }

    /// Failed with `code` and `message`.
    pub fn failed(code: Code, message: impl Into<String>) -> Self {
        Self::Failed {
            code,
            message: message.into(),
        }
    }

    /// Failed terminally because the item is invalid (`INVALID_ARGUMENT`).
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::failed(Code::InvalidArgument, message)
    }

    /// Failed for a reason that may pass (`UNAVAILABLE`, retried).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::failed(Code::Unavailable, message)
    }

    /// Ask again after `retry_after`.
    pub fn wait(retry_after: Duration) -> Self {
        Self::Wait { retry_after }
    }

    /// Goes on in the background (see [`Outcome::InProgress`]).
    pub fn in_progress() -> Self {
        Self::InProgress
    }

    /// Cancelled as asked (see [`Outcome::Cancelled`]): return it when
    /// [`OperationContext::cancelled`](super::OperationContext::cancelled)
    /// fired and the operation stopped.
    ///
    /// ```
    /// use std::time::Duration;
    /// use reconciled_client::agent::{OperationContext, Outcome};
    ///
    /// async fn slow_create(ctx: &OperationContext) -> Outcome {
    ///     tokio::select! {
    ///         () = tokio::time::sleep(Duration::from_secs(60)) => Outcome::done(),
    ///         () = ctx.cancelled() => Outcome::cancelled(),
    ///     }
    /// }
    /// ```
    pub fn cancelled() -> Self {
        Self::Cancelled
    }
}

/// An operation written as a function returning `Result<Outcome, Outcome>`,
/// so that `?` works inside it (an early `Err` is the outcome), answers
/// with whichever it returned:
///
/// ```
/// use reconciled_client::prelude::*;
/// # #[derive(reconciled_client::serde::Deserialize)]
/// # #[serde(crate = "reconciled_client::serde")]
/// # struct Listener { port: u16 }
///
/// struct Listeners;
///
/// impl Listeners {
///     async fn ensure(&self, item: &Item) -> Result<Outcome, Outcome> {
///         // A `PropertiesError` becomes a terminal INVALID_ARGUMENT.
///         let listener: Listener = item.properties_as()?;
///         if listener.port < 1024 {
///             return Err(Outcome::invalid_argument("ports below 1024 are refused"));
///         }
///         Ok(Outcome::done())
///     }
/// }
///
/// impl Configurator for Listeners {
///     async fn create(&self, _ctx: &OperationContext, item: &Item) -> Outcome {
///         self.ensure(item).await.into()
///     }
///     async fn modify(&self, _ctx: &OperationContext, _previous: &Item, item: &Item) -> Outcome {
///         self.ensure(item).await.into()
///     }
///     async fn delete(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
///         Outcome::done()
///     }
/// }
/// ```
impl From<Result<Outcome, Outcome>> for Outcome {
    fn from(result: Result<Outcome, Outcome>) -> Self {
        result.unwrap_or_else(|outcome| outcome)
    }
}

/// Properties of the wrong shape are an invalid item: `INVALID_ARGUMENT`.
impl From<PropertiesError> for Outcome {
    fn from(error: PropertiesError) -> Self {
        Self::invalid_argument(error.to_string())
    }
}

/// The outcome of a Read.
#[derive(Debug, Clone, PartialEq)]
pub enum ReadOutcome {
    /// The item exists with these properties.
    Found {
        /// The item's actual properties.
        observed: Map<String, Value>,
    },
    /// The item does not exist (sent as `FAILED` with `NOT_FOUND`; the
    /// server removes it from current state).
    NotFound,
    /// Reading failed.
    Failed {
        /// The gRPC code.
        code: Code,
        /// What went wrong.
        message: String,
    },
    /// Ask again after `retry_after`.
    Wait {
        /// How long to wait.
        retry_after: Duration,
    },
    /// The configurator cannot read items (sent as `FAILED` with
    /// `UNIMPLEMENTED`). The default of [`Configurator::read`](super::Configurator::read).
    Unsupported,
}

impl From<PropertiesError> for ReadOutcome {
    fn from(error: PropertiesError) -> Self {
        Self::Failed {
            code: Code::InvalidArgument,
            message: error.to_string(),
        }
    }
}

/// The final answer to one operation, before it becomes an
/// `OperationResult`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    /// The answer to Create, Modify or Delete.
    Outcome(Outcome),
    /// The answer to Read.
    Read(ReadOutcome),
    /// The answer to NEEDS_RECREATE.
    NeedsRecreate(bool),
}

impl From<ReadOutcome> for Outcome {
    fn from(read: ReadOutcome) -> Self {
        match read {
            ReadOutcome::Found { observed } => Outcome::done_observed(observed),
            ReadOutcome::NotFound => Outcome::failed(Code::NotFound, "the item does not exist"),
            ReadOutcome::Failed { code, message } => Outcome::Failed { code, message },
            ReadOutcome::Wait { retry_after } => Outcome::Wait { retry_after },
            ReadOutcome::Unsupported => Outcome::failed(
                Code::Unimplemented,
                "this configurator does not implement read; declare supports_read only for types \
                 whose configurator implements Configurator::read",
            ),
        }
    }
}

/// Builds the `OperationResult` for `answer` to operation (`op_id`,
/// `attempt`).
pub(crate) fn result_message(op_id: &str, attempt: u32, answer: Answer) -> v1::OperationResult {
    let mut result = v1::OperationResult {
        op_id: op_id.to_owned(),
        attempt,
        ..v1::OperationResult::default()
    };
    let outcome = match answer {
        Answer::Outcome(outcome) => outcome,
        Answer::Read(read) => Outcome::from(read),
        Answer::NeedsRecreate(needs_recreate) => {
            result.set_outcome(v1::Outcome::Done);
            result.needs_recreate = needs_recreate;
            return result;
        }
    };
    match outcome {
        Outcome::Done { observed } => {
            result.set_outcome(v1::Outcome::Done);
            result.observed = observed.as_ref().map(properties_to_struct);
        }
        Outcome::Failed { code, message } => {
            let code = if code == Code::Ok {
                Code::Unknown
            } else {
                code
            };
            result.set_outcome(v1::Outcome::Failed);
            result.status = Some(rpc::Status {
                code: code as i32,
                message,
                details: Vec::new(),
            });
        }
        Outcome::Wait { retry_after } => {
            result.set_outcome(v1::Outcome::Wait);
            result.retry_after = Some(duration_to_proto(retry_after));
        }
        Outcome::InProgress => result.set_outcome(v1::Outcome::InProgress),
        Outcome::Cancelled => {
            result.set_outcome(v1::Outcome::Failed);
            result.status = Some(rpc::Status {
                code: Code::Cancelled as i32,
                message: CANCELLED_MESSAGE.to_owned(),
                details: Vec::new(),
            });
        }
    }
    result
}

/// The status message of a result for [`Outcome::Cancelled`].
pub(crate) const CANCELLED_MESSAGE: &str =
    "cancelled as asked: the operation stopped before it finished";

/// What kind of result was sent, for [`AgentEvent`](super::AgentEvent)s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultKind {
    /// `OUTCOME_DONE` (for NEEDS_RECREATE, with the answer).
    Done,
    /// `OUTCOME_IN_PROGRESS`: a long-running operation was accepted.
    InProgress,
    /// `OUTCOME_FAILED` with this code.
    Failed(Code),
    /// `OUTCOME_WAIT`.
    Wait,
}

impl ResultKind {
    /// The kind of a result message.
    pub(crate) fn of(result: &v1::OperationResult) -> Self {
        match result.outcome() {
            v1::Outcome::InProgress => Self::InProgress,
            v1::Outcome::Failed => Self::Failed(
                result
                    .status
                    .as_ref()
                    .map_or(Code::Unknown, |status| Code::from_i32(status.code)),
            ),
            v1::Outcome::Wait => Self::Wait,
            v1::Outcome::Done | v1::Outcome::Unspecified => Self::Done,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn done_carries_observed_properties() {
        let mut observed = Map::new();
        observed.insert("size".into(), json!(12));
        let result = result_message("op-1", 2, Answer::Outcome(Outcome::done_observed(observed)));
        assert_eq!(result.op_id, "op-1");
        assert_eq!(result.attempt, 2);
        assert_eq!(result.outcome(), v1::Outcome::Done);
        assert!(
            result
                .observed
                .is_some_and(|s| s.fields.contains_key("size"))
        );
        assert_eq!(result.status, None);
    }

    #[test]
    fn failed_carries_a_status_and_never_code_ok() {
        let result = result_message(
            "op",
            1,
            Answer::Outcome(Outcome::failed(Code::FailedPrecondition, "not empty")),
        );
        assert_eq!(result.outcome(), v1::Outcome::Failed);
        let status = result.status.expect("a status");
        assert_eq!(status.code, Code::FailedPrecondition as i32);
        assert_eq!(status.message, "not empty");

        let result = result_message("op", 1, Answer::Outcome(Outcome::failed(Code::Ok, "odd")));
        assert_eq!(result.status.map(|s| s.code), Some(Code::Unknown as i32));
    }

    #[test]
    fn wait_carries_retry_after() {
        let result = result_message(
            "op",
            1,
            Answer::Outcome(Outcome::wait(Duration::from_secs(3))),
        );
        assert_eq!(result.outcome(), v1::Outcome::Wait);
        assert_eq!(result.retry_after.map(|d| d.seconds), Some(3));
    }

    #[test]
    fn cancelled_is_failed_with_code_cancelled_on_the_wire() {
        let result = result_message("op", 2, Answer::Outcome(Outcome::cancelled()));
        assert_eq!(result.outcome(), v1::Outcome::Failed);
        assert_eq!(result.attempt, 2);
        let status = result.status.as_ref().expect("a status");
        assert_eq!(status.code, 1, "google.rpc.Code CANCELLED");
        assert_eq!(status.message, CANCELLED_MESSAGE);
        assert_eq!(ResultKind::of(&result), ResultKind::Failed(Code::Cancelled));
    }

    #[test]
    fn reads_map_not_found_and_unsupported_to_failure_codes() {
        let not_found = result_message("op", 1, Answer::Read(ReadOutcome::NotFound));
        assert_eq!(
            ResultKind::of(&not_found),
            ResultKind::Failed(Code::NotFound)
        );
        let unsupported = result_message("op", 1, Answer::Read(ReadOutcome::Unsupported));
        assert_eq!(
            ResultKind::of(&unsupported),
            ResultKind::Failed(Code::Unimplemented)
        );
        let found = result_message(
            "op",
            1,
            Answer::Read(ReadOutcome::Found {
                observed: Map::new(),
            }),
        );
        assert_eq!(found.outcome(), v1::Outcome::Done);
        assert!(found.observed.is_some());
    }

    #[test]
    fn needs_recreate_answers_done_with_the_flag() {
        let result = result_message("op", 1, Answer::NeedsRecreate(true));
        assert_eq!(result.outcome(), v1::Outcome::Done);
        assert!(result.needs_recreate);
    }

    #[test]
    fn terminal_codes_are_the_four_the_server_does_not_retry() {
        assert!(is_terminal_code(Code::InvalidArgument));
        assert!(is_terminal_code(Code::Unimplemented));
        assert!(!is_terminal_code(Code::Unavailable));
        assert!(!is_terminal_code(Code::NotFound));
    }

    #[test]
    fn proto_kinds_map_to_sdk_kinds() {
        assert_eq!(OperationKind::from_proto(1), Some(OperationKind::Create));
        assert_eq!(
            OperationKind::from_proto(5),
            Some(OperationKind::NeedsRecreate)
        );
        assert_eq!(OperationKind::from_proto(0), None);
        assert_eq!(OperationKind::from_proto(99), None);
    }
}
