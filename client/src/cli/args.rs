//! reconctl's command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use super::settings::FlagValues;

const AFTER_HELP: &str = "\
Connection: --addr, RECONCILED_ADDR, or `addr` in the config file (default \
http://127.0.0.1:50051); --token / --token-file, RECONCILED_TOKEN / \
RECONCILED_TOKEN_FILE, or `token` / `token_file`; --tenant, RECONCILED_TENANT, \
or `tenant`. Flags win over the environment, which wins over the config file \
(--config, RECONCTL_CONFIG, or ~/.config/reconciled/reconctl.toml).

Exit codes: 0 success (reconcile --wait: converged), 1 the request failed, \
2 bad command line or configuration, 3 reconcile --wait stalled or stopped \
making progress, 4 reconcile --wait timed out.";

/// reconctl: operate a reconciled server.
#[derive(Debug, Parser)]
#[command(
    name = "reconctl",
    version,
    about = "Operate a reconciled server: tenants, intents, graphs, reconciliation, watches",
    after_help = AFTER_HELP
)]
pub(crate) struct Cli {
    /// Where to connect and as whom.
    #[command(flatten)]
    pub(crate) connection: ConnectionArgs,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Connection flags, accepted before or after the subcommand.
#[derive(Debug, Args)]
pub(crate) struct ConnectionArgs {
    /// The server, e.g. http://127.0.0.1:50051 [env: RECONCILED_ADDR]
    #[arg(long, global = true, value_name = "URI", help_heading = "Connection")]
    addr: Option<String>,
    /// The bearer token (visible in the process list: prefer RECONCILED_TOKEN
    /// or --token-file) [env: RECONCILED_TOKEN]
    #[arg(
        long,
        global = true,
        value_name = "TOKEN",
        conflicts_with = "token_file",
        help_heading = "Connection"
    )]
    token: Option<String>,
    /// A file holding the bearer token, e.g. reconciled-data/admin.token
    /// [env: RECONCILED_TOKEN_FILE]
    #[arg(long, global = true, value_name = "FILE", help_heading = "Connection")]
    token_file: Option<PathBuf>,
    /// The tenant of tenant-scoped commands [env: RECONCILED_TENANT]
    #[arg(long, global = true, value_name = "NAME", help_heading = "Connection")]
    tenant: Option<String>,
    /// The config file (TOML: addr, token, token_file, tenant, ca_cert,
    /// client_cert, client_key) [env: RECONCTL_CONFIG] [default:
    /// ~/.config/reconciled/reconctl.toml]
    #[arg(long, global = true, value_name = "FILE", help_heading = "Connection")]
    config: Option<PathBuf>,
    /// TLS: the CA certificate (PEM) of the server's certificate; the
    /// address then uses https [env: RECONCILED_CA_CERT]
    #[arg(long, global = true, value_name = "FILE", help_heading = "Connection")]
    ca_cert: Option<PathBuf>,
    /// Mutual TLS: this client's certificate (PEM) [env:
    /// RECONCILED_CLIENT_CERT]
    #[arg(long, global = true, value_name = "FILE", help_heading = "Connection")]
    client_cert: Option<PathBuf>,
    /// Mutual TLS: this client's private key (PEM) [env:
    /// RECONCILED_CLIENT_KEY]
    #[arg(long, global = true, value_name = "FILE", help_heading = "Connection")]
    client_key: Option<PathBuf>,
}

impl ConnectionArgs {
    /// The flags' values, for [`super::settings::Settings::resolve`].
    pub(crate) fn flag_values(&self) -> FlagValues {
        FlagValues {
            addr: self.addr.clone(),
            token: self.token.clone(),
            token_file: self.token_file.clone(),
            tenant: self.tenant.clone(),
            config: self.config.clone(),
            ca_cert: self.ca_cert.clone(),
            client_cert: self.client_cert.clone(),
            client_key: self.client_key.clone(),
        }
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create, list, show and delete tenants, and rotate their tokens (admin
    /// token).
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Submit a tenant's intended items.
    #[command(subcommand)]
    Intent(IntentCommand),
    /// Show a tenant's intended and current graphs.
    #[command(subcommand)]
    Graph(GraphCommand),
    /// Trigger a reconciliation pass and, with --wait, follow it until the
    /// tenant converges, stalls or the timeout expires.
    Reconcile(ReconcileArgs),
    /// Stream a tenant's events: a snapshot then live events, or the events
    /// after a revision.
    Watch(WatchArgs),
    /// Show a tenant's conditions, generations and item counts.
    Status(StatusArgs),
    /// Show the item types agents registered for the tenant, with their
    /// specs and JSON Schemas.
    #[command(subcommand)]
    Type(TypeCommand),
    /// Show every tenant with its conditions and counts (admin token).
    Fleet(FleetArgs),
}

/// `reconctl type ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum TypeCommand {
    /// List the registered item types: connected, epoch, READ, recreate
    /// paths, whether they have a schema.
    List(FormatArgs),
    /// Show one item type's spec and JSON Schema.
    Get(TypeGetArgs),
}

/// `type get`.
#[derive(Debug, Args)]
pub(crate) struct TypeGetArgs {
    /// The item type.
    pub(crate) name: String,
    /// Print only the type's JSON Schema, as JSON (`true` if it has none).
    #[arg(long, conflicts_with = "output")]
    pub(crate) schema: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) output: OutputFormat,
}

