//! End-to-end tests of an agent against the real server (feature
//! `testkit`), after controller-runtime's envtest: [`TestServer::start`]
//! runs the real `reconciled` binary on a free loopback port with a
//! temporary data directory, [`TestServer::tenant`] creates a tenant,
//! [`TestTenant::start_agent`] runs the author's agent until it is
//! registered, and [`TestTenant::converge`] submits an intent and waits
//! until the tenant is Ready at that generation. Every wait is driven by the
//! server's `Watch` events and bounded by a deadline ([`DEADLINE`] unless
//! set with [`TestTenant::deadline`]); nothing sleeps to synchronise.
//!
//! ```no_run
//! use reconciled_client::prelude::*;
//! use reconciled_client::testkit::TestServer;
//! # struct Store;
//! # impl Configurator for Store {
//! #     async fn create(&self, _: &OperationContext, _: &Item) -> Outcome { Outcome::done() }
//! #     async fn modify(&self, _: &OperationContext, _: &Item, _: &Item) -> Outcome { Outcome::done() }
//! #     async fn delete(&self, _: &OperationContext, _: &Item) -> Outcome { Outcome::done() }
//! # }
//!
//! #[tokio::test]
//! async fn a_kv_item_is_created() -> Result<(), Box<dyn std::error::Error>> {
//!     let server = TestServer::start().await?;
//!     let tenant = server.tenant("acme").await?;
//!     let agent = tenant.start_agent(tenant.agent("kv-1").item_type(TypeSpec::new("kv"), Store)).await?;
//!     tenant.converge([Item::new("kv", "a").with_property("key", "a")]).await?;
//!     agent.stop().await?;
//!     Ok(())
//! }
//! ```
//!
//! # Which `reconciled` binary
//!
//! [`reconciled_binary`] picks, in order:
//!
//! 1. `$RECONCILED_BIN`, if set (a prebuilt or installed server);
//! 2. under cargo (`cargo test` sets `CARGO`): `cargo build -p reconciled
//!    --bin reconciled` with the test's profile and target directory, run
//!    from the test's package directory (in a workspace that depends on the
//!    `reconciled` package). Cargo rebuilds the server only if it changed
//!    (about a second otherwise), so a test never runs against a stale
//!    binary (`cargo test` does not build another package's binaries).
//!    Inside the reconciled workspace it builds `--workspace --bins
//!    --examples` instead: that is the selection of `cargo test --workspace`,
//!    so cargo reuses the test run's dependencies rather than compiling
//!    them again with other features;
//! 3. outside cargo, `reconciled` next to the test executable, in the
//!    cargo profile directory it was built into (`target/debug/reconciled`
//!    when the test is `target/debug/deps/<test>`). Under cargo, a build
//!    that fails is an error, which names such a binary if there is one:
//!    in a target directory shared by several checkouts it may be of
//!    another version, so it is used only when `$RECONCILED_BIN` names it.
//!
//! Dropping a [`TestServer`] kills the process and removes its directory
//! (kept, with the path printed, if the test is panicking).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use rand::Rng as _;
use reconciled_proto::v1;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::agent::{Agent, AgentBuilder, AgentError, AgentEvent, Grant, Item, ItemRef};
use crate::client::{Client, ClientError};

/// How long a testkit wait may take unless set with
/// [`TestTenant::deadline`]: 30 s.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Names a `reconciled` binary to test instead of the one found or built.
pub const RECONCILED_BIN_ENV: &str = "RECONCILED_BIN";

/// How often to try the server while it starts (it has no event to wait
/// for before it listens).
const START_RETRY: Duration = Duration::from_millis(25);

