//! Plans as proto messages, bounded by [`PLAN_LIMIT`].

use std::sync::Arc;

use imbl::OrdMap;
use reconciled_proto::v1;

use crate::engine::plan::{Plan, WaitingItem};
use crate::graph::{CurrentItem, IntendedItem, ItemRef};

use super::items::item_ref_to_proto;
use super::status::{item_status, operation_kind_to_proto};

pub use reconciled_proto::PLAN_LIMIT;

/// Converts a plan, listing at most `limit` operations (usually
/// [`PLAN_LIMIT`]) and at most `limit` waiting items.
///
/// Each listed operation keeps its index in the plan, and its `after` holds
/// all of [`Plan::predecessors`] (so the wait of Creates for same-type
/// Deletes is visible). The counts cover every operation, `blocked` counts
/// every waiting item, and `truncated` is set when anything was left out.
/// Waiting items carry only what the plan knows (identity, pending
/// operation, reason, blocked by); [`plan_to_proto_with_items`] adds their
/// state.
pub fn plan_to_proto(plan: &Plan, limit: usize) -> v1::Plan {
    plan_with_waiting_status(plan, limit, plan.waiting.len(), |waiting| {
        item_status(&waiting.item, None, None, Some(waiting))
    })
}

/// Like [`plan_to_proto`], with each waiting item's full status taken from
/// the items the plan was made from (e.g. a tenant snapshot's maps, or
/// `IntendedGraph::snapshot()` / `CurrentGraph::snapshot()`).
pub fn plan_to_proto_with_items(
    plan: &Plan,
    limit: usize,
    intended: &OrdMap<ItemRef, Arc<IntendedItem>>,
    current: &OrdMap<ItemRef, Arc<CurrentItem>>,
) -> v1::Plan {
    plan_to_proto_counting_tenant_waiting(plan, limit, intended, current, 0)
}

/// Like [`plan_to_proto_with_items`], with `blocked` counting every item
/// of the tenant that waits (`waiting_in_tenant`), not only those the
/// plan lists: the reply to a SubmitIntent that changed the intent. Its
/// pass plans only what the change reaches, so its list holds those, and
/// the count alone would read as if nothing else waited (a dry run or an
/// unchanged submission plans the whole tenant and counts them all).
/// `truncated` says that the list is partial.
pub fn plan_to_proto_counting_tenant_waiting(
    plan: &Plan,
    limit: usize,
    intended: &OrdMap<ItemRef, Arc<IntendedItem>>,
    current: &OrdMap<ItemRef, Arc<CurrentItem>>,
    waiting_in_tenant: usize,
) -> v1::Plan {
    let waiting = waiting_in_tenant.max(plan.waiting.len());
    plan_with_waiting_status(plan, limit, waiting, |waiting| {
        item_status(
            &waiting.item,
            current.get(&waiting.item).map(AsRef::as_ref),
            intended.get(&waiting.item).map(AsRef::as_ref),
            Some(waiting),
        )
    })
}

/// `waiting` counts the waiting items (at least those `plan` lists).
fn plan_with_waiting_status(
    plan: &Plan,
    limit: usize,
    waiting: usize,
    status_of: impl Fn(&WaitingItem) -> v1::ItemStatus,
) -> v1::Plan {
    let (creates, modifies, deletes) = plan.counts();
    v1::Plan {
        operations: (0..plan.operations.len().min(limit))
            .map(|index| planned_operation_to_proto(plan, index))
            .collect(),
        creates: saturating_u32(creates),
        modifies: saturating_u32(modifies),
        deletes: saturating_u32(deletes),
        blocked: saturating_u32(waiting),
        truncated: plan.operations.len() > limit || waiting > plan.waiting.len().min(limit),
        waiting: plan.waiting.iter().take(limit).map(status_of).collect(),
    }
}

