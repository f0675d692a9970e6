//! State transitions of current items when operations start and finish.
//!
//! Pure functions over the current graph, shared by the executor (which
//! commits their result) and by the planner's tests (which simulate agents).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::graph::{
    CurrentGraph, CurrentItem, InFlight, IntendedGraph, Item, ItemRef, ItemState, OperationError,
    OperationKind, Properties, RetryOf,
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
    /// Not a failure: ask again at `retry_at_ms` without counting an attempt.
    Wait {
        /// Earliest next attempt (unix milliseconds).
        retry_at_ms: u64,
    },
    /// The outcome is not known (the agent went away, the server restarted).
    Lost,
    /// The answer to a READ: what the item actually is. A difference on a
    /// property the intent sets is drift: the applied value takes the
    /// observed value there, so the next pass corrects it.
    Read {
        /// The observed properties.
        observed: Properties,
    },
    /// A READ found that the item does not exist: it leaves current state.
    Vanished,
    /// The answer to a NEEDS_RECREATE question.
    Answered {
        /// Whether the change needs a recreate.
        needs_recreate: bool,
    },
    /// A READ that resolves an UNKNOWN item answered: the item exists with
    /// these properties (`Some`), or does not exist (`None`).
    Resolved {
        /// What the agent observed, if the item exists.
        observed: Option<Properties>,
    },
}

/// The value of `existing` (absent for a first Create) once `in_flight`
/// starts on it. `target` is the intended value a Create or Modify applies.
pub fn started(
    existing: Option<&CurrentItem>,
    target: Option<Arc<Item>>,
    in_flight: InFlight,
) -> CurrentItem {
    let in_flight = InFlight {
        target,
        ..in_flight
    };
    let state = match in_flight.kind {
        _ if in_flight.question => existing.map_or(ItemState::Created, |e| e.state),
        OperationKind::Create => ItemState::Creating,
        OperationKind::Modify => ItemState::Modifying,
        OperationKind::Delete => ItemState::Deleting,
        OperationKind::Read => existing.map_or(ItemState::Created, |e| e.state),
    };
    let observes = in_flight.kind == OperationKind::Read;
    match existing {
        Some(existing) => {
            let running = CurrentItem {
                state,
                in_flight: Some(Box::new(in_flight)),
                ..existing.clone()
            };
            if observes {
                // A READ only observes: an operation waiting to be asked
                // again (after WAIT, a failure or a timeout) is still that
                // operation afterwards, under its op id.
                running
            } else {
                // The running operation carries its own op id from now on.
                running.with_rare(|rare| rare.retry_of = None)
            }
        }
        None => CurrentItem::creating(in_flight),
    }
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
    let mut entry = started(current.get(item).map(|e| &**e), target, in_flight);
    record_dispatch_marks(current, &mut entry);
    current.insert(item.clone(), entry);
}

/// `entry`, which may hold the target of `operation` (a lost operation that
/// may have applied when it was sent): the target joins the values it may
/// hold ([`CurrentItem::may_also_hold`]), and the modification counters
/// that the target's `recreate_when_modified` dependencies had at dispatch
/// join the item's marks (the older one where both have one; an absent
/// dependency's mark wins). A dependency modified since then recreates the
/// item, whichever value it holds (simulator seed 52881).
pub fn may_hold_target_of(entry: CurrentItem, operation: &InFlight) -> CurrentItem {
    let entry = entry.may_also_hold(operation.target.clone());
    if operation.dispatch_marks.is_empty() {
        return entry;
    }
    entry.with_rare(|rare| {
        for (required, &mark) in &operation.dispatch_marks {
            rare.dependency_marks
                .entry(required.clone())
                .and_modify(|kept| *kept = older_mark(*kept, mark))
                .or_insert(mark);
        }
    })
}

/// Of two marks of one dependency, the one that recreates the item soonest:
/// an absent dependency's, otherwise the smaller counter (counters only
/// grow).
fn older_mark(one: u64, other: u64) -> u64 {
    if one == ABSENT_DEPENDENCY_MARK || other == ABSENT_DEPENDENCY_MARK {
        ABSENT_DEPENDENCY_MARK
    } else {
        one.min(other)
    }
}

/// Records, on `entry`'s operation, the modification counters of its
/// target's `recreate_when_modified` dependencies as they are now (at
/// dispatch). Kept when the operation is re-delivered.
pub fn record_dispatch_marks(current: &CurrentGraph, entry: &mut CurrentItem) {
    let Some(operation) = entry.in_flight.as_mut() else {
        return;
    };
    let Some(target) = operation.target.as_ref() else {
        return;
    };
    if !operation.dispatch_marks.is_empty() {
        return;
    }
    operation.dispatch_marks = target
        .dependencies
        .iter()
        .filter(|dependency| dependency.recreate_when_modified())
        .map(|dependency| {
            let counter = current
                .get(&dependency.requires)
                .map_or(0, |required| required.modifications);
            (dependency.requires.clone(), counter)
        })
        .collect();
}

/// The value of `existing` once its in-flight operation ended with
/// `completion` (`None`: the item no longer exists). `current` supplies the
/// modification counters of dependencies. Returns `existing` unchanged when
/// nothing is in flight.
pub fn completed(
    current: &CurrentGraph,
    existing: &CurrentItem,
    completion: Completion,
) -> Option<CurrentItem> {
    let Some(operation) = existing.in_flight.clone() else {
        return Some(existing.clone());
    };
    if let Some(lost) = operation.resolves.as_deref() {
        return resolved(current, existing, lost, completion);
    }
    let changes_nothing =
        operation.question || matches!(operation.kind, OperationKind::Delete | OperationKind::Read);
    if existing.gone_with_external && changes_nothing && !matches!(completion, Completion::Lost) {
        // A question, READ or Delete cannot bring the item back, whatever
        // its outcome (a failed or timed-out Delete too): the item went
        // with its external item.
        return None;
    }
    if existing.gone_with_external && !matches!(completion, Completion::Lost) {
        // A live report settles what the mark was for (not sending a lost
        // operation again). A failure left the item as it was: gone, if
        // the value it had shares the tie that went (`still_tied`), and
        // otherwise as before the operation. A DONE of a
        // Create or Modify that ties the item to the external item that
        // went is ambiguous: applied before that item came back, the item
        // went with it; applied after, it exists. So its existence is
        // uncertain: the planner drops it if its external item is still
        // gone, and otherwise creates it again (Creates are idempotent) or
        // deletes it (DESIGN 3, rule 9; DESIGN 4, `previous_uncertain`).
        let applied_a_tie = matches!(completion, Completion::Done { .. })
            && matches!(
                operation.kind,
                OperationKind::Create | OperationKind::Modify
            );
        if !applied_a_tie && still_tied(existing, &operation) {
            return None;
        }
        let unmarked = CurrentItem {
            gone_with_external: false,
            ..existing.clone()
        };
        return completed(current, &unmarked, completion).map(|settled| CurrentItem {
            existence_uncertain: settled.existence_uncertain || applied_a_tie,
            ..settled
        });
    }
    if existing.gone_unless_applied && !matches!(completion, Completion::Lost) {
        // A live report settles it: a DONE says the untying operation
        // applied before the item could go (an agent answers NOT_FOUND for
        // an item that went first), so the item exists with its value;
        // anything else left the item as it was, and it went with its
        // external item, even if that item is back by now. A Create that
        // is asked again is the same operation: it keeps its op id and
        // attempts (DESIGN 4).
        let applied = matches!(completion, Completion::Done { .. });
        let unmarked = CurrentItem {
            gone_unless_applied: false,
            ..existing.clone()
        };
        // Sent again after its outcome was lost, an earlier delivery may
        // have applied (see `lost::may_have_applied`): then only that
        // tells, and the item may exist with the operation's value.
        if !applied && existing.uncertain() {
            return applied_uncertainly(current, &unmarked);
        }
        let settled = completed(current, &unmarked, completion);
        return match operation.kind {
            _ if applied => settled,
            OperationKind::Create => settled.as_ref().and_then(create_to_retry),
            _ => None,
        };
    }
    match completion {
        Completion::Done { observed } => {
            completed_successfully(current, existing, &operation, observed)
        }
        Completion::Failed { error, retry_at_ms } => Some(
            CurrentItem {
                state: ItemState::Failed,
                last_operation: Some(operation.kind),
                attempts: existing.attempts.saturating_add(1),
                gave_up: retry_at_ms.is_none(),
                in_flight: None,
                ..existing.clone()
            }
            .with_rare(|rare| {
                rare.last_error = Some(error);
                rare.next_attempt_at_ms = retry_at_ms;
                rare.failed_generation = operation.target_generation;
                rare.retry_of = Some(retry_of(&operation));
            }),
        ),
        Completion::Wait { retry_at_ms } => {
            Some(as_before(existing, &operation).with_rare(|rare| {
                rare.next_attempt_at_ms = Some(retry_at_ms);
                rare.retry_of = Some(retry_of(&operation));
            }))
        }
        Completion::Read { observed } => Some(read_back(existing, observed)),
        Completion::Vanished => None,
        Completion::Answered { needs_recreate } => {
            Some(as_before(existing, &operation).with_rare(|rare| {
                rare.needs_recreate_answer = Some((operation.target_generation, needs_recreate));
                rare.retry_of = None;
            }))
        }
        // Only a READ that resolves an UNKNOWN item resolves (above).
        Completion::Resolved { .. } => Some(CurrentItem {
            in_flight: None,
            ..existing.clone()
        }),
        Completion::Lost => Some(CurrentItem {
            state: ItemState::Unknown,
            unknown_was_created: existing.is_created() || operation.kind != OperationKind::Create,
            in_flight: Some(operation),
            ..existing.clone()
        }),
    }
}

