//! 0002: a tenant's records become protobuf ("binary records").
//!
//! Up to schema version 1 the server stored its tenant records as JSON.
//! From version 2 the tenant record, intended items, current items and type
//! specs are the protobuf messages of `reconciled.store.v1`
//! (`proto/reconciled/store/v1/records.proto`): no field names repeated in
//! every record, integers as varints, faster to decode when a tenant loads.
//! Property objects (an item's properties, observed properties, a type's
//! JSON Schema) stay JSON text inside `bytes` fields.
//!
//! The JSON shape is read through a frozen copy of the version 1 types
//! ([`v1_json`]), never through the server's types: those move on, the
//! records on disk do not. Every other key is left as it is: events are
//! protobuf already, global keys keep their encodings.
//!
//! The store is walked tenant by tenant and kind by kind, a page at a time,
//! and written in batches of bounded size, so neither the store nor one
//! tenant is ever in memory at once. A batch is atomic, but the migration as
//! a whole is not: after a crash it runs again from the start, and skips
//! every value that is not JSON (a JSON record starts with `{`, a protobuf
//! record of these messages never does: that would be field 15 with the
//! group wire type, which proto3 does not use).
//!
//! The migration sees the raw store, not the layer above it that splits
//! values over 64 KiB into chunks (a header under the record's key, the
//! bytes under `0x02` keys, see [`crate::layout`]): such a record is read
//! back from its chunks, and its converted value is written plain (its
//! chunks deleted) or, if still over 64 KiB, as chunks again in the same
//! format, in one batch.

mod convert;
mod v1_json;

#[cfg(test)]
mod tests;

use prost::Message;
use serde::de::DeserializeOwned;

use crate::layout::{
    KIND_CURRENT_ITEM, KIND_INTENDED_ITEM, KIND_TENANT, KIND_TYPE_SPEC, MAX_PLAIN_VALUE_BYTES,
    TENANT_SPACE, chunk_header, chunk_key, kind_prefix, parse_chunk_header, tenant_id_of,
    tenant_prefix,
};
use crate::{MigrationError, MigrationStore, Record};

/// Records read per page of a kind's scan.
const SCAN_PAGE: usize = 100;

/// The most writes (puts and deletes) in one batch: an etcd transaction
/// takes at most 128 operations.
const BATCH_WRITES: usize = 100;

/// The most bytes of keys and values in one batch. One record's writes are
/// never split (its chunks and header go together), so a batch holding a
/// single chunked record (up to 1 MiB) may exceed it.
const BATCH_BYTES: usize = 512 * 1024;

/// The largest chunked value the store holds (1 MiB): a header claiming
/// more is not trusted to size a buffer.
const MAX_CHUNKED_VALUE_BYTES: usize = 1024 * 1024;

/// The record kinds converted, what they are called in errors, and how.
const KINDS: [(u8, &str, Convert); 4] = [
    (KIND_TENANT, "tenant record", tenant),
    (KIND_INTENDED_ITEM, "intended item", intended),
    (KIND_CURRENT_ITEM, "current item", current),
    (KIND_TYPE_SPEC, "type spec", spec),
];

/// Converts one version 1 JSON value to its protobuf encoding.
type Convert = fn(&[u8]) -> Result<Vec<u8>, serde_json::Error>;

/// Rewrites every JSON tenant record, current item, intended item and type
/// spec as protobuf; see the module documentation.
pub(super) fn apply(store: &dyn MigrationStore) -> Result<(), MigrationError> {
    let mut batch = Batch::default();
    let mut after: Option<Vec<u8>> = None;
    let mut last_tenant = None;
    // One probe per tenant: its first key names it, then the walk skips
    // past every key it has (the kind bytes are all below 0xff).
    while let Some((key, _)) = store
        .scan_page(&[TENANT_SPACE], after.as_deref(), 1)?
        .into_iter()
        .next()
    {
        let Some(tenant) = tenant_id_of(&key).filter(|&id| last_tenant != Some(id)) else {
            // Too short to name a tenant, or a key of the tenant just done
            // that sorts after 0xff: nothing to convert.
            after = Some(key);
            continue;
        };
        for (kind, what, convert) in KINDS {
            convert_kind(store, &mut batch, tenant, kind, what, convert)?;
        }
        last_tenant = Some(tenant);
        after = Some([tenant_prefix(tenant).as_slice(), &[0xff]].concat());
    }
    batch.flush(store)
}

/// Converts every record of one kind of one tenant, a page at a time.
fn convert_kind(
    store: &dyn MigrationStore,
    batch: &mut Batch,
    tenant: u64,
    kind: u8,
    what: &str,
    convert: Convert,
) -> Result<(), MigrationError> {
    let prefix = kind_prefix(tenant, kind);
    if kind == KIND_TENANT {
        // The record is the prefix itself; nothing longer is one.
        if let Some(value) = store.get(&prefix)? {
            convert_record(store, batch, prefix, value, what, convert)?;
        }
        return Ok(());
    }
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = store.scan_page(&prefix, after.as_deref(), SCAN_PAGE)?;
        let complete = page.len() < SCAN_PAGE;
        after = page.last().map(|(key, _)| key.clone());
        for (key, value) in page {
            convert_record(store, batch, key, value, what, convert)?;
        }
        if complete {
            return Ok(());
        }
    }
}

