//! A tenant's event sequence: its live hub, its persisted history, and the
//! filter of one `Reconciler.Watch` request.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prost::Message;
use reconciled_proto::v1;

use crate::store::Store;

use super::error::WatchError;
use super::history::{HistoryError, read_after};
use super::hub::{Hub, Revision};
use super::stream::{HistorySource, Wire};

/// The events of one tenant: written by its owner, read by watchers.
pub struct TenantEvents {
    /// Live groups.
    pub hub: Arc<Hub<v1::Event>>,
    floor: AtomicU64,
    store: Arc<dyn Store>,
    tenant_id: u64,
}

impl std::fmt::Debug for TenantEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantEvents")
            .field("tenant_id", &self.tenant_id)
            .field("floor", &self.floor)
            .field("hub", &self.hub)
            .finish_non_exhaustive()
    }
}

impl TenantEvents {
    /// The events of tenant `tenant_id`, whose history is kept after
    /// `floor` and whose newest revision is `revision`.
    pub fn new(
        store: Arc<dyn Store>,
        tenant_id: u64,
        floor: u64,
        revision: u64,
        ring_events: usize,
    ) -> Self {
        Self {
            hub: Arc::new(Hub::new(revision, ring_events)),
            floor: AtomicU64::new(floor),
            store,
            tenant_id,
        }
    }

    /// Raises the compaction floor. Called before the pruned events are
    /// deleted, so that a reader never trusts a read that raced a prune.
    pub fn raise_floor(&self, floor: u64) {
        self.floor.fetch_max(floor, Ordering::SeqCst);
    }
}

impl HistorySource<v1::Event> for TenantEvents {
    fn floor(&self) -> u64 {
        self.floor.load(Ordering::SeqCst)
    }

    fn read(
        &self,
        after: u64,
        bound: u64,
        max: usize,
    ) -> Result<Vec<Arc<Revision<v1::Event>>>, WatchError> {
        read_after(&*self.store, self.tenant_id, after, bound, max).map_err(history_error)
    }
}

/// A history read failure as a watch error.
pub fn history_error(error: HistoryError) -> WatchError {
    WatchError::History(error.to_string())
}

/// What one `Reconciler.Watch` asked for.
#[derive(Clone, Debug, Default)]
pub struct TenantFilter {
    /// Item types; empty: all.
    pub item_types: HashSet<String>,
    /// Event kinds; empty: all.
    pub kinds: HashSet<i32>,
}

impl TenantFilter {
    /// Whether the watcher wants items of `item_type` (snapshots too).
    pub fn wants_type(&self, item_type: &str) -> bool {
        self.item_types.is_empty() || self.item_types.contains(item_type)
    }

    /// Whether the watcher wants `event`: its kind is asked for, and if it
    /// is about an item (or an agent), the item's type (or one of the
    /// agent's types) is asked for. Intent and condition events pass any
    /// type filter.
    pub fn wants(&self, event: &v1::Event) -> bool {
        if !self.kinds.is_empty() && !self.kinds.contains(&event.kind) {
            return false;
        }
        if self.item_types.is_empty() {
            return true;
        }
        use v1::event::Body;
        let item = |item: &Option<v1::ItemRef>| {
            item.as_ref()
                .is_some_and(|item| self.item_types.contains(&item.r#type))
        };
        match &event.body {
            Some(Body::ItemStatusChanged(change)) => item(&change.item),
            Some(Body::OperationStarted(started)) => item(&started.item),
            Some(Body::OperationFinished(finished)) => item(&finished.item),
            Some(Body::DriftDetected(drift)) => item(&drift.item),
            Some(Body::AgentConnected(agent)) => {
                agent.item_types.iter().any(|t| self.item_types.contains(t))
            }
            Some(Body::AgentDisconnected(agent)) => {
                agent.item_types.iter().any(|t| self.item_types.contains(t))
            }
            Some(Body::IntentChanged(_)) | Some(Body::ConditionsChanged(_)) | None => true,
        }
    }
}

impl Wire<v1::Event> for TenantFilter {
    type Message = v1::WatchResponse;

    fn wants(&self, event: &v1::Event) -> bool {
        TenantFilter::wants(self, event)
    }

    fn size(&self, event: &v1::Event) -> usize {
        event.encoded_len() + 4
    }

    fn events(&self, revision: u64, events: Vec<v1::Event>, continued: bool) -> v1::WatchResponse {
        v1::WatchResponse {
            message: Some(v1::watch_response::Message::Events(v1::EventGroup {
                revision,
                events,
                continued,
            })),
        }
    }

    fn bookmark(&self, revision: u64) -> v1::WatchResponse {
        v1::WatchResponse {
            message: Some(v1::watch_response::Message::Bookmark(v1::Bookmark {
                revision,
            })),
        }
    }
}