/// Operation `index` of `plan`; the caller keeps `index` in range.
fn planned_operation_to_proto(plan: &Plan, index: usize) -> v1::PlannedOperation {
    let operation = &plan.operations[index];
    let mut after: Vec<u32> = plan.predecessors(index).map(saturating_u32).collect();
    after.sort_unstable();
    after.dedup();
    v1::PlannedOperation {
        index: saturating_u32(index),
        item: Some(item_ref_to_proto(&operation.item)),
        kind: operation_kind_to_proto(operation.kind).into(),
        after,
        recreate: operation.recreate,
        ask_needs_recreate: operation.ask_needs_recreate,
        target_generation: operation.target_generation,
    }
}

fn saturating_u32(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use crate::engine::plan::{BlockedBy, PlannedOperation, WaitReason};
    use crate::graph::{ItemState, OperationKind};
    use crate::wire::testkit::in_flight;

    fn operation(name: &str, kind: OperationKind, after: Vec<usize>) -> PlannedOperation {
        PlannedOperation {
            item: ItemRef::new("t", name),
            kind,
            after,
            recreate: false,
            ask_needs_recreate: false,
            target_generation: 1,
        }
    }

    fn waiting(name: &str) -> WaitingItem {
        WaitingItem {
            item: ItemRef::new("t", name),
            operation: OperationKind::Create,
            reason: WaitReason::Dependency,
            blocked_by: vec![BlockedBy {
                item: ItemRef::new("t", "missing"),
                why: "missing".into(),
            }],
        }
    }

    fn sample_plan() -> Plan {
        Plan {
            operations: vec![
                operation("old", OperationKind::Delete, vec![]),
                operation("x", OperationKind::Modify, vec![]),
                operation("new", OperationKind::Create, vec![1]),
                operation("other", OperationKind::Create, vec![]),
            ],
            waiting: vec![waiting("w1"), waiting("w2")],
            type_barriers: BTreeMap::from([(Arc::from("t"), vec![0])]),
            ..Plan::default()
        }
    }

    #[test]
    fn plans_list_operations_with_type_barriers_in_after() {
        let plan = plan_to_proto(&sample_plan(), PLAN_LIMIT);
        assert_eq!(plan.operations.len(), 4);
        assert_eq!(plan.operations[2].index, 2);
        assert_eq!(plan.operations[2].after, [0, 1]);
        assert_eq!(plan.operations[3].after, [0]);
        assert!(plan.operations[0].after.is_empty());
        assert_eq!((plan.creates, plan.modifies, plan.deletes), (2, 1, 1));
        assert_eq!(plan.blocked, 2);
        assert!(!plan.truncated);
        assert_eq!(plan.waiting.len(), 2);
        assert_eq!(plan.waiting[0].reason(), v1::WaitReason::Dependency);
        assert_eq!(plan.waiting[0].state(), v1::ItemState::Pending);
        assert_eq!(plan.waiting[0].blocked_by[0].why, "missing");
    }

    #[test]
    fn truncated_plans_keep_counts_over_every_operation() {
        let plan = plan_to_proto(&sample_plan(), 1);
        assert_eq!(plan.operations.len(), 1);
        assert_eq!(plan.waiting.len(), 1);
        assert_eq!((plan.creates, plan.modifies, plan.deletes), (2, 1, 1));
        assert_eq!(plan.blocked, 2);
        assert!(plan.truncated);
    }

    #[test]
    fn plans_with_graphs_show_the_state_of_waiting_items() {
        let mut current = crate::graph::CurrentGraph::default();
        let mut failed = CurrentItem::creating(in_flight(OperationKind::Create));
        failed.state = ItemState::Failed;
        failed.in_flight = None;
        current.insert(ItemRef::new("t", "w1"), failed);
        let plan = plan_to_proto_with_items(
            &sample_plan(),
            PLAN_LIMIT,
            &crate::graph::IntendedGraph::default().snapshot(),
            &current.snapshot(),
        );
        assert_eq!(plan.waiting[0].state(), v1::ItemState::Failed);
        assert_eq!(plan.waiting[1].state(), v1::ItemState::Pending);
    }
}
