//! `reconciled repair`: finds, with the server stopped, the stored records
//! of each tenant that cannot be read (the ones that quarantine a tenant at
//! start-up, and the ones start-up skips), and repairs or removes them.
//!
//! What a repair may do is decided by one rule: **never make an agent run
//! an operation that nobody asked for.** So:
//!
//! | unreadable record | repair |
//! |---|---|
//! | the tenant record | rebuilt from the name index: same name and id, a **new token** (printed once), limits back to the server's defaults, generation from the intended items, revision past every stored event and past a floor from the clock (`now_ms × 1024`, which no revision of the lost record can have reached, commits without events included); the event history is dropped (watchers resuming from before get `REVISION_COMPACTED`) |
//! | an intended item | replaced by the value its agent last applied (no operation follows; submit the intent again to change it); without an applied value it is removed from the intent |
//! | a current item | removed: if the item is intended it is created again (agents' Creates are idempotent, DESIGN section 4); if not, the server forgets it and it stays where its agent put it |
//! | a type spec | removed: the next agent registering the type stores it again |
//! | an event | the tenant's history up to it is compacted (removed, and the compaction floor raised), so no watcher is fed a gap |
//!
//! Removing a tenant instead ([`remove`]) tombstones it exactly as
//! `DeleteTenant` does: its name is free at once and its keys are purged
//! when the server next starts.

use std::collections::BTreeMap;
use std::fmt;

use crate::auth::{TokenHash, TokenKind, generate_token};
use crate::engine::exec::StoredSpec;
use crate::graph::{CurrentItem, IntendedItem};
use crate::store::{Store, WriteBatch, keys};

use super::error::TenantError;
use super::owner::now_ms;
use super::record::{StoredIntended, TenantLimits, TenantRecord, decode, encode, first_revision};
use super::revision_floor;
use super::state::{TenantState, scan_all};

/// Why a repair could not run.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    /// No tenant of that name is in the store's name index.
    #[error(
        "no tenant named {0:?} in this data directory; run `reconciled repair` without --tenant to list the damaged ones"
    )]
    UnknownTenant(String),
    /// Reading or writing the store failed.
    #[error(transparent)]
    Store(#[from] TenantError),
    /// A token could not be generated for a rebuilt tenant record.
    #[error("cannot generate the rebuilt tenant's token: {0}")]
    Token(String),
}

/// Which record could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Damaged {
    /// The tenant record (name, generations, revision, limits, token hash).
    TenantRecord,
    /// An intended item, `type/name`.
    Intended(String),
    /// A current item, `type/name`.
    Current(String),
    /// A registered item type's spec.
    TypeSpec(String),
    /// A chunk of the event of `revision`.
    Event(u64),
}

impl fmt::Display for Damaged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TenantRecord => write!(f, "the tenant record"),
            Self::Intended(item) => write!(f, "intended item {item}"),
            Self::Current(item) => write!(f, "current item {item}"),
            Self::TypeSpec(item_type) => write!(f, "type spec {item_type}"),
            Self::Event(revision) => write!(f, "event of revision {revision}"),
        }
    }
}

/// One record that could not be read, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The record's key.
    pub key: Vec<u8>,
    /// Which record it is.
    pub damaged: Damaged,
    /// What went wrong reading it.
    pub error: String,
}

/// A tenant's unreadable records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantDiagnosis {
    /// The tenant's name (from the name index).
    pub name: String,
    /// Its internal id.
    pub id: u64,
    /// Every record that could not be read; empty when the tenant is sound.
    pub problems: Vec<Problem>,
}

impl TenantDiagnosis {
    /// Whether start-up would quarantine this tenant (its record, an
    /// intended or a current item is unreadable); type specs and events
    /// only lose what they hold.
    pub fn quarantines(&self) -> bool {
        self.problems.iter().any(|problem| {
            matches!(
                problem.damaged,
                Damaged::TenantRecord | Damaged::Intended(_) | Damaged::Current(_)
            )
        })
    }
}

/// What [`repair`] did to one tenant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepairOutcome {
    /// One line per record repaired or removed, for the operator.
    pub actions: Vec<String>,
    /// The new token, when the tenant record was rebuilt (shown once).
    pub new_token: Option<String>,
}

