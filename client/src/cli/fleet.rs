//! `reconctl fleet` (and `tenant list`): every tenant with its conditions
//! and counts; `fleet --watch` streams condition changes across the fleet.

use serde_json::{Value, json};

use super::args::{FleetArgs, OutputFormat};
use super::failure::{Exit, Failure};
use super::output::{emit, emit_as, emit_json_line};
use super::status::{condition_value, counts};
use super::table::Table;
use super::watch::{follow, follow_resuming, stream_failure};
use super::{Session, json, names};
use crate::Fleet;
use crate::proto as v1;
use crate::proto::watch_fleet_response::Message;

/// Lists the fleet, or streams its changes with `--watch`.
pub(crate) async fn run(session: &Session, args: FleetArgs) -> Result<Exit, Failure> {
    if args.watch {
        if args.output == OutputFormat::Yaml {
            return Err(Failure::usage(
                "fleet --watch prints one line per change: use -o table or -o json",
            ));
        }
        watch(session, args.since, args.reconnect, args.output).await
    } else {
        list(session, args.output).await
    }
}

/// Lists every tenant as a table (or JSON / YAML).
pub(crate) async fn list(session: &Session, format: OutputFormat) -> Result<Exit, Failure> {
    let reply = session
        .client
        .list_tenants(v1::ListTenantsRequest::default())
        .await
        .map_err(|status| session.failed("list tenants", &status))?;
    emit_as(
        format,
        || json!({"tenants": reply.tenants.iter().map(json::tenant).collect::<Vec<Value>>()}),
        || render(&reply.tenants),
    )?;
    Ok(Exit::Success)
}

/// Why a tenant is not simply Ready: the reason of its Stalled condition
/// if it holds, else of Ready if it does not hold.
fn attention(conditions: &[v1::Condition]) -> String {
    let find = |kind: &str| conditions.iter().find(|c| c.r#type == kind);
    let holds = |condition: &&v1::Condition| condition.status == v1::ConditionStatus::True as i32;
    if let Some(stalled) = find("Stalled").filter(holds) {
        return stalled.reason.clone();
    }
    match find("Ready") {
        Some(ready) if !holds(&ready) => ready.reason.clone(),
        _ => String::new(),
    }
}

/// The tenants as a table.
fn render(tenants: &[v1::Tenant]) -> String {
    if tenants.is_empty() {
        return "no tenants; create one with `reconctl tenant create NAME`\n".to_owned();
    }
    let mut table = Table::new(&[
        "TENANT",
        "READY",
        "RECONCILING",
        "STALLED",
        "GENERATION",
        "OBSERVED",
        "INTENDED",
        "IN-FLIGHT",
        "ITEMS",
        "REASON",
    ]);
    for tenant in tenants {
        if !tenant.quarantine_error.is_empty() {
            // Not served: only its name and why are known.
            let mut row = vec![tenant.name.clone()];
            row.extend(std::iter::repeat_n("-".to_owned(), 8));
            row.push(format!("Quarantined: {}", tenant.quarantine_error));
            table.row(row);
            continue;
        }
        let status = tenant.status.clone().unwrap_or_default();
        table.row(vec![
            tenant.name.clone(),
            condition_value(&status.conditions, "Ready"),
            condition_value(&status.conditions, "Reconciling"),
            condition_value(&status.conditions, "Stalled"),
            status.generation.to_string(),
            status.observed_generation.to_string(),
            status.intended_items.to_string(),
            status.operations_in_flight.to_string(),
            counts(&status),
            attention(&status.conditions),
        ]);
    }
    table.render()
}

/// One fleet event as a line.
fn event_line(event: &v1::FleetEvent) -> String {
    if event.deleted {
        return format!("rev {:<6} {} deleted", event.revision, event.tenant);
    }

    format!(
        "rev {:<6} {} {}",
        event.revision,
        event.tenant,
        names::conditions_line(&event.conditions)
    )
}

async fn watch(
    session: &Session,
    since: Option<u64>,
    reconnect: bool,
    format: OutputFormat,
) -> Result<Exit, Failure> {
    let what = "watch the fleet";
    let request = v1::WatchFleetRequest {
        start_revision: since.unwrap_or(0),
    };
    let stream = session
        .client
        .watch_fleet(request)
        .await
        .map_err(|status| stream_failure(session, what, &status, since))?;
    if reconnect {
        let watch = session
            .client
            .watch_fleet_resuming(request)
            .continuing(stream);
        return follow_resuming(
            session,
            what,
            watch,
            "listing every tenant again",
            |message| show(&message, format).map(|()| None),
        )
        .await;
    }
    follow::<Fleet>(
        session,
        what,
        stream,
        since,
        |resume_from| {
            format!(
                "; resume with `reconctl fleet --watch --since {}`",
                resume_from.unwrap_or(0)
            )
        },
        |message| show(&message, format).map(|()| None),
    )
    .await
}

/// Prints one message of the fleet stream.
fn show(message: &Message, format: OutputFormat) -> Result<(), Failure> {
    match message {
        Message::Events(group) => {
            for event in &group.events {
                if format == OutputFormat::Table {
                    emit(&(event_line(event) + "\n"))?;
                } else {
                    emit_json_line(&json::fleet_event(event))?;
                }
            }
        }
        Message::Synced(synced) => {
            if format == OutputFormat::Table {
                emit(&format!(
                    "rev {:<6} SYNCED live changes follow\n",
                    synced.revision
                ))?;
            } else {
                emit_json_line(&json!({"kind": "SYNCED", "revision": synced.revision}))?;
            }
        }
        Message::Bookmark(bookmark) => {
            if format != OutputFormat::Table {
                emit_json_line(&json!({"kind": "BOOKMARK", "revision": bookmark.revision}))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(kind: &str, holds: bool, reason: &str) -> v1::Condition {
        v1::Condition {
            r#type: kind.into(),
            status: if holds {
                v1::ConditionStatus::True as i32
            } else {
                v1::ConditionStatus::False as i32
            },
            reason: reason.into(),
            ..v1::Condition::default()
        }
    }

    #[test]
    fn a_quarantined_tenant_shows_why_in_the_table() {
        let table = render(&[v1::Tenant {
            name: "bad".into(),
            quarantine_error: "stored record is unreadable".into(),
            ..v1::Tenant::default()
        }]);
        let row = table.lines().nth(1).expect("a row");
        assert!(row.starts_with("bad"), "{table}");
        assert!(
            row.contains("Quarantined: stored record is unreadable"),
            "{table}"
        );
    }

    #[test]
    fn the_table_shows_conditions_counts_and_why_a_tenant_is_not_ready() {
        let tenant = v1::Tenant {
            name: "acme".into(),
            status: Some(v1::TenantStatus {
                conditions: vec![
                    condition("Ready", false, "WaitingForConfigurator"),
                    condition("Reconciling", false, ""),
                    condition("Stalled", false, ""),
                ],
                generation: 3,
                observed_generation: 3,
                intended_items: 2,
                items_by_state: [("PENDING".to_owned(), 2)].into_iter().collect(),
                ..v1::TenantStatus::default()
            }),
            ..v1::Tenant::default()
        };
        let text = render(&[tenant]);
        let row = text.lines().nth(1).expect("a row");
        assert!(
            row.starts_with("acme    False  False        False"),
            "{text}"
        );
        assert!(row.contains("PENDING 2"), "{text}");
        assert!(row.ends_with("WaitingForConfigurator"), "{text}");
    }
}
