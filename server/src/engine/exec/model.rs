//! A tenant's state as its executor keeps it: the two graphs, what is not
//! converged yet, what waits and why, the counts by state, and the
//! tenant's progress (generation, observed generation, conditions).
//!
//! Changes are **staged**: [`TenantModel::stage_current`] and
//! [`TenantModel::stage_intent`] apply a change at once (planning then sees
//! it, so nothing is applied twice) and remember, per item, the value it
//! had before the transaction. [`TenantModel::staged_writes`] hands those
//! before / after pairs to the commit; once it is durable,
//! [`TenantModel::forget_staged`] keeps the changes, and if it failed,
//! [`TenantModel::rollback_staged`] puts the old values back. Counts follow every staged change, and its undoing.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::FxHashSet;

use crate::engine::conditions::Condition;
use crate::engine::exec::unconverged::UnconvergedSet;
use crate::engine::intent::{IntentChange, apply_change};
use crate::engine::waiting::WaitingSet;
use crate::graph::{CurrentGraph, CurrentItem, IntendedGraph, IntendedItem, ItemRef, ItemState};

/// Counts of a tenant's items by displayed state: an intended item that is
/// not current (an external item never reported too) counts as `PENDING`,
/// so every intended item counts in one state.
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

    /// Counts by state name (`PENDING`, `CREATED`, ...); states with no
    /// item are absent.
    pub fn by_state(&self) -> &BTreeMap<&'static str, u64> {
        &self.by_state
    }

    /// The count of one state.
    pub fn get(&self, state: ItemState) -> u64 {
        self.by_state.get(state_name(state)).copied().unwrap_or(0)
    }

    /// The counts of the items of `intended` and `current`, from scratch.
    pub fn recount(intended: &IntendedGraph, current: &CurrentGraph) -> Self {
        let mut counts = Self::default();
        for (key, entry) in intended.iter() {
            if current.get(key).is_none() {
                counts.add(displayed_state(Some(entry), None), 1);
            }
        }
        for (key, entry) in current.iter() {
            counts.add(
                displayed_state(intended.get(key).map(|e| &**e), Some(entry)),
                1,
            );
        }
        counts
    }
}

/// The upper-case name of a state, as metrics and statuses show it.
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

/// The state an item shows, as its `ItemStatus` does: its current state,
/// `PENDING` for an intended item that is not current (an external item
/// never reported too: it is expected and not there yet).
pub fn displayed_state(
    intended: Option<&IntendedItem>,
    current: Option<&CurrentItem>,
) -> Option<ItemState> {
    match (intended, current) {
        (_, Some(current)) => Some(current.state),
        (Some(_), None) => Some(ItemState::Pending),
        (None, None) => None,
    }
}

/// The tenant's progress, stored in its record: the intent generation, the
/// generation last observed quiescent, and the conditions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantProgress {
    /// The intent generation.
    pub generation: u64,
    /// The newest generation once the tenant was quiescent.
    pub observed_generation: u64,
    /// Ready, Reconciling and Stalled.
    pub conditions: Vec<Condition>,
}

/// One current item a transaction changed, for its commit: its value
/// before the transaction and after it (`None`: absent).
#[derive(Clone, Debug)]
pub struct ItemWrite {
    /// The item.
    pub item: ItemRef,
    /// Its value before the transaction.
    pub before: Option<Arc<CurrentItem>>,
    /// Its value after the transaction.
    pub after: Option<Arc<CurrentItem>>,
}

/// What a transaction changed, with the values to put back.
#[derive(Debug, Default)]
struct Staged {
    /// Current items changed, with their value before, in first-change
    /// order.
    current: Vec<(ItemRef, Option<Arc<CurrentItem>>)>,
    current_seen: FxHashSet<ItemRef>,
    /// Intended items changed, with their value before.
    intended: Vec<(ItemRef, Option<Arc<IntendedItem>>)>,
    intended_seen: FxHashSet<ItemRef>,
    /// The progress before the transaction, once it changed.
    progress: Option<TenantProgress>,
}

/// A tenant's state, owned by its executor.
#[derive(Debug, Default)]
pub struct TenantModel {
    /// What users asked for.
    pub intended: IntendedGraph,
    /// What exists (or may exist) on the configurators' side.
    pub current: CurrentGraph,
    /// Items a pass must look at again.
    pub unconverged: UnconvergedSet,
    /// Items that need an operation the executor cannot run yet, and why.
    pub waiting: WaitingSet,
    counts: StateCounts,
    progress: TenantProgress,
    staged: Staged,
}

impl TenantModel {
    /// A model of `intended` and `current` (as loaded): every item is to be
    /// looked at by the first pass.
    pub fn new(intended: IntendedGraph, current: CurrentGraph, progress: TenantProgress) -> Self {
        let mut unconverged: UnconvergedSet = intended.iter().map(|(k, _)| k.clone()).collect();
        unconverged.extend(current.iter().map(|(k, _)| k.clone()));
        let counts = StateCounts::recount(&intended, &current);
        Self {
            intended,
            current,
            unconverged,
            waiting: WaitingSet::default(),
            counts,
            progress,
            staged: Staged::default(),
        }
    }

