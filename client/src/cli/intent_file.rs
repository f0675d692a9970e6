//! Intent files: the body of a `SubmitIntent` request in JSON or YAML, as
//! `deploy/examples/site.json` writes it.
//!
//! ```yaml
//! tenant: acme            # optional; --tenant must agree if both are given
//! subgraph: ""            # optional; --subgraph overrides it
//! items:
//!   - type: directory
//!     name: etc
//!     properties: {path: etc/app}
//!   - type: file
//!     name: config
//!     properties: {path: etc/app/app.conf, content: "listen = 8080\n"}
//!     dependencies:
//!       - requires: {type: directory, name: etc}   # or: requires: directory/etc
//! ```
//!
//! A bare list of items is accepted too. Field names may be snake_case or
//! lowerCamelCase (as proto3 JSON and grpcurl write them). Unknown fields
//! are errors naming their path, e.g. `items[1].dependencies[0].requires`.

use serde_json::{Map, Value};

use crate::convert::properties_to_struct;
use crate::proto as v1;

/// A parsed intent file.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct IntentFile {
    /// The tenant the file names, if any.
    pub(crate) tenant: Option<String>,
    /// The subgraph the file names, if any.
    pub(crate) subgraph: Option<String>,
    /// The items.
    pub(crate) items: Vec<v1::Item>,
}

/// The syntax of an intent file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Syntax {
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

impl Syntax {
    /// The syntax a file name suggests (`.json`, `.yaml`, `.yml`), else the
    /// one its first non-blank character suggests (`{` or `[`: JSON).
    pub(crate) fn detect(name: &str, text: &str) -> Syntax {
        let lower = name.to_ascii_lowercase();
        if lower.ends_with(".json") {
            Syntax::Json
        } else if lower.ends_with(".yaml") || lower.ends_with(".yml") {
            Syntax::Yaml
        } else if text.trim_start().starts_with(['{', '[']) {
            Syntax::Json
        } else {
            Syntax::Yaml
        }
    }
}

/// Parses an intent file; errors name the file's syntax problem or the
/// path of the offending field.
pub(crate) fn parse(text: &str, syntax: Syntax) -> Result<IntentFile, String> {
    let value: Value = match syntax {
        Syntax::Json => {
            serde_json::from_str(text).map_err(|error| format!("invalid JSON: {error}"))?
        }
        Syntax::Yaml => {
            serde_yaml::from_str(text).map_err(|error| format!("invalid YAML: {error}"))?
        }
    };
    from_value(value)
}

fn from_value(value: Value) -> Result<IntentFile, String> {
    match value {
        Value::Array(items) => Ok(IntentFile {
            items: items_from(items, "")?,
            ..IntentFile::default()
        }),
        Value::Object(fields) => {
            let mut file = IntentFile::default();
            for (key, value) in fields {
                match key.as_str() {
                    "tenant" => file.tenant = Some(string(value, "tenant")?),
                    "subgraph" => file.subgraph = Some(string(value, "subgraph")?),
                    "items" => match value {
                        Value::Array(items) => file.items = items_from(items, "items")?,
                        Value::Null => {}
                        _ => return Err("items: must be a list of items".into()),
                    },
                    "expected_generation" | "expectedGeneration" => {
                        return Err(format!(
                            "{key}: not read from the file; pass --expected-generation"
                        ));
                    }
                    "dry_run" | "dryRun" => {
                        return Err(format!("{key}: not read from the file; pass --dry-run"));
                    }
                    _ => {
                        return Err(format!(
                            "{key}: unknown field; an intent file has `tenant`, `subgraph` and \
                             `items`"
                        ));
                    }
                }
            }
            Ok(file)
        }
        Value::Null => Ok(IntentFile::default()),
        _ => Err("the file must hold an object with `items` (or a list of items)".into()),
    }
}

fn items_from(items: Vec<Value>, path: &str) -> Result<Vec<v1::Item>, String> {
    items
        .into_iter()
        .enumerate()
        .map(|(index, value)| item(value, &format!("{path}[{index}]")))
        .collect()
}

fn string(value: Value, path: &str) -> Result<String, String> {
    match value {
        Value::String(text) => Ok(text),
        Value::Null => Ok(String::new()),
        other => Err(format!("{path}: must be a string, not {other}")),
    }
}

fn boolean(value: Value, path: &str) -> Result<bool, String> {
    match value {
        Value::Bool(flag) => Ok(flag),
        Value::Null => Ok(false),
        other => Err(format!("{path}: must be true or false, not {other}")),
    }
}

fn object(value: Value, path: &str) -> Result<Map<String, Value>, String> {
    match value {
        Value::Object(fields) => Ok(fields),
        Value::Null => Ok(Map::new()),
        other => Err(format!("{path}: must be an object, not {other}")),
    }
}

fn item(value: Value, path: &str) -> Result<v1::Item, String> {
    let mut item = v1::Item::default();
    for (key, value) in object(value, path)? {
        let field = format!("{path}.{key}");
        match key.as_str() {
            "type" => item.r#type = string(value, &field)?,
            "name" => item.name = string(value, &field)?,
            "properties" => item.properties = Some(properties_to_struct(&object(value, &field)?)),
            "dependencies" => match value {
                Value::Array(dependencies) => {
                    item.dependencies = dependencies
                        .into_iter()
                        .enumerate()
                        .map(|(index, value)| dependency(value, &format!("{field}[{index}]")))
                        .collect::<Result<_, _>>()?;
                }
                Value::Null => {}
                _ => return Err(format!("{field}: must be a list of dependencies")),
            },
            "external" => item.external = boolean(value, &field)?,
            "subgraph" => item.subgraph = string(value, &field)?,
            "label" => item.label = string(value, &field)?,
            "description" => item.description = string(value, &field)?,
            _ => {
                return Err(format!(
                    "{field}: unknown field; an item has type, name, properties, dependencies, \
                     external, subgraph, label and description"
                ));
            }
        }
    }
    if item.properties.is_none() {
        item.properties = Some(prost_types::Struct::default());
    }
    Ok(item)
}

