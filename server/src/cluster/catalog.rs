//! The fleet-wide tenant directory every replica keeps: which tenants
//! exist (the name index), and what a replica must know of a tenant it does
//! not serve (its id, its token hash, its conditions), read from etcd and
//! kept up to date by watching two small key ranges.
//!
//! - The name index (`tenant_name` keys, written when a tenant is created
//!   and deleted) says which tenants exist and their ids; placement
//!   spreads exactly these.
//! - Directory entries (`tenant_entry` keys, [`TenantEntry`]) mirror the
//!   parts of a tenant record other replicas need. The owner keeps its
//!   tenant's entry in step with the record in the same commits
//!   ([`OwnerStore`](super::owner_store::OwnerStore)), so a token rotated
//!   or a tenant created on any replica is known everywhere as soon as the
//!   watch delivers it (milliseconds; see docs/scale-out.md).
//!
//! The fleet stream ([`ClusterFleet`](super::fleet::ClusterFleet))
//! follows the entries' changes too, with a watch of its own.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::follow::follow_records;
use crate::auth::TokenDirectory;
use crate::engine::conditions::Condition;
use crate::store::etcd::RecordChange;
use crate::store::{EtcdStore, StoreError, keys};
use crate::tenant::directory::parse_hash;
use crate::tenant::{TenantLimits, TenantRecord};

/// What every replica knows of a tenant, whoever serves it: a projection
/// of the tenant record, stored under the tenant's name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantEntry {
    /// The tenant's internal id.
    pub id: u64,
    /// The SHA-256 of its token, hex.
    pub token_hash: String,
    /// When it was created (unix milliseconds).
    pub created_at_ms: u64,
    /// Its limits.
    pub limits: TenantLimits,
    /// Its conditions, as last committed.
    pub conditions: Vec<Condition>,
    /// When `conditions` last changed (unix milliseconds): the time of the
    /// fleet event the change makes.
    pub conditions_changed_ms: u64,
    /// Why the replica that claimed the tenant could not read its records
    /// (it quarantined the tenant, as one server does at start-up); empty
    /// for a tenant that is served. The fleet stream, `ListTenants` and
    /// `GetTenant` show it on every replica. A replica that loads the
    /// tenant's records again rewrites the entry from them, without it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub quarantine_error: String,
}

impl TenantEntry {
    /// The entry of `record`, whose conditions changed at `changed_ms`.
    pub fn of(record: &TenantRecord, changed_ms: u64) -> Self {
        Self {
            id: record.id,
            token_hash: record.token_hash.clone(),
            created_at_ms: record.created_at_ms,
            limits: record.limits.clone(),
            conditions: record.conditions.clone(),
            conditions_changed_ms: changed_ms,
            quarantine_error: String::new(),
        }
    }

    /// The entry of a tenant quarantined because of `error`, written by the
    /// replica that claimed it: what `stored` (the entry as etcd has it, if
    /// it decodes) says of its identity and token, without conditions (it
    /// is not served, as a quarantined tenant of one server shows none).
    pub fn quarantined(id: u64, stored: Option<TenantEntry>, error: String, now_ms: u64) -> Self {
        let mut entry = stored.unwrap_or(Self {
            id,
            token_hash: String::new(),
            created_at_ms: 0,
            limits: TenantLimits::default(),
            conditions: Vec::new(),
            conditions_changed_ms: now_ms,
            quarantine_error: String::new(),
        });
        if !entry.conditions.is_empty() {
            entry.conditions.clear();
            entry.conditions_changed_ms = now_ms;
        }
        entry.id = id;
        entry.quarantine_error = error;
        entry
    }

    /// Whether `other` says the same of the tenant (the time aside).
    pub fn same_as(&self, other: &TenantEntry) -> bool {
        self.id == other.id
            && self.token_hash == other.token_hash
            && self.created_at_ms == other.created_at_ms
            && self.limits == other.limits
            && self.conditions == other.conditions
            && self.quarantine_error == other.quarantine_error
    }

