//! State transitions of current items when operations start and finish.
//!
//! Pure functions over the current graph, shared by the executor (which
//! commits their result) and by the planner's tests (which simulate agents).

use std::sync::Arc;

use crate::graph::{
    CurrentGraph, CurrentItem, InFlight, IntendedGraph, ItemRef, ItemState, OperationError,
    OperationKind, Properties,
};

use super::plan::{ForgetReason, Plan};

/// What an operation that ended reported.
#[derive(Clone, Debug, PartialEq)]
pub enum Completion {
    /// Applied; the agent may report observed properties.
    Done {
        /// Properties the agent observed after applying.
        observed: Option<Properties>,
    },
    /// Failed; `retry_at_ms` is when a retry may start (computed by the
    /// caller from the type's retry policy), `None` for terminal failures.
    Failed {
        /// The agent's error.
        error: OperationError,
        /// Earliest next attempt (unix milliseconds).
        retry_at_ms: Option<u64>,
    },
}

/// Marks `item` as running `operation`: state Creating/Modifying/Deleting and
/// the in-flight record. The target of a Create or Modify is the intended
/// value at `target_generation`.
pub fn begin_operation(
    current: &mut CurrentGraph,
    intended: &IntendedGraph,
    item: &ItemRef,
    in_flight: InFlight,
) {
    let target = match in_flight.kind {
        OperationKind::Create | OperationKind::Modify => {
            intended.get(item).map(|entry| entry.item.clone())
        }
        OperationKind::Delete | OperationKind::Read => None,
    };
    let in_flight = InFlight {
        target,
        ..in_flight
    };
    let state = match in_flight.kind {
        OperationKind::Create => ItemState::Creating,
        OperationKind::Modify => ItemState::Modifying,
        OperationKind::Delete => ItemState::Deleting,
        OperationKind::Read => ItemState::Created,
    };
    let entry = match current.get(item) {
        Some(existing) => CurrentItem {
            state: if in_flight.kind == OperationKind::Read {
                existing.state
            } else {
                state
            },
            in_flight: Some(in_flight),
            ..(**existing).clone()
        },
        None => CurrentItem::creating(in_flight),
    };
    current.insert(item.clone(), entry);
}

/// Records the final outcome of the operation in flight on `item`.
/// Returns `false` (and changes nothing) if no operation is in flight.
pub fn complete_operation(
    current: &mut CurrentGraph,
    item: &ItemRef,
    completion: Completion,
) -> bool {
    let Some(existing) = current.get(item).cloned() else {
        return false;
    };
    let Some(operation) = existing.in_flight.clone() else {
        return false;
    };
    match completion {
        Completion::Done { observed } => {
            complete_successfully(current, item, &existing, &operation, observed)
        }
        Completion::Failed { error, retry_at_ms } => {
            let failed = CurrentItem {
                state: ItemState::Failed,
                last_operation: Some(operation.kind),
                last_error: Some(error),
                attempts: existing.attempts.saturating_add(1),
                next_attempt_at_ms: retry_at_ms,
                failed_generation: operation.target_generation,
                in_flight: None,
                ..(*existing).clone()
            };
            current.insert(item.clone(), failed);
        }
    }
    true
}

fn complete_successfully(
    current: &mut CurrentGraph,
    item: &ItemRef,
    existing: &CurrentItem,
    operation: &InFlight,
    observed: Option<Properties>,
) {
    match operation.kind {
        OperationKind::Delete => {
            current.remove(item);
        }
        OperationKind::Create | OperationKind::Modify => {
            let Some(target) = operation.target.clone() else {
                current.remove(item);
                return;
            };
            let created_now = operation.kind == OperationKind::Create;
            let mut entry = CurrentItem::created(target.clone(), operation.target_generation);
            entry.last_operation = Some(operation.kind);
            entry.observed = observed.map(Arc::new);
            if created_now {
                entry.modifications = 0;
            } else {
                entry.modifications = existing.modifications.saturating_add(1);
                entry.dependency_marks = existing.dependency_marks.clone();
            }
            for dependency in target
                .dependencies
                .iter()
                .filter(|d| d.recreate_when_modified)
            {
                let counter = current
                    .get(&dependency.requires)
                    .map_or(0, |required| required.modifications);
                if created_now || !entry.dependency_marks.contains_key(&dependency.requires) {
                    entry
                        .dependency_marks
                        .insert(dependency.requires.clone(), counter);
                }
            }
            entry.dependency_marks.retain(|required, _| {
                target
                    .dependency_on(required)
                    .is_some_and(|d| d.recreate_when_modified)
            });
            current.insert(item.clone(), entry);
        }
        OperationKind::Read => {
            let mut entry = existing.clone();
            entry.in_flight = None;
            entry.observed = observed.map(Arc::new);
            current.insert(item.clone(), entry);
        }
    }
}

/// New values of current items: `None` removes the item.
pub type CurrentUpdates = Vec<(ItemRef, Option<CurrentItem>)>;

/// What a plan decides without any operation, as updates of current items:
/// drops (items gone with an external dependency, or never created) and
/// settles (failed items that need nothing any more). Computing them apart
/// from applying them lets the owner commit first and change memory after.
pub fn bookkeeping_updates(current: &CurrentGraph, plan: &Plan) -> CurrentUpdates {
    let mut updates: CurrentUpdates = Vec::new();
    for (item, reason) in &plan.forget {
        match reason {
            ForgetReason::DeletedWithExternal | ForgetReason::NeverCreated => {
                updates.push((item.clone(), None));
            }
        }
    }
    for item in &plan.settle {
        if let Some(existing) = current.get(item) {
            let settled = CurrentItem {
                state: ItemState::Created,
                last_error: None,
                attempts: 0,
                next_attempt_at_ms: None,
                ..(**existing).clone()
            };
            updates.push((item.clone(), Some(settled)));
        }
    }
    updates
}

/// Applies updates computed by [`bookkeeping_updates`] (or any other source).
pub fn apply_updates(current: &mut CurrentGraph, updates: CurrentUpdates) {
    for (item, value) in updates {
        match value {
            Some(value) => {
                current.insert(item, value);
            }
            None => {
                current.remove(&item);
            }
        }
    }
}

/// Applies what a plan decides without any operation (see
/// [`bookkeeping_updates`]).
pub fn apply_bookkeeping(current: &mut CurrentGraph, plan: &Plan) {
    let updates = bookkeeping_updates(current, plan);
    apply_updates(current, updates);
}
