//! Watch streams for tests: open one, read it with deadlines, reassemble
//! the groups split over `continued` messages, and check the stream
//! guarantees (ordered, unique, whole groups) on what was received.

use std::time::Duration;

use reconciled_proto::v1;
use reconciled_proto::v1::watch_response::Message;
use tonic::{Code, Status, Streaming};

use crate::api::{Reconciler, error_metadata};

/// How long a test waits for the next message of a stream.
pub const MESSAGE_DEADLINE: Duration = Duration::from_secs(30);

/// One revision's events, reassembled from its messages.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// The revision.
    pub revision: u64,
    /// Its events, in order.
    pub events: Vec<v1::Event>,
}

/// What a watcher saw of one stream.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// Snapshot items, if the stream started with a snapshot.
    pub snapshot: Vec<v1::ItemStatus>,
    /// The `Synced` revision, if any.
    pub synced: Option<u64>,
    /// Complete groups.
    pub groups: Vec<Group>,
    /// The newest bookmark revision.
    pub bookmark: Option<u64>,
    /// The revision a resumed watch would continue from: the last complete
    /// group, bookmark or `Synced`.
    pub resume_from: u64,
}

/// A Watch stream being read.
pub struct Watcher {
    stream: Streaming<v1::WatchResponse>,
    partial: Option<Group>,
    /// Everything read so far.
    pub seen: Seen,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").field("seen", &self.seen).finish()
    }
}

/// A Watch request.
pub fn watch_request(tenant: &str, start_revision: u64) -> v1::WatchRequest {
    v1::WatchRequest {
        tenant: tenant.to_string(),
        start_revision,
        item_types: Vec::new(),
        kinds: Vec::new(),
    }
}

impl Watcher {
    /// Opens a Watch; the error is the RPC's status.
    pub async fn open(client: &mut Reconciler, request: v1::WatchRequest) -> Result<Self, Status> {
        let stream = client.watch(request.clone()).await?.into_inner();
        Ok(Self {
            stream,
            partial: None,
            seen: Seen {
                resume_from: request.start_revision,
                ..Seen::default()
            },
        })
    }

    /// Opens a Watch of all of a tenant's retained history, as a client
    /// that wants it does: from revision 1, and on `REVISION_COMPACTED`
    /// from the `compact_revision` the error names (a tenant's history
    /// starts past a floor from the clock, never at 1).
    pub async fn open_from_oldest(client: &mut Reconciler, tenant: &str) -> Result<Self, Status> {
        let status = match Self::open(client, watch_request(tenant, 1)).await {
            Err(status) if status.code() == Code::OutOfRange => status,
            opened => return opened,
        };
        let Some(oldest) =
            error_metadata(&status, "compact_revision").and_then(|floor| floor.parse().ok())
        else {
            return Err(status);
        };
        Self::open(client, watch_request(tenant, oldest)).await
    }

    /// Reads one message and records it. `Ok(None)` when the stream ended,
    /// `Err` with the status it ended with.
    ///
    /// # Panics
    /// If no message comes within [`MESSAGE_DEADLINE`].
    pub async fn next(&mut self) -> Result<Option<Message>, Status> {
        let message = tokio::time::timeout(MESSAGE_DEADLINE, self.stream.message())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no watch message within {MESSAGE_DEADLINE:?}; seen {:#?}",
                    self.seen
                )
            })?;
        let Some(message) = message.and_then(|m| m.message) else {
            return Ok(None);
        };
        match &message {
            Message::Snapshot(snapshot) => {
                self.seen.snapshot.extend(snapshot.items.iter().cloned())
            }
            Message::Synced(synced) => {
                self.seen.synced = Some(synced.revision);
                self.seen.resume_from = synced.revision;
            }
            Message::Bookmark(bookmark) => {
                assert!(
                    self.partial.is_none(),
                    "a bookmark inside a group: {message:?}"
                );
                assert!(
                    bookmark.revision >= self.seen.resume_from,
                    "a bookmark went backwards: {} after {}",
                    bookmark.revision,
                    self.seen.resume_from
                );
                self.seen.bookmark = Some(bookmark.revision);
                self.seen.resume_from = bookmark.revision;
            }
            Message::Events(group) => {
                assert!(
                    !group.events.is_empty(),
                    "an empty event message: {group:?}"
                );
                let partial = self.partial.get_or_insert_with(|| Group {
                    revision: group.revision,
                    events: Vec::new(),
                });
                assert_eq!(
                    partial.revision, group.revision,
                    "a group was interrupted by another revision"
                );
                partial.events.extend(group.events.iter().cloned());
                if !group.continued {
                    let whole = self.partial.take().expect("a group in progress");
                    assert!(
                        whole.revision > self.seen.resume_from,
                        "revision {} arrived after {}: reordered or duplicated",
                        whole.revision,
                        self.seen.resume_from
                    );
                    for event in &whole.events {
                        assert_eq!(
                            event.revision, whole.revision,
                            "an event of another revision in a group"
                        );
                    }
                    self.seen.resume_from = whole.revision;
                    self.seen.groups.push(whole);
                }
            }
        }
        Ok(Some(message))
    }

    /// Reads until `done` holds for what was seen; panics if the stream
    /// ends first.
    pub async fn until(&mut self, mut done: impl FnMut(&Seen) -> bool) -> &Seen {
        while !done(&self.seen) {
            match self.next().await {
                Ok(Some(_)) => {}
                Ok(None) => panic!("the watch ended early; seen {:#?}", self.seen),
                Err(status) => panic!("the watch failed: {status:?}; seen {:#?}", self.seen),
            }
        }
        &self.seen
    }

    /// Reads until the watcher has reached `revision` (a group, bookmark or
    /// `Synced` at or after it).
    pub async fn until_revision(&mut self, revision: u64) -> &Seen {
        self.until(|seen| seen.resume_from >= revision).await
    }

    /// Reads until the watcher has reached `revision`; returns the groups
    /// up to it (a stream may already carry later ones).
    pub async fn groups_through(&mut self, revision: u64) -> Vec<Group> {
        self.until_revision(revision)
            .await
            .groups
            .iter()
            .filter(|group| group.revision <= revision)
            .cloned()
            .collect()
    }

    /// Reads until the stream ends; returns how it ended.
    pub async fn until_end(&mut self) -> Result<(), Status> {
        loop {
            if self.next().await?.is_none() {
                return Ok(());
            }
        }
    }
}

/// Every event of `groups`, flattened.
pub fn events(groups: &[Group]) -> impl Iterator<Item = &v1::Event> {
    groups.iter().flat_map(|group| group.events.iter())
}

/// The item an event is about, as `type/name`, if it is about one.
pub fn event_item(event: &v1::Event) -> Option<String> {
    use v1::event::Body;
    let item = match event.body.as_ref()? {
        Body::ItemStatusChanged(change) => change.item.as_ref(),
        Body::OperationStarted(started) => started.item.as_ref(),
        Body::OperationFinished(finished) => finished.item.as_ref(),
        Body::DriftDetected(drift) => drift.item.as_ref(),
        _ => None,
    }?;
    Some(format!("{}/{}", item.r#type, item.name))
}
