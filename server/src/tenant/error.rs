//! What can go wrong in a tenant's owner, in engine terms. The API layer
//! maps these to gRPC statuses in one place.

use crate::engine::intent::IntentError;
use crate::graph::ItemRef;
use crate::graph::validate::FieldViolation;
use crate::store::StoreError;

/// Errors of tenant operations.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TenantError {
    /// The request is invalid; nothing was stored.
    #[error("the request is invalid: {} problem(s), first: {}", violations.len(), violations.first().map(|v| format!("{}: {}", v.field, v.description)).unwrap_or_default())]
    Invalid {
        /// Each problem with its field path.
        violations: Vec<FieldViolation>,
    },
    /// The intent would contain a dependency cycle.
    #[error("the intent has a dependency cycle: {}", cycle.iter().map(ToString::to_string).collect::<Vec<_>>().join(" -> "))]
    DependencyCycle {
        /// The cycle, first item repeated at the end.
        cycle: Vec<ItemRef>,
        /// Field path of the request item that closes the cycle.
        field: String,
    },
    /// An item of the request is already listed in a subgraph the request
    /// does not own.
    #[error(
        "item {item} at {field} is listed in subgraph {subgraph:?}; submit it there, or remove it there first"
    )]
    ItemInOtherSubgraph {
        /// Field path in the request.
        field: String,
        /// The item.
        item: ItemRef,
        /// Where it is listed now.
        subgraph: String,
    },
    /// `expected_generation` did not match.
    #[error(
        "tenant generation is {actual} but expected_generation was {expected}; fetch the graph and resubmit"
    )]
    GenerationMismatch {
        /// What the caller expected.
        expected: u64,
        /// The tenant's generation.
        actual: u64,
    },
    /// A per-tenant limit would be exceeded.
    #[error("{subject}: {description}")]
    Quota {
        /// The limit's name.
        subject: String,
        /// What exceeded it and what to do.
        description: String,
    },
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

impl From<IntentError> for TenantError {
    fn from(error: IntentError) -> Self {
        match error {
            IntentError::Invalid { violations } => Self::Invalid { violations },
            IntentError::DependencyCycle { cycle, field } => Self::DependencyCycle { cycle, field },
            IntentError::ItemInOtherSubgraph {
                field,
                item,
                subgraph,
            } => Self::ItemInOtherSubgraph {
                field,
                item,
                subgraph,
            },
            IntentError::GenerationMismatch { expected, actual } => {
                Self::GenerationMismatch { expected, actual }
            }
            IntentError::Quota {
                subject,
                description,
            } => Self::Quota {
                subject,
                description,
            },
        }
    }
}
