//! The executor of one tenant, sans IO: it plans, decides what runs on
//! which agent session, takes results, times operations out and resolves
//! lost ones, and says what that means as [`Effects`]. It has no store, no
//! network, no clock and no metrics: every input carries the time
//! ([`Now`]), and the tenant's owner (`tenant/owner.rs`) carries out the
//! effects and reports back whether their commit became durable.
//!
//! Each input is one **transaction**. The executor stages its changes in
//! memory (planning sees them; [`TenantModel`]) and returns them as one
//! [`Commit`]; the owner makes it durable, then calls
//! [`Executor::committed`] and sends what the effects say, or calls
//! [`Executor::commit_failed`], which undoes the changes. Nothing is sent
//! before its transition is durable (DESIGN 4 and 6), except what does not
//! depend on it (acknowledgements of results that change nothing,
//! re-deliveries of operations already journaled).
//!
//! The rooms it uses: [`TypeRegistry`] (specs, rules, epochs), [`Room`]
//! (room under the in-flight limits), [`Deadlines`] (timeouts on the
//! monotonic clock), [`lost`](super::lost) (what becomes of a lost
//! operation), and the planner.

mod agents;
mod pass;
mod timer;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustc_hash::FxHashSet;

use super::deadlines::Deadlines;
use super::effects::{
    Commit, Effects, Finished, ItemChange, MAX_CHANGED_REFS, Message, Started, TenantEvent,
};
use super::model::{ItemWrite, TenantModel, TenantProgress};
use super::port::{Outstanding, ToAgent};
use super::registry::{RegisteredType, StoredSpec, TypeRegistry};
use super::room::Room;
use super::spec::TypeSpec;
use crate::engine::conditions::Condition;
use crate::engine::intent::{IntentChange, IntentError, ValidatedSubmit, prepare_submit};
use crate::engine::plan::{Plan, plan_operations};
use crate::engine::transition::{Completion, completed, with_marks_forgotten};
use crate::graph::{CurrentGraph, CurrentItem, IntendedGraph, ItemRef, OperationKind};

pub use agents::{AgentResult, TypeHeld};

/// The time of an input: the wall clock for what is stored or shown
/// (unix ms), the monotonic clock for deadlines (ms since any fixed
/// origin; it never jumps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// Unix milliseconds.
    pub wall_ms: u64,
    /// Milliseconds of the monotonic clock.
    pub mono_ms: u64,
}

/// Settings of an executor.
#[derive(Clone, Debug)]
pub struct ExecutorSettings {
    /// The tenant's internal id (op ids start with it).
    pub tenant_id: u64,
    /// The tenant's item limit (0: `default_max_items`).
    pub max_items: u64,
    /// Used when `max_items` is 0.
    pub default_max_items: usize,
    /// The tenant's limit on operations in flight (0: none).
    pub max_operations_in_flight: u64,
    /// How long items may wait for a configurator before the tenant stalls.
    pub configurator_grace_ms: u64,
    /// Period of full passes, with ±10% jitter.
    pub resync_interval_ms: u64,
    /// How long a cancelled operation may take to report before its
    /// outcome is unknown.
    pub cancel_timeout_ms: u64,
    /// Seed of the executor's random numbers (boot number, jitter).
    pub seed: u64,
}

/// How long a failed transaction waits before a full pass tries again.
const RETRY_AFTER_FAILED_COMMIT_MS: u64 = 1_000;

/// The live session holding an item type.
#[derive(Clone, Debug)]
struct Holder {
    session_id: u64,
    agent_id: String,
    epoch: u64,
    /// What the agent said it still ran from earlier sessions when it
    /// registered (shared by the types it registered together).
    outstanding: Arc<Outstanding>,
}

/// What a pass looks at.
pub(crate) enum Scope {
    /// Every unconverged item.
    Full,
    /// These items (and what the planner reaches from them).
    Items(BTreeSet<ItemRef>),
}

