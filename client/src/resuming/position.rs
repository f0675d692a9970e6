//! Where a resuming watch stands in its stream, and what it does when the
//! stream breaks: the rules of `docs/watch.md` ("The stream") without any
//! I/O, so that every case is a unit test.
//!
//! - A watch opened from revision 0 first lists what there is (snapshot
//!   parts, or the fleet's listing groups) and then says `Synced`. Until
//!   then it has no revision to resume from: a break starts it over, and
//!   what was listed must be forgotten (a tenant deleted between two
//!   listings would otherwise stay).
//! - A revision's events may come in several messages, all but the last
//!   marked `continued`. The server resumes after the last *whole*
//!   revision, so it sends a cut revision again from its first event; the
//!   events already delivered are dropped, so none is seen twice.
//! - `REVISION_COMPACTED` (the history to resume from is gone): start over
//!   from 0. Other refusals are retried where [`retry_after`] says a retry
//!   can succeed, or end the call.

use tonic::{Code, Status};
use tonic_types::StatusExt as _;

use crate::retry::retry_after;

/// What one message of the stream is, as far as resuming goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// A part of the initial listing (a snapshot part; a fleet group
    /// before `Synced`).
    Listing,
    /// The listing is complete as of this revision.
    Synced(u64),
    /// Nothing to send up to this revision.
    Bookmark(u64),
    /// `count` events of `revision`; more of it follow when `continued`.
    Events {
        revision: u64,
        count: usize,
        continued: bool,
    },
}

/// What to do after the stream (or the call that opens it) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Break {
    /// Wait, then open it again from [`Position::start`].
    Resume,
    /// What was delivered can no longer be continued: tell the caller to
    /// forget it, wait, then open again from 0 (a fresh listing).
    StartOver,
    /// The history to resume from is gone: tell the caller to forget what
    /// was delivered and open again from 0 at once (the server answered).
    Compacted,
    /// Retrying cannot help (the tenant or token is gone, the request is
    /// wrong): hand the status to the caller.
    Fatal,
}

/// Events of one revision delivered while its group was not whole yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cut {
    revision: u64,
    events: usize,
}

/// A resuming watch's place in its stream.
#[derive(Debug, Clone)]
pub(crate) struct Position {
    /// The revision the next stream starts from (0: a listing).
    resume_from: u64,
    /// The current stream was opened from 0 and has not said `Synced`.
    listing: bool,
    /// Some part of the current listing was delivered.
    listed: bool,
    /// The revision being delivered, if its group is not whole yet.
    cut: Option<Cut>,
    /// After a resume: the leading events of this revision that were
    /// delivered before the break, still to drop.
    to_drop: Option<Cut>,
}

impl Position {
    /// A watch that starts from `start_revision` (0: a listing first).
    pub(crate) fn new(start_revision: u64) -> Self {
        Self {
            resume_from: start_revision,
            listing: start_revision == 0,
            listed: false,
            cut: None,
            to_drop: None,
        }
    }

    /// The revision to open the stream from.
    pub(crate) fn start(&self) -> u64 {
        self.resume_from
    }

    /// Takes in a message of the stream; returns how many of its leading
    /// events to drop (delivered before a break).
    pub(crate) fn observe(&mut self, seen: Seen) -> usize {
        if self.listing {
            match seen {
                Seen::Synced(revision) => {
                    self.listing = false;
                    self.listed = false;
                    self.resume_from = revision;
                }
                _ => self.listed = true,
            }
            return 0;
        }
        match seen {
            Seen::Listing => 0,
            Seen::Synced(revision) | Seen::Bookmark(revision) => {
                self.resume_from = revision;
                0
            }
            Seen::Events {
                revision,
                count,
                continued,
            } => self.events(revision, count, continued),
        }
    }

    fn events(&mut self, revision: u64, count: usize, continued: bool) -> usize {
        let dropped = match &mut self.to_drop {
            Some(drop) if drop.revision == revision => {
                let dropped = drop.events.min(count);
                drop.events -= dropped;
                dropped
            }
            _ => 0,
        };
        if self
            .to_drop
            .is_some_and(|drop| drop.events == 0 || drop.revision != revision)
        {
            self.to_drop = None;
        }
        if continued {
            let before = self
                .cut
                .filter(|cut| cut.revision == revision)
                .map_or(0, |cut| cut.events);
            self.cut = Some(Cut {
                revision,
                events: before + count - dropped,
            });
        } else {
            self.cut = None;
            self.to_drop = None;
            self.resume_from = revision;
        }
        dropped
    }

    /// The stream ended with `status`, or the call opening it was refused
    /// with it.
    pub(crate) fn broke(&mut self, status: &Status) -> Break {
        if is_compacted(status) {
            self.start_over();
            return Break::Compacted;
        }
        if retry_after(status).is_none() {
            return Break::Fatal;
        }
        if self.listing {
            let listed = self.listed;
            self.start_over();
            return if listed {
                Break::StartOver
            } else {
                Break::Resume
            };
        }
        self.to_drop = self.cut;
        Break::Resume
    }

    fn start_over(&mut self) {
        *self = Self::new(0);
    }
}

