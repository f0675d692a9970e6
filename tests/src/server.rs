//! [`ServerProcess`]: the real `reconciled` binary in a child process, on a
//! loopback port, with a private data directory.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::Rng as _;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::binary::reconciled_binary;
use crate::grpcurl::grpcurl;

/// How long a server may take to become healthy.
pub const READY_DEADLINE: Duration = Duration::from_secs(30);

/// How long [`ServerProcess::terminate`] waits for the process to exit.
pub const EXIT_DEADLINE: Duration = Duration::from_secs(30);

/// Interval between readiness and exit polls.
const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// How many ports to try when a picked free port is taken before the
/// server binds it.
pub const START_ATTEMPTS: usize = 3;

/// What a server's log says when its port is taken.
pub const PORT_TAKEN: &str = "Address already in use";

/// The bytes of a failing server's log shown in errors and panics.
const LOG_TAIL_BYTES: u64 = 8 * 1024;

/// The server argument that turns off the per-tenant budget of request
/// bytes (see [`ServerOptions::without_byte_budget`]).
pub const NO_BYTE_BUDGET: &str = "--max-tenant-bytes-per-second=0";

/// How to start a server.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    admin_token: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    tls: Option<ClientTlsConfig>,
    wait_for_serving: bool,
    listen: Option<SocketAddr>,
}

impl Default for ServerOptions {
    /// A random admin token passed with `--admin-token`, no other flags.
    fn default() -> Self {
        ServerOptions {
            admin_token: Some(random_token("rcda_test_")),
            args: Vec::new(),
            env: Vec::new(),
            tls: None,
            wait_for_serving: true,
            listen: None,
        }
    }
}

impl ServerOptions {
    /// Starts without `--admin-token`, so the server generates
    /// `<data-dir>/admin.token`.
    pub fn without_admin_token(mut self) -> Self {
        self.admin_token = None;
        self
    }

    /// Uses this admin token.
    pub fn admin_token(mut self, token: impl Into<String>) -> Self {
        self.admin_token = Some(token.into());
        self
    }

    /// Turns off the per-tenant budget of request bytes: for benchmarks
    /// that measure what the server can take, not what it admits.
    pub fn without_byte_budget(self) -> Self {
        self.arg(NO_BYTE_BUDGET)
    }

    /// Appends a command-line argument (after `--listen`, `--data-dir` and
    /// `--admin-token`).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Talks TLS to the server (which the test starts with `--tls-cert`
    /// etc.): the health checks and [`ServerProcess::channel`] use `tls`,
    /// and [`ServerProcess::endpoint`] is `https://`.
    pub fn client_tls(mut self, tls: ClientTlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Starting returns as soon as the health service answers, whatever
    /// it says (for tests of readiness), instead of waiting for `SERVING`.
    pub fn without_waiting_for_serving(mut self) -> Self {
        self.wait_for_serving = false;
        self
    }

    /// Listens on `addr` instead of a free port picked at start (for tests
    /// that need to know the address before the server runs). Starting
    /// fails, without trying another port, if `addr` is taken.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
        self
    }

    /// Sets an environment variable for the server process.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }
}

/// A running `reconciled` child process.
///
/// Its stdout and stderr go to `server.log` in a temporary directory that
/// also holds the data directory. Dropping it kills the process (SIGKILL);
/// if the test is panicking, the log's tail is printed and the directory is
/// kept for inspection.
#[derive(Debug)]
pub struct ServerProcess {
    child: Option<Child>,
    binary: PathBuf,
    options: ServerOptions,
    addr: SocketAddr,
    /// The dashboard's address (`--ui-listen`), unless the options turn it
    /// off or choose it themselves.
    ui_addr: Option<SocketAddr>,
    dir: Option<tempfile::TempDir>,
    starts: usize,
}