/// The transaction of the input being handled: what its commit holds
/// beyond the staged items, what to do once it is durable, and how to undo
/// what it changed besides the model if it is not.
#[derive(Debug, Default)]
struct Transaction {
    events: Vec<TenantEvent>,
    intent: Option<IntentChange>,
    /// Items the intent change brought into the intent (a watcher sees an
    /// intended item without a current entry as PENDING); those it took
    /// out are the change's removals.
    intent_entered: Vec<ItemRef>,
    specs: Vec<StoredSpec>,
    immediate: Vec<Message>,
    sends: Vec<Message>,
    started: Vec<Started>,
    finished: Vec<Finished>,
    /// Operations whose clock starts when they are sent.
    clocked: Vec<(String, u64)>,
    /// Operations whose cancel is sent.
    cancelled: Vec<String>,
    /// Lost operations sent again because the READ that was to resolve
    /// their item could not tell, not yet queued for sending.
    relost: Vec<(ItemRef, String)>,
    /// Everything its passes looked at (unconverged again if it fails).
    seeds: BTreeSet<ItemRef>,
    /// A timer pass (it clears the retry after a failed commit).
    timer: bool,
    undo_types: Vec<(String, Option<RegisteredType>)>,
    undo_sessions: Vec<(String, Option<Holder>)>,
    undo_operations: Vec<(String, Option<ItemRef>)>,
    /// The put-off re-deliveries as they were when the transaction began
    /// (a failed commit puts them back: what it sent did not go); `None`
    /// for one opened without [`Executor::begin`], which restores nothing.
    undo_deferred: Option<BTreeSet<ItemRef>>,
    /// Drift READs taken from the queue (a failed commit queues them
    /// again).
    undo_reads: Vec<ItemRef>,
}

/// What a SubmitIntent did.
#[derive(Clone, Debug)]
pub struct Submitted {
    /// The generation afterwards (for a dry run: as it was).
    pub generation: u64,
    /// Whether anything changes.
    pub changed: bool,
    /// The plan after the submit (for a dry run: the plan it would give).
    pub plan: Plan,
}

/// The executor of one tenant.
#[derive(Debug)]
pub struct Executor {
    model: TenantModel,
    settings: ExecutorSettings,
    /// Registered item types: specs, rules and epochs.
    types: TypeRegistry,
    /// The live session of each item type. Ordered maps wherever the
    /// executor iterates, so that one seed gives one run.
    sessions: BTreeMap<String, Holder>,
    /// In-flight (or lost) operations by op id.
    operations: BTreeMap<String, ItemRef>,
    deadlines: Deadlines,
    /// For each item: the waiting items that named it in `blocked_by`.
    waiters: HashMap<ItemRef, BTreeSet<ItemRef>>,
    /// For each item with a planned operation: the items a plan put after
    /// it, with the kind of that operation (a recreate plans a Delete and a
    /// Create of one item). Should a later pass no longer plan that
    /// operation (its item now waits, or needs nothing), they are planned
    /// again: no result of it would wake them.
    behind: HashMap<ItemRef, BTreeSet<(OperationKind, ItemRef)>>,
    room: Room,
    rng: StdRng,
    /// Random per executor start: op ids never repeat across restarts.
    boot: u32,
    next_operation: u64,
    /// The earliest backoff deadline among waiting items (unix ms: retry
    /// times are stored and shown).
    next_retry_ms: Option<u64>,
    /// When the next periodic full pass is due (monotonic).
    next_resync: u64,
    /// After a failed commit: when the next full pass runs (monotonic).
    timer_retry: Option<u64>,
    /// Items of READ-capable types to read back (periodic resync).
    pending_reads: BTreeSet<ItemRef>,
    /// Items a pass changed without an operation, or left behind an
    /// operation it no longer plans: the next turn plans them again, so
    /// what they now need is planned and shown.
    follow_up: BTreeSet<ItemRef>,
    /// UNKNOWN items whose lost operation waits to be sent again until an
    /// UNKNOWN item it depends on is resolved (DESIGN 4).
    deferred_redeliveries: BTreeSet<ItemRef>,
    /// Since when some item waits for a configurator.
    no_configurator: Option<ConfiguratorWait>,
    txn: Option<Transaction>,
    /// Items the planner examined over every pass so far.
    items_examined: u64,
    /// What is true whatever becomes of the commit that first carries it,
    /// kept until a commit stores it: see [`Owed`].
    owed: Owed,
}

