//! The stored records as protobuf messages (`reconciled.store.v1`,
//! `proto/reconciled/store/v1/records.proto`): each record type converts to
//! its message for [`encode`](super::encode) and back for
//! [`decode`](super::decode).
//!
//! Property values stay JSON text inside the messages (see the proto file
//! for why). A message that decodes but breaks an invariant of the model (an
//! unknown state, an intended record without its item) is refused with a
//! message naming what is wrong, like a record that does not decode.

use std::collections::BTreeMap;
use std::sync::Arc;

use reconciled_proto::store::v1 as pb;

use super::{StoredIntended, TenantLimits, TenantRecord};
use crate::engine::conditions::{Condition, ConditionKind};
use crate::engine::exec::{RetryPolicy, StoredSpec, TypeSpec};
use crate::engine::schema::TypeSchema;
use crate::graph::{
    CurrentItem, Dependency, InFlight, Item, ItemRef, ItemState, OperationError, OperationKind,
    Properties, RareFields, RetryOf,
};

/// A record type the store holds, and its protobuf message.
pub trait StoredRecord: Sized {
    /// The message it is stored as.
    type Message: prost::Message + Default;

    /// The message for `self`; fails only if a property value cannot be
    /// written as JSON (a server defect).
    fn to_message(&self) -> Result<Self::Message, String>;

    /// The record a decoded message holds, or what is wrong with it.
    fn from_message(message: Self::Message) -> Result<Self, String>;
}

impl StoredRecord for TenantRecord {
    type Message = pb::Tenant;

    fn to_message(&self) -> Result<pb::Tenant, String> {
        Ok(pb::Tenant {
            id: self.id,
            name: self.name.clone(),
            created_at_ms: self.created_at_ms,
            generation: self.generation,
            observed_generation: self.observed_generation,
            revision: self.revision,
            limits: Some(limits_message(&self.limits)),
            token_hash: self.token_hash.clone(),
            deleted: self.deleted,
            conditions: self.conditions.iter().map(condition_message).collect(),
            compact_revision: self.compact_revision,
            history_bytes: self.history_bytes,
        })
    }

    fn from_message(message: pb::Tenant) -> Result<Self, String> {
        let limits = message.limits.unwrap_or_default();
        Ok(Self {
            id: message.id,
            name: message.name,
            created_at_ms: message.created_at_ms,
            generation: message.generation,
            observed_generation: message.observed_generation,
            revision: message.revision,
            limits: TenantLimits {
                max_items: limits.max_items,
                max_request_items: limits.max_request_items,
                max_agents: limits.max_agents,
                max_watchers: limits.max_watchers,
                max_operations_in_flight: limits.max_operations_in_flight,
            },
            token_hash: message.token_hash,
            deleted: message.deleted,
            conditions: message
                .conditions
                .into_iter()
                .map(condition_from)
                .collect::<Result<_, _>>()?,
            compact_revision: message.compact_revision,
            history_bytes: message.history_bytes,
        })
    }
}

impl StoredRecord for StoredIntended {
    type Message = pb::Intended;

    fn to_message(&self) -> Result<pb::Intended, String> {
        intended_message(&self.item, self.generation)
    }

    fn from_message(message: pb::Intended) -> Result<Self, String> {
        let item = message.item.ok_or("an intended record without its item")?;
        Ok(Self {
            item: item_from(item)?,
            generation: message.generation,
        })
    }
}

/// The message of the intended record of `item` at `generation`, from a
/// borrowed item (what [`StoredIntended::to_message`] makes, without a
/// copy of the item to hold it first).
pub(super) fn intended_message(item: &Item, generation: u64) -> Result<pb::Intended, String> {
    Ok(pb::Intended {
        item: Some(item_message(item)?),
        generation,
    })
}

impl StoredRecord for CurrentItem {
    type Message = pb::Current;

