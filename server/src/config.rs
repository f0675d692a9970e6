//! Server configuration: command-line flags, `RECONCILED_*` environment
//! variables and an optional TOML file.
//!
//! Every setting is resolved with exact precedence **flag > environment >
//! file > built-in default**, independently of the others: a flag given for
//! `--listen` does not stop `RECONCILED_DATA_DIR` from applying. Flags are
//! parsed by clap; the environment and the file are read here (not through
//! clap's `env` fallback) so that tests can pass an explicit environment and
//! every value's origin is known when it is rejected.
//!
//! `docs/configuration.md` documents every setting; a unit test keeps that
//! table and [`SETTINGS`] in step.

use std::ffi::OsString;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

mod store;

pub use store::{EtcdSettings, StoreKind, StoreLocation, parse_endpoints};

/// Environment variable naming the TOML configuration file (`--config`).
pub const CONFIG_FILE_ENV: &str = "RECONCILED_CONFIG";

/// What `admin_token` shows in [`Config::to_toml`] output.
pub const REDACTED: &str = "<redacted>";

/// Settings whose values are secrets: never echoed in errors or output.
const SECRET_SETTINGS: [&str; 2] = ["admin_token", "etcd_password"];

/// The longest item the store accepts: it keeps every stored value under
/// 64 KiB so that sled never moves it to its (unsynced) blob files.
pub const MAX_ITEM_BYTES_LIMIT: u64 = 64 * 1024;

/// The shortest admin token accepted from configuration.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 16;

const MIB: u64 = 1024 * 1024;

/// The default TTL of a replica's etcd lease (`cluster_lease_secs`).
pub const DEFAULT_CLUSTER_LEASE: Duration = Duration::from_secs(5);

/// Declares the settings once: the per-source [`Layer`] (clap flags, TOML
/// keys), its environment reader, the merge, and the [`SETTINGS`] table.
macro_rules! settings {
    ($(
        $key:ident: $ty:ty,
            env = $env:literal,
            default = $default:literal,
            value_name = $value_name:literal,
            help = $help:literal;
    )*) => {
        /// One source's view of the settings (flags, environment or file):
        /// every setting optional. Its serde form is the TOML file format.
        #[derive(Debug, Default, Clone, PartialEq, clap::Args, Deserialize, Serialize)]
        #[serde(deny_unknown_fields)]
        struct Layer {
            $(
                #[arg(
                    long,
                    global = true,
                    value_name = $value_name,
                    value_parser = <$ty as FlagValue>::flag_parser(),
                    help = concat!($help, " [env: ", $env, "] [default: ", $default, "]"),
                )]
                #[serde(default, skip_serializing_if = "Option::is_none")]
                $key: Option<$ty>,
            )*
        }

        impl Layer {
            /// Reads every `RECONCILED_*` variable that `env` reports; an
            /// empty value counts as unset.
            fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Layer, ConfigError> {
                Ok(Layer {
                    $(
                        $key: match env($env).filter(|raw| !raw.is_empty()) {
                            None => None,
                            Some(raw) => Some(
                                <$ty as SettingValue>::parse_setting(&raw).map_err(|reason| {
                                    ConfigError::Env {
                                        var: $env,
                                        // Never echo a secret back.
                                        value: if SECRET_SETTINGS.contains(&stringify!($key)) {
                                            REDACTED.to_owned()
                                        } else {
                                            raw.clone()
                                        },
                                        reason,
                                    }
                                })?,
                            ),
                        },
                    )*
                })
            }

            /// Merges the sources setting by setting, highest precedence
            /// first, and records where each value came from.
            fn merge(flags: Layer, env: Layer, file: Layer, file_path: Option<&Path>) -> (Layer, Origins) {
                let mut origins = Origins::default();
                let merged = Layer {
                    $(
                        $key: {
                            let (value, origin) = if flags.$key.is_some() {
                                (flags.$key, Origin::Flag(concat!("--", stringify!($key))))
                            } else if env.$key.is_some() {
                                (env.$key, Origin::Env($env))
                            } else if file.$key.is_some() {
                                (file.$key, Origin::File(file_path.map(Path::to_path_buf).unwrap_or_default()))
                            } else {
                                (None, Origin::Default)
                            };
                            origins.0.push((stringify!($key), origin));
                            value
                        },
                    )*
                };
                (merged, origins)
            }
        }

        /// Every setting of [`Config`] (except `--config` itself) with its
        /// TOML key, environment variable and default, in documentation
        /// order.
        pub const SETTINGS: &[SettingInfo] = &[
            $(SettingInfo { key: stringify!($key), env: $env, default: $default, help: $help },)*
        ];
    };
}

