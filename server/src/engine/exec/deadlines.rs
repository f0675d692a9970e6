//! When operations in flight time out, and when an unanswered cancel makes
//! an outcome unknown: on the monotonic clock (DESIGN section 4), so that a
//! step of the wall clock neither times out nor extends every operation at
//! once. Times are milliseconds of the executor's monotonic clock; the
//! stored `started_at_ms` and `cancel_requested_at_ms` are for display.

use std::collections::HashMap;

use crate::graph::{CurrentGraph, InFlight, ItemRef};

/// The deadlines of one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    /// When the operation times out (its delivery plus its timeout).
    pub timeout_at: u64,
    /// When an unanswered cancel makes the outcome unknown.
    pub cancel_at: Option<u64>,
}

/// The deadlines of the operations in flight, by op id.
#[derive(Clone, Debug, Default)]
pub struct Deadlines {
    by_op: HashMap<String, Deadline>,
}

/// The operation `op_id` on `item`, if it runs at an agent (an UNKNOWN
/// item's lost operation waits for a report, not a clock).
fn running<'a>(current: &'a CurrentGraph, op_id: &str, item: &ItemRef) -> Option<&'a InFlight> {
    current
        .get(item)
        .filter(|entry| entry.operation_runs())
        .and_then(|entry| entry.in_flight.as_deref())
        .filter(|operation| operation.op_id == op_id)
}

impl Deadlines {
    /// Starts the clock of an operation just (re)delivered: it has its
    /// full timeout from `now` (the agent is told a duration).
    pub fn start(&mut self, op_id: &str, timeout_ms: u64, now: u64) {
        self.by_op.insert(
            op_id.to_owned(),
            Deadline {
                timeout_at: now.saturating_add(timeout_ms),
                cancel_at: None,
            },
        );
    }

    /// A cancel of `op_id` was sent at `now`: its outcome becomes unknown
    /// after `cancel_timeout_ms` without an answer.
    pub fn cancel_sent(&mut self, op_id: &str, now: u64, cancel_timeout_ms: u64) {
        if let Some(deadline) = self.by_op.get_mut(op_id) {
            deadline.cancel_at = Some(now.saturating_add(cancel_timeout_ms));
        }
    }

