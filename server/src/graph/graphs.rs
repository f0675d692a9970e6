//! The two graphs of a tenant and their dependency indexes.
//!
//! Items live in persistent ordered maps (`imbl::OrdMap`): cloning one is
//! O(1), which is how readers get an immutable snapshot of a tenant while
//! its owner keeps changing it. The indexes of dependents are only needed by
//! the owner and the planner, so they are plain tables: each graph names
//! every identity it mentions with an integer ([`ItemId`]) and keeps its
//! edges in that form (a few bytes per edge instead of a copy of the
//! dependent's identity, and no text compared to follow one).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use imbl::OrdMap;

use super::id_list::IdList;
use super::ids::{IdTable, ItemId};
use super::item::{Dependency, Item, ItemRef};
use super::predicate::{Predicate, PredicateError};
use super::state::CurrentItem;

/// An item of the intended graph with the generation that last changed it
/// and its compiled predicates (one per dependency, in order).
#[derive(Clone, Debug)]
pub struct IntendedItem {
    /// The intended value.
    pub item: Arc<Item>,
    /// The tenant generation that last changed the item's content.
    pub generation: u64,
    /// Compiled `must_satisfy` expressions, index-aligned with
    /// `item.dependencies`.
    pub predicates: Predicates,
}

/// The compiled `must_satisfy` predicates of an item's dependencies,
/// index-aligned with them. Nearly no dependency has one, so an item with
/// none keeps no list (a list costs 24 B per dependency).
#[derive(Clone, Debug, Default)]
pub struct Predicates(Option<Arc<[Option<Predicate>]>>);

impl Predicates {
    /// The predicate of the dependency at `index`, if it has one.
    pub fn get(&self, index: usize) -> Option<&Predicate> {
        self.0.as_ref()?.get(index)?.as_ref()
    }

    /// Whether some dependency has a predicate.
    pub fn any(&self) -> bool {
        self.0.is_some()
    }
}

impl From<Vec<Option<Predicate>>> for Predicates {
    fn from(predicates: Vec<Option<Predicate>>) -> Self {
        if predicates.iter().all(Option::is_none) {
            Self(None)
        } else {
            Self(Some(predicates.into()))
        }
    }
}

impl IntendedItem {
    /// Compiles the item's predicates. Validation has already parsed them
    /// for submitted intents; this path serves tests and store loading.
    pub fn compile(item: Item, generation: u64) -> Result<Self, PredicateError> {
        let predicates = item
            .dependencies
            .iter()
            .map(|dependency| {
                if dependency.must_satisfy().is_empty() {
                    Ok(None)
                } else {
                    Predicate::compile(dependency.must_satisfy()).map(Some)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            item: Arc::new(item),
            generation,
            predicates: predicates.into(),
        })
    }

    /// The compiled predicate of the dependency on `target`, if it has one.
    pub fn predicate_on(&self, target: &ItemRef) -> Option<&Predicate> {
        self.item
            .dependencies
            .iter()
            .position(|dependency| &dependency.requires == target)
            .and_then(|index| self.predicates.get(index))
    }
}

/// The facts about an intended item that planning reads for every edge,
/// kept next to the edges so reading them does not follow pointers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ItemSummary {
    /// The item is external (never operated on).
    pub external: bool,
    /// The tenant generation that last changed the item.
    pub generation: u64,
    /// Some dependency has a `must_satisfy` predicate.
    pub has_predicates: bool,
    /// Every dependency asks only that its target exists
    /// ([`Dependency::asks_only_existence`]): planning reads this instead
    /// of each dependency's flags.
    pub plain_dependencies: bool,
}

impl ItemSummary {
    fn of(entry: &IntendedItem) -> Self {
        Self {
            external: entry.item.external,
            generation: entry.generation,
            has_predicates: entry.predicates.any(),
            plain_dependencies: entry
                .item
                .dependencies
                .iter()
                .all(Dependency::asks_only_existence),
        }
    }
}

/// Where the current graph last found an identity: its id there, a guess
/// that spares the planner a look-up by name and is checked before use
/// (ids of the current graph are given to other identities once released).
/// Written while planning reads the graphs, hence atomic.
#[derive(Debug)]
pub struct CurrentSlotHint(AtomicU32);

impl CurrentSlotHint {
    const NONE: u32 = u32::MAX;

    /// The id guessed, if any.
    fn guess(&self) -> Option<ItemId> {
        Some(self.0.load(Ordering::Relaxed)).filter(|&id| id != Self::NONE)
    }

    /// Remembers `id` as the guess.
    fn remember(&self, id: ItemId) {
        self.0.store(id, Ordering::Relaxed);
    }
}

impl Default for CurrentSlotHint {
    fn default() -> Self {
        Self(AtomicU32::new(Self::NONE))
    }
}

