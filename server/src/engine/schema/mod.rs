//! Typed properties: the JSON Schema an agent may declare for an item type,
//! and the check of submitted items against it (like a Kubernetes CRD's
//! OpenAPI schema, or a Terraform provider's schema).
//!
//! - [`TypeSchema::compile`] checks a schema at `Register`: within the
//!   bounds of [`bounds`] (a schema is input from an agent, which may be
//!   hostile), then compiled by the `jsonschema` crate, offline, with
//!   `format` as an annotation and `pattern`s on the linear-time `regex`
//!   engine.
//! - [`check_items`] validates the items of a SubmitIntent against the
//!   schemas of the tenant's registered types, and answers a field
//!   violation per problem, with a path into the item
//!   (`items[3].properties.port`).
//!
//! A stored schema (read back from a type spec record) is compiled on first
//! use, so loading a tenant costs no compilation.
//!
//! Pure: no I/O, no clock.

pub mod bounds;

use std::fmt;
use std::sync::{Arc, OnceLock};

use jsonschema::error::ValidationErrorKind;
use jsonschema::paths::LocationSegment;
use jsonschema::{PatternOptions, Validator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::exec::TypeRegistry;
use super::intent::IntentError;
use crate::graph::validate::{FieldViolation, MAX_VIOLATIONS};
use crate::graph::{Item, Properties};

pub use bounds::BoundsError;

/// The largest compiled form of one `pattern` (the `regex` engine's size
/// limit), and of its lazy DFA's cache.
pub const MAX_PATTERN_COMPILED_BYTES: usize = 256 * 1024;
/// The most subschema evaluations validating one SubmitIntent may cost,
/// estimated before it runs as each item's values times its schema's
/// evaluations per value (about 0.35 s in a release build at worst).
pub const MAX_EVALUATIONS_PER_REQUEST: u64 = 50_000_000;
/// Of those, how many may go to listing every problem of invalid items;
/// past it an invalid item reports its first problem only. Listing costs
/// some 35 times more per evaluation than checking.
const LISTING_EVALUATIONS_PER_REQUEST: u64 = 200_000;
/// The longest description of one violation; longer messages (they quote
/// the offending value) are cut.
const MAX_DESCRIPTION_CHARS: usize = 300;

/// Why a schema is refused at `Register`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// Over a bound (size, nesting, references, cost).
    #[error(transparent)]
    Bounds(#[from] BoundsError),
    /// The validator does not accept it (not a valid schema of its
    /// dialect, an invalid or too large `pattern`, ...).
    #[error("the schema does not compile: {message}")]
    Invalid {
        /// What the validator said, with the place in the schema.
        message: String,
    },
}

/// A registered type's JSON Schema: the schema as declared, and its
/// compiled validator. Cheap to clone; compared and stored as the JSON.
#[derive(Clone)]
pub struct TypeSchema {
    inner: Arc<Inner>,
}

struct Inner {
    json: Value,
    compiled: OnceLock<Result<Compiled, SchemaError>>,
}

/// A schema ready to validate.
struct Compiled {
    validator: Validator,
    /// The most subschema evaluations one value may cause.
    evaluations_per_value: u64,
}

impl TypeSchema {
    /// Checks and compiles a schema an agent declares.
    pub fn compile(json: Value) -> Result<Self, SchemaError> {
        let compiled = compile(&json)?;
        Ok(Self {
            inner: Arc::new(Inner {
                json,
                compiled: OnceLock::from(Ok(compiled)),
            }),
        })
    }

    /// A schema read back from the store, compiled when first used. One
    /// that no longer compiles (stricter limits of a newer server) refuses
    /// every item of its type until the agent registers again.
    pub fn stored(json: Value) -> Self {
        Self {
            inner: Arc::new(Inner {
                json,
                compiled: OnceLock::new(),
            }),
        }
    }

    /// The schema as declared.
    pub fn json(&self) -> &Value {
        &self.inner.json
    }

    fn compiled(&self) -> &Result<Compiled, SchemaError> {
        self.inner
            .compiled
            .get_or_init(|| compile(&self.inner.json))
    }

    /// Validates `properties` (those of an item of type `item_type`) and
    /// pushes a violation per problem, with field paths under `field` (e.g.
    /// `items[3].properties`), onto `violations`. `listing` is what is left
    /// of the request's budget for listing every problem of invalid items;
    /// `cost` is what listing this one may take.
    fn check(
        &self,
        item_type: &str,
        properties: &Value,
        field: &str,
        cost: u64,
        listing: &mut u64,
        violations: &mut Violations,
    ) {
        let validator = match self.compiled() {
            Ok(compiled) => &compiled.validator,
            Err(error) => {
                violations.push(
                    field.to_owned(),
                    format!(
                        "the schema registered for type {item_type:?} cannot be used ({error}); \
                         the type's agent must register a valid one"
                    ),
                );
                return;
            }
        };
        if validator.is_valid(properties) {
            return;
        }
        if cost > *listing {
            // Listing everything could cost too much: the first problem.
            let first = validator
                .validate(properties)
                .err()
                .and_then(|error| violations_of(item_type, field, &error).into_iter().next());
            if let Some((path, description)) = first {
                violations.push(
                    path,
                    format!(
                        "{description}; this is the item's first problem: fix it and submit \
                         again to see more"
                    ),
                );
            }
            return;
        }
        *listing -= cost;
        for error in validator.iter_errors(properties) {
            if violations.full() {
                return;
            }
            for (path, description) in violations_of(item_type, field, &error) {
                violations.push(path, description);
            }
        }
    }
}

/// The violations one validator error makes: (field path, description).
/// A missing or extra property is pointed at by its own name.
fn violations_of(
    item_type: &str,
    field: &str,
    error: &jsonschema::ValidationError<'_>,
) -> Vec<(String, String)> {
    let mut path = field.to_owned();
    for segment in error.instance_path().segments() {
        match segment {
            LocationSegment::Property(key) => push_key(&mut path, &key),
            LocationSegment::Index(index) => path.push_str(&format!("[{index}]")),
        }
    }
    let wanted = format!("(schema of type {item_type:?} at #{})", error.schema_path());
    match error.kind() {
        ValidationErrorKind::Required {
            property: Value::String(name),
        } => {
            push_key(&mut path, name);
            vec![(path, format!("is required {wanted}"))]
        }
        ValidationErrorKind::AdditionalProperties { unexpected }
        | ValidationErrorKind::UnevaluatedProperties { unexpected } => unexpected
            .iter()
            .map(|name| {
                let mut extra = path.clone();
                push_key(&mut extra, name);
                (
                    extra,
                    format!("is not a property the schema allows {wanted}"),
                )
            })
            .collect(),
        _ => vec![(path, format!("{} {wanted}", cut(&describe(error))))],
    }
}

impl PartialEq for TypeSchema {
    fn eq(&self, other: &Self) -> bool {
        self.inner.json == other.inner.json
    }
}

impl fmt::Debug for TypeSchema {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_tuple("TypeSchema")
            .field(&self.inner.json)
            .finish()
    }
}