settings! {
    listen: SocketAddr,
        env = "RECONCILED_LISTEN", default = "127.0.0.1:50051", value_name = "ADDR",
        help = "Address the gRPC server listens on";
    data_dir: PathBuf,
        env = "RECONCILED_DATA_DIR", default = "./reconciled-data", value_name = "DIR",
        help = "Directory holding the database and the generated admin token";
    admin_token: String,
        env = "RECONCILED_ADMIN_TOKEN", default = "generated into <data-dir>/admin.token",
        value_name = "TOKEN",
        help = "Admin bearer token (at least 16 visible ASCII characters)";
    metrics_listen: SocketAddr,
        env = "RECONCILED_METRICS_LISTEN", default = "off", value_name = "ADDR",
        help = "Address of the Prometheus metrics HTTP endpoint";
    ui_listen: UiListen,
        env = "RECONCILED_UI_LISTEN", default = "127.0.0.1:8080", value_name = "ADDR|off",
        help = "Address of the web dashboard (its pages and the gRPC-Web API they call), or `off`";
    tls_cert: PathBuf,
        env = "RECONCILED_TLS_CERT", default = "off (plaintext)", value_name = "PEM_FILE",
        help = "Server certificate chain (PEM); serves TLS when set, together with --tls-key";
    tls_key: PathBuf,
        env = "RECONCILED_TLS_KEY", default = "off", value_name = "PEM_FILE",
        help = "Private key of the server certificate (PEM)";
    tls_client_ca: PathBuf,
        env = "RECONCILED_TLS_CLIENT_CA", default = "off", value_name = "PEM_FILE",
        help = "CA certificates (PEM) for mutual TLS: clients must present a certificate they signed";
    reflection: Reflection,
        env = "RECONCILED_REFLECTION", default = "authenticated", value_name = "MODE",
        help = "Who may use gRPC server reflection: `public` (anyone), `authenticated` (any valid token) or `off`";
    log_format: LogFormat,
        env = "RECONCILED_LOG_FORMAT", default = "human", value_name = "FORMAT",
        help = "Log format";
    log_level: String,
        env = "RECONCILED_LOG", default = "info", value_name = "FILTER",
        help = "Log filter, a tracing EnvFilter directive such as `info,reconciled=debug`";
    max_message_bytes: u64,
        env = "RECONCILED_MAX_MESSAGE_BYTES", default = "16777216", value_name = "BYTES",
        help = "Largest gRPC message accepted (from the admin) or sent";
    max_tenant_message_bytes: u64,
        env = "RECONCILED_MAX_TENANT_MESSAGE_BYTES", default = "4194304", value_name = "BYTES",
        help = "Largest gRPC message accepted from a tenant token or a public call (at most max_message_bytes)";
    max_request_items: u64,
        env = "RECONCILED_MAX_REQUEST_ITEMS", default = "10000", value_name = "N",
        help = "Most items in one request";
    max_item_bytes: u64,
        env = "RECONCILED_MAX_ITEM_BYTES", default = "65536", value_name = "BYTES",
        help = "Largest encoded item (at most 65536)";
    max_connections: u64,
        env = "RECONCILED_MAX_CONNECTIONS", default = "10000", value_name = "N",
        help = "Most client connections served at once; calls on further connections are refused";
    max_concurrent_requests: u64,
        env = "RECONCILED_MAX_CONCURRENT_REQUESTS", default = "1024", value_name = "N",
        help = "Most unary calls running at once; further calls are shed with RESOURCE_EXHAUSTED";
    max_reconcile_calls_per_tenant: u64,
        env = "RECONCILED_MAX_RECONCILE_CALLS_PER_TENANT", default = "8", value_name = "N",
        help = "Most Reconcile calls (waits included) one tenant, or the admin, runs at once; they take no unary slot";
    max_tenant_bytes_per_second: u64,
        env = "RECONCILED_MAX_TENANT_BYTES_PER_SECOND", default = "1048576", value_name = "BYTES",
        help = "Request bytes one tenant may send per second in unary calls (bursts of four seconds' worth; a call is admitted while the tenant's budget is not in debt); 0 = no limit";
    max_requests_per_second: u64,
        env = "RECONCILED_MAX_REQUESTS_PER_SECOND", default = "0", value_name = "N",
        help = "Calls accepted per second, all clients together (bursts up to one second's worth); 0 = no limit";
    request_timeout_secs: u64,
        env = "RECONCILED_REQUEST_TIMEOUT_SECS", default = "900", value_name = "SECS",
        help = "Longest a unary call may run before it fails with DEADLINE_EXCEEDED";
    max_agents_per_tenant: u64,
        env = "RECONCILED_MAX_AGENTS_PER_TENANT", default = "1000", value_name = "N",
        help = "Agents connected at once per tenant, unless the tenant's own limit says otherwise";
    max_items_per_tenant: u64,
        env = "RECONCILED_MAX_ITEMS_PER_TENANT", default = "1000000", value_name = "N",
        help = "Intended items per tenant, unless the tenant's own limit says otherwise";
    cache_capacity_bytes: u64,
        env = "RECONCILED_CACHE_CAPACITY_BYTES", default = "1073741824", value_name = "BYTES",
        help = "Store page cache size";
    max_commit_items: u64,
        env = "RECONCILED_MAX_COMMIT_ITEMS", default = "10000", value_name = "N",
        help = "Most records written by one store commit";
    resync_interval_secs: u64,
        env = "RECONCILED_RESYNC_INTERVAL_SECS", default = "600", value_name = "SECS",
        help = "Seconds between periodic full reconcile passes of a tenant";
    configurator_grace_secs: u64,
        env = "RECONCILED_CONFIGURATOR_GRACE_SECS", default = "300", value_name = "SECS",
        help = "Seconds items may wait for a configurator before the tenant is Stalled";
    cancel_timeout_secs: u64,
        env = "RECONCILED_CANCEL_TIMEOUT_SECS", default = "60", value_name = "SECS",
        help = "Seconds a cancelled operation may take to report before it is considered unknown";
    heartbeat_interval_secs: u64,
        env = "RECONCILED_HEARTBEAT_INTERVAL_SECS", default = "5", value_name = "SECS",
        help = "Seconds between heartbeats on configurator streams";
    lease_secs: u64,
        env = "RECONCILED_LEASE_SECS", default = "15", value_name = "SECS",
        help = "Seconds without a heartbeat after which a configurator session expires";
    shutdown_grace_secs: u64,
        env = "RECONCILED_SHUTDOWN_GRACE_SECS", default = "10", value_name = "SECS",
        help = "Seconds open streams may take to drain after SIGTERM";
    watch_history_revisions: u64,
        env = "RECONCILED_WATCH_HISTORY_REVISIONS", default = "100000", value_name = "N",
        help = "Revisions whose events are retained per tenant (and in the fleet log) for resuming watchers";
    watch_history_age_secs: u64,
        env = "RECONCILED_WATCH_HISTORY_AGE_SECS", default = "3600", value_name = "SECS",
        help = "Seconds watch events are retained";
    watch_history_bytes: u64,
        env = "RECONCILED_WATCH_HISTORY_BYTES", default = "268435456", value_name = "BYTES",
        help = "Bytes of watch events retained per tenant; the oldest revisions beyond it are compacted, the newest is always kept";
    watch_ring_events: u64,
        env = "RECONCILED_WATCH_RING_EVENTS", default = "10000", value_name = "N",
        help = "Events a watched tenant keeps in memory; a watcher further behind is ended with RESOURCE_EXHAUSTED";
    watch_bookmark_interval_ms: u64,
        env = "RECONCILED_WATCH_BOOKMARK_INTERVAL_MS", default = "5000", value_name = "MS",
        help = "Milliseconds of silence after which a watch stream gets a bookmark";
    max_watchers_per_tenant: u64,
        env = "RECONCILED_MAX_WATCHERS_PER_TENANT", default = "100", value_name = "N",
        help = "Open Watch streams per tenant, for tenants whose own limit is 0";
    fsync: bool,
        env = "RECONCILED_FSYNC", default = "true", value_name = "BOOL",
        help = "Fsync every commit; `false` can lose acknowledged writes on power loss";
    store: StoreKind,
        env = "RECONCILED_STORE", default = "sled", value_name = "sled|etcd",
        help = "Where state is kept: `sled` (embedded, in --data-dir) or `etcd` (shared by replicas, see --etcd-endpoints)";
    etcd_endpoints: String,
        env = "RECONCILED_ETCD_ENDPOINTS", default = "http://127.0.0.1:2379", value_name = "URLS",
        help = "Comma-separated client URLs of the etcd members (with --store etcd)";
    etcd_prefix: String,
        env = "RECONCILED_ETCD_PREFIX", default = "/reconciled/", value_name = "PREFIX",
        help = "Key prefix of this deployment in etcd; deployments sharing an etcd need distinct prefixes";
    advertise_addr: String,
        env = "RECONCILED_ADVERTISE_ADDR", default = "the --listen address", value_name = "HOST:PORT",
        help = "Address other replicas and clients reach this replica at";
    replica_id: String,
        env = "RECONCILED_REPLICA_ID", default = "the advertise address", value_name = "ID",
        help = "Name of this replica in the cluster (with --store etcd); keep it stable across restarts";
    cluster_lease_secs: u64,
        env = "RECONCILED_CLUSTER_LEASE_SECS", default = "5", value_name = "SECS",
        help = "TTL of the etcd lease a replica holds its tenants under (with --store etcd); renewed every third of it";
    etcd_staging_lease_secs: u64,
        env = "RECONCILED_ETCD_STAGING_LEASE_SECS", default = "60", value_name = "SECS",
        help = "How long the chunks of a large commit whose writer died stay in etcd before a replica discards them (with --store etcd)";
    etcd_ca: PathBuf,
        env = "RECONCILED_ETCD_CA", default = "off", value_name = "PEM_FILE",
        help = "CA certificates (PEM) that etcd's server certificate must chain to (https:// endpoints)";
    etcd_cert: PathBuf,
        env = "RECONCILED_ETCD_CERT", default = "off", value_name = "PEM_FILE",
        help = "Client certificate (PEM) presented to etcd, together with --etcd-key";
    etcd_key: PathBuf,
        env = "RECONCILED_ETCD_KEY", default = "off", value_name = "PEM_FILE",
        help = "Private key of the etcd client certificate (PEM)";
    etcd_user: String,
        env = "RECONCILED_ETCD_USER", default = "off", value_name = "USER",
        help = "etcd user, when etcd has authentication enabled (with --etcd-password)";
    etcd_password: String,
        env = "RECONCILED_ETCD_PASSWORD", default = "off", value_name = "PASSWORD",
        help = "Password of the etcd user (prefer the environment variable to the flag)";
}

/// Documentation of one setting, as listed in [`SETTINGS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettingInfo {
    /// The TOML key, e.g. `data_dir`.
    pub key: &'static str,
    /// The environment variable, e.g. `RECONCILED_DATA_DIR`.
    pub env: &'static str,
    /// The default, as shown in `--help`.
    pub default: &'static str,
    /// One line saying what the setting does.
    pub help: &'static str,
}

