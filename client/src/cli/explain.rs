//! Errors turned into messages that say what went wrong and what to do,
//! naming where the address and token in use came from.

use tonic::{Code, Status};
use tonic_types::StatusExt as _;

use super::failure::Failure;
use super::settings::Settings;
use crate::ClientError;

/// The deepest cause of an error, e.g. "Connection refused (os error 111)".
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut deepest = error;
    while let Some(source) = deepest.source() {
        deepest = source;
    }
    deepest.to_string()
}

/// A failure to create the client, naming the address and where it came
/// from.
pub(crate) fn connect_failure(error: &ClientError, settings: &Settings) -> Failure {
    let addr = &settings.addr;
    match error {
        ClientError::InvalidEndpoint { .. } => Failure::usage(format!(
            "{:?} (from {}) is not a valid server address; use a URI such as \
             http://127.0.0.1:50051",
            addr.value, addr.source
        )),
        ClientError::EndpointWithoutScheme { .. } | ClientError::UnusableEndpoint { .. } => {
            Failure::usage(format!("{error} (address from {})", addr.source))
        }
        ClientError::Connect { endpoint, source } => {
            let cause = root_cause(source);
            Failure::error(format!(
                "cannot connect to reconciled at {endpoint} (address from {}): {cause}; {}",
                addr.source,
                connect_remedy(&cause)
            ))
        }
        ClientError::Tls { .. } => {
            Failure::usage(format!("{error} (address from {})", addr.source))
        }
        ClientError::InvalidToken(invalid) => Failure::usage(format!(
            "{invalid} (token from {})",
            settings
                .token
                .as_ref()
                .map_or_else(|| "nowhere".to_owned(), |token| token.source.to_string())
        )),
    }
}

/// What to do about a connection that failed with `cause`: TLS failures
/// need other certificates or flags, not a running server.
fn connect_remedy(cause: &str) -> &'static str {
    if cause.contains("CaUsedAsEndEntity") {
        "the server's certificate is a CA certificate (as `openssl req -x509` makes by \
         default), which TLS clients refuse as a server's certificate: give the server a \
         certificate made with `-addext basicConstraints=critical,CA:FALSE`, or one signed by \
         a CA whose certificate you pass with --ca-cert (docs/security.md, \"A certificate of \
         your own\")"
    } else if cause.contains("UnknownIssuer") || cause.contains("BadSignature") {
        "the server's certificate is not signed by the CA of --ca-cert (or RECONCILED_CA_CERT): \
         pass the certificate of the CA that signed it, or the server's own certificate if it is \
         self-signed"
    } else if cause.contains("NotValidForName") {
        "the server's certificate does not name the host of the address: dial a name or IP \
         address the certificate lists (openssl x509 -noout -ext subjectAltName -in CERT), or \
         make a certificate that names it"
    } else if cause.contains("Expired") || cause.contains("NotValidYet") {
        "the server's certificate is outside its validity period: renew it (and check the \
         clocks)"
    } else if cause.contains("HTTPS without TLS") {
        "an https:// address needs the CA certificate of the server's certificate: pass \
         --ca-cert FILE (or set RECONCILED_CA_CERT)"
    } else {
        "check that the server runs and listens there, or point --addr or RECONCILED_ADDR at it"
    }
}

