//! What the store fixture generator (`make-store-fixture`) and the upgrade
//! test (`tests/tests/upgrade.rs`, which includes this file with `#[path]`)
//! share: the fixture's names and item type specs, how a server's answers
//! are written down as JSON (`expected.json`) and compared, how the data
//! directory is packed, and `reconciled migrate`.
//!
//! The JSON form keeps every field of the answers (GetGraph intended and
//! current, GetStatus, GetItemTypes, ListTenants), with items keyed by
//! `type/name` so a difference names its item. [`comparable`] drops what
//! legitimately differs between two runs of a server on the same store.

// The generator and the test each use part of this module.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use reconciled_client::agent::TypeSpec;
use reconciled_proto::json::properties_from_struct;
use reconciled_proto::v1;
use reconciled_tests::api;
use serde_json::{Map, Value, json};
use tonic::transport::Channel;

/// Tenant A: agents, a diamond, a failure, operations held at shutdown.
pub const ACME: &str = "acme";
/// Tenant B: limits, a subgraph, unicode in its name; no agent ever.
pub const GLOBEX: &str = "globex-ß";

/// The item type agent `net-agent` handles (spec: [`net_spec`]).
pub const NET: &str = "net";
/// The item type agent `svc-agent` handles (spec: [`svc_spec`]).
pub const SVC: &str = "svc";
/// The type of the external item an agent reports.
pub const UPLINK: &str = "uplink";
/// The item type of tenant B (no agent handles it).
pub const DEV: &str = "dev";

/// The agent ids of the fixture's agents.
pub const NET_AGENT: &str = "net-agent";
/// See [`NET_AGENT`].
pub const SVC_AGENT: &str = "svc-agent";

/// The item whose Create failed (retryable) when the fixture was made.
pub const FLAKY: &str = "flaky";

/// Server arguments of every run on the fixture: items that wait for a
/// configurator never make the tenant Stalled, however old the fixture is
/// (the grace counts from when the wait began), so two runs on the same
/// store answer the same whenever they happen.
pub const SERVER_ARGS: &[&str] = &["--configurator-grace-secs", "315360000"];

/// The archive of the data directory, in the fixture directory: a gzipped
/// tar of `data/` (sled writes an 8 MiB segment, mostly zeros).
pub const ARCHIVE: &str = "data.tar.gz";
/// What the old server answered, in the fixture directory.
pub const EXPECTED: &str = "expected.json";

/// The format of `expected.json` (bump it when its shape changes).
pub const EXPECTED_FORMAT: u64 = 1;

/// How long a wait for a settled server may take.
pub const SETTLE_DEADLINE: Duration = Duration::from_secs(20);

/// The spec `net-agent` registers: a non-default retry policy, a schema,
/// `recreate_on_change`, a timeout and an in-flight limit.
pub fn net_spec() -> TypeSpec {
    TypeSpec::new(NET)
        .recreate_on_change(["/vlan"])
        .retry_static(Duration::from_secs(3))
        .max_attempts(7)
        .operation_timeout(Duration::from_secs(120))
        .max_in_flight(8)
        .schema(json!({
            "type": "object",
            "properties": {
                "vlan": {
                    "type": "object",
                    "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 4094}},
                    "required": ["id"],
                },
                "mtu": {"type": "integer", "minimum": 576},
            },
            "required": ["vlan"],
        }))
}

/// The spec `svc-agent` registers: an exponential retry and a long
/// operation timeout (its operations are held across the shutdown).
pub fn svc_spec() -> TypeSpec {
    TypeSpec::new(SVC)
        .retry_exponential(Duration::from_millis(500), 3.0, Duration::from_secs(90))
        .operation_timeout(Duration::from_secs(3_600))
}