impl Clone for CurrentSlotHint {
    fn clone(&self) -> Self {
        Self(AtomicU32::new(self.0.load(Ordering::Relaxed)))
    }
}

/// What the intended graph keeps per interned identity.
#[derive(Clone, Debug, Default)]
struct Edges {
    /// The intended item with this identity, if there is one.
    entry: Option<Arc<IntendedItem>>,
    /// Its summary's generation and flags (meaningful while `entry` is
    /// set), kept as fields of their own so that `current_slot` fits in
    /// their padding: a slot stays 88 bytes.
    generation: u64,
    external: bool,
    has_predicates: bool,
    plain_dependencies: bool,
    /// Where the current graph last found this identity.
    current_slot: CurrentSlotHint,
    /// Its dependencies' targets, in declaration order.
    required: IdList,
    /// The intended items that require this identity.
    dependents: BTreeSet<ItemId>,
}

impl Edges {
    fn summary(&self) -> ItemSummary {
        ItemSummary {
            external: self.external,
            generation: self.generation,
            has_predicates: self.has_predicates,
            plain_dependencies: self.plain_dependencies,
        }
    }

    fn set_summary(&mut self, summary: ItemSummary) {
        self.external = summary.external;
        self.generation = summary.generation;
        self.has_predicates = summary.has_predicates;
        self.plain_dependencies = summary.plain_dependencies;
    }
}

/// The intended graph: what users asked for.
#[derive(Clone, Debug, Default)]
pub struct IntendedGraph {
    items: OrdMap<ItemRef, Arc<IntendedItem>>,
    ids: IdTable<Edges>,
    subgraphs: BTreeMap<Box<str>, BTreeSet<ItemRef>>,
}

impl IntendedGraph {
    /// The intended item with identity `item`: a hash look-up in the id
    /// table, which keeps every entry beside its edges, rather than a walk
    /// down the ordered map comparing names.
    pub fn get(&self, item: &ItemRef) -> Option<&Arc<IntendedItem>> {
        let id = self.ids.get(item)?;
        self.ids.data(id)?.entry.as_ref()
    }

    /// Puts `entry` in the graph, replacing (and returning) any previous one.
    ///
    /// The item's key and, when the graph holds the only reference to its
    /// value, its dependencies' targets are made to share the text of the
    /// identities the graph interned ([`Self::shared_identity`]): on a deep
    /// graph every identity is named by up to a dozen dependencies, and
    /// each would otherwise keep two allocations of its own.
    pub fn insert(&mut self, entry: IntendedItem) -> Option<Arc<IntendedItem>> {
        let mut entry = match self.replace_in_place(entry) {
            Ok(previous) => return Some(previous),
            Err(entry) => entry,
        };
        let key = entry.item.item_ref();
        let previous = self.remove(&key);
        let id = self.ids.acquire(&key);
        let key = self.ids.item(id).cloned().unwrap_or(key);
        let required: IdList = entry
            .item
            .required_items()
            .map(|target| self.ids.acquire(target))
            .collect();
        self.share_interned(&mut entry, &key, required.as_slice());
        for &target in required.as_slice() {
            if let Some(edges) = self.ids.data_mut(target) {
                edges.dependents.insert(id);
            }
        }
        self.subgraphs
            .entry(entry.item.subgraph.clone())
            .or_default()
            .insert(key.clone());
        let summary = ItemSummary::of(&entry);
        let entry = Arc::new(entry);
        if let Some(edges) = self.ids.data_mut(id) {
            edges.entry = Some(entry.clone());
            edges.set_summary(summary);
            edges.required = required;
        }
        self.items.insert(key, entry);
        previous
    }

    /// Replaces the item `entry` names when it is there already, in the
    /// same subgraph and with dependencies on the same items in the same
    /// order (a changed value, the usual change): its id, its edges and
    /// its subgraph listing stay as they are, and only the entry is
    /// swapped. Returns the previous entry, or `entry` back when the
    /// change is not of that kind.
    fn replace_in_place(
        &mut self,
        mut entry: IntendedItem,
    ) -> Result<Arc<IntendedItem>, IntendedItem> {
        let Some(id) = self.ids.get(&entry.item.identity) else {
            return Err(entry);
        };
        let previous = match self.ids.data(id).and_then(|edges| edges.entry.as_ref()) {
            Some(previous)
                if previous.item.subgraph == entry.item.subgraph
                    && previous
                        .item
                        .required_items()
                        .eq(entry.item.required_items()) =>
            {
                previous.clone()
            }
            _ => return Err(entry),
        };
        let key = previous.item.identity.clone();
        if let Some(edges) = self.ids.data(id) {
            self.share_interned(&mut entry, &key, edges.required.as_slice());
        }
        let summary = ItemSummary::of(&entry);
        let entry = Arc::new(entry);
        if let Some(edges) = self.ids.data_mut(id) {
            edges.set_summary(summary);
            edges.entry = Some(entry.clone());
        }
        self.items.insert(key, entry);
        Ok(previous)
    }

