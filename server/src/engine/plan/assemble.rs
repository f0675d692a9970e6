//! Turns the planner's schedules into a [`Plan`]: operations in a
//! deterministic topological order, waiting items, cancels, drops.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::need::Need;
use super::planner::{OperationKey, Planner, Schedule};
use super::{ForgetReason, Plan, PlanEnvironment, PlannedOperation, WaitingItem};
use crate::graph::{ItemRef, ItemState, OperationKind};

/// An operation before ordering.
struct Draft {
    key: OperationKey,
    after: Vec<OperationKey>,
    recreate: bool,
    ask_needs_recreate: bool,
    target_generation: u64,
}

/// Builds the plan from a finished planning run.
pub(super) fn assemble<E: PlanEnvironment>(planner: &mut Planner<'_, E>) -> Plan {
    let mut plan = Plan {
        examined: planner.examined.len(),
        ..Plan::default()
    };
    let mut drafts = Vec::new();
    let mut waiting: BTreeMap<ItemRef, WaitingItem> = BTreeMap::new();

    let examined: Vec<ItemRef> = planner.examined.iter().cloned().collect();
    for item in &examined {
        let intended_generation = planner.intended.get(item).map(|entry| entry.generation);
        let recreate = intended_generation.is_some() && planner.deleting.contains(item);
        match planner.delete_schedules.get(item) {
            Some(Schedule::Ready { kind, after }) => drafts.push(Draft {
                key: (item.clone(), *kind),
                after: after.clone(),
                recreate,
                ask_needs_recreate: false,
                target_generation: if recreate {
                    intended_generation.unwrap_or(0)
                } else {
                    0
                },
            }),
            Some(Schedule::Waiting {
                kind,
                reason,
                blocked_by,
                ..
            }) => {
                waiting.insert(
                    item.clone(),
                    WaitingItem {
                        item: item.clone(),
                        operation: *kind,
                        reason: *reason,
                        blocked_by: blocked_by.clone(),
                    },
                );
            }
            Some(Schedule::NotNeeded) | None => {}
        }
        let need = planner.need(item);
        match planner.change_schedules.get(item) {
            Some(Schedule::Ready { kind, after }) => drafts.push(Draft {
                key: (item.clone(), *kind),
                after: after.clone(),
                recreate,
                ask_needs_recreate: *kind == OperationKind::Modify
                    && matches!(need, Need::Modify { ask: true }),
                target_generation: intended_generation.unwrap_or(0),
            }),
            Some(Schedule::Waiting {
                kind,
                reason,
                blocked_by,
                ..
            }) => {
                waiting.entry(item.clone()).or_insert_with(|| WaitingItem {
                    item: item.clone(),
                    operation: *kind,
                    reason: *reason,
                    blocked_by: blocked_by.clone(),
                });
            }
            Some(Schedule::NotNeeded) | None => {}
        }
        classify_bookkeeping(planner, item, need, &mut plan);
    }

    let (operations, type_barriers) = order(drafts);
    plan.operations = operations;
    plan.type_barriers = type_barriers;
    plan.waiting = waiting.into_values().collect();
    for operation in &plan.operations {
        plan.unconverged.insert(operation.item.clone());
    }
    for waiting in &plan.waiting {
        plan.unconverged.insert(waiting.item.clone());
    }
    plan
}

/// Cancels, drops, settles, and the unconverged set for one item.
fn classify_bookkeeping<E: PlanEnvironment>(
    planner: &Planner<'_, E>,
    item: &ItemRef,
    need: Need,
    plan: &mut Plan,
) {
    let intended = planner.intended.get(item);
    let Some(current) = planner.current.get(item) else {
        return;
    };
    if planner.dropped.contains(item) {
        plan.forget
            .push((item.clone(), ForgetReason::DeletedWithExternal));
        plan.unconverged.insert(item.clone());
        return;
    }
    if current.is_busy() {
        plan.unconverged.insert(item.clone());
    }
    if let Some(operation) = &current.in_flight {
        let superseded = matches!(
            operation.kind,
            OperationKind::Create | OperationKind::Modify
        ) && operation.target_generation
            != intended.map_or(0, |entry| entry.generation);
        if superseded && !operation.cancel_requested {
            plan.cancel.push(item.clone());
        }
        return;
    }
    if current.is_busy() {
        return;
    }
    let operated_on = intended.is_some_and(|entry| !entry.item.external);
    if !operated_on && intended.is_none() && !current.may_exist() {
        plan.forget.push((item.clone(), ForgetReason::NeverCreated));
        return;
    }
    if need == Need::Nothing
        && current.state == ItemState::Failed
        && current.may_exist()
        && !planner.deleting.contains(item)
    {
        plan.settle.push(item.clone());
        plan.unconverged.insert(item.clone());
    }
}

