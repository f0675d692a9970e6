//! Watches that resume by themselves:
//! [`Client::watch_resuming`](crate::Client::watch_resuming) and
//! [`Client::watch_fleet_resuming`](crate::Client::watch_fleet_resuming).
//!
//! A `Watch` or `WatchFleet` stream ends whenever the connection does (a
//! server restart, a replica handing the tenant over), when the watcher
//! is too slow, or when the history it would resume from is gone. Each
//! case has its rule (`docs/watch.md`); a [`ResumingWatch`] follows them,
//! so that a controller reads one stream in which nothing is lost or
//! repeated, and is told when it must start over.

mod kinds;
mod position;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;
use tonic::codec::Streaming;
use tonic_types::StatusExt as _;
use tracing::{info, warn};

pub use kinds::{Fleet, Tenant};
pub(crate) use position::Position;
use position::{Break, Seen};

use crate::backoff::Backoff;
use crate::retry::UNAVAILABLE_RETRY_DELAY;

/// The first wait before reopening a broken stream (drawn from its upper
/// half); it doubles while attempts bring nothing.
const FIRST_RETRY: Duration = UNAVAILABLE_RETRY_DELAY;

/// The longest wait between attempts.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// A tenant's `Watch` that resumes by itself
/// ([`Client::watch_resuming`](crate::Client::watch_resuming)).
pub type TenantWatch = ResumingWatch<Tenant>;

/// The fleet's `WatchFleet` that resumes by itself
/// ([`Client::watch_fleet_resuming`](crate::Client::watch_fleet_resuming)).
pub type FleetWatch = ResumingWatch<Fleet>;

/// What [`ResumingWatch::next`] gives.
#[derive(Debug)]
pub enum Resumed<M> {
    /// The stream's next message, in order: across reconnections nothing
    /// is lost or repeated. A revision's events may still come in several
    /// messages (`continued` set on all but the last).
    Message(M),
    /// The watch could not continue where it was (the history it would
    /// resume from was compacted, or the stream broke during the initial
    /// listing). A fresh listing follows (snapshot parts or the fleet's
    /// groups, then `Synced`): build your view again from it. What it
    /// lacks of the old view went away meanwhile, with no event of its
    /// own, so a controller that reports changes keeps the old view until
    /// `Synced` and compares. The status says why.
    StartedOver(Status),
}

/// Which stream a [`ResumingWatch`] follows: [`Tenant`] or [`Fleet`]. The
/// SDK implements it for those two only.
pub trait WatchKind: kinds::Sealed + Send + 'static {
    /// The request that opens the stream.
    type Request: Clone + Send + Sync + 'static;
    /// A message of the stream (the response's `oneof message`).
    type Message: Send + 'static;
    /// The response type of the stream.
    #[doc(hidden)]
    type Response: Send + 'static;

    #[doc(hidden)]
    fn start_revision(request: &Self::Request) -> u64;

    #[doc(hidden)]
    fn from_revision(request: &Self::Request, revision: u64) -> Self::Request;

    #[doc(hidden)]
    fn message(response: Self::Response) -> Option<Self::Message>;

    #[doc(hidden)]
    fn seen(message: &Self::Message) -> Seen;

    /// Drops the first `count` events of an events message; returns
    /// whether any event is left.
    #[doc(hidden)]
    fn drop_events(message: &mut Self::Message, count: usize) -> bool;

    /// What the stream is, for logs ("tenant acme", "the fleet").
    #[doc(hidden)]
    fn describe(request: &Self::Request) -> String;
}

/// A watch stream that opens itself again after a break, from where it
/// was.
///
/// - **Lost connections and slow consumers** (`UNAVAILABLE`,
///   `RESOURCE_EXHAUSTED` with a `RetryInfo`): it waits and resumes after
///   the last revision it delivered whole; the events of a revision it
///   had delivered in part are not delivered again. The wait is at least
///   what a `RetryInfo` says, 0.5 to 1 s at first, and doubles (with
///   jitter, up to 30 s) while attempts bring no message.
/// - **A compacted history** (`OUT_OF_RANGE`, `REVISION_COMPACTED`) or a
///   break during the initial listing: [`Resumed::StartedOver`], then a
///   fresh listing.
/// - **Anything retrying cannot mend** (`NOT_FOUND`: the tenant was
///   deleted; `UNAUTHENTICATED`: the token was rotated or the tenant
///   deleted; `INVALID_ARGUMENT`; `PERMISSION_DENIED`; the watcher limit's
///   `RESOURCE_EXHAUSTED`) ends [`next`](Self::next) with that status.
///   Calling `next` again opens the stream again from the same place.
///
/// Each break is logged (`tracing`, level WARN) with the status that
/// ended the stream, as the agent logs a lost session, and the first
/// message after it at INFO ("The watch stream is open again.").
pub struct ResumingWatch<K: WatchKind> {
    open: Opener<K>,
    request: K::Request,
    position: Position,
    stream: Option<Streaming<K::Response>>,
    /// Reset whenever a message comes through.
    backoff: Backoff,
    /// Breaks so far.
    breaks: u64,
    /// A break was logged and no message has come through since.
    recovering: bool,
    /// When the next attempt to open the stream may start. Kept until
    /// then, so that a `next` dropped during the wait (in a `select!`)
    /// goes on waiting for the same moment.
    wait_until: Option<Instant>,
    /// The attempt to open the stream under way, kept across a dropped
    /// `next` so that it is not started again.
    opening: Option<Opening<K>>,
}