/// A failed RPC as a message that says what to do.
pub(crate) fn rpc_failure(what: &str, status: &Status, settings: &Settings) -> Failure {
    let token_source = settings
        .token
        .as_ref()
        .map_or_else(|| "nowhere".to_owned(), |token| token.source.to_string());
    let message = status.message();
    let text = match status.code() {
        Code::Unauthenticated => format!(
            "{what}: the server refused the token from {token_source}: {message}. Use the admin \
             token (<data-dir>/admin.token) or the tenant's token from `reconctl tenant create` \
             or `reconctl tenant rotate-token`"
        ),
        Code::PermissionDenied => format!(
            "{what}: the token from {token_source} may not do this: {message}. Tenant \
             administration and `fleet` need the admin token"
        ),
        Code::NotFound => format!(
            "{what}: {message} (token from {token_source}; `reconctl tenant list` with the \
             admin token shows every tenant)"
        ),
        // A server that speaks TLS drops a plaintext client's connection,
        // or answers its first bytes with a TLS alert that HTTP/2 reads as
        // a protocol error (tonic reports that one as INTERNAL).
        Code::Unavailable if settings.ca_cert.is_none() => format!(
            "{what}: the server at {} is unavailable: {message}; check that it runs, and if it \
             serves TLS (--tls-cert), pass its CA certificate with --ca-cert",
            settings.addr.value
        ),
        Code::Internal if settings.ca_cert.is_none() && message.contains("h2 protocol error") => {
            format!(
                "{what}: the server at {} broke the connection off: {message}; if it serves TLS \
                 (--tls-cert), use an https:// address and pass its CA certificate with --ca-cert",
                settings.addr.value
            )
        }
        Code::Unavailable => format!(
            "{what}: the server at {} is unavailable: {message}; check that it runs",
            settings.addr.value
        ),
        Code::Unimplemented => format!(
            "{what}: the server at {} does not support this: {message}",
            settings.addr.value
        ),
        Code::DeadlineExceeded => format!("{what}: timed out: {message}"),
        code => format!("{what}: {} ({code:?})", with_details(status)),
    };
    Failure::error(text)
}

/// The status message followed by its field violations and error reason.
fn with_details(status: &Status) -> String {
    let details = status.get_error_details();
    let mut text = status.message().to_owned();
    if let Some(info) = details.error_info() {
        text.push_str(&format!(" [{}]", info.reason));
        if info.reason == "GENERATION_MISMATCH" {
            text.push_str(
                "; see the tenant's generation with `reconctl status`, or drop \
                 --expected-generation",
            );
        }
    }
    if let Some(bad_request) = details.bad_request() {
        for violation in &bad_request.field_violations {
            text.push_str(&format!(
                "\n  {}: {}",
                violation.field, violation.description
            ));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use tonic_types::{ErrorDetails, FieldViolation};

    use super::*;
    use crate::cli::failure::Exit;
    use crate::cli::settings::{Setting, Source};

    fn settings() -> Settings {
        Settings {
            addr: Setting {
                value: "http://127.0.0.1:1".into(),
                source: Source::Flag("--addr"),
            },
            token: Some(Setting {
                value: "x".into(),
                source: Source::Env("RECONCILED_TOKEN"),
            }),
            tenant: None,
            ca_cert: None,
            client_cert: None,
            client_key: None,
            config_file: None,
        }
    }

    #[test]
    fn an_auth_failure_names_the_token_source() {
        let failure = rpc_failure(
            "status",
            &Status::unauthenticated("invalid bearer token"),
            &settings(),
        );
        assert_eq!(failure.exit, Exit::Error);
        assert!(failure.message.contains("RECONCILED_TOKEN"), "{failure}");
    }

    /// A plaintext client against a TLS port fails either way, depending on
    /// timing: the connection dropped (UNAVAILABLE) or the server's TLS
    /// alert read as an HTTP/2 protocol error (INTERNAL). Both point at TLS.
    #[test]
    fn a_plaintext_client_of_a_tls_server_is_pointed_at_tls_however_it_failed() {
        for status in [
            Status::unavailable("connection lost"),
            Status::internal("h2 protocol error: http2 error"),
        ] {
            let failure = rpc_failure("list tenants", &status, &settings());
            assert!(failure.message.contains("--ca-cert"), "{failure}");
        }
    }

    #[test]
    fn field_violations_are_listed_one_per_line() {
        let status = Status::with_error_details(
            Code::InvalidArgument,
            "invalid intent",
            ErrorDetails::with_bad_request(vec![FieldViolation::new(
                "items[1].name",
                "must not be empty",
            )]),
        );
        let failure = rpc_failure("intent submit", &status, &settings());
        assert!(
            failure
                .message
                .contains("\n  items[1].name: must not be empty"),
            "{failure}"
        );
    }
}
