//! Values larger than one stored value ([`MAX_VALUE_BYTES`]), kept as
//! chunks.
//!
//! Every backend keeps each stored value under 64 KiB (DESIGN section 6:
//! sled's log segments, etcd's request limits), but some records are
//! legitimately larger: the current record of a 64 KiB item holds its
//! applied value and, while an operation runs, its target too; an event
//! carries an item's values. [`ChunkedValues`] wraps a store so that such a
//! value is written as chunks of at most [`CHUNK_BYTES`] under their own
//! keys, with a small header under the record's key, in the same atomic
//! batch, and is read back whole by [`Store::get`] and [`Store::scan`].
//! Callers see ordinary keys and values.
//!
//! Chunk keys live in their own key space (`0x02`, see
//! [`keys`](crate::store::keys)), so prefix scans of records never meet
//! them. The wrapper remembers which keys are chunked (read back from the
//! chunk space when it opens), so that overwriting or deleting such a key
//! also deletes its chunks in the same batch. If a commit fails after that
//! bookkeeping, the worst outcome is a chunk nobody reads any more.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use crate::store::{CommitHandle, MAX_VALUE_BYTES, Record, Store, StoreError, Write, WriteBatch};

/// The largest value a chunked store accepts, in bytes (1 MiB).
pub const MAX_CHUNKED_VALUE_BYTES: usize = 1024 * 1024;

/// The size of one chunk, in bytes.
pub const CHUNK_BYTES: usize = MAX_VALUE_BYTES;

// The chunk format is part of the on-disk layout, defined with the other
// layout bytes in `reconciled_migrations::layout` (migration 0002 reads
// chunked records too). A chunked value's key holds a header: a marker,
// the number of chunks (u32 BE) and the value's length (u64 BE). No record
// we store starts with a NUL byte followed by the marker's text (protobuf
// and JSON never start with NUL, and fixed-width integers are shorter than
// the header).
pub use reconciled_migrations::layout::CHUNK_SPACE;
use reconciled_migrations::layout::{chunk_header as header, chunk_key, parse_chunk_header};

/// Scan page used to find the chunked keys when the store opens.
const OPEN_PAGE: usize = 1024;

/// A store that also accepts values up to [`MAX_CHUNKED_VALUE_BYTES`].
pub struct ChunkedValues<S> {
    inner: S,
    /// Chunked keys and how many chunk keys each may have.
    chunked: Mutex<HashMap<Vec<u8>, u32>>,
}

impl<S: Store> ChunkedValues<S> {
    /// Wraps `inner`, reading which of its keys hold chunked values.
    pub fn new(inner: S) -> Result<Self, StoreError> {
        let mut chunked: HashMap<Vec<u8>, u32> = HashMap::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = inner.scan(&[CHUNK_SPACE], after.as_deref(), OPEN_PAGE)?;
            for (key, _) in &page {
                let (owner, index) = parse_chunk_key(key).ok_or_else(|| corrupt(key))?;
                let count = chunked.entry(owner.to_vec()).or_default();
                *count = (*count).max(index.saturating_add(1));
            }
            if page.len() < OPEN_PAGE {
                break;
            }
            after = page.last().map(|(key, _)| key.clone());
        }
        Ok(Self {
            inner,
            chunked: Mutex::new(chunked),
        })
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// `batch` with every large value split into chunks, and the chunks of
    /// overwritten or deleted chunked keys deleted.
    fn split(&self, batch: WriteBatch) -> Result<WriteBatch, StoreError> {
        batch.validate_within(MAX_CHUNKED_VALUE_BYTES)?;
        let mut chunked = self
            .chunked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let small = batch.writes().iter().all(|write| match write {
            Write::Put { value, .. } => value.len() <= MAX_VALUE_BYTES,
            Write::Delete { .. } => true,
        });
        if small && chunked.is_empty() {
            // The common case: nothing to split, no chunks to delete.
            return Ok(batch);
        }
        let mut out = WriteBatch::new();
        out.set_fence(batch.fence().cloned());
        for write in batch.into_writes() {
            let key = match &write {
                Write::Put { key, .. } | Write::Delete { key } => key.clone(),
            };
            let previous_chunks = chunked.remove(&key).unwrap_or(0);
            let chunks = match write {
                Write::Put { key, value } if value.len() > MAX_VALUE_BYTES => {
                    let pieces: Vec<&[u8]> = value.chunks(CHUNK_BYTES).collect();
                    let count = u32::try_from(pieces.len()).unwrap_or(u32::MAX);
                    for (index, piece) in (0..count).zip(&pieces) {
                        out.put(chunk_key(&key, index), piece.to_vec());
                    }
                    out.put(key.clone(), header(count, value.len()));
                    chunked.insert(key.clone(), count);
                    count
                }
                Write::Put { key, value } => {
                    out.put(key, value);
                    0
                }
                Write::Delete { key } => {
                    out.delete(key);
                    0
                }
            };
            for index in chunks..previous_chunks {
                out.delete(chunk_key(&key, index));
            }
        }
        Ok(out)
    }