    /// Makes `entry`'s item, when the graph holds the only reference to
    /// it, name itself by `key` and its dependencies by the interned
    /// identities of `required` (their ids, in declaration order).
    fn share_interned(&self, entry: &mut IntendedItem, key: &ItemRef, required: &[ItemId]) {
        let Some(item) = Arc::get_mut(&mut entry.item) else {
            return;
        };
        item.identity = key.clone();
        for (dependency, &target) in item.dependencies.iter_mut().zip(required) {
            if let Some(shared) = self.ids.item(target) {
                dependency.requires = shared.clone();
            }
        }
    }

    /// Removes and returns the item with identity `item`.
    pub fn remove(&mut self, item: &ItemRef) -> Option<Arc<IntendedItem>> {
        let previous = self.items.remove(item)?;
        if let Some(id) = self.ids.get(item) {
            let required = self
                .ids
                .data_mut(id)
                .map(|edges| {
                    edges.entry = None;
                    std::mem::take(&mut edges.required)
                })
                .unwrap_or_default();
            for &target in required.as_slice() {
                if let Some(edges) = self.ids.data_mut(target) {
                    edges.dependents.remove(&id);
                }
                self.ids.release(target);
            }
            self.ids.release(id);
        }
        if let Some(listed) = self.subgraphs.get_mut(&*previous.item.subgraph) {
            listed.remove(item);
            if listed.is_empty() {
                self.subgraphs.remove(&*previous.item.subgraph);
            }
        }
        Some(previous)
    }

    /// Items listed in subgraph `path` or any subgraph under it (`""` is
    /// the root and covers everything), in identity order per subgraph.
    pub fn items_under(&self, path: &str) -> impl Iterator<Item = &ItemRef> {
        self.subgraphs
            .range::<str, _>((std::ops::Bound::Included(path), std::ops::Bound::Unbounded))
            .take_while(move |(listed, _)| listed.starts_with(path))
            .filter(move |(listed, _)| subgraph_contains(path, listed))
            .flat_map(|(_, items)| items.iter())
    }

    /// Items whose intended value requires `item` (in no particular order).
    pub fn dependents_of(&self, item: &ItemRef) -> impl Iterator<Item = &ItemRef> {
        self.ids
            .get(item)
            .into_iter()
            .flat_map(|id| self.dependent_ids(id))
            .filter_map(|id| self.ids.item(id))
    }

    /// The graph's own copy of identity `item`, if the graph mentions it
    /// (as an item or as a dependency target): a clone of it shares its
    /// text instead of allocating it again.
    pub fn shared_identity(&self, item: &ItemRef) -> Option<&ItemRef> {
        self.ids.get(item).and_then(|id| self.ids.item(id))
    }

    /// The id of identity `item`, if the graph mentions it (as an item or
    /// as a dependency target).
    pub fn id_of(&self, item: &ItemRef) -> Option<ItemId> {
        self.ids.get(item)
    }

