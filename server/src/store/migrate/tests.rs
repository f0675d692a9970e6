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

const BINARY_RECORDS: MigrationInfo = MigrationInfo {
    version: 2,
    name: "binary records",
};

/// Every migration this build ships, in order.
const ALL: [MigrationInfo; 2] = [CREATE_LAYOUT, BINARY_RECORDS];

#[test]
fn a_new_store_is_migrated_without_a_backup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, report) = open_and_migrate(dir.path(), options(), false).expect("migrate");
    assert_eq!(report.before.current_version, 0);
    assert_eq!(report.applied, ALL);
    assert_eq!((report.backup.clone(), report.version_now()), (None, 2));
    assert_eq!(
        store.get(schema_version_key()).expect("get"),
        Some(2u32.to_be_bytes().to_vec())
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
    assert_eq!(report.applied, ALL);
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
    assert_eq!(report.before.pending, ALL);
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

/// Migration 0002 has its own frozen copy of the JSON shape: records written
/// as JSON by the server's own (serde) types, at schema version 1, come out
/// of the migration as binary records that the server decodes to the same
/// values.
#[test]
fn json_records_of_schema_version_1_decode_as_the_same_records_after_migrating() {
    use std::sync::Arc;

    use crate::engine::exec::{RetryPolicy, StoredSpec, TypeSpec};
    use crate::engine::schema::TypeSchema;
    use crate::graph::{CurrentItem, InFlight, Item, OperationKind};
    use crate::store::keys::{
        current_item_key, intended_item_key, tenant_record_key, type_spec_key,
    };
    use crate::tenant::record::{StoredIntended, TenantRecord, decode, samples};

    let tenant = samples::tenant_with_everything_set();
    let id = tenant.id;
    // JSON records predate the mark of an item gone unless its operation
    // applied: version 1 never stored it.
    let full = CurrentItem {
        gone_unless_applied: false,
        ..samples::current_with_everything_set()
    };
    let applied = full.applied.clone().expect("applied");
    // Large enough that the current record was stored in chunks.
    let mut big = (*applied).clone();
    big.identity = crate::graph::ItemRef::new(big.item_type(), "big");
    big.properties
        .insert("blob".into(), "x".repeat(50_000).into());
    let big = Arc::new(big);
    let mut modifying = CurrentItem::created(big.clone(), 2);
    let mut in_flight = InFlight::new(OperationKind::Modify, "7-aa-1".into(), 1, 3, 5, 60_000);
    in_flight.target = Some(big.clone());
    modifying.in_flight = Some(Box::new(in_flight));
    let intended = StoredIntended {
        item: (*applied).clone(),
        generation: 3,
    };
    let mut spec = TypeSpec::new("t1");
    spec.retry = RetryPolicy::Random {
        min_ms: 3,
        max_ms: 8,
    };
    spec.schema = Some(TypeSchema::stored(serde_json::json!({"type": "object"})));
    let spec = StoredSpec {
        spec,
        epoch: 4,
        held_by: None,
    };
    let item_key = |item: &Item| (item.item_type().clone(), item.name().clone());
    let (applied_type, applied_name) = item_key(&applied);

    let dir = tempfile::tempdir().expect("tempdir");
    // One store throughout: a sled store reopened in-process right after
    // it was dropped may still find its file lock held (docs/testing.md).
    let raw = std::sync::Arc::new(SledStore::open(dir.path(), options()).expect("open"));
    {
        let store = crate::store::ChunkedValues::new(raw.clone()).expect("chunked");
        let mut batch = WriteBatch::new();
        batch.put(schema_version_key(), 1u32.to_be_bytes());
        batch.put(next_tenant_id_key(), (id + 1).to_be_bytes());
        batch.put(tenant_record_key(id), json(&tenant));
        batch.put(
            intended_item_key(id, &applied_type, &applied_name),
            json(&intended),
        );
        batch.put(
            current_item_key(id, &applied_type, &applied_name),
            json(&full),
        );
        batch.put(
            current_item_key(id, big.item_type(), big.name()),
            json(&modifying),
        );
        batch.put(type_spec_key(id, "t1"), json(&spec));
        store
            .commit_blocking(batch)
            .expect("version 1 records written");
    }

    let report = crate::store::migrate(raw.as_ref(), dir.path(), false).expect("migrates");
    assert_eq!(report.applied, vec![BINARY_RECORDS]);
    // A new view: the chunked keys changed under the first one.
    let store = crate::store::ChunkedValues::new(raw.clone()).expect("chunked");
    let read = |key: Vec<u8>| {
        let value = store.get(&key).expect("reads").expect("still stored");
        assert_ne!(value.first(), Some(&b'{'), "binary now");
        (key, value)
    };
    let (key, value) = read(tenant_record_key(id));
    // A version 1 record never kept its event log's bytes: the server
    // counts them when the tenant loads.
    assert_eq!(
        decode::<TenantRecord>(&key, &value).expect("decodes"),
        TenantRecord {
            history_bytes: None,
            ..tenant
        }
    );
    let (key, value) = read(intended_item_key(id, &applied_type, &applied_name));
    assert_eq!(
        decode::<StoredIntended>(&key, &value).expect("decodes"),
        intended
    );
    let (key, value) = read(current_item_key(id, &applied_type, &applied_name));
    assert_eq!(decode::<CurrentItem>(&key, &value).expect("decodes"), full);
    let (key, value) = read(current_item_key(id, big.item_type(), big.name()));
    assert_eq!(
        decode::<CurrentItem>(&key, &value).expect("decodes"),
        modifying
    );
    let (key, value) = read(type_spec_key(id, "t1"));
    assert_eq!(decode::<StoredSpec>(&key, &value).expect("decodes"), spec);
}

/// Today's JSON encoding of the server's record types (schema version 1).
fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("JSON encodes")
}
