//! Batches of writes that commit atomically.

use crate::store::StoreError;

/// The largest value a store accepts, in bytes (64 KiB).
///
/// Keeping values small keeps every record inside sled's log segments (never
/// in its unsynced blob files) and bounds the cost of a rewrite.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// One write of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Sets `key` to `value`.
    Put {
        /// The key to set.
        key: Vec<u8>,
        /// Its new value, at most [`MAX_VALUE_BYTES`].
        value: Vec<u8>,
    },
    /// Removes `key` (a no-op if it is absent).
    Delete {
        /// The key to remove.
        key: Vec<u8>,
    },
}

/// A condition a [`WriteBatch`] commits under: `key` still has the
/// modification revision `mod_revision` when the batch is applied.
///
/// The etcd backend checks it inside the transaction that makes the batch
/// real (DESIGN section 11, fencing): a replica that lost the key (its
/// lease expired while it was paused, another replica claimed it) gets
/// [`StoreError::Fenced`] and nothing of the batch is written. `key` is
/// relative to the backend's prefix, like the keys of
/// [`EtcdStore`](crate::store::EtcdStore)'s cluster primitives.
///
/// The sled and in-memory backends ignore fences: one process owns their
/// files (sled's lock), so there is nobody to be fenced from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The key whose revision guards the batch (e.g. a tenant's owner key).
    pub key: Vec<u8>,
    /// Its modification revision when the writer claimed it.
    pub mod_revision: i64,
}

/// Writes applied atomically together, in order (a later write to the same
/// key wins), optionally under a [`Fence`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    writes: Vec<Write>,
    bytes: usize,
    fence: Option<Fence>,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch that commits only while `fence` holds (see [`Fence`]).
    pub fn fenced(fence: Fence) -> Self {
        Self {
            fence: Some(fence),
            ..Self::default()
        }
    }

    /// The fence the batch commits under, if any.
    pub fn fence(&self) -> Option<&Fence> {
        self.fence.as_ref()
    }

    /// Sets (or, with `None`, removes) the batch's fence.
    pub fn set_fence(&mut self, fence: Option<Fence>) -> &mut Self {
        self.fence = fence;
        self
    }

    /// Adds a put of `value` at `key`.
    pub fn put(&mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> &mut Self {
        let (key, value) = (key.into(), value.into());
        self.bytes += key.len() + value.len();
        self.writes.push(Write::Put { key, value });
        self
    }

    /// Adds a delete of `key`.
    pub fn delete(&mut self, key: impl Into<Vec<u8>>) -> &mut Self {
        let key = key.into();
        self.bytes += key.len();
        self.writes.push(Write::Delete { key });
        self
    }

    /// The number of writes.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// True if the batch holds no write.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// The total size of the keys and values, in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The writes, in order.
    pub fn writes(&self) -> &[Write] {
        &self.writes
    }

    /// Takes the writes out, in order (the fence, if any, is dropped).
    pub fn into_writes(self) -> Vec<Write> {
        self.writes
    }

    /// Checks the limits every backend enforces before anything is written.
    pub fn validate(&self) -> Result<(), StoreError> {
        self.validate_within(MAX_VALUE_BYTES)
    }

    /// Checks that no value is over `limit` bytes (a store's
    /// [`max_value_bytes`](crate::store::Store::max_value_bytes)).
    pub fn validate_within(&self, limit: usize) -> Result<(), StoreError> {
        for write in &self.writes {
            if let Write::Put { key, value } = write
                && value.len() > limit
            {
                return Err(StoreError::ValueTooLarge {
                    key: printable_key(key),
                    size: value.len(),
                    limit,
                });
            }
        }
        Ok(())
    }
}

/// Renders a binary key for an error message, shortened to 64 bytes.
pub(crate) fn printable_key(key: &[u8]) -> String {
    const SHOWN: usize = 64;
    let shown = &key[..key.len().min(SHOWN)];
    let ellipsis = if key.len() > SHOWN { "..." } else { "" };
    format!("\"{}{ellipsis}\"", shown.escape_ascii())
}
