//! The directory of tenants: names, internal ids, token hashes, and the
//! owner task of every live tenant. Creating, deleting and rotating tokens
//! are serialised; lookups are lock-free reads of a small map.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::auth::{TokenDirectory, TokenHash, TokenKind, generate_token};
use crate::store::{Fence, Store, WriteBatch, keys};
use crate::watch::hub::CloseReason;
use crate::wire::condition_to_proto;

use super::error::TenantError;
use super::owner::{OwnerSettings, TenantHandle, now_ms};
use super::record::{TenantLimits, TenantRecord, decode, encode};
use super::revision_floor;
use super::revocation::{Revocation, Revoked};
use super::state::{TenantState, scan_all};

/// Keys deleted per commit while purging a deleted tenant.
const PURGE_BATCH: usize = 1_000;

/// Errors of tenant administration.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    /// A tenant with this name exists.
    #[error("tenant {0:?} already exists; pick another name or delete it first")]
    AlreadyExists(String),
    /// No tenant with this name.
    #[error("tenant {0:?} not found")]
    NotFound(String),
    /// The tenant is quarantined: its records could not be read at
    /// start-up, so nothing of it may change but its deletion.
    #[error("tenant {name:?} is quarantined (its records cannot be read: {error})")]
    Quarantined {
        /// The tenant.
        name: String,
        /// Why its records could not be read.
        error: String,
    },
    /// A token could not be generated.
    #[error("cannot generate a token: {0}")]
    Token(String),
    /// The store or a record failed.
    #[error(transparent)]
    Tenant(#[from] TenantError),
}

#[derive(Default)]
struct Inner {
    by_name: BTreeMap<String, TenantHandle>,
    by_token: HashMap<[u8; 32], u64>,
    token_of: HashMap<u64, [u8; 32]>,
    /// Per tenant, cancelled when its current token stops being valid
    /// (rotation, deletion); streams opened with that token end then.
    credentials: HashMap<u64, Revocation>,
    /// Tenants whose records could not be read at start-up, by name.
    quarantined: BTreeMap<String, Quarantined>,
}

/// A tenant not served because its stored records could not be read at
/// start-up; every other tenant is. An admin sees it (FAILED_PRECONDITION
/// with its error) and can delete it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantined {
    /// The tenant's id.
    pub id: u64,
    /// Why its records could not be read.
    pub error: String,
    /// With replicas on etcd, the claim this replica keeps the tenant
    /// under: its deletion commits under this fence, so that a replica
    /// that lost the claim (its lease ran out while it was paused) cannot
    /// free a name another tenant may have taken since. `None` on one
    /// server, where nobody else writes the store.
    pub fence: Option<Fence>,
}

impl Inner {
    /// Ends every stream opened with tenant `id`'s current token, saying
    /// `why`.
    fn revoke_credentials(&mut self, id: u64, why: Revoked) {
        if let Some(revocation) = self.credentials.remove(&id) {
            revocation.revoke(why);
        }
    }
}

/// All live tenants.
pub struct TenantDirectory {
    store: Arc<dyn Store>,
    settings: OwnerSettings,
    inner: RwLock<Inner>,
    admin: tokio::sync::Mutex<()>,
    /// Purges of deleted tenants under way; [`TenantDirectory::shutdown`]
    /// ends and awaits them (they resume at the next start).
    purges: std::sync::Mutex<JoinSet<()>>,
    /// Cancelled at shutdown: purges stop between batches.
    stopping: CancellationToken,
    /// Sweeps expired revision floors, one page after each purge.
    floor_sweeper: Arc<revision_floor::Sweeper>,
}

impl TokenDirectory for TenantDirectory {
    fn tenant_by_token_hash(&self, hash: &[u8; 32]) -> Option<u64> {
        self.read().by_token.get(hash).copied()
    }
}

