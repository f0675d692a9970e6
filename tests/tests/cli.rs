//! The binary's subcommands: `migrate --status | --dry-run`, `migrate`, and
//! `check-config`, on real data directories.

use std::process::Command;

use reconciled_tests::reconciled_binary;

fn run(args: &[&str]) -> (bool, String) {
    let output = Command::new(reconciled_binary())
        .args(args)
        .env_remove("RECONCILED_DATA_DIR")
        .output()
        .expect("the binary runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

#[test]
fn migrate_status_and_dry_run_show_pending_migrations_and_change_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8 path");

    // A data directory that does not exist (a typo) is not created to be
    // reported on.
    for args in [
        &["migrate", "--status", "--data-dir", data][..],
        &["migrate", "--dry-run", "--data-dir", data],
        &["repair", "--data-dir", data],
    ] {
        let (ok, refused) = run(args);
        assert!(!ok, "{args:?}: {refused}");
        assert!(
            refused.contains("there is no data directory"),
            "{args:?}: {refused}"
        );
        assert!(!dir.path().join("data").exists(), "{args:?} created it");
    }

    std::fs::create_dir(dir.path().join("data")).expect("create the data directory");
    let (ok, status) = run(&["migrate", "--status", "--data-dir", data]);
    assert!(ok, "{status}");
    assert!(status.contains("schema version: 0"), "{status}");
    assert!(status.contains("would run: 0001 create layout"), "{status}");
    assert!(status.contains("0002 binary records"), "{status}");

    let (ok, dry) = run(&["migrate", "--dry-run", "--data-dir", data]);
    assert!(ok, "{dry}");
    assert!(
        dry.contains("would run: 0001"),
        "a dry run applies nothing: {dry}"
    );
    assert!(
        dry.contains("would take no backup first: the store holds no record"),
        "{dry}"
    );
    assert!(
        !status.contains("back up"),
        "--status says nothing of a backup: {status}"
    );

    let (ok, applied) = run(&["migrate", "--data-dir", data]);
    assert!(ok, "{applied}");
    assert!(applied.contains("ran: 0001 create layout"), "{applied}");
    assert!(applied.contains("0002 binary records"), "{applied}");

    let (ok, after) = run(&["migrate", "--status", "--data-dir", data]);
    assert!(ok, "{after}");
    assert!(after.contains("schema version: 2"), "{after}");
    assert!(after.contains("applied: 0001 create layout"), "{after}");
    assert!(after.contains("nothing to do"), "{after}");
}

#[test]
fn check_config_validates_a_file_and_names_unknown_keys() {
    let dir = tempfile::tempdir().expect("temp dir");
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "listen = \"127.0.0.1:6000\"\nmax_request_items = 500\n",
    )
    .expect("write");
    let (ok, effective) = run(&["check-config", "--config", good.to_str().expect("utf-8")]);
    assert!(ok, "{effective}");
    assert!(effective.contains("127.0.0.1:6000"), "{effective}");
    assert!(effective.contains("500"), "{effective}");

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "listen = \"127.0.0.1:6000\"\nno_such_setting = 1\n").expect("write");
    let (ok, error) = run(&["check-config", "--config", bad.to_str().expect("utf-8")]);
    assert!(!ok, "an unknown key is refused");
    assert!(error.contains("no_such_setting"), "{error}");
}

#[test]
fn a_database_newer_than_the_binary_is_refused() {
    use reconciled::store::{SledOptions, SledStore, Store, WriteBatch, keys};
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    {
        let store = SledStore::open(&data, SledOptions::default()).expect("store opens");
        let mut batch = WriteBatch::new();
        batch.put(
            keys::schema_version_key().to_vec(),
            99u32.to_be_bytes().to_vec(),
        );
        store.commit_blocking(batch).expect("committed");
    }
    let data = data.to_str().expect("utf-8 path");
    // sled releases the dropped store's file lock from a background thread:
    // retry while the binary still finds the directory locked.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (ok, text) = loop {
        let (ok, text) = run(&["migrate", "--status", "--data-dir", data]);
        if !text.contains("lock") || std::time::Instant::now() > deadline {
            break (ok, text);
        }
    };
    assert!(!ok, "a newer schema is refused: {text}");
    assert!(text.contains("99"), "the message names the version: {text}");
    let (ok, text) = run(&["--data-dir", data, "--listen", "127.0.0.1:0"]);
    assert!(!ok, "the server does not start on a newer schema: {text}");
}

