//! From the frozen JSON records of version 1 to the protobuf records of
//! `reconciled.store.v1`.
//!
//! Property objects (an item's properties, observed properties, a type's
//! JSON Schema) stay JSON, as compact text in `bytes` fields. Writing that
//! text into memory cannot fail in practice (the keys are strings, the
//! numbers finite); should it, the error is passed up, never hidden.

use std::collections::BTreeMap;

use reconciled_proto::store::v1 as pb;

use super::v1_json as json;

/// A conversion's outcome: only writing JSON text can fail.
type Result<T> = std::result::Result<T, serde_json::Error>;

/// A property object as JSON text; the empty object is empty bytes (the
/// proto's "no properties").
fn properties(map: &json::Properties) -> Result<Vec<u8>> {
    if map.is_empty() {
        Ok(Vec::new())
    } else {
        serde_json::to_vec(map)
    }
}

/// An item value.
fn item(item: json::Item) -> Result<pb::Item> {
    Ok(pb::Item {
        properties: properties(&item.properties)?,
        r#type: item.item_type,
        name: item.name,
        dependencies: item.dependencies.into_iter().map(dependency).collect(),
        external: item.external,
        subgraph: item.subgraph,
        label: item.label,
        description: item.description,
    })
}

/// One dependency.
fn dependency(dependency: json::Dependency) -> pb::Dependency {
    pb::Dependency {
        requires_type: dependency.requires.item_type,
        requires_name: dependency.requires.name,
        must_satisfy: dependency.must_satisfy,
        description: dependency.description,
        recreate_when_modified: dependency.recreate_when_modified,
        auto_deleted_by_external: dependency.auto_deleted_by_external,
    }
}

/// Marks in the map's order: by (type, name).
fn marks(marks: BTreeMap<json::ItemRef, u64>) -> Vec<pb::Mark> {
    marks
        .into_iter()
        .map(|(item, counter)| pb::Mark {
            r#type: item.item_type,
            name: item.name,
            counter,
        })
        .collect()
}

/// An item state.
fn state(state: json::ItemState) -> pb::ItemState {
    match state {
        json::ItemState::Pending => pb::ItemState::Pending,
        json::ItemState::Creating => pb::ItemState::Creating,
        json::ItemState::Modifying => pb::ItemState::Modifying,
        json::ItemState::Deleting => pb::ItemState::Deleting,
        json::ItemState::Created => pb::ItemState::Created,
        json::ItemState::Failed => pb::ItemState::Failed,
        json::ItemState::Unknown => pb::ItemState::Unknown,
    }
}

/// An operation kind.
fn operation(kind: json::OperationKind) -> pb::OperationKind {
    match kind {
        json::OperationKind::Create => pb::OperationKind::Create,
        json::OperationKind::Modify => pb::OperationKind::Modify,
        json::OperationKind::Delete => pb::OperationKind::Delete,
        json::OperationKind::Read => pb::OperationKind::Read,
    }
}

/// An operation in flight, with the one it resolves.
fn in_flight(op: json::InFlight) -> Result<pb::InFlight> {
    Ok(pb::InFlight {
        kind: operation(op.kind).into(),
        op_id: op.op_id,
        attempt: op.attempt,
        target_generation: op.target_generation,
        started_at_ms: op.started_at_ms,
        timeout_ms: op.timeout_ms,
        last_progress_ms: op.last_progress_ms,
        cancel_requested: op.cancel_requested,
        cancel_requested_at_ms: op.cancel_requested_at_ms,
        redeliveries: op.redeliveries,
        question: op.question,
        target: op.target.map(item).transpose()?,
        dispatch_marks: marks(op.dispatch_marks),
        progress_message: op.progress_message,
        resolves: match op.resolves {
            Some(resolved) => Some(Box::new(in_flight(*resolved)?)),
            None => None,
        },
    })
}

/// An intended item.
pub(super) fn intended(stored: json::StoredIntended) -> Result<pb::Intended> {
    Ok(pb::Intended {
        item: Some(item(stored.item)?),
        generation: stored.generation,
    })
}