/// Why a testkit step failed. Each message says what to check; `Debug`
/// prints the same message, so a test returning `Result<(), Box<dyn
/// Error>>` shows it.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum TestkitError {
    /// No `reconciled` binary was found and building one failed.
    #[error(
        "cannot get the reconciled binary: {0}; set {RECONCILED_BIN_ENV}=/path/to/reconciled \
         (`cargo build -p reconciled --bin reconciled` in a reconciled checkout builds its \
         target/debug/reconciled)"
    )]
    Binary(String),
    /// The server process could not be started or did not become ready.
    #[error("the reconciled server did not start: {message}\n--- server log ---\n{log}")]
    Start {
        /// What went wrong.
        message: String,
        /// The tail of the server's log.
        log: String,
    },
    /// A client could not be created.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The server refused a call.
    #[error("{call} failed: {status}")]
    Call {
        /// The RPC, e.g. `SubmitIntent`.
        call: &'static str,
        /// The server's answer.
        status: tonic::Status,
    },
    /// The agent could not be built or stopped with an error.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The agent ended before it registered.
    #[error("the agent ended before it registered: {0}")]
    AgentEnded(String),
    /// A wait reached its deadline.
    #[error("timed out after {deadline:?} waiting for {what}; last seen: {last}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The deadline.
        deadline: Duration,
        /// What was seen last (a status, an event).
        last: String,
    },
    /// The tenant stalled (an item failed terminally or waits for a missing
    /// configurator) before it became Ready.
    #[error("tenant {tenant} stalled at generation {generation}: {message}")]
    Stalled {
        /// The tenant.
        tenant: String,
        /// The generation awaited.
        generation: u64,
        /// The Stalled condition's reason and message.
        message: String,
    },
}

impl std::fmt::Debug for TestkitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// The `reconciled` binary the testkit runs (see the [module
/// docs](self#which-reconciled-binary)); looked up (and built) once per
/// process.
pub fn reconciled_binary() -> Result<PathBuf, TestkitError> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(locate_or_build)
        .clone()
        .map_err(TestkitError::Binary)
}

fn locate_or_build() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(RECONCILED_BIN_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "{RECONCILED_BIN_ENV}={} is not a file",
                path.display()
            ))
        };
    }
    let profile_dir = profile_dir();
    let earlier = profile_dir
        .as_deref()
        .map(|dir| dir.join(format!("reconciled{}", std::env::consts::EXE_SUFFIX)))
        .filter(|path| path.is_file());
    pick_binary(std::env::var_os("CARGO").is_some(), earlier, || {
        build_with_cargo(
            profile_dir.as_deref(),
            std::env::var_os("CARGO_MANIFEST_DIR").as_deref(),
        )
    })
}

/// Under cargo, the server `build` makes, and only that: when the build
/// fails, a binary an earlier build left next to the test executable
/// (`earlier`) may be of another version (a target directory shared by
/// several checkouts or crates), so the error names it rather than the
/// tests quietly running against it. Outside cargo, that earlier binary,
/// or a build when there is none.
fn pick_binary(
    under_cargo: bool,
    earlier: Option<PathBuf>,
    build: impl FnOnce() -> Result<PathBuf, String>,
) -> Result<PathBuf, String> {
    if !under_cargo && let Some(path) = earlier {
        return Ok(path);
    }
    build().map_err(|error| match earlier {
        Some(path) => format!(
            "{error}\n(an earlier build left a reconciled binary at {path}, which may be of \
             another version or checkout; to test against it anyway, set \
             {RECONCILED_BIN_ENV}={path})",
            path = path.display()
        ),
        None => error,
    })
}

/// `<target>/<profile>` of the running test executable, which lives in
/// `<target>/<profile>/deps/` (tests) or `<target>/<profile>/examples/`.
fn profile_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let parent = exe.parent()?;
    let name = parent.file_name()?;
    (name == "deps" || name == "examples").then(|| parent.parent().map(Path::to_path_buf))?
}

/// Builds the server with cargo, run from `manifest_dir` (the test's
/// package directory).
fn build_with_cargo(
    profile_dir: Option<&Path>,
    manifest_dir: Option<&std::ffi::OsStr>,
) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let profile = match profile_dir
        .and_then(Path::file_name)
        .map(|name| name.to_string_lossy().into_owned())
        .as_deref()
    {
        None | Some("debug") => "dev".to_owned(),
        Some(other) => other.to_owned(),
    };
    let selection: &[&str] = if reconciled_is_a_workspace_member(&cargo, manifest_dir) {
        &["--workspace", "--bins", "--examples"]
    } else {
        &["-p", "reconciled", "--bin", "reconciled"]
    };
    let mut command = std::process::Command::new(&cargo);
    command
        .arg("build")
        .args(selection)
        .args(["--profile", &profile, "--message-format", "json"]);
    if let Some(target) = profile_dir.and_then(Path::parent) {
        command.arg("--target-dir").arg(target);
    }
    if let Some(dir) = manifest_dir {
        command.current_dir(dir);
    }
    let output = command
        .output()
        .map_err(|error| format!("cannot run cargo: {error}"))?;
    if !output.status.success() {
        return Err(build_failure(
            selection,
            &output.status.to_string(),
            &String::from_utf8_lossy(&output.stderr),
        ));
    }
    reported_executable(&String::from_utf8_lossy(&output.stdout), "reconciled")
        .ok_or_else(|| "cargo built reconciled but reported no executable".to_owned())
}

