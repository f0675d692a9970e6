//! `reconctl watch`: a tenant's event stream, one line per event (human
//! text or JSON).
//!
//! Every JSON line has `kind` and `revision`: `SNAPSHOT` (current and
//! intended items as of the revision), `SYNCED` (live events follow),
//! `BOOKMARK` (nothing matched up to the revision) or an event kind such as
//! `ITEM_STATUS_CHANGED`. Human output leaves bookmarks out.

use serde_json::{Value, json};
use tonic::{Code, Status};
use tonic_types::StatusExt as _;

use super::args::{EventKindArg, StreamFormat, WatchArgs};
use super::failure::{Exit, Failure};
use super::output::{emit, emit_json_line, note};
use super::{Session, json, names};
use crate::proto as v1;
use crate::resuming::Position;
use crate::{Resumed, ResumingWatch, Tenant, WatchKind};

/// Streams the tenant's events until the server ends the stream (with
/// `--reconnect`: until a break retrying cannot mend), `--count` events
/// were shown, or the reader goes away.
pub(crate) async fn run(session: &Session, args: WatchArgs) -> Result<Exit, Failure> {
    let tenant = session.tenant()?;
    let mut request = v1::WatchRequest {
        tenant: tenant.clone(),
        // The oldest retained revision is not known ahead: ask for the
        // first and take the one the refusal names.
        start_revision: if args.history {
            1
        } else {
            args.since.unwrap_or(0)
        },
        item_types: args.item_types.clone(),
        kinds: args
            .kinds
            .iter()
            .map(|kind| event_kind(*kind) as i32)
            .collect(),
    };
    let what = format!("watch tenant {tenant:?}");
    let mut opened = session.client.watch(request.clone()).await;
    if args.history
        && let Err(status) = &opened
        && let Some(oldest) = oldest_retained(status)
    {
        request.start_revision = oldest;
        opened = session.client.watch(request.clone()).await;
    }
    let since = (request.start_revision > 0).then_some(request.start_revision);
    let stream = opened.map_err(|status| stream_failure(session, &what, &status, since))?;
    if args.count == Some(0) {
        return Ok(Exit::Success);
    }
    // Events shown so far, against `--count`.
    let mut shown = 0;
    if args.reconnect {
        let watch = session.client.watch_resuming(request).continuing(stream);
        return follow_resuming(
            session,
            &what,
            watch,
            "starting over from a snapshot",
            |message| show(message, &args, &mut shown),
        )
        .await;
    }
    follow::<Tenant>(session, &what, stream, since, resume_hint, |message| {
        show(message, &args, &mut shown)
    })
    .await
}

/// Follows one stream, opened from `since` (none: a snapshot first),
/// until it ends (without `--reconnect`): `show` prints each message and
/// says when to stop; where the stream ended, `resume_hint` says how to
/// go on from the last revision it delivered whole (counted as a
/// resuming watch counts it).
pub(crate) async fn follow<K: WatchKind>(
    session: &Session,
    what: &str,
    mut stream: tonic::codec::Streaming<K::Response>,
    since: Option<u64>,
    resume_hint: impl Fn(Option<u64>) -> String,
    mut show: impl FnMut(K::Message) -> Result<Option<Exit>, Failure>,
) -> Result<Exit, Failure> {
    let mut position = Position::new(since.unwrap_or(0));
    let resume_from = |position: &Position| Some(position.start()).filter(|revision| *revision > 0);
    loop {
        let response = match stream.message().await {
            Ok(Some(response)) => response,
            Ok(None) => {
                return Err(Failure::error(format!(
                    "{what}: the server ended the stream{}",
                    resume_hint(resume_from(&position))
                )));
            }
            Err(status) => {
                return Err(stream_failure(
                    session,
                    what,
                    &status,
                    resume_from(&position),
                ));
            }
        };
        let Some(message) = K::message(response) else {
            continue;
        };
        position.observe(K::seen(&message));
        if let Some(exit) = show(message)? {
            return Ok(exit);
        }
    }
}