/// Why the agents holding a tenant's types when its server stopped are
/// disconnected.
pub const RESTART_REASON: &str = "the server restarted: no session outlives it";

/// Changes that happened whether or not a commit stores them: what loading
/// did to operations journaled before a restart (each running one lost:
/// UNKNOWN), and sessions that ended (with the process, or on their own).
/// Every commit carries them until one is durable, so that watchers learn
/// them as `GetStatus` shows them (DESIGN 7) and a failed commit does not
/// drop them.
#[derive(Debug, Default)]
struct Owed {
    /// Current items, staged again after a failed commit.
    items: Vec<(ItemRef, Option<CurrentItem>)>,
    /// Events, ahead of the commit's own.
    events: Vec<TenantEvent>,
    /// Type specs whose holder changed (one per type), unless the commit
    /// stores the type again.
    specs: Vec<StoredSpec>,
}

impl Owed {
    /// Owes `stored`, in place of what was owed for its type.
    fn store_spec(&mut self, stored: StoredSpec) {
        self.specs
            .retain(|owed| owed.spec.item_type != stored.spec.item_type);
        self.specs.push(stored);
    }
}

/// How long items have waited for a configurator (DESIGN 5,
/// `configurator_grace`), on the monotonic clock.
#[derive(Clone, Copy, Debug)]
struct ConfiguratorWait {
    /// When this process saw the wait begin (monotonic ms).
    since_mono: u64,
    /// How long it had lasted before this process started.
    before_ms: u64,
}

impl ConfiguratorWait {
    /// How long it has lasted at monotonic `now_ms`.
    fn waited_ms(&self, now_ms: u64) -> u64 {
        now_ms
            .saturating_sub(self.since_mono)
            .saturating_add(self.before_ms)
    }

    /// When (monotonic ms) it has lasted `grace_ms`.
    fn grace_ends(&self, grace_ms: u64) -> u64 {
        self.since_mono
            .saturating_add(grace_ms.saturating_sub(self.before_ms))
    }
}

/// Whether `progress` holds the tenant Stalled for want of a configurator.
fn stalled_for_a_configurator(progress: &TenantProgress) -> bool {
    progress.conditions.iter().any(|condition| {
        condition.kind == crate::engine::conditions::ConditionKind::Stalled
            && condition.status
            && condition.reason == crate::engine::conditions::NO_CONFIGURATOR
    })
}

