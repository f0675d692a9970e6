//! Builders shared by the unit tests of the wire room.

use prost_types::value::Kind;
use reconciled_proto::v1;
use serde_json::Value as Json;

use crate::graph::{InFlight, OperationKind, Properties};

/// The properties of a JSON object (empty for anything else).
pub fn props(value: Json) -> Properties {
    Properties::try_from(value).unwrap_or_default()
}

/// A number value.
pub fn number(value: f64) -> prost_types::Value {
    prost_types::Value {
        kind: Some(Kind::NumberValue(value)),
    }
}

/// A Struct with `fields`.
pub fn object(fields: Vec<(&str, prost_types::Value)>) -> prost_types::Struct {
    prost_types::Struct {
        fields: fields
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value))
            .collect(),
    }
}

/// A proto item identity.
pub fn proto_ref(item_type: &str, name: &str) -> v1::ItemRef {
    v1::ItemRef {
        r#type: item_type.to_owned(),
        name: name.to_owned(),
    }
}

/// An operation of `kind` in flight as attempt 2 for generation 7, started
/// at 1000 ms with a 30 s timeout and progress at 5500 ms.
pub fn in_flight(kind: OperationKind) -> InFlight {
    InFlight {
        kind,
        op_id: "op-1".into(),
        attempt: 2,
        target_generation: 7,
        started_at_ms: 1_000,
        timeout_ms: 30_000,
        last_progress_ms: Some(5_500),
        cancel_requested: false,
        cancel_requested_at_ms: None,
        redeliveries: 0,
        question: false,
        target: None,
        dispatch_marks: Default::default(),
        progress_message: None,
        resolves: None,
    }
}
