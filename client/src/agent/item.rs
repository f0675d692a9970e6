//! The SDK's item model: what a configurator receives, converted from the
//! proto `Item` at the SDK's boundary.

use std::fmt;

use reconciled_proto::v1;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::convert::{properties_from_struct, properties_to_struct};

/// The identity of an item: its type and name, written `type/name`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ItemRef {
    /// The item type, e.g. `"file"`.
    pub item_type: String,
    /// The item name, unique among items of its type.
    pub name: String,
}

impl ItemRef {
    /// The identity `item_type/name`.
    pub fn new(item_type: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            item_type: item_type.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ItemRef {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}/{}", self.item_type, self.name)
    }
}

impl From<v1::ItemRef> for ItemRef {
    fn from(item: v1::ItemRef) -> Self {
        Self::new(item.r#type, item.name)
    }
}

impl From<ItemRef> for v1::ItemRef {
    fn from(item: ItemRef) -> Self {
        Self {
            r#type: item.item_type,
            name: item.name,
        }
    }
}

/// A "must exist" edge from an item to the item it requires (see
/// `reconciled.v1.Dependency`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dependency {
    /// The required item.
    pub requires: ItemRef,
    /// A CEL predicate over the required item (`self`); empty: none.
    pub must_satisfy: String,
    /// Why the dependency exists (not part of item equality).
    pub description: String,
    /// Recreate the dependent whenever the required item is modified.
    pub recreate_when_modified: bool,
    /// When the required external item disappears, the dependent is dropped
    /// without a Delete.
    pub auto_deleted_by_external: bool,
}

impl Dependency {
    /// A plain dependency on `requires`.
    pub fn on(requires: ItemRef) -> Self {
        Self {
            requires,
            ..Self::default()
        }
    }
}

impl From<v1::Dependency> for Dependency {
    fn from(dependency: v1::Dependency) -> Self {
        Self {
            requires: dependency.requires.map(ItemRef::from).unwrap_or_default(),
            must_satisfy: dependency.must_satisfy,
            description: dependency.description,
            recreate_when_modified: dependency.recreate_when_modified,
            auto_deleted_by_external: dependency.auto_deleted_by_external,
        }
    }
}

impl From<Dependency> for v1::Dependency {
    fn from(dependency: Dependency) -> Self {
        Self {
            requires: Some(dependency.requires.into()),
            must_satisfy: dependency.must_satisfy,
            description: dependency.description,
            recreate_when_modified: dependency.recreate_when_modified,
            auto_deleted_by_external: dependency.auto_deleted_by_external,
        }
    }
}

/// A configuration item: its identity, its properties (a JSON object) and
/// its dependencies. Configurators receive it converted from the proto
/// `Item`; [`Item::new`] and the `with_*` methods build one (for intents and
/// external reports).
///
/// ```
/// use reconciled_client::agent::{Item, ItemRef};
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct File {
///     path: String,
///     mode: u32,
/// }
///
/// let item = Item::new("file", "motd")
///     .with_property("path", "etc/motd")
///     .with_property("mode", 420)
///     .depends_on(ItemRef::new("directory", "etc"));
/// let file: File = item.properties_as()?;
/// assert_eq!((file.path.as_str(), file.mode), ("etc/motd", 0o644));
/// # Ok::<(), reconciled_client::agent::PropertiesError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Item {
    /// The item type; with `name`, the item's identity.
    pub item_type: String,
    /// The item name.
    pub name: String,
    /// The item's configuration.
    pub properties: Map<String, Value>,
    /// The items this item requires.
    pub dependencies: Vec<Dependency>,
    /// Whether the item is external (reported, never operated on).
    pub external: bool,
    /// The subgraph path where the item is listed; empty: the root.
    pub subgraph: String,
    /// A short label for displays.
    pub label: String,
    /// A free-form description.
    pub description: String,
}