impl SettingInfo {
    /// The command-line flag, e.g. `--data-dir`.
    pub fn flag(&self) -> String {
        format!("--{}", self.key.replace('_', "-"))
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Human,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Who may use gRPC server reflection (`grpc.reflection.v1` and
/// `v1alpha`), which lists and describes every service and message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reflection {
    /// Anyone who can reach the port, without a token.
    Public,
    /// Callers with a valid admin or tenant token (the default, DESIGN
    /// section 9: every RPC but health is authenticated).
    #[default]
    Authenticated,
    /// Not served at all (`UNIMPLEMENTED`).
    Off,
}

/// The `ui_listen` setting: an address, or `off`. Its text form is what
/// the flag, the environment variable and the TOML key take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UiListen {
    /// The dashboard is not served.
    Off,
    /// The dashboard is served on this address.
    On(SocketAddr),
}

impl UiListen {
    /// The address to listen on; `None` for `off`.
    pub fn address(self) -> Option<SocketAddr> {
        match self {
            UiListen::Off => None,
            UiListen::On(addr) => Some(addr),
        }
    }
}

impl From<Option<SocketAddr>> for UiListen {
    fn from(addr: Option<SocketAddr>) -> Self {
        addr.map_or(UiListen::Off, UiListen::On)
    }
}

impl std::str::FromStr for UiListen {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let raw = raw.trim();
        if raw.eq_ignore_ascii_case("off") {
            return Ok(UiListen::Off);
        }
        raw.parse().map(UiListen::On).map_err(|_| {
            "expected `off` or an IP address and port such as 127.0.0.1:8080".to_owned()
        })
    }
}

impl fmt::Display for UiListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UiListen::Off => f.write_str("off"),
            UiListen::On(addr) => write!(f, "{addr}"),
        }
    }
}

impl Serialize for UiListen {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for UiListen {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        raw.parse().map_err(serde::de::Error::custom)
    }
}

/// A secret string (the admin token) whose `Debug` output is redacted, so a
/// logged [`Config`] never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({REDACTED})")
    }
}

/// What the process was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Run the server (the default when no subcommand is given).
    Serve,
    /// Inspect or apply store schema migrations.
    Migrate(MigrateMode),
    /// Validate the configuration and print it, effective, as TOML.
    CheckConfig,
    /// Copy every record of one store into another, empty one.
    StoreCopy {
        /// The store read.
        from: StoreLocation,
        /// The store written (must be empty).
        to: StoreLocation,
    },
    /// With the server stopped: report the tenants whose stored records
    /// cannot be read, and repair or remove them (`tenant::repair`).
    Repair(RepairMode),
}

/// What `reconciled repair` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepairMode {
    /// No flag: report every tenant's unreadable records, change nothing.
    Report,
    /// `--tenant NAME --apply`: back up the store, then repair the tenant's
    /// unreadable records.
    Apply(String),
    /// `--tenant NAME --remove`: back up the store, then tombstone the
    /// tenant (purged at the next start), as DeleteTenant does.
    Remove(String),
}

/// What `reconciled migrate` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrateMode {
    /// `--status`: show the schema version and the pending migrations.
    Status,
    /// `--dry-run`: show what would run, change nothing.
    DryRun,
    /// Neither flag: back up the database and apply pending migrations.
    Apply,
}

/// The fully resolved server configuration. Build it with [`Config::load`];
/// [`Config::default`] is the configuration of `reconciled` run with no
/// flags, environment or file (handy in tests: `Config { data_dir, ..Default::default() }`).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The TOML file that was read, if any (`--config` / `RECONCILED_CONFIG`).
    pub config_file: Option<PathBuf>,
    /// Address the gRPC server listens on.
    pub listen: SocketAddr,
    /// Directory holding the database and the generated admin token.
    pub data_dir: PathBuf,
    /// The configured admin token; `None` means generate it into (or read it
    /// from) `<data_dir>/admin.token`, see `auth::AdminToken::load_or_generate`.
    pub admin_token: Option<Secret>,
    /// Address of the Prometheus metrics endpoint; `None` turns it off.
    pub metrics_listen: Option<SocketAddr>,
    /// Address of the web dashboard and its gRPC-Web endpoint; `None`
    /// turns it off.
    pub ui_listen: Option<SocketAddr>,
    /// Server certificate chain (PEM file); with `tls_key`, serves TLS.
    pub tls_cert: Option<PathBuf>,
    /// Private key of `tls_cert` (PEM file).
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM file) that client certificates must chain to;
    /// set: mutual TLS, a client certificate is required.
    pub tls_client_ca: Option<PathBuf>,
    /// Who may use server reflection.
    pub reflection: Reflection,
    /// Log output format.
    pub log_format: LogFormat,
    /// Log filter: a `tracing_subscriber::EnvFilter` directive (validated).
    pub log_filter: String,
    /// Largest gRPC message accepted or sent, per service.
    pub max_message_bytes: usize,
    /// Largest message accepted from a caller other than the admin (a
    /// tenant token, a public health or reflection call); never more than
    /// `max_message_bytes`. See `limits::DecodeLimitLayer`.
    pub max_tenant_message_bytes: usize,
    /// Most items in one request.
    pub max_request_items: usize,
    /// Largest encoded item; never more than [`MAX_ITEM_BYTES_LIMIT`].
    pub max_item_bytes: usize,
    /// Most client connections served at once.
    pub max_connections: usize,
    /// Most unary calls running at once; further ones are shed.
    pub max_concurrent_requests: usize,
    /// Reconcile calls one tenant (or the admin) runs at once; they take no
    /// unary slot, so long waits cannot starve other tenants' calls.
    pub max_reconcile_calls_per_tenant: usize,
    /// Request bytes one tenant may send per second in unary calls;
    /// `None`: no limit.
    pub max_tenant_bytes_per_second: Option<u64>,
    /// Calls accepted per second, all clients together; `None`: no limit.
    pub max_requests_per_second: Option<u64>,
    /// Longest a unary call may run.
    pub request_timeout: Duration,
    /// Agents connected at once per tenant whose own limit is 0.
    pub max_agents_per_tenant: usize,
    /// Intended items per tenant whose own limit is 0.
    pub max_items_per_tenant: usize,
    /// sled page cache size.
    pub cache_capacity_bytes: u64,
    /// Most records written by one store commit (group commit batch bound).
    pub max_commit_items: usize,
    /// Period of full reconcile passes of every tenant.
    pub resync_interval: Duration,
    /// How long items may wait for a configurator before the tenant is Stalled.
    pub configurator_grace: Duration,
    /// How long a cancelled operation may take before it is considered unknown.
    pub cancel_timeout: Duration,
    /// Interval of heartbeats on configurator streams.
    pub heartbeat_interval: Duration,
    /// Time without a heartbeat after which a session expires; always longer
    /// than `heartbeat_interval`.
    pub lease: Duration,
    /// How long open streams may take to drain after SIGTERM.
    pub shutdown_grace: Duration,
    /// Revisions whose events are retained per tenant and in the fleet log.
    pub watch_history_revisions: u64,
    /// How long watch events are retained.
    pub watch_history_age: Duration,
    /// Bytes (keys and values) of events retained per tenant.
    pub watch_history_bytes: u64,
    /// Events a watched tenant keeps in memory for its watchers.
    pub watch_ring_events: usize,
    /// Silence after which a watch stream gets a bookmark.
    pub watch_bookmark_interval: Duration,
    /// Open Watch streams per tenant (tenants whose own limit is 0).
    pub max_watchers_per_tenant: usize,
    /// Fsync every commit. `false` can lose acknowledged writes on power loss
    /// and is logged as a warning at start.
    pub fsync: bool,
    /// Which backend keeps the state.
    pub store: StoreKind,
    /// How to reach etcd (with `store = etcd`, and for `store copy`).
    pub etcd: EtcdSettings,
    /// Address other replicas and clients reach this one at; `None`: the
    /// listen address.
    pub advertise_addr: Option<String>,
    /// This replica's name in the cluster; `None`: the advertise address.
    pub replica_id: Option<String>,
    /// TTL of the replica's etcd lease.
    pub cluster_lease: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            config_file: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            data_dir: PathBuf::from("./reconciled-data"),
            admin_token: None,
            metrics_listen: None,
            ui_listen: Some(SocketAddr::from(([127, 0, 0, 1], 8080))),
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            reflection: Reflection::Authenticated,
            log_format: LogFormat::Human,
            log_filter: "info".to_owned(),
            max_message_bytes: 16 * MIB as usize,
            max_tenant_message_bytes: 4 * MIB as usize,
            max_request_items: 10_000,
            max_item_bytes: MAX_ITEM_BYTES_LIMIT as usize,
            max_connections: 10_000,
            max_concurrent_requests: 1_024,
            max_reconcile_calls_per_tenant: 8,
            max_tenant_bytes_per_second: Some(MIB),
            max_requests_per_second: None,
            request_timeout: Duration::from_secs(900),
            max_agents_per_tenant: 1_000,
            max_items_per_tenant: 1_000_000,
            cache_capacity_bytes: 1024 * MIB,
            max_commit_items: 10_000,
            resync_interval: Duration::from_secs(600),
            configurator_grace: Duration::from_secs(300),
            cancel_timeout: Duration::from_secs(60),
            heartbeat_interval: Duration::from_secs(5),
            lease: Duration::from_secs(15),
            shutdown_grace: Duration::from_secs(10),
            watch_history_revisions: 100_000,
            watch_history_age: Duration::from_secs(3600),
            watch_history_bytes: 256 * MIB,
            watch_ring_events: 10_000,
            watch_bookmark_interval: Duration::from_secs(5),
            max_watchers_per_tenant: 100,
            fsync: true,
            store: StoreKind::Sled,
            etcd: EtcdSettings::default(),
            advertise_addr: None,
            replica_id: None,
            cluster_lease: DEFAULT_CLUSTER_LEASE,
        }
    }
}

