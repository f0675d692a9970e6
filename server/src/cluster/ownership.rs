//! Which replica serves which tenant, and the moves between them.
//!
//! Every tenant has an owner key `owners/<tenant id>` naming the replica
//! that serves it, attached to that replica's lease and claimed with a
//! put-if-absent: at most one replica holds it at any instant, and the
//! claim's revision is the fence of every commit of that owner. Who
//! *should* serve a tenant is [`placement::owner_of`] over the live
//! members, so every replica reaches the same answer; the controller here
//! makes it so, from this replica's side:
//!
//! - a tenant this replica should serve and nobody holds: claim, load from
//!   etcd (the loader rolls forward marked staged commits), serve;
//! - a tenant this replica serves and another live replica should: hand it
//!   off, one tenant at a time: the owner finishes the command it is on
//!   and stops, its streams end (`NOT_OWNER`, `UNAVAILABLE`), and the key
//!   is deleted (only if it is still this claim); the new owner, watching
//!   the keys, claims it;
//! - the lease lost: drop every tenant at once (the keys went with it);
//! - an owner fenced out (its commit refused): drop that tenant;
//! - a claim under this replica's lease on a tenant it neither serves nor
//!   is busy with (a claim etcd applied but whose answer was lost, or a
//!   release that failed): release it, since no other replica may claim
//!   the tenant while it stands.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::store::{EtcdStore, Fence, Store, WriteBatch, keys};
use crate::tenant::owner::now_ms;
use crate::tenant::record::decode;
use crate::tenant::{TenantDirectory, TenantError, TenantHandle, TenantRecord, TenantState};
use crate::watch::hub::CloseReason;

use super::catalog::{Catalog, TenantEntry};
use super::membership::{HeldLease, Membership};
use super::metrics::ClusterMetrics;
use super::mirror::{self, Keys};
use super::owner_store::OwnerStore;
use super::placement;

/// The prefix of the owner keys.
pub const OWNERS: &[u8] = b"owners/";

/// How often the controller looks again even when nothing was reported.
const RESYNC: Duration = Duration::from_secs(2);

/// Tenants loaded at once when many need an owner (a failover).
const PARALLEL_ADOPTIONS: usize = 8;

/// The owner key of tenant `id`, relative to the deployment's prefix.
pub fn owner_key(id: u64) -> Vec<u8> {
    [OWNERS, format!("{id:016x}").as_bytes()].concat()
}

/// Where a call for a tenant must go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// This replica serves it.
    Here,
    /// The replica at this address serves it.
    Elsewhere(String),
    /// No replica serves it right now (a hand-off or a failover).
    Nowhere,
    /// No such tenant: the local handler answers (`NOT_FOUND`).
    Unknown,
}

/// A tenant this replica serves.
struct Local {
    name: String,
    /// The revision of the owner key this replica claimed (its fence).
    revision: i64,
    handle: TenantHandle,
}

/// The ownership controller of this replica and the routing it implies.
pub struct Ownership {
    store: Arc<EtcdStore>,
    records: Arc<dyn Store>,
    directory: Arc<TenantDirectory>,
    catalog: Arc<Catalog>,
    membership: Arc<Membership>,
    owners: watch::Receiver<Keys>,
    metrics: Arc<ClusterMetrics>,
    local: Mutex<HashMap<u64, Local>>,
    /// Tenants being claimed, loaded or handed off.
    busy: Mutex<HashSet<u64>>,
    /// Bumped whenever where a tenant is served may have changed.
    changed: watch::Sender<u64>,
    /// True once this replica has joined and serves what it should.
    ready: watch::Sender<bool>,
    /// Wakes the controller (an adoption finished, an owner ended).
    wake: Notify,
}

