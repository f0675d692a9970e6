//! The key layout as the migrations know it.
//!
//! These bytes are part of the on-disk format: the server's key builders
//! (`reconciled::store::keys`) use them, and no released value may change.
//! Global keys start with `0x00`, tenant keys with `0x01`, the chunks of
//! values too large for one key with `0x02`.

/// The key holding the schema version as 4 bytes big-endian. Absent means
/// version 0 (an empty, never migrated database).
pub const SCHEMA_VERSION_KEY: &[u8] = b"\x00schema_version";

/// The key holding the next internal tenant id as 8 bytes big-endian.
pub const NEXT_TENANT_ID_KEY: &[u8] = b"\x00next_tenant_id";

/// The first internal tenant id handed out (0 is never used).
pub const FIRST_TENANT_ID: u64 = 1;

/// Encodes a schema version for [`SCHEMA_VERSION_KEY`].
pub fn encode_version(version: u32) -> Vec<u8> {
    version.to_be_bytes().to_vec()
}

/// Decodes the value of [`SCHEMA_VERSION_KEY`], or `None` if it is not 4 bytes.
pub fn decode_version(bytes: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(bytes).ok().map(u32::from_be_bytes)
}

/// The first byte of every tenant key: `0x01`, the tenant id (8 bytes
/// big-endian), a record kind byte, then the rest of the key.
pub const TENANT_SPACE: u8 = 0x01;

/// The length of a tenant's key prefix: [`TENANT_SPACE`] and the 8-byte id.
/// The record kind byte follows it.
pub const TENANT_PREFIX_LEN: usize = 9;

/// Record kind of the tenant record itself (key: tenant prefix and this
/// byte, nothing after it).
pub const KIND_TENANT: u8 = 0x01;

/// Record kind of an intended item (key: ... this byte, `type 0x00 name`).
pub const KIND_INTENDED_ITEM: u8 = 0x02;

/// Record kind of a current item (key: ... this byte, `type 0x00 name`).
pub const KIND_CURRENT_ITEM: u8 = 0x03;

/// Record kind of a stored item type spec (key: ... this byte, the type).
pub const KIND_TYPE_SPEC: u8 = 0x04;

/// Record kind of a chunk of the tenant's event log (key: ... this byte, the
/// revision as u64 BE, the chunk as u32 BE). Event values are protobuf.
pub const KIND_EVENT: u8 = 0x05;

/// The prefix of every key of tenant `tenant_id`.
pub fn tenant_prefix(tenant_id: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(TENANT_PREFIX_LEN + 1);
    key.push(TENANT_SPACE);
    key.extend_from_slice(&tenant_id.to_be_bytes());
    key
}

/// The prefix of every record of `kind` of tenant `tenant_id`.
pub fn kind_prefix(tenant_id: u64, kind: u8) -> Vec<u8> {
    let mut key = tenant_prefix(tenant_id);
    key.push(kind);
    key
}

/// The tenant id of a tenant key, or `None` for any other key.
pub fn tenant_id_of(key: &[u8]) -> Option<u64> {
    let rest = key.strip_prefix(&[TENANT_SPACE])?;
    let (id, _) = rest.split_first_chunk::<8>()?;
    Some(u64::from_be_bytes(*id))
}

/// The largest value stored under one key, in bytes (64 KiB). A larger
/// record is stored chunked: a header under its key, the bytes under
/// [`chunk_key`]s, at most this many per chunk.
pub const MAX_PLAIN_VALUE_BYTES: usize = 64 * 1024;

/// The first byte of every chunk key.
pub const CHUNK_SPACE: u8 = 0x02;

/// What the key of a chunked value holds first: this marker, then the number
/// of chunks (u32 BE) and the value's length (u64 BE), nothing else.
pub const CHUNK_HEADER_MARKER: &[u8] = b"\0reconciled chunked value\0";

/// The length of a chunked value's header.
pub const CHUNK_HEADER_LEN: usize = CHUNK_HEADER_MARKER.len() + 4 + 8;

/// The key of chunk `index` of the chunked value of `key`: [`CHUNK_SPACE`],
/// the key's length (u32 BE), the key, the index (u32 BE).
pub fn chunk_key(key: &[u8], index: u32) -> Vec<u8> {
    let length = u32::try_from(key.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(1 + 4 + key.len() + 4);
    out.push(CHUNK_SPACE);
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&index.to_be_bytes());
    out
}

/// The header stored under the key of a value of `length` bytes kept as
/// `count` chunks.
pub fn chunk_header(count: u32, length: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(CHUNK_HEADER_LEN);
    out.extend_from_slice(CHUNK_HEADER_MARKER);
    out.extend_from_slice(&count.to_be_bytes());
    out.extend_from_slice(&u64::try_from(length).unwrap_or(u64::MAX).to_be_bytes());
    out
}

/// The chunk count and value length of a chunked value's header, or `None`
/// if `value` is not one.
pub fn parse_chunk_header(value: &[u8]) -> Option<(u32, u64)> {
    if value.len() != CHUNK_HEADER_LEN {
        return None;
    }
    let rest = value.strip_prefix(CHUNK_HEADER_MARKER)?;
    let (count, length) = rest.split_first_chunk::<4>()?;
    let length: [u8; 8] = length.try_into().ok()?;
    Some((u32::from_be_bytes(*count), u64::from_be_bytes(length)))
}