/// Why the configuration could not be loaded. Every message names the
/// setting and where its value came from.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Bad command line, or `--help` / `--version` (call
    /// [`clap::Error::exit`] to print them with the right exit code).
    #[error(transparent)]
    Cli(#[from] clap::Error),
    /// The `--config` file could not be read.
    #[error(
        "cannot read configuration file {}: {source}; check the path given with --config or {CONFIG_FILE_ENV}",
        path.display()
    )]
    ReadFile {
        /// The file named by `--config` or `RECONCILED_CONFIG`.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The `--config` file is not valid TOML, has an unknown key or a value
    /// of the wrong type.
    #[error("invalid configuration file {}: {message}", path.display())]
    ParseFile {
        /// The file named by `--config` or `RECONCILED_CONFIG`.
        path: PathBuf,
        /// The parser's message, with line, column and key.
        message: String,
    },
    /// A `RECONCILED_*` environment variable has a value of the wrong type.
    #[error("invalid environment variable {var}={value:?}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// Its value (redacted for the admin token).
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A value is well-formed but out of range or inconsistent.
    #[error("invalid setting `{key}` (from {origin}): {reason}")]
    Invalid {
        /// The TOML key of the setting.
        key: &'static str,
        /// Where the rejected value came from.
        origin: Origin,
        /// What is wrong and what is accepted.
        reason: String,
    },
}

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A command-line flag.
    Flag(&'static str),
    /// An environment variable.
    Env(&'static str),
    /// The TOML file.
    File(PathBuf),
    /// The built-in default.
    Default,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Flag(flag) => write!(f, "flag {}", flag.replace('_', "-")),
            Origin::Env(var) => write!(f, "environment variable {var}"),
            Origin::File(path) => write!(f, "configuration file {}", path.display()),
            Origin::Default => f.write_str("default"),
        }
    }
}

/// The origin of every setting after the merge.
#[derive(Debug, Default)]
struct Origins(Vec<(&'static str, Origin)>);

impl Origins {
    fn of(&self, key: &str) -> Origin {
        self.0
            .iter()
            .find(|(k, _)| *k == key)
            .map_or(Origin::Default, |(_, origin)| origin.clone())
    }
}

/// Parses one setting from an environment variable's text.
trait SettingValue: Sized {
    fn parse_setting(raw: &str) -> Result<Self, String>;
}

impl SettingValue for SocketAddr {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        raw.parse().map_err(|_| {
            "expected an IP address and port such as 127.0.0.1:50051 or [::1]:50051".to_owned()
        })
    }
}

/// How clap parses a setting's flag: an address as the environment does
/// (clap's own "invalid socket address syntax" does not say which form is
/// expected, e.g. that host names are not taken), every other type with
/// clap's parser (which lists an enum's values in `--help`).
trait FlagValue {
    fn flag_parser() -> clap::builder::ValueParser;
}

impl FlagValue for SocketAddr {
    fn flag_parser() -> clap::builder::ValueParser {
        clap::builder::ValueParser::new(<SocketAddr as SettingValue>::parse_setting)
    }
}

macro_rules! clap_parses_flags_of {
    ($($ty:ty),*) => {$(
        impl FlagValue for $ty {
            fn flag_parser() -> clap::builder::ValueParser {
                clap::value_parser!($ty).into()
            }
        }
    )*};
}

clap_parses_flags_of!(
    PathBuf, String, u64, bool, UiListen, Reflection, LogFormat, StoreKind
);

impl SettingValue for UiListen {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        raw.parse()
    }
}

impl SettingValue for PathBuf {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        Ok(PathBuf::from(raw))
    }
}

impl SettingValue for String {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        Ok(raw.to_owned())
    }
}

impl SettingValue for u64 {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        raw.trim()
            .parse()
            .map_err(|_| "expected a non-negative whole number".to_owned())
    }
}

impl SettingValue for bool {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            _ => Err("expected `true` or `false`".to_owned()),
        }
    }
}

impl SettingValue for Reflection {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        Reflection::from_str(raw.trim(), true)
            .map_err(|_| "expected `public`, `authenticated` or `off`".to_owned())
    }
}

impl SettingValue for LogFormat {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        LogFormat::from_str(raw.trim(), true).map_err(|_| "expected `human` or `json`".to_owned())
    }
}

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "reconciled",
    version,
    about = "Multi-tenant gRPC service that converges intended and current configuration graphs",
    after_help = "Precedence: flag > environment > configuration file > default. \
                  See docs/configuration.md."
)]
struct Cli {
    /// TOML configuration file (unknown keys are errors) [env: RECONCILED_CONFIG]
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,

    #[command(flatten)]
    settings: Layer,

    #[command(subcommand)]
    command: Option<CliCommand>,
}

#[derive(Debug, Subcommand)]
enum CliCommand {
    /// Run the server (the default)
    Serve,
    /// Show or apply store schema migrations (without flags: back up, then apply)
    Migrate {
        /// Show the schema version and pending migrations, change nothing
        #[arg(long, conflicts_with = "dry_run")]
        status: bool,
        /// Show what would run, change nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Validate the configuration and print it, effective, as TOML (admin token redacted)
    CheckConfig,
    /// Offline store tools (stop the servers using the stores first)
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// With the server stopped: report tenants whose stored records cannot be
    /// read; with --tenant and --apply or --remove, repair or remove one
    Repair {
        /// The tenant to repair or remove
        #[arg(long, value_name = "NAME")]
        tenant: Option<String>,
        /// Back up the store, then repair the tenant's unreadable records
        #[arg(long, requires = "tenant", conflicts_with = "remove")]
        apply: bool,
        /// Back up the store, then remove the tenant (as DeleteTenant does)
        #[arg(long, requires = "tenant")]
        remove: bool,
    },
}

#[derive(Debug, Subcommand)]
enum StoreCommand {
    /// Copy every record of one store into another, empty one: `--from sled:DIR --to
    /// etcd:URLS` (or back); etcd's prefix, TLS and auth come from the --etcd-* settings
    Copy {
        /// The store to read: `sled:DIR` or `etcd:URL[,URL...]` (`etcd:` alone: --etcd-endpoints)
        #[arg(long, value_name = "STORE", value_parser = StoreLocation::parse)]
        from: StoreLocation,
        /// The empty store to write: `sled:DIR` or `etcd:URL[,URL...]`
        #[arg(long, value_name = "STORE", value_parser = StoreLocation::parse)]
        to: StoreLocation,
    },
}

impl Config {
    /// Parses `args` (including the program name, as from
    /// [`std::env::args_os`]), the process environment and the TOML file
    /// they name, and returns what to do with which configuration.
    pub fn load<I, T>(args: I) -> Result<(Command, Config), ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        Self::load_with_env(args, |name| {
            std::env::var_os(name).map(|value| value.to_string_lossy().into_owned())
        })
    }

