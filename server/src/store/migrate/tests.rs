use reconciled_migrations::{MigrationError, MigrationInfo};

use crate::store::keys::{next_tenant_id_key, schema_version_key};
use crate::store::{SledOptions, SledStore, Store, StoreError, WriteBatch, open_and_migrate};

fn options() -> SledOptions {
    SledOptions {
        cache_capacity_bytes: 16 << 20,
        ..SledOptions::default()
    }
}

const CREATE_LAYOUT: MigrationInfo = MigrationInfo {
    version: 1,
    name: "create layout",
};

#[test]
fn a_new_store_is_migrated_without_a_backup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, report) = open_and_migrate(dir.path(), options(), false).expect("migrate");
    assert_eq!(report.before.current_version, 0);
    assert_eq!(report.applied, vec![CREATE_LAYOUT]);
    assert_eq!((report.backup.clone(), report.version_now()), (None, 1));
    assert_eq!(
        store.get(schema_version_key()).expect("get"),
        Some(1u32.to_be_bytes().to_vec())
    );
    assert_eq!(
        store.get(next_tenant_id_key()).expect("get"),
        Some(1u64.to_be_bytes().to_vec())
    );
    drop(store);

    let (_, again) = open_and_migrate(dir.path(), options(), false).expect("reopen");
    assert!(again.applied.is_empty() && again.before.is_up_to_date());
}

#[test]
fn a_store_with_data_is_backed_up_before_migrating() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = SledStore::open(dir.path(), options()).expect("open");
        let mut batch = WriteBatch::new();
        batch.put(b"\x01legacy".to_vec(), b"v".to_vec());
        store.commit_blocking(batch).expect("commit");
    }
    let (store, report) = open_and_migrate(dir.path(), options(), false).expect("migrate");
    let backup = report.backup.expect("a backup was taken");
    let name = backup.file_name().and_then(|n| n.to_str()).expect("name");
    assert!(
        backup.starts_with(dir.path().join("backups")) && name.starts_with("pre-migration-v0-"),
        "{backup:?}"
    );
    assert_eq!(report.applied, vec![CREATE_LAYOUT]);
    drop(store);

    let copy = SledStore::open(&backup, options()).expect("open backup");
    assert_eq!(
        copy.scan(b"", None, 10).expect("scan"),
        vec![(b"\x01legacy".to_vec(), b"v".to_vec())]
    );
}

#[test]
fn a_dry_run_reports_pending_migrations_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, report) = open_and_migrate(dir.path(), options(), true).expect("dry run");
    assert!(report.dry_run);
    assert_eq!(report.before.pending, vec![CREATE_LAYOUT]);
    assert!(report.applied.is_empty() && report.backup.is_none());
    assert_eq!(store.scan(b"", None, 10).expect("scan"), vec![]);
}

#[test]
fn a_store_from_a_newer_reconciled_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = SledStore::open(dir.path(), options()).expect("open");
        let mut batch = WriteBatch::new();
        batch.put(schema_version_key(), 99u32.to_be_bytes());
        store.commit_blocking(batch).expect("commit");
    }
    let err = open_and_migrate(dir.path(), options(), false).expect_err("too new");
    assert!(
        matches!(
            err,
            StoreError::Migration(MigrationError::SchemaTooNew { found: 99, .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("newer reconciled"), "{err}");
    assert!(!dir.path().join("backups").exists());
}
