//! The fleet log: one sequence of revisions across all tenants, recording
//! every change of a tenant's conditions (and its creation and deletion),
//! for `Tenants.WatchFleet`.
//!
//! A fleet event is written in the same commit as the tenant change it
//! describes. Its revision is assigned, and the commit queued, under one
//! lock, so revisions follow commit order. Commits of different tenants
//! complete in that order but their owners may resume in any order; a
//! small reorder buffer publishes them to the hub strictly in sequence.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use prost::Message;
use reconciled_proto::v1;
use serde::{Deserialize, Serialize};

use crate::store::{CommitHandle, Store, StoreError, WriteBatch, keys};

use super::error::WatchError;
use super::history::Retention;
use super::hub::{Hub, Revision};
use super::stream::{HistorySource, Wire};

/// Fleet events read per history scan.
const SCAN_EVENTS: usize = 256;

/// The stored position of the fleet log.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
struct Position {
    revision: u64,
    floor: u64,
}

#[derive(Debug)]
struct Sequencer {
    position: Position,
    /// Revisions kept, with their times (for retention by age).
    kept: VecDeque<(u64, u64)>,
}

#[derive(Debug, Default)]
struct Settled {
    published: u64,
    waiting: BTreeMap<u64, Option<v1::FleetEvent>>,
    /// Each live tenant's latest fleet event, as of `published`.
    tenants: BTreeMap<String, v1::FleetEvent>,
}

/// The fleet-wide sequence of tenant condition changes.
pub struct FleetLog {
    store: Arc<dyn Store>,
    retention: Retention,
    sequencer: Mutex<Sequencer>,
    settled: Mutex<Settled>,
    floor: AtomicU64,
    /// Live fleet groups.
    pub hub: Arc<Hub<v1::FleetEvent>>,
}