impl Serialize for TypeSchema {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.inner.json.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for TypeSchema {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(Self::stored)
    }
}

/// Checks `json` against the bounds and compiles it.
fn compile(json: &Value) -> Result<Compiled, SchemaError> {
    let evaluations_per_value = bounds::check(json)?;
    let validator = jsonschema::options()
        .offline()
        .should_validate_formats(false)
        .with_pattern_options(
            PatternOptions::regex()
                .size_limit(MAX_PATTERN_COMPILED_BYTES)
                .dfa_size_limit(MAX_PATTERN_COMPILED_BYTES),
        )
        .build(json)
        .map_err(|error| {
            let place = error.instance_path().to_string();
            let place = if place.is_empty() {
                String::new()
            } else {
                format!("at #{place}: ")
            };
            SchemaError::Invalid {
                message: format!("{place}{}", cut(&error.to_string())),
            }
        })?;
    Ok(Compiled {
        validator,
        evaluations_per_value,
    })
}

/// Validates the managed items of a SubmitIntent (in request order, so
/// that `items[i]` is the request's) against the schemas of their types;
/// items of types without a schema, and external items (never sent to an
/// agent), are not checked. Every problem is reported, up to
/// [`MAX_VIOLATIONS`] with a closing note; validation stops there.
pub fn check_items<'a>(
    types: &TypeRegistry,
    items: impl IntoIterator<Item = &'a Item>,
) -> Result<(), IntentError> {
    let checked: Vec<(usize, &Item, &TypeSchema)> = items
        .into_iter()
        .enumerate()
        .filter(|(_, item)| !item.external)
        .filter_map(|(index, item)| {
            let spec = types.spec(item.item_type())?;
            Some((index, item, spec.schema.as_ref()?))
        })
        .collect();
    // What validating may cost, before anything runs.
    let costs: Vec<u64> = checked
        .iter()
        .map(|(_, item, schema)| {
            let per_value = schema
                .compiled()
                .as_ref()
                .map_or(0, |compiled| compiled.evaluations_per_value);
            per_value.saturating_mul(count_values(&item.properties))
        })
        .collect();
    let total = costs
        .iter()
        .fold(0u64, |sum, cost| sum.saturating_add(*cost));
    if total > MAX_EVALUATIONS_PER_REQUEST {
        return Err(IntentError::Quota {
            subject: "schema_evaluations_per_request".into(),
            description: format!(
                "validating these items against their types' schemas may take up to {total} \
                 evaluations; at most {MAX_EVALUATIONS_PER_REQUEST} are allowed per request: \
                 split the intent into subgraphs"
            ),
        });
    }
    let mut violations = Violations::default();
    let mut listing = LISTING_EVALUATIONS_PER_REQUEST;
    for ((index, item, schema), cost) in checked.into_iter().zip(costs) {
        if violations.full() {
            break;
        }
        // The validator takes a JSON value; items of schema'd types only.
        let properties = item.properties.to_value();
        schema.check(
            item.item_type(),
            &properties,
            &format!("items[{index}].properties"),
            cost,
            &mut listing,
            &mut violations,
        );
    }
    violations.into_result()
}

