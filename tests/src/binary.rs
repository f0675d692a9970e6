//! Finding (and building) the `reconciled` binary under test.
//!
//! Cargo does not build another package's binaries for a test
//! (`CARGO_BIN_EXE_*` exists only for a package's own binaries), and
//! `cargo test -p reconciled-tests` would otherwise run against whatever
//! stale binary a previous build left in `target/`. So the first test in each
//! test process that needs a binary runs `cargo build --workspace --bins
//! --examples` with the profile of the test itself, and uses the
//! executables cargo reports (the server, `reconctl`, the example agents).
//! Under `cargo test --workspace` that only links them: see
//! `build_workspace_executables` for why the whole workspace. Cargo's own
//! lock on the build directory serialises concurrent builds from parallel
//! test processes.
//!
//! Set `RECONCILED_BIN=/path/to/reconciled` to test a prebuilt binary
//! instead (nothing is built then).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context as _, bail};

/// Environment variable that names a prebuilt `reconciled` binary to test.
pub const RECONCILED_BIN_ENV: &str = "RECONCILED_BIN";

/// The `reconciled` binary to test, built (once per process) if needed.
///
/// # Panics
/// If the binary cannot be built or found: a black-box test cannot run
/// without it. The message carries cargo's output.
pub fn reconciled_binary() -> PathBuf {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let result = BINARY.get_or_init(|| locate_or_build().map_err(|error| format!("{error:#}")));
    match result {
        Ok(path) => path.clone(),
        Err(message) => panic!("cannot get the reconciled binary to test: {message}"),
    }
}

fn locate_or_build() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(RECONCILED_BIN_ENV) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("{RECONCILED_BIN_ENV}={} is not a file", path.display());
        }
        return Ok(path);
    }
    build_with_cargo()
}

/// The workspace root: this crate lives in `<root>/tests`.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// The cargo profile this test executable was built with, from its path
/// (`<target>/<profile-dir>/deps/<test>`): `debug` is the `dev` profile.
fn test_profile() -> String {
    let exe = std::env::current_exe().ok();
    let profile_dir = exe.as_deref().and_then(|exe| {
        let deps = exe.parent()?;
        if deps.file_name()? != "deps" {
            return None;
        }
        Some(deps.parent()?.file_name()?.to_string_lossy().into_owned())
    });
    match profile_dir.as_deref() {
        None | Some("debug") => "dev".to_owned(),
        Some(other) => other.to_owned(),
    }
}

/// The target directory this test executable was built into, from its
/// path `<target>/<profile>/deps/<test>`.
fn detected_target_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.parent()?.parent()?.to_path_buf();
    dir.join("CACHEDIR.TAG").exists().then_some(dir)
}

/// The directory where tests keep tools they install (grpcurl): the target
/// directory of this test run, or `<workspace>/target` if it cannot be told.
pub fn target_dir() -> PathBuf {
    detected_target_dir().unwrap_or_else(|| workspace_root().join("target"))
}

fn build_with_cargo() -> anyhow::Result<PathBuf> {
    workspace_executable("bin", "reconciled")
}

/// The example `name` of the workspace (e.g. the `fs_agent` example
/// agent), built once per test process with the test's profile. The build
/// blocks the calling thread: call it before opening connections, which
/// the server closes when their runtime misses its keepalive pings.
pub fn example_binary(name: &str) -> PathBuf {
    executable_or_panic("example", name)
}

/// The binary `name` of the workspace (e.g. `reconctl`), built once per
/// test process with the test's profile. Like [`example_binary`], call it
/// before opening connections.
pub fn workspace_binary(name: &str) -> PathBuf {
    executable_or_panic("bin", name)
}

fn executable_or_panic(kind: &str, name: &str) -> PathBuf {
    workspace_executable(kind, name)
        .unwrap_or_else(|error| panic!("cannot build {kind} {name}: {error:#}"))
}

/// The executable of target `name` of `kind` (`bin` or `example`) from the
/// workspace build, which runs once per test process.
fn workspace_executable(kind: &str, name: &str) -> anyhow::Result<PathBuf> {
    static BUILT: OnceLock<Result<Vec<Executable>, String>> = OnceLock::new();
    let built = BUILT
        .get_or_init(|| build_workspace_executables().map_err(|error| format!("{error:#}")))
        .as_ref()
        .map_err(|message| anyhow::anyhow!("{message}"))?;
    built
        .iter()
        .find(|executable| executable.kind == kind && executable.name == name)
        .map(|executable| executable.path.clone())
        .with_context(|| format!("the workspace has no {kind} named {name}"))
}

/// One executable cargo reported building.
struct Executable {
    kind: String,
    name: String,
    path: PathBuf,
}

/// Runs `cargo build --workspace --bins --examples` with the test's profile
/// and target dir, and returns every executable cargo reports.
///
/// The whole workspace, examples included, is what `cargo test --workspace`
/// selects: cargo then resolves every dependency with the same features as
/// the test run and reuses its artifacts, so only the binaries themselves
/// are linked. A narrower selection (`-p reconciled --bin reconciled`)
/// resolves features differently (no dev-dependencies, fewer packages) and
/// compiled a second copy of nearly every dependency: about 1 GB of the
/// target directory and minutes of CPU next to the running tests.
fn build_workspace_executables() -> anyhow::Result<Vec<Executable>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = workspace_root().join("Cargo.toml");
    let profile = test_profile();
    let mut command = Command::new(&cargo);
    command
        .arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["--workspace", "--bins", "--examples"])
        .args(["--profile", &profile])
        .args(["--message-format", "json-render-diagnostics"]);
    if let Some(dir) = detected_target_dir() {
        command.arg("--target-dir").arg(dir);
    }
    let output = command
        .output()
        .with_context(|| format!("cannot run {}", Path::new(&cargo).display()))?;
    if !output.status.success() {
        bail!(
            "`cargo build --workspace --bins --examples --profile {profile}` failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut executables = Vec::new();
    for line in stdout.lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let (Some(name), Some(path)) = (
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) else {
            continue;
        };
        for kind in message["target"]["kind"].as_array().into_iter().flatten() {
            if let Some(kind) = kind.as_str() {
                executables.push(Executable {
                    kind: kind.to_owned(),
                    name: name.to_owned(),
                    path: PathBuf::from(path),
                });
            }
        }
    }
    Ok(executables)
}