/// `OUT_OF_RANGE` with `ErrorInfo` reason `REVISION_COMPACTED`: the
/// revision to resume from is no longer in the history (or is one a
/// deleted tenant of the same name reached).
fn is_compacted(status: &Status) -> bool {
    status.code() == Code::OutOfRange
        && status
            .get_error_details()
            .error_info()
            .is_some_and(|info| info.reason == "REVISION_COMPACTED")
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tonic_types::ErrorDetails;

    use std::time::Duration;

    use super::*;

    fn lost() -> Status {
        Status::unavailable("the connection was lost")
    }

    fn events(revision: u64, count: usize, continued: bool) -> Seen {
        Seen::Events {
            revision,
            count,
            continued,
        }
    }

    fn compacted() -> Status {
        Status::with_error_details(
            Code::OutOfRange,
            "compacted",
            ErrorDetails::with_error_info("REVISION_COMPACTED", "reconciled", HashMap::new()),
        )
    }

    #[test]
    fn a_break_after_whole_groups_resumes_from_the_last_one() {
        let mut position = Position::new(0);
        assert_eq!(position.observe(Seen::Listing), 0);
        assert_eq!(position.observe(Seen::Synced(10)), 0);
        assert_eq!(position.observe(events(11, 3, false)), 0);
        assert_eq!(position.observe(Seen::Bookmark(14)), 0);
        assert_eq!(
            position.broke(&Status::unavailable("restarting")),
            Break::Resume
        );
        assert_eq!(position.start(), 14);
        // The resumed stream has nothing to drop.
        assert_eq!(position.observe(events(15, 2, false)), 0);
        assert_eq!(position.start(), 15);
    }

    #[test]
    fn a_revision_cut_by_a_break_is_resent_whole_and_its_delivered_events_are_dropped() {
        let mut position = Position::new(4);
        assert_eq!(position.observe(events(5, 2, false)), 0);
        assert_eq!(position.observe(events(6, 3, true)), 0);
        assert_eq!(position.observe(events(6, 2, true)), 0);
        assert_eq!(position.broke(&lost()), Break::Resume);
        assert_eq!(position.start(), 5);
        // The server sends revision 6 again, split another way: the five
        // delivered events go, the rest comes through.
        assert_eq!(position.observe(events(6, 4, true)), 4);
        assert_eq!(position.observe(events(6, 4, true)), 1);
        assert_eq!(position.observe(events(6, 1, false)), 0);
        assert_eq!(position.start(), 6);
        assert_eq!(position.observe(events(7, 1, false)), 0);
    }

    #[test]
    fn a_second_break_in_the_same_cut_revision_drops_everything_delivered_so_far() {
        let mut position = Position::new(4);
        assert_eq!(position.observe(events(6, 3, true)), 0);
        assert_eq!(position.broke(&lost()), Break::Resume);
        // Three dropped, two new delivered: five of revision 6 so far.
        assert_eq!(position.observe(events(6, 5, true)), 3);
        assert_eq!(position.broke(&lost()), Break::Resume);
        assert_eq!(position.observe(events(6, 5, true)), 5);
        assert_eq!(position.observe(events(6, 2, false)), 0);
        assert_eq!(position.start(), 6);
    }

    #[test]
    fn a_break_in_a_listing_starts_over_and_one_before_it_just_reopens() {
        let mut position = Position::new(0);
        assert_eq!(position.broke(&lost()), Break::Resume);
        assert_eq!(position.start(), 0);
        // A fleet listing is groups of one revision before `Synced`: its
        // revision is not a place to resume from.
        assert_eq!(position.observe(events(30, 500, true)), 0);
        assert_eq!(position.observe(events(30, 20, false)), 0);
        assert_eq!(position.start(), 0);
        assert_eq!(
            position.broke(&Status::unavailable("gone")),
            Break::StartOver
        );
        assert_eq!(position.start(), 0);
        assert_eq!(position.observe(Seen::Listing), 0);
        assert_eq!(position.observe(Seen::Synced(31)), 0);
        assert_eq!(position.start(), 31);
    }

    #[test]
    fn a_compacted_history_starts_over_from_a_listing() {
        let mut position = Position::new(4);
        assert_eq!(position.observe(events(6, 3, true)), 0);
        assert_eq!(position.broke(&compacted()), Break::Compacted);
        assert_eq!(position.start(), 0);
        // Nothing is dropped from the new listing's stream.
        assert_eq!(position.observe(Seen::Listing), 0);
        assert_eq!(position.observe(Seen::Synced(40)), 0);
        assert_eq!(position.observe(events(41, 3, false)), 0);
    }

    #[test]
    fn a_slow_consumer_waits_as_told_and_a_refusal_that_cannot_change_is_fatal() {
        let mut position = Position::new(7);
        let slow = Status::with_error_details(
            Code::ResourceExhausted,
            "too slow",
            ErrorDetails::with_retry_info(Some(Duration::from_millis(300))),
        );
        assert_eq!(position.broke(&slow), Break::Resume);
        for status in [
            Status::not_found("no such tenant"),
            Status::unauthenticated("the tenant's token was rotated"),
            Status::invalid_argument("kinds"),
            Status::out_of_range("something else"),
        ] {
            assert_eq!(position.broke(&status), Break::Fatal, "{status:?}");
            assert_eq!(position.start(), 7);
        }
    }
}
