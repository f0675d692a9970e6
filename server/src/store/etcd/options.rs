//! How to reach etcd and how the store uses it.

use std::path::PathBuf;
use std::time::Duration;

/// The key prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "/reconciled/";

/// etcd's default `--max-txn-ops`: operations per transaction.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;

/// The payload one request may carry: well under etcd's default
/// `--max-request-bytes` (1.5 MiB), leaving room for the request's own
/// encoding (keys, op headers, compares).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// TTL of a staging lease unless configured: how long the chunks of a
/// large commit whose writer died stay before they are discarded.
pub const DEFAULT_STAGING_LEASE: Duration = Duration::from_secs(60);

/// Client certificates and trust for `https://` endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    /// CA certificates (PEM) that etcd's server certificate must chain to.
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM), for etcd's `--client-cert-auth`.
    pub cert: Option<PathBuf>,
    /// Private key of `cert` (PEM).
    pub key: Option<PathBuf>,
}

/// A user name and password for etcd's authentication.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdAuth {
    /// The etcd user.
    pub user: String,
    /// Its password. Never logged.
    pub password: String,
}

impl std::fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAuth")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Where a staged commit stops, as a crash there would: for tests of
/// crash safety only. The store's commit writer ends at that point, so
/// this commit and every later one fail with
/// [`StoreError::Closed`](crate::store::StoreError::Closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// Every chunk is staged; the marker is not written.
    AfterStaging,
    /// The marker is written; nothing is rolled into its keys.
    AfterMarker,
    /// The first roll-in transaction is applied, the others are not.
    DuringRollIn,
}

/// Settings of an [`EtcdStore`](crate::store::EtcdStore).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Client URLs of the etcd members, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Every key the store writes starts with this (default
    /// [`DEFAULT_PREFIX`]), so that deployments can share an etcd.
    pub prefix: String,
    /// TLS settings for `https://` endpoints.
    pub tls: Option<EtcdTls>,
    /// etcd user and password, when etcd has authentication enabled.
    pub auth: Option<EtcdAuth>,
    /// Most operations in one transaction: etcd's `--max-txn-ops`.
    pub max_txn_ops: usize,
    /// Most bytes of keys and values in one request, below etcd's
    /// `--max-request-bytes`.
    pub max_request_bytes: usize,
    /// TTL of the lease that marks a staged commit as in progress: chunks
    /// of a writer that died are discarded once it expired.
    pub staging_lease: Duration,
    /// How long a read waits for a commit marker to go (its writer rolls
    /// the batch in) before it rolls the batch in itself.
    pub marker_wait: Duration,
    /// How long a commit keeps retrying while etcd is unreachable or has
    /// no leader. After that the outcome of the last attempt is unknown
    /// and the process stops, as it does when sled cannot fsync.
    pub commit_timeout: Duration,
    /// How long opening waits for etcd to answer.
    pub connect_timeout: Duration,
    /// For tests: abandon staged commits at this stage, as a crash would.
    pub crash_point: Option<CrashPoint>,
    /// For tests: send every commit transaction as a retry may at worst:
    /// twice at once (the first answer lost), and once more after the next
    /// commit has landed (a first attempt etcd held back). Commits must
    /// come out as if each were applied once, in order.
    pub resend_commits: bool,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            endpoints: vec!["http://127.0.0.1:2379".to_owned()],
            prefix: DEFAULT_PREFIX.to_owned(),
            tls: None,
            auth: None,
            max_txn_ops: DEFAULT_MAX_TXN_OPS,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            staging_lease: DEFAULT_STAGING_LEASE,
            marker_wait: Duration::from_secs(10),
            commit_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            crash_point: None,
            resend_commits: false,
        }
    }
}
