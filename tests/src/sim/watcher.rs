//! A watcher that follows the tenant through a whole run, as a fleet
//! controller would: it opens `Reconciler.Watch` through the server's own
//! stream code, and whenever its stream ends (too slow for the ring, the
//! server restarting, history compacted) it opens it again from the last
//! revision it saw, or from a snapshot if that revision is gone.
//!
//! It checks what DESIGN 7 promises a watcher:
//!
//! - revisions only grow, and each revision's events arrive once, whole
//!   (a group split into messages marked as continued is completed before
//!   the next one), and every event carries its group's revision;
//! - events are published only once their commit is durable: after a
//!   crash, every revision the watcher saw is in the restarted server's
//!   history with exactly the events it saw (so a resumed stream carries
//!   what the live one did, and no revision is reused for other events);
//! - a watcher that keeps up misses nothing: what it built from the events
//!   (each item's presence, state and last error; the intent generation;
//!   the conditions and observed generation; the item types agents hold;
//!   every operation in flight announced started) is what the tenant's
//!   status shows once the tenant is idle.

use std::collections::{BTreeMap, BTreeSet};

use futures::FutureExt as _;
use reconciled::api::context::WatchSettings;
use reconciled::api::watch::{WatchStream, watch_tenant};
use reconciled::graph::ItemRef;
use reconciled::status::ApiError;
use reconciled::tenant::{TenantHandle, TenantSnapshot};
use reconciled::watch::FollowSettings;
use reconciled::watch::stream::HistorySource as _;
use reconciled::wire::item_state_to_proto;
use reconciled_proto::v1;
use reconciled_proto::v1::event::Body;
use reconciled_proto::v1::watch_response::Message;
use tokio_stream::StreamExt as _;

use super::invariants::Violation;

/// Rounds of "read what is ready, let the server run" in a row that bring
/// messages but no new revision before catching up counts as failed.
const MAX_ROUNDS: usize = 64;
/// Rounds in all: a server that keeps committing in a loop (a livelock)
/// fails here rather than hanging the run. A long step of time can bring
/// thousands of revisions (every operation timing out and retried over
/// a quarter of an hour), read 64 events at a time.
const MAX_ROUNDS_IN_ALL: usize = 50_000;
/// Yields that let the stream's task run before the watcher reads.
const YIELDS: usize = 16;

/// What the events said about one item: its current record, or PENDING
/// while it is intended without one.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SeenItem {
    /// The `ItemState` the last status change gave it.
    state: i32,
    /// The message of its last error, if any.
    error: Option<String>,
}

/// The watcher and what it has seen.
#[derive(Default)]
pub struct Watcher {
    stream: Option<WatchStream>,
    /// Every revision up to this one arrived whole.
    cursor: u64,
    /// The events of each revision that arrived, as they arrived.
    seen: BTreeMap<u64, Vec<v1::Event>>,
    /// A revision whose messages are still arriving (marked continued).
    partial: Option<(u64, Vec<v1::Event>)>,
    /// Items with a current record or intended, as the events tell.
    items: BTreeMap<ItemRef, SeenItem>,
    /// The intent generation, as the events tell.
    generation: u64,
    /// Condition types and statuses, with the observed generation, as the
    /// last `ConditionsChanged` tells (none after a snapshot restart until
    /// the next one).
    conditions: Option<(BTreeMap<String, i32>, u64)>,
    /// Item types a live agent holds, as the agent events tell.
    connected: BTreeSet<String>,
    /// Every operation announced started: item, op id, attempt.
    started: BTreeSet<(ItemRef, String, u32)>,
    /// The watcher restarted from a snapshot after its first: what was
    /// announced before it (operations started, agents) is unknown.
    partial_history: bool,
}

