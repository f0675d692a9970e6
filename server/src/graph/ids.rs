//! Integer names for item identities within one graph.
//!
//! A graph interns every identity it mentions (its items and the targets of
//! their dependencies) once, when the item is inserted. Its edges are then
//! lists of [`ItemId`]s, so following them (the planner's inner loop) is
//! array access instead of hashing and comparing `type/name` strings.
//! The identities it keeps share one allocation per type name, so cloning
//! or comparing them touches less memory.

use std::collections::hash_map::Entry;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::item::ItemRef;

/// An identity's integer name within one graph. Stable while the graph
/// mentions the identity; a released id may be given to another identity
/// later, so ids must not be kept across changes of the graph.
pub type ItemId = u32;

/// One interned identity with the data the graph keeps for it.
#[derive(Clone, Debug)]
struct Slot<T> {
    item: ItemRef,
    /// Mentions: one for the item itself, one per edge pointing at it.
    uses: u32,
    data: T,
}

/// Interned identities, reference counted by mentions, each with data `T`.
#[derive(Clone, Debug)]
pub(super) struct IdTable<T> {
    by_ref: FxHashMap<ItemRef, ItemId>,
    slots: Vec<Option<Slot<T>>>,
    free: Vec<ItemId>,
    /// The shared type names, with how many slots use each.
    types: FxHashMap<Arc<str>, u32>,
}

impl<T> Default for IdTable<T> {
    fn default() -> Self {
        Self {
            by_ref: FxHashMap::default(),
            slots: Vec::new(),
            free: Vec::new(),
            types: FxHashMap::default(),
        }
    }
}

impl<T: Default> IdTable<T> {
    /// The id of `item`, interning it if new, and counts one more mention.
    pub(super) fn acquire(&mut self, item: &ItemRef) -> ItemId {
        if let Some(&id) = self.by_ref.get(item) {
            if let Some(slot) = self.slot_mut(id) {
                slot.uses = slot.uses.saturating_add(1);
            }
            return id;
        }
        // One hash of the type name finds its shared copy and counts the use.
        let item = match self.types.entry(item.item_type().clone()) {
            Entry::Occupied(mut shared) => {
                *shared.get_mut() += 1;
                item.sharing_type(shared.key())
            }
            Entry::Vacant(unseen) => {
                unseen.insert(1);
                item.clone()
            }
        };
        let slot = Slot {
            item: item.clone(),
            uses: 1,
            data: T::default(),
        };
        let id = match self.free.pop() {
            Some(id) => {
                if let Some(entry) = self.slots.get_mut(id as usize) {
                    *entry = Some(slot);
                }
                id
            }
            None => {
                self.slots.push(Some(slot));
                ItemId::try_from(self.slots.len() - 1).unwrap_or(ItemId::MAX)
            }
        };
        self.by_ref.insert(item, id);
        id
    }

    /// Counts one mention less of `id`; forgets the identity (and its data)
    /// when nothing mentions it any more.
    pub(super) fn release(&mut self, id: ItemId) {
        let Some(slot) = self.slot_mut(id) else {
            return;
        };
        slot.uses = slot.uses.saturating_sub(1);
        if slot.uses > 0 {
            return;
        }
        if let Some(slot) = self.slots.get_mut(id as usize).and_then(Option::take) {
            self.by_ref.remove(&slot.item);
            if let Some(users) = self.types.get_mut(slot.item.item_type()) {
                *users -= 1;
                if *users == 0 {
                    self.types.remove(slot.item.item_type());
                }
            }
            self.free.push(id);
        }
    }
}

impl<T> IdTable<T> {
    /// The id of `item`, if the graph mentions it.
    pub(super) fn get(&self, item: &ItemRef) -> Option<ItemId> {
        self.by_ref.get(item).copied()
    }

    /// The identity named `id`.
    pub(super) fn item(&self, id: ItemId) -> Option<&ItemRef> {
        self.slot(id).map(|slot| &slot.item)
    }

    /// The identity named `id` with the data kept for it.
    pub(super) fn entry(&self, id: ItemId) -> Option<(&ItemRef, &T)> {
        self.slot(id).map(|slot| (&slot.item, &slot.data))
    }

    /// The data kept for `id`.
    pub(super) fn data(&self, id: ItemId) -> Option<&T> {
        self.slot(id).map(|slot| &slot.data)
    }

    /// The data kept for `id`, to change it.
    pub(super) fn data_mut(&mut self, id: ItemId) -> Option<&mut T> {
        self.slot_mut(id).map(|slot| &mut slot.data)
    }

    /// One more than the largest id in use (ids are dense below it).
    pub(super) fn bound(&self) -> usize {
        self.slots.len()
    }

    /// Every id in use with its data, in id order.
    pub(super) fn iter_data(&self) -> impl Iterator<Item = (ItemId, &T)> {
        (0..)
            .zip(&self.slots)
            .filter_map(|(id, slot)| Some((id, &slot.as_ref()?.data)))
    }

    fn slot(&self, id: ItemId) -> Option<&Slot<T>> {
        self.slots.get(id as usize).and_then(Option::as_ref)
    }

    fn slot_mut(&mut self, id: ItemId) -> Option<&mut Slot<T>> {
        self.slots.get_mut(id as usize).and_then(Option::as_mut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_forgotten_when_their_last_mention_goes_and_ids_reused() {
        let mut table: IdTable<u8> = IdTable::default();
        let a = ItemRef::new("t", "a");
        let b = ItemRef::new("t", "b");
        let id_a = table.acquire(&a);
        assert_eq!(table.acquire(&a), id_a);
        table.release(id_a);
        assert_eq!(table.get(&a), Some(id_a));
        table.release(id_a);
        assert_eq!(table.get(&a), None);
        assert_eq!(table.item(id_a), None);
        let id_b = table.acquire(&b);
        assert_eq!(id_b, id_a, "a released id is reused");
        assert_eq!(table.item(id_b), Some(&b));
        assert_eq!(table.bound(), 1);
        table.release(id_b);
        assert!(
            table.types.is_empty(),
            "type names go with their last identity"
        );
    }

    #[test]
    fn identities_of_one_type_share_the_type_name() {
        let mut table: IdTable<u8> = IdTable::default();
        let a = table.acquire(&ItemRef::new("t", "a"));
        let b = table.acquire(&ItemRef::new("t", "b"));
        let (Some(a), Some(b)) = (table.item(a), table.item(b)) else {
            panic!("both identities are kept");
        };
        assert!(Arc::ptr_eq(a.item_type(), b.item_type()));
    }
}
