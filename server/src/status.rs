//! The one place where errors become `tonic::Status` (DESIGN section 8,
//! error table).
//!
//! Whatever refuses a call (the handlers in [`crate::api`], authentication
//! in [`crate::auth`], the global limits in [`crate::limits`]) says why with
//! an [`ApiError`]; `From<ApiError> for tonic::Status` picks the gRPC code,
//! writes a message that says what went wrong and what to do, and attaches
//! the `google.rpc` details (`BadRequest`, `ErrorInfo`, `QuotaFailure`,
//! `RetryInfo`) that clients decode with `tonic_types::StatusExt`.
//!
//! This room sits below every room that refuses calls and depends only on
//! [`crate::graph`], so any of them may use it without reaching up into
//! `api/`. Conversions from a room's own errors into [`ApiError`] live next
//! to the callers that need them (e.g. `From<WatchError>` in `api/watch.rs`).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::graph::ItemRef;
use crate::graph::validate::FieldViolation;

/// The `ErrorInfo.domain` of every error this service reports.
pub const ERROR_DOMAIN: &str = "reconciled.dev";

/// `ErrorInfo.reason` values (UPPER_SNAKE_CASE, part of the API contract).
pub mod reason {
    /// The intended graph would contain a dependency cycle.
    pub const DEPENDENCY_CYCLE: &str = "DEPENDENCY_CYCLE";
    /// An item of the request is listed in a subgraph the request does not own.
    pub const ITEM_IN_OTHER_SUBGRAPH: &str = "ITEM_IN_OTHER_SUBGRAPH";
    /// `expected_generation` did not match the tenant's generation.
    pub const GENERATION_MISMATCH: &str = "GENERATION_MISMATCH";
    /// A watch asked for a revision older than the retained event log.
    pub const REVISION_COMPACTED: &str = "REVISION_COMPACTED";
    /// An agent spoke a configurator protocol version this server does not.
    pub const UNSUPPORTED_PROTOCOL: &str = "UNSUPPORTED_PROTOCOL";
    /// An item type is already handled by another live agent session.
    pub const TYPE_HELD: &str = "TYPE_HELD";
    /// A tenant's stored records could not be read at start-up.
    pub const TENANT_QUARANTINED: &str = "TENANT_QUARANTINED";
    /// With replicas on etcd: another replica serves the tenant (metadata
    /// `owner`: its address, empty while none does).
    pub const NOT_OWNER: &str = "NOT_OWNER";
    /// A stream opened with a tenant's token ended because `RotateToken`
    /// replaced the token: reconnect with the new one.
    pub const TOKEN_ROTATED: &str = "TOKEN_ROTATED";
    /// A stream opened with a tenant's token ended because the tenant was
    /// deleted: no token opens it again.
    pub const TENANT_DELETED: &str = "TENANT_DELETED";
}

