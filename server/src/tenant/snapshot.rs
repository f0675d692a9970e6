//! Immutable snapshots of a tenant, published after every commit, so that
//! reads never wait for the tenant's owner.
//!
//! Only the latest snapshot is kept, and the ones a paged `GetGraph` is
//! still reading ([`SnapshotHistory::pin`]): a snapshot kept shares the
//! unchanged parts of the graphs with the latest, but holds its own copy of
//! every item changed since, so keeping the last N snapshots of a tenant
//! that rewrites its items would hold N versions of them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use imbl::OrdMap;
use tokio::sync::watch;

use crate::engine::exec::TypeRegistry;
use crate::engine::plan::WaitingItem;
use crate::graph::{CurrentItem, IntendedItem, ItemRef};

use super::oplog::OperationLog;
use super::record::TenantRecord;
use crate::engine::exec::{StateCounts, TenantModel};

/// The most snapshots paged reads may hold per tenant: one more pins the
/// least recently read one out.
pub const MAX_PINNED_SNAPSHOTS: usize = 16;

/// How long a pinned snapshot is kept after its last page was read.
pub const PINNED_SNAPSHOT_IDLE: Duration = Duration::from_secs(60);

/// A tenant as of one revision.
#[derive(Clone, Debug)]
pub struct TenantSnapshot {
    /// The record at that revision.
    pub record: TenantRecord,
    /// Intended items (an O(1) copy of the owner's map).
    pub intended: OrdMap<ItemRef, Arc<IntendedItem>>,
    /// Current items.
    pub current: OrdMap<ItemRef, Arc<CurrentItem>>,
    /// Items waiting, with reasons.
    pub waiting: OrdMap<ItemRef, Arc<WaitingItem>>,
    /// Items by displayed state.
    pub counts: StateCounts,
    /// Operations in flight.
    pub in_flight: usize,
    /// Item types a configurator is connected for, sorted.
    pub connected_item_types: Vec<String>,
    /// The registered item types (specs, schemas, epochs); an O(1) copy.
    pub item_types: TypeRegistry,
}

impl TenantSnapshot {
    /// Captures the owner's state.
    pub fn capture(
        record: TenantRecord,
        model: &TenantModel,
        in_flight: usize,
        connected_item_types: Vec<String>,
    ) -> Self {
        Self {
            record,
            intended: model.intended.snapshot(),
            current: model.current.snapshot(),
            waiting: model.waiting.items(),
            counts: model.counts().clone(),
            in_flight,
            connected_item_types,
            item_types: TypeRegistry::default(),
        }
    }

    /// The snapshot with the tenant's registered item types.
    pub fn with_item_types(mut self, item_types: TypeRegistry) -> Self {
        self.item_types = item_types;
        self
    }
}

/// The latest snapshot of a tenant, and the ones paged reads hold.
#[derive(Debug)]
pub struct SnapshotHistory {
    latest: watch::Sender<Arc<TenantSnapshot>>,
    pinned: Mutex<Vec<Pinned>>,
    log: Arc<OperationLog>,
}

/// A snapshot a paged read holds, and when a page of it was last read.
#[derive(Debug)]
struct Pinned {
    snapshot: Arc<TenantSnapshot>,
    last_read: Instant,
}

impl SnapshotHistory {
    /// A history starting at `first`.
    pub fn new(first: TenantSnapshot) -> Self {
        let (latest, _) = watch::channel(Arc::new(first));
        Self {
            latest,
            pinned: Mutex::new(Vec::new()),
            log: Arc::new(OperationLog::default()),
        }
    }

    /// Publishes a new snapshot; pinned snapshots idle for longer than
    /// [`PINNED_SNAPSHOT_IDLE`] are let go.
    pub fn publish(&self, snapshot: TenantSnapshot) {
        self.latest.send_replace(Arc::new(snapshot));
        unpin_idle(&mut self.pinned(), Instant::now());
    }

    /// The newest snapshot.
    pub fn latest(&self) -> Arc<TenantSnapshot> {
        self.latest.borrow().clone()
    }

    /// Keeps `snapshot` for the pages of a listing that began on it, until
    /// no page of it was read for [`PINNED_SNAPSHOT_IDLE`] or
    /// [`MAX_PINNED_SNAPSHOTS`] more recently read ones are held.
    pub fn pin(&self, snapshot: &Arc<TenantSnapshot>) {
        self.pin_at(snapshot, Instant::now());
    }

    /// The snapshot of exactly `revision`, if it is the latest or pinned;
    /// a pinned one counts as read now.
    pub fn at_revision(&self, revision: u64) -> Option<Arc<TenantSnapshot>> {
        self.at_revision_at(revision, Instant::now())
    }

