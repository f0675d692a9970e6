//! The API's messages as JSON for `-o json` and `-o yaml`.
//!
//! Field names are the proto field names (snake_case, as in intent files);
//! enums are their short names (`CREATED`, `CREATE`); times are RFC 3339,
//! durations `1.5s`; fields at their default value are left out, as in
//! proto3 JSON. An intended item prints exactly as an intent file lists it.

use serde_json::{Map, Value, json};

use super::names;
use crate::convert::properties_from_struct;
use crate::proto as v1;
use reconciled_proto::google::rpc::Status as RpcStatus;

/// A JSON object built field by field, skipping default values.
#[derive(Debug, Default)]
struct Object(Map<String, Value>);

impl Object {
    fn new() -> Self {
        Self::default()
    }

    /// Sets `key` unless `value` is null, false, 0, "" or an empty array.
    fn set(mut self, key: &str, value: Value) -> Self {
        let is_default = match &value {
            Value::Null => true,
            Value::Bool(flag) => !flag,
            Value::Number(number) => number.as_f64() == Some(0.0),
            Value::String(text) => text.is_empty(),
            Value::Array(values) => values.is_empty(),
            Value::Object(_) => false,
        };
        if !is_default {
            self.0.insert(key.to_owned(), value);
        }
        self
    }

    /// Sets `key` even when `value` is a default value.
    fn always(mut self, key: &str, value: Value) -> Self {
        self.0.insert(key.to_owned(), value);
        self
    }

    fn done(self) -> Value {
        Value::Object(self.0)
    }
}

fn optional<T>(value: Option<&T>, convert: impl Fn(&T) -> Value) -> Value {
    value.map_or(Value::Null, convert)
}

