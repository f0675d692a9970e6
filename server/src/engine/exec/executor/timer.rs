//! Time: operations and cancels past their deadlines, retries whose
//! backoff is over, the periodic resync, and when to wake up for them.

use std::collections::HashSet;

use tracing::debug;

use super::{Executor, Now, Scope, lost_outcome, to_session};
use crate::engine::exec::effects::{Effects, Finished, OperationOutcome};
use crate::engine::exec::lost::may_have_applied;
use crate::engine::exec::port::ToAgent;
use crate::engine::plan::WaitReason;
use crate::engine::transition::{Completion, completed};
use crate::graph::{ItemRef, ItemState, OperationError, OperationKind, code};

impl Executor {
    /// The earliest time (monotonic ms) the executor must be woken up
    /// with [`Self::on_timer`]: an operation or cancel deadline, a retry
    /// time, or the next resync.
    pub fn next_wakeup(&self, now: Now) -> Option<u64> {
        let deadline = self.deadlines.next(&self.operations, &self.model.current);
        // Retry times are wall-clock times (stored and shown): wake up when
        // the wall clock says so.
        let retry = self
            .next_retry_ms
            .map(|at| now.mono_ms.saturating_add(at.saturating_sub(now.wall_ms)));
        // After a failed commit, a full pass runs then: not earlier (a
        // deadline already due would spin while the store refuses
        // writes), and not later (what the failed commit held waits).
        if let Some(retry) = self.timer_retry {
            return Some(retry);
        }
        // A tenant waiting for a configurator stalls when the grace ends
        // (DESIGN 5): a pass then recomputes its conditions.
        let grace = self
            .no_configurator
            .map(|wait| wait.grace_ends(self.settings.configurator_grace_ms))
            .filter(|&at| at > now.mono_ms);
        deadline
            .into_iter()
            .chain(retry)
            .chain(grace)
            .chain(Some(self.next_resync))
            .min()
    }

    /// Times out operations past their deadline and cancels past theirs,
    /// plans the items whose backoff is over, starts a resync when it is
    /// due, and runs a full pass.
    pub fn on_timer(&mut self, now: Now) -> Effects {
        self.begin();
        self.transaction().timer = true;
        // Cancels that got no answer within the cancel timeout: the item's
        // outcome is unknown; it gets no new operation until the old one
        // reports or its session ends (then the next registration decides
        // it): no re-delivery put off earlier may send one meanwhile.
        for item in
            self.deadlines
                .cancels_expired(&self.operations, &self.model.current, now.mono_ms)
        {
            self.deferred_redeliveries.remove(&item);
            if let Some(entry) = self.model.current.get(&item).cloned() {
                let value = completed(&self.model.current, &entry, lost_outcome(&entry));
                self.stage(&item, value);
            }
        }
        for item in self
            .deadlines
            .timed_out(&self.operations, &self.model.current, now.mono_ms)
        {
            self.time_out(&item, now);
        }
        if self.next_retry_ms.is_some_and(|at| at <= now.wall_ms) {
            self.next_retry_ms = None;
            // The items whose backoff is over are planned again, whatever
            // the last passes looked at.
            let due: Vec<ItemRef> = self
                .model
                .waiting
                .items()
                .iter()
                .filter(|(item, waiting)| {
                    waiting.reason == WaitReason::Backoff
                        && self
                            .model
                            .current
                            .get(item)
                            .and_then(|current| current.rare.next_attempt_at_ms)
                            .is_none_or(|at| at <= now.wall_ms)
                })
                .map(|(item, _)| item.clone())
                .collect();
            self.model.unconverged.extend(due);
        }
        if self.next_resync <= now.mono_ms {
            debug!(tenant_id = self.settings.tenant_id, "Periodic resync.");
            self.schedule_resync(now);
            self.schedule_reads();
        }
        self.pass(Scope::Full, now);
        self.end()
    }