/// Everything an RPC can fail with, in API terms. Each variant maps to one
/// row of DESIGN section 8's error table; its `Display` text is the status
/// message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The request is invalid: `INVALID_ARGUMENT` with a `BadRequest`, plus
    /// an `ErrorInfo` when `reason` is set.
    #[error("{}", invalid_argument_message(violations))]
    InvalidArgument {
        /// Each problem with its field path, e.g. `items[3].dependencies[0].requires`.
        violations: Vec<FieldViolation>,
        /// Machine-readable reason for `ErrorInfo`, e.g. [`reason::DEPENDENCY_CYCLE`].
        reason: Option<&'static str>,
        /// `ErrorInfo.metadata` (only sent with a reason).
        metadata: BTreeMap<String, String>,
    },
    /// `NOT_FOUND`. Used alike for things that do not exist and for things
    /// the caller may not see, so the message reveals neither.
    #[error(
        "{what} was not found, or your credentials do not grant access to it; \
         check the name and the token"
    )]
    NotFound {
        /// What was looked for, e.g. `tenant "acme"`.
        what: String,
    },
    /// `expected_generation` did not match: `FAILED_PRECONDITION` with
    /// `ErrorInfo{GENERATION_MISMATCH}`.
    #[error(
        "tenant generation is {actual} but expected_generation was {expected}; \
         fetch the graph and resubmit"
    )]
    GenerationMismatch {
        /// The generation the caller expected.
        expected: u64,
        /// The tenant's generation.
        actual: u64,
    },
    /// Missing or bad credentials: `UNAUTHENTICATED`.
    #[error("{message}")]
    Unauthenticated {
        /// What is wrong with the credentials and what to send instead.
        message: String,
        /// For a stream whose token was revoked while it was open, why
        /// ([`reason::TOKEN_ROTATED`], [`reason::TENANT_DELETED`]), sent as
        /// an `ErrorInfo`.
        reason: Option<&'static str>,
    },
    /// A limit was hit: `RESOURCE_EXHAUSTED` with a `QuotaFailure`.
    #[error("quota exceeded for {subject}: {description}")]
    QuotaExceeded {
        /// The limit, e.g. `max_request_items`.
        subject: String,
        /// What exceeded it and what to do.
        description: String,
    },
    /// A watcher fell too far behind and was dropped: `RESOURCE_EXHAUSTED`
    /// with a `RetryInfo`.
    #[error(
        "the watch fell too far behind the event stream and was closed; \
         resume it from the last revision received after {} ms",
        retry_after.as_millis()
    )]
    SlowConsumer {
        /// How long to wait before resuming.
        retry_after: Duration,
    },
    /// A watch asked for a revision whose events are gone: `OUT_OF_RANGE`
    /// with `ErrorInfo{REVISION_COMPACTED}`.
    #[error(
        "revision {requested} is compacted (the oldest revision available is \
         {compact_revision}): the events after it are gone; watch from revision 0 for a \
         fresh snapshot, or read the graph with GetGraph and watch from the revision it \
         answers"
    )]
    RevisionCompacted {
        /// The revision asked for.
        requested: u64,
        /// The oldest revision still available.
        compact_revision: u64,
    },
    /// A watch asked to resume after a revision the tenant has not reached
    /// (it was deleted and created again under its name, restored from a
    /// backup or repaired since the watcher saw that revision): the events
    /// the watcher expects are not there to send. `OUT_OF_RANGE` with
    /// `ErrorInfo{REVISION_COMPACTED}`, since the remedy is the same (the
    /// whole history the watcher knew is gone): start again from a
    /// snapshot.
    #[error(
        "revision {requested} is ahead of the tenant's latest revision {current} (the tenant \
         was deleted and created again, restored or repaired since): the history after it \
         is not there; watch from revision 0 for a fresh snapshot, or read the graph with \
         GetGraph and watch from the revision it answers"
    )]
    RevisionAhead {
        /// The revision asked for.
        requested: u64,
        /// The tenant's latest revision.
        current: u64,
    },
    /// An agent's protocol version is not spoken here: `FAILED_PRECONDITION`
    /// with `ErrorInfo{UNSUPPORTED_PROTOCOL}`.
    #[error(
        "configurator protocol version {requested} is not supported; this server \
         speaks version {supported}: upgrade or downgrade the agent SDK"
    )]
    UnsupportedProtocol {
        /// The version the agent sent.
        requested: u32,
        /// The version this server speaks.
        supported: u32,
    },
    /// An item type is handled by another live agent: `FAILED_PRECONDITION`
    /// with `ErrorInfo{TYPE_HELD}`.
    #[error(
        "item type {item_type:?} is already handled by the live agent {holder:?}; \
         stop that agent, or wait for its session to expire, then reconnect"
    )]
    TypeHeld {
        /// The contested item type.
        item_type: String,
        /// The agent that holds it.
        holder: String,
    },
    /// A tenant whose stored records could not be read at start-up is not
    /// served: `FAILED_PRECONDITION` with `ErrorInfo{TENANT_QUARANTINED}`.
    #[error(
        "tenant {name:?} is quarantined: its stored records could not be read at start-up \
         ({error}); delete it with DeleteTenant, or restore the data directory from a backup"
    )]
    TenantQuarantined {
        /// The tenant.
        name: String,
        /// Why its records could not be read.
        error: String,
    },
    /// An item is listed in a subgraph the request does not own:
    /// `INVALID_ARGUMENT` with `ErrorInfo{ITEM_IN_OTHER_SUBGRAPH}` and a
    /// `BadRequest` violation at `field`.
    #[error(
        "{field}: item {item} is listed in subgraph {subgraph:?}; submit it there, \
         or remove it from there first"
    )]
    ItemInOtherSubgraph {
        /// Field path of the item in the request, e.g. `items[4]`.
        field: String,
        /// The item.
        item: ItemRef,
        /// The subgraph that lists it now (empty = root).
        subgraph: String,
    },
    /// A global server limit (connections, request rate, unary calls
    /// running at once) refused the call: `RESOURCE_EXHAUSTED` with a
    /// `RetryInfo` saying when to try again.
    #[error("{message}")]
    Overloaded {
        /// Which limit was reached (naming its setting) and what to do.
        message: String,
        /// How long to wait before retrying.
        retry_after: Duration,
    },
    /// The request message is larger than `max_message_bytes`:
    /// `RESOURCE_EXHAUSTED` with a `QuotaFailure` on `max_message_bytes`
    /// whose description is `detail`.
    #[error(
        "the request is larger than the server accepts: {detail}; split it \
         (e.g. into subgraphs)"
    )]
    MessageTooLarge {
        /// What the transport said about the sizes, e.g. `decoded message
        /// length too large: found 17000000 bytes, the limit is: 16777216 bytes`.
        detail: String,
    },
    /// The caller is authenticated but this RPC is not for it (e.g. a
    /// tenant token on an admin RPC): `PERMISSION_DENIED`, no details.
    #[error("{message}")]
    PermissionDenied {
        /// What the RPC needs and what the caller's token may do instead.
        message: String,
    },
    /// Something did not happen in time (a call ran past the server's
    /// timeout, an agent did not register or went silent past its lease):
    /// `DEADLINE_EXCEEDED`, no details.
    #[error("{message}")]
    DeadlineExceeded {
        /// What took too long, the limit, and what to do.
        message: String,
    },
    /// A `Configurators.Connect` stream ended before its first message,
    /// which must be `Register`: `INVALID_ARGUMENT`, no details.
    #[error("the stream ended before Register")]
    StreamEndedBeforeRegister,
    /// A page token refers to a revision that is no longer kept:
    /// `ABORTED`. (The figures are `MAX_PINNED_SNAPSHOTS` and
    /// `PINNED_SNAPSHOT_IDLE` of `tenant::snapshot`.)
    #[error(
        "the page token refers to a revision that is no longer kept (a listing's \
         revision is kept while a page of it is read at least every 60 s, for the 16 \
         listings of a tenant read most recently); restart the listing without a page token"
    )]
    PageTokenExpired,
    /// `ALREADY_EXISTS`.
    #[error("{what} already exists; pick another name, or use the existing one")]
    AlreadyExists {
        /// What exists, e.g. `tenant "acme"`.
        what: String,
    },
    /// The tenant was deleted while a stream of it was open: `NOT_FOUND`.
    #[error("the tenant was deleted; its watch has ended")]
    TenantDeleted,
    /// The service cannot serve the request now (e.g. shutting down):
    /// `UNAVAILABLE`, which clients retry.
    #[error("{message}")]
    Unavailable {
        /// What is unavailable and when to retry.
        message: String,
    },
    /// With replicas on etcd, this replica does not serve the tenant:
    /// another one does (`owner`, its address), or none does for a moment
    /// (a hand-off or a failover). `UNAVAILABLE` with
    /// `ErrorInfo{NOT_OWNER, metadata: {tenant, owner}}` and a `RetryInfo`;
    /// agents reconnect to `owner` at once.
    #[error("{}", not_owner_message(tenant, owner.as_deref()))]
    NotOwner {
        /// The tenant.
        tenant: String,
        /// The address of the replica that serves it, if one does.
        owner: Option<String>,
    },
    /// A bug or a broken store: `INTERNAL`. Logged at ERROR when converted.
    #[error("internal error: {message}; the server logged it, retry later or report it")]
    Internal {
        /// A short description without internals beyond what helps the caller.
        message: String,
    },
}