/// The values in `properties` (the object itself and everything nested).
fn count_values(properties: &Properties) -> u64 {
    fn count(value: &Value) -> u64 {
        1 + match value {
            Value::Array(list) => list.iter().map(count).sum(),
            Value::Object(map) => map.values().map(count).sum(),
            _ => 0,
        }
    }
    1 + properties.values().map(count).sum::<u64>()
}

/// What the validator says of `error`; for `anyOf` / `oneOf`, with what
/// each branch wanted (else "not valid under any of the schemas" leaves the
/// author guessing).
fn describe(error: &jsonschema::ValidationError<'_>) -> String {
    let branches = match error.kind() {
        ValidationErrorKind::AnyOf { context } | ValidationErrorKind::OneOfNotValid { context } => {
            context
        }
        _ => return error.to_string(),
    };
    let tried: Vec<String> = branches
        .iter()
        .enumerate()
        .map(|(index, errors)| {
            let said: Vec<String> = errors.iter().map(ToString::to_string).collect();
            format!("#{index}: {}", said.join(", "))
        })
        .collect();
    format!("{} ({})", error, tried.join("; "))
}

/// Appends `.key` for identifier-like keys and `["key"]` (JSON-quoted) for
/// others, as the request's other field paths do.
fn push_key(path: &mut String, key: &str) {
    let mut chars = key.chars();
    let identifier = chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if identifier {
        path.push('.');
        path.push_str(key);
    } else {
        path.push('[');
        path.push_str(&Value::String(key.to_owned()).to_string());
        path.push(']');
    }
}

/// `text`, cut to [`MAX_DESCRIPTION_CHARS`] characters.
fn cut(text: &str) -> String {
    match text.char_indices().nth(MAX_DESCRIPTION_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// Violations collected so far: at most [`MAX_VIOLATIONS`] - 1, then a
/// closing note. Validation stops once they are full, so that an intent
/// with a million problems costs no more to refuse than one with a
/// hundred.
#[derive(Default)]
struct Violations {
    kept: Vec<FieldViolation>,
    /// More were found than are kept.
    overflowed: bool,
}

impl Violations {
    fn push(&mut self, field: String, description: String) {
        if self.kept.len() < MAX_VIOLATIONS - 1 {
            self.kept.push(FieldViolation { field, description });
        } else {
            self.overflowed = true;
        }
    }

    /// Whether no more are wanted.
    fn full(&self) -> bool {
        self.overflowed
    }

    fn into_result(mut self) -> Result<(), IntentError> {
        if self.kept.is_empty() {
            return Ok(());
        }
        if self.overflowed {
            self.kept.push(FieldViolation::new(
                "items",
                format!(
                    "more violations are not shown: validation stopped after {}; fix the ones \
                     above and submit again to see the rest",
                    MAX_VIOLATIONS - 1
                ),
            ));
        }
        Err(IntentError::Invalid {
            violations: self.kept,
        })
    }
}

#[cfg(test)]
mod tests;