impl Executor {
    /// The executor of a tenant loaded from its store: `intended` and
    /// `current` as stored, `progress` from its record, `specs` its stored
    /// type specs. Operations journaled before the restart become lost
    /// (UNKNOWN), to be resolved when their type's agent registers again;
    /// the agents whose sessions held types are disconnected; retry times
    /// wait at most the policy's longest wait from now. The first commit
    /// stores all of it and tells watchers.
    pub fn load(
        intended: IntendedGraph,
        current: CurrentGraph,
        progress: TenantProgress,
        specs: Vec<StoredSpec>,
        settings: ExecutorSettings,
        now: Now,
    ) -> Self {
        let carried_wait = stalled_for_a_configurator(&progress).then_some(ConfiguratorWait {
            since_mono: now.mono_ms,
            before_ms: settings.configurator_grace_ms,
        });
        let mut types = TypeRegistry::default();
        let mut owed = Owed::default();
        let mut held: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for stored in specs {
            if let Some(agent_id) = &stored.held_by {
                // Its session ended with the process.
                held.entry(agent_id.clone())
                    .or_default()
                    .push(stored.spec.item_type.clone());
                owed.store_spec(StoredSpec {
                    held_by: None,
                    ..stored.clone()
                });
            }
            types.insert(stored.spec, stored.epoch);
        }
        for (agent_id, mut item_types) in held {
            item_types.sort();
            owed.events.push(TenantEvent::AgentDisconnected {
                agent_id,
                item_types,
                reason: RESTART_REASON.to_owned(),
            });
        }
        let clamped = clamped_retry_times(&current, &types, now.wall_ms);
        let mut rng = StdRng::seed_from_u64(settings.seed);
        let boot = rng.random();
        let mut executor = Self {
            model: TenantModel::new(intended, current, progress),
            settings,
            types,
            sessions: BTreeMap::new(),
            operations: BTreeMap::new(),
            deadlines: Deadlines::default(),
            waiters: HashMap::new(),
            behind: HashMap::new(),
            room: Room::default(),
            rng,
            boot,
            next_operation: 0,
            next_retry_ms: None,
            next_resync: now.mono_ms,
            timer_retry: None,
            pending_reads: BTreeSet::new(),
            follow_up: BTreeSet::new(),
            deferred_redeliveries: BTreeSet::new(),
            // A tenant stored Stalled for want of a configurator stays so:
            // the restart does not give the grace again (the next pass
            // ends the wait if nothing waits any more).
            no_configurator: carried_wait,
            txn: None,
            items_examined: 0,
            owed,
        };
        // Staged, so that a commit stores what the snapshots show.
        for (key, value) in clamped {
            executor.model.stage_current(&key, Some(value.clone()));
            executor.owed.items.push((key, Some(value)));
        }
        let journaled: Vec<ItemRef> = executor
            .model
            .current
            .iter()
            .filter(|(_, entry)| entry.in_flight.is_some())
            .map(|(key, _)| key.clone())
            .collect();
        for key in journaled {
            let Some(entry) = executor
                .model
                .current
                .get(&key)
                .map(|entry| (**entry).clone())
            else {
                continue;
            };
            let lost = if entry.operation_runs() {
                // Staged one by one: each sees those before it lost, and
                // the marks forgotten on any of them that went.
                let lost = completed(&executor.model.current, &entry, lost_outcome(&entry));
                let updates = with_marks_forgotten(&executor.model.current, &key, lost.clone());
                for (changed, value) in updates {
                    executor.model.stage_current(&changed, value.clone());
                    executor.owed.items.push((changed, value));
                }
                lost
            } else {
                Some(entry)
            };
            if let Some(operation) = lost.as_ref().and_then(|lost| lost.in_flight.as_ref()) {
                executor
                    .operations
                    .insert(operation.op_id.clone(), key.clone());
            }
        }
        executor.schedule_resync(now);
        executor
    }

    /// Stages the items [`Owed`] until a commit stores them.
    fn stage_owed(&mut self) {
        for (key, value) in &self.owed.items {
            self.model.stage_current(key, value.clone());
        }
    }

    /// The tenant's state.
    pub fn model(&self) -> &TenantModel {
        &self.model
    }

    /// How many items the planner examined over every pass so far: the
    /// engine's planning cost, which a completed operation should grow by
    /// its neighbours, not by the graph.
    pub fn items_examined(&self) -> u64 {
        self.items_examined
    }

    /// Operations running now.
    pub fn running_operations(&self) -> usize {
        self.room.running()
    }

    /// The registered item types (an O(1) copy, for snapshots).
    pub fn item_types(&self) -> TypeRegistry {
        self.types.clone()
    }

    /// Whether session `session_id` holds an item type.
    pub fn holds_a_type(&self, session_id: u64) -> bool {
        self.sessions
            .values()
            .any(|holder| holder.session_id == session_id)
    }

    /// The item types a live session holds, sorted.
    pub fn connected_item_types(&self) -> Vec<String> {
        self.sessions.keys().cloned().collect()
    }

