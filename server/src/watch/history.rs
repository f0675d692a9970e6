//! The persisted event log of a tenant: every committed revision's events,
//! stored as `reconciled.v1.EventGroup` protobuf chunks in the same commit
//! as the change they describe, retained by count and age.
//!
//! Chunks are keyed `(revision, chunk)` (see `store::keys::event_key`); all
//! but the last chunk of a revision have `continued` set. A revision with no
//! events stores nothing.
//!
//! A tenant's log is also bounded by its stored bytes (keys and values of
//! its chunks): [`write_revision`] says what it adds, [`prune`] what it
//! drops, and the owner keeps the sum in the tenant record, counting it
//! with [`stored_bytes_after`] for a record that does not have it.

use std::sync::Arc;

use prost::Message;
use reconciled_proto::v1;

use crate::store::{Store, StoreError, WriteBatch, keys};

use super::hub::Revision;

/// The most bytes of events one stored chunk holds (below the store's
/// 64 KiB value limit, with room for the group's own fields).
pub const CHUNK_BYTES: usize = 60 * 1024;

/// Chunks read per store scan.
const SCAN_CHUNKS: usize = 256;

/// How long events are kept, by count and by age.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Revisions kept per tenant (and in the fleet log).
    pub max_revisions: u64,
    /// The oldest events kept, in milliseconds.
    pub max_age_ms: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            max_revisions: 10_000,
            max_age_ms: 24 * 3_600 * 1_000,
        }
    }
}

/// Splits `events` into groups of at most `max_bytes` encoded bytes each
/// (an event larger than that travels alone); all but the last group have
/// `continued` set.
pub fn split_into_groups(
    revision: u64,
    events: &[v1::Event],
    max_bytes: usize,
) -> Vec<v1::EventGroup> {
    let mut groups = Vec::new();
    let mut current: Vec<v1::Event> = Vec::new();
    let mut bytes = 0;
    for event in events {
        let size = event.encoded_len() + 4;
        if !current.is_empty() && bytes + size > max_bytes {
            groups.push(v1::EventGroup {
                revision,
                events: std::mem::take(&mut current),
                continued: true,
            });
            bytes = 0;
        }
        bytes += size;
        current.push(event.clone());
    }
    if !current.is_empty() {
        groups.push(v1::EventGroup {
            revision,
            events: current,
            continued: false,
        });
    }
    groups
}

/// Adds the writes that store `events` of `revision` to `batch`; returns
/// the bytes they store (keys and values).
pub fn write_revision(
    batch: &mut WriteBatch,
    tenant_id: u64,
    revision: u64,
    events: &[v1::Event],
) -> u64 {
    let mut stored = 0;
    for (chunk, group) in split_into_groups(revision, events, CHUNK_BYTES)
        .iter()
        .enumerate()
    {
        let chunk = u32::try_from(chunk).unwrap_or(u32::MAX);
        let key = keys::event_key(tenant_id, revision, chunk);
        let value = group.encode_to_vec();
        stored += chunk_bytes(&key, &value);
        batch.put(key, value);
    }
    stored
}

/// What one stored chunk counts against the log's bytes.
fn chunk_bytes(key: &[u8], value: &[u8]) -> u64 {
    u64::try_from(key.len() + value.len()).unwrap_or(u64::MAX)
}

/// The bytes (keys and values) of every chunk stored after `floor`: the
/// count of a record written before the log's bytes were kept, read once
/// when its tenant loads.
pub fn stored_bytes_after(
    store: &dyn Store,
    tenant_id: u64,
    floor: u64,
) -> Result<u64, HistoryError> {
    let prefix = keys::events_prefix(tenant_id);
    let mut start = keys::event_key(tenant_id, floor, u32::MAX);
    let mut total = 0u64;
    loop {
        let page = store.scan(&prefix, Some(&start), SCAN_CHUNKS)?;
        let full_page = page.len() == SCAN_CHUNKS;
        for (key, value) in &page {
            total = total.saturating_add(chunk_bytes(key, value));
        }
        match page.into_iter().last() {
            Some((key, _)) if full_page => start = key,
            _ => return Ok(total),
        }
    }
}

