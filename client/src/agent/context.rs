//! [`OperationContext`]: what a configurator knows about the operation it
//! runs, and how it reports progress, notices cancellation and hands a
//! long-running operation over to a [`Completion`].

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::item::ItemRef;
use super::outcome::{OperationKind, Outcome};

/// Names one attempt of one operation: the protocol de-duplicates on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct OpKey {
    /// The operation id.
    pub(crate) op_id: String,
    /// The attempt number.
    pub(crate) attempt: u32,
}

impl OpKey {
    pub(crate) fn new(op_id: impl Into<String>, attempt: u32) -> Self {
        Self {
            op_id: op_id.into(),
            attempt,
        }
    }
}

/// What an operation task tells the session (through the agent's run loop).
#[derive(Debug)]
pub(crate) enum OperationEvent {
    /// The configurator called `finish_later`: answer IN_PROGRESS now.
    LongRunning {
        /// The operation.
        key: OpKey,
    },
    /// The configurator reported progress.
    Progress {
        /// The operation.
        key: OpKey,
        /// The progress message.
        message: String,
    },
    /// The operation finished; `result` is its final `OperationResult`.
    Finished {
        /// The operation.
        key: OpKey,
        /// The result to send (and keep until acknowledged).
        result: reconciled_proto::v1::OperationResult,
    },
}

/// Where a long-running operation's final outcome will come from.
#[derive(Debug, Default)]
enum LaterSlot {
    /// `finish_later` was not called.
    #[default]
    Unused,
    /// `finish_later` was called; the outcome arrives here.
    Waiting(oneshot::Receiver<Outcome>),
    /// The run loop took the receiver.
    Taken,
}

/// The operation a configurator is running: its identity on the wire, its
/// cancellation, and the means to report progress or to finish later.
///
/// One context lives as long as its operation (including a long-running
/// operation's background part, through its [`Completion`]).
#[derive(Debug)]
pub struct OperationContext {
    key: OpKey,
    kind: OperationKind,
    item: ItemRef,
    epoch: u64,
    generation: u64,
    timeout: Option<Duration>,
    previous_uncertain: bool,
    cancel: CancellationToken,
    events: mpsc::UnboundedSender<OperationEvent>,
    later: Mutex<LaterSlot>,
}

/// Everything an [`OperationContext`] is made of, from the request.
pub(crate) struct ContextParts {
    pub(crate) key: OpKey,
    pub(crate) kind: OperationKind,
    pub(crate) item: ItemRef,
    pub(crate) epoch: u64,
    pub(crate) generation: u64,
    pub(crate) timeout: Option<Duration>,
    pub(crate) previous_uncertain: bool,
    pub(crate) cancel: CancellationToken,
}

impl OperationContext {
    pub(crate) fn new(parts: ContextParts, events: mpsc::UnboundedSender<OperationEvent>) -> Self {
        Self {
            key: parts.key,
            kind: parts.kind,
            item: parts.item,
            epoch: parts.epoch,
            generation: parts.generation,
            timeout: parts.timeout,
            previous_uncertain: parts.previous_uncertain,
            cancel: parts.cancel,
            events,
            later: Mutex::new(LaterSlot::Unused),
        }
    }

    /// The operation id: one operation on one item toward one target
    /// generation. A re-delivery keeps it.
    pub fn op_id(&self) -> &str {
        &self.key.op_id
    }

    /// The attempt number, starting at 1.
    pub fn attempt(&self) -> u32 {
        self.key.attempt
    }

    /// What the server asked for.
    pub fn kind(&self) -> OperationKind {
        self.kind
    }

    /// The item the operation acts on.
    pub fn item(&self) -> &ItemRef {
        &self.item
    }

    /// The item type's epoch when the operation was sent.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The intent generation the operation moves the item to.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// How long the server waits for a result (or, once the operation is
    /// long-running, between progress reports); `None` if it did not say.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The outcome of an earlier operation on the item is unknown: the
    /// previous value may not be what the item is now.
    pub fn previous_uncertain(&self) -> bool {
        self.previous_uncertain
    }

    /// Completes when the server cancels the operation (its item's intent
    /// changed or left the intent) or the agent shuts down. Whatever outcome
    /// the configurator returns afterwards is still sent and is
    /// authoritative, so return what actually happened.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    /// Whether the operation has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The cancellation token itself, e.g. to hand to other tasks.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Sends `OperationProgress` with `message` (shown in the item's status).
    /// Each report gives the operation its whole `operation_timeout` again,
    /// whether or not it is long-running ([`finish_later`](Self::finish_later)).
    /// Dropped while the agent is disconnected.
    pub fn progress(&self, message: impl Into<String>) {
        // The run loop may already have stopped: nothing to report to then.
        let _ = self.events.send(OperationEvent::Progress {
            key: self.key.clone(),
            message: message.into(),
        });
    }

