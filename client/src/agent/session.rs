//! The agent's protocol bookkeeping as a pure state machine: no I/O, no
//! clock, no tasks. The run loop feeds it what arrives (server messages,
//! operation events, connects and disconnects) and carries out the
//! [`Action`]s it returns (send a message, start an operation, publish an
//! event).
//!
//! It owns the rules of DESIGN section 4 on the agent's side:
//!
//! - **De-duplication on (op_id, attempt).** A request whose result is still
//!   held is answered with that result again; one still running is not
//!   started twice (a long-running one is answered `IN_PROGRESS` again). A
//!   newer attempt of an operation still running cancels the older attempt
//!   and starts once it has finished, so two attempts never run at once.
//!   The last [`ACKED_MEMORY`] final results the server acknowledged are
//!   remembered too, so a re-delivery after the acknowledgement (the server
//!   re-issues journaled operations after a reconnect or restart) is
//!   answered without running again; older ones run again (operations are
//!   idempotent). A `WAIT` answer settles nothing: the server asks again
//!   later with the same op_id and attempt, and that request runs the
//!   operation again.
//! - **Results until acknowledged.** Every result is kept until its
//!   `ResultAck`. The server acknowledges every result it receives, in order,
//!   so acks pop results per (op_id, attempt) first in, first out. After a
//!   reconnect only the newest result of each operation is sent again (a
//!   final result supersedes an `IN_PROGRESS`).
//! - **Cancels.** `CancelOperation` fires the cancellation token of every
//!   running attempt of the operation; `CancelAck` follows once their results
//!   were sent (at once if nothing runs). A cancel whose operation ends while
//!   disconnected is not acknowledged: the result, sent after the reconnect,
//!   says more.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::time::Duration;

use reconciled_proto::v1;
use reconciled_proto::v1::agent_message::Message as Outgoing;
use reconciled_proto::v1::server_message::Message as Incoming;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use super::context::{ContextParts, OpKey, OperationEvent};
use super::events::{AgentEvent, Grant};
use super::item::Item;
use super::outcome::{Answer, OperationKind, Outcome, ResultKind, result_message};
use crate::convert::duration_from_proto;

/// The most external updates kept while disconnected; older ones are
/// dropped first (a newer report of the same item supersedes them anyway).
const EXTERNAL_QUEUE_LIMIT: usize = 1024;

/// How many acknowledged final results are remembered for re-deliveries.
pub(crate) const ACKED_MEMORY: usize = 1024;

/// What the configurator is asked to do, with the items it needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Work {
    Create { item: Item },
    Modify { previous: Item, item: Item },
    Delete { item: Item },
    Read { item: Item },
    NeedsRecreate { previous: Item, item: Item },
}

impl Work {
    pub(crate) fn item(&self) -> &Item {
        match self {
            Self::Create { item }
            | Self::Modify { item, .. }
            | Self::Delete { item }
            | Self::Read { item }
            | Self::NeedsRecreate { item, .. } => item,
        }
    }
}

/// An operation to start in its own task.
pub(crate) struct StartOperation {
    /// Everything its [`OperationContext`](super::OperationContext) needs.
    pub(crate) parts: ContextParts,
    /// What to do.
    pub(crate) work: Work,
}

/// What the run loop must do.
pub(crate) enum Action {
    /// Send this message on the current stream.
    Send(v1::AgentMessage),
    /// Start this operation.
    Start(Box<StartOperation>),
    /// Publish this event.
    Event(AgentEvent),
}

#[derive(Debug)]
struct Running {
    cancel: CancellationToken,
    long_running: bool,
}

#[derive(Debug)]
struct Unacked {
    /// Order of first sending, for resending in the original order.
    seq: u64,
    /// Results sent and not acknowledged yet, oldest first.
    results: VecDeque<v1::OperationResult>,
}

/// The agent's protocol state across reconnects (see the module docs).
#[derive(Debug)]
pub(crate) struct SessionState {
    item_types: BTreeSet<String>,
    connected: bool,
    draining: bool,
    /// Shutting down past the drain timeout: operations were cancelled to
    /// be handed back.
    handing_back: bool,
    running: HashMap<OpKey, Running>,
    /// A newer attempt per op id, waiting for an older attempt to finish.
    parked: HashMap<String, Parked>,
    /// Op ids whose CancelAck waits for their running attempts to end.
    cancel_pending: HashSet<String>,
    unacked: HashMap<OpKey, Unacked>,
    next_seq: u64,
    /// Acknowledged final results, and their keys oldest first.
    acked: HashMap<OpKey, v1::OperationResult>,
    acked_order: VecDeque<OpKey>,
    external_queue: VecDeque<v1::ExternalUpdate>,
}

/// A parked operation (see [`SessionState`]); `Debug` without the items.
struct Parked(Box<StartOperation>);

impl std::fmt::Debug for Parked {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "Parked({:?})", self.0.parts.key)
    }
}

impl SessionState {
    /// State for an agent that handles `item_types`.
    pub(crate) fn new(item_types: impl IntoIterator<Item = String>) -> Self {
        Self {
            item_types: item_types.into_iter().collect(),
            connected: false,
            draining: false,
            handing_back: false,
            running: HashMap::new(),
            parked: HashMap::new(),
            cancel_pending: HashSet::new(),
            unacked: HashMap::new(),
            next_seq: 0,
            acked: HashMap::new(),
            acked_order: VecDeque::new(),
            external_queue: VecDeque::new(),
        }
    }

