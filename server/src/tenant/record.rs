//! Stored records of a tenant and their encoding.
//!
//! Values are JSON: readable with `sled` tools when debugging, versioned by
//! the schema version, and small (every value stays under 64 KiB: items
//! are limited to 64 KiB on submit).

use serde::{Deserialize, Serialize};

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
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, TenantError> {
    serde_json::to_vec(value).map_err(|error| TenantError::Encode {
        record: std::any::type_name::<T>(),
        message: error.to_string(),
    })
}

/// Decodes the store value of `key`, written by [`encode`].
pub fn decode<T: for<'de> Deserialize<'de>>(key: &[u8], bytes: &[u8]) -> Result<T, TenantError> {
    serde_json::from_slice(bytes).map_err(|error| TenantError::Corrupt {
        key: String::from_utf8_lossy(key).into_owned(),
        message: error.to_string(),
    })
}

/// A current item as stored: the same structure as in memory.
pub type StoredCurrent = CurrentItem;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::graph::{Dependency, InFlight, ItemRef, OperationKind, RetryOf};

    #[test]
    fn a_current_item_with_dependency_marks_and_a_retry_round_trips_through_its_encoding() {
        let required = ItemRef::new("t2", "c");
        let applied = Item::new("t1", "a", Default::default()).depends_on(Dependency {
            recreate_when_modified: true,
            ..Dependency::on(required.clone())
        });
        let mut current = CurrentItem::created(Arc::new(applied), 3);
        current.dependency_marks.insert(required, 7);
        current
            .dependency_marks
            .insert(ItemRef::new("ext", "x/y"), 2);
        current.retry_of = Some(RetryOf {
            kind: OperationKind::Modify,
            target_generation: 3,
            op_id: "1-ab-9".into(),
        });
        current.in_flight = Some(InFlight::new(
            OperationKind::Modify,
            "1-ab-9".into(),
            2,
            3,
            1_000,
            60_000,
        ));
        let bytes = encode(&current).expect("a current item encodes");
        let decoded: CurrentItem = decode(b"key", &bytes).expect("and decodes");
        assert_eq!(decoded, current);
    }

    #[test]
    fn records_written_before_retries_and_mark_pairs_still_decode() {
        let current = CurrentItem::created(Arc::new(Item::new("t", "a", Default::default())), 1);
        let mut json: serde_json::Value =
            serde_json::from_slice(&encode(&current).expect("encodes")).expect("is JSON");
        let fields = json.as_object_mut().expect("an object");
        fields.remove("retry_of");
        fields.insert("dependency_marks".into(), serde_json::json!({}));
        let decoded: CurrentItem =
            decode(b"key", json.to_string().as_bytes()).expect("an older record decodes");
        assert_eq!(decoded.retry_of, None);
    }
}
