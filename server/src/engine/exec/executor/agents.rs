//! What agents and reporters bring: registrations, results, progress,
//! sessions that end, lost operations sent again, and reports of external
//! items.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use tracing::{debug, info};

use super::pass::Dispatch;
use super::{Executor, Holder, Now, Scope, lost_outcome, to_session};
use crate::engine::exec::effects::{Effects, Finished, OperationOutcome, TenantEvent};
use crate::engine::exec::lost::{
    GiveUpReason, Redelivery, redelivery, redelivery_waits, runs_a_delete, superseded,
};
use crate::engine::exec::port::{AgentOutcome, ExternalChange, Grant, Registration, ToAgent};
use crate::engine::exec::registry::StoredSpec;
use crate::engine::transition::{
    Completion, CurrentUpdates, completed, drifted_paths, forget_marks_on_removed,
    mark_gone_with_externals,
};
use crate::graph::{
    CurrentItem, InFlight, ItemRef, ItemState, OperationError, OperationKind, code,
};

/// One result an agent reported.
#[derive(Clone, Debug)]
pub struct AgentResult {
    /// The session it came on.
    pub session_id: u64,
    /// The operation.
    pub op_id: String,
    /// Its attempt.
    pub attempt: u32,
    /// What the agent says happened.
    pub outcome: AgentOutcome,
}

/// A registration refused: another live agent holds one of its types.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("item type {item_type:?} is held by agent {holder:?}")]
pub struct TypeHeld {
    /// The type.
    pub item_type: String,
    /// The holding agent.
    pub holder: String,
}

/// A result that changes state, waiting for its commit.
struct Accepted {
    session_id: u64,
    item: ItemRef,
    kind: OperationKind,
    op_id: String,
    attempt: u32,
    outcome: OperationOutcome,
    started_ms: u64,
    value: Option<CurrentItem>,
    error: Option<OperationError>,
}

fn ack(session_id: u64, op_id: String, attempt: u32) -> crate::engine::exec::effects::Message {
    to_session(session_id, ToAgent::Ack { op_id, attempt })
}

impl Executor {
    /// Registers a session for item types (DESIGN 4, ownership): stores
    /// their specs with new epochs, sends again the operations its types
    /// had lost or had running on an earlier session, and plans.
    pub fn register(
        &mut self,
        registration: Registration,
        now: Now,
    ) -> Result<(Effects, Vec<Grant>), TypeHeld> {
        for spec in &registration.types {
            if let Some(holder) = self.sessions.get(&spec.item_type)
                && holder.agent_id != registration.agent_id
            {
                return Err(TypeHeld {
                    item_type: spec.item_type.clone(),
                    holder: holder.agent_id.clone(),
                });
            }
        }
        self.begin();
        let mut grants = Vec::new();
        for spec in &registration.types {
            let epoch = self.types.epoch(&spec.item_type) + 1;
            grants.push(Grant {
                item_type: spec.item_type.clone(),
                epoch,
            });
        }
        let mut by_epoch: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for grant in &grants {
            by_epoch
                .entry(grant.epoch)
                .or_default()
                .push(grant.item_type.clone());
        }
        for (epoch, item_types) in by_epoch {
            self.event(TenantEvent::AgentConnected {
                agent_id: registration.agent_id.clone(),
                item_types,
                epoch,
            });
        }
        let types: HashSet<String> = registration
            .types
            .iter()
            .map(|spec| spec.item_type.clone())
            .collect();
        let outstanding = Arc::new(registration.outstanding);
        for (spec, grant) in registration.types.into_iter().zip(&grants) {
            let previous_type = self.types.get(&spec.item_type).cloned();
            self.types.insert(spec.clone(), grant.epoch);
            let previous_holder = self.sessions.insert(
                spec.item_type.clone(),
                Holder {
                    session_id: registration.session_id,
                    agent_id: registration.agent_id.clone(),
                    epoch: grant.epoch,
                    outstanding: outstanding.clone(),
                },
            );
            let txn = self.transaction();
            txn.undo_types.push((spec.item_type.clone(), previous_type));
            txn.undo_sessions
                .push((spec.item_type.clone(), previous_holder));
            txn.specs.push(StoredSpec {
                spec,
                epoch: grant.epoch,
                held_by: Some(registration.agent_id.clone()),
            });
        }
        info!(
            tenant_id = self.settings.tenant_id,
            agent = %registration.agent_id,
            types = ?types,
            "Configurator registered."
        );
        self.redeliver_lost(&types, None, now);
        self.pass(Scope::Full, now);
        Ok((self.end(), grants))
    }

