//! Following the records under a prefix in etcd, through failures: what
//! the tenant directory and the fleet view both do.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::store::etcd::RecordChange;
use crate::store::{EtcdStore, StoreError};

/// The pause before a failed watch is opened again.
const REWATCH_PAUSE: Duration = Duration::from_millis(200);

/// Watches the records under `prefix` from `revision` + 1 until `stop`,
/// handing every batch of changes to `apply`, and opening the watch again
/// after a failure from where it left off. When etcd compacted away what
/// the watch had not delivered yet, `reload` reads the state afresh and
/// returns the revision to go on from (`None`: it failed, try again from
/// where it was). `what` names the records in logs.
pub(super) async fn follow_records<R>(
    store: &EtcdStore,
    prefix: &[u8],
    mut revision: i64,
    what: &str,
    stop: &CancellationToken,
    mut apply: impl FnMut(&[RecordChange]),
    mut reload: impl FnMut(i64) -> R,
) where
    R: Future<Output = Option<i64>>,
{
    loop {
        let mut changes = match store.watch_records(prefix, revision + 1).await {
            Ok(changes) => changes,
            Err(error) => {
                warn!(%error, what, "Cannot watch records in etcd; retrying.");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(REWATCH_PAUSE) => continue,
                }
            }
        };
        loop {
            let batch = tokio::select! {
                () = stop.cancelled() => return,
                batch = changes.recv() => batch,
            };
            match batch {
                Some(Ok(batch)) => {
                    if let Some(last) = batch.last() {
                        revision = revision.max(last.revision);
                    }
                    apply(&batch);
                }
                Some(Err(StoreError::Compacted {
                    compact_revision, ..
                })) => {
                    warn!(
                        compact_revision,
                        what, "A watch in etcd was compacted away; reading the records again."
                    );
                    if let Some(at) = reload(compact_revision).await {
                        revision = at;
                    }
                    break;
                }
                Some(Err(error)) => {
                    warn!(%error, what, "A watch in etcd ended; opening it again.");
                    break;
                }
                None => break,
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(REWATCH_PAUSE) => {}
        }
    }
}