/// Output of commands that show records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    /// Human-readable text.
    Table,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// Output of `graph get`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum GraphFormat {
    /// Human-readable tables.
    Table,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
    /// Graphviz DOT (render with `dot -Tsvg`).
    Dot,
}

/// Output of streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StreamFormat {
    /// One human-readable line per event.
    Human,
    /// One JSON object per line.
    Json,
}

/// `reconctl tenant ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum TenantCommand {
    /// Create a tenant and print its token (shown only once).
    Create(TenantCreateArgs),
    /// List every tenant with its conditions.
    List(FormatArgs),
    /// Show a tenant with its limits and status.
    Get(TenantNameArgs),
    /// Delete a tenant and purge its data (configurators are not called).
    Delete(TenantNameArgs),
    /// Replace a tenant's token and print the new one; the old one stops
    /// working at once.
    RotateToken(TenantTokenArgs),
}

/// `-o table|json|yaml`.
#[derive(Debug, Args)]
pub(crate) struct FormatArgs {
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) output: OutputFormat,
}

/// A tenant name and an output format.
#[derive(Debug, Args)]
pub(crate) struct TenantNameArgs {
    /// The tenant's name.
    pub(crate) name: String,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) output: OutputFormat,
}

/// `tenant rotate-token`.
#[derive(Debug, Args)]
pub(crate) struct TenantTokenArgs {
    /// The tenant's name.
    pub(crate) name: String,
    /// Print only the token (for `TOKEN=$(reconctl ...)`).
    #[arg(short, long, conflicts_with = "output")]
    pub(crate) quiet: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) output: OutputFormat,
}

/// `tenant create`.
#[derive(Debug, Args)]
pub(crate) struct TenantCreateArgs {
    /// The new tenant's name (1 to 253 bytes of printable UTF-8).
    pub(crate) name: String,
    /// Print only the token (for `TOKEN=$(reconctl ...)`).
    #[arg(short, long, conflicts_with = "output")]
    pub(crate) quiet: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) output: OutputFormat,
    /// The most intended items (default: the server's).
    #[arg(long, value_name = "N")]
    pub(crate) max_items: Option<u64>,
    /// The most items in one intent submission (default: the server's).
    #[arg(long, value_name = "N")]
    pub(crate) max_request_items: Option<u64>,
    /// The most connected agents (default: the server's).
    #[arg(long, value_name = "N")]
    pub(crate) max_agents: Option<u64>,
    /// The most open watches (default: the server's).
    #[arg(long, value_name = "N")]
    pub(crate) max_watchers: Option<u64>,
    /// The most operations in flight (default: the server's).
    #[arg(long, value_name = "N")]
    pub(crate) max_operations_in_flight: Option<u64>,
}

/// `reconctl intent ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum IntentCommand {
    /// Replace the tenant's intended items (or one subgraph's) with those of
    /// a JSON or YAML file.
    Submit(IntentSubmitArgs),
}

/// `intent submit`.
#[derive(Debug, Args)]
pub(crate) struct IntentSubmitArgs {
    /// The intent file (JSON or YAML, as deploy/examples/site.json); `-`
    /// reads standard input.
    #[arg(short, long, value_name = "FILE")]
    pub(crate) file: String,
    /// Replace only this subgraph (and the paths under it); overrides the
    /// file's `subgraph`.
    #[arg(long, value_name = "PATH")]
    pub(crate) subgraph: Option<String>,
    /// Validate and show the plan; store nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Refuse the submission unless the tenant's generation is N.
    #[arg(long, value_name = "N")]
    pub(crate) expected_generation: Option<u64>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) output: OutputFormat,
}

/// `reconctl graph ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum GraphCommand {
    /// Show the intended and current graphs (both by default).
    Get(GraphGetArgs),
}

