//! Acknowledged writes survive restarts and SIGKILL.

use std::time::Duration;

use rand::Rng;
use reconciled_tests::api::{create_tenant, item, reconciler, submit};
use reconciled_tests::proto::v1;
use reconciled_tests::{ServerOptions, ServerProcess};
use serde_json::json;

fn intent(count: usize) -> Vec<v1::Item> {
    (0..count)
        .map(|i| item("t", &format!("n{i:04}"), json!({"i": i})))
        .collect()
}

/// A server with tenant `tenant` holding `intent(count)`: the server, a
/// channel to it and the tenant's token.
async fn server_with_intent(
    tenant: &str,
    count: usize,
) -> (ServerProcess, tonic::transport::Channel, String) {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("starts");
    let channel = server.channel().await.expect("connects");
    let token = create_tenant(&channel, &server.admin_token(), tenant).await;
    reconciler(&channel, &token)
        .submit_intent(submit(tenant, intent(count)))
        .await
        .expect("stored");
    (server, channel, token)
}

/// Asserts that `tenant` on `server` holds its first intent, of `count`
/// items.
async fn assert_first_intent_kept(server: &ServerProcess, token: &str, tenant: &str, count: usize) {
    let channel = server.channel().await.expect("connects");
    let (generation, names) = intended_names(&channel, token, tenant).await;
    assert_eq!(generation, 1);
    assert_eq!(names.len(), count);
}

/// The intended graph of `tenant` (one page of up to 5,000 items).
async fn intended_graph(
    channel: &tonic::transport::Channel,
    token: &str,
    tenant: &str,
) -> v1::GetGraphResponse {
    reconciler(channel, token)
        .get_graph(v1::GetGraphRequest {
            tenant: tenant.into(),
            view: v1::GraphView::Intended.into(),
            page_size: 5_000,
            ..Default::default()
        })
        .await
        .expect("graph")
        .into_inner()
}

async fn intended_names(
    channel: &tonic::transport::Channel,
    token: &str,
    tenant: &str,
) -> (u64, Vec<String>) {
    let graph = intended_graph(channel, token, tenant).await;
    let names = graph
        .intended
        .iter()
        .filter_map(|i| i.item.as_ref())
        .map(|i| i.name.clone())
        .collect();
    (graph.generation, names)
}

#[tokio::test]
async fn intents_survive_a_graceful_restart() {
    let (mut server, _, token) = server_with_intent("acme", 50).await;
    server.restart().await.expect("restarts");
    assert_first_intent_kept(&server, &token, "acme", 50).await;
}

#[tokio::test]
async fn every_acknowledged_intent_survives_sigkill_at_random_moments() {
    let mut server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("starts");
    let channel = server.channel().await.expect("connects");
    let token = create_tenant(&channel, &server.admin_token(), "acme").await;
    let mut acknowledged = 0usize;
    for round in 0..4 {
        let channel = server.channel().await.expect("connects");
        let writer_token = token.clone();
        let start = acknowledged;
        let (acks, mut acked) = tokio::sync::watch::channel(start);
        let writer = tokio::spawn(async move {
            let mut client = reconciler(&channel, &writer_token);
            let mut count = start;
            loop {
                count += 1;
                match client.submit_intent(submit("acme", intent(count))).await {
                    Ok(_) => {
                        let _ = acks.send(count);
                    }
                    Err(_) => return,
                }
            }
        });
        // Let at least one write through, then kill at a random moment.
        acked
            .wait_for(|count| *count > start)
            .await
            .expect("writer acknowledged a write");
        let pause = rand::rng().random_range(0..150);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        server.kill9().expect("SIGKILL");
        let _ = writer.await;
        acknowledged = *acked.borrow();

        server.start_again().await.expect("restarts after SIGKILL");
        let channel = server.channel().await.expect("connects");
        let (generation, names) = intended_names(&channel, &token, "acme").await;
        assert!(
            names.len() >= acknowledged && names.len() <= acknowledged + 1,
            "round {round}: {acknowledged} items acknowledged, {} stored",
            names.len()
        );
        assert_eq!(
            generation as usize,
            names.len(),
            "one generation per accepted submit"
        );
        acknowledged = names.len();
    }
}

