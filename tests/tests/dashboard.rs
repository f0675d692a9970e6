//! The web dashboard in real headless Chromium against the real binary and
//! real SDK agents: sign-in, the fleet view following WatchFleet live, the
//! server's own messages for denied calls, tenant isolation, the tenant
//! view following Watch live (an item going CREATING -> CREATED, a failure's
//! message), and names that look like HTML shown as text.
//!
//! Screenshots of each view go to `<target>/dashboard-screenshots/`.

use reconciled_client::agent::{ItemRef, OperationKind, TypeSpec};
use std::time::{Duration, Instant};

use reconciled_tests::agents::{
    Gate, Recorder, RunningAgent, Step, TestTenant, external_put, item_needing,
};
use reconciled_tests::api::{self, item};
use reconciled_tests::browser::Browser;
use reconciled_tests::proto::v1;
use serde_json::Value;
use serde_json::json;
use tonic::Code;

/// Held by the tests that measure time or load the machine (thousands of
/// items or tenants), so that one's load does not skew the other's figures.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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

/// The agent list's line for `agent_id` (null until it is listed).
const AGENT_LINE: &str = "for (const li of document.querySelectorAll('#agent-list li')) { \
       if (li.querySelector('b').innerText === arguments[0]) return li.innerText; } return null;";

#[tokio::test]
async fn after_a_server_crash_the_agents_it_had_show_disconnected() {
    let mut acme = TestTenant::start("acme").await;
    let mut agent = RunningAgent::start(
        acme.agent("agent-1")
            .item_type(TypeSpec::new("t"), Recorder::new()),
    );
    agent.connected().await;
    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &acme.token, Some("acme")).await;
    let shown = browser
        .wait_until("agent-1 listed", AGENT_LINE, vec![json!("agent-1")])
        .await
        .expect("the connected agent is listed");
    assert!(
        shown.as_str().unwrap_or_default().contains("— connected"),
        "{shown}"
    );

    // The server dies with the session open, and the agent with it: no
    // session ended before the process did, so only the restart says so.
    acme.server.kill9().expect("kills the server");
    agent.kill().await;
    acme.server.start_again().await.expect("starts again");
    let disconnected = format!(
        "const line = (function () {{ {AGENT_LINE} }}).apply(null, arguments); \
         return line && line.includes('disconnected') ? line : null;"
    );
    let gone = browser
        .wait_until(
            "agent-1 shown disconnected",
            &disconnected,
            vec![json!("agent-1")],
        )
        .await
        .expect("the agent shows disconnected after the restart");
    assert!(
        gone.as_str()
            .unwrap_or_default()
            .contains("server restarted"),
        "{gone}"
    );
    browser.close().await.expect("closes");
}

/// An item name that is HTML if anything renders it as HTML.
const XSS: &str = "<img src=x onerror=alert(1)>";

/// The state the graph shows for item `type/name` (null if not drawn).
const NODE_STATE: &str = "const key = arguments[0] + '\\u0000' + arguments[1]; \
     const node = [...document.querySelectorAll('#graph-svg .node')].find((n) => n.dataset.key === key); \
     return node ? node.dataset.state : null;";

async fn node_state(browser: &Browser, item_type: &str, name: &str) -> Value {
    browser
        .eval(NODE_STATE, vec![json!(item_type), json!(name)])
        .await
        .expect("reads the graph")
}