impl TenantDirectory {
    /// Loads every live tenant from the store, starts their owners, and
    /// resumes the purge of deleted ones.
    pub fn load(store: Arc<dyn Store>, settings: OwnerSettings) -> Result<Arc<Self>, TenantError> {
        let directory = Arc::new(Self {
            store: store.clone(),
            settings,
            inner: RwLock::new(Inner::default()),
            admin: tokio::sync::Mutex::new(()),
            purges: std::sync::Mutex::new(JoinSet::new()),
            stopping: CancellationToken::new(),
            floor_sweeper: Arc::default(),
        });
        let mut records = Vec::new();
        for (key, value) in scan_all(&*store, keys::tenant_names_prefix())? {
            let Some(id) = value
                .get(..8)
                .and_then(|bytes| bytes.try_into().ok())
                .map(u64::from_be_bytes)
            else {
                warn!(key = %String::from_utf8_lossy(&key), "Tenant name index entry is malformed; skipped.");
                continue;
            };
            let record_key = keys::tenant_record_key(id);
            let indexed_name =
                || keys::parse_tenant_name_key(&key).unwrap_or_else(|| format!("(tenant {id})"));
            // A name whose record is gone (a bad restore) cannot be read
            // either: quarantined, so that it is seen and can be deleted
            // or repaired, rather than hidden with its name taken.
            let Some(bytes) = store.get(&record_key)? else {
                let error = TenantError::Corrupt {
                    key: String::from_utf8_lossy(&record_key).into_owned(),
                    message: String::from("the tenant record is missing"),
                };
                directory.quarantine(indexed_name(), id, &error, None);
                continue;
            };
            let record: TenantRecord = match decode(&record_key, &bytes) {
                Ok(record) => record,
                Err(error) => {
                    directory.quarantine(indexed_name(), id, &error, None);
                    continue;
                }
            };
            if record.deleted {
                continue;
            }
            if let Some(fleet) = &directory.settings.fleet {
                fleet.seed(
                    &record.name,
                    record.conditions.iter().map(condition_to_proto).collect(),
                );
            }
            records.push(record);
        }
        for loaded in load_states(&*store, records)? {
            match loaded {
                Ok(state) => {
                    directory.start(state);
                }
                Err(failed) => {
                    let (record, error) = *failed;
                    directory.quarantine(record.name, record.id, &error, None);
                }
            }
        }
        directory.resume_purges()?;
        Ok(directory)
    }

    /// A directory that serves no tenant yet: with replicas on etcd, the
    /// cluster room decides which tenants this process owns and starts
    /// them with [`adopt`](Self::adopt).
    pub fn empty(store: Arc<dyn Store>, settings: OwnerSettings) -> Arc<Self> {
        Arc::new(Self {
            store,
            settings,
            inner: RwLock::new(Inner::default()),
            admin: tokio::sync::Mutex::new(()),
            purges: std::sync::Mutex::new(JoinSet::new()),
            stopping: CancellationToken::new(),
            floor_sweeper: Arc::default(),
        })
    }

    /// Resumes the purge of every deleted tenant whose keys are not all
    /// gone yet (purges are idempotent: replicas may resume the same one).
    pub fn resume_purges(&self) -> Result<(), TenantError> {
        for (key, _) in scan_all(&*self.store, keys::purges_prefix())? {
            if let Some(id) = keys::parse_purge_key(&key) {
                info!(tenant_id = id, "Resuming the purge of a deleted tenant.");
                self.spawn_purge(id);
            }
        }
        Ok(())
    }

    /// Starts serving a loaded tenant whose commits go through `store`
    /// (with replicas on etcd: fenced on the tenant's owner key).
    pub fn adopt(&self, state: TenantState, store: Arc<dyn Store>) -> TenantHandle {
        self.start_with(state, store)
    }

    /// Stops serving tenant `name` without deleting it (another replica
    /// takes it over): its owner finishes the command it is on and stops,
    /// and its open watches end with `reason`. Returns its handle, if it
    /// was served here.
    pub async fn release(&self, name: &str, reason: CloseReason) -> Option<TenantHandle> {
        let handle = self.get(name)?;
        handle.stop_and_wait().await;
        handle.events.hub.close(reason);
        let mut inner = self.write();
        if inner
            .by_name
            .get(name)
            .is_some_and(|live| live.id == handle.id)
        {
            inner.by_name.remove(name);
            if let Some(hash) = inner.token_of.remove(&handle.id) {
                inner.by_token.remove(&hash);
            }
        }
        Some(handle)
    }

    /// Keeps tenant `name` out of service: its records could not be read.
    /// `fence` is the claim it is kept under, with replicas on etcd (see
    /// [`Quarantined::fence`]).
    pub fn quarantine(&self, name: String, id: u64, error: &TenantError, fence: Option<Fence>) {
        error!(
            tenant = %name,
            tenant_id = id,
            %error,
            "A tenant's stored records cannot be read; it is quarantined (not served). Delete it with DeleteTenant, repair it with `reconciled repair` while the server is stopped, or restore the data directory from a backup."
        );
        let error = error.to_string();
        if let Some(fleet) = &self.settings.fleet {
            fleet.seed_quarantined(&name, &error);
        }
        self.write()
            .quarantined
            .insert(name, Quarantined { id, error, fence });
    }

