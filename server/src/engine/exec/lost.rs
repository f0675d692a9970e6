//! What becomes of an operation whose outcome was lost (its agent went
//! away, or the server restarted: the item is UNKNOWN) when an agent holds
//! its type again (DESIGN section 4, UNKNOWN and poison operations).
//!
//! Sent again under its op id and attempt when the agent says it still
//! runs it, or holds its result (it may apply whatever changed meanwhile,
//! so the server waits for its outcome; the agent de-duplicates). Else sent
//! again too, unless:
//! - an item it relies on is UNKNOWN too: it waits for that outcome (and
//!   for a Create or Modify of a dependency, running or waiting for its
//!   backoff);
//! - the item went with an external item while it ran: whatever it applied
//!   went too;
//! - it was lost too often (a poison operation): the loss counts as a
//!   failure;
//! - it is a Create or Modify whose target is no longer the intent (the
//!   item left it, or its intended value changed): DESIGN 4 re-issues a
//!   journaled operation only while its target is intended, so the planner
//!   sends what the intent needs now instead, with what this one may have
//!   done left uncertain;
//! - what it applies can no longer be applied (a dependency vanished, went
//!   with its external item while an operation of its own still runs, or
//!   no longer satisfies its predicate): the planner sends what the intent
//!   needs now instead, with what this one may have done left uncertain.
//!
//! Sent again to an agent that does not hold it, it may still have applied
//! before its outcome was lost (an agent that restarts forgets the results
//! it had not reported), so what it may have done stays possible until an
//! attempt reports DONE: a failure or WAIT of the attempt sent again does
//! not say the first one did nothing.

use crate::engine::plan::WaitReason;
use crate::engine::transition::{
    Completion, applied_uncertainly, completed, may_hold_target_of, started,
};
use crate::engine::waiting::WaitingSet;
use crate::graph::predicate::Predicate;
use crate::graph::{
    CurrentGraph, CurrentItem, Dependency, InFlight, IntendedGraph, ItemRef, ItemState,
    OperationError, OperationKind, code,
};

/// Re-deliveries of a lost operation that do not count as failed attempts
/// (DESIGN section 4, poison operations).
pub const MAX_REDELIVERIES: u32 = 5;

/// What to do with one lost operation.
#[derive(Debug, PartialEq)]
pub enum Redelivery {
    /// Not yet: an item it relies on is UNKNOWN.
    Defer,
    /// Not sent again; the item's record becomes `value` (`None`: the item
    /// is forgotten).
    GiveUp {
        /// The item's new record.
        value: Option<CurrentItem>,
        /// Why.
        why: GiveUpReason,
    },
    /// Not sent again yet: a READ asks the agent what exists, and its
    /// answer settles the operation (its type declares READ, and the agent
    /// that holds the type said the operation runs nowhere).
    Read,
    /// Sent again as `operation`, with the item's record `value`.
    Resend {
        /// The operation (its re-delivery counted).
        operation: InFlight,
        /// The item's record, running it again.
        value: CurrentItem,
    },
}

/// Why a lost operation is not sent again.
#[derive(Debug, PartialEq, Eq)]
pub enum GiveUpReason {
    /// The item went with an external item while the operation ran.
    GoneWithExternal,
    /// It was lost more than [`MAX_REDELIVERIES`] times.
    Poison,
    /// This dependency of what it applies no longer holds.
    BrokenDependency(ItemRef),
    /// What it applies is no longer the intent.
    Superseded,
}

/// Decides what becomes of `entry`'s lost `operation` (the item is
/// UNKNOWN). `waiting` is what the tenant's passes left waiting (a
/// dependency waiting for its backoff holds the operation back).
/// `agent_holds` is whether the agent that holds the type now
/// said it still runs the operation or holds its result (`None`: it does
/// not say); `readable` whether the type declares READ;
/// `delete_of_its_type_runs` whether a Delete of another item of its type
/// runs; `superseded` whether it is a Create or Modify whose target is no
/// longer the item's intended value. `retry_at` gives, for a number of
/// failures, when the type's retry policy tries again (`None`: never), for
/// a poison operation.
#[allow(clippy::too_many_arguments)]
pub fn redelivery(
    current: &CurrentGraph,
    waiting: &WaitingSet,
    item: &ItemRef,
    entry: &CurrentItem,
    operation: &InFlight,
    agent_holds: Option<bool>,
    readable: bool,
    delete_of_its_type_runs: bool,
    superseded: bool,
    now_ms: u64,
    retry_at: impl FnOnce(u32) -> Option<u64>,
) -> Redelivery {
    if agent_holds == Some(true) {
        // It runs there, or its result is on the way: whatever changed
        // meanwhile, its outcome is coming, and nothing may act as if it
        // never ran. Sent again, it is not started twice.
        //
        // Unless an item it relies on is UNKNOWN: the agent lists op ids,
        // not attempts, and the attempt it holds may be older than the one
        // journaled (the server journaled the next attempt and stopped
        // before sending it): sent now, that one would start while an item
        // it relies on is UNKNOWN (seed 40453, DESIGN 4). Put off, nothing
        // is lost: a result of the journaled attempt is taken whether or
        // not it was sent again, and an older one's is stale.
        if relies_on_unknown(current, item, entry) {
            return Redelivery::Defer;
        }
        return resend(entry, operation);
    }
    if entry.gone_with_external {
        // It ties the item to an external item that went while it ran. It
        // may still run at its agent (a lost outcome is not a stopped
        // operation), and apply after the external item came back: then
        // the item exists. So neither kind is sent again (an agent could
        // answer from its de-duplication cache for an item that went), and
        // the item's existence is uncertain: a lost Create may have applied
        // its target; a lost Modify left the value before it or its target.
        // The planner drops the item while its external item is gone, and
        // otherwise creates it again under a new op id (Creates are
        // idempotent) or deletes it (DESIGN 3, rule 9; DESIGN 4,
        // `previous_uncertain`).
        let unmarked = CurrentItem {
            gone_with_external: false,
            gone_unless_applied: false,
            ..entry.clone()
        };
        // A Delete, READ or question of a tied item changes nothing: the
        // item went.
        let value = match operation.kind {
            _ if operation.question => None,
            // If it did not apply, an item of uncertain existence may still
            // have the value it had before: dropped only if that value
            // goes too.
            OperationKind::Create => created_or_as_before(current, &unmarked),
            OperationKind::Modify => completed(
                current,
                &unmarked,
                Completion::Wait {
                    retry_at_ms: now_ms,
                },
            ),
            OperationKind::Delete | OperationKind::Read => None,
        }
        .map(|value| CurrentItem {
            existence_uncertain: true,
            ..value
        });
        return Redelivery::GiveUp {
            value,
            why: GiveUpReason::GoneWithExternal,
        };
    }
    // A READ only observes: it may resolve the item while a dependency's
    // outcome is unknown too (that dependency may stay unknown for long,
    // its agent gone). What the READ finds then waits for the dependency
    // like any operation would.
    let read_resolves = readable && agent_holds == Some(false);
    if superseded && !read_resolves {
        // Started afresh where no agent runs it, it would apply a value
        // the intent no longer has (seed 56317: a Create lost with its
        // session went out at the next registration, after its item had
        // left the intent). It may have applied before its outcome was
        // lost: the planner sends what the intent needs now, with that
        // left uncertain.
        return Redelivery::GiveUp {
            value: applied_or_not(current, entry, operation, &[], now_ms),
            why: GiveUpReason::Superseded,
        };
    }
    if !read_resolves && redelivery_waits(current, waiting, item, entry, delete_of_its_type_runs) {
        return Redelivery::Defer;
    }
    if operation.redeliveries >= MAX_REDELIVERIES {
        // A poison operation (it keeps losing its agent): from now on a
        // loss counts as an UNAVAILABLE failure, so it cannot loop forever
        // past the type's max_attempts.
        let error = OperationError {
            code: code::UNAVAILABLE,
            message: format!(
                "the operation's outcome was lost {} times (its agent went away each time)",
                operation.redeliveries + 1
            ),
        };
        let retry_at_ms = retry_at(entry.attempts.saturating_add(1));
        // Any of its deliveries may have applied before its outcome was
        // lost: the failure leaves that possible.
        let value = completed(
            current,
            &may_have_applied(entry, operation),
            Completion::Failed { error, retry_at_ms },
        );
        return Redelivery::GiveUp {
            value,
            why: GiveUpReason::Poison,
        };
    }
    if read_resolves {
        // It runs nowhere: what exists says what it did (DESIGN 4, "READ
        // resolves them"), with nothing left uncertain.
        return Redelivery::Read;
    }
    let broken = broken_dependencies(current, operation);
    if let Some(first) = broken.first() {
        return Redelivery::GiveUp {
            value: applied_or_not(current, entry, operation, &broken, now_ms),
            why: GiveUpReason::BrokenDependency(first.requires.clone()),
        };
    }
    resend(&may_have_applied(entry, operation), operation)
}