/// Records of 1 KiB added to a store so that copying it (the backup before
/// a migration) takes long enough to be killed in the middle of.
const FILLER_RECORDS: u32 = 100_000;

/// A store at schema version 1 (0002 pending) in `data` holding
/// [`FILLER_RECORDS`] records besides its layout; returns how many
/// records it holds in all.
fn a_version_1_store_to_back_up(data: &std::path::Path) -> usize {
    use reconciled::store::{SledOptions, SledStore, Store, WriteBatch, keys};
    let store = SledStore::open(data, SledOptions::default()).expect("store opens");
    let mut batch = WriteBatch::new();
    batch.put(
        keys::schema_version_key().to_vec(),
        1u32.to_be_bytes().to_vec(),
    );
    batch.put(
        keys::next_tenant_id_key().to_vec(),
        1u64.to_be_bytes().to_vec(),
    );
    store.commit_blocking(batch).expect("committed");
    for chunk in 0..FILLER_RECORDS / 10_000 {
        let mut batch = WriteBatch::new();
        for index in chunk * 10_000..(chunk + 1) * 10_000 {
            let mut key = b"\x00test_filler\x00".to_vec();
            key.extend_from_slice(&index.to_be_bytes());
            batch.put(key, vec![b'x'; 1024]);
        }
        store.commit_blocking(batch).expect("committed");
    }
    count_records(&store)
}

/// Every record of `store`.
fn count_records(store: &dyn reconciled::store::Store) -> usize {
    let mut count = 0;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = store
            .scan_keys(&[], after.as_deref(), 10_000)
            .expect("scans");
        count += page.len();
        match page.last() {
            Some(last) if page.len() == 10_000 => after = Some(last.clone()),
            _ => return count,
        }
    }
}

/// How many records the sled store in `dir` holds.
fn records_in(dir: &std::path::Path) -> usize {
    use reconciled::store::{SledOptions, SledStore};
    let store = SledStore::open(dir, SledOptions::default())
        .unwrap_or_else(|error| panic!("{} opens: {error}", dir.display()));
    count_records(&store)
}

/// Waits until the backup under `<data>/backups/` has its sled log file:
/// the copy into it has begun.
fn wait_for_a_backup_being_written(data: &str) {
    let backups = std::path::Path::new(data).join("backups");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let writing = std::fs::read_dir(&backups).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|entry| entry.path().join("db").join("db").exists())
        });
        if writing {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no backup is being written under {}",
            backups.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// `reconciled migrate` on `data`, killed with SIGKILL once it has logged
/// that it backs the store up and the copy has begun (retried while the
/// directory is still locked by this process's store, which sled releases
/// in the background).
fn migrate_killed_during_its_backup(data: &str) {
    use std::io::BufRead as _;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut child = Command::new(reconciled_binary())
            .args(["migrate", "--data-dir", data])
            .env_remove("RECONCILED_DATA_DIR")
            .env("RECONCILED_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the binary runs");
        let stderr = child.stderr.take().expect("stderr is piped");
        let mut seen = String::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.expect("reads stderr");
            if line.contains("Backing up the store before migrating") {
                wait_for_a_backup_being_written(data);
                child.kill().expect("SIGKILL");
                child.wait().expect("reaped");
                return;
            }
            seen.push_str(&line);
            seen.push('\n');
        }
        let status = child.wait().expect("reaped");
        assert!(
            seen.contains("lock") && std::time::Instant::now() < deadline,
            "migrate ended ({status}) before backing up: {seen}"
        );
    }
}