    /// Forgets every quarantined tenant (nothing is deleted: their records
    /// stay as they are); returns how many there were. With replicas on
    /// etcd, a replica that lost its lease lost the claims it kept them
    /// under: another replica may claim them now, and serve them if their
    /// records were repaired, so this one must no longer answer for them.
    pub fn forget_quarantined(&self) -> usize {
        let mut inner = self.write();
        let count = inner.quarantined.len();
        inner.quarantined.clear();
        count
    }

    /// The quarantined tenant `name`, if it is one.
    pub fn quarantined(&self, name: &str) -> Option<Quarantined> {
        self.read().quarantined.get(name).cloned()
    }

    /// How many tenants are quarantined.
    pub fn quarantined_count(&self) -> usize {
        self.read().quarantined.len()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn start(&self, state: TenantState) -> TenantHandle {
        self.start_with(state, self.store.clone())
    }

    fn start_with(&self, state: TenantState, store: Arc<dyn Store>) -> TenantHandle {
        let hash = parse_hash(&state.record.token_hash);
        let handle = TenantHandle::spawn(state, store, self.settings.clone());
        let mut inner = self.write();
        if let Some(hash) = hash {
            inner.by_token.insert(hash, handle.id);
            inner.token_of.insert(handle.id, hash);
        }
        inner.by_name.insert(handle.name.clone(), handle.clone());
        handle
    }

    /// The live tenant named `name`.
    pub fn get(&self, name: &str) -> Option<TenantHandle> {
        self.read().by_name.get(name).cloned()
    }

    /// Up to `limit` tenants in name order, after `after` when given.
    pub fn list(&self, after: Option<&str>, limit: usize) -> Vec<TenantHandle> {
        let inner = self.read();
        let range = match after {
            Some(after) => inner
                .by_name
                .range::<str, _>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded)),
            None => inner.by_name.range::<str, _>(..),
        };
        range
            .take(limit)
            .map(|(_, handle)| handle.clone())
            .collect()
    }

    /// Up to `limit` quarantined tenants by name, after `after`.
    pub fn list_quarantined(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Vec<(String, Quarantined)> {
        let inner = self.read();
        let range = match after {
            Some(after) => inner
                .quarantined
                .range::<str, _>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded)),
            None => inner.quarantined.range::<str, _>(..),
        };
        range
            .take(limit)
            .map(|(name, quarantined)| (name.clone(), quarantined.clone()))
            .collect()
    }

    /// Number of live tenants.
    pub fn len(&self) -> usize {
        self.read().by_name.len()
    }

    /// Whether there is no live tenant.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Creates a tenant; returns its handle and its token (shown once).
    pub async fn create(
        &self,
        name: &str,
        limits: TenantLimits,
    ) -> Result<(TenantHandle, String), DirectoryError> {
        let _admin = self.admin.lock().await;
        if self.get(name).is_some()
            || self
                .store
                .get(&keys::tenant_name_key(name))
                .map_err(TenantError::from)?
                .is_some()
        {
            return Err(DirectoryError::AlreadyExists(name.to_string()));
        }
        let id = self.next_id()?;
        let floor = revision_floor::read(&*self.store, name)?;
        let now = self.settings.clock.now_ms();
        let (record, token, batch) = creation(id, name, limits, now, floor)?;
        self.commit_with_fleet_event(&*self.store, batch, name, false)
            .await?;
        info!(tenant = name, tenant_id = id, "Tenant created.");
        Ok((self.start(TenantState::new(record)), token))
    }

    fn next_id(&self) -> Result<u64, TenantError> {
        next_tenant_id(&*self.store)
    }

    /// The signal that tenant `id`'s current bearer token stopped being
    /// valid (RotateToken, DeleteTenant), with why. A stream opened with a
    /// tenant token takes it right after authenticating, then
    /// authenticates again (a rotation in between is then seen), and ends
    /// with `UNAUTHENTICATED` once it is revoked.
    pub fn credential_revoked(&self, id: u64) -> Revocation {
        self.write().credentials.entry(id).or_default().clone()
    }

    /// Replaces a tenant's token; returns the new one (shown once); every
    /// stream opened with the old token ends.
    pub async fn rotate_token(&self, name: &str) -> Result<String, DirectoryError> {
        let _admin = self.admin.lock().await;
        let handle = self.get(name).ok_or_else(|| match self.quarantined(name) {
            Some(quarantined) => DirectoryError::Quarantined {
                name: name.to_string(),
                error: quarantined.error,
            },
            None => DirectoryError::NotFound(name.to_string()),
        })?;
        let token = generate_token(TokenKind::Tenant)
            .map_err(|error| DirectoryError::Token(error.to_string()))?;
        let hash = *TokenHash::of(&token).as_bytes();
        handle.set_token_hash(hex(&hash)).await?;
        let mut inner = self.write();
        if let Some(old) = inner.token_of.insert(handle.id, hash) {
            inner.by_token.remove(&old);
        }
        inner.by_token.insert(hash, handle.id);
        inner.revoke_credentials(handle.id, Revoked::Rotated);
        info!(tenant = name, "Tenant token rotated.");
        Ok(token)
    }

    /// Deletes a tenant: a durable tombstone first (the name is free again
    /// at once), then its owner stops and its keys are purged in bounded
    /// batches, resumed after a restart.
    pub async fn delete(&self, name: &str) -> Result<(), DirectoryError> {
        let _admin = self.admin.lock().await;
        if self.get(name).is_none()
            && let Some(quarantined) = self.quarantined(name)
        {
            return self.delete_quarantined(name, quarantined).await;
        }
        let handle = self
            .get(name)
            .ok_or_else(|| DirectoryError::NotFound(name.to_string()))?;
        info!(
            tenant = name,
            tenant_id = handle.id,
            "Deleting a tenant: its owner finishes its current command first."
        );
        // The agent sessions that end with the owner wait for the outcome
        // (until `deleting` is dropped) to tell their agents.
        let deleting = handle.begin_deletion();
        // Nothing of the owner may commit after the tombstone.
        handle.stop_and_wait().await;
        let mut record = handle.snapshots.latest().record.clone();
        record.deleted = true;
        let mut batch = WriteBatch::new();
        batch.put(keys::tenant_record_key(handle.id), encode(&record)?);
        batch.put(keys::purge_key(handle.id), Vec::new());
        batch.delete(keys::tenant_name_key(name));
        let now = self.settings.clock.now_ms();
        revision_floor::leave(&mut batch, name, Some(record.revision), now);
        // Through the owner's store: with replicas on etcd, the tombstone
        // lands only while this process still owns the tenant. One that
        // does not land (fenced out: another replica took the tenant over)
        // leaves the token valid and ends no stream here: they end as the
        // tenant moves (UNAVAILABLE, NOT_OWNER), and go on at its new owner.
        self.commit_with_fleet_event(&**handle.store(), batch, name, true)
            .await?;
        // Durable: streams opened with the tenant's token end now with
        // UNAUTHENTICATED (first, so that they do not see the hub close),
        // those opened with the admin token with NOT_FOUND.
        self.write().revoke_credentials(handle.id, Revoked::Deleted);
        handle.events.hub.close(CloseReason::Deleted);
        {
            let mut inner = self.write();
            inner.by_name.remove(name);
            if let Some(hash) = inner.token_of.remove(&handle.id) {
                inner.by_token.remove(&hash);
            }
            // A stream that authenticated while the tenant was being
            // deleted took a new signal: end it too.
            inner.revoke_credentials(handle.id, Revoked::Deleted);
        }
        drop(deleting);
        info!(
            tenant = name,
            tenant_id = handle.id,
            "Tenant deleted; purging its records."
        );
        self.spawn_purge(handle.id);
        Ok(())
    }

    /// Deletes a quarantined tenant: its name is freed and its keys are
    /// purged (its record, unreadable, is not rewritten). With replicas on
    /// etcd the commit is fenced on the claim the tenant was quarantined
    /// under: a replica that lost it writes nothing (the call answers
    /// `NOT_OWNER`, and its retry reaches the replica that holds it now).
    async fn delete_quarantined(
        &self,
        name: &str,
        quarantined: Quarantined,
    ) -> Result<(), DirectoryError> {
        let id = quarantined.id;
        let mut batch = WriteBatch::new();
        batch.set_fence(quarantined.fence);
        batch.put(keys::purge_key(id), Vec::new());
        batch.delete(keys::tenant_name_key(name));
        // Its last revision is unreadable: the floor is the clock's now.
        revision_floor::leave(&mut batch, name, None, self.settings.clock.now_ms());
        // With replicas on etcd, its directory entry goes too: the other
        // replicas and the fleet stream follow the entries, and the purge
        // (by id) never reaches this key (by name). On sled there is none.
        batch.delete(keys::tenant_entry_key(name));
        // Fleet watchers listed it as quarantined: they see it go.
        self.commit_with_fleet_event(&*self.store, batch, name, true)
            .await?;
        self.write().quarantined.remove(name);
        info!(
            tenant = name,
            tenant_id = id,
            "Quarantined tenant deleted; purging its records."
        );
        self.spawn_purge(id);
        Ok(())
    }

    fn spawn_purge(&self, id: u64) {
        let store = self.store.clone();
        let stop = self.stopping.clone();
        let floor_sweeper = Arc::clone(&self.floor_sweeper);
        let clock = Arc::clone(&self.settings.clock);
        let mut purges = self
            .purges
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while purges.try_join_next().is_some() {}
        purges.spawn(async move {
            match purge(&*store, id, &stop).await {
                Ok(Some(removed)) => {
                    info!(tenant_id = id, removed, "Deleted tenant purged.");
                    floor_sweeper.sweep_next(&*store, clock.now_ms()).await;
                }
                Ok(None) => info!(
                    tenant_id = id,
                    "Purge of a deleted tenant paused for shutdown; it resumes at the next start."
                ),
                Err(error) => {
                    warn!(tenant_id = id, %error, "Purging a deleted tenant failed; it resumes at the next start.")
                }
            }
        });
    }

    /// Commits a tenant's creation or deletion with its fleet event.
    async fn commit_with_fleet_event(
        &self,
        store: &dyn Store,
        batch: WriteBatch,
        name: &str,
        deleted: bool,
    ) -> Result<(), TenantError> {
        let Some(fleet) = &self.settings.fleet else {
            return Ok(store.commit(batch).await?);
        };
        let now = now_ms();
        let event = crate::wire::fleet_event(name, &[], now, deleted);
        Ok(fleet.commit_durably(batch, Some(event), now).await?)
    }

    /// The gauges the tenants own (items by state, operations in flight,
    /// queued commands, watchers, tenants), summed over every live tenant.
    pub fn gauges(&self) -> crate::metrics::Gauges {
        let mut gauges = crate::metrics::Gauges {
            tenants_quarantined: self.read().quarantined.len() as u64,
            ..Default::default()
        };
        for handle in self.read().by_name.values() {
            let snapshot = handle.snapshots.latest();
            gauges.tenants += 1;
            gauges.queued_commands += handle.queued_commands() as u64;
            gauges.watchers += handle.events.hub.watchers() as u64;
            gauges.operations_in_flight += snapshot.in_flight as u64;
            for (state, count) in snapshot.counts.by_state() {
                *gauges.items_by_state.entry(state).or_default() += count;
            }
        }
        gauges
    }

    /// Ends every open watch stream (at shutdown).
    pub fn close_watches(&self) {
        for handle in self.read().by_name.values() {
            handle.events.hub.close(CloseReason::ShuttingDown);
        }
    }

    /// Stops every owner and every purge, and waits for them all: once
    /// this returns, no tenant task commits anything (at shutdown).
    pub async fn shutdown(&self) {
        self.stopping.cancel();
        let handles: Vec<TenantHandle> = self.read().by_name.values().cloned().collect();
        for handle in &handles {
            handle.stop();
        }
        for handle in &handles {
            handle.stop_and_wait().await;
        }
        let mut purges = std::mem::take(
            &mut *self
                .purges
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        while purges.join_next().await.is_some() {}
    }
}

