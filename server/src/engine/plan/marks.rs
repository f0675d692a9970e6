//! A compact array of per-node flags, apart from the planner's nodes.
//!
//! Scheduling reads a few facts about the target of every edge (is it ours
//! to change, does it need a change, is its Create already scheduled). In a
//! large plan the targets are scattered; reading them from a two-byte entry
//! instead of a node of several cache lines keeps the reads in cache.

use crate::graph::OperationKind;

/// One node's flags.
pub(super) type Mark = u16;

/// Intended and not external: ours to create or modify.
pub(super) const OPERABLE: Mark = 1 << 0;
/// Removed from current state without a call.
pub(super) const DROPPED: Mark = 1 << 1;
/// Planned for deletion.
pub(super) const DELETING: Mark = 1 << 2;
/// An operation is in flight or its outcome is unknown.
pub(super) const BUSY: Mark = 1 << 3;
/// Its current state says it exists as created.
pub(super) const CREATED: Mark = 1 << 4;
/// Its own need is known ([`NEEDS_CHANGE`] is meaningful).
pub(super) const NEED_KNOWN: Mark = 1 << 5;
/// Its own need is a Create, Modify or Recreate.
pub(super) const NEEDS_CHANGE: Mark = 1 << 6;
/// Its Create/Modify schedule is being computed (cycle detection).
pub(super) const CHANGE_IN_PROGRESS: Mark = 1 << 7;
/// Its Delete schedule is being computed (cycle detection).
pub(super) const DELETE_IN_PROGRESS: Mark = 1 << 8;

/// The environment was asked whether it is converged ([`UNCONVERGED`] is
/// meaningful): a node is asked once, however many edges lead to it.
pub(super) const CONVERGENCE_KNOWN: Mark = 1 << 12;
/// The environment says it is not converged.
pub(super) const UNCONVERGED: Mark = 1 << 13;

const CHANGE_SHIFT: u32 = 9;
const CHANGE_MASK: Mark = 0b111 << CHANGE_SHIFT;

/// The state of a node's Create/Modify schedule, as far as its
/// dependents need to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ChangeMark {
    /// Not computed (in this round).
    Unknown,
    /// Computed: nothing to do.
    NotNeeded,
    /// Computed: ready, a Create.
    ReadyCreate,
    /// Computed: ready, a Modify.
    ReadyModify,
    /// Computed: waiting.
    Waiting,
}

impl ChangeMark {
    fn bits(self) -> Mark {
        let value: Mark = match self {
            Self::Unknown => 0,
            Self::NotNeeded => 1,
            Self::ReadyCreate => 2,
            Self::ReadyModify => 3,
            Self::Waiting => 4,
        };
        value << CHANGE_SHIFT
    }

    fn of(mark: Mark) -> Self {
        match (mark & CHANGE_MASK) >> CHANGE_SHIFT {
            1 => Self::NotNeeded,
            2 => Self::ReadyCreate,
            3 => Self::ReadyModify,
            4 => Self::Waiting,
            _ => Self::Unknown,
        }
    }

    /// The mark of a ready schedule of `kind`.
    pub(super) fn ready(kind: OperationKind) -> Self {
        if kind == OperationKind::Modify {
            Self::ReadyModify
        } else {
            Self::ReadyCreate
        }
    }

    /// The kind of a ready schedule.
    pub(super) fn ready_kind(self) -> Option<OperationKind> {
        match self {
            Self::ReadyCreate => Some(OperationKind::Create),
            Self::ReadyModify => Some(OperationKind::Modify),
            Self::Unknown | Self::NotNeeded | Self::Waiting => None,
        }
    }
}

/// The flags of every node of a run, indexed like the nodes.
#[derive(Default)]
pub(super) struct Marks {
    marks: Vec<Mark>,
}

impl Marks {
    /// Adds the flags of a new node.
    pub(super) fn push(&mut self, mark: Mark) {
        self.marks.push(mark);
    }

    /// Room for `additional` more nodes.
    pub(super) fn reserve(&mut self, additional: usize) {
        self.marks.reserve(additional);
    }

    /// The flags of node `id`.
    pub(super) fn get(&self, id: u32) -> Mark {
        self.marks.get(id as usize).copied().unwrap_or(0)
    }

    /// Whether node `id` has every flag of `flags`.
    pub(super) fn has(&self, id: u32, flags: Mark) -> bool {
        self.get(id) & flags == flags
    }

    /// Sets `flags` on node `id`.
    pub(super) fn set(&mut self, id: u32, flags: Mark) {
        if let Some(mark) = self.marks.get_mut(id as usize) {
            *mark |= flags;
        }
    }

    /// The state of node `id`'s Create/Modify schedule.
    pub(super) fn change(&self, id: u32) -> ChangeMark {
        ChangeMark::of(self.get(id))
    }

    /// Records the state of node `id`'s Create/Modify schedule.
    pub(super) fn set_change(&mut self, id: u32, change: ChangeMark) {
        if let Some(mark) = self.marks.get_mut(id as usize) {
            *mark = (*mark & !CHANGE_MASK) | change.bits();
        }
    }

    /// Forgets every schedule state and cycle flag: a new scheduling round.
    pub(super) fn new_round(&mut self) {
        let round = CHANGE_MASK | CHANGE_IN_PROGRESS | DELETE_IN_PROGRESS;
        for mark in &mut self.marks {
            *mark &= !round;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn change_states_round_trip_without_touching_other_flags() {
        let mut marks = Marks::default();
        marks.push(OPERABLE | BUSY);
        for change in [
            ChangeMark::NotNeeded,
            ChangeMark::ReadyCreate,
            ChangeMark::ReadyModify,
            ChangeMark::Waiting,
        ] {
            marks.set_change(0, change);
            assert_eq!(marks.change(0), change);
            assert!(marks.has(0, OPERABLE | BUSY));
        }
        marks.set(0, CHANGE_IN_PROGRESS);
        marks.new_round();
        assert_eq!(marks.change(0), ChangeMark::Unknown);
        assert!(!marks.has(0, CHANGE_IN_PROGRESS));
        assert!(marks.has(0, OPERABLE | BUSY));
    }
}