async fn wait_for_node_state(browser: &Browser, item_type: &str, name: &str, state: &str) {
    browser
        .wait_until(
            &format!("{item_type}/{name} to be {state} in the graph"),
            &format!("{NODE_STATE} "),
            vec![json!(item_type), json!(name)],
        )
        .await
        .expect("the node is drawn");
    let started = Instant::now();
    loop {
        if node_state(browser, item_type, name).await == json!(state) {
            return;
        }
        assert!(
            started.elapsed() < reconciled_tests::browser::BROWSER_DEADLINE,
            "{item_type}/{name} never showed {state}: {}",
            node_state(browser, item_type, name).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_tenant_view_follows_items_live_and_shows_failures_and_names_as_text() {
    let held = Gate::new();
    let recorder = Recorder::new();
    recorder.script(
        OperationKind::Create,
        ItemRef::new("t", "b"),
        [Step::Hold(held.clone())],
    );
    recorder.script(
        OperationKind::Create,
        ItemRef::new("t", "bad"),
        [Step::FailWith(
            Code::InvalidArgument,
            "disk full on /dev/sda1".into(),
        )],
    );
    let acme = TestTenant::start("acme").await;
    let mut agent = RunningAgent::start(
        acme.agent("agent-1")
            .item_type(TypeSpec::new("t"), recorder.clone()),
    );
    agent.connected().await;
    acme.report_external(vec![external_put("net", "uplink", json!({"mtu": 1500}))])
        .await;
    let mut uplink = item("net", "uplink", json!({"mtu": 1500}));
    uplink.external = true;
    let in_rack = |mut item: v1::Item| {
        item.subgraph = "site/rack1".into();
        item
    };
    acme.submit(vec![
        uplink,
        in_rack(item_needing("t", "a", json!({"port": 1}), &["net/uplink"])),
        in_rack(item_needing("t", "b", json!({"port": 2}), &["t/a"])),
        item_needing("t", "c", json!({"port": 3}), &["t/b"]),
        item("t", "bad", json!({"disk": "/dev/sda1"})),
        item("t", XSS, json!({"note": XSS})),
    ])
    .await;
    recorder.wait_for_operations(4).await;

    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &acme.server.admin_token(), None).await;
    browser
        .wait_for_text(&fleet_row("acme"), "acme")
        .await
        .expect("the fleet shows acme");
    browser
        .click(&format!("{} a", fleet_row("acme")))
        .await
        .expect("opens acme");
    wait_for_node_state(&browser, "t", "b", "CREATING").await;
    wait_for_node_state(&browser, "t", "c", "PENDING").await;
    wait_for_node_state(&browser, "t", "bad", "FAILED").await;

    // The item panel of the held item: the operation in flight.
    browser
        .goto(&format!(
            "{}#/tenant/acme?item=t/b",
            acme.server.dashboard_url()
        ))
        .await
        .expect("selects t/b");
    browser
        .wait_for_text("#item-operation", "create · attempt 1")
        .await
        .expect("the panel shows the operation in flight");
    let blocked = browser
        .wait_until(
            "a red edge from t/b to t/c",
            "return document.querySelectorAll('#graph-svg .edge.blocked').length;",
            vec![],
        )
        .await
        .expect("what blocks what is drawn");
    assert!(blocked.as_u64().unwrap_or(0) >= 1);
    browser.screenshot("tenant").await.expect("screenshot");

    // The agent finishes: the node turns CREATED (how fast is printed,
    // not asserted: docs/dashboard.md keeps the figure).
    held.open();
    let opened = Instant::now();
    wait_for_node_state(&browser, "t", "b", "CREATED").await;
    let recoloured = opened.elapsed();
    println!("t/b recoloured {recoloured:?} after the agent finished");
    wait_for_node_state(&browser, "t", "c", "CREATED").await;
    browser
        .wait_for_text("#oplog", "done")
        .await
        .expect("the operation log shows finished operations");
    browser
        .wait_for_text("#agent-list", "agent-1")
        .await
        .expect("the agent that connected before the page opened is listed");

    // A failure's message, as the agent sent it.
    browser
        .goto(&format!(
            "{}#/tenant/acme?item=t/bad",
            acme.server.dashboard_url()
        ))
        .await
        .expect("selects t/bad");
    let error = browser
        .wait_for_text("#item-error", "disk full on /dev/sda1")
        .await
        .expect("the last error shows");
    assert!(error.contains("INVALID_ARGUMENT"), "{error}");
    browser.screenshot("item-failed").await.expect("screenshot");

    // A name that is HTML stays text: found by search, shown in the panel,
    // and nothing of it is parsed into an element.
    browser
        .fill("#item-search", "onerror")
        .await
        .expect("searches");
    browser
        .wait_for_text("#search-results", XSS)
        .await
        .expect("the search lists the name as text");
    browser
        .click("#search-results a")
        .await
        .expect("selects it");
    let title = browser
        .wait_for_text("#item-title", "onerror")
        .await
        .expect("the panel shows the name");
    assert!(title.contains(XSS), "shown literally: {title}");
    browser
        .wait_for_text("#item-panel", "\"<img src=x onerror=alert(1)>\"")
        .await
        .expect("its property is shown as text too");
    let images = browser
        .eval("return document.querySelectorAll('img').length;", vec![])
        .await
        .expect("counts images");
    assert_eq!(images, json!(0), "no element was made from item data");
    assert!(
        browser.client().get_alert_text().await.is_err(),
        "no alert opened"
    );
    browser.screenshot("xss-as-text").await.expect("screenshot");
    browser.close().await.expect("closes");
}

#[tokio::test]
async fn a_tenant_named_like_html_is_listed_as_text() {
    let acme = TestTenant::start("acme").await;
    let admin = acme.server.admin_token();
    api::create_tenant(&acme.channel, &admin, XSS).await;
    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &admin, None).await;
    let shown = browser
        .wait_for_text("#fleet-rows", "onerror")
        .await
        .expect("the tenant is listed");
    assert!(shown.contains(XSS), "shown literally: {shown}");
    let images = browser
        .eval("return document.querySelectorAll('img').length;", vec![])
        .await
        .expect("counts images");
    assert_eq!(images, json!(0));
    browser.close().await.expect("closes");
}

/// `count` items of type `t` named `i-00000`..., in ten subgraphs
/// (`zone/0`..`zone/9`), each in a chain of ten with its predecessor.
fn many_items(count: usize) -> Vec<v1::Item> {
    (0..count)
        .map(|i| {
            let name = format!("i-{i:05}");
            let mut item = if i % 10 == 0 {
                item("t", &name, json!({"index": i}))
            } else {
                item_needing(
                    "t",
                    &name,
                    json!({"index": i}),
                    &[&format!("t/i-{:05}", i - 1)],
                )
            };
            item.subgraph = format!("zone/{}", (i / 10) % 10);
            item
        })
        .collect()
}

#[tokio::test]
async fn a_thousand_items_draw_whole_and_ten_thousand_stay_navigable() {
    let _heavy = HEAVY.lock().await;
    let acme = TestTenant::start("acme").await;
    let admin = acme.server.admin_token();
    let huge_token = api::create_tenant(&acme.channel, &admin, "huge").await;
    acme.submit(many_items(1_000)).await;
    api::reconciler(&acme.channel, &huge_token)
        .submit_intent(api::submit("huge", many_items(10_000)))
        .await
        .expect("10,000 items are accepted");

    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &admin, None).await;
    browser
        .wait_for_text(&fleet_row("huge"), "huge")
        .await
        .expect("the fleet shows");
    let opened = Instant::now();
    browser
        .goto(&format!("{}#/tenant/acme", acme.server.dashboard_url()))
        .await
        .expect("opens acme");
    let drawn = browser
        .wait_until(
            "1,000 items drawn",
            "const g = document.getElementById('graph'); \
             return g && g.dataset.nodes === '1000' ? Number(g.dataset.drawMs) : null;",
            vec![],
        )
        .await
        .expect("the graph is drawn");
    let draw_ms = drawn.as_f64().expect("the graph reports its drawing time");
    println!(
        "1,000 items: layout + draw {draw_ms} ms; {:?} from navigation to drawn (snapshot included)",
        opened.elapsed()
    );
    // The time is a figure for docs/dashboard.md, not a bound: the test
    // asserts what is drawn, and the machine's load decides how fast.
    browser.screenshot("tenant-1000").await.expect("screenshot");
    // Search zooms the whole graph to the item, at its natural size.
    browser
        .fill("#item-search", "i-00555")
        .await
        .expect("searches");
    browser
        .click("#search-results a")
        .await
        .expect("selects it");
    let width = browser
        .wait_until(
            "t/i-00555 zoomed to the middle of the pane",
            "const node = [...document.querySelectorAll('#graph-svg .node.selected')][0]; \
             if (!node) return null; \
             const box = node.getBoundingClientRect(); \
             const pane = document.getElementById('graph').getBoundingClientRect(); \
             const middle = (box.left + box.right) / 2 - (pane.left + pane.right) / 2; \
             return Math.abs(middle) < 40 && box.width > 150 ? box.width : null;",
            vec![],
        )
        .await
        .expect("the selected node is shown readable");
    println!("1,000 items: t/i-00555 focused at {width} px wide");
    browser
        .screenshot("tenant-1000-focused")
        .await
        .expect("screenshot");

    // 10,000 items: too many to draw at once; search, then the graph
    // around the chosen item.
    let opened = Instant::now();
    browser
        .goto(&format!("{}#/tenant/huge", acme.server.dashboard_url()))
        .await
        .expect("opens huge");
    browser
        .wait_for_text("#graph-too-large", "10,000 items")
        .await
        .expect("the view says to search");
    println!("10,000 items: snapshot shown after {:?}", opened.elapsed());
    browser
        .fill("#item-search", "i-04242")
        .await
        .expect("searches");
    browser
        .wait_for_text("#search-results", "t/i-04242")
        .await
        .expect("search finds the item");
    let searched = Instant::now();
    browser
        .click("#search-results a")
        .await
        .expect("selects it");
    let nodes = browser
        .wait_until(
            "the graph around t/i-04242",
            "const g = document.getElementById('graph'); \
             return g && g.dataset.nodes ? Number(g.dataset.nodes) : null;",
            vec![],
        )
        .await
        .expect("the neighbourhood is drawn");
    println!(
        "10,000 items: neighbourhood of {nodes} items drawn {:?} after the click",
        searched.elapsed()
    );
    assert_eq!(node_state(&browser, "t", "i-04242").await, json!("PENDING"));
    browser
        .wait_for_text("#item-title", "t/i-04242")
        .await
        .expect("the item panel shows it");
    browser
        .screenshot("tenant-10000")
        .await
        .expect("screenshot");
    browser.close().await.expect("closes");
}

