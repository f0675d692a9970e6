//! [`AgentError`], and which stream errors end an agent for good.

use tonic::Code;
use tonic_types::StatusExt;

use crate::auth::InvalidToken;

use super::env_error::EnvError;

/// `ErrorInfo.reason` of a refused protocol version.
pub const REASON_UNSUPPORTED_PROTOCOL: &str = "UNSUPPORTED_PROTOCOL";

/// `ErrorInfo.reason` of a type held by another live agent.
pub const REASON_TYPE_HELD: &str = "TYPE_HELD";

/// Why an agent could not be built, or why [`Agent::run`](super::Agent::run)
/// gave up. Everything else (transport errors, dropped streams, a type held
/// by another agent) is retried with backoff and reported as
/// [`AgentEvent::Disconnected`](super::AgentEvent::Disconnected).
///
/// `Debug` prints the same message as `Display` (what went wrong and what to
/// do), so a `main` or a test that returns `Result<(), Box<dyn Error>>`
/// shows it: they print their error with `Debug`.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The endpoint is not a valid URI.
    #[error("{endpoint:?} is not a valid server address; use a URI such as http://127.0.0.1:50051")]
    InvalidEndpoint {
        /// The address as given.
        endpoint: String,
        /// What the URI parser said.
        #[source]
        source: tonic::transport::Error,
    },
    /// The endpoint has no `http://` or `https://` scheme (e.g.
    /// `127.0.0.1:50051`): it parses as a URI, but no connection to it can
    /// ever be made, so it is refused at `build()` rather than retried.
    #[error("{endpoint:?} has no scheme; use http://{endpoint} (or https://{endpoint} with TLS)")]
    EndpointWithoutScheme {
        /// The address as given.
        endpoint: String,
    },
    /// The endpoint parses as a URI but cannot be dialled: a port that is
    /// not a number from 1 to 65535 (`http://127.0.0.1:notaport`, which the
    /// connector would take for port 80), a scheme other than `http` or
    /// `https`, or no host. Refused at `build()` rather than retried.
    #[error("{endpoint:?} cannot be dialled: {problem}; use a URI such as http://127.0.0.1:50051")]
    UnusableEndpoint {
        /// The address as given.
        endpoint: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The TLS settings cannot be used (e.g. a malformed certificate).
    #[error(
        "invalid TLS settings for {endpoint:?}: {source}; check the CA and client certificate PEM files"
    )]
    Tls {
        /// The address as given.
        endpoint: String,
        /// What tonic said.
        #[source]
        source: tonic::transport::Error,
    },
    /// The token cannot be sent in a header.
    #[error(transparent)]
    InvalidToken(#[from] InvalidToken),
    /// The token file of [`Token::file`](super::Token::file) cannot be
    /// read, or holds no valid token.
    #[error(
        "cannot read the tenant token from {}: {problem}; the file must hold the token \
         CreateTenant or RotateToken returned",
        path.display()
    )]
    TokenFile {
        /// The file.
        path: std::path::PathBuf,
        /// What went wrong.
        problem: String,
    },
    /// [`Agent::builder_from_env`](super::Agent::builder_from_env) found
    /// no usable connection settings in the environment.
    #[error(transparent)]
    Environment(EnvError),
    /// The agent handles no item type.
    #[error("the agent handles no item type; add one with AgentBuilder::item_type")]
    NoItemTypes,
    /// A `recreate_on_change` path is not a JSON Pointer (RFC 6901) or `*`.
    /// The server would refuse it too; accepted, a path such as `key` (for
    /// `/key`) would never match, and a change of `key` would be applied as
    /// a Modify instead of a recreate.
    #[error("item type {item_type:?}: recreate_on_change path {path:?} {problem}")]
    InvalidRecreatePath {
        /// The item type whose spec holds the path.
        item_type: String,
        /// The path as given.
        path: String,
        /// What is wrong with it.
        problem: reconciled_proto::pointer::PointerError,
    },
    /// A type's schema is not a JSON Schema object (or `true` / `false`).
    /// The server checks the rest at `Register` and refuses a schema that
    /// does not compile, or one over its limits, with a field violation at
    /// `register.item_types[i].schema`.
    #[error("item type {item_type:?}: the schema {problem}")]
    InvalidSchema {
        /// The item type whose spec holds the schema.
        item_type: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Two configurators were registered for one item type.
    #[error("item type {0:?} was registered twice; register each type once")]
    DuplicateItemType(String),
    /// The server speaks another configurator protocol version.
    #[error(
        "the server refused configurator protocol version {version}: {message}; use an agent \
         SDK that matches the server's version"
    )]
    UnsupportedProtocol {
        /// The version this SDK speaks.
        version: u32,
        /// The server's message.
        message: String,
    },
    /// The token was missing, wrong, or revoked.
    #[error(
        "the server rejected the token: {message}; pass the tenant's current token (see \
         Tenants.RotateToken)"
    )]
    Unauthenticated {
        /// The server's message.
        message: String,
    },
    /// The tenant does not exist, or the token does not grant access to it.
    #[error(
        "the server refused tenant {tenant:?} (no such tenant, or the token is another \
         tenant's): {message}"
    )]
    TenantNotFound {
        /// The tenant the agent registered for.
        tenant: String,
        /// The server's message.
        message: String,
    },
    /// The server refused the registration itself (e.g. an invalid item type
    /// spec); retrying the same registration cannot succeed.
    #[error(
        "the server refused the registration ({code:?}): {message}; fix the agent's item type specs"
    )]
    RegistrationRejected {
        /// The gRPC code.
        code: Code,
        /// The server's message.
        message: String,
    },
}