/// Every live tenant in the name index with the records of it that cannot
/// be read, in name order (sound tenants too, with no problems).
pub fn diagnose_all(store: &dyn Store) -> Result<Vec<TenantDiagnosis>, TenantError> {
    let mut all = Vec::new();
    for (key, value) in scan_all(store, keys::tenant_names_prefix())? {
        let (Some(name), Some(id)) = (keys::parse_tenant_name_key(&key), id_of(&value)) else {
            continue;
        };
        if let Some(diagnosis) = diagnose(store, &name, id)? {
            all.push(diagnosis);
        }
    }
    Ok(all)
}

/// The diagnosis of tenant `name`.
pub fn diagnose_tenant(store: &dyn Store, name: &str) -> Result<TenantDiagnosis, RepairError> {
    let id = store
        .get(&keys::tenant_name_key(name))
        .map_err(TenantError::from)?
        .as_deref()
        .and_then(id_of)
        .ok_or_else(|| RepairError::UnknownTenant(name.to_owned()))?;
    diagnose(store, name, id)?.ok_or_else(|| RepairError::UnknownTenant(name.to_owned()))
}

fn id_of(value: &[u8]) -> Option<u64> {
    value
        .get(..8)
        .and_then(|bytes| bytes.try_into().ok())
        .map(u64::from_be_bytes)
}

/// Tenant `id`'s unreadable records; `None` for a tombstoned tenant.
fn diagnose(
    store: &dyn Store,
    name: &str,
    id: u64,
) -> Result<Option<TenantDiagnosis>, TenantError> {
    let mut problems = Vec::new();
    let record_key = keys::tenant_record_key(id);
    match store.get(&record_key) {
        Err(error) => {
            let error = TenantError::from(error);
            problems.push(problem(record_key, Damaged::TenantRecord, &error));
        }
        Ok(Some(bytes)) => match decode::<TenantRecord>(&record_key, &bytes) {
            Ok(record) if record.deleted => return Ok(None),
            Ok(_) => {}
            Err(error) => problems.push(problem(record_key, Damaged::TenantRecord, &error)),
        },
        Ok(None) => problems.push(Problem {
            key: record_key,
            damaged: Damaged::TenantRecord,
            error: String::from("missing"),
        }),
    }
    for (key, value) in records_under(store, &keys::intended_items_prefix(id))? {
        let item = item_name(&key);
        let readable = value
            .and_then(|value| decode::<StoredIntended>(&key, &value))
            .and_then(|stored| {
                IntendedItem::compile(stored.item, stored.generation).map_err(|error| {
                    TenantError::Corrupt {
                        key: String::from_utf8_lossy(&key).into_owned(),
                        message: error.to_string(),
                    }
                })
            });
        if let Err(error) = readable {
            problems.push(problem(key, Damaged::Intended(item), &error));
        }
    }
    for (key, value) in records_under(store, &keys::current_items_prefix(id))? {
        let item = item_name(&key);
        let readable = match keys::parse_item_key(&key) {
            Some(_) => value.and_then(|value| decode::<CurrentItem>(&key, &value).map(|_| ())),
            None => Err(TenantError::Corrupt {
                key: String::from_utf8_lossy(&key).into_owned(),
                message: String::from("not an item key"),
            }),
        };
        if let Err(error) = readable {
            problems.push(problem(key, Damaged::Current(item), &error));
        }
    }
    for (key, value) in records_under(store, &keys::type_specs_prefix(id))? {
        if let Err(error) = value.and_then(|value| decode::<StoredSpec>(&key, &value)) {
            let item_type = keys::parse_type_spec_key(&key)
                .map_or_else(|| printable(&key), |(_, item_type)| item_type);
            problems.push(problem(key, Damaged::TypeSpec(item_type), &error));
        }
    }
    for (key, value) in scan_all(store, &keys::events_prefix(id))? {
        use prost::Message as _;
        let Some((_, revision, _)) = keys::parse_event_key(&key) else {
            continue;
        };
        if let Err(error) = reconciled_proto::v1::EventGroup::decode(value.as_slice()) {
            problems.push(Problem {
                key,
                damaged: Damaged::Event(revision),
                error: error.to_string(),
            });
        }
    }
    Ok(Some(TenantDiagnosis {
        name: name.to_owned(),
        id,
        problems,
    }))
}

/// A record's key and its value, or why the value cannot be read back.
type RecordRead = (Vec<u8>, Result<Vec<u8>, TenantError>);

