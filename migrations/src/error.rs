//! The errors of migrations and of their runner.

/// Why a migration could not be planned or applied.
///
/// Cloneable (it carries messages, not sources) so that callers can hand the
/// same error to several waiters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MigrationError {
    /// The database was written by a newer reconciled.
    #[error(
        "the database has schema version {found} but this reconciled knows migrations only up \
         to version {newest_known}; refusing to touch it: run a newer reconciled (or restore a \
         backup taken by this version)"
    )]
    SchemaTooNew {
        /// The version recorded in the database.
        found: u32,
        /// The newest version this binary can migrate to.
        newest_known: u32,
    },
    /// The schema version record is not 4 bytes.
    #[error(
        "the schema version record holds {len} bytes instead of 4: the database is damaged or \
         was not written by reconciled; restore it from a backup"
    )]
    CorruptVersion {
        /// The length of the stored record.
        len: usize,
    },
    /// The list of migrations is not numbered 1, 2, ..., N.
    #[error(
        "migration at position {position} has version {found}, expected {expected}: migrations \
         must be numbered 1..=N without gaps; this is a bug in reconciled, please report it"
    )]
    InvalidSequence {
        /// Zero-based index in the list.
        position: usize,
        /// The version that position should have.
        expected: u32,
        /// The version it has.
        found: u32,
    },
    /// The underlying store failed.
    #[error("the store failed during a migration: {message}; check the data directory and retry")]
    Store {
        /// What the store reported.
        message: String,
    },
    /// A migration found data it cannot convert.
    #[error(
        "unexpected data in the database: {message}; restore the pre-migration backup and report the bug"
    )]
    Data {
        /// What was found, and where.
        message: String,
    },
    /// The backup taken before the first pending migration failed.
    #[error(
        "backup before migrating failed: {message}; nothing was migrated: free disk space or fix permissions and retry"
    )]
    Backup {
        /// What went wrong.
        message: String,
    },
    /// A migration failed; earlier migrations of the same run stay applied.
    #[error(
        "migration {version:04} ({name}) failed: {source}; the database stays at version \
         {previous}: fix the cause and start again, or restore the pre-migration backup"
    )]
    Failed {
        /// The failed migration's version.
        version: u32,
        /// The failed migration's name.
        name: &'static str,
        /// The version the database is at now.
        previous: u32,
        /// Why it failed.
        #[source]
        source: Box<MigrationError>,
    },
}
