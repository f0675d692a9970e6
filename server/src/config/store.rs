//! The store settings: `--store sled|etcd` and how to reach etcd.

use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use super::{ConfigError, Layer, Origins, Secret, SettingValue};
use crate::store::EtcdOptions;
use crate::store::etcd::{DEFAULT_STAGING_LEASE, EtcdAuth, EtcdTls};

/// Which backend keeps the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// The embedded sled database in `--data-dir` (the default).
    #[default]
    Sled,
    /// An etcd cluster (`--etcd-endpoints`), shared by replicas.
    Etcd,
}

impl SettingValue for StoreKind {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        StoreKind::from_str(raw.trim(), true).map_err(|_| "expected `sled` or `etcd`".to_owned())
    }
}

/// How to reach etcd (used with [`StoreKind::Etcd`], and by `store copy`).
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdSettings {
    /// Client URLs of the etcd members.
    pub endpoints: Vec<String>,
    /// The key prefix of this deployment.
    pub prefix: String,
    /// CA certificates (PEM) for etcd's server certificate.
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's client-certificate auth.
    pub cert: Option<PathBuf>,
    /// Private key of `cert` (PEM).
    pub key: Option<PathBuf>,
    /// etcd user, with `password`.
    pub user: Option<String>,
    /// Password of `user`. Never logged.
    pub password: Option<Secret>,
    /// TTL of the lease that marks a large commit as being staged: the
    /// chunks of a writer that died are discarded once it has expired.
    pub staging_lease: Duration,
}

impl Default for EtcdSettings {
    fn default() -> Self {
        Self {
            endpoints: vec![DEFAULT_ENDPOINT.to_owned()],
            prefix: crate::store::etcd::DEFAULT_PREFIX.to_owned(),
            ca: None,
            cert: None,
            key: None,
            user: None,
            password: None,
            staging_lease: DEFAULT_STAGING_LEASE,
        }
    }
}

/// The endpoint used when none is configured.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:2379";

impl EtcdSettings {
    /// The store options these settings give, on `endpoints` (those of
    /// the settings unless a `store copy` names others).
    pub fn options(&self, endpoints: Option<Vec<String>>) -> EtcdOptions {
        let tls = (self.ca.is_some() || self.cert.is_some()).then(|| EtcdTls {
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
        });
        let auth = match (&self.user, &self.password) {
            (Some(user), Some(password)) => Some(EtcdAuth {
                user: user.clone(),
                password: password.expose().to_owned(),
            }),
            _ => None,
        };
        EtcdOptions {
            endpoints: endpoints.unwrap_or_else(|| self.endpoints.clone()),
            prefix: self.prefix.clone(),
            tls,
            auth,
            staging_lease: self.staging_lease,
            ..EtcdOptions::default()
        }
    }
}

/// The TTL of an etcd lease set to `secs` (`default` when unset); etcd
/// grants no lease shorter than about 2 s.
pub(super) fn lease_ttl(secs: Option<u64>, default: Duration) -> Result<Duration, String> {
    match secs {
        None => Ok(default),
        Some(secs) if secs < 2 => Err(format!(
            "{secs}s is shorter than etcd grants (its minimum lease TTL is about 2 s with its \
             default election timeout); use 2 or more"
        )),
        Some(secs) => Ok(Duration::from_secs(secs)),
    }
}

/// Parses a comma-separated list of etcd client URLs.
pub fn parse_endpoints(raw: &str) -> Result<Vec<String>, String> {
    let endpoints: Vec<String> = raw
        .split(',')
        .map(str::trim)
        .filter(|endpoint| !endpoint.is_empty())
        .map(str::to_owned)
        .collect();
    if endpoints.is_empty() {
        return Err("give at least one etcd client URL, e.g. http://127.0.0.1:2379".to_owned());
    }
    if let Some(bad) = endpoints
        .iter()
        .find(|e| !(e.starts_with("http://") || e.starts_with("https://")))
    {
        return Err(format!(
            "{bad:?} is not an etcd client URL; write http://HOST:PORT or https://HOST:PORT, \
             several separated by commas"
        ));
    }
    Ok(endpoints)
}

/// The store settings of `layer`, checked.
pub(super) fn resolve(
    layer: &Layer,
    origins: &Origins,
    admin_token_set: bool,
) -> Result<(StoreKind, EtcdSettings, Option<String>), ConfigError> {
    let invalid = |key: &'static str, reason: String| ConfigError::Invalid {
        key,
        origin: origins.of(key),
        reason,
    };
    let store = layer.store.unwrap_or_default();
    let defaults = EtcdSettings::default();
    let endpoints = match &layer.etcd_endpoints {
        Some(raw) => parse_endpoints(raw).map_err(|reason| invalid("etcd_endpoints", reason))?,
        None => defaults.endpoints,
    };
    let prefix = layer.etcd_prefix.clone().unwrap_or(defaults.prefix);
    if prefix.is_empty() || prefix.starts_with("store/") {
        return Err(invalid(
            "etcd_prefix",
            "must be a non-empty key prefix such as /reconciled/ (one per deployment)".to_owned(),
        ));
    }
    if layer.etcd_cert.is_some() != layer.etcd_key.is_some() {
        let key = if layer.etcd_cert.is_some() {
            "etcd_cert"
        } else {
            "etcd_key"
        };
        return Err(invalid(
            key,
            "give both the etcd client certificate and its private key".to_owned(),
        ));
    }
    if layer.etcd_user.is_some() != layer.etcd_password.is_some() {
        let key = if layer.etcd_user.is_some() {
            "etcd_user"
        } else {
            "etcd_password"
        };
        return Err(invalid(
            key,
            "give both the etcd user and its password".to_owned(),
        ));
    }
    if let Some(addr) = &layer.advertise_addr {
        let port = addr
            .rsplit_once(':')
            .map(|(host, port)| (host, port.parse::<u16>()));
        if !matches!(port, Some((host, Ok(_))) if !host.is_empty()) {
            return Err(invalid(
                "advertise_addr",
                format!(
                    "{addr:?} is not HOST:PORT; give the address other replicas reach this one at"
                ),
            ));
        }
    }
    if store == StoreKind::Etcd && !admin_token_set {
        return Err(invalid(
            "store",
            "with `etcd` the admin token must be configured (--admin-token or \
             RECONCILED_ADMIN_TOKEN), the same on every replica: a token generated into one \
             replica's data directory would not work on the others"
                .to_owned(),
        ));
    }
    let staging_lease = lease_ttl(layer.etcd_staging_lease_secs, DEFAULT_STAGING_LEASE)
        .map_err(|reason| invalid("etcd_staging_lease_secs", reason))?;
    let settings = EtcdSettings {
        staging_lease,
        endpoints,
        prefix,
        ca: layer.etcd_ca.clone(),
        cert: layer.etcd_cert.clone(),
        key: layer.etcd_key.clone(),
        user: layer.etcd_user.clone(),
        password: layer.etcd_password.clone().map(Secret::new),
    };
    Ok((store, settings, layer.advertise_addr.clone()))
}