    /// The op ids of the operations still running or parked here, or whose
    /// result is not acknowledged: a registration lists them, so the server
    /// waits for their outcomes instead of giving them up (an operation
    /// whose session ended keeps running here).
    pub(crate) fn outstanding_op_ids(&self) -> Vec<String> {
        let op_ids: BTreeSet<&String> = self
            .running
            .keys()
            .chain(self.unacked.keys())
            .map(|key| &key.op_id)
            .chain(self.parked.keys())
            .collect();
        op_ids.into_iter().cloned().collect()
    }

    /// The server answered `Registered`: resend what is unacknowledged and
    /// what was reported meanwhile.
    pub(crate) fn connected(&mut self, registered: &v1::Registered) -> Vec<Action> {
        self.connected = true;
        let mut actions = vec![Action::Event(AgentEvent::Connected {
            session_id: registered.session_id.clone(),
            granted: registered
                .granted
                .iter()
                .map(|grant| Grant {
                    item_type: grant.item_type.clone(),
                    epoch: grant.epoch,
                })
                .collect(),
        })];
        let mut keys: Vec<(u64, OpKey)> = self
            .unacked
            .iter()
            .map(|(key, unacked)| (unacked.seq, key.clone()))
            .collect();
        keys.sort();
        for (_, key) in keys {
            let Some(unacked) = self.unacked.get_mut(&key) else {
                continue;
            };
            let newest_final = unacked
                .results
                .iter()
                .rposition(|result| result.outcome() != v1::Outcome::InProgress);
            let keep = newest_final.unwrap_or(unacked.results.len().saturating_sub(1));
            let Some(result) = unacked.results.get(keep).cloned() else {
                continue;
            };
            unacked.results = VecDeque::from([result.clone()]);
            actions.push(Action::Event(sent_event(&key, &result, true)));
            actions.push(Action::Send(message(Outgoing::Result(result))));
        }
        for update in self.external_queue.drain(..) {
            actions.push(Action::Send(message(Outgoing::ExternalUpdate(update))));
        }
        actions
    }

    /// The session ended (or a connection attempt failed).
    pub(crate) fn disconnected(&mut self, reason: String, code: Option<Code>) -> Vec<Action> {
        self.connected = false;
        self.cancel_pending.clear();
        vec![Action::Event(AgentEvent::Disconnected { reason, code })]
    }

    /// Stop starting operations (shutdown): new requests are left
    /// unanswered, parked attempts are dropped.
    pub(crate) fn begin_drain(&mut self) {
        self.draining = true;
        self.parked.clear();
    }

    /// Nothing runs and every result was acknowledged.
    pub(crate) fn is_idle(&self) -> bool {
        self.running.is_empty() && self.parked.is_empty() && self.unacked.is_empty()
    }

    /// Shutdown past the drain timeout: cancels every running operation.
    /// Each one that then answers CANCELLED is reported as WAIT (ask again
    /// later, no attempt counted, same op id and attempt: DESIGN 4), so the
    /// server keeps it for this agent's successor instead of dispatching
    /// it again at once to this closing session.
    pub(crate) fn hand_back(&mut self) {
        self.handing_back = true;
        self.cancel_all();
    }

    /// Fires the cancellation token of every running operation.
    pub(crate) fn cancel_all(&mut self) {
        for running in self.running.values() {
            running.cancel.cancel();
        }
        self.parked.clear();
    }

    /// Handles one message from the server.
    pub(crate) fn on_server_message(&mut self, message: v1::ServerMessage) -> Vec<Action> {
        let mut actions = Vec::new();
        match message.message {
            Some(Incoming::Operation(request)) => self.on_request(request, &mut actions),
            Some(Incoming::Cancel(cancel)) => self.on_cancel(cancel.op_id, &mut actions),
            Some(Incoming::ResultAck(ack)) => {
                let key = OpKey::new(ack.op_id, ack.attempt);
                self.on_ack(key, &mut actions);
            }
            Some(Incoming::Registered(_)) => {
                tracing::warn!("Ignored a second Registered in one session.");
            }
            Some(Incoming::Heartbeat(_)) | None => {}
        }
        actions
    }

    /// Handles one event from an operation task.
    pub(crate) fn on_operation_event(&mut self, event: OperationEvent) -> Vec<Action> {
        let mut actions = Vec::new();
        match event {
            OperationEvent::LongRunning { key } => {
                let Some(running) = self.running.get_mut(&key) else {
                    return actions;
                };
                if !running.long_running {
                    running.long_running = true;
                    let result = result_message(
                        &key.op_id,
                        key.attempt,
                        Answer::Outcome(Outcome::InProgress),
                    );
                    self.send_result(key, result, false, &mut actions);
                }
            }
            OperationEvent::Progress { key, message: text } => {
                if self.connected && self.running.contains_key(&key) {
                    actions.push(Action::Send(message(Outgoing::Progress(
                        v1::OperationProgress {
                            op_id: key.op_id,
                            attempt: key.attempt,
                            message: text,
                        },
                    ))));
                }
            }
            OperationEvent::Finished { key, mut result } => {
                self.running.remove(&key);
                if self.handing_back {
                    handed_back(&mut result);
                }
                self.send_result(key.clone(), result, false, &mut actions);
                self.after_attempt_ended(&key.op_id, &mut actions);
            }
        }
        actions
    }

