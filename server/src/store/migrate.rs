//! Runs the schema migrations on a store at start-up.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reconciled_migrations::{
    MigrationError, MigrationInfo, MigrationStore, Record, Runner, Status, builtin,
};
use tracing::info;

use crate::store::{
    EtcdOptions, EtcdStore, SledOptions, SledStore, Store, StoreError, WriteBatch, keys,
};

/// Lets the migrations read and write a [`Store`]. Blocking: use it from
/// start-up code or `spawn_blocking`, not on an async runtime thread.
#[derive(Clone, Copy)]
pub struct MigrationAdapter<'a>(pub &'a dyn Store);

fn to_migration_error(error: StoreError) -> MigrationError {
    MigrationError::Store {
        message: error.to_string(),
    }
}

impl MigrationStore for MigrationAdapter<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MigrationError> {
        self.0.get(key).map_err(to_migration_error)
    }

    fn scan_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Record>, MigrationError> {
        self.0
            .scan(prefix, after, limit)
            .map_err(to_migration_error)
    }

    fn apply(&self, puts: Vec<Record>, deletes: Vec<Vec<u8>>) -> Result<(), MigrationError> {
        let mut batch = WriteBatch::new();
        for key in deletes {
            batch.delete(key);
        }
        for (key, value) in puts {
            batch.put(key, value);
        }
        self.0.commit_blocking(batch).map_err(to_migration_error)
    }
}

/// What [`open_and_migrate`] found and did, for `reconciled migrate` and the
/// start-up log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Where the database stood before anything ran.
    pub before: Status,
    /// The migrations applied, in order (with `dry_run`: none).
    pub applied: Vec<MigrationInfo>,
    /// The backup taken before the first migration, if one was.
    pub backup: Option<PathBuf>,
    /// True if nothing was written because a dry run was asked for.
    pub dry_run: bool,
}

impl MigrationReport {
    /// The schema version of the database now.
    pub fn version_now(&self) -> u32 {
        self.applied
            .last()
            .map_or(self.before.current_version, |m| m.version)
    }
}

/// Opens the store in `dir` and brings its schema up to date.
///
/// Refuses a database newer than this binary's migrations, and one that
/// holds part of an unfinished `reconciled store copy`. When migrations
/// are pending it first backs the store up to
/// `<dir>/backups/pre-migration-v{from}-{unix seconds}` (skipped for a store
/// that holds no record at all: there is nothing to lose), then applies them.
/// With `dry_run` it only reports what would run. Blocking: call it before
/// starting the runtime or from `spawn_blocking`.
pub fn open_and_migrate(
    dir: &Path,
    options: SledOptions,
    dry_run: bool,
) -> Result<(SledStore, MigrationReport), StoreError> {
    let store = SledStore::open(dir, options)?;
    let report = migrate(&store, dir, dry_run)?;
    Ok((store, report))
}

/// The lock one replica migrates an etcd store under (a cluster key).
const MIGRATION_LOCK: &[u8] = b"locks/migrate";

/// How long the migration lock outlives a replica that died holding it.
const MIGRATION_LOCK_TTL: Duration = Duration::from_secs(10);

/// Opens the etcd store of `options` and brings its schema up to date,
/// like [`open_and_migrate`]: the schema version lives in etcd, one
/// replica migrates under an etcd lock while the others wait for it, and
/// the backup before migrating is a sled store under
/// `<backup_dir>/backups/` (copy it back with `reconciled store copy`).
pub fn open_and_migrate_etcd(
    options: EtcdOptions,
    backup_dir: &Path,
    dry_run: bool,
) -> Result<(EtcdStore, MigrationReport), StoreError> {
    let store = EtcdStore::open(options)?;
    refuse_partial_copy(&store)?;
    let status = Runner::new(builtin())?.status(&MigrationAdapter(&store))?;
    if status.is_up_to_date() || dry_run {
        let report = MigrationReport {
            before: status,
            applied: Vec::new(),
            backup: None,
            dry_run,
        };
        return Ok((store, report));
    }
    info!("Waiting for the store's migration lock.");
    let held = store.hold_lock_blocking(MIGRATION_LOCK, MIGRATION_LOCK_TTL)?;
    // Another replica may have migrated while this one waited.
    let report = migrate(&store, backup_dir, false);
    drop(held);
    Ok((store, report?))
}

/// Brings the schema of an open `store` up to date (see
/// [`open_and_migrate`]); backups go under `<backup_dir>/backups/`.
pub fn migrate(
    store: &dyn Store,
    backup_dir: &Path,
    dry_run: bool,
) -> Result<MigrationReport, StoreError> {
    let dir = backup_dir;
    refuse_partial_copy(store)?;
    let runner = Runner::new(builtin())?;
    let adapter = MigrationAdapter(store);
    let before = runner.status(&adapter)?;
    let mut report = MigrationReport {
        before,
        applied: Vec::new(),
        backup: None,
        dry_run,
    };
    if report.before.is_up_to_date() || dry_run {
        return Ok(report);
    }

    let from = report.before.current_version;
    let backup = takes_backup(store)?.then(|| backup_path(dir, from));
    let ran = runner.run(&adapter, || match &backup {
        Some(path) => {
            info!(path = %path.display(), from, "Backing up the store before migrating.");
            store.backup_to(path).map_err(|e| MigrationError::Backup {
                message: e.to_string(),
            })
        }
        None => Ok(()),
    })?;
    report.applied = report
        .before
        .pending
        .iter()
        .filter(|m| ran.contains(&m.version))
        .copied()
        .collect();
    report.backup = backup;
    info!(
        from,
        to = report.version_now(),
        applied = ran.len(),
        "Store schema migrated."
    );
    Ok(report)
}

/// Whether migrating `store` backs it up first: a store that holds no
/// record at all has nothing to lose.
pub fn takes_backup(store: &dyn Store) -> Result<bool, StoreError> {
    Ok(!store.scan(&[], None, 1)?.is_empty())
}

/// Fails with [`StoreError::PartialCopy`] if `store` holds part of an
/// unfinished `reconciled store copy` (see [`crate::store::copy_store`]).
fn refuse_partial_copy(store: &dyn Store) -> Result<(), StoreError> {
    match store.get(keys::copy_incomplete_key())? {
        Some(_) => Err(StoreError::PartialCopy),
        None => Ok(()),
    }
}

fn backup_path(dir: &Path, from: u32) -> PathBuf {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let base = dir
        .join("backups")
        .join(format!("pre-migration-v{from}-{now}"));
    // Two migrations of the same store within a second get distinct paths.
    let mut path = base.clone();
    let mut attempt = 1;
    while path.exists() {
        attempt += 1;
        path = base.with_extension(attempt.to_string());
    }
    path
}

#[cfg(test)]
mod tests;
