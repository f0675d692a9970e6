//! Protocol buffer definitions of reconciled, package `reconciled.v1`, and the
//! gRPC clients and servers generated from them.
//!
//! - [`v1`]: messages and the `Reconciler`, `Configurators` and `Tenants`
//!   services (`v1::reconciler_server::ReconcilerServer`,
//!   `v1::reconciler_client::ReconcilerClient`, and so on).
//! - [`store::v1`]: the records the server stores (not an API).
//! - [`google::rpc`]: `google.rpc.Status` (embedded in item status, operation
//!   results and events) and the standard error details (`BadRequest`,
//!   `ErrorInfo`, `QuotaFailure`, `RetryInfo`, ...). They are wire-compatible
//!   with every other copy of these messages, e.g. `tonic-types`.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors of every file above and
//!   of the well-known types they import, with comments, for server
//!   reflection.
//!
//! - [`pointer`]: the check of a `recreate_on_change` path (a JSON Pointer or
//!   `*`) that the agent SDK and the server share.
//!
//! The well-known types (`google.protobuf.Struct`, `Duration`, `Timestamp`,
//! ...) are those of [`prost_types`].
//!
//! The `.proto` sources live in this crate under `reconciled/v1/` and
//! `google/rpc/`; code is generated at build time without a system `protoc`.
#![forbid(unsafe_code)]

/// The configurator protocol version this build speaks: agents send it in
/// `Register.protocol_version`, and the server refuses other versions with
/// `FAILED_PRECONDITION` and `ErrorInfo{reason: "UNSUPPORTED_PROTOCOL"}`.
pub const PROTOCOL_VERSION: u32 = 1;

/// The most operations, and the most waiting items, a `Plan` message lists
/// (DESIGN section 8); its counts cover the rest, and `truncated` says so.
pub const PLAN_LIMIT: usize = 1_000;

/// The encoded `google.protobuf.FileDescriptorSet` of `reconciled.v1`, our
/// copy of `google.rpc` (status and error details) and the well-known types
/// they import, including source comments. Register it with server
/// reflection so that grpcurl can describe the services and decode error
/// details.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("reconciled_descriptor");

/// Package `reconciled.v1`: the reconciled API (generated).
#[allow(missing_docs, clippy::all)]
#[allow(
    rustdoc::broken_intra_doc_links,
    rustdoc::invalid_html_tags,
    rustdoc::bare_urls
)]
pub mod v1 {
    tonic::include_proto!("reconciled.v1");
}

/// Package `reconciled.store.v1`: how the server stores a tenant's records
/// (generated). Not an API, and not served by reflection; see
/// `reconciled/store/v1/records.proto` for the rules of changing it.
pub mod store {
    /// Store schema version 2 and later.
    #[allow(missing_docs, clippy::all)]
    pub mod v1 {
        tonic::include_proto!("reconciled.store.v1");
    }
}

/// Google packages this crate generates (the well-known types come from
/// [`prost_types`]).
pub mod google {
    /// Package `google.rpc`: `Status` and the standard error details
    /// (generated from a copy of googleapis' `status.proto` and
    /// `error_details.proto`).
    #[allow(missing_docs, clippy::all)]
    #[allow(
        rustdoc::broken_intra_doc_links,
        rustdoc::invalid_html_tags,
        rustdoc::bare_urls
    )]
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

pub mod json;
pub mod pointer;
