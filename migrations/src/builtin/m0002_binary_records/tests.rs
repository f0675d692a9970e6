use std::cell::RefCell;
use std::collections::BTreeMap;

use prost::Message;
use reconciled_proto::store::v1 as pb;
use serde_json::{Value, json};

use super::{BATCH_BYTES, BATCH_WRITES};
use crate::layout::{
    CHUNK_SPACE, KIND_CURRENT_ITEM, KIND_EVENT, KIND_INTENDED_ITEM, KIND_TENANT, KIND_TYPE_SPEC,
    MAX_PLAIN_VALUE_BYTES, NEXT_TENANT_ID_KEY, SCHEMA_VERSION_KEY, chunk_header, chunk_key,
    encode_version, kind_prefix, parse_chunk_header,
};
use crate::{MigrationError, MigrationStore, Record, Runner, builtin};

/// An in-memory store that records every `apply` call.
#[derive(Default)]
struct Memory {
    data: RefCell<BTreeMap<Vec<u8>, Vec<u8>>>,
    /// Per `apply`: its puts and how many deletes.
    applies: RefCell<Vec<(Vec<Record>, usize)>>,
}

impl Memory {
    fn put(&self, key: Vec<u8>, value: impl Into<Vec<u8>>) {
        self.data.borrow_mut().insert(key, value.into());
    }

    fn put_json(&self, key: Vec<u8>, value: &Value) {
        self.put(key, value.to_string());
    }

    fn value(&self, key: &[u8]) -> Vec<u8> {
        self.data
            .borrow()
            .get(key)
            .cloned()
            .unwrap_or_else(|| panic!("no value under {}", super::show_key(key)))
    }

    fn decode<M: Message + Default>(&self, key: &[u8]) -> M {
        M::decode(self.value(key).as_slice()).expect("a protobuf record")
    }

    fn snapshot(&self) -> BTreeMap<Vec<u8>, Vec<u8>> {
        self.data.borrow().clone()
    }

    fn apply_count(&self) -> usize {
        self.applies.borrow().len()
    }
}

impl MigrationStore for Memory {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MigrationError> {
        Ok(self.data.borrow().get(key).cloned())
    }