/// Keys read per page by [`records_under`].
const KEYS_PAGE: usize = 1_000;

/// Every record under `prefix`, a page at a time. A page that cannot be
/// read whole (a chunked value with a chunk missing) is read again key by
/// key, so the unreadable record is a problem of its own, not the end of
/// the diagnosis; a sound store is read once.
fn records_under(store: &dyn Store, prefix: &[u8]) -> Result<Vec<RecordRead>, TenantError> {
    let mut all: Vec<RecordRead> = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        // How many keys the page held, and its last key.
        let (count, last) = match store.scan(prefix, after.as_deref(), KEYS_PAGE) {
            Ok(page) => {
                let (count, last) = (page.len(), page.last().map(|(key, _)| key.clone()));
                all.extend(page.into_iter().map(|(key, value)| (key, Ok(value))));
                (count, last)
            }
            Err(_) => {
                let keys = store.scan_keys(prefix, after.as_deref(), KEYS_PAGE)?;
                for key in &keys {
                    match store.get(key) {
                        Ok(Some(value)) => all.push((key.clone(), Ok(value))),
                        Ok(None) => {}
                        Err(error) => all.push((key.clone(), Err(TenantError::from(error)))),
                    }
                }
                (keys.len(), keys.last().cloned())
            }
        };
        if count < KEYS_PAGE {
            return Ok(all);
        }
        after = last;
    }
}

fn problem(key: Vec<u8>, damaged: Damaged, error: &TenantError) -> Problem {
    Problem {
        key,
        damaged,
        error: error.to_string(),
    }
}

fn item_name(key: &[u8]) -> String {
    keys::parse_item_key(key).map_or_else(
        || printable(key),
        |(item_type, name)| format!("{item_type}/{name}"),
    )
}

fn printable(key: &[u8]) -> String {
    String::from_utf8_lossy(key).escape_debug().to_string()
}

