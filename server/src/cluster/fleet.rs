//! The fleet stream (`Tenants.WatchFleet`) of replicas on etcd: one order
//! for the whole fleet, the same on every replica, that survives failover.
//!
//! A fleet event is a change of a tenant's directory entry
//! ([`TenantEntry`]) that creates the tenant, changes its conditions or
//! deletes it; its revision is etcd's revision of that change. Every
//! replica follows the entries with one etcd watch that starts where
//! etcd's history starts (revision 1, or the revision etcd compacted to)
//! and goes on live: so it has seen, in etcd's order, every change etcd
//! still knows, whenever it started. It keeps the recent ones (by count
//! and age, as a single server keeps its fleet log) for watchers that
//! resume, and publishes live ones to a [`Hub`]. A revision means the same
//! on every replica, so a watcher resumes on any of them after a failover;
//! one that resumes before what is kept gets `REVISION_COMPACTED`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use reconciled_proto::v1;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::store::etcd::RecordChange;
use crate::store::{EtcdStore, Record, keys};
use crate::tenant::owner::now_ms;
use crate::watch::error::WatchError;
use crate::watch::history::Retention;
use crate::watch::hub::{Hub, Revision};
use crate::watch::stream::HistorySource;
use crate::wire::fleet_event;

use super::catalog::TenantEntry;
use super::follow::follow_records;

/// The fleet as of one revision, and the recent history.
#[derive(Debug, Default)]
struct State {
    revision: u64,
    /// Every live tenant's latest fleet event.
    tenants: BTreeMap<String, v1::FleetEvent>,
    /// Kept groups, oldest first, with when they were seen (unix ms).
    kept: VecDeque<(Arc<Revision<v1::FleetEvent>>, u64)>,
    /// Revisions up to this one are no longer kept.
    floor: u64,
}