impl ServerProcess {
    /// Starts the server on a free loopback port with a new data directory
    /// and waits until `grpc.health.v1.Health/Check` answers `SERVING`
    /// (deadline [`READY_DEADLINE`]). Errors carry the tail of its log.
    pub async fn start(options: ServerOptions) -> anyhow::Result<ServerProcess> {
        let binary = reconciled_binary();
        let mut dir = Some(
            tempfile::Builder::new()
                .prefix("reconciled-test-")
                .tempdir()
                .context("cannot create the test's temporary directory")?,
        );
        for attempt in 1.. {
            let mut server = ServerProcess {
                child: None,
                binary: binary.clone(),
                options: options.clone(),
                addr: match options.listen {
                    Some(addr) => addr,
                    None => free_loopback_addr()?,
                },
                // Every server gets a dashboard port of its own: tests run
                // in parallel and the default 127.0.0.1:8080 is shared.
                ui_addr: if options
                    .args
                    .iter()
                    .any(|arg| arg.starts_with("--ui-listen"))
                {
                    None
                } else {
                    Some(free_loopback_addr()?)
                },
                dir: dir.take(),
                starts: 0,
            };
            match server.spawn_and_wait().await {
                Ok(()) => return Ok(server),
                Err(error) => {
                    server.kill9()?;
                    // Another process may take the probed port before the
                    // server binds it: then try another port, from scratch.
                    let port_taken = server.log_tail().contains(PORT_TAKEN);
                    if !port_taken || attempt >= START_ATTEMPTS || options.listen.is_some() {
                        return Err(error);
                    }
                    let _ = std::fs::remove_file(server.log_path());
                    let _ = std::fs::remove_dir_all(server.data_dir());
                    dir = server.dir.take();
                }
            }
        }
        unreachable!("the loop returns")
    }

