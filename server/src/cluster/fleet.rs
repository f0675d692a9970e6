//! The fleet stream (`Tenants.WatchFleet`) of replicas on etcd: one order
//! for the whole fleet, the same on every replica, that survives failover.
//!
//! A fleet event is a change of a tenant's directory entry
//! ([`TenantEntry`]) that changes its conditions, creates it or deletes it;
//! its revision is etcd's revision of that change. Every replica watches
//! the entries (through the [catalog](super::catalog)) and publishes what
//! it sees, in etcd's order, to a local [`Hub`]; a watcher that resumes
//! from an older revision (on another replica after a failover, say)
//! replays etcd's own history of the entries. So every replica serves the
//! same sequence, and a revision means the same on all of them. What etcd
//! has compacted is gone: resuming before it answers `REVISION_COMPACTED`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use reconciled_proto::v1;

use crate::store::etcd::RecordChange;
use crate::store::{EtcdStore, Record, StoreError, keys};
use crate::watch::error::WatchError;
use crate::watch::hub::{Hub, Revision};
use crate::watch::stream::HistorySource;
use crate::wire::fleet_event;

use super::catalog::TenantEntry;

/// Every live tenant's latest fleet event, as of one revision.
#[derive(Debug, Default)]
struct Snapshot {
    revision: u64,
    tenants: BTreeMap<String, v1::FleetEvent>,
}

/// The fleet stream of this replica.
pub struct ClusterFleet {
    store: Arc<EtcdStore>,
    snapshot: Mutex<Snapshot>,
    /// Live fleet groups, by etcd revision.
    pub hub: Arc<Hub<v1::FleetEvent>>,
}

impl std::fmt::Debug for ClusterFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterFleet")
            .field("published", &self.hub.published())
            .finish_non_exhaustive()
    }
}

