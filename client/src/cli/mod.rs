//! `reconctl`, the operator's command-line tool (feature `cli`, on by
//! default): tenants, intents from JSON or YAML files, graphs as tables,
//! JSON, YAML or Graphviz DOT, `reconcile --wait` with a live progress
//! display, watches, registered item types and their schemas, and the
//! fleet. `docs/reconctl.md` documents every
//! command, the configuration and the exit codes.

mod args;
mod dot;
mod explain;
mod failure;
mod fleet;
mod graph;
mod intent;
mod intent_file;
mod json;
mod names;
mod output;
mod progress;
mod reconcile;
mod settings;
mod status;
mod table;
mod tenant;
mod types;
mod watch;

use std::process::ExitCode;

use clap::Parser as _;

use self::args::{Cli, Command, GraphCommand, IntentCommand, TypeCommand};
use self::explain::{connect_failure, rpc_failure};
use self::failure::{Exit, Failure};
use self::settings::{ProcessEnvironment, Settings};
use crate::Client;

/// Runs reconctl with the process's arguments and environment; returns the
/// exit code (docs/reconctl.md lists them).
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Prints help, the version or the usage error, and exits 0 or 2.
        Err(error) => error.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("reconctl: cannot start the async runtime: {error}");
            return ExitCode::from(Exit::Error.code());
        }
    };
    let exit = match runtime.block_on(run(cli)) {
        Ok(exit) => exit,
        Err(failure) => {
            if !failure.message.is_empty() {
                // Messages may quote what a tenant or an agent wrote.
                eprintln!("reconctl: {}", output::printable(&failure.message));
            }
            failure.exit
        }
    };
    ExitCode::from(exit.code())
}

async fn run(cli: Cli) -> Result<Exit, Failure> {
    let settings = Settings::resolve(&cli.connection.flag_values(), &ProcessEnvironment)?;
    let session = Session::connect(settings).await?;
    match cli.command {
        Command::Tenant(command) => tenant::run(&session, command).await,
        Command::Intent(IntentCommand::Submit(args)) => intent::submit(&session, args).await,
        Command::Graph(GraphCommand::Get(args)) => graph::get(&session, args).await,
        Command::Reconcile(args) => reconcile::run(&session, args).await,
        Command::Watch(args) => watch::run(&session, args).await,
        Command::Status(args) => status::run(&session, args).await,
        Command::Type(TypeCommand::List(args)) => types::list(&session, args).await,
        Command::Type(TypeCommand::Get(args)) => types::get(&session, args).await,
        Command::Fleet(args) => fleet::run(&session, args).await,
    }
}

/// A connected client and the settings it was made from.
pub(crate) struct Session {
    /// Where the address, token and tenant came from.
    pub(crate) settings: Settings,
    /// The client, with the token attached.
    pub(crate) client: Client,
}

/// The TLS settings from the CA / client certificate files, if any is
/// given.
fn tls_settings(settings: &Settings) -> Result<Option<crate::ClientTls>, Failure> {
    let read = |setting: &settings::Setting| {
        std::fs::read(&setting.value).map_err(|error| {
            Failure::usage(format!(
                "cannot read {} (from {}): {error}",
                setting.value, setting.source
            ))
        })
    };
    let ca = settings.ca_cert.as_ref().map(read).transpose()?;
    let identity = match (&settings.client_cert, &settings.client_key) {
        (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
        _ => None,
    };
    Ok(crate::ClientTls::from_parts(ca, identity))
}

impl Session {
    /// Connects to the configured address with the configured token.
    async fn connect(settings: Settings) -> Result<Self, Failure> {
        let token = settings.require_token()?.value.clone();
        let tls = tls_settings(&settings)?;
        let addr = crate::ClientTls::dial_addr(&settings.addr.value, tls.as_ref());
        let client = Client::connect_with(addr, &token, tls.as_ref())
            .await
            .map_err(|error| connect_failure(&error, &settings))?;
        Ok(Self { settings, client })
    }

    /// A failed RPC as a message naming the address or token source as
    /// fits the error.
    pub(crate) fn failed(&self, what: &str, status: &tonic::Status) -> Failure {
        rpc_failure(what, status, &self.settings)
    }

    /// The tenant of a tenant-scoped command.
    pub(crate) fn tenant(&self) -> Result<String, Failure> {
        Ok(self.settings.require_tenant()?.value.clone())
    }
}