impl ApiError {
    /// An invalid request with these violations and no `ErrorInfo`.
    pub fn invalid_argument(violations: Vec<FieldViolation>) -> Self {
        Self::InvalidArgument {
            violations,
            reason: None,
            metadata: BTreeMap::new(),
        }
    }

    /// An invalid request with one violation at `field`.
    pub fn invalid_field(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self::invalid_argument(vec![FieldViolation::new(field, description)])
    }

    /// A dependency cycle: a violation at `field` (the request item that
    /// closes the cycle) naming the cycle, and
    /// `ErrorInfo{DEPENDENCY_CYCLE, metadata: {cycle: "a -> b -> a"}}`.
    /// `cycle` repeats its first item at the end, as `find_cycle` returns it.
    pub fn dependency_cycle(field: impl Into<String>, cycle: &[ItemRef]) -> Self {
        let path = cycle
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" -> ");
        let description =
            format!("closes the dependency cycle {path}; remove one of these dependencies");
        Self::InvalidArgument {
            violations: vec![FieldViolation::new(field, description)],
            reason: Some(reason::DEPENDENCY_CYCLE),
            metadata: BTreeMap::from([("cycle".to_owned(), path)]),
        }
    }

    /// Missing or bad credentials, with a message saying what to send.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::Unauthenticated {
            message: message.into(),
            reason: None,
        }
    }

    /// Credentials revoked while a stream was open, with the `ErrorInfo`
    /// reason that says why.
    pub fn unauthenticated_because(message: impl Into<String>, reason: &'static str) -> Self {
        Self::Unauthenticated {
            message: message.into(),
            reason: Some(reason),
        }
    }

    /// An internal error with this message.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::Internal {
            message: message.into(),
        }
    }

    /// The gRPC code this error maps to.
    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument { .. }
            | Self::ItemInOtherSubgraph { .. }
            | Self::StreamEndedBeforeRegister => Code::InvalidArgument,
            Self::NotFound { .. } | Self::TenantDeleted => Code::NotFound,
            Self::GenerationMismatch { .. }
            | Self::UnsupportedProtocol { .. }
            | Self::TypeHeld { .. }
            | Self::TenantQuarantined { .. } => Code::FailedPrecondition,
            Self::Unauthenticated { .. } => Code::Unauthenticated,
            Self::QuotaExceeded { .. }
            | Self::SlowConsumer { .. }
            | Self::Overloaded { .. }
            | Self::MessageTooLarge { .. } => Code::ResourceExhausted,
            Self::PermissionDenied { .. } => Code::PermissionDenied,
            Self::DeadlineExceeded { .. } => Code::DeadlineExceeded,
            Self::RevisionCompacted { .. } | Self::RevisionAhead { .. } => Code::OutOfRange,
            Self::PageTokenExpired => Code::Aborted,
            Self::AlreadyExists { .. } => Code::AlreadyExists,
            Self::Unavailable { .. } | Self::NotOwner { .. } => Code::Unavailable,
            Self::Internal { .. } => Code::Internal,
        }
    }

    /// The `google.rpc` details this error carries, if any.
    fn details(&self) -> Option<ErrorDetails> {
        match self {
            Self::InvalidArgument {
                violations,
                reason,
                metadata,
            } => Some(invalid_argument_details(violations, *reason, metadata)),
            Self::GenerationMismatch { expected, actual } => Some(error_info(
                reason::GENERATION_MISMATCH,
                [
                    ("expected", expected.to_string()),
                    ("actual", actual.to_string()),
                ],
            )),
            Self::QuotaExceeded {
                subject,
                description,
            } => Some(ErrorDetails::with_quota_failure_violation(
                subject.clone(),
                description.clone(),
            )),
            Self::SlowConsumer { retry_after } | Self::Overloaded { retry_after, .. } => {
                Some(ErrorDetails::with_retry_info(Some(*retry_after)))
            }
            Self::MessageTooLarge { detail } => Some(ErrorDetails::with_quota_failure_violation(
                "max_message_bytes",
                detail.clone(),
            )),
            Self::RevisionCompacted {
                requested,
                compact_revision,
            } => Some(error_info(
                reason::REVISION_COMPACTED,
                [
                    ("compact_revision", compact_revision.to_string()),
                    ("requested_revision", requested.to_string()),
                ],
            )),
            Self::RevisionAhead { requested, current } => Some(error_info(
                reason::REVISION_COMPACTED,
                [
                    ("compact_revision", current.to_string()),
                    ("current_revision", current.to_string()),
                    ("requested_revision", requested.to_string()),
                ],
            )),
            Self::UnsupportedProtocol {
                requested,
                supported,
            } => Some(error_info(
                reason::UNSUPPORTED_PROTOCOL,
                [
                    ("requested", requested.to_string()),
                    ("supported", supported.to_string()),
                ],
            )),
            Self::TypeHeld { item_type, holder } => Some(error_info(
                reason::TYPE_HELD,
                [("item_type", item_type.clone()), ("holder", holder.clone())],
            )),
            Self::TenantQuarantined { name, error } => Some(error_info(
                reason::TENANT_QUARANTINED,
                [("tenant", name.clone()), ("error", error.clone())],
            )),
            Self::ItemInOtherSubgraph { .. } => Some(self.item_in_other_subgraph_details()),
            Self::NotOwner { tenant, owner } => {
                let mut details = error_info(
                    reason::NOT_OWNER,
                    [
                        ("tenant", tenant.clone()),
                        ("owner", owner.clone().unwrap_or_default()),
                    ],
                );
                details.set_retry_info(Some(NOT_OWNER_RETRY));
                Some(details)
            }
            Self::Unauthenticated {
                reason: Some(reason),
                ..
            } => Some(error_info(reason, [])),
            Self::NotFound { .. }
            | Self::TenantDeleted
            | Self::Unauthenticated { reason: None, .. }
            | Self::PermissionDenied { .. }
            | Self::DeadlineExceeded { .. }
            | Self::StreamEndedBeforeRegister
            | Self::PageTokenExpired
            | Self::AlreadyExists { .. }
            | Self::Unavailable { .. }
            | Self::Internal { .. } => None,
        }
    }

    fn item_in_other_subgraph_details(&self) -> ErrorDetails {
        let Self::ItemInOtherSubgraph {
            field,
            item,
            subgraph,
        } = self
        else {
            return ErrorDetails::new();
        };
        let mut details = error_info(
            reason::ITEM_IN_OTHER_SUBGRAPH,
            [("item", item.to_string()), ("subgraph", subgraph.clone())],
        );
        details.add_bad_request_violation(
            field.clone(),
            format!(
                "item {item} is listed in subgraph {subgraph:?}; submit it there, \
                 or remove it from there first"
            ),
        );
        details
    }
}