impl ClusterFleet {
    /// A fleet stream over `store`'s entries whose hub keeps up to
    /// `ring_events` events in memory while watched.
    pub fn new(store: Arc<EtcdStore>, ring_events: usize) -> Arc<Self> {
        Arc::new(Self {
            store,
            snapshot: Mutex::new(Snapshot::default()),
            hub: Arc::new(Hub::new(0, ring_events)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Snapshot> {
        self.snapshot
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts from the entries read at etcd revision `revision`.
    pub fn seed(&self, revision: i64, entries: &[Record]) {
        let revision = revision_u64(revision);
        let mut snapshot = self.lock();
        snapshot.revision = revision;
        snapshot.tenants = entries
            .iter()
            .filter_map(|(key, value)| {
                let name = keys::parse_tenant_entry_key(key)?;
                let entry = TenantEntry::decode(value)?;
                Some((name.clone(), event_of(&name, Some(&entry))))
            })
            .collect();
        self.hub.publish(revision, Vec::new());
    }

    /// Publishes the fleet events of entry changes seen by the watch, in
    /// order, one group per etcd revision.
    pub fn publish(&self, changes: &[RecordChange]) {
        let mut snapshot = self.lock();
        for (revision, events) in group(changes) {
            for event in &events {
                if event.deleted {
                    snapshot.tenants.remove(&event.tenant);
                } else {
                    snapshot.tenants.insert(event.tenant.clone(), event.clone());
                }
            }
            snapshot.revision = snapshot.revision.max(revision);
            // Under the lock: the hub sees revisions in order.
            self.hub.publish(revision, events);
        }
    }

    /// Starts over from `entries` read at `revision` after the watch lost
    /// its place (etcd compacted past it): what changed meanwhile is
    /// published as one group at `revision`.
    pub fn restart(&self, revision: i64, entries: &[Record]) {
        let revision = revision_u64(revision);
        let fresh: BTreeMap<String, v1::FleetEvent> = entries
            .iter()
            .filter_map(|(key, value)| {
                let name = keys::parse_tenant_entry_key(key)?;
                let entry = TenantEntry::decode(value)?;
                Some((name.clone(), event_of(&name, Some(&entry))))
            })
            .collect();
        let mut snapshot = self.lock();
        let mut events: Vec<v1::FleetEvent> = snapshot
            .tenants
            .keys()
            .filter(|name| !fresh.contains_key(*name))
            .map(|name| event_of(name, None))
            .collect();
        events.extend(
            fresh
                .iter()
                .filter(|(name, event)| {
                    snapshot
                        .tenants
                        .get(*name)
                        .is_none_or(|old| old.conditions != event.conditions)
                })
                .map(|(_, event)| event.clone()),
        );
        snapshot.tenants = fresh;
        snapshot.revision = snapshot.revision.max(revision);
        self.hub.publish(revision, stamped(events, revision));
    }

    /// Every live tenant's latest conditions, as of one revision.
    pub fn snapshot(&self) -> (u64, Vec<v1::FleetEvent>) {
        let snapshot = self.lock();
        (
            snapshot.revision,
            snapshot.tenants.values().cloned().collect(),
        )
    }
}

fn revision_u64(revision: i64) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

/// The fleet event of tenant `name`'s entry (`None`: the tenant is gone).
fn event_of(name: &str, entry: Option<&TenantEntry>) -> v1::FleetEvent {
    match entry {
        Some(entry) => fleet_event(name, &entry.conditions, entry.conditions_changed_ms, false),
        None => fleet_event(name, &[], 0, true),
    }
}

fn stamped(mut events: Vec<v1::FleetEvent>, revision: u64) -> Vec<v1::FleetEvent> {
    for event in &mut events {
        event.revision = revision;
        if event.deleted {
            event.time = None;
        }
    }
    events
}

/// The fleet events of one entry change: a tenant that appears, one whose
/// conditions changed, one that is gone. A change of anything else (its
/// token) makes none.
fn events_of(change: &RecordChange) -> Option<v1::FleetEvent> {
    let name = keys::parse_tenant_entry_key(&change.key)?;
    let before = change.previous.as_deref().and_then(TenantEntry::decode);
    let after = change.value.as_deref().and_then(TenantEntry::decode);
    match (&before, &after) {
        (_, None) if change.value.is_none() => before.is_some().then(|| event_of(&name, None)),
        (None, Some(entry)) => Some(event_of(&name, Some(entry))),
        (Some(old), Some(new)) if old.conditions != new.conditions => {
            Some(event_of(&name, Some(new)))
        }
        _ => None,
    }
}

/// `changes` grouped by revision, each with its fleet events.
fn group(changes: &[RecordChange]) -> Vec<(u64, Vec<v1::FleetEvent>)> {
    let mut groups: Vec<(u64, Vec<v1::FleetEvent>)> = Vec::new();
    for change in changes {
        let revision = revision_u64(change.revision);
        if groups.last().is_none_or(|(last, _)| *last != revision) {
            groups.push((revision, Vec::new()));
        }
        if let (Some(event), Some((_, events))) = (events_of(change), groups.last_mut()) {
            events.push(event);
        }
    }
    groups
        .into_iter()
        .map(|(revision, events)| (revision, stamped(events, revision)))
        .collect()
}

impl HistorySource<v1::FleetEvent> for ClusterFleet {
    fn floor(&self) -> u64 {
        // etcd's compaction is discovered by reading (see `read`).
        0
    }

    fn read(
        &self,
        after: u64,
        bound: u64,
        max: usize,
    ) -> Result<Vec<Arc<Revision<v1::FleetEvent>>>, WatchError> {
        let to_i64 = |revision: u64| i64::try_from(revision).unwrap_or(i64::MAX);
        let changes = self
            .store
            .record_changes(
                keys::tenant_entries_prefix(),
                to_i64(after),
                to_i64(bound),
                max,
            )
            .map_err(|error| match error {
                StoreError::Compacted {
                    compact_revision, ..
                } => WatchError::RevisionCompacted {
                    requested: after,
                    compact_revision: revision_u64(compact_revision),
                },
                other => WatchError::History(format!("the fleet history in etcd: {other}")),
            })?;
        Ok(group(&changes)
            .into_iter()
            .map(|(revision, events)| Arc::new(Revision { revision, events }))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::conditions::{Condition, ConditionKind};
    use crate::tenant::TenantLimits;

    fn entry(ready: bool) -> Vec<u8> {
        TenantEntry {
            id: 1,
            token_hash: "t".into(),
            created_at_ms: 1,
            limits: TenantLimits::default(),
            conditions: vec![Condition {
                kind: ConditionKind::Ready,
                status: ready,
                reason: "R".into(),
                message: String::new(),
                observed_generation: 1,
                last_transition_ms: 5,
            }],
            conditions_changed_ms: 5,
        }
        .encode()
    }

    fn change(
        revision: i64,
        name: &str,
        previous: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
    ) -> RecordChange {
        RecordChange {
            key: keys::tenant_entry_key(name),
            value,
            previous,
            revision,
        }
    }

    #[test]
    fn entry_changes_become_fleet_events_grouped_by_revision() {
        let changes = [
            change(10, "a", None, Some(entry(false))),
            change(10, "b", None, Some(entry(false))),
            // The token changed: no fleet event, but the revision is seen.
            change(11, "a", Some(entry(false)), Some(entry(false))),
            change(12, "a", Some(entry(false)), Some(entry(true))),
            change(13, "b", Some(entry(false)), None),
        ];
        let groups = group(&changes);
        let summary: Vec<(u64, Vec<(&str, bool)>)> = groups
            .iter()
            .map(|(revision, events)| {
                (
                    *revision,
                    events
                        .iter()
                        .map(|e| (e.tenant.as_str(), e.deleted))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (10, vec![("a", false), ("b", false)]),
                (11, vec![]),
                (12, vec![("a", false)]),
                (13, vec![("b", true)]),
            ]
        );
        assert!(
            groups
                .iter()
                .all(|(revision, events)| events.iter().all(|e| e.revision == *revision))
        );
    }
}
