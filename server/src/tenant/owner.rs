//! The owner of one tenant: a task that alone changes the tenant's state.
//!
//! Every change goes through its command queue: it computes the change,
//! commits it durably to the store, then applies it in memory, re-plans and
//! publishes a new snapshot. Readers use snapshots and never wait for it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::engine::plan::{Plan, PlanEnvironment, TypeRules, WaitReason, plan_operations};
use crate::engine::transition::{CurrentUpdates, apply_updates, bookkeeping_updates};
use crate::graph::{CurrentItem, Item, ItemRef};
use crate::store::{Store, WriteBatch};

use super::conditions::{Progress, compute_conditions};
use super::error::TenantError;
use super::record::{StoredIntended, TenantRecord, encode};
use super::snapshot::{SnapshotHistory, TenantSnapshot};
use super::state::TenantState;
use super::submit::{ValidatedSubmit, apply_change, prepare_submit};

/// Settings every tenant owner shares.
#[derive(Clone, Debug)]
pub struct OwnerSettings {
    /// Default for tenants whose `max_items` is 0.
    pub default_max_items: usize,
    /// How long items may wait for a configurator before the tenant stalls.
    pub configurator_grace: Duration,
}

impl Default for OwnerSettings {
    fn default() -> Self {
        Self {
            default_max_items: 1_000_000,
            configurator_grace: Duration::from_secs(300),
        }
    }
}

/// Which item types have a live configurator, per tenant.
pub trait ConfiguratorDirectory: Send + Sync + 'static {
    /// Whether a live session handles `item_type` for tenant `tenant_id`.
    fn is_connected(&self, tenant_id: u64, item_type: &str) -> bool;
}

/// A directory with no configurator at all.
#[derive(Debug, Default)]
pub struct NoConfigurators;

impl ConfiguratorDirectory for NoConfigurators {
    fn is_connected(&self, _tenant_id: u64, _item_type: &str) -> bool {
        false
    }
}

/// A change of an external item's reported state.
#[derive(Clone, Debug)]
pub enum ExternalChange {
    /// The item exists with these properties; `modified` bumps its
    /// modification counter (dependents with `recreate_when_modified` are
    /// recreated).
    Put {
        /// The reported item (its `external` flag is forced on).
        item: Item,
        /// Whether its content changed in a way dependents must see.
        modified: bool,
    },
    /// The item no longer exists.
    Delete {
        /// Its identity.
        item: ItemRef,
    },
}

/// What a SubmitIntent did.
#[derive(Clone, Debug)]
pub struct SubmitOutcome {
    /// The tenant's generation afterwards.
    pub generation: u64,
    /// Whether anything was stored (false for an identical resubmission).
    pub changed: bool,
    /// The plan after the submit (for a dry run: the plan it would give).
    pub plan: Plan,
    /// The tenant's revision afterwards.
    pub revision: u64,
}

type Reply<T> = oneshot::Sender<Result<T, TenantError>>;

enum Command {
    SetTokenHash(String, Reply<()>),
    Submit(ValidatedSubmit, Reply<SubmitOutcome>),
    ReportExternal(Vec<ExternalChange>, Reply<u64>),
    Reconcile(Reply<Plan>),
}

/// A running tenant: its identity, its command queue and its snapshots.
#[derive(Clone, Debug)]
pub struct TenantHandle {
    /// Internal id.
    pub id: u64,
    /// Name.
    pub name: String,
    commands: mpsc::Sender<Command>,
    /// Published snapshots.
    pub snapshots: Arc<SnapshotHistory>,
    stop: CancellationToken,
}