/// Longest status message sent: status messages and details travel in
/// HTTP/2 headers, which clients refuse past 16 KiB in all (tonic's and
/// grpc-go's default), so what a client sent cannot be echoed whole.
pub const MAX_STATUS_MESSAGE_BYTES: usize = 2 * 1024;

/// Longest text of one field path, description or metadata value in the
/// details.
pub const MAX_DETAIL_TEXT_BYTES: usize = 512;

/// Most bytes of violation text in one `BadRequest`; the violations past it
/// are counted in a last one.
pub const MAX_BAD_REQUEST_BYTES: usize = 4 * 1024;

/// `text` cut at a character boundary to at most `max` bytes, saying how
/// long it was when cut.
fn capped(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub(32);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], text.len())
}

/// The violations sent: each text capped, and no more than
/// [`MAX_BAD_REQUEST_BYTES`] of them, the rest counted.
fn bounded_violations(violations: &[FieldViolation]) -> Vec<FieldViolation> {
    let mut kept = Vec::new();
    let mut bytes = 0;
    for (index, violation) in violations.iter().enumerate() {
        let field = capped(&violation.field, MAX_DETAIL_TEXT_BYTES);
        let description = capped(&violation.description, MAX_DETAIL_TEXT_BYTES);
        bytes += field.len() + description.len() + 8;
        if bytes > MAX_BAD_REQUEST_BYTES {
            kept.push(FieldViolation::new(
                "",
                format!(
                    "{} more problems not shown (the reply's size is bounded); fix these and send again",
                    violations.len() - index
                ),
            ));
            break;
        }
        kept.push(FieldViolation::new(field, description));
    }
    kept
}