/// `entry` while the outcome of its `operation` is unknown: lost and sent
/// again to an agent that does not hold it (an agent that restarts
/// forgets the results it had not reported), or timed out (its DONE may
/// come after the cancel). The operation may have applied, so until an
/// attempt reports DONE, what it may have done stays possible. A Create's or Delete's item may exist or not
/// ([`CurrentItem::existence_uncertain`]: deleted if it must go, created
/// again before anything is built on it); a Modify's item, or a Create's
/// that had a value before, may have either value
/// ([`crate::graph::RareFields::maybe_applied`]: the new value's
/// dependencies stay edges).
pub fn may_have_applied(entry: &CurrentItem, operation: &InFlight) -> CurrentItem {
    if operation.question {
        return entry.clone();
    }
    match operation.kind {
        // If it exists, it has the Create's value, or the value it may
        // have had before (an item already of uncertain existence): both
        // values' dependencies stay edges, and a Delete names one.
        OperationKind::Create if entry.applied.is_none() => CurrentItem {
            existence_uncertain: true,
            applied: operation.target.clone(),
            applied_generation: operation.target_generation,
            ..entry.clone()
        },
        OperationKind::Create => may_hold_target_of(
            CurrentItem {
                existence_uncertain: true,
                ..entry.clone()
            },
            operation,
        ),
        OperationKind::Delete => CurrentItem {
            existence_uncertain: true,
            ..entry.clone()
        },
        OperationKind::Modify => may_hold_target_of(entry.clone(), operation),
        OperationKind::Read => entry.clone(),
    }
}

/// `operation` sent again, its re-delivery counted.
fn resend(entry: &CurrentItem, operation: &InFlight) -> Redelivery {
    let operation = InFlight {
        redeliveries: operation.redeliveries + 1,
        ..operation.clone()
    };
    let restarted = started(
        Some(&CurrentItem {
            state: ItemState::Created,
            ..entry.clone()
        }),
        operation.target.clone(),
        operation.clone(),
    );
    Redelivery::Resend {
        operation,
        value: CurrentItem {
            unknown_was_created: false,
            ..restarted
        },
    }
}

/// The record of an item whose lost Create or Modify is not sent again
/// because the dependencies `broken` of what it applies no longer hold
/// (none: because it is no longer the intent).
fn applied_or_not(
    current: &CurrentGraph,
    entry: &CurrentItem,
    operation: &InFlight,
    broken: &[&Dependency],
    now_ms: u64,
) -> Option<CurrentItem> {
    match (operation.kind, operation.target.as_ref()) {
        (OperationKind::Create, Some(_)) => {
            let gone_with_external = !broken.is_empty()
                && broken.iter().all(|dependency| {
                    dependency.auto_deleted_by_external()
                        && current
                            .get(&dependency.requires)
                            .is_none_or(|required| required.gone_with_external)
                });
            if gone_with_external {
                // Created or not, it went with the external item it was
                // auto-deleted by: nothing exists.
                return None;
            }
            // It may exist, on a dependency that no longer holds: existence
            // uncertain; the planner deletes it once nothing blocks that (an
            // UNKNOWN dependency does, DESIGN 4), or creates it again if it
            // stays intended and its dependency holds again.
            created_or_as_before(current, entry)
        }
        (OperationKind::Modify, Some(_)) if entry.gone_unless_applied => {
            // Its item went with an external item unless it applied: if it
            // exists, it has this value, on a dependency that no longer
            // holds. Existence uncertain, as for a Create above.
            applied_uncertainly(current, entry)
        }
        _ => {
            // A Modify ends as if the agent had said WAIT: the item exists
            // with the old value or the new one, no attempt is counted, and
            // the planner deletes it (rule 5) or, once the dependency holds
            // again, asks again under the same op id and attempt (an agent
            // that applied it answers with its result). Its target's
            // dependencies stay edges until an operation of the item
            // succeeds (it may hold it).
            completed(
                current,
                entry,
                Completion::Wait {
                    retry_at_ms: now_ms,
                },
            )
            .map(|value| may_hold_target_of(value, operation))
        }
    }
}