impl std::fmt::Debug for AgentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// What to do after a stream ended with `status`.
#[derive(Debug)]
pub(crate) enum Disposition {
    /// Give up: `run` returns this error.
    Permanent(AgentError),
    /// Reconnect after a backoff.
    Retry,
}

/// Sorts a status the server ended a stream (or refused a connection) with:
/// `UNAUTHENTICATED`, `NOT_FOUND`, `FAILED_PRECONDITION` with
/// `UNSUPPORTED_PROTOCOL`, `INVALID_ARGUMENT` and `PERMISSION_DENIED` are
/// permanent; everything else, `TYPE_HELD` included, is retried.
pub(crate) fn classify(status: &tonic::Status, tenant: &str) -> Disposition {
    let message = status.message().to_owned();
    match status.code() {
        Code::Unauthenticated => Disposition::Permanent(AgentError::Unauthenticated { message }),
        Code::NotFound => Disposition::Permanent(AgentError::TenantNotFound {
            tenant: tenant.to_owned(),
            message,
        }),
        Code::FailedPrecondition
            if error_reason(status).as_deref() == Some(REASON_UNSUPPORTED_PROTOCOL) =>
        {
            Disposition::Permanent(AgentError::UnsupportedProtocol {
                version: reconciled_proto::PROTOCOL_VERSION,
                message,
            })
        }
        code @ (Code::InvalidArgument | Code::PermissionDenied) => {
            Disposition::Permanent(AgentError::RegistrationRejected { code, message })
        }
        _ => Disposition::Retry,
    }
}

/// The `ErrorInfo.reason` in a status's details, if any.
pub(crate) fn error_reason(status: &tonic::Status) -> Option<String> {
    status.get_details_error_info().map(|info| info.reason)
}

impl From<EnvError> for AgentError {
    fn from(error: EnvError) -> Self {
        AgentError::Environment(error)
    }
}

#[cfg(test)]
mod tests {
    use tonic_types::ErrorDetails;

    use super::*;

    fn with_reason(code: Code, reason: &str) -> tonic::Status {
        tonic::Status::with_error_details(
            code,
            "refused",
            ErrorDetails::with_error_info(reason, "reconciled.dev", []),
        )
    }

    #[test]
    fn an_unsupported_protocol_is_permanent() {
        let status = with_reason(Code::FailedPrecondition, REASON_UNSUPPORTED_PROTOCOL);
        assert!(matches!(
            classify(&status, "acme"),
            Disposition::Permanent(AgentError::UnsupportedProtocol { version: 1, .. })
        ));
    }

    #[test]
    fn a_type_held_by_another_agent_is_retried() {
        let status = with_reason(Code::FailedPrecondition, REASON_TYPE_HELD);
        assert!(matches!(classify(&status, "acme"), Disposition::Retry));
        assert_eq!(error_reason(&status).as_deref(), Some(REASON_TYPE_HELD));
    }

    #[test]
    fn bad_credentials_and_unknown_tenants_are_permanent() {
        assert!(matches!(
            classify(&tonic::Status::unauthenticated("bad token"), "acme"),
            Disposition::Permanent(AgentError::Unauthenticated { .. })
        ));
        let error = match classify(&tonic::Status::not_found("no such tenant"), "acme") {
            Disposition::Permanent(error) => error,
            Disposition::Retry => panic!("NOT_FOUND must be permanent"),
        };
        assert!(error.to_string().contains("\"acme\""), "{error}");
    }

    #[test]
    fn transient_errors_are_retried() {
        for status in [
            tonic::Status::unavailable("restarting"),
            tonic::Status::internal("oops"),
            tonic::Status::unimplemented("not yet"),
            tonic::Status::failed_precondition("no details"),
        ] {
            assert!(
                matches!(classify(&status, "acme"), Disposition::Retry),
                "{status:?}"
            );
        }
    }
}
