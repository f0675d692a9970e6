//! What a schema may ask of the server, checked before it is compiled: a
//! schema is input from an agent, and a hostile one must not be able to
//! make the server read files, fetch URLs, overflow its stack, or spend
//! unbounded time validating an intent.
//!
//! The checks (docs/security.md lists the limits):
//!
//! - size: at most [`MAX_SCHEMA_BYTES`] of JSON, nested at most
//!   [`MAX_SCHEMA_DEPTH`] levels;
//! - dialect: draft 2020-12 (the default), 2019-09 or draft-07, whose
//!   meta-schemas the validator carries;
//! - references: `$ref` only to a place in the same schema (`#` or
//!   `#/json/pointer`), which must exist; no `$dynamicRef`,
//!   `$recursiveRef`, and no `$id` below the root (it would move where
//!   references resolve), so nothing is ever loaded from anywhere;
//! - patterns: at most [`MAX_PATTERNS`] regular expressions, compiled by the
//!   validator with a linear-time engine (no backtracking) and a size limit;
//! - cost: the most subschemas that may be evaluated against one value of an
//!   instance ([`MAX_EVALUATIONS_PER_VALUE`]), following `$ref`s, counting
//!   each path through `allOf` / `anyOf` / `oneOf` / `not` / `if` /
//!   `then` / `else` / `$ref` separately, and refusing a `$ref` cycle that
//!   does not descend into the value (it would never end). Validating an
//!   intent then costs at most that many evaluations per value of its
//!   items' properties, whatever the schema.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value};

/// The largest schema, as compact JSON.
pub const MAX_SCHEMA_BYTES: usize = 32 * 1024;
/// The deepest nesting of JSON values in a schema (the root object is level
/// 1).
pub const MAX_SCHEMA_DEPTH: usize = 64;
/// The most regular expressions (`pattern` values and `patternProperties`
/// keys) in one schema.
pub const MAX_PATTERNS: usize = 64;
/// The most subschema evaluations one value of an instance may cause.
pub const MAX_EVALUATIONS_PER_VALUE: u64 = 1_000;
/// The deepest instance the cost bound looks at: properties are nested at
/// most this deep (`graph::MAX_PROPERTY_DEPTH`).
const MAX_INSTANCE_DEPTH: usize = crate::graph::MAX_PROPERTY_DEPTH;
/// Own keywords (everything but subschemas) of this many bytes count as one
/// more evaluation: an `enum` of 500 names costs more than a `type`.
const BYTES_PER_EVALUATION: usize = 256;

/// The dialects a schema may name in `$schema` (with or without a trailing
/// `#`, over http or https); absent means draft 2020-12.
const DIALECTS: &[&str] = &[
    "json-schema.org/draft/2020-12/schema",
    "json-schema.org/draft/2019-09/schema",
    "json-schema.org/draft-07/schema",
];

/// Keywords whose value is one subschema applied to the same value.
const SAME_VALUE_ONE: &[&str] = &["not", "if", "then", "else"];
/// Keywords whose value is a list of subschemas applied to the same value.
const SAME_VALUE_LIST: &[&str] = &["allOf", "anyOf", "oneOf"];
/// Keywords whose value maps names to subschemas applied to the same value.
const SAME_VALUE_MAP: &[&str] = &["dependentSchemas", "dependencies"];
/// Keywords whose value is one subschema applied to members of the value.
const MEMBER_ONE: &[&str] = &[
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "additionalItems",
    "unevaluatedItems",
    "contains",
];
/// Keywords whose value maps names to subschemas that are only reached
/// through `$ref`.
const DEFINITIONS: &[&str] = &["$defs", "definitions"];
/// Keywords that only annotate: they cost nothing to evaluate.
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$anchor",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "format",
];
/// Keywords that would resolve references at run time or from elsewhere.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "$dynamicRef",
        "refer to a definition with \"$ref\": \"#/$defs/NAME\" instead",
    ),
    (
        "$recursiveRef",
        "refer to a definition with \"$ref\": \"#/$defs/NAME\" instead",
    ),
];

