//! Item identities, items, dependencies and intended items, both ways.

use std::fmt::Display;

use reconciled_proto::v1;

use crate::graph::validate::FieldViolation;
use crate::graph::{Dependency, IntendedItem, Item, ItemRef, Properties};

use super::properties::{properties_from_struct, properties_to_struct};

/// Converts an identity to its proto form.
pub fn item_ref_to_proto(item: &ItemRef) -> v1::ItemRef {
    v1::ItemRef {
        r#type: item.item_type().to_string(),
        name: item.name().to_string(),
    }
}

/// Converts a proto identity. Names are checked by validation, not here.
pub fn item_ref_from_proto(item: v1::ItemRef) -> ItemRef {
    ItemRef::new(item.r#type, item.name)
}

/// Converts the `index`-th item of a request's `items` field; violations
/// carry paths under `items[index]`.
pub fn item_from_proto(item: v1::Item, index: usize) -> Result<Item, Vec<FieldViolation>> {
    item_from_proto_at(item, format_args!("items[{index}]"))
}

/// Converts an item received at field `path` (e.g. `reports[2].put`):
/// absent properties are an empty object; a dependency without `requires`
/// is a violation at `{path}.dependencies[k].requires`. Every violation of
/// the item is returned, not only the first. The path is written out only
/// for a violation.
pub fn item_from_proto_at(item: v1::Item, path: impl Display) -> Result<Item, Vec<FieldViolation>> {
    let mut violations = Vec::new();
    let properties = match item.properties {
        None => Properties::new(),
        Some(value) => properties_from_struct(value, format_args!("{path}.properties"))
            .unwrap_or_else(|violation| {
                violations.push(violation);
                Properties::new()
            }),
    };
    let mut dependencies = Vec::with_capacity(item.dependencies.len());
    for (index, dependency) in item.dependencies.into_iter().enumerate() {
        match dependency_from_proto(dependency, format_args!("{path}.dependencies[{index}]")) {
            Ok(dependency) => dependencies.push(dependency),
            Err(violation) => violations.push(violation),
        }
    }
    if !violations.is_empty() {
        return Err(violations);
    }
    let mut decoded = Item::identified(ItemRef::new(item.r#type, item.name))
        .with_label(item.label)
        .with_description(item.description);
    decoded.properties = properties;
    decoded.dependencies = dependencies;
    decoded.external = item.external;
    decoded.subgraph = item.subgraph.into();
    Ok(decoded)
}

fn dependency_from_proto(
    dependency: v1::Dependency,
    path: impl Display,
) -> Result<Dependency, FieldViolation> {
    let requires = dependency.requires.ok_or_else(|| {
        FieldViolation::new(
            format!("{path}.requires"),
            "is missing; name the required item with its type and name",
        )
    })?;
    Ok(Dependency::on(item_ref_from_proto(requires))
        .with_must_satisfy(dependency.must_satisfy)
        .with_description(dependency.description)
        .with_recreate_when_modified(dependency.recreate_when_modified)
        .with_auto_deleted_by_external(dependency.auto_deleted_by_external))
}

/// Converts an item to its proto form.
pub fn item_to_proto(item: &Item) -> v1::Item {
    v1::Item {
        r#type: item.item_type().to_string(),
        name: item.name().to_string(),
        properties: Some(properties_to_struct(&item.properties)),
        dependencies: item.dependencies.iter().map(dependency_to_proto).collect(),
        external: item.external,
        subgraph: item.subgraph.to_string(),
        label: item.label().to_owned(),
        description: item.description().to_owned(),
    }
}

fn dependency_to_proto(dependency: &Dependency) -> v1::Dependency {
    v1::Dependency {
        requires: Some(item_ref_to_proto(&dependency.requires)),
        must_satisfy: dependency.must_satisfy().to_string(),
        description: dependency.description().to_string(),
        recreate_when_modified: dependency.recreate_when_modified(),
        auto_deleted_by_external: dependency.auto_deleted_by_external(),
    }
}

/// Converts an intended item (value and generation) to its proto form.
pub fn intended_item_to_proto(intended: &IntendedItem) -> v1::IntendedItem {
    v1::IntendedItem {
        item: Some(item_to_proto(&intended.item)),
        generation: intended.generation,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::wire::testkit::{number, object, props, proto_ref};

    #[test]
    fn items_convert_both_ways() {
        let mut item = Item::new("vlan", "10", props(json!({"id": 10, "ports": ["a", "b"]})))
            .depends_on(
                Dependency::on(ItemRef::new("port", "a"))
                    .with_must_satisfy("self.up")
                    .with_description("needs the port")
                    .with_recreate_when_modified(true),
            )
            .with_label("VLAN 10")
            .with_description("test");
        item.subgraph = "net/vlans".into();
        let wire = item_to_proto(&item);
        assert_eq!(wire.r#type, "vlan");
        assert_eq!(wire.dependencies[0].requires, Some(proto_ref("port", "a")));
        assert_eq!(item_from_proto(wire, 0), Ok(item));
    }

    #[test]
    fn absent_properties_are_an_empty_object() {
        let wire = v1::Item {
            r#type: "t".into(),
            name: "n".into(),
            ..v1::Item::default()
        };
        let item = item_from_proto(wire, 0);
        assert_eq!(item.map(|i| i.properties), Ok(Properties::new()));
    }

    #[test]
    fn every_item_violation_is_reported_with_its_path() {
        let wire = v1::Item {
            r#type: "t".into(),
            name: "n".into(),
            properties: Some(object(vec![("x", number(f64::INFINITY))])),
            dependencies: vec![
                v1::Dependency {
                    requires: Some(proto_ref("t", "ok")),
                    ..v1::Dependency::default()
                },
                v1::Dependency::default(),
            ],
            ..v1::Item::default()
        };
        let fields: Vec<String> = item_from_proto(wire, 3)
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.field)
            .collect();
        assert_eq!(
            fields,
            ["items[3].properties.x", "items[3].dependencies[1].requires"]
        );
    }

    #[test]
    fn item_refs_convert_both_ways() {
        let item = ItemRef::new("file", "/etc/hosts");
        let wire = item_ref_to_proto(&item);
        assert_eq!(wire, proto_ref("file", "/etc/hosts"));
        assert_eq!(item_ref_from_proto(wire), item);
    }
}
