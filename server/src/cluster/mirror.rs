//! A live copy of the cluster keys under one prefix (`members/`,
//! `owners/`): read once, then kept up to date by an etcd watch from the
//! revision of that read, and read again whenever the watch is lost.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::store::etcd::{KeyEvent, Versioned};
use crate::store::{EtcdStore, StoreError};

/// How long a failed watch waits before the keys are read again.
const RELIST_PAUSE: Duration = Duration::from_millis(200);

/// The keys under a prefix (without it) and their values and revisions.
pub type Keys = Arc<BTreeMap<Vec<u8>, Versioned>>;

/// Reads the keys under `prefix` and keeps the returned receiver up to
/// date until `stop` is cancelled. Returns once the first read is done.
pub async fn mirror(
    store: Arc<EtcdStore>,
    prefix: &'static [u8],
    stop: CancellationToken,
) -> Result<watch::Receiver<Keys>, StoreError> {
    let (keys, revision) = list(&store, prefix).await?;
    let (sender, receiver) = watch::channel(Arc::new(keys));
    tokio::spawn(follow(store, prefix, revision, sender, stop));
    Ok(receiver)
}

async fn list(
    store: &EtcdStore,
    prefix: &[u8],
) -> Result<(BTreeMap<Vec<u8>, Versioned>, i64), StoreError> {
    let (found, revision) = store.list_versioned(prefix).await?;
    let keys = found
        .into_iter()
        .filter_map(|(key, value)| Some((key.strip_prefix(prefix)?.to_vec(), value)))
        .collect();
    Ok((keys, revision))
}

async fn follow(
    store: Arc<EtcdStore>,
    prefix: &'static [u8],
    mut revision: i64,
    sender: watch::Sender<Keys>,
    stop: CancellationToken,
) {
    loop {
        match store.watch_prefix(prefix, revision + 1).await {
            Ok(mut events) => loop {
                let event = tokio::select! {
                    () = stop.cancelled() => return,
                    event = events.recv() => event,
                };
                match event {
                    Some(Ok(event)) => {
                        sender.send_modify(|keys| {
                            let keys = Arc::make_mut(keys);
                            match event {
                                KeyEvent::Put {
                                    key,
                                    value,
                                    mod_revision,
                                    lease,
                                } => {
                                    revision = revision.max(mod_revision);
                                    if let Some(key) = key.strip_prefix(prefix) {
                                        let create_revision = keys
                                            .get(key)
                                            .map_or(mod_revision, |old| old.create_revision);
                                        keys.insert(
                                            key.to_vec(),
                                            Versioned {
                                                value,
                                                mod_revision,
                                                create_revision,
                                                lease,
                                            },
                                        );
                                    }
                                }
                                KeyEvent::Delete { key, revision: at } => {
                                    revision = revision.max(at);
                                    if let Some(key) = key.strip_prefix(prefix) {
                                        keys.remove(key);
                                    }
                                }
                            }
                        });
                    }
                    Some(Err(error)) => {
                        warn!(%error, prefix = %String::from_utf8_lossy(prefix), "A cluster watch ended; reading the keys again.");
                        break;
                    }
                    None => break,
                }
            },
            Err(error) => {
                warn!(%error, prefix = %String::from_utf8_lossy(prefix), "Cannot watch cluster keys; retrying.");
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(RELIST_PAUSE) => {}
        }
        match list(&store, prefix).await {
            Ok((keys, at)) => {
                revision = at;
                sender.send_replace(Arc::new(keys));
            }
            Err(error) => {
                warn!(%error, prefix = %String::from_utf8_lossy(prefix), "Cannot read cluster keys; retrying.");
            }
        }
    }
}
