//! A tenant as loaded from the store: its record, its two graphs and its
//! registered type specs, from which its owner builds the executor.

use std::sync::Arc;

use tracing::warn;

use crate::engine::exec::{StoredSpec, TenantProgress};
use crate::graph::{CurrentGraph, CurrentItem, IntendedGraph, IntendedItem, ItemRef};
use crate::store::{Record, Store, keys};

use super::error::TenantError;
use super::record::{StoredIntended, TenantRecord, decode};

pub use crate::engine::exec::model::{StateCounts, displayed_state, state_name};

/// Items per page when loading a tenant from the store.
const LOAD_PAGE: usize = 10_000;

/// A tenant as stored.
#[derive(Debug)]
pub struct TenantState {
    /// The tenant record (generation, revision, ...).
    pub record: TenantRecord,
    /// What users asked for.
    pub intended: IntendedGraph,
    /// What exists.
    pub current: CurrentGraph,
    /// The type specs its configurators registered, with their epochs
    /// and the agents that held them.
    pub specs: Vec<StoredSpec>,
}

impl TenantState {
    /// A new, empty tenant.
    pub fn new(record: TenantRecord) -> Self {
        Self {
            record,
            intended: IntendedGraph::default(),
            current: CurrentGraph::default(),
            specs: Vec::new(),
        }
    }

    /// Loads a tenant's graphs and type specs from the store. A type spec
    /// that cannot be read is skipped with a warning (its agent registers
    /// it again); an unreadable item fails the load.
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
            let item = state
                .intended
                .shared_identity(&item)
                .cloned()
                .unwrap_or(item);
            // The applied value shares the intended one when they are equal
            // (memory, and cheap comparisons).
            if let (Some(applied), Some(intended)) =
                (current.applied.as_mut(), state.intended.get(&item))
                && **applied == *intended.item
            {
                *applied = Arc::clone(&intended.item);
            }
            state.current.insert(item, current);
        }
        for (key, value) in scan_all(store, &keys::type_specs_prefix(id))? {
            match decode::<StoredSpec>(&key, &value) {
                Ok(stored) => state.specs.push(stored),
                Err(error) => {
                    warn!(tenant = %state.record.name, %error, "A stored type spec is unreadable; it is skipped until its agent registers again.");
                }
            }
        }
        Ok(state)
    }

    /// The progress stored in the record.
    pub fn progress(&self) -> TenantProgress {
        TenantProgress {
            generation: self.record.generation,
            observed_generation: self.record.observed_generation,
            conditions: self.record.conditions.clone(),
        }
    }
}

/// Every record under `prefix`, read page by page.
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