    /// Like [`Config::load`], with the environment given by `env` (a lookup
    /// by variable name) instead of the process environment.
    pub fn load_with_env<I, T>(
        args: I,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<(Command, Config), ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let cli = Cli::try_parse_from(args)?;
        let command = match cli.command {
            None | Some(CliCommand::Serve) => Command::Serve,
            Some(CliCommand::CheckConfig) => Command::CheckConfig,
            Some(CliCommand::Store {
                command: StoreCommand::Copy { from, to },
            }) => Command::StoreCopy { from, to },
            Some(CliCommand::Repair {
                tenant,
                apply,
                remove,
            }) => Command::Repair(match (tenant, apply, remove) {
                (Some(tenant), true, _) => RepairMode::Apply(tenant),
                (Some(tenant), _, true) => RepairMode::Remove(tenant),
                _ => RepairMode::Report,
            }),
            Some(CliCommand::Migrate { status, dry_run }) => {
                Command::Migrate(match (status, dry_run) {
                    (true, _) => MigrateMode::Status,
                    (false, true) => MigrateMode::DryRun,
                    (false, false) => MigrateMode::Apply,
                })
            }
        };

        let config_file = cli.config.or_else(|| {
            env(CONFIG_FILE_ENV)
                .filter(|raw| !raw.is_empty())
                .map(PathBuf::from)
        });
        let file_layer = match &config_file {
            Some(path) => read_file_layer(path)?,
            None => Layer::default(),
        };
        let env_layer = Layer::from_env(&env)?;
        let (merged, origins) =
            Layer::merge(cli.settings, env_layer, file_layer, config_file.as_deref());
        let config = resolve(merged, &origins, config_file)?;
        Ok((command, config))
    }

    /// The effective configuration as a TOML file that [`Config::load`]
    /// accepts, with the admin token shown as [`REDACTED`].
    pub fn to_toml(&self) -> String {
        let layer = Layer {
            listen: Some(self.listen),
            data_dir: Some(PathBuf::from(self.data_dir.to_string_lossy().into_owned())),
            admin_token: self.admin_token.as_ref().map(|_| REDACTED.to_owned()),
            metrics_listen: self.metrics_listen,
            ui_listen: Some(UiListen::from(self.ui_listen)),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            tls_client_ca: self.tls_client_ca.clone(),
            reflection: Some(self.reflection),
            log_format: Some(self.log_format),
            log_level: Some(self.log_filter.clone()),
            max_message_bytes: Some(self.max_message_bytes as u64),
            max_tenant_message_bytes: Some(self.max_tenant_message_bytes as u64),
            max_request_items: Some(self.max_request_items as u64),
            max_item_bytes: Some(self.max_item_bytes as u64),
            max_connections: Some(self.max_connections as u64),
            max_concurrent_requests: Some(self.max_concurrent_requests as u64),
            max_reconcile_calls_per_tenant: Some(self.max_reconcile_calls_per_tenant as u64),
            max_tenant_bytes_per_second: Some(self.max_tenant_bytes_per_second.unwrap_or(0)),
            max_requests_per_second: Some(self.max_requests_per_second.unwrap_or(0)),
            request_timeout_secs: Some(self.request_timeout.as_secs()),
            max_agents_per_tenant: Some(self.max_agents_per_tenant as u64),
            max_items_per_tenant: Some(self.max_items_per_tenant as u64),
            cache_capacity_bytes: Some(self.cache_capacity_bytes),
            max_commit_items: Some(self.max_commit_items as u64),
            resync_interval_secs: Some(self.resync_interval.as_secs()),
            configurator_grace_secs: Some(self.configurator_grace.as_secs()),
            cancel_timeout_secs: Some(self.cancel_timeout.as_secs()),
            heartbeat_interval_secs: Some(self.heartbeat_interval.as_secs()),
            lease_secs: Some(self.lease.as_secs()),
            shutdown_grace_secs: Some(self.shutdown_grace.as_secs()),
            watch_history_revisions: Some(self.watch_history_revisions),
            watch_history_age_secs: Some(self.watch_history_age.as_secs()),
            watch_history_bytes: Some(self.watch_history_bytes),
            watch_ring_events: Some(self.watch_ring_events as u64),
            watch_bookmark_interval_ms: Some(
                u64::try_from(self.watch_bookmark_interval.as_millis()).unwrap_or(u64::MAX),
            ),
            max_watchers_per_tenant: Some(self.max_watchers_per_tenant as u64),
            fsync: Some(self.fsync),
            store: Some(self.store),
            etcd_endpoints: Some(self.etcd.endpoints.join(",")),
            etcd_prefix: Some(self.etcd.prefix.clone()),
            advertise_addr: self.advertise_addr.clone(),
            replica_id: self.replica_id.clone(),
            cluster_lease_secs: Some(self.cluster_lease.as_secs()),
            etcd_staging_lease_secs: Some(self.etcd.staging_lease.as_secs()),
            etcd_ca: self.etcd.ca.clone(),
            etcd_cert: self.etcd.cert.clone(),
            etcd_key: self.etcd.key.clone(),
            etcd_user: self.etcd.user.clone(),
            etcd_password: self.etcd.password.as_ref().map(|_| REDACTED.to_owned()),
        };
        match toml::to_string(&layer) {
            Ok(text) => text,
            // Every field is a plain string, number or boolean, so this is
            // unreachable; say so rather than panic.
            Err(error) => format!("# cannot render the configuration as TOML: {error}\n"),
        }
    }

    /// The file the generated admin token lives in: `<data_dir>/admin.token`.
    pub fn admin_token_path(&self) -> PathBuf {
        self.data_dir.join("admin.token")
    }
}

fn read_file_layer(path: &Path) -> Result<Layer, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|error| ConfigError::ParseFile {
        path: path.to_path_buf(),
        message: error.to_string().trim_end().to_owned(),
    })
}

/// Whether `id` may name a replica (it is part of an etcd key).
fn valid_replica_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'))
}

