//! Properties <-> `google.protobuf.Struct`.
//!
//! `google.protobuf.Struct` numbers are doubles, so integers beyond 2^53
//! travel as strings (DESIGN section 2). Going out, an integer whose
//! magnitude exceeds 2^53 becomes a string; coming in, an integral number
//! within ±2^53 becomes a JSON integer and any other number a float.

use prost_types::value::Kind;
use reconciled_proto::json::MAX_EXACT_INTEGER;
pub use reconciled_proto::json::properties_to_struct;
use serde_json::{Number, Value as Json};

use crate::graph::MAX_PROPERTY_DEPTH;
use crate::graph::Properties;
use crate::graph::validate::FieldViolation;

/// Converts a `google.protobuf.Struct` received at field `path` (e.g.
/// `items[3].properties`) to properties.
///
/// Integral numbers within ±2^53 become JSON integers, other numbers floats,
/// and a `Value` with no kind set becomes `null`. NaN and infinities (not
/// JSON) and values nested deeper than [`MAX_PROPERTY_DEPTH`] are rejected
/// with a violation naming the offending value's path.
pub fn properties_from_struct(
    value: prost_types::Struct,
    path: impl std::fmt::Display,
) -> Result<Properties, FieldViolation> {
    struct_to_map(value, 1).map_err(|error| error.into_violation(path))
}

/// One step of a path inside properties.
#[derive(Debug)]
enum Segment {
    Key(String),
    Index(usize),
}

/// What is wrong with a property value.
#[derive(Debug)]
enum ValueProblem {
    NotFinite(f64),
    TooDeep,
}

/// A problem found below some value, with the path to it collected while
/// the error travels up (innermost segment first).
#[derive(Debug)]
struct NestedError {
    reversed_path: Vec<Segment>,
    problem: ValueProblem,
}

impl NestedError {
    fn new(problem: ValueProblem) -> Self {
        Self {
            reversed_path: Vec::new(),
            problem,
        }
    }

    fn under(mut self, segment: Segment) -> Self {
        self.reversed_path.push(segment);
        self
    }

    fn into_violation(self, prefix: impl std::fmt::Display) -> FieldViolation {
        let mut field = prefix.to_string();
        for segment in self.reversed_path.iter().rev() {
            push_segment(&mut field, segment);
        }
        let description = match self.problem {
            ValueProblem::NotFinite(number) => format!(
                "is {number}, which JSON cannot represent; send a finite number, or a string"
            ),
            ValueProblem::TooDeep => format!(
                "is nested more than {MAX_PROPERTY_DEPTH} levels deep; flatten the properties"
            ),
        };
        FieldViolation::new(field, description)
    }
}

/// Appends `.key` for identifier-like keys, `["key"]` (JSON-quoted) for
/// others, and `[index]` for list elements.
fn push_segment(field: &mut String, segment: &Segment) {
    match segment {
        Segment::Key(key) if is_identifier(key) => {
            field.push('.');
            field.push_str(key);
        }
        Segment::Key(key) => {
            field.push('[');
            field.push_str(&Json::String(key.clone()).to_string());
            field.push(']');
        }
        Segment::Index(index) => {
            field.push_str(&format!("[{index}]"));
        }
    }
}