    /// The tenant's item limit.
    fn max_items(&self) -> usize {
        match self.settings.max_items {
            0 => self.settings.default_max_items,
            limit => usize::try_from(limit).unwrap_or(usize::MAX),
        }
    }

    /// Handles a SubmitIntent (validated by the caller): stages the intent
    /// change and plans. A dry run plans on the changed intent and undoes
    /// it, with no effects.
    pub fn submit(
        &mut self,
        request: ValidatedSubmit,
        now: Now,
    ) -> Result<(Effects, Submitted), IntentError> {
        let dry_run = request.dry_run;
        crate::engine::schema::check_items(
            &self.types,
            request.items.iter().map(|(item, _)| item),
        )?;
        let generation = self.model.progress().generation;
        let change = prepare_submit(&self.model.intended, generation, self.max_items(), request)?;
        if dry_run {
            let mut seeds = self.model.unconverged.to_ordered();
            seeds.extend(change.content_changed.iter().cloned());
            self.model.stage_intent(&change);
            let plan = plan_operations(
                &self.model.intended,
                &self.model.current,
                &seeds,
                &self.environment(now.wall_ms),
            );
            self.model.rollback_staged();
            // What loading or an ended session owes is true whatever
            // becomes of any commit: staged again, as after a failed one.
            self.stage_owed();
            let submitted = Submitted {
                generation,
                changed: !change.is_empty(),
                plan,
            };
            return Ok((Effects::default(), submitted));
        }
        self.begin();
        if change.is_empty() {
            let plan = self.pass(Scope::Full, now);
            let submitted = Submitted {
                generation,
                changed: false,
                plan,
            };
            return Ok((self.end(), submitted));
        }
        let seeds = change.content_changed.clone();
        let entered: Vec<ItemRef> = change
            .upserts
            .iter()
            .map(|entry| entry.item.item_ref())
            .filter(|item| self.model.intended.get(item).is_none())
            .collect();
        self.model.stage_intent(&change);
        let count = change.upserts.len() + change.removals.len();
        let items = change
            .upserts
            .iter()
            .map(|entry| entry.item.item_ref())
            .chain(change.removals.iter().cloned())
            .take(MAX_CHANGED_REFS)
            .collect();
        self.event(TenantEvent::IntentChanged {
            generation: change.generation,
            count,
            items,
        });
        let txn = self.transaction();
        txn.intent_entered = entered;
        txn.intent = Some(change);
        let plan = self.pass(Scope::Items(seeds), now);
        let submitted = Submitted {
            generation: self.model.progress().generation,
            changed: true,
            plan,
        };
        Ok((self.end(), submitted))
    }

    /// Runs a full pass now (the `Reconcile` RPC). With `refresh`, first
    /// queues a READ of every created item whose type supports it, as the
    /// periodic resync does.
    pub fn reconcile(&mut self, refresh: bool, now: Now) -> (Effects, Plan) {
        self.begin();
        if refresh {
            self.schedule_reads();
        }
        let plan = self.pass(Scope::Full, now);
        (self.end(), plan)
    }

    /// Opens the transaction of an input.
    fn begin(&mut self) {
        debug_assert!(self.txn.is_none(), "a transaction is still open");
        self.txn = Some(Transaction {
            undo_deferred: Some(self.deferred_redeliveries.clone()),
            ..Transaction::default()
        });
    }

    /// The open transaction. Inputs open one before they stage anything.
    fn transaction(&mut self) -> &mut Transaction {
        self.txn.get_or_insert_with(Transaction::default)
    }

    fn event(&mut self, event: TenantEvent) {
        self.transaction().events.push(event);
    }