/// A migration killed while it backs the store up leaves no partial copy
/// under a backup's name (an operator restoring it would lose records):
/// the copy is named complete only once it is whole, and the next
/// `migrate` backs up and migrates as if nothing had happened.
#[test]
fn a_migration_killed_during_its_backup_leaves_no_partial_backup() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data_dir = dir.path().join("data");
    let records = a_version_1_store_to_back_up(&data_dir);
    let data = data_dir.to_str().expect("utf-8 path");

    migrate_killed_during_its_backup(data);
    let backups = data_dir.join("backups");
    let mut interrupted = 0;
    for entry in std::fs::read_dir(&backups).expect("the backup was started") {
        let path = entry.expect("lists backups").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with(".incomplete") {
            interrupted += 1;
            continue;
        }
        let held = records_in(&path);
        if held < records {
            interrupted += 1;
        }
        assert_eq!(
            held,
            records,
            "{} is named as a backup but holds {held} of the store's {records} records",
            path.display()
        );
    }
    assert_eq!(
        interrupted, 1,
        "the kill came before the backup was complete"
    );

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let report = loop {
        let (ok, report) = run(&["migrate", "--data-dir", data]);
        if ok || !report.contains("lock") || std::time::Instant::now() > deadline {
            assert!(ok, "migrating again succeeds: {report}");
            break report;
        }
    };
    assert!(report.contains("ran: 0002 binary records"), "{report}");
    let backup = report
        .lines()
        .find_map(|line| line.strip_prefix("backup: "))
        .unwrap_or_else(|| panic!("a new backup is taken: {report}"));
    assert_eq!(records_in(std::path::Path::new(backup)), records);
    let (ok, status) = run(&["migrate", "--status", "--data-dir", data]);
    assert!(ok && status.contains("nothing to do"), "{status}");
}

#[test]
fn store_copy_refuses_a_source_that_is_not_a_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("backups/pre-migration-v1-typo");
    let restored = dir.path().join("restored");
    let from = format!("sled:{}", missing.display());
    let to = format!("sled:{}", restored.display());
    // A restore from a mistyped backup path: refused, and neither the
    // source nor the destination is created.
    let (ok, text) = run(&["store", "copy", "--from", &from, "--to", &to]);
    assert!(!ok, "a missing source is refused: {text}");
    assert!(
        text.contains("there is no store at") && text.contains("check --from"),
        "{text}"
    );
    assert!(!missing.exists(), "the source was created: {text}");
    assert!(!restored.exists(), "the destination was created: {text}");

    // A directory without a store in it (the backups folder itself).
    std::fs::create_dir_all(dir.path().join("backups")).expect("mkdir");
    let from = format!("sled:{}", dir.path().join("backups").display());
    let (ok, text) = run(&["store", "copy", "--from", &from, "--to", &to]);
    assert!(!ok, "a directory holding no store is refused: {text}");
    assert!(text.contains("there is no store at"), "{text}");
    assert!(!dir.path().join("backups/db").exists(), "{text}");
}

#[test]
fn a_data_directory_reached_through_a_symbolic_link_is_made_private_too() {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |path: &std::path::Path| {
        std::fs::metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    };
    // systemd's DynamicUser= makes /var/lib/reconciled a link to
    // /var/lib/private/reconciled; operators link data onto another disk.
    let dir = tempfile::tempdir().expect("temp dir");
    let target = dir.path().join("private/reconciled");
    std::fs::create_dir_all(&target).expect("mkdir");
    let link = dir.path().join("reconciled");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let token = target.join("admin.token");
    std::fs::write(&token, "rcda_0123456789abcdef0123456789abcdef\n").expect("write");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).expect("chmod");

    let (ok, text) = run(&["migrate", "--data-dir", link.to_str().expect("utf-8")]);
    assert!(ok, "{text}");
    assert_eq!(mode(&target), 0o700, "the data directory is private");
    assert_eq!(mode(&token), 0o600, "the admin token is private");
    assert_eq!(mode(&target.join("db")), 0o700, "the database is private");
    assert!(
        std::fs::symlink_metadata(&link)
            .expect("metadata")
            .file_type()
            .is_symlink(),
        "the link is left as it was"
    );
}