/// A current item.
pub(super) fn current(current: json::CurrentItem) -> Result<pb::Current> {
    Ok(pb::Current {
        state: state(current.state).into(),
        applied: current.applied.map(item).transpose()?,
        applied_generation: current.applied_generation,
        // Present even when empty: "reported no properties" is not "never
        // reported".
        observed: current
            .observed
            .as_ref()
            .map(serde_json::to_vec)
            .transpose()?,
        last_operation: current
            .last_operation
            .map_or(pb::OperationKind::Unspecified, operation)
            .into(),
        last_error: current.last_error.map(|error| pb::OperationError {
            code: error.code,
            message: error.message,
        }),
        attempts: current.attempts,
        next_attempt_at_ms: current.next_attempt_at_ms,
        failed_generation: current.failed_generation,
        in_flight: current.in_flight.map(in_flight).transpose()?,
        modifications: current.modifications,
        dependency_marks: marks(current.dependency_marks),
        unknown_was_created: current.unknown_was_created,
        needs_recreate_answer: current
            .needs_recreate_answer
            .map(|(generation, needs_recreate)| pb::RecreateAnswer {
                generation,
                needs_recreate,
            }),
        retry_of: current.retry_of.map(|retry| pb::RetryOf {
            kind: operation(retry.kind).into(),
            target_generation: retry.target_generation,
            op_id: retry.op_id,
        }),
        gave_up: current.gave_up,
        gone_with_external: current.gone_with_external,
        // JSON records predate this mark: an item marked gone with its
        // external item was always marked gone whatever its operation did.
        gone_unless_applied: false,
        existence_uncertain: current.existence_uncertain,
        maybe_applied: current
            .maybe_applied
            .map(item)
            .transpose()?
            .into_iter()
            .collect(),
    })
}

/// The tenant record.
pub(super) fn tenant(record: json::TenantRecord) -> pb::Tenant {
    let limits = record.limits;
    pb::Tenant {
        id: record.id,
        name: record.name,
        created_at_ms: record.created_at_ms,
        generation: record.generation,
        observed_generation: record.observed_generation,
        revision: record.revision,
        limits: Some(pb::TenantLimits {
            max_items: limits.max_items,
            max_request_items: limits.max_request_items,
            max_agents: limits.max_agents,
            max_watchers: limits.max_watchers,
            max_operations_in_flight: limits.max_operations_in_flight,
        }),
        token_hash: record.token_hash,
        deleted: record.deleted,
        conditions: record.conditions.into_iter().map(condition).collect(),
        compact_revision: record.compact_revision,
        // Counted by the server when the tenant loads.
        history_bytes: None,
    }
}

/// One condition.
fn condition(condition: json::Condition) -> pb::Condition {
    let kind = match condition.kind {
        json::ConditionKind::Ready => pb::ConditionKind::Ready,
        json::ConditionKind::Reconciling => pb::ConditionKind::Reconciling,
        json::ConditionKind::Stalled => pb::ConditionKind::Stalled,
    };
    pb::Condition {
        kind: kind.into(),
        status: condition.status,
        reason: condition.reason,
        message: condition.message,
        observed_generation: condition.observed_generation,
        last_transition_ms: condition.last_transition_ms,
    }
}

/// A stored type spec.
pub(super) fn spec(stored: json::StoredSpec) -> Result<pb::Spec> {
    let spec = stored.spec;
    Ok(pb::Spec {
        spec: Some(pb::TypeSpec {
            item_type: spec.item_type,
            recreate_on_change: spec.recreate_on_change,
            ask_needs_recreate: spec.ask_needs_recreate,
            retry: Some(retry(spec.retry)),
            max_attempts: spec.max_attempts,
            operation_timeout_ms: spec.operation_timeout_ms,
            supports_read: spec.supports_read,
            max_in_flight: spec.max_in_flight,
            schema: spec.schema.as_ref().map(serde_json::to_vec).transpose()?,
        }),
        epoch: stored.epoch,
        // Schema version 1 did not record which agent held a type.
        held_by: None,
    })
}

/// A retry policy.
fn retry(policy: json::RetryPolicy) -> pb::RetryPolicy {
    use pb::retry_policy::Policy;
    let policy = match policy {
        json::RetryPolicy::Static { wait_ms } => Policy::StaticWait(pb::StaticRetry { wait_ms }),
        json::RetryPolicy::Random { min_ms, max_ms } => {
            Policy::Random(pb::RandomRetry { min_ms, max_ms })
        }
        json::RetryPolicy::Exponential {
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
