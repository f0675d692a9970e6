//! The live side of a watch: a bounded ring of recently committed event
//! groups that writers append to without ever waiting for readers.
//!
//! A hub covers the revisions `(floor, published]`: every event group of
//! those revisions is in the ring (revisions without events have no
//! entry). Older groups are read from the persisted history. The ring is
//! kept only while someone watches: with no watcher, a publish just moves
//! the floor, so an idle tenant costs no memory.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

/// The events of one committed change.
#[derive(Debug, PartialEq)]
pub struct Revision<E> {
    /// The revision of the commit.
    pub revision: u64,
    /// Its events, in commit order.
    pub events: Vec<E>,
}

/// What a reader gets from [`Hub::read_after`].
#[derive(Debug)]
pub enum RingRead<E> {
    /// The groups after the cursor, and the revision they reach: the reader
    /// has seen everything up to `reached` once it has sent them.
    Groups {
        /// Event groups in revision order (possibly none).
        groups: Vec<Arc<Revision<E>>>,
        /// The revision the reader has reached.
        reached: u64,
    },
    /// The cursor lies before the ring: what follows it must come from the
    /// persisted history.
    Behind {
        /// The first revision the ring can serve after.
        floor: u64,
    },
    /// The hub is closed.
    Closed(CloseReason),
}

/// Why a hub closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// The tenant was deleted.
    Deleted,
    /// The server is shutting down.
    ShuttingDown,
    /// Another replica serves the tenant now (replicas on etcd).
    Moved,
}

#[derive(Debug)]
struct Inner<E> {
    ring: VecDeque<Arc<Revision<E>>>,
    ring_events: usize,
    floor: u64,
    published: u64,
    watchers: usize,
    closed: Option<CloseReason>,
}

/// Fan-out point of one event sequence (a tenant's, or the fleet's).
#[derive(Debug)]
pub struct Hub<E> {
    inner: Mutex<Inner<E>>,
    published: watch::Sender<u64>,
    capacity_events: usize,
}

/// Groups handed out per [`Hub::read_after`] call, so that no reader holds
/// the lock for long.
const GROUPS_PER_READ: usize = 256;

impl<E> Hub<E> {
    /// A hub whose sequence has reached `revision`; the ring holds up to
    /// `capacity_events` events (always at least the newest group).
    pub fn new(revision: u64, capacity_events: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                ring: VecDeque::new(),
                ring_events: 0,
                floor: revision,
                published: revision,
                watchers: 0,
                closed: None,
            }),
            published: watch::Sender::new(revision),
            capacity_events: capacity_events.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<E>> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Publishes a committed revision (with or without events). Revisions
    /// must come in increasing order; an old one is ignored. Never waits
    /// for readers: a reader the ring leaves behind notices on its next read.
    pub fn publish(&self, revision: u64, events: Vec<E>) {
        {
            let mut inner = self.lock();
            if revision <= inner.published || inner.closed.is_some() {
                return;
            }
            if inner.watchers == 0 {
                inner.ring.clear();
                inner.ring_events = 0;
                inner.floor = revision;
            } else if !events.is_empty() {
                inner.ring_events += events.len();
                inner
                    .ring
                    .push_back(Arc::new(Revision { revision, events }));
                while inner.ring_events > self.capacity_events && inner.ring.len() > 1 {
                    if let Some(oldest) = inner.ring.pop_front() {
                        inner.ring_events -= oldest.events.len();
                        inner.floor = oldest.revision;
                    }
                }
            }
            inner.published = revision;
        }
        self.published.send_replace(revision);
    }

    /// The newest published revision.
    pub fn published(&self) -> u64 {
        self.lock().published
    }

    /// Groups after `cursor` from the ring (at most a bounded number per
    /// call), or why the ring cannot serve them.
    pub fn read_after(&self, cursor: u64) -> RingRead<E> {
        let inner = self.lock();
        if let Some(reason) = inner.closed {
            return RingRead::Closed(reason);
        }
        if cursor < inner.floor {
            return RingRead::Behind { floor: inner.floor };
        }
        let start = inner.ring.partition_point(|group| group.revision <= cursor);
        let groups: Vec<_> = inner
            .ring
            .iter()
            .skip(start)
            .take(GROUPS_PER_READ)
            .cloned()
            .collect();
        let reached = if inner.ring.len() - start > GROUPS_PER_READ {
            groups.last().map_or(cursor, |group| group.revision)
        } else {
            inner.published.max(cursor)
        };
        RingRead::Groups { groups, reached }
    }

    /// Registers a watcher if fewer than `limit` are open (0: no limit).
    /// While any watcher is registered the ring is kept.
    pub fn subscribe(self: &Arc<Self>, limit: usize) -> Option<Subscription<E>> {
        let mut inner = self.lock();
        if inner.closed.is_some() || (limit > 0 && inner.watchers >= limit) {
            return None;
        }
        inner.watchers += 1;
        Some(Subscription {
            hub: self.clone(),
            changes: self.published.subscribe(),
        })
    }

    /// Open watchers.
    pub fn watchers(&self) -> usize {
        self.lock().watchers
    }

    /// Closes the hub: readers get [`RingRead::Closed`] and are woken.
    pub fn close(&self, reason: CloseReason) {
        {
            let mut inner = self.lock();
            inner.closed.get_or_insert(reason);
            inner.ring.clear();
            inner.ring_events = 0;
        }
        self.published.send_modify(|_| {});
    }
}

