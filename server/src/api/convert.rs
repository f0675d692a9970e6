//! Conversions between the proto types of `reconciled.v1` and the engine's
//! own types (`graph::Item`, `Plan`, ...). Pure functions, no I/O.
//!
//! Conversions from proto report problems as [`FieldViolation`]s with the
//! full field path (`items[3].properties.foo.bar`), ready for a
//! `BadRequest`. Conversions to proto cannot fail.
//!
//! Properties: `google.protobuf.Struct` numbers are doubles, so integers
//! beyond 2^53 travel as strings (DESIGN section 2). Going out, an integer
//! whose magnitude exceeds 2^53 becomes a string; coming in, an integral
//! number within ±2^53 becomes a JSON integer and any other number a float.

use std::sync::Arc;

use imbl::OrdMap;
use prost_types::value::Kind;
use reconciled_proto::google::rpc;
use reconciled_proto::json::MAX_EXACT_INTEGER;
pub use reconciled_proto::json::properties_to_struct;
use reconciled_proto::v1;
use serde_json::{Map, Number, Value as Json};

use crate::engine::plan::{Plan, WaitReason, WaitingItem};
use crate::graph::validate::FieldViolation;
use crate::graph::{
    CurrentItem, Dependency, InFlight, IntendedItem, Item, ItemRef, ItemState, OperationError,
    OperationKind, Properties,
};

/// The deepest nesting of property values accepted from a client: the
/// values of the properties object are at level 1.
pub const MAX_PROPERTY_DEPTH: usize = 64;

/// The most operations (and waiting items) a `Plan` message lists
/// (DESIGN section 8).
pub const PLAN_LIMIT: usize = 1000;

const MILLIS_PER_SECOND: u64 = 1000;
const NANOS_PER_MILLI: u64 = 1_000_000;
const NANOS_PER_SECOND: i32 = 1_000_000_000;

// ---------------------------------------------------------------------------
// Properties <-> google.protobuf.Struct
// ---------------------------------------------------------------------------

