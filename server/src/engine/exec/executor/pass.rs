//! A pass: plan what the tenant needs, stage the plan's bookkeeping,
//! journal the operations there is room for, remember who waits for what,
//! recompute the conditions, and mark superseded operations cancelled.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use rustc_hash::FxHashSet;

use super::Holder;
use super::{Executor, Now, Scope, to_session};
use crate::engine::conditions::{Progress, compute_conditions};
use crate::engine::exec::effects::Started;
use crate::engine::exec::model::TenantModel;
use crate::engine::exec::port::{OperationOrder, ToAgent};
use crate::engine::exec::registry::TypeRegistry;
use crate::engine::exec::room::{Limits, Room, Running};
use crate::engine::exec::spec::DEFAULT_MAX_IN_FLIGHT;
use crate::engine::plan::{
    BlockedBy, Plan, PlanEnvironment, TypeRules, WaitReason, WaitingItem, plan_operations,
    runs_first,
};
use crate::engine::transition::{
    CurrentUpdates, bookkeeping_updates, record_dispatch_marks, started,
};
use crate::graph::{CurrentGraph, InFlight, ItemRef, ItemState, OperationKind};

/// Waiters kept waiting on blockers that only left the intent, by blocker.
type KeptWaiting = Vec<(ItemRef, Vec<ItemRef>)>;

/// Whether a pass dispatches the operations it finds ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dispatch {
    /// Journals them (sent once the commit is durable) or queues them
    /// for room.
    Now,
    /// Leaves them unconverged, for a later pass of the same input.
    Held,
}

/// The planner's view of the world, as the executor sees it.
pub(super) struct Environment<'a> {
    types: &'a TypeRegistry,
    sessions: &'a BTreeMap<String, Holder>,
    model: &'a TenantModel,
    operations: &'a BTreeMap<String, ItemRef>,
    room: &'a Room,
    /// Seeds taken from the room's queue that nothing else changed, with
    /// the operation each was queued for.
    for_room: Option<&'a BTreeMap<ItemRef, OperationKind>>,
    now_ms: u64,
}

impl PlanEnvironment for Environment<'_> {
    fn type_rules(&self, item_type: &str) -> Option<&TypeRules> {
        self.types.rules(item_type)
    }
    fn has_configurator(&self, item_type: &str) -> bool {
        self.sessions.contains_key(item_type)
    }
    fn now_ms(&self) -> u64 {
        self.now_ms
    }
    fn is_converged(&self, item: &ItemRef) -> bool {
        !self.model.unconverged.contains(item)
    }
    fn deletes_of_type(&self, item_type: &str) -> Vec<ItemRef> {
        let in_flight = self.operations.values().filter(|item| {
            **item.item_type() == *item_type
                && self
                    .model
                    .current
                    .get(item)
                    .and_then(|c| c.in_flight.as_ref())
                    .is_some_and(|operation| operation.kind == OperationKind::Delete)
        });
        let waiting = self.model.waiting.deletes_of_type(item_type);
        let queued = self.room.queued_deletes_of(item_type);
        in_flight.chain(waiting).chain(queued).cloned().collect()
    }
    fn may_have_pending_delete(&self, item: &ItemRef) -> bool {
        self.model.waiting.waits_to_delete(item) || self.room.queues_delete_of(item)
    }
    fn planned_again_for_room(&self, item: &ItemRef) -> bool {
        self.for_room.is_some_and(|taken| taken.contains_key(item))
    }
    fn deletes_as_before(&self, item: &ItemRef) -> bool {
        let taken_for_room = self
            .for_room
            .and_then(|taken| taken.get(item))
            .is_some_and(|kind| *kind == OperationKind::Delete);
        let running = self
            .model
            .current
            .get(item)
            .and_then(|current| current.in_flight.as_ref())
            .is_some_and(|operation| operation.kind == OperationKind::Delete);
        taken_for_room || running || self.may_have_pending_delete(item)
    }
}

