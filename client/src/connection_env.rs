//! The environment variables reconctl and agents
//! ([`Agent::builder_from_env`](crate::agent::Agent::builder_from_env))
//! read their connection settings from, and the address rules they share.

/// The address used when nothing names one.
pub(crate) const DEFAULT_ADDR: &str = "http://127.0.0.1:50051";
/// The server's address.
pub(crate) const ADDR_ENV: &str = "RECONCILED_ADDR";
/// A bearer token.
pub(crate) const TOKEN_ENV: &str = "RECONCILED_TOKEN";
/// A file holding a bearer token.
pub(crate) const TOKEN_FILE_ENV: &str = "RECONCILED_TOKEN_FILE";
/// The tenant.
pub(crate) const TENANT_ENV: &str = "RECONCILED_TENANT";
/// The CA certificate (PEM) that signs the server's certificate.
pub(crate) const CA_CERT_ENV: &str = "RECONCILED_CA_CERT";
/// The client's certificate (PEM), for mutual TLS.
pub(crate) const CLIENT_CERT_ENV: &str = "RECONCILED_CLIENT_CERT";
/// The client's private key (PEM), for mutual TLS.
pub(crate) const CLIENT_KEY_ENV: &str = "RECONCILED_CLIENT_KEY";

/// `host:port` becomes `http://host:port`; URIs stay as they are.
pub(crate) fn normalize_addr(addr: &str) -> String {
    let addr = addr.trim();
    if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_without_a_scheme_get_http() {
        assert_eq!(normalize_addr("127.0.0.1:50051"), "http://127.0.0.1:50051");
        assert_eq!(normalize_addr(" 10.0.0.5:1 "), "http://10.0.0.5:1");
        assert_eq!(normalize_addr("https://example:1"), "https://example:1");
    }
}
