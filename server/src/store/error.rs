//! The errors of every store backend.

use std::path::PathBuf;

use reconciled_migrations::MigrationError;

/// Why a store operation failed.
///
/// Cloneable (it carries messages, not backend errors) so that one failed
/// group commit can answer each of its waiters.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A put's value is over [`MAX_VALUE_BYTES`](crate::store::MAX_VALUE_BYTES).
    #[error(
        "value of {size} bytes for key {key} is over the {limit}-byte limit; nothing of its \
         batch was written: split the record into smaller ones"
    )]
    ValueTooLarge {
        /// The key, escaped for display.
        key: String,
        /// The value's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The store could not be opened.
    #[error(
        "cannot open the store at {path}: {message}; check that the directory exists and is \
         writable, and that no other reconciled process is using it"
    )]
    Open {
        /// The store directory.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The backend failed a read or a write; nothing of a failed write was applied.
    #[error(
        "the store failed to {operation}: {message}; check the disk (free space, permissions, \
         health) and the logs, then retry"
    )]
    Backend {
        /// What the store was doing.
        operation: &'static str,
        /// What the backend reported.
        message: String,
    },
    /// The commit writer has stopped, so nothing more can be written.
    #[error(
        "the store's commit writer has stopped, so the write was not made; reconciled is \
         shutting down or the writer failed: see the logs and restart reconciled"
    )]
    Closed,
    /// A backup could not be written.
    #[error(
        "cannot back up the store to {path}: {message}; choose a path that does not exist yet, \
         on a disk with enough free space"
    )]
    Backup {
        /// The backup target.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The batch's [`Fence`](crate::store::Fence) no longer holds: another
    /// process changed (or removed) the fence key since it was claimed.
    #[error(
        "the write was refused because fence key {key} has moved on (claimed at revision \
         {expected}, now {actual}); nothing of the batch was written: this process no longer \
         owns what the key guards and must stop writing it"
    )]
    Fenced {
        /// The fence key, escaped for display.
        key: String,
        /// The revision the batch expected.
        expected: i64,
        /// The key's revision now (0: the key is gone).
        actual: i64,
    },
    /// The etcd cluster refused or failed a request.
    #[error(
        "etcd failed to {operation}: {message}; check that the etcd endpoints are reachable and \
         healthy (`etcdctl endpoint health`), and the credentials and TLS settings"
    )]
    Etcd {
        /// What the store was doing.
        operation: &'static str,
        /// What etcd or the client reported.
        message: String,
    },
    /// etcd no longer keeps the history asked for: it was compacted.
    #[error(
        "etcd has compacted its history past revision {requested} (it keeps revisions from \
         {compact_revision}); start over from the current state"
    )]
    Compacted {
        /// The first revision asked for.
        requested: i64,
        /// The oldest revision etcd still keeps.
        compact_revision: i64,
    },
    /// The store holds part of the records of a `reconciled store copy`
    /// that did not finish.
    #[error(
        "this store holds only part of the records of a `reconciled store copy` that did not \
         finish, so it is not served, migrated or repaired; empty it (a new data directory, or \
         `etcdctl del --prefix <prefix>`) and run the copy again"
    )]
    PartialCopy,
    /// Planning or applying schema migrations failed.
    #[error("{0}")]
    Migration(#[from] MigrationError),
}