/// Why building the server failed. An agent's own crate, outside the
/// reconciled workspace, has no `reconciled` package to build: cargo's
/// "did not match any packages" is then explained, with the steps that
/// work, instead of being left to read as a broken setup.
fn build_failure(selection: &[&str], status: &str, stderr: &str) -> String {
    if stderr.contains("did not match any packages") {
        return format!(
            "this crate's workspace has no `reconciled` package, so the testkit cannot build \
             the server (an agent's own crate): build it in a reconciled checkout and point \
             {RECONCILED_BIN_ENV} at it"
        );
    }
    format!(
        "`cargo build {}` failed ({status}):\n{stderr}",
        selection.join(" ")
    )
}

/// Whether the `reconciled` package is a member of the test's workspace
/// (`cargo metadata --no-deps` lists the members alone). If it is, the
/// server is built with the whole workspace selected, as `cargo test
/// --workspace` selects it, so cargo resolves every dependency with the
/// test run's features and only links the binary; `-p reconciled` alone
/// resolves them differently and compiles a second copy of nearly every
/// dependency.
fn reconciled_is_a_workspace_member(
    cargo: &std::ffi::OsStr,
    dir: Option<&std::ffi::OsStr>,
) -> bool {
    let mut command = std::process::Command::new(cargo);
    command.args(["metadata", "--no-deps", "--format-version", "1"]);
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let Ok(output) = command.output() else {
        return false;
    };
    let Ok(metadata) = serde_json::from_slice::<serde_json::Value>(&output.stdout) else {
        return false;
    };
    metadata["packages"].as_array().is_some_and(|packages| {
        packages
            .iter()
            .any(|package| package["name"] == "reconciled")
    })
}

/// The executable of the binary target `name` among cargo's JSON messages.
/// The package's library has the same target name but no executable, so
/// only a `bin` artifact counts.
fn reported_executable(cargo_messages: &str, name: &str) -> Option<PathBuf> {
    cargo_messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| {
            message["reason"] == "compiler-artifact"
                && message["target"]["name"] == name
                && message["target"]["kind"]
                    .as_array()
                    .is_some_and(|kinds| kinds.iter().any(|kind| kind == "bin"))
        })
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
}

/// Tries `ListTenants` until the server answers and returns the admin
/// client: the server has no event to wait for before it listens, so this
/// polls, bounded by [`DEADLINE`] and by the process exiting.
async fn wait_until_listening(
    child: &mut Child,
    endpoint: &str,
    admin_token: &str,
) -> Result<Client, String> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the server exited ({status})"));
        }
        let last = match Client::connect(endpoint, admin_token).await {
            Ok(client) => match client.list_tenants(v1::ListTenantsRequest::default()).await {
                Ok(_) => return Ok(client),
                Err(status) => status.to_string(),
            },
            Err(error) => error.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "not answering at {endpoint} within {DEADLINE:?} (last: {last})"
            ));
        }
        tokio::time::sleep(START_RETRY).await;
    }
}

/// The last 8 KiB of the server log in `dir`.
fn log_tail(dir: &TempDir) -> String {
    let text = std::fs::read(dir.0.join("server.log")).unwrap_or_default();
    let start = text.len().saturating_sub(8 * 1024);
    String::from_utf8_lossy(&text[start..]).into_owned()
}