/// Complete revisions of the log after `after` and at most `bound`, at
/// most `max_revisions` of them, in revision order.
///
/// `bound` must be a revision whose commit had completed before this call
/// began (e.g. the hub's published revision read just before): then every
/// revision up to it is visible to the scan, whatever commits race with it.
pub fn read_after(
    store: &dyn Store,
    tenant_id: u64,
    after: u64,
    bound: u64,
    max_revisions: usize,
) -> Result<Vec<Arc<Revision<v1::Event>>>, HistoryError> {
    let prefix = keys::events_prefix(tenant_id);
    let mut start = keys::event_key(tenant_id, after, u32::MAX);
    let mut out: Vec<Arc<Revision<v1::Event>>> = Vec::new();
    let mut partial: Option<Revision<v1::Event>> = None;
    'scan: loop {
        let page = store.scan(&prefix, Some(&start), SCAN_CHUNKS)?;
        let full_page = page.len() == SCAN_CHUNKS;
        for (key, value) in page {
            let Some((_, revision, _)) = keys::parse_event_key(&key) else {
                return Err(HistoryError::Corrupt(format!(
                    "malformed event key {}",
                    String::from_utf8_lossy(&key)
                )));
            };
            if revision > bound {
                break 'scan;
            }
            let group = v1::EventGroup::decode(value.as_slice()).map_err(|error| {
                HistoryError::Corrupt(format!("event chunk of revision {revision}: {error}"))
            })?;
            let entry = partial.get_or_insert_with(|| Revision {
                revision,
                events: Vec::new(),
            });
            if entry.revision != revision {
                return Err(HistoryError::Corrupt(format!(
                    "revision {} ends with a continued chunk",
                    entry.revision
                )));
            }
            entry.events.extend(group.events);
            if !group.continued {
                out.extend(partial.take().map(Arc::new));
                if out.len() >= max_revisions {
                    break 'scan;
                }
            }
            start = key;
        }
        if !full_page {
            break;
        }
    }
    Ok(out)
}

/// What pruning the log decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// The new compaction floor: events after it are still available.
    pub floor: u64,
    /// The time of the oldest event kept, if any is kept.
    pub oldest_ms: Option<u64>,
    /// The bytes (keys and values) of the chunks deleted.
    pub dropped_bytes: u64,
}

/// Adds to `batch` the deletes of the oldest revisions beyond `retention`,
/// and of as many more oldest revisions as it takes to drop at least
/// `excess_bytes`, looking at most at a bounded number of chunks; returns
/// the new floor. `newest` is the revision being committed (it is not
/// stored yet, so it is always kept).
#[allow(clippy::too_many_arguments)]
pub fn prune(
    store: &dyn Store,
    batch: &mut WriteBatch,
    tenant_id: u64,
    floor: u64,
    newest: u64,
    now_ms: u64,
    retention: Retention,
    excess_bytes: u64,
) -> Result<Pruned, HistoryError> {
    let keep_after = newest.saturating_sub(retention.max_revisions);
    let age_cutoff = now_ms.saturating_sub(retention.max_age_ms);
    let prefix = keys::events_prefix(tenant_id);
    let start = keys::event_key(tenant_id, floor, u32::MAX);
    let page = store.scan(&prefix, Some(&start), SCAN_CHUNKS * 4)?;
    let mut pruned = Pruned {
        floor,
        oldest_ms: None,
        dropped_bytes: 0,
    };
    let mut dropping: Option<u64> = None;
    for (key, value) in &page {
        let Some((_, revision, chunk)) = keys::parse_event_key(key) else {
            continue;
        };
        if dropping != Some(revision) {
            // The first chunk of a revision decides for all of its chunks.
            let time = first_event_ms(value);
            let old = revision <= keep_after
                || (chunk == 0 && time.is_some_and(|t| t < age_cutoff))
                || pruned.dropped_bytes < excess_bytes;
            if !old {
                pruned.oldest_ms = time;
                pruned.floor = pruned.floor.max(revision.saturating_sub(1));
                return Ok(pruned);
            }
            dropping = Some(revision);
            pruned.floor = revision;
        }
        pruned.dropped_bytes += chunk_bytes(key, value);
        batch.delete(key.clone());
    }
    if page.len() < SCAN_CHUNKS * 4 {
        // Every stored revision was dropped: only the one being committed
        // remains.
        pruned.floor = pruned.floor.max(newest.saturating_sub(1));
    }
    Ok(pruned)
}

