//! Fuzzing of the stored-record decoders through the real start-up path: a
//! store holding two tenants has one record of one tenant damaged (cut,
//! bytes flipped, replaced by noise, or a field's value swapped for another
//! of any wire type, JSON text included), and the directory loads it. Whatever the damage, start-up
//! succeeds, the other tenant is served, and the damaged tenant is either
//! served (its owner answering) or quarantined with its error (issue:
//! "a corrupt or unreadable tenant must not stop the server").
//!
//! The corpus is the set of records a real tenant writes: its record, an
//! intended chain with a predicate, current records (created, one with an
//! operation in flight, an external item), a registered type spec, and
//! the events of its commits. Proptest keeps failing cases under
//! `server/proptest-regressions/`.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use serde_json::Value;

use super::directory::TenantDirectory;
use super::owner::OwnerSettings;
use super::persist;
use super::record::TenantLimits;
use crate::engine::exec::port::ExternalChange;
use crate::engine::exec::{Commit, ItemWrite};
use crate::engine::exec::{StoredSpec, TypeSpec};
use crate::engine::intent::ValidatedSubmit;
use crate::graph::predicate::Predicate;
use crate::graph::{CurrentItem, Dependency, InFlight, Item, ItemRef, OperationKind};
use crate::store::{InMemoryStore, Store, WriteBatch, keys};

type Records = BTreeMap<Vec<u8>, Vec<u8>>;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn store_of(records: &Records) -> Arc<dyn Store> {
    let store = InMemoryStore::new();
    let mut batch = WriteBatch::new();
    for (key, value) in records {
        batch.put(key.clone(), value.clone());
    }
    store.commit_blocking(batch).expect("records copied");
    Arc::new(store)
}

fn chain() -> ValidatedSubmit {
    let mut on_a = Dependency::on(ItemRef::new("t", "a"));
    on_a.set_must_satisfy("self.v >= 1");
    let mut a = Item::new("t", "a", Default::default());
    a.properties.insert("v".into(), 1.into());
    let b = Item::new("t", "b", Default::default()).depends_on(on_a);
    let c =
        Item::new("t", "c", Default::default()).depends_on(Dependency::on(ItemRef::new("t", "b")));
    ValidatedSubmit {
        subgraph: String::new(),
        items: vec![
            (a, Vec::new()),
            (
                b,
                vec![Some(
                    Predicate::compile("self.v >= 1").expect("a valid predicate"),
                )],
            ),
            (c, vec![None]),
        ],
        expected_generation: None,
        dry_run: false,
    }
}

/// The records of tenants `acme` (the one damaged) and `bystander`.
fn corpus() -> Records {
    let store = Arc::new(InMemoryStore::new());
    let acme_id = runtime().block_on(async {
        let directory = TenantDirectory::load(store.clone(), OwnerSettings::default())
            .expect("an empty store loads");
        let (acme, _) = directory
            .create("acme", TenantLimits::default())
            .await
            .expect("created");
        directory
            .create("bystander", TenantLimits::default())
            .await
            .expect("created");
        acme.submit(chain()).await.expect("submitted");
        let mut external = Item::new("e", "x", Default::default());
        external.external = true;
        acme.report_external(vec![ExternalChange::Put {
            item: external,
            modified: false,
        }])
        .await
        .expect("reported");
        directory.shutdown().await;
        acme.id
    });
    // What an agent's work leaves: a created item, one with a Create in
    // flight (journaled), a registered type.
    let a = Item::new("t", "a", Default::default());
    let running = InFlight::new(OperationKind::Create, "1-2-3".into(), 1, 1, 5, 60_000);
    let written = |item: &str, value: CurrentItem| ItemWrite {
        item: ItemRef::new("t", item),
        before: None,
        after: Some(Arc::new(value)),
    };
    let commit = Commit {
        items: vec![
            written("a", CurrentItem::created(Arc::new(a), 1)),
            written("b", CurrentItem::creating(running)),
        ],
        specs: vec![StoredSpec {
            spec: TypeSpec::new("t"),
            epoch: 2,
            held_by: None,
        }],
        ..Commit::default()
    };
    let mut batch = WriteBatch::new();
    persist::write_commit(&mut batch, acme_id, &commit).expect("encoded");
    store.commit_blocking(batch).expect("committed");
    store.snapshot()
}

/// The keys of `acme`'s records (created first: tenant id 1).
fn damageable(records: &Records) -> Vec<Vec<u8>> {
    let acme = keys::tenant_prefix(1);
    records
        .keys()
        .filter(|key| key.starts_with(&acme))
        .cloned()
        .collect()
}

/// One way to damage a record.
#[derive(Clone, Debug)]
enum Damage {
    /// Keep only the first `at` bytes (modulo the length).
    Cut { at: usize },
    /// Flip bits of the byte at `at`.
    Flip { at: usize, mask: u8 },
    /// Replace the whole value.
    Noise(Vec<u8>),
    /// Replace the value of the `nth` top-level field of the message by
    /// `with` (any wire type, keeping the field number).
    SwapField { nth: usize, with: FieldValue },
}