#[tokio::test]
async fn a_tenant_whose_records_cannot_be_read_is_quarantined_and_the_others_are_served() {
    use reconciled::store::{SledOptions, SledStore, Store, WriteBatch, keys};
    let mut server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("starts");
    let channel = server.channel().await.expect("connects");
    let admin = server.admin_token();
    let good = create_tenant(&channel, &admin, "good").await;
    create_tenant(&channel, &admin, "bad").await;
    reconciler(&channel, &good)
        .submit_intent(submit("good", intent(3)))
        .await
        .expect("stored");
    server.terminate().await.expect("stops");

    // Corrupt the bad tenant's record, as a torn disk or a bad restore would.
    {
        let store = SledStore::open(&server.data_dir(), SledOptions::default()).expect("opens");
        let id = store
            .get(&keys::tenant_name_key("bad"))
            .expect("reads")
            .and_then(|bytes| {
                bytes
                    .get(..8)
                    .map(|b| u64::from_be_bytes(b.try_into().unwrap_or_default()))
            })
            .expect("the bad tenant is indexed");
        let mut batch = WriteBatch::new();
        batch.put(keys::tenant_record_key(id), b"\xffnot a record".to_vec());
        store.commit_blocking(batch).expect("writes");
    }

    server
        .start_again()
        .await
        .expect("starts with a corrupt tenant");
    let channel = server.channel().await.expect("connects");
    let (_, names) = intended_names(&channel, &good, "good").await;
    assert_eq!(names.len(), 3, "the other tenant is served");
    let refused = reconciled_tests::api::tenants(&channel, &admin)
        .get_tenant(v1::GetTenantRequest { name: "bad".into() })
        .await
        .expect_err("quarantined");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("quarantined"), "{refused:?}");
    // ListTenants shows it, in name order, with why; pages go across it.
    let listed = reconciled_tests::api::tenants(&channel, &admin)
        .list_tenants(v1::ListTenantsRequest::default())
        .await
        .expect("lists")
        .into_inner()
        .tenants;
    let shown: Vec<(&str, bool)> = listed
        .iter()
        .map(|t| (t.name.as_str(), !t.quarantine_error.is_empty()))
        .collect();
    assert_eq!(shown, [("bad", true), ("good", false)], "{listed:?}");
    assert!(
        listed[0].quarantine_error.contains("unreadable"),
        "{:?}",
        listed[0].quarantine_error
    );
    let first_page = reconciled_tests::api::tenants(&channel, &admin)
        .list_tenants(v1::ListTenantsRequest {
            page_size: 1,
            ..Default::default()
        })
        .await
        .expect("lists")
        .into_inner();
    assert_eq!(first_page.tenants[0].name, "bad");
    let second_page = reconciled_tests::api::tenants(&channel, &admin)
        .list_tenants(v1::ListTenantsRequest {
            page_size: 1,
            page_token: first_page.next_page_token,
        })
        .await
        .expect("lists")
        .into_inner();
    assert_eq!(second_page.tenants[0].name, "good");
    assert!(second_page.next_page_token.is_empty());

    // The fleet stream lists it with why, and sees it go when it is deleted.
    let mut fleet = reconciled_tests::api::tenants(&channel, &admin)
        .watch_fleet(v1::WatchFleetRequest { start_revision: 0 })
        .await
        .expect("the fleet stream opens")
        .into_inner();
    let mut listed = Vec::new();
    loop {
        match next_fleet(&mut fleet).await {
            v1::watch_fleet_response::Message::Events(group) => listed.extend(group.events),
            v1::watch_fleet_response::Message::Synced(_) => break,
            v1::watch_fleet_response::Message::Bookmark(_) => {}
        }
    }
    let shown: Vec<(&str, bool)> = listed
        .iter()
        .map(|t| (t.tenant.as_str(), !t.quarantine_error.is_empty()))
        .collect();
    assert_eq!(shown, [("bad", true), ("good", false)], "{listed:?}");

    reconciled_tests::api::tenants(&channel, &admin)
        .delete_tenant(v1::DeleteTenantRequest { name: "bad".into() })
        .await
        .expect("a quarantined tenant can be deleted");
    let gone = loop {
        if let v1::watch_fleet_response::Message::Events(group) = next_fleet(&mut fleet).await
            && let Some(event) = group.events.into_iter().find(|e| e.tenant == "bad")
        {
            break event;
        }
    };
    assert!(gone.deleted, "{gone:?}");
    let gone = reconciled_tests::api::tenants(&channel, &admin)
        .get_tenant(v1::GetTenantRequest { name: "bad".into() })
        .await
        .expect_err("deleted");
    assert_eq!(gone.code(), tonic::Code::NotFound, "{gone:?}");
    // The name is free again, and a restart serves everything.
    create_tenant(&channel, &admin, "bad").await;
    server.restart().await.expect("restarts");
    let channel = server.channel().await.expect("connects");
    reconciled_tests::api::tenants(&channel, &admin)
        .get_tenant(v1::GetTenantRequest { name: "bad".into() })
        .await
        .expect("served");
}

