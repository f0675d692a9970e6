//! Room for operations (DESIGN section 4: "each item type gets a fair
//! share of the tenant's in-flight limit"): an item type runs at most its
//! spec's `max_in_flight` operations at once, and at most its share of the
//! tenant's `max_operations_in_flight` (divided among the types with a
//! live session); the tenant at most that limit. A ready operation that finds no room waits
//! in its type's queue, and when room frees, queued items are planned
//! again. Pure bookkeeping: the executor decides what to dispatch, this
//! says whether there is room.
//!
//! The queue holds exactly the items whose last plan made them ready
//! without room: an item planned again leaves it ([`Room::unqueue`]) until
//! it finds no room again, and an item dispatched leaves it. (An item left
//! in the queue after it no longer needed room took the room of the next
//! one when an operation ended, which then waited for ever.)

use std::collections::{BTreeMap, HashMap};

use crate::graph::{ItemRef, OperationKind};

/// Operations running and queued, by item type.
#[derive(Clone, Debug, Default)]
pub struct Room {
    /// Running operations of each type with a live session: all of them,
    /// and the drift READs among them (observation, not work; a READ that
    /// resolves a lost operation is work).
    running: HashMap<String, Running>,
    /// Ready operations that found no room, by type, with what they do.
    queued: BTreeMap<String, BTreeMap<ItemRef, OperationKind>>,
}

/// The running operations of one type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Running {
    /// Every running operation.
    pub all: usize,
    /// Of `all`: drift READs (not those resolving a lost operation).
    pub reads: usize,
}

/// The limits that make room: the type's and the tenant's (0: none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The type's `max_in_flight` (at least 1).
    pub per_type: usize,
    /// The tenant's `max_operations_in_flight`; 0 means no limit.
    pub per_tenant: u64,
}

impl Room {
    /// Replaces the running counts with a recount: one entry per type that
    /// has a live session (types without one run nothing).
    pub fn set_running(&mut self, counts: impl IntoIterator<Item = (String, Running)>) {
        self.running = counts.into_iter().collect();
    }

    /// Every running operation.
    pub fn running(&self) -> usize {
        self.running.values().map(|running| running.all).sum()
    }

    /// Running operations that are work (all but drift READs).
    pub fn running_work(&self) -> usize {
        self.running
            .values()
            .map(|running| running.all.saturating_sub(running.reads))
            .sum()
    }

    /// Room left in the tenant.
    fn tenant_room(&self, per_tenant: u64) -> usize {
        match per_tenant {
            0 => usize::MAX,
            limit => usize::try_from(limit)
                .unwrap_or(usize::MAX)
                .saturating_sub(self.running()),
        }
    }

    /// The most operations a type may run at once: its `max_in_flight`,
    /// and its fair share of the tenant's limit (that limit divided among
    /// the types with a live session, rounded up), so that however long a
    /// slow type's operations run, the others keep room of their own
    /// (DESIGN 4). A type busy alone does not borrow the others' shares:
    /// what it took could not be handed back until its operations end.
    fn type_cap(&self, limits: Limits) -> usize {
        let per_type = limits.per_type.max(1);
        match limits.per_tenant {
            0 => per_type,
            limit => {
                let limit = usize::try_from(limit).unwrap_or(usize::MAX);
                per_type.min(limit.div_ceil(self.running.len().max(1)))
            }
        }
    }

    /// Room left for `item_type` (0 without a live session).
    fn type_room(&self, item_type: &str, limits: Limits) -> usize {
        self.running
            .get(item_type)
            .map_or(0, |running| {
                self.type_cap(limits).saturating_sub(running.all)
            })
            .min(self.tenant_room(limits.per_tenant))
    }

    /// Whether an operation of `item_type` would find room now.
    pub fn has_room(&self, item_type: &str, limits: Limits) -> bool {
        self.type_room(item_type, limits) > 0
    }

    /// Takes room for operation `kind` on `item` if its type, which must
    /// have a live session, and the tenant have some: `true`, and the item
    /// leaves its type's queue. Otherwise `false`; a planned operation (not
    /// a drift READ) then waits in the queue.
    pub fn admit(&mut self, item: &ItemRef, kind: OperationKind, limits: Limits) -> bool {
        let read = kind == OperationKind::Read;
        if !self.take(item.item_type(), read, limits) {
            if !read {
                self.queued
                    .entry(item.item_type().to_string())
                    .or_default()
                    .insert(item.clone(), kind);
            }
            return false;
        }
        self.unqueue_one(item);
        true
    }