    /// Closes the input's transaction into its effects; the transaction
    /// stays open until [`Self::committed`] or [`Self::commit_failed`].
    fn end(&mut self) -> Effects {
        let writes = self.model.staged_writes();
        let conditions_changed = self.model.progress_before().is_some_and(|before| {
            let after = self.model.progress();
            significant_change(&before.conditions, &after.conditions)
                || before.observed_generation != after.observed_generation
        });
        let epochs: Vec<u64> = writes
            .iter()
            .map(|write| {
                self.sessions
                    .get(&**write.item.item_type())
                    .map_or(0, |holder| holder.epoch)
            })
            .collect();
        let changes = self.item_changes(&writes, epochs);
        let progress = self.model.progress().clone();
        let mut events = self.owed.events.clone();
        let mut specs: Vec<StoredSpec> = self.owed.specs.clone();
        let txn = self.transaction();
        // A type the input stores again is stored once, as the input has it.
        specs.retain(|owed| {
            !txn.specs
                .iter()
                .any(|stored| stored.spec.item_type == owed.spec.item_type)
        });
        specs.append(&mut txn.specs);
        events.append(&mut txn.events);
        events.extend(changes);
        if conditions_changed {
            events.push(TenantEvent::ConditionsChanged {
                conditions: progress.conditions,
                observed_generation: progress.observed_generation,
            });
        }
        Effects {
            immediate: std::mem::take(&mut txn.immediate),
            commit: Commit {
                items: writes,
                intent: txn.intent.take(),
                specs,
                events,
                conditions_changed,
            },
            sends: std::mem::take(&mut txn.sends),
            started: std::mem::take(&mut txn.started),
            finished: std::mem::take(&mut txn.finished),
        }
    }

    /// The item changes a watcher sees in the open transaction: each
    /// current entry written (with the epoch of its type's session), then
    /// each item that entered or left the intent without a current entry
    /// (it became PENDING, or stopped being).
    fn item_changes(&self, writes: &[ItemWrite], epochs: Vec<u64>) -> Vec<TenantEvent> {
        let (entered, left) = self.txn.as_ref().map_or((&[][..], &[][..]), |txn| {
            let left = txn
                .intent
                .as_ref()
                .map_or(&[][..], |change| &change.removals[..]);
            (&txn.intent_entered[..], left)
        });
        let entered_set: FxHashSet<&ItemRef> = entered.iter().collect();
        let left_set: FxHashSet<&ItemRef> = left.iter().collect();
        let change = |item: &ItemRef, write: Option<&ItemWrite>, epoch: u64| {
            let intended = self.model.intended.get(item).cloned();
            let was_intended = if entered_set.contains(item) {
                false
            } else {
                left_set.contains(item) || intended.is_some()
            };
            TenantEvent::ItemChanged(ItemChange {
                item: item.clone(),
                before: write.and_then(|write| write.before.clone()),
                after: write.and_then(|write| write.after.clone()),
                intended,
                was_intended,
                waiting: self.model.waiting.get(item).cloned(),
                epoch,
            })
        };
        let mut changes: Vec<TenantEvent> = writes
            .iter()
            .zip(epochs)
            .map(|(write, epoch)| change(&write.item, Some(write), epoch))
            .collect();
        if entered.is_empty() && left.is_empty() {
            return changes;
        }
        let written: FxHashSet<&ItemRef> = writes.iter().map(|write| &write.item).collect();
        changes.extend(
            entered
                .iter()
                .chain(left)
                .filter(|item| !written.contains(item) && self.model.current.get(item).is_none())
                .map(|item| change(item, None, 0)),
        );
        changes
    }

    /// The commit of the last input is durable: its changes stay, and the
    /// operations it sent start their clocks.
    pub fn committed(&mut self, now: Now) {
        let Some(txn) = self.txn.take() else {
            // No input staged anything: what loading staged waits for a
            // commit that stores it.
            return;
        };
        self.model.forget_staged();
        self.owed = Owed::default();
        for (op_id, timeout_ms) in txn.clocked {
            self.deadlines.start(&op_id, timeout_ms, now.mono_ms);
        }
        for op_id in txn.cancelled {
            self.deadlines
                .cancel_sent(&op_id, now.mono_ms, self.settings.cancel_timeout_ms);
        }
        if txn.timer {
            self.timer_retry = None;
        }
        self.recount_in_flight(now);
    }

