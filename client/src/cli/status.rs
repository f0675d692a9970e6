//! `reconctl status`: a tenant's conditions, generations and item counts.

use super::args::StatusArgs;
use super::failure::{Exit, Failure};
use super::output::emit_as;
use super::table::Table;
use super::{Session, json, names};
use crate::proto as v1;

/// Shows the tenant's status.
pub(crate) async fn run(session: &Session, args: StatusArgs) -> Result<Exit, Failure> {
    let tenant = session.tenant()?;
    let reply = session
        .client
        .get_status(v1::GetStatusRequest {
            tenant: tenant.clone(),
        })
        .await
        .map_err(|status| session.failed(&format!("status of tenant {tenant:?}"), &status))?;
    let status = reply.status.unwrap_or_default();
    emit_as(
        args.output,
        || json::tenant_status(&status),
        || render(&status),
    )?;
    Ok(Exit::Success)
}

/// `CREATED 3, PENDING 1`: the item counts by state, or `none`.
pub(crate) fn counts(status: &v1::TenantStatus) -> String {
    if status.items_by_state.is_empty() {
        return "none".to_owned();
    }
    let mut counts: Vec<_> = status.items_by_state.iter().collect();
    counts.sort();
    counts
        .iter()
        .map(|(state, count)| format!("{state} {count}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The condition `kind` as `True`, `False`, `Unknown` or `-`.
pub(crate) fn condition_value(conditions: &[v1::Condition], kind: &str) -> String {
    conditions
        .iter()
        .find(|condition| condition.r#type == kind)
        .map_or_else(
            || "-".to_owned(),
            |condition| names::condition_status(condition.status),
        )
}

/// The conditions as a table.
pub(crate) fn conditions_table(conditions: &[v1::Condition]) -> String {
    let mut table = Table::new(&["CONDITION", "STATUS", "REASON", "SINCE", "MESSAGE"]);
    for condition in conditions {
        table.row(vec![
            condition.r#type.clone(),
            names::condition_status(condition.status),
            condition.reason.clone(),
            condition
                .last_transition_time
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            condition.message.clone(),
        ]);
    }
    table.render()
}

/// The status as text.
pub(crate) fn render(status: &v1::TenantStatus) -> String {
    let agents = if status.connected_item_types.is_empty() {
        String::new()
    } else {
        format!("agents for:  {}\n", status.connected_item_types.join(", "))
    };
    // Replicas on etcd name the one serving the tenant.
    let owner = if status.owner.is_empty() {
        String::new()
    } else {
        format!("served by:   {}\n", status.owner)
    };
    format!(
        "tenant:      {}\n{owner}generation:  {} (observed {})\nrevision:    {}\nitems:       {} \
         intended; current: {}\nin flight:   {} operation(s)\n{agents}\n{}",
        status.tenant,
        status.generation,
        status.observed_generation,
        status.revision,
        status.intended_items,
        counts(status),
        status.operations_in_flight,
        conditions_table(&status.conditions),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_shows_counts_and_conditions() {
        let status = v1::TenantStatus {
            tenant: "acme".into(),
            generation: 2,
            observed_generation: 2,
            revision: 9,
            conditions: vec![v1::Condition {
                r#type: "Ready".into(),
                status: v1::ConditionStatus::True as i32,
                reason: "READY".into(),
                ..v1::Condition::default()
            }],
            items_by_state: [("PENDING".to_owned(), 1), ("CREATED".to_owned(), 3)]
                .into_iter()
                .collect(),
            intended_items: 4,
            ..v1::TenantStatus::default()
        };
        let text = render(&status);
        assert!(text.contains("current: CREATED 3, PENDING 1"), "{text}");
        assert!(!text.contains("served by"), "{text}");
        let served = render(&v1::TenantStatus {
            owner: "10.0.0.2:50051".into(),
            ..status.clone()
        });
        assert!(served.contains("served by:   10.0.0.2:50051\n"), "{served}");
        assert!(text.contains("Ready      True    READY"), "{text}");
        assert_eq!(condition_value(&status.conditions, "Stalled"), "-");
    }
}
