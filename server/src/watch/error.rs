//! Why a watch cannot start, or why it ended. The API layer maps these to
//! API errors (`api/watch.rs`), which [`crate::status`] turns into gRPC
//! statuses; nothing here knows the wire.

use std::time::Duration;

use super::hub::CloseReason;

/// Errors of a watch stream.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    /// The watcher fell out of the live ring after it had caught up; it
    /// may resume from its last revision after `retry_after`.
    #[error("the watcher fell behind the live events")]
    SlowConsumer {
        /// How long to wait before resuming.
        retry_after: Duration,
    },
    /// The events after `requested` are no longer kept.
    #[error("revision {requested} is compacted (the oldest available is {compact_revision})")]
    RevisionCompacted {
        /// The revision asked for.
        requested: u64,
        /// The oldest revision still available.
        compact_revision: u64,
    },
    /// The tenant was deleted: its stream ends.
    #[error("the tenant was deleted; its watch has ended")]
    TenantDeleted,
    /// The server is shutting down: resume after the restart.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// Another replica serves the tenant now: resume from the last
    /// revision (any replica forwards the watch to the new owner).
    #[error("the tenant moved to another replica")]
    Moved,
    /// Reading the stored history failed.
    #[error("reading the event history failed: {0}")]
    History(String),
}

impl From<CloseReason> for WatchError {
    fn from(reason: CloseReason) -> Self {
        match reason {
            CloseReason::Deleted => Self::TenantDeleted,
            CloseReason::ShuttingDown => Self::ShuttingDown,
            CloseReason::Moved => Self::Moved,
        }
    }
}