/// `entry` after its lost Create, which may have applied or not: the item
/// may not exist, may hold the Create's target, or, had the Create not
/// applied, any value it may have held before (an item already of
/// uncertain existence, whose Delete failed, say). Every such value's
/// dependencies stay edges: nothing it relies on is deleted under it.
fn created_or_as_before(current: &CurrentGraph, entry: &CurrentItem) -> Option<CurrentItem> {
    applied_uncertainly(current, entry).map(|created| {
        entry.values().fold(created, |created, before| {
            created.may_also_hold(Some(before.clone()))
        })
    })
}

/// Whether `operation`, a lost operation of `item`, is a Create or Modify
/// whose target is no longer `item`'s intended value (the item left the
/// intent, or its intended content is another): DESIGN 4 re-issues a
/// journaled operation only while its target is intended. (A target
/// intended again after a change, with the same content, is still
/// intended.) So is one whose target relies on an item that left the
/// intent: that item is planned for deletion, which DESIGN 2 makes an
/// unsatisfied dependency (seed 291807: a lost Create was sent again after
/// the item it relies on left the intent); the planner decides what the
/// item needs instead.
pub fn superseded(
    intended: &IntendedGraph,
    current: &CurrentGraph,
    item: &ItemRef,
    operation: &InFlight,
) -> bool {
    let Some(target) = operation.target.as_deref() else {
        return false;
    };
    if operation.question
        || !matches!(
            operation.kind,
            OperationKind::Create | OperationKind::Modify
        )
    {
        return false;
    }
    let leaving = |required: &ItemRef| {
        intended.get(required).is_none()
            && current
                .get(required)
                .is_some_and(|c| c.applied.as_ref().is_none_or(|a| !a.external))
    };
    intended
        .get(item)
        .is_none_or(|entry| !entry.item.same_content(target))
        || target
            .dependencies
            .iter()
            .any(|dependency| leaving(&dependency.requires))
}

/// Whether a Delete (not a question) runs on `entry`, sent and its outcome
/// not lost: a lost Create of its type sent again afresh waits for it
/// (DESIGN 3, rule 8).
pub fn runs_a_delete(entry: &CurrentItem) -> bool {
    entry.state != ItemState::Unknown
        && entry
            .in_flight
            .as_deref()
            .is_some_and(|operation| operation.kind == OperationKind::Delete && !operation.question)
}

/// Whether a value `item` may hold (`entry`'s applied, observed or
/// in-flight target) relies on an UNKNOWN item. Every value counts, as when
/// planning (seed 10544: a lost Delete sent again while a value an earlier
/// lost Create may have applied relied on an UNKNOWN item).
fn relies_on_unknown(current: &CurrentGraph, item: &ItemRef, entry: &CurrentItem) -> bool {
    entry
        .edges()
        .filter(|required| *required != item)
        .any(|required| {
            current
                .get(required)
                .is_some_and(|r| r.state == ItemState::Unknown)
        })
}

/// Whether the re-delivery of `item`'s lost operation must wait for a
/// dependency: one that `item` relies on (by any value it may hold, or the
/// lost operation's target) is UNKNOWN, or, for a lost Create or Modify, a
/// dependency of its target is being created, modified or deleted (a
/// Create or Modify waits for those, DESIGN 3), or waits in `waiting`
/// to be created or modified again at its backoff, or, for a lost Modify,
/// an operation runs on a dependent (rule 8). The owner tries again after
/// every command ([`super::Executor::redeliver_deferred`]).
fn waits_for_a_dependency(
    current: &CurrentGraph,
    waiting: &WaitingSet,
    item: &ItemRef,
    entry: &CurrentItem,
) -> bool {
    let operation = entry.in_flight.as_ref();
    let target = operation.and_then(|operation| operation.target.as_deref());
    let others = |value: &crate::graph::Item| -> Vec<ItemRef> {
        value
            .dependencies
            .iter()
            .map(|dependency| dependency.requires.clone())
            .filter(|required| required != item)
            .collect()
    };
    let unknown = relies_on_unknown(current, item, entry);
    let lost_kind = operation
        .filter(|operation| !operation.question)
        .map(|operation| operation.kind);
    let changing = matches!(
        lost_kind,
        Some(OperationKind::Create | OperationKind::Modify)
    ) && target.into_iter().flat_map(others).any(|required| {
        // Being created counts too: a dependency that went with its
        // external item while the lost operation ran, and whose Create
        // runs again, is not broken but on its way back.
        matches!(
            running_kind(current, &required),
            Some(OperationKind::Create | OperationKind::Modify | OperationKind::Delete)
        ) || asked_again_later(current, waiting, &required)
    });
    // A Modify also waits for the operations running on its dependents
    // (DESIGN 3, rule 8); not for an UNKNOWN dependent, whose lost
    // operation waits for this item (above): both would wedge.
    let dependent_runs = lost_kind == Some(OperationKind::Modify)
        && current.dependents_of(item).any(|dependent| {
            dependent != item
                && current
                    .get(dependent)
                    .is_some_and(|entry| entry.state != ItemState::Unknown)
                && running_kind(current, dependent).is_some_and(|kind| kind != OperationKind::Read)
        });
    unknown || changing || dependent_runs
}

/// Whether the re-delivery of `item`'s lost operation (in `entry`) to an
/// agent that does not hold it must wait: for a dependency
/// ([`waits_for_a_dependency`]), or, a Create, while a Delete of another
/// item of its type runs (`delete_of_its_type_runs`). Started afresh
/// there, a Create waits for those like any Create (DESIGN 3, rule 8: two
/// items contending for one resource never race). The owner tries again
/// after every command ([`super::Executor::redeliver_deferred`]), so the
/// Delete's result sends it.
pub fn redelivery_waits(
    current: &CurrentGraph,
    waiting: &WaitingSet,
    item: &ItemRef,
    entry: &CurrentItem,
    delete_of_its_type_runs: bool,
) -> bool {
    let creates = entry
        .in_flight
        .as_deref()
        .is_some_and(|operation| operation.kind == OperationKind::Create && !operation.question);
    (delete_of_its_type_runs && creates) || waits_for_a_dependency(current, waiting, item, entry)
}

