//! The executor half of a tenant's owner: configurator sessions, dispatch
//! of ready operations, results, timeouts and lost outcomes.
//!
//! Every transition is committed before it is acted on: an operation is
//! journaled (its in-flight record stored) before it is sent, and a result
//! is stored before it is acknowledged.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use reconciled_proto::v1;
use tracing::{debug, info, info_span};

use crate::engine::exec::lost::{
    GiveUpReason, Redelivery, redelivery, waits_for_an_unknown_dependency,
};
use crate::engine::exec::port::{
    AgentOutcome, FromAgent, Grant, OperationOrder, Registration, ToAgent,
};
use crate::engine::exec::{Limits, Running, TypeSpec};
use crate::engine::plan::Plan;
use crate::engine::transition::{
    Completion, CurrentUpdates, completed, record_dispatch_marks, started,
};
use crate::graph::{
    CurrentItem, InFlight, ItemRef, ItemState, OperationError, OperationKind, code,
};
use crate::store::{WriteBatch, keys};
use crate::watch::events;
use tokio::time::Instant;

use super::error::TenantError;
use super::owner::{Deadline, Holder, Owner, RegistrationError, Scope};
use super::persist::{self, StoredSpec};
use super::record::decode;
use super::state::scan_all;

/// A result that changes state, waiting for its commit.
struct AcceptedResult {
    kind: OperationKind,
    outcome: &'static str,
    wire_outcome: v1::Outcome,
    started_ms: u64,
    session_id: u64,
    item: ItemRef,
    op_id: String,
    attempt: u32,
    value: Option<CurrentItem>,
    error: Option<OperationError>,
}

impl AcceptedResult {
    fn ack(&self) -> ToAgent {
        ToAgent::Ack {
            op_id: self.op_id.clone(),
            attempt: self.attempt,
        }
    }
}

/// A uniformly random number in `[low, high]` from the owner's generator.
fn random_in(rng: &mut rand::rngs::StdRng, low: u64, high: u64) -> u64 {
    rng.random_range(low..=high)
}

impl Owner {
    /// Loads stored type specs, and turns operations journaled before a
    /// restart into lost outcomes (UNKNOWN) to be resolved when their type's
    /// agent registers again.
    pub(super) fn load_specs_and_journal(&mut self) -> Result<(), TenantError> {
        for (key, value) in scan_all(&*self.store, &keys::type_specs_prefix(self.state.record.id))?
        {
            let stored: StoredSpec = decode(&key, &value)?;
            self.types.insert(stored.spec, stored.epoch);
        }
        self.clamp_retry_times();
        let journaled: Vec<(ItemRef, CurrentItem)> = self
            .state
            .current
            .iter()
            .filter(|(_, current)| current.in_flight.is_some())
            .map(|(key, current)| (key.clone(), (**current).clone()))
            .collect();
        for (key, current) in journaled {
            if let Some(operation) = &current.in_flight {
                self.operations.insert(operation.op_id.clone(), key.clone());
            }
            if current.state != ItemState::Unknown {
                let before = self.state.displayed(&key);
                if let Some(lost) = completed(&self.state.current, &current, lost_outcome(&current))
                {
                    self.state.current.insert(key.clone(), lost);
                }
                self.state.recount_item(&key, before);
            }
        }
        Ok(())
    }

    /// A retry time stored before a restart waits at most the policy's
    /// longest wait from now (clocks move; policies change).
    fn clamp_retry_times(&mut self) {
        let now = self.now();
        let clamped: Vec<(ItemRef, CurrentItem)> = self
            .state
            .current
            .iter()
            .filter_map(|(key, current)| {
                let at = current.next_attempt_at_ms?;
                let latest = now.saturating_add(self.spec(&key.item_type).retry.max_delay_ms());
                (at > latest).then(|| {
                    let mut clamped = (**current).clone();
                    clamped.next_attempt_at_ms = Some(latest);
                    (key.clone(), clamped)
                })
            })
            .collect();
        for (key, value) in clamped {
            self.state.current.insert(key, value);
        }
    }

    /// Recomputes each session's operations in flight from the items'
    /// journaled operations, and forgets index entries of operations that
    /// are no longer any item's (so counts cannot drift, whatever path an
    /// operation ended on). Only on committed state: an entry forgotten on
    /// a tentative state whose commit then failed would make the resent
    /// result unknown and leave its operation in flight with no deadline.
    pub(super) fn recount_in_flight(&mut self) {
        let current = &self.state.current;
        self.operations.retain(|op_id, item| {
            current
                .get(item)
                .and_then(|c| c.in_flight.as_ref())
                .is_some_and(|operation| &operation.op_id == op_id)
        });
        self.count_in_flight();
        self.track_deadlines();
    }