fn dependency(value: Value, path: &str) -> Result<v1::Dependency, String> {
    let mut dependency = v1::Dependency::default();
    for (key, value) in object(value, path)? {
        let field = format!("{path}.{key}");
        match key.as_str() {
            "requires" => dependency.requires = Some(item_ref(value, &field)?),
            "must_satisfy" | "mustSatisfy" => dependency.must_satisfy = string(value, &field)?,
            "description" => dependency.description = string(value, &field)?,
            "recreate_when_modified" | "recreateWhenModified" => {
                dependency.recreate_when_modified = boolean(value, &field)?;
            }
            "auto_deleted_by_external" | "autoDeletedByExternal" => {
                dependency.auto_deleted_by_external = boolean(value, &field)?;
            }
            _ => {
                return Err(format!(
                    "{field}: unknown field; a dependency has requires, must_satisfy, \
                     description, recreate_when_modified and auto_deleted_by_external"
                ));
            }
        }
    }
    if dependency.requires.is_none() {
        return Err(format!(
            "{path}.requires: missing; name the required item as {{type: ..., name: ...}} or \
             \"type/name\""
        ));
    }
    Ok(dependency)
}

fn item_ref(value: Value, path: &str) -> Result<v1::ItemRef, String> {
    if let Value::String(text) = &value {
        return match text.split_once('/') {
            Some((item_type, name)) => Ok(v1::ItemRef {
                r#type: item_type.to_owned(),
                name: name.to_owned(),
            }),
            None => Err(format!(
                "{path}: {text:?} is not \"type/name\"; write the item's type, a slash and its \
                 name"
            )),
        };
    }
    let mut reference = v1::ItemRef::default();
    for (key, value) in object(value, path)? {
        let field = format!("{path}.{key}");
        match key.as_str() {
            "type" => reference.r#type = string(value, &field)?,
            "name" => reference.name = string(value, &field)?,
            _ => {
                return Err(format!(
                    "{field}: unknown field; a reference has type and name"
                ));
            }
        }
    }
    Ok(reference)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::properties_from_struct;

    const SITE_YAML: &str = r#"
tenant: acme
items:
  - type: directory
    name: etc
    properties: {path: etc/app}
  - type: file
    name: config
    properties: {path: etc/app/app.conf, mode: 420}
    dependencies:
      - requires: directory/etc
        mustSatisfy: self.path != ""
"#;

    #[test]
    fn yaml_and_json_give_the_same_items() {
        let yaml = parse(SITE_YAML, Syntax::Yaml).expect("valid YAML");
        let json = parse(
            r#"{"tenant": "acme", "items": [
                {"type": "directory", "name": "etc", "properties": {"path": "etc/app"}},
                {"type": "file", "name": "config", "properties": {"path": "etc/app/app.conf", "mode": 420},
                 "dependencies": [{"requires": {"type": "directory", "name": "etc"},
                                   "must_satisfy": "self.path != \"\""}]}]}"#,
            Syntax::Json,
        )
        .expect("valid JSON");
        assert_eq!(yaml, json);
        assert_eq!(yaml.tenant.as_deref(), Some("acme"));
        let file = &yaml.items[1];
        assert_eq!(
            properties_from_struct(file.properties.clone().unwrap_or_default())["mode"],
            420
        );
        assert_eq!(
            file.dependencies[0].requires,
            Some(v1::ItemRef {
                r#type: "directory".into(),
                name: "etc".into()
            })
        );
    }

    #[test]
    fn mistakes_name_the_path_of_the_field() {
        let error = parse(
            r#"{"items": [{"type": "t", "name": "a"}, {"type": "t", "name": "b", "dependencies": [{"require": "t/a"}]}]}"#,
            Syntax::Json,
        )
        .expect_err("unknown field");
        assert!(
            error.starts_with("items[1].dependencies[0].require:"),
            "{error}"
        );

        let error =
            parse("items:\n  - type: t\n    name: 5\n", Syntax::Yaml).expect_err("a number");
        assert!(
            error.starts_with("items[0].name: must be a string"),
            "{error}"
        );

        let error = parse("{\"items\": [", Syntax::Json).expect_err("bad JSON");
        assert!(error.starts_with("invalid JSON"), "{error}");
    }

    #[test]
    fn the_syntax_follows_the_extension_then_the_content() {
        assert_eq!(Syntax::detect("a.yml", "{}"), Syntax::Yaml);
        assert_eq!(Syntax::detect("a.JSON", "x: 1"), Syntax::Json);
        assert_eq!(Syntax::detect("-", "  [ ]"), Syntax::Json);
        assert_eq!(Syntax::detect("-", "items: []"), Syntax::Yaml);
    }

    #[test]
    fn the_example_intent_parses() {
        let text = include_str!("../../../deploy/examples/site.json");
        let file = parse(text, Syntax::Json).expect("the example is valid");
        assert_eq!(file.items.len(), 2);
    }
}
