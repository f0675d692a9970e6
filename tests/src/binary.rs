//! Finding (and building) the `reconciled` binary under test.
//!
//! Cargo does not build another package's binaries for a test
//! (`CARGO_BIN_EXE_*` exists only for a package's own binaries), and
//! `cargo test -p reconciled-tests` would otherwise run against whatever
//! stale binary a previous build left in `target/`. So the first test in each
//! test process runs `cargo build -p reconciled --bin reconciled` with the
//! profile of the test itself, and uses the executable cargo reports. When
//! the binary is up to date this takes about a second. Cargo's own lock on
//! the build directory serialises concurrent builds from parallel test
//! processes.
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
    cargo_build("reconciled", "bin", "reconciled")
}

/// The example `name` of package `package`, built once per test process
/// with the test's profile (e.g. the `fs_agent` example agent). The build
/// blocks the calling thread: call it before opening connections, which
/// the server closes when their runtime misses its keepalive pings.
pub fn example_binary(package: &str, name: &str) -> PathBuf {
    built_once(package, "example", name)
}

/// The binary `name` of package `package` (e.g. `reconctl` of
/// `reconciled-client`), built once per test process with the test's
/// profile. Like [`example_binary`], call it before opening connections.
pub fn package_binary(package: &str, name: &str) -> PathBuf {
    built_once(package, "bin", name)
}

fn built_once(package: &str, kind: &str, name: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let key = format!("{package}/{kind}/{name}");
    if let Some((_, path)) = built.iter().find(|(k, _)| *k == key) {
        return path.clone();
    }
    match cargo_build(package, kind, name) {
        Ok(path) => {
            built.push((key, path.clone()));
            path
        }
        Err(error) => panic!("cannot build {kind} {name} of {package}: {error:#}"),
    }
}

/// Runs `cargo build -p <package> --<kind> <name>` with the test's profile
/// and target dir, and returns the executable cargo reports.
fn cargo_build(package: &str, kind: &str, name: &str) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = workspace_root().join("Cargo.toml");
    let profile = test_profile();
    let mut command = Command::new(&cargo);
    command
        .arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["-p", package, &format!("--{kind}"), name])
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
            "`cargo build -p {package} --{kind} {name} --profile {profile}` failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in stdout.lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_target = message["reason"] == "compiler-artifact"
            && message["target"]["name"] == name
            && message["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == kind));
        if let (true, Some(executable)) = (is_target, message["executable"].as_str()) {
            return Ok(PathBuf::from(executable));
        }
    }
    bail!(
        "cargo built {name} but reported no executable; its output was:\n{}",
        String::from_utf8_lossy(&output.stderr)
    )
}