/// The time of the first event of a stored chunk.
fn first_event_ms(value: &[u8]) -> Option<u64> {
    let group = v1::EventGroup::decode(value).ok()?;
    let time = group.events.first()?.time?;
    u64::try_from(time.seconds)
        .ok()
        .map(|seconds| seconds * 1_000 + u64::try_from(time.nanos / 1_000_000).unwrap_or(0))
}

/// The time of the first event kept after `floor`, if any (at start-up).
pub fn oldest_after(
    store: &dyn Store,
    tenant_id: u64,
    floor: u64,
) -> Result<Option<u64>, HistoryError> {
    let prefix = keys::events_prefix(tenant_id);
    let start = keys::event_key(tenant_id, floor, u32::MAX);
    Ok(store
        .scan(&prefix, Some(&start), 1)?
        .first()
        .and_then(|(_, value)| first_event_ms(value)))
}

/// Errors reading the log.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored chunk does not decode.
    #[error("the event log is corrupt: {0}")]
    Corrupt(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::InMemoryStore;

    fn event(revision: u64, time_ms: u64, payload: usize) -> v1::Event {
        v1::Event {
            revision,
            kind: v1::EventKind::DriftDetected.into(),
            time: Some(prost_types::Timestamp {
                seconds: i64::try_from(time_ms / 1000).expect("small"),
                nanos: i32::try_from((time_ms % 1000) * 1_000_000).expect("small"),
            }),
            body: Some(v1::event::Body::DriftDetected(v1::DriftDetected {
                item: None,
                paths: vec!["x".repeat(payload)],
            })),
        }
    }

    /// Stores `events` as `revision` of tenant 7; returns the bytes stored.
    fn commit(store: &InMemoryStore, revision: u64, events: &[v1::Event]) -> u64 {
        let mut batch = WriteBatch::new();
        let stored = write_revision(&mut batch, 7, revision, events);
        store.commit_blocking(batch).expect("commit");
        stored
    }

    fn revisions(groups: &[Arc<Revision<v1::Event>>]) -> Vec<(u64, usize)> {
        groups
            .iter()
            .map(|g| (g.revision, g.events.len()))
            .collect()
    }

    #[test]
    fn large_revisions_are_split_into_chunks_and_read_back_whole() {
        let store = InMemoryStore::new();
        let big: Vec<_> = (0..40).map(|_| event(2, 1_000, 4_000)).collect();
        commit(&store, 1, &[event(1, 1_000, 10)]);
        commit(&store, 2, &big);
        commit(&store, 4, &[event(4, 1_000, 10)]);
        assert!(
            store
                .scan(&keys::events_prefix(7), None, 100)
                .expect("scan")
                .len()
                > 3
        );
        let read = read_after(&store, 7, 0, 10, 100).expect("read");
        assert_eq!(revisions(&read), vec![(1, 1), (2, 40), (4, 1)]);
        assert_eq!(read[1].events, big);
        assert_eq!(
            revisions(&read_after(&store, 7, 1, 10, 100).expect("read")),
            vec![(2, 40), (4, 1)]
        );
        assert_eq!(
            revisions(&read_after(&store, 7, 0, 2, 100).expect("read")),
            vec![(1, 1), (2, 40)]
        );
        assert_eq!(
            revisions(&read_after(&store, 7, 0, 10, 1).expect("read")),
            vec![(1, 1)]
        );
    }

    #[test]
    fn pruning_by_count_moves_the_floor_and_deletes_every_chunk() {
        let store = InMemoryStore::new();
        for revision in 1..=10 {
            commit(
                &store,
                revision,
                &[
                    event(revision, 1_000, 40_000),
                    event(revision, 1_000, 40_000),
                ],
            );
        }
        let retention = Retention {
            max_revisions: 4,
            max_age_ms: u64::MAX,
        };
        let mut batch = WriteBatch::new();
        let pruned = prune(&store, &mut batch, 7, 0, 10, 2_000, retention, 0).expect("prune");
        store.commit_blocking(batch).expect("commit");
        assert_eq!(pruned.floor, 6);
        assert_eq!(pruned.oldest_ms, Some(1_000));
        assert_eq!(
            revisions(&read_after(&store, 7, 0, 10, 100).expect("read")),
            vec![(7, 2), (8, 2), (9, 2), (10, 2)]
        );
    }

    #[test]
    fn pruning_by_age_keeps_the_recent_revisions() {
        let store = InMemoryStore::new();
        for revision in 1..=6 {
            commit(&store, revision, &[event(revision, revision * 1_000, 10)]);
        }
        let retention = Retention {
            max_revisions: 100,
            max_age_ms: 2_500,
        };
        let mut batch = WriteBatch::new();
        let pruned = prune(&store, &mut batch, 7, 0, 6, 6_000, retention, 0).expect("prune");
        store.commit_blocking(batch).expect("commit");
        assert_eq!((pruned.floor, pruned.oldest_ms), (3, Some(4_000)));
        assert_eq!(oldest_after(&store, 7, 3).expect("oldest"), Some(4_000));
    }

    #[test]
    fn pruning_by_bytes_drops_whole_oldest_revisions_until_the_excess_is_gone() {
        let store = InMemoryStore::new();
        // Revision 2 is split into several chunks; every revision is far
        // younger than the age bound and within the count bound.
        let sizes: Vec<u64> = (1..=6)
            .map(|revision| {
                let events: Vec<_> = (0..if revision == 2 { 40 } else { 1 })
                    .map(|_| event(revision, 1_000, 4_000))
                    .collect();
                commit(&store, revision, &events)
            })
            .collect();
        assert_eq!(
            stored_bytes_after(&store, 7, 0).expect("counted"),
            sizes.iter().sum::<u64>()
        );
        let retention = Retention {
            max_revisions: 100,
            max_age_ms: u64::MAX,
        };
        // One byte more than revision 1 holds: revision 2 goes too, all of
        // its chunks, and nothing after it.
        let mut batch = WriteBatch::new();
        let pruned =
            prune(&store, &mut batch, 7, 0, 7, 2_000, retention, sizes[0] + 1).expect("prune");
        store.commit_blocking(batch).expect("commit");
        assert_eq!(pruned.floor, 2);
        assert_eq!(pruned.dropped_bytes, sizes[0] + sizes[1]);
        assert_eq!(
            revisions(&read_after(&store, 7, 0, 10, 100).expect("read")),
            vec![(3, 1), (4, 1), (5, 1), (6, 1)]
        );
        assert_eq!(
            stored_bytes_after(&store, 7, pruned.floor).expect("counted"),
            sizes[2..].iter().sum::<u64>()
        );

        // An excess beyond everything stored empties the log; the floor
        // stops below the revision being committed.
        let mut batch = WriteBatch::new();
        let pruned = prune(&store, &mut batch, 7, 2, 7, 2_000, retention, u64::MAX).expect("prune");
        store.commit_blocking(batch).expect("commit");
        assert_eq!(pruned.floor, 6);
        assert_eq!(pruned.dropped_bytes, sizes[2..].iter().sum::<u64>());
        assert_eq!(stored_bytes_after(&store, 7, 0).expect("counted"), 0);
    }
}