    /// The stored form.
    pub fn encode(&self) -> Vec<u8> {
        // A struct of strings, numbers and vectors always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The entry stored as `bytes`, if it decodes.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }
}

#[derive(Debug, Default)]
struct State {
    /// Existing tenants: name -> id (the name index).
    names: BTreeMap<String, u64>,
    /// id -> name.
    ids: HashMap<u64, String>,
    /// Directory entries by name.
    entries: HashMap<String, TenantEntry>,
    /// Token hash -> tenant id and name, from the entries of existing
    /// tenants.
    tokens: HashMap<[u8; 32], (u64, String)>,
}

impl State {
    /// Makes the token map agree with tenant `name`'s index and entry.
    fn rebuild_token(&mut self, name: &str) {
        self.tokens.retain(|_, (_, of)| of != name);
        if let (Some(id), Some(entry)) = (self.names.get(name), self.entries.get(name))
            && entry.id == *id
            && let Some(hash) = parse_hash(&entry.token_hash)
        {
            self.tokens.insert(hash, (*id, name.to_owned()));
        }
    }
}

/// The fleet-wide tenant directory of this replica.
#[derive(Debug)]
pub struct Catalog {
    state: RwLock<State>,
    /// Bumped on every change (placement and routing wait on it).
    changed: watch::Sender<u64>,
    /// The revision through which the name index has been applied (its
    /// load, its watch's last change, or its last reload).
    names_applied: watch::Sender<i64>,
    /// The same for the directory entries.
    entries_applied: watch::Sender<i64>,
}

impl TokenDirectory for Catalog {
    fn tenant_by_token_hash(&self, hash: &[u8; 32]) -> Option<u64> {
        self.read().tokens.get(hash).map(|(id, _)| *id)
    }
}

impl Catalog {
    /// Loads the name index and the directory entries, and keeps them up
    /// to date until `stop` is cancelled.
    pub async fn start(
        store: Arc<EtcdStore>,
        stop: CancellationToken,
    ) -> Result<Arc<Self>, StoreError> {
        let (names, names_revision) = store.list_records(keys::tenant_names_prefix()).await?;
        let (entries, entries_revision) = store.list_records(keys::tenant_entries_prefix()).await?;
        let catalog = Arc::new(Self {
            state: RwLock::new(State::default()),
            changed: watch::Sender::new(0),
            names_applied: watch::Sender::new(names_revision),
            entries_applied: watch::Sender::new(entries_revision),
        });
        {
            let mut state = catalog.write();
            for (key, value) in &names {
                apply_name(&mut state, key, Some(value));
            }
            for (key, value) in &entries {
                apply_entry(&mut state, key, Some(value));
            }
            let names: Vec<String> = state.names.keys().cloned().collect();
            for name in names {
                state.rebuild_token(&name);
            }
        }
        info!(
            tenants = catalog.read().names.len(),
            "Tenant directory loaded from etcd."
        );
        tokio::spawn(follow(
            store.clone(),
            keys::tenant_names_prefix(),
            names_revision,
            Feed::Names(catalog.clone()),
            stop.clone(),
        ));
        tokio::spawn(follow(
            store,
            keys::tenant_entries_prefix(),
            entries_revision,
            Feed::Entries(catalog.clone()),
            stop,
        ));
        Ok(catalog)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until the catalog holds every tenant written (created, given
    /// a new token) that etcd had acknowledged when it was called, for at
    /// most `wait`; whether it does. For each of its two key ranges it
    /// reads the latest write after what its watch has applied (keys
    /// only, filtered by etcd), and waits for the watch to apply it.
    ///
    /// It waits for the watch's own events rather than asking etcd for a
    /// progress report: before etcd 3.5.8 and 3.4.24, a requested report
    /// could arrive ahead of events it covers (etcd issue 15220).
    /// Deletions are not waited for: a deleted tenant's token is refused
    /// once the watch delivers the deletion, as before.
    pub async fn catch_up(&self, store: &EtcdStore, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        let ranges = [
            (keys::tenant_names_prefix(), &self.names_applied),
            (keys::tenant_entries_prefix(), &self.entries_applied),
        ];
        for (prefix, applied_through) in ranges {
            let applied = *applied_through.borrow();
            let latest = store.latest_write_after(prefix, applied);
            let latest = match tokio::time::timeout_at(deadline, latest).await {
                Ok(Ok(Some(latest))) => latest,
                Ok(Ok(None)) => continue,
                Ok(Err(_)) | Err(_) => return false,
            };
            let mut through = applied_through.subscribe();
            let reached = through.wait_for(|through| *through >= latest);
            if !matches!(tokio::time::timeout_at(deadline, reached).await, Ok(Ok(_))) {
                return false;
            }
        }
        true
    }

    /// The id of tenant `name`, if it exists.
    pub fn id_of(&self, name: &str) -> Option<u64> {
        self.read().names.get(name).copied()
    }

    /// The name of tenant `id`, if it exists.
    pub fn name_of(&self, id: u64) -> Option<String> {
        self.read().ids.get(&id).cloned()
    }

    /// The directory entry of tenant `name`, if it has one.
    pub fn entry(&self, name: &str) -> Option<TenantEntry> {
        self.read().entries.get(name).cloned()
    }

    /// Every existing tenant's id and name.
    pub fn tenants(&self) -> Vec<(u64, String)> {
        self.read()
            .names
            .iter()
            .map(|(name, id)| (*id, name.clone()))
            .collect()
    }

    /// Up to `limit` tenant names in order, after `after` when given.
    pub fn names_after(&self, after: Option<&str>, limit: usize) -> Vec<String> {
        let state = self.read();
        let range = match after {
            Some(after) => state
                .names
                .range::<str, _>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded)),
            None => state.names.range::<str, _>(..),
        };
        range.take(limit).map(|(name, _)| name.clone()).collect()
    }

