//! `reconciled store copy`: every record of one store into another, empty
//! one (sled to etcd to move a single-node deployment onto replicas, and
//! back).

use tracing::debug;

use crate::store::{Store, StoreError, WriteBatch, keys};

/// Records read and written per batch.
const COPY_PAGE: usize = 1_000;

/// Why a copy did not happen or stopped.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The destination holds records already.
    #[error(
        "the destination store is not empty; copy only into an empty store (for etcd, a new \
         --etcd-prefix or `etcdctl del --prefix <prefix>`; for sled, a new directory)"
    )]
    DestinationNotEmpty,
    /// The source is itself an unfinished copy.
    #[error(
        "the source store holds only part of the records of a `reconciled store copy` that did \
         not finish; copy from the store it was copied from (or a backup) instead"
    )]
    SourceIncomplete,
    /// The source holds no record at all: a mistyped location (an etcd
    /// prefix, say) rather than a store, which even new holds its layout.
    #[error(
        "the source store holds no records, so there is nothing to copy; check --from (and, for \
         etcd, --etcd-prefix): even a new store holds its schema version"
    )]
    SourceEmpty,
    /// Reading or writing failed; the destination holds part of the copy.
    #[error("{0}; the destination now holds part of the copy: empty it before copying again")]
    Store(#[from] StoreError),
}

/// Copies every record of `from` into the empty store `to`, in batches of
/// [`COPY_PAGE`] records; returns how many were copied. Both stores must
/// be raw (not wrapped in [`ChunkedValues`](crate::store::ChunkedValues)):
/// chunks are copied as the records they are. Stop the servers using
/// either store first.
///
/// From its first batch until its last, `to` holds
/// [`keys::copy_incomplete_key`]: a copy that stops midway (killed, or a
/// failed write) leaves a store that start-up, `migrate` and `repair`
/// refuse, rather than one served with part of its records.
pub fn copy_store(from: &dyn Store, to: &dyn Store) -> Result<u64, CopyError> {
    if !to.scan(&[], None, 1)?.is_empty() {
        return Err(CopyError::DestinationNotEmpty);
    }
    if from.get(keys::copy_incomplete_key())?.is_some() {
        return Err(CopyError::SourceIncomplete);
    }
    if from.scan(&[], None, 1)?.is_empty() {
        return Err(CopyError::SourceEmpty);
    }
    let mut copied = 0u64;
    let mut after: Option<Vec<u8>> = None;
    let mut first = true;
    loop {
        let page = from.scan(&[], after.as_deref(), COPY_PAGE)?;
        let done = page.len() < COPY_PAGE;
        after = page.last().map(|(key, _)| key.clone());
        let mut batch = WriteBatch::new();
        if first && !done {
            batch.put(keys::copy_incomplete_key().to_vec(), Vec::new());
        }
        for (key, value) in page {
            batch.put(key, value);
            copied += 1;
        }
        if done && !first {
            batch.delete(keys::copy_incomplete_key().to_vec());
        }
        first = false;
        to.commit_blocking(batch)?;
        debug!(copied, "Copied a batch of records.");
        if done {
            return Ok(copied);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::InMemoryStore;

    #[test]
    fn every_record_is_copied_into_an_empty_store_only() {
        let from = InMemoryStore::new();
        let mut batch = WriteBatch::new();
        for index in 0..2_500u32 {
            batch.put(index.to_be_bytes().to_vec(), vec![1; 10]);
        }
        from.commit_blocking(batch).expect("commit");
        let to = InMemoryStore::new();
        assert_eq!(copy_store(&from, &to).expect("copied"), 2_500);
        assert_eq!(from.snapshot(), to.snapshot());
        assert!(matches!(
            copy_store(&from, &to),
            Err(CopyError::DestinationNotEmpty)
        ));
    }

    #[test]
    fn the_store_of_an_unfinished_copy_is_not_copied_from() {
        let from = InMemoryStore::new();
        let mut batch = WriteBatch::new();
        batch.put(keys::copy_incomplete_key().to_vec(), Vec::new());
        batch.put(b"record".to_vec(), vec![1]);
        from.commit_blocking(batch).expect("commit");
        assert!(matches!(
            copy_store(&from, &InMemoryStore::new()),
            Err(CopyError::SourceIncomplete)
        ));
    }

    #[test]
    fn an_empty_source_is_refused_rather_than_copied_as_nothing() {
        let to = InMemoryStore::new();
        assert!(matches!(
            copy_store(&InMemoryStore::new(), &to),
            Err(CopyError::SourceEmpty)
        ));
        assert!(to.snapshot().is_empty(), "nothing was written");
    }
}
