//! A tenant's in-memory state, owned by its owner task, and how it is
//! loaded from the store and written back.

use std::collections::{BTreeMap, BTreeSet};

use crate::graph::{CurrentGraph, CurrentItem, IntendedGraph, IntendedItem, ItemRef, ItemState};
use crate::store::{Record, Store, WriteBatch, keys};

use super::error::TenantError;
use super::record::{StoredIntended, TenantRecord, decode};
use crate::engine::waiting::WaitingSet;

/// Items per page when loading a tenant from the store.
const LOAD_PAGE: usize = 10_000;

/// Counts of items by displayed state (PENDING for intended items with no
/// current entry), kept up to date as items change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateCounts {
    by_state: BTreeMap<&'static str, u64>,
}

impl StateCounts {
    fn add(&mut self, state: Option<ItemState>, delta: i64) {
        let Some(state) = state else { return };
        let name = state_name(state);
        let count = self.by_state.entry(name).or_default();
        *count = count.saturating_add_signed(delta);
        if *count == 0 {
            self.by_state.remove(name);
        }
    }

    /// Counts by state name ("CREATED", "PENDING", ...); zero counts absent.
    pub fn by_state(&self) -> &BTreeMap<&'static str, u64> {
        &self.by_state
    }

    /// The count for one state.
    pub fn get(&self, state: ItemState) -> u64 {
        self.by_state.get(state_name(state)).copied().unwrap_or(0)
    }
}

/// The state name users see.
pub fn state_name(state: ItemState) -> &'static str {
    match state {
        ItemState::Pending => "PENDING",
        ItemState::Creating => "CREATING",
        ItemState::Modifying => "MODIFYING",
        ItemState::Deleting => "DELETING",
        ItemState::Created => "CREATED",
        ItemState::Failed => "FAILED",
        ItemState::Unknown => "UNKNOWN",
    }
}

/// The state shown for an item: its current state, or PENDING when it is
/// intended (and not external) and has no current entry.
pub fn displayed_state(
    intended: Option<&IntendedItem>,
    current: Option<&CurrentItem>,
) -> Option<ItemState> {
    match (intended, current) {
        (_, Some(current)) => Some(current.state),
        (Some(entry), None) if !entry.item.external => Some(ItemState::Pending),
        _ => None,
    }
}

/// Everything the owner of one tenant keeps in memory.
#[derive(Debug)]
pub struct TenantState {
    /// The tenant record (generation, revision, ...).
    pub record: TenantRecord,
    /// What users asked for.
    pub intended: IntendedGraph,
    /// What exists.
    pub current: CurrentGraph,
    /// Items the next pass must look at.
    pub unconverged: BTreeSet<ItemRef>,
    /// Items waiting, with reasons and what blocks them.
    pub waiting: WaitingSet,
    /// Items by displayed state.
    pub counts: StateCounts,
}

impl TenantState {
    /// A new, empty tenant.
    pub fn new(record: TenantRecord) -> Self {
        Self {
            record,
            intended: IntendedGraph::default(),
            current: CurrentGraph::default(),
            unconverged: BTreeSet::new(),
            waiting: WaitingSet::default(),
            counts: StateCounts::default(),
        }
    }

    /// Loads a tenant's graphs from the store. Every loaded item is
    /// unconverged until the first pass looks at it.
    pub fn load(store: &dyn Store, record: TenantRecord) -> Result<Self, TenantError> {
        let id = record.id;
        let mut state = Self::new(record);
        for (key, value) in scan_all(store, &keys::intended_items_prefix(id))? {
            let stored: StoredIntended = decode(&key, &value)?;
            let entry = IntendedItem::compile(stored.item, stored.generation).map_err(|error| {
                TenantError::Corrupt {
                    key: String::from_utf8_lossy(&key).into_owned(),
                    message: error.to_string(),
                }
            })?;
            state.unconverged.insert(entry.item.item_ref());
            state.intended.insert(entry);
        }
        for (key, value) in scan_all(store, &keys::current_items_prefix(id))? {
            let Some((item_type, name)) = keys::parse_item_key(&key) else {
                return Err(TenantError::Corrupt {
                    key: String::from_utf8_lossy(&key).into_owned(),
                    message: "not an item key".into(),
                });
            };
            let mut current: CurrentItem = decode(&key, &value)?;
            let item = ItemRef::new(item_type, name);
            // A converged item's applied value equals its intended one:
            // share one copy (halves the memory of a converged tenant).
            if let (Some(applied), Some(intended)) =
                (current.applied.as_mut(), state.intended.get(&item))
                && **applied == *intended.item
            {
                *applied = intended.item.clone();
            }
            state.unconverged.insert(item.clone());
            state.current.insert(item, current);
        }
        state.recount();
        Ok(state)
    }

    /// Recomputes the state counts from scratch (O(items); at load only).
    fn recount(&mut self) {
        let mut counts = StateCounts::default();
        for (key, entry) in self.intended.iter() {
            if self.current.get(key).is_none() {
                counts.add(displayed_state(Some(entry), None), 1);
            }
        }
        for (key, current) in self.current.iter() {
            counts.add(
                displayed_state(self.intended.get(key).map(|e| &**e), Some(current)),
                1,
            );
        }
        self.counts = counts;
    }

    /// The displayed state of one item now.
    pub fn displayed(&self, item: &ItemRef) -> Option<ItemState> {
        displayed_state(
            self.intended.get(item).map(|e| &**e),
            self.current.get(item).map(|c| &**c),
        )
    }

    /// Adjusts the counts for `item`, whose displayed state went from
    /// `before` to what it is now.
    pub fn recount_item(&mut self, item: &ItemRef, before: Option<ItemState>) {
        let after = self.displayed(item);
        if before != after {
            self.counts.add(before, -1);
            self.counts.add(after, 1);
        }
    }

    /// Adds the write that stores `item`'s current record as it is now.
    pub fn write_current(&self, batch: &mut WriteBatch, item: &ItemRef) -> Result<(), TenantError> {
        self.write_current_value(batch, item, self.current.get(item).map(|c| &**c))
    }

    /// Adds the write that stores `value` as `item`'s current record
    /// (`None` deletes it).
    pub fn write_current_value(
        &self,
        batch: &mut WriteBatch,
        item: &ItemRef,
        value: Option<&CurrentItem>,
    ) -> Result<(), TenantError> {
        super::persist::put_current(batch, self.record.id, item, value)
    }
}

/// Reads every key under `prefix`, page by page.
pub fn scan_all(store: &dyn Store, prefix: &[u8]) -> Result<Vec<Record>, TenantError> {
    let mut all = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = store.scan(prefix, after.as_deref(), LOAD_PAGE)?;
        let full = page.len() == LOAD_PAGE;
        after = page.last().map(|(key, _)| key.clone());
        all.extend(page);
        if !full {
            return Ok(all);
        }
    }
}