    /// Takes note at once of what this replica just committed for tenant
    /// `name` (its watch brings the same a moment later): calls that come
    /// right after see it.
    pub fn note(&self, name: &str, id: u64, entry: TenantEntry) {
        {
            let mut state = self.write();
            if let Some(old) = state.names.insert(name.to_owned(), id)
                && old != id
            {
                state.ids.remove(&old);
            }
            state.ids.insert(id, name.to_owned());
            state.entries.insert(name.to_owned(), entry);
            state.rebuild_token(name);
        }
        self.bump();
    }

    /// A receiver told of every change.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn bump(&self) {
        self.changed.send_modify(|version| *version += 1);
    }
}

fn apply_name(state: &mut State, key: &[u8], value: Option<&[u8]>) {
    let Some(name) = keys::parse_tenant_name_key(key) else {
        return;
    };
    if let Some(old) = state.names.remove(&name) {
        state.ids.remove(&old);
    }
    let id = value
        .and_then(|bytes| bytes.get(..8))
        .and_then(|bytes| bytes.try_into().ok())
        .map(u64::from_be_bytes);
    if let Some(id) = id {
        state.names.insert(name.clone(), id);
        state.ids.insert(id, name);
    }
}

fn apply_entry(state: &mut State, key: &[u8], value: Option<&[u8]>) {
    let Some(name) = keys::parse_tenant_entry_key(key) else {
        return;
    };
    match value.map(TenantEntry::decode) {
        Some(Some(entry)) => {
            state.entries.insert(name, entry);
        }
        Some(None) => {
            warn!(tenant = %name, "A tenant's directory entry does not decode; it is ignored until its owner rewrites it.");
            state.entries.remove(&name);
        }
        None => {
            state.entries.remove(&name);
        }
    }
}

/// What a watch keeps up to date.
enum Feed {
    Names(Arc<Catalog>),
    Entries(Arc<Catalog>),
}

impl Feed {
    /// The revision through which this feed has been applied.
    fn applied(&self) -> &watch::Sender<i64> {
        match self {
            Feed::Names(catalog) => &catalog.names_applied,
            Feed::Entries(catalog) => &catalog.entries_applied,
        }
    }

    fn apply(&self, changes: &[RecordChange]) {
        let (Feed::Names(catalog) | Feed::Entries(catalog)) = self;
        {
            let mut state = catalog.write();
            for change in changes {
                match self {
                    Feed::Names(_) => apply_name(&mut state, &change.key, change.value.as_deref()),
                    Feed::Entries(_) => {
                        apply_entry(&mut state, &change.key, change.value.as_deref())
                    }
                }
                let name = match self {
                    Feed::Names(_) => keys::parse_tenant_name_key(&change.key),
                    Feed::Entries(_) => keys::parse_tenant_entry_key(&change.key),
                };
                if let Some(name) = name {
                    state.rebuild_token(&name);
                }
            }
        }
        if let Some(last) = changes.last() {
            advance(self.applied(), last.revision);
        }
        catalog.bump();
    }
}