    /// The ids of `items` (as [`Self::id_of`] gives them), for items that
    /// come in identity order and cover a good part of the graph.
    ///
    /// One ordered walk of the graph replaces a hash look-up per item: the
    /// look-ups read each identity's text and a random hash bucket, cache
    /// misses that dominate when planning a large graph. The walk compares
    /// identities (by pointer when they share their text, as identities
    /// taken from the graphs do) and joins the matches with their ids by
    /// sorting both sides on the address of the intended entry. Costs
    /// O(size of the graph), so small sets of items are looked up one by one.
    pub fn ids_of_sorted<'i>(
        &self,
        items: impl ExactSizeIterator<Item = &'i ItemRef>,
    ) -> Vec<Option<ItemId>> {
        let mut found: Vec<Option<ItemId>> = Vec::with_capacity(items.len());
        // (address of the intended entry, index in `items`)
        let mut matched: Vec<(usize, u32)> = Vec::with_capacity(items.len());
        let mut unmatched: Vec<(usize, &ItemRef)> = Vec::new();
        let mut graph = self.items.iter().peekable();
        for (index, item) in items.enumerate() {
            found.push(None);
            while graph.next_if(|(key, _)| *key < item).is_some() {}
            match graph.next_if(|(key, _)| *key == item) {
                Some((_, entry)) => {
                    let index = u32::try_from(index).unwrap_or(u32::MAX);
                    matched.push((entry_address(entry), index));
                }
                None => unmatched.push((index, item)),
            }
        }
        let mut by_address: Vec<(usize, ItemId)> = self
            .ids
            .iter_data()
            .filter_map(|(id, edges)| Some((entry_address(edges.entry.as_ref()?), id)))
            .collect();
        by_address.sort_unstable();
        matched.sort_unstable();
        let mut ids = by_address.iter().peekable();
        for (address, index) in matched {
            while ids.next_if(|(known, _)| *known < address).is_some() {}
            if let Some(&&(known, id)) = ids.peek()
                && known == address
                && let Some(slot) = found.get_mut(index as usize)
            {
                *slot = Some(id);
            }
        }
        // Not intended (a dependency target, or unknown): by hash.
        for (index, item) in unmatched {
            if let Some(slot) = found.get_mut(index) {
                *slot = self.ids.get(item);
            }
        }
        found
    }

    /// The identity named `id`.
    pub fn identity(&self, id: ItemId) -> Option<&ItemRef> {
        self.ids.item(id)
    }

    /// The intended item named `id`, if it is intended (and not only
    /// required by something).
    pub fn get_by_id(&self, id: ItemId) -> Option<&Arc<IntendedItem>> {
        self.ids.data(id).and_then(|edges| edges.entry.as_ref())
    }

    /// The intended item named `id` with its summary, if it is intended.
    pub fn entry_by_id(&self, id: ItemId) -> Option<(&Arc<IntendedItem>, ItemSummary)> {
        self.ids
            .data(id)
            .and_then(|edges| Some((edges.entry.as_ref()?, edges.summary())))
    }

    /// Where the current graph last found the identity named `id` (see
    /// [`CurrentGraph::get_hinted`]).
    pub fn current_slot_hint(&self, id: ItemId) -> Option<&CurrentSlotHint> {
        self.ids.data(id).map(|edges| &edges.current_slot)
    }

    /// The targets of the dependencies of the item named `id`, in
    /// declaration order (index-aligned with its `dependencies`).
    pub fn required_ids(&self, id: ItemId) -> &[ItemId] {
        self.ids
            .data(id)
            .map_or(&[], |edges| edges.required.as_slice())
    }

    /// The ids of the items whose intended value requires `id`.
    pub fn dependent_ids(&self, id: ItemId) -> impl Iterator<Item = ItemId> + '_ {
        self.ids
            .data(id)
            .into_iter()
            .flat_map(|edges| edges.dependents.iter().copied())
    }

    /// One more than the largest id in use: arrays indexed by id need this
    /// many entries.
    pub fn id_bound(&self) -> usize {
        self.ids.bound()
    }

    /// An O(1) immutable copy of the items, for readers.
    pub fn snapshot(&self) -> OrdMap<ItemRef, Arc<IntendedItem>> {
        self.items.clone()
    }

    /// The items in identity order.
    pub fn iter(&self) -> impl Iterator<Item = (&ItemRef, &Arc<IntendedItem>)> {
        self.items.iter()
    }

    /// Number of intended items.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing is intended.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// The address of an intended entry: the key that joins the ordered map
/// of items with the id table, which hold the same `Arc`.
fn entry_address(entry: &Arc<IntendedItem>) -> usize {
    Arc::as_ptr(entry).addr()
}

/// The current graph: what exists (or may exist) on the configurators' side.
#[derive(Clone, Debug, Default)]
pub struct CurrentGraph {
    items: OrdMap<ItemRef, Arc<CurrentItem>>,
    /// Every identity an edge mentions (items with edges and their edges'
    /// targets), each with the ids of the items whose edges point at it.
    /// Kept for targets that are not current too, so a dependent waiting
    /// for a missing item is found when it appears.
    ids: IdTable<Mentioned>,
    /// A reused buffer for the ids of the edges being recorded, so
    /// recording them allocates nothing.
    scratch: Vec<ItemId>,
}

/// What the current graph keeps for an identity an edge mentions.
#[derive(Clone, Debug, Default)]
struct Mentioned {
    /// The items whose edges point at it.
    dependents: BTreeSet<ItemId>,
    /// Its current item, if it is current: the planner looks up the items
    /// around the ones it examines, and a hash look-up here reads less
    /// memory than a walk down the ordered map, comparing names.
    item: Option<Arc<CurrentItem>>,
}

impl CurrentGraph {
    /// The graph's own copy of identity `item`, if the item is current.
    pub fn identity(&self, item: &ItemRef) -> Option<&ItemRef> {
        self.items.get_key_value(item).map(|(key, _)| key)
    }

    /// The current item with identity `item`.
    pub fn get(&self, item: &ItemRef) -> Option<&Arc<CurrentItem>> {
        match self.ids.get(item) {
            Some(id) => self
                .ids
                .data(id)
                .and_then(|mentioned| mentioned.item.as_ref()),
            None => self.items.get(item),
        }
    }

