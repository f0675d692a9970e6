//! Commits larger than one etcd transaction (DESIGN section 11).
//!
//! 1. A staging header `store/staging/<id>` is put under a lease of its
//!    own, kept alive while staging runs.
//! 2. The coalesced writes are put as chunks `store/staged/<id>/<n>`,
//!    each well under etcd's request limit. Nothing reads them.
//! 3. One small transaction makes the commit real: if the header still
//!    exists (its writer is alive and nobody discarded the chunks) and the
//!    batch's fence holds, it puts the marker `store/commits/<id>` and
//!    deletes the header. The marker's revision `M` is the commit's
//!    revision.
//! 4. The writes are rolled into their keys by transactions of at most
//!    `max_txn_ops` writes, each write guarded by "the key's revision is
//!    below `M`": a key written after the marker keeps its later value,
//!    and rolling in twice (a crash, or a reader helping) changes nothing.
//!    Each transaction also requires the marker: one that etcd held back
//!    past step 5 cannot land after a later commit deleted one of its
//!    keys (a deleted key has no revision to compare).
//! 5. One transaction deletes the chunks and the marker.
//!
//! Readers never see half a commit: every read checks, in the same etcd
//! revision, that no marker exists (see [`read`](super::read)); while one
//! does it waits for the roll-in, and rolls the batch in itself if the
//! marker outlives `marker_wait` (its writer died). Opening a store rolls
//! every marked batch forward, oldest first, and deletes the chunks of
//! batches that were never marked and whose staging lease has expired; an
//! open store looks for such chunks again every staging lease's TTL.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp};
use rand::Rng as _;
use tracing::{info, warn};

use crate::store::etcd::codec::{KeyWrite, decode_chunk, encode_chunks, write_bytes};
use crate::store::etcd::connect::{
    Failure, Shared, etcd_error, fenced, invalid_fence, retry, stop_process,
};
use crate::store::etcd::writer::LateAttempt;
use crate::store::etcd::{CrashPoint, layout::prefix_end};
use crate::store::{Fence, StoreError};

/// Room left in a chunk's request for its key and the request's encoding.
const CHUNK_HEADROOM: usize = 4 * 1024;

/// What became of a staged commit.
pub(crate) enum Staged {
    /// It was applied (`Ok`) or refused with nothing applied.
    Done(Result<(), StoreError>),
    /// A test's crash point stopped it; the writer must stop too.
    Crashed,
}

/// A fresh id (of a staged commit, of a commit's attempts): 128 random
/// bits in hex.
pub(crate) fn new_id() -> String {
    let bits: u128 = rand::rng().random();
    format!("{bits:032x}")
}

/// Stages `writes`, marks them committed under `fence`, and rolls them in
/// (`late`: a test's transactions sent again late, see
/// [`LateAttempt`]).
pub(crate) async fn commit(
    shared: &Shared,
    writes: Vec<KeyWrite>,
    fence: Option<Fence>,
    late: Option<&LateAttempt>,
) -> Staged {
    let id = new_id();
    let marked = match stage_and_mark(shared, &id, &writes, fence.as_ref()).await {
        Ok(Some(revision)) => revision,
        Ok(None) => return Staged::Crashed,
        Err(error) => {
            discard(shared, &id).await;
            return Staged::Done(Err(error));
        }
    };
    if shared.options.crash_point == Some(CrashPoint::AfterMarker) {
        return Staged::Crashed;
    }
    let crash_midway = shared.options.crash_point == Some(CrashPoint::DuringRollIn);
    match roll_in(shared, &id, marked, &writes, crash_midway, late).await {
        Ok(true) => Staged::Done(Ok(())),
        Ok(false) => Staged::Crashed,
        // The commit is durable (marked): a roll-in that cannot finish is
        // finished by the next reader or loader, but this process can no
        // longer tell what its later commits land on.
        Err(error) => stop_process(&error.to_string()),
    }
}