/// `existing` as if its in-flight operation had applied, its existence
/// uncertain: if the item exists, it has that operation's value (DESIGN 4,
/// `previous_uncertain`). `None` for a Delete.
pub fn applied_uncertainly(current: &CurrentGraph, existing: &CurrentItem) -> Option<CurrentItem> {
    completed(current, existing, Completion::Done { observed: None }).map(|applied| CurrentItem {
        existence_uncertain: true,
        ..applied
    })
}

/// An UNKNOWN item after the READ that resolves its `lost` operation
/// ended with `completion` (DESIGN 4: "READ resolves them"):
///
/// - the item does not exist: it is gone, whatever `lost` was;
/// - `lost` was a Create of an item that held nothing: it exists, so the
///   Create applied (nothing else creates it), with what was read taken
///   into its value where they differ;
/// - `lost` was a Create or Modify whose target the item shows on every
///   property the target sets, and what was read tells the target apart
///   from every value the item may hold had it not applied
///   ([`tells_apart`]: a new property value, the same dependencies and
///   the same `external` flag, no property the target removes still
///   shown): `lost` applied;
/// - otherwise the item is kept with the value it had, what was read
///   taken into it (drift), and `lost` is asked again under its op id. A
///   Create or Modify may have applied all the same (a READ sees
///   properties only, and drift may have changed them since, even back
///   to the old ones): its target is kept as `maybe_applied` until the
///   item's next Create or Modify answers DONE;
/// - the READ's own outcome is lost: the item is UNKNOWN again, with
///   `lost` to resolve.
///
/// An answer is a live report: it settles a mark of going with an external
/// item ([`CurrentItem::gone_with_external`],
/// [`CurrentItem::gone_unless_applied`]), and the planner applies rule 9 to
/// what was read; but an item found with only values tied to external
/// items, while it was marked, is of uncertain existence (the agent may
/// have looked before the external item went).
fn resolved(
    current: &CurrentGraph,
    existing: &CurrentItem,
    lost: &InFlight,
    completion: Completion,
) -> Option<CurrentItem> {
    let unknown = |existing: &CurrentItem| CurrentItem {
        state: ItemState::Unknown,
        in_flight: Some(Box::new(lost.clone())),
        ..existing.clone()
    };
    let observed = match completion {
        Completion::Resolved { observed: None } => return None,
        Completion::Resolved {
            observed: Some(observed),
        } => observed,
        _ => return Some(unknown(existing)),
    };
    let marked = existing.gone_with_external || existing.gone_unless_applied;
    let unmarked = CurrentItem {
        gone_with_external: false,
        gone_unless_applied: false,
        ..existing.clone()
    };
    let found = read_found(current, &unmarked, lost, observed)?;
    // Marked, an external item went while the READ was out or since the
    // outcome was lost, and the agent may have looked before it went. A
    // value tied to an external item (the mark does not say which) shown
    // then does not say the item is still there: if every value it may
    // hold is tied, it may have gone since, even if that external item is
    // back by now. Created again if it stays intended (Creates are
    // idempotent), dropped while its external item is gone (rule 9).
    let tied_whatever = marked && found.values().all(|value| tied_to_an_external(value));
    Some(CurrentItem {
        existence_uncertain: found.existence_uncertain || tied_whatever,
        ..found
    })
}

/// Whether `item` goes with some external item (an
/// `auto_deleted_by_external` dependency).
fn tied_to_an_external(item: &Item) -> bool {
    item.dependencies
        .iter()
        .any(|dependency| dependency.auto_deleted_by_external())
}

/// What a READ that found the item with `observed` says of the UNKNOWN,
/// unmarked `existing` and its `lost` operation (see [`resolved`]).
fn read_found(
    current: &CurrentGraph,
    existing: &CurrentItem,
    lost: &InFlight,
    observed: Properties,
) -> Option<CurrentItem> {
    let unknown = CurrentItem {
        state: ItemState::Unknown,
        in_flight: Some(Box::new(lost.clone())),
        ..existing.clone()
    };
    let applies =
        matches!(lost.kind, OperationKind::Create | OperationKind::Modify) && !lost.question;
    let target = lost.target.as_deref();
    let shows_target = target.is_some_and(|target| shows(target, &observed));
    // A READ sees properties only, and only those the target sets tell
    // (an agent may report more than the intent sets). It tells that the
    // operation applied only if it tells the target apart from every value
    // the item may hold had it not applied: its applied value, and the
    // values earlier lost operations may have left (`maybe_applied`; one
    // that is the target itself is no alternative: an item that may hold
    // the target and shows it holds it). See [`tells_apart`]; otherwise
    // the operation is asked again under its op id (it is idempotent)
    // rather than taken as applied.
    let tells = target.is_none_or(|target| {
        existing
            .values()
            .filter(|held| !held.same_content(target))
            .all(|held| tells_apart(held, target, &observed))
    });
    if applies && ((shows_target && tells) || existing.applied.is_none()) {
        // Applied; or a Create found something else in its place: created,
        // with what was read as the applied value where they differ.
        return completed_successfully(current, &unknown, lost, None)
            .map(|created| read_back(&created, observed));
    }
    let kept = CurrentItem {
        state: if existing.rare.last_error.is_some() {
            ItemState::Failed
        } else {
            ItemState::Created
        },
        in_flight: None,
        unknown_was_created: false,
        ..existing.clone()
    }
    .with_rare(|rare| rare.retry_of = (!lost.question).then(|| retry_of(lost)));
    // It may have applied (an agent that restarts forgets what it had not
    // reported): until it is asked again and answers, the dependencies of
    // its value stay edges. Whatever was read: a READ cannot see
    // dependencies, and drift may have taken the item's properties since
    // to another value (simulator seed 20481 with drift: neither the
    // applied value nor the target) or back to the applied value's, so
    // not even a READ showing the applied value proves that the operation
    // did not apply.
    let kept = if applies {
        may_hold_target_of(kept, lost)
    } else {
        kept
    };
    Some(read_back(&kept, observed))
}

/// Whether a READ showing `observed`, which shows every property `target`
/// sets, tells that `target` applied to an item that held `held` before.
///
/// Not when the target sets no property to a value `held` did not have
/// already (a Modify of its dependencies, say, or one that only removes a
/// property): the READ would show the same. Nor when the target changes
/// the dependencies `held` has, since a READ cannot see them: the item may
/// have drifted to show the target's properties while the operation did
/// not apply. Dropping one, it would still rely on that dependency, which
/// must not be deleted under it (simulator seed 6798 with drift); adding
/// or changing one, its agent would never be told of it, while the server
/// took the item for converged and created its dependents against a value
/// it does not hold (simulator seed 41499 with drift). Nor when the READ
/// still shows a property `held` sets and the target removes: the
/// operation would have removed it, but an
/// agent may report more than the intent sets, so it may not have applied
/// (simulator seed 15609 with drift); taken as applied, the property
/// would stay on the item for good, since drift is looked for only in the
/// properties the applied value sets. Nor when the target takes over an
/// item reported as external (or gives it back): a READ cannot see that
/// flag either, and the agent would never have been told of the takeover.
fn tells_apart(held: &Item, target: &Item, observed: &Properties) -> bool {
    let sets_a_new_value = target
        .properties
        .iter()
        .any(|(key, value)| held.properties.get(key) != Some(value));
    let keeps_the_dependencies = held.same_dependencies(target);
    let shows_no_removed_property = held
        .properties
        .iter()
        .all(|(key, _)| target.properties.get(key).is_some() || observed.get(key).is_none());
    let same_management = held.external == target.external;
    sets_a_new_value && keeps_the_dependencies && shows_no_removed_property && same_management
}

/// Whether `observed` has every property `value` sets, as it sets it.
fn shows(value: &Item, observed: &Properties) -> bool {
    value
        .properties
        .iter()
        .all(|(key, set)| observed.get(key) == Some(set))
}

