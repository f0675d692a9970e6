//! External reports: the one validation and the one set of limits that both
//! `Reconciler.ReportExternal` and an agent's `ExternalUpdate` on
//! `Configurators.Connect` go through before anything reaches the owner.
//!
//! A report is refused as a whole (nothing is stored) when any of it is
//! invalid: names as in SubmitIntent (1–253 bytes of printable UTF-8),
//! items within `max_item_bytes`, no dependencies, no report naming a managed
//! item (one the intent lists as non-external, or one the service created),
//! at most the server's and the tenant's `max_request_items` reports, and a
//! current graph of at most the tenant's `max_items` items afterwards.

use std::collections::BTreeSet;

use reconciled_proto::v1;

use crate::graph::ItemRef;
use crate::graph::validate::{FieldViolation, ValidationLimits, validate_items, validate_name};
use crate::status::ApiError;
use crate::tenant::{ExternalChange, TenantHandle, TenantSnapshot};
use crate::wire::{item_from_proto_at, item_ref_from_proto};

/// Validates `reports` of tenant `handle` and converts them to changes for
/// its owner. `field` names the repeated field in the caller's message
/// (`reports` for ReportExternal, `external_update.reports` for Connect),
/// so every violation carries the path the client sent.
///
/// Limits are checked against the tenant's latest snapshot; the owner
/// applies the changes in order afterwards.
pub fn validate_external_reports(
    reports: Vec<v1::ExternalReport>,
    field: &str,
    handle: &TenantHandle,
    limits: &ValidationLimits,
    default_max_items: usize,
) -> Result<Vec<ExternalChange>, ApiError> {
    if reports.len() > limits.max_request_items {
        return Err(ApiError::invalid_field(
            field,
            format!(
                "{} reports are over the server's limit of {} per message; split them",
                reports.len(),
                limits.max_request_items
            ),
        ));
    }
    let snapshot = handle.snapshots.latest();
    let tenant_limit = snapshot.record.limits.max_request_items;
    if tenant_limit > 0 && reports.len() as u64 > tenant_limit {
        return Err(ApiError::QuotaExceeded {
            subject: "max_request_items".into(),
            description: format!(
                "{} reports are over the tenant's limit of {tenant_limit} per message; split them",
                reports.len()
            ),
        });
    }
    let mut violations = Vec::new();
    let mut changes = Vec::with_capacity(reports.len());
    for (index, report) in reports.into_iter().enumerate() {
        let path = format!("{field}[{index}]");
        match convert_report(report, &path, limits) {
            Ok(change) => {
                let (item, part) = match &change {
                    ExternalChange::Put { item, .. } => (item.item_ref(), "put"),
                    ExternalChange::Delete { item } => (item.clone(), "delete"),
                };
                match managed_reason(&snapshot, &item) {
                    Some(why) => violations.push(FieldViolation::new(
                        format!("{path}.{part}"),
                        format!(
                            "item {item} {why}; external reports may only name external \
                             items: mark it `external` in the intent, or report another item"
                        ),
                    )),
                    None => changes.push(change),
                }
            }
            Err(mut problems) => violations.append(&mut problems),
        }
    }
    if !violations.is_empty() {
        let max = crate::graph::validate::MAX_VIOLATIONS;
        if violations.len() > max {
            let total = violations.len();
            violations.truncate(max - 1);
            let left_out = total - violations.len();
            violations.push(FieldViolation::new(
                field,
                format!(
                    "{left_out} more violations are not shown; fix the ones above \
                     and send the reports again to see the rest"
                ),
            ));
        }
        return Err(ApiError::invalid_argument(violations));
    }
    check_max_items(&snapshot, &changes, default_max_items)?;
    Ok(changes)
}

/// One report, checked on its own.
fn convert_report(
    report: v1::ExternalReport,
    path: &str,
    limits: &ValidationLimits,
) -> Result<ExternalChange, Vec<FieldViolation>> {
    match report.change {
        Some(v1::external_report::Change::Put(item)) => {
            let path = format!("{path}.put");
            let mut item = item_from_proto_at(item, &path)?;
            if !item.dependencies.is_empty() {
                return Err(vec![FieldViolation::new(
                    format!("{path}.dependencies"),
                    "external items cannot have dependencies; remove them",
                )]);
            }
            // Only an external item may be reported, so the flag is implied.
            item.external = true;
            match validate_items(std::slice::from_ref(&item), limits) {
                Ok(_) => Ok(ExternalChange::Put {
                    item,
                    modified: report.modified,
                }),
                Err(problems) => Err(problems
                    .into_iter()
                    .map(|problem| {
                        FieldViolation::new(
                            problem.field.replacen("items[0]", &path, 1),
                            problem.description,
                        )
                    })
                    .collect()),
            }
        }
        Some(v1::external_report::Change::Delete(reference)) => {
            let item = item_ref_from_proto(reference);
            let mut problems = Vec::new();
            for (part, value) in [("type", item.item_type()), ("name", item.name())] {
                if let Err(problem) = validate_name(value, limits) {
                    problems.push(FieldViolation::new(
                        format!("{path}.delete.{part}"),
                        format!("the {part} {problem}"),
                    ));
                }
            }
            if problems.is_empty() {
                Ok(ExternalChange::Delete { item })
            } else {
                Err(problems)
            }
        }
        None => Err(vec![FieldViolation::new(
            path,
            "a report needs either `put` (the item exists) or `delete` (it is gone)",
        )]),
    }
}

