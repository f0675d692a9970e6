//! Where the store's records live in etcd's key space.
//!
//! Under the configured prefix `P` (default `/reconciled/`):
//!
//! | key | holds |
//! |---|---|
//! | `P store/data/<key>` | the value of store key `<key>` (binary, as given) |
//! | `P store/staging/<id>` | a staged commit in progress (attached to its writer's lease) |
//! | `P store/staged/<id>/<n>` | chunk `n` (u32 BE) of staged commit `<id>`: encoded writes |
//! | `P store/commits/<id>` | the marker that made staged commit `<id>` real: its chunk count |
//! | `P store/attempts/<id>` | a commit transaction that was sent more than once: every later attempt creates it, and its first attempt can no longer land (empty) |
//! | `P <anything else>` | the cluster's keys (membership, ownership, locks), never under `store/` |
//!
//! Store keys map to data keys by plain concatenation, so etcd's byte order
//! is the store's key order and a store prefix scan is one etcd range.

/// The part of the key space the store's own records use.
const STORE: &[u8] = b"store/";

/// The keys of one store, under its prefix.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    prefix: Vec<u8>,
}

impl Layout {
    /// The layout under `prefix` (e.g. `/reconciled/`).
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.as_bytes().to_vec(),
        }
    }

    fn join(&self, parts: &[&[u8]]) -> Vec<u8> {
        let mut key = self.prefix.clone();
        for part in parts {
            key.extend_from_slice(part);
        }
        key
    }

    /// The etcd key holding store key `key`.
    pub(crate) fn data(&self, key: &[u8]) -> Vec<u8> {
        self.join(&[STORE, b"data/", key])
    }

    /// The store key an etcd data key holds (None: not a data key).
    pub(crate) fn store_key<'a>(&self, etcd_key: &'a [u8]) -> Option<&'a [u8]> {
        etcd_key
            .strip_prefix(self.prefix.as_slice())?
            .strip_prefix(STORE)?
            .strip_prefix(b"data/".as_slice())
    }

    /// The header of staged commit `id` while it is being staged.
    pub(crate) fn staging(&self, id: &str) -> Vec<u8> {
        self.join(&[STORE, b"staging/", id.as_bytes()])
    }

    /// Chunk `index` of staged commit `id`.
    pub(crate) fn chunk(&self, id: &str, index: u32) -> Vec<u8> {
        self.join(&[STORE, b"staged/", id.as_bytes(), b"/", &index.to_be_bytes()])
    }

    /// The prefix of every chunk of staged commit `id`.
    pub(crate) fn chunks_of(&self, id: &str) -> Vec<u8> {
        self.join(&[STORE, b"staged/", id.as_bytes(), b"/"])
    }

    /// The prefix of every staged chunk.
    pub(crate) fn staged_prefix(&self) -> Vec<u8> {
        self.join(&[STORE, b"staged/"])
    }

    /// The staged commit id a chunk key belongs to.
    pub(crate) fn chunk_owner<'a>(&self, chunk: &'a [u8]) -> Option<&'a str> {
        let rest = chunk.strip_prefix(self.staged_prefix().as_slice())?;
        let end = rest.iter().position(|byte| *byte == b'/')?;
        std::str::from_utf8(&rest[..end]).ok()
    }

    /// The marker of staged commit `id`.
    pub(crate) fn marker(&self, id: &str) -> Vec<u8> {
        self.join(&[STORE, b"commits/", id.as_bytes()])
    }

    /// The prefix of every marker.
    pub(crate) fn marker_prefix(&self) -> Vec<u8> {
        self.join(&[STORE, b"commits/"])
    }

    /// The staged commit id of a marker key.
    pub(crate) fn marker_id<'a>(&self, marker: &'a [u8]) -> Option<&'a str> {
        let rest = marker.strip_prefix(self.marker_prefix().as_slice())?;
        std::str::from_utf8(rest).ok()
    }

    /// The key the retries of commit transaction `id` create (see
    /// [`writer`](super::writer)).
    pub(crate) fn attempt(&self, id: &str) -> Vec<u8> {
        self.join(&[STORE, b"attempts/", id.as_bytes()])
    }

    /// The etcd key of a cluster key `key` (relative to the prefix), or
    /// None if `key` reaches into the store's own records.
    pub(crate) fn cluster(&self, key: &[u8]) -> Option<Vec<u8>> {
        (!key.starts_with(STORE)).then(|| self.join(&[key]))
    }

    /// The cluster key (relative to the prefix) of an etcd key.
    pub(crate) fn relative<'a>(&self, etcd_key: &'a [u8]) -> &'a [u8] {
        etcd_key
            .strip_prefix(self.prefix.as_slice())
            .unwrap_or(etcd_key)
    }
}

/// The end of the etcd range holding every key that starts with `prefix`
/// (etcd's `range_end`): the prefix with its last byte below 0xff
/// incremented, or `\0` (to the end of the key space) if there is none.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_keys_keep_the_store_key_order_and_map_back() {
        let layout = Layout::new("/r/");
        let (a, b) = (layout.data(b"\x01a"), layout.data(b"\x01a\x00"));
        assert!(a < b);
        assert_eq!(layout.store_key(&b), Some(b"\x01a\x00".as_slice()));
        assert_eq!(layout.store_key(&layout.marker("x")), None);
    }

    #[test]
    fn prefix_end_covers_every_key_with_the_prefix() {
        assert_eq!(prefix_end(b"ab"), b"ac");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn chunk_and_marker_keys_name_their_commit() {
        let layout = Layout::new("/r/");
        assert_eq!(layout.chunk_owner(&layout.chunk("abc", 7)), Some("abc"));
        assert_eq!(layout.marker_id(&layout.marker("abc")), Some("abc"));
        assert!(layout.chunk("abc", 1).starts_with(&layout.chunks_of("abc")));
    }

    #[test]
    fn cluster_keys_cannot_reach_the_store_records() {
        let layout = Layout::new("/r/");
        assert_eq!(layout.cluster(b"owners/t"), Some(b"/r/owners/t".to_vec()));
        assert_eq!(layout.cluster(b"store/data/x"), None);
        assert_eq!(layout.relative(b"/r/owners/t"), b"owners/t");
    }
}
