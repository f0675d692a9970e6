//! The items of a tenant that wait for something, kept up to date pass by
//! pass, with running counts so conditions never rescan them.

use std::collections::BTreeMap;
use std::sync::Arc;

use imbl::{OrdMap, OrdSet};

use super::plan::{BlockedBy, WaitReason, WaitingItem};
use crate::graph::{ItemRef, OperationKind};

/// Counts over the waiting items.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WaitingSummary {
    /// Waiting items.
    pub total: usize,
    /// Waiting items by reason.
    pub by_reason: BTreeMap<WaitReason, usize>,
    /// Items that failed terminally or wait on one.
    pub terminal: usize,
    /// Items waiting for a configurator, by item type.
    pub without_configurator: BTreeMap<String, usize>,
    /// Items waiting for the outcome of a lost operation, by item type:
    /// while no agent holds their type, they wait for a configurator too
    /// (only one can READ them or send the operation again, DESIGN 4).
    pub unknown_outcome: BTreeMap<String, usize>,
    /// The items that failed terminally themselves (not those that only
    /// wait on one): what a Stalled tenant names. Counted, not a set: a
    /// replaced entry is counted in before its predecessor is counted out.
    pub failed_terminally: BTreeMap<ItemRef, usize>,
}

impl WaitingSummary {
    fn count(&mut self, item: &WaitingItem, delta: isize) {
        let adjust = |value: &mut usize| *value = value.saturating_add_signed(delta);
        adjust(&mut self.total);
        adjust(self.by_reason.entry(item.reason).or_default());
        if item.waits_on_terminal_failure() {
            adjust(&mut self.terminal);
        }
        if item.failed_terminally_itself() {
            let entry = self.failed_terminally.entry(item.item.clone()).or_default();
            adjust(entry);
            if *entry == 0 {
                self.failed_terminally.remove(&item.item);
            }
        }
        let by_type = match item.reason {
            WaitReason::NoConfigurator => Some(&mut self.without_configurator),
            WaitReason::UnknownOutcome => Some(&mut self.unknown_outcome),
            _ => None,
        };
        if let Some(by_type) = by_type {
            let item_type = item.item.item_type().to_string();
            let entry = by_type.entry(item_type.clone()).or_default();
            adjust(entry);
            if *entry == 0 {
                by_type.remove(&item_type);
            }
        }
        self.by_reason.retain(|_, count| *count > 0);
    }
}

/// The waiting items (an O(1)-clone map for snapshots) and their summary.
///
/// Entries are shared, not copied, when a change to the map copies the
/// part of it a snapshot still holds: a Delete waiting for a hub's many
/// dependents names each of them.
#[derive(Clone, Debug, Default)]
pub struct WaitingSet {
    items: OrdMap<ItemRef, Arc<WaitingItem>>,
    /// The items whose waiting operation is a Delete: a Create of their
    /// type asks for them, and must not walk every waiting item to find
    /// them (a deep chain keeps almost every item waiting).
    deletes: OrdSet<ItemRef>,
    summary: WaitingSummary,
}

impl WaitingSet {
    /// Records that `item` waits as described, replacing what it waited for.
    pub fn insert(&mut self, entry: WaitingItem) {
        // An item waiting as before keeps its entry: a pass plans every
        // pending item again, and replacing each would copy the map's
        // paths that snapshots share and count it out and in.
        if self
            .items
            .get(&entry.item)
            .is_some_and(|existing| **existing == entry)
        {
            return;
        }
        if entry.operation == OperationKind::Delete {
            self.deletes.insert(entry.item.clone());
        } else {
            self.deletes.remove(&entry.item);
        }
        self.summary.count(&entry, 1);
        if let Some(previous) = self.items.insert(entry.item.clone(), Arc::new(entry)) {
            self.summary.count(&previous, -1);
        }
    }

    /// Records that `item` no longer waits.
    pub fn remove(&mut self, item: &ItemRef) {
        self.deletes.remove(item);
        if let Some(previous) = self.items.remove(item) {
            self.summary.count(&previous, -1);
        }
    }

