//! Registered item types -> `ItemTypeSpec` (what `GetItemTypes` shows).

use reconciled_proto::v1;
use serde_json::Value;

use super::properties::properties_to_struct;
use super::time::duration_from_ms;
use crate::engine::exec::{RetryPolicy, TypeSpec};

/// A registered type's spec as the server keeps it (defaults filled in),
/// with its schema.
pub fn type_spec_to_proto(spec: &TypeSpec) -> v1::ItemTypeSpec {
    let policy = match &spec.retry {
        RetryPolicy::Static { wait_ms } => v1::retry_policy::Policy::StaticRetry(v1::StaticRetry {
            wait: Some(duration_from_ms(*wait_ms)),
        }),
        RetryPolicy::Random { min_ms, max_ms } => {
            v1::retry_policy::Policy::Random(v1::RandomRetry {
                min: Some(duration_from_ms(*min_ms)),
                max: Some(duration_from_ms(*max_ms)),
            })
        }
        RetryPolicy::Exponential {
            initial_ms,
            multiplier,
            max_ms,
        } => v1::retry_policy::Policy::Exponential(v1::ExponentialRetry {
            initial: Some(duration_from_ms(*initial_ms)),
            multiplier: *multiplier,
            max: Some(duration_from_ms(*max_ms)),
        }),
    };
    v1::ItemTypeSpec {
        item_type: spec.item_type.clone(),
        recreate_on_change: spec.recreate_on_change.clone(),
        ask_needs_recreate: spec.ask_needs_recreate,
        retry_policy: Some(v1::RetryPolicy {
            policy: Some(policy),
            max_attempts: spec.max_attempts,
        }),
        operation_timeout: Some(duration_from_ms(spec.operation_timeout_ms)),
        supports_read: spec.supports_read,
        max_in_flight: spec.max_in_flight,
        schema: spec
            .schema
            .as_ref()
            .map(|schema| schema_to_struct(schema.json())),
    }
}

/// A schema as a `Struct`: `true` is `{}` (anything), `false` is
/// `{"not": {}}` (nothing).
fn schema_to_struct(schema: &Value) -> prost_types::Struct {
    match schema {
        Value::Object(object) => properties_to_struct(object),
        Value::Bool(false) => prost_types::Struct {
            fields: [(
                "not".to_owned(),
                prost_types::Value {
                    kind: Some(prost_types::value::Kind::StructValue(
                        prost_types::Struct::default(),
                    )),
                },
            )]
            .into_iter()
            .collect(),
        },
        _ => prost_types::Struct::default(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::engine::schema::TypeSchema;

    #[test]
    fn a_spec_goes_out_with_its_schema_and_defaults() {
        let mut spec = TypeSpec::new("kv");
        spec.recreate_on_change = vec!["/key".into()];
        spec.schema = Some(
            TypeSchema::compile(json!({"type": "object", "required": ["key"]})).expect("compiles"),
        );
        let wire = type_spec_to_proto(&spec);
        assert_eq!(wire.item_type, "kv");
        assert_eq!(wire.recreate_on_change, ["/key"]);
        assert_eq!(wire.operation_timeout.map(|d| d.seconds), Some(60));
        let schema = wire.schema.expect("a schema");
        assert!(schema.fields.contains_key("required"));
        assert!(type_spec_to_proto(&TypeSpec::new("x")).schema.is_none());
    }
}