impl Executor {
    pub(super) fn environment(&self, now_ms: u64) -> Environment<'_> {
        Environment {
            types: &self.types,
            sessions: &self.sessions,
            model: &self.model,
            operations: &self.operations,
            room: &self.room,
            for_room: None,
            now_ms,
        }
    }

    /// Plans (every unconverged item, or the given ones and what they
    /// unblock) on the state as staged so far, and stages what the plan
    /// decides: its bookkeeping, the journal of the operations it
    /// dispatches (sent once the commit is durable), the conditions and
    /// cancel marks.
    pub(super) fn pass(&mut self, scope: Scope, now: Now) -> Plan {
        self.pass_dispatching(scope, Dispatch::Now, now)
    }

    /// [`Self::pass`], dispatching as told: with [`Dispatch::Held`] the
    /// operations it finds ready stay unconverged, for a later pass of the
    /// same input to plan and dispatch on the state that input leaves
    /// (see `report_external`).
    pub(super) fn pass_dispatching(&mut self, scope: Scope, dispatch: Dispatch, now: Now) -> Plan {
        let (mut seeds, kept_waiting) = match scope {
            Scope::Full => (self.model.unconverged.to_ordered(), Vec::new()),
            Scope::Items(mut items) => {
                let (mut seeds, kept) = self.wake_waiters(&items);
                // Merged, not inserted one by one: both are ordered.
                seeds.append(&mut items);
                (seeds, kept)
            }
        };
        self.count_in_flight();
        let for_room: BTreeMap<ItemRef, OperationKind> = self
            .take_undispatched_with_room()
            .into_iter()
            .filter(|(item, _)| !seeds.contains(item))
            .collect();
        seeds.extend(for_room.keys().cloned());
        let plan = plan_operations(
            &self.model.intended,
            &self.model.current,
            &seeds,
            &Environment {
                for_room: Some(&for_room),
                ..self.environment(now.wall_ms)
            },
        );
        self.items_examined = self.items_examined.saturating_add(plan.examined as u64);
        let bookkeeping = bookkeeping_updates(&self.model.current, &plan);
        // The seeds (and the items the plan revised) were planned again:
        // whether they still wait for room is decided anew below (an item
        // queued for room may need nothing now, and would take the room of
        // one that does). What they were queued for, and what was taken for
        // room, is checked against the plan in `absorb`.
        let mut from_queue = self.room.unqueue(seeds.iter().chain(&plan.revised));
        from_queue.extend(for_room);
        let (mut starts, mut journal) = match dispatch {
            Dispatch::Now => self.prepare_dispatch(&plan, now.wall_ms),
            Dispatch::Held => Default::default(),
        };
        if dispatch == Dispatch::Now {
            let (reads, read_journal) = self.prepare_reads(now.wall_ms, &plan, &starts);
            starts.extend(reads);
            journal.extend(read_journal);
        }
        // Retry times and waiters are read from the state the plan saw.
        self.absorb(&seeds, &plan, &from_queue, now.mono_ms);
        self.follow_up_kept_waiters(kept_waiting);
        self.stage_all(bookkeeping);
        self.stage_all(journal);
        // Every operation that waits for room is ready work, whichever
        // pass found it ready: the tenant is not quiescent while any does.
        self.update_conditions(now, self.room.queued_len());
        self.stage_cancels(&plan, now.wall_ms);
        self.dispatch(starts, now.wall_ms);
        self.transaction().seeds.append(&mut seeds);
        plan
    }

    /// The waiting items to plan again because `items` changed: those that
    /// named one of them in `blocked_by`.
    ///
    /// Except a Delete blocked by operations of other items (its
    /// dependents' Deletes, reason `BLOCKED`) when each blocker that
    /// changed either is gone (its Delete completed; none of them was shown
    /// failed terminally) or left the intent while its Delete was already
    /// what the waiter waits for ("its delete runs first": nothing can
    /// spare it now), and some blocker remains. It waits for those as
    /// before: the gone ones leave its list, the others stay on it. The
    /// last blocker to go wakes it. A hub's Delete is thus planned again
    /// once, not on every batch of its N dependents' Deletes nor on every
    /// request removing some of them from the intent, each of which would
    /// examine all the dependents left (O(N²)).
    ///
    /// Returns the items to plan again, and the waiters kept waiting on
    /// blockers that only left the intent, by blocker (see
    /// [`Self::follow_up_kept_waiters`]).
    fn wake_waiters(&mut self, items: &BTreeSet<ItemRef>) -> (BTreeSet<ItemRef>, KeptWaiting) {
        let mut woken = BTreeSet::new();
        // Waiters whose changed blockers are all gone or only left the
        // intent.
        let mut of_leavers_only = BTreeSet::new();
        // The waiters of changed blockers that only left the intent.
        let mut of_remaining_leavers = Vec::new();
        let mut any_gone = false;
        for item in items {
            self.behind.remove(item);
            let Some(waiters) = self.waiters.remove(item) else {
                continue;
            };
            let current = self.model.current.get(item);
            let gone = current.is_none();
            any_gone |= gone;
            // Out of the intent, and otherwise as it was: existing, ours
            // (not an external item), idle, no failure or retry time (a
            // result or a report changes one of those). Its own need is
            // then a Delete, whatever else changes.
            let only_left_the_intent = current.is_some_and(|current| {
                current.state == ItemState::Created
                    && !current.is_busy()
                    && current.rare.next_attempt_at_ms.is_none()
                    && current
                        .applied
                        .as_ref()
                        .is_some_and(|applied| !applied.external)
            }) && self.model.intended.get(item).is_none();
            if gone {
                of_leavers_only.extend(waiters);
            } else if only_left_the_intent {
                of_leavers_only.extend(waiters.iter().cloned());
                of_remaining_leavers.push((item, waiters));
            } else {
                woken.extend(waiters);
            }
        }
        if of_leavers_only.is_empty() {
            return (woken, Vec::new());
        }
        let gone: FxHashSet<&ItemRef> = if any_gone {
            items
                .iter()
                .filter(|item| self.model.current.get(item).is_none())
                .collect()
        } else {
            FxHashSet::default()
        };
        let delete_runs_first = runs_first(OperationKind::Delete);
        let mut still_waiting = Vec::new();
        for waiter in of_leavers_only {
            if woken.contains(&waiter) || items.contains(&waiter) {
                continue;
            }
            let left = self.model.waiting.get(&waiter).and_then(|entry| {
                if entry.operation != OperationKind::Delete || entry.reason != WaitReason::Blocked {
                    return None;
                }
                let mut left = Vec::with_capacity(entry.blocked_by.len());
                for blocker in &entry.blocked_by {
                    if gone.contains(&blocker.item) {
                        if blocker.shows_terminal_failure() {
                            // What it showed of that blocker no longer
                            // holds: its conditions change.
                            return None;
                        }
                    } else if blocker.why != delete_runs_first && items.contains(&blocker.item) {
                        // It left the intent while shown otherwise (a
                        // Modify sparing it, an operation running): what
                        // the waiter waits for may change.
                        return None;
                    } else {
                        left.push(blocker.clone());
                    }
                }
                let holds = !left.is_empty() && left.iter().all(|blocker| blocker.item != waiter);
                holds.then_some(left)
            });
            match left {
                Some(left) => still_waiting.push((waiter, left)),
                None => {
                    woken.insert(waiter);
                }
            }
        }
        // Those still waiting stay waiters of the blockers that left the
        // intent and remain (the others are planned again, and wait anew).
        let mut kept = Vec::new();
        for (item, mut waiters) in of_remaining_leavers {
            waiters.retain(|waiter| !woken.contains(waiter) && !items.contains(waiter));
            if !waiters.is_empty() {
                kept.push((item.clone(), waiters.iter().cloned().collect()));
                self.waiters.insert(item.clone(), waiters);
            }
        }
        for (waiter, left) in still_waiting {
            let shortened = self
                .model
                .waiting
                .get(&waiter)
                .is_some_and(|entry| entry.blocked_by.len() != left.len());
            if shortened {
                self.model.waiting.drop_gone_blockers(&waiter, left);
            }
        }
        (woken, kept)
    }

    /// The waiters [`Self::wake_waiters`] kept waiting on a blocker that
    /// only left the intent still say that the blocker's Delete runs
    /// first. If the pass made that Delete wait for something else (the
    /// Deletes of its own dependents that left the intent with it, say, or
    /// a configurator), a follow-up pass plans them again, so that they
    /// show what they wait for and are woken by it.
    fn follow_up_kept_waiters(&mut self, kept: KeptWaiting) {
        for (blocker, waiters) in kept {
            let runs_first = self.model.waiting.get(&blocker).is_none_or(|entry| {
                entry.operation != OperationKind::Delete
                    || entry.blocked_by.iter().all(BlockedBy::says_runs_first)
            });
            if !runs_first {
                self.follow_up.extend(waiters);
            }
        }
    }

    /// Counts each session's operations in flight (and READs among them)
    /// on the state as it is now, staged or committed.
    pub(super) fn count_in_flight(&mut self) {
        let current = &self.model.current;
        let mut counts: HashMap<&str, (usize, usize)> = HashMap::new();
        for (op_id, item) in &self.operations {
            let Some(entry) = current.get(item) else {
                continue;
            };
            let Some(operation) = entry.in_flight.as_ref() else {
                continue;
            };
            if &operation.op_id == op_id && entry.operation_runs() {
                let count = counts.entry(item.item_type()).or_default();
                count.0 += 1;
                let drift_read =
                    operation.kind == OperationKind::Read && operation.resolves.is_none();
                count.1 += usize::from(drift_read);
            }
        }
        let running: Vec<(String, Running)> = self
            .sessions
            .keys()
            .map(|item_type| {
                let (all, reads) = counts.get(item_type.as_str()).copied().unwrap_or((0, 0));
                (item_type.clone(), Running { all, reads })
            })
            .collect();
        self.room.set_running(running);
    }

    /// Items queued for room that now have some, to plan again (as many
    /// per type as the type has room for: re-planning the whole backlog on
    /// every result would cost O(backlog) per operation).
    fn take_undispatched_with_room(&mut self) -> Vec<(ItemRef, OperationKind)> {
        let types = &self.types;
        let per_tenant = self.settings.max_operations_in_flight;
        self.room
            .take_queued(|item_type| limits_of(types, per_tenant, item_type))
    }

    /// The limits that make room for an operation of `item_type` (the
    /// default ones for a type that never registered).
    pub(super) fn type_limits(&self, item_type: &str) -> Limits {
        limits_of(
            &self.types,
            self.settings.max_operations_in_flight,
            item_type,
        )
    }

    /// Picks every ready operation whose type has a live session with room
    /// and prepares its journal record (ready ones without room wait in
    /// the room's queue). Returns the operations and their journal updates.
    fn prepare_dispatch(
        &mut self,
        plan: &Plan,
        now_ms: u64,
    ) -> (Vec<(ItemRef, InFlight)>, CurrentUpdates) {
        let mut starts: Vec<(ItemRef, InFlight)> = Vec::new();
        for index in plan.ready() {
            let operation = &plan.operations[index];
            let item = &operation.item;
            let spec = self.spec(item.item_type());
            if !self.sessions.contains_key(&**item.item_type()) {
                continue;
            }
            if !self
                .room
                .admit(item, operation.kind, self.type_limits(item.item_type()))
            {
                continue;
            }
            // A retry (after FAILED, a timeout or WAIT) of the same
            // operation keeps its op id; anything else is a new operation
            // and starts at attempt 1.
            let existing = self.model.current.get(item);
            let continued = existing
                .and_then(|c| c.rare.retry_of.as_ref())
                .and_then(|retry| retry.continues(operation.kind, operation.target_generation))
                .map(str::to_owned);
            let (op_id, attempt) = match continued {
                Some(op_id) => (op_id, existing.map_or(1, |c| c.attempts.saturating_add(1))),
                None => (self.next_op_id(), 1),
            };
            starts.push((
                item.clone(),
                InFlight {
                    question: operation.ask_needs_recreate,
                    ..InFlight::new(
                        operation.kind,
                        op_id,
                        attempt,
                        operation.target_generation,
                        now_ms,
                        spec.operation_timeout_ms,
                    )
                },
            ));
        }
        let updates: CurrentUpdates = starts
            .iter()
            .map(|(item, in_flight)| {
                let target = match in_flight.kind {
                    OperationKind::Create | OperationKind::Modify => self
                        .model
                        .intended
                        .get(item)
                        .map(|entry| entry.item.clone()),
                    OperationKind::Delete | OperationKind::Read => None,
                };
                let existing = self.model.current.get(item).map(|c| &**c);
                let mut value = started(existing, target, in_flight.clone());
                record_dispatch_marks(&self.model.current, &mut value);
                let continues = existing
                    .and_then(|c| c.rare.retry_of.as_ref())
                    .is_some_and(|retry| retry.op_id == in_flight.op_id);
                if !continues {
                    // A new operation: its failures count from zero, and an
                    // earlier operation's failure (even one given up on)
                    // says nothing about it.
                    value.attempts = 0;
                    value.rare.update(|rare| rare.last_error = None);
                    value.gave_up = false;
                }
                (item.clone(), Some(value))
            })
            .collect();
        (starts, updates)
    }

    /// Picks queued READs whose type's session has room and prepares their
    /// journal records (a READ changes no state until it reports). Items
    /// the pass works on or dispatches now are not read: one operation per
    /// item at a time, and the operation's own result reports what it
    /// observed.
    fn prepare_reads(
        &mut self,
        now_ms: u64,
        plan: &Plan,
        dispatched: &[(ItemRef, InFlight)],
    ) -> (Vec<(ItemRef, InFlight)>, CurrentUpdates) {
        let dispatched: HashSet<&ItemRef> = dispatched.iter().map(|(item, _)| item).collect();
        let mut dropped = Vec::new();
        self.pending_reads.retain(|item| {
            let keep = !dispatched.contains(item) && !plan.unconverged.contains(item);
            if !keep {
                dropped.push(item.clone());
            }
            keep
        });
        self.transaction().undo_reads.extend(dropped);
        let mut starts = Vec::new();
        let mut updates: CurrentUpdates = Vec::new();
        let queued: Vec<ItemRef> = self.pending_reads.iter().cloned().collect();
        for item in queued {
            let spec = self.spec(item.item_type());
            let limits = self.type_limits(item.item_type());
            if !self.sessions.contains_key(&**item.item_type())
                || !self.room.has_room(item.item_type(), limits)
            {
                continue;
            }
            self.pending_reads.remove(&item);
            self.transaction().undo_reads.push(item.clone());
            let Some(current) = self.model.current.get(&item).cloned() else {
                continue;
            };
            if current.is_busy() || current.state != ItemState::Created {
                continue;
            }
            self.room.admit(&item, OperationKind::Read, limits);
            let in_flight = InFlight::new(
                OperationKind::Read,
                self.next_op_id(),
                1,
                current.applied_generation,
                now_ms,
                spec.operation_timeout_ms,
            );
            updates.push((
                item.clone(),
                Some(started(Some(&current), None, in_flight.clone())),
            ));
            starts.push((item, in_flight));
        }
        (starts, updates)
    }

    /// Records the journaled operations of `starts` as running and queues
    /// their orders for after the commit.
    fn dispatch(&mut self, starts: Vec<(ItemRef, InFlight)>, now_ms: u64) {
        for (item, in_flight) in starts {
            self.track_operation(&in_flight.op_id, &item);
            let previous_error = self
                .model
                .current
                .get(&item)
                .and_then(|c| c.rare.last_error.as_ref().cloned());
            let started = Started {
                item: item.clone(),
                kind: in_flight.kind,
                op_id: in_flight.op_id.clone(),
                attempt: in_flight.attempt,
                at_ms: now_ms,
                previous_error,
            };
            self.transaction().started.push(started);
            self.send_journaled(&item);
        }
    }

    /// Queues the order of `item`'s journaled operation for its type's
    /// session, to send once the commit is durable; its clock starts then.
    pub(super) fn send_journaled(&mut self, item: &ItemRef) {
        let Some(holder) = self.sessions.get(&**item.item_type()) else {
            return;
        };
        let (session_id, epoch) = (holder.session_id, holder.epoch);
        let Some(order) = self.order_for(item, epoch) else {
            return;
        };
        let superseded = self.superseded_by_the_intent(item);
        let op_id = order.op_id.clone();
        let txn = self.transaction();
        txn.clocked.push((order.op_id.clone(), order.timeout_ms));
        txn.sends
            .push(to_session(session_id, ToAgent::Operation(order)));
        if superseded {
            // Superseded by the intent before it was sent again (its
            // cancel may never have reached an agent): the cancel follows
            // it (DESIGN 4). One asked because its item went with an
            // external item is not sent again: that item may be back, and
            // the item is settled by what the operation reports.
            txn.sends.push(to_session(
                session_id,
                ToAgent::Cancel {
                    op_id: op_id.clone(),
                },
            ));
            txn.cancelled.push(op_id);
        }
    }

    /// Whether `item`'s operation was cancelled because its intent
    /// changed (or left) and still is superseded
    /// ([`InFlight::superseded_at`], the planner's test).
    fn superseded_by_the_intent(&self, item: &ItemRef) -> bool {
        let intended = self
            .model
            .intended
            .get(item)
            .map_or(0, |entry| entry.generation);
        self.model
            .current
            .get(item)
            .and_then(|current| current.in_flight.as_ref())
            .is_some_and(|operation| {
                operation.cancel_requested && operation.superseded_at(intended)
            })
    }

    /// The order that sends `item`'s journaled operation to an agent.
    pub(super) fn order_for(&self, item: &ItemRef, epoch: u64) -> Option<OperationOrder> {
        order_for(&self.model.current, item, epoch)
    }

    /// Merges a plan over `seeds` into the tenant's bookkeeping: the
    /// unconverged set, the waiting set, and who waits on whom.
    fn absorb(
        &mut self,
        seeds: &BTreeSet<ItemRef>,
        plan: &Plan,
        from_queue: &[(ItemRef, OperationKind)],
        now_mono_ms: u64,
    ) {
        // The plan's verdict on the items it examined replaces what earlier
        // passes said of them: seeds, and items it reached that were left
        // unconverged (a dependent whose Delete waited for a retry is
        // converged once the item it relies on is back). One converged
        // now, though no result or change of its own settled it, has
        // nothing more to say to its waiters: they are planned again (seed
        // 162641: a Delete + Create its dependency's return made needless;
        // an item whose Create waited for it to be created again waited
        // for good). Only converged ones: an item left unconverged is
        // planned again and its results still come. An item the plan
        // leaves waiting keeps its entry until the plan's replaces it below
        // (where an equal one leaves it as it is).
        let waits_again: FxHashSet<&ItemRef> = plan.waiting.iter().map(|w| &w.item).collect();
        for seed in seeds.iter().chain(&plan.revised) {
            if !plan.unconverged.contains(seed) {
                self.model.unconverged.remove(seed);
                self.follow_up_waiters_of(seed, seeds);
            }
            if !waits_again.contains(seed) {
                self.model.waiting.remove(seed);
            }
        }
        self.wake_behind_unplanned(seeds, plan);
        self.wake_behind_dropped_from_queue(from_queue, seeds, plan);
        // An item the plan gives an operation no longer waits for what an
        // earlier pass said (it runs, waits for room, or waits for the
        // operations before it, below), whether it was a seed or not.
        for operation in &plan.operations {
            self.model.waiting.remove(&operation.item);
        }
        self.model
            .unconverged
            .extend(plan.unconverged.iter().cloned());
        for (key, _) in &plan.forget {
            self.model.unconverged.insert(key.clone());
            self.follow_up.insert(key.clone());
        }
        self.follow_up.extend(plan.settle.iter().cloned());
        // Operations that wait for other operations of the plan are woken
        // by those operations' results, like waiting items by their
        // blockers, and meanwhile show what they wait for (DESIGN 2).
        for (index, operation) in plan.operations.iter().enumerate() {
            let mut blocked_by = Vec::new();
            let mut waits_for_dependency = false;
            for predecessor in plan.predecessors(index) {
                let blocker = &plan.operations[predecessor];
                if blocker.item != operation.item {
                    self.waiters
                        .entry(blocker.item.clone())
                        .or_default()
                        .insert(operation.item.clone());
                    self.behind
                        .entry(blocker.item.clone())
                        .or_default()
                        .insert((blocker.kind, operation.item.clone()));
                    waits_for_dependency |= blocker.kind != OperationKind::Delete;
                    blocked_by.push(BlockedBy {
                        item: blocker.item.clone(),
                        why: runs_first(blocker.kind),
                    });
                }
            }
            if !blocked_by.is_empty() {
                self.model.waiting.insert(WaitingItem {
                    item: operation.item.clone(),
                    operation: operation.kind,
                    reason: if waits_for_dependency {
                        WaitReason::Dependency
                    } else {
                        WaitReason::Blocked
                    },
                    blocked_by,
                });
            }
        }
        // A retry time already due stays: the timer then fires at once and
        // plans the items whose backoff is over (dropping it stranded an
        // item this pass did not look at, after a wall-clock step forward).
        let mut next_retry = self.next_retry_ms;
        for waiting in &plan.waiting {
            for blocker in &waiting.blocked_by {
                if blocker.item != waiting.item {
                    self.waiters
                        .entry(blocker.item.clone())
                        .or_default()
                        .insert(waiting.item.clone());
                }
            }
            if waiting.reason == WaitReason::Backoff {
                let at = self
                    .model
                    .current
                    .get(&waiting.item)
                    .and_then(|c| c.rare.next_attempt_at_ms);
                next_retry = match (next_retry, at) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            self.model.waiting.insert(waiting.clone());
        }
        self.next_retry_ms = next_retry;
        self.follow_up_waiters_of_stalled(seeds, plan);
        let waits_for_configurator = !self.types_without_configurator().is_empty();
        self.no_configurator = match (waits_for_configurator, self.no_configurator) {
            (false, _) => None,
            (true, Some(wait)) => Some(wait),
            (true, None) => Some(super::ConfiguratorWait {
                since_mono: now_mono_ms,
                before_ms: 0,
            }),
        };
    }

    /// Items that wait for a revised item's operation "to run first" (the
    /// plan reached it without being seeded with it) are planned again by a
    /// follow-up pass when the plan now makes that operation wait for
    /// something other than operations running first: a configurator, a
    /// retry time, a failure. Their words would no longer hold, and what
    /// they wait for would wake them only by chance (seed 24248: a Delete
    /// whose configurator left while a dependency's Delete kept it behind).
    /// Seeds' waiters were woken before the plan ([`Self::wake_waiters`]),
    /// and revised waiters got a verdict from this plan.
    fn follow_up_waiters_of_stalled(&mut self, seeds: &BTreeSet<ItemRef>, plan: &Plan) {
        let stalled: Vec<(&ItemRef, OperationKind)> = plan
            .revised
            .iter()
            .filter(|item| self.waiters.contains_key(*item))
            .filter_map(|item| {
                let entry = self.model.waiting.get(item)?;
                let running = self
                    .model
                    .current
                    .get(item)
                    .and_then(|current| current.in_flight.as_ref())
                    .is_some_and(|operation| operation.kind == entry.operation);
                let waits_for_more = !entry.blocked_by.iter().all(BlockedBy::says_runs_first);
                (waits_for_more && !running).then_some((item, entry.operation))
            })
            .collect();
        if stalled.is_empty() {
            return;
        }
        let revised: FxHashSet<&ItemRef> = plan.revised.iter().collect();
        for (item, operation) in stalled {
            let Some(waiters) = self.waiters.get_mut(item) else {
                continue;
            };
            let said = runs_first(operation);
            let model = &self.model;
            let naming_it_first: Vec<ItemRef> = waiters
                .iter()
                .filter(|waiter| !seeds.contains(*waiter) && !revised.contains(waiter))
                .filter(|waiter| {
                    model.waiting.get(waiter).is_some_and(|entry| {
                        entry
                            .blocked_by
                            .iter()
                            .any(|blocker| blocker.item == *item && blocker.why == said)
                    })
                })
                .cloned()
                .collect();
            // They register anew when the follow-up pass plans them.
            for waiter in &naming_it_first {
                waiters.remove(waiter);
            }
            if waiters.is_empty() {
                self.waiters.remove(item);
            }
            self.follow_up.extend(naming_it_first);
        }
    }

    /// Items an earlier plan put after an operation (of an item, of a
    /// kind: a recreate plans a Delete and a Create) that this plan no
    /// longer has (its item now waits, say behind a dependent's failed
    /// Delete, or needs nothing) are planned again by a follow-up pass:
    /// that operation's result, which was to wake them, will not come. A
    /// Create kept behind a Delete of its type that now waits would wait
    /// for good, where a plan made afresh creates it (DESIGN 3, rule 8:
    /// the block ends when the blocking operation is no longer needed).
    fn wake_behind_unplanned(&mut self, seeds: &BTreeSet<ItemRef>, plan: &Plan) {
        let decided: Vec<&ItemRef> = seeds
            .iter()
            .chain(&plan.revised)
            .chain(plan.waiting.iter().map(|w| &w.item))
            .filter(|item| self.behind.contains_key(*item))
            .collect();
        if decided.is_empty() {
            return;
        }
        let planned: HashSet<(&ItemRef, OperationKind)> =
            plan.operations.iter().map(|o| (&o.item, o.kind)).collect();
        for item in decided {
            let Some(behind) = self.behind.get_mut(item) else {
                continue;
            };
            behind.retain(|(kind, waiter)| {
                let still_planned = planned.contains(&(item, *kind));
                if !still_planned {
                    self.follow_up.insert(waiter.clone());
                }
                still_planned
            });
            if behind.is_empty() {
                self.behind.remove(item);
            }
        }
    }

    /// Operations taken from the room's queue, or queued for items the
    /// plan looked at again, that the plan no longer has (a retry time
    /// ahead again after the wall clock stepped back, say): their items'
    /// waiters are planned again. An item waiting for such an operation and
    /// for something else is a waiting entry, not an operation placed
    /// after it ([`Self::wake_behind_unplanned`]), and went on showing it
    /// running first (seed 150801).
    fn wake_behind_dropped_from_queue(
        &mut self,
        from_queue: &[(ItemRef, OperationKind)],
        seeds: &BTreeSet<ItemRef>,
        plan: &Plan,
    ) {
        if from_queue.is_empty() {
            return;
        }
        let planned: HashSet<(&ItemRef, OperationKind)> =
            plan.operations.iter().map(|o| (&o.item, o.kind)).collect();
        for (item, kind) in from_queue {
            if !planned.contains(&(item, *kind)) {
                self.follow_up_waiters_of(item, seeds);
            }
        }
    }

    /// Plans `item`'s waiters again in a follow-up pass (those among this
    /// pass's seeds were planned in it), dropping their registrations:
    /// waiters the plan looked at register anew.
    fn follow_up_waiters_of(&mut self, item: &ItemRef, seeds: &BTreeSet<ItemRef>) {
        if let Some(waiters) = self.waiters.remove(item) {
            self.follow_up
                .extend(waiters.into_iter().filter(|waiter| !seeds.contains(waiter)));
        }
    }

    /// The item types some waiting item needs a configurator of, sorted:
    /// those of items waiting for one, and those of UNKNOWN items that no
    /// live session holds (only an agent of the type can READ them or send
    /// their lost operation again, DESIGN 4). An UNKNOWN item whose agent
    /// is gone for good otherwise kept its tenant from Ready without ever
    /// stalling it (DESIGN 5, `configurator_grace`).
    fn types_without_configurator(&self) -> Vec<String> {
        let summary = self.model.waiting.summary();
        let mut types: Vec<String> = summary.without_configurator.keys().cloned().collect();
        types.extend(
            summary
                .unknown_outcome
                .keys()
                .filter(|item_type| !self.sessions.contains_key(item_type.as_str()))
                .cloned(),
        );
        types.sort();
        types.dedup();
        types
    }

    /// Recomputes the conditions: staged when they changed in substance; a
    /// change of wording only is shown without a commit.
    fn update_conditions(&mut self, now: Now, ready_operations: usize) {
        let now_ms = now.wall_ms;
        let before = self.model.progress();
        let progress = Progress {
            generation: before.generation,
            // A drift READ is observation, not work (DESIGN section 5).
            in_flight: self.room.running_work(),
            ready_operations,
            waiting: self.model.waiting.summary(),
            // Measured on the monotonic clock, shown as the wall-clock
            // time that far back.
            no_configurator_since_ms: self
                .no_configurator
                .map(|wait| now_ms.saturating_sub(wait.waited_ms(now.mono_ms))),
            without_configurator: self.types_without_configurator(),
            configurator_grace_ms: self.settings.configurator_grace_ms,
            now_ms,
        };
        let (conditions, observed) =
            compute_conditions(&before.conditions, before.observed_generation, &progress);
        let significant = super::significant_change(&before.conditions, &conditions)
            || observed != before.observed_generation;
        if significant {
            let mut next = before.clone();
            next.conditions = conditions;
            next.observed_generation = observed;
            self.model.stage_progress(next);
        } else {
            self.model.reword_conditions(conditions);
        }
    }

    /// Marks every in-flight operation the plan found superseded by an
    /// intent change as cancelled (staged), and queues its cancel for
    /// after the commit (a transition is committed before it is acted on).
    fn stage_cancels(&mut self, plan: &Plan, now_ms: u64) {
        for item in &plan.cancel {
            let Some(current) = self.model.current.get(item) else {
                continue;
            };
            let Some(operation) = &current.in_flight else {
                continue;
            };
            let op_id = operation.op_id.clone();
            let mut marked = (**current).clone();
            if let Some(operation) = marked.in_flight.as_mut() {
                operation.cancel_requested = true;
                operation.cancel_requested_at_ms = Some(now_ms);
            }
            self.stage(item, Some(marked));
            let session = self
                .sessions
                .get(&**item.item_type())
                .map(|holder| holder.session_id);
            let txn = self.transaction();
            if let Some(session_id) = session {
                txn.sends.push(to_session(
                    session_id,
                    ToAgent::Cancel {
                        op_id: op_id.clone(),
                    },
                ));
            }
            txn.cancelled.push(op_id);
        }
    }
}