/// An item reference: `{"type": ..., "name": ...}`.
pub(crate) fn item_ref(reference: &v1::ItemRef) -> Value {
    json!({"type": reference.r#type, "name": reference.name})
}

/// A timestamp in RFC 3339.
pub(crate) fn timestamp(time: &prost_types::Timestamp) -> Value {
    Value::String(time.to_string())
}

/// A duration such as `1.5s`.
pub(crate) fn duration(duration: &prost_types::Duration) -> Value {
    Value::String(duration.to_string())
}

/// A `google.rpc.Status`: `{"code": "INVALID_ARGUMENT", "message": ...}`.
pub(crate) fn rpc_status(status: &RpcStatus) -> Value {
    json!({"code": names::code(status.code), "message": status.message})
}

/// Properties as a JSON object.
fn properties(properties: Option<&prost_types::Struct>) -> Value {
    Value::Object(
        properties
            .cloned()
            .map(properties_from_struct)
            .unwrap_or_default(),
    )
}

/// A dependency, as an intent file writes it.
fn dependency(dependency: &v1::Dependency) -> Value {
    Object::new()
        .always("requires", optional(dependency.requires.as_ref(), item_ref))
        .set("must_satisfy", json!(dependency.must_satisfy))
        .set("description", json!(dependency.description))
        .set(
            "recreate_when_modified",
            json!(dependency.recreate_when_modified),
        )
        .set(
            "auto_deleted_by_external",
            json!(dependency.auto_deleted_by_external),
        )
        .done()
}

/// An item, as an intent file writes it.
pub(crate) fn item(item: &v1::Item) -> Value {
    Object::new()
        .always("type", json!(item.r#type))
        .always("name", json!(item.name))
        .always("properties", properties(item.properties.as_ref()))
        .set(
            "dependencies",
            Value::Array(item.dependencies.iter().map(dependency).collect()),
        )
        .set("external", json!(item.external))
        .set("subgraph", json!(item.subgraph))
        .set("label", json!(item.label))
        .set("description", json!(item.description))
        .done()
}

/// An intended item: the item's fields plus its `generation`.
pub(crate) fn intended_item(intended: &v1::IntendedItem) -> Value {
    let mut value = optional(intended.item.as_ref(), item);
    if let Value::Object(fields) = &mut value {
        fields.insert("generation".into(), json!(intended.generation));
    }
    value
}

fn in_flight(operation: &v1::InFlightOperation) -> Value {
    Object::new()
        .always("kind", json!(names::operation_kind(operation.kind)))
        .set("op_id", json!(operation.op_id))
        .set("attempt", json!(operation.attempt))
        .set("target_generation", json!(operation.target_generation))
        .set(
            "started_at",
            optional(operation.started_at.as_ref(), timestamp),
        )
        .set("timeout", optional(operation.timeout.as_ref(), duration))
        .set(
            "last_progress_at",
            optional(operation.last_progress_at.as_ref(), timestamp),
        )
        .set("progress_message", json!(operation.progress_message))
        .done()
}

fn kind_or_null(kind: i32) -> Value {
    if kind == 0 {
        Value::Null
    } else {
        json!(names::operation_kind(kind))
    }
}

/// The status of a current item.
pub(crate) fn item_status(status: &v1::ItemStatus) -> Value {
    Object::new()
        .always("ref", optional(status.r#ref.as_ref(), item_ref))
        .always("state", json!(names::item_state(status.state)))
        .set("external", json!(status.external))
        .set("applied", optional(status.applied.as_ref(), item))
        .set("applied_generation", json!(status.applied_generation))
        .set(
            "observed",
            status
                .observed
                .as_ref()
                .map_or(Value::Null, |observed| properties(Some(observed))),
        )
        .set("last_operation", kind_or_null(status.last_operation))
        .set(
            "last_error",
            optional(status.last_error.as_ref(), rpc_status),
        )
        .set("attempts", json!(status.attempts))
        .set(
            "next_attempt_at",
            optional(status.next_attempt_at.as_ref(), timestamp),
        )
        .set("operation", optional(status.operation.as_ref(), in_flight))
        .set("pending_operation", kind_or_null(status.pending_operation))
        .set(
            "reason",
            if status.reason == 0 {
                Value::Null
            } else {
                json!(names::wait_reason(status.reason))
            },
        )
        .set(
            "blocked_by",
            Value::Array(
                status
                    .blocked_by
                    .iter()
                    .map(|blocked| {
                        json!({
                            "item": optional(blocked.item.as_ref(), item_ref),
                            "why": blocked.why,
                        })
                    })
                    .collect(),
            ),
        )
        .set("modifications", json!(status.modifications))
        .done()
}

/// A tenant condition.
pub(crate) fn condition(condition: &v1::Condition) -> Value {
    Object::new()
        .always("type", json!(condition.r#type))
        .always("status", json!(names::condition_status(condition.status)))
        .set("reason", json!(condition.reason))
        .set("message", json!(condition.message))
        .set("observed_generation", json!(condition.observed_generation))
        .set(
            "last_transition_time",
            optional(condition.last_transition_time.as_ref(), timestamp),
        )
        .done()
}

/// A tenant's status.
pub(crate) fn tenant_status(status: &v1::TenantStatus) -> Value {
    let by_state: Map<String, Value> = status
        .items_by_state
        .iter()
        .map(|(state, count)| (state.clone(), json!(count)))
        .collect();
    Object::new()
        .always("tenant", json!(status.tenant))
        .always("generation", json!(status.generation))
        .always("observed_generation", json!(status.observed_generation))
        .always("revision", json!(status.revision))
        .always(
            "conditions",
            Value::Array(status.conditions.iter().map(condition).collect()),
        )
        .always("items_by_state", Value::Object(by_state))
        .always("intended_items", json!(status.intended_items))
        .always("operations_in_flight", json!(status.operations_in_flight))
        .always("connected_item_types", json!(status.connected_item_types))
        .set("owner", json!(status.owner))
        .done()
}

/// A tenant with its limits and status.
pub(crate) fn tenant(tenant: &v1::Tenant) -> Value {
    let limits = tenant.limits.unwrap_or_default();
    Object::new()
        .always("name", json!(tenant.name))
        .set(
            "created_at",
            optional(tenant.created_at.as_ref(), timestamp),
        )
        .always(
            "limits",
            json!({
                "max_items": limits.max_items,
                "max_request_items": limits.max_request_items,
                "max_agents": limits.max_agents,
                "max_watchers": limits.max_watchers,
                "max_operations_in_flight": limits.max_operations_in_flight,
            }),
        )
        .set("status", optional(tenant.status.as_ref(), tenant_status))
        .set("quarantine_error", json!(tenant.quarantine_error))
        .done()
}

/// A plan.
pub(crate) fn plan(plan: &v1::Plan) -> Value {
    Object::new()
        .always(
            "operations",
            Value::Array(
                plan.operations
                    .iter()
                    .map(|operation| {
                        Object::new()
                            .always("index", json!(operation.index))
                            .always("item", optional(operation.item.as_ref(), item_ref))
                            .always("kind", json!(names::operation_kind(operation.kind)))
                            .set("after", json!(operation.after))
                            .set("recreate", json!(operation.recreate))
                            .set("ask_needs_recreate", json!(operation.ask_needs_recreate))
                            .set("target_generation", json!(operation.target_generation))
                            .done()
                    })
                    .collect(),
            ),
        )
        .always("creates", json!(plan.creates))
        .always("modifies", json!(plan.modifies))
        .always("deletes", json!(plan.deletes))
        .always("blocked", json!(plan.blocked))
        .set("truncated", json!(plan.truncated))
        .set(
            "waiting",
            Value::Array(plan.waiting.iter().map(item_status).collect()),
        )
        .done()
}

/// A SubmitIntent reply.
pub(crate) fn submit_response(response: &v1::SubmitIntentResponse, dry_run: bool) -> Value {
    Object::new()
        .always("generation", json!(response.generation))
        .always("changed", json!(response.changed))
        .always("revision", json!(response.revision))
        .always("dry_run", json!(dry_run))
        .always(
            "plan",
            response
                .plan
                .as_ref()
                .map_or_else(|| plan(&v1::Plan::default()), plan),
        )
        .done()
}

/// One entry of a Reconcile operation log.
fn operation_log_entry(entry: &v1::OperationLogEntry) -> Value {
    Object::new()
        .always("item", optional(entry.item.as_ref(), item_ref))
        .always("kind", json!(names::operation_kind(entry.kind)))
        .set("start_time", optional(entry.start_time.as_ref(), timestamp))
        .set("end_time", optional(entry.end_time.as_ref(), timestamp))
        .set("in_progress", json!(entry.in_progress))
        .set("error", optional(entry.error.as_ref(), rpc_status))
        .set(
            "previous_error",
            optional(entry.previous_error.as_ref(), rpc_status),
        )
        .set("op_id", json!(entry.op_id))
        .set("attempt", json!(entry.attempt))
        .done()
}

/// A Reconcile reply, with how the wait ended (`converged`, `stalled`,
/// `timed_out`, `no_progress` or `triggered`).
pub(crate) fn reconcile_response(response: &v1::ReconcileResponse, result: &str) -> Value {
    Object::new()
        .always("result", json!(result))
        .always("iterations", json!(response.iterations))
        .always("converged", json!(response.converged))
        .always("require_rerun", json!(response.require_rerun))
        .always(
            "operation_log",
            Value::Array(
                response
                    .operation_log
                    .iter()
                    .map(operation_log_entry)
                    .collect(),
            ),
        )
        .always("operations_total", json!(response.operations_total))
        .set("truncated", json!(response.truncated))
        .set("status", optional(response.status.as_ref(), tenant_status))
        .done()
}

/// A GetGraph reply.
pub(crate) fn graph(tenant: &str, graph: &v1::GetGraphResponse, view: v1::GraphView) -> Value {
    let mut object = Object::new()
        .always("tenant", json!(tenant))
        .always("revision", json!(graph.revision))
        .always("generation", json!(graph.generation));
    if view != v1::GraphView::Current {
        object = object.always(
            "intended",
            Value::Array(graph.intended.iter().map(intended_item).collect()),
        );
    }
    if view != v1::GraphView::Intended {
        object = object.always(
            "current",
            Value::Array(graph.current.iter().map(item_status).collect()),
        );
    }
    object.done()
}

/// One watch event.
pub(crate) fn event(event: &v1::Event) -> Value {
    use v1::event::Body;
    let mut object = Object::new()
        .always("revision", json!(event.revision))
        .always("kind", json!(names::event_kind(event.kind)))
        .set("time", optional(event.time.as_ref(), timestamp));
    match &event.body {
        Some(Body::IntentChanged(changed)) => {
            object = object
                .always("generation", json!(changed.generation))
                .always("items_changed", json!(changed.items_changed))
                .set(
                    "changed",
                    Value::Array(changed.changed.iter().map(item_ref).collect()),
                );
        }
        Some(Body::ItemStatusChanged(changed)) => {
            object = object
                .always("item", optional(changed.item.as_ref(), item_ref))
                .set("old_state", state_or_null(changed.old_state))
                .set("new_state", state_or_null(changed.new_state))
                .set("error", optional(changed.error.as_ref(), rpc_status))
                .set("status", optional(changed.status.as_ref(), item_status));
        }
        Some(Body::OperationStarted(started)) => {
            object = object
                .always("item", optional(started.item.as_ref(), item_ref))
                .always("operation", json!(names::operation_kind(started.kind)))
                .set("op_id", json!(started.op_id))
                .set("attempt", json!(started.attempt))
                .set("epoch", json!(started.epoch));
        }
        Some(Body::OperationFinished(finished)) => {
            object = object
                .always("item", optional(finished.item.as_ref(), item_ref))
                .always("operation", json!(names::operation_kind(finished.kind)))
                .set("op_id", json!(finished.op_id))
                .set("attempt", json!(finished.attempt))
                .always("outcome", json!(names::outcome(finished.outcome)))
                .set("error", optional(finished.error.as_ref(), rpc_status));
        }
        Some(Body::ConditionsChanged(changed)) => {
            object = object
                .always(
                    "conditions",
                    Value::Array(changed.conditions.iter().map(condition).collect()),
                )
                .set("observed_generation", json!(changed.observed_generation));
        }
        Some(Body::AgentConnected(connected)) => {
            object = object
                .always("agent_id", json!(connected.agent_id))
                .always("item_types", json!(connected.item_types))
                .set("epoch", json!(connected.epoch));
        }
        Some(Body::AgentDisconnected(disconnected)) => {
            object = object
                .always("agent_id", json!(disconnected.agent_id))
                .always("item_types", json!(disconnected.item_types))
                .set("reason", json!(disconnected.reason));
        }
        Some(Body::DriftDetected(drift)) => {
            object = object
                .always("item", optional(drift.item.as_ref(), item_ref))
                .always("paths", json!(drift.paths));
        }
        None => {}
    }
    object.done()
}

fn state_or_null(state: i32) -> Value {
    if state == 0 {
        Value::Null
    } else {
        json!(names::item_state(state))
    }
}

/// One fleet event.
pub(crate) fn fleet_event(event: &v1::FleetEvent) -> Value {
    Object::new()
        .always("revision", json!(event.revision))
        .always("tenant", json!(event.tenant))
        .always(
            "conditions",
            Value::Array(event.conditions.iter().map(condition).collect()),
        )
        .set("time", optional(event.time.as_ref(), timestamp))
        .set("deleted", json!(event.deleted))
        .done()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::properties_to_struct;

    #[test]
    fn an_item_prints_as_an_intent_file_lists_it() {
        let properties = json!({"path": "etc/app", "mode": 420});
        let Value::Object(map) = properties.clone() else {
            panic!("object")
        };
        let value = item(&v1::Item {
            r#type: "file".into(),
            name: "config".into(),
            properties: Some(properties_to_struct(&map)),
            dependencies: vec![v1::Dependency {
                requires: Some(v1::ItemRef {
                    r#type: "directory".into(),
                    name: "etc".into(),
                }),
                ..v1::Dependency::default()
            }],
            ..v1::Item::default()
        });
        assert_eq!(
            value,
            json!({
                "type": "file",
                "name": "config",
                "properties": {"path": "etc/app", "mode": 420},
                "dependencies": [{"requires": {"type": "directory", "name": "etc"}}],
            })
        );
    }
}