impl std::fmt::Debug for Ownership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ownership")
            .field("replica", &self.membership.replica())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Ownership {
    /// Reads the owner keys and starts the controller, which runs until
    /// `stop` is cancelled.
    pub async fn start(
        store: Arc<EtcdStore>,
        records: Arc<dyn Store>,
        directory: Arc<TenantDirectory>,
        catalog: Arc<Catalog>,
        membership: Arc<Membership>,
        metrics: Arc<ClusterMetrics>,
        stop: CancellationToken,
    ) -> Result<Arc<Self>, crate::store::StoreError> {
        let owners = mirror::mirror(store.clone(), OWNERS, stop.clone()).await?;
        let ownership = Arc::new(Self {
            store,
            records,
            directory,
            catalog,
            membership,
            owners,
            metrics,
            local: Mutex::new(HashMap::new()),
            busy: Mutex::new(HashSet::new()),
            changed: watch::Sender::new(0),
            ready: watch::Sender::new(false),
            wake: Notify::new(),
        });
        tokio::spawn(ownership.clone().run(stop));
        Ok(ownership)
    }

    /// A receiver of readiness: true once this replica holds a lease and
    /// serves every tenant it should that nobody else holds.
    pub fn readiness(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }

    /// Where calls for tenant `name` go now.
    pub fn route(&self, name: &str) -> Route {
        let Some(id) = self.catalog.id_of(name) else {
            return Route::Unknown;
        };
        if self.membership.is_valid()
            && (lock(&self.local).contains_key(&id) || self.directory.quarantined(name).is_some())
        {
            return Route::Here;
        }
        let holder = self
            .owners
            .borrow()
            .get(&owner_key(id)[OWNERS.len()..])
            .and_then(|claim| String::from_utf8(claim.value.clone()).ok());
        match holder {
            Some(replica) if replica != self.membership.replica() => {
                match self.membership.members().get(&replica) {
                    Some(address) => Route::Elsewhere(address.clone()),
                    None => Route::Nowhere,
                }
            }
            _ => Route::Nowhere,
        }
    }

    /// [`route`](Self::route), waiting up to `wait` while no replica
    /// serves the tenant.
    pub async fn await_route(&self, name: &str, wait: Duration) -> Route {
        let deadline = Instant::now() + wait;
        let mut changes = self.changed.subscribe();
        loop {
            changes.mark_unchanged();
            let route = self.route(name);
            if route != Route::Nowhere {
                return route;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                _ => return self.route(name),
            }
        }
    }

    /// Completes once tenant `name` is served by another replica than the
    /// one at `owner` (or no longer exists). A moment without an owner (the
    /// keys of a lease that expired are gone, the new claim not seen yet)
    /// does not count: the call may still be answered.
    pub async fn moved_from(&self, name: &str, owner: &str) {
        let mut changes = self.changed.subscribe();
        loop {
            changes.mark_unchanged();
            let moved = match self.route(name) {
                Route::Here | Route::Unknown => true,
                Route::Elsewhere(now) => now != owner,
                Route::Nowhere => false,
            };
            if moved {
                return;
            }
            if changes.changed().await.is_err() {
                // The controller stopped (shutdown): nothing moves any more.
                std::future::pending::<()>().await;
            }
        }
    }

    /// How many tenants this replica serves.
    pub fn owned(&self) -> usize {
        lock(&self.local).len()
    }

    fn bump(&self) {
        self.changed.send_modify(|version| *version += 1);
    }

    async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut leases = self.membership.lease_changes();
        let mut members = self.membership.member_changes();
        let mut owners = self.owners.clone();
        let mut catalog = self.catalog.changes();
        let mut epoch = 0;
        loop {
            match self.membership.current() {
                None => {
                    self.ready.send_replace(false);
                    self.drop_all("the lease was lost").await;
                }
                Some(lease) => {
                    if lease.epoch != epoch {
                        self.drop_all("a new lease replaced the old one").await;
                        epoch = lease.epoch;
                    }
                    self.step(lease).await;
                }
            }
            self.bump();
            tokio::select! {
                () = stop.cancelled() => break,
                _ = leases.changed() => {}
                _ = members.changed() => {}
                _ = owners.changed() => {}
                _ = catalog.changed() => {}
                () = self.wake.notified() => {}
                () = tokio::time::sleep(RESYNC) => {}
            }
        }
        self.ready.send_replace(false);
    }

    /// One round: claims what this replica should serve and nobody holds,
    /// hands off (at most) one tenant another replica should serve, and
    /// cleans up after tenants that are gone.
    async fn step(self: &Arc<Self>, lease: HeldLease) {
        let me = self.membership.replica().to_owned();
        let members = self.membership.members();
        if !members.contains_key(&me) {
            // Our own member key is not visible yet: wait for the watch.
            return;
        }
        let owners = self.owners.borrow().clone();
        let tenants = self.catalog.tenants();
        let existing: HashSet<u64> = tenants.iter().map(|(id, _)| *id).collect();
        let mut claims = Vec::new();
        let mut hand_off = None;
        let mut strays = Vec::new();
        {
            let local = lock(&self.local);
            let busy = lock(&self.busy);
            for (id, name) in &tenants {
                if busy.contains(id) {
                    continue;
                }
                let desired = placement::owner_of(*id, members.keys().map(String::as_str));
                let holder = owners.get(&owner_key(*id)[OWNERS.len()..]);
                if local.contains_key(id) {
                    if hand_off.is_none() && desired.is_some_and(|desired| desired != me) {
                        hand_off = Some(*id);
                    }
                } else if desired == Some(me.as_str()) && holder.is_none() {
                    claims.push((*id, name.clone()));
                } else if let Some(claim) = holder
                    && claim.value == me.as_bytes()
                    && claim.lease == lease.id.0
                {
                    strays.push((*id, name.clone(), claim.mod_revision));
                }
            }
        }
        for (id, name, revision) in strays {
            // A quarantined tenant keeps its claim on purpose.
            if self.directory.quarantined(&name).is_some() {
                continue;
            }
            warn!(tenant = %name, revision, "This replica holds a claim on a tenant it does not serve (etcd applied a claim or kept a release whose answer was lost); releasing it so that the tenant is served again.");
            if let Err(error) = self.store.delete_if(&owner_key(id), revision).await {
                warn!(tenant = %name, %error, "Releasing a stray claim failed; trying again at the next round.");
            }
        }
        // Tenants deleted (their owner stopped by DeleteTenant): release.
        let gone: Vec<u64> = lock(&self.local)
            .keys()
            .filter(|id| !existing.contains(id))
            .copied()
            .collect();
        for id in gone {
            self.forget(id, "the tenant was deleted").await;
        }
        let adopting = !claims.is_empty();
        for (id, name) in claims.into_iter().take(PARALLEL_ADOPTIONS) {
            lock(&self.busy).insert(id);
            tokio::spawn(self.clone().adopt(id, name, lease));
        }
        if let Some(id) = hand_off {
            self.hand_off(id).await;
            // Hand-offs go one at a time; look again at once.
            self.wake.notify_one();
        }
        if !adopting && lock(&self.busy).is_empty() && !*self.ready.borrow() {
            info!(tenants = self.owned(), "This replica serves its tenants.");
            self.ready.send_replace(true);
        }
        let owned = self.owned();
        self.metrics.set_owned(owned);
    }

    /// Claims tenant `id`, loads it and starts serving it.
    async fn adopt(self: Arc<Self>, id: u64, name: String, lease: HeldLease) {
        self.adopt_inner(id, &name, lease).await;
        lock(&self.busy).remove(&id);
        self.bump();
        self.wake.notify_one();
    }

    async fn adopt_inner(self: &Arc<Self>, id: u64, name: &str, lease: HeldLease) {
        let key = owner_key(id);
        let me = self.membership.replica().as_bytes().to_vec();
        let revision = match self.store.put_if_absent(&key, me, Some(lease.id)).await {
            Ok(Some(revision)) => revision,
            Ok(None) => return,
            Err(error) => {
                warn!(tenant = %name, %error, "Claiming a tenant failed; trying again later.");
                return;
            }
        };
        let started = std::time::Instant::now();
        let records = self.records.clone();
        let entry_name = name.to_owned();
        let loaded = tokio::task::spawn_blocking(move || load(&*records, id, &entry_name))
            .await
            .unwrap_or_else(|_| {
                Err(TenantError::Corrupt {
                    key: String::from("(tenant load)"),
                    message: String::from("the loader panicked"),
                })
            });
        let fence = Fence {
            key: key.clone(),
            mod_revision: revision,
        };
        let (state, stored_entry) = match loaded {
            Ok(Some(loaded)) => loaded,
            Ok(None) => {
                // Deleted meanwhile: nothing to serve.
                let _ = self.store.delete_if(&key, revision).await;
                return;
            }
            Err(error) => {
                if self.membership.current().map(|held| held.epoch) != Some(lease.epoch) {
                    // The claim went with the lease while loading.
                    return;
                }
                // Keep the claim: another replica would fail the same way.
                self.directory
                    .quarantine(name.to_owned(), id, &error, Some(fence.clone()));
                self.publish_quarantine(id, name, &error, fence).await;
                return;
            }
        };
        if self.membership.current().map(|held| held.epoch) != Some(lease.epoch) {
            // The lease (and with it the claim) was lost while loading.
            return;
        }
        // The entry as etcd has it, read with the record after the claim:
        // not the catalog's copy, which lags etcd's watch (the previous
        // owner's last commit may not have reached it yet). Only an entry
        // that is missing or says something else than the record (a store
        // copied from sled) is written, alone and under the fence: the
        // record itself is never written again unchanged, so every write
        // of it carries a new revision.
        let current = TenantEntry::of(&state.record, now_ms());
        let known = match stored_entry {
            Some(stored) if stored.same_as(&current) => {
                self.catalog.note(name, id, stored.clone());
                Some(stored)
            }
            _ => {
                let mut batch = WriteBatch::fenced(fence.clone());
                batch.put(keys::tenant_entry_key(name), current.encode());
                match self.records.commit(batch).await {
                    Ok(()) => {
                        self.catalog.note(name, id, current.clone());
                        Some(current)
                    }
                    Err(error) => {
                        warn!(tenant = %name, %error, "Writing a tenant's directory entry failed; its owner writes it with the next commit.");
                        None
                    }
                }
            }
        };
        let owner_store = Arc::new(OwnerStore::new(self.records.clone(), id, fence, known));
        let handle = self.directory.adopt(state, owner_store);
        lock(&self.local).insert(
            id,
            Local {
                name: name.to_owned(),
                revision,
                handle: handle.clone(),
            },
        );
        self.metrics.adopted();
        info!(tenant = %name, revision, millis = started.elapsed().as_millis() as u64, "Serving a tenant.");
        let watcher = self.clone();
        tokio::spawn(async move {
            handle.ended().await;
            watcher.ended(id, revision).await;
        });
    }

    /// Writes tenant `name`'s quarantine (`error`) into its directory
    /// entry under the claim's `fence`, so that every replica's fleet
    /// stream, `ListTenants` and `GetTenant` show it, as one server shows
    /// a tenant it quarantined at start-up. The entry keeps what etcd has
    /// of the tenant's identity and token; one that does not decode is
    /// replaced. An entry that already says so is not written again (a
    /// failover to a replica that fails the same way makes no fleet event).
    async fn publish_quarantine(&self, id: u64, name: &str, error: &TenantError, fence: Fence) {
        let records = self.records.clone();
        let key = keys::tenant_entry_key(name);
        let read = {
            let key = key.clone();
            tokio::task::spawn_blocking(move || records.get(&key)).await
        };
        let stored = match read {
            Ok(Ok(bytes)) => bytes.and_then(|bytes| TenantEntry::decode(&bytes)),
            Ok(Err(read_error)) => {
                warn!(tenant = %name, error = %read_error, "Reading a quarantined tenant's directory entry failed; other replicas do not show its quarantine.");
                return;
            }
            Err(_) => return,
        };
        let entry = TenantEntry::quarantined(id, stored.clone(), error.to_string(), now_ms());
        if stored.is_some_and(|stored| stored.same_as(&entry)) {
            self.catalog.note(name, id, entry);
            return;
        }
        let mut batch = WriteBatch::fenced(fence);
        batch.put(key, entry.encode());
        match self.records.commit(batch).await {
            Ok(()) => self.catalog.note(name, id, entry),
            Err(error) => {
                warn!(tenant = %name, %error, "Writing a quarantined tenant's directory entry failed; other replicas do not show its quarantine.");
            }
        }
    }

    /// Tenant `id`'s owner ended without this controller asking: fenced
    /// out (another replica holds the tenant now), or stopped by
    /// `DeleteTenant` (which still writes the tombstone through the
    /// owner's fenced store, so the claim must stay until it is written).
    async fn ended(&self, id: u64, revision: i64) {
        let ours = |local: &HashMap<u64, Local>| {
            local
                .get(&id)
                .is_some_and(|local| local.revision == revision)
        };
        if !ours(&lock(&self.local)) {
            return;
        }
        let key = owner_key(id);
        let still_claimed = match self.store.get_versioned(&key).await {
            Ok((found, _)) => found.is_some_and(|found| found.mod_revision == revision),
            // Unknown: treat the claim as held; the lease decides.
            Err(_) => true,
        };
        if still_claimed {
            // Stopped on purpose (a deletion): give the tombstone time to
            // land; the tenant then leaves the catalog and `step` forgets
            // it. If it does not, the owner stopped for another reason:
            // let the tenant be claimed and loaded again.
            let deadline = Instant::now() + self.membership.ttl() * 2;
            let mut catalog = self.catalog.changes();
            while self.catalog.name_of(id).is_some() && Instant::now() < deadline {
                let _ = tokio::time::timeout_at(deadline, catalog.changed()).await;
            }
            if self.catalog.name_of(id).is_none() || !ours(&lock(&self.local)) {
                self.wake.notify_one();
                return;
            }
            warn!(
                tenant_id = id,
                "A tenant's owner stopped by itself; releasing it to be loaded again."
            );
        } else {
            self.metrics.dropped(1);
        }
        self.forget(
            id,
            "its owner stopped (fenced out: another replica holds it)",
        )
        .await;
        self.wake.notify_one();
    }

    /// Stops serving tenant `id` and releases its claim if it still holds.
    async fn forget(&self, id: u64, reason: &str) {
        let Some(local) = lock(&self.local).remove(&id) else {
            return;
        };
        // A deletion under way ends the tenant's streams itself once its
        // tombstone is durable (UNAUTHENTICATED, NOT_FOUND): the tenant
        // leaves the catalog as the tombstone lands, and releasing it as
        // moved before the deletion is done would end them UNAVAILABLE.
        local.handle.deletion_settled().await;
        self.directory
            .release(&local.name, CloseReason::Moved)
            .await;
        let _ = self.store.delete_if(&owner_key(id), local.revision).await;
        debug!(tenant = %local.name, reason, "Tenant no longer served here.");
        self.bump();
    }

    /// Hands tenant `id` off to the replica that should serve it.
    async fn hand_off(&self, id: u64) {
        let Some(local) = lock(&self.local).remove(&id) else {
            return;
        };
        lock(&self.busy).insert(id);
        self.bump();
        let started = std::time::Instant::now();
        self.directory
            .release(&local.name, CloseReason::Moved)
            .await;
        if let Err(error) = self.store.delete_if(&owner_key(id), local.revision).await {
            warn!(tenant = %local.name, %error, "Releasing a tenant's owner key failed; it goes with the lease.");
        }
        lock(&self.busy).remove(&id);
        self.metrics.handed_off();
        info!(tenant = %local.name, millis = started.elapsed().as_millis() as u64, "Handed a tenant off.");
        drop(local.handle);
        self.bump();
    }

    /// Stops serving every tenant at once (the lease was lost): their keys
    /// went with the lease, so nothing is released. The tenants quarantined
    /// here are forgotten too (until 2026-12-03 they were kept, and this
    /// replica went on answering for them as quarantined while another one
    /// held, and perhaps served, them).
    async fn drop_all(&self, reason: &str) {
        // The claims of quarantined tenants went with the lease too.
        let forgotten = self.directory.forget_quarantined();
        if forgotten > 0 {
            warn!(
                tenants = forgotten,
                reason, "No longer holding the tenants quarantined here."
            );
            self.bump();
        }
        let dropped: Vec<Local> = lock(&self.local).drain().map(|(_, local)| local).collect();
        if dropped.is_empty() {
            return;
        }
        warn!(
            tenants = dropped.len(),
            reason, "Stopped serving every tenant."
        );
        self.metrics.dropped(dropped.len());
        for local in &dropped {
            local.handle.stop();
            local.handle.events.hub.close(CloseReason::Moved);
        }
        self.bump();
        self.release_all(
            dropped.into_iter().map(|local| local.name),
            CloseReason::Moved,
        )
        .await;
        self.metrics.set_owned(0);
    }

    /// Releases the tenants `names` concurrently and waits for all.
    async fn release_all(&self, names: impl Iterator<Item = String>, reason: CloseReason) {
        let mut releases = tokio::task::JoinSet::new();
        for name in names {
            let directory = self.directory.clone();
            releases.spawn(async move {
                directory.release(&name, reason).await;
            });
        }
        while releases.join_next().await.is_some() {}
    }

    /// Stops serving every tenant and releases their claims (at shutdown,
    /// before the lease is revoked).
    pub async fn shutdown(&self) {
        let names: Vec<String> = lock(&self.local)
            .drain()
            .map(|(_, local)| local.name)
            .collect();
        self.release_all(names.into_iter(), CloseReason::ShuttingDown)
            .await;
        self.metrics.set_owned(0);
    }
}

/// Tenant `id`'s state and its directory entry (under `name`) as stored,
/// or `None` if it is gone or deleted.
fn load(
    store: &dyn Store,
    id: u64,
    name: &str,
) -> Result<Option<(TenantState, Option<TenantEntry>)>, TenantError> {
    let key = keys::tenant_record_key(id);
    let Some(bytes) = store.get(&key)? else {
        return Ok(None);
    };
    let record: TenantRecord = decode(&key, &bytes)?;
    if record.deleted {
        return Ok(None);
    }
    let entry = store
        .get(&keys::tenant_entry_key(name))?
        .and_then(|bytes| TenantEntry::decode(&bytes));
    Ok(Some((TenantState::load(store, record)?, entry)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_keys_name_their_tenant_in_fixed_width_hex() {
        assert_eq!(owner_key(0xab), b"owners/00000000000000ab");
        assert!(owner_key(1) < owner_key(2));
    }
}
