//! Opening watch streams: `Reconciler.Watch` (one tenant) and
//! `Tenants.WatchFleet` (every tenant's conditions). The streams
//! themselves are followed by [`crate::watch::stream::follow`].

use std::collections::HashSet;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use prost::Message;
use reconciled_proto::v1;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt as _};
use tokio_util::sync::WaitForCancellationFutureOwned;
use tonic::Status;

use crate::graph::ItemRef;
use crate::status::ApiError;
use crate::tenant::{Revocation, TenantHandle, TenantSnapshot};
use crate::watch::fleet::{FleetLog, FleetWire};
use crate::watch::stream::{HistorySource, Wire, follow};
use crate::watch::{TenantFilter, WatchError};
use crate::wire::{intended_item_to_proto, item_status};

use super::context::{WatchSettings, credentials_revoked, invalid};

/// Messages buffered per stream between the follower and the transport.
const STREAM_BUFFER: usize = 16;

/// A stream of `Reconciler.Watch` messages.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<v1::WatchResponse, Status>> + Send>>;

/// A stream of `Tenants.WatchFleet` messages.
pub type FleetStream = Pin<Box<dyn Stream<Item = Result<v1::WatchFleetResponse, Status>> + Send>>;

/// Ends `stream` with `UNAUTHENTICATED` once `revocation` is revoked (the
/// token it was opened with was rotated, or its tenant deleted), saying
/// which.
pub fn until_revoked(stream: WatchStream, revocation: Revocation) -> WatchStream {
    Box::pin(UntilRevoked {
        stream,
        revoked: Box::pin(revocation.clone().revoked_owned()),
        revocation,
        ended: false,
    })
}

struct UntilRevoked {
    stream: WatchStream,
    revoked: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Why, once `revoked` completes.
    revocation: Revocation,
    ended: bool,
}

impl Stream for UntilRevoked {
    type Item = Result<v1::WatchResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if self.revoked.as_mut().poll(cx).is_ready() {
            self.ended = true;
            let why = self.revocation.why();
            return Poll::Ready(Some(Err(credentials_revoked(why).into())));
        }
        self.stream.as_mut().poll_next(cx)
    }
}

/// Validates a Watch request's filter.
pub fn tenant_filter(request: &v1::WatchRequest) -> Result<TenantFilter, ApiError> {
    let mut kinds = HashSet::new();
    for (index, kind) in request.kinds.iter().enumerate() {
        match v1::EventKind::try_from(*kind) {
            Ok(v1::EventKind::Unspecified) | Err(_) => {
                return Err(invalid(
                    format!("kinds[{index}]"),
                    format!(
                        "{kind} is not an event kind; use EVENT_KIND_* names such as EVENT_KIND_ITEM_STATUS_CHANGED"
                    ),
                ));
            }
            Ok(_) => {
                kinds.insert(*kind);
            }
        }
    }
    for (index, item_type) in request.item_types.iter().enumerate() {
        if item_type.is_empty() {
            return Err(invalid(
                format!("item_types[{index}]"),
                "an item type must not be empty; leave item_types empty to watch every type",
            ));
        }
    }
    Ok(TenantFilter {
        item_types: request.item_types.iter().cloned().collect(),
        kinds,
    })
}