    fn to_message(&self) -> Result<pb::Current, String> {
        Ok(pb::Current {
            state: state_message(self.state) as i32,
            applied: self.applied.as_deref().map(item_message).transpose()?,
            applied_generation: self.applied_generation,
            observed: self.observed.as_deref().map(json_text).transpose()?,
            last_operation: kind_message(self.last_operation) as i32,
            last_error: self
                .rare
                .last_error
                .as_ref()
                .map(|error| pb::OperationError {
                    code: error.code,
                    message: error.message.clone(),
                }),
            attempts: self.attempts,
            next_attempt_at_ms: self.rare.next_attempt_at_ms,
            failed_generation: self.rare.failed_generation,
            in_flight: self
                .in_flight
                .as_deref()
                .map(in_flight_message)
                .transpose()?,
            modifications: self.modifications,
            dependency_marks: marks_message(&self.rare.dependency_marks),
            unknown_was_created: self.unknown_was_created,
            needs_recreate_answer: self.rare.needs_recreate_answer.map(|(generation, needs)| {
                pb::RecreateAnswer {
                    generation,
                    needs_recreate: needs,
                }
            }),
            retry_of: self.rare.retry_of.as_ref().map(|retry| pb::RetryOf {
                kind: kind_message(Some(retry.kind)) as i32,
                target_generation: retry.target_generation,
                op_id: retry.op_id.clone(),
            }),
            gave_up: self.gave_up,
            gone_with_external: self.gone_with_external,
            gone_unless_applied: self.gone_unless_applied,
            existence_uncertain: self.existence_uncertain,
            maybe_applied: self
                .rare
                .maybe_applied
                .iter()
                .map(|value| item_message(value))
                .collect::<Result<_, _>>()?,
        })
    }

    fn from_message(message: pb::Current) -> Result<Self, String> {
        Ok(Self {
            state: state_from(message.state)?,
            applied: optional_item(message.applied)?,
            applied_generation: message.applied_generation,
            observed: message
                .observed
                .map(|text| properties_from(&text).map(Arc::new))
                .transpose()?,
            last_operation: kind_from(message.last_operation)?,
            attempts: message.attempts,
            in_flight: message
                .in_flight
                .map(|message| in_flight_from(message).map(Box::new))
                .transpose()?,
            modifications: message.modifications,
            unknown_was_created: message.unknown_was_created,
            gave_up: message.gave_up,
            gone_with_external: message.gone_with_external,
            gone_unless_applied: message.gone_unless_applied,
            existence_uncertain: message.existence_uncertain,
            rare: RareFields {
                last_error: message.last_error.map(|error| OperationError {
                    code: error.code,
                    message: error.message,
                }),
                next_attempt_at_ms: message.next_attempt_at_ms,
                failed_generation: message.failed_generation,
                dependency_marks: marks_from(message.dependency_marks),
                needs_recreate_answer: message
                    .needs_recreate_answer
                    .map(|answer| (answer.generation, answer.needs_recreate)),
                retry_of: message.retry_of.map(retry_of_from).transpose()?,
                maybe_applied: message
                    .maybe_applied
                    .into_iter()
                    .map(|value| item_from(value).map(Arc::new))
                    .collect::<Result<_, _>>()?,
            }
            .into(),
        })
    }
}

impl StoredRecord for StoredSpec {
    type Message = pb::Spec;

    fn to_message(&self) -> Result<pb::Spec, String> {
        let spec = &self.spec;
        Ok(pb::Spec {
            spec: Some(pb::TypeSpec {
                item_type: spec.item_type.clone(),
                recreate_on_change: spec.recreate_on_change.clone(),
                ask_needs_recreate: spec.ask_needs_recreate,
                retry: Some(retry_message(&spec.retry)),
                max_attempts: spec.max_attempts,
                operation_timeout_ms: spec.operation_timeout_ms,
                supports_read: spec.supports_read,
                max_in_flight: spec.max_in_flight,
                schema: spec
                    .schema
                    .as_ref()
                    .map(|schema| serde_json::to_vec(schema.json()))
                    .transpose()
                    .map_err(|error| error.to_string())?,
            }),
            epoch: self.epoch,
            held_by: self.held_by.clone(),
        })
    }