/// A string of about 40 KB: with the target of a Modify in flight, the
/// current record of its item is over one stored value (64 KiB) and is
/// stored in chunks.
pub fn blob() -> String {
    let mut text = String::with_capacity(40_100);
    let mut index = 0u32;
    while text.len() < 40_000 {
        text.push_str(&format!("{index:05}·ü "));
        index += 1;
    }
    text
}

// ---------------------------------------------------------------------
// Answers as JSON
// ---------------------------------------------------------------------

fn timestamp(value: Option<&prost_types::Timestamp>) -> Value {
    value.map_or(
        Value::Null,
        |t| json!({"seconds": t.seconds, "nanos": t.nanos}),
    )
}

fn duration(value: Option<&prost_types::Duration>) -> Value {
    value.map_or(
        Value::Null,
        |d| json!({"seconds": d.seconds, "nanos": d.nanos}),
    )
}

fn properties(value: Option<&prost_types::Struct>) -> Value {
    value.map_or(Value::Null, |s| {
        summarise_long_strings(Value::Object(properties_from_struct(s.clone())))
    })
}

/// Strings longer than this are written down as [`summarise_long_strings`]
/// says, which keeps `expected.json` small.
const LONG_STRING_BYTES: usize = 256;

/// Replaces every string longer than [`LONG_STRING_BYTES`] by its length,
/// its 64-bit FNV-1a hash and its first characters: two answers that agree
/// on the summary agree on the string (barring a hash collision, which no
/// mangling of a migration is likely to hit).
fn summarise_long_strings(value: Value) -> Value {
    match value {
        Value::String(text) if text.len() > LONG_STRING_BYTES => {
            let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
            });
            let start: String = text.chars().take(24).collect();
            Value::String(format!(
                "<{} bytes, FNV-1a 64 {hash:016x}, starting {start:?}>",
                text.len()
            ))
        }
        Value::Array(values) => {
            Value::Array(values.into_iter().map(summarise_long_strings).collect())
        }
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(key, value)| (key, summarise_long_strings(value)))
                .collect(),
        ),
        other => other,
    }
}

fn enum_name<E: TryFrom<i32>>(value: i32, name: impl Fn(E) -> &'static str) -> Value {
    match E::try_from(value) {
        Ok(known) => Value::from(name(known)),
        Err(_) => Value::from(value),
    }
}

fn item_state(value: i32) -> Value {
    enum_name(value, |s: v1::ItemState| s.as_str_name())
}

fn operation_kind(value: i32) -> Value {
    enum_name(value, |k: v1::OperationKind| k.as_str_name())
}