    /// Takes room for an operation of `item_type` (`drift_read`: a drift
    /// READ, observation rather than work) if the type and the tenant have
    /// some, and queues nothing: a lost operation sent again, or the READ
    /// that resolves it, waits as UNKNOWN instead (see [`Room::admit`] for
    /// planned ones).
    pub fn take(&mut self, item_type: &str, drift_read: bool, limits: Limits) -> bool {
        if self.type_room(item_type, limits) == 0 {
            return false;
        }
        let running = self.running.entry(item_type.to_string()).or_default();
        running.all += 1;
        running.reads += usize::from(drift_read);
        true
    }

    /// Counts an operation of `item_type` that runs whatever the room (a
    /// lost operation the agent still runs: it holds its room).
    pub fn occupy(&mut self, item_type: &str) {
        self.running.entry(item_type.to_string()).or_default().all += 1;
    }

    /// Ready operations waiting for room, of every type.
    pub fn queued_len(&self) -> usize {
        self.queued.values().map(BTreeMap::len).sum()
    }

    /// Items planned again leave the queue; those still without room are
    /// queued again by [`Room::admit`]. Returns the operations they were
    /// queued for (a plan that no longer has one leaves its waiters
    /// without the result that was to wake them).
    pub fn unqueue<'a>(
        &mut self,
        items: impl IntoIterator<Item = &'a ItemRef>,
    ) -> Vec<(ItemRef, OperationKind)> {
        if self.queued.is_empty() {
            return Vec::new();
        }
        items
            .into_iter()
            .filter_map(|item| Some((item.clone(), self.unqueue_one(item)?)))
            .collect()
    }

    /// Takes `item` out of its type's queue: the operation it was queued
    /// for, if it was.
    fn unqueue_one(&mut self, item: &ItemRef) -> Option<OperationKind> {
        let queued = self.queued.get_mut(&**item.item_type())?;
        let kind = queued.remove(item);
        if queued.is_empty() {
            self.queued.remove(&**item.item_type());
        }
        kind
    }

    /// Takes every queued item of `item_type` out of the queue (its session
    /// ended: they are to be planned again, and wait for a configurator).
    pub fn take_queued_of(&mut self, item_type: &str) -> Vec<ItemRef> {
        self.queued
            .remove(item_type)
            .map(|queued| queued.into_keys().collect())
            .unwrap_or_default()
    }

    /// Queued items that now have room, to be planned again, with the
    /// operation each was queued for: per type as many as its room (in
    /// identity order), within the tenant's room. They leave the queue.
    pub fn take_queued(
        &mut self,
        limits_of: impl Fn(&str) -> Limits,
    ) -> Vec<(ItemRef, OperationKind)> {
        let mut taken = Vec::new();
        let types: Vec<String> = self.queued.keys().cloned().collect();
        for item_type in types {
            let limits = limits_of(&item_type);
            let room = self.type_room(&item_type, limits).min(
                self.tenant_room(limits.per_tenant)
                    .saturating_sub(taken.len()),
            );
            let Some(queued) = self.queued.get_mut(&item_type) else {
                continue;
            };
            for _ in 0..room {
                match queued.pop_first() {
                    Some(entry) => taken.push(entry),
                    None => break,
                }
            }
            if queued.is_empty() {
                self.queued.remove(&item_type);
            }
        }
        taken
    }

    /// The queued Deletes of `item_type` (a plan's Creates of a type wait
    /// for its Deletes of that type, queued ones included).
    pub fn queued_deletes_of(&self, item_type: &str) -> impl Iterator<Item = &ItemRef> {
        self.queued
            .get(item_type)
            .into_iter()
            .flatten()
            .filter(|(_, kind)| **kind == OperationKind::Delete)
            .map(|(item, _)| item)
    }

    /// Whether a Delete of `item` waits for room.
    pub fn queues_delete_of(&self, item: &ItemRef) -> bool {
        self.queued
            .get(&**item.item_type())
            .and_then(|queued| queued.get(item))
            .is_some_and(|kind| *kind == OperationKind::Delete)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> ItemRef {
        ItemRef::new("t", name)
    }

    /// The queued items of `item_type`, in identity order.
    fn queued(room: &Room, item_type: &str) -> Vec<ItemRef> {
        room.queued
            .get(item_type)
            .into_iter()
            .flat_map(|queued| queued.keys().cloned())
            .collect()
    }

    const ONE_AT_A_TIME: Limits = Limits {
        per_type: 1,
        per_tenant: 0,
    };

    fn with_session() -> Room {
        let mut room = Room::default();
        room.set_running([("t".to_owned(), Running::default())]);
        room
    }

    #[test]
    fn a_type_runs_at_most_its_limit_and_queues_the_rest_in_identity_order() {
        let mut room = with_session();
        assert!(room.admit(&t("b"), OperationKind::Create, ONE_AT_A_TIME));
        assert!(!room.admit(&t("c"), OperationKind::Create, ONE_AT_A_TIME));
        assert!(!room.admit(&t("a"), OperationKind::Create, ONE_AT_A_TIME));
        assert_eq!(room.running(), 1);
        assert_eq!(room.take_queued(|_| ONE_AT_A_TIME), vec![]);
        room.set_running([("t".to_owned(), Running::default())]);
        assert_eq!(
            room.take_queued(|_| ONE_AT_A_TIME),
            vec![(t("a"), OperationKind::Create)]
        );
        assert_eq!(queued(&room, "t"), vec![t("c")]);
    }

    #[test]
    fn an_item_dispatched_by_another_pass_leaves_the_queue() {
        // Simulator seed 1239: `b` stayed queued after it was dispatched;
        // when room freed it was taken again instead of `c`, which then
        // waited for ever.
        let mut room = with_session();
        assert!(room.admit(&t("a"), OperationKind::Create, ONE_AT_A_TIME));
        assert!(!room.admit(&t("b"), OperationKind::Create, ONE_AT_A_TIME));
        assert!(!room.admit(&t("c"), OperationKind::Create, ONE_AT_A_TIME));
        room.set_running([("t".to_owned(), Running::default())]);
        // A pass seeded otherwise dispatches `b` directly.
        assert!(room.admit(&t("b"), OperationKind::Create, ONE_AT_A_TIME));
        room.set_running([("t".to_owned(), Running::default())]);
        assert_eq!(
            room.take_queued(|_| ONE_AT_A_TIME),
            vec![(t("c"), OperationKind::Create)]
        );
    }

    #[test]
    fn an_item_planned_again_leaves_the_queue_unless_it_still_waits_for_room() {
        // Simulator seed 10458: a queued item that no longer needed anything
        // took the room of the one whose Delete waited.
        let mut room = with_session();
        assert!(room.admit(&t("a"), OperationKind::Create, ONE_AT_A_TIME));
        assert!(!room.admit(&t("b"), OperationKind::Create, ONE_AT_A_TIME));
        assert!(!room.admit(&t("c"), OperationKind::Create, ONE_AT_A_TIME));
        assert_eq!(
            room.unqueue([&t("a"), &t("b"), &t("c")]),
            vec![
                (t("b"), OperationKind::Create),
                (t("c"), OperationKind::Create)
            ],
            "what was queued, not what ran"
        );
        // Planned again, only `c` is still ready.
        assert!(!room.admit(&t("c"), OperationKind::Create, ONE_AT_A_TIME));
        room.set_running([("t".to_owned(), Running::default())]);
        assert_eq!(
            room.take_queued(|_| ONE_AT_A_TIME),
            vec![(t("c"), OperationKind::Create)]
        );
    }

    #[test]
    fn the_tenant_limit_caps_every_type_together_and_reads_are_not_queued() {
        let mut room = Room::default();
        room.set_running([
            ("t".to_owned(), Running::default()),
            ("u".to_owned(), Running::default()),
        ]);
        let limits = Limits {
            per_type: 10,
            per_tenant: 2,
        };
        assert!(room.admit(&t("a"), OperationKind::Create, limits));
        assert!(room.admit(&ItemRef::new("u", "x"), OperationKind::Read, limits));
        assert!(!room.admit(&t("b"), OperationKind::Create, limits));
        assert!(!room.admit(&t("r"), OperationKind::Read, limits));
        assert_eq!(room.running(), 2);
        assert_eq!(room.running_work(), 1, "the READ is not work");
        assert_eq!(queued(&room, "t"), vec![t("b")]);
    }

    #[test]
    fn only_queued_deletes_are_listed_as_deletes() {
        let mut room = with_session();
        assert!(room.admit(&t("a"), OperationKind::Create, ONE_AT_A_TIME));
        assert!(!room.admit(&t("b"), OperationKind::Delete, ONE_AT_A_TIME));
        assert!(!room.admit(&t("c"), OperationKind::Modify, ONE_AT_A_TIME));
        assert_eq!(
            room.queued_deletes_of("t").collect::<Vec<_>>(),
            vec![&t("b")]
        );
        assert_eq!(queued(&room, "t").len(), 2);
    }

    #[test]
    fn a_type_without_a_session_has_no_room() {
        let mut room = Room::default();
        assert!(!room.has_room("t", ONE_AT_A_TIME));
        assert!(!room.admit(&t("a"), OperationKind::Create, ONE_AT_A_TIME));
        assert_eq!(room.take_queued(|_| ONE_AT_A_TIME), vec![]);
    }
}
