//! The writes of a staged commit, coalesced and encoded into chunks.
//!
//! A chunk is a sequence of writes: a tag byte (`1` put, `0` delete), the
//! key's length (u32 BE) and the key, and for a put the value's length
//! (u32 BE) and the value. Each write lands whole in one chunk.

use std::collections::HashMap;

use crate::store::{StoreError, Write};

/// The final state of one key after a batch: `Some(value)` put, `None`
/// deleted.
pub(crate) type KeyWrite = (Vec<u8>, Option<Vec<u8>>);

/// Bytes a write adds to a request besides its key and value (operation
/// and length headers, the roll-in's compare).
pub(crate) const WRITE_OVERHEAD: usize = 48;

/// The writes of a batch, one per key, the last write to a key winning
/// (etcd refuses a transaction that writes a key twice). Keys keep the
/// order of their first write.
pub(crate) fn coalesce(writes: Vec<Write>) -> Vec<KeyWrite> {
    let mut index: HashMap<Vec<u8>, usize> = HashMap::with_capacity(writes.len());
    let mut out: Vec<KeyWrite> = Vec::with_capacity(writes.len());
    for write in writes {
        let (key, value) = match write {
            Write::Put { key, value } => (key, Some(value)),
            Write::Delete { key } => (key, None),
        };
        match index.get(&key) {
            Some(&at) => out[at].1 = value,
            None => {
                index.insert(key.clone(), out.len());
                out.push((key, value));
            }
        }
    }
    out
}

/// The size a write takes in a request.
pub(crate) fn write_bytes((key, value): &KeyWrite) -> usize {
    key.len() + value.as_ref().map_or(0, Vec::len) + WRITE_OVERHEAD
}

/// Encodes `writes` into chunks of at most `chunk_bytes` each (a single
/// write larger than that gets a chunk of its own).
pub(crate) fn encode_chunks(writes: &[KeyWrite], chunk_bytes: usize) -> Vec<Vec<u8>> {
    let mut chunks = Vec::new();
    let mut chunk: Vec<u8> = Vec::new();
    for (key, value) in writes {
        let size = 1 + 4 + key.len() + value.as_ref().map_or(0, |v| 4 + v.len());
        if !chunk.is_empty() && chunk.len() + size > chunk_bytes {
            chunks.push(std::mem::take(&mut chunk));
        }
        chunk.push(u8::from(value.is_some()));
        push_bytes(&mut chunk, key);
        if let Some(value) = value {
            push_bytes(&mut chunk, value);
        }
    }
    if !chunk.is_empty() {
        chunks.push(chunk);
    }
    chunks
}

fn push_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let length = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(bytes);
}

/// Decodes one chunk back into its writes.
pub(crate) fn decode_chunk(mut chunk: &[u8]) -> Result<Vec<KeyWrite>, StoreError> {
    let mut writes = Vec::new();
    while let Some((&tag, rest)) = chunk.split_first() {
        let (key, rest) = take_bytes(rest)?;
        let (value, rest) = match tag {
            1 => {
                let (value, rest) = take_bytes(rest)?;
                (Some(value.to_vec()), rest)
            }
            0 => (None, rest),
            _ => return Err(malformed("an unknown write tag")),
        };
        writes.push((key.to_vec(), value));
        chunk = rest;
    }
    Ok(writes)
}

fn take_bytes(input: &[u8]) -> Result<(&[u8], &[u8]), StoreError> {
    let (length, rest) = input
        .split_first_chunk::<4>()
        .ok_or_else(|| malformed("a truncated length"))?;
    let length = usize::try_from(u32::from_be_bytes(*length))
        .map_err(|_| malformed("a length too large for this platform"))?;
    if rest.len() < length {
        return Err(malformed("a truncated key or value"));
    }
    Ok(rest.split_at(length))
}

fn malformed(what: &str) -> StoreError {
    StoreError::Backend {
        operation: "read a staged commit",
        message: format!("a staged chunk holds {what}; the etcd key space was changed by hand"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_write_to_a_key_wins() {
        let writes = vec![
            Write::Put {
                key: b"a".to_vec(),
                value: b"1".to_vec(),
            },
            Write::Delete { key: b"b".to_vec() },
            Write::Delete { key: b"a".to_vec() },
            Write::Put {
                key: b"b".to_vec(),
                value: b"2".to_vec(),
            },
        ];
        assert_eq!(
            coalesce(writes),
            vec![(b"a".to_vec(), None), (b"b".to_vec(), Some(b"2".to_vec()))]
        );
    }

    #[test]
    fn chunks_decode_to_the_writes_and_respect_their_size() {
        let writes: Vec<KeyWrite> = (0..100u32)
            .map(|i| {
                let value = (i % 3 != 0).then(|| vec![i as u8; 300]);
                (i.to_be_bytes().to_vec(), value)
            })
            .collect();
        let chunks = encode_chunks(&writes, 1000);
        assert!(chunks.len() > 10);
        assert!(chunks.iter().all(|chunk| chunk.len() <= 1000));
        let decoded: Vec<KeyWrite> = chunks
            .iter()
            .flat_map(|chunk| decode_chunk(chunk).expect("decodes"))
            .collect();
        assert_eq!(decoded, writes);
        assert!(decode_chunk(&[1, 0, 0, 0, 9, 1]).is_err());
    }
}
