//! Numbered store migrations for reconciled, and the runner that applies them.
//!
//! Migrations see the store only through [`MigrationStore`], a minimal
//! key-value interface defined here so that this crate never depends on the
//! server: the server implements it for its own store. Every migration is
//! frozen once released: it uses the key layout *as of its version* (the
//! constants in [`layout`]), never the server's current key builders.
#![forbid(unsafe_code)]

mod builtin;
mod error;
pub mod layout;
mod runner;

pub use builtin::builtin;
pub use error::MigrationError;
pub use layout::SCHEMA_VERSION_KEY;
pub use runner::{MigrationInfo, Runner, Status};

/// A key and its value.
pub type Record = (Vec<u8>, Vec<u8>);

/// Records per page when [`MigrationStore::scan_prefix`] reads a prefix.
const SCAN_PREFIX_PAGE: usize = 1_000;

/// The key-value operations a migration may use.
///
/// Implementations must make each [`apply`](MigrationStore::apply) call
/// atomic and durable before it returns.
pub trait MigrationStore {
    /// Reads one key.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MigrationError>;
    /// Returns, in key order, at most `limit` records whose key starts with
    /// `prefix` and is greater than `after` (from the first such key when
    /// `after` is `None`). Fewer than `limit` records (and `limit` > 0) means
    /// there are no more. Migrations that may meet many records page through
    /// them with this rather than [`scan_prefix`](MigrationStore::scan_prefix).
    fn scan_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Record>, MigrationError>;
    /// Returns every key starting with `prefix`, with its value, in key order:
    /// all of them in memory at once, read page by page through
    /// [`scan_page`](MigrationStore::scan_page).
    fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<Record>, MigrationError> {
        let mut records: Vec<Record> = Vec::new();
        loop {
            let after = records.last().map(|(key, _)| key.as_slice());
            let page = self.scan_page(prefix, after, SCAN_PREFIX_PAGE)?;
            let complete = page.len() < SCAN_PREFIX_PAGE;
            records.extend(page);
            if complete {
                return Ok(records);
            }
        }
    }
    /// Applies `deletes`, then `puts`, atomically and durably. A key should not
    /// appear in both; if it does, the put wins.
    fn apply(&self, puts: Vec<Record>, deletes: Vec<Vec<u8>>) -> Result<(), MigrationError>;
}

/// One numbered step of the schema.
///
/// `apply` must be idempotent with respect to a crash before the version is
/// recorded: the runner records the version in the same atomic write as the
/// migration's last batch when it can, but a migration that writes several
/// batches may be re-run from the start after a crash.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// The schema version this migration produces (1, 2, ...).
    pub version: u32,
    /// A short human-readable name, shown by `reconciled migrate --status`.
    pub name: &'static str,
    /// Transforms a database at `version - 1` into one at `version`. It must
    /// not write [`SCHEMA_VERSION_KEY`]: the runner does.
    pub apply: fn(&dyn MigrationStore) -> Result<(), MigrationError>,
}