    /// Queues or sends an `ExternalUpdate`.
    pub(crate) fn report_external(&mut self, update: v1::ExternalUpdate) -> Vec<Action> {
        if self.connected {
            return vec![Action::Send(message(Outgoing::ExternalUpdate(update)))];
        }
        if self.external_queue.len() >= EXTERNAL_QUEUE_LIMIT {
            self.external_queue.pop_front();
            tracing::warn!(
                limit = EXTERNAL_QUEUE_LIMIT,
                "Dropped the oldest queued external update while disconnected."
            );
        }
        self.external_queue.push_back(update);
        Vec::new()
    }

    fn on_request(&mut self, request: v1::OperationRequest, actions: &mut Vec<Action>) {
        let key = OpKey::new(request.op_id.clone(), request.attempt);

        if let Some(result) = self.known_final_result(&key) {
            actions.push(duplicate_event(&key));
            self.send_result(key, result, true, actions);
            return;
        }
        if let Some(running) = self.running.get(&key) {
            actions.push(duplicate_event(&key));
            if running.long_running {
                let result = result_message(
                    &key.op_id,
                    key.attempt,
                    Answer::Outcome(Outcome::InProgress),
                );
                self.send_result(key, result, true, actions);
            }
            return;
        }
        if self
            .parked
            .get(&key.op_id)
            .is_some_and(|parked| parked.0.parts.key.attempt >= key.attempt)
            || self.newest_running_attempt(&key.op_id) > Some(key.attempt)
        {
            // The same or a newer attempt is already queued or running.
            actions.push(duplicate_event(&key));
            return;
        }
        if self.draining {
            tracing::debug!(
                op_id = %key.op_id,
                attempt = key.attempt,
                "Left an operation unanswered while shutting down."
            );
            return;
        }
        // A newer attempt: the server has settled the older ones and no
        // longer waits for their results (it acknowledges them without
        // effect). Kept, such a result would have a registration list the
        // operation as still held here after this attempt is gone, and the
        // server would send it again at once, past what it checks before
        // starting an operation (its dependencies).
        self.unacked
            .retain(|held, _| held.op_id != key.op_id || held.attempt >= key.attempt);
        let start = match self.prepare(request) {
            Ok(start) => start,
            Err(result) => {
                self.send_result(key, *result, false, actions);
                return;
            }
        };
        if self.newest_running_attempt(&key.op_id).is_some() {
            // An older attempt still runs: stop it, and start this one
            // when it has ended.
            for (running_key, running) in &self.running {
                if running_key.op_id == key.op_id {
                    running.cancel.cancel();
                }
            }
            self.parked.insert(key.op_id.clone(), Parked(start));
            return;
        }
        self.start(start, actions);
    }

    fn on_cancel(&mut self, op_id: String, actions: &mut Vec<Action>) {
        actions.push(Action::Event(AgentEvent::Cancelled {
            op_id: op_id.clone(),
        }));
        let mut any_running = false;
        for (key, running) in &self.running {
            if key.op_id == op_id {
                running.cancel.cancel();
                any_running = true;
            }
        }
        if let Some(Parked(parked)) = self.parked.remove(&op_id) {
            let key = parked.parts.key;
            let result = result_message(
                &key.op_id,
                key.attempt,
                Answer::Outcome(Outcome::cancelled()),
            );
            self.send_result(key, result, false, actions);
        }
        if any_running {
            self.cancel_pending.insert(op_id);
        } else {
            self.send_cancel_ack(op_id, actions);
        }
    }

    fn on_ack(&mut self, key: OpKey, actions: &mut Vec<Action>) {
        let Some(unacked) = self.unacked.get_mut(&key) else {
            tracing::debug!(
                op_id = %key.op_id,
                attempt = key.attempt,
                "Ignored an acknowledgement of no held result."
            );
            return;
        };
        let acknowledged = unacked.results.pop_front();
        if unacked.results.is_empty() {
            self.unacked.remove(&key);
        }
        if let Some(result) = acknowledged
            && settles(&result)
        {
            self.remember_acked(key.clone(), result);
        }
        actions.push(Action::Event(AgentEvent::ResultAcked {
            op_id: key.op_id,
            attempt: key.attempt,
        }));
    }

    /// After an attempt of `op_id` ended: acknowledge a pending cancel, or
    /// start the newer attempt parked behind it.
    fn after_attempt_ended(&mut self, op_id: &str, actions: &mut Vec<Action>) {
        if self.newest_running_attempt(op_id).is_some() {
            return;
        }
        if self.cancel_pending.remove(op_id) {
            self.send_cancel_ack(op_id.to_owned(), actions);
        }
        if let Some(Parked(parked)) = self.parked.remove(op_id) {
            self.start(parked, actions);
        }
    }

    fn start(&mut self, start: Box<StartOperation>, actions: &mut Vec<Action>) {
        let key = start.parts.key.clone();
        self.running.insert(
            key.clone(),
            Running {
                cancel: start.parts.cancel.clone(),
                long_running: false,
            },
        );
        actions.push(Action::Event(AgentEvent::OperationReceived {
            op_id: key.op_id,
            attempt: key.attempt,
            kind: start.parts.kind,
            item: start.work.item().clone(),
        }));
        actions.push(Action::Start(start));
    }

    /// The newest result held or remembered for `key` that settles the
    /// operation (not `IN_PROGRESS`, not `WAIT`), if any.
    fn known_final_result(&self, key: &OpKey) -> Option<v1::OperationResult> {
        self.unacked
            .get(key)
            .and_then(|unacked| {
                unacked
                    .results
                    .iter()
                    .rev()
                    .find(|result| settles(result))
                    .cloned()
            })
            .or_else(|| self.acked.get(key).cloned())
    }