    /// The commit of the last input failed: nothing of it happened. Its
    /// changes are undone; what its passes looked at is looked at again by
    /// a full pass a second from now (at once would spin while the store
    /// refuses writes).
    pub fn commit_failed(&mut self, now: Now) {
        self.model.rollback_staged();
        // What is owed is true whatever the commit: staged again.
        self.stage_owed();
        let Some(txn) = self.txn.take() else {
            return;
        };
        for (op_id, previous) in txn.undo_operations.into_iter().rev() {
            match previous {
                Some(item) => {
                    self.operations.insert(op_id, item);
                }
                None => {
                    self.operations.remove(&op_id);
                }
            }
        }
        for (item_type, previous) in txn.undo_sessions.into_iter().rev() {
            match previous {
                Some(holder) => {
                    self.sessions.insert(item_type, holder);
                }
                None => {
                    self.sessions.remove(&item_type);
                }
            }
        }
        for (item_type, previous) in txn.undo_types.into_iter().rev() {
            self.types.restore(&item_type, previous);
        }
        if let Some(deferred) = txn.undo_deferred {
            self.deferred_redeliveries = deferred;
        }
        self.pending_reads.extend(txn.undo_reads);
        self.model.unconverged.extend(txn.seeds);
        self.follow_up.clear();
        self.timer_retry = Some(now.mono_ms.saturating_add(RETRY_AFTER_FAILED_COMMIT_MS));
        self.count_in_flight();
    }

    /// Records that operation `op_id` runs on `item` (staged).
    fn track_operation(&mut self, op_id: &str, item: &ItemRef) {
        if self.operations.get(op_id) == Some(item) {
            return;
        }
        let previous = self.operations.insert(op_id.to_owned(), item.clone());
        self.transaction()
            .undo_operations
            .push((op_id.to_owned(), previous));
    }

    /// Stages `item`'s new value (`None`: it leaves current state); an
    /// operation it has in flight is tracked by its op id (a lost
    /// operation that comes back when the READ resolving it is lost, say).
    ///
    /// An item that leaves current state, whatever took it out (a result,
    /// a timeout, a lost session, a lost operation given up, a report), is
    /// another item if it comes back: its dependents forget the counters
    /// they recorded for it, here (DESIGN 3, rule 4). A batch whose
    /// dependents' new values were computed before its removals are staged
    /// forgets them over the whole batch first
    /// ([`crate::engine::transition::forget_marks_on_removed`]), so that
    /// those values, staged after,
    /// keep the forgetting.
    fn stage(&mut self, item: &ItemRef, value: Option<CurrentItem>) {
        for (changed, value) in with_marks_forgotten(&self.model.current, item, value) {
            self.stage_value(&changed, value);
        }
    }

    /// [`Self::stage`] without the forgetting of marks.
    fn stage_value(&mut self, item: &ItemRef, value: Option<CurrentItem>) {
        let op_id = value
            .as_ref()
            .and_then(|value| value.in_flight.as_ref())
            .map(|operation| operation.op_id.clone());
        self.model.stage_current(item, value);
        if let Some(op_id) = op_id {
            self.track_operation(&op_id, item);
        }
    }

    /// Stages every update in order (see [`Self::stage`]).
    fn stage_all(&mut self, updates: crate::engine::transition::CurrentUpdates) {
        for (item, value) in updates {
            self.stage(&item, value);
        }
    }

    /// Queues the lost operations [`Self::unresolved`] put back for
    /// sending with the commit.
    fn send_relost(&mut self) {
        let relost = std::mem::take(&mut self.transaction().relost);
        for (item, op_id) in relost {
            self.track_operation(&op_id, &item);
            self.send_journaled(&item);
        }
    }

