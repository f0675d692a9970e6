//! Fleet events: one tenant's conditions, or its creation or deletion, as
//! the fleet stream carries them.

use reconciled_proto::v1;

use super::status::condition_to_proto;
use super::time::timestamp_from_ms;
use crate::engine::conditions::Condition;

/// The fleet event for tenant `tenant` at `now_ms`: its `conditions`, or
/// (with `deleted`) its deletion. The fleet log assigns the revision when
/// it commits the event.
pub fn fleet_event(
    tenant: &str,
    conditions: &[Condition],
    now_ms: u64,
    deleted: bool,
) -> v1::FleetEvent {
    v1::FleetEvent {
        revision: 0,
        tenant: tenant.to_owned(),
        conditions: conditions.iter().map(condition_to_proto).collect(),
        time: Some(timestamp_from_ms(now_ms)),
        deleted,
        quarantine_error: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::conditions::ConditionKind;

    #[test]
    fn a_tenants_conditions_and_its_deletion_become_fleet_events() {
        let ready = Condition {
            kind: ConditionKind::Ready,
            status: true,
            reason: "Converged".into(),
            message: "every intended item is created".into(),
            observed_generation: 3,
            last_transition_ms: 1_000,
        };
        let event = fleet_event("acme", std::slice::from_ref(&ready), 2_000, false);
        assert_eq!(event.tenant, "acme");
        assert_eq!(event.conditions, vec![condition_to_proto(&ready)]);
        assert_eq!(event.time, Some(timestamp_from_ms(2_000)));
        assert!(!event.deleted);
        assert_eq!(event.revision, 0, "the fleet log assigns it");

        let gone = fleet_event("acme", &[], 3_000, true);
        assert!(gone.deleted && gone.conditions.is_empty());
    }
}