    fn remember_acked(&mut self, key: OpKey, result: v1::OperationResult) {
        if self.acked.insert(key.clone(), result).is_none() {
            self.acked_order.push_back(key);
        }
        while self.acked_order.len() > ACKED_MEMORY {
            if let Some(oldest) = self.acked_order.pop_front() {
                self.acked.remove(&oldest);
            }
        }
    }

    fn newest_running_attempt(&self, op_id: &str) -> Option<u32> {
        self.running
            .keys()
            .filter(|key| key.op_id == op_id)
            .map(|key| key.attempt)
            .max()
    }

    /// Holds `result` until acknowledged and sends it if connected.
    fn send_result(
        &mut self,
        key: OpKey,
        result: v1::OperationResult,
        resent: bool,
        actions: &mut Vec<Action>,
    ) {
        let seq = self.next_seq;
        let unacked = self.unacked.entry(key.clone()).or_insert_with(|| Unacked {
            seq,
            results: VecDeque::new(),
        });
        if unacked.seq == seq {
            self.next_seq += 1;
        }
        unacked.results.push_back(result.clone());
        if self.connected {
            actions.push(Action::Event(sent_event(&key, &result, resent)));
            actions.push(Action::Send(message(Outgoing::Result(result))));
        }
    }

    fn send_cancel_ack(&mut self, op_id: String, actions: &mut Vec<Action>) {
        if !self.connected {
            return;
        }
        actions.push(Action::Event(AgentEvent::CancelAcked {
            op_id: op_id.clone(),
        }));
        actions.push(Action::Send(message(Outgoing::CancelAck(v1::CancelAck {
            op_id,
        }))));
    }

    /// Checks a request and turns it into an operation to start, or into the
    /// failure to answer it with.
    fn prepare(
        &self,
        request: v1::OperationRequest,
    ) -> Result<Box<StartOperation>, Box<v1::OperationResult>> {
        let fail = |code: Code, text: String| {
            Box::new(result_message(
                &request.op_id,
                request.attempt,
                Answer::Outcome(Outcome::failed(code, text)),
            ))
        };
        let Some(kind) = OperationKind::from_proto(request.operation) else {
            return Err(fail(
                Code::Unimplemented,
                format!(
                    "operation kind {} is not known to this agent (configurator protocol {}); \
                     upgrade the agent SDK",
                    request.operation,
                    reconciled_proto::PROTOCOL_VERSION
                ),
            ));
        };
        let Some(item) = request.item.clone().map(Item::from) else {
            return Err(fail(
                Code::InvalidArgument,
                format!("the {kind} request carried no item"),
            ));
        };
        if !self.item_types.contains(&item.item_type) {
            return Err(fail(
                Code::Unimplemented,
                format!(
                    "this agent does not handle item type {:?}; it registered {:?}",
                    item.item_type, self.item_types
                ),
            ));
        }
        let previous = request.previous.clone().map(Item::from);
        let work = match (kind, previous) {
            (OperationKind::Create, _) => Work::Create { item },
            (OperationKind::Delete, _) => Work::Delete { item },
            (OperationKind::Read, _) => Work::Read { item },
            (OperationKind::Modify, Some(previous)) => Work::Modify { previous, item },
            (OperationKind::NeedsRecreate, Some(previous)) => {
                Work::NeedsRecreate { previous, item }
            }
            (OperationKind::Modify | OperationKind::NeedsRecreate, None) => {
                return Err(fail(
                    Code::InvalidArgument,
                    format!(
                        "the {kind} request for {} carried no previous value",
                        item.item_ref()
                    ),
                ));
            }
        };
        Ok(Box::new(StartOperation {
            parts: ContextParts {
                key: OpKey::new(request.op_id, request.attempt),
                kind,
                item: work.item().item_ref(),
                epoch: request.epoch,
                generation: request.generation,
                timeout: request.timeout.and_then(duration_from_proto),
                previous_uncertain: request.previous_uncertain,
                cancel: CancellationToken::new(),
            },
            work,
        }))
    }

    #[cfg(test)]
    fn held_results(&self, key: &OpKey) -> usize {
        self.unacked
            .get(key)
            .map_or(0, |unacked| unacked.results.len())
    }
}

fn message(message: Outgoing) -> v1::AgentMessage {
    v1::AgentMessage {
        message: Some(message),
    }
}

fn duplicate_event(key: &OpKey) -> Action {
    Action::Event(AgentEvent::DuplicateOperation {
        op_id: key.op_id.clone(),
        attempt: key.attempt,
    })
}

fn sent_event(key: &OpKey, result: &v1::OperationResult, resent: bool) -> AgentEvent {
    AgentEvent::ResultSent {
        op_id: key.op_id.clone(),
        attempt: key.attempt,
        outcome: ResultKind::of(result),
        resent,
    }
}

/// The heartbeat interval a `Registered` asks for (5 s if absent or zero).
pub(crate) fn heartbeat_interval(registered: &v1::Registered) -> Duration {
    registered
        .heartbeat_interval
        .and_then(duration_from_proto)
        .filter(|interval| !interval.is_zero())
        .unwrap_or(DEFAULT_HEARTBEAT_INTERVAL)
        .max(MIN_HEARTBEAT_INTERVAL)
}

