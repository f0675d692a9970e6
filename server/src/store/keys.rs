//! The key layout: one sled tree of typed key prefixes (DESIGN section 6).
//!
//! ```text
//! 0x00 "schema_version"                       -> u32 BE
//! 0x00 "next_tenant_id"                       -> u64 BE
//! 0x00 "tenant_name" 0x00 <name>              -> tenant id (u64 BE)
//! 0x00 "purge" 0x00 <tenant id u64 BE>        -> tombstoned tenant being purged
//! 0x00 "fleet_event" 0x00 <revision u64 BE>   -> fleet-wide event
//! 0x00 "fleet_log"                            -> fleet log position (JSON)
//! 0x00 "tenant_entry" 0x00 <name>             -> a tenant's directory entry (replicas on etcd only)
//! 0x00 "revision_floor" 0x00 <name>           -> u64 BE: where a tenant created again under <name> starts counting
//! 0x00 "copy_incomplete"                      -> empty: the store holds part of an unfinished `store copy`
//! 0x01 <tenant id u64 BE> <kind u8> <rest>    -> a tenant's records (see RecordKind)
//! 0x02 <key len u32 BE> <key> <index u32 BE>  -> a chunk of a large value (store/chunked.rs)
//! ```
//!
//! Integers are big-endian and fixed width, so range scans come out in
//! numeric order and a tenant's 9-byte prefix cannot be extended by another
//! tenant's key. An item identity is `type 0x00 name`: types never contain
//! NUL (identities are 1–253 bytes of printable UTF-8), so the first NUL
//! splits them unambiguously and byte order equals (type, name) order.
//!
//! The bytes are an on-disk format: change them only with a migration.

pub use reconciled_migrations::layout::{NEXT_TENANT_ID_KEY, SCHEMA_VERSION_KEY};

/// The first byte of every global key.
pub const GLOBAL_SPACE: u8 = 0x00;
/// The first byte of every tenant key.
pub const TENANT_SPACE: u8 = 0x01;

const TENANT_NAME_PREFIX: &[u8] = b"\x00tenant_name\x00";
const PURGE_PREFIX: &[u8] = b"\x00purge\x00";
const FLEET_EVENT_PREFIX: &[u8] = b"\x00fleet_event\x00";
const FLEET_LOG_KEY: &[u8] = b"\x00fleet_log";
const TENANT_ENTRY_PREFIX: &[u8] = b"\x00tenant_entry\x00";
const COPY_INCOMPLETE_KEY: &[u8] = b"\x00copy_incomplete";
const REVISION_FLOOR_PREFIX: &[u8] = b"\x00revision_floor\x00";

/// The length of [`tenant_prefix`]: space byte and 8-byte id.
pub const TENANT_PREFIX_LEN: usize = 9;

/// The kind of a tenant record: the byte after the tenant prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum RecordKind {
    /// The tenant itself (name, generations, revision, limits, token hash).
    Tenant = 0x01,
    /// An intended item, keyed by identity.
    IntendedItem = 0x02,
    /// A current item, keyed by identity.
    CurrentItem = 0x03,
    /// A stored item type spec, keyed by type.
    TypeSpec = 0x04,
    /// An entry of the tenant's event log, keyed by revision.
    Event = 0x05,
    /// A journaled operation, keyed by the identity it acts on.
    Journal = 0x06,
    /// Retry backoff state, keyed by identity.
    Backoff = 0x07,
}

impl RecordKind {
    fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            0x01 => Self::Tenant,
            0x02 => Self::IntendedItem,
            0x03 => Self::CurrentItem,
            0x04 => Self::TypeSpec,
            0x05 => Self::Event,
            0x06 => Self::Journal,
            0x07 => Self::Backoff,
            _ => return None,
        })
    }

    fn is_item(self) -> bool {
        matches!(
            self,
            Self::IntendedItem | Self::CurrentItem | Self::Journal | Self::Backoff
        )
    }
}

// ---- global keys ----

/// The schema version record (4 bytes BE), written by migrations.
pub fn schema_version_key() -> &'static [u8] {
    SCHEMA_VERSION_KEY
}

/// The counter of internal tenant ids (8 bytes BE: the next id to hand out).
pub fn next_tenant_id_key() -> &'static [u8] {
    NEXT_TENANT_ID_KEY
}

/// The index from a tenant's name to its internal id.
pub fn tenant_name_key(name: &str) -> Vec<u8> {
    [TENANT_NAME_PREFIX, name.as_bytes()].concat()
}

/// The prefix of every [`tenant_name_key`].
pub fn tenant_names_prefix() -> &'static [u8] {
    TENANT_NAME_PREFIX
}

/// Parses a [`tenant_name_key`] back to the name.
pub fn parse_tenant_name_key(key: &[u8]) -> Option<String> {
    let rest = key.strip_prefix(TENANT_NAME_PREFIX)?;
    String::from_utf8(rest.to_vec()).ok()
}