    /// Counts by displayed state.
    pub fn counts(&self) -> &StateCounts {
        &self.counts
    }

    /// The tenant's progress.
    pub fn progress(&self) -> &TenantProgress {
        &self.progress
    }

    /// The state `item` shows.
    pub fn displayed(&self, item: &ItemRef) -> Option<ItemState> {
        displayed_state(
            self.intended.get(item).map(|e| &**e),
            self.current.get(item).map(|c| &**c),
        )
    }

    fn recount_item(&mut self, item: &ItemRef, before: Option<ItemState>) {
        let after = self.displayed(item);
        if before != after {
            self.counts.add(before, -1);
            self.counts.add(after, 1);
        }
    }

    /// Puts `value` as `item`'s current value (`None`: removes it), staged.
    pub fn stage_current(&mut self, item: &ItemRef, value: Option<CurrentItem>) {
        if self.staged.current_seen.insert(item.clone()) {
            self.staged
                .current
                .push((item.clone(), self.current.get(item).cloned()));
        }
        let before = self.displayed(item);
        match value {
            Some(value) => {
                self.current.insert(item.clone(), value);
            }
            None => {
                self.current.remove(item);
            }
        }
        self.recount_item(item, before);
    }

    /// Stages every update in order.
    pub fn stage_updates(&mut self, updates: crate::engine::transition::CurrentUpdates) {
        for (item, value) in updates {
            self.stage_current(&item, value);
        }
    }

    /// Applies an intent change (items and generation), staged.
    pub fn stage_intent(&mut self, change: &IntentChange) {
        let keys: Vec<ItemRef> = change
            .upserts
            .iter()
            .map(|entry| entry.item.item_ref())
            .chain(change.removals.iter().cloned())
            .collect();
        let mut before = Vec::with_capacity(keys.len());
        for key in &keys {
            if self.staged.intended_seen.insert(key.clone()) {
                self.staged
                    .intended
                    .push((key.clone(), self.intended.get(key).cloned()));
            }
            before.push(self.displayed(key));
        }
        apply_change(&mut self.intended, change);
        for (key, before) in keys.iter().zip(before) {
            self.recount_item(key, before);
        }
        let mut progress = self.progress.clone();
        progress.generation = change.generation;
        self.stage_progress(progress);
    }

    /// Sets the progress, staged.
    pub fn stage_progress(&mut self, progress: TenantProgress) {
        if self.staged.progress.is_none() {
            self.staged.progress = Some(self.progress.clone());
        }
        self.progress = progress;
    }

    /// Sets the conditions without staging: a change of wording only is
    /// shown, not committed, and not undone.
    pub fn reword_conditions(&mut self, conditions: Vec<Condition>) {
        self.progress.conditions = conditions;
    }

    /// Whether anything is staged.
    pub fn has_staged(&self) -> bool {
        !self.staged.current.is_empty()
            || !self.staged.intended.is_empty()
            || self.staged.progress.is_some()
    }

    /// The current items the transaction changed, with their values
    /// before and after, in first-change order (items changed back to
    /// what they were are left out).
    pub fn staged_writes(&self) -> Vec<ItemWrite> {
        self.staged
            .current
            .iter()
            .filter_map(|(item, before)| {
                let after = self.current.get(item).cloned();
                let unchanged = match (before, &after) {
                    (Some(b), Some(a)) => Arc::ptr_eq(b, a),
                    (None, None) => true,
                    _ => false,
                };
                (!unchanged).then(|| ItemWrite {
                    item: item.clone(),
                    before: before.clone(),
                    after,
                })
            })
            .collect()
    }

    /// The progress before the transaction, if the transaction changed it.
    pub fn progress_before(&self) -> Option<&TenantProgress> {
        self.staged.progress.as_ref()
    }

    /// Ends the transaction as committed: what it staged stays.
    pub fn forget_staged(&mut self) {
        self.staged = Staged::default();
    }