/// The lease a `Registered` announces (three heartbeat intervals if absent);
/// never shorter than two heartbeat intervals, so one late heartbeat does
/// not end the session.
pub(crate) fn lease(registered: &v1::Registered) -> Duration {
    let interval = heartbeat_interval(registered);
    registered
        .lease
        .and_then(duration_from_proto)
        .filter(|lease| !lease.is_zero())
        .unwrap_or(interval * 3)
        .max(interval * 2)
}

/// The heartbeat interval when the server does not say.
pub(crate) const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);

/// The shortest heartbeat interval the agent honours.
const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(50);

/// Whether a result settles its operation, so that a repeated request is
/// answered with it: `IN_PROGRESS` promises a later result and `WAIT` asks
/// to be asked again (DESIGN section 4), so neither does; nor does
/// "cancelled as asked" (`FAILED` with `CANCELLED`), which the server
/// takes as no attempt and may follow with the same op_id and attempt.
fn settles(result: &v1::OperationResult) -> bool {
    let cancelled_as_asked = result.outcome() == v1::Outcome::Failed
        && result
            .status
            .as_ref()
            .is_some_and(|status| status.code == Code::Cancelled as i32);
    !cancelled_as_asked
        && !matches!(
            result.outcome(),
            v1::Outcome::InProgress | v1::Outcome::Wait
        )
}

/// How long the server waits before asking again for an operation a
/// shutting-down agent handed back: long enough for the agent to close its
/// stream first.
const HAND_BACK_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// A CANCELLED answer of an operation cancelled for shutdown, as WAIT.
fn handed_back(result: &mut v1::OperationResult) {
    let cancelled = result.outcome == i32::from(v1::Outcome::Failed)
        && result
            .status
            .as_ref()
            .is_some_and(|status| status.code == tonic::Code::Cancelled as i32);
    if cancelled {
        result.outcome = v1::Outcome::Wait.into();
        result.status = None;
        result.retry_after = prost_types::Duration::try_from(HAND_BACK_RETRY).ok();
    }
}

#[cfg(test)]
mod tests {
    use reconciled_proto::v1::server_message::Message as Incoming;
    use serde_json::json;

    use super::*;
    use crate::convert::properties_to_struct;

    fn state() -> SessionState {
        let mut state = SessionState::new(["file".to_owned(), "directory".to_owned()]);
        let _ = state.connected(&registered());
        state
    }

    fn registered() -> v1::Registered {
        v1::Registered {
            session_id: "s-1".into(),
            granted: vec![v1::TypeGrant {
                item_type: "file".into(),
                epoch: 4,
            }],
            heartbeat_interval: None,
            lease: None,
        }
    }

    fn item(name: &str) -> v1::Item {
        let properties = json!({"path": name});
        let properties = properties.as_object().cloned().unwrap_or_default();
        v1::Item {
            r#type: "file".into(),
            name: name.into(),
            properties: Some(properties_to_struct(&properties)),
            ..v1::Item::default()
        }
    }

    fn request(op_id: &str, attempt: u32, kind: v1::OperationKind) -> v1::ServerMessage {
        v1::ServerMessage {
            message: Some(Incoming::Operation(v1::OperationRequest {
                op_id: op_id.into(),
                attempt,
                epoch: 4,
                operation: kind as i32,
                item: Some(item("a")),
                previous: None,
                timeout: Some(prost_types::Duration {
                    seconds: 30,
                    nanos: 0,
                }),
                generation: 9,
                previous_uncertain: false,
            })),
        }
    }

    fn create(op_id: &str, attempt: u32) -> v1::ServerMessage {
        request(op_id, attempt, v1::OperationKind::Create)
    }

    fn ack(op_id: &str, attempt: u32) -> v1::ServerMessage {
        v1::ServerMessage {
            message: Some(Incoming::ResultAck(v1::ResultAck {
                op_id: op_id.into(),
                attempt,
            })),
        }
    }

    fn cancel(op_id: &str) -> v1::ServerMessage {
        v1::ServerMessage {
            message: Some(Incoming::Cancel(v1::CancelOperation {
                op_id: op_id.into(),
            })),
        }
    }

    fn finished(op_id: &str, attempt: u32, outcome: Outcome) -> OperationEvent {
        OperationEvent::Finished {
            key: OpKey::new(op_id, attempt),
            result: result_message(op_id, attempt, Answer::Outcome(outcome)),
        }
    }

    fn starts(actions: &[Action]) -> Vec<&StartOperation> {
        actions
            .iter()
            .filter_map(|action| match action {
                Action::Start(start) => Some(start.as_ref()),
                _ => None,
            })
            .collect()
    }

    fn sent(actions: &[Action]) -> Vec<&Outgoing> {
        actions
            .iter()
            .filter_map(|action| match action {
                Action::Send(message) => message.message.as_ref(),
                _ => None,
            })
            .collect()
    }

    fn sent_results(actions: &[Action]) -> Vec<(String, u32, v1::Outcome)> {
        sent(actions)
            .into_iter()
            .filter_map(|message| match message {
                Outgoing::Result(result) => {
                    Some((result.op_id.clone(), result.attempt, result.outcome()))
                }
                _ => None,
            })
            .collect()
    }

    fn cancel_acks(actions: &[Action]) -> Vec<String> {
        sent(actions)
            .into_iter()
            .filter_map(|message| match message {
                Outgoing::CancelAck(ack) => Some(ack.op_id.clone()),
                _ => None,
            })
            .collect()
    }