/// Opens a Watch of `handle`'s tenant.
pub fn watch_tenant(
    handle: &TenantHandle,
    request: &v1::WatchRequest,
    settings: WatchSettings,
) -> Result<WatchStream, ApiError> {
    let filter = tenant_filter(request)?;
    let limits = handle.snapshots.latest().record.limits.clone();
    let limit = match limits.max_watchers {
        0 => settings.max_watchers_per_tenant,
        n => usize::try_from(n).unwrap_or(usize::MAX),
    };
    let subscription = handle.events.hub.subscribe(limit).ok_or_else(|| ApiError::QuotaExceeded {
        subject: String::from("max_watchers"),
        description: format!(
            "tenant {:?} already has {limit} open Watch streams; close one, or raise the tenant's max_watchers",
            handle.name
        ),
    })?;
    let history: Arc<dyn HistorySource<v1::Event>> = handle.events.clone();
    let start = check_start(&*history, request.start_revision)?;
    // Revisions only grow: one ahead of the tenant was given by a tenant
    // of this name that is gone, or by a history a restore or a repair
    // took back. Following from it would skip, silently, every event up
    // to it.
    let current = handle.events.hub.published();
    if start > current {
        return Err(ApiError::RevisionAhead {
            requested: start,
            current,
        });
    }
    let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
    let snapshot = (start == 0).then(|| handle.snapshots.latest());
    tokio::spawn(async move {
        let cursor = match snapshot {
            Some(snapshot) => {
                if !send_snapshot(&snapshot, &filter, &sender, settings.follow.message_bytes).await
                {
                    return;
                }
                snapshot.record.revision
            }
            None => start,
        };
        follow(
            history,
            subscription,
            cursor,
            filter,
            sender,
            settings.follow,
        )
        .await;
    });
    Ok(Box::pin(to_statuses(receiver)))
}

/// The start revision, if the history still holds what follows it (0, the
/// snapshot, always does); else REVISION_COMPACTED.
fn check_start<E: 'static>(history: &dyn HistorySource<E>, start: u64) -> Result<u64, ApiError> {
    let floor = history.floor();
    if start > 0 && start < floor {
        return Err(ApiError::RevisionCompacted {
            requested: start,
            compact_revision: floor,
        });
    }
    Ok(start)
}

/// Streams the snapshot's items of the wanted types, then `Synced`. False
/// when the watcher went away.
async fn send_snapshot(
    snapshot: &TenantSnapshot,
    filter: &TenantFilter,
    sender: &mpsc::Sender<Result<v1::WatchResponse, WatchError>>,
    message_bytes: usize,
) -> bool {
    let revision = snapshot.record.revision;
    let generation = snapshot.record.generation;
    let keys: Vec<&ItemRef> = merged_keys(snapshot)
        .filter(|key| filter.wants_type(key.item_type()))
        .collect();
    let mut message = empty_snapshot(revision, generation);
    let mut bytes = 0;
    for key in keys {
        let intended = snapshot.intended.get(key).map(|i| &**i);
        let current = snapshot.current.get(key).map(|c| &**c);
        let status = item_status(
            key,
            current,
            intended,
            snapshot.waiting.get(key).map(|w| &**w),
        );
        let intended = intended.map(intended_item_to_proto);
        let size = status.encoded_len() + intended.as_ref().map_or(0, Message::encoded_len) + 8;
        if bytes > 0 && bytes + size > message_bytes {
            let mut full = std::mem::replace(&mut message, empty_snapshot(revision, generation));
            full.continued = true;
            if !send(sender, v1::watch_response::Message::Snapshot(full)).await {
                return false;
            }
            bytes = 0;
        }
        bytes += size;
        message.items.push(status);
        message.intended.extend(intended);
    }
    send(sender, v1::watch_response::Message::Snapshot(message)).await
        && send(
            sender,
            v1::watch_response::Message::Synced(v1::Synced { revision }),
        )
        .await
}

fn empty_snapshot(revision: u64, generation: u64) -> v1::SnapshotItems {
    v1::SnapshotItems {
        revision,
        generation,
        ..v1::SnapshotItems::default()
    }
}

/// Every item of the snapshot, current or intended, in identity order.
fn merged_keys(snapshot: &TenantSnapshot) -> impl Iterator<Item = &ItemRef> {
    let mut current = snapshot.current.keys().peekable();
    let mut intended = snapshot.intended.keys().peekable();
    std::iter::from_fn(move || match (current.peek(), intended.peek()) {
        (Some(c), Some(i)) if c < i => current.next(),
        (Some(c), Some(i)) if c > i => intended.next(),
        (Some(_), Some(_)) => {
            intended.next();
            current.next()
        }
        (Some(_), None) => current.next(),
        (None, Some(_)) => intended.next(),
        (None, None) => None,
    })
}