    /// [`Self::get`], trying `hint` first: the id under which this graph
    /// last found `item`, which the caller keeps beside it (the intended
    /// graph does, per identity). A guess that names another identity now
    /// is replaced by the id found by name.
    pub fn get_hinted(&self, item: &ItemRef, hint: &CurrentSlotHint) -> Option<&Arc<CurrentItem>> {
        if let Some((known, mentioned)) = hint.guess().and_then(|id| self.ids.entry(id))
            && known == item
        {
            return mentioned.item.as_ref();
        }
        match self.ids.get(item) {
            Some(id) => {
                hint.remember(id);
                self.ids
                    .data(id)
                    .and_then(|mentioned| mentioned.item.as_ref())
            }
            None => self.items.get(item),
        }
    }

    /// Puts `entry` in the graph under `key`, replacing (and returning) any
    /// previous one. Edges follow the applied value's dependencies and those
    /// of an in-flight Create or Modify.
    pub fn insert(&mut self, key: ItemRef, entry: CurrentItem) -> Option<Arc<CurrentItem>> {
        let entry = Arc::new(entry);
        let previous = self.items.insert(key.clone(), entry.clone());
        match &previous {
            // Most updates change an item's state, not its edges (an
            // operation completing turns its target into the applied
            // value): the index stays as it is.
            Some(previous) if previous.edges().eq(entry.edges()) => {}
            Some(previous) => {
                self.unlink(&key, previous);
                self.link(&key, &entry);
            }
            None => self.link(&key, &entry),
        }
        self.index_item(&key, Some(entry));
        previous
    }

    /// Removes and returns the item with identity `item`.
    pub fn remove(&mut self, item: &ItemRef) -> Option<Arc<CurrentItem>> {
        let previous = self.items.remove(item)?;
        self.index_item(item, None);
        self.unlink(item, &previous);
        Some(previous)
    }

    /// Keeps `entry` as the current item of `key` in the id table, if an
    /// edge mentions `key` (see [`Mentioned::item`]).
    fn index_item(&mut self, key: &ItemRef, entry: Option<Arc<CurrentItem>>) {
        if let Some(mentioned) = self.ids.get(key).and_then(|id| self.ids.data_mut(id)) {
            mentioned.item = entry;
        }
    }

    /// Items whose applied value (or in-flight target) requires `item`, in
    /// no particular order.
    pub fn dependents_of(&self, item: &ItemRef) -> impl Iterator<Item = &ItemRef> {
        self.dependents_with_items_of(item)
            .map(|(dependent, _)| dependent)
    }

    /// [`Self::dependents_of`], each with its current item (`None` if it is
    /// not current), read from the slot that names it: the planner, which
    /// looks at every dependent of an item it examines, makes no look-up
    /// per dependent.
    pub fn dependents_with_items_of(
        &self,
        item: &ItemRef,
    ) -> impl Iterator<Item = (&ItemRef, Option<&Arc<CurrentItem>>)> {
        self.ids
            .get(item)
            .and_then(|id| self.ids.data(id))
            .into_iter()
            .flat_map(|mentioned| &mentioned.dependents)
            .filter_map(|&dependent| {
                let (item, mentioned) = self.ids.entry(dependent)?;
                Some((item, mentioned.item.as_ref()))
            })
    }

    /// Records the edges of `entry`, the item `key`. Only an item with
    /// edges is interned (most items of most tenants have none, and an
    /// interned identity costs about 150 B).
    fn link(&mut self, key: &ItemRef, entry: &CurrentItem) {
        let mut required = entry.edges().peekable();
        if required.peek().is_none() {
            return;
        }
        let dependent = self.ids.acquire(key);
        let mut targets = std::mem::take(&mut self.scratch);
        targets.clear();
        targets.extend(required.map(|target| self.ids.acquire(target)));
        targets.sort_unstable();
        let mut previous = None;
        for &target in &targets {
            if previous == Some(target) {
                // Named twice (the applied value and the in-flight target
                // share dependencies): one mention is enough.
                self.ids.release(target);
                continue;
            }
            previous = Some(target);
            // A target interned just now learns whether it is current.
            let unknown = self.ids.data(target).is_some_and(|m| m.item.is_none());
            let item = unknown
                .then(|| self.ids.item(target).and_then(|item| self.items.get(item)))
                .flatten()
                .cloned();
            if let Some(mentioned) = self.ids.data_mut(target) {
                mentioned.dependents.insert(dependent);
                if item.is_some() {
                    mentioned.item = item;
                }
            }
        }
        self.scratch = targets;
    }

    /// Forgets the edges [`Self::link`] recorded for `entry`, the item `key`.
    fn unlink(&mut self, key: &ItemRef, entry: &CurrentItem) {
        let mut required = entry.edges().peekable();
        if required.peek().is_none() {
            return;
        }
        let Some(dependent) = self.ids.get(key) else {
            return;
        };
        let mut targets: Vec<ItemId> = required.filter_map(|target| self.ids.get(target)).collect();
        targets.sort_unstable();
        targets.dedup();
        for target in targets {
            if let Some(mentioned) = self.ids.data_mut(target) {
                mentioned.dependents.remove(&dependent);
            }
            self.ids.release(target);
        }
        self.ids.release(dependent);
    }