    fn from_message(message: pb::Spec) -> Result<Self, String> {
        let spec = message.spec.ok_or("a type spec record without its spec")?;
        let schema = spec
            .schema
            .map(|text| serde_json::from_slice(&text).map(TypeSchema::stored))
            .transpose()
            .map_err(|error| format!("the type's schema is not JSON: {error}"))?;
        Ok(Self {
            spec: TypeSpec {
                item_type: spec.item_type,
                recreate_on_change: spec.recreate_on_change,
                ask_needs_recreate: spec.ask_needs_recreate,
                retry: retry_from(spec.retry)?,
                max_attempts: spec.max_attempts,
                operation_timeout_ms: spec.operation_timeout_ms,
                supports_read: spec.supports_read,
                max_in_flight: spec.max_in_flight,
                schema,
            },
            epoch: message.epoch,
            held_by: message.held_by,
        })
    }
}

/// Properties as compact JSON text; no properties: no bytes.
fn properties_text(properties: &Properties) -> Result<Vec<u8>, String> {
    if properties.is_empty() {
        return Ok(Vec::new());
    }
    json_text(properties)
}

fn json_text(properties: &Properties) -> Result<Vec<u8>, String> {
    serde_json::to_vec(properties).map_err(|error| error.to_string())
}

fn properties_from(text: &[u8]) -> Result<Properties, String> {
    if text.is_empty() {
        return Ok(Properties::new());
    }
    serde_json::from_slice(text)
        .map_err(|error| format!("properties are not a JSON object: {error}"))
}

fn item_message(item: &Item) -> Result<pb::Item, String> {
    Ok(pb::Item {
        r#type: item.item_type().to_string(),
        name: item.name().to_string(),
        properties: properties_text(&item.properties)?,
        dependencies: item
            .dependencies
            .iter()
            .map(|dependency| pb::Dependency {
                requires_type: dependency.requires.item_type().to_string(),
                requires_name: dependency.requires.name().to_string(),
                must_satisfy: dependency.must_satisfy().to_string(),
                description: dependency.description().to_string(),
                recreate_when_modified: dependency.recreate_when_modified(),
                auto_deleted_by_external: dependency.auto_deleted_by_external(),
            })
            .collect(),
        external: item.external,
        subgraph: item.subgraph.to_string(),
        label: item.label().to_owned(),
        description: item.description().to_owned(),
    })
}