/// A registered watcher: keeps the ring alive and wakes on publishes.
#[derive(Debug)]
pub struct Subscription<E> {
    hub: Arc<Hub<E>>,
    changes: watch::Receiver<u64>,
}

impl<E> Subscription<E> {
    /// The hub.
    pub fn hub(&self) -> &Arc<Hub<E>> {
        &self.hub
    }

    /// Waits until something is published after the last call (or the hub
    /// closes).
    pub async fn changed(&mut self) {
        if self.changes.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Marks everything published so far as seen.
    pub fn mark_seen(&mut self) {
        self.changes.borrow_and_update();
    }
}

impl<E> Drop for Subscription<E> {
    fn drop(&mut self) {
        let mut inner = self.hub.lock();
        inner.watchers = inner.watchers.saturating_sub(1);
        if inner.watchers == 0 {
            inner.ring.clear();
            inner.ring_events = 0;
            inner.floor = inner.published;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(read: RingRead<u32>) -> (Vec<(u64, Vec<u32>)>, u64) {
        match read {
            RingRead::Groups { groups, reached } => (
                groups
                    .iter()
                    .map(|g| (g.revision, g.events.clone()))
                    .collect(),
                reached,
            ),
            other => panic!("expected groups, got {other:?}"),
        }
    }

    #[test]
    fn without_watchers_publishes_keep_nothing_and_move_the_floor() {
        let hub = Arc::new(Hub::new(1, 10));
        hub.publish(2, vec![1]);
        hub.publish(3, vec![2]);
        assert!(matches!(hub.read_after(1), RingRead::Behind { floor: 3 }));
        assert_eq!(groups(hub.read_after(3)), (vec![], 3));
    }

    #[test]
    fn a_watcher_sees_every_group_after_its_cursor_and_revisions_without_events_count() {
        let hub = Arc::new(Hub::new(1, 10));
        let _watcher = hub.subscribe(0).expect("room");
        hub.publish(2, vec![1]);
        hub.publish(3, vec![]);
        hub.publish(4, vec![2, 3]);
        assert_eq!(
            groups(hub.read_after(1)),
            (vec![(2, vec![1]), (4, vec![2, 3])], 4)
        );
        assert_eq!(groups(hub.read_after(2)), (vec![(4, vec![2, 3])], 4));
        assert_eq!(groups(hub.read_after(4)), (vec![], 4));
    }

    #[test]
    fn the_ring_drops_its_oldest_groups_beyond_capacity_but_keeps_the_newest() {
        let hub = Arc::new(Hub::new(0, 3));
        let _watcher = hub.subscribe(0).expect("room");
        hub.publish(1, vec![1, 2]);
        hub.publish(2, vec![3, 4]);
        assert!(matches!(hub.read_after(0), RingRead::Behind { floor: 1 }));
        assert_eq!(groups(hub.read_after(1)), (vec![(2, vec![3, 4])], 2));
        hub.publish(3, vec![5, 6, 7, 8]);
        assert_eq!(groups(hub.read_after(2)), (vec![(3, vec![5, 6, 7, 8])], 3));
    }

    #[test]
    fn the_watcher_limit_is_enforced_and_released_on_drop() {
        let hub: Arc<Hub<u32>> = Arc::new(Hub::new(0, 3));
        let first = hub.subscribe(1).expect("room for one");
        assert!(hub.subscribe(1).is_none());
        drop(first);
        assert!(hub.subscribe(1).is_some());
    }

    #[test]
    fn a_closed_hub_refuses_readers_and_watchers() {
        let hub: Arc<Hub<u32>> = Arc::new(Hub::new(0, 3));
        hub.close(CloseReason::Deleted);
        assert!(matches!(
            hub.read_after(0),
            RingRead::Closed(CloseReason::Deleted)
        ));
        assert!(hub.subscribe(0).is_none());
    }
}