    /// A session ended: its types are free, and the outcome of its
    /// operations in flight is unknown. Nothing to do for a session that
    /// holds no type.
    pub fn session_closed(&mut self, session_id: u64, reason: &str, now: Now) -> Effects {
        let released: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, holder)| holder.session_id == session_id)
            .map(|(item_type, _)| item_type.clone())
            .collect();
        let Some(agent_id) = released
            .first()
            .and_then(|item_type| self.sessions.get(item_type))
            .map(|holder| holder.agent_id.clone())
        else {
            return Effects::default();
        };
        self.begin();
        for item_type in &released {
            self.sessions.remove(item_type);
            if let Some(registered) = self.types.get(item_type) {
                self.owed.store_spec(StoredSpec {
                    spec: registered.spec.clone(),
                    epoch: registered.epoch,
                    held_by: None,
                });
            }
        }
        info!(tenant_id = self.settings.tenant_id, types = ?released, reason, "Configurator disconnected.");
        // The session ended whatever becomes of this commit: owed until
        // one stores it.
        self.owed.events.push(TenantEvent::AgentDisconnected {
            agent_id,
            item_types: released.clone(),
            reason: reason.to_owned(),
        });
        // Operations of these types that waited for room wait for a
        // configurator now: planned again, they say so.
        let mut touched: BTreeSet<ItemRef> = released
            .iter()
            .flat_map(|item_type| self.room.take_queued_of(item_type))
            .collect();
        let lost: Vec<ItemRef> = self
            .operations
            .values()
            .filter(|item| released.iter().any(|t| **t == **item.item_type()))
            .filter(|item| {
                self.model
                    .current
                    .get(item)
                    .is_some_and(|entry| entry.operation_runs())
            })
            .cloned()
            .collect();
        for item in lost {
            if let Some(entry) = self.model.current.get(&item).cloned() {
                let value = completed(&self.model.current, &entry, lost_outcome(&entry));
                self.stage(&item, value);
                touched.insert(item);
            }
        }
        self.pass(Scope::Items(touched), now);
        self.end()
    }

    /// Takes results that arrived together into one pass and one commit
    /// (the results, the journal of what they unblock, the record); each
    /// is acknowledged once that commit is durable. Results that change
    /// nothing are acknowledged at once.
    pub fn results(&mut self, batch: Vec<AgentResult>, now: Now) -> Effects {
        self.begin();
        let mut accepted: Vec<Accepted> = Vec::new();
        for result in batch {
            if let Some(result) = self.accept_result(result, now) {
                if accepted.iter().any(|other| other.item == result.item) {
                    // The same operation reported twice in one batch: its
                    // copy is acknowledged with it, once the commit that
                    // records it is durable.
                    let message = ack(result.session_id, result.op_id, result.attempt);
                    self.transaction().sends.push(message);
                    continue;
                }
                accepted.push(result);
            }
        }
        if accepted.is_empty() {
            return self.end();
        }
        for result in &accepted {
            self.event(TenantEvent::OperationFinished {
                item: result.item.clone(),
                kind: result.kind,
                op_id: result.op_id.clone(),
                attempt: result.attempt,
                outcome: result.outcome,
                error: result.error.clone(),
            });
        }
        let mut updates: CurrentUpdates = accepted
            .iter()
            .map(|result| (result.item.clone(), result.value.clone()))
            .collect();
        // An item that is gone (deleted, or found gone by its agent) is
        // another item if it is created again: its dependents forget the
        // counters they recorded, as when an external item vanishes.
        forget_marks_on_removed(&self.model.current, &mut updates);
        let items: BTreeSet<ItemRef> = updates.iter().map(|(item, _)| item.clone()).collect();
        self.stage_all(updates);
        self.send_relost();
        self.pass(Scope::Items(items), now);
        for result in accepted {
            let finished = Finished {
                item: result.item,
                kind: result.kind,
                op_id: result.op_id.clone(),
                attempt: result.attempt,
                outcome: result.outcome,
                duration_ms: now.wall_ms.saturating_sub(result.started_ms),
                at_ms: now.wall_ms,
                error: result.error,
            };
            let txn = self.transaction();
            txn.finished.push(finished);
            txn.sends
                .push(ack(result.session_id, result.op_id, result.attempt));
        }
        self.end()
    }

    /// Checks one result against the item's in-flight operation. Results
    /// that change no state are acknowledged at once and give `None`.
    fn accept_result(&mut self, result: AgentResult, now: Now) -> Option<Accepted> {
        let AgentResult {
            session_id,
            op_id,
            attempt,
            outcome,
        } = result;
        let item = self.operations.get(&op_id).cloned();
        let entry = item
            .as_ref()
            .and_then(|item| self.model.current.get(item).cloned());
        let (Some(item), Some(entry)) = (item, entry) else {
            self.transaction()
                .immediate
                .push(ack(session_id, op_id, attempt));
            return None;
        };
        let Some(operation) = entry
            .in_flight
            .as_deref()
            .cloned()
            .filter(|operation| operation.op_id == op_id && operation.attempt == attempt)
        else {
            // A stale attempt: it changes no state.
            self.transaction()
                .immediate
                .push(ack(session_id, op_id, attempt));
            return None;
        };
        let holder = self
            .sessions
            .get(&**item.item_type())
            .map(|holder| (holder.session_id, holder.epoch));
        if holder.is_none_or(|(holder, _)| holder != session_id) {
            // A session whose epoch is over: its result changes no state; the
            // operation is re-delivered, same op id and attempt, to the
            // session that holds the type now.
            self.transaction()
                .immediate
                .push(ack(session_id, op_id, attempt));
            if entry.state == ItemState::Unknown {
                // Its outcome is lost and it has not been sent again: the
                // re-delivery this schedules is decided like any other
                // ([`Self::redeliver_deferred`]), waiting for what it must
                // (a Delete of its type, an UNKNOWN dependency, room).
                self.deferred_redeliveries.insert(item);
                return None;
            }
            if let Some((holder, epoch)) = holder
                && let Some(order) = self.order_for(&item, epoch)
            {
                // This is the re-delivery a registration may have put off
                // until the agent's answer came: it is not made again.
                self.deferred_redeliveries.remove(&item);
                self.deadlines
                    .start(&order.op_id, order.timeout_ms, now.mono_ms);
                self.transaction()
                    .immediate
                    .push(to_session(holder, ToAgent::Operation(order)));
            }
            return None;
        }
        if operation.resolves.is_some() {
            return self.accept_resolution(
                session_id,
                item,
                (*entry).clone(),
                operation,
                outcome,
                now,
            );
        }
        let is_read = operation.kind == OperationKind::Read;
        // A failure the agent reported that is not a failed attempt
        // (cancelled as asked, NOT_FOUND): shown as FAILED with its error.
        let mut reported_failure: Option<OperationError> = None;
        // A READ that asks to be asked again: it changes nothing, and is
        // reported as the WAIT it was.
        let mut reported_wait = false;
        let completion = match outcome {
            AgentOutcome::InProgress => {
                self.transaction()
                    .immediate
                    .push(ack(session_id, op_id, attempt));
                return None;
            }
            AgentOutcome::Done { observed, .. } if is_read => {
                let observed = observed.unwrap_or_default();
                if let Some(applied) = &entry.applied {
                    let paths = drifted_paths(applied, &observed);
                    if !paths.is_empty() {
                        info!(tenant_id = self.settings.tenant_id, item = %item, ?paths, "Drift detected; correcting it.");
                        self.event(TenantEvent::DriftDetected {
                            item: item.clone(),
                            paths,
                        });
                    }
                }
                Completion::Read { observed }
            }
            AgentOutcome::Failed(error) if is_read => {
                if error.code == code::NOT_FOUND {
                    reported_failure = Some(error);
                    Completion::Vanished
                } else {
                    // A failed READ changes nothing; the next resync tries
                    // again. It is reported as the failure it was (the
                    // operation log, Watch and metrics), not as DONE.
                    reported_failure = Some(error);
                    unchanged_read(&entry)
                }
            }
            // Observation, not work: no backoff for a READ either; the
            // next resync reads again.
            AgentOutcome::Wait { .. } if is_read => {
                reported_wait = true;
                unchanged_read(&entry)
            }
            AgentOutcome::Done { needs_recreate, .. } if operation.question => {
                Completion::Answered { needs_recreate }
            }
            AgentOutcome::Done { observed, .. } => Completion::Done { observed },
            AgentOutcome::Wait { retry_after_ms } => Completion::Wait {
                retry_at_ms: now.wall_ms.saturating_add(retry_after_ms),
            },
            AgentOutcome::Failed(error) if error.code == code::CANCELLED => {
                // "Cancelled as asked" (the SDK's `Outcome::cancelled()`):
                // the agent stopped because it was told to. Not a failure:
                // no attempt is counted, no backoff; the next pass plans
                // what the intent needs now.
                reported_failure = Some(error);
                Completion::Wait {
                    retry_at_ms: now.wall_ms,
                }
            }
            AgentOutcome::Failed(error)
                if error.code == code::NOT_FOUND
                    && matches!(
                        operation.kind,
                        OperationKind::Modify | OperationKind::Delete
                    ) =>
            {
                // The configurator has no such item: a Delete has nothing
                // left to do, and a Modify has nothing to modify. Either
                // way the item is gone from current state; if it is
                // intended, the next pass creates it.
                reported_failure = Some(error);
                Completion::Vanished
            }
            AgentOutcome::Failed(error) => {
                let failures = entry.attempts.saturating_add(1);
                let retry_at_ms =
                    self.retry_at(item.item_type(), now.wall_ms, failures, error.is_terminal());
                Completion::Failed { error, retry_at_ms }
            }
        };
        let outcome = match &completion {
            _ if reported_failure
                .as_ref()
                .is_some_and(|error| error.code == code::CANCELLED) =>
            {
                OperationOutcome::Cancelled
            }
            _ if reported_failure.is_some() => OperationOutcome::Failed,
            _ if reported_wait => OperationOutcome::Wait,
            Completion::Failed { .. } => OperationOutcome::Failed,
            Completion::Wait { .. } => OperationOutcome::Wait,
            _ => OperationOutcome::Done,
        };
        let error = match &completion {
            Completion::Failed { error, .. } => Some(error.clone()),
            _ => reported_failure,
        };
        let value = completed(&self.model.current, &entry, completion);
        Some(Accepted {
            session_id,
            item,
            kind: operation.kind,
            op_id: operation.op_id,
            attempt: operation.attempt,
            outcome,
            started_ms: operation.started_at_ms,
            value,
            error,
        })
    }

    /// The answer to a READ that resolves an UNKNOWN item: it exists (DONE)
    /// or not (NOT_FOUND), and what it is settles the lost operation; any
    /// other answer cannot tell, and the lost operation is sent again.
    fn accept_resolution(
        &mut self,
        session_id: u64,
        item: ItemRef,
        entry: CurrentItem,
        operation: InFlight,
        outcome: AgentOutcome,
        now: Now,
    ) -> Option<Accepted> {
        let (completion, outcome, error) = match outcome {
            AgentOutcome::InProgress => {
                self.transaction().immediate.push(ack(
                    session_id,
                    operation.op_id,
                    operation.attempt,
                ));
                return None;
            }
            AgentOutcome::Done { observed, .. } => (
                Completion::Resolved {
                    observed: Some(observed.unwrap_or_default()),
                },
                OperationOutcome::Done,
                None,
            ),
            AgentOutcome::Failed(error) if error.code == code::NOT_FOUND => (
                Completion::Resolved { observed: None },
                OperationOutcome::Failed,
                Some(error),
            ),
            AgentOutcome::Failed(error) => {
                let value = self.unresolved(&item, &entry, now);
                return Some(self.accepted(
                    session_id,
                    item,
                    &operation,
                    OperationOutcome::Failed,
                    value,
                    Some(error),
                    now,
                ));
            }
            AgentOutcome::Wait { .. } => {
                let value = self.unresolved(&item, &entry, now);
                return Some(self.accepted(
                    session_id,
                    item,
                    &operation,
                    OperationOutcome::Wait,
                    value,
                    None,
                    now,
                ));
            }
        };
        info!(tenant_id = self.settings.tenant_id, item = %item, op_id = %operation.op_id, "A READ resolved an UNKNOWN item.");
        let value = completed(&self.model.current, &entry, completion);
        Some(self.accepted(session_id, item, &operation, outcome, value, error, now))
    }

    #[allow(clippy::too_many_arguments)]
    fn accepted(
        &self,
        session_id: u64,
        item: ItemRef,
        operation: &InFlight,
        outcome: OperationOutcome,
        value: Option<CurrentItem>,
        error: Option<OperationError>,
        _now: Now,
    ) -> Accepted {
        Accepted {
            session_id,
            item,
            kind: operation.kind,
            op_id: operation.op_id.clone(),
            attempt: operation.attempt,
            outcome,
            started_ms: operation.started_at_ms,
            value,
            error,
        }
    }

    /// Notes a progress heartbeat of a running operation from session
    /// `session_id` (shown as its last progress time; kept in memory, not
    /// worth a durable commit). Only the session that holds the item's
    /// type speaks for the operation, as for results: progress from an
    /// older session changes nothing (it would keep an operation alive
    /// that the current session does not run). Returns whether anything
    /// changed.
    pub fn progress(
        &mut self,
        session_id: u64,
        op_id: &str,
        attempt: u32,
        message: String,
        now: Now,
    ) -> bool {
        debug!(tenant_id = self.settings.tenant_id, %op_id, attempt, "Operation progress.");
        let Some(item) = self.operations.get(op_id).cloned() else {
            return false;
        };
        let held_by_sender = self
            .sessions
            .get(&**item.item_type())
            .is_some_and(|holder| holder.session_id == session_id);
        if !held_by_sender {
            return false;
        }
        let Some(entry) = self.model.current.get(&item) else {
            return false;
        };
        let matches = entry
            .in_flight
            .as_ref()
            .is_some_and(|operation| operation.op_id == op_id && operation.attempt == attempt);
        if !matches {
            return false;
        }
        if entry.operation_runs()
            && let Some(operation) = entry.in_flight.as_ref()
        {
            // A progress report resets the operation's timeout
            // (docs/agents.md, long-running operations).
            self.deadlines
                .extend(op_id, operation.timeout_ms, now.mono_ms);
        }
        let mut updated = (**entry).clone();
        if let Some(operation) = updated.in_flight.as_mut() {
            operation.last_progress_ms = Some(now.wall_ms);
            if !message.is_empty() {
                operation.progress_message = Some(message);
            }
        }
        self.model.current.insert(item, updated);
        true
    }

    /// Records reports of external items. Reports in which an item
    /// vanishes and comes back are planned in segments: its vanishing must
    /// be planned (dependents auto-deleted with it are dropped, rule 9)
    /// before it exists again. One commit holds every segment, and only
    /// the pass on the last one dispatches: an operation found ready
    /// before a later segment removes an item it relies on would be sent,
    /// once the commit is durable, with that item already gone.
    pub fn report_external(&mut self, changes: Vec<ExternalChange>, now: Now) -> Effects {
        self.begin();
        let segments = flap_segments(changes);
        let last = segments.len().saturating_sub(1);
        let mut held = false;
        for (index, segment) in segments.into_iter().enumerate() {
            let dispatch = if index == last {
                Dispatch::Now
            } else {
                Dispatch::Held
            };
            let planned = self.report_segment(segment, dispatch, now);
            if index == last && held && !planned {
                // The last segment changed nothing: what the held passes
                // found ready is planned and dispatched now.
                let unconverged = self.model.unconverged.to_ordered();
                self.pass(Scope::Items(unconverged), now);
            }
            held |= planned;
        }
        self.end()
    }

    /// Stages reports in which no item vanishes and comes back (the last
    /// report of an item wins), and plans, dispatching as told. Whether it
    /// planned (a report that changes nothing does not).
    fn report_segment(
        &mut self,
        changes: Vec<ExternalChange>,
        dispatch: Dispatch,
        now: Now,
    ) -> bool {
        let mut latest: BTreeMap<ItemRef, Option<CurrentItem>> = BTreeMap::new();
        for change in changes {
            match change {
                ExternalChange::Put { mut item, modified } => {
                    item.external = true;
                    item.dependencies.clear();
                    let key = item.item_ref();
                    let previous_counter = match latest.get(&key) {
                        Some(reported) => reported.as_ref().map_or(0, |r| r.modifications),
                        None => self.model.current.get(&key).map_or(0, |c| c.modifications),
                    };
                    let mut entry = CurrentItem::created(Arc::new(item), 0);
                    entry.modifications = previous_counter + u64::from(modified);
                    latest.insert(key, Some(entry));
                }
                ExternalChange::Delete { item } => {
                    latest.insert(item, None);
                }
            }
        }
        // A report that changes nothing (the item exactly as stored, or the
        // vanishing of an item that is not there) writes nothing and plans
        // nothing: agents and controllers re-report their whole inventory
        // periodically, and an unchanged item settles nothing new.
        latest.retain(|key, reported| {
            self.model.current.get(key).map(|stored| &**stored) != reported.as_ref()
        });
        if latest.is_empty() {
            return false;
        }
        let vanished: Vec<ItemRef> = latest
            .iter()
            .filter(|(key, reported)| reported.is_none() && self.model.current.get(key).is_some())
            .map(|(key, _)| key.clone())
            .collect();
        let mut updates: CurrentUpdates = latest.into_iter().collect();
        updates.extend(mark_gone_with_externals(&self.model.current, vanished));
        forget_marks_on_removed(&self.model.current, &mut updates);
        let mut touched: BTreeSet<ItemRef> = updates.iter().map(|(key, _)| key.clone()).collect();
        // What depends on a reported item is planned again too: an external
        // item's presence or value decides its dependents' fate (rule 9,
        // predicates), and the planner does not walk down from an item it
        // finds converged.
        let dependents: Vec<ItemRef> = touched
            .iter()
            .flat_map(|key| {
                self.model
                    .current
                    .dependents_of(key)
                    .chain(self.model.intended.dependents_of(key))
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        touched.extend(dependents);
        // And every unconverged item: a dependent further down may have
        // waited on what the report settles (a Delete no longer needed once
        // an external item is back), and its wait must not outlive it.
        touched.extend(self.model.unconverged.iter().cloned());
        self.stage_all(updates);
        self.pass_dispatching(Scope::Items(touched), dispatch, now);
        true
    }

    /// Sends again the lost operations whose re-delivery waited for a
    /// dependency (UNKNOWN, or being modified or deleted), for a Delete of
    /// their type (a lost Create), or for room, once none does and their
    /// type has a session with room.
    /// `None` when there is nothing to send.
    pub fn redeliver_deferred(&mut self, now: Now) -> Option<Effects> {
        if self.deferred_redeliveries.is_empty() {
            return None;
        }
        self.count_in_flight();
        let deleting = self.types_with_running_deletes();
        let ready: BTreeSet<ItemRef> = self
            .deferred_redeliveries
            .iter()
            .filter(|item| {
                self.sessions.contains_key(&**item.item_type())
                    && self
                        .room
                        .has_room(item.item_type(), self.type_limits(item.item_type()))
                    && self.model.current.get(item).is_none_or(|current| {
                        current.state != ItemState::Unknown
                            || !redelivery_waits(
                                &self.model.current,
                                &self.model.waiting,
                                item,
                                current,
                                deleting.contains(&**item.item_type()),
                            )
                    })
            })
            .cloned()
            .collect();
        if ready.is_empty() {
            return None;
        }
        self.begin();
        for item in &ready {
            self.deferred_redeliveries.remove(item);
        }
        let types: HashSet<String> = ready
            .iter()
            .map(|item| item.item_type().to_string())
            .collect();
        self.redeliver_lost(&types, Some(&ready), now);
        self.pass(Scope::Items(ready), now);
        Some(self.end())
    }

    /// Sends lost operations of `types` again, with the same op id and
    /// attempt, to the session that now holds the type, and re-sends the
    /// operations in flight on the type's previous session. With `only`,
    /// just the lost operations of those items. A lost operation of an item
    /// that relies on an UNKNOWN item waits (DESIGN 4) until that is
    /// resolved ([`Self::redeliver_deferred`]), and so does one (or the
    /// READ that would resolve it) that finds no room: an UNKNOWN item's
    /// lost operation does not count as running, so sending every one at
    /// once could pass the type's `max_in_flight` (after a restart, say,
    /// with operations whose cancel went unanswered). One the agent lists
    /// as still running goes at once: it attaches to what already runs.
    fn redeliver_lost(
        &mut self,
        types: &HashSet<String>,
        only: Option<&BTreeSet<ItemRef>>,
        now: Now,
    ) {
        let mut resend = Vec::new();
        // Each decision, with whether the agent still runs the operation
        // (it listed it): sending it again then attaches to the running
        // one, which already takes its room.
        let mut decided: Vec<(ItemRef, Redelivery, CurrentItem, bool)> = Vec::new();
        let deleting = self.types_with_running_deletes();
        let candidates: Vec<ItemRef> = self
            .operations
            .values()
            .filter(|item| {
                types.contains(&**item.item_type()) && only.is_none_or(|only| only.contains(item))
            })
            .cloned()
            .collect();
        for item in candidates {
            let Some(mut entry) = self.model.current.get(&item).map(|entry| (**entry).clone())
            else {
                continue;
            };
            let Some(mut operation) = entry.in_flight.as_deref().cloned() else {
                continue;
            };
            if entry.state == ItemState::Unknown
                && let Some(lost) = operation.resolves.take()
            {
                // The READ that was to resolve it was lost too: what is
                // decided is the lost operation's fate.
                operation = *lost;
                entry.in_flight = Some(Box::new(operation.clone()));
            }
            if entry.state != ItemState::Unknown {
                // Sent to the previous session of this type: send it again
                // (agents de-duplicate on op id and attempt).
                if only.is_none() {
                    resend.push(item);
                }
                continue;
            }
            let agent_holds = self
                .sessions
                .get(&**item.item_type())
                .and_then(|holder| holder.outstanding.holds(&operation.op_id));
            let superseded =
                superseded(&self.model.intended, &self.model.current, &item, &operation);
            let spec = self.spec(item.item_type());
            let readable = spec.supports_read;
            let rng = &mut self.rng;
            let retry_at = |failures| {
                spec.retry_at(now.wall_ms, failures, false, |low, high| {
                    rand::Rng::random_range(rng, low..=high)
                })
            };
            let decision = redelivery(
                &self.model.current,
                &self.model.waiting,
                &item,
                &entry,
                &operation,
                agent_holds,
                readable,
                deleting.contains(&**item.item_type()),
                superseded,
                now.wall_ms,
                retry_at,
            );
            decided.push((item, decision, entry, agent_holds == Some(true)));
        }
        defer_creates_behind_deletes_sent_with_them(&mut decided);
        // Those the agent still runs hold their room before any other
        // takes one.
        decided.sort_by_key(|(_, _, _, still_runs)| !*still_runs);
        for item in resend {
            self.send_journaled(&item);
        }
        self.count_in_flight();
        let mut orders = Vec::new();
        for (item, decision, entry, still_runs) in decided {
            // Decided now: a deferral from before is settled (or made
            // again below), so the item is not sent twice.
            self.deferred_redeliveries.remove(&item);
            let read = matches!(decision, Redelivery::Read);
            let sends = read || matches!(decision, Redelivery::Resend { .. });
            if sends && still_runs {
                self.room.occupy(item.item_type());
            }
            if sends && !still_runs {
                let limits = self.type_limits(item.item_type());
                // A READ resolving a lost operation is work, not a drift
                // READ: the tenant stays Reconciling while it runs.
                if !self.room.take(item.item_type(), false, limits) {
                    self.deferred_redeliveries.insert(item);
                    continue;
                }
            }
            let op_id = entry
                .in_flight
                .as_ref()
                .map(|operation| operation.op_id.clone())
                .unwrap_or_default();
            match decision {
                Redelivery::Defer => {
                    self.deferred_redeliveries.insert(item);
                }
                Redelivery::GiveUp { value, why } => {
                    if let GiveUpReason::BrokenDependency(dependency) = &why {
                        info!(
                            tenant_id = self.settings.tenant_id,
                            item = %item,
                            op_id = %op_id,
                            dependency = %dependency,
                            "A lost operation's dependency no longer holds; it is not sent again."
                        );
                    }
                    self.stage(&item, value);
                }
                Redelivery::Resend { operation, value } => {
                    self.stage(&item, Some(value));
                    orders.push((item, operation.op_id));
                }
                Redelivery::Read => {
                    let read = self.resolving_read(&item, &entry, now);
                    orders.push((item, read));
                }
            }
        }
        for (item, op_id) in orders {
            self.track_operation(&op_id, &item);
            self.send_journaled(&item);
        }
    }
}

impl Executor {
    /// Stages a READ of UNKNOWN `item` whose lost operation (in `entry`)
    /// runs nowhere: its answer resolves the item. Returns the READ's op
    /// id. The lost operation's re-delivery is counted, so an agent that
    /// keeps dying on it cannot loop for ever (a poison operation).
    fn resolving_read(&mut self, item: &ItemRef, entry: &CurrentItem, now: Now) -> String {
        let mut lost = entry.in_flight.as_deref().cloned().unwrap_or_else(|| {
            InFlight::new(OperationKind::Read, String::new(), 1, 0, now.wall_ms, 0)
        });
        lost.redeliveries = lost.redeliveries.saturating_add(1);
        let timeout_ms = self.spec(item.item_type()).operation_timeout_ms;
        let read = InFlight {
            resolves: Some(Box::new(lost.clone())),
            ..InFlight::new(
                OperationKind::Read,
                self.next_op_id(),
                1,
                lost.target_generation,
                now.wall_ms,
                timeout_ms,
            )
        };
        let op_id = read.op_id.clone();
        let value = CurrentItem {
            state: ItemState::Unknown,
            in_flight: Some(Box::new(read)),
            ..entry.clone()
        };
        self.stage(item, Some(value));
        op_id
    }

    /// The READ that was to resolve UNKNOWN `item` could not tell (it
    /// failed, waited or timed out): its lost operation's fate is decided
    /// as for a type without READ (sent again, given up, or deferred).
    /// Returns the item's new record; an order goes out with the commit.
    pub(super) fn unresolved(
        &mut self,
        item: &ItemRef,
        entry: &CurrentItem,
        now: Now,
    ) -> Option<CurrentItem> {
        let Some(mut lost) = entry
            .in_flight
            .as_ref()
            .and_then(|operation| operation.resolves.as_deref())
            .cloned()
        else {
            return Some(entry.clone());
        };
        // The READ counted this loss when it was sent; sending the lost
        // operation again counts it once more, so one loss counts once
        // towards giving the operation up as poison.
        lost.redeliveries = lost.redeliveries.saturating_sub(1);
        let unknown = CurrentItem {
            state: ItemState::Unknown,
            in_flight: Some(Box::new(lost.clone())),
            ..entry.clone()
        };
        let delete_of_its_type_runs = self
            .types_with_running_deletes()
            .contains(&**item.item_type());
        let superseded = superseded(&self.model.intended, &self.model.current, item, &lost);
        let spec = self.spec(item.item_type());
        let rng = &mut self.rng;
        let retry_at = |failures| {
            spec.retry_at(now.wall_ms, failures, false, |low, high| {
                rand::Rng::random_range(rng, low..=high)
            })
        };
        let decision = redelivery(
            &self.model.current,
            &self.model.waiting,
            item,
            &unknown,
            &lost,
            Some(false),
            false,
            delete_of_its_type_runs,
            superseded,
            now.wall_ms,
            retry_at,
        );
        // Decided now: a deferral from before (a registration that found
        // no room for this READ, say) is settled, or made again below. Left
        // behind, it would send a READ the next time the item is UNKNOWN,
        // even while its operation still runs on a live session.
        self.deferred_redeliveries.remove(item);
        match decision {
            Redelivery::Resend { operation, value } => {
                self.transaction()
                    .relost
                    .push((item.clone(), operation.op_id));
                Some(value)
            }
            Redelivery::GiveUp { value, .. } => value,
            Redelivery::Defer | Redelivery::Read => {
                self.deferred_redeliveries.insert(item.clone());
                Some(unknown)
            }
        }
    }

    /// The item types on which a Delete runs (sent, its outcome not lost):
    /// a lost Create sent again afresh waits for those (DESIGN 3, rule 8).
    fn types_with_running_deletes(&self) -> HashSet<String> {
        self.operations
            .iter()
            .filter(|(op_id, item)| {
                self.model.current.get(item).is_some_and(|entry| {
                    runs_a_delete(entry)
                        && entry
                            .in_flight
                            .as_deref()
                            .is_some_and(|operation| &operation.op_id == *op_id)
                })
            })
            .map(|(_, item)| item.item_type().to_string())
            .collect()
    }
}

/// Lost operations decided together (an agent registered): a Create sent
/// afresh waits for a Delete of its type sent with it, as it would for one
/// that already runs (DESIGN 3, rule 8). The Delete's result sends it
/// ([`Executor::redeliver_deferred`]).
fn defer_creates_behind_deletes_sent_with_them(
    decided: &mut [(ItemRef, Redelivery, CurrentItem, bool)],
) {
    let sends_kind = |decision: &Redelivery, kind: OperationKind| {
        matches!(decision, Redelivery::Resend { operation, .. }
            if operation.kind == kind && !operation.question)
    };
    let deleting: HashSet<String> = decided
        .iter()
        .filter(|(_, decision, _, _)| sends_kind(decision, OperationKind::Delete))
        .map(|(item, ..)| item.item_type().to_string())
        .collect();
    for (item, decision, _, still_runs) in decided.iter_mut() {
        if !*still_runs
            && sends_kind(decision, OperationKind::Create)
            && deleting.contains(&**item.item_type())
        {
            *decision = Redelivery::Defer;
        }
    }
}

/// A READ that changes nothing: the item keeps what it observed.
fn unchanged_read(entry: &CurrentItem) -> Completion {
    Completion::Read {
        observed: entry.observed.as_deref().cloned().unwrap_or_default(),
    }
}

/// Splits reports where an item that vanished comes back: its vanishing
/// must be planned (dependents auto-deleted with it are dropped, rule 9)
/// before it exists again, not folded into "it exists".
fn flap_segments(changes: Vec<ExternalChange>) -> Vec<Vec<ExternalChange>> {
    let mut segments = Vec::new();
    let mut segment = Vec::new();
    let mut vanished: BTreeSet<ItemRef> = BTreeSet::new();
    for change in changes {
        let comes_back = matches!(&change, ExternalChange::Put { item, .. } if vanished.contains(&item.item_ref()));
        if comes_back {
            segments.push(std::mem::take(&mut segment));
            vanished.clear();
        }
        if let ExternalChange::Delete { item } = &change {
            vanished.insert(item.clone());
        }
        segment.push(change);
    }
    segments.push(segment);
    segments
}
