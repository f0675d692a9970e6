//! An item's properties: a JSON object kept as one sorted list.
//!
//! A `serde_json::Map` is a B-tree whose first node has room for eleven
//! entries (about 630 B) however few the object has, and most items have
//! a handful of properties while a tenant may hold a million items.
//! [`Properties`] keeps the entries in one allocation of exactly their
//! size, sorted by key: it iterates in the map's order (the keys' byte
//! order), so what users see is unchanged, and finds a key by binary
//! search. Keys of up to 24 bytes (nearly all) are kept inline, not in an
//! allocation of their own. Values, nested objects included, stay
//! `serde_json` values.

use std::fmt;

use compact_str::CompactString;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// The deepest nesting of property values accepted from a client: the
/// values of the properties object are at level 1.
pub const MAX_PROPERTY_DEPTH: usize = 64;

/// A JSON object with string keys, sorted by key, each key once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Properties {
    entries: Vec<(Key, Value)>,
}

/// A property key: inline up to 24 bytes.
type Key = CompactString;

impl Properties {
    /// An empty object.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the object has no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        let index = self.position(key).ok()?;
        self.entries.get(index).map(|(_, value)| value)
    }

    /// Sets `key` to `value`; returns the value it replaced.
    pub fn insert(&mut self, key: String, value: Value) -> Option<Value> {
        match self.position(&key) {
            Ok(index) => self
                .entries
                .get_mut(index)
                .map(|(_, old)| std::mem::replace(old, value)),
            Err(index) => {
                self.entries.insert(index, (key.into(), value));
                None
            }
        }
    }

    /// Removes `key`; returns its value.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let index = self.position(key).ok()?;
        Some(self.entries.remove(index).1)
    }

    /// Removes every key.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// The keys and values, in key order.
    pub fn iter(&self) -> <&Self as IntoIterator>::IntoIter {
        self.into_iter()
    }

    /// The keys and values, in key order, values changeable.
    pub fn iter_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = (&str, &mut Value)> + ExactSizeIterator {
        self.entries
            .iter_mut()
            .map(|(key, value)| (key.as_str(), value))
    }

    /// The values, in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Value> + ExactSizeIterator {
        self.entries.iter().map(|(_, value)| value)
    }

    /// The object as a `serde_json` value (a copy).
    pub fn to_value(&self) -> Value {
        Value::Object(
            self.entries
                .iter()
                .map(|(key, value)| (key.to_string(), value.clone()))
                .collect(),
        )
    }

    fn position(&self, key: &str) -> Result<usize, usize> {
        self.entries
            .binary_search_by(|(probe, _)| probe.as_str().cmp(key))
    }
}

impl<K: Into<Key>> FromIterator<(K, Value)> for Properties {
    /// Collects entries in any order; a key given twice keeps its last
    /// value, as inserting them one by one would.
    fn from_iter<I: IntoIterator<Item = (K, Value)>>(entries: I) -> Self {
        let mut entries: Vec<(Key, Value)> = entries
            .into_iter()
            .map(|(key, value)| (key.into(), value))
            .collect();
        let sorted = entries.windows(2).all(|pair| match pair {
            [(first, _), (second, _)] => first < second,
            _ => true,
        });
        if !sorted {
            // Stable: of equal keys, the last given stays last.
            entries.sort_by(|(a, _), (b, _)| a.cmp(b));
            let mut unique: Vec<(Key, Value)> = Vec::with_capacity(entries.len());
            for (key, value) in entries {
                match unique.last_mut() {
                    Some((last, kept)) if *last == key => *kept = value,
                    _ => unique.push((key, value)),
                }
            }
            entries = unique;
        }
        // Pushed one by one (as decoding does), the list has room to spare;
        // an item keeps its properties for as long as it lives.
        entries.shrink_to_fit();
        Self { entries }
    }
}

impl<'a> IntoIterator for &'a Properties {
    type Item = (&'a str, &'a Value);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (Key, Value)>,
        fn(&'a (Key, Value)) -> (&'a str, &'a Value),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.entries
            .iter()
            .map(|(key, value)| (key.as_str(), value))
    }
}

impl TryFrom<Value> for Properties {
    type Error = Value;

    /// The properties of a JSON object; anything else is handed back.
    fn try_from(value: Value) -> Result<Self, Value> {
        match value {
            Value::Object(map) => Ok(map.into()),
            other => Err(other),
        }
    }
}

impl From<Map<String, Value>> for Properties {
    fn from(map: Map<String, Value>) -> Self {
        // A map iterates in key order: no sorting needed.
        map.into_iter().collect()
    }
}