impl From<ApiError> for Status {
    fn from(error: ApiError) -> Self {
        let code = error.code();
        let message = capped(&error.to_string(), MAX_STATUS_MESSAGE_BYTES);
        if let ApiError::Internal { message: internal } = &error {
            tracing::error!(error = %internal, "Internal error returned to a client.");
        }
        match error.details() {
            Some(details) => Status::with_error_details(code, message, details),
            None => Status::new(code, message),
        }
    }
}

/// How long a client should wait before retrying a call refused with
/// [`ApiError::NotOwner`] when it does not follow the owner's address.
const NOT_OWNER_RETRY: Duration = Duration::from_millis(200);

/// The status message of [`ApiError::NotOwner`].
fn not_owner_message(tenant: &str, owner: Option<&str>) -> String {
    match owner {
        Some(owner) => format!(
            "tenant {tenant:?} is served by the replica at {owner}; connect there \
             (ErrorInfo NOT_OWNER names it) or retry here"
        ),
        None => format!(
            "tenant {tenant:?} is moving between replicas (a hand-off or a failover); \
             retry in a moment"
        ),
    }
}

/// The status message of an invalid request: the first problem, and how
/// many more the `BadRequest` details list.
fn invalid_argument_message(violations: &[FieldViolation]) -> String {
    match violations {
        [] => "the request is invalid; check it against the API reference".to_owned(),
        [only] => format!("invalid request: {}: {}", only.field, only.description),
        [first, rest @ ..] => format!(
            "invalid request: {}: {} (and {} more problems, listed in the \
             BadRequest details)",
            first.field,
            first.description,
            rest.len()
        ),
    }
}

