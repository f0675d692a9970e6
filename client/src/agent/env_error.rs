//! [`EnvError`]: why the environment gave an agent no usable connection
//! settings ([`Agent::builder_from_env`](super::Agent::builder_from_env)).

use std::path::PathBuf;

/// Why [`Agent::builder_from_env`](super::Agent::builder_from_env) found
/// no usable connection settings in the environment. Each message names
/// the variable to set.
///
/// `Debug` prints the same message as `Display`, so a `main` that returns
/// the error shows what to do.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// `RECONCILED_TENANT` is unset or empty.
    #[error(
        "no tenant given: set RECONCILED_TENANT to the tenant this agent serves (the name given \
         to `reconctl tenant create`)"
    )]
    MissingTenant,
    /// Neither `RECONCILED_TOKEN` nor `RECONCILED_TOKEN_FILE` is set.
    #[error(
        "no token given: set RECONCILED_TOKEN to the tenant's token (`reconctl tenant create` \
         prints it), or RECONCILED_TOKEN_FILE to a file holding it"
    )]
    MissingToken,
    /// Both `RECONCILED_TOKEN` and `RECONCILED_TOKEN_FILE` are set.
    #[error("both RECONCILED_TOKEN and RECONCILED_TOKEN_FILE give a token; keep one")]
    TwoTokens,
    /// Only one of `RECONCILED_CLIENT_CERT` and `RECONCILED_CLIENT_KEY` is
    /// set.
    #[error(
        "mutual TLS needs both a client certificate and its key: set RECONCILED_CLIENT_CERT \
         and RECONCILED_CLIENT_KEY together"
    )]
    IncompleteIdentity,
    /// A TLS file named by a variable cannot be read.
    #[error("cannot read {} (from {variable}): {problem}", path.display())]
    TlsFile {
        /// The variable that names the file, e.g. `RECONCILED_CA_CERT`.
        variable: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        problem: String,
    },
}

impl std::fmt::Debug for EnvError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, formatter)
    }
}