    /// An O(1) immutable copy of the items, for readers.
    pub fn snapshot(&self) -> OrdMap<ItemRef, Arc<CurrentItem>> {
        self.items.clone()
    }

    /// The items in identity order.
    pub fn iter(&self) -> impl Iterator<Item = (&ItemRef, &Arc<CurrentItem>)> {
        self.items.iter()
    }

    /// Number of current items.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the graph is empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// Whether subgraph `path` (a `/`-separated path, `""` = root) contains the
/// subgraph `listed`: it is the same path or lies under it.
pub fn subgraph_contains(path: &str, listed: &str) -> bool {
    path.is_empty()
        || listed == path
        || (listed.starts_with(path) && listed.as_bytes().get(path.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Dependency, InFlight, OperationKind};

    #[test]
    fn subgraph_paths_contain_themselves_and_their_children_only() {
        assert!(subgraph_contains("", "a/b"));
        assert!(subgraph_contains("a", "a"));
        assert!(subgraph_contains("a", "a/b"));
        assert!(!subgraph_contains("a", "ab"));
        assert!(!subgraph_contains("a/b", "a"));
    }

    #[test]
    fn ids_of_sorted_items_are_the_ids_of_single_look_ups() {
        let mut graph = IntendedGraph::default();
        for (name, requires) in [("b", "a"), ("d", "zz"), ("c", "b"), ("a", "x")] {
            let mut item = Item::new("t", name, Default::default());
            item.dependencies
                .push(Dependency::on(ItemRef::new("t", requires)));
            graph.insert(IntendedItem::compile(item, 1).expect("no predicates"));
        }
        let asked: BTreeSet<ItemRef> = ["a", "b", "c", "d", "e", "x", "zz"]
            .into_iter()
            .map(|name| ItemRef::new("t", name))
            .chain([ItemRef::new("s", "a"), ItemRef::new("u", "a")])
            .collect();
        let single: Vec<Option<ItemId>> = asked.iter().map(|item| graph.id_of(item)).collect();
        assert_eq!(graph.ids_of_sorted(asked.iter()), single);
        assert_eq!(single.iter().filter(|id| id.is_some()).count(), 6);
    }

    /// Item `t/x` requiring `t/{name}` for each of `names`.
    fn requiring(names: &[&str]) -> Arc<Item> {
        let mut item = Item::new("t", "x", Default::default());
        for name in names {
            item.dependencies
                .push(Dependency::on(ItemRef::new("t", name)));
        }
        Arc::new(item)
    }

    /// The names of the current dependents of `t/{name}`.
    fn dependents(graph: &CurrentGraph, name: &str) -> Vec<String> {
        graph
            .dependents_of(&ItemRef::new("t", name))
            .map(|item| item.name().to_string())
            .collect()
    }

    #[test]
    fn a_hint_naming_another_identity_is_not_taken() {
        // x requires a and b: all three are interned in the current graph.
        let mut graph = CurrentGraph::default();
        graph.insert(
            ItemRef::new("t", "x"),
            CurrentItem::created(requiring(&["a", "b"]), 1),
        );
        for name in ["a", "b"] {
            let value = Arc::new(Item::new("t", name, Default::default()));
            graph.insert(ItemRef::new("t", name), CurrentItem::created(value, 1));
        }
        let a = ItemRef::new("t", "a");
        let found_a = |found: Option<&Arc<CurrentItem>>| {
            found
                .and_then(|entry| entry.applied.as_ref())
                .map(|value| value.identity.clone())
        };
        // No guess: found by name, and the guess remembered.
        let hint = CurrentSlotHint::default();
        assert_eq!(found_a(graph.get_hinted(&a, &hint)), Some(a.clone()));
        let remembered = hint.guess().expect("the id found is remembered");
        assert_eq!(found_a(graph.get_hinted(&a, &hint)), Some(a.clone()));
        // A guess naming b now (its id given to another identity, say), or
        // no identity at all: a is still found, and the guess corrected.
        let b_id = graph
            .ids
            .get(&ItemRef::new("t", "b"))
            .expect("b is interned");
        for stale in [b_id, 9_999] {
            hint.remember(stale);
            assert_eq!(found_a(graph.get_hinted(&a, &hint)), Some(a.clone()));
            assert_eq!(hint.guess(), Some(remembered));
        }
        // An item the graph does not hold is not found, guess or not.
        assert!(graph.get_hinted(&ItemRef::new("t", "zz"), &hint).is_none());
    }

    #[test]
    fn current_dependents_follow_each_items_latest_edges() {
        let key = ItemRef::new("t", "x");
        let mut graph = CurrentGraph::default();
        graph.insert(key.clone(), CurrentItem::created(requiring(&["a", "b"]), 1));
        // Same edges, another state: the index is unchanged.
        let mut failed = CurrentItem::created(requiring(&["a", "b"]), 2);
        failed.attempts = 1;
        graph.insert(key.clone(), failed);
        assert_eq!(dependents(&graph, "a"), ["x"]);
        assert_eq!(dependents(&graph, "b"), ["x"]);
        // Other edges: the old ones go, the kept and new ones stay.
        graph.insert(key.clone(), CurrentItem::created(requiring(&["b", "c"]), 3));
        assert!(dependents(&graph, "a").is_empty());
        assert_eq!(dependents(&graph, "b"), ["x"]);
        assert_eq!(dependents(&graph, "c"), ["x"]);
        graph.remove(&key);
        assert!(dependents(&graph, "b").is_empty() && dependents(&graph, "c").is_empty());
    }

    #[test]
    fn a_read_resolving_a_lost_create_keeps_the_edges_of_what_it_may_have_applied() {
        // Until the READ tells, the lost Create of x on a may have run: a's
        // Delete must still find x among a's dependents.
        let mut lost = InFlight::new(OperationKind::Create, "op".into(), 1, 1, 0, 1_000);
        lost.target = Some(requiring(&["a"]));
        let mut read = InFlight::new(OperationKind::Read, "read".into(), 1, 1, 0, 1_000);
        read.resolves = Some(Box::new(lost));
        let unknown = CurrentItem {
            state: crate::graph::ItemState::Unknown,
            ..CurrentItem::creating(read)
        };
        let mut graph = CurrentGraph::default();
        graph.insert(ItemRef::new("t", "x"), unknown);
        assert_eq!(dependents(&graph, "a"), ["x"]);
    }

    #[test]
    fn current_edges_named_twice_are_kept_once_and_forgotten_with_their_item() {
        let key = ItemRef::new("t", "x");
        let mut graph = CurrentGraph::default();
        // An item without edges costs the index nothing.
        graph.insert(key.clone(), CurrentItem::created(requiring(&[]), 1));
        assert_eq!(graph.ids.get(&key), None);
        // A Modify in flight: the applied value and the target both
        // require a; only the target requires b.
        let mut modifying = CurrentItem::created(requiring(&["a"]), 1);
        let mut operation = InFlight::new(OperationKind::Modify, "op".into(), 1, 2, 0, 1_000);
        operation.target = Some(requiring(&["a", "b"]));
        modifying.in_flight = Some(Box::new(operation));
        graph.insert(key.clone(), modifying);
        assert_eq!(dependents(&graph, "a"), ["x"]);
        assert_eq!(dependents(&graph, "b"), ["x"]);
        // The Modify done: b goes with the old target, a stays.
        graph.insert(key.clone(), CurrentItem::created(requiring(&["a"]), 2));
        assert_eq!(dependents(&graph, "a"), ["x"]);
        assert!(dependents(&graph, "b").is_empty());
        assert_eq!(graph.ids.get(&ItemRef::new("t", "b")), None);
        graph.remove(&key);
        for name in ["a", "b", "x"] {
            assert_eq!(
                graph.ids.get(&ItemRef::new("t", name)),
                None,
                "{name} is forgotten with the last item mentioning it"
            );
        }
    }

    proptest::proptest! {
        /// Whatever is inserted and removed in whatever order, looking an
        /// item up (through the id table where an edge mentions it) finds
        /// exactly what the ordered map holds, and its dependents are the
        /// items whose edges name it.
        #[test]
        fn look_ups_and_dependents_follow_every_change(
            steps in proptest::collection::vec(
                (0..6usize, proptest::collection::vec(0..6usize, 0..3), proptest::bool::ANY),
                1..40,
            ),
        ) {
            let names = ["a", "b", "c", "d", "e", "f"];
            let mut graph = CurrentGraph::default();
            for (generation, (item, requires, remove)) in (1..).zip(steps) {
                let key = ItemRef::new("t", names[item]);
                if remove {
                    graph.remove(&key);
                } else {
                    let mut value = Item::new("t", names[item], Default::default());
                    for &target in &requires {
                        value.dependencies.push(Dependency::on(ItemRef::new("t", names[target])));
                    }
                    graph.insert(key, CurrentItem::created(Arc::new(value), generation));
                }
                for name in names {
                    let key = ItemRef::new("t", name);
                    let found = graph.get(&key).map(Arc::as_ptr);
                    proptest::prop_assert_eq!(found, graph.items.get(&key).map(Arc::as_ptr));
                    let mut listed = dependents(&graph, name);
                    listed.sort();
                    let mut expected: Vec<String> = graph
                        .iter()
                        .filter(|(_, entry)| entry.edges().any(|target| *target == key))
                        .map(|(dependent, _)| dependent.name().to_string())
                        .collect();
                    expected.dedup();
                    proptest::prop_assert_eq!(listed, expected);
                }
            }
        }
    }

    proptest::proptest! {
        /// Whatever is put in the intended graph and taken out, in place
        /// (same subgraph and dependency targets, another value) or not,
        /// each item, its dependents and the items of each subgraph are
        /// those of the values put there last.
        #[test]
        fn intended_look_ups_follow_every_change(
            steps in proptest::collection::vec(
                (0..5usize, proptest::collection::vec(0..5usize, 0..3), 0..2usize, 0..3u64, proptest::bool::ANY),
                1..40,
            ),
        ) {
            let names = ["a", "b", "c", "d", "e"];
            let subgraphs = ["s", "s/t"];
            let mut graph = IntendedGraph::default();
            let mut model: BTreeMap<&str, Item> = BTreeMap::new();
            for (item, requires, subgraph, version, remove) in steps {
                let key = ItemRef::new("t", names[item]);
                if remove {
                    let removed = graph.remove(&key).map(|entry| (*entry.item).clone());
                    proptest::prop_assert_eq!(removed, model.remove(names[item]));
                } else {
                    let mut value = Item::new("t", names[item], Default::default());
                    value.properties = serde_json::json!({"v": version})
                        .try_into()
                        .expect("an object");
                    value.subgraph = subgraphs[subgraph].into();
                    for &target in &requires {
                        value.dependencies.push(Dependency::on(ItemRef::new("t", names[target])));
                    }
                    let previous = graph
                        .insert(IntendedItem::compile(value.clone(), version).expect("no predicates"))
                        .map(|entry| (*entry.item).clone());
                    proptest::prop_assert_eq!(previous, model.insert(names[item], value));
                }
                for name in names {
                    let key = ItemRef::new("t", name);
                    let found = graph.get(&key).map(|entry| (*entry.item).clone());
                    proptest::prop_assert_eq!(found.as_ref(), model.get(name));
                    // The id table's view: the same entry, its summary and
                    // its dependencies' targets.
                    let by_id = graph.id_of(&key).and_then(|id| {
                        graph.entry_by_id(id).map(|(entry, summary)| {
                            let required: Vec<String> = graph
                                .required_ids(id)
                                .iter()
                                .filter_map(|&target| graph.identity(target))
                                .map(|r| r.name().to_string())
                                .collect();
                            ((*entry.item).clone(), summary.generation, required)
                        })
                    });
                    let expected = model.get(name).map(|value| {
                        let required: Vec<String> =
                            value.required_items().map(|r| r.name().to_string()).collect();
                        (value.clone(), version_of(value), required)
                    });
                    proptest::prop_assert_eq!(by_id, expected);
                    let mut dependents: Vec<String> =
                        graph.dependents_of(&key).map(|r| r.name().to_string()).collect();
                    dependents.sort();
                    dependents.dedup();
                    let expected: Vec<String> = model
                        .values()
                        .filter(|value| value.required_items().any(|target| *target == key))
                        .map(|value| value.name().to_string())
                        .collect();
                    proptest::prop_assert_eq!(dependents, expected);
                }
                for subgraph in subgraphs {
                    let listed: BTreeSet<String> =
                        graph.items_under(subgraph).map(|r| r.name().to_string()).collect();
                    let expected: BTreeSet<String> = model
                        .values()
                        .filter(|value| subgraph_contains(subgraph, &value.subgraph))
                        .map(|value| value.name().to_string())
                        .collect();
                    proptest::prop_assert_eq!(listed, expected);
                }
            }
        }
    }

    /// The `v` property the proptest above gives each value, which it
    /// also uses as the value's generation.
    fn version_of(value: &Item) -> u64 {
        value
            .properties
            .get("v")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    }

    #[test]
    fn items_under_a_subgraph_cover_nested_paths_but_not_siblings() {
        let mut graph = IntendedGraph::default();
        for (name, subgraph) in [("x", "a"), ("y", "a/b"), ("z", "ab"), ("w", "")] {
            let mut item = Item::new("t", name, Default::default());
            item.subgraph = subgraph.into();
            graph.insert(IntendedItem::compile(item, 1).expect("no predicates"));
        }
        let under_a: Vec<String> = graph
            .items_under("a")
            .map(|r| r.name().to_string())
            .collect();
        assert_eq!(under_a, ["x", "y"]);
        assert_eq!(graph.items_under("").count(), 4);
        graph.remove(&ItemRef::new("t", "y"));
        assert_eq!(graph.items_under("a/b").count(), 0);
    }
}