/// Why a schema is refused before it is compiled. Each message says what is
/// wrong and what to do; `location` is a JSON Pointer into the schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundsError {
    /// The schema is neither an object nor a boolean.
    #[error("a schema is a JSON object (or true / false); this one is {found}")]
    NotASchema {
        /// What it is instead.
        found: &'static str,
    },
    /// Too many bytes.
    #[error(
        "the schema is {bytes} bytes of JSON; at most {MAX_SCHEMA_BYTES} are allowed: move \
         descriptions into documentation or split the type"
    )]
    TooLarge {
        /// Its size.
        bytes: usize,
    },
    /// Nested too deep.
    #[error(
        "the schema nests deeper than {MAX_SCHEMA_DEPTH} levels at {location}; move nested \
         parts into \"$defs\" and refer to them with \"$ref\""
    )]
    TooDeep {
        /// Where the limit was passed.
        location: String,
    },
    /// An unsupported `$schema`.
    #[error(
        "\"$schema\" is {dialect:?}; use draft 2020-12 (what schemars derives; the default when \
         \"$schema\" is absent), 2019-09 or draft-07"
    )]
    UnsupportedDialect {
        /// The `$schema` value.
        dialect: String,
    },
    /// A `$ref` to something outside the schema, or not a JSON Pointer.
    #[error(
        "\"$ref\" {reference:?} at {location} points outside the schema; the server loads \
         nothing: put the definition under \"$defs\" and refer to it as \"#/$defs/NAME\""
    )]
    ExternalRef {
        /// Where the `$ref` is.
        location: String,
        /// Its value.
        reference: String,
    },
    /// A `$ref` to a place in the schema that holds no schema.
    #[error("\"$ref\" {reference:?} at {location} points to no schema in this schema")]
    DanglingRef {
        /// Where the `$ref` is.
        location: String,
        /// Its value.
        reference: String,
    },
    /// A keyword the server does not accept.
    #[error("{keyword:?} at {location} is not supported: {hint}")]
    UnsupportedKeyword {
        /// Where it is.
        location: String,
        /// The keyword.
        keyword: &'static str,
        /// What to do.
        hint: &'static str,
    },
    /// `$id` below the root.
    #[error(
        "\"$id\" at {location} is not supported below the root: it would change where \
         references resolve; remove it and refer to the subschema with \"#/...\""
    )]
    NestedId {
        /// Where it is.
        location: String,
    },
    /// Too many regular expressions.
    #[error(
        "the schema has {count} regular expressions (\"pattern\" and \"patternProperties\"); at \
         most {MAX_PATTERNS} are allowed"
    )]
    TooManyPatterns {
        /// How many.
        count: usize,
    },
    /// A cycle of references that never descends into the value.
    #[error(
        "the references {} form a cycle that applies to the same value for ever; a recursive \
         schema must descend into a property or an array item on the way",
        cycle.join(" -> ")
    )]
    RefCycle {
        /// The subschemas of the cycle, first repeated at the end.
        cycle: Vec<String>,
    },
    /// Validation could cost too much.
    #[error(
        "the schema may evaluate up to {evaluations} subschemas against one value (at depth \
         {depth} of the properties); at most {MAX_EVALUATIONS_PER_VALUE} are allowed: use fewer \
         \"allOf\" / \"anyOf\" / \"oneOf\" branches, or fewer \"$ref\"s to large definitions"
    )]
    TooCostly {
        /// The bound found (at least the limit + 1).
        evaluations: u64,
        /// The instance depth where it was found (0: the properties object).
        depth: usize,
    },
}

/// Checks `schema` against every bound of this module; answers the most
/// subschema evaluations one value of an instance may cause (at most
/// [`MAX_EVALUATIONS_PER_VALUE`]), which bounds what validating an item
/// costs: this many per value of its properties.
pub fn check(schema: &Value) -> Result<u64, BoundsError> {
    match schema {
        Value::Bool(_) => return Ok(1),
        Value::Object(_) => {}
        other => {
            return Err(BoundsError::NotASchema { found: kind(other) });
        }
    }
    let bytes = serde_json::to_vec(schema).map_or(usize::MAX, |json| json.len());
    if bytes > MAX_SCHEMA_BYTES {
        return Err(BoundsError::TooLarge { bytes });
    }
    check_depth(schema, 1, &mut String::new())?;
    if let Some(dialect) = schema.get("$schema") {
        let known = dialect.as_str().is_some_and(|uri| {
            let uri = uri.trim_end_matches('#');
            let rest = uri
                .strip_prefix("https://")
                .or_else(|| uri.strip_prefix("http://"));
            rest.is_some_and(|rest| DIALECTS.contains(&rest))
        });
        if !known {
            return Err(BoundsError::UnsupportedDialect {
                dialect: dialect.to_string(),
            });
        }
    }
    let graph = Graph::build(schema)?;
    graph.check_cost()
}

