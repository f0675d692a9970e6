//! Following one event sequence for one watcher: history first (if the
//! watcher starts behind the live ring), then live groups, with bookmarks
//! on idle streams. Shared by the tenant stream (`Reconciler.Watch`) and
//! the fleet stream (`Tenants.WatchFleet`).
//!
//! Guarantees: groups go out in revision order, each exactly once and
//! whole (split into messages marked `continued`); a watcher that falls
//! out of the live ring after it caught up is ended with
//! `RESOURCE_EXHAUSTED` rather than fed a gap.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::error::WatchError;
use super::hub::{Revision, RingRead, Subscription};

/// Where a watcher's history comes from.
pub trait HistorySource<E>: Send + Sync + 'static {
    /// Events after this revision are available (the compaction floor).
    fn floor(&self) -> u64;

    /// Complete groups after `after` and at most `bound`, at most `max` of
    /// them, in revision order.
    fn read(&self, after: u64, bound: u64, max: usize)
    -> Result<Vec<Arc<Revision<E>>>, WatchError>;
}

/// How a sequence's messages look on the wire, and which events a watcher
/// wants.
pub trait Wire<E>: Send + 'static {
    /// The stream's message type.
    type Message: Send + 'static;

    /// Whether the watcher wants `event`.
    fn wants(&self, event: &E) -> bool;

    /// The encoded size of an event (to bound messages).
    fn size(&self, event: &E) -> usize;

    /// A message with events of one revision.
    fn events(&self, revision: u64, events: Vec<E>, continued: bool) -> Self::Message;

    /// A bookmark at `revision`.
    fn bookmark(&self, revision: u64) -> Self::Message;
}

/// Settings of one watcher.
#[derive(Clone, Copy, Debug)]
pub struct FollowSettings {
    /// Idle time after which a bookmark is sent.
    pub bookmark_interval: Duration,
    /// The most bytes of events per message.
    pub message_bytes: usize,
    /// How long a dropped slow watcher is told to wait before resuming.
    pub retry_after: Duration,
}

/// Revisions read from history per step.
const HISTORY_STEP: usize = 64;

/// Where a follower sends its messages, or the error that ends the stream.
pub type Sender<M> = mpsc::Sender<Result<M, WatchError>>;

/// Follows the sequence from `cursor` (everything up to it was seen) until
/// the watcher goes away or the stream must end; sends into `out`.
pub async fn follow<E, W>(
    history: Arc<dyn HistorySource<E>>,
    mut subscription: Subscription<E>,
    mut cursor: u64,
    wire: W,
    out: Sender<W::Message>,
    settings: FollowSettings,
) where
    E: Clone + Send + Sync + 'static,
    W: Wire<E>,
{
    let hub = subscription.hub().clone();
    let mut live = false;
    let mut last_sent = Instant::now();
    loop {
        subscription.mark_seen();
        match hub.read_after(cursor) {
            RingRead::Closed(reason) => {
                let _ = out.send(Err(reason.into())).await;
                return;
            }
            RingRead::Behind { .. } if live => {
                let error = WatchError::SlowConsumer {
                    retry_after: settings.retry_after,
                };
                let _ = out.send(Err(error)).await;
                return;
            }
            RingRead::Behind { .. } => {
                let bound = hub.published();
                let groups = match catch_up(&*history, cursor, bound) {
                    Ok(groups) => groups,
                    Err(error) => {
                        let _ = out.send(Err(error)).await;
                        return;
                    }
                };
                let reached = if groups.len() == HISTORY_STEP {
                    groups.last().map_or(bound, |group| group.revision)
                } else {
                    bound.max(cursor)
                };
                if !send_groups(&wire, &groups, &out, settings.message_bytes, &mut last_sent).await
                {
                    return;
                }
                cursor = reached;
            }
            RingRead::Groups { groups, reached } => {
                live = true;
                if !send_groups(&wire, &groups, &out, settings.message_bytes, &mut last_sent).await
                {
                    return;
                }
                cursor = reached;
                if !groups.is_empty() {
                    continue;
                }
                let idle_until = last_sent + settings.bookmark_interval;
                tokio::select! {
                    () = subscription.changed() => {}
                    () = out.closed() => return,
                    () = tokio::time::sleep_until(idle_until) => {
                        if out.send(Ok(wire.bookmark(cursor))).await.is_err() {
                            return;
                        }
                        last_sent = Instant::now();
                    }
                }
            }
        }
    }
}

/// Reads the next step of history after `cursor`, failing with
/// REVISION_COMPACTED if it is (or becomes, during the read) compacted.
fn catch_up<E: 'static>(
    history: &dyn HistorySource<E>,
    cursor: u64,
    bound: u64,
) -> Result<Vec<Arc<Revision<E>>>, WatchError> {
    let compacted = |floor: u64| WatchError::RevisionCompacted {
        requested: cursor,
        compact_revision: floor,
    };
    let floor = history.floor();
    if cursor < floor {
        return Err(compacted(floor));
    }
    let groups = history.read(cursor, bound, HISTORY_STEP)?;
    // The floor moves before pruned events are deleted: if it passed the
    // cursor during the read, the read may have missed some.
    let floor = history.floor();
    if cursor < floor {
        return Err(compacted(floor));
    }
    Ok(groups)
}

/// Sends the wanted events of `groups`, each revision split into messages
/// of at most `message_bytes`. False when the watcher went away.
async fn send_groups<E, W>(
    wire: &W,
    groups: &[Arc<Revision<E>>],
    out: &Sender<W::Message>,
    message_bytes: usize,
    last_sent: &mut Instant,
) -> bool
where
    E: Clone,
    W: Wire<E>,
{
    for group in groups {
        let mut messages: Vec<Vec<E>> = Vec::new();
        let mut bytes = 0;
        for event in group.events.iter().filter(|event| wire.wants(event)) {
            let size = wire.size(event);
            match messages.last_mut() {
                Some(current) if bytes + size <= message_bytes || current.is_empty() => {
                    current.push(event.clone());
                    bytes += size;
                }
                _ => {
                    messages.push(vec![event.clone()]);
                    bytes = size;
                }
            }
        }
        let count = messages.len();
        for (index, events) in messages.into_iter().enumerate() {
            let message = wire.events(group.revision, events, index + 1 < count);
            if out.send(Ok(message)).await.is_err() {
                return false;
            }
            *last_sent = Instant::now();
        }
    }
    true
}