/// What is left of an item that went with its external item while its
/// Create waited for a retry (after WAIT or a retryable failure): nothing
/// exists, but asking again is the same operation, so it keeps its op id
/// and attempts (DESIGN 4). `None` when no Create waits for a retry.
fn create_to_retry(existing: &CurrentItem) -> Option<CurrentItem> {
    let retry_of = existing
        .rare
        .retry_of
        .clone()
        .filter(|retry| retry.kind == OperationKind::Create)?;
    if existing.in_flight.is_some() {
        return None;
    }
    Some(
        CurrentItem {
            state: if existing.rare.last_error.is_some() {
                ItemState::Failed
            } else {
                ItemState::Pending
            },
            applied: None,
            applied_generation: 0,
            observed: None,
            last_operation: Some(OperationKind::Create),
            unknown_was_created: false,
            gone_with_external: false,
            gone_unless_applied: false,
            existence_uncertain: false,
            ..existing.clone()
        }
        .with_rare(|rare| {
            rare.dependency_marks.clear();
            rare.needs_recreate_answer = None;
            rare.retry_of = Some(retry_of);
            rare.maybe_applied.clear();
        }),
    )
}

/// What a retry of `operation` continues: its kind, target and op id.
fn retry_of(operation: &InFlight) -> RetryOf {
    RetryOf {
        kind: operation.kind,
        target_generation: operation.target_generation,
        op_id: operation.op_id.clone(),
    }
}

/// The paths (top-level properties) where `observed` contradicts what the
/// item's applied value sets: drift.
pub fn drifted_paths(applied: &Item, observed: &Properties) -> Vec<String> {
    applied
        .properties
        .iter()
        .filter(|(key, value)| observed.get(key).is_some_and(|seen| seen != *value))
        .map(|(key, _)| format!("/{key}"))
        .collect()
}

/// An item after a READ: observed recorded, drifted properties taken into
/// the applied value (so it no longer equals the intent and is corrected).
fn read_back(existing: &CurrentItem, observed: Properties) -> CurrentItem {
    let mut item = CurrentItem {
        in_flight: None,
        ..existing.clone()
    };
    if let Some(applied) = &existing.applied
        && !drifted_paths(applied, &observed).is_empty()
    {
        let mut corrected = (**applied).clone();
        for (key, value) in corrected.properties.iter_mut() {
            if let Some(seen) = observed.get(key) {
                *value = seen.clone();
            }
        }
        item.applied = Some(Arc::new(corrected));
    }
    item.observed = Some(Arc::new(observed));
    item
}

/// `existing` with nothing in flight, back in the state it had before
/// `operation` ran (see [`state_before`]).
fn as_before(existing: &CurrentItem, operation: &InFlight) -> CurrentItem {
    CurrentItem {
        state: state_before(existing, operation),
        in_flight: None,
        ..existing.clone()
    }
}

/// The state an item had before `operation` started.
fn state_before(existing: &CurrentItem, operation: &InFlight) -> ItemState {
    match (
        operation.kind,
        &existing.rare.last_error,
        existing.applied.is_some(),
    ) {
        (_, Some(_), _) => ItemState::Failed,
        (OperationKind::Create, None, false) => ItemState::Pending,
        _ => ItemState::Created,
    }
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
    if existing.in_flight.is_none() {
        return false;
    }
    match completed(current, &existing, completion) {
        Some(entry) => {
            current.insert(item.clone(), entry);
        }
        None => {
            current.remove(item);
        }
    }
    true
}

/// The mark a dependent records for a `recreate_when_modified` dependency
/// that was gone when its Create or Modify completed: no counter equals
/// it, so the dependent is recreated once an item of that name is back
/// (DESIGN 3, rule 4: counters restart with each new item).
pub const ABSENT_DEPENDENCY_MARK: u64 = u64::MAX;

fn completed_successfully(
    current: &CurrentGraph,
    existing: &CurrentItem,
    operation: &InFlight,
    observed: Option<Properties>,
) -> Option<CurrentItem> {
    match operation.kind {
        OperationKind::Delete => None,
        OperationKind::Create | OperationKind::Modify => {
            let target = operation.target.clone()?;
            let created_now = operation.kind == OperationKind::Create;
            let mut entry = CurrentItem::created(target.clone(), operation.target_generation);
            entry.last_operation = Some(operation.kind);
            entry.observed = observed.map(Arc::new);
            entry.modifications = if created_now {
                0
            } else {
                existing.modifications.saturating_add(1)
            };
            // A Create of an item that may exist already (its existence
            // uncertain, with a value it may hold) may have found it there,
            // created before a dependency's modification: the marks it
            // had are kept where older, and a recreate it owed is still
            // owed (simulator seed 57172).
            let may_have_existed =
                created_now && existing.existence_uncertain && existing.applied.is_some();
            entry.rare.update(|rare| {
                let marks = &mut rare.dependency_marks;
                if !created_now || may_have_existed {
                    marks.clone_from(&existing.rare.dependency_marks);
                }
                for dependency in target
                    .dependencies
                    .iter()
                    .filter(|d| d.recreate_when_modified())
                {
                    let counter = match current.get(&dependency.requires) {
                        // It went while the operation ran: whatever appears
                        // under its name later is another item (its counter
                        // starts again), so it counts as modified.
                        None => ABSENT_DEPENDENCY_MARK,
                        Some(required) => operation
                            .dispatch_marks
                            .get(&dependency.requires)
                            .copied()
                            .unwrap_or(required.modifications),
                    };
                    match marks.get_mut(&dependency.requires) {
                        Some(kept) if may_have_existed => *kept = older_mark(*kept, counter),
                        Some(_) if !created_now => {}
                        _ => {
                            marks.insert(dependency.requires.clone(), counter);
                        }
                    }
                }
                marks.retain(|required, _| {
                    target
                        .dependency_on(required)
                        .is_some_and(|d| d.recreate_when_modified())
                });
            });
            Some(entry)
        }
        OperationKind::Read => {
            let mut entry = existing.clone();
            entry.in_flight = None;
            entry.observed = observed.map(Arc::new);
            Some(entry)
        }
    }
}

/// New values of current items: `None` removes the item.
pub type CurrentUpdates = Vec<(ItemRef, Option<CurrentItem>)>;

/// Keeps only the last value written for each item (a result and the next
/// operation it unblocks on the same item land in one commit), in the
/// order of those last writes. Applying the result equals applying the
/// input in order, and each item's change is seen once.
pub fn coalesce(updates: CurrentUpdates) -> CurrentUpdates {
    let mut last: std::collections::HashMap<ItemRef, usize> =
        std::collections::HashMap::with_capacity(updates.len());
    for (index, (item, _)) in updates.iter().enumerate() {
        last.insert(item.clone(), index);
    }
    if last.len() == updates.len() {
        return updates;
    }
    updates
        .into_iter()
        .enumerate()
        .filter(|(index, (item, _))| last.get(item) == Some(index))
        .map(|(_, update)| update)
        .collect()
}

/// Whether every value `existing` may have held before `operation` (its
/// applied value, and any a lost operation may have left) is tied
/// (through an `auto_deleted_by_external` dependency) to every external
/// item the operation's target is tied to: whichever of them went, the
/// item went with it whatever it held. One untied value it may hold keeps
/// it, to be deleted (DESIGN 3, rule 9).
fn still_tied(existing: &CurrentItem, operation: &InFlight) -> bool {
    let ties = |item: &Item| -> std::collections::BTreeSet<ItemRef> {
        item.dependencies
            .iter()
            .filter(|dependency| dependency.auto_deleted_by_external())
            .map(|dependency| dependency.requires.clone())
            .collect()
    };
    let (Some(_), Some(target)) = (existing.applied.as_deref(), operation.target.as_deref()) else {
        return false;
    };
    let target_ties = ties(target);
    !target_ties.is_empty()
        && existing
            .values()
            .all(|value| target_ties.is_subset(&ties(value)))
}

/// `item`'s new `value` as updates to stage: with, when it removes the
/// item, its dependents' values with their marks on it forgotten
/// ([`forget_marks_on_removed`]).
pub fn with_marks_forgotten(
    current: &CurrentGraph,
    item: &ItemRef,
    value: Option<CurrentItem>,
) -> CurrentUpdates {
    let mut updates = vec![(item.clone(), value)];
    forget_marks_on_removed(current, &mut updates);
    updates
}