/// A temporary directory, removed on drop unless the thread is panicking.
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> std::io::Result<Self> {
        let suffix: u64 = rand::rng().random();
        let path = std::env::temp_dir().join(format!("reconciled-testkit-{suffix:016x}"));
        std::fs::create_dir_all(&path)?;
        Ok(Self(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("reconciled testkit files kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The real `reconciled` server in a child process, on a free loopback
/// port, with its own data directory. Dropping it kills the process.
#[derive(Debug)]
pub struct TestServer {
    // Held only to be killed on drop (`kill_on_drop`); declared before
    // `dir`, so the process dies before its files go.
    _child: Child,
    endpoint: String,
    admin_token: String,
    admin: Client,
    dir: TempDir,
}

impl TestServer {
    /// Starts the server (see [`reconciled_binary`]) and waits until it
    /// answers, for at most [`DEADLINE`].
    pub async fn start() -> Result<TestServer, TestkitError> {
        let binary = reconciled_binary()?;
        let start_error = |message: String| TestkitError::Start {
            message,
            log: String::new(),
        };
        let dir = TempDir::new().map_err(|error| {
            start_error(format!("cannot create a temporary directory: {error}"))
        })?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|probe| probe.local_addr())
            .map_err(|error| start_error(format!("cannot find a free port: {error}")))?
            .port();
        let suffix: u128 = rand::rng().random();
        let admin_token = format!("rcda_testkit_{suffix:032x}");
        let log = std::fs::File::create(dir.0.join("server.log"))
            .map_err(|error| start_error(format!("cannot create the server log: {error}")))?;
        let log_err = log
            .try_clone()
            .map_err(|error| start_error(format!("cannot share the server log: {error}")))?;
        let mut command = Command::new(&binary);
        command
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(dir.0.join("data"))
            .arg("--admin-token")
            .arg(&admin_token)
            // Agent tests need no dashboard, and its default port is
            // shared by every server on the machine.
            .arg("--ui-listen")
            .arg("off")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .kill_on_drop(true);
        // The test's environment must not configure the server behind its
        // back (RECONCILED_LOG, for debugging, is the exception).
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("RECONCILED_") && name != "RECONCILED_LOG" {
                command.env_remove(&name);
            }
        }
        let mut child = command
            .spawn()
            .map_err(|error| start_error(format!("cannot run {}: {error}", binary.display())))?;
        let endpoint = format!("http://127.0.0.1:{port}");
        let admin = wait_until_listening(&mut child, &endpoint, &admin_token)
            .await
            .map_err(|message| TestkitError::Start {
                message,
                log: log_tail(&dir),
            })?;
        Ok(TestServer {
            _child: child,
            endpoint,
            admin_token,
            admin,
            dir,
        })
    }

    /// The last 8 KiB of the server's log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.dir)
    }

    /// The server's endpoint, e.g. `http://127.0.0.1:41234`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The admin token (for `Tenants` calls).
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// A client with the admin token.
    pub fn admin(&self) -> &Client {
        &self.admin
    }

    /// The server's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.0.join("data")
    }

    /// Creates tenant `name` and returns it with a client holding its token.
    pub async fn tenant(&self, name: &str) -> Result<TestTenant, TestkitError> {
        let created = self
            .admin
            .create_tenant(v1::CreateTenantRequest {
                name: name.to_owned(),
                limits: None,
            })
            .await
            .map_err(|status| TestkitError::Call {
                call: "CreateTenant",
                status,
            })?;
        let client = Client::connect(&self.endpoint, &created.token).await?;
        Ok(TestTenant {
            endpoint: self.endpoint.clone(),
            name: name.to_owned(),
            token: created.token,
            client,
            deadline: DEADLINE,
        })
    }
}

/// A tenant of a [`TestServer`]: build agents for it, submit intents, and
/// wait for convergence.
#[derive(Debug, Clone)]
pub struct TestTenant {
    endpoint: String,
    name: String,
    token: String,
    client: Client,
    deadline: Duration,
}

impl TestTenant {
    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tenant's token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The server's endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// A client with the tenant's token.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The same tenant with another deadline for every wait.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// An agent builder for this tenant with id `agent_id` and quick
    /// reconnects (50 ms doubling to 500 ms); add item types and pass it to
    /// [`start_agent`](Self::start_agent).
    pub fn agent(&self, agent_id: &str) -> AgentBuilder {
        Agent::builder(&self.endpoint, &self.name, &self.token)
            .agent_id(agent_id)
            .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
    }

