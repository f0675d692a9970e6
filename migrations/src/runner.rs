//! Decides which migrations are pending and applies them in order.

use std::cell::RefCell;

use crate::layout::{SCHEMA_VERSION_KEY, decode_version, encode_version};
use crate::{Migration, MigrationError, MigrationStore, Record};

/// A migration's number and name, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrationInfo {
    /// The schema version the migration produces.
    pub version: u32,
    /// Its short name.
    pub name: &'static str,
}

/// Where a database stands relative to the known migrations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The version recorded in the database (0 if none).
    pub current_version: u32,
    /// The newest version this binary knows.
    pub latest_version: u32,
    /// Known migrations the database already has, in order.
    pub applied: Vec<MigrationInfo>,
    /// Known migrations still to apply, in order.
    pub pending: Vec<MigrationInfo>,
}

impl Status {
    /// True when nothing is pending.
    pub fn is_up_to_date(&self) -> bool {
        self.pending.is_empty()
    }
}

/// Applies a validated, contiguous list of migrations.
#[derive(Debug, Clone)]
pub struct Runner {
    migrations: Vec<Migration>,
}

impl Runner {
    /// Builds a runner; the versions must be exactly 1, 2, ..., N in order.
    pub fn new(migrations: Vec<Migration>) -> Result<Self, MigrationError> {
        for (position, migration) in migrations.iter().enumerate() {
            let expected = u32::try_from(position + 1).unwrap_or(u32::MAX);
            if migration.version != expected {
                return Err(MigrationError::InvalidSequence {
                    position,
                    expected,
                    found: migration.version,
                });
            }
        }
        Ok(Self { migrations })
    }

    /// The newest version these migrations produce (0 if there are none).
    pub fn latest_version(&self) -> u32 {
        self.migrations.last().map_or(0, |m| m.version)
    }

    /// Reports the database's version and what is applied and pending.
    ///
    /// Fails with [`MigrationError::SchemaTooNew`] if the database is newer
    /// than [`latest_version`](Self::latest_version).
    pub fn status(&self, store: &dyn MigrationStore) -> Result<Status, MigrationError> {
        let current_version = read_version(store)?;
        let latest_version = self.latest_version();
        if current_version > latest_version {
            return Err(MigrationError::SchemaTooNew {
                found: current_version,
                newest_known: latest_version,
            });
        }
        let (applied, pending): (Vec<_>, Vec<_>) = self
            .migrations
            .iter()
            .map(|m| MigrationInfo {
                version: m.version,
                name: m.name,
            })
            .partition(|m| m.version <= current_version);
        Ok(Status {
            current_version,
            latest_version,
            applied,
            pending,
        })
    }

    /// Applies every pending migration in order and returns their versions.
    ///
    /// `before_first` (the backup) runs once, only if something is pending,
    /// before anything is written; if it fails nothing is migrated. Each
    /// migration's version is recorded in the same atomic write as its last
    /// batch, unless it read the store after that batch (then in a write of
    /// its own right after).
    pub fn run(
        &self,
        store: &dyn MigrationStore,
        before_first: impl FnOnce() -> Result<(), MigrationError>,
    ) -> Result<Vec<u32>, MigrationError> {
        let status = self.status(store)?;
        if status.pending.is_empty() {
            return Ok(Vec::new());
        }
        before_first().map_err(|e| match e {
            MigrationError::Backup { .. } => e,
            other => MigrationError::Backup {
                message: other.to_string(),
            },
        })?;
        let mut ran = Vec::with_capacity(status.pending.len());
        let mut previous = status.current_version;
        for migration in &self.migrations[status.applied.len()..] {
            apply_one(store, migration).map_err(|source| MigrationError::Failed {
                version: migration.version,
                name: migration.name,
                previous,
                source: Box::new(source),
            })?;
            previous = migration.version;
            ran.push(migration.version);
        }
        Ok(ran)
    }
}

fn read_version(store: &dyn MigrationStore) -> Result<u32, MigrationError> {
    match store.get(SCHEMA_VERSION_KEY)? {
        None => Ok(0),
        Some(bytes) => {
            decode_version(&bytes).ok_or(MigrationError::CorruptVersion { len: bytes.len() })
        }
    }
}

fn apply_one(store: &dyn MigrationStore, migration: &Migration) -> Result<(), MigrationError> {
    let deferring = DeferLastWrite {
        inner: store,
        held: RefCell::new(None),
    };
    (migration.apply)(&deferring)?;
    let (mut puts, deletes) = deferring.held.into_inner().unwrap_or_default();
    puts.retain(|(key, _)| key.as_slice() != SCHEMA_VERSION_KEY);
    puts.push((
        SCHEMA_VERSION_KEY.to_vec(),
        encode_version(migration.version),
    ));
    store.apply(puts, deletes)
}

type HeldWrite = (Vec<Record>, Vec<Vec<u8>>);

/// Holds back a migration's most recent write so that the runner can record
/// the new version in the same atomic write. Any read first releases the held
/// write, so the migration always reads its own writes.
struct DeferLastWrite<'a> {
    inner: &'a dyn MigrationStore,
    held: RefCell<Option<HeldWrite>>,
}

impl DeferLastWrite<'_> {
    fn release(&self) -> Result<(), MigrationError> {
        match self.held.take() {
            Some((puts, deletes)) => self.inner.apply(puts, deletes),
            None => Ok(()),
        }
    }
}

impl MigrationStore for DeferLastWrite<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MigrationError> {
        self.release()?;
        self.inner.get(key)
    }

    fn scan_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Record>, MigrationError> {
        self.release()?;
        self.inner.scan_page(prefix, after, limit)
    }

    fn apply(&self, puts: Vec<Record>, deletes: Vec<Vec<u8>>) -> Result<(), MigrationError> {
        self.release()?;
        *self.held.borrow_mut() = Some((puts, deletes));
        Ok(())
    }
}

#[cfg(test)]
mod tests;