/// Dependents of the items `updates` removes (items that are current
/// now) forget the modification counters they recorded for them (DESIGN
/// 3, rule 4): whatever appears under a removed name later is another
/// item whose counter starts again, so each mark, applied or taken at
/// dispatch, becomes [`ABSENT_DEPENDENCY_MARK`] and the dependent is
/// recreated once the name is back. Whatever removed the item (its
/// external item vanished, its Delete completed, its agent found it gone).
/// The dependents' new values join `updates` (values already staged there
/// win over `current`).
pub fn forget_marks_on_removed(current: &CurrentGraph, updates: &mut CurrentUpdates) {
    let removed: std::collections::HashSet<ItemRef> = updates
        .iter()
        .filter(|(key, value)| value.is_none() && current.get(key).is_some())
        .map(|(key, _)| key.clone())
        .collect();
    let dependents: std::collections::BTreeSet<ItemRef> = removed
        .iter()
        .flat_map(|required| current.dependents_of(required).cloned())
        .collect();
    if dependents.is_empty() {
        return;
    }
    // Where each item's last staged value is: one look-up per dependent,
    // however many are staged (a hub found gone may have thousands).
    let mut staged_at: std::collections::HashMap<ItemRef, usize> = updates
        .iter()
        .enumerate()
        .map(|(index, (key, _))| (key.clone(), index))
        .collect();
    for dependent in dependents {
        let staged = staged_at.get(&dependent).copied();
        let mut entry = match staged {
            Some(index) => match &updates[index].1 {
                Some(entry) => entry.clone(),
                None => continue,
            },
            None => match current.get(&dependent) {
                Some(entry) => (**entry).clone(),
                None => continue,
            },
        };
        let mut changed = false;
        entry
            .rare
            .update(|rare| changed |= mark_absent(&mut rare.dependency_marks, &removed));
        if let Some(operation) = entry.in_flight.as_mut() {
            changed |= mark_absent(&mut operation.dispatch_marks, &removed);
        }
        if changed {
            match staged {
                Some(index) => updates[index].1 = Some(entry),
                None => {
                    staged_at.insert(dependent.clone(), updates.len());
                    updates.push((dependent, Some(entry)));
                }
            }
        }
    }
}

/// Sets the marks `marks` holds on `removed` items to the absent mark;
/// whether one changed. Walks the item's own marks (a few), not the
/// removed items (up to a whole batch).
fn mark_absent(
    marks: &mut BTreeMap<ItemRef, u64>,
    removed: &std::collections::HashSet<ItemRef>,
) -> bool {
    let mut changed = false;
    for (required, mark) in marks.iter_mut() {
        if removed.contains(required) && *mark != ABSENT_DEPENDENCY_MARK {
            *mark = ABSENT_DEPENDENCY_MARK;
            changed = true;
        }
    }
    changed
}

/// Rule 9 for items that are busy when external items vanish: each item
/// that an `auto_deleted_by_external` dependency ties to a vanished item
/// (through its applied value or the target of its running operation), and
/// transitively to such an item, goes with it. Idle ones the planner drops;
/// busy ones that are gone whatever their operation does are marked
/// [`CurrentItem::gone_with_external`] here: if that operation's outcome is
/// lost, it is not sent again (an agent could answer it from its
/// de-duplication cache for an item that went, even if the external item
/// is back by then); the item is forgotten instead. Busy ones whose
/// running Create or Modify unties them are marked
/// [`CurrentItem::gone_unless_applied`]: only that operation's outcome
/// tells whether they went, and the external item may be back before it
/// reports.
pub fn mark_gone_with_externals(
    current: &CurrentGraph,
    vanished: impl IntoIterator<Item = ItemRef>,
) -> CurrentUpdates {
    let mut gone: Vec<ItemRef> = vanished.into_iter().collect();
    let mut seen: std::collections::BTreeSet<ItemRef> = gone.iter().cloned().collect();
    let mut updates: CurrentUpdates = Vec::new();
    let mut staged_at: BTreeMap<ItemRef, usize> = BTreeMap::new();
    while let Some(required) = gone.pop() {
        for dependent in current.dependents_of(&required) {
            let Some(entry) = current.get(dependent) else {
                continue;
            };
            let ties = |item: &Item| {
                item.dependencies
                    .iter()
                    .any(|d| d.auto_deleted_by_external() && d.requires == required)
            };
            let deciding = entry.in_flight.as_deref().map(InFlight::deciding);
            // An item that may hold other values (`maybe_applied`) went
            // only if each of them went too.
            let applied_ties = entry.applied.as_deref().is_some_and(ties)
                && entry.rare.maybe_applied.iter().all(|value| ties(value));
            let target_ties = || {
                deciding
                    .and_then(|operation| operation.target.as_deref())
                    .is_some_and(ties)
            };
            // Gone if the deciding operation succeeds, whenever it ran: a
            // Create or Modify that makes the item tied to it (applied
            // before the external item came back, the item went with it);
            // a Delete, READ or question (which change nothing) of a tied
            // item.
            let gone_whatever = match deciding {
                Some(operation) if operation.question => applied_ties,
                Some(operation) => match operation.kind {
                    OperationKind::Create | OperationKind::Modify => target_ties(),
                    OperationKind::Delete | OperationKind::Read => applied_ties,
                },
                None => applied_ties,
            };
            if !(applied_ties || target_ties()) {
                continue;
            }
            // Its applied value went, but a Create or Modify that unties it
            // may have applied first: gone unless that operation applied.
            // Only its outcome tells, and the external item may be back
            // before it reports.
            let gone_unless_applied = !gone_whatever
                && applied_ties
                && deciding.is_some_and(|operation| {
                    !operation.question
                        && matches!(
                            operation.kind,
                            OperationKind::Create | OperationKind::Modify
                        )
                });
            if entry.is_busy() {
                let staged = staged_at.get(dependent).copied();
                let marks = staged
                    .and_then(|index| updates[index].1.as_ref())
                    .unwrap_or(entry);
                let marked = with_gone_mark(marks, gone_whatever, gone_unless_applied);
                match (marked, staged) {
                    (Some(marked), Some(index)) => updates[index].1 = Some(marked),
                    (Some(marked), None) => {
                        staged_at.insert(dependent.clone(), updates.len());
                        updates.push((dependent.clone(), Some(marked)));
                    }
                    (None, _) => {}
                }
            }
            if !seen.insert(dependent.clone()) {
                continue;
            }
            gone.push(dependent.clone());
        }
    }
    updates
}

/// `item` with the stronger of its marks and the one just found (gone
/// whatever its operation does over gone unless it applies), or `None`
/// when it already has it.
fn with_gone_mark(
    item: &CurrentItem,
    gone_whatever: bool,
    gone_unless_applied: bool,
) -> Option<CurrentItem> {
    if item.gone_with_external {
        return None;
    }
    if gone_whatever {
        return Some(CurrentItem {
            gone_with_external: true,
            gone_unless_applied: false,
            ..item.clone()
        });
    }
    (gone_unless_applied && !item.gone_unless_applied).then(|| CurrentItem {
        gone_unless_applied: true,
        ..item.clone()
    })
}