/// The properties of an item do not have the shape a configurator expects.
#[derive(Debug, thiserror::Error)]
#[error(
    "properties of {item} do not match the expected shape: {source}; fix the item's \
     properties in the intent"
)]
pub struct PropertiesError {
    /// The item.
    pub item: ItemRef,
    /// What serde said.
    #[source]
    pub source: serde_json::Error,
}

impl Item {
    /// An item with no properties or dependencies.
    pub fn new(item_type: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            item_type: item_type.into(),
            name: name.into(),
            ..Self::default()
        }
    }

    /// The item's identity.
    pub fn item_ref(&self) -> ItemRef {
        ItemRef::new(self.item_type.clone(), self.name.clone())
    }

    /// The property `key`, if set.
    pub fn property(&self, key: &str) -> Option<&Value> {
        self.properties.get(key)
    }

    /// Deserializes the properties into `T` (any `serde` type whose shape
    /// matches the JSON object).
    pub fn properties_as<T: DeserializeOwned>(&self) -> Result<T, PropertiesError> {
        T::deserialize(Value::Object(self.properties.clone())).map_err(|source| PropertiesError {
            item: self.item_ref(),
            source,
        })
    }

    /// Sets property `key` to `value`.
    pub fn with_property(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.properties.insert(key.into(), value.into());
        self
    }

    /// Replaces the properties with `properties` serialized through serde;
    /// fails unless it serializes to a JSON object.
    pub fn with_properties(mut self, properties: &impl Serialize) -> Result<Self, PropertiesError> {
        let item = self.item_ref();
        match serde_json::to_value(properties) {
            Ok(Value::Object(map)) => {
                self.properties = map;
                Ok(self)
            }
            Ok(other) => Err(PropertiesError {
                item,
                source: serde::de::Error::custom(format!(
                    "properties must serialize to a JSON object, not {other}"
                )),
            }),
            Err(source) => Err(PropertiesError { item, source }),
        }
    }

    /// Adds a plain dependency on `requires`.
    pub fn depends_on(self, requires: ItemRef) -> Self {
        self.with_dependency(Dependency::on(requires))
    }

    /// Adds a dependency.
    pub fn with_dependency(mut self, dependency: Dependency) -> Self {
        self.dependencies.push(dependency);
        self
    }

    /// Lists the item in `subgraph`.
    pub fn in_subgraph(mut self, subgraph: impl Into<String>) -> Self {
        self.subgraph = subgraph.into();
        self
    }

    /// Sets the display label.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// Marks the item external.
    pub fn external(mut self) -> Self {
        self.external = true;
        self
    }
}

impl From<v1::Item> for Item {
    fn from(item: v1::Item) -> Self {
        Self {
            item_type: item.r#type,
            name: item.name,
            properties: item
                .properties
                .map(properties_from_struct)
                .unwrap_or_default(),
            dependencies: item
                .dependencies
                .into_iter()
                .map(Dependency::from)
                .collect(),
            external: item.external,
            subgraph: item.subgraph,
            label: item.label,
            description: item.description,
        }
    }
}

impl From<Item> for v1::Item {
    fn from(item: Item) -> Self {
        Self {
            r#type: item.item_type,
            name: item.name,
            properties: Some(properties_to_struct(&item.properties)),
            dependencies: item
                .dependencies
                .into_iter()
                .map(v1::Dependency::from)
                .collect(),
            external: item.external,
            subgraph: item.subgraph,
            label: item.label,
            description: item.description,
        }
    }
}

/// A report about an external item, sent with
/// [`AgentHandle::report_external`](crate::agent::AgentHandle::report_external).
#[derive(Debug, Clone, PartialEq)]
pub enum ExternalReport {
    /// The external item exists with this value (created or updated).
    Put {
        /// The item's value; `external` is set on the wire regardless.
        item: Item,
        /// Its content changed in a way dependents with
        /// `recreate_when_modified` must see.
        modified: bool,
    },
    /// The external item no longer exists.
    Delete {
        /// The item that disappeared.
        item: ItemRef,
    },
}