    /// Stops the server if it runs (SIGTERM, waiting up to
    /// [`EXIT_DEADLINE`]) and starts it again on the same port with the same
    /// data directory and options, waiting until it is healthy.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if self.is_running() {
            self.terminate().await?;
        }
        self.spawn_and_wait().await
    }

    /// Starts the server again after [`kill9`](Self::kill9) or
    /// [`terminate`](Self::terminate), without stopping anything first.
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        if self.is_running() {
            bail!("the server is still running; stop it first or use restart()");
        }
        self.spawn_and_wait().await
    }

    /// Kills the server with SIGKILL (no chance to flush or clean up) and
    /// reaps it.
    pub fn kill9(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            // Fails only if the process already exited; `wait` reaps it
            // either way.
            let _ = child.kill();
            child.wait().context("cannot reap the killed server")?;
        }
        Ok(())
    }

    /// Sends SIGTERM and waits up to [`EXIT_DEADLINE`] for the process to
    /// exit; returns its exit status. On timeout the process is killed and
    /// an error (with the log tail) returned.
    pub async fn terminate(&mut self) -> anyhow::Result<ExitStatus> {
        self.terminate_within(EXIT_DEADLINE).await
    }

    /// [`terminate`](Self::terminate) with a custom deadline.
    pub async fn terminate_within(&mut self, deadline: Duration) -> anyhow::Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            bail!("the server is not running");
        };
        let pid = Pid::from_raw(i32::try_from(child.id()).context("process id out of range")?);
        kill(pid, Signal::SIGTERM).context("cannot send SIGTERM to the server")?;
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().context("cannot wait for the server")? {
                return Ok(status);
            }
            if started.elapsed() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the server did not exit within {deadline:?} of SIGTERM; killed it.\n{}",
                    self.log_report()
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Whether the process is running (not exited, killed or terminated).
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server's resident memory now (`VmRSS`) and its peak so far
    /// (`VmHWM`), in bytes, from `/proc/<pid>/status`.
    ///
    /// # Panics
    /// If the server is not running or `/proc` cannot be read (Linux only):
    /// a test that measures memory must not pass without measuring.
    pub fn memory(&self) -> (u64, u64) {
        let pid = self.pid().expect("the server runs");
        let path = format!("/proc/{pid}/status");
        let field = |name: &str| {
            reconciled::process_memory::status_bytes(&path, name)
                .unwrap_or_else(|error| panic!("{error}"))
        };
        (field("VmRSS"), field("VmHWM"))
    }

    /// The server's gRPC address, e.g. `127.0.0.1:41234`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The dashboard's URL, e.g. `http://127.0.0.1:41235/` (`https://` with
    /// [`ServerOptions::client_tls`]).
    ///
    /// # Panics
    /// If the options passed `--ui-listen` themselves.
    pub fn dashboard_url(&self) -> String {
        let addr = self.ui_addr.expect(
            "the dashboard address is chosen by ServerProcess unless --ui-listen is passed",
        );
        match self.options.tls {
            Some(_) => format!("https://{addr}/"),
            None => format!("http://{addr}/"),
        }
    }

    /// The server's gRPC endpoint URI, e.g. `http://127.0.0.1:41234`
    /// (`https://127.0.0.1:41234` with [`ServerOptions::client_tls`]; test
    /// certificates name the IP address).
    pub fn endpoint(&self) -> String {
        match self.options.tls {
            Some(_) => format!("https://{}", self.addr),
            None => format!("http://{}", self.addr),
        }
    }

    /// An endpoint for the server, with the TLS settings of its options.
    fn dial(&self) -> anyhow::Result<Endpoint> {
        let endpoint = Endpoint::from_shared(self.endpoint()).context("invalid endpoint")?;
        match &self.options.tls {
            Some(tls) => endpoint
                .tls_config(tls.clone())
                .context("invalid client TLS settings"),
            None => Ok(endpoint),
        }
    }

    /// The admin token: the one passed with `--admin-token`, or else the one
    /// the server generated into `<data-dir>/admin.token`.
    ///
    /// # Panics
    /// If no token was passed and the server has not written the file.
    pub fn admin_token(&self) -> String {
        if let Some(token) = &self.options.admin_token {
            return token.clone();
        }
        let path = self.data_dir().join("admin.token");
        match std::fs::read_to_string(&path) {
            Ok(text) => text.trim_end().to_owned(),
            Err(error) => panic!(
                "cannot read the generated admin token {}: {error}",
                path.display()
            ),
        }
    }

    /// The server's data directory (`--data-dir`).
    pub fn data_dir(&self) -> PathBuf {
        self.temp_dir().join("data")
    }

    /// The file the server's stdout and stderr go to.
    pub fn log_path(&self) -> PathBuf {
        self.temp_dir().join("server.log")
    }

    /// A connected gRPC channel to the server.
    pub async fn channel(&self) -> anyhow::Result<Channel> {
        self.dial()?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .with_context(|| format!("cannot connect to the server at {}", self.addr))
    }

    /// Runs grpcurl against the server: `grpcurl -plaintext <flags> <addr>
    /// <command>`, e.g. `server.grpcurl(&["-d", "{}"],
    /// &["grpc.health.v1.Health/Check"])`.
    pub fn grpcurl(&self, flags: &[&str], command: &[&str]) -> Output {
        let binary = grpcurl();
        match Command::new(&binary)
            .arg("-plaintext")
            .args(flags)
            .arg(self.addr.to_string())
            .args(command)
            .stdin(Stdio::null())
            .output()
        {
            Ok(output) => output,
            Err(error) => panic!("cannot run {}: {error}", binary.display()),
        }
    }

    /// The last few KiB of the server's log.
    pub fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(self.log_path()) {
            let length = file.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = file.seek(SeekFrom::Start(length.saturating_sub(LOG_TAIL_BYTES)));
            let mut bytes = Vec::new();
            let _ = file.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    }

    fn log_report(&self) -> String {
        format!(
            "--- tail of {} ---\n{}--- end of log ---",
            self.log_path().display(),
            self.log_tail()
        )
    }

    fn temp_dir(&self) -> &Path {
        match &self.dir {
            Some(dir) => dir.path(),
            None => Path::new("/nonexistent-reconciled-test-dir"),
        }
    }

    /// Spawns the process and waits until it is healthy.
    async fn spawn_and_wait(&mut self) -> anyhow::Result<()> {
        self.spawn()?;
        self.wait_until_healthy().await
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        self.starts += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .with_context(|| format!("cannot open {}", self.log_path().display()))?;
        writeln!(log, "=== start #{} on {} ===", self.starts, self.addr)?;
        let stderr = log.try_clone()?;

        let mut command = Command::new(&self.binary);
        command
            .arg("--listen")
            .arg(self.addr.to_string())
            .arg("--data-dir")
            .arg(self.data_dir())
            .args(
                self.ui_addr
                    .map(|addr| ["--ui-listen".to_owned(), addr.to_string()])
                    .into_iter()
                    .flatten(),
            )
            .args(&self.options.args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr);
        // The test's own environment must not configure the server behind
        // its back (RECONCILED_LOG for debugging is the exception).
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("RECONCILED_") && name != "RECONCILED_LOG" {
                command.env_remove(&name);
            }
        }
        if let Some(token) = &self.options.admin_token {
            command.arg("--admin-token").arg(token);
        }
        for (name, value) in &self.options.env {
            command.env(name, value);
        }
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {}", self.binary.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Whether the process started last printed its `listening on` line
    /// (stdout, which goes to the log whatever the log level): it has
    /// bound its port.
    fn listens_since_last_start(&self) -> bool {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let marker = format!("=== start #{} on {} ===", self.starts, self.addr);
        log.rfind(&marker)
            .is_some_and(|start| log[start..].contains("reconciled listening on "))
    }

    async fn wait_until_healthy(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let endpoint = self
            .dial()?
            .connect_timeout(Duration::from_secs(1))
            .timeout(Duration::from_secs(1));
        loop {
            if let Some(child) = &mut self.child
                && let Some(status) = child.try_wait().context("cannot poll the server process")?
            {
                self.child = None;
                bail!(
                    "the server exited before it was ready ({status}).\n{}",
                    self.log_report()
                );
            }
            let last_answer = match endpoint.connect().await {
                Ok(channel) => {
                    match HealthClient::new(channel)
                        .check(HealthCheckRequest {
                            service: String::new(),
                        })
                        .await
                    {
                        // Another test's server may hold the port this one
                        // failed to bind: only an answer after this process
                        // said it listens is its own.
                        Ok(_) if !self.listens_since_last_start() => {
                            "an answer from another process on the port".to_owned()
                        }
                        Ok(reply)
                            if reply.get_ref().status() == ServingStatus::Serving
                                || !self.options.wait_for_serving =>
                        {
                            return Ok(());
                        }
                        Ok(reply) => format!("health status {:?}", reply.get_ref().status()),
                        Err(status) => format!("health check failed: {status}"),
                    }
                }
                Err(error) => format!("cannot connect: {error}"),
            };
            if started.elapsed() > READY_DEADLINE {
                bail!(
                    "the server at {} was not healthy within {READY_DEADLINE:?} (last: {last_answer}).\n{}",
                    self.addr,
                    self.log_report()
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.kill9();
        if std::thread::panicking()
            && let Some(dir) = self.dir.take()
        {
            let report = self.log_report_at(dir.path());
            let kept = dir.keep();
            eprintln!(
                "reconciled test server files kept in {}\n{report}",
                kept.display()
            );
        }
    }
}

impl ServerProcess {
    fn log_report_at(&self, dir: &Path) -> String {
        let path = dir.join("server.log");
        let text = std::fs::read(&path).unwrap_or_default();
        let start = text.len().saturating_sub(LOG_TAIL_BYTES as usize);
        format!(
            "--- tail of {} ---\n{}--- end of log ---",
            path.display(),
            String::from_utf8_lossy(&text[start..])
        )
    }
}

/// A loopback address whose port was free a moment ago.
pub fn free_loopback_addr() -> anyhow::Result<SocketAddr> {
    let probe =
        TcpListener::bind("127.0.0.1:0").context("cannot bind a probe socket on 127.0.0.1")?;
    probe
        .local_addr()
        .context("cannot read the probe socket's address")
}

/// A random token with the given prefix.
pub fn random_token(prefix: &str) -> String {
    let bytes: [u8; 24] = rand::rng().random();
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("{prefix}{hex}")
}