#[tokio::test]
async fn ten_thousand_tenants_list_filter_and_scroll() {
    use futures::StreamExt as _;

    let _heavy = HEAVY.lock().await;
    let options = reconciled_tests::ServerOptions::default()
        .arg("--fsync")
        .arg("false");
    let acme = TestTenant::start_with(options, "acme").await;
    let admin = acme.server.admin_token();
    let created = Instant::now();
    futures::stream::iter(1..10_000)
        .map(|i| {
            let channel = acme.channel.clone();
            let admin = admin.clone();
            async move { api::create_tenant(&channel, &admin, &format!("tenant-{i:05}")).await }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    println!("10,000 tenants created in {:?}", created.elapsed());

    let browser = Browser::start().await.expect("headless Chromium starts");
    let opened = Instant::now();
    sign_in(&browser, &acme, &admin, None).await;
    browser
        .wait_for_text("#fleet-summary", "10000 tenants")
        .await
        .expect("every tenant is listed");
    browser
        .wait_until(
            "the tenants' generations and counts",
            "const gen = document.querySelector('#fleet-rows .row .c-gen'); \
             return gen !== null && gen.innerText.includes('/');",
            vec![],
        )
        .await
        .expect("counts are shown");
    println!(
        "10,000 tenants: listed {:?} after sign-in",
        opened.elapsed()
    );
    let rows = browser
        .eval(
            "return document.querySelectorAll('#fleet-rows .row').length;",
            vec![],
        )
        .await
        .expect("counts rows");
    assert!(
        rows.as_u64().unwrap_or(u64::MAX) < 100,
        "only the rows in view exist: {rows}"
    );
    // A filter and a jump to the end each re-render (their times are
    // figures for docs/dashboard.md, not bounds).
    let timing = browser
        .eval(
            "const input = document.getElementById('fleet-filter'); \
             const t0 = performance.now(); \
             input.value = 'tenant-099'; input.dispatchEvent(new Event('input')); \
             return new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(() => { \
               const filtered = performance.now() - t0; \
               input.value = ''; input.dispatchEvent(new Event('input')); \
               const scroller = document.getElementById('fleet-scroll'); \
               requestAnimationFrame(() => { const t1 = performance.now(); \
                 scroller.scrollTop = scroller.scrollHeight; \
                 requestAnimationFrame(() => requestAnimationFrame(() => resolve({ filtered, \
                   scrolled: performance.now() - t1, \
                   shown: document.querySelectorAll('#fleet-rows .row').length, \
                   last: [...document.querySelectorAll('#fleet-rows .row')].pop().dataset.tenant }))); }); })));",
            vec![],
        )
        .await
        .expect("measures");
    println!("10,000 tenants: {timing}");
    assert_eq!(timing["last"], json!("tenant-09999"), "{timing}");
    browser.screenshot("fleet-10000").await.expect("screenshot");

    // Live at that size: an intent no agent serves turns one tenant
    // Reconciling or not Ready, and its row says so.
    browser
        .fill("#fleet-filter", "tenant-05000")
        .await
        .expect("filters");
    let token = api::tenants(&acme.channel, &admin)
        .rotate_token(v1::RotateTokenRequest {
            name: "tenant-05000".into(),
        })
        .await
        .expect("rotates the token")
        .into_inner()
        .token;
    let changed = Instant::now();
    api::reconciler(&acme.channel, &token)
        .submit_intent(api::submit("tenant-05000", vec![item("t", "a", json!({}))]))
        .await
        .expect("the intent is accepted");
    browser
        .wait_until(
            "tenant-05000 to leave Ready",
            "const row = document.querySelector('#fleet-rows .row'); \
             return row && row.dataset.tenant === 'tenant-05000' && !row.innerText.includes('Ready') \
               ? row.innerText : null;",
            vec![],
        )
        .await
        .expect("the change shows");
    println!(
        "10,000 tenants: a change shown {:?} after its commit",
        changed.elapsed()
    );
    browser.close().await.expect("closes");
}

/// Decodes `bytes` as `message_type` with the page's own codec
/// (`/assets/proto.js`), in the browser; Dates come back as ISO strings.
async fn decode_in_page(browser: &Browser, message_type: &str, bytes: Vec<u8>) -> Value {
    browser
        .client()
        .execute_async(
            "const [type, bytes, done] = arguments; \
             import('/assets/proto.js').then(async (proto) => { \
               await proto.loadSchema(); \
               done(JSON.parse(JSON.stringify(proto.decode(type, Uint8Array.from(bytes))))); \
             }).catch((error) => done({ error: String(error) }));",
            vec![json!(message_type), json!(bytes)],
        )
        .await
        .expect("the page decodes")
}

/// Encodes `object` as `message_type` with the page's codec.
async fn encode_in_page(browser: &Browser, message_type: &str, object: Value) -> Vec<u8> {
    let bytes = browser
        .client()
        .execute_async(
            "const [type, object, done] = arguments; \
             import('/assets/proto.js').then(async (proto) => { \
               await proto.loadSchema(); \
               done(Array.from(proto.encode(type, object))); \
             }).catch((error) => done({ error: String(error) }));",
            vec![json!(message_type), object],
        )
        .await
        .expect("the page encodes");
    serde_json::from_value(bytes.clone()).unwrap_or_else(|_| panic!("encoding failed: {bytes}"))
}

#[tokio::test]
async fn the_pages_protobuf_codec_agrees_with_prost() {
    use prost::Message as _;

    let acme = TestTenant::start("acme").await;
    let browser = Browser::start().await.expect("headless Chromium starts");
    browser
        .goto(&acme.server.dashboard_url())
        .await
        .expect("opens the dashboard");

    let properties = json!({
        "n": 1.5, "s": "ä <b>", "b": false, "zero": 0, "empty": "", "none": null,
        "list": [1, "a", {"k": true}], "nested": {"deep": {"x": -3}},
    });
    let status = v1::ItemStatus {
        r#ref: Some(v1::ItemRef {
            r#type: "t".into(),
            name: "ä/<b>".into(),
        }),
        state: v1::ItemState::Failed as i32,
        applied: Some(v1::Item {
            external: true,
            subgraph: "site/rack1".into(),
            properties: Some(api::json_to_struct(properties.clone())),
            dependencies: vec![v1::Dependency {
                must_satisfy: "self.mtu >= 1500".into(),
                ..api::dependency("net", "uplink")
            }],
            ..item("t", "ä/<b>", json!({}))
        }),
        applied_generation: (1 << 53) + 1,
        attempts: 4,
        last_error: Some(reconciled_tests::proto::google::rpc::Status {
            code: Code::InvalidArgument as i32,
            message: "bad".into(),
            details: vec![],
        }),
        next_attempt_at: Some(prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 250_000_000,
        }),
        operation: Some(v1::InFlightOperation {
            kind: v1::OperationKind::Modify as i32,
            op_id: "1-abc".into(),
            attempt: 2,
            timeout: Some(prost_types::Duration {
                seconds: 60,
                nanos: 500_000_000,
            }),
            ..v1::InFlightOperation::default()
        }),
        blocked_by: vec![v1::BlockedBy {
            item: Some(v1::ItemRef {
                r#type: "net".into(),
                name: "uplink".into(),
            }),
            why: "missing".into(),
        }],
        modifications: u64::MAX,
        ..v1::ItemStatus::default()
    };
    let decoded =
        decode_in_page(&browser, "reconciled.v1.ItemStatus", status.encode_to_vec()).await;
    assert_eq!(
        decoded["ref"],
        json!({"type": "t", "name": "ä/<b>"}),
        "{decoded}"
    );
    assert_eq!(decoded["state"], json!("ITEM_STATE_FAILED"));
    assert_eq!(
        decoded["applied"]["properties"], properties,
        "Struct round trip"
    );
    assert_eq!(decoded["applied"]["external"], json!(true));
    assert_eq!(
        decoded["applied"]["dependencies"][0]["must_satisfy"],
        json!("self.mtu >= 1500")
    );
    assert_eq!(
        decoded["applied_generation"],
        json!("9007199254740993"),
        "beyond 2^53: a string"
    );
    assert_eq!(decoded["modifications"], json!("18446744073709551615"));
    assert_eq!(decoded["attempts"], json!(4));
    assert_eq!(decoded["last_error"]["code"], json!(3));
    assert_eq!(
        decoded["next_attempt_at"],
        json!("2023-11-14T22:13:20.250Z")
    );
    assert_eq!(decoded["operation"]["timeout"], json!(60.5));
    assert_eq!(decoded["operation"]["kind"], json!("OPERATION_KIND_MODIFY"));
    assert_eq!(decoded["blocked_by"][0]["why"], json!("missing"));
    assert_eq!(
        decoded["pending_operation"],
        json!("OPERATION_KIND_UNSPECIFIED"),
        "defaults"
    );

    let tenant_status = v1::TenantStatus {
        tenant: "acme".into(),
        items_by_state: [("CREATED".to_owned(), 3), ("FAILED".to_owned(), 1)].into(),
        connected_item_types: vec!["a".into(), "b".into()],
        ..v1::TenantStatus::default()
    };
    let decoded = decode_in_page(
        &browser,
        "reconciled.v1.TenantStatus",
        tenant_status.encode_to_vec(),
    )
    .await;
    assert_eq!(
        decoded["items_by_state"],
        json!({"CREATED": 3, "FAILED": 1}),
        "{decoded}"
    );
    assert_eq!(decoded["connected_item_types"], json!(["a", "b"]));

    let encoded = encode_in_page(
        &browser,
        "reconciled.v1.WatchRequest",
        json!({"tenant": "ä<b", "start_revision": 12_345_678_901_u64,
               "kinds": ["EVENT_KIND_OPERATION_STARTED", "EVENT_KIND_AGENT_CONNECTED"]}),
    )
    .await;
    let request =
        v1::WatchRequest::decode(encoded.as_slice()).expect("prost decodes the page's bytes");
    assert_eq!(
        request,
        v1::WatchRequest {
            tenant: "ä<b".into(),
            start_revision: 12_345_678_901,
            item_types: vec![],
            kinds: vec![
                v1::EventKind::OperationStarted as i32,
                v1::EventKind::AgentConnected as i32
            ],
        }
    );
    browser.close().await.expect("closes");
}