/// Applies defaults, converts units and checks ranges and consistency.
fn resolve(
    layer: Layer,
    origins: &Origins,
    config_file: Option<PathBuf>,
) -> Result<Config, ConfigError> {
    let defaults = Config::default();
    let invalid = |key: &'static str, reason: String| ConfigError::Invalid {
        key,
        origin: origins.of(key),
        reason,
    };
    let count =
        |key: &'static str, value: Option<u64>, default: usize| -> Result<usize, ConfigError> {
            match value {
                None => Ok(default),
                Some(0) => Err(invalid(key, "must be at least 1".to_owned())),
                Some(n) => usize::try_from(n)
                    .map_err(|_| invalid(key, format!("{n} is too large for this platform"))),
            }
        };
    let seconds =
        |key: &'static str, value: Option<u64>, default: Duration, allow_zero: bool| match value {
            None => Ok(default),
            Some(0) if !allow_zero => Err(invalid(key, "must be at least 1 second".to_owned())),
            Some(secs) => Ok(Duration::from_secs(secs)),
        };

    let (store, etcd, advertise_addr) =
        store::resolve(&layer, origins, layer.admin_token.is_some())?;
    let data_dir = layer.data_dir.unwrap_or(defaults.data_dir);
    if data_dir.as_os_str().is_empty() {
        return Err(invalid(
            "data_dir",
            "must not be empty; use `.` for the working directory".to_owned(),
        ));
    }

    let admin_token = match layer.admin_token {
        None => None,
        Some(token) => {
            check_admin_token(&token).map_err(|reason| invalid("admin_token", reason))?;
            Some(Secret::new(token))
        }
    };

    let log_filter = layer.log_level.unwrap_or(defaults.log_filter);
    if let Err(error) = tracing_subscriber::EnvFilter::try_new(&log_filter) {
        return Err(invalid(
            "log_level",
            format!(
                "{log_filter:?} is not a valid filter ({error}); use e.g. `info` or `info,reconciled=debug`"
            ),
        ));
    }

    let max_message_bytes = count(
        "max_message_bytes",
        layer.max_message_bytes,
        defaults.max_message_bytes,
    )?;
    let max_item_bytes = count(
        "max_item_bytes",
        layer.max_item_bytes,
        defaults.max_item_bytes,
    )?;
    if max_item_bytes as u64 > MAX_ITEM_BYTES_LIMIT {
        return Err(invalid(
            "max_item_bytes",
            format!(
                "{max_item_bytes} exceeds the store's limit of {MAX_ITEM_BYTES_LIMIT} bytes per item; \
                 split large values into several items"
            ),
        ));
    }
    let tenant_limit_set = layer.max_tenant_message_bytes.is_some();
    let mut max_tenant_message_bytes = count(
        "max_tenant_message_bytes",
        layer.max_tenant_message_bytes,
        defaults.max_tenant_message_bytes,
    )?;
    // The default follows a smaller max_message_bytes down; a value set
    // explicitly above it is a mistake worth stopping for.
    if !tenant_limit_set {
        max_tenant_message_bytes = max_tenant_message_bytes.min(max_message_bytes);
    }
    if max_tenant_message_bytes > max_message_bytes {
        return Err(invalid(
            "max_tenant_message_bytes",
            format!(
                "{max_tenant_message_bytes} is larger than max_message_bytes ({max_message_bytes}), \
                 which bounds every call; raise max_message_bytes too"
            ),
        ));
    }
    if max_tenant_message_bytes < max_item_bytes {
        return Err(invalid(
            "max_tenant_message_bytes",
            format!(
                "{max_tenant_message_bytes} is smaller than max_item_bytes ({max_item_bytes}); no item would fit"
            ),
        ));
    }
    if max_message_bytes < max_item_bytes {
        return Err(invalid(
            "max_message_bytes",
            format!(
                "{max_message_bytes} is smaller than max_item_bytes ({max_item_bytes}); no item would fit"
            ),
        ));
    }

    let cache_capacity_bytes = match layer.cache_capacity_bytes {
        Some(0) => {
            return Err(invalid(
                "cache_capacity_bytes",
                "must be at least 1".to_owned(),
            ));
        }
        value => value.unwrap_or(defaults.cache_capacity_bytes),
    };

    let heartbeat_interval = seconds(
        "heartbeat_interval_secs",
        layer.heartbeat_interval_secs,
        defaults.heartbeat_interval,
        false,
    )?;
    let lease = seconds("lease_secs", layer.lease_secs, defaults.lease, false)?;
    if lease <= heartbeat_interval {
        return Err(invalid(
            "lease_secs",
            format!(
                "{}s must be longer than heartbeat_interval_secs ({}s), or every session expires between two \
                 heartbeats; three heartbeats per lease is usual",
                lease.as_secs(),
                heartbeat_interval.as_secs()
            ),
        ));
    }

    match (&layer.tls_cert, &layer.tls_key) {
        (Some(_), None) => {
            return Err(invalid(
                "tls_cert",
                "is set without tls_key; give both the certificate and its private key".to_owned(),
            ));
        }
        (None, Some(_)) => {
            return Err(invalid(
                "tls_key",
                "is set without tls_cert; give both the certificate and its private key".to_owned(),
            ));
        }
        _ => {}
    }
    if layer.tls_client_ca.is_some() && layer.tls_cert.is_none() {
        return Err(invalid(
            "tls_client_ca",
            "mutual TLS needs TLS: set tls_cert and tls_key as well".to_owned(),
        ));
    }

    let replica_id = match &layer.replica_id {
        Some(id) if !valid_replica_id(id) => {
            return Err(invalid(
                "replica_id",
                format!(
                    "{id:?} is not a replica id; use 1 to 128 letters, digits and `.-_:` (a \
                     host name, a pod name, HOST:PORT)"
                ),
            ));
        }
        id => id.clone(),
    };
    let cluster_lease = store::lease_ttl(layer.cluster_lease_secs, defaults.cluster_lease)
        .map_err(|reason| invalid("cluster_lease_secs", reason))?;

    Ok(Config {
        store,
        etcd,
        advertise_addr,
        replica_id,
        cluster_lease,
        config_file,
        listen: layer.listen.unwrap_or(defaults.listen),
        data_dir,
        admin_token,
        metrics_listen: layer.metrics_listen,
        ui_listen: layer
            .ui_listen
            .map_or(defaults.ui_listen, UiListen::address),
        tls_cert: layer.tls_cert,
        tls_key: layer.tls_key,
        tls_client_ca: layer.tls_client_ca,
        reflection: layer.reflection.unwrap_or(defaults.reflection),
        log_format: layer.log_format.unwrap_or(defaults.log_format),
        log_filter,
        max_message_bytes,
        max_tenant_message_bytes,
        max_request_items: count(
            "max_request_items",
            layer.max_request_items,
            defaults.max_request_items,
        )?,
        max_item_bytes,
        max_connections: count(
            "max_connections",
            layer.max_connections,
            defaults.max_connections,
        )?,
        max_concurrent_requests: count(
            "max_concurrent_requests",
            layer.max_concurrent_requests,
            defaults.max_concurrent_requests,
        )?,
        max_reconcile_calls_per_tenant: count(
            "max_reconcile_calls_per_tenant",
            layer.max_reconcile_calls_per_tenant,
            defaults.max_reconcile_calls_per_tenant,
        )?,
        max_tenant_bytes_per_second: layer
            .max_tenant_bytes_per_second
            .or(defaults.max_tenant_bytes_per_second)
            .filter(|rate| *rate > 0),
        max_requests_per_second: layer.max_requests_per_second.filter(|rate| *rate > 0),
        request_timeout: seconds(
            "request_timeout_secs",
            layer.request_timeout_secs,
            defaults.request_timeout,
            false,
        )?,
        max_agents_per_tenant: count(
            "max_agents_per_tenant",
            layer.max_agents_per_tenant,
            defaults.max_agents_per_tenant,
        )?,
        max_items_per_tenant: count(
            "max_items_per_tenant",
            layer.max_items_per_tenant,
            defaults.max_items_per_tenant,
        )?,
        cache_capacity_bytes,
        max_commit_items: count(
            "max_commit_items",
            layer.max_commit_items,
            defaults.max_commit_items,
        )?,
        resync_interval: seconds(
            "resync_interval_secs",
            layer.resync_interval_secs,
            defaults.resync_interval,
            false,
        )?,
        configurator_grace: seconds(
            "configurator_grace_secs",
            layer.configurator_grace_secs,
            defaults.configurator_grace,
            true,
        )?,
        cancel_timeout: seconds(
            "cancel_timeout_secs",
            layer.cancel_timeout_secs,
            defaults.cancel_timeout,
            false,
        )?,
        heartbeat_interval,
        lease,
        shutdown_grace: seconds(
            "shutdown_grace_secs",
            layer.shutdown_grace_secs,
            defaults.shutdown_grace,
            true,
        )?,
        watch_history_revisions: count(
            "watch_history_revisions",
            layer.watch_history_revisions,
            defaults.watch_history_revisions as usize,
        )? as u64,
        watch_history_age: seconds(
            "watch_history_age_secs",
            layer.watch_history_age_secs,
            defaults.watch_history_age,
            false,
        )?,
        watch_history_bytes: count(
            "watch_history_bytes",
            layer.watch_history_bytes,
            defaults.watch_history_bytes as usize,
        )? as u64,
        watch_ring_events: count(
            "watch_ring_events",
            layer.watch_ring_events,
            defaults.watch_ring_events,
        )?,
        watch_bookmark_interval: Duration::from_millis(count(
            "watch_bookmark_interval_ms",
            layer.watch_bookmark_interval_ms,
            defaults.watch_bookmark_interval.as_millis() as usize,
        )? as u64),
        max_watchers_per_tenant: count(
            "max_watchers_per_tenant",
            layer.max_watchers_per_tenant,
            defaults.max_watchers_per_tenant,
        )?,
        fsync: layer.fsync.unwrap_or(defaults.fsync),
    })
}