/// The next free internal tenant id in `store` (ids are never reused).
///
/// The stored counter says which it is, but it is one small record: a torn
/// write or a bad restore can leave it unreadable or behind the ids in use,
/// and handing out an id that has keys (or a purge still under way) would
/// give the new tenant another tenant's records, token and future purge.
/// So the id is also past every id that still has a key or a purge marker.
pub fn next_tenant_id(store: &dyn Store) -> Result<u64, TenantError> {
    let stored = store.get(keys::next_tenant_id_key())?;
    let counter = stored
        .as_deref()
        .filter(|bytes| bytes.len() == 8)
        .and_then(|bytes| bytes.try_into().ok())
        .map(u64::from_be_bytes);
    if stored.is_some() && counter.is_none() {
        warn!(
            "The stored tenant id counter is unreadable; the next id is taken past every id in use."
        );
    }
    let mut next = counter.unwrap_or(1).max(1);
    // A purge marker, then any key, of an id at or past `next` moves it on
    // (each check is one bounded scan; only a stale counter loops).
    loop {
        let purging = store
            .scan(keys::purges_prefix(), Some(&keys::purge_key(next - 1)), 1)?
            .first()
            .and_then(|(key, _)| keys::parse_purge_key(key))
            .filter(|&id| id >= next);
        if let Some(id) = purging {
            next = next_after(id)?;
            continue;
        }
        if !has_keys_from(store, next)? {
            return Ok(next);
        }
        next = next_after(highest_id_with_keys(store, next)?)?;
    }
}