impl TenantHandle {
    /// Starts the owner task of a loaded tenant.
    pub fn spawn(
        state: TenantState,
        store: Arc<dyn Store>,
        configurators: Arc<dyn ConfiguratorDirectory>,
        settings: OwnerSettings,
    ) -> Self {
        let (commands, receiver) = mpsc::channel(256);
        let snapshots = Arc::new(SnapshotHistory::new(TenantSnapshot::capture(&state, 0)));
        let stop = CancellationToken::new();
        let handle = Self {
            id: state.record.id,
            name: state.record.name.clone(),
            commands,
            snapshots: snapshots.clone(),
            stop: stop.clone(),
        };
        let owner = Owner {
            state,
            store,
            configurators,
            settings,
            snapshots,
            no_configurator_since_ms: None,
        };
        tokio::spawn(owner.run(receiver, stop));
        handle
    }

    /// Submits an intent (validated by the caller).
    pub async fn submit(&self, request: ValidatedSubmit) -> Result<SubmitOutcome, TenantError> {
        self.ask(|reply| Command::Submit(request, reply)).await
    }

    /// Records reports of external items; returns the new revision.
    pub async fn report_external(&self, changes: Vec<ExternalChange>) -> Result<u64, TenantError> {
        self.ask(|reply| Command::ReportExternal(changes, reply))
            .await
    }

    /// Runs a pass now and returns its plan.
    pub async fn reconcile(&self) -> Result<Plan, TenantError> {
        self.ask(Command::Reconcile).await
    }

    /// Stores a new token hash in the tenant record.
    pub async fn set_token_hash(&self, token_hash: String) -> Result<(), TenantError> {
        self.ask(|reply| Command::SetTokenHash(token_hash, reply))
            .await
    }

    /// Stops the owner; queued commands fail with [`TenantError::Gone`].
    pub fn stop(&self) {
        self.stop.cancel();
    }

    async fn ask<T>(&self, command: impl FnOnce(Reply<T>) -> Command) -> Result<T, TenantError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(command(reply))
            .await
            .map_err(|_| TenantError::Gone)?;
        answer.await.map_err(|_| TenantError::Gone)?
    }
}

/// Now, in unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

/// The planner's view of the world, as the owner sees it.
struct Environment<'a> {
    tenant_id: u64,
    type_rules: &'a HashMap<String, TypeRules>,
    configurators: &'a dyn ConfiguratorDirectory,
    now_ms: u64,
}

impl PlanEnvironment for Environment<'_> {
    fn type_rules(&self, item_type: &str) -> Option<&TypeRules> {
        self.type_rules.get(item_type)
    }
    fn has_configurator(&self, item_type: &str) -> bool {
        self.configurators.is_connected(self.tenant_id, item_type)
    }
    fn now_ms(&self) -> u64 {
        self.now_ms
    }
}

struct Owner {
    state: TenantState,
    store: Arc<dyn Store>,
    configurators: Arc<dyn ConfiguratorDirectory>,
    settings: OwnerSettings,
    snapshots: Arc<SnapshotHistory>,
    no_configurator_since_ms: Option<u64>,
}