    /// `value` read back whole if it is a chunked value's header.
    fn join(&self, key: &[u8], value: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        let Some((count, length)) = parse_header(&value) else {
            return Ok(value);
        };
        let mut whole = Vec::with_capacity(length.min(MAX_CHUNKED_VALUE_BYTES));
        for index in 0..count {
            let piece = self
                .inner
                .get(&chunk_key(key, index))?
                .ok_or_else(|| missing_chunk(key, index))?;
            whole.extend_from_slice(&piece);
        }
        if whole.len() != length {
            return Err(StoreError::Backend {
                operation: "read a chunked value",
                message: format!(
                    "key {} should hold {length} bytes but its chunks hold {}",
                    crate::store::batch::printable_key(key),
                    whole.len()
                ),
            });
        }
        Ok(whole)
    }
}

/// Up to `limit` entries after `start_after` that are not chunk keys,
/// each passed through `finish`, from pages of `fetch` (the inner store's
/// scan, after a key, for a count). Only a scan whose prefix reaches into
/// the chunk space meets chunk keys; those are skipped and the page is
/// filled up again.
fn outside_chunk_space<T>(
    start_after: Option<&[u8]>,
    limit: usize,
    mut fetch: impl FnMut(Option<&[u8]>, usize) -> Result<Vec<T>, StoreError>,
    key_of: impl Fn(&T) -> &Vec<u8>,
    mut finish: impl FnMut(T) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let mut found = Vec::new();
    let mut after = start_after.map(<[u8]>::to_vec);
    while found.len() < limit {
        let want = limit - found.len();
        let page = fetch(after.as_deref(), want)?;
        let full = page.len() == want;
        after = page.last().map(|entry| key_of(entry).clone());
        for entry in page {
            if key_of(&entry).first() != Some(&CHUNK_SPACE) {
                found.push(finish(entry)?);
            }
        }
        if !full {
            break;
        }
    }
    Ok(found)
}

impl<S: Store> Store for ChunkedValues<S> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.inner.get(key)? {
            Some(value) => self.join(key, value).map(Some),
            None => Ok(None),
        }
    }

    fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        outside_chunk_space(
            start_after,
            limit,
            |after, want| self.inner.scan(prefix, after, want),
            |(key, _)| key,
            |(key, value)| {
                let value = self.join(&key, value)?;
                Ok((key, value))
            },
        )
    }

    fn scan_keys(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        // No value is joined, so a record whose chunks are damaged is
        // still listed (and can be deleted or reported).
        outside_chunk_space(
            start_after,
            limit,
            |after, want| self.inner.scan_keys(prefix, after, want),
            |key| key,
            Ok,
        )
    }

    fn commit(&self, batch: WriteBatch) -> CommitHandle {
        match self.split(batch) {
            Ok(batch) => self.inner.commit(batch),
            Err(error) => CommitHandle::ready(Err(error)),
        }
    }

    fn commit_blocking(&self, batch: WriteBatch) -> Result<(), StoreError> {
        self.inner.commit_blocking(self.split(batch)?)
    }

    fn backup_to(&self, path: &Path) -> Result<(), StoreError> {
        self.inner.backup_to(path)
    }

    fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.inner.size_on_disk()
    }

    fn max_value_bytes(&self) -> usize {
        MAX_CHUNKED_VALUE_BYTES
    }

    fn writes_per_step(&self) -> Option<usize> {
        self.inner.writes_per_step()
    }
}

/// The key and index a chunk key belongs to.
fn parse_chunk_key(chunk: &[u8]) -> Option<(&[u8], u32)> {
    let rest = chunk.strip_prefix(&[CHUNK_SPACE])?;
    let (length, rest) = rest.split_first_chunk::<4>()?;
    let length = usize::try_from(u32::from_be_bytes(*length)).ok()?;
    let (key, index) = (rest.get(..length)?, rest.get(length..)?);
    let index: [u8; 4] = index.try_into().ok()?;
    Some((key, u32::from_be_bytes(index)))
}

/// The chunk count and value length of a chunked value's header.
fn parse_header(value: &[u8]) -> Option<(u32, usize)> {
    let (count, length) = parse_chunk_header(value)?;
    Some((count, usize::try_from(length).ok()?))
}

fn corrupt(key: &[u8]) -> StoreError {
    StoreError::Backend {
        operation: "read the chunk space",
        message: format!(
            "malformed chunk key {}",
            crate::store::batch::printable_key(key)
        ),
    }
}