#[tokio::test]
async fn the_dashboard_speaks_tls_when_the_grpc_port_does() {
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])
        .expect("a self-signed certificate");
    let dir = tempfile::tempdir().expect("temp dir");
    let cert = dir.path().join("server.pem");
    let key = dir.path().join("server.key");
    std::fs::write(&cert, certified.cert.pem()).expect("writes the certificate");
    std::fs::write(&key, certified.signing_key.serialize_pem()).expect("writes the key");
    let harness = tonic::transport::ClientTlsConfig::new().ca_certificate(
        tonic::transport::Certificate::from_pem(certified.cert.pem()),
    );
    let options = reconciled_tests::ServerOptions::default()
        .arg("--tls-cert")
        .arg(cert.to_string_lossy().into_owned())
        .arg("--tls-key")
        .arg(key.to_string_lossy().into_owned())
        .client_tls(harness);
    let acme = TestTenant::start_with(options, "acme").await;
    let url = acme.server.dashboard_url();
    assert!(url.starts_with("https://"), "{url}");

    let browser = Browser::start_with(true)
        .await
        .expect("headless Chromium starts");
    // Plain HTTP to the TLS port gets no page.
    let plain = url.replacen("https://", "http://", 1);
    let _ = browser.goto(&plain).await;
    let shown = browser
        .eval("return document.getElementById('token') !== null;", vec![])
        .await
        .expect("reads the page");
    assert_eq!(shown, json!(false), "no dashboard over plaintext");

    sign_in(&browser, &acme, &acme.server.admin_token(), None).await;
    browser
        .wait_for_text(&fleet_row("acme"), "Ready")
        .await
        .expect("the fleet shows over TLS");
    // Over TLS the browser multiplexes every stream on one HTTP/2
    // connection (plaintext gRPC-Web is HTTP/1.1, six connections at most).
    let protocols = browser
        .eval(
            "return [...new Set(performance.getEntriesByType('resource') \
               .concat(performance.getEntriesByType('navigation')).map((e) => e.nextHopProtocol))];",
            vec![],
        )
        .await
        .expect("reads the protocols");
    assert_eq!(protocols, json!(["h2"]), "HTTP/2 over TLS");
    browser.close().await.expect("closes");
}