impl Owner {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>, stop: CancellationToken) {
        if let Err(error) = self.pass(BTreeSet::new()).await {
            warn!(tenant = %self.state.record.name, %error, "First pass failed.");
        }
        loop {
            let command = tokio::select! {
                () = stop.cancelled() => break,
                command = commands.recv() => match command {
                    Some(command) => command,
                    None => break,
                },
            };
            match command {
                Command::Submit(request, reply) => {
                    let _ = reply.send(self.submit(request).await);
                }
                Command::ReportExternal(changes, reply) => {
                    let _ = reply.send(self.report_external(changes).await);
                }
                Command::SetTokenHash(token_hash, reply) => {
                    let _ = reply.send(self.set_token_hash(token_hash).await);
                }
                Command::Reconcile(reply) => {
                    let _ = reply.send(self.pass(BTreeSet::new()).await);
                }
            }
        }
        debug!(tenant = %self.state.record.name, "Tenant owner stopped.");
    }

    fn max_items(&self) -> usize {
        match self.state.record.limits.max_items {
            0 => self.settings.default_max_items,
            limit => usize::try_from(limit).unwrap_or(usize::MAX),
        }
    }

    async fn submit(&mut self, request: ValidatedSubmit) -> Result<SubmitOutcome, TenantError> {
        let dry_run = request.dry_run;
        let change = prepare_submit(
            &self.state.intended,
            self.state.record.generation,
            self.max_items(),
            request,
        )?;
        if dry_run {
            let mut intended = self.state.intended.clone();
            apply_change(&mut intended, &change);
            let mut seeds = self.state.unconverged.clone();
            seeds.extend(change.content_changed.iter().cloned());
            let now = now_ms();
            let plan = plan_operations(
                &intended,
                &self.state.current,
                &seeds,
                &self.environment(now),
            );
            return Ok(SubmitOutcome {
                generation: change.generation,
                changed: !change.is_empty(),
                plan,
                revision: self.state.record.revision,
            });
        }
        if change.is_empty() {
            let plan = self.pass(BTreeSet::new()).await?;
            return Ok(SubmitOutcome {
                generation: self.state.record.generation,
                changed: false,
                plan,
                revision: self.state.record.revision,
            });
        }

        let mut record = self.state.record.clone();
        record.generation = change.generation;
        record.revision += 1;
        let mut batch = WriteBatch::new();
        for entry in &change.upserts {
            let stored = StoredIntended {
                item: (*entry.item).clone(),
                generation: entry.generation,
            };
            batch.put(
                crate::store::keys::intended_item_key(
                    record.id,
                    &entry.item.item_type,
                    &entry.item.name,
                ),
                encode(&stored)?,
            );
        }
        for key in &change.removals {
            batch.delete(crate::store::keys::intended_item_key(
                record.id,
                &key.item_type,
                &key.name,
            ));
        }
        batch.put(
            crate::store::keys::tenant_record_key(record.id),
            encode(&record)?,
        );
        self.store.commit(batch).await?;

        let touched: Vec<ItemRef> = change
            .upserts
            .iter()
            .map(|entry| entry.item.item_ref())
            .chain(change.removals.iter().cloned())
            .collect();
        let before: Vec<_> = touched
            .iter()
            .map(|key| self.state.displayed(key))
            .collect();
        apply_change(&mut self.state.intended, &change);
        for (key, before) in touched.iter().zip(before) {
            self.state.recount_item(key, before);
        }
        self.state.record = record;
        debug!(
            tenant = %self.state.record.name,
            generation = self.state.record.generation,
            changed = change.content_changed.len(),
            "Intent stored."
        );
        let plan = self.pass(change.content_changed).await?;
        Ok(SubmitOutcome {
            generation: self.state.record.generation,
            changed: true,
            plan,
            revision: self.state.record.revision,
        })
    }

    async fn report_external(&mut self, changes: Vec<ExternalChange>) -> Result<u64, TenantError> {
        let mut updates: CurrentUpdates = Vec::new();
        let mut latest: BTreeMap<ItemRef, Option<CurrentItem>> = BTreeMap::new();
        for change in changes {
            match change {
                ExternalChange::Put { mut item, modified } => {
                    item.external = true;
                    item.dependencies.clear();
                    let key = item.item_ref();
                    let previous_counter = match latest.get(&key) {
                        Some(reported) => reported.as_ref().map_or(0, |r| r.modifications),
                        None => self.state.current.get(&key).map_or(0, |c| c.modifications),
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
        updates.extend(latest);
        if updates.is_empty() {
            return Ok(self.state.record.revision);
        }
        let touched: BTreeSet<ItemRef> = updates.iter().map(|(key, _)| key.clone()).collect();
        self.commit_current_updates(updates, None).await?;
        self.pass(touched).await?;
        Ok(self.state.record.revision)
    }

    async fn set_token_hash(&mut self, token_hash: String) -> Result<(), TenantError> {
        let mut record = self.state.record.clone();
        record.token_hash = token_hash;
        self.commit_current_updates(Vec::new(), Some(record))
            .await?;
        self.snapshots
            .publish(TenantSnapshot::capture(&self.state, 0));
        Ok(())
    }

    /// Commits new current values (and optionally a changed record) with a
    /// new revision, then applies them in memory.
    async fn commit_current_updates(
        &mut self,
        updates: CurrentUpdates,
        record: Option<TenantRecord>,
    ) -> Result<(), TenantError> {
        let mut record = record.unwrap_or_else(|| self.state.record.clone());
        record.revision = self.state.record.revision + 1;
        let mut batch = WriteBatch::new();
        for (key, value) in &updates {
            self.state
                .write_current_value(&mut batch, key, value.as_ref())?;
        }
        batch.put(
            crate::store::keys::tenant_record_key(record.id),
            encode(&record)?,
        );
        self.store.commit(batch).await?;
        let touched: Vec<ItemRef> = updates.iter().map(|(key, _)| key.clone()).collect();
        let before: Vec<_> = touched
            .iter()
            .map(|key| self.state.displayed(key))
            .collect();
        apply_updates(&mut self.state.current, updates);
        for (key, before) in touched.iter().zip(before) {
            self.state.recount_item(key, before);
        }
        self.state.record = record;
        Ok(())
    }

    fn environment(&self, now_ms: u64) -> Environment<'_> {
        Environment {
            tenant_id: self.state.record.id,
            type_rules: &self.state.type_rules,
            configurators: &*self.configurators,
            now_ms,
        }
    }

    /// Plans from the unconverged items plus `changed`, applies the plan's
    /// bookkeeping, recomputes conditions, commits what changed and
    /// publishes a snapshot.
    async fn pass(&mut self, changed: BTreeSet<ItemRef>) -> Result<Plan, TenantError> {
        let now = now_ms();
        let mut seeds = std::mem::take(&mut self.state.unconverged);
        seeds.extend(changed);
        let plan = plan_operations(
            &self.state.intended,
            &self.state.current,
            &seeds,
            &self.environment(now),
        );

        let updates = bookkeeping_updates(&self.state.current, &plan);
        let waiting: BTreeMap<ItemRef, _> = plan
            .waiting
            .iter()
            .map(|w| (w.item.clone(), w.clone()))
            .collect();
        let waits_for_configurator = waiting
            .values()
            .any(|w| w.reason == WaitReason::NoConfigurator);
        self.no_configurator_since_ms =
            match (waits_for_configurator, self.no_configurator_since_ms) {
                (false, _) => None,
                (true, Some(since)) => Some(since),
                (true, None) => Some(now),
            };
        let progress = Progress {
            generation: self.state.record.generation,
            in_flight: 0,
            ready_operations: plan.ready().count(),
            waiting: &waiting,
            no_configurator_since_ms: self.no_configurator_since_ms,
            configurator_grace_ms: u64::try_from(self.settings.configurator_grace.as_millis())
                .unwrap_or(u64::MAX),
            now_ms: now,
        };
        let (conditions, observed) = compute_conditions(
            &self.state.record.conditions,
            self.state.record.observed_generation,
            &progress,
        );
        let record_changed = conditions != self.state.record.conditions
            || observed != self.state.record.observed_generation;
        if !updates.is_empty() || record_changed {
            let mut record = self.state.record.clone();
            record.conditions = conditions;
            record.observed_generation = observed;
            if let Err(error) = self.commit_current_updates(updates, Some(record)).await {
                self.state.unconverged = seeds;
                return Err(error);
            }
        }
        self.state.unconverged = plan.unconverged.clone();
        for (key, _) in &plan.forget {
            self.state.unconverged.insert(key.clone());
        }
        self.state.waiting = Arc::new(waiting);
        self.snapshots
            .publish(TenantSnapshot::capture(&self.state, 0));
        Ok(plan)
    }
}
