//! Item identities: `type/name`, one pointer wide, cheap to compare.
//!
//! A deep graph holds an identity per dependency, every graph keys its
//! items by one, and the planner looks them up in ordered and hashed maps
//! all the time. So an identity is one pointer to shared parts that carry
//! what most comparisons need without reading the texts: a hash of the
//! whole identity, and the first bytes of the name (as "German strings"
//! do). Identities cloned from one another compare by pointer.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use rustc_hash::FxHasher;
use serde::{Deserialize, Serialize};

/// How many leading bytes of a name an identity keeps beside it.
const NAME_PREFIX: usize = 16;

/// The identity of an item within a tenant: `type/name`.
///
/// Cloning is cheap (one reference count), so graphs and plans pass
/// identities around by value.
#[derive(Clone)]
pub struct ItemRef(Arc<Parts>);

struct Parts {
    /// The name's first bytes, zero-padded, read as two big-endian
    /// numbers: they order as the bytes do, and two integer comparisons
    /// replace a byte-wise one (two `u64`s, not one `u128`, which would
    /// align the parts to 16 bytes and grow every identity by 8). Zero
    /// padding orders like the text wherever two prefixes differ (a shorter
    /// name that is a prefix of a longer one pads with bytes no greater
    /// than the other's).
    name_prefix: [u64; 2],
    item_type: Arc<str>,
    name: Arc<str>,
    /// Hash of both texts, so hashing and most inequalities skip them.
    hash: u64,
}

impl ItemRef {
    /// Builds an identity from a type and a name.
    pub fn new(item_type: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        Self::from_parts(Arc::from(item_type.as_ref()), Arc::from(name.as_ref()))
    }

    /// Builds an identity from shared texts (no copy of them).
    pub fn from_parts(item_type: Arc<str>, name: Arc<str>) -> Self {
        let mut prefix = [0; NAME_PREFIX];
        let shown = name.len().min(NAME_PREFIX);
        prefix[..shown].copy_from_slice(&name.as_bytes()[..shown]);
        let (high, low) = prefix.split_at(NAME_PREFIX / 2);
        let half = |bytes: &[u8]| u64::from_be_bytes(bytes.try_into().unwrap_or_default());
        let name_prefix = [half(high), half(low)];
        let mut hasher = FxHasher::default();
        item_type.hash(&mut hasher);
        name.hash(&mut hasher);
        Self(Arc::new(Parts {
            name_prefix,
            hash: hasher.finish(),
            item_type,
            name,
        }))
    }

    /// This identity with `item_type` (the same text, another copy of it)
    /// as its type: itself when it already shares that copy. Graphs keep
    /// one copy of each type name this way.
    pub fn sharing_type(&self, item_type: &Arc<str>) -> Self {
        if Arc::ptr_eq(&self.0.item_type, item_type) {
            return self.clone();
        }
        debug_assert_eq!(*self.0.item_type, **item_type, "the same type text");
        self.rebuilt(item_type.clone(), self.0.name.clone())
    }

    /// An equal identity of its own, with a copy of the name (the type
    /// text stays shared).
    pub fn fresh_copy(&self) -> Self {
        self.rebuilt(self.0.item_type.clone(), Arc::from(&*self.0.name))
    }

    /// New parts holding texts equal to this identity's: the hash and the
    /// name's prefix are copied, not computed again.
    fn rebuilt(&self, item_type: Arc<str>, name: Arc<str>) -> Self {
        Self(Arc::new(Parts {
            name_prefix: self.0.name_prefix,
            item_type,
            name,
            hash: self.0.hash,
        }))
    }

    /// The item type, e.g. `interface`.
    pub fn item_type(&self) -> &Arc<str> {
        &self.0.item_type
    }

    /// The item name, unique within its type.
    pub fn name(&self) -> &Arc<str> {
        &self.0.name
    }

    /// Whether both are the same allocation (clones of one another), a
    /// cheaper test than equality that implies it.
    pub fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Default for ItemRef {
    fn default() -> Self {
        Self::new("", "")
    }
}

/// Two texts are equal when they share their allocation or their bytes.
fn same_text(left: &Arc<str>, right: &Arc<str>) -> bool {
    Arc::ptr_eq(left, right) || left == right
}

fn compare_texts(left: &Arc<str>, right: &Arc<str>) -> Ordering {
    if Arc::ptr_eq(left, right) {
        Ordering::Equal
    } else {
        left.cmp(right)
    }
}

impl Parts {
    /// Whether the name fits in the prefix (then the prefix and the length
    /// say everything about it).
    fn name_is_short(&self) -> bool {
        self.name.len() <= NAME_PREFIX
    }