/// Converts a `google.protobuf.Struct` received at field `path` (e.g.
/// `items[3].properties`) to properties.
///
/// Integral numbers within ±2^53 become JSON integers, other numbers floats,
/// and a `Value` with no kind set becomes `null`. NaN and infinities (not
/// JSON) and values nested deeper than [`MAX_PROPERTY_DEPTH`] are rejected
/// with a violation naming the offending value's path.
pub fn properties_from_struct(
    value: prost_types::Struct,
    path: &str,
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

    fn into_violation(self, prefix: &str) -> FieldViolation {
        let mut field = prefix.to_owned();
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

/// Converts the fields of a Struct whose values sit at nesting `depth`.
fn struct_to_map(value: prost_types::Struct, depth: usize) -> Result<Properties, NestedError> {
    let mut map = Map::new();
    for (key, field) in value.fields {
        match value_to_json(field, depth) {
            Ok(json) => {
                map.insert(key, json);
            }
            Err(error) => return Err(error.under(Segment::Key(key))),
        }
    }
    Ok(map)
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

// ---------------------------------------------------------------------------
// Items and identities
// ---------------------------------------------------------------------------

/// Converts an identity to its proto form.
pub fn item_ref_to_proto(item: &ItemRef) -> v1::ItemRef {
    v1::ItemRef {
        r#type: item.item_type.to_string(),
        name: item.name.to_string(),
    }
}

/// Converts a proto identity. Names are checked by validation, not here.
pub fn item_ref_from_proto(item: v1::ItemRef) -> ItemRef {
    ItemRef::new(item.r#type, item.name)
}

/// Converts the `index`-th item of a request's `items` field; violations
/// carry paths under `items[index]`.
pub fn item_from_proto(item: v1::Item, index: usize) -> Result<Item, Vec<FieldViolation>> {
    item_from_proto_at(item, &format!("items[{index}]"))
}

/// Converts an item received at field `path` (e.g. `reports[2].put`):
/// absent properties are an empty object; a dependency without `requires`
/// is a violation at `{path}.dependencies[k].requires`. Every violation of
/// the item is returned, not only the first.
pub fn item_from_proto_at(item: v1::Item, path: &str) -> Result<Item, Vec<FieldViolation>> {
    let mut violations = Vec::new();
    let properties = match item.properties {
        None => Properties::new(),
        Some(value) => properties_from_struct(value, &format!("{path}.properties")).unwrap_or_else(
            |violation| {
                violations.push(violation);
                Properties::new()
            },
        ),
    };
    let mut dependencies = Vec::with_capacity(item.dependencies.len());
    for (index, dependency) in item.dependencies.into_iter().enumerate() {
        match dependency_from_proto(dependency, &format!("{path}.dependencies[{index}]")) {
            Ok(dependency) => dependencies.push(dependency),
            Err(violation) => violations.push(violation),
        }
    }
    if !violations.is_empty() {
        return Err(violations);
    }
    Ok(Item {
        item_type: item.r#type,
        name: item.name,
        properties,
        dependencies,
        external: item.external,
        subgraph: item.subgraph,
        label: item.label,
        description: item.description,
    })
}

fn dependency_from_proto(
    dependency: v1::Dependency,
    path: &str,
) -> Result<Dependency, FieldViolation> {
    let requires = dependency.requires.ok_or_else(|| {
        FieldViolation::new(
            format!("{path}.requires"),
            "is missing; name the required item with its type and name",
        )
    })?;
    Ok(Dependency {
        requires: item_ref_from_proto(requires),
        must_satisfy: dependency.must_satisfy,
        description: dependency.description,
        recreate_when_modified: dependency.recreate_when_modified,
        auto_deleted_by_external: dependency.auto_deleted_by_external,
    })
}

/// Converts an item to its proto form.
pub fn item_to_proto(item: &Item) -> v1::Item {
    v1::Item {
        r#type: item.item_type.clone(),
        name: item.name.clone(),
        properties: Some(properties_to_struct(&item.properties)),
        dependencies: item.dependencies.iter().map(dependency_to_proto).collect(),
        external: item.external,
        subgraph: item.subgraph.clone(),
        label: item.label.clone(),
        description: item.description.clone(),
    }
}

fn dependency_to_proto(dependency: &Dependency) -> v1::Dependency {
    v1::Dependency {
        requires: Some(item_ref_to_proto(&dependency.requires)),
        must_satisfy: dependency.must_satisfy.clone(),
        description: dependency.description.clone(),
        recreate_when_modified: dependency.recreate_when_modified,
        auto_deleted_by_external: dependency.auto_deleted_by_external,
    }
}

/// Converts an intended item (value and generation) to its proto form.
pub fn intended_item_to_proto(intended: &IntendedItem) -> v1::IntendedItem {
    v1::IntendedItem {
        item: Some(item_to_proto(&intended.item)),
        generation: intended.generation,
    }
}

// ---------------------------------------------------------------------------
// Enums and errors
// ---------------------------------------------------------------------------

/// Converts an item state to its proto enum.
pub fn item_state_to_proto(state: ItemState) -> v1::ItemState {
    match state {
        ItemState::Pending => v1::ItemState::Pending,
        ItemState::Creating => v1::ItemState::Creating,
        ItemState::Modifying => v1::ItemState::Modifying,
        ItemState::Deleting => v1::ItemState::Deleting,
        ItemState::Created => v1::ItemState::Created,
        ItemState::Failed => v1::ItemState::Failed,
        ItemState::Unknown => v1::ItemState::Unknown,
    }
}

/// Converts an operation kind to its proto enum.
pub fn operation_kind_to_proto(kind: OperationKind) -> v1::OperationKind {
    match kind {
        OperationKind::Create => v1::OperationKind::Create,
        OperationKind::Modify => v1::OperationKind::Modify,
        OperationKind::Delete => v1::OperationKind::Delete,
        OperationKind::Read => v1::OperationKind::Read,
    }
}

/// Converts a wait reason to its proto enum.
pub fn wait_reason_to_proto(reason: WaitReason) -> v1::WaitReason {
    match reason {
        WaitReason::Dependency => v1::WaitReason::Dependency,
        WaitReason::NoConfigurator => v1::WaitReason::NoConfigurator,
        WaitReason::Backoff => v1::WaitReason::Backoff,
        WaitReason::Blocked => v1::WaitReason::Blocked,
        WaitReason::TerminalFailure => v1::WaitReason::TerminalFailure,
        WaitReason::UnknownOutcome => v1::WaitReason::UnknownOutcome,
    }
}

/// Converts a configurator's failure to a `google.rpc.Status` (code and
/// message; no details).
pub fn operation_error_to_status(error: &OperationError) -> rpc::Status {
    rpc::Status {
        code: error.code,
        message: error.message.clone(),
        details: Vec::new(),
    }
}

/// Converts a `google.rpc.Status` reported by a configurator to an
/// operation error. Details are dropped: the engine keeps code and message.
pub fn operation_error_from_status(status: &rpc::Status) -> OperationError {
    OperationError {
        code: status.code,
        message: status.message.clone(),
    }
}

// ---------------------------------------------------------------------------
// Times
// ---------------------------------------------------------------------------

/// Converts unix milliseconds to a `Timestamp`.
pub fn timestamp_from_ms(unix_ms: u64) -> prost_types::Timestamp {
    let (seconds, nanos) = split_millis(unix_ms);
    prost_types::Timestamp { seconds, nanos }
}

/// Converts milliseconds to a `Duration`.
pub fn duration_from_ms(ms: u64) -> prost_types::Duration {
    let (seconds, nanos) = split_millis(ms);
    prost_types::Duration { seconds, nanos }
}

/// Whole seconds and the remaining nanoseconds of `ms`. Both always fit:
/// u64::MAX / 1000 < i64::MAX, and the remainder is below 10^9.
fn split_millis(ms: u64) -> (i64, i32) {
    let seconds = i64::try_from(ms / MILLIS_PER_SECOND).unwrap_or(i64::MAX);
    let nanos = i32::try_from((ms % MILLIS_PER_SECOND) * NANOS_PER_MILLI).unwrap_or(0);
    (seconds, nanos)
}

/// Converts a `Duration` received at field `field` to milliseconds, rounding
/// a partial millisecond up (so a non-zero duration never becomes zero).
/// Negative durations, `nanos` outside `0..1e9` and durations that overflow
/// u64 milliseconds are rejected.
pub fn duration_to_ms(
    duration: &prost_types::Duration,
    field: &str,
) -> Result<u64, FieldViolation> {
    let invalid = |problem: String| FieldViolation::new(field, problem);
    if duration.seconds < 0 || duration.nanos < 0 {
        return Err(invalid(format!(
            "is negative ({}s {}ns); give a duration of zero or more",
            duration.seconds, duration.nanos
        )));
    }
    if duration.nanos >= NANOS_PER_SECOND {
        return Err(invalid(format!(
            "has nanos {} outside 0 to 999,999,999; carry whole seconds into `seconds`",
            duration.nanos
        )));
    }
    let seconds = u64::try_from(duration.seconds).unwrap_or(u64::MAX);
    let nanos = u64::try_from(duration.nanos).unwrap_or(0);
    seconds
        .checked_mul(MILLIS_PER_SECOND)
        .and_then(|ms| ms.checked_add(nanos.div_ceil(NANOS_PER_MILLI)))
        .ok_or_else(|| {
            invalid(format!(
                "is {} seconds, too long to represent in milliseconds; give a shorter duration",
                duration.seconds
            ))
        })
}

// ---------------------------------------------------------------------------
// Item status
// ---------------------------------------------------------------------------

/// The status of one item, assembled from what is known about it: its
/// current entry, its intended entry and, if the planner found it waiting,
/// why.
///
/// The state is the current entry's (so an item whose Create failed shows
/// `FAILED`); with no current entry it is `PENDING` when the item is
/// intended or waits for a Create, and `UNSPECIFIED` when nothing says what
/// it is. `applied` is present only when the item has an applied value
/// (absent while `CREATING`). `external` comes from the intended value, else
/// from the applied one.
pub fn item_status(
    item: &ItemRef,
    current: Option<&CurrentItem>,
    intended: Option<&IntendedItem>,
    waiting: Option<&WaitingItem>,
) -> v1::ItemStatus {
    let mut status = v1::ItemStatus {
        r#ref: Some(item_ref_to_proto(item)),
        state: status_state(current, intended, waiting).into(),
        external: is_external(current, intended),
        ..v1::ItemStatus::default()
    };
    if let Some(current) = current {
        fill_current(&mut status, current);
    }
    if let Some(waiting) = waiting {
        fill_waiting(&mut status, waiting);
    }
    status
}

fn status_state(
    current: Option<&CurrentItem>,
    intended: Option<&IntendedItem>,
    waiting: Option<&WaitingItem>,
) -> v1::ItemState {
    match current {
        Some(current) => item_state_to_proto(current.state),
        None if intended.is_some()
            || waiting.is_some_and(|w| w.operation == OperationKind::Create) =>
        {
            v1::ItemState::Pending
        }
        None => v1::ItemState::Unspecified,
    }
}

fn is_external(current: Option<&CurrentItem>, intended: Option<&IntendedItem>) -> bool {
    match (intended, current.and_then(|c| c.applied.as_ref())) {
        (Some(intended), _) => intended.item.external,
        (None, Some(applied)) => applied.external,
        (None, None) => false,
    }
}

fn fill_current(status: &mut v1::ItemStatus, current: &CurrentItem) {
    status.applied = current.applied.as_deref().map(item_to_proto);
    status.applied_generation = current.applied_generation;
    status.observed = current.observed.as_deref().map(properties_to_struct);
    status.last_operation = current
        .last_operation
        .map_or(v1::OperationKind::Unspecified, operation_kind_to_proto)
        .into();
    status.last_error = current.last_error.as_ref().map(operation_error_to_status);
    status.attempts = current.attempts;
    status.next_attempt_at = current.next_attempt_at_ms.map(timestamp_from_ms);
    status.operation = current.in_flight.as_ref().map(in_flight_to_proto);
    status.modifications = current.modifications;
}

fn fill_waiting(status: &mut v1::ItemStatus, waiting: &WaitingItem) {
    status.pending_operation = operation_kind_to_proto(waiting.operation).into();
    status.reason = wait_reason_to_proto(waiting.reason).into();
    status.blocked_by = waiting
        .blocked_by
        .iter()
        .map(|blocked| v1::BlockedBy {
            item: Some(item_ref_to_proto(&blocked.item)),
            why: blocked.why.clone(),
        })
        .collect();
}

/// Converts an in-flight operation to its proto form.
pub fn in_flight_to_proto(operation: &InFlight) -> v1::InFlightOperation {
    v1::InFlightOperation {
        kind: operation_kind_to_proto(operation.kind).into(),
        op_id: operation.op_id.clone(),
        attempt: operation.attempt,
        target_generation: operation.target_generation,
        started_at: Some(timestamp_from_ms(operation.started_at_ms)),
        timeout: Some(duration_from_ms(operation.timeout_ms)),
        last_progress_at: operation.last_progress_ms.map(timestamp_from_ms),
        progress_message: String::new(),
    }
}

// ---------------------------------------------------------------------------
// Plans
// ---------------------------------------------------------------------------

/// Converts a plan, listing at most `limit` operations (usually
/// [`PLAN_LIMIT`]) and at most `limit` waiting items.
///
/// Each listed operation keeps its index in the plan, and its `after` holds
/// all of [`Plan::predecessors`] (so the wait of Creates for same-type
/// Deletes is visible). The counts cover every operation, `blocked` counts
/// every waiting item, and `truncated` is set when anything was left out.
/// Waiting items carry only what the plan knows (identity, pending
/// operation, reason, blocked by); [`plan_to_proto_with_items`] adds their
/// state.
pub fn plan_to_proto(plan: &Plan, limit: usize) -> v1::Plan {
    plan_with_waiting_status(plan, limit, |waiting| {
        item_status(&waiting.item, None, None, Some(waiting))
    })
}

/// Like [`plan_to_proto`], with each waiting item's full status taken from
/// the items the plan was made from (e.g. a tenant snapshot's maps, or
/// `IntendedGraph::snapshot()` / `CurrentGraph::snapshot()`).
pub fn plan_to_proto_with_items(
    plan: &Plan,
    limit: usize,
    intended: &OrdMap<ItemRef, Arc<IntendedItem>>,
    current: &OrdMap<ItemRef, Arc<CurrentItem>>,
) -> v1::Plan {
    plan_with_waiting_status(plan, limit, |waiting| {
        item_status(
            &waiting.item,
            current.get(&waiting.item).map(AsRef::as_ref),
            intended.get(&waiting.item).map(AsRef::as_ref),
            Some(waiting),
        )
    })
}

fn plan_with_waiting_status(
    plan: &Plan,
    limit: usize,
    status_of: impl Fn(&WaitingItem) -> v1::ItemStatus,
) -> v1::Plan {
    let (creates, modifies, deletes) = plan.counts();
    v1::Plan {
        operations: (0..plan.operations.len().min(limit))
            .map(|index| planned_operation_to_proto(plan, index))
            .collect(),
        creates: saturating_u32(creates),
        modifies: saturating_u32(modifies),
        deletes: saturating_u32(deletes),
        blocked: saturating_u32(plan.waiting.len()),
        truncated: plan.operations.len() > limit || plan.waiting.len() > limit,
        waiting: plan.waiting.iter().take(limit).map(status_of).collect(),
    }
}

/// Operation `index` of `plan`; the caller keeps `index` in range.
fn planned_operation_to_proto(plan: &Plan, index: usize) -> v1::PlannedOperation {
    let operation = &plan.operations[index];
    let mut after: Vec<u32> = plan.predecessors(index).map(saturating_u32).collect();
    after.sort_unstable();
    after.dedup();
    v1::PlannedOperation {
        index: saturating_u32(index),
        item: Some(item_ref_to_proto(&operation.item)),
        kind: operation_kind_to_proto(operation.kind).into(),
        after,
        recreate: operation.recreate,
        ask_needs_recreate: operation.ask_needs_recreate,
        target_generation: operation.target_generation,
    }
}

fn saturating_u32(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::engine::plan::{BlockedBy, PlannedOperation};

    fn props(value: Json) -> Properties {
        value.as_object().cloned().unwrap_or_default()
    }

    fn number(value: f64) -> prost_types::Value {
        prost_types::Value {
            kind: Some(Kind::NumberValue(value)),
        }
    }

    fn object(fields: Vec<(&str, prost_types::Value)>) -> prost_types::Struct {
        prost_types::Struct {
            fields: fields
                .into_iter()
                .map(|(key, value)| (key.to_owned(), value))
                .collect(),
        }
    }

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

    fn proto_ref(item_type: &str, name: &str) -> v1::ItemRef {
        v1::ItemRef {
            r#type: item_type.to_owned(),
            name: name.to_owned(),
        }
    }

    #[test]
    fn items_convert_both_ways() {
        let item = Item {
            item_type: "vlan".into(),
            name: "10".into(),
            properties: props(json!({"id": 10, "ports": ["a", "b"]})),
            dependencies: vec![Dependency {
                requires: ItemRef::new("port", "a"),
                must_satisfy: "self.up".into(),
                description: "needs the port".into(),
                recreate_when_modified: true,
                auto_deleted_by_external: false,
            }],
            external: false,
            subgraph: "net/vlans".into(),
            label: "VLAN 10".into(),
            description: "test".into(),
        };
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

    #[test]
    fn enums_map_to_their_proto_values() {
        assert_eq!(
            item_state_to_proto(ItemState::Failed),
            v1::ItemState::Failed
        );
        assert_eq!(
            item_state_to_proto(ItemState::Unknown),
            v1::ItemState::Unknown
        );
        assert_eq!(
            operation_kind_to_proto(OperationKind::Read),
            v1::OperationKind::Read
        );
        assert_eq!(
            wait_reason_to_proto(WaitReason::TerminalFailure),
            v1::WaitReason::TerminalFailure
        );
        assert_eq!(
            wait_reason_to_proto(WaitReason::NoConfigurator),
            v1::WaitReason::NoConfigurator
        );
    }

    #[test]
    fn operation_errors_become_rpc_statuses_and_back() {
        let error = OperationError {
            code: 14,
            message: "agent gone".into(),
        };
        let status = operation_error_to_status(&error);
        assert_eq!((status.code, status.message.as_str()), (14, "agent gone"));
        assert_eq!(operation_error_from_status(&status), error);
    }

    #[test]
    fn milliseconds_become_timestamps_and_durations() {
        let stamp = timestamp_from_ms(1_700_000_000_123);
        assert_eq!((stamp.seconds, stamp.nanos), (1_700_000_000, 123_000_000));
        let duration = duration_from_ms(u64::MAX);
        assert_eq!(duration_to_ms(&duration, "timeout"), Ok(u64::MAX));
        assert_eq!(duration_to_ms(&duration_from_ms(1500), "timeout"), Ok(1500));
    }

    #[test]
    fn partial_milliseconds_round_up() {
        let duration = prost_types::Duration {
            seconds: 0,
            nanos: 1,
        };
        assert_eq!(duration_to_ms(&duration, "timeout"), Ok(1));
    }

    #[test]
    fn negative_malformed_and_overflowing_durations_are_rejected() {
        let cases = [
            (-1, 0, "negative"),
            (0, -5, "negative"),
            (1, 1_000_000_000, "nanos"),
            (i64::MAX, 0, "too long"),
        ];
        for (seconds, nanos, words) in cases {
            let duration = prost_types::Duration { seconds, nanos };
            let violation = duration_to_ms(&duration, "timeout").err();
            assert_eq!(
                violation.as_ref().map(|v| v.field.as_str()),
                Some("timeout")
            );
            assert!(
                violation.is_some_and(|v| v.description.contains(words)),
                "{seconds}s {nanos}ns should be rejected as {words}"
            );
        }
    }

    fn in_flight(kind: OperationKind) -> InFlight {
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
        }
    }

    fn intended(item: Item, generation: u64) -> IntendedItem {
        IntendedItem {
            item: Arc::new(item),
            generation,
            predicates: Arc::from(Vec::new()),
        }
    }

    #[test]
    fn an_intended_item_without_current_entry_is_pending() {
        let key = ItemRef::new("t", "a");
        let entry = intended(Item::new("t", "a", Properties::new()), 1);
        let status = item_status(&key, None, Some(&entry), None);
        assert_eq!(status.state(), v1::ItemState::Pending);
        assert_eq!(status.r#ref, Some(proto_ref("t", "a")));
        assert!(status.applied.is_none());
    }

    #[test]
    fn a_creating_item_shows_its_operation_and_no_applied_value() {
        let key = ItemRef::new("t", "a");
        let current = CurrentItem::creating(in_flight(OperationKind::Create));
        let status = item_status(&key, Some(&current), None, None);
        assert_eq!(status.state(), v1::ItemState::Creating);
        assert!(status.applied.is_none());
        let operation = status.operation.unwrap_or_default();
        assert_eq!(operation.kind(), v1::OperationKind::Create);
        assert_eq!(operation.op_id, "op-1");
        assert_eq!((operation.attempt, operation.target_generation), (2, 7));
        assert_eq!(operation.started_at, Some(timestamp_from_ms(1_000)));
        assert_eq!(operation.timeout, Some(duration_from_ms(30_000)));
        assert_eq!(operation.last_progress_at, Some(timestamp_from_ms(5_500)));
    }

    #[test]
    fn a_failed_create_keeps_its_state_and_shows_the_error_and_wait() {
        let key = ItemRef::new("t", "a");
        let mut current = CurrentItem::creating(in_flight(OperationKind::Create));
        current.state = ItemState::Failed;
        current.in_flight = None;
        current.last_operation = Some(OperationKind::Create);
        current.last_error = Some(OperationError {
            code: 14,
            message: "agent gone".into(),
        });
        current.attempts = 3;
        current.next_attempt_at_ms = Some(9_000);
        let entry = intended(Item::new("t", "a", Properties::new()), 4);
        let waiting = WaitingItem {
            item: key.clone(),
            operation: OperationKind::Create,
            reason: WaitReason::Backoff,
            blocked_by: vec![BlockedBy {
                item: key.clone(),
                why: "retry at 9000".into(),
            }],
        };
        let status = item_status(&key, Some(&current), Some(&entry), Some(&waiting));
        assert_eq!(status.state(), v1::ItemState::Failed);
        assert_eq!(status.last_operation(), v1::OperationKind::Create);
        assert_eq!(status.last_error.as_ref().map(|e| e.code), Some(14));
        assert_eq!(status.attempts, 3);
        assert_eq!(status.next_attempt_at, Some(timestamp_from_ms(9_000)));
        assert_eq!(status.pending_operation(), v1::OperationKind::Create);
        assert_eq!(status.reason(), v1::WaitReason::Backoff);
        assert_eq!(status.blocked_by.len(), 1);
        assert_eq!(status.blocked_by[0].why, "retry at 9000");
    }

    #[test]
    fn a_created_item_shows_applied_observed_and_external() {
        let key = ItemRef::new("t", "a");
        let mut applied = Item::new("t", "a", props(json!({"mtu": 1500})));
        applied.external = true;
        let mut current = CurrentItem::created(Arc::new(applied), 3);
        current.observed = Some(Arc::new(props(json!({"state": "up"}))));
        current.modifications = 2;
        let status = item_status(&key, Some(&current), None, None);
        assert_eq!(status.state(), v1::ItemState::Created);
        assert_eq!(status.applied_generation, 3);
        assert!(status.external);
        assert_eq!(status.modifications, 2);
        let observed = status
            .observed
            .map(|s| properties_from_struct(s, "observed"));
        assert_eq!(observed, Some(Ok(props(json!({"state": "up"})))));
        let applied = status.applied.and_then(|a| a.properties);
        assert_eq!(
            applied.map(|s| properties_from_struct(s, "applied")),
            Some(Ok(props(json!({"mtu": 1500}))))
        );
    }

    fn operation(name: &str, kind: OperationKind, after: Vec<usize>) -> PlannedOperation {
        PlannedOperation {
            item: ItemRef::new("t", name),
            kind,
            after,
            recreate: false,
            ask_needs_recreate: false,
            target_generation: 1,
        }
    }

    fn waiting(name: &str) -> WaitingItem {
        WaitingItem {
            item: ItemRef::new("t", name),
            operation: OperationKind::Create,
            reason: WaitReason::Dependency,
            blocked_by: vec![BlockedBy {
                item: ItemRef::new("t", "missing"),
                why: "missing".into(),
            }],
        }
    }

    fn sample_plan() -> Plan {
        Plan {
            operations: vec![
                operation("old", OperationKind::Delete, vec![]),
                operation("x", OperationKind::Modify, vec![]),
                operation("new", OperationKind::Create, vec![1]),
                operation("other", OperationKind::Create, vec![]),
            ],
            waiting: vec![waiting("w1"), waiting("w2")],
            type_barriers: BTreeMap::from([(Arc::from("t"), vec![0])]),
            ..Plan::default()
        }
    }

    #[test]
    fn plans_list_operations_with_type_barriers_in_after() {
        let plan = plan_to_proto(&sample_plan(), PLAN_LIMIT);
        assert_eq!(plan.operations.len(), 4);
        assert_eq!(plan.operations[2].index, 2);
        assert_eq!(plan.operations[2].after, [0, 1]);
        assert_eq!(plan.operations[3].after, [0]);
        assert!(plan.operations[0].after.is_empty());
        assert_eq!((plan.creates, plan.modifies, plan.deletes), (2, 1, 1));
        assert_eq!(plan.blocked, 2);
        assert!(!plan.truncated);
        assert_eq!(plan.waiting.len(), 2);
        assert_eq!(plan.waiting[0].reason(), v1::WaitReason::Dependency);
        assert_eq!(plan.waiting[0].state(), v1::ItemState::Pending);
        assert_eq!(plan.waiting[0].blocked_by[0].why, "missing");
    }

    #[test]
    fn truncated_plans_keep_counts_over_every_operation() {
        let plan = plan_to_proto(&sample_plan(), 1);
        assert_eq!(plan.operations.len(), 1);
        assert_eq!(plan.waiting.len(), 1);
        assert_eq!((plan.creates, plan.modifies, plan.deletes), (2, 1, 1));
        assert_eq!(plan.blocked, 2);
        assert!(plan.truncated);
    }

    #[test]
    fn plans_with_graphs_show_the_state_of_waiting_items() {
        let mut current = crate::graph::CurrentGraph::default();
        let mut failed = CurrentItem::creating(in_flight(OperationKind::Create));
        failed.state = ItemState::Failed;
        failed.in_flight = None;
        current.insert(ItemRef::new("t", "w1"), failed);
        let plan = plan_to_proto_with_items(
            &sample_plan(),
            PLAN_LIMIT,
            &crate::graph::IntendedGraph::default().snapshot(),
            &current.snapshot(),
        );
        assert_eq!(plan.waiting[0].state(), v1::ItemState::Failed);
        assert_eq!(plan.waiting[1].state(), v1::ItemState::Pending);
    }
}
