//! Python with `grpcio` and stubs generated from `proto/`, for the test of
//! the Python example agent (`examples/python`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::binary::{target_dir, workspace_root};

/// The PyPI packages the Python agent and its stub generation need.
pub const PYTHON_GRPC_PACKAGES: [&str; 2] = ["grpcio==1.85.1", "grpcio-tools==1.85.1"];

/// The directory (for `PYTHONPATH`) that holds `grpc` and `grpc_tools`:
/// `<target>/tools/pypi-grpcio`, installed there with `python3 -m pip
/// install --target` on first use (once, under a file lock shared by
/// parallel test processes).
///
/// # Panics
/// If `python3` or pip is missing or the install fails: the test must fail,
/// not skip. The message says how to install them by hand.
pub fn python_grpc_site() -> PathBuf {
    static SITE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let result = SITE.get_or_init(|| install().map_err(|error| format!("{error:#}")));
    match result {
        Ok(path) => path.clone(),
        Err(message) => panic!(
            "the Python agent test needs python3 with pip and the packages {PYTHON_GRPC_PACKAGES:?}: \
             {message}\nInstall Python 3 with pip (e.g. `apt-get install python3 python3-pip`); \
             the test installs the packages itself into <target>/tools/pypi-grpcio."
        ),
    }
}

fn install() -> anyhow::Result<PathBuf> {
    let site = target_dir().join("tools").join("pypi-grpcio");
    let marker = site.join("grpc_tools").join("protoc.py");
    crate::pip::install_once(&site, &PYTHON_GRPC_PACKAGES, &marker)?;
    Ok(site)
}

/// Generates the Python stubs of every file under `proto/reconciled/v1` and
/// `proto/google/rpc` into `out` with `grpc_tools.protoc`.
///
/// # Panics
/// If the generation fails (with protoc's output).
pub fn generate_python_stubs(site: &Path, out: &Path) {
    let proto = workspace_root().join("proto");
    let mut files = Vec::new();
    for dir in ["reconciled/v1", "google/rpc"] {
        let entries = std::fs::read_dir(proto.join(dir))
            .unwrap_or_else(|error| panic!("cannot list proto/{dir}: {error}"));
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".proto") {
                files.push(format!("{dir}/{name}"));
            }
        }
    }
    let output = Command::new("python3")
        .args(["-m", "grpc_tools.protoc"])
        .arg(format!("-I{}", proto.display()))
        .arg(format!(
            "-I{}",
            site.join("grpc_tools").join("_proto").display()
        ))
        .arg(format!("--python_out={}", out.display()))
        .arg(format!("--grpc_python_out={}", out.display()))
        .args(&files)
        .env("PYTHONPATH", site)
        .output()
        .unwrap_or_else(|error| panic!("cannot run python3 -m grpc_tools.protoc: {error}"));
    assert!(
        output.status.success(),
        "generating the Python stubs failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}