impl std::fmt::Debug for FleetLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetLog")
            .field("floor", &self.floor)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl FleetLog {
    /// Loads the log's position and the times of the events it keeps.
    pub fn load(
        store: Arc<dyn Store>,
        retention: Retention,
        ring_events: usize,
    ) -> Result<Arc<Self>, StoreError> {
        let position = match store.get(keys::fleet_log_key())? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|error| StoreError::Backend {
                operation: "decode the fleet log position",
                message: error.to_string(),
            })?,
            None => Position::default(),
        };
        let mut kept = VecDeque::new();
        let mut after = keys::fleet_event_key(position.floor);
        loop {
            let page = store.scan(keys::fleet_events_prefix(), Some(&after), SCAN_EVENTS)?;
            for (key, value) in &page {
                if let (Some(revision), Ok(event)) = (
                    keys::parse_fleet_event_key(key),
                    v1::FleetEvent::decode(value.as_slice()),
                ) {
                    kept.push_back((revision, event_ms(&event)));
                }
            }
            match page.last() {
                Some((key, _)) if page.len() == SCAN_EVENTS => after = key.clone(),
                _ => break,
            }
        }
        Ok(Arc::new(Self {
            store,
            retention,
            sequencer: Mutex::new(Sequencer { position, kept }),
            settled: Mutex::new(Settled {
                published: position.revision,
                ..Settled::default()
            }),
            floor: AtomicU64::new(position.floor),
            hub: Arc::new(Hub::new(position.revision, ring_events)),
        }))
    }

    /// Records a live tenant's conditions at start-up (they are consistent
    /// with the log: both are written in the same commits).
    pub fn seed(&self, tenant: &str, conditions: Vec<v1::Condition>) {
        let mut settled = lock(&self.settled);
        let revision = settled.published;
        settled.tenants.insert(
            tenant.to_string(),
            v1::FleetEvent {
                revision,
                tenant: tenant.to_string(),
                conditions,
                time: None,
                deleted: false,
                quarantine_error: String::new(),
            },
        );
    }

    /// Records a tenant quarantined at start-up (its records could not be
    /// read): it is listed, with `error` and no conditions, in the initial
    /// listing of every fleet stream until it is deleted. Quarantine is
    /// found at start-up, before any stream opens, so no live event is
    /// needed; its deletion is an ordinary `deleted` event.
    pub fn seed_quarantined(&self, tenant: &str, error: &str) {
        let mut settled = lock(&self.settled);
        let revision = settled.published;
        settled.tenants.insert(
            tenant.to_string(),
            v1::FleetEvent {
                revision,
                tenant: tenant.to_string(),
                conditions: Vec::new(),
                time: None,
                deleted: false,
                quarantine_error: error.to_string(),
            },
        );
    }

    /// Queues `batch` for commit; with an event, the event gets the next
    /// fleet revision and is written in the same batch. Call
    /// [`FleetLog::settle`] with the revision once the handle resolves.
    pub fn commit(
        &self,
        mut batch: WriteBatch,
        event: Option<v1::FleetEvent>,
        now_ms: u64,
    ) -> Result<(CommitHandle, Option<(u64, v1::FleetEvent)>), StoreError> {
        let Some(mut event) = event else {
            return Ok((self.store.commit(batch), None));
        };
        batch.validate_within(self.store.max_value_bytes())?;
        let mut sequencer = lock(&self.sequencer);
        let revision = sequencer.position.revision + 1;
        event.revision = revision;
        batch.put(keys::fleet_event_key(revision), event.encode_to_vec());
        let age_cutoff = now_ms.saturating_sub(self.retention.max_age_ms);
        while let Some(&(oldest, time)) = sequencer.kept.front() {
            let over = sequencer.kept.len() as u64 >= self.retention.max_revisions;
            if !over && time >= age_cutoff {
                break;
            }
            sequencer.kept.pop_front();
            batch.delete(keys::fleet_event_key(oldest));
            sequencer.position.floor = oldest;
        }
        sequencer.position.revision = revision;
        sequencer.kept.push_back((revision, now_ms));
        // Raised before the deletes commit: see `stream::catch_up`.
        self.floor
            .fetch_max(sequencer.position.floor, Ordering::SeqCst);
        let position =
            serde_json::to_vec(&sequencer.position).map_err(|error| StoreError::Backend {
                operation: "encode the fleet log position",
                message: error.to_string(),
            })?;
        batch.put(keys::fleet_log_key().to_vec(), position);
        let handle = self.store.commit(batch);
        Ok((handle, Some((revision, event))))
    }

    /// Commits `batch` durably, with `event` (if any) at the next fleet
    /// revision, and publishes the revision once it is settled.
    pub async fn commit_durably(
        &self,
        batch: WriteBatch,
        event: Option<v1::FleetEvent>,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        if let Some((revision, event)) = self.commit_unsettled(batch, event, now_ms).await? {
            self.settle(revision, Some(event));
        }
        Ok(())
    }

    /// Commits `batch` durably, with `event` (if any) at the next fleet
    /// revision, and gives that revision back for the caller to
    /// [`settle`](Self::settle) once it may be told: a tenant's owner tells
    /// it after publishing the snapshot that shows the commit. A failed
    /// commit settles its revision at once, with nothing to publish.
    pub async fn commit_unsettled(
        &self,
        batch: WriteBatch,
        event: Option<v1::FleetEvent>,
        now_ms: u64,
    ) -> Result<Option<(u64, v1::FleetEvent)>, StoreError> {
        let (handle, sequenced) = self.commit(batch, event, now_ms)?;
        match handle.await {
            Ok(()) => Ok(sequenced),
            Err(error) => {
                if let Some((revision, _)) = sequenced {
                    self.settle(revision, None);
                }
                Err(error)
            }
        }
    }

    /// Publishes revision `revision` once every earlier one is settled:
    /// `event` if its commit succeeded, nothing if it failed. The revision
    /// of a failed commit is published only once a later revision's commit
    /// is durable: the position stored with that one passes it, so a
    /// restart never gives it to another event (a watcher whose cursor had
    /// passed it would never see that event).
    pub fn settle(&self, revision: u64, event: Option<v1::FleetEvent>) {
        let mut settled = lock(&self.settled);
        settled.waiting.insert(revision, event);
        loop {
            let next = settled.published + 1;
            let passed_durably = |settled: &Settled| {
                settled
                    .waiting
                    .range(next + 1..)
                    .any(|(_, event)| event.is_some())
            };
            match settled.waiting.get(&next) {
                None => break,
                Some(None) if !passed_durably(&settled) => break,
                Some(_) => {}
            }
            let Some(event) = settled.waiting.remove(&next) else {
                break;
            };
            settled.published = next;
            let events = match event {
                Some(event) => {
                    if event.deleted {
                        settled.tenants.remove(&event.tenant);
                    } else {
                        settled.tenants.insert(event.tenant.clone(), event.clone());
                    }
                    vec![event]
                }
                None => Vec::new(),
            };
            // Under the lock: the hub sees revisions in order.
            self.hub.publish(next, events);
        }
    }

    /// Every live tenant's latest conditions, as of one fleet revision.
    pub fn snapshot(&self) -> (u64, Vec<v1::FleetEvent>) {
        let settled = lock(&self.settled);
        (
            settled.published,
            settled.tenants.values().cloned().collect(),
        )
    }
}