fn is_identifier(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Converts the fields of a Struct whose values sit at nesting `depth`
/// into an object: [`Properties`] at the top, a JSON map below.
fn struct_to_map<Object: FromIterator<(String, Json)>>(
    value: prost_types::Struct,
    depth: usize,
) -> Result<Object, NestedError> {
    value
        .fields
        .into_iter()
        .map(|(key, field)| match value_to_json(field, depth) {
            Ok(json) => Ok((key, json)),
            Err(error) => Err(error.under(Segment::Key(key))),
        })
        .collect()
}

fn value_to_json(value: prost_types::Value, depth: usize) -> Result<Json, NestedError> {
    if depth > MAX_PROPERTY_DEPTH {
        return Err(NestedError::new(ValueProblem::TooDeep));
    }
    match value.kind {
        None | Some(Kind::NullValue(_)) => Ok(Json::Null),
        Some(Kind::BoolValue(flag)) => Ok(Json::Bool(flag)),
        Some(Kind::StringValue(text)) => Ok(Json::String(text)),
        Some(Kind::NumberValue(number)) => number_to_json(number).map_err(NestedError::new),
        Some(Kind::StructValue(object)) => struct_to_map(object, depth + 1).map(Json::Object),
        Some(Kind::ListValue(list)) => list_to_json(list, depth + 1),
    }
}

fn list_to_json(list: prost_types::ListValue, depth: usize) -> Result<Json, NestedError> {
    list.values
        .into_iter()
        .enumerate()
        .map(|(index, element)| {
            value_to_json(element, depth).map_err(|error| error.under(Segment::Index(index)))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Json::Array)
}

/// An integral double within ±2^53 as a JSON integer, any other finite
/// double as a JSON float.
fn number_to_json(number: f64) -> Result<Json, ValueProblem> {
    if !number.is_finite() {
        return Err(ValueProblem::NotFinite(number));
    }
    // Exact: both bounds are powers of two, and within them every integral
    // double converts to i64 without loss.
    let exact_bound = MAX_EXACT_INTEGER as f64;
    if number.fract() == 0.0 && number.abs() <= exact_bound {
        return Ok(Json::from(number as i64));
    }
    Number::from_f64(number)
        .map(Json::Number)
        .ok_or(ValueProblem::NotFinite(number))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::wire::testkit::{number, object, props};

    fn nested(value: prost_types::Struct) -> prost_types::Value {
        prost_types::Value {
            kind: Some(Kind::StructValue(value)),
        }
    }

    #[test]
    fn properties_survive_a_round_trip_through_struct() {
        let original = props(json!({
            "mtu": 1500,
            "ratio": 0.25,
            "negative": -7,
            "up": true,
            "none": null,
            "name": "eth0",
            "tags": ["a", 1, [2.5, {"deep": false}]],
            "nested": {"a": {"b": {"c": "d"}}},
        }));
        let back = properties_from_struct(properties_to_struct(&original), "properties");
        assert_eq!(back, Ok(original));
    }

    #[test]
    fn integers_beyond_two_to_the_53_travel_as_strings() {
        let limit = 1_i64 << 53;
        let original = props(json!({
            "at_limit": limit,
            "below_negative_limit": -limit - 1,
            "above": limit + 1,
            "huge": u64::MAX,
        }));
        let wire = properties_to_struct(&original);
        let kind = |key: &str| wire.fields.get(key).and_then(|v| v.kind.clone());
        assert_eq!(kind("at_limit"), Some(Kind::NumberValue(limit as f64)));
        assert_eq!(
            kind("below_negative_limit"),
            Some(Kind::StringValue((-limit - 1).to_string()))
        );
        assert_eq!(
            kind("above"),
            Some(Kind::StringValue((limit + 1).to_string()))
        );
        assert_eq!(kind("huge"), Some(Kind::StringValue(u64::MAX.to_string())));
    }

    #[test]
    fn integral_numbers_within_range_become_integers_and_others_floats() {
        let wire = object(vec![
            ("whole", number(1500.0)),
            ("negative", number(-3.0)),
            ("fraction", number(2.5)),
            ("beyond", number(2f64.powi(60))),
        ]);
        let properties = properties_from_struct(wire, "properties");
        let properties = properties.unwrap_or_default();
        assert_eq!(properties.get("whole"), Some(&json!(1500)));
        assert!(properties.get("whole").is_some_and(Json::is_i64));
        assert_eq!(properties.get("negative"), Some(&json!(-3)));
        assert_eq!(properties.get("fraction"), Some(&json!(2.5)));
        assert!(properties.get("beyond").is_some_and(Json::is_f64));
    }

    #[test]
    fn a_value_without_kind_becomes_null() {
        let wire = object(vec![("empty", prost_types::Value { kind: None })]);
        assert_eq!(
            properties_from_struct(wire, "p"),
            Ok(props(json!({"empty": null})))
        );
    }

    #[test]
    fn nan_and_infinity_are_rejected_with_their_field_path() {
        let wire = object(vec![(
            "foo",
            nested(object(vec![("bar", number(f64::NAN))])),
        )]);
        let violation = properties_from_struct(wire, "items[3].properties");
        assert_eq!(
            violation.map_err(|v| v.field),
            Err("items[3].properties.foo.bar".to_owned())
        );

        let list = prost_types::Value {
            kind: Some(Kind::ListValue(prost_types::ListValue {
                values: vec![number(1.0), number(f64::NEG_INFINITY)],
            })),
        };
        let wire = object(vec![("odd key", list)]);
        let violation = properties_from_struct(wire, "items[0].properties");
        let violation = violation.err();
        assert_eq!(
            violation.as_ref().map(|v| v.field.as_str()),
            Some(r#"items[0].properties["odd key"][1]"#)
        );
        assert!(violation.is_some_and(|v| v.description.contains("finite")));
    }

    fn nested_struct(levels: usize) -> prost_types::Struct {
        let mut value = object(vec![("leaf", number(1.0))]);
        for _ in 1..levels {
            value = object(vec![("n", nested(value))]);
        }
        value
    }

    #[test]
    fn nesting_up_to_64_levels_is_accepted_and_deeper_is_rejected() {
        assert!(properties_from_struct(nested_struct(MAX_PROPERTY_DEPTH), "p").is_ok());

        let violation = properties_from_struct(nested_struct(MAX_PROPERTY_DEPTH + 1), "p").err();
        let expected = format!("p{}.leaf", ".n".repeat(MAX_PROPERTY_DEPTH));
        assert_eq!(violation.as_ref().map(|v| v.field.clone()), Some(expected));
        assert!(violation.is_some_and(|v| v.description.contains("64 levels")));
    }
}