/// What a plan decides without any operation, as updates of current items:
/// drops (items gone with an external dependency, or never created) and
/// settles (failed items that need nothing any more). Computing them apart
/// from applying them lets the owner commit first and change memory after.
pub fn bookkeeping_updates(current: &CurrentGraph, plan: &Plan) -> CurrentUpdates {
    let mut updates: CurrentUpdates = Vec::new();
    for (item, reason) in &plan.forget {
        match reason {
            ForgetReason::DeletedWithExternal => {
                let kept = current
                    .get(item)
                    .and_then(|existing| create_to_retry(existing));
                updates.push((item.clone(), kept));
            }
            ForgetReason::NeverCreated => updates.push((item.clone(), None)),
        }
    }
    for item in &plan.settle {
        if let Some(existing) = current.get(item) {
            // The failed operation is not needed now, but it may be again
            // (a dependency's Create that was running fails, and the
            // cascade that needed this Delete returns): then it is a retry
            // of the same operation, under the same op id, its attempts go
            // on counting, and it waits the backoff its failure set (DESIGN
            // 4; seed 56203: a Delete settled and needed again in the same
            // step went out 2 ms after it failed, where the type waits
            // 1.6 s). A failure given up on stays given up on: needed
            // again at the same generation, it waits for an intent change
            // (seed 65764: a Delete past `max_attempts`, settled, went out
            // again at once, over and over).
            let settled = CurrentItem {
                state: ItemState::Created,
                gave_up: existing.failed_terminally_at(existing.rare.failed_generation),
                ..(**existing).clone()
            }
            .with_rare(|rare| rare.last_error = None);
            updates.push((item.clone(), Some(settled)));
        }
    }
    // An item dropped with its external item is gone like one deleted.
    forget_marks_on_removed(current, &mut updates);
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::plan::{ForgetReason, Plan};
    use crate::graph::Item;

    fn waiting_to_retry_create(last_error: Option<OperationError>) -> CurrentItem {
        CurrentItem {
            state: ItemState::Created,
            existence_uncertain: true,
            attempts: 2,
            ..CurrentItem::created(Arc::new(Item::new("t", "a", Default::default())), 7)
        }
        .with_rare(|rare| {
            rare.last_error = last_error;
            rare.retry_of = Some(RetryOf {
                kind: OperationKind::Create,
                target_generation: 7,
                op_id: "op-1".into(),
            });
        })
    }

    fn forgotten_with_external(entry: CurrentItem) -> Option<CurrentItem> {
        let item = ItemRef::new("t", "a");
        let mut current = CurrentGraph::default();
        current.insert(item.clone(), entry);
        let plan = Plan {
            forget: vec![(item, ForgetReason::DeletedWithExternal)],
            ..Plan::default()
        };
        bookkeeping_updates(&current, &plan)
            .into_iter()
            .next()
            .expect("one update")
            .1
    }

    #[test]
    fn a_create_of_an_item_that_may_exist_keeps_the_recreate_it_owed() {
        // Simulator seed 57172: b was created when d had 0 modifications;
        // d was modified, and the Delete of b's recreate was lost, sent
        // again, and timed out, leaving b's existence uncertain. The
        // Create sent then found b still there, and took fresh marks: the
        // recreate b owed was forgotten, and b kept a value created
        // before d's modification.
        let d = ItemRef::new("t", "d");
        let mut current = CurrentGraph::default();
        let mut modified =
            CurrentItem::created(Arc::new(Item::new("t", "d", Default::default())), 1);
        modified.modifications = 1;
        current.insert(d.clone(), modified);
        let value =
            Arc::new(Item::new("t", "b", Default::default()).depends_on(
                crate::graph::Dependency::on(d.clone()).with_recreate_when_modified(true),
            ));
        let create = InFlight {
            target: Some(value.clone()),
            dispatch_marks: [(d.clone(), 1)].into_iter().collect(),
            ..InFlight::new(OperationKind::Create, "op-2".into(), 1, 8, 0, 10_000)
        };
        let existing = CurrentItem {
            existence_uncertain: true,
            in_flight: Some(Box::new(create)),
            ..CurrentItem::created(value, 8)
        }
        .with_rare(|rare| rare.dependency_marks = [(d.clone(), 0)].into_iter().collect());
        let after =
            completed(&current, &existing, Completion::Done { observed: None }).expect("created");
        assert_eq!(
            after.rare.dependency_marks.get(&d),
            Some(&0),
            "b may be the item created before d's modification"
        );
    }

    #[test]
    fn a_dependent_forgets_its_mark_on_an_item_dropped_with_its_external_item() {
        let (a, b) = (ItemRef::new("t", "a"), ItemRef::new("t", "b"));
        let mut current = CurrentGraph::default();
        current.insert(
            a.clone(),
            CurrentItem::created(Arc::new(Item::new("t", "a", Default::default())), 1),
        );
        let dependent = Item::new("t", "b", Default::default())
            .depends_on(crate::graph::Dependency::on(a.clone()).with_recreate_when_modified(true));
        let marked = CurrentItem::created(Arc::new(dependent), 1)
            .with_rare(|rare| rare.dependency_marks = [(a.clone(), 3)].into_iter().collect());
        current.insert(b.clone(), marked);
        let plan = Plan {
            forget: vec![(a.clone(), ForgetReason::DeletedWithExternal)],
            ..Plan::default()
        };
        let updates = bookkeeping_updates(&current, &plan);
        let mark = updates
            .iter()
            .find(|(key, _)| *key == b)
            .and_then(|(_, value)| value.as_ref()?.rare.dependency_marks.get(&a).copied());
        assert_eq!(mark, Some(ABSENT_DEPENDENCY_MARK), "{updates:?}");
    }

    #[test]
    fn a_create_waiting_to_be_asked_again_keeps_its_op_id_when_its_item_goes() {
        let kept = forgotten_with_external(waiting_to_retry_create(None)).expect("kept");
        assert_eq!(kept.state, ItemState::Pending);
        assert!(kept.applied.is_none() && !kept.existence_uncertain && !kept.may_exist());
        assert_eq!(retried_op_id(&kept), Some("op-1".into()));
        assert_eq!(kept.attempts, 2, "attempts go on counting");

        let failed = forgotten_with_external(waiting_to_retry_create(Some(OperationError {
            code: crate::graph::code::UNAVAILABLE,
            message: "later".into(),
        })))
        .expect("kept");
        assert_eq!(failed.state, ItemState::Failed);
        assert!(!failed.may_exist());
    }

    #[test]
    fn an_item_that_goes_with_its_external_item_is_otherwise_forgotten() {
        let mut entry = waiting_to_retry_create(None);
        entry.rare.update(|rare| rare.retry_of = None);
        assert!(forgotten_with_external(entry).is_none());
    }

    /// `t/a`, created tied (or not) to the external item `e/x`, running
    /// `kind` towards a value tied to `e/x`, and marked gone with it.
    fn marked_gone_with_x(kind: OperationKind, applied_tied: bool) -> CurrentItem {
        let on_x = |tied: bool, version: i64| {
            let mut dependency = crate::graph::Dependency::on(ItemRef::new("e", "x"));
            dependency.set_auto_deleted_by_external(tied);
            let mut item = Item::new("t", "a", Default::default());
            item.properties.insert("v".into(), version.into());
            item.dependencies.push(dependency);
            Arc::new(item)
        };
        let target =
            matches!(kind, OperationKind::Create | OperationKind::Modify).then(|| on_x(true, 2));
        let operation = InFlight::new(kind, "op-2".into(), 1, 8, 0, 10_000);
        CurrentItem {
            gone_with_external: true,
            ..started(
                Some(&CurrentItem::created(on_x(applied_tied, 1), 7)),
                target,
                operation,
            )
        }
    }

    fn timed_out() -> Completion {
        Completion::Failed {
            error: OperationError {
                code: 4,
                message: "the operation did not finish within 10000 ms".into(),
            },
            retry_at_ms: Some(20_000),
        }
    }

    #[test]
    fn a_delete_that_fails_after_its_item_went_with_its_external_item_leaves_it_gone() {
        // Simulator seed 20307: the failed Delete left the item as created,
        // and a dependent of it was created on nothing.
        let entry = marked_gone_with_x(OperationKind::Delete, true);
        let after = completed(&CurrentGraph::default(), &entry, timed_out());
        assert_eq!(after, None);
    }

    #[test]
    fn a_modify_that_fails_after_its_tied_item_went_leaves_it_gone() {
        let entry = marked_gone_with_x(OperationKind::Modify, true);
        let after = completed(&CurrentGraph::default(), &entry, timed_out());
        assert_eq!(after, None);
    }

    /// A value of `t/a` with `v: version`, `auto_deleted_by_external` on
    /// `e/x` or not (`tied`).
    fn value_of_a(tied: bool, version: i64) -> Arc<Item> {
        let mut item = Item::new("t", "a", Default::default());
        item.properties.insert("v".into(), version.into());
        if tied {
            let mut dependency = crate::graph::Dependency::on(ItemRef::new("e", "x"));
            dependency.set_auto_deleted_by_external(true);
            item.dependencies.push(dependency);
        }
        Arc::new(item)
    }

    /// `t/a`, UNKNOWN with an applied value tied to `e/x` (its existence
    /// `uncertain` or not), whose lost `kind` of a value tied to `e/x` or
    /// not (`target_tied`) a READ is resolving; then `e/x` vanishes.
    fn marks_when_x_vanishes_under_a_read_resolving(
        kind: OperationKind,
        target_tied: bool,
        uncertain: bool,
    ) -> CurrentUpdates {
        let lost = InFlight {
            target: Some(value_of_a(target_tied, 2)),
            ..InFlight::new(kind, "op-1".into(), 1, 8, 0, 10_000)
        };
        let read = InFlight {
            resolves: Some(Box::new(lost)),
            ..InFlight::new(OperationKind::Read, "op-2".into(), 1, 8, 0, 10_000)
        };
        let entry = CurrentItem {
            state: ItemState::Unknown,
            in_flight: Some(Box::new(read)),
            existence_uncertain: uncertain,
            ..CurrentItem::created(value_of_a(true, 1), 7)
        };
        let mut current = CurrentGraph::default();
        current.insert(ItemRef::new("t", "a"), entry);
        mark_gone_with_externals(&current, [ItemRef::new("e", "x")])
    }

    /// [`marks_when_x_vanishes_under_a_read_resolving`] a lost Create of
    /// an item of uncertain existence.
    fn marks_when_x_vanishes_under_a_resolving_read(target_tied: bool) -> CurrentUpdates {
        marks_when_x_vanishes_under_a_read_resolving(OperationKind::Create, target_tied, true)
    }

    #[test]
    fn an_item_whose_lost_create_unties_it_is_not_gone_whatever_its_read_finds() {
        // Simulator seed 70955: marked gone because the READ changes
        // nothing, the lost Create it resolves was given up rather than sent
        // again under its op id; but that Create, if it ran, made the item
        // independent of `e/x`.
        let untying = marks_when_x_vanishes_under_a_resolving_read(false);
        assert!(
            matches!(untying.as_slice(), [(_, Some(marked))]
                if !marked.gone_with_external && marked.gone_unless_applied),
            "a lost Create of an untied value leaves it gone unless it applied: {untying:?}"
        );
        let updates = marks_when_x_vanishes_under_a_resolving_read(true);
        assert!(
            matches!(updates.as_slice(), [(_, Some(marked))] if marked.gone_with_external),
            "a lost Create of a tied value leaves it gone whatever: {updates:?}"
        );
    }

    #[test]
    fn a_read_that_finds_the_item_settles_its_mark_of_going_with_an_external_item() {
        // Simulator seed 68388: the mark outlived the READ's answer and the
        // Delete planned next; lost at a restart, that Delete was forgotten
        // as if the item had gone, while the READ had found it.
        let updates = marks_when_x_vanishes_under_a_resolving_read(true);
        let [(_, Some(marked))] = updates.as_slice() else {
            panic!("marked: {updates:?}");
        };
        let applied = marked.applied.as_deref().expect("applied");
        let after = completed(
            &CurrentGraph::default(),
            marked,
            Completion::Resolved {
                observed: Some(applied.properties.clone()),
            },
        )
        .expect("it exists");
        assert!(!after.gone_with_external && after.in_flight.is_none());
        assert_eq!(
            after.applied.as_deref(),
            Some(applied),
            "the lost Create did not apply"
        );
    }

    #[test]
    fn a_read_that_ran_when_its_external_item_vanished_leaves_a_tied_item_of_uncertain_existence() {
        // `t/a`, tied to `e/x` by every value it may hold, is UNKNOWN after
        // a lost Modify (still tied); a READ resolving it is out when `e/x`
        // is reported gone. The agent may have looked before `e/x` went
        // (the item then went with it) or after (it could not have shown a
        // tied item). So the READ's DONE proves nothing about the item now,
        // even if `e/x` is back by the time it answers: the item is kept
        // only as of uncertain existence (created again if intended, rule
        // 9 applied while `e/x` is gone), not as created.
        let updates =
            marks_when_x_vanishes_under_a_read_resolving(OperationKind::Modify, true, false);
        let [(_, Some(marked))] = updates.as_slice() else {
            panic!("marked: {updates:?}");
        };
        assert!(marked.gone_with_external);
        for shown in [1, 2] {
            let after = completed(
                &CurrentGraph::default(),
                marked,
                Completion::Resolved {
                    observed: Some(value_of_a(true, shown).properties.clone()),
                },
            )
            .expect("it may exist");
            assert!(!after.gone_with_external && after.in_flight.is_none());
            assert!(
                after.existence_uncertain,
                "showing v{shown}, the tied item is taken as existing for sure: {after:?}"
            );
        }
        // An untied value the READ settles on is not touched by `e/x`
        // going, whenever the agent looked.
        let untying =
            marks_when_x_vanishes_under_a_read_resolving(OperationKind::Create, false, false);
        let [(_, Some(marked))] = untying.as_slice() else {
            panic!("marked: {untying:?}");
        };
        let settled = completed(
            &CurrentGraph::default(),
            marked,
            Completion::Resolved {
                observed: Some(value_of_a(false, 2).properties.clone()),
            },
        )
        .expect("it exists");
        assert!(
            !settled.existence_uncertain,
            "the lost Create applied its untied value: {settled:?}"
        );
    }

    #[test]
    fn a_modify_that_would_have_tied_an_untied_item_fails_and_leaves_it_as_it_was() {
        let entry = marked_gone_with_x(OperationKind::Modify, false);
        let after = completed(&CurrentGraph::default(), &entry, timed_out()).expect("kept");
        assert_eq!(after.state, ItemState::Failed);
        assert!(!after.gone_with_external && !after.existence_uncertain);
        assert_eq!(after.applied, entry.applied);
    }

    /// `t/a`, created tied to the external item `e/x`, running `kind` (a
    /// Create or Modify) towards a value that does not rely on `e/x`, once
    /// `e/x` vanished: the marks that leaves on it.
    fn untying_when_x_vanishes(kind: OperationKind) -> CurrentItem {
        let entry = started(
            Some(&CurrentItem::created(value_of_a(true, 1), 7)),
            Some(value_of_a(false, 2)),
            InFlight::new(kind, "op-2".into(), 1, 8, 0, 10_000),
        );
        let mut current = CurrentGraph::default();
        current.insert(ItemRef::new("t", "a"), entry);
        let updates = mark_gone_with_externals(&current, [ItemRef::new("e", "x")]);
        let [(_, Some(marked))] = updates.as_slice() else {
            panic!("one mark: {updates:?}");
        };
        assert!(marked.gone_unless_applied && !marked.gone_with_external);
        marked.clone()
    }

    /// The op id a retry of `item` continues.
    fn retried_op_id(item: &CurrentItem) -> Option<String> {
        item.rare.retry_of.as_ref().map(|retry| retry.op_id.clone())
    }

    /// The value `item`'s in-flight operation applies.
    fn target_in_flight(item: &CurrentItem) -> Option<Arc<Item>> {
        item.in_flight
            .as_ref()
            .and_then(|operation| operation.target.clone())
    }

    #[test]
    fn an_untying_modify_that_waits_after_its_external_item_went_leaves_the_item_gone() {
        // Simulator seed 222510: `e/x` came back before the Modify answered
        // WAIT; the item was kept with its old value, as if it had not
        // gone, and a dependent was created on nothing.
        let marked = untying_when_x_vanishes(OperationKind::Modify);
        let wait = Completion::Wait {
            retry_at_ms: 20_000,
        };
        assert_eq!(completed(&CurrentGraph::default(), &marked, wait), None);
        assert_eq!(
            completed(&CurrentGraph::default(), &marked, timed_out()),
            None
        );
        assert_eq!(
            completed(&CurrentGraph::default(), &marked, Completion::Vanished),
            None
        );
    }

    #[test]
    fn an_untying_modify_that_applied_before_its_external_item_went_keeps_the_item() {
        let marked = untying_when_x_vanishes(OperationKind::Modify);
        let target = target_in_flight(&marked);
        let after = completed(
            &CurrentGraph::default(),
            &marked,
            Completion::Done { observed: None },
        )
        .expect("it exists");
        assert_eq!(after.state, ItemState::Created);
        assert_eq!(after.applied, target);
        assert!(!after.gone_unless_applied && !after.existence_uncertain);
    }

    #[test]
    fn an_untying_create_that_fails_after_its_external_item_went_is_retried_under_its_op_id() {
        let marked = untying_when_x_vanishes(OperationKind::Create);
        let after = completed(&CurrentGraph::default(), &marked, timed_out()).expect("kept");
        assert!(after.applied.is_none() && !after.may_exist());
        assert!(!after.gone_unless_applied);
        assert_eq!(retried_op_id(&after), Some("op-2".into()));
    }

    #[test]
    fn a_lost_outcome_keeps_the_mark_of_an_untying_operation() {
        let marked = untying_when_x_vanishes(OperationKind::Modify);
        let after =
            completed(&CurrentGraph::default(), &marked, Completion::Lost).expect("unknown");
        assert_eq!(after.state, ItemState::Unknown);
        assert!(after.gone_unless_applied);
    }

    #[test]
    fn an_untying_modify_sent_again_that_fails_leaves_its_item_of_uncertain_existence() {
        // Simulator seed 2242 with agents that restart: the first delivery
        // applied before the external item vanished, and its agent forgot
        // it; the attempt sent again timed out, and the item was forgotten
        // as if it had gone, though it existed with the Modify's value.
        let marked = untying_when_x_vanishes(OperationKind::Modify);
        let target = target_in_flight(&marked);
        let sent_again = marked.may_also_hold(target.clone());
        let after = completed(&CurrentGraph::default(), &sent_again, timed_out()).expect("kept");
        assert!(after.existence_uncertain && after.may_exist() && !after.is_created());
        assert_eq!(after.applied, target);
    }

    /// The item whose applied value is `before` once the READ that
    /// resolves its `lost` operation found it, showing no property.
    fn settled_by_an_empty_read(before: Arc<Item>, lost: &InFlight) -> CurrentItem {
        settled_by_a_read(before, lost, Properties::new())
    }

    /// The item whose applied value is `before` once the READ that
    /// resolves its `lost` operation found it with `observed`.
    fn settled_by_a_read(before: Arc<Item>, lost: &InFlight, observed: Properties) -> CurrentItem {
        settled_by_a_read_maybe_holding(before, Vec::new(), lost, observed)
    }

    #[test]
    fn a_read_showing_neither_value_keeps_the_lost_operations_dependencies() {
        // Simulator seed 20481 with drift and agents that restart: a lost
        // operation (there the Create of a recreate; a Modify takes the
        // same path) to a value depending on b applied, then a property of
        // the item drifted. The READ showed neither the old value nor the
        // target, the item was taken as holding its old value (no
        // dependency), and b was deleted in parallel with it while it
        // still relied on b.
        let properties = |state: &str| -> Properties {
            [("state".to_owned(), state.into())].into_iter().collect()
        };
        let before = Arc::new(Item::new("t", "a", properties("up")));
        let target = Item::new(
            "t",
            "a",
            [
                ("state".to_owned(), "up".into()),
                ("v".to_owned(), 1.into()),
            ]
            .into_iter()
            .collect(),
        )
        .depends_on(crate::graph::Dependency::on(ItemRef::new("t", "b")));
        let lost = InFlight {
            target: Some(Arc::new(target)),
            ..InFlight::new(OperationKind::Modify, "op-1".into(), 1, 8, 0, 10_000)
        };
        let drifted: Properties = [
            ("state".to_owned(), "down".into()),
            ("v".to_owned(), 1.into()),
        ]
        .into_iter()
        .collect();
        let after = settled_by_a_read(before, &lost, drifted);
        assert_eq!(
            after.rare.maybe_applied,
            Vec::from_iter(lost.target.clone()),
            "the item may hold the target, drifted"
        );
        // Nor does a READ that shows the applied value as it was: see
        // `a_read_showing_the_applied_value_keeps_the_target_of_a_lost_modify_as_maybe_applied`.
    }

    #[test]
    fn a_read_showing_a_target_that_drops_a_dependency_asks_the_modify_again() {
        // Simulator seed 6798 with drift and agents that restart: a lost
        // Modify dropped the item's dependency on b and set v to 0; it did
        // not apply, but v drifted to 0, so the READ showed every property
        // the target sets. The item was taken as modified, with no
        // dependency, and b was deleted while the item still relied on it.
        let properties = |v: i64| -> Properties {
            [
                ("state".to_owned(), "up".into()),
                ("v".to_owned(), v.into()),
            ]
            .into_iter()
            .collect()
        };
        let before = Arc::new(
            Item::new("t", "a", properties(3))
                .depends_on(crate::graph::Dependency::on(ItemRef::new("t", "b"))),
        );
        let lost = InFlight {
            target: Some(Arc::new(Item::new("t", "a", properties(0)))),
            ..InFlight::new(OperationKind::Modify, "op-1".into(), 1, 8, 0, 10_000)
        };
        let after = settled_by_a_read(before, &lost, properties(0));
        let applied = after.applied.as_deref().expect("it exists");
        assert!(
            applied.dependency_on(&ItemRef::new("t", "b")).is_some(),
            "it may still rely on b: {applied:?}"
        );
        assert_asked_again(&after, &lost);
    }

    #[test]
    fn a_read_showing_a_target_that_adds_a_dependency_asks_the_modify_again() {
        // Simulator seed 41499 with drift and agents that restart: a lost
        // Modify set mtu to 1400 and gave the item a dependency on b; it
        // did not apply, but mtu drifted to 1400, so the READ showed every
        // property the target sets. The item was taken as modified, its
        // agent was never told of b, and its dependents were created
        // against a value it did not hold.
        let before = item_a(&[("mtu", 1500.into())]);
        let target = Arc::new(
            (*item_a(&[("mtu", 1400.into())])).clone().depends_on(
                crate::graph::Dependency::on(ItemRef::new("t", "b"))
                    .with_must_satisfy("self.mtu >= 1500"),
            ),
        );
        let lost = lost_modify_to(target.clone());
        let after = settled_by_a_read(before, &lost, properties_of(&[("mtu", 1400.into())]));
        let applied = after.applied.as_deref().expect("it exists");
        assert!(
            applied.dependency_on(&ItemRef::new("t", "b")).is_none(),
            "its agent may never have been told of b: {applied:?}"
        );
        assert_asked_again(&after, &lost);
    }

    #[test]
    fn a_read_showing_the_applied_value_keeps_the_target_of_a_lost_modify_as_maybe_applied() {
        // A lost Modify set state to down and gave the item a dependency on
        // b; it applied, then the item's state drifted back to up, so the
        // READ showed the applied value. The item may rely on b: had its
        // target been dropped, b could be deleted under it, and its agent
        // never told to drop b.
        let before = item_a(&[("state", "up".into())]);
        let target = Arc::new(
            (*item_a(&[("state", "down".into())]))
                .clone()
                .depends_on(crate::graph::Dependency::on(ItemRef::new("t", "b"))),
        );
        let lost = lost_modify_to(target.clone());
        let after = settled_by_a_read(
            before.clone(),
            &lost,
            properties_of(&[("state", "up".into())]),
        );
        assert_eq!(
            after.applied.as_ref(),
            Some(&before),
            "it shows its old value"
        );
        assert_eq!(
            after.rare.maybe_applied,
            vec![target],
            "it may hold the target, and rely on b"
        );
        assert!(
            after.edges().any(|edge| edge == &ItemRef::new("t", "b")),
            "b stays an edge until the item answers"
        );
    }

    #[test]
    fn a_read_showing_the_target_of_a_lost_takeover_asks_it_again() {
        // A lost Modify took over an item reported as external, setting v
        // to 2; drift may have set v to 2 without it, and a READ cannot
        // see whether the item is managed now.
        let mut reported = (*item_a(&[("v", 1.into())])).clone();
        reported.external = true;
        let lost = lost_modify_to(item_a(&[("v", 2.into())]));
        let after = settled_by_a_read(Arc::new(reported), &lost, properties_of(&[("v", 2.into())]));
        assert!(
            after
                .applied
                .as_deref()
                .is_some_and(|applied| applied.external),
            "not taken as managed: {after:?}"
        );
        assert_eq!(
            retried_op_id(&after),
            Some("op-1".into()),
            "asked again under its op id"
        );
    }

    /// A READ settling `lost`, an operation of an item holding `before`
    /// that lost operations may have left at one of `maybe` instead,
    /// answered with `observed`.
    fn settled_by_a_read_maybe_holding(
        before: Arc<Item>,
        maybe: Vec<Arc<Item>>,
        lost: &InFlight,
        observed: Properties,
    ) -> CurrentItem {
        let read = InFlight {
            resolves: Some(Box::new(lost.clone())),
            ..InFlight::new(OperationKind::Read, "op-2".into(), 1, 8, 0, 10_000)
        };
        let entry = CurrentItem {
            state: ItemState::Unknown,
            in_flight: Some(Box::new(read)),
            ..CurrentItem::created(before, 7)
        }
        .with_rare(|rare| rare.maybe_applied = maybe);
        completed(
            &CurrentGraph::default(),
            &entry,
            Completion::Resolved {
                observed: Some(observed),
            },
        )
        .expect("it exists")
    }

    /// `lost` was not taken as applied: its target is a value the item may
    /// hold, and it is asked again under its op id.
    fn assert_asked_again(after: &CurrentItem, lost: &InFlight) {
        assert_eq!(
            after.rare.maybe_applied,
            Vec::from_iter(lost.target.clone()),
            "it may hold the target"
        );
        assert_eq!(
            retried_op_id(after),
            Some(lost.op_id.clone()),
            "asked again under its op id"
        );
    }

    /// Item t/a with these properties.
    fn item_a(entries: &[(&str, serde_json::Value)]) -> Arc<Item> {
        Arc::new(Item::new("t", "a", properties_of(entries)))
    }

    /// A lost Modify (op-1) of t/a toward `target`.
    fn lost_modify_to(target: Arc<Item>) -> InFlight {
        InFlight {
            target: Some(target),
            ..InFlight::new(OperationKind::Modify, "op-1".into(), 1, 8, 0, 10_000)
        }
    }

    fn properties_of(entries: &[(&str, serde_json::Value)]) -> Properties {
        entries
            .iter()
            .map(|(key, value)| ((*key).to_owned(), value.clone()))
            .collect()
    }

    #[test]
    fn a_read_showing_a_property_only_a_value_the_item_may_hold_sets_asks_the_modify_again() {
        // The item holds {v: 1} or, after an earlier lost Modify, {v: 2,
        // vlan: 7}. A lost Modify to {v: 2} did not apply; the READ shows
        // the earlier value. Taken as applied, vlan would stay for good.
        let maybe = item_a(&[("v", 2.into()), ("vlan", 7.into())]);
        let lost = lost_modify_to(item_a(&[("v", 2.into())]));
        let after = settled_by_a_read_maybe_holding(
            item_a(&[("v", 1.into())]),
            vec![maybe.clone()],
            &lost,
            properties_of(&[("v", 2.into()), ("vlan", 7.into())]),
        );
        assert!(
            after.rare.maybe_applied.contains(&maybe),
            "it may still hold the earlier value: {after:?}"
        );
        assert_eq!(
            retried_op_id(&after),
            Some("op-1".into()),
            "asked again under its op id"
        );
    }

    #[test]
    fn a_read_showing_the_target_an_item_may_already_hold_takes_it_as_applied() {
        // An earlier delivery of the same Modify may have applied (its
        // target is among the values the item may hold): a READ showing
        // the target, told apart from the applied value, settles it.
        let target = item_a(&[("v", 2.into())]);
        let lost = lost_modify_to(target.clone());
        let after = settled_by_a_read_maybe_holding(
            item_a(&[("v", 1.into()), ("vlan", 2.into())]),
            vec![target.clone()],
            &lost,
            properties_of(&[("v", 2.into())]),
        );
        assert!(after.holds_only(&target), "it holds the target: {after:?}");
        assert_eq!(retried_op_id(&after), None, "nothing is asked again");
    }

    #[test]
    fn a_read_cannot_drop_a_dependency_of_a_value_the_item_may_hold() {
        // The item holds {v: 1} or, after an earlier lost Modify, {v: 2}
        // relying on b. A lost Modify to {v: 2} without b did not apply;
        // the READ shows v = 2. Taken as applied, b could be deleted while
        // the item relies on it.
        let maybe = Arc::new(
            Item::new("t", "a", properties_of(&[("v", 2.into())]))
                .depends_on(crate::graph::Dependency::on(ItemRef::new("t", "b"))),
        );
        let lost = lost_modify_to(item_a(&[("v", 2.into())]));
        let after = settled_by_a_read_maybe_holding(
            item_a(&[("v", 1.into())]),
            vec![maybe],
            &lost,
            properties_of(&[("v", 2.into())]),
        );
        assert!(
            after
                .values()
                .any(|value| value.dependency_on(&ItemRef::new("t", "b")).is_some()),
            "it may still rely on b: {after:?}"
        );
        assert_eq!(
            retried_op_id(&after),
            Some("op-1".into()),
            "asked again under its op id"
        );
    }

    #[test]
    fn a_read_still_showing_a_property_the_target_removes_asks_the_modify_again() {
        // Simulator seed 15609 with drift: a lost Modify removed `vlan` and
        // set v to 3; it did not apply, but v drifted to 3 and vlan to
        // another value, so the READ showed every property the target sets
        // and the vlan it removes. Taken as applied, the item was settled
        // with vlan left on it for good, and its dependents went ahead.
        let lost = lost_modify_to(item_a(&[("v", 3.into())]));
        let after = settled_by_a_read(
            item_a(&[("v", 1.into()), ("vlan", 2.into())]),
            &lost,
            properties_of(&[("v", 3.into()), ("vlan", 4.into())]),
        );
        let applied = after.applied.as_deref().expect("it exists");
        assert_eq!(
            applied.properties.get("vlan"),
            Some(&4.into()),
            "not taken as applied; the drift is read: {applied:?}"
        );
        assert_eq!(
            retried_op_id(&after),
            Some("op-1".into()),
            "asked again under its op id"
        );
    }

    #[test]
    fn a_read_that_cannot_tell_whether_a_lost_modify_applied_keeps_its_value_as_maybe_applied() {
        // Simulator seed 2049 with agents that restart: the lost Modify
        // only added a dependency, so the READ showed the same properties;
        // its item was taken as unmodified, and the new dependency was
        // deleted under it.
        let before = Arc::new(Item::new("t", "a", Default::default()));
        let mut after_modify = Item::new("t", "a", Default::default());
        after_modify
            .dependencies
            .push(crate::graph::Dependency::on(ItemRef::new("t", "b")));
        let lost = InFlight {
            target: Some(Arc::new(after_modify)),
            ..InFlight::new(OperationKind::Modify, "op-1".into(), 1, 8, 0, 10_000)
        };
        let after = settled_by_an_empty_read(before.clone(), &lost);
        assert_eq!(after.applied, Some(before));
        assert_eq!(
            after.rare.maybe_applied,
            Vec::from_iter(lost.target.clone())
        );
        assert_eq!(
            retried_op_id(&after),
            Some("op-1".into()),
            "asked again under its op id"
        );
    }

    #[test]
    fn a_lost_modify_the_read_cannot_tell_keeps_the_marks_it_was_sent_with() {
        // Simulator seed 52881 with agents that restart: a lost Modify
        // added a recreate-when-modified dependency on b while b had been
        // modified once, and applied; b was modified again; the READ could
        // not tell. The item was then modified, not recreated: no mark said
        // under which counter of b the value it may hold was applied.
        let before = Arc::new(Item::new("t", "a", Default::default()));
        let after_modify = Item::new("t", "a", Default::default()).depends_on(
            crate::graph::Dependency::on(ItemRef::new("t", "b")).with_recreate_when_modified(true),
        );
        let lost = InFlight {
            target: Some(Arc::new(after_modify)),
            dispatch_marks: [(ItemRef::new("t", "b"), 1)].into(),
            ..InFlight::new(OperationKind::Modify, "op-1".into(), 1, 8, 0, 10_000)
        };
        let after = settled_by_an_empty_read(before, &lost);
        assert_eq!(after.rare.maybe_applied, Vec::from_iter(lost.target));
        assert_eq!(after.rare.dependency_marks, lost.dispatch_marks);
    }

    #[test]
    fn the_older_of_two_marks_is_kept_and_an_absent_mark_wins() {
        let b = ItemRef::new("t", "b");
        let c = ItemRef::new("t", "c");
        let entry = CurrentItem::created(Arc::new(Item::new("t", "a", Default::default())), 7)
            .with_rare(|rare| {
                rare.dependency_marks.insert(b.clone(), 3);
                rare.dependency_marks.insert(c.clone(), 3);
            });
        let lost = InFlight {
            target: Some(Arc::new(Item::new(
                "t",
                "a",
                [("v".to_owned(), 1.into())].into_iter().collect(),
            ))),
            dispatch_marks: [(b.clone(), 2), (c.clone(), ABSENT_DEPENDENCY_MARK)].into(),
            ..InFlight::new(OperationKind::Modify, "op-1".into(), 1, 8, 0, 10_000)
        };
        let after = may_hold_target_of(entry, &lost);
        assert_eq!(after.rare.dependency_marks[&b], 2);
        assert_eq!(after.rare.dependency_marks[&c], ABSENT_DEPENDENCY_MARK);
    }

    #[test]
    fn an_item_that_may_hold_an_untied_value_does_not_go_with_the_external_item() {
        // Simulator seed 2911 with agents that restart: the item's applied
        // value was tied to `e/x`, the value it may hold instead was not;
        // marked gone whatever its lost Delete did, the Delete was given up
        // rather than resumed under its op id.
        let tied = value_of_a(true, 1);
        let untied = value_of_a(false, 2);
        let delete = InFlight::new(OperationKind::Delete, "op-3".into(), 1, 8, 0, 10_000);
        let entry = CurrentItem {
            state: ItemState::Unknown,
            in_flight: Some(Box::new(delete)),
            ..CurrentItem::created(tied, 7)
        }
        .with_rare(|rare| rare.maybe_applied = vec![untied]);
        let mut current = CurrentGraph::default();
        current.insert(ItemRef::new("t", "a"), entry);
        let updates = mark_gone_with_externals(&current, [ItemRef::new("e", "x")]);
        assert!(updates.is_empty(), "not marked: {updates:?}");
    }

    #[test]
    fn a_failed_tying_modify_of_an_item_that_may_hold_an_untied_value_keeps_the_item() {
        // `t/a` holds a value tied to `e/x` (auto_deleted_by_external), or
        // perhaps an untied one a lost Modify left (`maybe_applied`). A
        // Modify towards a tied value runs when `e/x` vanishes: marked gone
        // whatever that Modify does. It times out: it did not say what `a`
        // holds, and had `a` held the untied value, `a` still exists
        // (planning.md: dropped with an external item only if every value
        // it may hold goes with it; otherwise it is deleted).
        let entry = started(
            Some(
                &CurrentItem::created(value_of_a(true, 1), 7)
                    .with_rare(|rare| rare.maybe_applied = vec![value_of_a(false, 2)]),
            ),
            Some(value_of_a(true, 3)),
            InFlight::new(OperationKind::Modify, "op-2".into(), 1, 8, 0, 10_000),
        );
        let mut current = CurrentGraph::default();
        current.insert(ItemRef::new("t", "a"), entry);
        let updates = mark_gone_with_externals(&current, [ItemRef::new("e", "x")]);
        let [(_, Some(marked))] = updates.as_slice() else {
            panic!("one mark: {updates:?}");
        };
        assert!(marked.gone_with_external);
        let after = completed(&current, marked, timed_out());
        let after = after.expect("a may still exist with the untied value");
        assert!(
            after.values().any(|value| value.dependencies.is_empty()),
            "the untied value is still one a may hold: {after:?}"
        );
    }
}