/// The fleet stream of this replica.
pub struct ClusterFleet {
    retention: Retention,
    state: Mutex<State>,
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
    /// Starts following `store`'s directory entries from the start of
    /// etcd's history, keeping what `retention` allows and up to
    /// `ring_events` events in memory for live watchers, until `stop`.
    pub fn start(
        store: Arc<EtcdStore>,
        retention: Retention,
        ring_events: usize,
        stop: CancellationToken,
    ) -> Arc<Self> {
        let fleet = Arc::new(Self {
            retention,
            state: Mutex::new(State::default()),
            hub: Arc::new(Hub::new(0, ring_events)),
        });
        tokio::spawn(follow(store, fleet.clone(), stop));
        fleet
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Publishes the fleet events of entry changes, in order, one group
    /// per etcd revision.
    fn publish(&self, changes: &[RecordChange]) {
        let now = now_ms();
        let mut state = self.lock();
        for (revision, events) in group(changes) {
            for event in &events {
                if event.deleted {
                    state.tenants.remove(&event.tenant);
                } else {
                    state.tenants.insert(event.tenant.clone(), event.clone());
                }
            }
            self.keep(&mut state, revision, events.clone(), now);
            // Under the lock: the hub sees revisions in order.
            self.hub.publish(revision, events);
        }
    }

    /// Adds a group to the kept history and drops what the retention no
    /// longer covers.
    fn keep(&self, state: &mut State, revision: u64, events: Vec<v1::FleetEvent>, now: u64) {
        state.revision = state.revision.max(revision);
        if !events.is_empty() {
            state
                .kept
                .push_back((Arc::new(Revision { revision, events }), now));
        }
        let cutoff = now.saturating_sub(self.retention.max_age_ms);
        while let Some((oldest, seen)) = state.kept.front() {
            let over = state.kept.len() as u64 > self.retention.max_revisions;
            if !over && *seen >= cutoff {
                break;
            }
            state.floor = oldest.revision;
            state.kept.pop_front();
        }
    }

    /// Starts over from `entries` read at `revision`: what changed since
    /// the state known is published as one group at `revision`, and the
    /// history before it is no longer available.
    fn restart(&self, revision: i64, entries: &[Record]) {
        let revision = revision_u64(revision);
        let fresh: BTreeMap<String, v1::FleetEvent> = entries
            .iter()
            .filter_map(|(key, value)| {
                let name = keys::parse_tenant_entry_key(key)?;
                let entry = TenantEntry::decode(value)?;
                Some((name.clone(), event_of(&name, Some(&entry))))
            })
            .collect();
        let mut state = self.lock();
        if revision <= state.revision {
            return;
        }
        let mut events: Vec<v1::FleetEvent> = state
            .tenants
            .keys()
            .filter(|name| !fresh.contains_key(*name))
            .map(|name| event_of(name, None))
            .collect();
        events.extend(
            fresh
                .iter()
                .filter(|(name, event)| {
                    state.tenants.get(*name).is_none_or(|old| {
                        old.conditions != event.conditions
                            || old.quarantine_error != event.quarantine_error
                    })
                })
                .map(|(_, event)| event.clone()),
        );
        let events = stamped(events, revision);
        state.tenants = fresh;
        state.kept.clear();
        // A replica that had followed nothing yet (it started after etcd
        // compacted) knows nothing before `revision`: a resume from
        // before it cannot be answered.
        state.floor = if state.revision == 0 {
            revision
        } else {
            state.revision
        };
        self.keep(&mut state, revision, events.clone(), now_ms());
        self.hub.publish(revision, events);
    }

    /// Every live tenant's latest conditions, as of one revision.
    pub fn snapshot(&self) -> (u64, Vec<v1::FleetEvent>) {
        let state = self.lock();
        (state.revision, state.tenants.values().cloned().collect())
    }
}

/// Follows the entries from the start of etcd's history, then live,
/// until `stop`; after a failure, goes on from where it left off.
async fn follow(store: Arc<EtcdStore>, fleet: Arc<ClusterFleet>, stop: CancellationToken) {
    let prefix = keys::tenant_entries_prefix();
    let (store, fleet) = (&*store, &*fleet);
    follow_records(
        store,
        prefix,
        0,
        "the fleet's entries",
        &stop,
        |batch| fleet.publish(batch),
        // etcd no longer has the history from where the watch was: start
        // from its state at the compaction (at start-up, the usual case),
        // or from now.
        move |compact_revision| async move {
            let listed = match store.list_records_at(prefix, compact_revision).await {
                Ok(listed) => Ok(listed),
                Err(_) => store.list_records(prefix).await,
            };
            match listed {
                Ok((entries, at)) => {
                    fleet.restart(at, &entries);
                    Some(at)
                }
                Err(error) => {
                    warn!(%error, "Reading the fleet's entries failed; retrying.");
                    None
                }
            }
        },
    )
    .await;
}

fn revision_u64(revision: i64) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

/// The fleet event of tenant `name`'s entry (`None`: the tenant is gone).
fn event_of(name: &str, entry: Option<&TenantEntry>) -> v1::FleetEvent {
    match entry {
        Some(entry) => {
            let mut event =
                fleet_event(name, &entry.conditions, entry.conditions_changed_ms, false);
            event.quarantine_error = entry.quarantine_error.clone();
            event
        }
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

/// The fleet event of one entry change: a tenant that appears, one whose
/// conditions changed, one quarantined (or loaded again after it was), one
/// that is gone. A change of anything else (its token) makes none.
fn event_of_change(change: &RecordChange) -> Option<v1::FleetEvent> {
    let name = keys::parse_tenant_entry_key(&change.key)?;
    let before = change.previous.as_deref().and_then(TenantEntry::decode);
    let after = change.value.as_deref().and_then(TenantEntry::decode);
    match (&before, &after) {
        (_, None) if change.value.is_none() => before.is_some().then(|| event_of(&name, None)),
        (None, Some(entry)) => Some(event_of(&name, Some(entry))),
        (Some(old), Some(new))
            if old.conditions != new.conditions || old.quarantine_error != new.quarantine_error =>
        {
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
        if let (Some(event), Some((_, events))) = (event_of_change(change), groups.last_mut()) {
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
        self.lock().floor
    }

    fn read(
        &self,
        after: u64,
        bound: u64,
        max: usize,
    ) -> Result<Vec<Arc<Revision<v1::FleetEvent>>>, WatchError> {
        let state = self.lock();
        if after < state.floor {
            return Err(WatchError::RevisionCompacted {
                requested: after,
                compact_revision: state.floor,
            });
        }
        let start = state
            .kept
            .partition_point(|(group, _)| group.revision <= after);
        Ok(state
            .kept
            .iter()
            .skip(start)
            .take_while(|(group, _)| group.revision <= bound)
            .take(max)
            .map(|(group, _)| group.clone())
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
            quarantine_error: String::new(),
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

    fn changes() -> Vec<RecordChange> {
        vec![
            change(10, "a", None, Some(entry(false))),
            change(10, "b", None, Some(entry(false))),
            // The token changed: no fleet event, but the revision is seen.
            change(11, "a", Some(entry(false)), Some(entry(false))),
            change(12, "a", Some(entry(false)), Some(entry(true))),
            change(13, "b", Some(entry(false)), None),
        ]
    }

    #[test]
    fn entry_changes_become_fleet_events_grouped_by_revision() {
        let groups = group(&changes());
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

    #[test]
    fn history_is_kept_by_count_and_read_back_in_order() {
        let fleet = ClusterFleet {
            retention: Retention {
                max_revisions: 2,
                max_age_ms: u64::MAX,
            },
            state: Mutex::new(State::default()),
            hub: Arc::new(Hub::new(0, 100)),
        };
        fleet.publish(&changes());
        // Three groups had events; the oldest one went.
        assert_eq!(fleet.floor(), 10);
        let kept = fleet.read(10, 13, 10).expect("reads");
        assert_eq!(
            kept.iter().map(|r| r.revision).collect::<Vec<_>>(),
            [12, 13]
        );
        assert!(matches!(
            fleet.read(5, 13, 10),
            Err(WatchError::RevisionCompacted { .. })
        ));
        let (revision, tenants) = fleet.snapshot();
        assert_eq!(revision, 13);
        assert_eq!(
            tenants
                .iter()
                .map(|t| t.tenant.as_str())
                .collect::<Vec<_>>(),
            ["a"]
        );
    }

    /// A replica that quarantines a tenant writes the error into its
    /// entry: a fleet event with the error and no conditions, as one
    /// server's fleet stream shows a quarantined tenant; loading it again
    /// (an entry rewritten from the record) is one more event, without it.
    #[test]
    fn a_quarantine_written_into_an_entry_is_a_fleet_event_with_its_error() {
        let served = entry(true);
        let stored = TenantEntry::decode(&served).expect("decodes");
        let quarantined =
            TenantEntry::quarantined(1, Some(stored.clone()), "torn record".into(), 9);
        assert_eq!(
            quarantined.token_hash, stored.token_hash,
            "the token is kept"
        );
        let groups = group(&[
            change(10, "a", None, Some(served.clone())),
            change(11, "a", Some(served.clone()), Some(quarantined.encode())),
            change(12, "a", Some(quarantined.encode()), Some(served)),
        ]);
        let events: Vec<(u64, &str, usize)> = groups
            .iter()
            .flat_map(|(_, events)| events.iter())
            .map(|e| (e.revision, e.quarantine_error.as_str(), e.conditions.len()))
            .collect();
        assert_eq!(events, [(10, "", 1), (11, "torn record", 0), (12, "", 1)]);
    }

    /// A replica that starts after etcd compacted its history (hourly
    /// auto-compaction, as docs/scale-out.md advises) knows the fleet only
    /// as of the compaction. A watcher that saw tenant "b" before it and
    /// resumes here after a failover must get `REVISION_COMPACTED` (or
    /// b's deletion): "every replica serves the same sequence".
    #[test]
    fn a_resume_from_before_a_compaction_on_a_fresh_replica_is_refused_or_complete() {
        let fleet = ClusterFleet {
            retention: Retention {
                max_revisions: 100,
                max_age_ms: u64::MAX,
            },
            state: Mutex::new(State::default()),
            hub: Arc::new(Hub::new(0, 100)),
        };
        // History up to 20 compacted: "b" (created at 10) was deleted at
        // 13; only "a" is left.
        fleet.restart(20, &[(keys::tenant_entry_key("a"), entry(true))]);
        match fleet.read(10, 20, 10) {
            Err(WatchError::RevisionCompacted { .. }) => {}
            Ok(groups) => assert!(
                groups
                    .iter()
                    .flat_map(|group| group.events.iter())
                    .any(|event| event.tenant == "b" && event.deleted),
                "a watcher resumed at 10 on a replica that started after the compaction \
                 at 20 is never told that b is gone: {groups:?}"
            ),
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
}
