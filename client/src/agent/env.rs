//! [`Agent::builder_from_env`]: where the agent finds its server, tenant and
//! token when its `main` does not say, read from the same environment
//! variables `reconctl` reads, with the same rules.
//!
//! The variables, the default address and its scheme rule, and how TLS
//! files make a [`ClientTls`] are shared with reconctl
//! (`crate::connection_env`, `ClientTls::from_parts`); reconctl's flags and
//! configuration file, behind the `cli` feature that agents turn off, stay
//! its own. As in reconctl: an empty variable counts as unset; the address
//! defaults to `http://127.0.0.1:50051` and gets `http://` when it has no
//! scheme (with a CA certificate, `https://`); a token and a token file
//! together are refused; a client certificate needs its key.

use std::path::PathBuf;

use super::env_error::EnvError;
use super::runner::{Agent, AgentBuilder};
use super::token::Token;
use crate::connection_env::{
    ADDR_ENV, CA_CERT_ENV, CLIENT_CERT_ENV, CLIENT_KEY_ENV, DEFAULT_ADDR, TENANT_ENV, TOKEN_ENV,
    TOKEN_FILE_ENV, normalize_addr,
};
use crate::tls::ClientTls;

impl Agent {
    /// Starts building an agent from the environment variables `reconctl`
    /// reads, with the same rules, so that one shell's settings serve both:
    ///
    /// | variable | is | if unset |
    /// |---|---|---|
    /// | `RECONCILED_ADDR` | the server, e.g. `http://10.0.0.5:50051` (`http://` is added when there is no scheme) | `http://127.0.0.1:50051` |
    /// | `RECONCILED_TENANT` | the tenant the agent serves | [`EnvError::MissingTenant`] |
    /// | `RECONCILED_TOKEN` or `RECONCILED_TOKEN_FILE` | the tenant's token, or a file holding it (never both) | [`EnvError::MissingToken`] |
    /// | `RECONCILED_CA_CERT` | the CA (PEM) of the server's certificate; the agent then dials `https://` | plaintext |
    /// | `RECONCILED_CLIENT_CERT`, `RECONCILED_CLIENT_KEY` | for mutual TLS, the agent's certificate and key (PEM), both or neither | no client certificate |
    ///
    /// A variable set to the empty string counts as unset. The token file
    /// becomes a [`Token::file`]: read (and trimmed) at
    /// [`build`](AgentBuilder::build) and again before every connection,
    /// so a rotated token reaches the running agent. The TLS files are read
    /// now. Unlike reconctl, the agent reads no configuration file.
    ///
    /// The builder takes further settings as usual:
    ///
    /// ```no_run
    /// use reconciled_client::prelude::*;
    /// # struct Store;
    /// # impl Configurator for Store {
    /// #     async fn create(&self, _: &OperationContext, _: &Item) -> Outcome { Outcome::done() }
    /// #     async fn modify(&self, _: &OperationContext, _: &Item, _: &Item) -> Outcome { Outcome::done() }
    /// #     async fn delete(&self, _: &OperationContext, _: &Item) -> Outcome { Outcome::done() }
    /// # }
    ///
    /// #[reconciled_client::tokio::main(crate = "reconciled_client::tokio")]
    /// async fn main() -> Result<(), AgentError> {
    ///     let agent = Agent::builder_from_env()?
    ///         .item_type(TypeSpec::new("kv"), Store)
    ///         .build()?;
    ///     agent.run(shutdown_signal()).await
    /// }
    /// ```
    pub fn builder_from_env() -> Result<AgentBuilder, EnvError> {
        let settings = EnvSettings::resolve(|name| {
            std::env::var(name).ok().filter(|value| !value.is_empty())
        })?;
        Ok(settings.into_builder())
    }
}

/// The connection settings of an agent, as the environment gives them.
#[derive(Debug)]
struct EnvSettings {
    endpoint: String,
    tenant: String,
    token: Token,
    tls: Option<ClientTls>,
}