/// The id after `id`, unless every id is used up.
fn next_after(id: u64) -> Result<u64, TenantError> {
    id.checked_add(1).ok_or_else(|| TenantError::Corrupt {
        key: String::from("(tenant ids)"),
        message: String::from("every internal tenant id is in use"),
    })
}

/// Whether any tenant key of an id at least `id` (> 0) exists. Every key
/// of a tenant is its 9-byte prefix and a record kind byte below 0xff.
fn has_keys_from(store: &dyn Store, id: u64) -> Result<bool, TenantError> {
    let mut after = keys::tenant_prefix(id - 1);
    after.push(0xff);
    Ok(!store
        .scan(&[keys::TENANT_SPACE], Some(&after), 1)?
        .is_empty())
}

/// The highest tenant id with a key, knowing one at least `low` exists.
fn highest_id_with_keys(store: &dyn Store, low: u64) -> Result<u64, TenantError> {
    // Invariant: some id >= low has keys; none >= high + 1 has.
    let (mut low, mut high) = (low, u64::MAX);
    while low < high {
        let middle = low + (high - low).div_ceil(2);
        if has_keys_from(store, middle)? {
            low = middle;
        } else {
            high = middle - 1;
        }
    }
    Ok(low)
}

/// What creating tenant `name` with id `id` at `created_at_ms` writes: its
/// record, its token (shown once) and the batch that stores both, the name
/// index and the next free id. The caller makes sure the name is free and
/// the id is the next one while the batch commits. `floor` is what a
/// deleted tenant of the name left ([`revision_floor::read`]): the new
/// tenant's revisions start past it and the clock's floor, and the batch
/// clears it.
pub fn creation(
    id: u64,
    name: &str,
    limits: TenantLimits,
    created_at_ms: u64,
    floor: Option<u64>,
) -> Result<(TenantRecord, String, WriteBatch), DirectoryError> {
    let token = generate_token(TokenKind::Tenant)
        .map_err(|error| DirectoryError::Token(error.to_string()))?;
    let revision = revision_floor::first_revision_past(created_at_ms, floor);
    let record = TenantRecord {
        id,
        name: name.to_string(),
        created_at_ms,
        generation: 0,
        observed_generation: 0,
        revision,
        limits,
        token_hash: hex(TokenHash::of(&token).as_bytes()),
        deleted: false,
        conditions: Vec::new(),
        compact_revision: Some(revision),
        history_bytes: Some(0),
    };
    let mut batch = WriteBatch::new();
    batch.put(
        keys::next_tenant_id_key().to_vec(),
        (id + 1).to_be_bytes().to_vec(),
    );
    batch.put(keys::tenant_name_key(name), id.to_be_bytes().to_vec());
    batch.put(keys::tenant_record_key(id), encode(&record)?);
    revision_floor::clear(&mut batch, name, floor);
    Ok((record, token, batch))
}

