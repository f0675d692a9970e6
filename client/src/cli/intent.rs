//! `reconctl intent submit -f FILE`: replaces a tenant's intended items (or
//! one subgraph's) with those of a JSON or YAML file, or with `--dry-run`
//! shows the plan they would give.

use std::io::Read as _;

use super::args::IntentSubmitArgs;
use super::failure::{Exit, Failure};
use super::intent_file::{self, IntentFile, Syntax};
use super::output::emit_as;
use super::settings::{Setting, Source};
use super::table::Table;
use super::{Session, json, names};
use crate::proto as v1;
use reconciled_proto::PLAN_LIMIT;

/// Reads, checks and submits the intent file.
pub(crate) async fn submit(session: &Session, args: IntentSubmitArgs) -> Result<Exit, Failure> {
    let file = read(&args.file)?;
    let tenant = tenant_for(session.settings.tenant.as_ref(), &file, &args.file)?;
    let subgraph = args.subgraph.clone().or(file.subgraph).unwrap_or_default();
    let request = v1::SubmitIntentRequest {
        tenant: tenant.clone(),
        subgraph,
        items: file.items,
        expected_generation: args.expected_generation,
        dry_run: args.dry_run,
    };
    let what = if args.dry_run {
        format!("plan the intent of {} for tenant {tenant:?}", args.file)
    } else {
        format!("submit the intent of {} to tenant {tenant:?}", args.file)
    };
    let reply = session
        .client
        .submit_intent(request)
        .await
        .map_err(|status| session.failed(&what, &status))?;
    emit_as(
        args.output,
        || json::submit_response(&reply, args.dry_run),
        || render(&reply, args.dry_run),
    )?;
    Ok(Exit::Success)
}

/// Reads the file (`-`: standard input) and parses it.
fn read(name: &str) -> Result<IntentFile, Failure> {
    let text = if name == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|error| Failure::error(format!("cannot read standard input: {error}")))?;
        text
    } else {
        std::fs::read_to_string(name).map_err(|error| {
            Failure::error(format!("cannot read the intent file {name}: {error}"))
        })?
    };
    intent_file::parse(&text, Syntax::detect(name, &text)).map_err(|problem| {
        Failure::error(format!(
            "the intent file {name} is not valid: {problem}. See deploy/examples/site.json \
             for the format"
        ))
    })
}

/// The tenant to submit to: the configured one, else the file's; both
/// given must agree, so a file is never applied to the wrong tenant.
fn tenant_for(
    configured: Option<&Setting>,
    file: &IntentFile,
    file_name: &str,
) -> Result<String, Failure> {
    let from_file = file.tenant.as_ref().filter(|tenant| !tenant.is_empty());
    match (configured, from_file) {
        (Some(configured), Some(in_file)) if configured.value != *in_file => {
            Err(Failure::usage(format!(
                "the intent file {file_name} is for tenant {in_file:?} but {} names tenant {:?}; \
                 remove `tenant` from the file or give the same tenant",
                configured.source, configured.value
            )))
        }
        (Some(configured), _) => Ok(configured.value.clone()),
        (None, Some(in_file)) => Ok(in_file.clone()),
        (None, None) => Err(Failure::usage(format!(
            "no tenant given: pass --tenant, set RECONCILED_TENANT, or add `tenant` to {}",
            Source::IntentFile(file_name.to_owned())
        ))),
    }
}

/// The reply as text: what happened, then the plan.
fn render(reply: &v1::SubmitIntentResponse, dry_run: bool) -> String {
    let headline = match (dry_run, reply.changed) {
        (true, true) => {
            "dry run: nothing stored; the intent would change the graph as planned below\n"
                .to_owned()
        }
        (true, false) => format!(
            "dry run: nothing stored; the intent equals the stored one (generation {})\n",
            reply.generation
        ),
        (false, true) => format!(
            "intent accepted: generation {}, revision {}\n",
            reply.generation, reply.revision
        ),
        (false, false) => format!(
            "intent unchanged: it equals the stored one (generation {}, revision {})\n",
            reply.generation, reply.revision
        ),
    };
    headline + &render_plan(&reply.plan.clone().unwrap_or_default())
}

