//! Reads that never see half a commit.
//!
//! Every read is one read-only etcd transaction that also looks for commit
//! markers at the same revision. Without a marker the answer stands: every
//! commit is either fully applied or not visible. With one, a staged commit
//! is being rolled in: the read waits for it, and after `marker_wait` rolls
//! it in itself (its writer died) before reading again.

use std::time::{Duration, Instant};

use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};

use crate::store::etcd::connect::Shared;
use crate::store::etcd::connect::retry;
use crate::store::etcd::layout::prefix_end;
use crate::store::etcd::staged::{marked_commits, roll_forward};
use crate::store::{Record, StoreError};

/// Most keys asked of etcd at once (64 KiB values: 16 MiB a reply).
const PAGE: usize = 256;

/// The answer of `read` at one revision with no marker present.
struct Consistent {
    /// The reply to the read's own operation.
    reply: etcd_client::GetResponse,
    /// The revision it was read at.
    revision: i64,
}

/// Runs the range read `key`/`options`, together with a marker probe,
/// until no marker is present.
async fn read(
    shared: &Shared,
    key: Vec<u8>,
    options: GetOptions,
) -> Result<Consistent, StoreError> {
    let markers = shared.layout.marker_prefix();
    let probe = GetOptions::new()
        .with_range(prefix_end(&markers))
        .with_keys_only()
        .with_limit(1);
    let txn = Txn::new().and_then(vec![
        TxnOp::get(key, Some(options)),
        TxnOp::get(markers, Some(probe)),
    ]);
    let started = Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        let asked = Instant::now();
        let response = retry("read", shared.options.commit_timeout, || {
            let (mut kv, txn) = (shared.kv.clone(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
        .map_err(|f| f.into_store_error("read"))?;
        shared.latency.reads.observe(asked.elapsed());
        shared.saw(response.header());
        let revision = response.header().map_or(0, |h| h.revision());
        let mut replies = response.op_responses().into_iter();
        let (Some(TxnOpResponse::Get(reply)), Some(TxnOpResponse::Get(probe))) =
            (replies.next(), replies.next())
        else {
            return Err(StoreError::Etcd {
                operation: "read",
                message: "etcd answered a read with unexpected replies".to_owned(),
            });
        };
        if probe.kvs().is_empty() {
            return Ok(Consistent { reply, revision });
        }
        if started.elapsed() >= shared.options.marker_wait {
            for id in marked_commits(shared).await? {
                roll_forward(shared, &id).await?;
            }
            continue;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// The value of store key `key`.
pub(crate) async fn get(shared: &Shared, key: Vec<u8>) -> Result<Option<Vec<u8>>, StoreError> {
    let found = read(shared, shared.layout.data(&key), GetOptions::new()).await?;
    Ok(found.reply.kvs().first().map(|kv| kv.value().to_vec()))
}

/// Store keys starting with `prefix`, after `start_after`, at most
/// `limit`, all read at one revision.
pub(crate) async fn scan(
    shared: &Shared,
    prefix: Vec<u8>,
    start_after: Option<Vec<u8>>,
    limit: usize,
) -> Result<Vec<Record>, StoreError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let layout = &shared.layout;
    let end = prefix_end(&layout.data(&prefix));
    let mut from = match &start_after {
        Some(after) if after.as_slice() >= prefix.as_slice() => {
            let mut key = layout.data(after);
            key.push(0);
            key
        }
        _ => layout.data(&prefix),
    };
    let page = |wanted: usize| {
        GetOptions::new()
            .with_range(end.clone())
            .with_limit(i64::try_from(wanted.min(PAGE)).unwrap_or(1))
    };
    let first = read(shared, from.clone(), page(limit)).await?;
    let revision = first.revision;
    let mut reply = first.reply;
    let mut found: Vec<Record> = Vec::new();
    loop {
        for kv in reply.kvs() {
            if let Some(key) = layout.store_key(kv.key()) {
                found.push((key.to_vec(), kv.value().to_vec()));
            }
        }
        let Some(last) = reply.kvs().last() else {
            break;
        };
        if found.len() >= limit || !reply.more() {
            break;
        }
        from = last.key().to_vec();
        from.push(0);
        let options = page(limit - found.len()).with_revision(revision);
        reply = retry("scan keys", shared.options.commit_timeout, || {
            let (mut kv, from, options) = (shared.kv.clone(), from.clone(), options.clone());
            async move { kv.get(from, Some(options)).await }
        })
        .await
        .map_err(|f| f.into_store_error("scan keys"))?;
    }
    found.truncate(limit);
    Ok(found)
}