/// Moves `applied` up to `revision` (never back).
fn advance(applied: &watch::Sender<i64>, revision: i64) {
    applied.send_if_modified(|through| {
        let later = revision > *through;
        if later {
            *through = revision;
        }
        later
    });
}

/// Follows the records under `prefix` from `revision` + 1 until `stop`
/// into `feed`; a watch compacted away reloads the prefix.
async fn follow(
    store: Arc<EtcdStore>,
    prefix: &'static [u8],
    revision: i64,
    feed: Feed,
    stop: CancellationToken,
) {
    let (store, feed) = (&*store, &feed);
    follow_records(
        store,
        prefix,
        revision,
        "the tenant directory",
        &stop,
        |batch| feed.apply(batch),
        move |_| async move {
            match store.list_records(prefix).await {
                Ok((records, at)) => {
                    reload(feed, &records);
                    advance(feed.applied(), at);
                    Some(at)
                }
                Err(error) => {
                    warn!(%error, "Reloading the tenant directory failed.");
                    None
                }
            }
        },
    )
    .await;
}

/// Replaces what `feed` keeps with `records`.
fn reload(feed: &Feed, records: &[crate::store::Record]) {
    match feed {
        Feed::Names(catalog) => {
            let mut state = catalog.write();
            state.names.clear();
            state.ids.clear();
            for (key, value) in records {
                apply_name(&mut state, key, Some(value));
            }
            let names: Vec<String> = state.names.keys().cloned().collect();
            for name in names {
                state.rebuild_token(&name);
            }
            drop(state);
            catalog.bump();
        }
        Feed::Entries(catalog) => {
            let mut state = catalog.write();
            state.entries.clear();
            for (key, value) in records {
                apply_entry(&mut state, key, Some(value));
            }
            state.tokens.clear();
            let names: Vec<String> = state.names.keys().cloned().collect();
            for name in names {
                state.rebuild_token(&name);
            }
            drop(state);
            catalog.bump();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::conditions::ConditionKind;

    fn entry(id: u64, token: &str) -> TenantEntry {
        TenantEntry {
            id,
            token_hash: token.to_owned(),
            created_at_ms: 1,
            limits: TenantLimits::default(),
            conditions: vec![Condition {
                kind: ConditionKind::Ready,
                status: true,
                reason: "Converged".into(),
                message: String::new(),
                observed_generation: 1,
                last_transition_ms: 5,
            }],
            conditions_changed_ms: 5,
            quarantine_error: String::new(),
        }
    }

    #[test]
    fn a_token_is_known_while_its_tenant_exists_and_its_entry_says_so() {
        let hash = "ab".repeat(32);
        let mut state = State::default();
        apply_entry(
            &mut state,
            &keys::tenant_entry_key("acme"),
            Some(&entry(7, &hash).encode()),
        );
        state.rebuild_token("acme");
        assert!(state.tokens.is_empty(), "no name index entry yet");
        apply_name(
            &mut state,
            &keys::tenant_name_key("acme"),
            Some(&7u64.to_be_bytes()),
        );
        state.rebuild_token("acme");
        assert_eq!(
            state.tokens.values().map(|(id, _)| *id).collect::<Vec<_>>(),
            [7]
        );
        apply_name(&mut state, &keys::tenant_name_key("acme"), None);
        state.rebuild_token("acme");
        assert!(state.tokens.is_empty(), "the tenant was deleted");
    }

    #[test]
    fn entries_that_differ_only_in_time_say_the_same() {
        let mut later = entry(1, "x");
        later.conditions_changed_ms = 99;
        assert!(entry(1, "x").same_as(&later));
        assert!(!entry(1, "x").same_as(&entry(1, "y")));
        assert_eq!(TenantEntry::decode(&later.encode()), Some(later));
    }
}