impl<K: WatchKind> std::fmt::Debug for ResumingWatch<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumingWatch")
            .field("watching", &K::describe(&self.request))
            .field("resume_revision", &self.position.start())
            .field("open", &self.stream.is_some())
            .finish()
    }
}

/// An attempt to open the stream.
pub(crate) type Opening<K> =
    Pin<Box<dyn Future<Output = Result<Streaming<<K as WatchKind>::Response>, Status>> + Send>>;

/// Opens the stream for a request (the client's `watch` or `watch_fleet`).
pub(crate) type Opener<K> = Box<dyn FnMut(<K as WatchKind>::Request) -> Opening<K> + Send>;

impl<K: WatchKind> ResumingWatch<K> {
    /// A watch of `request` (from its `start_revision`) whose streams
    /// `open` opens. Nothing is sent before the first [`next`](Self::next).
    pub(crate) fn new(request: K::Request, open: Opener<K>) -> Self {
        let position = Position::new(K::start_revision(&request));
        Self {
            open,
            request,
            position,
            stream: None,
            backoff: Backoff::new(FIRST_RETRY, MAX_RETRY),
            breaks: 0,
            recovering: false,
            wait_until: None,
            opening: None,
        }
    }

    /// Goes on from `stream`, already opened for the request this watch
    /// was made with (so that a caller that opened it to see its refusals
    /// first does not open it twice).
    pub(crate) fn continuing(mut self, stream: Streaming<K::Response>) -> Self {
        self.stream = Some(stream);
        self
    }

    /// The next message, waiting (and reconnecting) as long as it takes.
    ///
    /// Cancel-safe: a `next` dropped before it returns (a branch of
    /// `tokio::select!` that lost) loses no message and no
    /// [`Resumed::StartedOver`]; the next call goes on from there.
    ///
    /// # Errors
    /// A status that retrying cannot change (see [`ResumingWatch`]).
    pub async fn next(&mut self) -> Result<Resumed<K::Message>, Status> {
        loop {
            let Some(stream) = &mut self.stream else {
                if let Some(until) = self.wait_until {
                    tokio::time::sleep_until(until).await;
                    self.wait_until = None;
                }
                if self.opening.is_none() {
                    let request = K::from_revision(&self.request, self.position.start());
                    self.opening = Some((self.open)(request));
                }
                let opened = match &mut self.opening {
                    Some(opening) => opening.await,
                    None => continue,
                };
                self.opening = None;
                match opened {
                    Ok(stream) => self.stream = Some(stream),
                    Err(status) => {
                        if let Some(started_over) = self.after_break(Some(status))? {
                            return Ok(started_over);
                        }
                    }
                }
                continue;
            };
            let ended = match stream.message().await {
                Ok(Some(response)) => {
                    let Some(mut message) = K::message(response) else {
                        continue;
                    };
                    self.backoff.reset();
                    if std::mem::take(&mut self.recovering) {
                        info!(
                            watching = K::describe(&self.request),
                            breaks = self.breaks,
                            "The watch stream is open again."
                        );
                    }
                    let drop = self.position.observe(K::seen(&message));
                    if drop > 0 && !K::drop_events(&mut message, drop) {
                        // Every event of this message was delivered before.
                        continue;
                    }
                    return Ok(Resumed::Message(message));
                }
                Ok(None) => None,
                Err(status) => Some(status),
            };
            self.stream = None;
            if let Some(started_over) = self.after_break(ended)? {
                return Ok(started_over);
            }
        }
    }

    /// The revision the watch would resume from now: the last one it
    /// delivered whole, or the last `Synced` or `Bookmark` (0 before the
    /// listing's `Synced`). A controller that keeps it can start a new
    /// watch from it after its own restart.
    pub fn resume_revision(&self) -> u64 {
        self.position.start()
    }

    /// How many times the stream broke (or a call to open it was refused)
    /// and the watch went on: for a display that says it reconnected, or
    /// a metric.
    pub fn breaks(&self) -> u64 {
        self.breaks
    }

    /// Takes in a break: sets the wait before the next attempt, and gives
    /// `Some` when the caller must be told the watch starts over (at once:
    /// the wait comes before the next attempt, where a dropped `next`
    /// cannot lose the news).
    fn after_break(
        &mut self,
        ended: Option<Status>,
    ) -> Result<Option<Resumed<K::Message>>, Status> {
        let why = ended.unwrap_or_else(|| Status::unavailable("the server ended the stream"));
        let verdict = self.position.broke(&why);
        let delay = match verdict {
            Break::Fatal => return Err(why),
            Break::Compacted => Duration::ZERO,
            Break::Resume | Break::StartOver => self.delay_after(&why),
        };
        self.breaks += 1;
        self.recovering = true;
        self.wait_until = Some(Instant::now() + delay);
        warn!(
            watching = K::describe(&self.request),
            code = ?why.code(),
            message = why.message(),
            resume_revision = self.position.start(),
            ?delay,
            "{}",
            match verdict {
                Break::Resume => "The watch stream ended; resuming.",
                _ => "The watch cannot resume where it was; starting over from a fresh listing.",
            }
        );
        Ok((verdict != Break::Resume).then_some(Resumed::StartedOver(why)))
    }

    /// How long to wait before opening again after `status`: at least what
    /// the server's `RetryInfo` says, and a jittered backoff that grows
    /// while attempts bring nothing (so that the watchers of a restarted
    /// server do not all come back at once, and not every second while it
    /// is down).
    fn delay_after(&mut self, status: &Status) -> Duration {
        let told = status
            .get_error_details()
            .retry_info()
            .and_then(|retry| retry.retry_delay)
            .unwrap_or_default();
        told.max(self.backoff.next_delay())
    }
}
