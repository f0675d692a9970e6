//! Stored records of a tenant and their encoding.
//!
//! Values are protobuf messages of package `reconciled.store.v1`
//! (`proto/reconciled/store/v1/records.proto`, converted in [`binary`]),
//! with property values as compact JSON text inside them. Store schema
//! version 1 held JSON records; migration 0002 rewrote them. A record is
//! never larger than its JSON form was, so every size bound stated in JSON
//! bytes (items are limited to 64 KiB on submit) still holds.

mod binary;

use prost::Message as _;
use serde::{Deserialize, Serialize};

pub use binary::StoredRecord;

use super::error::TenantError;
use crate::engine::conditions::Condition;
use crate::graph::{CurrentItem, Item};

/// Per-tenant limits; 0 means "the server default".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantLimits {
    /// Intended items the tenant may hold.
    pub max_items: u64,
    /// Items one SubmitIntent may carry.
    pub max_request_items: u64,
    /// Agents connected at once.
    pub max_agents: u64,
    /// Watchers open at once.
    pub max_watchers: u64,
    /// Operations in flight at once.
    pub max_operations_in_flight: u64,
}

impl TenantLimits {
    /// The limits as the API shows them.
    pub fn to_proto(&self) -> reconciled_proto::v1::TenantLimits {
        reconciled_proto::v1::TenantLimits {
            max_items: self.max_items,
            max_request_items: self.max_request_items,
            max_agents: self.max_agents,
            max_watchers: self.max_watchers,
            max_operations_in_flight: self.max_operations_in_flight,
        }
    }

    /// The limits a request asks for (absent = all server defaults).
    pub fn from_proto(limits: Option<reconciled_proto::v1::TenantLimits>) -> Self {
        let limits = limits.unwrap_or_default();
        Self {
            max_items: limits.max_items,
            max_request_items: limits.max_request_items,
            max_agents: limits.max_agents,
            max_watchers: limits.max_watchers,
            max_operations_in_flight: limits.max_operations_in_flight,
        }
    }
}

/// The tenant record: identity, counters and the hashed token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRecord {
    /// Internal id, never reused; the prefix of every key of the tenant.
    pub id: u64,
    /// The tenant's name, as users type it.
    pub name: String,
    /// Creation time (unix milliseconds).
    pub created_at_ms: u64,
    /// Intent generation: grows with every equality-relevant intent change.
    pub generation: u64,
    /// The newest generation the tenant was quiescent at.
    pub observed_generation: u64,
    /// Grows by one with every committed change of the tenant.
    pub revision: u64,
    /// Limits set at creation.
    pub limits: TenantLimits,
    /// SHA-256 of the tenant's token, hex encoded.
    pub token_hash: String,
    /// Set when the tenant is being deleted (a tombstone).
    pub deleted: bool,
    /// Ready / Reconciling / Stalled, as of the last pass.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The event log's compaction floor: the events of every revision
    /// after it are kept. Absent in records written before the event log
    /// existed; then no earlier event is kept and the floor is `revision`.
    #[serde(default)]
    pub compact_revision: Option<u64>,
    /// The bytes (keys and values) of the event log after the floor, which
    /// `--watch-history-bytes` bounds. Absent in records written before
    /// they were kept, and after `reconciled repair` compacted the log;
    /// then they are counted when the tenant loads.
    #[serde(default)]
    pub history_bytes: Option<u64>,
}

/// How far revisions start past the clock: a tenant's revision grows by
/// one per commit, so no tenant reaches `now_ms × REVISIONS_PER_MS` unless
/// it averaged more commits than this per millisecond since it was
/// created. 1,024 per millisecond is far beyond what durable commits allow.
pub const REVISIONS_PER_MS: u64 = 1024;

/// The revision a tenant record made now starts from: past a floor from
/// the clock (`now_ms × REVISIONS_PER_MS`), with its history compacted to
/// it, so every earlier revision reads as compacted.
///
/// A watcher may hold a revision of an earlier tenant of the same name
/// (deleted, then created again) or of a record `reconciled repair` had to
/// rebuild. Had the new record counted from 1 again, that watcher's resume
/// would, once the new record passed its revision, continue into different
/// changes given the same numbers, without a word. No revision of an
/// earlier record can have reached the floor, so it is refused as
/// compacted instead, and the watcher starts over from a snapshot.
pub fn first_revision(now_ms: u64) -> u64 {
    now_ms.saturating_mul(REVISIONS_PER_MS).max(1)
}

impl TenantRecord {
    /// The event log's compaction floor (see `compact_revision`).
    pub fn events_floor(&self) -> u64 {
        self.compact_revision.unwrap_or(self.revision)
    }
}

/// An intended item as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredIntended {
    /// The intended value.
    pub item: Item,
    /// The generation that last changed its content.
    pub generation: u64,
}

/// Encodes a record as a store value.
pub fn encode<T: StoredRecord>(value: &T) -> Result<Vec<u8>, TenantError> {
    encoded::<T>(value.to_message())
}