fn event_ms(event: &v1::FleetEvent) -> u64 {
    event.time.map_or(0, |time| {
        u64::try_from(time.seconds).unwrap_or(0) * 1_000
            + u64::try_from(time.nanos / 1_000_000).unwrap_or(0)
    })
}

impl HistorySource<v1::FleetEvent> for FleetLog {
    fn floor(&self) -> u64 {
        self.floor.load(Ordering::SeqCst)
    }

    fn read(
        &self,
        after: u64,
        bound: u64,
        max: usize,
    ) -> Result<Vec<Arc<Revision<v1::FleetEvent>>>, WatchError> {
        let page = self
            .store
            .scan(
                keys::fleet_events_prefix(),
                Some(&keys::fleet_event_key(after)),
                max.min(SCAN_EVENTS),
            )
            .map_err(|error| WatchError::History(format!("the fleet log: {error}")))?;
        let mut out = Vec::new();
        for (key, value) in page {
            let Some(revision) = keys::parse_fleet_event_key(&key) else {
                continue;
            };
            if revision > bound {
                break;
            }
            let event = v1::FleetEvent::decode(value.as_slice()).map_err(|error| {
                WatchError::History(format!("fleet event {revision} does not decode: {error}"))
            })?;
            out.push(Arc::new(Revision {
                revision,
                events: vec![event],
            }));
        }
        Ok(out)
    }
}

/// The wire form of the fleet stream (no filters).
#[derive(Clone, Copy, Debug, Default)]
pub struct FleetWire;

impl Wire<v1::FleetEvent> for FleetWire {
    type Message = v1::WatchFleetResponse;

    fn wants(&self, _event: &v1::FleetEvent) -> bool {
        true
    }

    fn size(&self, event: &v1::FleetEvent) -> usize {
        event.encoded_len() + 4
    }

    fn events(
        &self,
        revision: u64,
        events: Vec<v1::FleetEvent>,
        continued: bool,
    ) -> v1::WatchFleetResponse {
        v1::WatchFleetResponse {
            message: Some(v1::watch_fleet_response::Message::Events(
                v1::FleetEventGroup {
                    revision,
                    events,
                    continued,
                },
            )),
        }
    }