/// The JSON type of a value, for messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Refuses nesting deeper than [`MAX_SCHEMA_DEPTH`]; `location` is the
/// pointer to `value`, extended while descending.
fn check_depth(value: &Value, level: usize, location: &mut String) -> Result<(), BoundsError> {
    let children: Box<dyn Iterator<Item = (String, &Value)>> = match value {
        Value::Object(map) => Box::new(map.iter().map(|(key, value)| (escape(key), value))),
        Value::Array(list) => Box::new(
            list.iter()
                .enumerate()
                .map(|(index, value)| (index.to_string(), value)),
        ),
        _ => return Ok(()),
    };
    if level > MAX_SCHEMA_DEPTH {
        return Err(BoundsError::TooDeep {
            location: display_pointer(location),
        });
    }
    for (token, child) in children {
        let length = location.len();
        location.push('/');
        location.push_str(&token);
        check_depth(child, level + 1, location)?;
        location.truncate(length);
    }
    Ok(())
}

/// A JSON Pointer reference token for `key` (RFC 6901).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The pointer as shown in messages: `#` for the root, else `#/a/b`.
fn display_pointer(pointer: &str) -> String {
    format!("#{pointer}")
}

/// One subschema and what it applies to the value it is evaluated
/// against.
#[derive(Default)]
struct Node {
    /// Own evaluations (1 + a share for large own keywords).
    weight: u64,
    /// Subschemas (by node index) applied to the same value.
    same_value: Vec<usize>,
    /// Subschemas applied to named properties or tuple positions: only one
    /// of them applies to a given member.
    one_of_members: Vec<usize>,
    /// Subschemas that may apply to every member.
    every_member: Vec<usize>,
}

/// The schema as a graph of subschemas, `$ref`s resolved.
struct Graph {
    nodes: Vec<Node>,
    /// Node pointers, for messages.
    pointers: Vec<String>,
}

impl Graph {
    /// Walks every subschema reachable from the root (through applicators,
    /// definitions and references), checking references, keywords and
    /// patterns on the way.
    fn build(root: &Value) -> Result<Self, BoundsError> {
        let mut builder = Builder {
            root,
            index: HashMap::new(),
            pending: Vec::new(),
            graph: Self {
                nodes: Vec::new(),
                pointers: Vec::new(),
            },
            patterns: 0,
        };
        builder.node(String::new());
        while let Some((id, pointer)) = builder.pending.pop() {
            builder.visit(id, &pointer)?;
        }
        Ok(builder.graph)
    }

    /// Refuses a same-value cycle or a cost over the limit; answers the
    /// cost: the most evaluations one value may cause, at any depth.
    fn check_cost(&self) -> Result<u64, BoundsError> {
        let order = self.same_value_order()?;
        // cost[n]: the evaluations node n causes at the current instance
        // depth d below the value it is applied to (d = 0: that value).
        let mut previous: Vec<u64> = vec![0; self.nodes.len()];
        let cap = MAX_EVALUATIONS_PER_VALUE + 1;
        let mut most = 0;
        for depth in 0..=MAX_INSTANCE_DEPTH {
            let mut cost: Vec<u64> = vec![0; self.nodes.len()];
            for &id in &order {
                let node = &self.nodes[id];
                let mut total = if depth == 0 {
                    node.weight
                } else {
                    let one = node
                        .one_of_members
                        .iter()
                        .map(|&child| previous[child])
                        .max()
                        .unwrap_or(0);
                    node.every_member
                        .iter()
                        .fold(one, |sum, &child| sum.saturating_add(previous[child]))
                };
                for &next in &node.same_value {
                    total = total.saturating_add(cost[next]);
                }
                cost[id] = total.min(cap);
            }
            if cost[0] > MAX_EVALUATIONS_PER_VALUE {
                return Err(BoundsError::TooCostly {
                    evaluations: cost[0],
                    depth,
                });
            }
            most = most.max(cost[0]);
            if cost == previous {
                // A fixed point: deeper levels cost the same.
                break;
            }
            previous = cost;
        }
        Ok(most.max(1))
    }