/// A plan as a table of operations and a table of waiting items.
pub(crate) fn render_plan(plan: &v1::Plan) -> String {
    let listed = plan.waiting.len();
    let partial = if !plan.truncated {
        String::new()
    } else if listed < PLAN_LIMIT && plan.operations.len() < PLAN_LIMIT {
        // After a change, the reply lists the waiting items the change
        // reached and counts every one.
        format!(" ({listed} listed, those the change reached; `reconctl graph get` shows all)")
    } else {
        format!(" (only the first {PLAN_LIMIT} listed)")
    };
    let mut text = format!(
        "plan: {} create, {} modify, {} delete; {} waiting{partial}\n",
        plan.creates, plan.modifies, plan.deletes, plan.blocked,
    );
    if !plan.operations.is_empty() {
        let mut table = Table::new(&["#", "OPERATION", "ITEM", "AFTER", "NOTE"]);
        for operation in &plan.operations {
            let after: Vec<String> = operation.after.iter().map(ToString::to_string).collect();
            let mut notes = Vec::new();
            if operation.recreate {
                notes.push("recreate".to_owned());
            }
            if operation.ask_needs_recreate {
                notes.push("asks the configurator whether to recreate".to_owned());
            }
            if operation.target_generation > 0 {
                notes.push(format!("to generation {}", operation.target_generation));
            }
            table.row(vec![
                operation.index.to_string(),
                names::operation_kind(operation.kind),
                names::item_ref(operation.item.as_ref()),
                after.join(","),
                notes.join("; "),
            ]);
        }
        text.push('\n');
        text.push_str(&table.render());
    }
    if !plan.waiting.is_empty() {
        let mut table = Table::new(&["WAITING ITEM", "NEEDS", "REASON", "BLOCKED BY"]);
        for item in &plan.waiting {
            table.row(vec![
                names::item_ref(item.r#ref.as_ref()),
                names::operation_kind(item.pending_operation),
                names::wait_reason(item.reason),
                blocked_by(item),
            ]);
        }
        text.push('\n');
        text.push_str(&table.render());
    }
    text
}

/// What holds an item: `directory/etc (missing); ...`.
pub(crate) fn blocked_by(item: &v1::ItemStatus) -> String {
    item.blocked_by
        .iter()
        .map(|blocked| {
            format!(
                "{} ({})",
                names::item_ref(blocked.item.as_ref()),
                blocked.why
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item_ref(item_type: &str, name: &str) -> Option<v1::ItemRef> {
        Some(v1::ItemRef {
            r#type: item_type.into(),
            name: name.into(),
        })
    }

    #[test]
    fn a_plan_reads_as_a_table_in_dependency_order() {
        let plan = v1::Plan {
            operations: vec![
                v1::PlannedOperation {
                    index: 0,
                    item: item_ref("directory", "etc"),
                    kind: v1::OperationKind::Create as i32,
                    target_generation: 1,
                    ..v1::PlannedOperation::default()
                },
                v1::PlannedOperation {
                    index: 1,
                    item: item_ref("file", "config"),
                    kind: v1::OperationKind::Create as i32,
                    after: vec![0],
                    target_generation: 1,
                    ..v1::PlannedOperation::default()
                },
            ],
            creates: 2,
            ..v1::Plan::default()
        };
        let text = render_plan(&plan);
        assert!(
            text.starts_with("plan: 2 create, 0 modify, 0 delete; 0 waiting\n"),
            "{text}"
        );
        assert!(
            text.contains("0  CREATE     directory/etc         to generation 1"),
            "{text}"
        );
        assert!(
            text.contains("1  CREATE     file/config    0      to generation 1"),
            "{text}"
        );
    }

    #[test]
    fn a_partial_waiting_list_says_which_items_it_holds() {
        let waiting = v1::ItemStatus {
            r#ref: item_ref("file", "c"),
            ..v1::ItemStatus::default()
        };
        let changed = v1::Plan {
            blocked: 3,
            truncated: true,
            waiting: vec![waiting],
            ..v1::Plan::default()
        };
        let text = render_plan(&changed);
        assert!(
            text.starts_with(
                "plan: 0 create, 0 modify, 0 delete; 3 waiting (1 listed, those the change \
                 reached; `reconctl graph get` shows all)\n"
            ),
            "{text}"
        );
        let long = v1::Plan {
            blocked: 1_500,
            truncated: true,
            waiting: vec![v1::ItemStatus::default(); PLAN_LIMIT],
            ..v1::Plan::default()
        };
        assert!(
            render_plan(&long).contains("; 1500 waiting (only the first 1000 listed)\n"),
            "{}",
            render_plan(&long)
        );
    }

    #[test]
    fn the_file_and_the_flag_must_agree_on_the_tenant() {
        let file = IntentFile {
            tenant: Some("acme".into()),
            ..IntentFile::default()
        };
        let flag = Setting {
            value: "beta".into(),
            source: Source::Flag("--tenant"),
        };
        let error = tenant_for(Some(&flag), &file, "site.json").expect_err("disagree");
        assert!(
            error.message.contains("--tenant names tenant \"beta\""),
            "{error}"
        );
        assert_eq!(tenant_for(None, &file, "site.json"), Ok("acme".to_owned()));
    }
}
