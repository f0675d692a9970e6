//! Every black-box test of reconciled, in one test binary.
//!
//! Each module is one area (its own file beside this one, with its own
//! docs). They are linked into one binary rather than one per file: each
//! binary links the whole server, the SDK and their dependencies (about
//! 50 MB in a debug build), so one binary per file cost CI 1.6 GB of disk
//! and a link per file. Tests run in the order of their names, so the
//! tests of one module still run beside each other.
//!
//! Run one area with `cargo test -p reconciled-tests --test integration
//! <module>::`, e.g. `simulation::`. A new file here must be declared
//! below: `every_test_file_is_a_module` fails until it is.

mod agents;
mod cli;
mod cluster;
mod cluster_failover;
mod controller;
mod dashboard;
mod deploy;
mod durability;
mod etcd;
mod etcd_store;
mod fairness;
mod fs_agent;
mod grpcurl;
mod hostile;
mod hostile_suite;
mod intent;
mod limits;
mod metrics;
mod operator_mistakes;
mod protocol;
mod python_agent;
mod randomized;
mod reconctl;
mod recovery;
mod resync;
mod schemas;
mod semantics;
mod shutdown;
mod simulation;
mod smoke;
mod telemetry;
mod tenants;
mod tls;
mod upgrade;
mod watch;

/// Cargo builds only this file's modules (`autotests = false`), so a test
/// file nobody declared would silently never run.
#[test]
fn every_test_file_is_a_module() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let this = std::fs::read_to_string(dir.join("integration.rs")).expect("reads integration.rs");
    let mut undeclared = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("lists tests/") {
        let path = entry.expect("reads an entry of tests/").path();
        let Some(stem) = path.file_stem().and_then(|stem| stem.to_str()) else {
            continue;
        };
        if path.extension().is_some_and(|ext| ext == "rs")
            && stem != "integration"
            && !this.contains(&format!("\nmod {stem};\n"))
        {
            undeclared.push(stem.to_owned());
        }
    }
    assert!(
        undeclared.is_empty(),
        "declare these test files in tests/tests/integration.rs: {undeclared:?}"
    );
}