    fn same_name(&self, other: &Self) -> bool {
        self.name.len() == other.name.len()
            && self.name_prefix == other.name_prefix
            && (self.name_is_short() || same_text(&self.name, &other.name))
    }

    fn compare_names(&self, other: &Self) -> Ordering {
        match self.name_prefix.cmp(&other.name_prefix) {
            Ordering::Equal if self.name_is_short() && other.name_is_short() => {
                self.name.len().cmp(&other.name.len())
            }
            Ordering::Equal => compare_texts(&self.name, &other.name),
            different => different,
        }
    }
}

impl PartialEq for ItemRef {
    fn eq(&self, other: &Self) -> bool {
        self.ptr_eq(other)
            || (self.0.hash == other.0.hash
                && self.0.same_name(&other.0)
                && same_text(&self.0.item_type, &other.0.item_type))
    }
}

impl Eq for ItemRef {}

/// Writes the stored hash of both texts, consistent with equality.
impl Hash for ItemRef {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.hash);
    }
}

/// By type, then by name, as the texts order.
impl Ord for ItemRef {
    fn cmp(&self, other: &Self) -> Ordering {
        if self.ptr_eq(other) {
            return Ordering::Equal;
        }
        compare_texts(&self.0.item_type, &other.0.item_type)
            .then_with(|| self.0.compare_names(&other.0))
    }
}

impl PartialOrd for ItemRef {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for ItemRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.0.item_type, self.0.name)
    }
}

impl fmt::Debug for ItemRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The fields of an identity as stored and shown in JSON.
#[derive(Serialize, Deserialize)]
struct ItemRefFields<T> {
    item_type: T,
    name: T,
}

impl Serialize for ItemRef {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ItemRefFields {
            item_type: &*self.0.item_type,
            name: &*self.0.name,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ItemRef {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let fields = ItemRefFields::<Arc<str>>::deserialize(deserializer)?;
        Ok(Self::from_parts(fields.item_type, fields.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Names around the prefix's length, from few letters (so prefixes
    /// collide) with NUL and multi-byte characters among them.
    fn name() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![Just("a"), Just("b"), Just("\0"), Just("é")],
            0..=20,
        )
        .prop_map(|parts| parts.concat())
    }

    fn identity() -> impl Strategy<Value = (String, String)> {
        (
            prop_oneof![Just("t"), Just("u"), Just("t\0")].prop_map(String::from),
            name(),
        )
    }

    fn hash_of(item: &ItemRef) -> u64 {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        item.hash(&mut hasher);
        hasher.finish()
    }

    proptest! {
        #[test]
        fn identities_compare_as_their_texts(left in identity(), right in identity()) {
            let (a, b) = (ItemRef::new(&left.0, &left.1), ItemRef::new(&right.0, &right.1));
            prop_assert_eq!(a.cmp(&b), left.cmp(&right));
            prop_assert_eq!(a == b, left == right);
            if a == b {
                prop_assert_eq!(hash_of(&a), hash_of(&b));
            }
            // Rebuilt parts keep the hash and prefix of the texts they copy.
            let copy = a.fresh_copy();
            prop_assert!(copy == a && !copy.ptr_eq(&a));
            prop_assert_eq!(hash_of(&copy), hash_of(&a));
            prop_assert_eq!(copy.cmp(&b), left.cmp(&right));
            let typed = ItemRef::new(&left.0, &left.1).sharing_type(a.item_type());
            prop_assert!(Arc::ptr_eq(typed.item_type(), a.item_type()));
            prop_assert_eq!(&typed, &a);
            prop_assert_eq!(hash_of(&typed), hash_of(&a));
            let shared = ItemRef::from_parts(a.item_type().clone(), b.name().clone());
            prop_assert_eq!(shared.cmp(&b), left.0.cmp(&right.0).then(Ordering::Equal));
        }
    }

    #[test]
    fn identities_order_by_type_then_name() {
        let mut refs = [
            ItemRef::new("b", "a"),
            ItemRef::new("a", "z"),
            ItemRef::new("a", "b"),
        ];
        refs.sort();
        let shown: Vec<String> = refs.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["a/b", "a/z", "b/a"]);
    }
}