/// The next message of a fleet stream, within a deadline.
async fn next_fleet(
    fleet: &mut tonic::Streaming<v1::WatchFleetResponse>,
) -> v1::watch_fleet_response::Message {
    tokio::time::timeout(Duration::from_secs(10), fleet.message())
        .await
        .expect("a fleet message within 10 s")
        .expect("the fleet stream is healthy")
        .and_then(|response| response.message)
        .expect("a message")
}

/// The id of tenant `name` in a stopped server's store.
fn tenant_id(store: &reconciled::store::SledStore, name: &str) -> u64 {
    use reconciled::store::{Store, keys};
    store
        .get(&keys::tenant_name_key(name))
        .expect("reads")
        .and_then(|bytes| bytes.get(..8).and_then(|b| b.try_into().ok()))
        .map(u64::from_be_bytes)
        .expect("the tenant is indexed")
}

/// Runs `reconciled repair ARGS` on `data_dir`; its stdout.
fn repair(data_dir: &std::path::Path, args: &[&str]) -> String {
    let output = std::process::Command::new(reconciled_tests::reconciled_binary())
        .arg("repair")
        .args(args)
        .env("RECONCILED_DATA_DIR", data_dir)
        .output()
        .expect("reconciled repair runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "reconciled repair {args:?} failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// One sample of a scrape of `--metrics-listen`.
async fn scrape_sample(addr: &str, name: &str) -> f64 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("metrics endpoint reachable");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("request sent");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("read");
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
}

#[tokio::test]
async fn a_quarantined_tenant_is_counted_and_reconciled_repair_brings_it_back_with_its_intent() {
    use reconciled::store::{SledOptions, SledStore, Store, WriteBatch, keys};
    let metrics = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        probe.local_addr().expect("address").to_string()
    };
    let mut server = ServerProcess::start(
        ServerOptions::default()
            .arg("--metrics-listen")
            .arg(&metrics),
    )
    .await
    .expect("starts");
    let channel = server.channel().await.expect("connects");
    let admin = server.admin_token();
    let old_token = create_tenant(&channel, &admin, "bad").await;
    reconciler(&channel, &old_token)
        .submit_intent(submit("bad", intent(3)))
        .await
        .expect("stored");
    server.terminate().await.expect("stops");

    // A torn tenant record and a torn intended item.
    {
        let store = SledStore::open(&server.data_dir(), SledOptions::default()).expect("opens");
        let id = tenant_id(&store, "bad");
        let mut batch = WriteBatch::new();
        batch.put(keys::tenant_record_key(id), b"\xffnot a record".to_vec());
        batch.put(
            keys::intended_item_key(id, "t", "n0001"),
            b"\x00\x01".to_vec(),
        );
        store.commit_blocking(batch).expect("writes");
    }
    server
        .start_again()
        .await
        .expect("starts with a corrupt tenant");
    assert_eq!(
        scrape_sample(&metrics, "reconciled_tenants_quarantined").await,
        1.0
    );
    server.terminate().await.expect("stops");

    // The report names the tenant and both records, and changes nothing.
    let report = repair(&server.data_dir(), &[]);
    assert!(
        report.contains("tenant \"bad\"") && report.contains("quarantined at start-up"),
        "{report}"
    );
    assert!(report.contains("the tenant record"), "{report}");
    assert!(report.contains("intended item t/n0001"), "{report}");
    assert_eq!(
        report,
        repair(&server.data_dir(), &[]),
        "a report changes nothing"
    );

    let repaired = repair(&server.data_dir(), &["--tenant", "bad", "--apply"]);
    assert!(repaired.contains("backup: "), "{repaired}");
    let token = repaired
        .lines()
        .find_map(|line| line.strip_prefix("new token for \"bad\""))
        .and_then(|rest| rest.rsplit(' ').next())
        .expect("a new token is printed")
        .to_owned();
    assert!(
        repair(&server.data_dir(), &[]).contains("1 tenant(s) with every record readable"),
        "the tenant reads cleanly after the repair"
    );

    server.start_again().await.expect("starts");
    let channel = server.channel().await.expect("connects");
    let (generation, names) = intended_names(&channel, &token, "bad").await;
    assert_eq!(generation, 1, "the generation comes back from the intent");
    assert_eq!(
        names,
        ["n0000", "n0002"],
        "the unreadable item had nothing applied: it left the intent"
    );
    let refused = reconciler(&channel, &old_token)
        .get_status(v1::GetStatusRequest {
            tenant: "bad".into(),
        })
        .await
        .expect_err("the old token is gone with the record");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert_eq!(
        scrape_sample(&metrics, "reconciled_tenants_quarantined").await,
        0.0
    );
    // The repaired tenant takes intents again.
    reconciler(&channel, &token)
        .submit_intent(submit("bad", intent(3)))
        .await
        .expect("stored");
}

