//! Which offset of a partition may be recorded as applied while key lanes
//! finish commands out of log order: the last offset below which every
//! command received is finished (the lowest unfinished command's
//! predecessor). No I/O.
//!
//! Offsets are received in increasing order. Most are finished at once; a
//! lane's command is *deferred* when it is received (a fan-out in progress,
//! or a command waiting behind one of its key) and finished later, in any
//! order. The memory held is one entry per deferred command, plus one per
//! gap between them: not one per message finished meanwhile.

use std::collections::{BTreeMap, BTreeSet};

use crate::index::progress::DoneAbove;
use crate::index::Checkpoint;

/// The offset tracker of one partition's lanes.
#[derive(Debug, Default)]
pub(super) struct Tracker {
    /// Received, not finished.
    open: BTreeSet<i64>,
    /// Finished while an earlier command was open: per gap between open
    /// offsets, only the highest (with its fingerprint) is kept.
    done: BTreeMap<i64, Checkpoint>,
    /// The last checkpoint below every open command.
    low: Option<Checkpoint>,
    /// The highest offset received (deferred or finished).
    seen: Option<i64>,
    /// Commands finished since [`Tracker::done_above_due`] last said yes.
    finished_since: usize,
}

impl Tracker {
    /// Forgets everything (the partition is read again from a checkpoint).
    pub fn reset(&mut self) {
        *self = Tracker::default();
    }

    /// Forgets everything; the partition is read again from after
    /// `checkpoint`, which is the low mark until a command passes it. Without
    /// it, a first command deferred into a lane left no low mark, and what
    /// the other keys' commands applied above it was not recorded until it
    /// finished (a repair applied during a held rename right after a
    /// restart was never seen applied).
    pub fn reset_at(&mut self, checkpoint: Option<Checkpoint>) {
        *self = Tracker { low: checkpoint, seen: checkpoint.map(|c| c.offset as i64), ..Tracker::default() };
    }

    /// Whether a command received is not finished yet.
    pub fn busy(&self) -> bool {
        !self.open.is_empty()
    }

    /// The lowest command received and not finished.
    pub fn lowest_open(&self) -> Option<i64> {
        self.open.first().copied()
    }

    /// The command at `offset`, just received, is finished later. A
    /// command deferred before and not finished may be deferred again (a
    /// lane's waiting message handled again when its fan-out ends, which
    /// starts a lane of its own or waits once more): nothing changes
    /// (review of lanes, F9: that broke the assertion of increasing
    /// offsets).
    pub fn defer(&mut self, offset: i64) {
        debug_assert!(self.open.contains(&offset) || self.open.last().is_none_or(|&o| o < offset), "deferred out of order");
        self.open.insert(offset);
        self.seen = self.seen.max(Some(offset));
    }

    /// The command at `at.offset` is finished (received just now, or
    /// deferred before). Returns the checkpoint every command up to which
    /// is finished, when there is one.
    pub fn finish(&mut self, at: Checkpoint) -> Option<Checkpoint> {
        let offset = at.offset as i64;
        self.seen = self.seen.max(Some(offset));
        if self.open.is_empty() && self.done.is_empty() {
            // Nothing out of order (every message without lanes): no
            // allocation, no search.
            if self.low.is_none_or(|l| l.offset < at.offset) {
                self.low = Some(at);
            }
            return self.low;
        }
        self.open.remove(&offset);
        // Only the highest finished offset of each gap between open
        // commands matters (finishing `offset` may have joined two gaps).
        let gap_start = self.open.range(..offset).next_back().map_or(i64::MIN, |s| s + 1);
        let gap_end = self.open.range(offset..).next().copied().unwrap_or(i64::MAX);
        self.done.insert(offset, at);
        let gap: Vec<i64> = self.done.range(gap_start..gap_end).map(|(&o, _)| o).collect();
        for o in &gap[..gap.len() - 1] {
            self.done.remove(o);
        }
        // Below the first open command, everything is finished.
        let first_open = self.open.first().copied().unwrap_or(i64::MAX);
        let below: Vec<i64> = self.done.range(..first_open).map(|(&o, _)| o).collect();
        for o in below {
            let c = self.done.remove(&o).expect("listed");
            if self.low.is_none_or(|l| l.offset < c.offset) {
                self.low = Some(c);
            }
        }
        self.low
    }

    /// What is finished above the low mark (issue 45): every offset
    /// received, but the open ones; above what was received, what
    /// `inherited` (the last commit's record) says.
    pub fn done_above(&self, inherited: &DoneAbove) -> DoneAbove {
        match (self.low, self.seen) {
            (Some(low), Some(seen)) => DoneAbove::merged(low.offset as i64, seen, self.open.iter().copied(), inherited),
            _ => DoneAbove::default(),
        }
    }

    /// Whether [`Tracker::done_above`] is due again after a command
    /// finished: its cost grows with the open commands (a flooding
    /// tenant's held messages are tens of thousands), so with many open it
    /// is computed once per `open / 256` commands finished, and the last
    /// record stands meanwhile. A record that lags says less is applied
    /// than is (what it omits is applied again after a restart, which is
    /// harmless), never more: a command finished stays finished. The
    /// applier computes it afresh before each commit of its own.
    pub fn done_above_due(&mut self) -> bool {
        self.finished_since += 1;
        let due = self.finished_since > self.open.len() / DoneAbove::MAX_RANGES;
        if due {
            self.finished_since = 0;
        }
        due
    }

    /// The last checkpoint below every open command.
    pub fn low(&self) -> Option<Checkpoint> {
        self.low
    }

