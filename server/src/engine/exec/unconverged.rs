//! The items a pass must look at again, ordered and hashed.
//!
//! Passes take the set in identity order (their seeds), and the planner
//! asks of nearly every item it reaches whether the set holds it: a changed
//! item brings a score of neighbours along on a deep graph, and walking an
//! ordered set compares a dozen identities per question. So the set keeps
//! a hash index beside its order; it is small while the tenant is
//! converged, and the index costs one more pointer per item while it is not.

use std::collections::BTreeSet;

use rustc_hash::FxHashSet;

use crate::graph::ItemRef;

/// Items a pass must look at again: in identity order, with O(1) look-up.
#[derive(Clone, Debug, Default)]
pub struct UnconvergedSet {
    ordered: BTreeSet<ItemRef>,
    index: FxHashSet<ItemRef>,
}

impl UnconvergedSet {
    /// Whether `item` is in the set (one hash look-up).
    pub fn contains(&self, item: &ItemRef) -> bool {
        self.index.contains(item)
    }

    /// Adds `item`; whether it was not there.
    pub fn insert(&mut self, item: ItemRef) -> bool {
        if !self.index.insert(item.clone()) {
            return false;
        }
        self.ordered.insert(item)
    }

    /// Removes `item`; whether it was there.
    pub fn remove(&mut self, item: &ItemRef) -> bool {
        self.index.remove(item) && self.ordered.remove(item)
    }

    /// The items, in identity order.
    pub fn iter(&self) -> impl Iterator<Item = &ItemRef> {
        self.ordered.iter()
    }

    /// The items as an ordered set, for a pass's seeds.
    pub fn to_ordered(&self) -> BTreeSet<ItemRef> {
        self.ordered.clone()
    }
}

impl Extend<ItemRef> for UnconvergedSet {
    fn extend<I: IntoIterator<Item = ItemRef>>(&mut self, items: I) {
        for item in items {
            self.insert(item);
        }
    }
}

impl FromIterator<ItemRef> for UnconvergedSet {
    fn from_iter<I: IntoIterator<Item = ItemRef>>(items: I) -> Self {
        let ordered: BTreeSet<ItemRef> = items.into_iter().collect();
        let index = ordered.iter().cloned().collect();
        Self { ordered, index }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_and_the_order_hold_the_same_items() {
        let item = |name: &str| ItemRef::new("t", name);
        let mut set: UnconvergedSet = ["c", "a"].into_iter().map(item).collect();
        assert!(set.insert(item("b")));
        assert!(!set.insert(item("a")), "already there");
        assert!(set.remove(&item("c")));
        assert!(!set.remove(&item("c")), "gone already");
        set.extend([item("d"), item("b")]);
        let names: Vec<String> = set.iter().map(|i| i.name().to_string()).collect();
        assert_eq!(names, ["a", "b", "d"]);
        assert!(set.contains(&item("d")) && !set.contains(&item("c")));
        assert_eq!(set.to_ordered().len(), 3);
    }
}