    /// Keeps one deadline per operation running on `current`: forgets
    /// those of operations that ended or whose outcome is unknown, and
    /// gives any running operation without one its full timeout from
    /// `now` (and its cancel timeout, if a cancel was asked).
    pub fn track<'a>(
        &mut self,
        operations: impl IntoIterator<Item = (&'a String, &'a ItemRef)> + Clone,
        current: &CurrentGraph,
        now: u64,
        cancel_timeout_ms: u64,
    ) {
        let live: HashMap<&str, &ItemRef> = operations
            .clone()
            .into_iter()
            .map(|(op_id, item)| (op_id.as_str(), item))
            .collect();
        self.by_op.retain(|op_id, _| {
            live.get(op_id.as_str())
                .is_some_and(|item| running(current, op_id, item).is_some())
        });
        for (op_id, item) in operations {
            if self.by_op.contains_key(op_id) {
                continue;
            }
            if let Some(operation) = running(current, op_id, item) {
                self.by_op.insert(
                    op_id.clone(),
                    Deadline {
                        timeout_at: now.saturating_add(operation.timeout_ms),
                        cancel_at: operation
                            .cancel_requested
                            .then(|| now.saturating_add(cancel_timeout_ms)),
                    },
                );
            }
        }
    }

    /// A progress report of `op_id` at `now`: it has its full timeout
    /// again from `now` (a cancel's deadline, if one was asked, stays).
    pub fn extend(&mut self, op_id: &str, timeout_ms: u64, now: u64) {
        if let Some(deadline) = self.by_op.get_mut(op_id) {
            deadline.timeout_at = deadline.timeout_at.max(now.saturating_add(timeout_ms));
        }
    }

    /// Forgets `op_id`'s deadlines.
    pub fn forget(&mut self, op_id: &str) {
        self.by_op.remove(op_id);
    }

    /// The deadline that matters for `operation` now: its cancel timeout
    /// once a cancel was asked, otherwise its timeout.
    fn due_at(&self, operation: &InFlight) -> Option<u64> {
        let deadline = self.by_op.get(&operation.op_id)?;
        if operation.cancel_requested {
            deadline.cancel_at
        } else {
            Some(deadline.timeout_at)
        }
    }

    /// The earliest deadline among the operations running on `current`.
    pub fn next<'a>(
        &self,
        operations: impl IntoIterator<Item = (&'a String, &'a ItemRef)>,
        current: &CurrentGraph,
    ) -> Option<u64> {
        operations
            .into_iter()
            .filter_map(|(op_id, item)| running(current, op_id, item))
            .filter_map(|operation| self.due_at(operation))
            .min()
    }

    /// The operations running on `current` that timed out by `now` (no
    /// cancel asked), in op id order of `operations`.
    pub fn timed_out<'a>(
        &self,
        operations: impl IntoIterator<Item = (&'a String, &'a ItemRef)>,
        current: &CurrentGraph,
        now: u64,
    ) -> Vec<ItemRef> {
        operations
            .into_iter()
            .filter(|(op_id, item)| {
                running(current, op_id, item).is_some_and(|operation| {
                    !operation.cancel_requested
                        && self
                            .by_op
                            .get(op_id.as_str())
                            .is_some_and(|deadline| deadline.timeout_at <= now)
                })
            })
            .map(|(_, item)| item.clone())
            .collect()
    }

    /// The operations running on `current` whose cancel went unanswered
    /// past its timeout by `now`.
    pub fn cancels_expired<'a>(
        &self,
        operations: impl IntoIterator<Item = (&'a String, &'a ItemRef)>,
        current: &CurrentGraph,
        now: u64,
    ) -> Vec<ItemRef> {
        operations
            .into_iter()
            .filter(|(op_id, item)| {
                running(current, op_id, item).is_some_and(|operation| {
                    operation.cancel_requested
                        && self
                            .by_op
                            .get(op_id.as_str())
                            .and_then(|deadline| deadline.cancel_at)
                            .is_some_and(|at| at <= now)
                })
            })
            .map(|(_, item)| item.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use crate::graph::{CurrentItem, Item, ItemState, OperationKind};

    fn running_create(op_id: &str, timeout_ms: u64) -> CurrentItem {
        CurrentItem::creating(InFlight::new(
            OperationKind::Create,
            op_id.into(),
            1,
            1,
            0,
            timeout_ms,
        ))
    }

    #[test]
    fn an_operation_times_out_its_timeout_after_delivery_and_a_cancel_after_its_own() {
        let a = ItemRef::new("t", "a");
        let mut current = CurrentGraph::default();
        current.insert(a.clone(), running_create("op-1", 100));
        let operations = BTreeMap::from([("op-1".to_string(), a.clone())]);
        let mut deadlines = Deadlines::default();
        deadlines.start("op-1", 100, 1_000);
        assert_eq!(deadlines.next(&operations, &current), Some(1_100));
        assert!(deadlines.timed_out(&operations, &current, 1_099).is_empty());
        assert_eq!(
            deadlines.timed_out(&operations, &current, 1_100),
            vec![a.clone()]
        );

        let mut cancelled = running_create("op-1", 100);
        if let Some(operation) = cancelled.in_flight.as_mut() {
            operation.cancel_requested = true;
        }
        current.insert(a.clone(), cancelled);
        deadlines.cancel_sent("op-1", 1_050, 500);
        assert_eq!(deadlines.next(&operations, &current), Some(1_550));
        assert!(deadlines.timed_out(&operations, &current, 2_000).is_empty());
        assert_eq!(
            deadlines.cancels_expired(&operations, &current, 1_550),
            vec![a]
        );
    }

    #[test]
    fn tracking_forgets_ended_and_unknown_operations_and_clocks_new_ones_from_now() {
        let a = ItemRef::new("t", "a");
        let b = ItemRef::new("t", "b");
        let mut current = CurrentGraph::default();
        current.insert(a.clone(), running_create("op-a", 100));
        let mut unknown = running_create("op-b", 100);
        unknown.state = ItemState::Unknown;
        current.insert(b.clone(), unknown);
        let operations = BTreeMap::from([
            ("op-a".to_string(), a.clone()),
            ("op-b".to_string(), b.clone()),
        ]);
        let mut deadlines = Deadlines::default();
        deadlines.start("op-b", 100, 0);
        deadlines.track(&operations, &current, 5_000, 60_000);
        assert_eq!(deadlines.next(&operations, &current), Some(5_100));
        current.insert(
            a.clone(),
            CurrentItem::created(Arc::new(Item::new("t", "a", Default::default())), 1),
        );
        deadlines.track(&operations, &current, 6_000, 60_000);
        assert_eq!(deadlines.next(&operations, &current), None);
    }

    #[test]
    fn a_wall_clock_step_does_not_move_a_deadline() {
        // The deadlines know only the monotonic clock: whatever the wall
        // clock does, an operation delivered at 0 with 10 s times out at
        // 10 s of monotonic time, not before.
        let a = ItemRef::new("t", "a");
        let mut current = CurrentGraph::default();
        current.insert(a.clone(), running_create("op", 10_000));
        let operations = BTreeMap::from([("op".to_string(), a)]);
        let mut deadlines = Deadlines::default();
        deadlines.start("op", 10_000, 0);
        assert!(deadlines.timed_out(&operations, &current, 9_999).is_empty());
        assert_eq!(deadlines.timed_out(&operations, &current, 10_000).len(), 1);
    }
}