/// Steps 1–3: the marker's revision, or `None` at a test's crash point.
async fn stage_and_mark(
    shared: &Shared,
    id: &str,
    writes: &[KeyWrite],
    fence: Option<&Fence>,
) -> Result<Option<i64>, StoreError> {
    let layout = &shared.layout;
    let timeout = shared.options.commit_timeout;
    let ttl = i64::try_from(shared.options.staging_lease.as_secs().max(2)).unwrap_or(60);
    let mut client = shared.client.clone();
    let lease = retry("grant a staging lease", timeout, || {
        let mut client = client.clone();
        async move { client.lease_grant(ttl, None).await }
    })
    .await
    .map_err(|f| f.into_store_error("grant a staging lease"))?
    .id();
    let staged = async {
        let kv = shared.kv.clone();
        let header = layout.staging(id);
        retry("stage a commit", timeout, || {
            let (mut kv, header) = (kv.clone(), header.clone());
            async move {
                kv.put(
                    header,
                    Vec::new(),
                    Some(PutOptions::new().with_lease(lease)),
                )
                .await
            }
        })
        .await
        .map_err(|f| f.into_store_error("stage a commit"))?;
        let chunk_bytes = shared
            .options
            .max_request_bytes
            .saturating_sub(CHUNK_HEADROOM)
            .max(1);
        let chunks = encode_chunks(writes, chunk_bytes);
        let count = u32::try_from(chunks.len()).map_err(|_| StoreError::Etcd {
            operation: "stage a commit",
            message: "the batch needs more than 2^32 chunks".to_owned(),
        })?;
        // Nothing reads chunks before the marker: they go out together.
        let puts = (0..count)
            .zip(chunks)
            .map(|(index, chunk)| {
                Txn::new().and_then(vec![TxnOp::put(layout.chunk(id, index), chunk, None)])
            })
            .collect();
        send_all(shared, "stage a commit", puts).await?;
        Ok::<_, StoreError>(count)
    };
    // The lease must outlive staging: keep it alive meanwhile.
    let keep_alive = keep_lease_alive(&mut client, lease, shared.options.staging_lease);
    let count = tokio::select! {
        staged = staged => staged?,
        () = keep_alive => {
            return Err(StoreError::Etcd {
                operation: "stage a commit",
                message: "the staging lease could not be kept alive".to_owned(),
            });
        }
    };
    if shared.options.crash_point == Some(CrashPoint::AfterStaging) {
        return Ok(None);
    }
    let marked = mark(shared, id, count, fence).await;
    let mut client = shared.client.clone();
    // The header is gone with the marker; the lease is no longer needed,
    // and nothing waits for its revocation.
    tokio::spawn(async move {
        if let Err(error) = client.lease_revoke(lease).await {
            warn!(%error, "Could not revoke a staging lease; it expires by itself.");
        }
    });
    marked.map(Some)
}