    fn failure_code(actions: &[Action]) -> Option<i32> {
        sent(actions).into_iter().find_map(|message| match message {
            Outgoing::Result(result) => result.status.as_ref().map(|status| status.code),
            _ => None,
        })
    }

    #[test]
    fn a_request_starts_an_operation_with_its_context() {
        let mut state = state();
        let actions = state.on_server_message(create("op-1", 1));
        let started = starts(&actions);
        assert_eq!(started.len(), 1);
        let parts = &started[0].parts;
        assert_eq!(parts.key, OpKey::new("op-1", 1));
        assert_eq!(parts.kind, OperationKind::Create);
        assert_eq!((parts.epoch, parts.generation), (4, 9));
        assert_eq!(parts.timeout, Some(Duration::from_secs(30)));
        assert_eq!(started[0].work.item().property("path"), Some(&json!("a")));
        assert!(actions.iter().any(|action| matches!(
            action,
            Action::Event(AgentEvent::OperationReceived { op_id, .. }) if op_id == "op-1"
        )));
    }

    #[test]
    fn a_re_ask_after_wait_runs_the_operation_again_under_the_same_key() {
        let mut state = state();
        let _ = state.on_server_message(create("op-1", 1));
        let actions = state.on_operation_event(finished(
            "op-1",
            1,
            Outcome::Wait {
                retry_after: Duration::from_millis(200),
            },
        ));
        assert_eq!(
            sent_results(&actions),
            [("op-1".to_string(), 1, v1::Outcome::Wait)]
        );
        let _ = state.on_server_message(ack("op-1", 1));
        // DESIGN section 4: the re-ask keeps op_id and attempt, and asks
        // the configurator again.
        let actions = state.on_server_message(create("op-1", 1));
        assert_eq!(starts(&actions).len(), 1, "the re-ask runs again");
        assert!(
            sent_results(&actions).is_empty(),
            "no cached WAIT is replayed"
        );
    }

    #[test]
    fn a_newer_attempt_drops_an_older_attempts_unacknowledged_result() {
        let mut state = state();
        let _ = state.on_server_message(create("op-1", 3));
        let _ = state.on_operation_event(finished(
            "op-1",
            3,
            Outcome::failed(Code::Unavailable, "busy"),
        ));
        assert_eq!(
            state.outstanding_op_ids(),
            ["op-1"],
            "the result is unacknowledged"
        );
        // The server retried (attempt 5); the session ends before the
        // attempt-3 result is acknowledged, and before attempt 5 starts.
        let _ = state.on_server_message(create("op-1", 5));
        let _ = state.on_operation_event(finished("op-1", 5, Outcome::Done { observed: None }));
        let _ = state.on_server_message(ack("op-1", 5));
        assert!(
            state.outstanding_op_ids().is_empty(),
            "a registration would still list op-1 for its stale attempt-3 result"
        );
    }

    #[test]
    fn a_repeated_request_while_running_is_not_started_twice() {
        let mut state = state();
        let _ = state.on_server_message(create("op-1", 1));
        let actions = state.on_server_message(create("op-1", 1));
        assert!(starts(&actions).is_empty());
        assert!(sent(&actions).is_empty());
        assert!(
            actions.iter().any(|action| matches!(
                action,
                Action::Event(AgentEvent::DuplicateOperation { .. })
            ))
        );
    }

    #[test]
    fn a_repeated_request_with_a_held_result_is_answered_with_it_again() {
        let mut state = state();
        let _ = state.on_server_message(create("op-1", 1));
        let actions = state.on_operation_event(finished("op-1", 1, Outcome::done()));
        assert_eq!(
            sent_results(&actions),
            [("op-1".into(), 1, v1::Outcome::Done)]
        );

        let actions = state.on_server_message(create("op-1", 1));
        assert!(starts(&actions).is_empty());
        assert_eq!(
            sent_results(&actions),
            [("op-1".into(), 1, v1::Outcome::Done)]
        );
        // Both copies are acknowledged in turn.
        assert_eq!(state.held_results(&OpKey::new("op-1", 1)), 2);
        let _ = state.on_server_message(ack("op-1", 1));
        let _ = state.on_server_message(ack("op-1", 1));
        assert!(state.is_idle());
    }

    #[test]
    fn a_re_delivery_after_the_ack_is_answered_from_memory_without_running_again() {
        let mut state = state();
        let _ = state.on_server_message(create("op-1", 1));
        let _ = state.on_operation_event(finished("op-1", 1, Outcome::done()));
        let actions = state.on_server_message(ack("op-1", 1));
        assert!(actions.iter().any(|action| matches!(
            action,
            Action::Event(AgentEvent::ResultAcked { attempt: 1, .. })
        )));
        assert!(state.is_idle());

        let actions = state.on_server_message(create("op-1", 1));
        assert!(starts(&actions).is_empty());
        assert_eq!(
            sent_results(&actions),
            [("op-1".into(), 1, v1::Outcome::Done)]
        );
        let _ = state.on_server_message(ack("op-1", 1));
        assert!(state.is_idle());
    }

    #[test]
    fn only_the_newest_acknowledged_results_are_remembered() {
        let mut state = state();
        for index in 0..=ACKED_MEMORY {
            let op_id = format!("op-{index}");
            let _ = state.on_server_message(create(&op_id, 1));
            let _ = state.on_operation_event(finished(&op_id, 1, Outcome::done()));
            let _ = state.on_server_message(ack(&op_id, 1));
        }
        assert_eq!(state.acked.len(), ACKED_MEMORY);
        // The oldest was forgotten: a re-delivery runs again.
        assert_eq!(starts(&state.on_server_message(create("op-0", 1))).len(), 1);
        assert!(starts(&state.on_server_message(create("op-1", 1))).is_empty());
    }

