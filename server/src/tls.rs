//! TLS and mutual TLS for the gRPC listener (rustls, through tonic): reads
//! the PEM files named by the configuration into a server TLS config.

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::config::Config;

/// Why the TLS files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("cannot read {what} {}: {source}; check --{flag}", path.display())]
    Read {
        /// Which file (e.g. "the TLS certificate").
        what: &'static str,
        /// The flag that names it.
        flag: &'static str,
        /// The path.
        path: PathBuf,
        /// The I/O error (also in the message; the printer of fatal
        /// errors leaves out a cause the message holds).
        source: std::io::Error,
    },
    /// A PEM file holds nothing usable.
    #[error("{} holds no PEM block; {what} must be PEM (-----BEGIN ...-----)", path.display())]
    NotPem {
        /// Which file.
        what: &'static str,
        /// The path.
        path: PathBuf,
    },
    /// The files are PEM but rustls refuses them: a key that is not the
    /// certificate's, a key file holding a certificate, a malformed block.
    #[error(
        "cannot serve TLS with the certificate {} and the private key {}: {reason}; check that \
         --tls-cert holds the certificate chain and --tls-key the private key of its first \
         certificate (their public keys must match: compare `openssl x509 -noout -pubkey -in \
         CERT` with `openssl pkey -pubout -in KEY`)",
        cert.display(),
        key.display()
    )]
    Unusable {
        /// The certificate chain file.
        cert: PathBuf,
        /// The private key file.
        key: PathBuf,
        /// What rustls said.
        reason: String,
    },
}

/// The server TLS configuration, or `None` when TLS is off. With
/// `tls_client_ca`, clients must present a certificate signed by one of
/// its CAs (mutual TLS).
pub fn server_tls(config: &Config) -> Result<Option<ServerTlsConfig>, TlsError> {
    let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
        return Ok(None);
    };
    let (cert_path, key_path) = (cert, key);
    let cert = read_pem(cert_path, "the TLS certificate", "tls-cert")?;
    let key = read_pem(key_path, "the TLS private key", "tls-key")?;
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
    if let Some(ca) = &config.tls_client_ca {
        let ca = read_pem(ca, "the client CA", "tls-client-ca")?;
        tls = tls.client_ca_root(Certificate::from_pem(ca));
    }
    // tonic builds the rustls configuration here, as serving would: a key
    // that does not match is found now, before the data directory is
    // touched, rather than after the store was opened.
    if let Err(error) = tonic::transport::Server::builder().tls_config(tls.clone()) {
        return Err(TlsError::Unusable {
            cert: cert_path.clone(),
            key: key_path.clone(),
            // tonic's own text is only "transport error"; rustls's is below.
            reason: std::error::Error::source(&error)
                .map_or_else(|| error.to_string(), ToString::to_string),
        });
    }
    Ok(Some(tls))
}

fn read_pem(path: &Path, what: &'static str, flag: &'static str) -> Result<Vec<u8>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        flag,
        path: path.to_path_buf(),
        source,
    })?;
    if !bytes.windows(11).any(|window| window == b"-----BEGIN ") {
        return Err(TlsError::NotPem {
            what,
            path: path.to_path_buf(),
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_non_pem_files_are_named_with_their_flag() {
        let dir = tempfile::tempdir().expect("temp dir");
        let cert = dir.path().join("cert.pem");
        std::fs::write(&cert, "not a certificate").expect("write");
        let config = Config {
            tls_cert: Some(cert.clone()),
            tls_key: Some(dir.path().join("missing.pem")),
            ..Config::default()
        };
        let message = server_tls(&config).expect_err("not PEM").to_string();
        assert!(
            message.contains("cert.pem") && message.contains("PEM"),
            "{message}"
        );

        std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\n").expect("write");
        let message = server_tls(&config).expect_err("no key").to_string();
        assert!(
            message.contains("missing.pem") && message.contains("--tls-key"),
            "{message}"
        );
    }

    #[test]
    fn no_files_means_plaintext() {
        assert!(server_tls(&Config::default()).expect("fine").is_none());
    }
}