#[tokio::test]
async fn the_server_stops_promptly_with_dashboard_streams_open() {
    let mut acme = TestTenant::start("acme").await;
    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &acme.server.admin_token(), None).await;
    browser
        .wait_for_text(&fleet_row("acme"), "Ready")
        .await
        .expect("the fleet streams");
    let started = Instant::now();
    let status = acme.server.terminate().await.expect("the server exits");
    assert!(status.success(), "clean exit: {status:?}");
    println!(
        "stopped {:?} after SIGTERM with WatchFleet open",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    browser
        .wait_for_text("#fleet-live", "reconnecting")
        .await
        .expect("the page says it lost the stream");
    browser.close().await.expect("closes");
}

/// A configurator whose links come up with a smaller MTU than intended and
/// report it, as a real device might.
struct ObservingLinks;

impl reconciled_client::agent::Configurator for ObservingLinks {
    async fn create(
        &self,
        _: &reconciled_client::agent::OperationContext,
        _: &reconciled_client::agent::Item,
    ) -> reconciled_client::agent::Outcome {
        let observed = json!({"mtu": 1400, "carrier": "up"});
        reconciled_client::agent::Outcome::done_observed(
            observed.as_object().cloned().unwrap_or_default(),
        )
    }

    async fn modify(
        &self,
        _: &reconciled_client::agent::OperationContext,
        _: &reconciled_client::agent::Item,
        _: &reconciled_client::agent::Item,
    ) -> reconciled_client::agent::Outcome {
        reconciled_client::agent::Outcome::done()
    }

    async fn delete(
        &self,
        _: &reconciled_client::agent::OperationContext,
        _: &reconciled_client::agent::Item,
    ) -> reconciled_client::agent::Outcome {
        reconciled_client::agent::Outcome::done()
    }
}

#[tokio::test]
async fn the_item_panel_shows_intended_applied_and_observed_with_differences() {
    let acme = TestTenant::start("acme").await;
    let mut agent = RunningAgent::start(
        acme.agent("agent-1")
            .item_type(TypeSpec::new("link"), ObservingLinks),
    );
    agent.connected().await;
    acme.submit(vec![item(
        "link",
        "eth0",
        json!({"mtu": 1500, "name": "eth0"}),
    )])
    .await;
    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &acme.server.admin_token(), None).await;
    browser
        .wait_for_text(&fleet_row("acme"), "acme")
        .await
        .expect("the fleet shows");
    browser
        .goto(&format!(
            "{}#/tenant/acme?item=link/eth0",
            acme.server.dashboard_url()
        ))
        .await
        .expect("selects link/eth0");
    wait_for_node_state(&browser, "link", "eth0", "CREATED").await;
    let rows = browser
        .wait_until(
            "the values table with observed values",
            "const rows = [...document.querySelectorAll('#item-panel table.values tbody tr')]; \
             return rows.length === 3 && rows.some((r) => r.innerText.includes('1400')) \
               ? rows.map((r) => [r.className, r.innerText]) : null;",
            vec![],
        )
        .await
        .expect("intended, applied and observed side by side");
    let row = |path: &str| -> (String, String) {
        let found = rows
            .as_array()
            .into_iter()
            .flatten()
            .find(|row| row[1].as_str().unwrap_or_default().starts_with(path))
            .unwrap_or_else(|| panic!("no row {path} in {rows}"));
        (
            found[0].as_str().unwrap_or_default().to_owned(),
            found[1].as_str().unwrap_or_default().to_owned(),
        )
    };
    let (class, text) = row("/mtu");
    assert_eq!(
        class, "diff",
        "observed 1400 differs from applied 1500: {text}"
    );
    assert!(text.contains("1500") && text.contains("1400"), "{text}");
    let (class, _) = row("/name");
    assert_eq!(class, "", "intended = applied, nothing observed");
    let (class, text) = row("/carrier");
    assert_eq!(class, "", "only observed: nothing to compare: {text}");
    browser.screenshot("item-values").await.expect("screenshot");
    browser.close().await.expect("closes");
}

/// A tenant whose records could not be read at start-up is quarantined:
/// the fleet lists it with why, and serves the others.
/// Tears tenant `name`'s record in the stopped server's store at `data`,
/// as a bad restore would leave it: the tenant is quarantined at the next
/// start.
fn tear_tenant_record(data: &std::path::Path, name: &str) {
    use reconciled::store::{SledOptions, SledStore, Store as _, WriteBatch, keys};
    let store = SledStore::open(data, SledOptions::default()).expect("opens");
    let id = store
        .get(&keys::tenant_name_key(name))
        .expect("reads")
        .and_then(|bytes| bytes.get(..8).map(|b| b.to_vec()))
        .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map(u64::from_be_bytes)
        .expect("the tenant is indexed");
    let mut batch = WriteBatch::new();
    batch.put(keys::tenant_record_key(id), b"\xffnot a record".to_vec());
    store.commit_blocking(batch).expect("writes");
}