    /// Counts each session's operations in flight (and READs among them)
    /// on the state as it is now, tentative or committed; changes nothing
    /// else.
    pub(super) fn count_in_flight(&mut self) {
        let current = &self.state.current;
        let mut counts: HashMap<&str, (usize, usize)> = HashMap::new();
        for (op_id, item) in &self.operations {
            let Some(current) = current.get(item) else {
                continue;
            };
            let Some(operation) = current.in_flight.as_ref() else {
                continue;
            };
            if &operation.op_id == op_id && current.state != ItemState::Unknown {
                let count = counts.entry(&*item.item_type).or_default();
                count.0 += 1;
                count.1 += usize::from(operation.kind == OperationKind::Read);
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

    /// Keeps one deadline per operation in flight: forgets those of
    /// operations that ended or whose outcome is unknown (they wait for a
    /// report, not a clock), and gives any running operation without one
    /// its full timeout from now.
    fn track_deadlines(&mut self) {
        let current = &self.state.current;
        let running = |op_id: &str, item: &ItemRef| {
            current
                .get(item)
                .filter(|c| c.state != ItemState::Unknown)
                .and_then(|c| c.in_flight.as_ref())
                .filter(|operation| operation.op_id == op_id)
                .cloned()
        };
        let operations = &self.operations;
        self.deadlines.retain(|op_id, _| {
            operations
                .get(op_id)
                .is_some_and(|item| running(op_id, item).is_some())
        });
        let now = self.settings.clock.monotonic();
        let cancel_timeout = self.settings.cancel_timeout;
        for (op_id, item) in &self.operations {
            if self.deadlines.contains_key(op_id) {
                continue;
            }
            if let Some(operation) = running(op_id, item) {
                self.deadlines.insert(
                    op_id.clone(),
                    Deadline {
                        timeout_at: now + Duration::from_millis(operation.timeout_ms),
                        cancel_at: operation.cancel_requested.then(|| now + cancel_timeout),
                    },
                );
            }
        }
    }

    /// Starts the clock of an operation just (re)delivered to an agent: it
    /// has its full timeout from now (the agent is told a duration).
    fn start_deadline(&mut self, op_id: &str, timeout_ms: u64) {
        let deadline = Deadline {
            timeout_at: self.monotonic() + Duration::from_millis(timeout_ms),
            cancel_at: None,
        };
        self.deadlines.insert(op_id.to_owned(), deadline);
    }

    fn spec(&self, item_type: &str) -> TypeSpec {
        self.types
            .spec(item_type)
            .cloned()
            .unwrap_or_else(|| TypeSpec::new(item_type))
    }

    fn holder_of_session(&self, session_id: u64) -> Option<&Holder> {
        self.sessions
            .values()
            .find(|holder| holder.link.session_id == session_id)
    }

    fn send_to_session(&self, session_id: u64, message: ToAgent) {
        if let Some(holder) = self.holder_of_session(session_id) {
            let _ = holder.link.sender.send(message);
        }
    }

    /// Registers a session for item types (see DESIGN section 4, ownership).
    pub(super) async fn register(
        &mut self,
        registration: Registration,
    ) -> Result<Vec<Grant>, RegistrationError> {
        for spec in &registration.types {
            if let Some(holder) = self.sessions.get(&spec.item_type)
                && holder.link.agent_id != registration.link.agent_id
            {
                return Err(RegistrationError::TypeHeld {
                    item_type: spec.item_type.clone(),
                    holder: holder.link.agent_id.clone(),
                });
            }
        }
        let mut batch = WriteBatch::new();
        let mut grants = Vec::new();
        for spec in &registration.types {
            let epoch = self.types.epoch(&spec.item_type) + 1;
            let stored = StoredSpec {
                spec: spec.clone(),
                epoch,
            };
            persist::put_type_spec(&mut batch, self.state.record.id, &stored)?;
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
            self.pending_events.push(events::agent_connected(
                &registration.link.agent_id,
                item_types,
                epoch,
            ));
        }
        if let Err(error) = self
            .commit_current_updates_with(Vec::new(), None, batch)
            .await
        {
            self.pending_events.clear();
            return Err(error.into());
        }

        let types: HashSet<String> = registration
            .types
            .iter()
            .map(|s| s.item_type.clone())
            .collect();
        let outstanding = Arc::new(registration.outstanding);
        for (spec, grant) in registration.types.into_iter().zip(&grants) {
            self.types.insert(spec.clone(), grant.epoch);
            self.sessions.insert(
                spec.item_type.clone(),
                Holder {
                    link: registration.link.clone(),
                    epoch: grant.epoch,
                    outstanding: outstanding.clone(),
                },
            );
        }
        info!(
            tenant = %self.state.record.name,
            agent = %registration.link.agent_id,
            types = ?types,
            "Configurator registered."
        );
        self.redeliver_lost(&types, None).await?;
        self.pass(Scope::Full).await?;
        Ok(grants)
    }

    /// Sends again the lost operations whose re-delivery waited for an
    /// UNKNOWN dependency, once none does and their type has a session.
    pub(super) async fn retry_deferred_redeliveries(&mut self) -> Result<(), TenantError> {
        if self.deferred_redeliveries.is_empty() {
            return Ok(());
        }
        let ready: BTreeSet<ItemRef> = self
            .deferred_redeliveries
            .iter()
            .filter(|item| {
                self.sessions.contains_key(&*item.item_type)
                    && self.state.current.get(item).is_none_or(|current| {
                        current.state != ItemState::Unknown
                            || !waits_for_an_unknown_dependency(&self.state.current, item, current)
                    })
            })
            .cloned()
            .collect();
        if ready.is_empty() {
            return Ok(());
        }
        for item in &ready {
            self.deferred_redeliveries.remove(item);
        }
        let types: HashSet<String> = ready
            .iter()
            .map(|item| item.item_type.to_string())
            .collect();
        self.redeliver_lost(&types, Some(&ready)).await?;
        self.pass(Scope::Items(ready)).await.map(|_| ())
    }

    /// Sends lost operations of `types` again, with the same op id and
    /// attempt, to the session that now holds the type, and re-sends the
    /// operations in flight on the type's previous session. With `only`,
    /// just the lost operations of those items. A lost operation of an item
    /// that relies on an UNKNOWN item waits (DESIGN 4) until that is
    /// resolved ([`Self::retry_deferred_redeliveries`]).
    async fn redeliver_lost(
        &mut self,
        types: &HashSet<String>,
        only: Option<&BTreeSet<ItemRef>>,
    ) -> Result<(), TenantError> {
        let mut updates: CurrentUpdates = Vec::new();
        let mut orders = Vec::new();
        let mut resend = Vec::new();
        let mut abandoned = Vec::new();
        let mut deferred = Vec::new();
        for item in self.operations.values() {
            if !types.contains(&*item.item_type) || only.is_some_and(|only| !only.contains(item)) {
                continue;
            }
            let Some(current) = self.state.current.get(item) else {
                continue;
            };
            let Some(operation) = current.in_flight.clone() else {
                continue;
            };
            if current.state != ItemState::Unknown {
                // Sent to the previous session of this type: send it again
                // (agents de-duplicate on op id and attempt).
                if only.is_none() {
                    resend.push((item.clone(), operation));
                }
                continue;
            }
            let now = self.settings.clock.now_ms();
            let spec = self.spec(&item.item_type);
            let agent_holds = self
                .sessions
                .get(&*item.item_type)
                .and_then(|holder| holder.outstanding.holds(&operation.op_id));
            let rng = &mut self.rng;
            let retry_at = |failures| {
                spec.retry_at(now, failures, false, |low, high| random_in(rng, low, high))
            };
            match redelivery(
                &self.state.current,
                item,
                current,
                &operation,
                agent_holds,
                now,
                retry_at,
            ) {
                Redelivery::Defer => deferred.push(item.clone()),
                Redelivery::GiveUp { value, why } => {
                    if let GiveUpReason::BrokenDependency(dependency) = &why {
                        info!(
                            tenant = %self.state.record.name,
                            item = %item,
                            op_id = %operation.op_id,
                            dependency = %dependency,
                            "A lost operation's dependency no longer holds; it is not sent again."
                        );
                    }
                    abandoned.push(operation.op_id.clone());
                    updates.push((item.clone(), value));
                }
                Redelivery::Resend { operation, value } => {
                    orders.push((item.clone(), operation));
                    updates.push((item.clone(), Some(value)));
                }
            }
        }
        for (item, operation) in &resend {
            if let Some(holder) = self.sessions.get(&*item.item_type)
                && let Some(order) = order_for(&self.state.current, item, operation, holder.epoch)
            {
                let _ = holder.link.sender.send(ToAgent::Operation(order));
                self.start_deadline(&operation.op_id, operation.timeout_ms);
            }
        }
        self.deferred_redeliveries.extend(deferred);
        if updates.is_empty() {
            return Ok(());
        }
        self.commit_current_updates(updates, None).await?;
        for op_id in abandoned {
            self.forget_operation(&op_id);
        }
        for (item, operation) in orders {
            self.operations
                .insert(operation.op_id.clone(), item.clone());
            let Some(holder) = self.sessions.get(&*item.item_type) else {
                continue;
            };
            let order = order_for(&self.state.current, &item, &operation, holder.epoch);
            if let Some(order) = order {
                let _ = holder.link.sender.send(ToAgent::Operation(order));
                self.start_deadline(&operation.op_id, operation.timeout_ms);
            }
        }
        Ok(())
    }

    /// Notes a progress heartbeat of a running operation (shown as its last
    /// progress time; kept in memory, not worth a durable commit).
    fn record_progress(&mut self, op_id: &str, attempt: u32, message: String) {
        let Some(item) = self.operations.get(op_id).cloned() else {
            return;
        };
        let Some(current) = self.state.current.get(&item) else {
            return;
        };
        let matches = current
            .in_flight
            .as_ref()
            .is_some_and(|operation| operation.op_id == op_id && operation.attempt == attempt);
        if matches {
            let mut updated = (**current).clone();
            if let Some(operation) = updated.in_flight.as_mut() {
                operation.last_progress_ms = Some(self.settings.clock.now_ms());
                if !message.is_empty() {
                    operation.progress_message = Some(message);
                }
            }
            self.state.current.insert(item, updated);
            self.publish();
        }
    }

    /// Handles a message of session `session_id`.
    pub(super) async fn handle_agent_message(
        &mut self,
        session_id: u64,
        message: FromAgent,
    ) -> Result<(), TenantError> {
        match message {
            FromAgent::Result {
                op_id,
                attempt,
                outcome,
            } => self.result(session_id, op_id, attempt, outcome).await,
            FromAgent::Progress {
                op_id,
                attempt,
                message,
            } => {
                debug!(tenant = %self.state.record.name, %op_id, attempt, "Operation progress.");
                self.record_progress(&op_id, attempt, message);
                Ok(())
            }
            FromAgent::CancelAck { op_id } => {
                debug!(tenant = %self.state.record.name, %op_id, "Cancel acknowledged.");
                Ok(())
            }
            FromAgent::External(changes) => self.report_external(changes).await.map(|_| ()),
        }
    }

    async fn result(
        &mut self,
        session_id: u64,
        op_id: String,
        attempt: u32,
        outcome: AgentOutcome,
    ) -> Result<(), TenantError> {
        self.results(vec![(session_id, op_id, attempt, outcome)])
            .await
    }

    /// Takes the results that arrived together into one pass and one commit
    /// (the results, the journal of what they unblock, the record), then
    /// acknowledges them. Results that change nothing are acknowledged at once.
    pub(super) async fn results(
        &mut self,
        batch: Vec<(u64, String, u32, AgentOutcome)>,
    ) -> Result<(), TenantError> {
        let now = self.now();
        let mut accepted: Vec<AcceptedResult> = Vec::new();
        for (session_id, op_id, attempt, outcome) in batch {
            if let Some(result) = self.accept_result(session_id, op_id, attempt, outcome, now) {
                if accepted.iter().any(|other| other.item == result.item) {
                    // The same operation reported twice in one batch.
                    self.send_to_session(result.session_id, result.ack());
                    continue;
                }
                accepted.push(result);
            }
        }
        if accepted.is_empty() {
            return Ok(());
        }
        let items: BTreeSet<ItemRef> = accepted.iter().map(|result| result.item.clone()).collect();
        let pending: CurrentUpdates = accepted
            .iter()
            .map(|result| (result.item.clone(), result.value.clone()))
            .collect();
        for result in &accepted {
            self.pending_events.push(events::operation_finished(
                &result.item,
                result.kind,
                &result.op_id,
                result.attempt,
                result.wire_outcome,
                result.error.as_ref(),
            ));
        }
        // Not durable on error: no ack; the agents resend their results.
        if let Err(error) = self.pass_with(Scope::Items(items), pending, None).await {
            self.pending_events.clear();
            return Err(error);
        }
        for result in accepted {
            let seconds = now.saturating_sub(result.started_ms) as f64 / 1e3;
            let _span = info_span!(
                "operation_result",
                tenant = %self.state.record.name,
                item = %result.item,
                op_id = %result.op_id,
                kind = result.kind.as_str(),
                outcome = result.outcome,
                seconds,
            )
            .entered();
            debug!("Operation result recorded.");
            self.settings
                .metrics
                .finished(result.kind, result.outcome, seconds);
            self.log
                .ended(&result.op_id, result.attempt, now, result.error.clone());
            // The pass above may already have dispatched the retry, under
            // the same op id: forget the id only if nothing runs under it.
            self.forget_operation(&result.op_id);
            self.send_to_session(result.session_id, result.ack());
        }
        Ok(())
    }

    /// Checks one result against the item's in-flight operation. Results
    /// that change no state are acknowledged here and give `None`.
    fn accept_result(
        &mut self,
        session_id: u64,
        op_id: String,
        attempt: u32,
        outcome: AgentOutcome,
        now: u64,
    ) -> Option<AcceptedResult> {
        let ack = ToAgent::Ack {
            op_id: op_id.clone(),
            attempt,
        };
        let Some(item) = self.operations.get(&op_id).cloned() else {
            self.send_to_session(session_id, ack);
            return None;
        };
        let Some(current) = self.state.current.get(&item).cloned() else {
            self.send_to_session(session_id, ack);
            return None;
        };
        let matches = current
            .in_flight
            .as_ref()
            .is_some_and(|operation| operation.op_id == op_id && operation.attempt == attempt);
        let holds_type = self
            .sessions
            .get(&*item.item_type)
            .is_some_and(|holder| holder.link.session_id == session_id);
        if !matches {
            // A stale attempt: it changes no state.
            self.send_to_session(session_id, ack);
            return None;
        }
        if !holds_type {
            // A session whose epoch is over: its result changes no state; the
            // operation is re-delivered, same op id and attempt, to the
            // session that holds the type now.
            self.send_to_session(session_id, ack);
            if let (Some(holder), Some(operation)) = (
                self.sessions.get(&*item.item_type),
                current.in_flight.as_ref(),
            ) && let Some(order) = order_for(&self.state.current, &item, operation, holder.epoch)
            {
                let _ = holder.link.sender.send(ToAgent::Operation(order));
                let (op_id, timeout_ms) = (operation.op_id.clone(), operation.timeout_ms);
                self.start_deadline(&op_id, timeout_ms);
            }
            return None;
        }
        let is_read = current
            .in_flight
            .as_ref()
            .is_some_and(|o| o.kind == OperationKind::Read);
        // A failure the agent reported that is not a failed attempt
        // (cancelled as asked, NOT_FOUND): shown as FAILED with its error.
        let mut reported_failure: Option<OperationError> = None;
        let completion = match outcome {
            AgentOutcome::InProgress => {
                self.send_to_session(session_id, ack);
                return None;
            }
            AgentOutcome::Done { observed, .. } if is_read => {
                let observed = observed.unwrap_or_default();
                if let Some(applied) = &current.applied {
                    let paths = crate::engine::transition::drifted_paths(applied, &observed);
                    if !paths.is_empty() {
                        info!(tenant = %self.state.record.name, item = %item, ?paths, "Drift detected; correcting it.");
                        self.pending_events
                            .push(events::drift_detected(&item, paths));
                    }
                }
                Completion::Read { observed }
            }
            AgentOutcome::Failed(error) if is_read => {
                if error.code == code::NOT_FOUND {
                    reported_failure = Some(error);
                    Completion::Vanished
                } else {
                    // A failed READ changes nothing; the next resync tries again.
                    Completion::Read {
                        observed: current.observed.as_deref().cloned().unwrap_or_default(),
                    }
                }
            }
            AgentOutcome::Wait { .. } if is_read => {
                // Observation, not work: no backoff for a READ either; the
                // next resync reads again.
                Completion::Read {
                    observed: current.observed.as_deref().cloned().unwrap_or_default(),
                }
            }
            AgentOutcome::Done { needs_recreate, .. }
                if current.in_flight.as_ref().is_some_and(|o| o.question) =>
            {
                Completion::Answered { needs_recreate }
            }
            AgentOutcome::Done { observed, .. } => Completion::Done { observed },
            AgentOutcome::Wait { retry_after_ms } => Completion::Wait {
                retry_at_ms: now.saturating_add(retry_after_ms),
            },
            AgentOutcome::Failed(error) if error.code == code::CANCELLED => {
                // "Cancelled as asked" (the SDK's `Outcome::cancelled()`): the
                // agent stopped because it was told to. Not a failure: no
                // attempt is counted, no backoff; the next pass plans what
                // the intent needs now.
                reported_failure = Some(error);
                Completion::Wait { retry_at_ms: now }
            }
            AgentOutcome::Failed(error)
                if error.code == code::NOT_FOUND
                    && current.in_flight.as_ref().is_some_and(|operation| {
                        matches!(
                            operation.kind,
                            OperationKind::Modify | OperationKind::Delete
                        )
                    }) =>
            {
                // The configurator has no such item: a Delete has nothing
                // left to do, and a Modify has nothing to modify. Either way
                // the item is gone from current state; if it is intended,
                // the next pass creates it (docs/configurators.md).
                reported_failure = Some(error);
                Completion::Vanished
            }
            AgentOutcome::Failed(error) => {
                let spec = self.spec(&item.item_type);
                let failures = current.attempts.saturating_add(1);
                let rng = &mut self.rng;
                let retry_at_ms = spec.retry_at(now, failures, error.is_terminal(), |low, high| {
                    random_in(rng, low, high)
                });
                Completion::Failed { error, retry_at_ms }
            }
        };
        let operation = current.in_flight.clone()?;
        let outcome = match &completion {
            _ if reported_failure
                .as_ref()
                .is_some_and(|error| error.code == code::CANCELLED) =>
            {
                "cancelled"
            }
            Completion::Done { .. }
            | Completion::Read { .. }
            | Completion::Answered { .. }
            | Completion::Vanished => "done",
            Completion::Failed { .. } => "failed",
            Completion::Wait { .. } => "wait",
            Completion::Lost => "lost",
        };
        let wire_outcome = match &completion {
            _ if reported_failure.is_some() => v1::Outcome::Failed,
            Completion::Failed { .. } => v1::Outcome::Failed,
            Completion::Wait { .. } => v1::Outcome::Wait,
            _ => v1::Outcome::Done,
        };
        let error = match &completion {
            Completion::Failed { error, .. } => Some(error.clone()),
            _ => reported_failure,
        };
        let value = completed(&self.state.current, &current, completion);
        Some(AcceptedResult {
            kind: operation.kind,
            outcome,
            wire_outcome,
            started_ms: operation.started_at_ms,
            session_id,
            item,
            op_id: operation.op_id,
            attempt: operation.attempt,
            value,
            error,
        })
    }

    /// Commits the end of `item`'s in-flight operation.
    async fn finish(
        &mut self,
        item: &ItemRef,
        current: &CurrentItem,
        completion: Completion,
        now: u64,
    ) -> Result<(), TenantError> {
        let Some(operation) = current.in_flight.clone() else {
            return Ok(());
        };
        let error = match &completion {
            Completion::Failed { error, .. } => Some(error.clone()),
            _ => None,
        };
        let value = completed(&self.state.current, current, completion);
        self.commit_current_updates(vec![(item.clone(), value)], None)
            .await?;
        self.log
            .ended(&operation.op_id, operation.attempt, now, error);
        self.forget_operation(&operation.op_id);
        Ok(())
    }

    /// Forgets op id `op_id` once it ended, unless an attempt of it runs
    /// again (a retry keeps its op id): then it still names that attempt.
    fn forget_operation(&mut self, op_id: &str) {
        let Some(item) = self.operations.get(op_id) else {
            return;
        };
        let runs_again = self
            .state
            .current
            .get(item)
            .and_then(|c| c.in_flight.as_ref())
            .is_some_and(|operation| operation.op_id == op_id);
        if !runs_again {
            self.operations.remove(op_id);
            self.deadlines.remove(op_id);
        }
    }

    /// A session ended: its types are free, and the outcome of its
    /// operations in flight is unknown.
    pub(super) async fn session_closed(
        &mut self,
        session_id: u64,
        reason: &str,
    ) -> Result<(), TenantError> {
        let mut released: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, holder)| holder.link.session_id == session_id)
            .map(|(item_type, _)| item_type.clone())
            .collect();
        released.sort();
        if released.is_empty() {
            return Ok(());
        }
        let agent_id = self
            .holder_of_session(session_id)
            .map(|holder| holder.link.agent_id.clone())
            .unwrap_or_default();
        for item_type in &released {
            self.sessions.remove(item_type);
        }
        self.pending_events.push(events::agent_disconnected(
            &agent_id,
            released.clone(),
            reason,
        ));
        info!(tenant = %self.state.record.name, types = ?released, reason, "Configurator disconnected.");
        let mut updates: CurrentUpdates = Vec::new();
        let mut touched = BTreeSet::new();
        for item in self.operations.values() {
            if !released.iter().any(|t| **t == *item.item_type) {
                continue;
            }
            let Some(current) = self.state.current.get(item) else {
                continue;
            };
            if current.in_flight.is_none() || current.state == ItemState::Unknown {
                continue;
            }
            updates.push((
                item.clone(),
                completed(&self.state.current, current, lost_outcome(current)),
            ));
            touched.insert(item.clone());
        }
        // Always a commit: the disconnection is an event of its own.
        if let Err(error) = self.commit_current_updates(updates, None).await {
            self.pending_events.clear();
            return Err(error);
        }
        self.pass(Scope::Items(touched)).await?;
        Ok(())
    }

    /// The cancels of every in-flight operation the plan found superseded
    /// by an intent change: the in-flight records marked as cancelled, for
    /// the pass's
    /// commit, and the operations to send a cancel for once it is durable
    /// (a transition is committed before it is acted on).
    pub(super) fn prepare_cancels(&self, plan: &Plan) -> (CurrentUpdates, Vec<(ItemRef, String)>) {
        let now = self.now();
        let mut marks: CurrentUpdates = Vec::new();
        let mut cancels = Vec::new();
        for item in &plan.cancel {
            let Some(current) = self.state.current.get(item) else {
                continue;
            };
            let Some(operation) = &current.in_flight else {
                continue;
            };
            cancels.push((item.clone(), operation.op_id.clone()));
            let mut marked = (**current).clone();
            if let Some(operation) = marked.in_flight.as_mut() {
                operation.cancel_requested = true;
                operation.cancel_requested_at_ms = Some(now);
            }
            marks.push((item.clone(), Some(marked)));
        }
        (marks, cancels)
    }

    /// Sends the cancels of committed cancel marks and starts their cancel
    /// timeouts.
    pub(super) fn send_cancels(&mut self, cancels: Vec<(ItemRef, String)>) {
        let cancel_at = self.monotonic() + self.settings.cancel_timeout;
        for (item, op_id) in cancels {
            if let Some(holder) = self.sessions.get(&*item.item_type) {
                let _ = holder.link.sender.send(ToAgent::Cancel {
                    op_id: op_id.clone(),
                });
            }
            if let Some(deadline) = self.deadlines.get_mut(&op_id) {
                deadline.cancel_at = Some(cancel_at);
            }
        }
    }

    /// Picks every ready operation whose type has a live session with room
    /// and prepares its journal record. Returns the operations, their
    /// journal updates, and how many ready ones had to wait for room. The
    /// sessions' in-flight counts include the picked operations until the
    /// next pass recounts them from the journal.
    pub(super) fn prepare_dispatch(
        &mut self,
        plan: &Plan,
        now: u64,
    ) -> (Vec<(ItemRef, InFlight)>, CurrentUpdates, usize) {
        let mut waiting_for_room = 0;
        let mut starts: Vec<(ItemRef, InFlight)> = Vec::new();
        for index in plan.ready() {
            let operation = &plan.operations[index];
            let item = &operation.item;
            let spec = self.spec(&item.item_type);
            if !self.sessions.contains_key(&*item.item_type) {
                continue;
            }
            if !self
                .room
                .admit(item, operation.kind, self.room_limits(&spec))
            {
                waiting_for_room += 1;
                continue;
            }
            // A retry (after FAILED, a timeout or WAIT) of the same
            // operation keeps its op id; anything else is a new operation
            // and starts at attempt 1.
            let existing = self.state.current.get(item);
            let continued = existing
                .and_then(|c| c.retry_of.as_ref())
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
                        now,
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
                        .state
                        .intended
                        .get(item)
                        .map(|entry| entry.item.clone()),
                    OperationKind::Delete | OperationKind::Read => None,
                };
                let existing = self.state.current.get(item).map(|c| &**c);
                let mut value = started(existing, target, in_flight.clone());
                record_dispatch_marks(&self.state.current, &mut value);
                let continues = existing
                    .and_then(|c| c.retry_of.as_ref())
                    .is_some_and(|retry| retry.op_id == in_flight.op_id);
                if !continues {
                    // A new operation: its failures count from zero, and an
                    // earlier operation's failure (even one given up on)
                    // says nothing about it.
                    value.attempts = 0;
                    value.last_error = None;
                    value.gave_up = false;
                }
                (item.clone(), Some(value))
            })
            .collect();
        (starts, updates, waiting_for_room)
    }

    /// A new op id: never repeated, across restarts too (the owner's random
    /// boot number).
    fn next_op_id(&mut self) -> String {
        self.next_operation += 1;
        format!(
            "{}-{:x}-{}",
            self.state.record.id, self.boot, self.next_operation
        )
    }

    /// Sends journaled operations to their sessions.
    pub(super) fn send_dispatched(&mut self, starts: Vec<(ItemRef, InFlight)>, now: u64) {
        for (item, in_flight) in starts {
            let _span = info_span!(
                "operation",
                tenant = %self.state.record.name,
                item = %item,
                op_id = %in_flight.op_id,
                kind = in_flight.kind.as_str(),
                attempt = in_flight.attempt,
            )
            .entered();
            debug!("Operation dispatched.");
            let previous_error = self
                .state
                .current
                .get(&item)
                .and_then(|c| c.last_error.clone());
            self.settings.metrics.dispatched(in_flight.kind);
            self.log.started(
                item.clone(),
                in_flight.kind,
                in_flight.op_id.clone(),
                in_flight.attempt,
                now,
                previous_error,
            );
            self.operations
                .insert(in_flight.op_id.clone(), item.clone());
            let Some(holder) = self.sessions.get(&*item.item_type) else {
                continue;
            };
            // The journaled record carries the target the operation applies.
            let journaled = self
                .state
                .current
                .get(&item)
                .and_then(|c| c.in_flight.clone());
            let Some(in_flight) = journaled else { continue };
            if let Some(order) = order_for(&self.state.current, &item, &in_flight, holder.epoch) {
                debug!(tenant = %self.state.record.name, item = %item, op_id = %order.op_id, kind = order.kind.as_str(), "Operation dispatched.");
                let _ = holder.link.sender.send(ToAgent::Operation(order));
                self.start_deadline(&in_flight.op_id, in_flight.timeout_ms);
            }
        }
    }

    /// Items whose ready operation waited for room, as many per type as the
    /// type's session has room for now (re-planning the whole backlog on
    /// every result would cost O(backlog) per operation).
    /// Items queued for room that now have some, to plan again.
    pub(super) fn take_undispatched_with_room(&mut self) -> Vec<ItemRef> {
        let types = &self.types;
        let per_tenant = self.state.record.limits.max_operations_in_flight;
        self.room.take_queued(|item_type| {
            let per_type = types
                .spec(item_type)
                .map_or(crate::engine::exec::DEFAULT_MAX_IN_FLIGHT, |spec| {
                    spec.max_in_flight
                });
            Limits {
                per_type: per_type.max(1) as usize,
                per_tenant,
            }
        })
    }

    /// The limits that make room for an operation of `spec`'s type.
    fn room_limits(&self, spec: &TypeSpec) -> Limits {
        Limits {
            per_type: spec.max_in_flight.max(1) as usize,
            per_tenant: self.state.record.limits.max_operations_in_flight,
        }
    }

    /// The earliest time (monotonic) the owner must wake up: an operation
    /// or cancel deadline, a retry time, or the next resync.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let deadlines = self.operations.iter().filter_map(|(op_id, item)| {
            let current = self.state.current.get(item)?;
            let operation = current.in_flight.as_ref()?;
            if current.state == ItemState::Unknown || operation.op_id != *op_id {
                return None;
            }
            let deadline = self.deadlines.get(op_id)?;
            if operation.cancel_requested {
                deadline.cancel_at
            } else {
                Some(deadline.timeout_at)
            }
        });
        // Retry times are wall-clock times (stored and shown): wake up when
        // the wall clock says so.
        let now = self.now();
        let monotonic = self.monotonic();
        let retry = self
            .next_retry_ms
            .map(|at| monotonic + Duration::from_millis(at.saturating_sub(now)));
        let next = deadlines.chain(retry).chain(Some(self.next_resync)).min();
        match (next, self.timer_retry) {
            (Some(next), Some(retry)) => Some(next.max(retry)),
            (next, _) => next,
        }
    }

    /// Picks the time of the next periodic full pass: the resync interval
    /// with ±10% jitter, so tenants loaded together do not resync together.
    pub(super) fn schedule_resync(&mut self) {
        let interval = u64::try_from(self.settings.resync_interval.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let jitter = interval / 10;
        let wait = random_in(
            &mut self.rng,
            interval.saturating_sub(jitter),
            interval.saturating_add(jitter),
        );
        self.next_resync = self.monotonic() + Duration::from_millis(wait);
    }

    /// Times out operations past their deadline, then runs a full pass
    /// (which also picks up items whose retry time came).
    pub(super) async fn on_timer(&mut self) -> Result<(), TenantError> {
        let now = self.now();
        let monotonic = self.monotonic();
        self.expire_cancels(monotonic).await?;
        let expired: Vec<(ItemRef, Arc<CurrentItem>)> = self
            .operations
            .iter()
            .filter_map(|(op_id, item)| {
                let current = self.state.current.get(item)?;
                let operation = current.in_flight.as_ref()?;
                let due = operation.op_id == *op_id
                    && self
                        .deadlines
                        .get(op_id)
                        .is_some_and(|deadline| deadline.timeout_at <= monotonic);
                (due && current.state != ItemState::Unknown && !operation.cancel_requested)
                    .then(|| (item.clone(), current.clone()))
            })
            .collect();
        for (item, current) in expired {
            let Some(operation) = current.in_flight.clone() else {
                continue;
            };
            if let Some(holder) = self.sessions.get(&*item.item_type) {
                let _ = holder.link.sender.send(ToAgent::Cancel {
                    op_id: operation.op_id.clone(),
                });
            }
            let error = OperationError {
                code: code::DEADLINE_EXCEEDED,
                message: format!(
                    "the operation did not finish within {} ms",
                    operation.timeout_ms
                ),
            };
            let completion = if operation.kind == OperationKind::Read {
                // A READ is observation: one that times out changes
                // nothing (the next resync reads again), like a failed one.
                Completion::Read {
                    observed: current.observed.as_deref().cloned().unwrap_or_default(),
                }
            } else {
                let spec = self.spec(&item.item_type);
                let failures = current.attempts.saturating_add(1);
                let rng = &mut self.rng;
                let retry_at_ms =
                    spec.retry_at(now, failures, false, |low, high| random_in(rng, low, high));
                Completion::Failed { error, retry_at_ms }
            };
            self.finish(&item, &current, completion, now).await?;
        }
        if self.next_retry_ms.is_some_and(|at| at <= now) {
            self.next_retry_ms = None;
            // The items whose backoff is over are planned again, whatever
            // the last passes looked at.
            let due: Vec<ItemRef> = self
                .state
                .waiting
                .items()
                .iter()
                .filter(|(item, waiting)| {
                    waiting.reason == crate::engine::plan::WaitReason::Backoff
                        && self
                            .state
                            .current
                            .get(item)
                            .and_then(|current| current.next_attempt_at_ms)
                            .is_none_or(|at| at <= now)
                })
                .map(|(item, _)| item.clone())
                .collect();
            self.state.unconverged.extend(due);
        }
        if self.next_resync <= monotonic {
            debug!(tenant = %self.state.record.name, "Periodic resync.");
            self.schedule_resync();
            self.schedule_reads();
        }
        self.pass(Scope::Full).await.map(|_| ())
    }

    /// Queues a READ of every created item whose type supports it, so drift
    /// (a change made behind the service's back) is seen and corrected.
    pub(super) fn schedule_reads(&mut self) {
        let readable: HashSet<&String> = self
            .types
            .specs()
            .filter(|spec| spec.supports_read)
            .map(|spec| &spec.item_type)
            .collect();
        if readable.is_empty() {
            return;
        }
        for (key, current) in self.state.current.iter() {
            let ours = self
                .state
                .intended
                .get(key)
                .is_some_and(|e| !e.item.external);
            if ours
                && readable.contains(&key.item_type.to_string())
                && current.state == ItemState::Created
                && !current.is_busy()
            {
                self.pending_reads.insert(key.clone());
            }
        }
    }

    /// Picks queued READs whose type's session has room and prepares their
    /// journal records (a READ changes no state until it reports).
    ///
    /// Items the pass works on (`plan.unconverged`) or dispatches now
    /// (`dispatched`) are not read: one operation per item at a time, and
    /// the operation's own result reports what it observed.
    pub(super) fn prepare_reads(
        &mut self,
        now: u64,
        plan: &Plan,
        dispatched: &[(ItemRef, InFlight)],
    ) -> (Vec<(ItemRef, InFlight)>, CurrentUpdates) {
        let dispatched: HashSet<&ItemRef> = dispatched.iter().map(|(item, _)| item).collect();
        self.pending_reads
            .retain(|item| !dispatched.contains(item) && !plan.unconverged.contains(item));
        let mut starts = Vec::new();
        let mut updates: CurrentUpdates = Vec::new();
        let queued: Vec<ItemRef> = self.pending_reads.iter().cloned().collect();
        for item in queued {
            let spec = self.spec(&item.item_type);
            let limits = self.room_limits(&spec);
            if !self.sessions.contains_key(&*item.item_type)
                || !self.room.has_room(&item.item_type, limits)
            {
                continue;
            }
            self.pending_reads.remove(&item);
            let Some(current) = self.state.current.get(&item).cloned() else {
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
                now,
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

    /// Cancels that got no answer within the cancel timeout: the item's
    /// outcome is unknown; it gets no new operation until the old one
    /// reports or its session ends.
    async fn expire_cancels(&mut self, now: Instant) -> Result<(), TenantError> {
        let mut updates: CurrentUpdates = Vec::new();
        for (op_id, item) in &self.operations {
            let Some(current) = self.state.current.get(item) else {
                continue;
            };
            let Some(operation) = &current.in_flight else {
                continue;
            };
            let expired = operation.op_id == *op_id
                && operation.cancel_requested
                && self
                    .deadlines
                    .get(op_id)
                    .and_then(|deadline| deadline.cancel_at)
                    .is_some_and(|at| at <= now);
            if expired && current.state != ItemState::Unknown {
                updates.push((
                    item.clone(),
                    completed(&self.state.current, current, lost_outcome(current)),
                ));
            }
        }
        if updates.is_empty() {
            return Ok(());
        }
        self.commit_current_updates(updates, None).await
    }
}

/// How an operation whose outcome was lost (its session ended, the server
/// restarted, its cancel went unanswered) ends: the item's outcome becomes
/// unknown, except for a drift READ, which is observation and changes
/// nothing (the next resync reads again).
fn lost_outcome(current: &CurrentItem) -> Completion {
    match &current.in_flight {
        Some(operation) if operation.kind == OperationKind::Read => Completion::Read {
            observed: current.observed.as_deref().cloned().unwrap_or_default(),
        },
        _ => Completion::Lost,
    }
}

/// The order that sends `operation` on `item` to an agent.
fn order_for(
    current: &crate::graph::CurrentGraph,
    item: &ItemRef,
    operation: &InFlight,
    epoch: u64,
) -> Option<OperationOrder> {
    let entry = current.get(item)?;
    let applied = entry.applied.clone();
    let (subject, previous) = match operation.kind {
        OperationKind::Create => (operation.target.clone()?, None),
        OperationKind::Modify => (operation.target.clone()?, applied),
        OperationKind::Delete | OperationKind::Read => (applied?, None),
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
        previous_uncertain: entry.existence_uncertain,
        question: operation.question,
    })
}
