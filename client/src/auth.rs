//! The `authorization: Bearer <token>` metadata every call carries.

use std::fmt;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;

/// The token is not a valid HTTP header value (control characters or
/// non-ASCII text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the token contains characters an HTTP header cannot carry; pass the token exactly as \
     CreateTenant or RotateToken returned it (or the admin token file's content, without \
     a trailing newline)"
)]
pub struct InvalidToken;

/// An interceptor that adds `authorization: Bearer <token>` to every request.
/// Its `Debug` output never shows the token.
#[derive(Clone, PartialEq)]
pub(crate) struct BearerToken(MetadataValue<Ascii>);

impl BearerToken {
    /// Prepares the metadata value for `token` (surrounding whitespace is
    /// trimmed, so a token read from a file may end with a newline).
    pub(crate) fn new(token: &str) -> Result<Self, InvalidToken> {
        let token = token.trim();
        if token.is_empty() {
            return Err(InvalidToken);
        }
        let mut value: MetadataValue<Ascii> = format!("Bearer {token}")
            .parse()
            .map_err(|_| InvalidToken)?;
        value.set_sensitive(true);
        Ok(Self(value))
    }
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("BearerToken(<redacted>)")
    }
}

impl Interceptor for BearerToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interceptor_adds_a_bearer_authorization_header() {
        let mut bearer = BearerToken::new("rcd_abc\n").expect("valid token");
        let request = bearer
            .call(tonic::Request::new(()))
            .expect("interceptor never fails");
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|value| value.to_str().ok());
        assert_eq!(header, Some("Bearer rcd_abc"));
        assert!(!format!("{bearer:?}").contains("rcd_abc"));
    }

    #[test]
    fn tokens_a_header_cannot_carry_are_rejected() {
        assert_eq!(BearerToken::new("bad\u{7f}token").err(), Some(InvalidToken));
        assert_eq!(BearerToken::new("  ").err(), Some(InvalidToken));
    }
}