/// Keeps `lease` alive; returns once it cannot have been renewed for a
/// whole `ttl` (it may have expired). A failed keep-alive stream (an etcd
/// member going away) is opened again.
pub(crate) async fn keep_lease_alive(client: &mut etcd_client::Client, lease: i64, ttl: Duration) {
    let mut renewed = tokio::time::Instant::now();
    loop {
        if let Ok((mut keeper, mut replies)) = client.lease_keep_alive(lease).await {
            loop {
                if keeper.keep_alive().await.is_err() {
                    break;
                }
                match replies.message().await {
                    Ok(Some(reply)) if reply.ttl() > 0 => renewed = tokio::time::Instant::now(),
                    Ok(Some(_)) => return,
                    _ => break,
                }
                tokio::time::sleep(ttl / 3).await;
            }
        }
        if renewed.elapsed() >= ttl {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Step 3: the marker transaction; the marker's revision.
async fn mark(
    shared: &Shared,
    id: &str,
    count: u32,
    fence: Option<&Fence>,
) -> Result<i64, StoreError> {
    let layout = &shared.layout;
    let header = layout.staging(id);
    let marker = layout.marker(id);
    let mut compares = vec![Compare::version(header.clone(), CompareOp::Greater, 0)];
    let mut otherwise = vec![TxnOp::get(marker.clone(), None)];
    if let Some(fence) = fence {
        let key = layout
            .cluster(&fence.key)
            .ok_or_else(|| invalid_fence(fence))?;
        compares.push(Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            fence.mod_revision,
        ));
        otherwise.push(TxnOp::get(key, None));
    }
    let txn = Txn::new()
        .when(compares)
        .and_then(vec![
            TxnOp::put(marker.clone(), count.to_be_bytes().to_vec(), None),
            TxnOp::delete(header, None),
        ])
        .or_else(otherwise);
    let response = match retry(
        "mark a staged commit",
        shared.options.commit_timeout,
        || {
            let (mut kv, txn) = (shared.kv.clone(), txn.clone());
            async move { kv.txn(txn).await }
        },
    )
    .await
    {
        Ok(response) => response,
        Err(Failure::Refused(error)) => return Err(etcd_error("mark a staged commit")(error)),
        Err(Failure::Unknown(error)) => stop_process(&error.to_string()),
    };
    let revision = response.header().map_or(0, |h| h.revision());
    if response.succeeded() {
        return Ok(revision);
    }
    let reads: Vec<Option<i64>> = response
        .op_responses()
        .into_iter()
        .map(|op| match op {
            etcd_client::TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.mod_revision()),
            _ => None,
        })
        .collect();
    // A retried marker transaction that had landed the first time.
    if let Some(Some(marked)) = reads.first() {
        return Ok(*marked);
    }
    if let Some(fence) = fence {
        let now = reads.get(1).copied().flatten().unwrap_or(0);
        if now != fence.mod_revision {
            return Err(fenced(fence, now));
        }
    }
    Err(StoreError::Etcd {
        operation: "mark a staged commit",
        message: "its staging lease expired (this process was paused or lost etcd) and its \
                  chunks may have been discarded; nothing of the batch was written"
            .to_owned(),
    })
}

/// Step 4 and 5: rolls `writes` (marked at `marked`) into their keys and
/// removes the chunks and the marker. `Ok(false)`: stopped after the
/// first transaction at a test's crash point.
async fn roll_in(
    shared: &Shared,
    id: &str,
    marked: i64,
    writes: &[KeyWrite],
    crash_midway: bool,
    late: Option<&LateAttempt>,
) -> Result<bool, StoreError> {
    let layout = &shared.layout;
    // etcd counts a nested transaction's operations against what the outer
    // one leaves of `--max-txn-ops`: n guarded writes need n + 1 <= max.
    let max_ops = shared.options.max_txn_ops.saturating_sub(1).max(1);
    let max_bytes = shared.options.max_request_bytes;
    let mut transactions = Vec::new();
    let mut start = 0;
    while start < writes.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < writes.len() && end - start < max_ops {
            let size = write_bytes(&writes[end]);
            if end > start && bytes + size > max_bytes {
                break;
            }
            bytes += size;
            end += 1;
        }
        let guarded: Vec<TxnOp> = writes[start..end]
            .iter()
            .map(|(key, value)| {
                let key = layout.data(key);
                let write = match value {
                    Some(value) => TxnOp::put(key.clone(), value.clone(), None),
                    None => TxnOp::delete(key.clone(), None),
                };
                TxnOp::txn(
                    Txn::new()
                        .when(vec![Compare::mod_revision(key, CompareOp::Less, marked)])
                        .and_then(vec![write]),
                )
            })
            .collect();
        transactions.push(
            Txn::new()
                .when(vec![Compare::version(
                    layout.marker(id),
                    CompareOp::Greater,
                    0,
                )])
                .and_then(guarded),
        );
        start = end;
    }
    let first = transactions.first().cloned();
    if crash_midway {
        if let Some(first) = transactions.into_iter().next() {
            send(shared, "roll a staged commit in", first).await?;
        }
        return Ok(false);
    }
    // Each write is guarded on its own key and the marker's revision, so
    // the transactions are independent: they go out together.
    send_all(shared, "roll a staged commit in", transactions).await?;
    let finish = Txn::new().and_then(vec![
        TxnOp::delete(
            layout.chunks_of(id),
            Some(DeleteOptions::new().with_prefix()),
        ),
        TxnOp::delete(layout.marker(id), None),
    ]);
    let finished = retry(
        "finish a staged commit",
        shared.options.commit_timeout,
        || {
            let (mut kv, txn) = (shared.kv.clone(), finish.clone());
            async move { kv.txn(txn).await }
        },
    )
    .await
    .map_err(|f| f.into_store_error("finish a staged commit"))?;
    // Every key rolled in was written below this revision.
    shared.saw(finished.header());
    if let (Some(late), Some(first)) = (late, first) {
        late.hold(shared, first).await;
    }
    Ok(true)
}