/// Whether `item`'s own Create or Modify answered WAIT or failed and
/// waits in `waiting` for its backoff, to be sent again then (nothing runs
/// on it meanwhile). A lost operation that relies on it waits for that
/// attempt rather than giving up (seed 127716: a lost Create was given up,
/// and its item created again under a new op id, while its dependency's
/// Create, sent again, had answered WAIT). It waits no longer than the
/// plan does: once the backoff is over, the attempt runs (and the lost
/// operation waits for it as for any running operation) or is blocked,
/// and the lost operation's fate is decided on what holds then; a retry
/// the plan no longer has (a Delete's, of an item intended again) holds
/// nothing up.
fn asked_again_later(current: &CurrentGraph, waiting: &WaitingSet, item: &ItemRef) -> bool {
    waiting.get(item).is_some_and(|waits| {
        waits.reason == WaitReason::Backoff
            && matches!(
                waits.operation,
                OperationKind::Create | OperationKind::Modify
            )
    }) && current
        .get(item)
        .is_some_and(|entry| entry.state != ItemState::Unknown && entry.in_flight.is_none())
}

/// The kind of the operation (not a question) running on `item`.
fn running_kind(current: &CurrentGraph, item: &ItemRef) -> Option<OperationKind> {
    current
        .get(item)
        .and_then(|entry| entry.in_flight.as_ref())
        .filter(|running| !running.question)
        .map(|running| running.kind)
}