impl ExternalReport {
    /// The external item exists with value `item`.
    pub fn put(item: Item) -> Self {
        Self::Put {
            item,
            modified: false,
        }
    }

    /// The external item exists with value `item`, and changed in a way that
    /// dependents with `recreate_when_modified` must see.
    pub fn modified(item: Item) -> Self {
        Self::Put {
            item,
            modified: true,
        }
    }

    /// The external item `item` no longer exists.
    pub fn delete(item: ItemRef) -> Self {
        Self::Delete { item }
    }
}

impl From<ExternalReport> for v1::ExternalReport {
    fn from(report: ExternalReport) -> Self {
        match report {
            ExternalReport::Put { item, modified } => {
                let mut item = v1::Item::from(item);
                item.external = true;
                Self {
                    change: Some(v1::external_report::Change::Put(item)),
                    modified,
                }
            }
            ExternalReport::Delete { item } => Self {
                change: Some(v1::external_report::Change::Delete(item.into())),
                modified: false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    struct FileProperties {
        path: String,
        #[serde(default)]
        content: String,
        mode: u32,
    }

    #[test]
    fn an_item_survives_a_round_trip_through_proto() {
        let item = Item::new("file", "motd")
            .with_property("path", "etc/motd")
            .with_property("mode", 420)
            .with_property("tags", json!(["a", {"b": 2.5}]))
            .with_dependency(Dependency {
                requires: ItemRef::new("directory", "etc"),
                must_satisfy: "self.path != \"\"".into(),
                description: "lives in etc".into(),
                recreate_when_modified: true,
                auto_deleted_by_external: false,
            })
            .in_subgraph("site/a")
            .with_label("motd");
        let wire = v1::Item::from(item.clone());
        assert_eq!(wire.r#type, "file");
        assert_eq!(
            wire.dependencies[0]
                .requires
                .as_ref()
                .map(|r| r.name.as_str()),
            Some("etc")
        );
        assert_eq!(Item::from(wire), item);
    }

    #[test]
    fn properties_deserialize_into_a_typed_struct() {
        let item = Item::new("file", "motd")
            .with_property("path", "etc/motd")
            .with_property("mode", 420);
        let properties: FileProperties = item.properties_as().expect("matching shape");
        assert_eq!(
            properties,
            FileProperties {
                path: "etc/motd".into(),
                content: String::new(),
                mode: 0o644
            }
        );
    }

    #[test]
    fn a_shape_mismatch_names_the_item_and_the_field() {
        let item = Item::new("file", "motd").with_property("path", 7);
        let error = item
            .properties_as::<FileProperties>()
            .expect_err("path is not a string");
        let text = error.to_string();
        assert!(text.contains("file/motd"), "{text}");
        assert!(
            text.contains("expected a string") || text.contains("invalid type"),
            "{text}"
        );
    }

    #[test]
    fn with_properties_serializes_a_struct_and_rejects_non_objects() {
        #[derive(Serialize)]
        struct Directory {
            path: &'static str,
        }
        let item = Item::new("directory", "etc")
            .with_properties(&Directory { path: "etc" })
            .expect("an object");
        assert_eq!(item.property("path"), Some(&json!("etc")));
        assert!(Item::new("directory", "etc").with_properties(&3).is_err());
    }

    #[test]
    fn external_reports_mark_items_external_on_the_wire() {
        let wire = v1::ExternalReport::from(ExternalReport::modified(Item::new("link", "uplink")));
        assert!(wire.modified);
        match wire.change {
            Some(v1::external_report::Change::Put(item)) => assert!(item.external),
            other => panic!("unexpected change {other:?}"),
        }
        let wire = v1::ExternalReport::from(ExternalReport::delete(ItemRef::new("link", "uplink")));
        assert!(matches!(
            wire.change,
            Some(v1::external_report::Change::Delete(_))
        ));
    }
}