/// `graph get`.
#[derive(Debug, Args)]
pub(crate) struct GraphGetArgs {
    /// Only the intended graph.
    #[arg(long, conflicts_with = "current")]
    pub(crate) intended: bool,
    /// Only the current graph.
    #[arg(long)]
    pub(crate) current: bool,
    /// Only items listed in this subgraph and the paths under it.
    #[arg(long, value_name = "PATH")]
    pub(crate) subgraph: Option<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = GraphFormat::Table)]
    pub(crate) output: GraphFormat,
}

/// `reconcile`.
#[derive(Debug, Args)]
pub(crate) struct ReconcileArgs {
    /// Wait until the scope is Ready or Stalled, stops making progress, or
    /// the timeout expires, showing progress meanwhile.
    #[arg(long)]
    pub(crate) wait: bool,
    /// The longest wait, e.g. 90s, 5m, 500ms (at most 10m).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub(crate) timeout: Duration,
    /// Only await this subgraph (passes always plan the whole tenant).
    #[arg(long, value_name = "PATH")]
    pub(crate) subgraph: Option<String>,
    /// Stop waiting after this many passes in a row made no progress while
    /// nothing ran (default: the server's, 3).
    #[arg(long, value_name = "N")]
    pub(crate) max_no_progress: Option<u32>,
    /// Read every created item whose type supports READ now (instead of
    /// waiting for the periodic resync), so drift is found and corrected;
    /// with --wait, until the corrections are done.
    #[arg(long)]
    pub(crate) refresh: bool,
    /// Output format of the result (`json` and `yaml` show no progress).
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) output: OutputFormat,
}

/// `watch`.
#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    /// Start after this revision (from the server's retained history)
    /// instead of with a snapshot.
    #[arg(long, value_name = "REVISION", conflicts_with = "history")]
    pub(crate) since: Option<u64>,
    /// Start with every event the server still retains (from its oldest
    /// retained revision) instead of with a snapshot.
    #[arg(long)]
    pub(crate) history: bool,
    /// Only events about items of this type (repeatable).
    #[arg(long = "type", value_name = "TYPE")]
    pub(crate) item_types: Vec<String>,
    /// Only events of this kind (repeatable), e.g. item-status-changed.
    #[arg(long = "kind", value_enum, value_name = "KIND")]
    pub(crate) kinds: Vec<EventKindArg>,
    /// Stop after this many events (snapshot items, Synced and bookmarks do
    /// not count).
    #[arg(long, value_name = "N")]
    pub(crate) count: Option<u64>,
    /// Reconnect after a break (a server restart, a hand-off between
    /// replicas, falling behind) and resume where the stream was, losing
    /// and repeating nothing; notes on standard error say so. Without it
    /// the command ends at the first break and says how to resume.
    #[arg(long)]
    pub(crate) reconnect: bool,
    /// Output format: one line per event.
    #[arg(short, long, value_enum, default_value_t = StreamFormat::Human)]
    pub(crate) output: StreamFormat,
}

/// A watch event kind on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum EventKindArg {
    /// The intent changed.
    IntentChanged,
    /// An item's status changed.
    ItemStatusChanged,
    /// An operation was dispatched.
    OperationStarted,
    /// An operation finished.
    OperationFinished,
    /// The tenant's conditions changed.
    ConditionsChanged,
    /// An agent connected.
    AgentConnected,
    /// An agent disconnected.
    AgentDisconnected,
    /// Drift was detected.
    DriftDetected,
}

/// `status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) output: OutputFormat,
}

/// `fleet`.
#[derive(Debug, Args)]
pub(crate) struct FleetArgs {
    /// Stream condition changes across the fleet instead of listing once.
    #[arg(long)]
    pub(crate) watch: bool,
    /// With --watch: start after this fleet revision.
    #[arg(long, value_name = "REVISION", requires = "watch")]
    pub(crate) since: Option<u64>,
    /// With --watch: reconnect after a break (a server restart, falling
    /// behind) and resume where the stream was; notes on standard error
    /// say so. Without it the command ends at the first break.
    #[arg(long, requires = "watch")]
    pub(crate) reconnect: bool,
    /// Output format: table, json or yaml for the listing; with --watch,
    /// table gives one line per change and json one JSON object per line.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) output: OutputFormat,
}

/// Parses `90s`, `5m`, `500ms`, `1h` or a plain number of seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration; write e.g. 90s, 5m or 500ms"))?;
    let seconds = match unit {
        "" | "s" => number,
        "ms" => number / 1000.0,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit {unit:?}; use ms, s, m or h"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("{text:?} is out of range"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_take_common_units() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("5 days").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