    /// Ends `item`'s operation that ran past its timeout: the agent is
    /// told to stop, and the attempt failed with DEADLINE_EXCEEDED (a READ
    /// changes nothing; the next resync reads again).
    fn time_out(&mut self, item: &ItemRef, now: Now) {
        let Some(entry) = self.model.current.get(item).cloned() else {
            return;
        };
        let Some(operation) = entry.in_flight.clone() else {
            return;
        };
        if operation.resolves.is_some() {
            // The READ that was to resolve an UNKNOWN item cannot tell:
            // its lost operation is sent again.
            let value = self.unresolved(item, &entry, now);
            self.stage(item, value);
            self.send_relost();
            return;
        }
        if let Some(holder) = self.sessions.get(&**item.item_type()) {
            let cancel = to_session(
                holder.session_id,
                ToAgent::Cancel {
                    op_id: operation.op_id.clone(),
                },
            );
            self.transaction().immediate.push(cancel);
        }
        let error = OperationError {
            code: code::DEADLINE_EXCEEDED,
            message: format!(
                "the operation did not finish within {} ms",
                operation.timeout_ms
            ),
        };
        let value = if operation.kind == OperationKind::Read {
            let completion = Completion::Read {
                observed: entry.observed.as_deref().cloned().unwrap_or_default(),
            };
            completed(&self.model.current, &entry, completion)
        } else {
            let failures = entry.attempts.saturating_add(1);
            let retry_at_ms = self.retry_at(item.item_type(), now.wall_ms, failures, false);
            let completion = Completion::Failed {
                error: error.clone(),
                retry_at_ms,
            };
            // A timeout proves nothing of what the agent did: the
            // operation may have applied before it was cancelled (its DONE
            // may even come after the cancel, for an attempt the server no
            // longer waits for). What it may have done stays possible, as
            // for a lost operation, until an attempt answers DONE: an item
            // it may have created is deleted if it leaves the intent.
            completed(
                &self.model.current,
                &may_have_applied(&entry, &operation),
                completion,
            )
        };
        self.stage(item, value);
        let finished = Finished {
            item: item.clone(),
            kind: operation.kind,
            op_id: operation.op_id,
            attempt: operation.attempt,
            outcome: OperationOutcome::Failed,
            duration_ms: now.wall_ms.saturating_sub(operation.started_at_ms),
            at_ms: now.wall_ms,
            error: Some(error),
        };
        self.transaction().finished.push(finished);
    }

    /// Plans the items a pass changed without an operation (dropped with a
    /// vanished external item, or settled after a failure), and those
    /// that waited for an operation a later pass no longer plans, so that
    /// what they now need is planned and shown. `None` when there are none.
    pub fn follow_up(&mut self, now: Now) -> Option<Effects> {
        if self.follow_up.is_empty() {
            return None;
        }
        let items = std::mem::take(&mut self.follow_up);
        self.begin();
        self.pass(Scope::Items(items), now);
        Some(self.end())
    }

    /// Picks the time of the next periodic full pass: the resync interval
    /// with ±10% jitter, so tenants loaded together do not resync together.
    pub(super) fn schedule_resync(&mut self, now: Now) {
        let interval = self.settings.resync_interval_ms.max(1);
        let jitter = interval / 10;
        let wait = self.random_in(
            interval.saturating_sub(jitter),
            interval.saturating_add(jitter),
        );
        self.next_resync = now.mono_ms.saturating_add(wait);
    }

    /// Queues a READ of every created item whose type supports it, so
    /// drift (a change made behind the service's back) is seen and
    /// corrected.
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
        for (key, current) in self.model.current.iter() {
            let ours = self
                .model
                .intended
                .get(key)
                .is_some_and(|entry| !entry.item.external);
            if ours
                && readable.contains(&key.item_type().to_string())
                && current.state == ItemState::Created
                && !current.is_busy()
            {
                self.pending_reads.insert(key.clone());
            }
        }
    }
}
