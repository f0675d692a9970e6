//! `reconctl graph get`: a tenant's intended and current graphs as tables,
//! JSON, YAML or Graphviz DOT.

use std::collections::BTreeMap;

use super::args::{GraphFormat, GraphGetArgs};
use super::failure::{Exit, Failure};
use super::intent::blocked_by;
use super::output::{emit, emit_json, emit_yaml};
use super::table::Table;
use super::{Session, dot, json, names};
use crate::proto as v1;

/// Fetches every page of the graph and prints it.
pub(crate) async fn get(session: &Session, args: GraphGetArgs) -> Result<Exit, Failure> {
    let tenant = session.tenant()?;
    let view = if args.intended {
        v1::GraphView::Intended
    } else if args.current {
        v1::GraphView::Current
    } else {
        v1::GraphView::Both
    };
    let graph = session
        .client
        .get_graph(v1::GetGraphRequest {
            tenant: tenant.clone(),
            view: view as i32,
            subgraph: args.subgraph.clone().unwrap_or_default(),
            ..v1::GetGraphRequest::default()
        })
        .await
        .map_err(|status| session.failed(&format!("graph of tenant {tenant:?}"), &status))?;
    match args.output {
        GraphFormat::Table => emit(&render(&tenant, &graph, view))?,
        GraphFormat::Json => emit_json(&json::graph(&tenant, &graph, view))?,
        GraphFormat::Yaml => emit_yaml(&json::graph(&tenant, &graph, view))?,
        GraphFormat::Dot => emit(&dot::render(&tenant, &graph))?,
    }
    Ok(Exit::Success)
}

/// What is happening to a current item: its operation in flight, what it
/// waits for, or its last error.
pub(crate) fn detail(status: &v1::ItemStatus) -> String {
    let mut parts = Vec::new();
    if status.external {
        parts.push("external".to_owned());
    }
    if let Some(operation) = &status.operation {
        let mut text = format!(
            "{} in flight (attempt {})",
            names::operation_kind(operation.kind),
            operation.attempt
        );
        if !operation.progress_message.is_empty() {
            text.push_str(&format!(": {}", operation.progress_message));
        }
        parts.push(text);
    }
    if status.pending_operation != 0 {
        let mut text = format!(
            "needs {}, waiting: {}",
            names::operation_kind(status.pending_operation),
            names::wait_reason(status.reason)
        );
        let holders = blocked_by(status);
        if !holders.is_empty() {
            text.push_str(&format!(" on {holders}"));
        }
        // A retryable failure waits in backoff: FAILED alone reads as final.
        if status.reason == v1::WaitReason::Backoff as i32
            && let Some(next) = &status.next_attempt_at
        {
            text.push_str(&format!(", next attempt at {next}"));
        }
        parts.push(text);
    }
    if let Some(error) = &status.last_error {
        parts.push(format!(
            "{} failed after {} attempt(s): {}",
            names::operation_kind(status.last_operation),
            status.attempts,
            names::rpc_status(error)
        ));
    }
    parts.join("; ")
}