/// An admin token must be usable in an `authorization: Bearer` header and
/// not trivially guessable.
fn check_admin_token(token: &str) -> Result<(), String> {
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(
            "must consist of visible ASCII characters only (no spaces or control characters)"
                .to_owned(),
        );
    }
    if token.len() < MIN_ADMIN_TOKEN_CHARS {
        return Err(format!(
            "is {} characters long; use at least {MIN_ADMIN_TOKEN_CHARS} (e.g. `openssl rand -hex 32`), \
             or leave it unset to have one generated",
            token.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::io::Write as _;

    fn load(args: &[&str], env: &[(&str, &str)]) -> Result<(Command, Config), ConfigError> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let argv = std::iter::once("reconciled").chain(args.iter().copied());
        Config::load_with_env(argv, |name| env.get(name).cloned())
    }

    fn config_file(text: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        file.write_all(text.as_bytes()).expect("write temp file");
        file
    }

    fn path_of(file: &tempfile::NamedTempFile) -> &str {
        file.path().to_str().expect("utf-8 temp path")
    }

    #[test]
    fn no_arguments_means_serve_with_defaults() {
        let (command, config) = load(&[], &[]).expect("defaults load");
        assert_eq!(command, Command::Serve);
        assert_eq!(config, Config::default());
        assert_eq!(config.listen, "127.0.0.1:50051".parse().expect("addr"));
        assert_eq!(config.data_dir, PathBuf::from("./reconciled-data"));
        assert_eq!(config.max_message_bytes, 16 * 1024 * 1024);
        assert_eq!(config.max_tenant_message_bytes, 4 * 1024 * 1024);
        assert_eq!(config.cache_capacity_bytes, 1 << 30);
        assert!(config.fsync);
        assert_eq!(config.metrics_listen, None);
        assert_eq!(
            config.ui_listen,
            Some("127.0.0.1:8080".parse().expect("addr"))
        );
    }

    #[test]
    fn the_tenant_message_limit_follows_a_smaller_message_limit_unless_set() {
        let (_, small) = load(&["--max-message-bytes", "1048576"], &[]).expect("valid");
        assert_eq!(small.max_tenant_message_bytes, 1_048_576);
        let error = load(
            &[
                "--max-message-bytes",
                "1048576",
                "--max-tenant-message-bytes",
                "2097152",
            ],
            &[],
        )
        .expect_err("explicitly over max_message_bytes");
        assert!(
            error.to_string().contains("max_tenant_message_bytes"),
            "{error}"
        );
    }

    #[test]
    fn ui_listen_takes_an_address_or_off_from_every_source() {
        let (_, flag) = load(&["--ui-listen", "off"], &[]).expect("loads");
        assert_eq!(flag.ui_listen, None);
        let (_, env) = load(&[], &[("RECONCILED_UI_LISTEN", "127.0.0.1:9")]).expect("loads");
        assert_eq!(env.ui_listen, Some("127.0.0.1:9".parse().expect("addr")));
        let file = config_file("ui_listen = \"off\"\n");
        let (_, from_file) = load(&["--config", path_of(&file)], &[]).expect("loads");
        assert_eq!(from_file.ui_listen, None);
        let error = load(&[], &[("RECONCILED_UI_LISTEN", "nowhere")])
            .expect_err("not an address")
            .to_string();
        assert!(
            error.contains("RECONCILED_UI_LISTEN") && error.contains("off"),
            "{error}"
        );
    }

    #[test]
    fn flag_beats_env_beats_file_beats_default() {
        let file = config_file(
            "listen = \"127.0.0.1:3\"\ndata_dir = \"/from/file\"\nlease_secs = 30\nmax_request_items = 7\n",
        );
        let (_, config) = load(
            &["--config", path_of(&file), "--listen", "127.0.0.1:1"],
            &[
                ("RECONCILED_LISTEN", "127.0.0.1:2"),
                ("RECONCILED_DATA_DIR", "/from/env"),
                ("RECONCILED_LEASE_SECS", ""),
            ],
        )
        .expect("loads");
        assert_eq!(
            config.listen,
            "127.0.0.1:1".parse().expect("addr"),
            "flag wins"
        );
        assert_eq!(
            config.data_dir,
            PathBuf::from("/from/env"),
            "env beats file"
        );
        assert_eq!(
            config.lease,
            Duration::from_secs(30),
            "file applies; empty env is unset"
        );
        assert_eq!(config.max_request_items, 7, "file applies");
        assert_eq!(config.max_commit_items, 10_000, "default applies");
        assert_eq!(config.config_file.as_deref(), Some(file.path()));
    }

    #[test]
    fn reflection_is_authenticated_by_default_and_set_by_flag_env_or_file() {
        assert_eq!(
            load(&[], &[]).expect("loads").1.reflection,
            Reflection::Authenticated
        );
        let flag = load(&["--reflection", "public"], &[]).expect("loads").1;
        assert_eq!(flag.reflection, Reflection::Public);
        let env = load(&[], &[("RECONCILED_REFLECTION", "off")])
            .expect("loads")
            .1;
        assert_eq!(env.reflection, Reflection::Off);
        let file = config_file("reflection = \"public\"\n");
        let from_file = load(&["--config", path_of(&file)], &[]).expect("loads").1;
        assert_eq!(from_file.reflection, Reflection::Public);
        let bad = load(&[], &[("RECONCILED_REFLECTION", "sometimes")]).expect_err("refused");
        assert!(
            bad.to_string()
                .contains("`public`, `authenticated` or `off`"),
            "{bad}"
        );
    }

    #[test]
    fn config_file_can_come_from_the_environment() {
        let file = config_file("max_item_bytes = 1000\n");
        let (_, config) = load(&[], &[("RECONCILED_CONFIG", path_of(&file))]).expect("loads");
        assert_eq!(config.max_item_bytes, 1000);
    }

    #[test]
    fn flags_work_after_the_subcommand() {
        let (command, config) = load(
            &[
                "check-config",
                "--listen",
                "127.0.0.1:9",
                "--fsync",
                "false",
            ],
            &[],
        )
        .expect("loads");
        assert_eq!(command, Command::CheckConfig);
        assert_eq!(config.listen.port(), 9);
        assert!(!config.fsync);
    }

    #[test]
    fn migrate_modes_are_parsed() {
        let mode = |args: &[&str]| load(args, &[]).expect("loads").0;
        assert_eq!(
            mode(&["migrate", "--status"]),
            Command::Migrate(MigrateMode::Status)
        );
        assert_eq!(
            mode(&["migrate", "--dry-run"]),
            Command::Migrate(MigrateMode::DryRun)
        );
        assert_eq!(mode(&["migrate"]), Command::Migrate(MigrateMode::Apply));
        assert_eq!(mode(&["serve"]), Command::Serve);
        assert!(load(&["migrate", "--status", "--dry-run"], &[]).is_err());
    }

    #[test]
    fn unknown_file_keys_are_errors_naming_the_key() {
        let file = config_file("listen = \"127.0.0.1:1\"\nlisten_adress = \"oops\"\n");
        let error = load(&["--config", path_of(&file)], &[]).expect_err("unknown key rejected");
        let message = error.to_string();
        assert!(matches!(error, ConfigError::ParseFile { .. }), "{message}");
        assert!(message.contains("listen_adress"), "{message}");
    }

    #[test]
    fn config_key_is_not_accepted_inside_the_file() {
        let file = config_file("config = \"other.toml\"\n");
        let error = load(&["--config", path_of(&file)], &[]).expect_err("rejected");
        assert!(error.to_string().contains("config"), "{error}");
    }

    #[test]
    fn wrongly_typed_file_values_name_the_key() {
        let file = config_file("lease_secs = \"fifteen\"\n");
        let message = load(&["--config", path_of(&file)], &[])
            .expect_err("rejected")
            .to_string();
        assert!(message.contains("lease_secs"), "{message}");
    }

    #[test]
    fn missing_config_file_is_an_error_naming_it() {
        let message = load(&["--config", "/nonexistent/reconciled.toml"], &[])
            .expect_err("rejected")
            .to_string();
        assert!(
            message.contains("/nonexistent/reconciled.toml"),
            "{message}"
        );
    }

    #[test]
    fn bad_env_values_name_the_variable() {
        let error = load(&[], &[("RECONCILED_LISTEN", "localhost")]).expect_err("rejected");
        let message = error.to_string();
        assert!(message.contains("RECONCILED_LISTEN"), "{message}");
        assert!(
            message.contains("127.0.0.1:50051"),
            "says what is expected: {message}"
        );

        let message = load(&[], &[("RECONCILED_FSYNC", "maybe")])
            .expect_err("rejected")
            .to_string();
        assert!(
            message.contains("RECONCILED_FSYNC") && message.contains("true"),
            "{message}"
        );

        let message = load(&[], &[("RECONCILED_LOG_FORMAT", "xml")])
            .expect_err("rejected")
            .to_string();
        assert!(message.contains("json"), "{message}");
    }

    #[test]
    fn bad_flag_values_are_rejected_by_the_parser() {
        assert!(matches!(
            load(&["--listen", "nowhere"], &[]),
            Err(ConfigError::Cli(_))
        ));
        assert!(matches!(
            load(&["--lease-secs", "-1"], &[]),
            Err(ConfigError::Cli(_))
        ));
        assert!(matches!(
            load(&["--log-format", "xml"], &[]),
            Err(ConfigError::Cli(_))
        ));
    }

    #[test]
    fn out_of_range_values_say_where_they_came_from() {
        let message = load(&[], &[("RECONCILED_MAX_ITEM_BYTES", "70000")])
            .expect_err("rejected")
            .to_string();
        assert!(message.contains("max_item_bytes"), "{message}");
        assert!(message.contains("RECONCILED_MAX_ITEM_BYTES"), "{message}");
        assert!(message.contains("65536"), "{message}");

        let message = load(&["--max-request-items", "0"], &[])
            .expect_err("rejected")
            .to_string();
        assert!(
            message.contains("max_request_items") && message.contains("--max-request-items"),
            "{message}"
        );

        let file = config_file("lease_secs = 5\n");
        let message = load(&["--config", path_of(&file)], &[])
            .expect_err("rejected")
            .to_string();
        assert!(
            message.contains("lease_secs") && message.contains("configuration file"),
            "{message}"
        );
        assert!(message.contains("heartbeat_interval_secs"), "{message}");
    }

    #[test]
    fn tls_settings_come_in_pairs() {
        let message = load(&["--tls-cert", "/etc/reconciled/cert.pem"], &[])
            .expect_err("a certificate without a key")
            .to_string();
        assert!(message.contains("tls_key"), "{message}");
        let message = load(&[], &[("RECONCILED_TLS_CLIENT_CA", "/etc/ca.pem")])
            .expect_err("mTLS without TLS")
            .to_string();
        assert!(
            message.contains("tls_client_ca") && message.contains("RECONCILED_TLS_CLIENT_CA"),
            "{message}"
        );
        let (_, config) = load(
            &["--tls-cert", "c.pem", "--tls-key", "k.pem"],
            &[("RECONCILED_TLS_CLIENT_CA", "ca.pem")],
        )
        .expect("loads");
        assert_eq!(config.tls_client_ca, Some(PathBuf::from("ca.pem")));
    }

    #[test]
    fn invalid_log_filter_is_rejected() {
        let message = load(&[], &[("RECONCILED_LOG", "info,[[[")])
            .expect_err("rejected")
            .to_string();
        assert!(
            message.contains("log_level") && message.contains("RECONCILED_LOG"),
            "{message}"
        );
    }

    #[test]
    fn weak_or_malformed_admin_tokens_are_rejected_without_echoing_them() {
        let message = load(&["--admin-token", "short"], &[])
            .expect_err("rejected")
            .to_string();
        assert!(
            message.contains("admin_token") && message.contains("16"),
            "{message}"
        );
        assert!(!message.contains("short\""), "{message}");

        let message = load(
            &[],
            &[("RECONCILED_ADMIN_TOKEN", "has a space in the middle")],
        )
        .expect_err("rejected")
        .to_string();
        assert!(
            !message.contains("middle"),
            "token must not be echoed: {message}"
        );
    }

    #[test]
    fn admin_token_is_redacted_in_debug_and_toml_output() {
        let token = "rcda_0123456789abcdef0123456789";
        let (_, config) = load(&["--admin-token", token], &[]).expect("loads");
        assert_eq!(config.admin_token.as_ref().map(Secret::expose), Some(token));
        assert!(!format!("{config:?}").contains(token));
        let toml = config.to_toml();
        assert!(!toml.contains(token), "{toml}");
        assert!(toml.contains(REDACTED), "{toml}");
    }

    #[test]
    fn effective_toml_round_trips_through_the_file_loader() {
        let (_, config) = load(
            &[
                "--listen",
                "[::1]:7000",
                "--metrics-listen",
                "127.0.0.1:9090",
                "--log-format",
                "json",
            ],
            &[("RECONCILED_SHUTDOWN_GRACE_SECS", "0")],
        )
        .expect("loads");
        let file = config_file(&config.to_toml());
        let (_, reloaded) = load(&["--config", path_of(&file)], &[]).expect("own output loads");
        assert_eq!(
            Config {
                config_file: None,
                ..reloaded
            },
            config
        );
    }

    #[test]
    fn every_setting_is_documented_in_the_configuration_guide() {
        let guide = include_str!("../../docs/configuration.md");
        for setting in SETTINGS {
            for needle in [
                setting.flag(),
                setting.env.to_owned(),
                format!("`{}`", setting.key),
            ] {
                assert!(
                    guide.contains(&needle),
                    "docs/configuration.md does not mention {needle}"
                );
            }
        }
        assert!(guide.contains(CONFIG_FILE_ENV));
    }

    /// An operator copies the example to start from: a setting missing
    /// there is one they never learn of (it lacked a third of them).
    #[test]
    fn every_setting_is_in_the_example_configuration() {
        let example = include_str!("../../deploy/reconciled.example.toml");
        for setting in SETTINGS {
            let set = format!("\n{} = ", setting.key);
            let shown = format!("\n# {} = ", setting.key);
            assert!(
                example.contains(&set) || example.contains(&shown),
                "deploy/reconciled.example.toml does not show `{}` (set, or commented out \
                 with its default)",
                setting.key
            );
        }
    }

    #[test]
    fn help_shows_environment_variables_and_defaults() {
        let help = match load(&["--help"], &[]) {
            Err(ConfigError::Cli(error)) => error.to_string(),
            other => panic!("--help should be a clap error, got {other:?}"),
        };
        assert!(help.contains("RECONCILED_DATA_DIR"), "{help}");
        assert!(help.contains("127.0.0.1:50051"), "{help}");
    }
}