#[tokio::test]
async fn a_quarantined_tenant_is_listed_with_why() {
    let mut acme = TestTenant::start("acme").await;
    let admin = acme.server.admin_token();
    api::create_tenant(&acme.channel, &admin, "bad").await;
    acme.server.terminate().await.expect("stops");
    tear_tenant_record(&acme.server.data_dir(), "bad");
    acme.server.start_again().await.expect("starts");

    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &admin, None).await;
    let row = browser
        .wait_for_text(&fleet_row("bad"), "Quarantined")
        .await
        .expect("the quarantined tenant is listed");
    assert!(row.contains("unreadable"), "with why: {row}");
    browser
        .wait_for_text(&fleet_row("acme"), "acme")
        .await
        .expect("the other tenant is listed");

    // Its own view says why it shows nothing, and stops asking: nothing
    // changes until an operator repairs or deletes it.
    browser
        .goto(&format!("{}#/tenant/bad", acme.server.dashboard_url()))
        .await
        .expect("opens bad");
    browser
        .wait_for_text("#tenant-live", "quarantined")
        .await
        .expect("the tenant view says the tenant is quarantined, not reconnecting");
    browser.close().await.expect("closes");
}

/// A tenant found quarantined when the server restarts while the fleet
/// view is open is shown quarantined once the page reconnects: the
/// stream resumes (the fleet's history survived the restart) and
/// quarantine is no event, so the page must not keep what it listed
/// before.
#[tokio::test]
async fn a_tenant_quarantined_by_a_restart_shows_quarantined_after_the_reconnect() {
    let mut acme = TestTenant::start("acme").await;
    let admin = acme.server.admin_token();
    api::create_tenant(&acme.channel, &admin, "bad").await;
    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &admin, None).await;
    browser
        .wait_for_text(&fleet_row("bad"), "bad")
        .await
        .expect("bad is listed");

    acme.server.terminate().await.expect("stops");
    tear_tenant_record(&acme.server.data_dir(), "bad");
    acme.server.start_again().await.expect("starts");

    let shown = browser
        .wait_for_text(&fleet_row("bad"), "Quarantined")
        .await;
    if let Err(error) = shown {
        panic!("a tenant quarantined at the restart is not shown so: {error}");
    }
    browser.close().await.expect("closes");
}

/// A tenant view whose stream resumed after a server restart (no new
/// snapshot: the history still holds its revision) says it is live again
/// and drops the restart's error, rather than showing "reconnecting" and
/// "the server is shutting down" while it follows the tenant.
#[tokio::test]
async fn a_tenant_view_resumed_after_a_restart_says_it_is_live() {
    let mut acme = TestTenant::start("acme").await;
    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &acme.token, Some("acme")).await;
    browser
        .wait_for_text("#tenant-live", "live")
        .await
        .expect("the view is live");

    acme.server.restart().await.expect("restarts");
    // A change after the restart reaches the page: its stream resumed.
    acme.submit(vec![item("t", "after-restart", json!({}))])
        .await;
    wait_for_node_state(&browser, "t", "after-restart", "PENDING").await;
    let live = browser
        .wait_until(
            "the view to say it is live, with no error shown",
            "const live = document.getElementById('tenant-live');              const banner = document.getElementById('error');              return live.textContent === 'live' && banner.hidden;",
            vec![],
        )
        .await;
    if let Err(error) = live {
        panic!("a resumed tenant view does not say it is live: {error}");
    }
    browser.close().await.expect("closes");
}

/// Whether the graph draws a node for `type/name` (false once it is gone).
const NODE_DRAWN: &str = "const key = arguments[0] + '\\u0000' + arguments[1]; \
     return [...document.querySelectorAll('#graph-svg .node')].some((n) => n.dataset.key === key);";

/// Tenant `acme` with agent `agent-1` handling type `t`, registered; its
/// `kind` of `t/name` waits until the returned gate opens.
async fn acme_holding(kind: OperationKind, name: &str) -> (TestTenant, RunningAgent, Gate) {
    let held = Gate::new();
    let recorder = Recorder::new();
    recorder.script(kind, ItemRef::new("t", name), [Step::Hold(held.clone())]);
    let acme = TestTenant::start("acme").await;
    let mut agent = RunningAgent::start(
        acme.agent("agent-1")
            .item_type(TypeSpec::new("t"), recorder),
    );
    agent.connected().await;
    (acme, agent, held)
}

/// The header's counts follow an intent change that leaves every
/// condition as it was: before, the header fetched the status again only
/// when a condition or an agent changed, and went on showing the old
/// generation and item counts.
#[tokio::test]
async fn the_tenant_header_follows_an_intent_change_that_leaves_the_conditions_alone() {
    let (acme, _agent, held) = acme_holding(OperationKind::Create, "a").await;
    acme.submit(vec![item("t", "a", json!({}))]).await;
    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &acme.token, Some("acme")).await;
    wait_for_node_state(&browser, "t", "a", "CREATING").await;
    browser
        .wait_for_text("#tenant-head .gen", "/ 1")
        .await
        .expect("the header shows generation 1");

    // An item of a type no agent handles waits for one: the Create of t/a
    // is still the one operation in flight, nothing is ready to run or
    // retried, so no condition changes (their messages count exactly
    // those).
    let conditions = acme.status().await.conditions;
    acme.submit(vec![item("t", "a", json!({})), item("u", "b", json!({}))])
        .await;
    browser
        .wait_for_text("#tenant-head .gen", "/ 2")
        .await
        .expect("the header shows generation 2");
    assert_eq!(
        acme.status().await.conditions,
        conditions,
        "the intent change left the conditions as they were"
    );
    held.open();
    browser.close().await.expect("closes");
}

#[tokio::test]
async fn an_item_its_agent_deleted_leaves_the_graph_instead_of_turning_unknown() {
    let (acme, _agent, held) = acme_holding(OperationKind::Delete, "b").await;
    acme.submit(vec![item("t", "a", json!({})), item("t", "b", json!({}))])
        .await;
    acme.wait_until_ready().await;

    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &acme.token, Some("acme")).await;
    wait_for_node_state(&browser, "t", "b", "CREATED").await;

    // t/b leaves the intent; its Delete is held: drawn dotted, DELETING.
    acme.submit(vec![item("t", "a", json!({}))]).await;
    browser
        .wait_until(
            "t/b drawn as no longer intended while its Delete runs",
            "const key = 't\\u0000b'; \
             const node = [...document.querySelectorAll('#graph-svg .node')].find((n) => n.dataset.key === key); \
             return node && node.classList.contains('orphan') && node.dataset.state === 'DELETING';",
            vec![],
        )
        .await
        .expect("the Delete in flight is shown");

    // The agent finishes the Delete: t/b exists nowhere any more.
    held.open();
    acme.wait_until_ready().await;
    assert!(acme.item("t", "b").await.is_none(), "t/b was deleted");
    let gone = browser
        .wait_until(
            "t/b to leave the graph",
            &format!("return !(function () {{ {NODE_DRAWN} }}).apply(null, arguments);"),
            vec![json!("t"), json!("b")],
        )
        .await;
    if let Err(error) = gone {
        panic!(
            "a deleted item is still drawn, as {}: {error}",
            node_state(&browser, "t", "b").await
        );
    }
    wait_for_node_state(&browser, "t", "a", "CREATED").await;
    browser.close().await.expect("closes");
}