impl EnvSettings {
    /// Resolves the settings from `var`, which returns a variable's value
    /// if it is set and not empty.
    fn resolve(var: impl Fn(&str) -> Option<String>) -> Result<Self, EnvError> {
        // reconctl's order: the token, then the tenant, then TLS.
        let token = match (var(TOKEN_ENV), var(TOKEN_FILE_ENV)) {
            (Some(_), Some(_)) => return Err(EnvError::TwoTokens),
            (Some(token), None) => Token::from(token),
            (None, Some(path)) => Token::file(path),
            (None, None) => return Err(EnvError::MissingToken),
        };
        let tenant = var(TENANT_ENV).ok_or(EnvError::MissingTenant)?;
        let tls = tls_from(&var)?;
        let endpoint = normalize_addr(&var(ADDR_ENV).unwrap_or_else(|| DEFAULT_ADDR.to_owned()));
        let endpoint = ClientTls::dial_addr(&endpoint, tls.as_ref());
        Ok(Self {
            endpoint,
            tenant,
            token,
            tls,
        })
    }

    /// An [`AgentBuilder`] with these settings.
    fn into_builder(self) -> AgentBuilder {
        let builder = Agent::builder(self.endpoint, self.tenant, self.token);
        match self.tls {
            Some(tls) => builder.tls(tls),
            None => builder,
        }
    }
}

