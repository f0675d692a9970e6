//! `reconctl reconcile [--wait]`: triggers a pass and, with `--wait`,
//! follows the tenant (polling GetStatus while the Reconcile call waits)
//! until it converges, stalls, stops making progress or times out. The exit
//! code says which (docs/reconctl.md).

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use super::args::{OutputFormat, ReconcileArgs};
use super::failure::{Exit, Failure};
use super::output::{emit, emit_as};
use super::progress::{Progress, summary};
use super::table::Table;
use super::{Session, graph, json, names};
use crate::convert::duration_to_proto;
use crate::proto as v1;

/// The longest wait the server allows.
const MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// How often the progress display asks for the tenant's status.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// How long past the timeout the client waits for the server's answer.
const ANSWER_GRACE: Duration = Duration::from_secs(10);
/// The most operations and items listed in the result.
const LISTED: usize = 50;

/// How a reconcile call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Without --wait: one pass ran.
    Triggered,
    /// Every intended item in scope is created and up to date.
    Converged,
    /// Something failed terminally (or waits on such a failure).
    Stalled,
    /// Passes stopped making progress while nothing ran.
    NoProgress,
    /// The timeout expired with work remaining.
    TimedOut,
}

impl Ending {
    fn name(self) -> &'static str {
        match self {
            Ending::Triggered => "triggered",
            Ending::Converged => "converged",
            Ending::Stalled => "stalled",
            Ending::NoProgress => "no_progress",
            Ending::TimedOut => "timed_out",
        }
    }

    fn exit(self) -> Exit {
        match self {
            Ending::Triggered | Ending::Converged => Exit::Success,
            Ending::Stalled | Ending::NoProgress => Exit::Stalled,
            Ending::TimedOut => Exit::TimedOut,
        }
    }
}