/// Loads the tenants' graphs, on as many threads as there are cores (the
/// start-up of a server with many tenants is mostly decoding). Returns them
/// in the order of `records`.
/// A tenant's state, or its record and why its state could not be read.
type Loaded = Result<TenantState, Box<(TenantRecord, TenantError)>>;

fn load_states(store: &dyn Store, records: Vec<TenantRecord>) -> Result<Vec<Loaded>, TenantError> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let chunk = records.len().div_ceil(threads).max(1);
    let mut chunks: Vec<Vec<TenantRecord>> = Vec::new();
    let mut records = records.into_iter().peekable();
    while records.peek().is_some() {
        chunks.push(records.by_ref().take(chunk).collect());
    }
    std::thread::scope(|scope| {
        let loaders: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .into_iter()
                        .map(|record| {
                            TenantState::load(store, record.clone())
                                .map_err(|error| Box::new((record, error)))
                        })
                        .collect::<Vec<Loaded>>()
                })
            })
            .collect();
        let mut states = Vec::new();
        for loader in loaders {
            let loaded = loader.join().map_err(|_| TenantError::Corrupt {
                key: String::from("(tenant load)"),
                message: String::from("a loader thread panicked"),
            })?;
            states.extend(loaded);
        }
        Ok(states)
    })
}

