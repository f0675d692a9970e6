//! Turns the planner's schedules into a [`Plan`]: operations in a
//! deterministic topological order, waiting items, cancels, drops.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::need::Need;
use super::planner::{Id, OperationKey, Planner, Schedule};
use super::{ForgetReason, Plan, PlanEnvironment, PlannedOperation, WaitingItem};
use crate::graph::{ItemRef, ItemState, OperationKind};

/// An operation before ordering.
struct Draft {
    key: OperationKey,
    item: ItemRef,
    after: Vec<OperationKey>,
    recreate: bool,
    ask_needs_recreate: bool,
    target_generation: u64,
}

fn waiting_item(item: &ItemRef, schedule: &Schedule) -> Option<WaitingItem> {
    match schedule {
        Schedule::Waiting {
            kind,
            reason,
            blocked_by,
            ..
        } => Some(WaitingItem {
            item: item.clone(),
            operation: *kind,
            reason: *reason,
            blocked_by: blocked_by.clone(),
        }),
        Schedule::Ready { .. } | Schedule::NotNeeded => None,
    }
}

/// Builds the plan from a finished planning run.
pub(super) fn assemble<E: PlanEnvironment>(planner: &mut Planner<'_, E>) -> Plan {
    let mut plan = Plan {
        examined: planner.examined.len(),
        ..Plan::default()
    };
    let mut drafts = Vec::new();
    let mut waiting: Vec<WaitingItem> = Vec::new();
    let mut unconverged: Vec<ItemRef> = Vec::new();

    let examined: Vec<Id> = planner.examined.clone();
    for id in examined {
        let need = planner.need(id);
        let node = planner.node(id);
        let item = node.item.clone();
        let intended_generation = node.intended.map(|entry| entry.generation);
        let recreate = intended_generation.is_some() && node.deleting;
        let mut waits = None;
        if let Some(schedule) = &node.delete_schedule {
            if let Schedule::Ready { kind, after } = schedule {
                drafts.push(Draft {
                    key: (id, *kind),
                    item: item.clone(),
                    after: after.clone(),
                    recreate,
                    ask_needs_recreate: false,
                    target_generation: if recreate {
                        intended_generation.unwrap_or(0)
                    } else {
                        0
                    },
                });
            }
            waits = waiting_item(&item, schedule);
        }
        if let Some(schedule) = &node.change_schedule {
            if let Schedule::Ready { kind, after } = schedule {
                drafts.push(Draft {
                    key: (id, *kind),
                    item: item.clone(),
                    after: after.clone(),
                    recreate,
                    ask_needs_recreate: *kind == OperationKind::Modify
                        && matches!(need, Need::Modify { ask: true }),
                    target_generation: intended_generation.unwrap_or(0),
                });
            }
            if waits.is_none() {
                waits = waiting_item(&item, schedule);
            }
        }
        if let Some(waits) = waits {
            waiting.push(waits);
        }
        classify_bookkeeping(planner, id, need, &mut plan, &mut unconverged);
    }

    let (operations, type_barriers) = order(drafts);
    unconverged.extend(operations.iter().map(|operation| operation.item.clone()));
    unconverged.extend(waiting.iter().map(|waiting| waiting.item.clone()));
    waiting.sort_by(|a, b| a.item.cmp(&b.item));
    plan.operations = operations;
    plan.type_barriers = type_barriers;
    plan.waiting = waiting;
    plan.unconverged = unconverged.into_iter().collect::<BTreeSet<_>>();
    plan
}

/// Cancels, drops, settles, and the unconverged set for one item.
fn classify_bookkeeping<E: PlanEnvironment>(
    planner: &Planner<'_, E>,
    id: Id,
    need: Need,
    plan: &mut Plan,
    unconverged: &mut Vec<ItemRef>,
) {
    let node = planner.node(id);
    let item = &node.item;
    let intended = node.intended;
    let Some(current) = node.current else {
        return;
    };
    if node.dropped {
        plan.forget
            .push((item.clone(), ForgetReason::DeletedWithExternal));
        unconverged.push(item.clone());
        return;
    }
    if current.is_busy() {
        unconverged.push(item.clone());
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
        && !node.deleting
    {
        plan.settle.push(item.clone());
        unconverged.push(item.clone());
    }
}

fn order(drafts: Vec<Draft>) -> (Vec<PlannedOperation>, BTreeMap<Arc<str>, Vec<usize>>) {
    let index_of: FxHashMap<OperationKey, usize> = drafts
        .iter()
        .enumerate()
        .map(|(index, draft)| (draft.key, index))
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
                    .entry(draft.item.item_type.clone())
                    .or_default() += 1
            }
            OperationKind::Create => {
                types_with_creates.insert(draft.item.item_type.clone());
            }
            _ => {}
        }
    }
    let mut creates_held_by_type: FxHashMap<Arc<str>, Vec<usize>> = FxHashMap::default();

    // Ties are broken by (item, kind): sort once, then order by rank.
    let mut by_identity: Vec<usize> = (0..drafts.len()).collect();
    by_identity.sort_unstable_by(|&a, &b| {
        (&drafts[a].item, drafts[a].key.1).cmp(&(&drafts[b].item, drafts[b].key.1))
    });
    let mut ranks = vec![0usize; drafts.len()];
    for (rank, &index) in by_identity.iter().enumerate() {
        ranks[index] = rank;
    }
    let rank = |index: usize| Reverse((ranks[index], index));
    let mut ready: BinaryHeap<Reverse<(usize, usize)>> = BinaryHeap::new();
    let release = |index: usize,
                   ready: &mut BinaryHeap<Reverse<(usize, usize)>>,
                   held: &mut FxHashMap<Arc<str>, Vec<usize>>,
                   deletes_left: &FxHashMap<Arc<str>, usize>| {
        let draft = &drafts[index];
        let item_type = &draft.item.item_type;
        if draft.key.1 == OperationKind::Create
            && deletes_left.get(item_type).copied().unwrap_or(0) > 0
        {
            held.entry(item_type.clone()).or_default().push(index);
        } else {
            ready.push(rank(index));
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
    while let Some(Reverse((_, index))) = ready.pop() {
        new_index[index] = emitted.len();
        emitted.push(index);
        if drafts[index].key.1 == OperationKind::Delete {
            let item_type = drafts[index].item.item_type.clone();
            if let Some(left) = deletes_left_by_type.get_mut(&item_type) {
                *left -= 1;
                if *left == 0 {
                    for held in creates_held_by_type.remove(&item_type).unwrap_or_default() {
                        ready.push(rank(held));
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
            && types_with_creates.contains(&draft.item.item_type)
        {
            type_barriers
                .entry(draft.item.item_type.clone())
                .or_default()
                .push(operations.len());
        }
        operations.push(PlannedOperation {
            item: draft.item.clone(),
            kind: draft.key.1,
            after,
            recreate: draft.recreate,
            ask_needs_recreate: draft.ask_needs_recreate,
            target_generation: draft.target_generation,
        });
    }
    (operations, type_barriers)
}