/// Encodes the intended record of `item` at `generation` as a store value:
/// [`encode`] of a [`StoredIntended`], from a borrowed item (a commit of
/// many items would otherwise copy each one to encode it).
pub fn encode_intended(item: &Item, generation: u64) -> Result<Vec<u8>, TenantError> {
    encoded::<StoredIntended>(binary::intended_message(item, generation))
}

/// The bytes of a record of type `T` made into its `message`, or why it
/// could not be.
fn encoded<T: StoredRecord>(message: Result<T::Message, String>) -> Result<Vec<u8>, TenantError> {
    let message = message.map_err(|message| TenantError::Encode {
        record: std::any::type_name::<T>(),
        message,
    })?;
    Ok(message.encode_to_vec())
}

/// Decodes the store value of `key`, written by [`encode`].
pub fn decode<T: StoredRecord>(key: &[u8], bytes: &[u8]) -> Result<T, TenantError> {
    let corrupt = |message: String| TenantError::Corrupt {
        key: String::from_utf8_lossy(key).into_owned(),
        message,
    };
    let message = T::Message::decode(bytes).map_err(|error| corrupt(error.to_string()))?;
    T::from_message(message).map_err(corrupt)
}

/// A current item as stored: the same structure as in memory.
pub type StoredCurrent = CurrentItem;

/// Records for tests: with every part set (the codec's and the migration's
/// tests), and a fresh tenant's.
#[cfg(test)]
pub(crate) mod samples {
    use std::sync::Arc;

    use super::*;
    use crate::graph::{
        Dependency, InFlight, ItemRef, ItemState, OperationError, OperationKind, Properties,
        RetryOf,
    };

    /// A current item with every optional part set, including the value
    /// shapes JSON-in-protobuf must keep exact.
    pub(crate) fn current_with_everything_set() -> CurrentItem {
        let required = ItemRef::new("t2", "c");
        let mut properties = Properties::new();
        properties.insert(
            "big".into(),
            serde_json::json!(1_152_921_504_606_846_977_u64),
        );
        properties.insert(
            "nested".into(),
            serde_json::json!({"a": [1, 2.5, null, "ü"]}),
        );
        let mut applied = Item::new("t1", "a", properties)
            .with_label("label")
            .with_description("described");
        applied.subgraph = "sub".into();
        let applied = applied.depends_on(
            Dependency::on(required.clone())
                .with_must_satisfy("self.v >= 1")
                .with_description("edge")
                .with_recreate_when_modified(true)
                .with_auto_deleted_by_external(true),
        );
        let applied = Arc::new(applied);
        let mut lost = InFlight::new(OperationKind::Create, "1-ab-8".into(), 1, 2, 900, 60_000);
        lost.target = Some(applied.clone());
        let mut read = InFlight::new(OperationKind::Read, "1-ab-9".into(), 2, 3, 1_000, 60_000);
        read.last_progress_ms = Some(1_100);
        read.cancel_requested = true;
        read.cancel_requested_at_ms = Some(1_200);
        read.redeliveries = 2;
        read.question = true;
        read.target = Some(applied.clone());
        read.dispatch_marks.insert(required.clone(), 4);
        read.progress_message = Some("half way".into());
        read.resolves = Some(Box::new(lost));
        let mut current = CurrentItem::created(applied.clone(), 3);
        current.state = ItemState::Unknown;
        current.observed = Some(Arc::new(Properties::new()));
        current.last_operation = Some(OperationKind::Modify);
        current.attempts = 2;
        current.in_flight = Some(Box::new(read));
        current.modifications = 6;
        current.unknown_was_created = true;
        current.gave_up = true;
        current.gone_with_external = true;
        current.gone_unless_applied = true;
        current.existence_uncertain = true;
        current.with_rare(|rare| {
            rare.last_error = Some(OperationError {
                code: 9,
                message: "refused".into(),
            });
            rare.next_attempt_at_ms = Some(5_000);
            rare.failed_generation = 3;
            rare.dependency_marks.insert(required, 7);
            rare.needs_recreate_answer = Some((3, true));
            rare.retry_of = Some(RetryOf {
                kind: OperationKind::Modify,
                target_generation: 3,
                op_id: "1-ab-9".into(),
            });
            rare.maybe_applied = vec![applied];
        })
    }

    /// A tenant record with every optional part set.
    pub(crate) fn tenant_with_everything_set() -> TenantRecord {
        TenantRecord {
            id: 7,
            name: "acme".into(),
            created_at_ms: 1,
            generation: 4,
            observed_generation: 3,
            revision: 19,
            limits: TenantLimits {
                max_items: 1,
                max_request_items: 2,
                max_agents: 3,
                max_watchers: 4,
                max_operations_in_flight: 5,
            },
            token_hash: "ab".repeat(32),
            deleted: true,
            conditions: vec![Condition {
                kind: crate::engine::conditions::ConditionKind::Stalled,
                status: true,
                reason: "TerminalFailure".into(),
                message: "t1/a failed".into(),
                observed_generation: 4,
                last_transition_ms: 10,
            }],
            compact_revision: Some(12),
            history_bytes: Some(4_096),
        }
    }