/// Deletes every key of tenant `id` in bounded batches, then its purge
/// marker. Returns how many keys were removed, or `None` when `stop` was
/// cancelled first (the marker stays: the purge resumes at the next start).
pub async fn purge(
    store: &dyn Store,
    id: u64,
    stop: &CancellationToken,
) -> Result<Option<usize>, TenantError> {
    let prefix = keys::tenant_prefix(id);
    let mut removed = 0;
    loop {
        if stop.is_cancelled() {
            return Ok(None);
        }
        // Keys only: a record that cannot be read back must go too.
        let page = store.scan_keys(&prefix, None, PURGE_BATCH)?;
        if page.is_empty() {
            break;
        }
        let mut batch = WriteBatch::new();
        for key in &page {
            batch.delete(key.clone());
        }
        removed += page.len();
        store.commit(batch).await?;
    }
    let mut batch = WriteBatch::new();
    batch.delete(keys::purge_key(id));
    store.commit(batch).await?;
    Ok(Some(removed))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The 32 bytes of a stored token hash (64 hex digits), if it is one.
pub fn parse_hash(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut hash = [0u8; 32];
    for (index, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(index * 2..index * 2 + 2)?, 16).ok()?;
    }
    Some(hash)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::intent::ValidatedSubmit;
    use crate::store::InMemoryStore;

    fn empty_submit() -> ValidatedSubmit {
        ValidatedSubmit {
            subgraph: String::new(),
            items: Vec::new(),
            expected_generation: None,
            dry_run: false,
        }
    }

    fn directory() -> Arc<TenantDirectory> {
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        TenantDirectory::load(store, OwnerSettings::default()).expect("an empty store loads")
    }

    #[tokio::test]
    async fn a_name_created_again_after_the_clock_was_set_back_counts_past_its_deleted_tenant() {
        let clock = Arc::new(crate::tenant::SimulatedClock::new(1_800_000_000_000));
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let settings = OwnerSettings {
            clock: clock.clone(),
            ..OwnerSettings::default()
        };
        let directory = TenantDirectory::load(store.clone(), settings).expect("loads");
        let (first, _) = directory
            .create("acme", TenantLimits::default())
            .await
            .expect("created");
        first.submit(empty_submit()).await.expect("submitted");
        let last_revision = first.snapshots.latest().record.revision;
        directory.delete("acme").await.expect("deleted");
        assert!(
            revision_floor::read(&*store, "acme")
                .expect("read")
                .is_some_and(|floor| floor > last_revision),
            "the deletion leaves a floor past the tenant's last revision"
        );

        // An operator sets the clock back an hour.
        clock.step_wall_clock(-60 * 60 * 1000);
        let (again, _) = directory
            .create("acme", TenantLimits::default())
            .await
            .expect("created again");
        let record = again.snapshots.latest().record.clone();
        assert!(
            record.events_floor() > last_revision,
            "the new tenant's revisions ({}) start past the deleted one's last ({last_revision})",
            record.events_floor()
        );
        assert_eq!(
            revision_floor::read(&*store, "acme").expect("read"),
            None,
            "the new record carries the floor on"
        );
        directory.shutdown().await;
    }

    #[tokio::test]
    async fn shutdown_returns_once_every_owner_has_stopped() {
        let directory = directory();
        for name in ["a", "b", "c"] {
            directory
                .create(name, TenantLimits::default())
                .await
                .expect("tenant created");
        }
        let handles: Vec<TenantHandle> = ["a", "b", "c"]
            .iter()
            .filter_map(|name| directory.get(name))
            .collect();
        directory.shutdown().await;
        for handle in handles {
            let answer = handle.submit(empty_submit()).await;
            assert!(
                matches!(answer, Err(TenantError::Gone)),
                "a stopped owner takes no command: {answer:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_damaged_tenant_id_counter_never_hands_out_an_id_in_use() {
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let directory =
            TenantDirectory::load(store.clone(), OwnerSettings::default()).expect("loads");
        let (first, first_token) = directory
            .create("first", TenantLimits::default())
            .await
            .expect("created");
        let (purged, _) = directory
            .create("purged", TenantLimits::default())
            .await
            .expect("created");
        // A tombstoned tenant whose purge is still to run keeps its id.
        let mut batch = WriteBatch::new();
        batch.put(keys::purge_key(purged.id + 5), Vec::new());
        store.commit(batch).await.expect("written");
        // A torn write leaves the counter unreadable (or a restore, behind).
        for counter in [vec![0, 1, 2], 1u64.to_be_bytes().to_vec()] {
            let mut batch = WriteBatch::new();
            batch.put(keys::next_tenant_id_key().to_vec(), counter);
            store.commit(batch).await.expect("written");
            let name = format!("new{}", directory.len());
            let (created, _) = directory
                .create(&name, TenantLimits::default())
                .await
                .expect("created");
            assert!(
                created.id > purged.id + 5,
                "{name} got id {}, which is in use",
                created.id
            );
        }
        let record: TenantRecord = decode(
            &keys::tenant_record_key(first.id),
            &store
                .get(&keys::tenant_record_key(first.id))
                .expect("reads")
                .expect("present"),
        )
        .expect("readable");
        assert_eq!(record.name, "first", "the first tenant's record is its own");
        assert_eq!(
            directory.tenant_by_token_hash(TokenHash::of(&first_token).as_bytes()),
            Some(first.id)
        );
    }

    #[tokio::test]
    async fn a_tenant_whose_record_is_missing_is_quarantined_not_hidden() {
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let directory =
            TenantDirectory::load(store.clone(), OwnerSettings::default()).expect("loads");
        let (lost, _) = directory
            .create("lost", TenantLimits::default())
            .await
            .expect("created");
        directory
            .create("kept", TenantLimits::default())
            .await
            .expect("created");
        directory.shutdown().await;
        // A bad restore: the name index survives, the record does not.
        let mut batch = WriteBatch::new();
        batch.delete(keys::tenant_record_key(lost.id));
        store.commit(batch).await.expect("written");

        let directory =
            TenantDirectory::load(store.clone(), OwnerSettings::default()).expect("loads");
        assert!(
            directory.get("kept").is_some(),
            "the other tenant is served"
        );
        let quarantined = directory
            .quarantined("lost")
            .expect("a tenant whose record is missing is quarantined, not hidden");
        assert_eq!(quarantined.id, lost.id);
        assert!(quarantined.error.contains("missing"), "{quarantined:?}");
        assert_eq!(directory.list_quarantined(None, 10).len(), 1);
        // An admin can remove it, and the name is free again.
        directory.delete("lost").await.expect("deleted");
        directory
            .create("lost", TenantLimits::default())
            .await
            .expect("the name is free again");
    }

    #[tokio::test]
    async fn rotating_the_token_of_a_quarantined_tenant_says_it_is_quarantined() {
        let directory = directory();
        directory.quarantine(
            String::from("bad"),
            7,
            &TenantError::Corrupt {
                key: String::from("k"),
                message: String::from("unreadable"),
            },
            None,
        );
        let refused = directory
            .rotate_token("bad")
            .await
            .expect_err("a quarantined tenant gets no token");
        let status = tonic::Status::from(crate::status::ApiError::from(refused));
        assert_eq!(
            status.code(),
            tonic::Code::FailedPrecondition,
            "as every admin call on a quarantined tenant (docs/security.md): {status:?}"
        );
        assert!(status.message().contains("quarantined"), "{status:?}");
        assert!(directory.quarantined("bad").is_some(), "still quarantined");
    }

    #[tokio::test]
    async fn a_tenant_with_an_unreadable_chunked_record_is_purged_whole() {
        let (store, raw, bad) = crate::tenant::repair::tests::a_tenant_with_a_lost_chunk();
        let directory = TenantDirectory::load(store.clone(), OwnerSettings::default())
            .expect("start-up survives a damaged tenant");
        assert!(directory.quarantined("bad").is_some());
        assert!(directory.get("good").is_some());
        directory.shutdown().await;
        let removed = purge(&*store, bad, &CancellationToken::new())
            .await
            .expect("a damaged record does not stop the purge");
        assert!(removed.is_some_and(|removed| removed >= 2), "{removed:?}");
        assert!(
            raw.scan(&keys::tenant_prefix(bad), None, 10)
                .expect("scans")
                .is_empty(),
            "every key of the tenant is gone"
        );
        assert!(
            raw.scan(&[reconciled_migrations::layout::CHUNK_SPACE], None, 10)
                .expect("scans")
                .is_empty(),
            "its chunks too"
        );
    }

    #[tokio::test]
    async fn a_deleted_tenants_owner_has_stopped_when_delete_returns() {
        let directory = directory();
        directory
            .create("gone", TenantLimits::default())
            .await
            .expect("tenant created");
        let handle = directory.get("gone").expect("tenant is live");
        directory.delete("gone").await.expect("tenant deleted");
        let answer = handle.submit(empty_submit()).await;
        assert!(matches!(answer, Err(TenantError::Gone)), "{answer:?}");
        assert!(directory.get("gone").is_none());
    }
}
