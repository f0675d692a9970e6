//! An item's properties: a JSON object kept as one sorted list.
//!
//! A `serde_json::Map` is a B-tree whose first node has room for eleven
//! entries (about 630 B) however few the object has, and most items have
//! a handful of properties while a tenant may hold a million items.
//! [`Properties`] keeps the entries in one allocation of exactly their
//! size, sorted by key: it iterates in the map's order (the keys' byte
//! order), so what users see is unchanged, and finds a key by binary
//! search. Values, nested objects included, stay `serde_json` values.

use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// A JSON object with string keys, sorted by key, each key once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Properties {
    entries: Vec<(String, Value)>,
}

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
                self.entries.insert(index, (key, value));
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
    ) -> impl DoubleEndedIterator<Item = (&String, &mut Value)> + ExactSizeIterator {
        self.entries.iter_mut().map(|(key, value)| (&*key, value))
    }

    /// The values, in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Value> + ExactSizeIterator {
        self.entries.iter().map(|(_, value)| value)
    }

    /// The object as a `serde_json` value (a copy).
    pub fn to_value(&self) -> Value {
        Value::Object(self.entries.iter().cloned().collect())
    }

    fn position(&self, key: &str) -> Result<usize, usize> {
        self.entries
            .binary_search_by(|(probe, _)| probe.as_str().cmp(key))
    }
}

impl FromIterator<(String, Value)> for Properties {
    /// Collects entries in any order; a key given twice keeps its last
    /// value, as inserting them one by one would.
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(entries: I) -> Self {
        let mut entries: Vec<(String, Value)> = entries.into_iter().collect();
        let sorted = entries.windows(2).all(|pair| match pair {
            [(first, _), (second, _)] => first < second,
            _ => true,
        });
        if !sorted {
            // Stable: of equal keys, the last given stays last.
            entries.sort_by(|(a, _), (b, _)| a.cmp(b));
            let mut unique: Vec<(String, Value)> = Vec::with_capacity(entries.len());
            for (key, value) in entries {
                match unique.last_mut() {
                    Some((last, kept)) if *last == key => *kept = value,
                    _ => unique.push((key, value)),
                }
            }
            unique.shrink_to_fit();
            entries = unique;
        }
        Self { entries }
    }
}

impl<'a> IntoIterator for &'a Properties {
    type Item = (&'a String, &'a Value);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, Value)>,
        fn(&'a (String, Value)) -> (&'a String, &'a Value),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(key, value)| (key, value))
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
        Value::Object(properties.entries.into_iter().collect())
    }
}

impl Serialize for Properties {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.entries.len()))?;
        for (key, value) in &self.entries {
            map.serialize_entry(key, value)?;
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
        while let Some(entry) = access.next_entry::<String, Value>()? {
            entries.push(entry);
        }
        Ok(entries.into_iter().collect())
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
        let keys: Vec<&String> = properties.iter().map(|(key, _)| key).collect();
        assert_eq!(keys, map.keys().collect::<Vec<_>>());
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