/// A change of an item whose full status is over 48 KiB reaches the
/// stream with its state and error only (docs/watch.md): the tenant view
/// shows the item in its new state, and says its values are as last
/// received, rather than dropping its status as if it had left the graph
/// (the node turned PENDING).
#[tokio::test]
async fn an_item_whose_status_is_too_large_for_the_stream_shows_its_new_state() {
    let (acme, _agent, held) = acme_holding(OperationKind::Create, "big").await;
    acme.submit(vec![item("t", "big", json!({"blob": "x".repeat(60_000)}))])
        .await;
    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &acme.token, Some("acme")).await;
    wait_for_node_state(&browser, "t", "big", "CREATING").await;

    // The Create finishes: the status now holds the 60 KB applied value.
    held.open();
    acme.wait_until_ready().await;
    wait_for_node_state(&browser, "t", "big", "CREATED").await;
    browser
        .goto(&format!(
            "{}#/tenant/acme?item=t/big",
            acme.server.dashboard_url()
        ))
        .await
        .expect("opens the item");
    browser
        .wait_for_text("#item-title", "CREATED")
        .await
        .expect("the panel shows the item CREATED");
    browser
        .wait_for_text("#item-partial", "too large for the live stream")
        .await
        .expect("the panel says its values are as last received");
    browser.close().await.expect("closes");
}