/// Kahn's algorithm with a min-queue on (item, kind): independent operations
/// come out in identity order. Creates of a type also wait for every Delete
/// of that type in the plan.
fn order(drafts: Vec<Draft>) -> (Vec<PlannedOperation>, BTreeMap<Arc<str>, Vec<usize>>) {
    let index_of: FxHashMap<OperationKey, usize> = drafts
        .iter()
        .enumerate()
        .map(|(index, draft)| (draft.key.clone(), index))
        .collect();
    let mut successors: Vec<Vec<usize>> = vec![Vec::new(); drafts.len()];
    let mut pending_predecessors: Vec<usize> = vec![0; drafts.len()];
    let mut resolved_after: Vec<Vec<usize>> = Vec::with_capacity(drafts.len());
    for (index, draft) in drafts.iter().enumerate() {
        let mut after: Vec<usize> = draft
            .after
            .iter()
            .filter_map(|key| index_of.get(key).copied())
            .collect();
        after.sort_unstable();
        after.dedup();
        for &predecessor in &after {
            successors[predecessor].push(index);
        }
        pending_predecessors[index] = after.len();
        resolved_after.push(after);
    }

    let mut deletes_left_by_type: FxHashMap<Arc<str>, usize> = FxHashMap::default();
    let mut types_with_creates: BTreeSet<Arc<str>> = BTreeSet::new();
    for draft in &drafts {
        match draft.key.1 {
            OperationKind::Delete => {
                *deletes_left_by_type
                    .entry(draft.key.0.item_type.clone())
                    .or_default() += 1
            }
            OperationKind::Create => {
                types_with_creates.insert(draft.key.0.item_type.clone());
            }
            _ => {}
        }
    }
    let mut creates_held_by_type: FxHashMap<Arc<str>, Vec<usize>> = FxHashMap::default();

    let rank = |index: usize| (drafts[index].key.0.clone(), drafts[index].key.1, index);
    let mut ready: BTreeSet<(ItemRef, OperationKind, usize)> = BTreeSet::new();
    let release = |index: usize,
                   ready: &mut BTreeSet<(ItemRef, OperationKind, usize)>,
                   held: &mut FxHashMap<Arc<str>, Vec<usize>>,
                   deletes_left: &FxHashMap<Arc<str>, usize>| {
        let draft = &drafts[index];
        let item_type = &draft.key.0.item_type;
        if draft.key.1 == OperationKind::Create
            && deletes_left.get(item_type).copied().unwrap_or(0) > 0
        {
            held.entry(item_type.clone()).or_default().push(index);
        } else {
            ready.insert(rank(index));
        }
    };
    for (index, pending) in pending_predecessors.iter().enumerate() {
        if *pending == 0 {
            release(
                index,
                &mut ready,
                &mut creates_held_by_type,
                &deletes_left_by_type,
            );
        }
    }

    let mut new_index: Vec<usize> = vec![usize::MAX; drafts.len()];
    let mut emitted: Vec<usize> = Vec::with_capacity(drafts.len());
    while let Some(next) = ready.pop_first() {
        let index = next.2;
        new_index[index] = emitted.len();
        emitted.push(index);
        if drafts[index].key.1 == OperationKind::Delete {
            let item_type = drafts[index].key.0.item_type.clone();
            if let Some(left) = deletes_left_by_type.get_mut(&item_type) {
                *left -= 1;
                if *left == 0 {
                    for held in creates_held_by_type.remove(&item_type).unwrap_or_default() {
                        ready.insert(rank(held));
                    }
                }
            }
        }
        for &successor in &successors[index] {
            pending_predecessors[successor] -= 1;
            if pending_predecessors[successor] == 0 {
                release(
                    successor,
                    &mut ready,
                    &mut creates_held_by_type,
                    &deletes_left_by_type,
                );
            }
        }
    }

    let mut type_barriers: BTreeMap<Arc<str>, Vec<usize>> = BTreeMap::new();
    let mut operations = Vec::with_capacity(emitted.len());
    for &old in &emitted {
        let draft = &drafts[old];
        let mut after: Vec<usize> = resolved_after[old].iter().map(|&p| new_index[p]).collect();
        after.sort_unstable();
        if draft.key.1 == OperationKind::Delete
            && types_with_creates.contains(&draft.key.0.item_type)
        {
            type_barriers
                .entry(draft.key.0.item_type.clone())
                .or_default()
                .push(operations.len());
        }
        operations.push(PlannedOperation {
            item: draft.key.0.clone(),
            kind: draft.key.1,
            after,
            recreate: draft.recreate,
            ask_needs_recreate: draft.ask_needs_recreate,
            target_generation: draft.target_generation,
        });
    }
    (operations, type_barriers)
}