/// Repairs every unreadable record of `diagnosis`'s tenant as the module
/// documentation says, in one commit, and checks that the tenant then
/// loads. Blocking: call it with the server stopped, off any runtime.
pub fn repair(
    store: &dyn Store,
    diagnosis: &TenantDiagnosis,
) -> Result<RepairOutcome, RepairError> {
    let id = diagnosis.id;
    let mut outcome = RepairOutcome::default();
    let mut batch = WriteBatch::new();
    let damaged = |wanted: fn(&Damaged) -> bool| {
        diagnosis
            .problems
            .iter()
            .filter(move |problem| wanted(&problem.damaged))
    };

    // The readable intended items, for the rebuilt record's generation.
    let mut intended_generation = 0;
    for (key, value) in records_under(store, &keys::intended_items_prefix(id))? {
        if let Ok(stored) = value.and_then(|value| decode::<StoredIntended>(&key, &value)) {
            intended_generation = intended_generation.max(stored.generation);
        }
    }
    let record_key = keys::tenant_record_key(id);
    // Unreadable, however: rebuilt.
    let mut record = match store.get(&record_key) {
        Ok(Some(bytes)) => decode::<TenantRecord>(&record_key, &bytes).ok(),
        Ok(None) | Err(_) => None,
    };
    let events = scan_all(store, &keys::events_prefix(id))?;
    if record.is_none() {
        let token = generate_token(TokenKind::Tenant)
            .map_err(|error| RepairError::Token(error.to_string()))?;
        let last_event = events
            .iter()
            .filter_map(|(key, _)| keys::parse_event_key(key).map(|(_, revision, _)| revision))
            .max()
            .unwrap_or(0);
        let revision = rebuilt_revision(last_event, now_ms());
        record = Some(TenantRecord {
            id,
            name: diagnosis.name.clone(),
            created_at_ms: now_ms(),
            generation: intended_generation,
            observed_generation: 0,
            revision,
            limits: TenantLimits::default(),
            token_hash: hex(TokenHash::of(&token).as_bytes()),
            deleted: false,
            conditions: Vec::new(),
            compact_revision: Some(revision),
            history_bytes: Some(0),
        });
        for (key, _) in &events {
            batch.delete(key.clone());
        }
        outcome.actions.push(format!(
            "the tenant record: rebuilt (generation {intended_generation}, revision {revision}, \
             limits back to the server's defaults, event history dropped); it has a new token"
        ));
        outcome.new_token = Some(token);
    }
    let Some(mut record) = record else {
        // Set just above when it was not readable.
        return Err(RepairError::UnknownTenant(diagnosis.name.clone()));
    };

    for problem in damaged(|d| matches!(d, Damaged::Intended(_))) {
        let current_key = intended_to_current_key(&problem.key);
        let applied = current_key
            .and_then(|key| store.get(&key).ok().flatten().map(|bytes| (key, bytes)))
            .and_then(|(key, bytes)| decode::<CurrentItem>(&key, &bytes).ok())
            .and_then(|current| current.applied)
            .filter(|applied| IntendedItem::compile((**applied).clone(), 0).is_ok());
        match applied {
            Some(applied) => {
                let stored = StoredIntended {
                    item: (*applied).clone(),
                    generation: record.generation,
                };
                batch.put(problem.key.clone(), encode(&stored)?);
                outcome.actions.push(format!(
                    "{}: replaced by the value its agent last applied; submit the intent again to change it",
                    problem.damaged
                ));
            }
            None => {
                batch.delete(problem.key.clone());
                outcome.actions.push(format!(
                    "{}: removed from the intent (nothing was applied for it); submit it again if it is still wanted",
                    problem.damaged
                ));
            }
        }
    }
    for problem in damaged(|d| matches!(d, Damaged::Current(_))) {
        batch.delete(problem.key.clone());
        outcome.actions.push(format!(
            "{}: removed; it is created again if intended (Creates are idempotent), otherwise forgotten",
            problem.damaged
        ));
    }
    for problem in damaged(|d| matches!(d, Damaged::TypeSpec(_))) {
        batch.delete(problem.key.clone());
        outcome.actions.push(format!(
            "{}: removed; the next agent registering the type stores it again",
            problem.damaged
        ));
    }
    let compact_to = damaged(|d| matches!(d, Damaged::Event(_)))
        .filter_map(|problem| match problem.damaged {
            Damaged::Event(revision) => Some(revision),
            _ => None,
        })
        .max();
    if let Some(compact_to) = compact_to
        && outcome.new_token.is_none()
    {
        for (key, _) in &events {
            if keys::parse_event_key(key).is_some_and(|(_, revision, _)| revision <= compact_to) {
                batch.delete(key.clone());
            }
        }
        record.compact_revision = Some(record.events_floor().max(compact_to));
        // Counted again when the tenant loads.
        record.history_bytes = None;
        outcome.actions.push(format!(
            "events up to revision {compact_to}: history compacted (watchers resuming from before get REVISION_COMPACTED)"
        ));
    }
    batch.put(record_key, encode(&record)?);
    store
        .commit_blocking(batch)
        .map_err(|error| RepairError::Store(error.into()))?;
    TenantState::load(store, record)?;
    Ok(outcome)
}

/// Tombstones tenant `diagnosis` as `DeleteTenant` does: its name is free
/// at once and the server purges its keys when it next starts. Its record
/// may be unreadable, so the revision floor left for the name is the
/// clock's now (see [`revision_floor`]).
pub fn remove(store: &dyn Store, diagnosis: &TenantDiagnosis) -> Result<(), RepairError> {
    let mut batch = WriteBatch::new();
    batch.put(keys::purge_key(diagnosis.id), Vec::new());
    batch.delete(keys::tenant_name_key(&diagnosis.name));
    revision_floor::leave(&mut batch, &diagnosis.name, None, now_ms());
    store
        .commit_blocking(batch)
        .map_err(|error| RepairError::Store(error.into()))
}

