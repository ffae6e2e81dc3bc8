//! What each new destination partition will make of the moves' chunks a
//! copy places there, by the destination worker's rules: the check that
//! keeps `migrate` from writing a topic whose rebuild would take a move for
//! a resend. No I/O.

use std::collections::VecDeque;

use crate::command::LogPosition;

/// One chunk of a move, as [`Arrivals`] sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Chunk {
    /// Its rename's place in the old topic (the move's identity).
    pub(crate) old: LogPosition,
    /// Its rename's place in the new topic.
    pub(crate) new: LogPosition,
    pub(crate) last: bool,
    pub(crate) aborted: bool,
}

/// The moves' chunks of one new destination partition, taken by the
/// destination worker's rules (`moves::arrival`): one move at a time, the
/// chunks of others passed over until it ends; a move whose rename lies at
/// or below the highest completed one from the same source partition taken
/// for a resend. Merging old partitions can put a move behind a later one
/// of its new source partition: its files would be lost.
#[derive(Default)]
pub(crate) struct Arrivals {
    /// Per new source partition, the highest rename offset completed.
    done: std::collections::HashMap<i32, i64>,
    completed: std::collections::HashSet<LogPosition>,
    active: Option<LogPosition>,
    passed_over: VecDeque<Chunk>,
}

impl Arrivals {
    /// Takes `c` in log order; false when a first arrival of a move would
    /// be taken for a resend.
    pub(crate) fn arrive(&mut self, c: Chunk) -> bool {
        if self.active.is_some_and(|a| a != c.old) {
            self.passed_over.push_back(c);
            return true;
        }
        if self.completed.contains(&c.old) {
            return true;
        }
        if self.done.get(&c.new.partition).is_some_and(|done| c.new.offset <= *done) {
            return false;
        }
        if !c.last {
            self.active = Some(c.old);
            return true;
        }
        self.active = None;
        if !c.aborted {
            self.done.insert(c.new.partition, c.new.offset);
            self.completed.insert(c.old);
        }
        // What was passed over is read again.
        std::mem::take(&mut self.passed_over).into_iter().all(|c| self.arrive(c))
    }
}