    fn bookmark(&self, revision: u64) -> v1::WatchFleetResponse {
        v1::WatchFleetResponse {
            message: Some(v1::watch_fleet_response::Message::Bookmark(v1::Bookmark {
                revision,
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::InMemoryStore;
    use crate::store::failing::FailingStore;

    fn event(tenant: &str, time_ms: u64) -> v1::FleetEvent {
        v1::FleetEvent {
            tenant: tenant.to_string(),
            time: Some(prost_types::Timestamp {
                seconds: i64::try_from(time_ms / 1_000).expect("small"),
                nanos: 0,
            }),
            ..v1::FleetEvent::default()
        }
    }

    fn commit(fleet: &FleetLog, tenant: &str, time_ms: u64) -> u64 {
        let (handle, sequenced) = fleet
            .commit(WriteBatch::new(), Some(event(tenant, time_ms)), time_ms)
            .expect("queued");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        runtime.block_on(handle).expect("committed");
        let (revision, event) = sequenced.expect("sequenced");
        fleet.settle(revision, Some(event));
        revision
    }

    #[test]
    fn revisions_are_kept_by_count_and_the_position_survives_a_reload() {
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let retention = Retention {
            max_revisions: 3,
            max_age_ms: u64::MAX,
        };
        let fleet = FleetLog::load(store.clone(), retention, 100).expect("loads");
        for index in 0..6 {
            commit(&fleet, &format!("t{index}"), 1_000);
        }
        assert_eq!(fleet.floor(), 3);
        let kept = fleet.read(3, 6, 100).expect("reads");
        assert_eq!(
            kept.iter().map(|r| r.revision).collect::<Vec<_>>(),
            [4, 5, 6]
        );
        assert_eq!(kept[0].events[0].tenant, "t3");

        let reloaded = FleetLog::load(store, retention, 100).expect("reloads");
        assert_eq!(reloaded.floor(), 3);
        assert_eq!(commit(&reloaded, "t6", 1_000), 7);
        assert_eq!(reloaded.floor(), 4);
    }

    #[test]
    fn old_revisions_go_by_age() {
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let retention = Retention {
            max_revisions: 100,
            max_age_ms: 10_000,
        };
        let fleet = FleetLog::load(store, retention, 100).expect("loads");
        commit(&fleet, "a", 1_000);
        commit(&fleet, "b", 2_000);
        commit(&fleet, "c", 20_000);
        assert_eq!(fleet.floor(), 2);
    }

    #[test]
    fn revisions_settled_out_of_order_are_published_in_order() {
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let fleet = FleetLog::load(store, Retention::default(), 100).expect("loads");
        let _watcher = fleet.hub.subscribe(0).expect("room");
        let (_first, a) = fleet
            .commit(WriteBatch::new(), Some(event("a", 1_000)), 1_000)
            .expect("queued");
        let (_second, b) = fleet
            .commit(WriteBatch::new(), Some(event("b", 1_000)), 1_000)
            .expect("queued");
        let (a, b) = (a.expect("a"), b.expect("b"));
        fleet.settle(b.0, Some(b.1));
        assert_eq!(fleet.hub.published(), 0, "2 waits for 1");
        fleet.settle(a.0, None);
        assert_eq!(fleet.hub.published(), 2);
        let (revision, tenants) = fleet.snapshot();
        assert_eq!(revision, 2);
        assert_eq!(
            tenants
                .iter()
                .map(|t| t.tenant.as_str())
                .collect::<Vec<_>>(),
            ["b"]
        );
    }

    /// A fleet log over a store that can fail: tenant a's event committed
    /// at revision 1, then tenant b's commit (revision 2) failed; the store
    /// still fails.
    fn a_committed_then_b_failed() -> (Arc<FailingStore>, Arc<dyn Store>, Arc<FleetLog>) {
        let flaky = Arc::new(FailingStore::default());
        let store: Arc<dyn Store> = flaky.clone();
        let fleet = FleetLog::load(store.clone(), Retention::default(), 100).expect("loads");
        assert_eq!(commit(&fleet, "a", 1_000), 1);
        flaky.failing.store(true, Ordering::SeqCst);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let failed = runtime.block_on(fleet.commit_unsettled(
            WriteBatch::new(),
            Some(event("b", 2_000)),
            2_000,
        ));
        assert!(failed.is_err());
        (flaky, store, fleet)
    }

    #[test]
    fn a_revision_published_for_a_failed_commit_is_not_given_again_after_a_reload() {
        // DESIGN 7: events are never silently dropped; the fleet stream
        // has one sequence of revisions. A failed commit settles its
        // revision with nothing. Published at once, a watcher's cursor (and
        // the Bookmark it is sent) passed it while the position stored was
        // the one before it, so after a restart the next event got that
        // same revision, and a watcher resuming from its bookmark never saw
        // that event. It is published only once a later commit is durable.
        let (flaky, store, fleet) = a_committed_then_b_failed();
        let bookmark = fleet.hub.published();
        assert_eq!(bookmark, 1, "the failed revision 2 is not told yet");

        flaky.failing.store(false, Ordering::SeqCst);
        let reloaded = FleetLog::load(store, Retention::default(), 100).expect("reloads");
        let revision = commit(&reloaded, "c", 3_000);
        let resumed = reloaded.read(bookmark, u64::MAX, 100).expect("reads");
        assert_eq!(
            resumed.iter().map(|r| r.revision).collect::<Vec<_>>(),
            [revision],
            "a watcher resuming from revision {bookmark} sees the event of tenant c \
             (given revision {revision})"
        );
    }

    #[test]
    fn a_failed_revision_is_published_once_a_later_one_is_durable() {
        let (flaky, _store, fleet) = a_committed_then_b_failed();
        flaky.failing.store(false, Ordering::SeqCst);
        assert_eq!(commit(&fleet, "c", 3_000), 3);
        assert_eq!(
            fleet.hub.published(),
            3,
            "the gap of revision 2 and tenant c's event are told together"
        );
        assert_eq!(
            fleet
                .snapshot()
                .1
                .iter()
                .map(|e| e.tenant.as_str())
                .collect::<Vec<_>>(),
            ["a", "c"]
        );
    }
}
