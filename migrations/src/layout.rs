//! The key layout as the migrations know it.
//!
//! These bytes are part of the on-disk format: the server's key builders
//! (`reconciled::store::keys`) use them, and no released value may change.
//! Global keys start with `0x00`, tenant keys with `0x01`.

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