    #[test]
    fn an_acknowledged_in_progress_is_not_a_known_result() {
        let mut state = state();
        let _ = state.on_server_message(create("op-1", 1));
        let key = OpKey::new("op-1", 1);
        let _ = state.on_operation_event(OperationEvent::LongRunning { key });
        let _ = state.on_server_message(ack("op-1", 1));
        let _ = state.on_operation_event(finished("op-1", 1, Outcome::done()));
        let _ = state.on_server_message(ack("op-1", 1));
        assert!(state.is_idle());
        let actions = state.on_server_message(create("op-1", 1));
        assert_eq!(
            sent_results(&actions),
            [("op-1".into(), 1, v1::Outcome::Done)]
        );
    }

    #[test]
    fn results_finished_while_disconnected_are_sent_after_reconnecting() {
        let mut state = state();
        let _ = state.on_server_message(create("op-1", 1));
        let _ = state.on_server_message(create("op-2", 1));
        let _ = state.on_operation_event(finished("op-1", 1, Outcome::done()));
        let _ = state.disconnected("stream reset".into(), None);
        let actions = state.on_operation_event(finished(
            "op-2",
            1,
            Outcome::failed(Code::Unavailable, "disk busy"),
        ));
        assert!(
            sent(&actions).is_empty(),
            "nothing is sent while disconnected"
        );

        let actions = state.connected(&registered());
        assert_eq!(
            sent_results(&actions),
            [
                ("op-1".into(), 1, v1::Outcome::Done),
                ("op-2".into(), 1, v1::Outcome::Failed)
            ]
        );
        assert!(actions.iter().all(|action| !matches!(
            action,
            Action::Event(AgentEvent::ResultSent { resent: false, .. })
        )));
        let _ = state.on_server_message(ack("op-1", 1));
        let _ = state.on_server_message(ack("op-2", 1));
        assert!(state.is_idle());
    }

    #[test]
    fn an_unacknowledged_result_is_resent_after_every_reconnect_until_acked() {
        let mut state = state();
        let _ = state.on_server_message(create("op-1", 1));
        let _ = state.on_operation_event(finished("op-1", 1, Outcome::done()));
        for _ in 0..2 {
            let _ = state.disconnected("gone".into(), None);
            let actions = state.connected(&registered());
            assert_eq!(sent_results(&actions).len(), 1);
        }
        let _ = state.on_server_message(ack("op-1", 1));
        assert!(state.is_idle());
    }

    #[test]
    fn a_long_running_operation_answers_in_progress_then_its_final_result() {
        let mut state = state();
        let _ = state.on_server_message(create("op-1", 1));
        let key = OpKey::new("op-1", 1);
        let actions = state.on_operation_event(OperationEvent::LongRunning { key: key.clone() });
        assert_eq!(
            sent_results(&actions),
            [("op-1".into(), 1, v1::Outcome::InProgress)]
        );

        let actions = state.on_operation_event(OperationEvent::Progress {
            key: key.clone(),
            message: "50%".into(),
        });
        assert!(matches!(sent(&actions)[..], [Outgoing::Progress(_)]));

        // A re-delivery while it runs is told it is in progress again.
        let actions = state.on_server_message(create("op-1", 1));
        assert_eq!(
            sent_results(&actions),
            [("op-1".into(), 1, v1::Outcome::InProgress)]
        );
        assert!(starts(&actions).is_empty());

        let actions = state.on_operation_event(finished("op-1", 1, Outcome::done()));
        assert_eq!(
            sent_results(&actions),
            [("op-1".into(), 1, v1::Outcome::Done)]
        );
        for _ in 0..3 {
            let _ = state.on_server_message(ack("op-1", 1));
        }
        assert!(state.is_idle());
    }

    #[test]
    fn a_final_result_supersedes_an_unacknowledged_in_progress_on_reconnect() {
        let mut state = state();
        let _ = state.on_server_message(create("op-1", 1));
        let key = OpKey::new("op-1", 1);
        let _ = state.on_operation_event(OperationEvent::LongRunning { key: key.clone() });
        let _ = state.disconnected("gone".into(), None);
        let _ = state.on_operation_event(finished("op-1", 1, Outcome::done()));
        let actions = state.connected(&registered());
        assert_eq!(
            sent_results(&actions),
            [("op-1".into(), 1, v1::Outcome::Done)]
        );
        let _ = state.on_server_message(ack("op-1", 1));
        assert!(state.is_idle());
    }

    #[test]
    fn a_cancel_fires_the_token_and_is_acknowledged_after_the_result() {
        let mut state = state();
        let actions = state.on_server_message(create("op-1", 1));
        let token = starts(&actions)[0].parts.cancel.clone();

        let actions = state.on_server_message(cancel("op-1"));
        assert!(token.is_cancelled());
        assert!(cancel_acks(&actions).is_empty(), "the operation still runs");

        let actions = state.on_operation_event(finished(
            "op-1",
            1,
            Outcome::failed(Code::Cancelled, "stopped"),
        ));
        assert_eq!(
            sent_results(&actions),
            [("op-1".into(), 1, v1::Outcome::Failed)]
        );
        assert_eq!(cancel_acks(&actions), ["op-1"]);
        // The result comes before the acknowledgement.
        let order: Vec<bool> = sent(&actions)
            .iter()
            .map(|message| matches!(message, Outgoing::Result(_)))
            .collect();
        assert_eq!(order, [true, false]);
    }

