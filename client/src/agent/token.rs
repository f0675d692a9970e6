//! [`Token`]: the tenant token an agent sends, given once or read from a
//! file before every connection (so a rotated token reaches a running
//! agent without a restart).

use std::path::{Path, PathBuf};

use crate::auth::BearerToken;

use super::error::AgentError;

/// Where an agent's tenant token comes from.
///
/// A `&str` or `String` is the token itself. [`Token::file`] names a file
/// holding it (surrounding whitespace ignored), read when the agent is
/// built and again before every connection: after `RotateToken`, which
/// ends the agent's stream with `UNAUTHENTICATED`, writing the new token
/// into the file (a mounted secret, say) is enough. While the server
/// rejects the token from a file, the agent keeps retrying with backoff,
/// reading the file each time, instead of stopping with
/// [`AgentError::Unauthenticated`] as it does for a token given once.
///
/// ```no_run
/// use reconciled_client::agent::{Agent, Token};
/// let builder = Agent::builder(
///     "http://127.0.0.1:50051",
///     "acme",
///     Token::file("/var/run/secrets/reconciled/token"),
/// );
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Source);

#[derive(Clone, PartialEq, Eq)]
enum Source {
    Given(String),
    File(PathBuf),
}

impl Token {
    /// The token held in the file at `path`, read before every connection.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self(Source::File(path.into()))
    }

    /// The file the token is read from, if any.
    pub fn path(&self) -> Option<&Path> {
        match &self.0 {
            Source::File(path) => Some(path),
            Source::Given(_) => None,
        }
    }

    /// The token as the `authorization` header carries it, read from its
    /// file if it has one.
    pub(crate) fn read(&self) -> Result<BearerToken, AgentError> {
        match &self.0 {
            Source::Given(token) => Ok(BearerToken::new(token)?),
            Source::File(path) => {
                let token =
                    std::fs::read_to_string(path).map_err(|source| AgentError::TokenFile {
                        path: path.clone(),
                        problem: source.to_string(),
                    })?;
                BearerToken::new(&token).map_err(|invalid| AgentError::TokenFile {
                    path: path.clone(),
                    problem: invalid.to_string(),
                })
            }
        }
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Source::Given(_) => formatter.write_str("Token(<redacted>)"),
            Source::File(path) => formatter.debug_tuple("Token::file").field(path).finish(),
        }
    }
}

impl From<String> for Token {
    fn from(token: String) -> Self {
        Self(Source::Given(token))
    }
}

impl From<&String> for Token {
    fn from(token: &String) -> Self {
        Self(Source::Given(token.clone()))
    }
}

impl From<&str> for Token {
    fn from(token: &str) -> Self {
        Self(Source::Given(token.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_is_read_again_each_time_and_its_newline_ignored() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("token");
        std::fs::write(&path, "rcd_first\n").expect("write");
        let token = Token::file(&path);
        let first = token.read().expect("readable");
        assert!(first == BearerToken::new("rcd_first").expect("valid"));
        std::fs::write(&path, "rcd_second").expect("write");
        assert!(token.read().expect("readable") == BearerToken::new("rcd_second").expect("valid"));
    }

    #[test]
    fn a_missing_or_empty_token_file_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("token");
        let missing = Token::file(&path).read().expect_err("no file");
        assert!(missing.to_string().contains("token"), "{missing}");
        assert!(matches!(missing, AgentError::TokenFile { .. }));
        std::fs::write(&path, "\n").expect("write");
        let empty = Token::file(&path).read().expect_err("empty file");
        assert!(matches!(empty, AgentError::TokenFile { .. }), "{empty}");
    }

    #[test]
    fn debug_output_never_shows_a_given_token() {
        let shown = format!("{:?}", Token::from("rcd_secret"));
        assert!(!shown.contains("rcd_secret"), "{shown}");
    }
}