/// The current item key with the identity of an intended item key.
fn intended_to_current_key(key: &[u8]) -> Option<Vec<u8>> {
    let (id, _, _) = keys::split_tenant_key(key)?;
    let (item_type, name) = keys::parse_item_key(key)?;
    Some(keys::current_item_key(id, &item_type, &name))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The per-tenant lines of a report, e.g. for `reconciled repair`.
pub fn describe(diagnoses: &[TenantDiagnosis]) -> String {
    let mut text = String::new();
    let mut sound = 0;
    let by_name: BTreeMap<&str, &TenantDiagnosis> =
        diagnoses.iter().map(|d| (d.name.as_str(), d)).collect();
    for diagnosis in by_name.values() {
        if diagnosis.problems.is_empty() {
            sound += 1;
            continue;
        }
        let state = if diagnosis.quarantines() {
            "quarantined at start-up"
        } else {
            "served, with records it skips"
        };
        text.push_str(&format!(
            "tenant {:?} (id {}): {} unreadable record(s), {state}\n",
            diagnosis.name,
            diagnosis.id,
            diagnosis.problems.len()
        ));
        for problem in &diagnosis.problems {
            text.push_str(&format!("  {}: {}\n", problem.damaged, problem.error));
        }
    }
    text.push_str(&format!("{sound} tenant(s) with every record readable\n"));
    text
}

/// The revision a rebuilt tenant record starts from (with its history
/// compacted to it, so every earlier revision reads as compacted).
///
/// The lost record's revision cannot be read back, and the event log does
/// not bound it: commits without an event (a token rotation, new limits)
/// store none, and pruning by age can empty it. So the record starts past
/// both the stored events and the clock's floor (`first_revision`), which
/// no revision of the lost record can have reached. Revisions stay
/// increasing; they jump once, here.
fn rebuilt_revision(last_event: u64, now_ms: u64) -> u64 {
    (last_event + 1).max(first_revision(now_ms))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::intent::ValidatedSubmit;
    use crate::graph::Item;
    use crate::store::InMemoryStore;
    use crate::tenant::TenantDirectory;
    use crate::tenant::owner::OwnerSettings;

    /// A store with tenants `bad` and `good`, each with two intended items.
    fn two_tenants() -> (Arc<dyn Store>, u64) {
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let bad = runtime.block_on(async {
            let directory =
                TenantDirectory::load(store.clone(), OwnerSettings::default()).expect("loads");
            let mut bad = 0;
            for name in ["bad", "good"] {
                let (handle, _) = directory
                    .create(name, TenantLimits::default())
                    .await
                    .expect("created");
                handle
                    .submit(ValidatedSubmit {
                        subgraph: String::new(),
                        items: ["a", "b"]
                            .iter()
                            .map(|n| (Item::new("t", *n, Default::default()), Vec::new()))
                            .collect(),
                        expected_generation: None,
                        dry_run: false,
                    })
                    .await
                    .expect("submitted");
                if name == "bad" {
                    bad = handle.id;
                }
            }
            directory.shutdown().await;
            bad
        });
        (store, bad)
    }

    fn damage(store: &dyn Store, key: Vec<u8>) {
        let mut batch = WriteBatch::new();
        batch.put(key, b"{torn".to_vec());
        store.commit_blocking(batch).expect("written");
    }

    #[test]
    fn a_rebuilt_tenant_record_keeps_the_intent_and_gets_a_new_token() {
        let (store, bad) = two_tenants();
        damage(&*store, keys::tenant_record_key(bad));
        let all = diagnose_all(&*store).expect("diagnosed");
        assert_eq!(all.len(), 2);
        let diagnosis = all.iter().find(|d| d.name == "bad").expect("listed");
        assert!(diagnosis.quarantines());
        assert_eq!(diagnosis.problems[0].damaged, Damaged::TenantRecord);
        assert!(
            all.iter()
                .any(|d| d.name == "good" && d.problems.is_empty())
        );

        let outcome = repair(&*store, diagnosis).expect("repaired");
        assert!(outcome.new_token.is_some());
        let after = diagnose_tenant(&*store, "bad").expect("diagnosed");
        assert!(after.problems.is_empty(), "{after:?}");
        let record: TenantRecord = decode(
            &keys::tenant_record_key(bad),
            &store
                .get(&keys::tenant_record_key(bad))
                .expect("reads")
                .expect("present"),
        )
        .expect("readable");
        assert_eq!(record.name, "bad");
        assert_eq!(record.generation, 1, "from the intended items");
        let state = TenantState::load(&*store, record).expect("loads");
        assert_eq!(state.intended.len(), 2);
    }

    #[test]
    fn unreadable_items_and_specs_are_repaired_without_an_operation_nobody_asked_for() {
        let (store, bad) = two_tenants();
        // An applied value for t/a, so its unreadable intent can take it.
        let mut current =
            CurrentItem::created(Arc::new(Item::new("t", "a", Default::default())), 1);
        current.observed = None;
        let mut batch = WriteBatch::new();
        batch.put(
            keys::current_item_key(bad, "t", "a"),
            encode(&current).expect("encodes"),
        );
        store.commit_blocking(batch).expect("written");
        damage(&*store, keys::intended_item_key(bad, "t", "a"));
        damage(&*store, keys::intended_item_key(bad, "t", "b"));
        damage(&*store, keys::type_spec_key(bad, "t"));
        let diagnosis = diagnose_tenant(&*store, "bad").expect("diagnosed");
        assert_eq!(diagnosis.problems.len(), 3, "{diagnosis:?}");

        let outcome = repair(&*store, &diagnosis).expect("repaired");
        assert_eq!(outcome.new_token, None);
        assert_eq!(outcome.actions.len(), 3, "{outcome:?}");
        let stored: StoredIntended = decode(
            b"a",
            &store
                .get(&keys::intended_item_key(bad, "t", "a"))
                .expect("reads")
                .expect("t/a keeps an intent"),
        )
        .expect("readable");
        assert_eq!(&**stored.item.name(), "a", "the applied value");
        assert!(
            store
                .get(&keys::intended_item_key(bad, "t", "b"))
                .expect("reads")
                .is_none(),
            "nothing was applied for t/b: it leaves the intent"
        );
        assert!(
            diagnose_tenant(&*store, "bad")
                .expect("diagnosed")
                .problems
                .is_empty()
        );
    }

    /// A chunked store (as the server's) with tenants `bad` and `good`;
    /// `bad` has a current record over one stored value whose middle
    /// chunk is lost, as a bad restore of the data directory leaves it.
    /// Returns the store, the raw store under it and `bad`'s id.
    pub(crate) fn a_tenant_with_a_lost_chunk() -> (Arc<dyn Store>, Arc<InMemoryStore>, u64) {
        use crate::store::ChunkedValues;
        use crate::tenant::directory::creation;
        let raw = Arc::new(InMemoryStore::new());
        let store: Arc<dyn Store> =
            Arc::new(ChunkedValues::new(raw.clone()).expect("an empty store wraps"));
        for (id, name) in [(1, "bad"), (2, "good")] {
            let (_, _, batch) =
                creation(id, name, TenantLimits::default(), now_ms(), None).expect("created");
            store.commit_blocking(batch).expect("written");
        }
        let mut properties = crate::graph::Properties::default();
        properties.insert("blob".into(), "x".repeat(150 * 1024).into());
        let big = CurrentItem::created(Arc::new(Item::new("t", "big", properties)), 1);
        let key = keys::current_item_key(1, "t", "big");
        let mut batch = WriteBatch::new();
        batch.put(key.clone(), encode(&big).expect("encodes"));
        store.commit_blocking(batch).expect("written");
        let mut batch = WriteBatch::new();
        batch.delete(reconciled_migrations::layout::chunk_key(&key, 1));
        raw.commit_blocking(batch).expect("a chunk lost");
        (store, raw, 1)
    }

    #[test]
    fn a_record_with_a_lost_chunk_is_diagnosed_and_repaired() {
        let (store, _, bad) = a_tenant_with_a_lost_chunk();
        let all = diagnose_all(&*store).expect("every tenant is diagnosed");
        assert!(
            all.iter()
                .any(|d| d.name == "good" && d.problems.is_empty()),
            "{all:?}"
        );
        let diagnosis = all.iter().find(|d| d.name == "bad").expect("listed");
        assert_eq!(
            diagnosis
                .problems
                .iter()
                .map(|p| p.damaged.clone())
                .collect::<Vec<_>>(),
            [Damaged::Current(String::from("t/big"))],
            "{diagnosis:?}"
        );
        assert!(diagnosis.quarantines());
        repair(&*store, diagnosis).expect("repaired");
        assert!(
            diagnose_tenant(&*store, "bad")
                .expect("diagnosed")
                .problems
                .is_empty()
        );
        assert!(
            store
                .get(&keys::current_item_key(bad, "t", "big"))
                .expect("reads")
                .is_none()
        );
    }

    #[test]
    fn a_removed_tenant_is_gone_from_the_index_and_queued_for_purge() {
        let (store, bad) = two_tenants();
        damage(&*store, keys::tenant_record_key(bad));
        let diagnosis = diagnose_tenant(&*store, "bad").expect("diagnosed");
        remove(&*store, &diagnosis).expect("removed");
        assert!(matches!(
            diagnose_tenant(&*store, "bad"),
            Err(RepairError::UnknownTenant(_))
        ));
        assert!(store.get(&keys::purge_key(bad)).expect("reads").is_some());
    }
}