/// The order that sends `item`'s journaled operation to an agent.
pub(super) fn order_for(
    current: &CurrentGraph,
    item: &ItemRef,
    epoch: u64,
) -> Option<OperationOrder> {
    let entry = current.get(item)?;
    let operation = entry.in_flight.as_ref()?;
    let applied = entry.applied.clone();
    // A READ that resolves a lost Create names the value that Create
    // applies: nothing was applied before it.
    let resolved_target = || {
        operation
            .resolves
            .as_ref()
            .and_then(|lost| lost.target.clone())
    };
    let (subject, previous) = match operation.kind {
        OperationKind::Create => (operation.target.clone()?, None),
        OperationKind::Modify => (operation.target.clone()?, applied),
        OperationKind::Delete => (applied?, None),
        OperationKind::Read => (applied.or_else(resolved_target)?, None),
    };
    Some(OperationOrder {
        op_id: operation.op_id.clone(),
        attempt: operation.attempt,
        epoch,
        kind: operation.kind,
        item: subject,
        previous,
        timeout_ms: operation.timeout_ms,
        generation: operation.target_generation,
        previous_uncertain: entry.uncertain(),
        question: operation.question,
    })
}

/// The limits that make room for an operation of `item_type`: its spec's
/// `max_in_flight` (the default for a type that never registered) and the
/// tenant's `per_tenant`.
fn limits_of(types: &TypeRegistry, per_tenant: u64, item_type: &str) -> Limits {
    let per_type = types
        .spec(item_type)
        .map_or(DEFAULT_MAX_IN_FLIGHT, |spec| spec.max_in_flight);
    Limits {
        per_type: per_type.max(1) as usize,
        per_tenant,
    }
}