fn dependencies(item: &v1::Item) -> String {
    item.dependencies
        .iter()
        .map(|dependency| {
            let mut text = names::item_ref(dependency.requires.as_ref());
            if !dependency.must_satisfy.is_empty() {
                text.push_str(&format!(" if {}", dependency.must_satisfy));
            }
            text
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The graph as tables: both graphs joined by item, or one of them.
fn render(tenant: &str, graph: &v1::GetGraphResponse, view: v1::GraphView) -> String {
    let mut text = format!(
        "tenant {tenant}, revision {}, generation {}\n\n",
        graph.revision, graph.generation
    );
    let intended: BTreeMap<String, &v1::IntendedItem> = graph
        .intended
        .iter()
        .map(|entry| {
            let reference = entry.item.as_ref().map(|item| v1::ItemRef {
                r#type: item.r#type.clone(),
                name: item.name.clone(),
            });
            (names::item_ref(reference.as_ref()), entry)
        })
        .collect();
    let current: BTreeMap<String, &v1::ItemStatus> = graph
        .current
        .iter()
        .map(|status| (names::item_ref(status.r#ref.as_ref()), status))
        .collect();
    let table = match view {
        v1::GraphView::Intended => {
            let mut table = Table::new(&["ITEM", "SUBGRAPH", "GENERATION", "DEPENDS ON", "LABEL"]);
            for (id, entry) in &intended {
                let item = entry.item.clone().unwrap_or_default();
                let mut generation = entry.generation.to_string();
                if item.external {
                    generation.push_str(" (external)");
                }
                table.row(vec![
                    id.clone(),
                    item.subgraph.clone(),
                    generation,
                    dependencies(&item),
                    item.label.clone(),
                ]);
            }
            table
        }
        v1::GraphView::Current => {
            let mut table = Table::new(&["ITEM", "STATE", "APPLIED", "DETAIL"]);
            for (id, status) in &current {
                table.row(vec![
                    id.clone(),
                    names::item_state(status.state),
                    applied_generation(status),
                    detail(status),
                ]);
            }
            table
        }
        v1::GraphView::Both | v1::GraphView::Unspecified => {
            let mut table =
                Table::new(&["ITEM", "SUBGRAPH", "INTENDED", "STATE", "APPLIED", "DETAIL"]);
            let ids: std::collections::BTreeSet<&String> =
                intended.keys().chain(current.keys()).collect();
            for id in ids {
                let entry = intended.get(id);
                let status = current.get(id);
                let subgraph = entry
                    .and_then(|entry| entry.item.as_ref())
                    .or_else(|| status.and_then(|status| status.applied.as_ref()))
                    .map(|item| item.subgraph.clone())
                    .unwrap_or_default();
                let intended_generation = entry.map_or_else(
                    || "- (to be deleted)".to_owned(),
                    |entry| entry.generation.to_string(),
                );
                table.row(vec![
                    id.clone(),
                    subgraph,
                    intended_generation,
                    status.map_or_else(|| "-".to_owned(), |status| names::item_state(status.state)),
                    status
                        .map(|status| applied_generation(status))
                        .unwrap_or_default(),
                    status.map(|status| detail(status)).unwrap_or_default(),
                ]);
            }
            table
        }
    };
    if table.is_empty() {
        text.push_str("no items\n");
    } else {
        text.push_str(&table.render());
    }
    text
}

fn applied_generation(status: &v1::ItemStatus) -> String {
    if status.applied.is_some() {
        status.applied_generation.to_string()
    } else {
        "-".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_in_backoff_says_when_it_is_tried_again() {
        let mut status = v1::ItemStatus {
            state: v1::ItemState::Failed as i32,
            pending_operation: v1::OperationKind::Create as i32,
            reason: v1::WaitReason::Backoff as i32,
            next_attempt_at: Some(prost_types::Timestamp {
                seconds: 1_800_000_000,
                nanos: 0,
            }),
            ..v1::ItemStatus::default()
        };
        assert!(
            detail(&status).ends_with(", next attempt at 2027-01-15T08:00:00Z"),
            "{}",
            detail(&status)
        );
        status.reason = v1::WaitReason::TerminalFailure as i32;
        assert!(
            !detail(&status).contains("next attempt"),
            "{}",
            detail(&status)
        );
    }

    #[test]
    fn the_joined_table_shows_each_item_once_with_what_holds_it() {
        let graph = v1::GetGraphResponse {
            intended: vec![v1::IntendedItem {
                item: Some(v1::Item {
                    r#type: "file".into(),
                    name: "config".into(),
                    ..v1::Item::default()
                }),
                generation: 2,
            }],
            current: vec![v1::ItemStatus {
                r#ref: Some(v1::ItemRef {
                    r#type: "file".into(),
                    name: "config".into(),
                }),
                state: v1::ItemState::Pending as i32,
                pending_operation: v1::OperationKind::Create as i32,
                reason: v1::WaitReason::Dependency as i32,
                blocked_by: vec![v1::BlockedBy {
                    item: Some(v1::ItemRef {
                        r#type: "directory".into(),
                        name: "etc".into(),
                    }),
                    why: "missing".into(),
                }],
                ..v1::ItemStatus::default()
            }],
            revision: 5,
            generation: 2,
            ..v1::GetGraphResponse::default()
        };
        let text = render("acme", &graph, v1::GraphView::Both);
        assert!(
            text.starts_with("tenant acme, revision 5, generation 2\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "file/config            2         PENDING  -        needs CREATE, waiting: \
                 DEPENDENCY on directory/etc (missing)"
            ),
            "{text}"
        );
    }
}
