//! [`ClientTls`]: how a [`Client`](crate::Client) or an
//! [`Agent`](crate::agent::Agent) verifies a TLS server (its CA) and, for
//! mutual TLS, which certificate it presents.

use std::fmt;
use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// TLS settings for connecting to a reconciled server that serves TLS
/// (`--tls-cert`); use an `https://` endpoint with them.
///
/// ```no_run
/// # fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use reconciled_client::ClientTls;
///
/// let tls = ClientTls::new()
///     .ca_certificate(std::fs::read("ca.pem")?)
///     // Only for servers with --tls-client-ca (mutual TLS):
///     .identity(std::fs::read("agent.pem")?, std::fs::read("agent.key")?);
/// # Ok(())
/// # }
/// ```
///
/// Its `Debug` output says which settings are present, never the private
/// key (nor the certificates' bytes).
#[derive(Clone, Default)]
pub struct ClientTls {
    ca_pem: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain: Option<String>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("ClientTls")
            .field("ca_certificate", &self.ca_pem.as_ref().map(|_| "<set>"))
            .field("identity", &self.identity.as_ref().map(|_| "<redacted>"))
            .field("domain_name", &self.domain)
            .finish()
    }
}

impl ClientTls {
    /// The TLS of a connection given a CA certificate and, for mutual TLS,
    /// a certificate and its key (PEM contents); `None` when neither is
    /// given (plaintext). What reconctl and `Agent::builder_from_env` make
    /// of the files their settings name.
    pub(crate) fn from_parts(
        ca_pem: Option<Vec<u8>>,
        identity: Option<(Vec<u8>, Vec<u8>)>,
    ) -> Option<Self> {
        (ca_pem.is_some() || identity.is_some()).then_some(Self {
            ca_pem,
            identity,
            domain: None,
        })
    }

    /// `addr` as dialled with `tls`: `https://` in place of `http://` when
    /// there is TLS.
    pub(crate) fn dial_addr(addr: &str, tls: Option<&Self>) -> String {
        match tls {
            Some(_) => addr.replacen("http://", "https://", 1),
            None => addr.to_owned(),
        }
    }

    /// No CA (the server must then be trusted some other way: set one with
    /// [`ca_certificate`](Self::ca_certificate)), no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts servers whose certificate chains to this CA (PEM).
    pub fn ca_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Presents this certificate (PEM chain) and private key (PEM) to the
    /// server, for mutual TLS.
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Expects this name in the server certificate instead of the
    /// endpoint's host.
    pub fn domain_name(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }

    /// Reads the CA and, when both are given, the client certificate and
    /// key from PEM files.
    pub fn from_files(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<Self, std::io::Error> {
        let mut tls = Self::new().ca_certificate(std::fs::read(ca)?);
        if let Some((cert, key)) = identity {
            tls = tls.identity(std::fs::read(cert)?, std::fs::read(key)?);
        }
        Ok(tls)
    }

    /// Applies the settings to a tonic endpoint.
    pub(crate) fn apply(&self, endpoint: Endpoint) -> Result<Endpoint, tonic::transport::Error> {
        let mut config = ClientTlsConfig::new();
        if let Some(ca) = &self.ca_pem {
            config = config.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        endpoint.tls_config(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_the_private_key() {
        let key = b"-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n";
        let tls = ClientTls::new()
            .ca_certificate(b"ca".to_vec())
            .identity(b"cert".to_vec(), key.to_vec());
        let shown = format!("{tls:?}");
        let as_numbers = format!("{:?}", key.to_vec());
        let inner = as_numbers.trim_start_matches('[').trim_end_matches(']');
        assert!(!shown.contains("secret"), "{shown}");
        assert!(!shown.contains(inner), "the key's bytes show: {shown}");
    }
}
