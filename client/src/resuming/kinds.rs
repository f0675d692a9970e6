//! The two streams a [`ResumingWatch`](super::ResumingWatch) follows: a
//! tenant's `Watch` and the fleet's `WatchFleet`.

use super::WatchKind;
use super::position::Seen;
use reconciled_proto::v1;
use reconciled_proto::v1::watch_fleet_response::Message as FleetMessage;
use reconciled_proto::v1::watch_response::Message as TenantMessage;

/// Keeps [`WatchKind`] to the SDK's two streams.
pub trait Sealed {}

/// A tenant's `Reconciler.Watch` stream.
#[derive(Debug, Clone, Copy)]
pub enum Tenant {}

/// The fleet's `Tenants.WatchFleet` stream (admin token).
#[derive(Debug, Clone, Copy)]
pub enum Fleet {}

impl Sealed for Tenant {}
impl Sealed for Fleet {}

/// Drops the first `count` of `events`; whether any is left.
fn drop_first<E>(events: &mut Vec<E>, count: usize) -> bool {
    events.drain(..count.min(events.len()));
    !events.is_empty()
}

impl WatchKind for Tenant {
    type Request = v1::WatchRequest;
    type Message = TenantMessage;
    type Response = v1::WatchResponse;

    fn start_revision(request: &v1::WatchRequest) -> u64 {
        request.start_revision
    }

    fn from_revision(request: &v1::WatchRequest, revision: u64) -> v1::WatchRequest {
        v1::WatchRequest {
            start_revision: revision,
            ..request.clone()
        }
    }

    fn message(response: v1::WatchResponse) -> Option<TenantMessage> {
        response.message
    }

    fn seen(message: &TenantMessage) -> Seen {
        match message {
            TenantMessage::Snapshot(_) => Seen::Listing,
            TenantMessage::Synced(synced) => Seen::Synced(synced.revision),
            TenantMessage::Bookmark(mark) => Seen::Bookmark(mark.revision),
            TenantMessage::Events(group) => Seen::Events {
                revision: group.revision,
                count: group.events.len(),
                continued: group.continued,
            },
        }
    }

    fn drop_events(message: &mut TenantMessage, count: usize) -> bool {
        match message {
            // The last message of a revision is delivered even when all
            // its events were: it says the revision is whole.
            TenantMessage::Events(group) => {
                drop_first(&mut group.events, count) || !group.continued
            }
            _ => true,
        }
    }

    fn describe(request: &v1::WatchRequest) -> String {
        format!("tenant {:?}", request.tenant)
    }
}

impl WatchKind for Fleet {
    type Request = v1::WatchFleetRequest;
    type Message = FleetMessage;
    type Response = v1::WatchFleetResponse;

    fn start_revision(request: &v1::WatchFleetRequest) -> u64 {
        request.start_revision
    }

    fn from_revision(_request: &v1::WatchFleetRequest, revision: u64) -> v1::WatchFleetRequest {
        v1::WatchFleetRequest {
            start_revision: revision,
        }
    }

    fn message(response: v1::WatchFleetResponse) -> Option<FleetMessage> {
        response.message
    }

    fn seen(message: &FleetMessage) -> Seen {
        match message {
            FleetMessage::Synced(synced) => Seen::Synced(synced.revision),
            FleetMessage::Bookmark(mark) => Seen::Bookmark(mark.revision),
            FleetMessage::Events(group) => Seen::Events {
                revision: group.revision,
                count: group.events.len(),
                continued: group.continued,
            },
        }
    }

    fn drop_events(message: &mut FleetMessage, count: usize) -> bool {
        match message {
            FleetMessage::Events(group) => drop_first(&mut group.events, count) || !group.continued,
            _ => true,
        }
    }

    fn describe(_request: &v1::WatchFleetRequest) -> String {
        "the fleet".to_owned()
    }
}
