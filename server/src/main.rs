//! The `reconciled` server binary: parses the configuration, sets up
//! logging and runs the requested subcommand (`serve` by default,
//! `migrate`, `check-config`). See docs/configuration.md.
#![forbid(unsafe_code)]

use std::io::IsTerminal as _;
use std::process::ExitCode;

use anyhow::Context as _;
use reconciled::config::{Command, Config, ConfigError, LogFormat, MigrateMode};

/// Exit code for configuration errors (as for command-line usage errors).
const EXIT_CONFIG: u8 = 2;

fn main() -> ExitCode {
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
            print!("{}", config.to_toml());
            Ok(())
        }
        Command::Migrate(mode) => init_tracing(&config).and_then(|()| run_migrate(&config, mode)),
        Command::Serve => init_tracing(&config).and_then(|()| run_serve(config.clone())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // Human logs share stderr with this message; JSON log collectors
            // need the error as an event of their own.
            if config.log_format == LogFormat::Json {
                tracing::error!(error = format!("{error:#}"), "Exiting.");
            }
            eprintln!("reconciled: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr (stdout carries the `listening on` line and command
/// output), human-readable or JSON, filtered by `--log-level` / `RECONCILED_LOG`.
fn init_tracing(config: &Config) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_filter)
        .with_context(|| format!("invalid log filter {:?}", config.log_filter))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let installed = match config.log_format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    installed.map_err(|error| anyhow::anyhow!("cannot install the log subscriber: {error}"))
}

/// `reconciled serve`: runs the server until SIGTERM/SIGINT.
fn run_serve(config: Config) -> anyhow::Result<()> {
    if !config.fsync {
        tracing::warn!(
            "fsync is DISABLED (--fsync false): acknowledged writes can be lost on power failure or \
             kernel crash. Never run production this way."
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime
        .block_on(reconciled::server::serve(config))
        .context("server stopped with an error")?;
    tracing::info!("Stopped.");
    Ok(())
}

/// `reconciled migrate [--status | --dry-run]`: shows or applies the store's
/// schema migrations and prints what it found and did.
fn run_migrate(config: &Config, mode: MigrateMode) -> anyhow::Result<()> {
    let report = reconciled::server::migrate(config, mode)
        .with_context(|| format!("cannot migrate the store in {}", config.data_dir.display()))?;
    print!("{report}");
    Ok(())
}
