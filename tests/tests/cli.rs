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