/// Transactions of one staged commit sent at once, at most.
const PARALLEL_TRANSACTIONS: usize = 8;

/// Sends `txn`, retrying while etcd does not answer.
async fn send(shared: &Shared, operation: &'static str, txn: Txn) -> Result<(), StoreError> {
    retry(operation, shared.options.commit_timeout, || {
        let (mut kv, txn) = (shared.kv.clone(), txn.clone());
        async move { kv.txn(txn).await }
    })
    .await
    .map_err(|f| f.into_store_error(operation))?;
    Ok(())
}

/// Sends independent transactions, up to [`PARALLEL_TRANSACTIONS`] at a
/// time, each retried while etcd does not answer; the first failure is
/// returned once all have ended.
async fn send_all(
    shared: &Shared,
    operation: &'static str,
    transactions: Vec<Txn>,
) -> Result<(), StoreError> {
    let mut pending = transactions.into_iter();
    let mut running = tokio::task::JoinSet::new();
    let mut failed = None;
    loop {
        while running.len() < PARALLEL_TRANSACTIONS
            && let Some(txn) = pending.next()
        {
            let (kv, timeout) = (shared.kv.clone(), shared.options.commit_timeout);
            running.spawn(async move {
                retry(operation, timeout, || {
                    let (mut kv, txn) = (kv.clone(), txn.clone());
                    async move { kv.txn(txn).await }
                })
                .await
                .map(|_| ())
                .map_err(|f| f.into_store_error(operation))
            });
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        let outcome = done.unwrap_or_else(|_| {
            Err(StoreError::Etcd {
                operation,
                message: "a request task panicked".to_owned(),
            })
        });
        if let Err(error) = outcome {
            failed.get_or_insert(error);
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Deletes the chunks of a staged commit that will never be marked.
async fn discard(shared: &Shared, id: &str) {
    let mut kv = shared.kv.clone();
    let chunks = shared.layout.chunks_of(id);
    if let Err(error) = kv
        .delete(chunks, Some(DeleteOptions::new().with_prefix()))
        .await
    {
        warn!(%error, "Could not delete the chunks of a refused commit; the next open does.");
    }
}

/// Rolls staged commit `id` forward from its marker and chunks (a loader,
/// or a reader whose wait ran out). A marker gone meanwhile means another
/// process finished it.
pub(crate) async fn roll_forward(shared: &Shared, id: &str) -> Result<(), StoreError> {
    let layout = &shared.layout;
    let mut kv = shared.kv.clone();
    let read = etcd_error("read a staged commit");
    let marker = kv.get(layout.marker(id), None).await.map_err(&read)?;
    let Some(marker) = marker.kvs().first() else {
        return Ok(());
    };
    let marked = marker.mod_revision();
    let count = marker
        .value()
        .try_into()
        .map(u32::from_be_bytes)
        .unwrap_or(0);
    // Chunks one at a time: each is up to a request's size.
    let mut writes = Vec::new();
    for index in 0..count {
        let chunk = kv
            .get(
                layout.chunk(id, index),
                Some(GetOptions::new().with_revision(marked)),
            )
            .await;
        let chunk = match chunk {
            Ok(chunk) => chunk,
            // Compacted past the marker, or finished and gone: look again.
            Err(_) => kv.get(layout.chunk(id, index), None).await.map_err(&read)?,
        };
        match chunk.kvs().first() {
            Some(chunk) => writes.extend(decode_chunk(chunk.value())?),
            None => {
                let still = kv.get(layout.marker(id), None).await.map_err(&read)?;
                if still.kvs().is_empty() {
                    return Ok(());
                }
                return Err(StoreError::Backend {
                    operation: "roll a staged commit in",
                    message: format!("chunk {index} of marked commit {id} is missing"),
                });
            }
        }
    }
    info!(
        id,
        writes = writes.len(),
        "Rolling a committed batch forward."
    );
    roll_in(shared, id, marked, &writes, false, None)
        .await
        .map(|_| ())
}

/// Every marked commit, oldest first.
pub(crate) async fn marked_commits(shared: &Shared) -> Result<Vec<String>, StoreError> {
    let layout = &shared.layout;
    let mut kv = shared.kv.clone();
    let prefix = layout.marker_prefix();
    let markers = kv
        .get(
            prefix.clone(),
            Some(
                GetOptions::new()
                    .with_range(prefix_end(&prefix))
                    .with_keys_only(),
            ),
        )
        .await
        .map_err(etcd_error("list commit markers"))?;
    let mut found: Vec<(i64, String)> = markers
        .kvs()
        .iter()
        .filter_map(|kv| Some((kv.mod_revision(), layout.marker_id(kv.key())?.to_owned())))
        .collect();
    found.sort();
    Ok(found.into_iter().map(|(_, id)| id).collect())
}

/// What opening a store does before anything reads: rolls every marked
/// commit forward and discards chunks nobody will mark.
pub(crate) async fn recover(shared: &Shared) -> Result<(), StoreError> {
    for id in marked_commits(shared).await? {
        roll_forward(shared, &id).await?;
    }
    discard_abandoned(shared).await
}

/// Runs for as long as the store is open: every staging lease's TTL,
/// discards the chunks of commits whose writer died while staging (their
/// header's lease has expired and nothing marked them). Opening a store
/// finds those only once their lease is over, which may be long after the
/// restart of the writer that left them.
pub(crate) async fn sweep_abandoned(shared: std::sync::Arc<Shared>) {
    let period = shared.options.staging_lease.max(Duration::from_secs(2));
    loop {
        tokio::time::sleep(period).await;
        if let Err(error) = discard_abandoned(&shared).await {
            warn!(%error, "Could not look for abandoned staged chunks; trying again later.");
        }
    }
}

/// Deletes the chunks of every staged commit that has neither its
/// staging header (its writer is alive) nor its marker (it was made real).
async fn discard_abandoned(shared: &Shared) -> Result<(), StoreError> {
    let layout = &shared.layout;
    let mut kv = shared.kv.clone();
    let list = etcd_error("list staged chunks");
    let staged = layout.staged_prefix();
    let chunks = kv
        .get(
            staged.clone(),
            Some(
                GetOptions::new()
                    .with_range(prefix_end(&staged))
                    .with_keys_only(),
            ),
        )
        .await
        .map_err(&list)?;
    let mut ids: Vec<String> = chunks
        .kvs()
        .iter()
        .filter_map(|kv| layout.chunk_owner(kv.key()).map(str::to_owned))
        .collect();
    ids.dedup();
    for id in ids {
        let header = kv.get(layout.staging(&id), None).await.map_err(&list)?;
        let marker = kv.get(layout.marker(&id), None).await.map_err(&list)?;
        if header.kvs().is_empty() && marker.kvs().is_empty() {
            info!(id, "Discarding the chunks of a commit that was never made.");
            // Only if still unmarked and unstaged: a writer that is alive
            // after all finds its header gone and fails its commit.
            let txn = Txn::new()
                .when(vec![
                    Compare::version(layout.marker(&id), CompareOp::Equal, 0),
                    Compare::version(layout.staging(&id), CompareOp::Equal, 0),
                ])
                .and_then(vec![TxnOp::delete(
                    layout.chunks_of(&id),
                    Some(DeleteOptions::new().with_prefix()),
                )]);
            kv.txn(txn)
                .await
                .map_err(etcd_error("discard staged chunks"))?;
        }
    }
    Ok(())
}