/// For a lost Create or Modify (not a question): the dependencies of the
/// value it applies that no longer hold (each must exist, be created and
/// satisfy its predicate).
pub fn broken_dependencies<'a>(
    current: &CurrentGraph,
    operation: &'a InFlight,
) -> Vec<&'a Dependency> {
    if operation.question
        || !matches!(
            operation.kind,
            OperationKind::Create | OperationKind::Modify
        )
    {
        return Vec::new();
    }
    let Some(target) = operation.target.as_ref() else {
        return Vec::new();
    };
    target
        .dependencies
        .iter()
        .filter(|dependency| {
            !current.get(&dependency.requires).is_some_and(|required| {
                // One that went with its external item is gone whatever
                // its running operation (a Delete, READ or question) does.
                !required.gone_with_external
                    && required.is_created()
                    && (dependency.must_satisfy().is_empty()
                        || Predicate::compile(dependency.must_satisfy())
                            .and_then(|predicate| {
                                predicate.evaluate(&required.effective_properties())
                            })
                            .unwrap_or(false))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc as Shared;

    use super::*;
    use crate::graph::Item;

    fn lost_create(target: Item) -> (InFlight, CurrentItem) {
        let operation = InFlight {
            target: Some(Shared::new(target)),
            ..InFlight::new(OperationKind::Create, "op".into(), 1, 1, 0, 10_000)
        };
        let entry = CurrentItem {
            state: ItemState::Unknown,
            ..CurrentItem::creating(operation.clone())
        };
        (operation, entry)
    }

    /// A lost Create of `t/a`, relying on `t/{name}`.
    fn lost_create_on(name: &str) -> (InFlight, CurrentItem) {
        lost_create(Item::new("t", "a", Default::default()).depends_on(on(name)))
    }

    fn on(name: &str) -> Dependency {
        Dependency::on(ItemRef::new("t", name))
    }

    fn graph_with(entries: Vec<(&str, CurrentItem)>) -> CurrentGraph {
        let mut graph = CurrentGraph::default();
        for (name, entry) in entries {
            graph.insert(ItemRef::new("t", name), entry);
        }
        graph
    }

    fn created(name: &str) -> CurrentItem {
        CurrentItem::created(Shared::new(Item::new("t", name, Default::default())), 1)
    }

    fn never(_: u32) -> Option<u64> {
        None
    }

    /// What becomes of `t/a`'s lost `operation` at time 5, with no retry
    /// policy.
    fn decide(
        graph: &CurrentGraph,
        entry: &CurrentItem,
        operation: &InFlight,
        agent_holds: Option<bool>,
    ) -> Redelivery {
        decide_knowing(graph, entry, operation, agent_holds, false, false)
    }

    /// [`redelivery`] of `t/a`'s lost operation at 5 ms, for a type whose
    /// retry policy never tries again, its target still intended.
    fn decide_knowing(
        graph: &CurrentGraph,
        entry: &CurrentItem,
        operation: &InFlight,
        agent_holds: Option<bool>,
        readable: bool,
        delete_of_its_type_runs: bool,
    ) -> Redelivery {
        let facts = [readable, delete_of_its_type_runs, false];
        decide_given(graph, entry, operation, agent_holds, facts)
    }

    /// [`decide`], for a lost operation whose target is no longer the
    /// intent.
    fn decide_superseded(
        graph: &CurrentGraph,
        entry: &CurrentItem,
        operation: &InFlight,
        agent_holds: Option<bool>,
    ) -> Redelivery {
        decide_given(graph, entry, operation, agent_holds, [false, false, true])
    }

    /// [`redelivery`] of `t/a`'s lost operation at 5 ms, for a type whose
    /// retry policy never tries again, nothing waiting; `facts` are whether
    /// the type is readable, whether a Delete of its type runs, and whether
    /// the operation is superseded.
    fn decide_given(
        graph: &CurrentGraph,
        entry: &CurrentItem,
        operation: &InFlight,
        agent_holds: Option<bool>,
        facts: [bool; 3],
    ) -> Redelivery {
        let waiting = WaitingSet::default();
        decide_amid_given(graph, &waiting, entry, operation, agent_holds, facts)
    }

    /// [`decide`] with `waiting` what the tenant's passes left waiting.
    fn decide_amid(
        graph: &CurrentGraph,
        waiting: &WaitingSet,
        entry: &CurrentItem,
        operation: &InFlight,
    ) -> Redelivery {
        decide_amid_given(graph, waiting, entry, operation, None, [false; 3])
    }

    /// [`decide_given`] with `waiting` what the tenant's passes left
    /// waiting.
    fn decide_amid_given(
        graph: &CurrentGraph,
        waiting: &WaitingSet,
        entry: &CurrentItem,
        operation: &InFlight,
        agent_holds: Option<bool>,
        [readable, delete_of_its_type_runs, superseded]: [bool; 3],
    ) -> Redelivery {
        redelivery(
            graph,
            waiting,
            &ItemRef::new("t", "a"),
            entry,
            operation,
            agent_holds,
            readable,
            delete_of_its_type_runs,
            superseded,
            5,
            never,
        )
    }

    #[test]
    fn a_lost_create_whose_dependencies_hold_is_sent_again_as_the_same_operation() {
        let (operation, entry) = lost_create_on("b");
        let graph = graph_with(vec![("b", created("b"))]);
        let Redelivery::Resend {
            operation: again,
            value,
        } = decide(&graph, &entry, &operation, None)
        else {
            panic!("sent again");
        };
        assert_eq!((again.op_id.as_str(), again.attempt), ("op", 1));
        assert_eq!(again.redeliveries, 1);
        assert_eq!(value.state, ItemState::Creating);
    }

    #[test]
    fn a_lost_create_on_a_predicate_that_cannot_be_evaluated_is_not_sent_again() {
        // A predicate that does not evaluate is not satisfied (DESIGN 3):
        // the dependency no longer holds, as if it were false.
        let target = Item::new("t", "a", Default::default())
            .depends_on(on("b").with_must_satisfy("self.missing == 1"));
        let (operation, entry) = lost_create(target);
        let graph = graph_with(vec![("b", created("b"))]);
        let decision = decide(&graph, &entry, &operation, Some(false));
        assert!(
            matches!(
                &decision,
                Redelivery::GiveUp {
                    why: GiveUpReason::BrokenDependency(required),
                    ..
                } if *required == ItemRef::new("t", "b")
            ),
            "{decision:?}"
        );
    }

    #[test]
    fn a_lost_delete_sent_again_to_an_agent_that_does_not_hold_it_may_have_deleted_its_item() {
        // The agent restarted and forgot: the Delete may have applied before
        // its outcome was lost, so until an attempt reports, the item may
        // already be gone (DESIGN 4).
        let operation = InFlight::new(OperationKind::Delete, "op".into(), 1, 1, 0, 10_000);
        let entry = CurrentItem {
            state: ItemState::Unknown,
            in_flight: Some(Box::new(operation.clone())),
            ..created("a")
        };
        let Redelivery::Resend { value, .. } =
            decide(&CurrentGraph::default(), &entry, &operation, Some(false))
        else {
            panic!("sent again");
        };
        assert!(value.existence_uncertain);
        assert_eq!(value.state, ItemState::Deleting);
    }

    /// `a`'s lost Create on `b`, and a graph where `b` is UNKNOWN.
    fn lost_create_on_unknown_b() -> (InFlight, CurrentItem, CurrentGraph) {
        let (operation, entry) = lost_create_on("b");
        let unknown = CurrentItem {
            state: ItemState::Unknown,
            ..created("b")
        };
        (operation, entry, graph_with(vec![("b", unknown)]))
    }

    #[test]
    fn a_lost_operation_waits_while_a_dependency_is_unknown() {
        let (operation, entry, graph) = lost_create_on_unknown_b();
        assert_eq!(decide(&graph, &entry, &operation, None), Redelivery::Defer);
    }

    #[test]
    fn a_lost_operation_the_agent_lists_waits_while_a_dependency_is_unknown() {
        // Simulator seed 40453: the agent listed the op id for the result
        // of an earlier attempt; the journaled attempt, never sent, went
        // out while a dependency was UNKNOWN. A result of the journaled
        // attempt is still taken while it waits.
        let (operation, entry, graph) = lost_create_on_unknown_b();
        assert_eq!(
            decide(&graph, &entry, &operation, Some(true)),
            Redelivery::Defer
        );
        let known = graph_with(vec![("b", created("b"))]);
        assert!(matches!(
            decide(&known, &entry, &operation, Some(true)),
            Redelivery::Resend { .. }
        ));
    }

    #[test]
    fn a_lost_delete_waits_while_a_value_the_item_may_hold_relies_on_an_unknown_item() {
        // Simulator seed 10544: `a`'s applied value relies on nothing, but
        // an earlier lost Create may have applied one relying on `b`. Its
        // lost Delete, sent again while `b` was UNKNOWN, was an operation
        // on a dependent of an UNKNOWN item (DESIGN 4).
        let tied = Shared::new(Item::new("t", "a", Default::default()).depends_on(on("b")));
        let operation = InFlight::new(OperationKind::Delete, "op".into(), 1, 1, 0, 10_000);
        let entry = CurrentItem {
            state: ItemState::Unknown,
            in_flight: Some(Box::new(operation.clone())),
            ..created("a")
        }
        .may_also_hold(Some(tied));
        let unknown = CurrentItem {
            state: ItemState::Unknown,
            ..created("b")
        };
        let graph = graph_with(vec![("b", unknown)]);
        assert_eq!(decide(&graph, &entry, &operation, None), Redelivery::Defer);
        assert!(redelivery_waits(
            &graph,
            &WaitingSet::default(),
            &ItemRef::new("t", "a"),
            &entry,
            false
        ));
    }

    #[test]
    fn a_lost_modify_waits_for_a_dependent_s_delete_but_not_for_an_unknown_dependent() {
        // Rule 8: a Modify waits for the operations running on its
        // dependents (seed 12078: sent again beside a dependent's Delete).
        // But an UNKNOWN dependent's lost operation waits for this item in
        // turn (it relies on it): waiting for it too wedged both for good
        // (seed 54).
        let target = Item::new(
            "t",
            "a",
            [("v".to_string(), 2.into())].into_iter().collect(),
        );
        let operation = InFlight {
            target: Some(Shared::new(target)),
            ..InFlight::new(OperationKind::Modify, "op".into(), 1, 2, 0, 10_000)
        };
        let entry = CurrentItem {
            state: ItemState::Unknown,
            in_flight: Some(Box::new(operation.clone())),
            ..created("a")
        };
        let dependent = |state| {
            let value = Item::new("t", "d", Default::default()).depends_on(on("a"));
            let delete = InFlight::new(OperationKind::Delete, "op-d".into(), 1, 1, 0, 10_000);
            CurrentItem {
                state,
                in_flight: Some(Box::new(delete)),
                ..CurrentItem::created(Shared::new(value), 1)
            }
        };
        let deleting = graph_with(vec![
            ("a", entry.clone()),
            ("d", dependent(ItemState::Deleting)),
        ]);
        assert_eq!(
            decide(&deleting, &entry, &operation, Some(false)),
            Redelivery::Defer
        );
        let unknown = graph_with(vec![
            ("a", entry.clone()),
            ("d", dependent(ItemState::Unknown)),
        ]);
        assert!(matches!(
            decide(&unknown, &entry, &operation, Some(false)),
            Redelivery::Resend { .. }
        ));
    }

    #[test]
    fn a_read_resolves_the_item_while_a_dependency_is_unknown() {
        let (operation, entry, graph) = lost_create_on_unknown_b();
        let decision = decide_knowing(&graph, &entry, &operation, Some(false), true, false);
        assert_eq!(
            decision,
            Redelivery::Read,
            "a READ only observes: b's unknown outcome does not hold it"
        );
    }

    #[test]
    fn a_lost_create_sent_again_afresh_waits_while_a_delete_of_its_type_runs() {
        let (operation, entry) = lost_create(Item::new("t", "a", Default::default()));
        let decide_with = |holds, delete_runs| {
            decide_knowing(
                &CurrentGraph::default(),
                &entry,
                &operation,
                holds,
                false,
                delete_runs,
            )
        };
        assert_eq!(decide_with(Some(false), true), Redelivery::Defer);
        assert_eq!(decide_with(None, true), Redelivery::Defer);
        assert!(
            matches!(decide_with(Some(true), true), Redelivery::Resend { .. }),
            "one the agent still runs attaches to what already runs"
        );
        assert!(matches!(
            decide_with(Some(false), false),
            Redelivery::Resend { .. }
        ));
    }

    #[test]
    fn a_lost_modify_does_not_wait_for_the_deletes_of_its_type() {
        let before = Item::new("t", "a", Default::default());
        let (operation, entry) = lost_create(before.clone());
        let operation = InFlight {
            kind: OperationKind::Modify,
            ..operation
        };
        let entry = CurrentItem {
            applied: Some(Shared::new(before)),
            in_flight: Some(Box::new(operation.clone())),
            ..entry
        };
        let decided = decide_knowing(
            &CurrentGraph::default(),
            &entry,
            &operation,
            Some(false),
            false,
            true,
        );
        assert!(matches!(decided, Redelivery::Resend { .. }), "{decided:?}");
    }

    #[test]
    fn a_lost_create_waits_while_its_dependency_is_created_again() {
        // b went with its external item while a's Create ran, came back,
        // and its Create runs: a's Create is not given up but sent again
        // under its op id once b exists.
        let (operation, entry) = lost_create_on("b");
        let b_create = InFlight::new(OperationKind::Create, "b-op".into(), 1, 1, 0, 10_000);
        let graph = graph_with(vec![("b", CurrentItem::creating(b_create))]);
        assert_eq!(decide(&graph, &entry, &operation, None), Redelivery::Defer);

        let graph = graph_with(vec![("b", created("b"))]);
        let Redelivery::Resend {
            operation: again, ..
        } = decide(&graph, &entry, &operation, None)
        else {
            panic!("sent again once b exists");
        };
        assert_eq!((again.op_id.as_str(), again.attempt), ("op", 1));
    }

    #[test]
    fn a_lost_create_on_a_vanished_dependency_is_of_uncertain_existence() {
        let (operation, entry) = lost_create_on("gone");
        let Redelivery::GiveUp { value, why } =
            decide(&CurrentGraph::default(), &entry, &operation, None)
        else {
            panic!("not sent again");
        };
        assert_eq!(
            why,
            GiveUpReason::BrokenDependency(ItemRef::new("t", "gone"))
        );
        let value = value.expect("kept: it may exist");
        assert!(value.existence_uncertain && value.in_flight.is_none());
    }

    #[test]
    fn a_lost_create_waits_for_its_dependencys_create_while_that_waits_for_its_backoff() {
        // b's Create answered WAIT and waits to be sent again (seed 127716
        // gave a's Create up meanwhile). Once b no longer waits for its
        // backoff, with nothing running on it, b does not hold what a
        // applies.
        let (operation, entry) = lost_create_on("b");
        let not_created = CurrentItem {
            existence_uncertain: true,
            last_operation: Some(OperationKind::Create),
            ..created("b")
        };
        let graph = graph_with(vec![("b", not_created)]);
        let waiting_for = |reason: WaitReason| {
            let mut waiting = WaitingSet::default();
            waiting.insert(crate::engine::plan::WaitingItem {
                item: ItemRef::new("t", "b"),
                operation: OperationKind::Create,
                reason,
                blocked_by: Vec::new(),
            });
            waiting
        };
        let decide_while = |waiting: &WaitingSet| decide_amid(&graph, waiting, &entry, &operation);
        assert_eq!(
            decide_while(&waiting_for(WaitReason::Backoff)),
            Redelivery::Defer
        );
        for waiting in [waiting_for(WaitReason::Dependency), WaitingSet::default()] {
            let Redelivery::GiveUp { why, .. } = decide_while(&waiting) else {
                panic!("b is not created and not about to be: a is not sent again");
            };
            assert_eq!(why, GiveUpReason::BrokenDependency(ItemRef::new("t", "b")));
        }
    }

    #[test]
    fn a_lost_create_on_a_dependency_gone_with_its_external_item_is_not_sent_again() {
        // b went with its external item while a question about it ran: it
        // stays in the graph until that question reports, but it is gone
        // whatever the answer, so a's Create cannot be applied (seed
        // 187463 sent it on b's record).
        let (operation, entry) = lost_create_on("b");
        let question = InFlight {
            question: true,
            ..InFlight::new(OperationKind::Modify, "b-op".into(), 1, 2, 0, 10_000)
        };
        let going = CurrentItem {
            in_flight: Some(Box::new(question)),
            gone_with_external: true,
            ..created("b")
        };
        let Redelivery::GiveUp { value, why } =
            decide(&graph_with(vec![("b", going)]), &entry, &operation, None)
        else {
            panic!("not sent again");
        };
        assert_eq!(why, GiveUpReason::BrokenDependency(ItemRef::new("t", "b")));
        let value = value.expect("kept: it may exist");
        assert!(value.existence_uncertain && value.in_flight.is_none());
    }

    #[test]
    fn a_lost_operation_the_agent_still_runs_is_waited_for_whatever_changed() {
        // Its dependency vanished: were it given up, the dependency could
        // be deleted under an operation that still runs at the agent.
        let (operation, entry) = lost_create_on("gone");
        let decided = decide(&CurrentGraph::default(), &entry, &operation, Some(true));
        let Redelivery::Resend {
            operation: again,
            value,
        } = decided
        else {
            panic!("waited for: {decided:?}");
        };
        assert_eq!((again.op_id.as_str(), again.attempt), ("op", 1));
        assert_eq!(value.state, ItemState::Creating);
        // An agent that lists what it runs, without this one, gets the
        // decision for an operation that no longer runs anywhere.
        assert!(matches!(
            decide(&CurrentGraph::default(), &entry, &operation, Some(false)),
            Redelivery::GiveUp { .. }
        ));
    }

    #[test]
    fn a_lost_create_auto_deleted_with_a_vanished_external_item_is_forgotten() {
        let mut tied = on("x");
        tied.set_auto_deleted_by_external(true);
        let (operation, entry) =
            lost_create(Item::new("t", "a", Default::default()).depends_on(tied));
        let decided = decide(&CurrentGraph::default(), &entry, &operation, None);
        assert!(
            matches!(decided, Redelivery::GiveUp { value: None, .. }),
            "{decided:?}"
        );
    }

    #[test]
    fn a_poison_operation_fails_with_unavailable_and_the_types_retry_time() {
        let (operation, entry) = lost_create(Item::new("t", "a", Default::default()));
        let operation = InFlight {
            redeliveries: MAX_REDELIVERIES,
            ..operation
        };
        let Redelivery::GiveUp { value, why } = redelivery(
            &CurrentGraph::default(),
            &WaitingSet::default(),
            &ItemRef::new("t", "a"),
            &entry,
            &operation,
            None,
            false,
            false,
            false,
            5,
            |failures| Some(100 * u64::from(failures)),
        ) else {
            panic!("not sent again");
        };
        assert_eq!(why, GiveUpReason::Poison);
        let value = value.expect("failed");
        assert_eq!(value.state, ItemState::Failed);
        assert_eq!(
            value.rare.last_error.as_ref().map(|e| e.code),
            Some(code::UNAVAILABLE)
        );
        assert_eq!(value.rare.next_attempt_at_ms, Some(100));
        assert!(
            value.may_exist() && !value.is_created(),
            "one of its deliveries may have created it"
        );
    }

    #[test]
    fn a_lost_create_of_an_item_gone_with_its_external_item_may_exist_with_its_target() {
        let (operation, entry) = lost_create(Item::new("t", "a", Default::default()));
        let entry = CurrentItem {
            gone_with_external: true,
            ..entry
        };
        let Redelivery::GiveUp { value, why } =
            decide(&CurrentGraph::default(), &entry, &operation, None)
        else {
            panic!("not sent again");
        };
        assert_eq!(why, GiveUpReason::GoneWithExternal);
        let value =
            value.expect("it may exist: the Create may run after the external item is back");
        assert!(value.existence_uncertain && !value.gone_with_external);
        assert!(value.in_flight.is_none());
        assert_eq!(value.applied, operation.target);
    }

    #[test]
    fn a_lost_modify_of_an_item_gone_with_its_external_item_may_still_exist() {
        let modify = InFlight {
            target: Some(Shared::new(Item::new("t", "a", Default::default()))),
            ..InFlight::new(OperationKind::Modify, "op".into(), 1, 2, 0, 10_000)
        };
        let entry = CurrentItem {
            state: ItemState::Unknown,
            in_flight: Some(Box::new(modify.clone())),
            gone_with_external: true,
            unknown_was_created: true,
            ..created("a")
        };
        let Redelivery::GiveUp { value, why } =
            decide(&CurrentGraph::default(), &entry, &modify, None)
        else {
            panic!("not sent again");
        };
        assert_eq!(why, GiveUpReason::GoneWithExternal);
        let value = value.expect("it may exist");
        assert!(value.existence_uncertain && !value.gone_with_external);
    }

    #[test]
    fn a_lost_operation_of_a_readable_type_that_runs_nowhere_is_resolved_by_a_read() {
        let (operation, entry) = lost_create_on("gone");
        let read = |holds, readable| {
            decide_knowing(
                &CurrentGraph::default(),
                &entry,
                &operation,
                holds,
                readable,
                false,
            )
        };
        assert_eq!(read(Some(false), true), Redelivery::Read);
        // Still running at the agent: its outcome is coming.
        assert!(matches!(read(Some(true), true), Redelivery::Resend { .. }));
        // An agent that does not say may still run it; a type without
        // READ cannot be asked.
        assert!(matches!(read(None, true), Redelivery::GiveUp { .. }));
        assert!(matches!(
            read(Some(false), false),
            Redelivery::GiveUp { .. }
        ));
    }

    #[test]
    fn a_lost_create_whose_target_left_the_intent_is_not_started_afresh() {
        // Simulator seed 56317: the Create was lost with its session, its
        // item left the intent, and the next registration sent it again.
        let (operation, entry) = lost_create_on("b");
        let graph = graph_with(vec![("b", created("b"))]);
        for agent_holds in [Some(false), None] {
            let Redelivery::GiveUp { value, why } =
                decide_superseded(&graph, &entry, &operation, agent_holds)
            else {
                panic!("not sent again ({agent_holds:?})");
            };
            assert_eq!(why, GiveUpReason::Superseded);
            let value = value.expect("it may exist");
            assert!(value.existence_uncertain && value.in_flight.is_none());
            assert_eq!(
                value.applied, operation.target,
                "what it may have created is deleted or replaced, not forgotten"
            );
        }
        // An agent that still runs it: its outcome is coming (the planner
        // cancels it as for any superseded operation).
        assert!(matches!(
            decide_superseded(&graph, &entry, &operation, Some(true)),
            Redelivery::Resend { .. }
        ));
    }

    #[test]
    fn a_lost_create_sent_again_to_an_agent_that_does_not_hold_it_may_have_created_its_item() {
        // Simulator seed 62 with agents that restart: the agent applied the
        // Create, restarted before reporting it, and timed out on the
        // Create sent again; taken as never applied, the item's dependency
        // was deleted under it.
        let (operation, entry) = lost_create_on("b");
        let graph = graph_with(vec![("b", created("b"))]);
        let Redelivery::Resend { value, .. } = decide(&graph, &entry, &operation, Some(false))
        else {
            panic!("sent again");
        };
        assert!(value.existence_uncertain);
        assert_eq!(value.applied, operation.target, "a Delete would name it");
        let timed_out = Completion::Failed {
            error: OperationError {
                code: code::DEADLINE_EXCEEDED,
                message: "the operation did not finish within 10000 ms".into(),
            },
            retry_at_ms: Some(20),
        };
        let after = completed(&graph, &value, timed_out).expect("kept");
        assert!(after.may_exist() && !after.is_created());
        let done = completed(&graph, &value, Completion::Done { observed: None }).expect("created");
        assert!(done.is_created() && !done.existence_uncertain);
    }

    #[test]
    fn a_lost_modify_sent_again_to_an_agent_that_does_not_hold_it_may_have_applied_its_value() {
        let target = Shared::new(Item::new("t", "a", Default::default()).depends_on(on("b")));
        let modify = InFlight {
            target: Some(target.clone()),
            ..InFlight::new(OperationKind::Modify, "op".into(), 1, 2, 0, 10_000)
        };
        let entry = CurrentItem {
            state: ItemState::Unknown,
            in_flight: Some(Box::new(modify.clone())),
            unknown_was_created: true,
            ..created("a")
        };
        let graph = graph_with(vec![("b", created("b"))]);
        let Redelivery::Resend { value, .. } = decide(&graph, &entry, &modify, Some(false)) else {
            panic!("sent again");
        };
        assert_eq!(value.rare.maybe_applied, [target]);
        assert!(!value.existence_uncertain);
    }

    #[test]
    fn a_second_lost_modify_sent_again_keeps_the_value_the_first_may_have_applied() {
        // Simulator seed 18627: the first lost Modify's value relied on
        // `b`, the second's did not. The second replaced the first as the
        // one value the item may hold, `b` stopped counting as a
        // dependency, and was deleted under the agent's item.
        let first = Shared::new(Item::new("t", "a", Default::default()).depends_on(on("b")));
        let mut untied = Item::new("t", "a", Default::default());
        untied.properties.insert("v".into(), 2.into());
        let second = Shared::new(untied);
        let modify_to = |target: &Shared<Item>, op_id: &str| InFlight {
            target: Some(target.clone()),
            ..InFlight::new(OperationKind::Modify, op_id.into(), 1, 2, 0, 10_000)
        };
        let entry = CurrentItem {
            state: ItemState::Unknown,
            in_flight: Some(Box::new(modify_to(&second, "op-2"))),
            unknown_was_created: true,
            ..created("a")
        }
        .may_also_hold(Some(first.clone()));
        let graph = graph_with(vec![("b", created("b"))]);
        let Redelivery::Resend { value, .. } =
            decide(&graph, &entry, &modify_to(&second, "op-2"), Some(false))
        else {
            panic!("sent again");
        };
        assert_eq!(value.rare.maybe_applied, [first.clone(), second]);
        let edges = graph_with(vec![("b", created("b")), ("a", value)]);
        assert!(
            edges
                .dependents_of(&ItemRef::new("t", "b"))
                .any(|dependent| dependent.name().as_ref() == "a"),
            "b stays a dependency of a while a may hold the first value"
        );
    }

    #[test]
    fn a_lost_operation_the_agent_holds_is_sent_again_with_nothing_uncertain() {
        let (operation, entry) = lost_create(Item::new("t", "a", Default::default()));
        let Redelivery::Resend { value, .. } =
            decide(&CurrentGraph::default(), &entry, &operation, Some(true))
        else {
            panic!("sent again");
        };
        assert!(!value.existence_uncertain && value.applied.is_none());
    }

    #[test]
    fn a_lost_create_gone_with_its_external_item_keeps_the_value_its_item_may_have_had() {
        // Simulator seed 227835: an item of uncertain existence, created
        // again with a value tied to an external item that then vanished,
        // was dropped with it, although, had the Create not applied, it
        // still existed with its old, untied value.
        let (operation, entry) = lost_create(Item::new("t", "a", Default::default()));
        let before = Shared::new(Item::new("t", "a", Default::default()).depends_on(on("b")));
        let entry = CurrentItem {
            gone_with_external: true,
            existence_uncertain: true,
            applied: Some(before.clone()),
            ..entry
        };
        let Redelivery::GiveUp { value, .. } =
            decide(&CurrentGraph::default(), &entry, &operation, None)
        else {
            panic!("not sent again");
        };
        let value = value.expect("it may exist");
        assert_eq!(value.applied, operation.target);
        assert_eq!(value.rare.maybe_applied, [before]);
    }

    #[test]
    fn a_lost_create_on_a_broken_dependency_keeps_the_value_its_item_may_have_had() {
        // Simulator seed 272739: an item whose Deletes timed out (existence
        // uncertain, its old value relying on c) was created again with a
        // value relying on b being "up"; that Create's outcome was lost, and
        // b went down, so the Create was not sent again. The record kept
        // only the Create's value, so c was deleted while the item, had the
        // Create not applied, still relied on it.
        let (operation, entry) = lost_create(
            Item::new("t", "a", Default::default())
                .depends_on(on("b").with_must_satisfy("self.state == \"up\"")),
        );
        let before = Shared::new(Item::new("t", "a", Default::default()).depends_on(on("c")));
        let entry = CurrentItem {
            existence_uncertain: true,
            applied: Some(before.clone()),
            ..entry
        };
        let mut down = crate::graph::Properties::new();
        down.insert("state".into(), serde_json::json!("down"));
        let b_down = CurrentItem::created(Shared::new(Item::new("t", "b", down)), 1);
        let graph = graph_with(vec![("b", b_down), ("c", created("c"))]);
        let Redelivery::GiveUp { value, why } = decide(&graph, &entry, &operation, None) else {
            panic!("not sent again");
        };
        assert_eq!(why, GiveUpReason::BrokenDependency(ItemRef::new("t", "b")));
        let value = value.expect("it may exist");
        assert!(value.existence_uncertain && value.in_flight.is_none());
        assert_eq!(value.applied, operation.target);
        assert_eq!(value.rare.maybe_applied, [before]);
    }
}