/// The TLS settings the variables name, if any: the CA, and for mutual TLS
/// the agent's certificate and key.
fn tls_from(var: &impl Fn(&str) -> Option<String>) -> Result<Option<ClientTls>, EnvError> {
    let read = |variable: &'static str| -> Result<Option<Vec<u8>>, EnvError> {
        let Some(path) = var(variable) else {
            return Ok(None);
        };
        std::fs::read(&path)
            .map(Some)
            .map_err(|error| EnvError::TlsFile {
                variable,
                path: PathBuf::from(path),
                problem: error.to_string(),
            })
    };
    if var(CLIENT_CERT_ENV).is_some() != var(CLIENT_KEY_ENV).is_some() {
        return Err(EnvError::IncompleteIdentity);
    }
    let ca = read(CA_CERT_ENV)?;
    let identity = match (read(CLIENT_CERT_ENV)?, read(CLIENT_KEY_ENV)?) {
        (Some(cert), Some(key)) => Some((cert, key)),
        _ => None,
    };
    Ok(ClientTls::from_parts(ca, identity))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Resolves the settings from `pairs`, with empty values unset as the
    /// process environment's are.
    fn resolve(pairs: &[(&str, &str)]) -> Result<EnvSettings, EnvError> {
        let vars: HashMap<String, String> = pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        EnvSettings::resolve(|name| vars.get(name).cloned().filter(|value| !value.is_empty()))
    }

    #[test]
    fn the_address_defaults_to_the_local_server_and_gets_a_scheme() {
        let local = resolve(&[(TENANT_ENV, "acme"), (TOKEN_ENV, "rcd_x")]).expect("valid");
        assert_eq!(local.endpoint, DEFAULT_ADDR);
        assert_eq!(local.tenant, "acme");
        assert_eq!(local.token, Token::from("rcd_x"));
        assert!(local.tls.is_none());

        let bare = resolve(&[
            (ADDR_ENV, " 10.0.0.5:50051 "),
            (TENANT_ENV, "acme"),
            (TOKEN_ENV, "rcd_x"),
        ])
        .expect("valid");
        assert_eq!(bare.endpoint, "http://10.0.0.5:50051");

        let empty = resolve(&[(ADDR_ENV, ""), (TENANT_ENV, "acme"), (TOKEN_ENV, "rcd_x")])
            .expect("an empty address counts as unset");
        assert_eq!(empty.endpoint, DEFAULT_ADDR);
    }

    #[test]
    fn a_missing_tenant_or_token_names_the_variable_to_set() {
        let tenant = resolve(&[(TOKEN_ENV, "rcd_x")]).expect_err("no tenant");
        assert_eq!(tenant, EnvError::MissingTenant);
        assert!(
            tenant.to_string().contains("set RECONCILED_TENANT"),
            "{tenant}"
        );

        let empty_tenant =
            resolve(&[(TENANT_ENV, ""), (TOKEN_ENV, "rcd_x")]).expect_err("empty tenant");
        assert_eq!(empty_tenant, EnvError::MissingTenant);

        let token = resolve(&[(TENANT_ENV, "acme")]).expect_err("no token");
        assert_eq!(token, EnvError::MissingToken);
        let message = format!("{token:?}");
        assert!(
            message.contains("set RECONCILED_TOKEN") && message.contains("RECONCILED_TOKEN_FILE"),
            "Debug says what to do: {message}"
        );
    }

    #[test]
    fn a_token_file_is_read_by_the_agent_and_a_token_with_a_file_is_refused() {
        let from_file = resolve(&[(TENANT_ENV, "acme"), (TOKEN_FILE_ENV, "/run/secrets/token")])
            .expect("valid");
        assert_eq!(from_file.token, Token::file("/run/secrets/token"));

        let both = resolve(&[
            (TENANT_ENV, "acme"),
            (TOKEN_ENV, "rcd_x"),
            (TOKEN_FILE_ENV, "/run/secrets/token"),
        ])
        .expect_err("ambiguous");
        assert_eq!(both, EnvError::TwoTokens);
        assert!(both.to_string().contains("keep one"), "{both}");

        let empty_file = resolve(&[
            (TENANT_ENV, "acme"),
            (TOKEN_ENV, "rcd_x"),
            (TOKEN_FILE_ENV, ""),
        ])
        .expect("an empty token file variable counts as unset");
        assert_eq!(empty_file.token, Token::from("rcd_x"));
    }

    #[test]
    fn a_ca_certificate_switches_the_address_to_https() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n").expect("write");
        let settings = resolve(&[
            (ADDR_ENV, "reconciled.example.com:443"),
            (TENANT_ENV, "acme"),
            (TOKEN_ENV, "rcd_x"),
            (CA_CERT_ENV, ca.to_str().expect("utf-8")),
        ])
        .expect("valid");
        assert_eq!(settings.endpoint, "https://reconciled.example.com:443");
        assert!(settings.tls.is_some());
    }

    #[test]
    fn tls_files_must_be_readable_and_a_certificate_needs_its_key() {
        let missing = resolve(&[
            (TENANT_ENV, "acme"),
            (TOKEN_ENV, "rcd_x"),
            (CA_CERT_ENV, "/nonexistent/ca.pem"),
        ])
        .expect_err("unreadable CA");
        assert!(
            matches!(
                &missing,
                EnvError::TlsFile { variable, .. } if *variable == CA_CERT_ENV
            ),
            "{missing}"
        );
        assert!(
            missing
                .to_string()
                .contains("/nonexistent/ca.pem (from RECONCILED_CA_CERT)"),
            "{missing}"
        );

        let half = resolve(&[
            (TENANT_ENV, "acme"),
            (TOKEN_ENV, "rcd_x"),
            (CLIENT_CERT_ENV, "/etc/agent.pem"),
        ])
        .expect_err("a certificate without its key");
        assert_eq!(half, EnvError::IncompleteIdentity);
    }

    #[test]
    fn the_settings_become_the_builders_endpoint_and_tenant() {
        let settings = resolve(&[(TENANT_ENV, "acme"), (TOKEN_ENV, "rcd_x")]).expect("valid");
        let builder = settings.into_builder();
        let shown = format!("{builder:?}");
        assert!(
            shown.contains(DEFAULT_ADDR) && shown.contains("\"acme\""),
            "{shown}"
        );
    }
}