fn invalid_argument_details(
    violations: &[FieldViolation],
    reason: Option<&str>,
    metadata: &BTreeMap<String, String>,
) -> ErrorDetails {
    let mut details = ErrorDetails::with_bad_request(
        bounded_violations(violations)
            .into_iter()
            .map(|v| tonic_types::FieldViolation::new(v.field, v.description))
            .collect::<Vec<_>>(),
    );
    if let Some(reason) = reason {
        let metadata: HashMap<String, String> = metadata
            .iter()
            .map(|(key, value)| (key.clone(), capped(value, MAX_DETAIL_TEXT_BYTES)))
            .collect();
        details.set_error_info(reason, ERROR_DOMAIN, metadata);
    }
    details
}

/// Details holding only an `ErrorInfo` in our domain.
fn error_info<const N: usize>(reason: &str, metadata: [(&str, String); N]) -> ErrorDetails {
    let metadata: HashMap<String, String> = metadata
        .into_iter()
        .map(|(key, value)| (key.to_owned(), capped(&value, MAX_DETAIL_TEXT_BYTES)))
        .collect();
    ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(error: ApiError) -> Status {
        Status::from(error)
    }

    #[test]
    fn echoed_client_text_is_bounded_so_the_status_fits_the_headers() {
        let key = "k".repeat(5_000);
        let violations: Vec<FieldViolation> = (0..100)
            .map(|index| {
                FieldViolation::new(
                    format!("items[{index}].properties.{key}"),
                    format!("the value under {key} is not a number JSON can hold"),
                )
            })
            .collect();
        let status = status(ApiError::invalid_argument(violations));
        assert!(status.message().len() <= MAX_STATUS_MESSAGE_BYTES);
        assert!(
            status.message().contains("bytes in all"),
            "{}",
            status.message()
        );
        // What the headers carry: the message and the base64 details.
        let sent = status.details().len() * 4 / 3 + status.message().len();
        assert!(sent <= 12 * 1024, "{sent} bytes of message and details");
        let bad_request = status
            .get_error_details()
            .bad_request()
            .cloned()
            .expect("a BadRequest");
        let last = bad_request.field_violations.last().expect("violations");
        assert!(
            last.description.contains("more problems not shown"),
            "{last:?}"
        );
    }

    fn reason_of(status: &Status) -> Option<String> {
        status.get_details_error_info().map(|info| info.reason)
    }

    fn metadata_of(status: &Status, key: &str) -> Option<String> {
        status
            .get_details_error_info()
            .and_then(|info| info.metadata.get(key).cloned())
    }

    fn violation_fields(status: &Status) -> Vec<String> {
        status
            .get_error_details()
            .bad_request()
            .map(|bad| {
                bad.field_violations
                    .iter()
                    .map(|v| v.field.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn invalid_requests_carry_every_field_violation() {
        let status = status(ApiError::invalid_argument(vec![
            FieldViolation::new("items[3].dependencies[0].requires", "is missing"),
            FieldViolation::new("items[4].name", "is empty"),
        ]));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            violation_fields(&status),
            ["items[3].dependencies[0].requires", "items[4].name"]
        );
        assert!(
            status
                .message()
                .contains("items[3].dependencies[0].requires")
        );
        assert!(status.message().contains("1 more"));
        assert_eq!(reason_of(&status), None);
    }

    #[test]
    fn dependency_cycles_name_the_cycle_in_error_info() {
        let cycle = [
            ItemRef::new("t", "a"),
            ItemRef::new("t", "b"),
            ItemRef::new("t", "a"),
        ];
        let status = status(ApiError::dependency_cycle(
            "items[1].dependencies[0]",
            &cycle,
        ));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(reason_of(&status).as_deref(), Some("DEPENDENCY_CYCLE"));
        assert_eq!(
            status.get_details_error_info().map(|info| info.domain),
            Some(ERROR_DOMAIN.to_owned())
        );
        assert_eq!(
            metadata_of(&status, "cycle").as_deref(),
            Some("t/a -> t/b -> t/a")
        );
        assert_eq!(violation_fields(&status), ["items[1].dependencies[0]"]);
    }

    #[test]
    fn not_found_does_not_say_whether_the_tenant_exists() {
        let status = status(ApiError::NotFound {
            what: "tenant \"acme\"".into(),
        });
        assert_eq!(status.code(), Code::NotFound);
        assert!(
            status
                .message()
                .contains("or your credentials do not grant access")
        );
        assert!(status.get_error_details_vec().is_empty());
    }

    #[test]
    fn generation_mismatch_reports_both_generations() {
        let status = status(ApiError::GenerationMismatch {
            expected: 5,
            actual: 7,
        });
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(
            status.message(),
            "tenant generation is 7 but expected_generation was 5; fetch the graph and resubmit"
        );
        assert_eq!(reason_of(&status).as_deref(), Some("GENERATION_MISMATCH"));
        assert_eq!(metadata_of(&status, "expected").as_deref(), Some("5"));
        assert_eq!(metadata_of(&status, "actual").as_deref(), Some("7"));
    }

    #[test]
    fn bad_credentials_are_unauthenticated() {
        let status = status(ApiError::unauthenticated(
            "missing authorization metadata; send `authorization: Bearer <token>`",
        ));
        assert_eq!(status.code(), Code::Unauthenticated);
        assert_eq!(
            status.message(),
            "missing authorization metadata; send `authorization: Bearer <token>`"
        );
        assert!(status.get_error_details_vec().is_empty());
    }

    #[test]
    fn quota_failures_name_the_limit() {
        let status = status(ApiError::QuotaExceeded {
            subject: "max_request_items".into(),
            description: "10001 items, over 10000; split the intent into subgraphs".into(),
        });
        assert_eq!(status.code(), Code::ResourceExhausted);
        let violations = status
            .get_details_quota_failure()
            .map(|quota| quota.violations)
            .unwrap_or_default();
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].subject, "max_request_items");
    }

    #[test]
    fn slow_watchers_are_told_when_to_retry() {
        let status = status(ApiError::SlowConsumer {
            retry_after: Duration::from_secs(2),
        });
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(
            status
                .get_details_retry_info()
                .and_then(|info| info.retry_delay),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn compacted_revisions_are_out_of_range_with_the_oldest_revision() {
        let status = status(ApiError::RevisionCompacted {
            requested: 3,
            compact_revision: 40,
        });
        assert_eq!(status.code(), Code::OutOfRange);
        assert_eq!(reason_of(&status).as_deref(), Some("REVISION_COMPACTED"));
        assert_eq!(
            metadata_of(&status, "compact_revision").as_deref(),
            Some("40")
        );
    }

    #[test]
    fn unsupported_protocols_and_held_types_are_failed_preconditions() {
        let protocol = status(ApiError::UnsupportedProtocol {
            requested: 2,
            supported: 1,
        });
        assert_eq!(protocol.code(), Code::FailedPrecondition);
        assert_eq!(
            reason_of(&protocol).as_deref(),
            Some("UNSUPPORTED_PROTOCOL")
        );
        assert_eq!(metadata_of(&protocol, "supported").as_deref(), Some("1"));

        let held = status(ApiError::TypeHeld {
            item_type: "vlan".into(),
            holder: "agent-7".into(),
        });
        assert_eq!(held.code(), Code::FailedPrecondition);
        assert_eq!(reason_of(&held).as_deref(), Some("TYPE_HELD"));
        assert_eq!(metadata_of(&held, "holder").as_deref(), Some("agent-7"));
    }

    #[test]
    fn items_of_other_subgraphs_are_invalid_with_reason_and_field() {
        let status = status(ApiError::ItemInOtherSubgraph {
            field: "items[4]".into(),
            item: ItemRef::new("vlan", "10"),
            subgraph: "net".into(),
        });
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            reason_of(&status).as_deref(),
            Some("ITEM_IN_OTHER_SUBGRAPH")
        );
        assert_eq!(metadata_of(&status, "item").as_deref(), Some("vlan/10"));
        assert_eq!(violation_fields(&status), ["items[4]"]);
    }

    #[test]
    fn overloads_are_resource_exhausted_with_retry_info_and_the_message_verbatim() {
        let message = "the server's request rate limit (max_requests_per_second) is reached; \
                       retry after the delay in RetryInfo";
        let status = status(ApiError::Overloaded {
            message: message.into(),
            retry_after: Duration::from_millis(250),
        });
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.message(), message);
        assert_eq!(
            status
                .get_details_retry_info()
                .and_then(|info| info.retry_delay),
            Some(Duration::from_millis(250))
        );
        assert!(status.get_details_quota_failure().is_none());
    }

    #[test]
    fn oversized_messages_are_quota_failures_on_max_message_bytes() {
        let detail = "Error, decoded message length too large: found 17000000 bytes, \
                      the limit is: 16777216 bytes";
        let status = status(ApiError::MessageTooLarge {
            detail: detail.into(),
        });
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(
            status.message(),
            format!(
                "the request is larger than the server accepts: {detail}; split it \
                 (e.g. into subgraphs)"
            )
        );
        let violations = status
            .get_details_quota_failure()
            .map(|quota| quota.violations)
            .unwrap_or_default();
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].subject, "max_message_bytes");
        assert_eq!(violations[0].description, detail);
        assert!(status.get_details_retry_info().is_none());
    }

    #[test]
    fn permission_denied_and_deadline_exceeded_carry_their_message_and_no_details() {
        let denied = status(ApiError::PermissionDenied {
            message: "this RPC needs the admin token".into(),
        });
        assert_eq!(denied.code(), Code::PermissionDenied);
        assert_eq!(denied.message(), "this RPC needs the admin token");
        assert!(denied.get_error_details_vec().is_empty());

        let late = status(ApiError::DeadlineExceeded {
            message: "send Register as the first message within 10 s".into(),
        });
        assert_eq!(late.code(), Code::DeadlineExceeded);
        assert_eq!(
            late.message(),
            "send Register as the first message within 10 s"
        );
        assert!(late.get_error_details_vec().is_empty());
    }

    #[test]
    fn a_stream_ending_before_register_is_invalid_without_details() {
        let status = status(ApiError::StreamEndedBeforeRegister);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "the stream ended before Register");
        assert!(status.get_error_details_vec().is_empty());
    }

    #[test]
    fn remaining_errors_map_to_their_codes() {
        let cases = [
            (ApiError::PageTokenExpired, Code::Aborted),
            (
                ApiError::AlreadyExists {
                    what: "tenant \"acme\"".into(),
                },
                Code::AlreadyExists,
            ),
            (
                ApiError::Unavailable {
                    message: "the server is shutting down; retry on another replica".into(),
                },
                Code::Unavailable,
            ),
            (ApiError::internal("store write failed"), Code::Internal),
        ];
        for (error, code) in cases {
            let status = status(error);
            assert_eq!(status.code(), code);
            assert!(!status.message().is_empty());
        }
    }
}
