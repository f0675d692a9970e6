//! The `reconciled` server binary: parses the configuration, sets up
//! logging and runs the requested subcommand (`serve` by default,
//! `migrate`, `check-config`, `store copy`, `repair`). See
//! docs/configuration.md.
#![forbid(unsafe_code)]

use std::io::IsTerminal as _;
use std::process::ExitCode;

use anyhow::Context as _;
use reconciled::config::{Command, Config, ConfigError, LogFormat, MigrateMode};
use reconciled::telemetry::Exporter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer, Registry};

/// The server's allocator. Requests of thousands of items allocate and
/// free large buffers; glibc's allocator spent a fifth of the server's
/// samples on them (docs/performance.md, "Durable SubmitIntent").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code for configuration errors (as for command-line usage errors).
const EXIT_CONFIG: u8 = 2;

fn main() -> ExitCode {
    // Whatever the server writes (the store, its snapshots, backups, the
    // admin token) is for its own user only; existing files are tightened
    // when the store opens.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    disable_transparent_huge_pages();
    let (command, config) = match Config::load(std::env::args_os()) {
        Ok(loaded) => loaded,
        // --help, --version and command-line errors print themselves.
        Err(ConfigError::Cli(error)) => error.exit(),
        Err(error) => {
            eprintln!("reconciled: error: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };

    let result = match command {
        Command::CheckConfig => {
            // The TLS files are part of the configuration: a missing file
            // or a key that is not the certificate's is found here too.
            if let Err(error) = reconciled::tls::server_tls(&config) {
                eprintln!("reconciled: error: {error}");
                return ExitCode::from(EXIT_CONFIG);
            }
            print!("{}", config.to_toml());
            Ok(())
        }
        Command::Migrate(mode) => {
            init_tracing(&config, None).and_then(|()| run_migrate(&config, mode))
        }
        Command::Repair(mode) => init_tracing(&config, None).and_then(|()| {
            let report = reconciled::server::repair(&config, &mode).with_context(|| {
                format!("cannot repair the store in {}", config.data_dir.display())
            })?;
            print!("{report}");
            Ok(())
        }),
        Command::Serve => run_serve(config.clone()),
        Command::StoreCopy { from, to } => init_tracing(&config, None).and_then(|()| {
            let report = reconciled::server::store_copy(&config, &from, &to)
                .context("cannot copy the store")?;
            print!("{report}");
            Ok(())
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // Human logs share stderr with this message; JSON log collectors
            // need the error as an event of their own.
            let error = error_chain(&error);
            if config.log_format == LogFormat::Json {
                tracing::error!(error, "Exiting.");
            }
            eprintln!("reconciled: error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Turns transparent huge pages off for this process (the kernel's switch
/// for one process; a child inherits it). Requests of thousands of items
/// allocate and free megabytes each; with huge pages the kernel zeroed a
/// whole 2 MiB page at each first touch of memory the allocator had handed
/// back, and split them again, which cost one client's 1,000-item
/// SubmitIntents up to 2.4x their throughput and a p99 of 200 ms
/// (docs/performance.md, "Transparent huge pages"). Best effort: a kernel
/// without the switch keeps its pages as they are.
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if let Err(error) = nix::sys::prctl::set_thp_disable(true) {
        eprintln!("reconciled: warning: cannot turn transparent huge pages off: {error}");
    }
}

/// `error` and its causes joined by ": ", leaving out a cause whose words
/// are already there: an error that says its cause in its own message and
/// also returns it as its `source()` (as `std::io::Error`'s wrappers often
/// do) would otherwise print it twice.
fn error_chain(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let words = cause.to_string();
        if text.contains(&words) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&words);
    }
    text
}

/// Logs go to stderr (stdout carries the `listening on` line and command
/// output), human-readable or JSON, filtered by `--log-level` /
/// `RECONCILED_LOG`; spans also go to `otel` (the OTLP exporter) when given.
fn init_tracing(
    config: &Config,
    otel: Option<Box<dyn Layer<Registry> + Send + Sync>>,
) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_filter)
        .with_context(|| format!("invalid log filter {:?}", config.log_filter))?;
    let logs = match config.log_format {
        LogFormat::Human => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(otel)
        .with(logs)
        .with(filter)
        .try_init()
        .map_err(|error| anyhow::anyhow!("cannot install the log subscriber: {error}"))
}

/// `reconciled serve`: runs the server until SIGTERM/SIGINT; exports spans
/// over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (flushed at exit).
fn run_serve(config: Config) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let exporter = {
        // The exporter's gRPC channel lives on the runtime.
        let _runtime = runtime.enter();
        match Exporter::from_env::<Registry>()? {
            Some((exporter, layer)) => {
                init_tracing(&config, Some(layer.boxed()))?;
                tracing::info!("Exporting traces over OTLP.");
                Some(exporter)
            }
            None => {
                init_tracing(&config, None)?;
                None
            }
        }
    };
    if !config.fsync {
        tracing::warn!(
            "fsync is DISABLED (--fsync false): acknowledged writes can be lost on power failure or \
             kernel crash. Never run production this way."
        );
    }
    let served = runtime
        .block_on(reconciled::server::serve(config))
        .context("server stopped with an error");
    if served.is_ok() {
        tracing::info!("Stopped.");
    }
    if let Some(exporter) = exporter {
        exporter.shutdown();
    }
    served
}

/// `reconciled migrate [--status | --dry-run]`: shows or applies the store's
/// schema migrations and prints what it found and did.
fn run_migrate(config: &Config, mode: MigrateMode) -> anyhow::Result<()> {
    let report = reconciled::server::migrate(config, mode).with_context(|| match config.store {
        reconciled::config::StoreKind::Sled => {
            format!("cannot migrate the store in {}", config.data_dir.display())
        }
        reconciled::config::StoreKind::Etcd => format!(
            "cannot migrate the etcd store at {} (prefix {})",
            config.etcd.endpoints.join(","),
            config.etcd.prefix
        ),
    })?;
    print!("{report}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot listen on 127.0.0.1:1: {source}")]
    struct SaysItsCause {
        source: std::io::Error,
    }

    #[test]
    fn a_cause_the_message_already_says_is_printed_once() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "address in use");
        let error = anyhow::Error::new(SaysItsCause { source: io }).context("cannot start");
        assert_eq!(
            error_chain(&error),
            "cannot start: cannot listen on 127.0.0.1:1: address in use"
        );
        let plain = anyhow::anyhow!("root").context("middle").context("top");
        assert_eq!(error_chain(&plain), "top: middle: root");
    }
}