    #[test]
    fn a_cancel_of_nothing_running_is_acknowledged_at_once() {
        let mut state = state();
        let actions = state.on_server_message(cancel("op-9"));
        assert_eq!(cancel_acks(&actions), ["op-9"]);
    }

    #[test]
    fn a_newer_attempt_cancels_the_older_and_starts_after_it() {
        let mut state = state();
        let actions = state.on_server_message(create("op-1", 1));
        let first_token = starts(&actions)[0].parts.cancel.clone();

        let actions = state.on_server_message(create("op-1", 2));
        assert!(starts(&actions).is_empty());
        assert!(first_token.is_cancelled());
        // A stale re-delivery of the older attempt changes nothing.
        assert!(starts(&state.on_server_message(create("op-1", 1))).is_empty());

        let actions = state.on_operation_event(finished("op-1", 1, Outcome::done()));
        let started = starts(&actions);
        assert_eq!(started.len(), 1);
        assert_eq!(started[0].parts.key, OpKey::new("op-1", 2));
        assert!(!started[0].parts.cancel.is_cancelled());
    }

    #[test]
    fn a_cancel_answers_a_parked_attempt_with_cancelled() {
        let mut state = state();
        let _ = state.on_server_message(create("op-1", 1));
        let _ = state.on_server_message(create("op-1", 2));
        let actions = state.on_server_message(cancel("op-1"));
        assert_eq!(
            sent_results(&actions),
            [("op-1".into(), 2, v1::Outcome::Failed)]
        );
        assert_eq!(failure_code(&actions), Some(Code::Cancelled as i32));
        let actions = state.on_operation_event(finished("op-1", 1, Outcome::done()));
        assert!(starts(&actions).is_empty());
        assert_eq!(cancel_acks(&actions), ["op-1"]);
    }

    #[test]
    fn a_request_for_an_unhandled_type_fails_with_unimplemented() {
        let mut state = state();
        let mut message = create("op-1", 1);
        if let Some(Incoming::Operation(request)) = message.message.as_mut()
            && let Some(item) = request.item.as_mut()
        {
            item.r#type = "vlan".into();
        }
        let actions = state.on_server_message(message);
        assert!(starts(&actions).is_empty());
        assert_eq!(failure_code(&actions), Some(Code::Unimplemented as i32));
    }

    #[test]
    fn a_modify_without_previous_fails_with_invalid_argument() {
        let mut state = state();
        let actions = state.on_server_message(request("op-1", 1, v1::OperationKind::Modify));
        assert!(starts(&actions).is_empty());
        assert_eq!(failure_code(&actions), Some(Code::InvalidArgument as i32));
    }

    #[test]
    fn an_unknown_operation_kind_fails_with_unimplemented() {
        let mut state = state();
        let mut message = create("op-1", 1);
        if let Some(Incoming::Operation(request)) = message.message.as_mut() {
            request.operation = 42;
        }
        let actions = state.on_server_message(message);
        assert_eq!(failure_code(&actions), Some(Code::Unimplemented as i32));
    }

    #[test]
    fn while_draining_new_requests_are_not_started() {
        let mut state = state();
        state.begin_drain();
        let actions = state.on_server_message(create("op-1", 1));
        assert!(starts(&actions).is_empty());
        assert!(sent(&actions).is_empty());
        assert!(state.is_idle());
    }

    #[test]
    fn external_updates_wait_for_a_connection() {
        let mut state = SessionState::new(["file".to_owned()]);
        assert!(
            state
                .report_external(v1::ExternalUpdate::default())
                .is_empty()
        );
        let actions = state.connected(&registered());
        assert!(matches!(sent(&actions)[..], [Outgoing::ExternalUpdate(_)]));
        assert_eq!(
            state.report_external(v1::ExternalUpdate::default()).len(),
            1
        );
    }

    #[test]
    fn progress_of_an_unknown_or_disconnected_operation_is_dropped() {
        let mut state = state();
        let actions = state.on_operation_event(OperationEvent::Progress {
            key: OpKey::new("nope", 1),
            message: "x".into(),
        });
        assert!(actions.is_empty());
    }

    #[test]
    fn a_registration_lists_what_runs_and_what_waits_for_its_ack() {
        let mut state = state();
        let _ = state.on_server_message(create("running", 1));
        let _ = state.on_server_message(create("finished", 1));
        let _ = state.on_operation_event(finished("finished", 1, Outcome::done()));
        let _ = state.on_server_message(create("acked", 1));
        let _ = state.on_operation_event(finished("acked", 1, Outcome::done()));
        let _ = state.on_server_message(ack("acked", 1));
        let _ = state.disconnected("gone".into(), None);
        assert_eq!(
            state.outstanding_op_ids(),
            vec!["finished".to_owned(), "running".to_owned()]
        );
    }

    #[test]
    fn heartbeat_and_lease_come_from_registered_with_safe_defaults() {
        let mut registered = registered();
        assert_eq!(heartbeat_interval(&registered), Duration::from_secs(5));
        assert_eq!(lease(&registered), Duration::from_secs(15));
        registered.heartbeat_interval = Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        });
        registered.lease = Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        });
        assert_eq!(heartbeat_interval(&registered), Duration::from_secs(1));
        assert_eq!(lease(&registered), Duration::from_secs(2));
    }
}
