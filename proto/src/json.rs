//! JSON values (`serde_json`) as the well-known proto types the API uses
//! for properties (`google.protobuf.Struct`, `Value`), shared by the server
//! and the client SDK.
//!
//! Numbers follow DESIGN section 2: `Struct` numbers are doubles, so an
//! integer whose magnitude exceeds 2^53 travels as a decimal string; coming
//! in, an integral number within ±2^53 becomes a JSON integer and any other
//! finite number a JSON float.

use prost_types::value::Kind;
use serde_json::{Map, Number, Value};

/// 2^53: the largest magnitude up to which every integer is exact in a double.
pub const MAX_EXACT_INTEGER: u64 = 1 << 53;

/// Converts a JSON object (a `serde_json::Map`, or any other type that
/// lists its keys and values) to a `google.protobuf.Struct`. Integers whose
/// magnitude exceeds 2^53 become decimal strings.
pub fn properties_to_struct<'a, K: AsRef<str>>(
    properties: impl IntoIterator<Item = (K, &'a Value)>,
) -> prost_types::Struct {
    prost_types::Struct {
        fields: properties
            .into_iter()
            .map(|(key, value)| (key.as_ref().to_owned(), json_to_value(value)))
            .collect(),
    }
}

/// Converts a `google.protobuf.Struct` to a JSON object.
///
/// Integral numbers within ±2^53 become JSON integers and other numbers
/// floats. Values JSON cannot hold (NaN, infinities) and `Value`s with no
/// kind set become `null`; the server never sends them.
pub fn properties_from_struct(properties: prost_types::Struct) -> Map<String, Value> {
    properties
        .fields
        .into_iter()
        .map(|(key, value)| (key, value_to_json(value)))
        .collect()
}

/// Converts one JSON value to a `google.protobuf.Value` (see
/// [`properties_to_struct`]).
pub fn json_to_value(value: &Value) -> prost_types::Value {
    let kind = match value {
        Value::Null => Kind::NullValue(prost_types::NullValue::NullValue.into()),
        Value::Bool(flag) => Kind::BoolValue(*flag),
        Value::Number(number) => number_to_kind(number),
        Value::String(text) => Kind::StringValue(text.clone()),
        Value::Array(values) => Kind::ListValue(prost_types::ListValue {
            values: values.iter().map(json_to_value).collect(),
        }),
        Value::Object(object) => Kind::StructValue(properties_to_struct(object)),
    };
    prost_types::Value { kind: Some(kind) }
}

/// Converts one `google.protobuf.Value` to JSON (see
/// [`properties_from_struct`]).
pub fn value_to_json(value: prost_types::Value) -> Value {
    match value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(flag)) => Value::Bool(flag),
        Some(Kind::StringValue(text)) => Value::String(text),
        Some(Kind::NumberValue(number)) => number_to_json(number),
        Some(Kind::StructValue(object)) => Value::Object(properties_from_struct(object)),
        Some(Kind::ListValue(list)) => {
            Value::Array(list.values.into_iter().map(value_to_json).collect())
        }
    }
}

/// A JSON number as a Struct number, or as a string when a double would
/// lose digits of it.
fn number_to_kind(number: &Number) -> Kind {
    let exact_integer = match (number.as_i64(), number.as_u64()) {
        (Some(signed), _) => Some(signed.unsigned_abs()),
        (None, Some(unsigned)) => Some(unsigned),
        (None, None) => None,
    };
    match (exact_integer, number.as_f64()) {
        (Some(magnitude), _) if magnitude > MAX_EXACT_INTEGER => {
            Kind::StringValue(number.to_string())
        }
        (_, Some(double)) => Kind::NumberValue(double),
        (_, None) => Kind::StringValue(number.to_string()),
    }
}

fn number_to_json(number: f64) -> Value {
    if !number.is_finite() {
        return Value::Null;
    }
    // Exact: the bound is a power of two, and within it every integral double
    // converts to i64 without loss.
    if number.fract() == 0.0 && number.abs() <= MAX_EXACT_INTEGER as f64 {
        return Value::from(number as i64);
    }
    Number::from_f64(number).map_or(Value::Null, Value::Number)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn properties_survive_a_round_trip_through_struct() {
        let properties = object(json!({
            "path": "etc/app",
            "mode": 420,
            "ratio": 0.5,
            "negative": -3,
            "enabled": true,
            "nothing": null,
            "list": [1, "two", [3.5]],
            "nested": {"deeper": {"x": 1}},
        }));
        let back = properties_from_struct(properties_to_struct(&properties));
        assert_eq!(back, properties);
    }

    #[test]
    fn integers_beyond_two_to_the_53_travel_as_strings() {
        let properties =
            object(json!({"big": 9_007_199_254_740_993_u64, "edge": 9_007_199_254_740_992_u64}));
        let wire = properties_to_struct(&properties);
        assert_eq!(
            wire.fields["big"].kind,
            Some(Kind::StringValue("9007199254740993".into()))
        );
        assert_eq!(
            wire.fields["edge"].kind,
            Some(Kind::NumberValue(9_007_199_254_740_992.0))
        );
    }

    #[test]
    fn integral_doubles_come_back_as_integers_and_others_as_floats() {
        assert_eq!(number_to_json(420.0), json!(420));
        assert!(number_to_json(420.0).is_i64());
        assert_eq!(number_to_json(0.25), json!(0.25));
        assert_eq!(number_to_json(1e300), json!(1e300));
        assert_eq!(number_to_json(f64::NAN), Value::Null);
        assert_eq!(
            value_to_json(prost_types::Value { kind: None }),
            Value::Null
        );
    }
}