/// Marks a tombstoned tenant whose keys are still being purged.
pub fn purge_key(tenant_id: u64) -> Vec<u8> {
    [PURGE_PREFIX, &tenant_id.to_be_bytes()].concat()
}

/// The prefix of every [`purge_key`] (scans come out in id order).
pub fn purges_prefix() -> &'static [u8] {
    PURGE_PREFIX
}

/// Parses a [`purge_key`] back to the tenant id.
pub fn parse_purge_key(key: &[u8]) -> Option<u64> {
    parse_u64(key.strip_prefix(PURGE_PREFIX)?)
}

/// A fleet-wide event at `revision`.
pub fn fleet_event_key(revision: u64) -> Vec<u8> {
    [FLEET_EVENT_PREFIX, &revision.to_be_bytes()].concat()
}

/// The prefix of every [`fleet_event_key`] (scans come out in revision order).
pub fn fleet_events_prefix() -> &'static [u8] {
    FLEET_EVENT_PREFIX
}

/// The fleet log's position: its newest revision and compaction floor.
pub fn fleet_log_key() -> &'static [u8] {
    FLEET_LOG_KEY
}

/// Present (empty) in a store that `reconciled store copy` is writing, from
/// its first batch until its last: a store holding it has only part of the
/// records, and nothing may serve, migrate or repair it.
pub fn copy_incomplete_key() -> &'static [u8] {
    COPY_INCOMPLETE_KEY
}

/// Parses a [`fleet_event_key`] back to the revision.
pub fn parse_fleet_event_key(key: &[u8]) -> Option<u64> {
    parse_u64(key.strip_prefix(FLEET_EVENT_PREFIX)?)
}

/// A tenant's directory entry: what every replica on etcd must know of a
/// tenant it does not serve (its id, token hash, conditions), kept next
/// to the name index so that replicas watch one small key range
/// (`cluster/catalog.rs`). Written only when replicas share an etcd
/// store; a single server never reads it.
pub fn tenant_entry_key(name: &str) -> Vec<u8> {
    [TENANT_ENTRY_PREFIX, name.as_bytes()].concat()
}

/// The prefix of every [`tenant_entry_key`] (scans come out in name order).
pub fn tenant_entries_prefix() -> &'static [u8] {
    TENANT_ENTRY_PREFIX
}

/// Parses a [`tenant_entry_key`] back to the tenant's name.
pub fn parse_tenant_entry_key(key: &[u8]) -> Option<String> {
    let rest = key.strip_prefix(TENANT_ENTRY_PREFIX)?;
    String::from_utf8(rest.to_vec()).ok()
}

/// The revision floor a deleted tenant left for its name (8 bytes BE): a
/// tenant created again under the name starts counting past it, whatever
/// the clock says (see `tenant::directory::revision_floor`).
pub fn revision_floor_key(name: &str) -> Vec<u8> {
    [REVISION_FLOOR_PREFIX, name.as_bytes()].concat()
}

/// The prefix of every [`revision_floor_key`] (scans come out in name order).
pub fn revision_floors_prefix() -> &'static [u8] {
    REVISION_FLOOR_PREFIX
}

// ---- tenant keys ----

/// The prefix of every key of tenant `tenant_id`; fixed width, so no other
/// tenant's key starts with it.
pub fn tenant_prefix(tenant_id: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(TENANT_PREFIX_LEN + 1);
    key.push(TENANT_SPACE);
    key.extend_from_slice(&tenant_id.to_be_bytes());
    key
}

/// The prefix of every record of `kind` of tenant `tenant_id`.
pub fn kind_prefix(tenant_id: u64, kind: RecordKind) -> Vec<u8> {
    let mut key = tenant_prefix(tenant_id);
    key.push(kind as u8);
    key
}

/// The tenant's own record.
pub fn tenant_record_key(tenant_id: u64) -> Vec<u8> {
    kind_prefix(tenant_id, RecordKind::Tenant)
}

/// An intended item. `item_type` and `name` must be valid identities.
pub fn intended_item_key(tenant_id: u64, item_type: &str, name: &str) -> Vec<u8> {
    item_key(tenant_id, RecordKind::IntendedItem, item_type, name)
}

/// The prefix of the tenant's intended items (scans in (type, name) order).
pub fn intended_items_prefix(tenant_id: u64) -> Vec<u8> {
    kind_prefix(tenant_id, RecordKind::IntendedItem)
}

/// A current item. `item_type` and `name` must be valid identities.
pub fn current_item_key(tenant_id: u64, item_type: &str, name: &str) -> Vec<u8> {
    item_key(tenant_id, RecordKind::CurrentItem, item_type, name)
}

/// The prefix of the tenant's current items (scans in (type, name) order).
pub fn current_items_prefix(tenant_id: u64) -> Vec<u8> {
    kind_prefix(tenant_id, RecordKind::CurrentItem)
}