    fn pin_at(&self, snapshot: &Arc<TenantSnapshot>, now: Instant) {
        let mut pinned = self.pinned();
        if read_pinned(&mut pinned, snapshot.record.revision, now).is_some() {
            return;
        }
        if pinned.len() >= MAX_PINNED_SNAPSHOTS
            && let Some((stalest, _)) = pinned
                .iter()
                .enumerate()
                .min_by_key(|(_, held)| held.last_read)
        {
            pinned.swap_remove(stalest);
        }
        pinned.push(Pinned {
            snapshot: snapshot.clone(),
            last_read: now,
        });
    }

    fn at_revision_at(&self, revision: u64, now: Instant) -> Option<Arc<TenantSnapshot>> {
        read_pinned(&mut self.pinned(), revision, now).or_else(|| {
            let latest = self.latest();
            (latest.record.revision == revision).then_some(latest)
        })
    }

    fn pinned(&self) -> std::sync::MutexGuard<'_, Vec<Pinned>> {
        self.pinned
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The tenant's log of operations.
    pub fn log(&self) -> Arc<OperationLog> {
        self.log.clone()
    }

    /// A receiver that sees every newer snapshot.
    pub fn subscribe(&self) -> watch::Receiver<Arc<TenantSnapshot>> {
        self.latest.subscribe()
    }
}

/// Lets go of the snapshots no page was read of for
/// [`PINNED_SNAPSHOT_IDLE`].
fn unpin_idle(pinned: &mut Vec<Pinned>, now: Instant) {
    pinned.retain(|held| now.saturating_duration_since(held.last_read) < PINNED_SNAPSHOT_IDLE);
}

/// The pinned snapshot of `revision`, read now (after letting go of the
/// idle ones).
fn read_pinned(
    pinned: &mut Vec<Pinned>,
    revision: u64,
    now: Instant,
) -> Option<Arc<TenantSnapshot>> {
    unpin_idle(pinned, now);
    let held = pinned
        .iter_mut()
        .find(|held| held.snapshot.record.revision == revision)?;
    held.last_read = now;
    Some(held.snapshot.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(revision: u64) -> TenantSnapshot {
        TenantSnapshot {
            record: crate::tenant::record::samples::fresh_tenant(1, "acme", revision),
            intended: OrdMap::new(),
            current: OrdMap::new(),
            waiting: OrdMap::new(),
            counts: StateCounts::default(),
            in_flight: 0,
            connected_item_types: Vec::new(),
            item_types: TypeRegistry::default(),
        }
    }

    fn revision_of(snapshot: Option<Arc<TenantSnapshot>>) -> Option<u64> {
        snapshot.map(|snapshot| snapshot.record.revision)
    }

    #[test]
    fn only_the_latest_snapshot_is_kept_unless_a_listing_pins_one() {
        let history = SnapshotHistory::new(at(1));
        history.publish(at(2));
        assert_eq!(revision_of(history.at_revision(2)), Some(2));
        assert_eq!(revision_of(history.at_revision(1)), None, "not pinned");

        history.pin(&history.latest());
        for revision in 3..100 {
            history.publish(at(revision));
        }
        assert_eq!(revision_of(history.at_revision(2)), Some(2));
        assert_eq!(revision_of(history.at_revision(99)), Some(99));
        assert_eq!(revision_of(history.at_revision(50)), None);
    }

    #[test]
    fn a_pinned_snapshot_is_let_go_once_no_page_of_it_was_read_for_a_while() {
        let history = SnapshotHistory::new(at(1));
        let start = Instant::now();
        history.pin_at(&history.latest(), start);
        history.publish(at(2));
        // Each read keeps it another while.
        let read = start + PINNED_SNAPSHOT_IDLE / 2;
        assert_eq!(revision_of(history.at_revision_at(1, read)), Some(1));
        let still = read + PINNED_SNAPSHOT_IDLE - Duration::from_millis(1);
        assert_eq!(revision_of(history.at_revision_at(1, still)), Some(1));
        let idle = still + PINNED_SNAPSHOT_IDLE;
        assert_eq!(revision_of(history.at_revision_at(1, idle)), None);
        assert!(history.pinned().is_empty());
    }

    #[test]
    fn one_pin_too_many_lets_go_of_the_least_recently_read() {
        let history = SnapshotHistory::new(at(0));
        let start = Instant::now();
        for revision in 0..MAX_PINNED_SNAPSHOTS as u64 {
            history.publish(at(revision));
            history.pin_at(&history.latest(), start + Duration::from_millis(revision));
        }
        // Revision 0 is read again, so revision 1 is now the stalest.
        let later = start + Duration::from_secs(1);
        assert_eq!(revision_of(history.at_revision_at(0, later)), Some(0));
        history.publish(at(100));
        history.pin_at(&history.latest(), later);
        history.publish(at(101));
        assert_eq!(history.pinned().len(), MAX_PINNED_SNAPSHOTS);
        assert_eq!(revision_of(history.at_revision_at(1, later)), None);
        for kept in [0, 2, 15, 100] {
            assert_eq!(revision_of(history.at_revision_at(kept, later)), Some(kept));
        }
    }
}