    /// Recomputes each session's operations in flight from the items'
    /// journaled operations, forgets index entries of operations that are
    /// no longer any item's, and keeps one deadline per running operation.
    /// Only on committed state.
    fn recount_in_flight(&mut self, now: Now) {
        let current = &self.model.current;
        self.operations.retain(|op_id, item| {
            current
                .get(item)
                .and_then(|c| c.in_flight.as_ref())
                .is_some_and(|operation| &operation.op_id == op_id)
        });
        self.count_in_flight();
        self.deadlines.track(
            &self.operations,
            &self.model.current,
            now.mono_ms,
            self.settings.cancel_timeout_ms,
        );
    }

    /// The spec of `item_type` (a default one if it never registered).
    fn spec(&self, item_type: &str) -> TypeSpec {
        self.types
            .spec(item_type)
            .cloned()
            .unwrap_or_else(|| TypeSpec::new(item_type))
    }

    /// A new op id: never repeated, across restarts too (the random boot
    /// number).
    fn next_op_id(&mut self) -> String {
        self.next_operation += 1;
        format!(
            "{}-{:x}-{}",
            self.settings.tenant_id, self.boot, self.next_operation
        )
    }

    /// A uniformly random number in `[low, high]`.
    fn random_in(&mut self, low: u64, high: u64) -> u64 {
        self.rng.random_range(low..=high)
    }

    /// When a failure of `item_type`'s operation, its `failures`-th, may
    /// be tried again (`None`: never).
    fn retry_at(
        &mut self,
        item_type: &str,
        now_ms: u64,
        failures: u32,
        terminal: bool,
    ) -> Option<u64> {
        let spec = self.spec(item_type);
        let rng = &mut self.rng;
        spec.retry_at(now_ms, failures, terminal, |low, high| {
            rng.random_range(low..=high)
        })
    }
}

/// A retry time stored before a restart waits at most the policy's longest
/// wait from now (clocks move; policies change): the items whose retry
/// time comes nearer, with it.
fn clamped_retry_times(
    current: &CurrentGraph,
    types: &TypeRegistry,
    now_ms: u64,
) -> Vec<(ItemRef, CurrentItem)> {
    current
        .iter()
        .filter_map(|(key, entry)| {
            let at = entry.rare.next_attempt_at_ms?;
            let max_delay = types.spec(key.item_type()).map_or_else(
                || TypeSpec::new("").retry.max_delay_ms(),
                |spec| spec.retry.max_delay_ms(),
            );
            let latest = now_ms.saturating_add(max_delay);
            (at > latest).then(|| {
                let mut clamped = (**entry).clone();
                clamped
                    .rare
                    .update(|rare| rare.next_attempt_at_ms = Some(latest));
                (key.clone(), clamped)
            })
        })
        .collect()
}

/// How an operation whose outcome was lost (its session ended, the server
/// restarted, its cancel went unanswered) ends: the item's outcome becomes
/// unknown, except for a drift READ, which is observation and changes
/// nothing (the next resync reads again).
fn lost_outcome(current: &CurrentItem) -> Completion {
    match &current.in_flight {
        Some(operation)
            if operation.kind == OperationKind::Read && operation.resolves.is_none() =>
        {
            Completion::Read {
                observed: current.observed.as_deref().cloned().unwrap_or_default(),
            }
        }
        _ => Completion::Lost,
    }
}

/// Whether two condition sets differ in anything but their messages.
fn significant_change(before: &[Condition], after: &[Condition]) -> bool {
    before.len() != after.len()
        || before.iter().zip(after).any(|(b, a)| {
            (
                b.kind,
                b.status,
                &b.reason,
                b.observed_generation,
                b.last_transition_ms,
            ) != (
                a.kind,
                a.status,
                &a.reason,
                a.observed_generation,
                a.last_transition_ms,
            )
        })
}

/// The message that sends `order` to its session.
fn to_session(session_id: u64, message: ToAgent) -> Message {
    Message {
        session_id,
        message,
    }
}
