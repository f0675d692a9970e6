use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use crate::layout::{NEXT_TENANT_ID_KEY, SCHEMA_VERSION_KEY, encode_version};
use crate::{Migration, MigrationError, MigrationInfo, MigrationStore, Record, Runner, builtin};

/// An in-memory database that also records every `apply` call.
#[derive(Default)]
struct Fixture {
    data: RefCell<BTreeMap<Vec<u8>, Vec<u8>>>,
    applies: RefCell<Vec<Vec<Vec<u8>>>>,
}

impl Fixture {
    fn at_version(version: u32) -> Self {
        let fixture = Self::default();
        fixture
            .data
            .borrow_mut()
            .insert(SCHEMA_VERSION_KEY.to_vec(), encode_version(version));
        fixture
    }

    fn with(self, key: &[u8], value: &[u8]) -> Self {
        self.data.borrow_mut().insert(key.to_vec(), value.to_vec());
        self
    }

    fn value(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.data.borrow().get(key).cloned()
    }

    fn version(&self) -> Option<Vec<u8>> {
        self.value(SCHEMA_VERSION_KEY)
    }
}

impl MigrationStore for Fixture {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MigrationError> {
        Ok(self.value(key))
    }

    fn scan_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Record>, MigrationError> {
        let data = self.data.borrow();
        Ok(data
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(k, _)| after.is_none_or(|after| k.as_slice() > after))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn apply(&self, puts: Vec<Record>, deletes: Vec<Vec<u8>>) -> Result<(), MigrationError> {
        let mut data = self.data.borrow_mut();
        let mut touched = Vec::new();
        for key in deletes {
            data.remove(&key);
            touched.push(key);
        }
        for (key, value) in puts {
            touched.push(key.clone());
            data.insert(key, value);
        }
        self.applies.borrow_mut().push(touched);
        Ok(())
    }
}

const OLD_PREFIX: &[u8] = b"\x01old/";
const NEW_PREFIX: &[u8] = b"\x01new/";
const RUNS_KEY: &[u8] = b"\x00test_runs";

/// Test-only 0002: moves every `old/` record to `new/` in two batches (puts,
/// then deletes) and counts its runs, so a re-run would show.
fn move_old_to_new(store: &dyn MigrationStore) -> Result<(), MigrationError> {
    let old = store.scan_prefix(OLD_PREFIX)?;
    let runs = store.get(RUNS_KEY)?.map_or(0, |v| v[0]) + 1;
    let mut puts: Vec<_> = old
        .iter()
        .map(|(k, v)| ([NEW_PREFIX, &k[OLD_PREFIX.len()..]].concat(), v.clone()))
        .collect();
    puts.push((RUNS_KEY.to_vec(), vec![runs]));
    store.apply(puts, Vec::new())?;
    store.apply(Vec::new(), old.into_iter().map(|(k, _)| k).collect())
}

fn fails(_: &dyn MigrationStore) -> Result<(), MigrationError> {
    Err(MigrationError::Data {
        message: "record x is odd".into(),
    })
}

/// The first built-in migration only: the runner tests add their own 0002.
fn layout_only() -> Vec<Migration> {
    builtin().into_iter().take(1).collect()
}

fn with_extra(
    version: u32,
    name: &'static str,
    apply: fn(&dyn MigrationStore) -> Result<(), MigrationError>,
) -> Runner {
    let mut migrations = layout_only();
    migrations.push(Migration {
        version,
        name,
        apply,
    });
    Runner::new(migrations).expect("contiguous")
}

fn no_backup() -> Result<(), MigrationError> {
    Ok(())
}

#[test]
fn builtin_migrations_are_numbered_from_one_without_gaps() {
    let runner = Runner::new(builtin()).expect("builtin list is valid");
    assert_eq!(runner.latest_version(), builtin().len() as u32);
}

#[test]
fn a_gap_in_the_numbering_is_rejected() {
    let mut migrations = layout_only();
    migrations.push(Migration {
        version: 3,
        name: "skips two",
        apply: fails,
    });
    let err = Runner::new(migrations).expect_err("gap");
    assert_eq!(
        err,
        MigrationError::InvalidSequence {
            position: 1,
            expected: 2,
            found: 3
        }
    );
}

#[test]
fn an_empty_database_gets_the_layout_from_0001() {
    let db = Fixture::default();
    let runner = Runner::new(layout_only()).expect("valid");
    assert_eq!(runner.run(&db, no_backup), Ok(vec![1]));
    assert_eq!(db.version(), Some(vec![0, 0, 0, 1]));
    assert_eq!(
        db.value(NEXT_TENANT_ID_KEY),
        Some(1u64.to_be_bytes().to_vec())
    );
    // The counter and the version went in one atomic write.
    assert_eq!(db.applies.borrow().len(), 1);
}

#[test]
fn create_layout_keeps_an_existing_tenant_counter() {
    let db = Fixture::default().with(NEXT_TENANT_ID_KEY, &7u64.to_be_bytes());
    let runner = Runner::new(layout_only()).expect("valid");
    assert_eq!(runner.run(&db, no_backup), Ok(vec![1]));
    assert_eq!(
        db.value(NEXT_TENANT_ID_KEY),
        Some(7u64.to_be_bytes().to_vec())
    );
}

#[test]
fn a_later_migration_runs_once_and_records_its_version_with_its_last_batch() {
    let db = Fixture::at_version(1)
        .with(NEXT_TENANT_ID_KEY, &3u64.to_be_bytes())
        .with(b"\x01old/a", b"1")
        .with(b"\x01old/b", b"2");
    let runner = with_extra(2, "move old to new", move_old_to_new);

    assert_eq!(runner.run(&db, no_backup), Ok(vec![2]));
    assert_eq!(db.version(), Some(vec![0, 0, 0, 2]));
    assert_eq!(db.scan_prefix(OLD_PREFIX), Ok(vec![]));
    assert_eq!(db.value(b"\x01new/a"), Some(b"1".to_vec()));
    assert_eq!(db.value(b"\x01new/b"), Some(b"2".to_vec()));
    let applies = db.applies.borrow().clone();
    assert_eq!(applies.len(), 2, "first batch, then last batch + version");
    assert!(applies[1].contains(&SCHEMA_VERSION_KEY.to_vec()));
    assert!(applies[1].contains(&b"\x01old/a".to_vec()));

    assert_eq!(runner.run(&db, no_backup), Ok(vec![]));
    assert_eq!(db.value(RUNS_KEY), Some(vec![1]), "0002 ran exactly once");
}

#[test]
fn a_database_newer_than_every_known_migration_is_refused() {
    let db = Fixture::at_version(99);
    let runner = Runner::new(builtin()).expect("valid");
    let backups = Cell::new(0);

    let err = runner.status(&db).expect_err("too new");
    assert_eq!(
        err,
        MigrationError::SchemaTooNew {
            found: 99,
            newest_known: builtin().len() as u32
        }
    );
    assert!(err.to_string().contains("run a newer reconciled"), "{err}");
    let run = runner.run(&db, || {
        backups.set(backups.get() + 1);
        Ok(())
    });
    assert_eq!(run, Err(err));
    assert_eq!(backups.get(), 0);
    assert!(db.applies.borrow().is_empty());
}

#[test]
fn status_lists_applied_and_pending_migrations() {
    let runner = with_extra(2, "move old to new", move_old_to_new);
    let create = MigrationInfo {
        version: 1,
        name: "create layout",
    };
    let moved = MigrationInfo {
        version: 2,
        name: "move old to new",
    };

    let fresh = runner.status(&Fixture::default()).expect("status");
    assert_eq!((fresh.current_version, fresh.latest_version), (0, 2));
    assert_eq!(
        (fresh.applied, fresh.pending),
        (vec![], vec![create, moved])
    );

    let half = runner.status(&Fixture::at_version(1)).expect("status");
    assert_eq!((half.applied, half.pending), (vec![create], vec![moved]));

    let done = runner.status(&Fixture::at_version(2)).expect("status");
    assert!(done.is_up_to_date());
    assert_eq!(done.applied, vec![create, moved]);
}

#[test]
fn the_backup_runs_once_before_pending_migrations_and_never_otherwise() {
    let runner = with_extra(2, "move old to new", move_old_to_new);
    let db = Fixture::default();
    let backups = Cell::new(0);
    let backup = || {
        assert!(
            db.applies.borrow().is_empty(),
            "backup runs before any write"
        );
        backups.set(backups.get() + 1);
        Ok(())
    };
    assert_eq!(runner.run(&db, backup), Ok(vec![1, 2]));
    assert_eq!(backups.get(), 1);

    let again = runner.run(&db, || {
        backups.set(backups.get() + 1);
        Ok(())
    });
    assert_eq!(again, Ok(vec![]));
    assert_eq!(backups.get(), 1);
}

#[test]
fn a_failed_backup_migrates_nothing() {
    let db = Fixture::default();
    let runner = Runner::new(builtin()).expect("valid");
    let err = runner
        .run(&db, || {
            Err(MigrationError::Backup {
                message: "disk full".into(),
            })
        })
        .expect_err("backup failed");
    assert!(matches!(err, MigrationError::Backup { .. }));
    assert!(db.applies.borrow().is_empty());
}

#[test]
fn a_failed_migration_keeps_earlier_ones_and_names_the_version_reached() {
    let db = Fixture::default();
    let runner = with_extra(2, "always fails", fails);
    let err = runner.run(&db, no_backup).expect_err("0002 fails");
    assert!(
        matches!(
            err,
            MigrationError::Failed {
                version: 2,
                previous: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("stays at version 1"), "{err}");
    assert_eq!(db.version(), Some(vec![0, 0, 0, 1]));
}

#[test]
fn a_damaged_version_record_is_reported() {
    let db = Fixture::default().with(SCHEMA_VERSION_KEY, b"\x01");
    let runner = Runner::new(builtin()).expect("valid");
    assert_eq!(
        runner.status(&db),
        Err(MigrationError::CorruptVersion { len: 1 })
    );
}

#[test]
fn an_empty_database_is_brought_to_the_latest_version() {
    let db = Fixture::default();
    let runner = Runner::new(builtin()).expect("valid");
    let every: Vec<u32> = (1..=runner.latest_version()).collect();
    assert_eq!(runner.run(&db, no_backup), Ok(every));
    assert_eq!(
        db.version(),
        Some(encode_version(runner.latest_version())),
        "{:?}",
        db.applies.borrow()
    );
    assert_eq!(runner.run(&db, no_backup), Ok(vec![]));
}

#[test]
fn scan_prefix_reads_every_page_in_key_order() {
    let db = Fixture::default()
        .with(b"\x01a", b"before")
        .with(b"\x03", b"after");
    for i in 0..2_500u32 {
        db.data
            .borrow_mut()
            .insert([b"\x02".as_slice(), &i.to_be_bytes()].concat(), vec![1]);
    }
    let records = db.scan_prefix(b"\x02").expect("scans");
    assert_eq!(records.len(), 2_500);
    assert!(records.windows(2).all(|pair| pair[0].0 < pair[1].0));
    assert_eq!(
        db.scan_page(b"\x02", Some(&records[2_498].0), 10),
        Ok(vec![records[2_499].clone()])
    );
}