#[tokio::test]
async fn repair_takes_no_backup_for_a_mistyped_or_healthy_tenant() {
    use reconciled_tests::{ServerOptions, ServerProcess};
    let mut server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("server starts");
    let channel = server.channel().await.expect("connects");
    reconciled_tests::api::create_tenant(&channel, &server.admin_token(), "acme").await;
    drop(channel);
    let status = server.terminate().await.expect("stops");
    assert!(status.success(), "{status}");
    let data = server.data_dir();
    let data = data.to_str().expect("utf-8 path");
    let backups = std::path::Path::new(data).join("backups");
    let backups_taken = || {
        std::fs::read_dir(&backups)
            .map(|entries| entries.count())
            .unwrap_or(0)
    };

    // A name that is not there: refused, and nothing written (a backup is
    // a copy of the whole store, on a disk that may be short of room).
    let (ok, text) = run(&["repair", "--data-dir", data, "--tenant", "acne", "--apply"]);
    assert!(!ok, "{text}");
    assert!(text.contains("no tenant named \"acne\""), "{text}");
    assert_eq!(backups_taken(), 0, "a refused repair took a backup: {text}");

    // A tenant whose records all read: nothing to repair, nothing copied.
    let (ok, text) = run(&["repair", "--data-dir", data, "--tenant", "acme", "--apply"]);
    assert!(ok, "{text}");
    assert!(text.contains("nothing to repair"), "{text}");
    assert_eq!(
        backups_taken(),
        0,
        "a repair that did nothing took a backup: {text}"
    );

    // Removing one still backs up first.
    let (ok, text) = run(&["repair", "--data-dir", data, "--tenant", "acme", "--remove"]);
    assert!(ok, "{text}");
    assert!(text.contains("backup: "), "{text}");
    assert_eq!(backups_taken(), 1, "{text}");
}

#[test]
fn an_offline_command_refuses_a_data_directory_of_another_user() {
    use std::os::unix::fs::MetadataExt as _;
    // /proc/self belongs to the process's effective user.
    let this = std::fs::metadata("/proc/self").expect("/proc/self").uid();
    if this != 0 {
        eprintln!("not root: another user's directory cannot be made here");
        return;
    }
    // The service's directory (systemd's DynamicUser=, a container's user),
    // and root running `reconciled migrate` on it.
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let (ok, text) = run(&["migrate", "--data-dir", data.to_str().expect("utf-8")]);
    assert!(ok, "{text}");
    let service = 10_001;
    for entry in walk(&data) {
        std::os::unix::fs::lchown(&entry, Some(service), Some(service)).expect("chown");
    }
    let (ok, text) = run(&["migrate", "--data-dir", data.to_str().expect("utf-8")]);
    assert!(!ok, "root wrote into the service's directory: {text}");
    assert!(
        text.contains("belongs to uid 10001") && text.contains("setpriv --reuid 10001"),
        "{text}"
    );
    let root_owned: Vec<_> = walk(&data)
        .into_iter()
        .filter(|path| std::fs::symlink_metadata(path).expect("metadata").uid() != service)
        .collect();
    assert!(
        root_owned.is_empty(),
        "files of another user: {root_owned:?}"
    );
}

/// `dir` and every path below it.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = vec![dir.to_path_buf()];
    let mut at = 0;
    while at < found.len() {
        if found[at].is_dir() && !found[at].is_symlink() {
            let entries = std::fs::read_dir(&found[at]).expect("list");
            found.extend(entries.map(|entry| entry.expect("entry").path()));
        }
        at += 1;
    }
    found
}