    /// Entries held (what the memory bound counts).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.open.len() + self.done.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(offset: i64) -> Checkpoint {
        Checkpoint::new(offset as u64, offset as u64 * 31 + 7)
    }

    #[test]
    fn the_done_above_record_is_due_at_every_command_with_few_open_and_every_open_over_256_with_many() {
        let mut t = Tracker::default();
        t.reset_at(Some(at(0)));
        t.defer(1);
        assert!((0..10).all(|_| t.done_above_due()), "one open command: due every time");
        for o in 2..=1024 {
            t.defer(o);
        }
        let due = (0..40).filter(|_| t.done_above_due()).count();
        assert_eq!(due, 8, "1,024 open: due once in every 5 commands finished");
    }

    #[test]
    fn a_first_command_deferred_after_a_seek_leaves_the_checkpoint_as_the_low_mark() {
        let mut t = Tracker::default();
        t.reset_at(Some(at(32)));
        t.defer(33);
        assert_eq!(t.finish(at(34)), Some(at(32)));
        let done = t.done_above(&DoneAbove::default());
        assert!(done.contains(Some(32), 34) && !done.contains(Some(32), 33), "{done:?}");
    }

    #[test]
    fn the_low_mark_waits_for_the_lowest_unfinished_command() {
        let mut t = Tracker::default();
        assert_eq!(t.finish(at(0)), Some(at(0)));
        t.defer(1);
        assert_eq!(t.finish(at(2)), Some(at(0)));
        t.defer(3);
        assert_eq!(t.finish(at(4)), Some(at(0)));
        assert_eq!(t.finish(at(3)), Some(at(0)), "3 finished, 1 still open");
        assert_eq!(t.finish(at(1)), Some(at(4)), "everything up to 4 finished, with 4's fingerprint");
        assert!(!t.busy());
    }

    /// Issue 45: a new owner's tracker knows only what it has received;
    /// above that, the last commit's record still says what is applied.
    /// (A fan-out resumed and finished before the commands applied after it
    /// were read again forgot them, and they were applied again.)
    #[test]
    fn what_the_last_commit_recorded_above_what_was_received_is_kept() {
        let inherited = DoneAbove::new(39, 41, [40]);
        let mut t = Tracker::default();
        t.defer(40);
        assert_eq!(t.finish(at(40)), Some(at(40)));
        let done = t.done_above(&inherited);
        assert!(done.contains(Some(40), 41), "{done:?}");
        assert_eq!(t.done_above(&DoneAbove::default()), DoneAbove::default());
    }

    proptest! {
        /// Under any completion order, the low mark is the highest offset
        /// below which every offset received is finished, with the
        /// fingerprint of that offset; it never moves back; and what is
        /// held stays within one entry per deferred command and per gap.
        #[test]
        fn the_low_mark_is_the_last_contiguously_finished_offset(
            // Per received offset: deferred or finished at once, and, after
            // it, how many deferred commands finish (picked by index), and
            // which one still open is deferred again (a lane's waiting
            // message handled again and waiting once more: review of
            // lanes, F9).
            steps in proptest::collection::vec((any::<bool>(), proptest::collection::vec(any::<prop::sample::Index>(), 0..3), proptest::option::of(any::<prop::sample::Index>())), 1..120),
            start in 0i64..1000,
        ) {
            let mut t = Tracker::default();
            let mut finished = BTreeSet::new();
            let mut deferred: Vec<i64> = Vec::new();
            let mut last_low: Option<i64> = None;
            let mut check = |t: &mut Tracker, low: Option<Checkpoint>, finished: &BTreeSet<i64>, received: i64, deferred: &[i64]| -> Result<(), TestCaseError> {
                // The model: every offset from `start` to the answer finished.
                let mut expected = None;
                for o in start..=received {
                    if !finished.contains(&o) {
                        break;
                    }
                    expected = Some(o);
                }
                prop_assert_eq!(low.map(|c| c.offset as i64), expected);
                if let Some(c) = low {
                    prop_assert_eq!(c, at(c.offset as i64));
                }
                prop_assert!(low.map(|c| c.offset as i64) >= last_low, "moved back");
                last_low = low.map(|c| c.offset as i64);
                prop_assert!(t.held() <= 2 * deferred.len() + 1, "held {} for {} deferred", t.held(), deferred.len());
                // What is recorded applied above the low mark (issue 45):
                // exactly the offsets finished, up to the highest one.
                if let Some(low) = low {
                    let done = t.done_above(&DoneAbove::default());
                    let high = finished.iter().next_back().copied().unwrap_or(-1);
                    for o in low.offset as i64 + 1..=received {
                        prop_assert_eq!(done.contains(Some(low.offset), o), o <= high && finished.contains(&o), "offset {} in {:?}", o, done);
                    }
                }
                Ok(())
            };
            let mut low = None;
            for (i, (defer, finishing, again)) in steps.iter().enumerate() {
                let offset = start + i as i64;
                if *defer {
                    t.defer(offset);
                    deferred.push(offset);
                } else {
                    finished.insert(offset);
                    low = t.finish(at(offset));
                }
                check(&mut t, low, &finished, offset, &deferred)?;
                for pick in finishing {
                    if deferred.is_empty() {
                        break;
                    }
                    let o = deferred.remove(pick.index(deferred.len()));
                    finished.insert(o);
                    low = t.finish(at(o));
                    check(&mut t, low, &finished, offset, &deferred)?;
                }
                if let (Some(pick), false) = (again, deferred.is_empty()) {
                    t.defer(deferred[pick.index(deferred.len())]);
                    check(&mut t, low, &finished, offset, &deferred)?;
                }
            }
            while let Some(o) = deferred.pop() {
                finished.insert(o);
                low = t.finish(at(o));
            }
            let last = start + steps.len() as i64 - 1;
            prop_assert_eq!(low, Some(at(last)));
            prop_assert!(!t.busy());
        }
    }
}
