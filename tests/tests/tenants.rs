//! Tenants and authentication against the real binary: tokens, isolation,
//! listing, rotation, deletion with a purge of every key.

use std::time::{Duration, Instant};

use reconciled::store::{SledOptions, SledStore, Store, keys};
use reconciled_tests::api::{
    create_tenant, item, reconciler, revision_of, rotate_token, submit, tenants,
};
use reconciled_tests::proto::v1;
use reconciled_tests::{ServerOptions, ServerProcess};
use serde_json::json;
use tonic::Code;

async fn start() -> (ServerProcess, tonic::transport::Channel) {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("server starts");
    let channel = server.channel().await.expect("connects");
    (server, channel)
}

fn status_request(tenant: &str) -> v1::GetStatusRequest {
    v1::GetStatusRequest {
        tenant: tenant.into(),
    }
}

#[tokio::test]
async fn missing_or_wrong_tokens_are_unauthenticated() {
    let (_server, channel) = start().await;
    let none = reconciler(&channel, "")
        .get_status(status_request("x"))
        .await
        .expect_err("no token");
    assert_eq!(none.code(), Code::Unauthenticated);
    assert!(
        none.message().contains("authorization"),
        "{}",
        none.message()
    );
    let wrong = reconciler(&channel, "rcd_not-a-token")
        .get_status(status_request("x"))
        .await
        .expect_err("bad token");
    assert_eq!(wrong.code(), Code::Unauthenticated);
    let admin_rpc = tenants(&channel, "rcd_not-a-token")
        .list_tenants(v1::ListTenantsRequest::default())
        .await
        .expect_err("bad token");
    assert_eq!(admin_rpc.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn a_tenant_token_sees_only_its_own_tenant() {
    let (server, channel) = start().await;
    let admin = server.admin_token();
    let token_a = create_tenant(&channel, &admin, "alpha").await;
    let _token_b = create_tenant(&channel, &admin, "beta").await;

    let mut as_alpha = reconciler(&channel, &token_a);
    as_alpha
        .submit_intent(submit("alpha", vec![item("t", "a", json!({}))]))
        .await
        .expect("own tenant");
    for error in [
        as_alpha
            .get_status(status_request("beta"))
            .await
            .expect_err("other tenant"),
        as_alpha
            .submit_intent(submit("beta", vec![item("t", "x", json!({}))]))
            .await
            .expect_err("other tenant"),
        as_alpha
            .get_status(status_request("nobody"))
            .await
            .expect_err("unknown tenant"),
    ] {
        assert_eq!(error.code(), Code::NotFound, "{error:?}");
    }
    let other = tenants(&channel, &token_a)
        .get_tenant(v1::GetTenantRequest {
            name: "beta".into(),
        })
        .await
        .expect_err("hidden");
    assert_eq!(other.code(), Code::NotFound);
    let own = tenants(&channel, &token_a)
        .get_tenant(v1::GetTenantRequest {
            name: "alpha".into(),
        })
        .await
        .expect("own tenant")
        .into_inner();
    assert_eq!(own.status.expect("status").intended_items, 1);
    let create = tenants(&channel, &token_a)
        .create_tenant(v1::CreateTenantRequest {
            name: "gamma".into(),
            limits: None,
        })
        .await
        .expect_err("admin only");
    assert_eq!(create.code(), Code::PermissionDenied);

    let beta = reconciler(&channel, &admin)
        .get_status(status_request("beta"))
        .await
        .expect("admin sees all");
    assert_eq!(beta.into_inner().status.expect("status").intended_items, 0);
}

#[tokio::test]
async fn tenants_are_listed_in_pages_and_names_are_unique_and_valid() {
    let (server, channel) = start().await;
    let admin = server.admin_token();
    for name in ["c", "a", "b"] {
        create_tenant(&channel, &admin, name).await;
    }
    let mut client = tenants(&channel, &admin);
    let duplicate = client
        .create_tenant(v1::CreateTenantRequest {
            name: "a".into(),
            limits: None,
        })
        .await
        .expect_err("taken");
    assert_eq!(duplicate.code(), Code::AlreadyExists);
    let empty = client
        .create_tenant(v1::CreateTenantRequest {
            name: String::new(),
            limits: None,
        })
        .await
        .expect_err("empty name");
    assert_eq!(empty.code(), Code::InvalidArgument);

    let mut names = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_tenants(v1::ListTenantsRequest {
                page_size: 2,
                page_token: token,
            })
            .await
            .expect("page")
            .into_inner();
        assert!(page.tenants.len() <= 2);
        names.extend(page.tenants.iter().map(|t| t.name.clone()));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(names, ["a", "b", "c"]);
}

#[tokio::test]
async fn rotating_a_token_retires_the_old_one_across_restarts() {
    let (mut server, channel) = start().await;
    let admin = server.admin_token();
    let old = create_tenant(&channel, &admin, "acme").await;
    let new = rotate_token(&channel, &admin, "acme").await;
    assert_ne!(old, new);
    let refused = reconciler(&channel, &old)
        .get_status(status_request("acme"))
        .await
        .expect_err("old token");
    assert_eq!(refused.code(), Code::Unauthenticated);
    reconciler(&channel, &new)
        .get_status(status_request("acme"))
        .await
        .expect("new token works");

    server.restart().await.expect("restarts");
    let channel = server.channel().await.expect("connects");
    reconciler(&channel, &new)
        .get_status(status_request("acme"))
        .await
        .expect("new token survives");
    let refused = reconciler(&channel, &old)
        .get_status(status_request("acme"))
        .await
        .expect_err("old token");
    assert_eq!(refused.code(), Code::Unauthenticated);
}

/// Waits until the server log contains `needle`.
async fn wait_for_log(server: &ServerProcess, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if std::fs::read_to_string(server.log_path()).is_ok_and(|log| log.contains(needle)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "log never said {needle:?}:\n{}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn deleting_a_tenant_purges_every_key_and_a_new_tenant_of_that_name_starts_empty() {
    let (mut server, channel) = start().await;
    let admin = server.admin_token();
    let old_token = create_tenant(&channel, &admin, "doomed").await;
    let keep_token = create_tenant(&channel, &admin, "keeper").await;
    let items: Vec<v1::Item> = (0..2_500)
        .map(|i| item("t", &format!("i{i}"), json!({"i": i})))
        .collect();
    reconciler(&channel, &old_token)
        .submit_intent(submit("doomed", items))
        .await
        .expect("stored");
    reconciler(&channel, &keep_token)
        .submit_intent(submit("keeper", vec![item("t", "k", json!({}))]))
        .await
        .expect("stored");

    tenants(&channel, &admin)
        .delete_tenant(v1::DeleteTenantRequest {
            name: "doomed".into(),
        })
        .await
        .expect("deleted");
    let gone = reconciler(&channel, &admin)
        .get_status(status_request("doomed"))
        .await
        .expect_err("gone");
    assert_eq!(gone.code(), Code::NotFound);
    let old = reconciler(&channel, &old_token)
        .get_status(status_request("doomed"))
        .await
        .expect_err("token gone");
    assert_eq!(old.code(), Code::Unauthenticated);
    wait_for_log(&server, "Deleted tenant purged.").await;

    let fresh = create_tenant(&channel, &admin, "doomed").await;
    let status = reconciler(&channel, &fresh)
        .get_status(status_request("doomed"))
        .await
        .expect("new tenant")
        .into_inner()
        .status
        .expect("status");
    assert_eq!((status.intended_items, status.generation), (0, 0));

    server.terminate().await.expect("stops");
    let store = SledStore::open(&server.data_dir(), SledOptions::default()).expect("store opens");
    let tenant_ids: std::collections::BTreeSet<u64> = store
        .scan(&[keys::TENANT_SPACE], None, usize::MAX)
        .expect("scan")
        .iter()
        .filter_map(|(key, _)| keys::split_tenant_key(key).map(|(id, _, _)| id))
        .collect();
    assert_eq!(
        tenant_ids,
        [2, 3].into(),
        "tenant 1 (deleted) left no key behind"
    );
}

#[tokio::test]
async fn a_deleted_tenant_leaves_its_name_a_revision_floor_that_a_tenant_of_that_name_clears() {
    let (mut server, channel) = start().await;
    let admin = server.admin_token();
    let mut last_revisions = Vec::new();
    for name in ["gone", "reborn"] {
        let token = create_tenant(&channel, &admin, name).await;
        for round in 0..3 {
            reconciler(&channel, &token)
                .submit_intent(submit(name, vec![item("t", "a", json!({"round": round}))]))
                .await
                .expect("stored");
        }
        last_revisions.push(revision_of(&channel, &token, name).await);
        tenants(&channel, &admin)
            .delete_tenant(v1::DeleteTenantRequest { name: name.into() })
            .await
            .expect("deleted");
    }
    let token = create_tenant(&channel, &admin, "reborn").await;
    let reborn_first = revision_of(&channel, &token, "reborn").await;
    assert!(reborn_first > last_revisions[1]);

    server.terminate().await.expect("stops");
    let store = SledStore::open(&server.data_dir(), SledOptions::default()).expect("store opens");
    let floor = store
        .get(&keys::revision_floor_key("gone"))
        .expect("read")
        .and_then(|value| Some(u64::from_be_bytes(value.try_into().ok()?)))
        .expect("the deleted tenant left a floor of 8 bytes for its name");
    assert!(
        floor > last_revisions[0],
        "a tenant created as \"gone\" would count past {floor}, beyond the deleted one's last revision {}",
        last_revisions[0]
    );
    assert_eq!(
        store
            .get(&keys::revision_floor_key("reborn"))
            .expect("read"),
        None,
        "the new \"reborn\" carries its floor in its own record"
    );
}