/// Runs `reconciled store copy --from sled:FROM --to sled:TO`; with
/// `kill_after_first_batch`, kills it with SIGKILL as soon as it logs its
/// first batch copied. Returns what it printed.
fn store_copy(
    from: &std::path::Path,
    to: &std::path::Path,
    kill_after_first_batch: bool,
) -> String {
    use std::io::BufRead as _;
    let mut child = std::process::Command::new(reconciled_tests::reconciled_binary())
        .arg("store")
        .arg("copy")
        .arg("--from")
        .arg(format!("sled:{}", from.display()))
        .arg("--to")
        .arg(format!("sled:{}", to.display()))
        .env_remove("RECONCILED_DATA_DIR")
        .env("RECONCILED_LOG", "reconciled=debug")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("reconciled store copy runs");
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut seen = String::new();
    for line in std::io::BufReader::new(stderr).lines() {
        let line = line.expect("reads stderr");
        if kill_after_first_batch && line.contains("Copied a batch of records") {
            child.kill().expect("SIGKILL");
            child.wait().expect("reaped");
            return seen;
        }
        seen.push_str(&line);
        seen.push('\n');
    }
    let output = child.wait_with_output().expect("reaped");
    assert!(
        !kill_after_first_batch,
        "the copy ended before its first batch was logged: {seen}"
    );
    assert!(output.status.success(), "the copy failed: {seen}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Puts the store in `copy` in place of `server`'s (which goes to `aside`).
fn swap_store_in(server: &ServerProcess, copy: &std::path::Path, aside: &std::path::Path) {
    let db = server.data_dir().join("db");
    if db.exists() {
        std::fs::rename(&db, aside).expect("moves the store aside");
    }
    std::fs::rename(copy.join("db"), &db).expect("moves the copy in");
}

/// A `reconciled store copy` killed midway (a restore of a backup cut off
/// by a reboot or a timeout) leaves part of the records in its
/// destination. A server started on it must refuse, saying so, rather
/// than serve a tenant with part of its intent (and delete, through its
/// agents, what the missing part held); a complete copy then serves
/// everything.
#[tokio::test]
async fn a_server_refuses_the_store_of_an_interrupted_store_copy() {
    let (mut server, _, token) = server_with_intent("acme", 3_000).await;
    server.terminate().await.expect("stops");

    let scratch = tempfile::tempdir().expect("temp dir");
    let original = scratch.path().join("original");
    std::fs::create_dir(&original).expect("mkdir");
    let partial = scratch.path().join("partial");
    store_copy(&server.data_dir(), &partial, true);
    swap_store_in(&server, &partial, &original.join("db"));

    let (ok, status) = {
        let output = std::process::Command::new(reconciled_tests::reconciled_binary())
            .args(["migrate", "--status", "--data-dir"])
            .arg(server.data_dir())
            .output()
            .expect("runs");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr),
        )
    };
    assert!(!ok, "migrate --status refuses a partial copy: {status}");
    assert!(status.contains("store copy"), "{status}");
    let refused = server.start_again().await;
    assert!(
        refused.is_err(),
        "the server must not serve the records of an interrupted copy"
    );
    assert!(
        server.log_tail().contains("store copy"),
        "the log says why: {}",
        server.log_tail()
    );

    // Emptied and copied again, whole: everything is there.
    std::fs::remove_dir_all(server.data_dir().join("db")).expect("empties the partial copy");
    let whole = scratch.path().join("whole");
    let printed = store_copy(&original, &whole, false);
    assert!(printed.starts_with("copied "), "{printed}");
    swap_store_in(&server, &whole, &scratch.path().join("unused"));
    server.start_again().await.expect("starts on a whole copy");
    assert_first_intent_kept(&server, &token, "acme", 3_000).await;
}