async fn send(
    sender: &mpsc::Sender<Result<v1::WatchResponse, WatchError>>,
    message: v1::watch_response::Message,
) -> bool {
    sender
        .send(Ok(v1::WatchResponse {
            message: Some(message),
        }))
        .await
        .is_ok()
}

/// Opens a WatchFleet stream.
pub fn watch_fleet(
    fleet: &Arc<FleetLog>,
    request: &v1::WatchFleetRequest,
    settings: WatchSettings,
) -> Result<FleetStream, ApiError> {
    watch_fleet_of(
        &fleet.hub,
        fleet.clone(),
        || fleet.snapshot(),
        request,
        settings,
    )
}

/// Opens a WatchFleet stream over a fleet sequence: its live `hub`, its
/// `history`, and the `snapshot` of every tenant's conditions that a
/// stream from revision 0 starts with (the fleet log of one server, or
/// the cluster's stream in etcd's order).
pub fn watch_fleet_of(
    hub: &Arc<crate::watch::hub::Hub<v1::FleetEvent>>,
    history: Arc<dyn HistorySource<v1::FleetEvent>>,
    snapshot: impl FnOnce() -> (u64, Vec<v1::FleetEvent>),
    request: &v1::WatchFleetRequest,
    settings: WatchSettings,
) -> Result<FleetStream, ApiError> {
    let subscription = hub.subscribe(0).ok_or_else(|| ApiError::Unavailable {
        message: String::from(
            "the server is shutting down; watch the fleet again after the restart",
        ),
    })?;
    let start = check_start(&*history, request.start_revision)?;
    let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
    let snapshot = (start == 0).then(snapshot);
    tokio::spawn(async move {
        let cursor = match snapshot {
            Some((revision, mut tenants)) => {
                for tenant in &mut tenants {
                    tenant.revision = revision;
                }
                let wire = FleetWire;
                for (index, chunk) in tenants.chunks(500).enumerate() {
                    let more = (index + 1) * 500 < tenants.len();
                    let message = wire.events(revision, chunk.to_vec(), more);
                    if sender.send(Ok(message)).await.is_err() {
                        return;
                    }
                }
                let synced = v1::WatchFleetResponse {
                    message: Some(v1::watch_fleet_response::Message::Synced(v1::Synced {
                        revision,
                    })),
                };
                if sender.send(Ok(synced)).await.is_err() {
                    return;
                }
                revision
            }
            None => start,
        };
        follow(
            history,
            subscription,
            cursor,
            FleetWire,
            sender,
            settings.follow,
        )
        .await;
    });
    Ok(Box::pin(to_statuses(receiver)))
}

/// The follower's messages as a gRPC stream: the error that ends it
/// becomes its status.
fn to_statuses<M: Send + 'static>(
    receiver: mpsc::Receiver<Result<M, WatchError>>,
) -> impl Stream<Item = Result<M, Status>> + Send {
    ReceiverStream::new(receiver)
        .map(|message| message.map_err(|error| Status::from(ApiError::from(error))))
}

impl From<WatchError> for ApiError {
    fn from(error: WatchError) -> Self {
        match error {
            WatchError::SlowConsumer { retry_after } => Self::SlowConsumer { retry_after },
            WatchError::RevisionCompacted {
                requested,
                compact_revision,
            } => Self::RevisionCompacted {
                requested,
                compact_revision,
            },
            WatchError::TenantDeleted => Self::TenantDeleted,
            WatchError::ShuttingDown => Self::Unavailable {
                message: String::from(
                    "the server is shutting down; resume the watch from the last revision received",
                ),
            },
            WatchError::Moved => Self::Unavailable {
                message: String::from(
                    "the tenant moved to another replica; resume the watch from the last \
                     revision received (any replica forwards it to the new owner)",
                ),
            },
            WatchError::History(message) => Self::internal(message),
        }
    }
}