/// Follows `watch` across breaks (`--reconnect`): `show` prints each
/// message and says when to stop; each resume, and each start over (with
/// `starting_over` saying what comes again), is noted on standard error.
pub(crate) async fn follow_resuming<K: WatchKind>(
    session: &Session,
    what: &str,
    mut watch: ResumingWatch<K>,
    starting_over: &str,
    mut show: impl FnMut(K::Message) -> Result<Option<Exit>, Failure>,
) -> Result<Exit, Failure> {
    let mut breaks = 0;
    loop {
        let next = watch.next().await;
        if watch.breaks() > breaks {
            breaks = watch.breaks();
            if matches!(next, Ok(Resumed::Message(_))) {
                note(&format!(
                    "{what}: the stream broke and was resumed after revision {}",
                    watch.resume_revision()
                ));
            }
        }
        match next {
            Ok(Resumed::Message(message)) => {
                if let Some(exit) = show(message)? {
                    return Ok(exit);
                }
            }
            Ok(Resumed::StartedOver(why)) => {
                note(&format!("{what}: {}; {starting_over}", why.message()));
            }
            Err(status) => {
                let resume_from = Some(watch.resume_revision()).filter(|revision| *revision > 0);
                return Err(stream_failure(session, what, &status, resume_from));
            }
        }
    }
}

/// Prints one message; `Some` once `--count` events were shown.
fn show(
    message: v1::watch_response::Message,
    args: &WatchArgs,
    shown: &mut u64,
) -> Result<Option<Exit>, Failure> {
    match message {
        v1::watch_response::Message::Snapshot(snapshot) => {
            print_snapshot(&snapshot, args.output)?;
        }
        v1::watch_response::Message::Synced(synced) => {
            print_marker("SYNCED", synced.revision, "live events follow", args.output)?;
        }
        v1::watch_response::Message::Bookmark(bookmark) => {
            if args.output == StreamFormat::Json {
                emit_json_line(&json!({"kind": "BOOKMARK", "revision": bookmark.revision}))?;
            }
        }
        v1::watch_response::Message::Events(group) => {
            for event in &group.events {
                match args.output {
                    StreamFormat::Human => emit(&(event_line(event) + "\n"))?,
                    StreamFormat::Json => emit_json_line(&json::event(event))?,
                }
                *shown += 1;
                if args.count.is_some_and(|count| *shown >= count) {
                    return Ok(Some(Exit::Success));
                }
            }
        }
    }
    Ok(None)
}

fn event_kind(kind: EventKindArg) -> v1::EventKind {
    match kind {
        EventKindArg::IntentChanged => v1::EventKind::IntentChanged,
        EventKindArg::ItemStatusChanged => v1::EventKind::ItemStatusChanged,
        EventKindArg::OperationStarted => v1::EventKind::OperationStarted,
        EventKindArg::OperationFinished => v1::EventKind::OperationFinished,
        EventKindArg::ConditionsChanged => v1::EventKind::ConditionsChanged,
        EventKindArg::AgentConnected => v1::EventKind::AgentConnected,
        EventKindArg::AgentDisconnected => v1::EventKind::AgentDisconnected,
        EventKindArg::DriftDetected => v1::EventKind::DriftDetected,
    }
}

/// A Watch refused for its start revision (`OUT_OF_RANGE`,
/// `REVISION_COMPACTED`), with the revision the refusal names.
enum RevisionRefused {
    /// Ahead of the tenant's latest revision (`current_revision`).
    Ahead { current: String },
    /// Older than the retained history, which starts after
    /// `compact_revision`.
    Compacted { oldest: String },
}

