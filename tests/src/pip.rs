//! Installing PyPI packages for tests: `python3 -m pip install --target`
//! into a directory under `<target>/tools`, once, under a file lock shared by
//! parallel test processes.

use std::fs::OpenOptions;
use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, bail};

/// Installs `packages` into `site` unless `marker` (a file the packages
/// ship) exists already; afterwards `marker` must exist.
pub fn install_once(site: &Path, packages: &[&str], marker: &Path) -> anyhow::Result<()> {
    if marker.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(site).with_context(|| format!("cannot create {}", site.display()))?;
    let lock_path = site.with_extension("lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("cannot open the install lock {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("cannot take the install lock {}", lock_path.display()))?;
    // Another process may have installed them while we waited for the lock.
    if !marker.exists() {
        let output = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["--no-input", "--target"])
            .arg(site)
            .args(packages)
            .output()
            .context("cannot run `python3 -m pip` (is Python 3 with pip installed?)")?;
        if !output.status.success() {
            bail!(
                "`python3 -m pip install --target {} {}` failed ({}):\n{}",
                site.display(),
                packages.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    if !marker.exists() {
        bail!(
            "pip installed {}, but {} does not exist",
            packages.join(" "),
            marker.display()
        );
    }
    Ok(())
}