    /// A fresh tenant's record: default limits, nothing committed yet but
    /// `revision`, an empty event log after revision 0.
    pub(crate) fn fresh_tenant(id: u64, name: &str, revision: u64) -> TenantRecord {
        TenantRecord {
            id,
            name: name.into(),
            created_at_ms: 0,
            generation: 0,
            observed_generation: 0,
            revision,
            limits: TenantLimits::default(),
            token_hash: String::new(),
            deleted: false,
            conditions: Vec::new(),
            compact_revision: Some(0),
            history_bytes: Some(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_of_a_current_item_round_trips_and_its_record_is_smaller_than_its_json() {
        let current = samples::current_with_everything_set();
        let bytes = encode(&current).expect("a current item encodes");
        let decoded: CurrentItem = decode(b"key", &bytes).expect("and decodes");
        assert_eq!(decoded, current);
        let json = serde_json::to_vec(&current).expect("JSON encodes");
        assert!(
            bytes.len() < json.len(),
            "{} bytes binary, {} JSON",
            bytes.len(),
            json.len()
        );
        let observed = decoded.observed.expect("observed kept");
        assert!(
            observed.is_empty(),
            "an empty observed object stays present"
        );
    }

    /// Every value an item may hold besides its applied one is kept, in
    /// the binary record and in JSON; one value is written to JSON as the
    /// item itself, the shape of the schema-version-1 records.
    #[test]
    fn every_value_an_item_may_hold_round_trips() {
        let one = samples::current_with_everything_set();
        let json = serde_json::to_value(&one).expect("JSON encodes");
        assert!(
            json["maybe_applied"].is_object(),
            "one value is an object: {}",
            json["maybe_applied"]
        );
        let mut second = (*one.rare.maybe_applied[0]).clone();
        second.properties.insert("v".into(), 2.into());
        let two = one.may_also_hold(Some(std::sync::Arc::new(second)));
        assert_eq!(two.rare.maybe_applied.len(), 2);
        let decoded: CurrentItem =
            decode(b"key", &encode(&two).expect("encodes")).expect("decodes");
        assert_eq!(decoded, two);
        let from_json: CurrentItem =
            serde_json::from_slice(&serde_json::to_vec(&two).expect("JSON encodes"))
                .expect("JSON decodes");
        assert_eq!(from_json, two);
    }

    #[test]
    fn tenant_intended_and_spec_records_round_trip() {
        let tenant = samples::tenant_with_everything_set();
        let decoded: TenantRecord =
            decode(b"t", &encode(&tenant).expect("encodes")).expect("decodes");
        assert_eq!(decoded, tenant);
        let without_floor = TenantRecord {
            compact_revision: None,
            history_bytes: None,
            ..tenant
        };
        let decoded: TenantRecord =
            decode(b"t", &encode(&without_floor).expect("encodes")).expect("decodes");
        assert_eq!(decoded.compact_revision, None);
        assert_eq!(decoded.history_bytes, None);

        let intended = StoredIntended {
            item: (**samples::current_with_everything_set()
                .applied
                .as_ref()
                .expect("applied"))
            .clone(),
            generation: 3,
        };
        let decoded: StoredIntended =
            decode(b"i", &encode(&intended).expect("encodes")).expect("decodes");
        assert_eq!(decoded, intended);

        let policies = [
            crate::engine::exec::RetryPolicy::Static { wait_ms: 5 },
            crate::engine::exec::RetryPolicy::Random {
                min_ms: 1,
                max_ms: 9,
            },
            crate::engine::exec::RetryPolicy::default(),
        ];
        for (index, retry) in policies.into_iter().enumerate() {
            let mut spec = crate::engine::exec::TypeSpec::new("vlan");
            spec.retry = retry;
            spec.recreate_on_change = vec!["/id".into()];
            spec.supports_read = true;
            spec.schema = (index == 0).then(|| {
                crate::engine::schema::TypeSchema::stored(serde_json::json!({"type": "object"}))
            });
            let stored = crate::engine::exec::StoredSpec {
                spec,
                epoch: 2,
                held_by: (index == 1).then(|| "agent-1".to_owned()),
            };
            let decoded: crate::engine::exec::StoredSpec =
                decode(b"s", &encode(&stored).expect("encodes")).expect("decodes");
            assert_eq!(decoded, stored);
        }
    }

    #[test]
    fn a_record_that_breaks_the_model_or_is_not_binary_is_refused_naming_its_key() {
        let mut message = samples::current_with_everything_set()
            .to_message()
            .expect("converts");
        message.state = 42;
        let error = decode::<CurrentItem>(b"tenant/current/t1/a", &message.encode_to_vec())
            .expect_err("an unknown state is refused");
        let text = error.to_string();
        assert!(text.contains("tenant/current/t1/a") && text.contains("unknown item state 42"));

        let json =
            serde_json::to_vec(&samples::current_with_everything_set()).expect("JSON encodes");
        assert!(
            decode::<CurrentItem>(b"k", &json).is_err(),
            "a JSON record (schema version 1) is not read as binary"
        );
    }
}