    /// Turns the operation into a long-running one: the agent answers
    /// `IN_PROGRESS` at once, and the final outcome is whatever is passed to
    /// [`Completion::finish`] later. The configurator then returns
    /// [`Outcome::InProgress`] (any other outcome it returns is final, and a
    /// later `finish` is ignored).
    ///
    /// Call it once per operation; a second call returns a `Completion` whose
    /// `finish` is ignored. If the `Completion` is dropped without `finish`,
    /// the operation fails with `ABORTED` (retried).
    ///
    /// ```no_run
    /// use reconciled_client::agent::{Item, OperationContext, Outcome};
    ///
    /// async fn create(ctx: &OperationContext, item: &Item) -> Outcome {
    ///     let completion = ctx.finish_later();
    ///     tokio::spawn(async move {
    ///         completion.progress("downloading image");
    ///         // ... minutes of work, watching completion.cancellation_token() ...
    ///         completion.finish(Outcome::done());
    ///     });
    ///     Outcome::InProgress
    /// }
    /// ```
    pub fn finish_later(&self) -> Completion {
        let mut slot = self
            .later
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let sender = match *slot {
            LaterSlot::Unused => {
                let (sender, receiver) = oneshot::channel();
                *slot = LaterSlot::Waiting(receiver);
                let _ = self.events.send(OperationEvent::LongRunning {
                    key: self.key.clone(),
                });
                Some(sender)
            }
            LaterSlot::Waiting(_) | LaterSlot::Taken => {
                tracing::warn!(
                    op_id = %self.key.op_id,
                    attempt = self.key.attempt,
                    "finish_later called twice; the second Completion is ignored."
                );
                None
            }
        };
        Completion {
            key: self.key.clone(),
            sender,
            cancel: self.cancel.clone(),
            events: self.events.clone(),
        }
    }

    /// The receiver of a long-running operation's final outcome, if
    /// `finish_later` was called (taken once).
    pub(crate) fn take_later(&self) -> Option<oneshot::Receiver<Outcome>> {
        let mut slot = self
            .later
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match std::mem::replace(&mut *slot, LaterSlot::Taken) {
            LaterSlot::Waiting(receiver) => Some(receiver),
            LaterSlot::Unused | LaterSlot::Taken => None,
        }
    }
}

/// The background half of a long-running operation (from
/// [`OperationContext::finish_later`]): report progress, watch for
/// cancellation, and [`finish`](Completion::finish) with the final outcome.
/// Dropping it without `finish` fails the operation with `ABORTED`.
#[derive(Debug)]
pub struct Completion {
    key: OpKey,
    sender: Option<oneshot::Sender<Outcome>>,
    cancel: CancellationToken,
    events: mpsc::UnboundedSender<OperationEvent>,
}

impl Completion {
    /// Sends the final outcome (a second result with the same op id and
    /// attempt). `Outcome::InProgress` is not final: it fails the operation
    /// with `INTERNAL`.
    pub fn finish(mut self, outcome: Outcome) {
        if let Some(sender) = self.sender.take() {
            // The operation may already have ended (its configurator
            // returned a final outcome); then this one is ignored.
            let _ = sender.send(outcome);
        }
    }

    /// Sends `OperationProgress` with `message`; it also extends the
    /// operation's timeout on the server.
    pub fn progress(&self, message: impl Into<String>) {
        let _ = self.events.send(OperationEvent::Progress {
            key: self.key.clone(),
            message: message.into(),
        });
    }

    /// The operation id.
    pub fn op_id(&self) -> &str {
        &self.key.op_id
    }

    /// The attempt number.
    pub fn attempt(&self) -> u32 {
        self.key.attempt
    }

    /// Completes when the server cancels the operation or the agent shuts
    /// down.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    /// Whether the operation has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The cancellation token itself.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.cancel
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> (OperationContext, mpsc::UnboundedReceiver<OperationEvent>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let parts = ContextParts {
            key: OpKey::new("op-1", 1),
            kind: OperationKind::Create,
            item: ItemRef::new("file", "a"),
            epoch: 3,
            generation: 7,
            timeout: Some(Duration::from_secs(10)),
            previous_uncertain: false,
            cancel: CancellationToken::new(),
        };
        (OperationContext::new(parts, sender), receiver)
    }

    #[tokio::test]
    async fn finish_later_announces_in_progress_and_delivers_the_outcome() {
        let (ctx, mut events) = context();
        let completion = ctx.finish_later();
        assert!(matches!(
            events.try_recv(),
            Ok(OperationEvent::LongRunning { key }) if key == OpKey::new("op-1", 1)
        ));
        completion.progress("half way");
        assert!(
            matches!(events.try_recv(), Ok(OperationEvent::Progress { message, .. }) if message == "half way")
        );
        let receiver = ctx.take_later().expect("finish_later was called");
        completion.finish(Outcome::done());
        assert_eq!(receiver.await.ok(), Some(Outcome::done()));
        assert!(ctx.take_later().is_none());
    }

    #[tokio::test]
    async fn a_dropped_completion_closes_the_channel() {
        let (ctx, _events) = context();
        drop(ctx.finish_later());
        let receiver = ctx.take_later().expect("finish_later was called");
        assert!(receiver.await.is_err());
    }

    #[test]
    fn a_second_finish_later_is_ignored() {
        let (ctx, mut events) = context();
        let _first = ctx.finish_later();
        let second = ctx.finish_later();
        assert!(second.sender.is_none());
        assert!(events.try_recv().is_ok());
        assert!(events.try_recv().is_err());
    }

    #[test]
    fn without_finish_later_there_is_nothing_to_wait_for() {
        let (ctx, _events) = context();
        assert!(ctx.take_later().is_none());
        assert!(ctx.take_later().is_none());
        assert_eq!(ctx.generation(), 7);
        assert_eq!(ctx.item().to_string(), "file/a");
    }
}