    /// The nodes ordered so that every node comes after the nodes it applies
    /// to the same value; a cycle among them is refused.
    fn same_value_order(&self) -> Result<Vec<usize>, BoundsError> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            Open,
            Done,
        }
        let mut marks = vec![Mark::New; self.nodes.len()];
        let mut order = Vec::with_capacity(self.nodes.len());
        for start in 0..self.nodes.len() {
            if marks[start] != Mark::New {
                continue;
            }
            // Iterative depth-first search: (node, next edge to follow).
            let mut stack = vec![(start, 0usize)];
            marks[start] = Mark::Open;
            while let Some(&mut (id, ref mut edge)) = stack.last_mut() {
                if let Some(&next) = self.nodes[id].same_value.get(*edge) {
                    *edge += 1;
                    match marks[next] {
                        Mark::New => {
                            marks[next] = Mark::Open;
                            stack.push((next, 0));
                        }
                        Mark::Open => {
                            let from = stack
                                .iter()
                                .position(|&(open, _)| open == next)
                                .unwrap_or(0);
                            let mut cycle: Vec<String> = stack[from..]
                                .iter()
                                .map(|&(open, _)| display_pointer(&self.pointers[open]))
                                .collect();
                            cycle.push(display_pointer(&self.pointers[next]));
                            return Err(BoundsError::RefCycle { cycle });
                        }
                        Mark::Done => {}
                    }
                } else {
                    marks[id] = Mark::Done;
                    order.push(id);
                    stack.pop();
                }
            }
        }
        Ok(order)
    }
}

/// Builds a [`Graph`].
struct Builder<'a> {
    root: &'a Value,
    /// Node index by pointer.
    index: HashMap<String, usize>,
    /// Nodes to visit: (index, pointer).
    pending: Vec<(usize, String)>,
    graph: Graph,
    patterns: usize,
}

impl Builder<'_> {
    /// The node at `pointer`, created (and queued for a visit) if new.
    fn node(&mut self, pointer: String) -> usize {
        if let Some(&id) = self.index.get(&pointer) {
            return id;
        }
        let id = self.graph.nodes.len();
        self.graph.nodes.push(Node::default());
        self.graph.pointers.push(pointer.clone());
        self.index.insert(pointer.clone(), id);
        self.pending.push((id, pointer));
        id
    }

    /// Records what the subschema at `pointer` applies.
    fn visit(&mut self, id: usize, pointer: &str) -> Result<(), BoundsError> {
        let Some(schema) = self.root.pointer(pointer) else {
            return Ok(());
        };
        let Value::Object(keywords) = schema else {
            // true / false: one evaluation, nothing below.
            self.graph.nodes[id].weight = 1;
            return Ok(());
        };
        let mut node = Node {
            weight: 1,
            ..Node::default()
        };
        let mut own_bytes = 0usize;
        for (keyword, value) in keywords {
            let here = format!("{pointer}/{}", escape(keyword));
            match keyword.as_str() {
                "$ref" => {
                    let target = self.reference(value, &here)?;
                    node.same_value.push(target);
                }
                "$id" if !pointer.is_empty() => {
                    return Err(BoundsError::NestedId {
                        location: display_pointer(&here),
                    });
                }
                "properties" => {
                    for (name, _) in subschemas_in_map(value) {
                        node.one_of_members
                            .push(self.node(format!("{here}/{}", escape(name))));
                    }
                }
                "patternProperties" => {
                    for (name, _) in subschemas_in_map(value) {
                        self.patterns += 1;
                        node.every_member
                            .push(self.node(format!("{here}/{}", escape(name))));
                    }
                }
                "prefixItems" => {
                    for index in 0..value.as_array().map_or(0, Vec::len) {
                        node.one_of_members
                            .push(self.node(format!("{here}/{index}")));
                    }
                }
                "items" => match value {
                    // draft-07 / 2019-09 tuples
                    Value::Array(list) => {
                        for index in 0..list.len() {
                            node.one_of_members
                                .push(self.node(format!("{here}/{index}")));
                        }
                    }
                    _ => node.every_member.push(self.node(here)),
                },
                "pattern" => {
                    self.patterns += 1;
                    own_bytes += value.as_str().map_or(0, str::len);
                }
                name if SAME_VALUE_ONE.contains(&name) => {
                    node.same_value.push(self.node(here));
                }
                name if SAME_VALUE_LIST.contains(&name) => {
                    for index in 0..value.as_array().map_or(0, Vec::len) {
                        node.same_value.push(self.node(format!("{here}/{index}")));
                    }
                }
                name if SAME_VALUE_MAP.contains(&name) => {
                    for (name, _) in subschemas_in_map(value) {
                        node.same_value
                            .push(self.node(format!("{here}/{}", escape(name))));
                    }
                }
                name if MEMBER_ONE.contains(&name) => {
                    node.every_member.push(self.node(here));
                }
                name if DEFINITIONS.contains(&name) => {
                    // Checked (references, patterns) even if nothing refers
                    // to them: the validator compiles them too.
                    for (name, _) in subschemas_in_map(value) {
                        self.node(format!("{here}/{}", escape(name)));
                    }
                }
                name if ANNOTATIONS.contains(&name) => {}
                name => {
                    if let Some((keyword, hint)) = UNSUPPORTED
                        .iter()
                        .find(|(unsupported, _)| *unsupported == name)
                    {
                        return Err(BoundsError::UnsupportedKeyword {
                            location: display_pointer(&here),
                            keyword,
                            hint,
                        });
                    }
                    own_bytes += serde_json::to_vec(value).map_or(0, |json| json.len());
                }
            }
        }
        if self.patterns > MAX_PATTERNS {
            return Err(BoundsError::TooManyPatterns {
                count: self.patterns,
            });
        }
        node.weight += u64::try_from(own_bytes / BYTES_PER_EVALUATION).unwrap_or(u64::MAX);
        self.graph.nodes[id] = node;
        Ok(())
    }

    /// The node a `$ref` at `location` points to.
    fn reference(&mut self, value: &Value, location: &str) -> Result<usize, BoundsError> {
        let reference = value.as_str().unwrap_or_default();
        let external = || BoundsError::ExternalRef {
            location: display_pointer(location),
            reference: value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned),
        };
        let fragment = reference.strip_prefix('#').ok_or_else(external)?;
        if !(fragment.is_empty() || fragment.starts_with('/')) {
            return Err(external());
        }
        let pointer = percent_decode(fragment).ok_or_else(external)?;
        match self.root.pointer(&pointer) {
            Some(Value::Object(_) | Value::Bool(_)) => Ok(self.node(pointer)),
            _ => Err(BoundsError::DanglingRef {
                location: display_pointer(location),
                reference: reference.to_owned(),
            }),
        }
    }
}