/// The rows of the item panel's values table as `[class, text]` pairs,
/// once a row starting with `path` is shown.
async fn value_rows(browser: &Browser, path: &str) -> Vec<(String, String)> {
    let rows = browser
        .wait_until(
            &format!("the values table with a row {path}"),
            "const rows = [...document.querySelectorAll('#item-panel table.values tbody tr')]; \
             return rows.some((r) => r.innerText.startsWith(arguments[0])) \
               ? rows.map((r) => [r.className, r.innerText]) : null;",
            vec![json!(path)],
        )
        .await
        .expect("the values table shows");
    rows.as_array()
        .into_iter()
        .flatten()
        .map(|row| {
            (
                row[0].as_str().unwrap_or_default().to_owned(),
                row[1].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_property_removed_from_the_intent_but_still_applied_is_marked_as_a_difference() {
    let (acme, _agent, held) = acme_holding(OperationKind::Modify, "a").await;
    acme.submit(vec![item("t", "a", json!({"port": 1, "debug": true}))])
        .await;
    acme.wait_until_ready().await;
    // The intent drops /debug; the Modify that would remove it is held, so
    // the applied value still has it.
    acme.submit(vec![item("t", "a", json!({"port": 1}))]).await;
    acme.wait_for_state("t", "a", v1::ItemState::Modifying)
        .await;

    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &acme.token, Some("acme")).await;
    browser
        .goto(&format!(
            "{}#/tenant/acme?item=t/a",
            acme.server.dashboard_url()
        ))
        .await
        .expect("selects t/a");
    wait_for_node_state(&browser, "t", "a", "MODIFYING").await;
    let rows = value_rows(&browser, "/debug").await;
    let (class, text) = rows
        .iter()
        .find(|(_, text)| text.starts_with("/debug"))
        .expect("a row for /debug");
    assert!(text.contains("true"), "applied true: {text}");
    assert_eq!(
        class, "diff",
        "intended has no /debug, applied has it: a difference ({rows:?})"
    );
    let (class, _) = rows
        .iter()
        .find(|(_, text)| text.starts_with("/port"))
        .expect("a row for /port");
    assert_eq!(class, "", "/port is the same everywhere ({rows:?})");
    held.open();
    browser.close().await.expect("closes");
}

#[tokio::test]
async fn a_property_named_proto_is_shown_like_any_other() {
    let acme = TestTenant::start("acme").await;
    // No agent: the item stays PENDING with its intended value.
    acme.submit(vec![item(
        "t",
        "p",
        json!({"__proto__": "hidden", "port": 1}),
    )])
    .await;
    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &acme.token, Some("acme")).await;
    browser
        .goto(&format!(
            "{}#/tenant/acme?item=t/p",
            acme.server.dashboard_url()
        ))
        .await
        .expect("selects t/p");
    wait_for_node_state(&browser, "t", "p", "PENDING").await;
    let rows = value_rows(&browser, "/port").await;
    assert!(
        rows.iter()
            .any(|(_, text)| text.starts_with("/__proto__") && text.contains("hidden")),
        "every property the tenant sent is shown: {rows:?}"
    );
    browser.close().await.expect("closes");
}

/// Another run of the server on `tenant`'s data directory while its own is
/// stopped, on a port the page does not know (and no dashboard): what it
/// commits happens while the page's stream is away.
struct Interim {
    child: std::process::Child,
    /// A channel to the interim server's gRPC port.
    channel: tonic::transport::Channel,
}

impl Interim {
    /// Starts it with `args` added and waits until it accepts connections.
    async fn start(tenant: &TestTenant, args: &[&str]) -> Self {
        use std::process::{Command, Stdio};

        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|probe| probe.local_addr())
            .expect("a free port");
        let child = Command::new(reconciled_tests::reconciled_binary())
            .args(["--listen", &addr.to_string(), "--ui-listen", "off"])
            .arg("--data-dir")
            .arg(tenant.server.data_dir())
            .args(["--admin-token", &tenant.server.admin_token()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the interim server starts");
        let started = Instant::now();
        let channel = loop {
            let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .expect("endpoint");
            match endpoint.connect().await {
                Ok(channel) => break channel,
                Err(error) => {
                    assert!(
                        started.elapsed() < reconciled_tests::READY_DEADLINE,
                        "the interim server never listened: {error}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        Self { child, channel }
    }

    /// Stops it (SIGTERM) and waits for it to exit.
    fn stop(mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid")),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("stops the interim server");
        self.child.wait().expect("the interim server exits");
    }
}

impl Drop for Interim {
    /// A test that fails midway leaves no server behind.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[tokio::test]
async fn a_tenant_deleted_while_the_fleet_stream_was_away_leaves_the_list() {
    // Two revisions of fleet history: a stream that was away for more
    // resumes from a new snapshot.
    let mut acme = TestTenant::start_with(
        reconciled_tests::ServerOptions::default().arg("--watch-history-revisions=2"),
        "acme",
    )
    .await;
    let admin = acme.server.admin_token();
    api::create_tenant(&acme.channel, &admin, "doomed").await;
    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &admin, None).await;
    browser
        .wait_for_text(&fleet_row("doomed"), "doomed")
        .await
        .expect("doomed is listed");

    // While the dashboard's server is down, another run of the server on
    // the same data (on ports the page does not know) deletes doomed and
    // creates tenants until the page's fleet revision is compacted away.
    acme.server.terminate().await.expect("stops");
    let interim = Interim::start(&acme, &["--watch-history-revisions=2"]).await;
    let mut tenants = api::tenants(&interim.channel, &admin);
    let started = Instant::now();
    loop {
        match tenants
            .delete_tenant(v1::DeleteTenantRequest {
                name: "doomed".into(),
            })
            .await
        {
            Ok(_) => break,
            Err(status) => {
                assert!(
                    started.elapsed() < reconciled_tests::READY_DEADLINE,
                    "cannot delete doomed: {status:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    for name in ["later-1", "later-2", "later-3", "later-4"] {
        api::create_tenant(&interim.channel, &admin, name).await;
    }
    interim.stop();
    acme.server.start_again().await.expect("starts again");

    // The page comes back: the stream's revision is gone, it starts over
    // from a snapshot, which no longer holds doomed.
    browser
        .wait_for_text(&fleet_row("later-4"), "later-4")
        .await
        .expect("the tenants created meanwhile are listed");
    let gone = browser
        .wait_until(
            "doomed to leave the fleet",
            "return document.querySelector(arguments[0]) === null;",
            vec![json!(fleet_row("doomed"))],
        )
        .await;
    if let Err(error) = gone {
        panic!("a deleted tenant is still listed: {error}");
    }
    browser.close().await.expect("closes");
}

/// A tenant view whose stream starts over from a new snapshot (its
/// revision compacted away while the page was disconnected) rebuilds the
/// agent list from what follows that snapshot: an agent that went away
/// meanwhile is no longer listed, let alone as connected.
#[tokio::test]
async fn a_tenant_views_new_snapshot_drops_the_agents_that_left_meanwhile() {
    let mut acme = TestTenant::start_with(
        reconciled_tests::ServerOptions::default().arg("--watch-history-revisions=2"),
        "acme",
    )
    .await;
    let mut agent = RunningAgent::start(
        acme.agent("agent-1")
            .item_type(TypeSpec::new("t"), Recorder::new()),
    );
    agent.connected().await;
    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &acme.token, Some("acme")).await;
    browser
        .wait_until("agent-1 listed", AGENT_LINE, vec![json!("agent-1")])
        .await
        .expect("the connected agent is listed");

    // The server dies and the agent with it. Another run of the server on
    // the same data (on ports the page does not know) announces the
    // disconnect in its first commit and commits on until the page's
    // revision, and that announcement, are compacted away.
    acme.server.kill9().expect("kills the server");
    agent.kill().await;
    let interim = Interim::start(&acme, &["--watch-history-revisions=2"]).await;
    let mut reconciler = api::reconciler(&interim.channel, &acme.token);
    for round in 0..6 {
        let started = Instant::now();
        while let Err(status) = reconciler
            .submit_intent(api::submit(
                "acme",
                vec![item("t", &format!("marker-{round}"), json!({}))],
            ))
            .await
        {
            assert!(
                started.elapsed() < reconciled_tests::READY_DEADLINE,
                "the interim server refuses the intent: {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    interim.stop();
    acme.server.start_again().await.expect("starts again");

    // The page comes back from a new snapshot (the last intent drawn)...
    wait_for_node_state(&browser, "t", "marker-5", "PENDING").await;
    // ...and lists no agent that the snapshot and what follows do not show.
    let gone = browser
        .wait_until(
            "agent-1 to leave the agent list",
            &format!("return (function () {{ {AGENT_LINE} }}).apply(null, arguments) === null;"),
            vec![json!("agent-1")],
        )
        .await;
    if let Err(error) = gone {
        let line = browser
            .eval(AGENT_LINE, vec![json!("agent-1")])
            .await
            .expect("reads the agent list");
        panic!("an agent gone before the new snapshot is still listed: {line} ({error})");
    }
    browser.close().await.expect("closes");
}

#[tokio::test]
async fn names_with_url_characters_open_the_tenant_and_item_they_name() {
    let acme = TestTenant::start("acme").await;
    let admin = acme.server.admin_token();
    // Names are any printable UTF-8: '?', '+' and '&' mean something in a
    // URL, and must not change which tenant or item a link opens.
    api::create_tenant(&acme.channel, &admin, "acme?eu").await;
    acme.submit(vec![
        item("t", "c++", json!({"lang": "cpp"})),
        item("t", "r&d", json!({"team": 1})),
    ])
    .await;
    let browser = Browser::start().await.expect("headless Chromium starts");
    sign_in(&browser, &acme, &admin, None).await;
    browser
        .wait_for_text(&fleet_row("acme?eu"), "acme?eu")
        .await
        .expect("the fleet lists acme?eu");
    browser
        .click(&format!("{} a", fleet_row("acme?eu")))
        .await
        .expect("opens acme?eu");
    browser
        .wait_until(
            "the view of tenant acme?eu",
            "const view = document.getElementById('tenant'); \
             return view ? view.dataset.tenant : null;",
            vec![],
        )
        .await
        .map(|shown| assert_eq!(shown, json!("acme?eu"), "the tenant clicked is opened"))
        .expect("a tenant view opens");

    browser
        .goto(&format!("{}#/tenant/acme", acme.server.dashboard_url()))
        .await
        .expect("opens acme");
    wait_for_node_state(&browser, "t", "c++", "PENDING").await;
    for (search, label) in [("c++", "t/c++"), ("r&d", "t/r&d")] {
        browser
            .fill("#item-search", search)
            .await
            .expect("searches");
        browser
            .wait_for_text("#search-results", label)
            .await
            .expect("the search finds the item");
        browser
            .click("#search-results a")
            .await
            .expect("follows its link");
        browser
            .wait_for_text("#item-title", label)
            .await
            .unwrap_or_else(|error| panic!("the link of {label} selects it: {error}"));
    }
    browser.close().await.expect("closes");
}