fn item_of(item: Option<&v1::ItemRef>) -> ItemRef {
    item.map_or_else(
        || ItemRef::new("", ""),
        |item| ItemRef::new(&item.r#type, &item.name),
    )
}

impl Watcher {
    /// Opens the stream on `handle` from the last revision seen (a
    /// snapshot first when none was).
    fn open(&mut self, handle: &TenantHandle) -> Result<(), Violation> {
        let request = v1::WatchRequest {
            tenant: handle.name.clone(),
            start_revision: self.cursor,
            ..v1::WatchRequest::default()
        };
        let settings = WatchSettings {
            follow: FollowSettings {
                bookmark_interval: std::time::Duration::from_secs(5),
                message_bytes: 4 * 1024,
                retry_after: std::time::Duration::from_secs(1),
            },
            max_watchers_per_tenant: 8,
        };
        match watch_tenant(handle, &request, settings) {
            Ok(stream) => {
                self.stream = Some(stream);
                Ok(())
            }
            Err(ApiError::RevisionCompacted { .. }) => {
                // The revision left the history: start over from a
                // snapshot, as a client must.
                self.restart_from_snapshot();
                self.open(handle)
            }
            Err(error) => Err(Violation::new(
                "a watcher can always resume",
                format!("Watch from revision {} failed: {error}", self.cursor),
            )),
        }
    }

    fn restart_from_snapshot(&mut self) {
        self.cursor = 0;
        self.partial = None;
        self.items.clear();
        self.conditions = None;
        self.partial_history = true;
    }

    /// Reads everything the server has published, resuming the stream
    /// whenever it ends, until nothing more arrives.
    pub async fn catch_up(&mut self, handle: &TenantHandle) -> Result<(), Violation> {
        let mut stale = 0;
        for _ in 0..MAX_ROUNDS_IN_ALL {
            let cursor = self.cursor;
            if self.stream.is_none() {
                self.open(handle)?;
            }
            let mut arrived = false;
            for _ in 0..YIELDS {
                tokio::task::yield_now().await;
            }
            while let Some(next) = self.stream.as_mut().and_then(|s| s.next().now_or_never()) {
                arrived = true;
                match next {
                    Some(Ok(response)) => self.on_message(response)?,
                    Some(Err(status)) => {
                        self.stream = None;
                        if status.code() == tonic::Code::OutOfRange {
                            self.restart_from_snapshot();
                        }
                        break;
                    }
                    None => {
                        self.stream = None;
                        break;
                    }
                }
            }
            if !arrived && self.stream.is_some() {
                return Ok(());
            }
            stale = if self.cursor > cursor { 0 } else { stale + 1 };
            if stale == MAX_ROUNDS {
                return Err(Violation::new(
                    "a watcher that keeps up catches up",
                    format!(
                        "still receiving after {MAX_ROUNDS} rounds with no new revision (at {})",
                        self.cursor
                    ),
                ));
            }
        }
        Err(Violation::new(
            "a watcher that keeps up catches up",
            format!(
                "still receiving new revisions after {MAX_ROUNDS_IN_ALL} rounds (at {}): the server commits in a loop",
                self.cursor
            ),
        ))
    }

    fn on_message(&mut self, response: v1::WatchResponse) -> Result<(), Violation> {
        match response.message {
            Some(Message::Events(group)) => self.on_group(group),
            Some(Message::Snapshot(snapshot)) => {
                self.generation = snapshot.generation;
                for status in snapshot.items {
                    let error = status.last_error.map(|e| e.message);
                    self.items.insert(
                        item_of(status.r#ref.as_ref()),
                        SeenItem {
                            state: status.state,
                            error,
                        },
                    );
                }
                Ok(())
            }
            Some(Message::Synced(synced)) => {
                self.cursor = synced.revision;
                Ok(())
            }
            Some(Message::Bookmark(bookmark)) => {
                if self.partial.is_some() || bookmark.revision < self.cursor {
                    return Err(Violation::new(
                        "events are never reordered",
                        format!(
                            "a bookmark at revision {} after revision {}{}",
                            bookmark.revision,
                            self.cursor,
                            if self.partial.is_some() {
                                " while a revision's messages were still arriving"
                            } else {
                                ""
                            }
                        ),
                    ));
                }
                self.cursor = bookmark.revision;
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn on_group(&mut self, group: v1::EventGroup) -> Result<(), Violation> {
        let revision = group.revision;
        if let Some(event) = group.events.iter().find(|e| e.revision != revision) {
            return Err(Violation::new(
                "every event carries its revision",
                format!(
                    "an event of revision {} in the group of revision {revision}",
                    event.revision
                ),
            ));
        }
        let mut events = match self.partial.take() {
            Some((partial, events)) if partial == revision => events,
            Some((partial, _)) => {
                return Err(Violation::new(
                    "a revision's events arrive whole",
                    format!("revision {partial} was continued, then came revision {revision}"),
                ));
            }
            None if revision <= self.cursor => {
                return Err(Violation::new(
                    "events are never duplicated or reordered",
                    format!("revision {revision} arrived after revision {}", self.cursor),
                ));
            }
            None => Vec::new(),
        };
        events.extend(group.events);
        if group.continued {
            self.partial = Some((revision, events));
            return Ok(());
        }
        for event in &events {
            self.fold(event);
        }
        self.seen.insert(revision, events);
        self.cursor = revision;
        Ok(())
    }

    /// What `event` tells about the tenant.
    fn fold(&mut self, event: &v1::Event) {
        match &event.body {
            Some(Body::ItemStatusChanged(change)) => {
                let item = item_of(change.item.as_ref());
                if change.new_state == v1::ItemState::Unspecified as i32 {
                    self.items.remove(&item);
                } else {
                    self.items.insert(
                        item,
                        SeenItem {
                            state: change.new_state,
                            error: change.error.as_ref().map(|e| e.message.clone()),
                        },
                    );
                }
            }
            Some(Body::IntentChanged(changed)) => self.generation = changed.generation,
            Some(Body::OperationStarted(started)) => {
                let item = item_of(started.item.as_ref());
                self.started
                    .insert((item, started.op_id.clone(), started.attempt));
            }
            Some(Body::AgentConnected(agent)) => {
                self.connected.extend(agent.item_types.iter().cloned());
            }
            Some(Body::AgentDisconnected(agent)) => {
                for item_type in &agent.item_types {
                    self.connected.remove(item_type);
                }
            }
            Some(Body::ConditionsChanged(changed)) => {
                let conditions = changed
                    .conditions
                    .iter()
                    .map(|c| (c.r#type.clone(), c.status))
                    .collect();
                self.conditions = Some((conditions, changed.observed_generation));
            }
            _ => {}
        }
    }

    /// Before the server dies: takes in what it published.
    pub async fn before_crash(&mut self, handle: &TenantHandle) -> Result<(), Violation> {
        self.catch_up(handle).await?;
        self.stream = None;
        Ok(())
    }

    /// After a restart that loaded revision `loaded` from `history`: every
    /// revision the watcher saw was durable, and is stored with exactly
    /// the events it saw.
    pub fn after_restart(&mut self, handle: &TenantHandle, loaded: u64) -> Result<(), Violation> {
        self.partial = None;
        if let Some((&newest, _)) = self.seen.last_key_value()
            && newest > loaded
        {
            return Err(Violation::new(
                "events are published only once their commit is durable",
                format!(
                    "the watcher saw revision {newest}; the restarted server loaded revision {loaded}"
                ),
            ));
        }
        let floor = handle.events.floor();
        let stored = handle
            .events
            .read(floor, loaded, usize::MAX)
            .map_err(|error| Violation::new("the event history reads back", error.to_string()))?;
        let stored: BTreeMap<u64, &Vec<v1::Event>> = stored
            .iter()
            .map(|group| (group.revision, &group.events))
            .collect();
        for (revision, events) in self.seen.range(floor + 1..) {
            if stored.get(revision).copied() != Some(events) {
                return Err(Violation::new(
                    "a resumed watch carries exactly what the live one did",
                    format!(
                        "revision {revision}: the watcher saw {} event(s), the restarted server has {}",
                        events.len(),
                        stored.get(revision).map_or(0, |e| e.len())
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Once the tenant is idle and the watcher caught up: what it built
    /// from the events is what `snapshot` shows.
    pub fn check_view(
        &self,
        handle: &TenantHandle,
        snapshot: &TenantSnapshot,
    ) -> Result<(), Violation> {
        if self.cursor > snapshot.record.revision {
            // A commit is published to watchers a moment before its
            // snapshot: nothing to compare yet.
            return Ok(());
        }
        // Revisions without events send nothing until a bookmark.
        let unseen = handle
            .events
            .read(self.cursor, snapshot.record.revision, 1)
            .map_err(|error| Violation::new("the event history reads back", error.to_string()))?;
        if !unseen.is_empty() {
            return Err(Violation::new(
                "a watcher that keeps up misses nothing",
                format!(
                    "the watcher reached revision {}, the tenant is at {}",
                    self.cursor, snapshot.record.revision
                ),
            ));
        }
        // A snapshot's items: the current ones, and the intended ones
        // without a current entry as PENDING.
        let pending = snapshot
            .intended
            .keys()
            .filter(|key| snapshot.current.get(*key).is_none())
            .map(|key| {
                let seen = SeenItem {
                    state: v1::ItemState::Pending as i32,
                    error: None,
                };
                (key.clone(), seen)
            });
        let shown: BTreeMap<ItemRef, SeenItem> = snapshot
            .current
            .iter()
            .map(|(key, current)| {
                let seen = SeenItem {
                    state: item_state_to_proto(current.state) as i32,
                    error: current.rare.last_error.as_ref().map(|e| e.message.clone()),
                };
                (key.clone(), seen)
            })
            .chain(pending)
            .collect();
        if shown != self.items {
            let differs = shown
                .keys()
                .chain(self.items.keys())
                .find(|key| shown.get(*key) != self.items.get(*key))
                .cloned();
            if let Some(key) = differs {
                return Err(Violation::new(
                    "a watcher's view of the items is the tenant's",
                    format!(
                        "{key}: the events say {:?}, the status shows {:?}",
                        self.items.get(&key),
                        shown.get(&key)
                    ),
                ));
            }
        }
        if !self.partial_history {
            for (key, current) in snapshot.current.iter() {
                let Some(operation) = current.in_flight.as_ref() else {
                    continue;
                };
                let announced = (key.clone(), operation.op_id.clone(), operation.attempt);
                if !self.started.contains(&announced) {
                    return Err(Violation::new(
                        "a watcher sees every operation start",
                        format!(
                            "{key} runs {} {} attempt {}, never announced",
                            operation.kind.as_str(),
                            operation.op_id,
                            operation.attempt
                        ),
                    ));
                }
            }
            let connected: BTreeSet<String> =
                snapshot.connected_item_types.iter().cloned().collect();
            if connected != self.connected {
                return Err(Violation::new(
                    "a watcher sees which agents are connected",
                    format!(
                        "the events say types {:?} are held, the status shows {connected:?}",
                        self.connected
                    ),
                ));
            }
        }
        if self.generation != snapshot.record.generation {
            return Err(Violation::new(
                "a watcher sees every intent generation",
                format!(
                    "the events say generation {}, the status shows {}",
                    self.generation, snapshot.record.generation
                ),
            ));
        }
        if let Some((conditions, observed)) = &self.conditions {
            let shown: BTreeMap<String, i32> = snapshot
                .record
                .conditions
                .iter()
                .map(|c| {
                    let proto = reconciled::wire::condition_to_proto(c);
                    (proto.r#type, proto.status)
                })
                .collect();
            if &shown != conditions || *observed != snapshot.record.observed_generation {
                return Err(Violation::new(
                    "a watcher sees every change of the conditions",
                    format!(
                        "the events say {conditions:?} at observed generation {observed}, \
                         the status shows {shown:?} at {}",
                        snapshot.record.observed_generation
                    ),
                ));
            }
        }
        Ok(())
    }
}