/// A stored item type spec.
pub fn type_spec_key(tenant_id: u64, item_type: &str) -> Vec<u8> {
    let mut key = kind_prefix(tenant_id, RecordKind::TypeSpec);
    key.extend_from_slice(item_type.as_bytes());
    key
}

/// The prefix of the tenant's type specs.
pub fn type_specs_prefix(tenant_id: u64) -> Vec<u8> {
    kind_prefix(tenant_id, RecordKind::TypeSpec)
}

/// Parses a [`type_spec_key`] back to the tenant id and the type.
pub fn parse_type_spec_key(key: &[u8]) -> Option<(u64, String)> {
    let (tenant_id, kind, rest) = split_tenant_key(key)?;
    if kind != RecordKind::TypeSpec {
        return None;
    }
    Some((tenant_id, String::from_utf8(rest.to_vec()).ok()?))
}

/// A chunk of the tenant's event log: the events of one revision are
/// stored in one or more chunks (each value stays under the store's limit).
pub fn event_key(tenant_id: u64, revision: u64, chunk: u32) -> Vec<u8> {
    let mut key = kind_prefix(tenant_id, RecordKind::Event);
    key.extend_from_slice(&revision.to_be_bytes());
    key.extend_from_slice(&chunk.to_be_bytes());
    key
}

/// The prefix of the tenant's event log (scans in revision order).
pub fn events_prefix(tenant_id: u64) -> Vec<u8> {
    kind_prefix(tenant_id, RecordKind::Event)
}

/// Parses an [`event_key`] back to the tenant id, revision and chunk.
pub fn parse_event_key(key: &[u8]) -> Option<(u64, u64, u32)> {
    let (tenant_id, kind, rest) = split_tenant_key(key)?;
    if kind != RecordKind::Event {
        return None;
    }
    let (revision, chunk) = rest.split_first_chunk::<8>()?;
    let chunk = <[u8; 4]>::try_from(chunk).ok()?;
    Some((
        tenant_id,
        u64::from_be_bytes(*revision),
        u32::from_be_bytes(chunk),
    ))
}

/// A journaled operation on an item. `item_type` and `name` must be valid
/// identities.
pub fn journal_key(tenant_id: u64, item_type: &str, name: &str) -> Vec<u8> {
    item_key(tenant_id, RecordKind::Journal, item_type, name)
}

/// The prefix of the tenant's journal.
pub fn journal_prefix(tenant_id: u64) -> Vec<u8> {
    kind_prefix(tenant_id, RecordKind::Journal)
}

/// Retry backoff state of an item. `item_type` and `name` must be valid
/// identities.
pub fn backoff_key(tenant_id: u64, item_type: &str, name: &str) -> Vec<u8> {
    item_key(tenant_id, RecordKind::Backoff, item_type, name)
}

/// The prefix of the tenant's backoff records.
pub fn backoffs_prefix(tenant_id: u64) -> Vec<u8> {
    kind_prefix(tenant_id, RecordKind::Backoff)
}

/// Splits any tenant key into tenant id, record kind and the rest.
pub fn split_tenant_key(key: &[u8]) -> Option<(u64, RecordKind, &[u8])> {
    let rest = key.strip_prefix(&[TENANT_SPACE])?;
    let (id, rest) = rest.split_first_chunk::<8>()?;
    let (kind, rest) = rest.split_first()?;
    Some((u64::from_be_bytes(*id), RecordKind::from_byte(*kind)?, rest))
}

/// Parses an item key (intended, current, journal or backoff) back to
/// `(type, name)`; `None` for any other key.
pub fn parse_item_key(key: &[u8]) -> Option<(String, String)> {
    let (_, kind, rest) = split_tenant_key(key)?;
    if !kind.is_item() {
        return None;
    }
    let separator = rest.iter().position(|&b| b == 0)?;
    let (item_type, name) = (&rest[..separator], &rest[separator + 1..]);
    if item_type.is_empty() || name.is_empty() {
        return None;
    }
    Some((
        String::from_utf8(item_type.to_vec()).ok()?,
        String::from_utf8(name.to_vec()).ok()?,
    ))
}

fn item_key(tenant_id: u64, kind: RecordKind, item_type: &str, name: &str) -> Vec<u8> {
    // Validation upstream guarantees this; a NUL in the type would make the
    // key ambiguous.
    debug_assert!(
        !item_type.contains('\0'),
        "item type contains NUL: {item_type:?}"
    );
    let mut key = kind_prefix(tenant_id, kind);
    key.reserve(item_type.len() + 1 + name.len());
    key.extend_from_slice(item_type.as_bytes());
    key.push(0);
    key.extend_from_slice(name.as_bytes());
    key
}

fn parse_u64(bytes: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(bytes).ok().map(u64::from_be_bytes)
}

#[cfg(test)]
mod tests;
