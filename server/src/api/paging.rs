//! Page tokens: opaque to users, they name the revision a listing started
//! at and the last key returned, so every page of a listing comes from one
//! snapshot.

use crate::graph::ItemRef;

/// Where a paged listing stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageToken {
    /// Which listing the token continues: a fingerprint of the tenant and
    /// the query (view, subgraph), so that a token is refused by another
    /// tenant or another query instead of resuming at a foreign key.
    pub listing: u64,
    /// The revision every page comes from.
    pub revision: u64,
    /// The last item returned.
    pub after: ItemRef,
}

impl PageToken {
    /// Encodes the token as hex text
    /// (`<listing>:<revision>:<type>\0<name>`).
    pub fn encode(&self) -> String {
        let raw = format!(
            "{:016x}:{}:{}\0{}",
            self.listing,
            self.revision,
            self.after.item_type(),
            self.after.name()
        );
        raw.bytes().map(|byte| format!("{byte:02x}")).collect()
    }

    /// Decodes a token made by [`PageToken::encode`].
    pub fn decode(token: &str) -> Option<Self> {
        let bytes = decode_hex(token)?;
        let raw = String::from_utf8(bytes).ok()?;
        let (listing, rest) = raw.split_once(':')?;
        let (revision, key) = rest.split_once(':')?;
        let (item_type, name) = key.split_once('\0')?;
        if listing.len() != 16 {
            return None;
        }
        Some(Self {
            listing: u64::from_str_radix(listing, 16).ok()?,
            revision: revision.parse().ok()?,
            after: ItemRef::new(item_type, name),
        })
    }
}

/// The fingerprint of a listing: FNV-1a over its parts (stable across
/// builds, unlike `DefaultHasher`), each part length-prefixed.
pub fn listing_fingerprint(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for byte in bytes {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for part in parts {
        feed(&(part.len() as u64).to_be_bytes());
        feed(part);
    }
    hash
}

/// Encodes a plain text key (e.g. a tenant name) as a page token.
pub fn encode_text(text: &str) -> String {
    text.bytes().map(|byte| format!("{byte:02x}")).collect()
}

/// Decodes [`encode_text`].
pub fn decode_text(token: &str) -> Option<String> {
    String::from_utf8(decode_hex(token)?).ok()
}

fn decode_hex(token: &str) -> Option<Vec<u8>> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    (0..token.len())
        .step_by(2)
        .map(|index| u8::from_str_radix(token.get(index..index + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_reject_garbage() {
        let token = PageToken {
            listing: listing_fingerprint(&[b"tenant", b"view"]),
            revision: 42,
            after: ItemRef::new("iface", "eth0:1"),
        };
        assert_eq!(PageToken::decode(&token.encode()), Some(token));
        assert_eq!(PageToken::decode("zz"), None);
        assert_eq!(PageToken::decode("abc"), None);
        assert_eq!(
            decode_text(&encode_text("tenant-a")),
            Some("tenant-a".into())
        );
    }
}