    /// Replaces the blockers of waiting `item` with `left`, what is left of
    /// them once some are gone (their Deletes completed): it waits as
    /// before otherwise. None of those gone may show a terminal failure,
    /// so the counts stand, and are not recounted over a long list.
    pub fn drop_gone_blockers(&mut self, item: &ItemRef, left: Vec<BlockedBy>) {
        let Some(entry) = self.items.get(item) else {
            return;
        };
        let shortened = WaitingItem {
            item: entry.item.clone(),
            operation: entry.operation,
            reason: entry.reason,
            blocked_by: left,
        };
        debug_assert_eq!(
            shortened.waits_on_terminal_failure(),
            entry.waits_on_terminal_failure(),
            "a blocker shown failed terminally left the list"
        );
        self.items.insert(item.clone(), Arc::new(shortened));
    }

    /// The items of one item type waiting to be deleted, in identity
    /// order; as cheap as there are such items, however many others wait.
    pub fn deletes_of_type<'s>(
        &'s self,
        item_type: &'s str,
    ) -> impl Iterator<Item = &'s ItemRef> + 's {
        let start = ItemRef::new(item_type, "");
        self.deletes
            .range(start..)
            .take_while(move |item| &**item.item_type() == item_type)
    }

    /// Whether `item` waits to be deleted.
    pub fn waits_to_delete(&self, item: &ItemRef) -> bool {
        self.deletes.contains(item)
    }

    /// The waiting entry of `item`, if it waits.
    pub fn get(&self, item: &ItemRef) -> Option<&Arc<WaitingItem>> {
        self.items.get(item)
    }

    /// The running counts.
    pub fn summary(&self) -> &WaitingSummary {
        &self.summary
    }

    /// An O(1) copy of the items.
    pub fn items(&self) -> OrdMap<ItemRef, Arc<WaitingItem>> {
        self.items.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::plan::BlockedBy;

    fn waiting(name: &str, reason: WaitReason) -> WaitingItem {
        WaitingItem {
            item: ItemRef::new("t", name),
            operation: OperationKind::Create,
            reason,
            blocked_by: vec![BlockedBy {
                item: ItemRef::new("t", "x"),
                why: "missing".into(),
            }],
        }
    }

    #[test]
    fn counts_follow_inserts_replacements_and_removals() {
        let mut set = WaitingSet::default();
        set.insert(waiting("a", WaitReason::NoConfigurator));
        set.insert(waiting("b", WaitReason::TerminalFailure));
        assert_eq!(set.summary().total, 2);
        assert_eq!(set.summary().terminal, 1);
        assert_eq!(set.summary().without_configurator.get("t"), Some(&1));
        set.insert(waiting("a", WaitReason::Dependency));
        assert!(set.summary().without_configurator.is_empty());
        set.remove(&ItemRef::new("t", "b"));
        assert_eq!(set.summary().total, 1);
        assert_eq!(set.summary().terminal, 0);
        assert_eq!(
            set.summary().by_reason.get(&WaitReason::Dependency),
            Some(&1)
        );
    }

    #[test]
    fn deletes_of_a_type_follow_what_each_item_waits_to_do() {
        let mut set = WaitingSet::default();
        let delete = |item_type: &str, name: &str| WaitingItem {
            item: ItemRef::new(item_type, name),
            operation: OperationKind::Delete,
            ..waiting(name, WaitReason::Dependency)
        };
        set.insert(waiting("a", WaitReason::Dependency));
        set.insert(delete("t", "b"));
        set.insert(delete("t", "c"));
        set.insert(delete("u", "d"));
        let names = |set: &WaitingSet| -> Vec<String> {
            set.deletes_of_type("t")
                .map(|item| item.name().to_string())
                .collect()
        };
        assert_eq!(names(&set), ["b", "c"]);
        // b now waits to be created, c no longer waits.
        set.insert(waiting("b", WaitReason::Dependency));
        set.remove(&ItemRef::new("t", "c"));
        assert!(names(&set).is_empty());
        assert_eq!(set.deletes_of_type("u").count(), 1);
        assert_eq!(set.deletes_of_type("").count(), 0);
    }
}
