//! What can go wrong in a tenant's owner, in engine terms. The API layer
//! maps these to gRPC statuses in one place.

use crate::engine::intent::IntentError;
use crate::store::StoreError;

/// Errors of tenant operations.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TenantError {
    /// The submitted intent is refused; nothing was stored.
    #[error(transparent)]
    Intent(#[from] IntentError),
    /// The tenant is gone (deleted while the request was queued).
    #[error("tenant not found")]
    Gone,
    /// A stored record could not be read.
    #[error(
        "stored record {key} is unreadable: {message}; restore the data directory from a backup"
    )]
    Corrupt {
        /// The record's key (lossy text).
        key: String,
        /// The decoder's message.
        message: String,
    },
    /// A record could not be encoded for storage: a defect of the server,
    /// not of the data on disk. Nothing was written.
    #[error(
        "a {record} record could not be encoded: {message}; nothing was written (this is a server defect: please report it)"
    )]
    Encode {
        /// The kind of record (its Rust type).
        record: &'static str,
        /// The encoder's message.
        message: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