/// A protobuf field value of any wire type.
#[derive(Debug, Clone)]
enum FieldValue {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    Bytes(Vec<u8>),
    /// JSON text in a length-delimited field: what properties are stored as.
    Json(Value),
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::String),
        Just(Value::String("\u{0}\u{7f}\u{202e}".into())),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,12}", inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn field_value() -> impl Strategy<Value = FieldValue> {
    prop_oneof![
        any::<u64>().prop_map(FieldValue::Varint),
        any::<u64>().prop_map(FieldValue::Fixed64),
        any::<u32>().prop_map(FieldValue::Fixed32),
        prop::collection::vec(any::<u8>(), 0..24).prop_map(FieldValue::Bytes),
        json_value().prop_map(FieldValue::Json),
    ]
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        any::<usize>().prop_map(|at| Damage::Cut { at }),
        (any::<usize>(), 1..=255u8).prop_map(|(at, mask)| Damage::Flip { at, mask }),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Damage::Noise),
        (any::<usize>(), field_value()).prop_map(|(nth, with)| Damage::SwapField { nth, with }),
    ]
}

fn apply(damage: &Damage, value: &[u8]) -> Vec<u8> {
    match damage {
        Damage::Cut { at } => value[..at % (value.len() + 1)].to_vec(),
        Damage::Flip { at, mask } => {
            let mut out = value.to_vec();
            if !out.is_empty() {
                let index = at % out.len();
                out[index] ^= mask;
            }
            out
        }
        Damage::Noise(bytes) => bytes.clone(),
        Damage::SwapField { nth, with } => {
            let fields = top_level_fields(value);
            if fields.is_empty() {
                return apply(
                    &Damage::Flip {
                        at: *nth,
                        mask: 0x5a,
                    },
                    value,
                );
            }
            let (number, span) = fields[nth % fields.len()].clone();
            let mut out = value[..span.start].to_vec();
            encode_field(number, with, &mut out);
            out.extend_from_slice(&value[span.end..]);
            out
        }
    }
}

/// The field numbers and byte spans (tag included) of a message's
/// top-level fields, as far as they parse.
fn top_level_fields(value: &[u8]) -> Vec<(u64, std::ops::Range<usize>)> {
    let mut fields = Vec::new();
    let mut at = 0;
    while at < value.len() {
        let start = at;
        let Some(tag) = read_varint(value, &mut at) else {
            break;
        };
        let length = match tag & 7 {
            0 => read_varint(value, &mut at).map(|_| 0),
            1 => Some(8),
            2 => read_varint(value, &mut at).and_then(|n| usize::try_from(n).ok()),
            5 => Some(4),
            _ => None,
        };
        match length {
            Some(length) if at + length <= value.len() => {
                at += length;
                fields.push((tag >> 3, start..at));
            }
            _ => break,
        }
    }
    fields
}

fn read_varint(value: &[u8], at: &mut usize) -> Option<u64> {
    let mut result = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *value.get(*at)?;
        *at += 1;
        result |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(result);
        }
    }
    None
}

fn write_varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn encode_field(number: u64, with: &FieldValue, out: &mut Vec<u8>) {
    let bytes = |data: &[u8], out: &mut Vec<u8>| {
        write_varint(number << 3 | 2, out);
        write_varint(data.len() as u64, out);
        out.extend_from_slice(data);
    };
    match with {
        FieldValue::Varint(value) => {
            write_varint(number << 3, out);
            write_varint(*value, out);
        }
        FieldValue::Fixed64(value) => {
            write_varint(number << 3 | 1, out);
            out.extend_from_slice(&value.to_le_bytes());
        }
        FieldValue::Fixed32(value) => {
            write_varint(number << 3 | 5, out);
            out.extend_from_slice(&value.to_le_bytes());
        }
        FieldValue::Bytes(data) => bytes(data, out),
        FieldValue::Json(json) => bytes(&serde_json::to_vec(json).expect("JSON encodes"), out),
    }
}

/// Loads `records` and checks the promise; returns what became of `acme`.
fn load_and_check(records: &Records) -> Result<&'static str, TestCaseError> {
    runtime().block_on(async {
        let directory = TenantDirectory::load(store_of(records), OwnerSettings::default())
            .map_err(|error| TestCaseError::fail(format!("start-up failed: {error}")))?;
        let bystander = directory
            .get("bystander")
            .ok_or_else(|| TestCaseError::fail("the bystander is not served"))?;
        bystander
            .submit(chain())
            .await
            .map_err(|error| TestCaseError::fail(format!("the bystander failed: {error}")))?;
        let fate = match directory.get("acme") {
            Some(acme) => {
                // Served: its owner answers (an error is fine, a dead owner
                // is not).
                let answer = acme.submit(chain()).await;
                if matches!(answer, Err(super::error::TenantError::Gone)) {
                    return Err(TestCaseError::fail("the damaged tenant's owner died"));
                }
                "served"
            }
            None if directory.quarantined("acme").is_some() => "quarantined",
            // The damage hid the tenant (its record marked deleted, say):
            // the bystander is still served, which is the promise.
            None => "not loaded",
        };
        directory.shutdown().await;
        Ok(fate)
    })
}

#[test]
fn the_undamaged_corpus_loads_both_tenants() {
    let records = corpus();
    assert!(damageable(&records).len() >= 8, "{records:?}");
    assert_eq!(load_and_check(&records).expect("loads"), "served");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn a_damaged_record_never_stops_the_server_or_its_other_tenants(
        pick in any::<usize>(),
        damage in damage(),
    ) {
        let mut records = corpus();
        let keys = damageable(&records);
        let key = &keys[pick % keys.len()];
        let damaged = apply(&damage, &records[key]);
        records.insert(key.clone(), damaged);
        load_and_check(&records)?;
    }
}
