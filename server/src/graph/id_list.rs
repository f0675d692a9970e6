//! A list of item ids that keeps short lists inline.
//!
//! The intended graph keeps each item's dependency targets next to the
//! item's other data. Most items have a few dependencies; keeping those
//! inline spares planning a read of a separate allocation (a cache miss
//! per item when the graph is large).

use super::ids::ItemId;

/// How many ids fit inline.
const INLINE: usize = 5;

/// A list of ids: inline up to [`INLINE`], on the heap beyond.
#[derive(Clone, Debug)]
pub(super) enum IdList {
    /// A short list: the first `len` entries of `ids`.
    Inline { len: u8, ids: [ItemId; INLINE] },
    /// A longer list.
    Heap(Box<[ItemId]>),
}

impl Default for IdList {
    fn default() -> Self {
        Self::Inline {
            len: 0,
            ids: [0; INLINE],
        }
    }
}

impl IdList {
    /// The ids, in order.
    pub(super) fn as_slice(&self) -> &[ItemId] {
        match self {
            Self::Inline { len, ids } => ids.get(..usize::from(*len)).unwrap_or_default(),
            Self::Heap(ids) => ids,
        }
    }
}

impl FromIterator<ItemId> for IdList {
    fn from_iter<I: IntoIterator<Item = ItemId>>(iter: I) -> Self {
        let all: Vec<ItemId> = iter.into_iter().collect();
        if all.len() > INLINE {
            return Self::Heap(all.into_boxed_slice());
        }
        let mut ids = [0; INLINE];
        ids.iter_mut().zip(&all).for_each(|(slot, &id)| *slot = id);
        Self::Inline {
            len: u8::try_from(all.len()).unwrap_or(0),
            ids,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_lists_keep_their_ids_in_order() {
        for len in [0, 1, INLINE, INLINE + 1, 3 * INLINE] {
            let ids: Vec<ItemId> = (0..len).map(|i| 10 + i as ItemId).collect();
            let list: IdList = ids.iter().copied().collect();
            assert_eq!(list.as_slice(), ids.as_slice());
            assert_eq!(matches!(list, IdList::Inline { .. }), len <= INLINE);
        }
    }
}