/// Adds the writes that convert one stored value to `batch`, unless it is
/// not JSON (converted already).
fn convert_record(
    store: &dyn MigrationStore,
    batch: &mut Batch,
    key: Vec<u8>,
    stored: Vec<u8>,
    what: &str,
    convert: Convert,
) -> Result<(), MigrationError> {
    let (value, old_chunks) = match parse_chunk_header(&stored) {
        Some((count, length)) => (join_chunks(store, &key, count, length)?, count),
        None => (stored, 0),
    };
    if value.first() != Some(&b'{') {
        return Ok(());
    }
    let encoded = convert(&value).map_err(|error| MigrationError::Data {
        message: format!(
            "the {what} under key {} is not a valid version 1 JSON record: {error}",
            show_key(&key)
        ),
    })?;
    let mut writes = Writes::default();
    let new_chunks = if encoded.len() <= MAX_PLAIN_VALUE_BYTES {
        writes.put(key.clone(), encoded);
        0
    } else {
        let pieces: Vec<&[u8]> = encoded.chunks(MAX_PLAIN_VALUE_BYTES).collect();
        let count = u32::try_from(pieces.len()).unwrap_or(u32::MAX);
        for (index, piece) in (0..count).zip(pieces) {
            writes.put(chunk_key(&key, index), piece.to_vec());
        }
        writes.put(key.clone(), chunk_header(count, encoded.len()));
        count
    };
    for index in new_chunks..old_chunks {
        writes.deletes.push(chunk_key(&key, index));
    }
    batch.add(store, writes)
}

/// The whole value of a chunked record, read from its `count` chunks.
fn join_chunks(
    store: &dyn MigrationStore,
    key: &[u8],
    count: u32,
    length: u64,
) -> Result<Vec<u8>, MigrationError> {
    let length = usize::try_from(length).unwrap_or(usize::MAX);
    let mut whole = Vec::with_capacity(length.min(MAX_CHUNKED_VALUE_BYTES));
    for index in 0..count {
        let piece = store
            .get(&chunk_key(key, index))?
            .ok_or_else(|| MigrationError::Data {
                message: format!(
                    "chunk {index} of the value of key {} is missing",
                    show_key(key)
                ),
            })?;
        whole.extend_from_slice(&piece);
    }
    if whole.len() != length {
        return Err(MigrationError::Data {
            message: format!(
                "key {} should hold {length} bytes but its chunks hold {}",
                show_key(key),
                whole.len()
            ),
        });
    }
    Ok(whole)
}

/// A key for an operator: hex, then its bytes with non-printable ones
/// escaped (an item key shows its type and name).
fn show_key(key: &[u8]) -> String {
    let hex: String = key.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("0x{hex} (\"{}\")", key.escape_ascii())
}

/// Parses `value` as the version 1 JSON `J`, converts it, and encodes it.
fn reencode<J: DeserializeOwned, P: Message>(
    value: &[u8],
    convert: impl FnOnce(J) -> Result<P, serde_json::Error>,
) -> Result<Vec<u8>, serde_json::Error> {
    let parsed: J = serde_json::from_slice(value)?;
    Ok(convert(parsed)?.encode_to_vec())
}

/// A tenant record.
fn tenant(value: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    reencode(value, |record| Ok(convert::tenant(record)))
}

/// An intended item.
fn intended(value: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    reencode(value, convert::intended)
}

/// A current item.
fn current(value: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    reencode(value, convert::current)
}

/// A type spec.
fn spec(value: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    reencode(value, convert::spec)
}

/// The writes that convert one record: they go into one batch together.
#[derive(Default)]
struct Writes {
    /// Keys and their new values.
    puts: Vec<Record>,
    /// Chunk keys no longer used.
    deletes: Vec<Vec<u8>>,
}

impl Writes {
    /// Adds a put.
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.puts.push((key, value));
    }

    /// Puts and deletes.
    fn count(&self) -> usize {
        self.puts.len() + self.deletes.len()
    }

    /// Bytes of keys and values.
    fn bytes(&self) -> usize {
        let puts: usize = self.puts.iter().map(|(k, v)| k.len() + v.len()).sum();
        puts + self.deletes.iter().map(Vec::len).sum::<usize>()
    }
}

/// Writes collected until they reach a batch's bounds.
#[derive(Default)]
struct Batch {
    /// What the next `apply` writes.
    writes: Writes,
    /// `writes.bytes()`, kept up to date.
    bytes: usize,
}

impl Batch {
    /// Adds one record's writes, first applying what is collected if they
    /// would not fit with it.
    fn add(&mut self, store: &dyn MigrationStore, writes: Writes) -> Result<(), MigrationError> {
        let bytes = writes.bytes();
        if self.writes.count() + writes.count() > BATCH_WRITES || self.bytes + bytes > BATCH_BYTES {
            self.flush(store)?;
        }
        self.writes.puts.extend(writes.puts);
        self.writes.deletes.extend(writes.deletes);
        self.bytes += bytes;
        Ok(())
    }

    /// Applies what is collected, if anything.
    fn flush(&mut self, store: &dyn MigrationStore) -> Result<(), MigrationError> {
        let writes = std::mem::take(&mut self.writes);
        self.bytes = 0;
        if writes.count() == 0 {
            return Ok(());
        }
        store.apply(writes.puts, writes.deletes)
    }
}