impl From<Properties> for Value {
    fn from(properties: Properties) -> Self {
        Value::Object(
            properties
                .entries
                .into_iter()
                .map(|(key, value)| (key.into_string(), value))
                .collect(),
        )
    }
}

impl Serialize for Properties {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.entries.len()))?;
        for (key, value) in &self.entries {
            map.serialize_entry(key.as_str(), value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Properties {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(PropertiesVisitor)
    }
}

/// Reads a JSON object into [`Properties`].
struct PropertiesVisitor;

impl<'de> Visitor<'de> for PropertiesVisitor {
    type Value = Properties;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Properties, A::Error> {
        // The hint is the sender's word: bound what it may reserve.
        let mut entries = Vec::with_capacity(access.size_hint().unwrap_or(0).min(64));
        while let Some(key) = access.next_key_seed(KeyVisitor)? {
            entries.push((key, access.next_value::<Value>()?));
        }
        Ok(entries.into_iter().collect())
    }
}

/// Reads a key straight into a [`Key`]: no `String` first (a short key
/// then takes no allocation at all, not even a passing one).
struct KeyVisitor;

impl<'de> serde::de::DeserializeSeed<'de> for KeyVisitor {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Key, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a property name")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Key, E> {
        Ok(Key::from(key))
    }

    fn visit_string<E: serde::de::Error>(self, key: String) -> Result<Key, E> {
        Ok(Key::from(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn entries_iterate_in_the_order_of_a_json_map_whatever_the_insertion_order() {
        let mut properties = Properties::new();
        for (key, value) in [("b", 1), ("a", 2), ("ab", 3), ("B", 4), ("a", 5)] {
            properties.insert(key.into(), json!(value));
        }
        let map: Map<String, Value> = [("b", 1), ("a", 2), ("ab", 3), ("B", 4), ("a", 5)]
            .into_iter()
            .map(|(key, value)| (key.to_owned(), json!(value)))
            .collect();
        let keys: Vec<&str> = properties.iter().map(|(key, _)| key).collect();
        assert_eq!(keys, map.keys().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(properties.get("a"), Some(&json!(5)), "the last value wins");
        assert_eq!(properties.to_value(), Value::Object(map.clone()));
        let collected: Properties = [("b", 1), ("a", 2), ("a", 5), ("B", 4), ("ab", 3)]
            .into_iter()
            .map(|(key, value)| (key.to_owned(), json!(value)))
            .collect();
        assert_eq!(collected, properties);
        assert_eq!(Properties::from(map), properties);
    }

    #[test]
    fn short_keys_take_no_allocation_of_their_own() {
        let long = "k".repeat(40);
        let properties: Properties = [("mtu", json!(1500)), (long.as_str(), json!(1))]
            .into_iter()
            .collect();
        let heap: Vec<bool> = properties
            .entries
            .iter()
            .map(|(key, _)| key.is_heap_allocated())
            .collect();
        assert_eq!(heap, [true, false], "the 40-byte key sorts first");
        assert_eq!(properties.get(&long), Some(&json!(1)));
        assert_eq!(properties.get("mtu"), Some(&json!(1500)));
    }

    #[test]
    fn json_text_round_trips_and_matches_a_maps() {
        let text = r#"{"z":{"nested":[1,2]},"a":"x","m":null,"a":"y"}"#;
        let properties: Properties = serde_json::from_str(text).expect("an object");
        let map: Map<String, Value> = serde_json::from_str(text).expect("an object");
        assert_eq!(
            serde_json::to_string(&properties).expect("serializes"),
            serde_json::to_string(&map).expect("serializes")
        );
        assert_eq!(properties.len(), 3);
        assert!(serde_json::from_str::<Properties>("[1]").is_err());
    }

    #[test]
    fn inserting_and_removing_keep_the_rest_in_order() {
        let mut properties: Properties = serde_json::from_value::<Properties>(json!({
            "a": 1, "c": 3
        }))
        .expect("an object");
        assert_eq!(properties.insert("a".into(), json!(10)), Some(json!(1)));
        assert_eq!(properties.insert("b".into(), json!(2)), None);
        assert_eq!(properties.to_value(), json!({"a": 10, "b": 2, "c": 3}));
        assert_eq!(properties.get("c"), Some(&json!(3)));
        assert_eq!(properties.get("z"), None);
        assert_eq!(properties.remove("b"), Some(json!(2)));
        assert_eq!(properties.remove("b"), None);
        assert_eq!(properties.to_value(), json!({"a": 10, "c": 3}));
    }
}