/// `type/name` of a reference.
pub fn reference(value: Option<&v1::ItemRef>) -> String {
    value.map_or_else(String::new, |r| format!("{}/{}", r.r#type, r.name))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn rpc_status(value: Option<&reconciled_proto::google::rpc::Status>) -> Value {
    value.map_or(Value::Null, |status| {
        json!({
            "code": status.code,
            "message": status.message,
            "details": status.details.iter().map(|any| json!({
                "type_url": any.type_url,
                "value": hex(&any.value),
            })).collect::<Vec<_>>(),
        })
    })
}

/// Every field of an item.
pub fn item_json(item: &v1::Item) -> Value {
    json!({
        "type": item.r#type,
        "name": item.name,
        "properties": properties(item.properties.as_ref()),
        "dependencies": item.dependencies.iter().map(|d| json!({
            "requires": reference(d.requires.as_ref()),
            "must_satisfy": d.must_satisfy,
            "description": d.description,
            "recreate_when_modified": d.recreate_when_modified,
            "auto_deleted_by_external": d.auto_deleted_by_external,
        })).collect::<Vec<_>>(),
        "external": item.external,
        "subgraph": item.subgraph,
        "label": item.label,
        "description": item.description,
    })
}

/// Every field of an item's status in the current graph.
pub fn item_status_json(status: &v1::ItemStatus) -> Value {
    json!({
        "state": item_state(status.state),
        "applied": status.applied.as_ref().map_or(Value::Null, item_json),
        "applied_generation": status.applied_generation,
        "observed": properties(status.observed.as_ref()),
        "last_operation": operation_kind(status.last_operation),
        "last_error": rpc_status(status.last_error.as_ref()),
        "attempts": status.attempts,
        "next_attempt_at": timestamp(status.next_attempt_at.as_ref()),
        "operation": status.operation.as_ref().map_or(Value::Null, |op| json!({
            "kind": operation_kind(op.kind),
            "op_id": op.op_id,
            "attempt": op.attempt,
            "target_generation": op.target_generation,
            "started_at": timestamp(op.started_at.as_ref()),
            "timeout": duration(op.timeout.as_ref()),
            "last_progress_at": timestamp(op.last_progress_at.as_ref()),
            "progress_message": op.progress_message,
        })),
        "pending_operation": operation_kind(status.pending_operation),
        "reason": enum_name(status.reason, |r: v1::WaitReason| r.as_str_name()),
        "blocked_by": status.blocked_by.iter().map(|b| json!({
            "item": reference(b.item.as_ref()),
            "why": b.why,
        })).collect::<Vec<_>>(),
        "modifications": status.modifications,
        "external": status.external,
    })
}

/// Every field of a tenant's status; conditions in order of type.
pub fn tenant_status_json(status: &v1::TenantStatus) -> Value {
    let mut conditions: Vec<&v1::Condition> = status.conditions.iter().collect();
    conditions.sort_by(|a, b| a.r#type.cmp(&b.r#type));
    let by_state: BTreeMap<&String, &u64> = status.items_by_state.iter().collect();
    let mut connected = status.connected_item_types.clone();
    connected.sort();
    json!({
        "tenant": status.tenant,
        "generation": status.generation,
        "observed_generation": status.observed_generation,
        "revision": status.revision,
        "conditions": conditions.iter().map(|c| json!({
            "type": c.r#type,
            "status": enum_name(c.status, |s: v1::ConditionStatus| s.as_str_name()),
            "reason": c.reason,
            "message": c.message,
            "observed_generation": c.observed_generation,
            "last_transition_time": timestamp(c.last_transition_time.as_ref()),
        })).collect::<Vec<_>>(),
        "items_by_state": by_state,
        "intended_items": status.intended_items,
        "operations_in_flight": status.operations_in_flight,
        "connected_item_types": connected,
        "owner": status.owner,
    })
}

fn limits_json(limits: Option<&v1::TenantLimits>) -> Value {
    limits.map_or(Value::Null, |l| {
        json!({
            "max_items": l.max_items,
            "max_request_items": l.max_request_items,
            "max_agents": l.max_agents,
            "max_watchers": l.max_watchers,
            "max_operations_in_flight": l.max_operations_in_flight,
        })
    })
}

/// A tenant as ListTenants shows it (its status is GetStatus's business).
pub fn tenant_json(tenant: &v1::Tenant) -> Value {
    json!({
        "name": tenant.name,
        "created_at": timestamp(tenant.created_at.as_ref()),
        "limits": limits_json(tenant.limits.as_ref()),
        "quarantine_error": tenant.quarantine_error,
    })
}

fn retry_policy_json(policy: Option<&v1::RetryPolicy>) -> Value {
    use v1::retry_policy::Policy;
    policy.map_or(Value::Null, |p| {
        let wait = match &p.policy {
            None => Value::Null,
            Some(Policy::StaticRetry(s)) => json!({"static": {"wait": duration(s.wait.as_ref())}}),
            Some(Policy::Random(r)) => json!({"random": {
                "min": duration(r.min.as_ref()),
                "max": duration(r.max.as_ref()),
            }}),
            Some(Policy::Exponential(e)) => json!({"exponential": {
                "initial": duration(e.initial.as_ref()),
                "multiplier": e.multiplier,
                "max": duration(e.max.as_ref()),
            }}),
        };
        json!({"policy": wait, "max_attempts": p.max_attempts})
    })
}

/// A registered item type: its stored spec, epoch and whether it is held.
pub fn item_type_json(registered: &v1::RegisteredItemType) -> Value {
    let spec = registered.spec.as_ref();
    json!({
        "spec": spec.map_or(Value::Null, |s| json!({
            "item_type": s.item_type,
            "recreate_on_change": s.recreate_on_change,
            "ask_needs_recreate": s.ask_needs_recreate,
            "retry_policy": retry_policy_json(s.retry_policy.as_ref()),
            "operation_timeout": duration(s.operation_timeout.as_ref()),
            "supports_read": s.supports_read,
            "max_in_flight": s.max_in_flight,
            "schema": properties(s.schema.as_ref()),
        })),
        "epoch": registered.epoch,
        "connected": registered.connected,
    })
}

/// What one tenant's token reads: the whole graph (every page), the status
/// and the registered item types.
pub async fn read_tenant(channel: &Channel, name: &str, token: &str) -> anyhow::Result<Value> {
    let mut client = api::reconciler(channel, token);
    let mut intended = Map::new();
    let mut current = Map::new();
    let mut page_token = String::new();
    let mut revision = None;
    let mut generation;
    loop {
        let page = client
            .get_graph(v1::GetGraphRequest {
                tenant: name.to_owned(),
                view: v1::GraphView::Both.into(),
                page_size: 1_000,
                page_token: page_token.clone(),
                ..v1::GetGraphRequest::default()
            })
            .await
            .with_context(|| format!("GetGraph of {name}"))?
            .into_inner();
        for entry in &page.intended {
            let item = entry
                .item
                .as_ref()
                .context("an intended entry without an item")?;
            intended.insert(
                format!("{}/{}", item.r#type, item.name),
                json!({"generation": entry.generation, "item": item_json(item)}),
            );
        }
        for status in &page.current {
            current.insert(reference(status.r#ref.as_ref()), item_status_json(status));
        }
        revision.get_or_insert(page.revision);
        generation = page.generation;
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let status = client
        .get_status(v1::GetStatusRequest {
            tenant: name.to_owned(),
        })
        .await
        .with_context(|| format!("GetStatus of {name}"))?
        .into_inner()
        .status
        .context("GetStatus answered no status")?;
    let types = client
        .get_item_types(v1::GetItemTypesRequest {
            tenant: name.to_owned(),
            ..Default::default()
        })
        .await
        .with_context(|| format!("GetItemTypes of {name}"))?
        .into_inner();
    let item_types: Map<String, Value> = types
        .item_types
        .iter()
        .map(|t| {
            let name = t
                .spec
                .as_ref()
                .map_or_else(String::new, |s| s.item_type.clone());
            (name, item_type_json(t))
        })
        .collect();
    Ok(json!({
        "graph": {
            "revision": revision.unwrap_or_default(),
            "generation": generation,
            "intended": intended,
            "current": current,
        },
        "status": tenant_status_json(&status),
        "item_types": {"revision": types.revision, "types": item_types},
    }))
}

/// ListTenants with the admin token, every page, keyed by name.
pub async fn list_tenants(channel: &Channel, admin_token: &str) -> anyhow::Result<Value> {
    let mut client = api::tenants(channel, admin_token);
    let mut tenants = Map::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_tenants(v1::ListTenantsRequest {
                page_size: 100,
                page_token: page_token.clone(),
            })
            .await
            .context("ListTenants")?
            .into_inner();
        for tenant in &page.tenants {
            tenants.insert(tenant.name.clone(), tenant_json(tenant));
        }
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    Ok(Value::Object(tenants))
}

/// Everything the server answers about the fixture's tenants: ListTenants
/// and, with each tenant's own token, [`read_tenant`].
pub async fn read_server(
    channel: &Channel,
    admin_token: &str,
    tokens: &BTreeMap<String, String>,
) -> anyhow::Result<Value> {
    let mut per_tenant = Map::new();
    for (name, token) in tokens {
        per_tenant.insert(name.clone(), read_tenant(channel, name, token).await?);
    }
    Ok(json!({
        "tenants": list_tenants(channel, admin_token).await?,
        "per_tenant": per_tenant,
    }))
}

/// Whether every operation was journaled away: after a restart without
/// agents, no item is CREATING, MODIFYING or DELETING (each in-flight
/// operation is UNKNOWN until an agent holds its type again).
pub fn no_operation_running(snapshot: &Value) -> bool {
    let running = [
        "ITEM_STATE_CREATING",
        "ITEM_STATE_MODIFYING",
        "ITEM_STATE_DELETING",
    ];
    snapshot["per_tenant"]
        .as_object()
        .into_iter()
        .flat_map(|tenants| tenants.values())
        .flat_map(|tenant| tenant["graph"]["current"].as_object().into_iter())
        .flat_map(|current| current.values())
        .all(|item| !running.iter().any(|state| item["state"] == *state))
}

/// Reads the server until its answers settle: no operation runs and two
/// reads in a row agree (see [`comparable`]). For a server just restarted
/// on a store without agents, whose start-up recovery runs in the
/// background.
pub async fn settled(
    channel: &Channel,
    admin_token: &str,
    tokens: &BTreeMap<String, String>,
) -> anyhow::Result<Value> {
    let deadline = tokio::time::Instant::now() + SETTLE_DEADLINE;
    let mut last: Option<Value> = None;
    loop {
        let now = read_server(channel, admin_token, tokens).await?;
        if no_operation_running(&now)
            && last
                .as_ref()
                .is_some_and(|last| comparable(last) == comparable(&now))
        {
            return Ok(now);
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "the server's answers did not settle within {SETTLE_DEADLINE:?}; last:\n{}",
                serde_json::to_string_pretty(&now)?
            );
        }
        last = Some(now);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `snapshot` without what legitimately differs between two runs of a
/// server on the same store: when conditions last changed (each start
/// recomputes them) and which replica owns the tenant.
pub fn comparable(snapshot: &Value) -> Value {
    let mut value = snapshot.clone();
    if let Some(tenants) = value["per_tenant"].as_object_mut() {
        for tenant in tenants.values_mut() {
            let status = &mut tenant["status"];
            if let Some(status) = status.as_object_mut() {
                status.remove("owner");
            }
            if let Some(conditions) = status["conditions"].as_array_mut() {
                for condition in conditions {
                    if let Some(condition) = condition.as_object_mut() {
                        condition.remove("last_transition_time");
                    }
                }
            }
        }
    }
    value
}

/// The item states of an operation in flight.
const RUNNING_STATES: [&str; 3] = [
    "ITEM_STATE_CREATING",
    "ITEM_STATE_MODIFYING",
    "ITEM_STATE_DELETING",
];

/// The fields of a current item that an operation in flight at shutdown
/// keeps while it becomes UNKNOWN.
const KEPT_BY_A_LOST_OPERATION: [&str; 9] = [
    "applied",
    "applied_generation",
    "observed",
    "last_operation",
    "last_error",
    "attempts",
    "next_attempt_at",
    "modifications",
    "external",
];

/// The fields of a journaled operation.
const JOURNALED: [&str; 6] = [
    "kind",
    "op_id",
    "attempt",
    "target_generation",
    "started_at",
    "timeout",
];

/// What of `before` (the answers of a server just before SIGTERM) `now`
/// (the answers after a restart without agents, on the same store or on
/// one migrated from it) lost, one line per loss:
///
/// - the tenants (name, creation time, limits), and each tenant's token
///   (`now` was read with them);
/// - each tenant's generation; its revision does not go back;
/// - the intended graph, every item and its generation, exactly;
/// - every current item: exactly as it was, unless an operation was in
///   flight on it; then it is UNKNOWN (its outcome was lost with the
///   agent's stream, DESIGN section 4) with the same journaled operation
///   (kind, op id, attempt, target generation, start, timeout) and the
///   same applied and observed values, error, attempts and counters;
/// - no current item appears from nowhere;
/// - every registered item type's spec and epoch (not whether an agent
///   holds it now).
pub fn losses(before: &Value, now: &Value) -> Vec<String> {
    let mut found = Vec::new();
    for difference in differences(&before["tenants"], &now["tenants"]) {
        found.push(format!("ListTenants {difference}"));
    }
    let empty = Map::new();
    for (name, then) in before["per_tenant"].as_object().unwrap_or(&empty) {
        let later = &now["per_tenant"][name];
        let mut lost = |what: String| found.push(format!("tenant {name}: {what}"));
        if later.is_null() {
            lost("cannot be read".into());
            continue;
        }
        for (answer, field) in [("graph", "generation"), ("status", "generation")] {
            if then[answer][field] != later[answer][field] {
                lost(format!(
                    "{answer} {field} {} became {}",
                    then[answer][field], later[answer][field]
                ));
            }
        }
        let revision = |value: &Value| value["status"]["revision"].as_u64().unwrap_or(0);
        if revision(later) < revision(then) {
            lost(format!(
                "revision went back from {} to {}",
                revision(then),
                revision(later)
            ));
        }
        for difference in differences(&then["graph"]["intended"], &later["graph"]["intended"]) {
            lost(format!("intended {difference}"));
        }
        let current_then = then["graph"]["current"].as_object().unwrap_or(&empty);
        let current_later = later["graph"]["current"].as_object().unwrap_or(&empty);
        for (item, was) in current_then {
            let Some(is) = current_later.get(item) else {
                lost(format!("current item {item} is gone (it was {was})"));
                continue;
            };
            if !RUNNING_STATES.iter().any(|state| was["state"] == *state) {
                for difference in differences(was, is) {
                    lost(format!("current {item}{difference}"));
                }
                continue;
            }
            if is["state"] != "ITEM_STATE_UNKNOWN" {
                lost(format!(
                    "current {item} was {} and is {}, not UNKNOWN",
                    was["state"], is["state"]
                ));
            }
            for field in KEPT_BY_A_LOST_OPERATION {
                if was[field] != is[field] {
                    lost(format!(
                        "current {item}/{field}: was {}, is {}",
                        was[field], is[field]
                    ));
                }
            }
            for field in JOURNALED {
                if was["operation"][field] != is["operation"][field] {
                    lost(format!(
                        "current {item}: the journaled operation's {field} was {}, is {}",
                        was["operation"][field], is["operation"][field]
                    ));
                }
            }
        }
        for item in current_later.keys() {
            if !current_then.contains_key(item) {
                lost(format!("current item {item} appeared"));
            }
        }
        let types_later = &later["item_types"]["types"];
        for (item_type, was) in then["item_types"]["types"].as_object().unwrap_or(&empty) {
            for field in ["spec", "epoch"] {
                for difference in differences(&was[field], &types_later[item_type][field]) {
                    lost(format!("item type {item_type}/{field}{difference}"));
                }
            }
        }
    }
    found
}

/// Where `actual` differs from `expected`, one line per JSON path.
pub fn differences(expected: &Value, actual: &Value) -> Vec<String> {
    let mut found = Vec::new();
    diff_into("", expected, actual, &mut found);
    found
}

fn diff_into(path: &str, expected: &Value, actual: &Value, found: &mut Vec<String>) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (key, value) in e {
                let at = format!("{path}/{key}");
                match a.get(key) {
                    Some(other) => diff_into(&at, value, other, found),
                    None => found.push(format!("{at}: missing (expected {value})")),
                }
            }
            for (key, value) in a {
                if !e.contains_key(key) {
                    found.push(format!("{path}/{key}: unexpected {value}"));
                }
            }
        }
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => {
            for (index, (e, a)) in e.iter().zip(a).enumerate() {
                diff_into(&format!("{path}/{index}"), e, a, found);
            }
        }
        _ if expected != actual => {
            found.push(format!("{path}: expected {expected}, got {actual}"));
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------
// The data directory and `reconciled migrate`
// ---------------------------------------------------------------------

/// The fixture directory of schema version 1, from the workspace root.
pub fn store_v1_dir() -> PathBuf {
    reconciled_tests::workspace_root().join("tests/fixtures/store-v1")
}

fn run(command: &mut Command) -> anyhow::Result<String> {
    let shown = format!("{command:?}");
    let output = command
        .output()
        .with_context(|| format!("cannot run {shown}"))?;
    if !output.status.success() {
        bail!(
            "{shown} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Packs the data directory `data_dir` (its name must be `data`) into the
/// gzipped tar `archive`, reproducibly (sorted names, no owners or times).
pub fn pack(data_dir: &Path, archive: &Path) -> anyhow::Result<()> {
    let parent = data_dir
        .parent()
        .context("the data directory has no parent")?;
    if data_dir.file_name() != Some("data".as_ref()) {
        bail!("{} is not named data", data_dir.display());
    }
    let tar = archive.with_extension("");
    run(Command::new("tar")
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner"])
        .args(["--mtime=@0", "--format=gnu", "-cf"])
        .arg(&tar)
        .arg("-C")
        .arg(parent)
        .arg("data"))?;
    run(Command::new("gzip").args(["-9", "-n", "-f"]).arg(&tar))?;
    if !archive.is_file() {
        bail!("gzip did not write {}", archive.display());
    }
    Ok(())
}

/// Unpacks `archive` (from [`pack`]) so that it becomes `data_dir`, which
/// must not exist and must be named `data`.
pub fn unpack(archive: &Path, data_dir: &Path) -> anyhow::Result<()> {
    if data_dir.exists() {
        bail!("{} exists already", data_dir.display());
    }
    if data_dir.file_name() != Some("data".as_ref()) {
        bail!("{} is not named data", data_dir.display());
    }
    let parent = data_dir
        .parent()
        .context("the data directory has no parent")?;
    std::fs::create_dir_all(parent)?;
    run(Command::new("tar")
        .arg("-xzf")
        .arg(archive)
        .arg("-C")
        .arg(parent))?;
    if !data_dir.join("db").is_dir() {
        bail!("{} holds no data/db", archive.display());
    }
    Ok(())
}

/// Runs `<binary> migrate --data-dir <data_dir> <flags>` and returns what
/// it printed on stdout. The test's `RECONCILED_*` settings are not passed
/// on (as for the server).
pub fn migrate(binary: &Path, data_dir: &Path, flags: &[&str]) -> anyhow::Result<String> {
    let mut command = Command::new(binary);
    command
        .arg("migrate")
        .arg("--data-dir")
        .arg(data_dir)
        .args(flags);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("RECONCILED_") {
            command.env_remove(&name);
        }
    }
    run(&mut command)
}

/// The schema version of a store and the newest this build knows, from
/// the first line of `reconciled migrate --status`:
/// `schema version: 1 (this build knows up to 2)`.
pub fn schema_versions(report: &str) -> anyhow::Result<(u32, u32)> {
    let line = report.lines().next().unwrap_or_default();
    let parse = || -> Option<(u32, u32)> {
        let rest = line.strip_prefix("schema version: ")?;
        let (current, rest) = rest.split_once(" (this build knows up to ")?;
        let latest = rest.strip_suffix(')')?;
        Some((current.parse().ok()?, latest.parse().ok()?))
    };
    parse().with_context(|| format!("unexpected `migrate --status` report:\n{report}"))
}