fn missing_chunk(key: &[u8], index: u32) -> StoreError {
    StoreError::Backend {
        operation: "read a chunked value",
        message: format!(
            "chunk {index} of key {} is missing",
            crate::store::batch::printable_key(key)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::InMemoryStore;

    fn store() -> ChunkedValues<InMemoryStore> {
        ChunkedValues::new(InMemoryStore::new()).expect("opens")
    }

    fn put(store: &impl Store, key: &[u8], value: Vec<u8>) {
        let mut batch = WriteBatch::new();
        batch.put(key.to_vec(), value);
        store.commit_blocking(batch).expect("committed");
    }

    fn chunk_keys(store: &ChunkedValues<InMemoryStore>) -> usize {
        store
            .inner()
            .scan(&[CHUNK_SPACE], None, 1000)
            .expect("scan")
            .len()
    }

    fn big(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
    }

    #[test]
    fn a_large_value_reads_back_whole_through_get_and_scan() {
        let store = store();
        let value = big(3 * CHUNK_BYTES + 17, 1);
        put(&store, b"\x01a", value.clone());
        put(&store, b"\x01b", b"small".to_vec());
        assert_eq!(store.get(b"\x01a").expect("read"), Some(value.clone()));
        assert_eq!(chunk_keys(&store), 4);
        let all = store.scan(b"\x01", None, 10).expect("scan");
        assert_eq!(
            all,
            vec![
                (b"\x01a".to_vec(), value),
                (b"\x01b".to_vec(), b"small".to_vec())
            ]
        );
        // Each stored value stays under the backend's limit.
        for (_, stored) in store.inner().scan(b"", None, 100).expect("scan") {
            assert!(stored.len() <= MAX_VALUE_BYTES);
        }
    }

    #[test]
    fn overwriting_or_deleting_a_large_value_removes_its_chunks() {
        let store = store();
        put(&store, b"\x01a", big(3 * CHUNK_BYTES, 2));
        put(&store, b"\x01a", big(CHUNK_BYTES + 1, 3));
        assert_eq!(chunk_keys(&store), 2, "the third chunk went");
        assert_eq!(
            store.get(b"\x01a").expect("read"),
            Some(big(CHUNK_BYTES + 1, 3))
        );
        put(&store, b"\x01a", b"small".to_vec());
        assert_eq!(chunk_keys(&store), 0);
        put(&store, b"\x01a", big(2 * CHUNK_BYTES, 4));
        let mut batch = WriteBatch::new();
        batch.delete(b"\x01a".to_vec());
        store.commit_blocking(batch).expect("deleted");
        assert_eq!(chunk_keys(&store), 0);
        assert_eq!(store.get(b"\x01a").expect("read"), None);
    }

    #[test]
    fn a_reopened_store_still_knows_its_chunked_keys() {
        let store = store();
        put(&store, b"\x01a", big(2 * CHUNK_BYTES, 5));
        let reopened = ChunkedValues::new(store.inner).expect("reopens");
        assert_eq!(
            reopened.get(b"\x01a").expect("read"),
            Some(big(2 * CHUNK_BYTES, 5))
        );
        put(&reopened, b"\x01a", b"small".to_vec());
        assert_eq!(chunk_keys(&reopened), 0);
    }

    #[test]
    fn a_value_over_the_chunked_limit_is_refused_and_nothing_is_written() {
        let store = store();
        let mut batch = WriteBatch::new();
        batch.put(b"\x01ok".to_vec(), b"fine".to_vec());
        batch.put(b"\x01huge".to_vec(), vec![0; MAX_CHUNKED_VALUE_BYTES + 1]);
        let error = store.commit_blocking(batch).expect_err("refused");
        assert!(matches!(error, StoreError::ValueTooLarge { .. }), "{error}");
        assert_eq!(store.get(b"\x01ok").expect("read"), None);
        assert_eq!(chunk_keys(&store), 0);
    }

    #[test]
    fn scans_never_return_chunk_keys() {
        let store = store();
        put(&store, b"\x01a", big(2 * CHUNK_BYTES, 6));
        put(&store, b"\x03z", b"after".to_vec());
        let everything = store.scan(b"", None, 10).expect("scan");
        let keys: Vec<&[u8]> = everything.iter().map(|(key, _)| key.as_slice()).collect();
        assert_eq!(keys, vec![b"\x01a".as_slice(), b"\x03z".as_slice()]);
        let limited = store.scan(b"", Some(b"\x01a"), 1).expect("scan");
        assert_eq!(limited.len(), 1, "the page is filled past the chunks");
        assert_eq!(limited[0].0, b"\x03z");
    }

    #[test]
    fn behaves_like_a_store_for_ordinary_values() {
        crate::store::conformance::scans_are_ordered_bounded_and_resumable(&store());
        crate::store::conformance::a_batch_applies_its_writes_in_order(&store());
    }

    #[test]
    fn chunk_keys_parse_back() {
        let key = chunk_key(b"\x01\x00a\xff", 7);
        assert_eq!(
            parse_chunk_key(&key),
            Some((b"\x01\x00a\xff".as_slice(), 7))
        );
        assert_eq!(parse_chunk_key(b"\x02\x00"), None);
    }
}