/// A tenant record rebuilt by `reconciled repair` takes a revision past
/// every revision the tenant had, not only past its last stored event
/// (commits without events, such as a token rotation, store none): a
/// watcher resuming from a revision it saw before the repair gets
/// REVISION_COMPACTED, never the events after it of revisions given a
/// second time.
#[tokio::test]
async fn a_rebuilt_tenant_record_never_gives_a_revision_twice() {
    use reconciled::store::{SledOptions, SledStore, Store, WriteBatch, keys};
    use reconciled_tests::api::rotate_token;
    use reconciled_tests::watch::{Watcher, watch_request};
    let (mut server, channel, mut token) = server_with_intent("bad", 3).await;
    let admin = server.admin_token();
    for _ in 0..3 {
        token = rotate_token(&channel, &admin, "bad").await;
    }
    let seen = intended_graph(&channel, &token, "bad").await.revision;
    server.terminate().await.expect("stops");
    {
        let store = SledStore::open(&server.data_dir(), SledOptions::default()).expect("opens");
        let id = tenant_id(&store, "bad");
        let mut batch = WriteBatch::new();
        batch.put(keys::tenant_record_key(id), b"\xffnot a record".to_vec());
        store.commit_blocking(batch).expect("writes");
    }
    let repaired = repair(&server.data_dir(), &["--tenant", "bad", "--apply"]);
    let token = repaired
        .lines()
        .find_map(|line| line.strip_prefix("new token for \"bad\""))
        .and_then(|rest| rest.rsplit(' ').next())
        .expect("a new token is printed")
        .to_owned();
    server.start_again().await.expect("starts");
    let channel = server.channel().await.expect("connects");
    for count in 4..=6 {
        reconciler(&channel, &token)
            .submit_intent(submit("bad", intent(count)))
            .await
            .expect("stored");
    }
    let now = intended_graph(&channel, &token, "bad").await.revision;
    assert!(now > seen, "revision {now} after the repair, {seen} before");
    let mut client = reconciler(&channel, &token);
    let status = match Watcher::open(&mut client, watch_request("bad", seen)).await {
        Ok(mut watcher) => match watcher.next().await {
            Err(status) => status,
            Ok(message) => panic!(
                "a resume from revision {seen}, seen before the repair, continued with \
                 {message:?}: the repair gave revisions up to {seen} a second time"
            ),
        },
        Err(status) => status,
    };
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert_eq!(
        reconciled_tests::api::error_reason(&status).as_deref(),
        Some("REVISION_COMPACTED"),
        "{status:?}"
    );
}