/// Why `item` is managed by the service (and so may not be reported), or
/// `None` when a report may name it.
fn managed_reason(snapshot: &TenantSnapshot, item: &ItemRef) -> Option<&'static str> {
    if let Some(intended) = snapshot.intended.get(item)
        && !intended.item.external
    {
        return Some("is in the intent as a managed (non-external) item");
    }
    let current = snapshot.current.get(item)?;
    let created_by_us = current.applied.as_ref().is_some_and(|a| !a.external);
    if created_by_us || current.is_busy() {
        return Some("was created by the service and is managed by it");
    }
    None
}

/// Refuses changes that would grow the current graph past the tenant's
/// `max_items` (0: the server's default).
fn check_max_items(
    snapshot: &TenantSnapshot,
    changes: &[ExternalChange],
    default_max_items: usize,
) -> Result<(), ApiError> {
    let limit = match snapshot.record.limits.max_items {
        0 => default_max_items,
        limit => usize::try_from(limit).unwrap_or(usize::MAX),
    };
    // The current graph after the changes, applied in order: items the
    // reports add, and current items they delete (a Put after the Delete
    // brings one back).
    let mut added: BTreeSet<ItemRef> = BTreeSet::new();
    let mut removed: BTreeSet<ItemRef> = BTreeSet::new();
    for change in changes {
        match change {
            ExternalChange::Put { item, .. } => {
                let key = item.item_ref();
                if snapshot.current.get(&key).is_none() {
                    added.insert(key);
                } else {
                    removed.remove(&key);
                }
            }
            ExternalChange::Delete { item } => {
                if snapshot.current.get(item).is_none() {
                    added.remove(item);
                } else {
                    removed.insert(item.clone());
                }
            }
        }
    }
    let total = (snapshot.current.len() - removed.len()) + added.len();
    if added.is_empty() || total <= limit {
        return Ok(());
    }
    Err(ApiError::QuotaExceeded {
        subject: "max_items".into(),
        description: format!(
            "the reports would add {} items, making {total} in the current graph, over the \
             tenant's limit of {limit}; report fewer external items or raise the tenant's max_items",
            added.len()
        ),
    })
}

#[cfg(test)]
mod handler_tests {
    use super::*;
    use crate::api::reconciler::handler_tests::{admin, item, service};
    use crate::tenant::TenantLimits;
    use reconciled_proto::v1::reconciler_server::Reconciler as _;
    use tonic::Code;

    fn put(name: &str) -> v1::ExternalReport {
        v1::ExternalReport {
            change: Some(v1::external_report::Change::Put(item("ext", name))),
            modified: false,
        }
    }

    fn delete(name: &str) -> v1::ExternalReport {
        v1::ExternalReport {
            change: Some(v1::external_report::Change::Delete(v1::ItemRef {
                r#type: "ext".into(),
                name: name.into(),
            })),
            modified: false,
        }
    }

    /// docs/security.md: "violations reported | 100 per rejection | the
    /// last violation says how many were left out".
    #[tokio::test]
    async fn external_report_violations_past_the_cap_say_how_many_were_left_out() {
        let (_service, context) = service();
        let (handle, _) = context
            .directory
            .create("alpha", TenantLimits::default())
            .await
            .expect("created");
        let reports: Vec<_> = (0..150).map(|_| put("")).collect();
        let error = validate_external_reports(
            reports,
            "reports",
            &handle,
            &context.limits,
            context.default_max_items,
        )
        .expect_err("150 empty names are invalid");
        let ApiError::InvalidArgument { violations, .. } = error else {
            panic!("not INVALID_ARGUMENT: {error:?}");
        };
        assert!(violations.len() <= crate::graph::validate::MAX_VIOLATIONS);
        let last = violations.last().expect("a violation");
        assert!(
            last.description.contains("51") && last.description.contains("not shown"),
            "150 violations were cut to {} and the last one does not say how many were left \
             out: {last:?}",
            violations.len()
        );
    }

    /// A report that deletes one external item and adds another leaves the
    /// current graph at its size: it is within `max_items` afterwards
    /// (module doc: "a current graph of at most the tenant's `max_items`
    /// items afterwards").
    #[tokio::test]
    async fn external_report_replacing_an_item_at_max_items_is_accepted() {
        let (service, context) = service();
        context
            .directory
            .create(
                "alpha",
                TenantLimits {
                    max_items: 1,
                    ..TenantLimits::default()
                },
            )
            .await
            .expect("created");
        service
            .report_external(admin(v1::ReportExternalRequest {
                tenant: "alpha".into(),
                reports: vec![put("x")],
            }))
            .await
            .expect("one external item fits max_items = 1");
        let answer = service
            .report_external(admin(v1::ReportExternalRequest {
                tenant: "alpha".into(),
                reports: vec![delete("x"), put("y")],
            }))
            .await;
        if let Err(status) = answer {
            assert_ne!(
                status.code(),
                Code::ResourceExhausted,
                "deleting x and adding y leaves 1 item, within max_items = 1: {status:?}"
            );
            panic!("refused: {status:?}");
        }
    }
}