/// Runs the command.
pub(crate) async fn run(session: &Session, args: ReconcileArgs) -> Result<Exit, Failure> {
    let tenant = session.tenant()?;
    if args.timeout.is_zero() || args.timeout > MAX_TIMEOUT {
        return Err(Failure::usage(format!(
            "--timeout {:?} is out of range; give more than 0 and at most 10m (the server's limit)",
            args.timeout
        )));
    }
    let request = v1::ReconcileRequest {
        tenant: tenant.clone(),
        subgraph: args.subgraph.clone().unwrap_or_default(),
        wait: args.wait,
        timeout: Some(duration_to_proto(args.timeout)),
        max_no_progress_iterations: args.max_no_progress.unwrap_or(0),
        refresh: args.refresh,
    };
    let what = format!("reconcile tenant {tenant:?}");
    let started = Instant::now();
    let show_progress = args.wait && args.output == OutputFormat::Table;
    let mut progress = Progress::new(std::io::stdout().is_terminal());
    let mut ticker = tokio::time::interval(POLL_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let call = session.client.reconcile(request);
    tokio::pin!(call);
    let give_up = tokio::time::sleep(args.timeout + ANSWER_GRACE);
    tokio::pin!(give_up);
    let reply = loop {
        tokio::select! {
            reply = &mut call => break reply,
            () = &mut give_up => {
                progress.finish()?;
                emit(&format!(
                    "timed out: the server did not answer within {:?}\n",
                    args.timeout + ANSWER_GRACE
                ))?;
                return Ok(Exit::TimedOut);
            }
            _ = ticker.tick(), if show_progress => {
                // A failed poll only skips one redraw; the call's own
                // result decides the outcome.
                let status = session
                    .client
                    .get_status(v1::GetStatusRequest { tenant: tenant.clone() })
                    .await;
                if let Ok(reply) = status {
                    progress.update(started.elapsed(), &reply.status.unwrap_or_default())?;
                }
            }
        }
    };
    progress.finish()?;
    let reply = reply.map_err(|status| session.failed(&what, &status))?;
    let elapsed = started.elapsed();
    let ending = ending(&reply, args.wait, elapsed, args.timeout);
    let waiting = if matches!(ending, Ending::Converged | Ending::Triggered)
        || args.output != OutputFormat::Table
    {
        Vec::new()
    } else {
        unsettled_items(session, &tenant, args.subgraph.as_deref()).await
    };
    emit_as(
        args.output,
        || json::reconcile_response(&reply, ending.name()),
        || render(&reply, ending, elapsed, args.timeout, &waiting),
    )?;
    Ok(ending.exit())
}

/// Classifies the reply. The server says converged or stalled; when it
/// answers neither, the wait ended by the timeout or for lack of progress.
fn ending(
    reply: &v1::ReconcileResponse,
    wait: bool,
    elapsed: Duration,
    timeout: Duration,
) -> Ending {
    let stalled = reply.status.as_ref().is_some_and(|status| {
        status.conditions.iter().any(|condition| {
            condition.r#type == "Stalled" && condition.status == v1::ConditionStatus::True as i32
        })
    });
    if reply.converged {
        Ending::Converged
    } else if !wait {
        Ending::Triggered
    } else if stalled || !reply.require_rerun {
        Ending::Stalled
    } else if elapsed >= timeout {
        Ending::TimedOut
    } else {
        Ending::NoProgress
    }
}

/// The current items that are not settled: failed, unknown, in flight or
/// waiting. Best effort: an error leaves the list empty.
async fn unsettled_items(
    session: &Session,
    tenant: &str,
    subgraph: Option<&str>,
) -> Vec<v1::ItemStatus> {
    let graph = session
        .client
        .get_graph(v1::GetGraphRequest {
            tenant: tenant.to_owned(),
            view: v1::GraphView::Current as i32,
            subgraph: subgraph.unwrap_or_default().to_owned(),
            ..v1::GetGraphRequest::default()
        })
        .await;
    graph
        .map(|graph| {
            graph
                .current
                .into_iter()
                .filter(|item| {
                    item.state != v1::ItemState::Created as i32
                        || item.pending_operation != 0
                        || item.operation.is_some()
                })
                .collect()
        })
        .unwrap_or_default()
}

fn condition_text(status: Option<&v1::TenantStatus>, kind: &str) -> String {
    status
        .and_then(|status| status.conditions.iter().find(|c| c.r#type == kind))
        .map_or_else(String::new, |condition| {
            let mut text = format!("{kind}={}", names::condition_status(condition.status));
            if !condition.reason.is_empty() {
                text.push_str(&format!(" ({})", condition.reason));
            }
            if !condition.message.is_empty() {
                text.push_str(&format!(": {}", condition.message));
            }
            text
        })
}

/// Said when no operation ran while the call waited: the server lists
/// only those (an agent may have applied the intent before the call).
const EARLIER_OPERATIONS: &str = "\nno operation ran during this call; earlier ones: \
     `reconctl watch --history` or `reconctl graph get`\n";

/// The result as text: the outcome, the operations (those that ran during
/// the call) and what is unsettled.
fn render(
    reply: &v1::ReconcileResponse,
    ending: Ending,
    elapsed: Duration,
    timeout: Duration,
    waiting: &[v1::ItemStatus],
) -> String {
    let status = reply.status.as_ref();
    let tenant = status
        .map(|status| status.tenant.as_str())
        .unwrap_or_default();
    let passes = format!(
        "{} pass(es), {:.1}s",
        reply.iterations,
        elapsed.as_secs_f64()
    );
    let mut text = match ending {
        Ending::Converged => format!("converged: tenant {tenant} is up to date ({passes})\n"),
        Ending::Triggered => format!(
            "pass triggered for tenant {tenant} ({passes}); not converged yet: follow it with \
             `reconctl reconcile --wait`\n"
        ),
        Ending::Stalled => format!(
            "stalled: tenant {tenant} cannot converge until its intent changes ({passes}); {}\n",
            condition_text(status, "Stalled")
        ),
        Ending::NoProgress => format!(
            "not converged: passes stopped making progress while nothing ran ({passes}); {}\n",
            condition_text(status, "Ready")
        ),
        Ending::TimedOut => format!(
            "timed out after {timeout:?} with work remaining ({passes}); {}\n",
            condition_text(status, "Reconciling")
        ),
    };
    if let Some(status) = status {
        text.push_str(&format!("{}\n", summary(status)));
    }
    if !reply.operation_log.is_empty() {
        let mut table = Table::new(&["OPERATION", "ITEM", "ATTEMPT", "RESULT"]);
        for entry in reply.operation_log.iter().take(LISTED) {
            let result = if entry.in_progress {
                "in progress".to_owned()
            } else if let Some(error) = &entry.error {
                format!("failed: {}", names::rpc_status(error))
            } else {
                "done".to_owned()
            };
            table.row(vec![
                names::operation_kind(entry.kind),
                names::item_ref(entry.item.as_ref()),
                entry.attempt.to_string(),
                result,
            ]);
        }
        text.push_str(&format!(
            "\noperations during this call: {}\n",
            reply.operations_total
        ));
        text.push_str(&table.render());
        let listed = reply.operation_log.len().min(LISTED);
        let total = usize::try_from(reply.operations_total).unwrap_or(usize::MAX);
        if total > listed {
            text.push_str(&format!("... and {} more\n", total - listed));
        }
    }
    if reply.operation_log.is_empty() && ending != Ending::Triggered {
        text.push_str(EARLIER_OPERATIONS);
    }
    if !waiting.is_empty() {
        let mut table = Table::new(&["UNSETTLED ITEM", "STATE", "DETAIL"]);
        for item in waiting.iter().take(LISTED) {
            table.row(vec![
                names::item_ref(item.r#ref.as_ref()),
                names::item_state(item.state),
                graph::detail(item),
            ]);
        }
        text.push('\n');
        text.push_str(&table.render());
        if waiting.len() > LISTED {
            text.push_str(&format!("... and {} more\n", waiting.len() - LISTED));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(converged: bool, require_rerun: bool, stalled: bool) -> v1::ReconcileResponse {
        v1::ReconcileResponse {
            converged,
            require_rerun,
            status: Some(v1::TenantStatus {
                conditions: vec![v1::Condition {
                    r#type: "Stalled".into(),
                    status: if stalled {
                        v1::ConditionStatus::True as i32
                    } else {
                        v1::ConditionStatus::False as i32
                    },
                    ..v1::Condition::default()
                }],
                ..v1::TenantStatus::default()
            }),
            ..v1::ReconcileResponse::default()
        }
    }

    #[test]
    fn the_operations_listed_are_said_to_be_those_of_the_call() {
        let second = Duration::from_secs(1);
        let quiet = render(
            &reply(true, false, false),
            Ending::Converged,
            second,
            second,
            &[],
        );
        assert!(
            quiet.contains(
                "no operation ran during this call; earlier ones: `reconctl watch --history`"
            ),
            "{quiet}"
        );
        let mut busy = reply(true, false, false);
        busy.operation_log.push(v1::OperationLogEntry::default());
        busy.operations_total = 1;
        let text = render(&busy, Ending::Converged, second, second, &[]);
        assert!(text.contains("operations during this call: 1"), "{text}");
        assert!(!text.contains("no operation ran"), "{text}");
        let triggered = render(
            &reply(false, false, false),
            Ending::Triggered,
            second,
            second,
            &[],
        );
        assert!(
            !triggered.contains("no operation ran"),
            "a pass that was only triggered did not wait for operations: {triggered}"
        );
    }

    #[test]
    fn each_ending_has_its_exit_code() {
        let second = Duration::from_secs(1);
        let minute = Duration::from_secs(60);
        let cases = [
            (
                reply(true, false, false),
                true,
                second,
                Ending::Converged,
                0,
            ),
            (reply(false, false, true), true, second, Ending::Stalled, 3),
            (
                reply(false, true, false),
                true,
                second,
                Ending::NoProgress,
                3,
            ),
            (reply(false, true, false), true, minute, Ending::TimedOut, 4),
            (
                reply(false, true, false),
                false,
                second,
                Ending::Triggered,
                0,
            ),
        ];
        for (reply, wait, elapsed, expected, code) in cases {
            let found = ending(&reply, wait, elapsed, minute);
            assert_eq!(found, expected);
            assert_eq!(found.exit().code(), code);
        }
    }
}
