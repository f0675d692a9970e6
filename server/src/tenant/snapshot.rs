//! Immutable snapshots of a tenant, published after every commit, so that
//! reads never wait for the tenant's owner.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use imbl::OrdMap;
use tokio::sync::watch;

use crate::engine::exec::TypeRegistry;
use crate::engine::plan::WaitingItem;
use crate::graph::{CurrentItem, IntendedItem, ItemRef};

use super::oplog::OperationLog;
use super::record::TenantRecord;
use crate::engine::exec::{StateCounts, TenantModel};

/// How many recent snapshots stay available for paged reads.
const RECENT_SNAPSHOTS: usize = 64;

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

/// The latest snapshot of a tenant plus a few recent ones.
#[derive(Debug)]
pub struct SnapshotHistory {
    latest: watch::Sender<Arc<TenantSnapshot>>,
    recent: Mutex<VecDeque<Arc<TenantSnapshot>>>,
    log: Arc<OperationLog>,
}

impl SnapshotHistory {
    /// A history starting at `first`.
    pub fn new(first: TenantSnapshot) -> Self {
        let first = Arc::new(first);
        let (latest, _) = watch::channel(first.clone());
        Self {
            latest,
            recent: Mutex::new(VecDeque::from([first])),
            log: Arc::new(OperationLog::default()),
        }
    }

    /// Publishes a new snapshot.
    pub fn publish(&self, snapshot: TenantSnapshot) {
        let snapshot = Arc::new(snapshot);
        {
            let mut recent = self
                .recent
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if recent
                .back()
                .is_some_and(|last| last.record.revision == snapshot.record.revision)
            {
                recent.pop_back();
            }
            recent.push_back(snapshot.clone());
            while recent.len() > RECENT_SNAPSHOTS {
                recent.pop_front();
            }
        }
        self.latest.send_replace(snapshot);
    }

    /// The newest snapshot.
    pub fn latest(&self) -> Arc<TenantSnapshot> {
        self.latest.borrow().clone()
    }

    /// The snapshot of exactly `revision`, if it is still kept.
    pub fn at_revision(&self, revision: u64) -> Option<Arc<TenantSnapshot>> {
        let recent = self
            .recent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        recent
            .iter()
            .rev()
            .find(|s| s.record.revision == revision)
            .cloned()
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