impl RevisionRefused {
    /// The refusal `status` is, if it is one.
    fn of(status: &Status) -> Option<Self> {
        if status.code() != Code::OutOfRange {
            return None;
        }
        let details = status.get_error_details();
        let info = details
            .error_info()
            .filter(|info| info.reason == "REVISION_COMPACTED")?;
        let named = |key: &str| info.metadata.get(key).cloned();
        Some(match named("current_revision") {
            Some(current) => Self::Ahead { current },
            None => Self::Compacted {
                oldest: named("compact_revision").unwrap_or_default(),
            },
        })
    }
}

/// The oldest revision a watch may resume from, from a refusal of one
/// older than the retained history.
fn oldest_retained(status: &Status) -> Option<u64> {
    match RevisionRefused::of(status)? {
        RevisionRefused::Compacted { oldest } => oldest.parse().ok(),
        RevisionRefused::Ahead { .. } => None,
    }
}

fn resume_hint(revision: Option<u64>) -> String {
    match revision {
        Some(revision) if revision > 0 => {
            format!("; resume with `--since {revision}`")
        }
        _ => "; run the command again to resume".to_owned(),
    }
}

/// A failed or ended stream; a compacted revision names the oldest one
/// still retained.
pub(crate) fn stream_failure(
    session: &Session,
    what: &str,
    status: &Status,
    resume_from: Option<u64>,
) -> Failure {
    match RevisionRefused::of(status) {
        Some(RevisionRefused::Ahead { current }) => {
            return Failure::error(format!(
                "{what}: revision {} is ahead of the tenant's latest revision {current} (the \
                 tenant was deleted and created again, restored or repaired since); watch \
                 without --since to start from a snapshot",
                resume_from.unwrap_or(0)
            ));
        }
        Some(RevisionRefused::Compacted { oldest }) => {
            return Failure::error(format!(
                "{what}: revision {} is older than the retained history (which starts after \
                 revision {oldest}); watch without --since to start from a snapshot",
                resume_from.unwrap_or(0)
            ));
        }
        None => {}
    }
    if status.code() == Code::ResourceExhausted {
        return Failure::error(format!(
            "{what}: {}; the watcher fell behind{}",
            status.message(),
            resume_hint(resume_from)
        ));
    }
    session.failed(what, status)
}

fn print_marker(
    kind: &str,
    revision: u64,
    text: &str,
    format: StreamFormat,
) -> Result<(), Failure> {
    match format {
        StreamFormat::Human => emit(&format!("rev {revision:<6} {kind:<21} {text}\n")),
        StreamFormat::Json => emit_json_line(&json!({"kind": kind, "revision": revision})),
    }
}