/// The entries of a map of subschemas (`properties`, `$defs`, ...), sorted;
/// nothing if the value is not an object.
fn subschemas_in_map(value: &Value) -> BTreeMap<&String, &Value> {
    value
        .as_object()
        .map(Map::iter)
        .into_iter()
        .flatten()
        .collect()
}

/// Decodes `%XX` escapes of a URI fragment; `None` if malformed.
fn percent_decode(fragment: &str) -> Option<String> {
    if !fragment.contains('%') {
        return Some(fragment.to_owned());
    }
    let bytes = fragment.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = fragment.get(at + 1..at + 3)?;
            decoded.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            decoded.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(decoded).ok()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_derived_struct_schema_is_within_bounds() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Server",
            "type": "object",
            "properties": {
                "host": {"type": "string", "pattern": "^[a-z0-9.-]+$"},
                "port": {"type": "integer", "format": "uint16", "minimum": 0, "maximum": 65535},
                "tls": {"$ref": "#/$defs/Tls"},
                "tags": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["host", "port"],
            "$defs": {"Tls": {"type": "object", "properties": {"ca": {"type": "string"}}}}
        });
        assert!(check(&schema).is_ok());
        assert_eq!(check(&json!(true)), Ok(1));
        assert_eq!(check(&json!({})), Ok(1));
    }

    #[test]
    fn a_recursive_schema_that_descends_is_accepted() {
        let tree = json!({
            "$ref": "#/$defs/node",
            "$defs": {"node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
            }}}
        });
        assert!(check(&tree).is_ok());
    }

    #[test]
    fn references_must_stay_inside_the_schema() {
        for reference in [
            "file:///etc/passwd",
            "http://127.0.0.1/schema.json",
            "other.json#/a",
            "#anchor",
        ] {
            let refused = check(&json!({"properties": {"a": {"$ref": reference}}}));
            assert!(
                matches!(&refused, Err(BoundsError::ExternalRef { location, .. }) if location == "#/properties/a/$ref"),
                "{reference}: {refused:?}"
            );
        }
        assert!(matches!(
            check(&json!({"$ref": "#/$defs/missing"})),
            Err(BoundsError::DanglingRef { .. })
        ));
        assert!(
            check(&json!({"$defs": {"a b": {"type": "string"}}, "$ref": "#/$defs/a%20b"})).is_ok()
        );
        assert!(matches!(
            check(&json!({"$dynamicRef": "#meta"})),
            Err(BoundsError::UnsupportedKeyword { .. })
        ));
        assert!(matches!(
            check(&json!({"properties": {"a": {"$id": "https://example.com/a"}}})),
            Err(BoundsError::NestedId { .. })
        ));
    }

    #[test]
    fn a_reference_cycle_on_the_same_value_is_refused() {
        for schema in [
            json!({"$ref": "#"}),
            json!({"allOf": [{"$ref": "#"}]}),
            json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"not": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"}),
        ] {
            let refused = check(&schema);
            assert!(
                matches!(&refused, Err(BoundsError::RefCycle { .. })),
                "{schema}: {refused:?}"
            );
        }
        let message = check(&json!({"$defs": {"a": {"$ref": "#/$defs/a"}}}))
            .expect_err("refused")
            .to_string();
        assert!(message.contains("#/$defs/a -> #/$defs/a"), "{message}");
    }

    #[test]
    fn exponential_reference_chains_are_refused_by_their_cost() {
        // Each level doubles the evaluations of the one below: 2^20 paths
        // in a schema of a few hundred bytes.
        let mut defs = Map::new();
        defs.insert("a0".into(), json!({"type": "string"}));
        for level in 1..=20 {
            let below = format!("#/$defs/a{}", level - 1);
            defs.insert(
                format!("a{level}"),
                json!({"anyOf": [{"$ref": below}, {"$ref": below}]}),
            );
        }
        let refused = check(&json!({"$defs": defs, "$ref": "#/$defs/a20"}));
        assert!(
            matches!(refused, Err(BoundsError::TooCostly { depth: 0, .. })),
            "{refused:?}"
        );
    }

    #[test]
    fn recursion_that_multiplies_per_level_is_refused_by_its_cost() {
        // Two branches per level of the value, each descending: 2^depth.
        let schema = json!({
            "$ref": "#/$defs/n",
            "$defs": {"n": {"anyOf": [
                {"properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["x"]},
                {"properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["y"]}
            ]}}
        });
        let refused = check(&schema);
        assert!(
            matches!(refused, Err(BoundsError::TooCostly { depth, .. }) if depth > 0),
            "{refused:?}"
        );
    }

    #[test]
    fn properties_count_once_per_member_and_wildcards_for_every_member() {
        // 600 named properties: a member meets one of them.
        let named: Map<String, Value> = (0..600)
            .map(|n| (format!("p{n}"), json!({"type": "string"})))
            .collect();
        // The root, then one property's subschema per member.
        assert_eq!(check(&json!({"properties": named})), Ok(1));
        // 1,001 subschemas that all apply to the same value.
        let all: Vec<Value> = (0..1_001).map(|_| json!({})).collect();
        assert!(matches!(
            check(&json!({"allOf": all})),
            Err(BoundsError::TooCostly { .. })
        ));
    }

    #[test]
    fn size_depth_dialect_and_patterns_are_bounded() {
        let big = "x".repeat(MAX_SCHEMA_BYTES);
        assert!(matches!(
            check(&json!({"description": big})),
            Err(BoundsError::TooLarge { .. })
        ));
        let mut deep = json!({"type": "string"});
        for _ in 0..MAX_SCHEMA_DEPTH {
            deep = json!({"not": deep});
        }
        assert!(matches!(check(&deep), Err(BoundsError::TooDeep { .. })));
        assert!(matches!(
            check(&json!({"$schema": "http://json-schema.org/draft-04/schema#"})),
            Err(BoundsError::UnsupportedDialect { .. })
        ));
        assert!(check(&json!({"$schema": "http://json-schema.org/draft-07/schema#"})).is_ok());
        let patterns: Map<String, Value> = (0..=MAX_PATTERNS)
            .map(|n| (format!("^p{n}$"), json!(true)))
            .collect();
        assert!(matches!(
            check(&json!({"patternProperties": patterns})),
            Err(BoundsError::TooManyPatterns { .. })
        ));
        assert!(matches!(
            check(&json!(["not", "a", "schema"])),
            Err(BoundsError::NotASchema { .. })
        ));
    }
}