fn item_from(message: pb::Item) -> Result<Item, String> {
    let mut item = Item::identified(ItemRef::new(message.r#type, message.name));
    item.properties = properties_from(&message.properties)?;
    item.dependencies = message
        .dependencies
        .into_iter()
        .map(|dependency| {
            Dependency::on(ItemRef::new(
                dependency.requires_type,
                dependency.requires_name,
            ))
            .with_must_satisfy(dependency.must_satisfy)
            .with_description(dependency.description)
            .with_recreate_when_modified(dependency.recreate_when_modified)
            .with_auto_deleted_by_external(dependency.auto_deleted_by_external)
        })
        .collect();
    item.external = message.external;
    item.subgraph = message.subgraph.into();
    Ok(item
        .with_label(message.label)
        .with_description(message.description))
}

fn optional_item(message: Option<pb::Item>) -> Result<Option<Arc<Item>>, String> {
    message
        .map(|item| item_from(item).map(Arc::new))
        .transpose()
}

fn in_flight_message(in_flight: &InFlight) -> Result<pb::InFlight, String> {
    Ok(pb::InFlight {
        kind: kind_message(Some(in_flight.kind)) as i32,
        op_id: in_flight.op_id.clone(),
        attempt: in_flight.attempt,
        target_generation: in_flight.target_generation,
        started_at_ms: in_flight.started_at_ms,
        timeout_ms: in_flight.timeout_ms,
        last_progress_ms: in_flight.last_progress_ms,
        cancel_requested: in_flight.cancel_requested,
        cancel_requested_at_ms: in_flight.cancel_requested_at_ms,
        redeliveries: in_flight.redeliveries,
        question: in_flight.question,
        target: in_flight.target.as_deref().map(item_message).transpose()?,
        dispatch_marks: marks_message(&in_flight.dispatch_marks),
        progress_message: in_flight.progress_message.clone(),
        resolves: in_flight
            .resolves
            .as_deref()
            .map(|lost| in_flight_message(lost).map(Box::new))
            .transpose()?,
    })
}

fn in_flight_from(message: pb::InFlight) -> Result<InFlight, String> {
    Ok(InFlight {
        kind: required_kind(message.kind)?,
        op_id: message.op_id,
        attempt: message.attempt,
        target_generation: message.target_generation,
        started_at_ms: message.started_at_ms,
        timeout_ms: message.timeout_ms,
        last_progress_ms: message.last_progress_ms,
        cancel_requested: message.cancel_requested,
        cancel_requested_at_ms: message.cancel_requested_at_ms,
        redeliveries: message.redeliveries,
        question: message.question,
        target: optional_item(message.target)?,
        dispatch_marks: marks_from(message.dispatch_marks),
        progress_message: message.progress_message,
        resolves: message
            .resolves
            .map(|lost| in_flight_from(*lost).map(Box::new))
            .transpose()?,
    })
}

fn retry_of_from(message: pb::RetryOf) -> Result<RetryOf, String> {
    Ok(RetryOf {
        kind: required_kind(message.kind)?,
        target_generation: message.target_generation,
        op_id: message.op_id,
    })
}

fn marks_message(marks: &BTreeMap<ItemRef, u64>) -> Vec<pb::Mark> {
    marks
        .iter()
        .map(|(item, counter)| pb::Mark {
            r#type: item.item_type().to_string(),
            name: item.name().to_string(),
            counter: *counter,
        })
        .collect()
}

fn marks_from(marks: Vec<pb::Mark>) -> BTreeMap<ItemRef, u64> {
    marks
        .into_iter()
        .map(|mark| (ItemRef::new(mark.r#type, mark.name), mark.counter))
        .collect()
}

fn state_message(state: ItemState) -> pb::ItemState {
    match state {
        ItemState::Pending => pb::ItemState::Pending,
        ItemState::Creating => pb::ItemState::Creating,
        ItemState::Modifying => pb::ItemState::Modifying,
        ItemState::Deleting => pb::ItemState::Deleting,
        ItemState::Created => pb::ItemState::Created,
        ItemState::Failed => pb::ItemState::Failed,
        ItemState::Unknown => pb::ItemState::Unknown,
    }
}

fn state_from(value: i32) -> Result<ItemState, String> {
    Ok(match pb::ItemState::try_from(value) {
        Ok(pb::ItemState::Pending) => ItemState::Pending,
        Ok(pb::ItemState::Creating) => ItemState::Creating,
        Ok(pb::ItemState::Modifying) => ItemState::Modifying,
        Ok(pb::ItemState::Deleting) => ItemState::Deleting,
        Ok(pb::ItemState::Created) => ItemState::Created,
        Ok(pb::ItemState::Failed) => ItemState::Failed,
        Ok(pb::ItemState::Unknown) => ItemState::Unknown,
        Ok(pb::ItemState::Unspecified) | Err(_) => {
            return Err(format!("unknown item state {value}"));
        }
    })
}

fn kind_message(kind: Option<OperationKind>) -> pb::OperationKind {
    match kind {
        None => pb::OperationKind::Unspecified,
        Some(OperationKind::Create) => pb::OperationKind::Create,
        Some(OperationKind::Modify) => pb::OperationKind::Modify,
        Some(OperationKind::Delete) => pb::OperationKind::Delete,
        Some(OperationKind::Read) => pb::OperationKind::Read,
    }
}

fn kind_from(value: i32) -> Result<Option<OperationKind>, String> {
    Ok(match pb::OperationKind::try_from(value) {
        Ok(pb::OperationKind::Unspecified) => None,
        Ok(pb::OperationKind::Create) => Some(OperationKind::Create),
        Ok(pb::OperationKind::Modify) => Some(OperationKind::Modify),
        Ok(pb::OperationKind::Delete) => Some(OperationKind::Delete),
        Ok(pb::OperationKind::Read) => Some(OperationKind::Read),
        Err(_) => return Err(format!("unknown operation kind {value}")),
    })
}

fn required_kind(value: i32) -> Result<OperationKind, String> {
    kind_from(value)?.ok_or_else(|| "an operation without its kind".to_owned())
}

fn limits_message(limits: &TenantLimits) -> pb::TenantLimits {
    pb::TenantLimits {
        max_items: limits.max_items,
        max_request_items: limits.max_request_items,
        max_agents: limits.max_agents,
        max_watchers: limits.max_watchers,
        max_operations_in_flight: limits.max_operations_in_flight,
    }
}

fn condition_message(condition: &Condition) -> pb::Condition {
    let kind = match condition.kind {
        ConditionKind::Ready => pb::ConditionKind::Ready,
        ConditionKind::Reconciling => pb::ConditionKind::Reconciling,
        ConditionKind::Stalled => pb::ConditionKind::Stalled,
    };
    pb::Condition {
        kind: kind as i32,
        status: condition.status,
        reason: condition.reason.clone(),
        message: condition.message.clone(),
        observed_generation: condition.observed_generation,
        last_transition_ms: condition.last_transition_ms,
    }
}

fn condition_from(message: pb::Condition) -> Result<Condition, String> {
    let kind = match pb::ConditionKind::try_from(message.kind) {
        Ok(pb::ConditionKind::Ready) => ConditionKind::Ready,
        Ok(pb::ConditionKind::Reconciling) => ConditionKind::Reconciling,
        Ok(pb::ConditionKind::Stalled) => ConditionKind::Stalled,
        Ok(pb::ConditionKind::Unspecified) | Err(_) => {
            return Err(format!("unknown condition kind {}", message.kind));
        }
    };
    Ok(Condition {
        kind,
        status: message.status,
        reason: message.reason,
        message: message.message,
        observed_generation: message.observed_generation,
        last_transition_ms: message.last_transition_ms,
    })
}

fn retry_message(retry: &RetryPolicy) -> pb::RetryPolicy {
    use pb::retry_policy::Policy;
    let policy = match *retry {
        RetryPolicy::Static { wait_ms } => Policy::StaticWait(pb::StaticRetry { wait_ms }),
        RetryPolicy::Random { min_ms, max_ms } => {
            Policy::Random(pb::RandomRetry { min_ms, max_ms })
        }
        RetryPolicy::Exponential {
            initial_ms,
            multiplier,
            max_ms,
        } => Policy::Exponential(pb::ExponentialRetry {
            initial_ms,
            multiplier,
            max_ms,
        }),
    };
    pb::RetryPolicy {
        policy: Some(policy),
    }
}

fn retry_from(message: Option<pb::RetryPolicy>) -> Result<RetryPolicy, String> {
    use pb::retry_policy::Policy;
    match message.and_then(|retry| retry.policy) {
        Some(Policy::StaticWait(retry)) => Ok(RetryPolicy::Static {
            wait_ms: retry.wait_ms,
        }),
        Some(Policy::Random(retry)) => Ok(RetryPolicy::Random {
            min_ms: retry.min_ms,
            max_ms: retry.max_ms,
        }),
        Some(Policy::Exponential(retry)) => Ok(RetryPolicy::Exponential {
            initial_ms: retry.initial_ms,
            multiplier: retry.multiplier,
            max_ms: retry.max_ms,
        }),
        None => Err("a type spec without its retry policy".to_owned()),
    }
}