    /// Ends the transaction as failed: every staged change is undone.
    /// Returns the items it had changed.
    pub fn rollback_staged(&mut self) -> Vec<ItemRef> {
        let staged = std::mem::take(&mut self.staged);
        let mut touched = Vec::with_capacity(staged.current.len() + staged.intended.len());
        for (key, previous) in staged.intended.into_iter().rev() {
            let before = self.displayed(&key);
            match previous {
                Some(entry) => {
                    self.intended.insert((*entry).clone());
                }
                None => {
                    self.intended.remove(&key);
                }
            }
            self.recount_item(&key, before);
            touched.push(key);
        }
        for (key, previous) in staged.current.into_iter().rev() {
            let before = self.displayed(&key);
            match previous {
                Some(entry) => {
                    self.current.insert(key.clone(), (*entry).clone());
                }
                None => {
                    self.current.remove(&key);
                }
            }
            self.recount_item(&key, before);
            touched.push(key);
        }
        if let Some(progress) = staged.progress {
            self.progress = progress;
        }
        touched
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::intent::IntentChange;
    use crate::graph::{InFlight, Item, OperationKind};

    fn created(name: &str) -> CurrentItem {
        CurrentItem::created(Arc::new(Item::new("t", name, Default::default())), 1)
    }

    fn intended(name: &str) -> IntendedItem {
        IntendedItem::compile(Item::new("t", name, Default::default()), 1).expect("compiles")
    }

    #[test]
    fn a_rolled_back_transaction_leaves_graphs_counts_and_progress_as_they_were() {
        let mut current = CurrentGraph::default();
        current.insert(ItemRef::new("t", "a"), created("a"));
        let mut model =
            TenantModel::new(IntendedGraph::default(), current, TenantProgress::default());
        let before = model.counts().clone();
        model.stage_current(&ItemRef::new("t", "a"), None);
        let creating = CurrentItem::creating(InFlight::new(
            OperationKind::Create,
            "op".into(),
            1,
            1,
            0,
            1_000,
        ));
        model.stage_current(&ItemRef::new("t", "b"), Some(creating));
        model.stage_intent(&IntentChange {
            generation: 2,
            upserts: vec![intended("c")],
            ..IntentChange::default()
        });
        assert_eq!(model.counts().get(ItemState::Creating), 1);
        assert_eq!(model.counts().get(ItemState::Pending), 1);
        assert_eq!(model.progress().generation, 2);
        model.rollback_staged();
        assert_eq!(model.counts(), &before);
        assert_eq!(model.progress().generation, 0);
        assert!(model.current.get(&ItemRef::new("t", "a")).is_some());
        assert!(model.current.get(&ItemRef::new("t", "b")).is_none());
        assert!(model.intended.get(&ItemRef::new("t", "c")).is_none());
        assert_eq!(
            model.counts(),
            &StateCounts::recount(&model.intended, &model.current)
        );
    }

    #[test]
    fn an_intended_external_item_never_reported_counts_as_pending() {
        let mut external = Item::new("t", "x", Default::default());
        external.external = true;
        let mut model = TenantModel::default();
        model.stage_intent(&IntentChange {
            generation: 1,
            upserts: vec![IntendedItem::compile(external, 1).expect("compiles")],
            ..IntentChange::default()
        });
        assert_eq!(
            model.counts().get(ItemState::Pending),
            1,
            "every intended item counts in one state, as its ItemStatus shows it"
        );
        assert_eq!(
            model.counts(),
            &StateCounts::recount(&model.intended, &model.current)
        );
    }

    #[test]
    fn a_committed_transaction_lists_each_changed_item_once_with_its_first_value() {
        let mut model = TenantModel::default();
        let a = ItemRef::new("t", "a");
        model.stage_current(&a, Some(created("a")));
        model.stage_current(&a, None);
        model.stage_current(&a, Some(created("a")));
        let writes = model.staged_writes();
        assert_eq!(writes.len(), 1);
        assert!(writes[0].before.is_none() && writes[0].after.is_some());
        model.forget_staged();
        assert!(!model.has_staged());
        assert_eq!(
            model.counts(),
            &StateCounts::recount(&model.intended, &model.current)
        );
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// One step of a random history: a current value, an intent
        /// change, or the end of a transaction.
        #[derive(Clone, Debug)]
        enum Step {
            Current(usize, Option<ItemState>),
            Intend(usize, bool),
            Commit,
            Rollback,
        }

        fn step() -> impl Strategy<Value = Step> {
            let state = prop_oneof![
                Just(ItemState::Creating),
                Just(ItemState::Created),
                Just(ItemState::Failed),
                Just(ItemState::Unknown),
                Just(ItemState::Deleting),
            ];
            prop_oneof![
                4 => (0..6usize, proptest::option::of(state)).prop_map(|(i, s)| Step::Current(i, s)),
                3 => (0..6usize, any::<bool>()).prop_map(|(i, keep)| Step::Intend(i, keep)),
                1 => Just(Step::Commit),
                1 => Just(Step::Rollback),
            ]
        }

        fn current_in(state: ItemState) -> CurrentItem {
            CurrentItem {
                state,
                ..created("x")
            }
        }

        proptest! {
            #[test]
            fn counts_always_equal_a_recount(steps in proptest::collection::vec(step(), 1..60)) {
                let mut model = TenantModel::default();
                let mut generation = 0;
                for step in steps {
                    match step {
                        Step::Current(i, state) => {
                            let key = ItemRef::new("t", format!("n{i}"));
                            model.stage_current(&key, state.map(current_in));
                        }
                        Step::Intend(i, keep) => {
                            generation += 1;
                            let key = ItemRef::new("t", format!("n{i}"));
                            let mut change = IntentChange { generation, ..IntentChange::default() };
                            if keep {
                                change.upserts.push(intended(&format!("n{i}")));
                            } else {
                                change.removals.push(key);
                            }
                            model.stage_intent(&change);
                        }
                        Step::Commit => model.forget_staged(),
                        Step::Rollback => {
                            model.rollback_staged();
                        }
                    }
                    prop_assert_eq!(
                        model.counts(),
                        &StateCounts::recount(&model.intended, &model.current)
                    );
                }
            }
        }
    }
}