    fn scan_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Record>, MigrationError> {
        Ok(self
            .data
            .borrow()
            .range(prefix.to_vec()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .filter(|(key, _)| after.is_none_or(|after| key.as_slice() > after))
            .take(limit)
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect())
    }

    fn apply(&self, puts: Vec<Record>, deletes: Vec<Vec<u8>>) -> Result<(), MigrationError> {
        let mut data = self.data.borrow_mut();
        for key in &deletes {
            data.remove(key);
        }
        for (key, value) in &puts {
            data.insert(key.clone(), value.clone());
        }
        self.applies.borrow_mut().push((puts, deletes.len()));
        Ok(())
    }
}

fn migrate(db: &Memory) {
    super::apply(db).expect("the migration succeeds");
}

fn tenant_key(tenant: u64) -> Vec<u8> {
    kind_prefix(tenant, KIND_TENANT)
}

fn item_key(tenant: u64, kind: u8, item_type: &str, name: &str) -> Vec<u8> {
    [
        kind_prefix(tenant, kind).as_slice(),
        item_type.as_bytes(),
        &[0],
        name.as_bytes(),
    ]
    .concat()
}

fn spec_key(tenant: u64, item_type: &str) -> Vec<u8> {
    [
        kind_prefix(tenant, KIND_TYPE_SPEC).as_slice(),
        item_type.as_bytes(),
    ]
    .concat()
}

fn event_key(tenant: u64, revision: u64, chunk: u32) -> Vec<u8> {
    [
        kind_prefix(tenant, KIND_EVENT).as_slice(),
        &revision.to_be_bytes(),
        &chunk.to_be_bytes(),
    ]
    .concat()
}

fn item_ref(item_type: &str, name: &str) -> Value {
    json!({"item_type": item_type, "name": name})
}

/// An item as the server serialized `Item` (every field is written).
fn item_json(item_type: &str, name: &str, properties: Value, dependencies: Value) -> Value {
    json!({
        "item_type": item_type,
        "name": name,
        "properties": properties,
        "dependencies": dependencies,
        "external": false,
        "subgraph": "",
        "label": "",
        "description": ""
    })
}

fn plain_item(item_type: &str, name: &str, properties: &[u8]) -> pb::Item {
    pb::Item {
        r#type: item_type.into(),
        name: name.into(),
        properties: properties.to_vec(),
        ..Default::default()
    }
}

fn mark(item_type: &str, name: &str, counter: u64) -> pb::Mark {
    pb::Mark {
        r#type: item_type.into(),
        name: name.into(),
        counter,
    }
}

/// A created item as `CurrentItem::created` wrote it: every field but the
/// ones skipped when empty.
fn created_json(item: Value) -> Value {
    json!({
        "state": "Created",
        "applied": item,
        "applied_generation": 1,
        "observed": null,
        "last_operation": "Create",
        "last_error": null,
        "attempts": 0,
        "next_attempt_at_ms": null,
        "failed_generation": 0,
        "in_flight": null,
        "modifications": 0,
        "dependency_marks": [],
        "unknown_was_created": false,
        "needs_recreate_answer": null,
        "retry_of": null,
        "gave_up": false
    })
}

#[test]
fn a_current_item_with_every_field_set_converts_field_by_field() {
    let db = Memory::default();
    let applied = json!({
        "item_type": "vm",
        "name": "web-1",
        "properties": {"cpus": 2},
        "dependencies": [{
            "requires": item_ref("net", "lan"),
            "must_satisfy": "self.up",
            "description": "the network",
            "recreate_when_modified": true,
            "auto_deleted_by_external": false
        }, {
            "requires": item_ref("ext", "x/y"),
            "must_satisfy": "",
            "description": "",
            "recreate_when_modified": false,
            "auto_deleted_by_external": true
        }],
        "external": true,
        "subgraph": "apps/web",
        "label": "Web 1",
        "description": "the first web server"
    });
    let target = item_json("vm", "web-1", json!({"cpus": 4}), json!([]));
    let maybe = item_json("vm", "web-1", json!({"cpus": 3}), json!([]));
    let current = json!({
        "state": "Unknown",
        "applied": applied,
        "applied_generation": 3,
        "observed": {},
        "last_operation": "Modify",
        "last_error": {"code": 14, "message": "the agent went away"},
        "attempts": 2,
        "next_attempt_at_ms": 5_000,
        "failed_generation": 3,
        "in_flight": {
            "kind": "Read",
            "op_id": "1-ab-10",
            "attempt": 1,
            "target_generation": 4,
            "started_at_ms": 6_000,
            "timeout_ms": 60_000,
            "last_progress_ms": 6_500,
            "cancel_requested": true,
            "cancel_requested_at_ms": 6_600,
            "redeliveries": 1,
            "question": false,
            "target": null,
            "progress_message": "reading",
            "resolves": {
                "kind": "Modify",
                "op_id": "1-ab-9",
                "attempt": 2,
                "target_generation": 4,
                "started_at_ms": 4_000,
                "timeout_ms": 30_000,
                "last_progress_ms": null,
                "cancel_requested": false,
                "cancel_requested_at_ms": null,
                "redeliveries": 0,
                "question": true,
                "target": target,
                "dispatch_marks": [
                    [item_ref("net", "lan"), 7],
                    [item_ref("ext", "x/y"), 2]
                ],
                "progress_message": "halfway"
            }
        },
        "modifications": 5,
        "dependency_marks": [
            [item_ref("net", "lan"), 6],
            [item_ref("ext", "x/y"), 1]
        ],
        "unknown_was_created": true,
        "needs_recreate_answer": [4, true],
        "retry_of": {"kind": "Modify", "target_generation": 4, "op_id": "1-ab-9"},
        "gave_up": true,
        "gone_with_external": true,
        "existence_uncertain": true,
        "maybe_applied": maybe
    });
    let key = item_key(7, KIND_CURRENT_ITEM, "vm", "web-1");
    db.put_json(key.clone(), &current);

    migrate(&db);

    let decoded: pb::Current = db.decode(&key);
    let target = plain_item("vm", "web-1", br#"{"cpus":4}"#);
    let expected = pb::Current {
        state: pb::ItemState::Unknown.into(),
        applied: Some(pb::Item {
            r#type: "vm".into(),
            name: "web-1".into(),
            properties: br#"{"cpus":2}"#.to_vec(),
            dependencies: vec![
                pb::Dependency {
                    requires_type: "net".into(),
                    requires_name: "lan".into(),
                    must_satisfy: "self.up".into(),
                    description: "the network".into(),
                    recreate_when_modified: true,
                    auto_deleted_by_external: false,
                },
                pb::Dependency {
                    requires_type: "ext".into(),
                    requires_name: "x/y".into(),
                    must_satisfy: String::new(),
                    description: String::new(),
                    recreate_when_modified: false,
                    auto_deleted_by_external: true,
                },
            ],
            external: true,
            subgraph: "apps/web".into(),
            label: "Web 1".into(),
            description: "the first web server".into(),
        }),
        applied_generation: 3,
        observed: Some(b"{}".to_vec()),
        last_operation: pb::OperationKind::Modify.into(),
        last_error: Some(pb::OperationError {
            code: 14,
            message: "the agent went away".into(),
        }),
        attempts: 2,
        next_attempt_at_ms: Some(5_000),
        failed_generation: 3,
        in_flight: Some(pb::InFlight {
            kind: pb::OperationKind::Read.into(),
            op_id: "1-ab-10".into(),
            attempt: 1,
            target_generation: 4,
            started_at_ms: 6_000,
            timeout_ms: 60_000,
            last_progress_ms: Some(6_500),
            cancel_requested: true,
            cancel_requested_at_ms: Some(6_600),
            redeliveries: 1,
            question: false,
            target: None,
            dispatch_marks: vec![],
            progress_message: Some("reading".into()),
            resolves: Some(Box::new(pb::InFlight {
                kind: pb::OperationKind::Modify.into(),
                op_id: "1-ab-9".into(),
                attempt: 2,
                target_generation: 4,
                started_at_ms: 4_000,
                timeout_ms: 30_000,
                last_progress_ms: None,
                cancel_requested: false,
                cancel_requested_at_ms: None,
                redeliveries: 0,
                question: true,
                target: Some(target),
                // Sorted by (type, name), as the server's map held them.
                dispatch_marks: vec![mark("ext", "x/y", 2), mark("net", "lan", 7)],
                progress_message: Some("halfway".into()),
                resolves: None,
            })),
        }),
        modifications: 5,
        dependency_marks: vec![mark("ext", "x/y", 1), mark("net", "lan", 6)],
        unknown_was_created: true,
        needs_recreate_answer: Some(pb::RecreateAnswer {
            generation: 4,
            needs_recreate: true,
        }),
        retry_of: Some(pb::RetryOf {
            kind: pb::OperationKind::Modify.into(),
            target_generation: 4,
            op_id: "1-ab-9".into(),
        }),
        gave_up: true,
        gone_with_external: true,
        gone_unless_applied: false,
        existence_uncertain: true,
        maybe_applied: vec![plain_item("vm", "web-1", br#"{"cpus":3}"#)],
    };
    assert_eq!(decoded, expected);
    // Field by field, the parts a whole-message comparison could hide.
    assert_eq!(decoded.observed.as_deref(), Some(b"{}".as_slice()));
    assert!(
        decoded
            .in_flight
            .as_ref()
            .is_some_and(|op| op.target.is_none())
    );
}

#[test]
fn a_legacy_current_item_with_an_empty_marks_map_and_no_retry_converts() {
    let db = Memory::default();
    let mut legacy = created_json(item_json("t", "a", json!({}), json!([])));
    let fields = legacy.as_object_mut().expect("an object");
    fields.remove("retry_of");
    fields.remove("gave_up");
    fields.insert("dependency_marks".into(), json!({}));
    let key = item_key(1, KIND_CURRENT_ITEM, "t", "a");
    db.put_json(key.clone(), &legacy);

    migrate(&db);

    let decoded: pb::Current = db.decode(&key);
    assert_eq!(
        decoded,
        pb::Current {
            state: pb::ItemState::Created.into(),
            applied: Some(plain_item("t", "a", b"")),
            applied_generation: 1,
            last_operation: pb::OperationKind::Create.into(),
            ..Default::default()
        }
    );
    assert_eq!(decoded.observed, None, "never reported stays absent");
    assert_eq!(decoded.retry_of, None);
    assert!(decoded.dependency_marks.is_empty());
}

#[test]
fn a_current_item_without_a_last_operation_stores_unspecified() {
    let db = Memory::default();
    let mut creating = created_json(item_json("t", "a", json!({}), json!([])));
    creating["state"] = json!("Creating");
    creating["applied"] = Value::Null;
    creating["last_operation"] = Value::Null;
    let key = item_key(1, KIND_CURRENT_ITEM, "t", "a");
    db.put_json(key.clone(), &creating);

    migrate(&db);

    let decoded: pb::Current = db.decode(&key);
    assert_eq!(decoded.state, i32::from(pb::ItemState::Creating));
    assert_eq!(decoded.applied, None);
    assert_eq!(
        decoded.last_operation,
        i32::from(pb::OperationKind::Unspecified)
    );
}

#[test]
fn a_non_empty_marks_map_is_refused_as_the_server_refuses_it() {
    let db = Memory::default();
    let mut record = created_json(item_json("t", "a", json!({}), json!([])));
    record["dependency_marks"] = json!({"t/b": 1});
    db.put_json(item_key(1, KIND_CURRENT_ITEM, "t", "a"), &record);
    let error = super::apply(&db).expect_err("refused");
    assert!(
        error
            .to_string()
            .contains("dependency marks must be a list of [item, counter] pairs"),
        "{error}"
    );
}

#[test]
fn tenant_records_convert_with_and_without_conditions_and_compaction_floor() {
    let db = Memory::default();
    let limits = json!({
        "max_items": 1_000,
        "max_request_items": 100,
        "max_agents": 4,
        "max_watchers": 8,
        "max_operations_in_flight": 64
    });
    // Written before conditions and the event log existed.
    db.put_json(
        tenant_key(1),
        &json!({
            "id": 1,
            "name": "old",
            "created_at_ms": 1_700_000_000_000u64,
            "generation": 3,
            "observed_generation": 2,
            "revision": 40,
            "limits": limits,
            "token_hash": "ab12",
            "deleted": false
        }),
    );
    db.put_json(
        tenant_key(2),
        &json!({
            "id": 2,
            "name": "new",
            "created_at_ms": 5,
            "generation": 9,
            "observed_generation": 9,
            "revision": 77,
            "limits": {
                "max_items": 0,
                "max_request_items": 0,
                "max_agents": 0,
                "max_watchers": 0,
                "max_operations_in_flight": 0
            },
            "token_hash": "cd34",
            "deleted": true,
            "conditions": [{
                "kind": "Ready",
                "status": true,
                "reason": "Converged",
                "message": "every intended item is created and up to date",
                "observed_generation": 9,
                "last_transition_ms": 100
            }, {
                "kind": "Reconciling",
                "status": false,
                "reason": "Idle",
                "message": "",
                "observed_generation": 9,
                "last_transition_ms": 101
            }, {
                "kind": "Stalled",
                "status": false,
                "reason": "NotStalled",
                "message": "",
                "observed_generation": 8,
                "last_transition_ms": 102
            }],
            "compact_revision": 70
        }),
    );

    migrate(&db);

    assert_eq!(
        db.decode::<pb::Tenant>(&tenant_key(1)),
        pb::Tenant {
            id: 1,
            name: "old".into(),
            created_at_ms: 1_700_000_000_000,
            generation: 3,
            observed_generation: 2,
            revision: 40,
            limits: Some(pb::TenantLimits {
                max_items: 1_000,
                max_request_items: 100,
                max_agents: 4,
                max_watchers: 8,
                max_operations_in_flight: 64,
            }),
            token_hash: "ab12".into(),
            deleted: false,
            conditions: vec![],
            compact_revision: None,
            history_bytes: None,
        }
    );
    let condition =
        |kind: pb::ConditionKind, status, reason: &str, message: &str, g, at| pb::Condition {
            kind: kind.into(),
            status,
            reason: reason.into(),
            message: message.into(),
            observed_generation: g,
            last_transition_ms: at,
        };
    assert_eq!(
        db.decode::<pb::Tenant>(&tenant_key(2)),
        pb::Tenant {
            id: 2,
            name: "new".into(),
            created_at_ms: 5,
            generation: 9,
            observed_generation: 9,
            revision: 77,
            limits: Some(pb::TenantLimits::default()),
            token_hash: "cd34".into(),
            deleted: true,
            conditions: vec![
                condition(
                    pb::ConditionKind::Ready,
                    true,
                    "Converged",
                    "every intended item is created and up to date",
                    9,
                    100
                ),
                condition(pb::ConditionKind::Reconciling, false, "Idle", "", 9, 101),
                condition(pb::ConditionKind::Stalled, false, "NotStalled", "", 8, 102),
            ],
            compact_revision: Some(70),
            history_bytes: None,
        }
    );
}

#[test]
fn an_intended_item_keeps_big_integers_and_nested_properties_exact() {
    let db = Memory::default();
    // Written as text: 2^60 and the float must not pass through an f64
    // rounding or a reordering the test itself would cause.
    let text = r#"{"item":{"item_type":"disk","name":"d1","properties":{"size":1152921504606846976,"ratio":0.1,"neg":-3,"nested":{"list":[1,2.5,"x",null,true,{"b":[]}],"a":{}}},"dependencies":[{"requires":{"item_type":"vm","name":"web-1"},"must_satisfy":"","description":"","recreate_when_modified":false,"auto_deleted_by_external":false}],"external":false,"subgraph":"s","label":"L","description":"D"},"generation":12}"#;
    let key = item_key(3, KIND_INTENDED_ITEM, "disk", "d1");
    db.put(key.clone(), text);

    migrate(&db);

    let decoded: pb::Intended = db.decode(&key);
    assert_eq!(decoded.generation, 12);
    let item = decoded.item.expect("an item");
    // serde_json's maps are sorted: the server wrote properties this way.
    assert_eq!(
        String::from_utf8(item.properties.clone()).expect("UTF-8"),
        r#"{"neg":-3,"nested":{"a":{},"list":[1,2.5,"x",null,true,{"b":[]}]},"ratio":0.1,"size":1152921504606846976}"#
    );
    let properties: Value = serde_json::from_slice(&item.properties).expect("JSON");
    assert_eq!(properties["size"].as_u64(), Some(1 << 60));
    assert_eq!(
        item,
        pb::Item {
            r#type: "disk".into(),
            name: "d1".into(),
            properties: item.properties.clone(),
            dependencies: vec![pb::Dependency {
                requires_type: "vm".into(),
                requires_name: "web-1".into(),
                ..Default::default()
            }],
            external: false,
            subgraph: "s".into(),
            label: "L".into(),
            description: "D".into(),
        }
    );
}

#[test]
fn empty_properties_become_empty_bytes() {
    let db = Memory::default();
    let key = item_key(3, KIND_INTENDED_ITEM, "t", "empty");
    db.put_json(
        key.clone(),
        &json!({"item": item_json("t", "empty", json!({}), json!([])), "generation": 1}),
    );

    migrate(&db);

    let decoded: pb::Intended = db.decode(&key);
    assert_eq!(
        decoded,
        pb::Intended {
            item: Some(plain_item("t", "empty", b"")),
            generation: 1,
        }
    );
}

/// A type spec as `StoredSpec` was written, with `retry` and `schema` given.
fn spec_json(item_type: &str, retry: Value, schema: Option<Value>) -> Value {
    let mut spec = json!({
        "spec": {
            "item_type": item_type,
            "recreate_on_change": ["/size", "/zone"],
            "ask_needs_recreate": true,
            "retry": retry,
            "max_attempts": 5,
            "operation_timeout_ms": 60_000,
            "supports_read": true,
            "max_in_flight": 64
        },
        "epoch": 3
    });
    if let Some(schema) = schema {
        spec["spec"]["schema"] = schema;
    }
    spec
}

#[test]
fn type_specs_convert_each_retry_policy_with_and_without_a_schema() {
    use pb::retry_policy::Policy;

    let db = Memory::default();
    let schema = json!({"type": "object", "properties": {"size": {"type": "integer", "maximum": 1152921504606846976u64}}});
    let cases = [
        (
            "static",
            json!({"Static": {"wait_ms": 10}}),
            Some(schema),
            Policy::StaticWait(pb::StaticRetry { wait_ms: 10 }),
            Some(
                br#"{"properties":{"size":{"maximum":1152921504606846976,"type":"integer"}},"type":"object"}"#
                    .to_vec(),
            ),
        ),
        (
            "random",
            json!({"Random": {"min_ms": 5, "max_ms": 9}}),
            None,
            Policy::Random(pb::RandomRetry {
                min_ms: 5,
                max_ms: 9,
            }),
            None,
        ),
        (
            "exponential",
            json!({"Exponential": {"initial_ms": 1_000, "multiplier": 1.5, "max_ms": 300_000}}),
            Some(Value::Null),
            Policy::Exponential(pb::ExponentialRetry {
                initial_ms: 1_000,
                multiplier: 1.5,
                max_ms: 300_000,
            }),
            None,
        ),
        (
            "boolean-schema",
            json!({"Static": {"wait_ms": 0}}),
            Some(json!(true)),
            Policy::StaticWait(pb::StaticRetry { wait_ms: 0 }),
            Some(b"true".to_vec()),
        ),
    ];
    for (item_type, retry, schema, _, _) in &cases {
        db.put_json(
            spec_key(4, item_type),
            &spec_json(item_type, retry.clone(), schema.clone()),
        );
    }

    migrate(&db);

    for (item_type, _, _, policy, schema) in cases {
        let decoded: pb::Spec = db.decode(&spec_key(4, item_type));
        assert_eq!(
            decoded,
            pb::Spec {
                spec: Some(pb::TypeSpec {
                    item_type: item_type.into(),
                    recreate_on_change: vec!["/size".into(), "/zone".into()],
                    ask_needs_recreate: true,
                    retry: Some(pb::RetryPolicy {
                        policy: Some(policy)
                    }),
                    max_attempts: 5,
                    operation_timeout_ms: 60_000,
                    supports_read: true,
                    max_in_flight: 64,
                    schema,
                }),
                epoch: 3,
                held_by: None,
            },
            "{item_type}"
        );
    }
}

/// A small store of every kind, plus keys the migration must not touch.
fn mixed_store() -> Memory {
    let db = Memory::default();
    db.put(SCHEMA_VERSION_KEY.to_vec(), encode_version(1));
    db.put(NEXT_TENANT_ID_KEY.to_vec(), 3u64.to_be_bytes());
    db.put(b"\x00tenant_name\x00acme".to_vec(), 1u64.to_be_bytes());
    db.put(b"\x00fleet_log".to_vec(), r#"{"revision":4,"floor":0}"#);
    db.put(
        b"\x00tenant_entry\x00acme".to_vec(),
        r#"{"id":1,"token_hash":"ab"}"#,
    );
    for tenant in [1, 2] {
        db.put_json(
            tenant_key(tenant),
            &json!({
                "id": tenant,
                "name": format!("t{tenant}"),
                "created_at_ms": 1,
                "generation": 1,
                "observed_generation": 1,
                "revision": 2,
                "limits": {
                    "max_items": 0,
                    "max_request_items": 0,
                    "max_agents": 0,
                    "max_watchers": 0,
                    "max_operations_in_flight": 0
                },
                "token_hash": "ab",
                "deleted": false
            }),
        );
        let item = item_json("t", "a", json!({"x": tenant}), json!([]));
        db.put_json(
            item_key(tenant, KIND_INTENDED_ITEM, "t", "a"),
            &json!({"item": item.clone(), "generation": 1}),
        );
        db.put_json(
            item_key(tenant, KIND_CURRENT_ITEM, "t", "a"),
            &created_json(item),
        );
        db.put_json(
            spec_key(tenant, "t"),
            &spec_json("t", json!({"Static": {"wait_ms": 1}}), None),
        );
        // Events are protobuf already; one that happens to start with `{`
        // must not be parsed either.
        db.put(event_key(tenant, 1, 0), vec![0x0a, 0x02, 0x08, 0x01]);
        db.put(event_key(tenant, 2, 0), b"{not an event}".to_vec());
        // Journal and backoff kinds are not converted.
        db.put(item_key(tenant, 0x06, "t", "a"), r#"{"journal":1}"#);
        db.put(item_key(tenant, 0x07, "t", "a"), r#"{"backoff":1}"#);
    }
    db
}

/// The keys this migration converts.
fn is_converted(key: &[u8]) -> bool {
    key.len() > 9
        && key[0] == 0x01
        && [
            KIND_TENANT,
            KIND_INTENDED_ITEM,
            KIND_CURRENT_ITEM,
            KIND_TYPE_SPEC,
        ]
        .contains(&key[9])
}

#[test]
fn events_global_keys_and_other_kinds_are_left_untouched() {
    let db = mixed_store();
    let before = db.snapshot();

    migrate(&db);

    let after = db.snapshot();
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>(),
        "no key added or removed"
    );
    for (key, value) in &before {
        if is_converted(key) {
            assert_ne!(&after[key], value, "{} converted", super::show_key(key));
            assert_ne!(after[key].first(), Some(&b'{'));
        } else {
            assert_eq!(&after[key], value, "{} untouched", super::show_key(key));
        }
    }
    assert_eq!(
        before.keys().filter(|key| is_converted(key)).count(),
        8,
        "two tenants of four records each"
    );
    let intended: pb::Intended = db.decode(&item_key(2, KIND_INTENDED_ITEM, "t", "a"));
    assert_eq!(
        intended.item.map(|item| item.properties),
        Some(br#"{"x":2}"#.to_vec())
    );
}

#[test]
fn running_again_changes_nothing() {
    let db = mixed_store();
    migrate(&db);
    let converted = db.snapshot();
    let applies = db.apply_count();
    assert!(applies > 0);

    migrate(&db);

    assert_eq!(db.snapshot(), converted);
    assert_eq!(db.apply_count(), applies, "nothing was written again");
}

#[test]
fn a_store_converted_halfway_is_finished_by_a_rerun() {
    // A crash after the first batch: some records are binary, some JSON.
    let db = mixed_store();
    let expected = {
        let done = mixed_store();
        migrate(&done);
        done.snapshot()
    };
    let first_tenant: Vec<Vec<u8>> = db
        .snapshot()
        .into_keys()
        .filter(|key| is_converted(key) && key[1..9] == 1u64.to_be_bytes())
        .collect();
    for key in first_tenant {
        db.put(key.clone(), expected[&key].clone());
    }

    migrate(&db);

    assert_eq!(db.snapshot(), expected);
}

#[test]
fn a_corrupt_record_fails_naming_its_key_and_writes_nothing_of_its_batch() {
    let db = mixed_store();
    let bad = item_key(2, KIND_CURRENT_ITEM, "t", "b");
    db.put(bad.clone(), r#"{"state": "Created", "applied": "#);
    let before = db.snapshot();

    let error = super::apply(&db).expect_err("a corrupt record");

    let MigrationError::Data { message } = &error else {
        panic!("a data error: {error:?}");
    };
    assert!(message.contains("current item"), "{message}");
    assert!(
        message.contains("0x01000000000000000203740062"),
        "the key in hex: {message}"
    );
    assert!(message.contains(r"\x03t\x00b"), "the key's text: {message}");
    assert!(
        message.contains("EOF while parsing"),
        "serde's error: {message}"
    );
    // Everything fitted in one batch, which was never applied.
    assert_eq!(db.apply_count(), 0);
    assert_eq!(db.snapshot(), before);
}

#[test]
fn a_record_missing_a_required_field_is_refused() {
    let db = Memory::default();
    let key = item_key(1, KIND_INTENDED_ITEM, "t", "a");
    db.put_json(
        key.clone(),
        &json!({"item": {"item_type": "t", "name": "a"}, "generation": 1}),
    );
    let error = super::apply(&db).expect_err("refused");
    assert!(
        error.to_string().contains("missing field `properties`"),
        "{error}"
    );
    assert_eq!(db.value(&key).first(), Some(&b'{'));
}

#[test]
fn many_records_are_written_in_several_bounded_batches() {
    let db = Memory::default();
    for i in 0..250 {
        let name = format!("item-{i:03}");
        db.put_json(
            item_key(1, KIND_INTENDED_ITEM, "t", &name),
            &json!({"item": item_json("t", &name, json!({"i": i}), json!([])), "generation": 1}),
        );
    }
    // Fewer records, but each large: the byte bound splits them.
    let padding = "p".repeat(40_000);
    for i in 0..30 {
        let name = format!("big-{i:02}");
        db.put_json(
            item_key(2, KIND_INTENDED_ITEM, "t", &name),
            &json!({"item": item_json("t", &name, json!({"pad": padding}), json!([])), "generation": 1}),
        );
    }

    migrate(&db);

    let applies = db.applies.borrow();
    let puts: Vec<usize> = applies.iter().map(|(puts, _)| puts.len()).collect();
    assert_eq!(puts.iter().sum::<usize>(), 280);
    // 250 small records need three batches by count; 30 of 40 kB (1.2 MB)
    // need three by size, one of them shared with the last small ones.
    assert!(applies.len() >= 5, "{puts:?}");
    for (puts, deletes) in applies.iter() {
        assert!(puts.len() + deletes <= BATCH_WRITES, "{}", puts.len());
        let bytes: usize = puts.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(bytes <= BATCH_BYTES, "{bytes}");
    }
    assert_eq!(&puts[..2], &[100, 100], "the write bound");
    drop(applies);
    let last: pb::Intended = db.decode(&item_key(1, KIND_INTENDED_ITEM, "t", "item-249"));
    assert_eq!(
        last.item.map(|item| item.properties),
        Some(br#"{"i":249}"#.to_vec())
    );
}

/// Stores `value` under `key` as the chunking layer does.
fn put_chunked(db: &Memory, key: &[u8], value: &[u8]) -> u32 {
    let mut count = 0;
    for (index, piece) in value.chunks(MAX_PLAIN_VALUE_BYTES).enumerate() {
        let index = u32::try_from(index).expect("few chunks");
        db.put(chunk_key(key, index), piece.to_vec());
        count = index + 1;
    }
    db.put(key.to_vec(), chunk_header(count, value.len()));
    count
}

/// The value of `key`, joined from its chunks if it has any.
fn read_whole(db: &Memory, key: &[u8]) -> Vec<u8> {
    let stored = db.value(key);
    match parse_chunk_header(&stored) {
        None => stored,
        Some((count, length)) => {
            let whole: Vec<u8> = (0..count)
                .flat_map(|index| db.value(&chunk_key(key, index)))
                .collect();
            assert_eq!(whole.len() as u64, length);
            whole
        }
    }
}

fn chunk_count(db: &Memory) -> usize {
    db.scan_prefix(&[CHUNK_SPACE]).expect("scan").len()
}

fn many_dependencies(count: usize) -> Value {
    (0..count)
        .map(|i| {
            json!({
                "requires": item_ref("some-long-type-name", &format!("required-item-{i:05}")),
                "must_satisfy": "",
                "description": "",
                "recreate_when_modified": false,
                "auto_deleted_by_external": false
            })
        })
        .collect()
}

#[test]
fn a_chunked_json_record_is_joined_converted_and_stored_plain_when_it_fits() {
    let db = Memory::default();
    let key = item_key(1, KIND_INTENDED_ITEM, "t", "a");
    let record =
        json!({"item": item_json("t", "a", json!({}), many_dependencies(700)), "generation": 2});
    let text = record.to_string().into_bytes();
    assert!(text.len() > MAX_PLAIN_VALUE_BYTES);
    let chunks = put_chunked(&db, &key, &text);
    assert!(chunks >= 2);

    migrate(&db);

    assert_eq!(chunk_count(&db), 0, "the old chunks went");
    let decoded: pb::Intended = db.decode(&key);
    let item = decoded.item.expect("an item");
    assert_eq!(item.dependencies.len(), 700);
    assert_eq!(item.dependencies[699].requires_name, "required-item-00699");

    let converted = db.snapshot();
    migrate(&db);
    assert_eq!(db.snapshot(), converted, "a rerun changes nothing");
}

#[test]
fn a_chunked_record_still_too_large_is_chunked_again() {
    let db = Memory::default();
    let key = item_key(1, KIND_CURRENT_ITEM, "t", "a");
    let padding = "p".repeat(45_000);
    let mut record = created_json(item_json(
        "t",
        "a",
        json!({"pad": padding}),
        many_dependencies(1_000),
    ));
    record["maybe_applied"] = item_json("t", "a", json!({"pad": padding}), json!([]));
    let text = record.to_string().into_bytes();
    let old_chunks = put_chunked(&db, &key, &text);
    assert!(old_chunks >= 4, "{old_chunks}");

    migrate(&db);

    let whole = read_whole(&db, &key);
    assert!(whole.len() > MAX_PLAIN_VALUE_BYTES);
    let chunks = chunk_count(&db);
    assert_eq!(chunks, whole.len().div_ceil(MAX_PLAIN_VALUE_BYTES));
    assert!(
        chunks < old_chunks as usize,
        "the chunks past the new end went"
    );
    let decoded = pb::Current::decode(whole.as_slice()).expect("protobuf");
    assert_eq!(
        decoded
            .maybe_applied
            .iter()
            .map(|item| item.properties.len())
            .collect::<Vec<_>>(),
        [padding.len() + r#"{"pad":""}"#.len()]
    );
    assert_eq!(
        decoded.applied.map(|item| item.dependencies.len()),
        Some(1_000)
    );

    let converted = db.snapshot();
    migrate(&db);
    assert_eq!(db.snapshot(), converted, "a rerun changes nothing");
}

#[test]
fn the_runner_takes_a_version_1_store_to_version_2() {
    let db = mixed_store();
    let runner = Runner::new(builtin()).expect("valid");
    assert_eq!(runner.latest_version(), 2);
    let status = runner.status(&db).expect("status");
    assert_eq!(status.current_version, 1);
    assert_eq!(
        status.pending.iter().map(|m| m.name).collect::<Vec<_>>(),
        ["binary records"]
    );

    assert_eq!(runner.run(&db, || Ok(())), Ok(vec![2]));

    assert_eq!(db.value(SCHEMA_VERSION_KEY), encode_version(2));
    let last = db.applies.borrow().last().cloned().expect("a write");
    assert!(
        last.0.iter().any(|(key, _)| key == SCHEMA_VERSION_KEY),
        "the version went with the last batch"
    );
    assert_eq!(
        db.apply_count(),
        1,
        "one batch: the records and the version"
    );
    let tenant: pb::Tenant = db.decode(&tenant_key(1));
    assert_eq!(tenant.name, "t1");
    assert_eq!(runner.run(&db, || Ok(())), Ok(vec![]));
}

#[test]
fn a_failing_run_leaves_the_store_at_version_1() {
    let db = mixed_store();
    db.put(tenant_key(2), "{}");
    let runner = Runner::new(builtin()).expect("valid");
    let error = runner.run(&db, || Ok(())).expect_err("corrupt tenant");
    assert!(error.to_string().contains("stays at version 1"), "{error}");
    assert!(error.to_string().contains("tenant record"), "{error}");
    assert_eq!(db.value(SCHEMA_VERSION_KEY), encode_version(1));
}