    /// Builds the agent, runs it in a task and waits until the server has
    /// registered it (its first `Connected` event).
    pub async fn start_agent(&self, builder: AgentBuilder) -> Result<RunningAgent, TestkitError> {
        let agent = builder.build()?;
        let mut events = agent.events();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(agent.run(async {
            let _ = stopped.await;
        }));
        let mut last = String::from("nothing");
        let waited = tokio::time::timeout(self.deadline, async {
            loop {
                match events.recv().await {
                    Ok(AgentEvent::Connected { granted, .. }) => return Ok(granted),
                    Ok(event) => last = format!("{event:?}"),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        return Err(last.clone());
                    }
                }
            }
        })
        .await;
        match waited {
            Ok(Ok(granted)) => Ok(RunningAgent {
                granted,
                stop: Some(stop),
                task: Some(task),
            }),
            Ok(Err(last)) => match task.await {
                Ok(Err(error)) => Err(TestkitError::Agent(error)),
                _ => Err(TestkitError::AgentEnded(last)),
            },
            Err(_) => {
                task.abort();
                Err(TestkitError::Timeout {
                    what: format!("the agent to register with tenant {}", self.name),
                    deadline: self.deadline,
                    last,
                })
            }
        }
    }

    /// Submits `items` as the tenant's whole intent and returns the new
    /// generation.
    pub async fn submit(&self, items: impl IntoIterator<Item = Item>) -> Result<u64, TestkitError> {
        let response = self
            .client
            .submit_intent(v1::SubmitIntentRequest {
                tenant: self.name.clone(),
                items: items.into_iter().map(v1::Item::from).collect(),
                ..v1::SubmitIntentRequest::default()
            })
            .await
            .map_err(|status| TestkitError::Call {
                call: "SubmitIntent",
                status,
            })?;
        Ok(response.generation)
    }

    /// Submits `items` and waits until the tenant is Ready at that
    /// generation (see [`wait_until_ready`](Self::wait_until_ready)).
    pub async fn converge(
        &self,
        items: impl IntoIterator<Item = Item>,
    ) -> Result<v1::TenantStatus, TestkitError> {
        let generation = self.submit(items).await?;
        self.wait_until_ready(generation).await
    }

    /// The tenant's status (`GetStatus`).
    pub async fn status(&self) -> Result<v1::TenantStatus, TestkitError> {
        self.client
            .get_status(v1::GetStatusRequest {
                tenant: self.name.clone(),
            })
            .await
            .map_err(|status| TestkitError::Call {
                call: "GetStatus",
                status,
            })?
            .status
            .ok_or_else(|| TestkitError::Call {
                call: "GetStatus",
                status: tonic::Status::internal("the reply holds no status"),
            })
    }

    /// Waits until the tenant is Ready (every intended item created and
    /// equal, nothing in flight) at `generation` or later. Fails early with
    /// [`TestkitError::Stalled`] if it stalls there instead.
    pub async fn wait_until_ready(
        &self,
        generation: u64,
    ) -> Result<v1::TenantStatus, TestkitError> {
        let tenant = self.name.clone();
        self.wait_for_status(&format!("Ready at generation {generation}"), |status| {
            if status.observed_generation < generation {
                return Ok(false);
            }
            if let Some(stalled) = holding(status, "Stalled") {
                return Err(TestkitError::Stalled {
                    tenant: tenant.clone(),
                    generation,
                    message: format!("{}: {}", stalled.reason, stalled.message),
                });
            }
            Ok(holding(status, "Ready").is_some() && holding(status, "Reconciling").is_none())
        })
        .await
    }

    /// Waits until `check` accepts the tenant's status (or returns an
    /// error, which ends the wait). The status is read when the wait starts
    /// and again after every event the server's `Watch` stream sends, so
    /// no change goes unseen and nothing polls.
    pub async fn wait_for_status(
        &self,
        what: &str,
        mut check: impl FnMut(&v1::TenantStatus) -> Result<bool, TestkitError>,
    ) -> Result<v1::TenantStatus, TestkitError> {
        // Subscribe first, so a change between the first read and the
        // subscription still wakes the wait.
        let mut stream = self
            .client
            .watch(v1::WatchRequest {
                tenant: self.name.clone(),
                start_revision: 0,
                ..v1::WatchRequest::default()
            })
            .await
            .map_err(|status| TestkitError::Call {
                call: "Watch",
                status,
            })?;
        let mut last = String::from("no status yet");
        let waited = tokio::time::timeout(self.deadline, async {
            loop {
                let status = self.status().await?;
                if check(&status)? {
                    return Ok(status);
                }
                last = format!("{status:?}");
                match stream.message().await {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        return Err(TestkitError::Call {
                            call: "Watch",
                            status: tonic::Status::unavailable("the server ended the stream"),
                        });
                    }
                    Err(status) => {
                        return Err(TestkitError::Call {
                            call: "Watch",
                            status,
                        });
                    }
                }
            }
        })
        .await;
        waited.unwrap_or_else(|_| {
            Err(TestkitError::Timeout {
                what: what.to_owned(),
                deadline: self.deadline,
                last,
            })
        })
    }

    /// The current status of one item (`GetGraph`), if it is in the current
    /// graph.
    pub async fn item(&self, item: &ItemRef) -> Result<Option<v1::ItemStatus>, TestkitError> {
        let graph = self
            .client
            .get_graph(v1::GetGraphRequest {
                tenant: self.name.clone(),
                view: v1::GraphView::Current.into(),
                ..v1::GetGraphRequest::default()
            })
            .await
            .map_err(|status| TestkitError::Call {
                call: "GetGraph",
                status,
            })?;
        Ok(graph.current.into_iter().find(|status| {
            status
                .r#ref
                .as_ref()
                .is_some_and(|r| r.r#type == item.item_type && r.name == item.name)
        }))
    }
}