fn print_snapshot(snapshot: &v1::SnapshotItems, format: StreamFormat) -> Result<(), Failure> {
    match format {
        StreamFormat::Json => emit_json_line(&json!({
            "kind": "SNAPSHOT",
            "revision": snapshot.revision,
            "generation": snapshot.generation,
            "items": snapshot.items.iter().map(json::item_status).collect::<Vec<Value>>(),
            "intended": snapshot.intended.iter().map(json::intended_item).collect::<Vec<Value>>(),
            "continued": snapshot.continued,
        })),
        StreamFormat::Human => {
            let mut text = String::new();
            for item in &snapshot.items {
                text.push_str(&format!(
                    "rev {:<6} {:<21} {} {}\n",
                    snapshot.revision,
                    "SNAPSHOT",
                    names::item_ref(item.r#ref.as_ref()),
                    names::item_state(item.state)
                ));
            }
            if !snapshot.continued {
                text.push_str(&format!(
                    "rev {:<6} {:<21} generation {}\n",
                    snapshot.revision, "SNAPSHOT", snapshot.generation
                ));
            }
            emit(&text)
        }
    }
}

fn state_or(state: i32, absent: &str) -> String {
    if state == 0 {
        absent.to_owned()
    } else {
        names::item_state(state)
    }
}

fn error_suffix(error: Option<&reconciled_proto::google::rpc::Status>) -> String {
    error.map_or_else(String::new, |error| {
        format!(" error {}", names::rpc_status(error))
    })
}

/// One event as a line: revision, kind, item, states or outcome.
pub(crate) fn event_line(event: &v1::Event) -> String {
    use v1::event::Body;
    let detail = match &event.body {
        Some(Body::IntentChanged(changed)) => {
            let listed: Vec<String> = changed
                .changed
                .iter()
                .map(|item| names::item_ref(Some(item)))
                .collect();
            let mut text = format!(
                "generation {}, {} item(s) changed",
                changed.generation, changed.items_changed
            );
            if !listed.is_empty() {
                text.push_str(": ");
                text.push_str(&listed.join(", "));
            }
            text
        }
        Some(Body::ItemStatusChanged(changed)) => format!(
            "{} {} -> {}{}",
            names::item_ref(changed.item.as_ref()),
            state_or(changed.old_state, "(new)"),
            state_or(changed.new_state, "(removed)"),
            error_suffix(changed.error.as_ref())
        ),
        Some(Body::OperationStarted(started)) => format!(
            "{} {} (op {}, attempt {})",
            names::item_ref(started.item.as_ref()),
            names::operation_kind(started.kind),
            started.op_id,
            started.attempt
        ),
        Some(Body::OperationFinished(finished)) => format!(
            "{} {} {} (op {}, attempt {}){}",
            names::item_ref(finished.item.as_ref()),
            names::operation_kind(finished.kind),
            names::outcome(finished.outcome),
            finished.op_id,
            finished.attempt,
            error_suffix(finished.error.as_ref())
        ),
        Some(Body::ConditionsChanged(changed)) => {
            format!(
                "{} (observed generation {})",
                names::conditions_line(&changed.conditions),
                changed.observed_generation
            )
        }
        Some(Body::AgentConnected(connected)) => format!(
            "agent {}: {} (epoch {})",
            connected.agent_id,
            connected.item_types.join(", "),
            connected.epoch
        ),
        Some(Body::AgentDisconnected(disconnected)) => format!(
            "agent {}: {} ({})",
            disconnected.agent_id,
            disconnected.item_types.join(", "),
            disconnected.reason
        ),
        Some(Body::DriftDetected(drift)) => format!(
            "{} differs at {}",
            names::item_ref(drift.item.as_ref()),
            drift.paths.join(", ")
        ),
        None => String::new(),
    };
    format!(
        "rev {:<6} {:<21} {detail}",
        event.revision,
        names::event_kind(event.kind)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_ref() -> Option<v1::ItemRef> {
        Some(v1::ItemRef {
            r#type: "file".into(),
            name: "config".into(),
        })
    }

    #[test]
    fn events_read_as_one_line_each() {
        let event = v1::Event {
            revision: 7,
            kind: v1::EventKind::ItemStatusChanged as i32,
            body: Some(v1::event::Body::ItemStatusChanged(v1::ItemStatusChanged {
                item: file_ref(),
                old_state: v1::ItemState::Pending as i32,
                new_state: v1::ItemState::Creating as i32,
                ..v1::ItemStatusChanged::default()
            })),
            ..v1::Event::default()
        };
        assert_eq!(
            event_line(&event),
            "rev 7      ITEM_STATUS_CHANGED   file/config PENDING -> CREATING"
        );
        let finished = v1::Event {
            revision: 8,
            kind: v1::EventKind::OperationFinished as i32,
            body: Some(v1::event::Body::OperationFinished(v1::OperationFinished {
                item: file_ref(),
                kind: v1::OperationKind::Create as i32,
                op_id: "op-1".into(),
                attempt: 2,
                outcome: v1::Outcome::Failed as i32,
                error: Some(reconciled_proto::google::rpc::Status {
                    code: 14,
                    message: "disk busy".into(),
                    details: Vec::new(),
                }),
            })),
            ..v1::Event::default()
        };
        assert_eq!(
            event_line(&finished),
            "rev 8      OPERATION_FINISHED    file/config CREATE FAILED (op op-1, attempt 2) \
             error UNAVAILABLE: disk busy"
        );
    }
}
