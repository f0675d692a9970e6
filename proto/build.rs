//! Generates the Rust code and the encoded file descriptor set of the
//! reconciled protocol, without a system `protoc`: `protox` parses the
//! `.proto` files and `tonic-prost-build` generates from the descriptors.
//!
//! Two code generation runs share one descriptor set:
//!
//! 1. `google.rpc` (our copy of googleapis' status and error details) into
//!    `google.rpc.rs`, included as `crate::google::rpc`;
//! 2. `reconciled.v1` (messages, clients and servers) into `reconciled.v1.rs`,
//!    with `.google.rpc` mapped to `crate::google::rpc` (an extern path, so
//!    this run does not generate those types a second time), and the stored
//!    records `reconciled.store.v1` into `reconciled.store.v1.rs`.
//!
//! The well-known types (`google.protobuf.*`) come from `prost-types`.

use std::{env, fs, io, path::PathBuf};

use prost::Message as _;

/// Our own `.proto` files, relative to the crate root (the include path).
const PROTOS: &[&str] = &[
    "google/rpc/status.proto",
    "google/rpc/error_details.proto",
    "reconciled/v1/model.proto",
    "reconciled/v1/watch.proto",
    "reconciled/v1/reconciler.proto",
    "reconciled/v1/configurators.proto",
    "reconciled/v1/tenants.proto",
    "reconciled/store/v1/records.proto",
];

/// The package of the stored records: generated like the API, but left out
/// of the descriptor set that reflection serves (it is not an API).
const STORE_PACKAGE: &str = "reconciled.store.v1";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    for proto in PROTOS {
        println!("cargo:rerun-if-changed={}", root.join(proto).display());
    }
    println!("cargo:rerun-if-changed=build.rs");

    // Includes imports (the well-known types) and source code info (comments,
    // which reflection clients such as grpcurl show in `describe`).
    let fds = protox::compile(PROTOS, [&root]).map_err(|e| {
        // protox errors carry the file, line and a caret; print them in full.
        io::Error::other(format!("{e:?}"))
    })?;

    let api = prost_types::FileDescriptorSet {
        file: fds
            .file
            .iter()
            .filter(|f| f.package() != STORE_PACKAGE)
            .cloned()
            .collect(),
    };
    fs::write(
        out_dir.join("reconciled_descriptor.bin"),
        api.encode_to_vec(),
    )?;

    // Run 1: google.rpc only (it has no services).
    let google_rpc = prost_types::FileDescriptorSet {
        file: fds
            .file
            .iter()
            .filter(|f| f.package() == "google.rpc" || f.package() == "google.protobuf")
            .cloned()
            .collect(),
    };
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .emit_rerun_if_changed(false)
        .compile_fds(google_rpc)?;

    // Run 2: reconciled.v1 with clients and servers. Types of `.google.rpc`
    // resolve to run 1's output and are not generated again (nor is an empty
    // google.rpc.rs written over it).
    //
    // No transport constructors on the clients: the RPC
    // `Configurators.Connect` becomes `ConfiguratorsClient::connect(&mut self,
    // ..)`, which would clash with the generated `async fn connect(dst)`
    // constructor (tonic#747, #1253). Clients are built from a channel:
    // `XClient::new(Endpoint::from_shared(addr)?.connect().await?)`.
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .extern_path(".google.rpc", "crate::google::rpc")
        .compile_fds(fds)?;

    Ok(())
}