/// The condition `kind` of `status` if it holds (is True).
fn holding<'a>(status: &'a v1::TenantStatus, kind: &str) -> Option<&'a v1::Condition> {
    status
        .conditions
        .iter()
        .find(|c| c.r#type == kind && c.status == v1::ConditionStatus::True as i32)
}

/// An agent running in a task (from [`TestTenant::start_agent`]). Dropping
/// it aborts the task; [`stop`](Self::stop) shuts it down cleanly.
#[derive(Debug)]
pub struct RunningAgent {
    granted: Vec<Grant>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), AgentError>>>,
}

impl RunningAgent {
    /// The types the server granted at registration, with their epochs.
    pub fn granted(&self) -> &[Grant] {
        &self.granted
    }

    /// Shuts the agent down as [`Agent::run`] does on its shutdown signal
    /// (drains running operations) and returns what `run` returned.
    pub async fn stop(mut self) -> Result<(), TestkitError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => match task.await {
                Ok(result) => result.map_err(TestkitError::Agent),
                Err(error) => Err(TestkitError::AgentEnded(error.to_string())),
            },
            None => Ok(()),
        }
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An agent's own crate, outside the reconciled workspace, without
    /// `RECONCILED_BIN`: cargo's "did not match any packages" used to be
    /// all the test printed.
    #[test]
    fn outside_the_workspace_the_error_says_how_to_get_a_server() {
        let dir = std::env::temp_dir().join(format!("testkit-outside-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("src")).expect("create the crate");
        std::fs::write(
            dir.join("Cargo.toml"),
            "[package]\nname = \"outside\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[workspace]\n",
        )
        .expect("write Cargo.toml");
        std::fs::write(dir.join("src/lib.rs"), "").expect("write lib.rs");
        let target = dir.join("target").join("debug");
        let error = build_with_cargo(Some(&target), Some(dir.as_os_str()))
            .expect_err("there is no server to build");
        std::fs::remove_dir_all(&dir).expect("remove the crate");
        assert!(
            error.contains("has no `reconciled` package")
                && error.contains("build it in a reconciled checkout and point RECONCILED_BIN"),
            "{error}"
        );
    }

    /// A build that fails under cargo used to fall back, without a word,
    /// to whatever `reconciled` an earlier build had left in the target
    /// directory: in one shared by several checkouts, another version.
    #[test]
    fn a_failed_build_names_an_earlier_binary_instead_of_running_it() {
        let earlier = PathBuf::from("/shared/target/debug/reconciled");
        let error = pick_binary(true, Some(earlier.clone()), || {
            Err("the build failed".into())
        })
        .expect_err("a failed build is an error under cargo");
        assert!(
            error.starts_with("the build failed")
                && error.contains("RECONCILED_BIN=/shared/target/debug/reconciled"),
            "{error}"
        );
        let built = PathBuf::from("/t/debug/reconciled");
        assert_eq!(
            pick_binary(true, Some(earlier.clone()), || Ok(built.clone())),
            Ok(built)
        );
        assert_eq!(
            pick_binary(false, Some(earlier.clone()), || Err("not called".into())),
            Ok(earlier)
        );
        assert_eq!(
            pick_binary(true, None, || Err("the build failed".into())),
            Err("the build failed".into())
        );
    }

    #[test]
    fn the_binary_is_found_after_the_library_of_the_same_name() {
        let messages = [
            r#"{"reason":"compiler-artifact","target":{"name":"reconciled","kind":["lib"]},"executable":null}"#,
            r#"{"reason":"compiler-artifact","target":{"name":"reconciled","kind":["bin"]},"executable":"/t/debug/reconciled"}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ]
        .join("\n");
        assert_eq!(
            reported_executable(&messages, "reconciled"),
            Some(PathBuf::from("/t/debug/reconciled"))
        );
        let library_only = messages.lines().next().expect("three lines");
        assert_eq!(reported_executable(library_only, "reconciled"), None);
    }
}
