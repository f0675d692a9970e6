//! The schema the dashboard's protobuf codec (`ui/proto.js`) reads: every
//! message and enum of the compiled descriptor set, as JSON. It is derived
//! at run time from [`reconciled_proto::FILE_DESCRIPTOR_SET`], the same
//! descriptors the services are generated from, so the page can never
//! decode with a stale copy of the `.proto` files.
//!
//! Shape:
//!
//! ```json
//! { "messages": { "reconciled.v1.ItemRef": {
//!       "fields": { "1": ["type", "string", false, null], ... },
//!       "map": false } },
//!   "enums": { "reconciled.v1.ItemState": { "0": "ITEM_STATE_UNSPECIFIED", ... } } }
//! ```
//!
//! A field is `[name, type, repeated, type_name]`; `type` is the proto
//! scalar name (`uint64`, `string`, ...), `message` or `enum`, with
//! `type_name` the full name without the leading dot. A map field is a
//! repeated message whose message has `"map": true` (fields 1 and 2 are
//! the key and the value).

use std::sync::OnceLock;

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};
use serde_json::{Map, Value, json};

/// The schema as JSON text, computed once.
pub fn schema_json() -> &'static str {
    static SCHEMA: OnceLock<String> = OnceLock::new();
    SCHEMA.get_or_init(|| build(reconciled_proto::FILE_DESCRIPTOR_SET).to_string())
}

/// Builds the schema of an encoded `FileDescriptorSet`. An undecodable set
/// (a build defect: it is compiled in) gives an empty schema.
pub fn build(encoded: &[u8]) -> Value {
    let set = FileDescriptorSet::decode(encoded).unwrap_or_default();
    let mut messages = Map::new();
    let mut enums = Map::new();
    for file in &set.file {
        let package = file.package();
        for message in &file.message_type {
            add_message(package, message, &mut messages, &mut enums);
        }
        for enumeration in &file.enum_type {
            add_enum(package, enumeration, &mut enums);
        }
    }
    json!({ "messages": messages, "enums": enums })
}

fn add_message(
    scope: &str,
    message: &DescriptorProto,
    messages: &mut Map<String, Value>,
    enums: &mut Map<String, Value>,
) {
    let name = format!("{scope}.{}", message.name());
    let mut fields = Map::new();
    for field in &message.field {
        let kind = match field.r#type() {
            Type::Message | Type::Group => "message",
            Type::Enum => "enum",
            Type::Double => "double",
            Type::Float => "float",
            Type::Int64 => "int64",
            Type::Uint64 => "uint64",
            Type::Int32 => "int32",
            Type::Fixed64 => "fixed64",
            Type::Fixed32 => "fixed32",
            Type::Bool => "bool",
            Type::String => "string",
            Type::Bytes => "bytes",
            Type::Uint32 => "uint32",
            Type::Sfixed32 => "sfixed32",
            Type::Sfixed64 => "sfixed64",
            Type::Sint32 => "sint32",
            Type::Sint64 => "sint64",
        };
        let type_name = field
            .type_name
            .as_deref()
            .map(|full| Value::from(full.trim_start_matches('.')))
            .unwrap_or(Value::Null);
        fields.insert(
            field.number().to_string(),
            json!([
                field.name(),
                kind,
                field.label() == Label::Repeated,
                type_name
            ]),
        );
    }
    let is_map = message
        .options
        .as_ref()
        .and_then(|options| options.map_entry)
        .unwrap_or(false);
    messages.insert(name.clone(), json!({ "fields": fields, "map": is_map }));
    for nested in &message.nested_type {
        add_message(&name, nested, messages, enums);
    }
    for enumeration in &message.enum_type {
        add_enum(&name, enumeration, enums);
    }
}

fn add_enum(
    scope: &str,
    enumeration: &prost_types::EnumDescriptorProto,
    enums: &mut Map<String, Value>,
) {
    let values: Map<String, Value> = enumeration
        .value
        .iter()
        .map(|value| (value.number().to_string(), Value::from(value.name())))
        .collect();
    enums.insert(
        format!("{scope}.{}", enumeration.name()),
        Value::Object(values),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_holds_the_messages_the_dashboard_decodes() {
        let schema: Value = serde_json::from_str(schema_json()).expect("valid JSON");
        let field =
            |message: &str, number: &str| schema["messages"][message]["fields"][number].clone();
        assert_eq!(
            field("reconciled.v1.FleetEvent", "2"),
            json!(["tenant", "string", false, null])
        );
        assert_eq!(
            field("reconciled.v1.ItemStatus", "13"),
            json!(["blocked_by", "message", true, "reconciled.v1.BlockedBy"])
        );
        assert_eq!(
            field("google.protobuf.Value", "5"),
            json!(["struct_value", "message", false, "google.protobuf.Struct"])
        );
        assert_eq!(
            schema["messages"]["reconciled.v1.TenantStatus.ItemsByStateEntry"]["map"],
            json!(true)
        );
        assert_eq!(
            schema["enums"]["reconciled.v1.ItemState"]["5"],
            json!("ITEM_STATE_CREATED")
        );
        assert_eq!(
            schema["messages"]["google.rpc.Status"]["fields"]["2"][0],
            json!("message")
        );
    }
}