/// A store named on the command line of `reconciled store copy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// `sled:DIR`: the sled store in a data directory.
    Sled(PathBuf),
    /// `etcd:URLS`: etcd at these endpoints (empty: the configured ones).
    Etcd(Vec<String>),
}

impl StoreLocation {
    /// Parses `sled:DIR` or `etcd:URL[,URL...]` (or `etcd:` alone).
    pub fn parse(raw: &str) -> Result<Self, String> {
        if let Some(dir) = raw.strip_prefix("sled:") {
            if dir.is_empty() {
                return Err("write sled:DIR, the data directory of the sled store".to_owned());
            }
            return Ok(StoreLocation::Sled(PathBuf::from(dir)));
        }
        if let Some(urls) = raw.strip_prefix("etcd:") {
            if urls.trim().is_empty() {
                return Ok(StoreLocation::Etcd(Vec::new()));
            }
            return parse_endpoints(urls).map(StoreLocation::Etcd);
        }
        Err(format!(
            "{raw:?} names no store; write sled:DIR or etcd:URL[,URL...]"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Command, Config, ConfigError};

    fn load(args: &[&str], env: &[(&str, &str)]) -> Result<(Command, Config), ConfigError> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let argv = std::iter::once("reconciled").chain(args.iter().copied());
        Config::load_with_env(argv, |name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    const TOKEN: &str = "0123456789abcdef0123";

    #[test]
    fn the_etcd_store_is_configured_from_flags_and_environment() {
        let (_, config) = load(
            &[
                "--store",
                "etcd",
                "--admin-token",
                TOKEN,
                "--etcd-prefix",
                "/p/",
            ],
            &[
                ("RECONCILED_ETCD_ENDPOINTS", "http://a:2379, https://b:2379"),
                ("RECONCILED_ETCD_USER", "rec"),
                ("RECONCILED_ETCD_PASSWORD", "s3cret"),
            ],
        )
        .expect("loads");
        assert_eq!(config.store, StoreKind::Etcd);
        assert_eq!(config.etcd.endpoints, ["http://a:2379", "https://b:2379"]);
        let options = config.etcd.options(None);
        assert_eq!(options.prefix, "/p/");
        assert_eq!(options.auth.map(|a| a.user), Some("rec".to_owned()));
        let toml = config.to_toml();
        assert!(
            !toml.contains("s3cret") && toml.contains("etcd_password"),
            "{toml}"
        );
        assert_eq!(load(&[], &[]).expect("loads").1.store, StoreKind::Sled);
    }

    #[test]
    fn etcd_settings_are_checked() {
        let error = load(&["--store", "etcd"], &[]).expect_err("no admin token");
        assert!(error.to_string().contains("admin token"), "{error}");
        let error = load(&["--etcd-endpoints", "127.0.0.1:2379"], &[]).expect_err("no scheme");
        assert!(error.to_string().contains("http://HOST:PORT"), "{error}");
        let error = load(&["--etcd-cert", "c.pem"], &[]).expect_err("no key");
        assert!(error.to_string().contains("etcd_cert"), "{error}");
        let error =
            load(&[], &[("RECONCILED_ETCD_PASSWORD", "hidden-value")]).expect_err("no user");
        assert!(!error.to_string().contains("hidden-value"), "{error}");
        let error = load(&["--advertise-addr", "nohost"], &[]).expect_err("no port");
        assert!(error.to_string().contains("HOST:PORT"), "{error}");
        let error = load(&["--etcd-staging-lease-secs", "1"], &[]).expect_err("too short");
        assert!(
            error.to_string().contains("etcd_staging_lease_secs"),
            "{error}"
        );
        let (_, config) = load(&["--etcd-staging-lease-secs", "7"], &[]).expect("loads");
        assert_eq!(
            config.etcd.options(None).staging_lease,
            std::time::Duration::from_secs(7)
        );
    }

    #[test]
    fn store_locations_parse() {
        assert_eq!(
            StoreLocation::parse("sled:/var/lib/r"),
            Ok(StoreLocation::Sled(PathBuf::from("/var/lib/r")))
        );
        assert_eq!(
            StoreLocation::parse("etcd:"),
            Ok(StoreLocation::Etcd(Vec::new()))
        );
        assert!(StoreLocation::parse("etcd:http://a:1,http://b:2").is_ok());
        assert!(StoreLocation::parse("postgres:x").is_err());
    }
}
