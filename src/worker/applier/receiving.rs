//! The receiving side of a cross-key move that spans several messages, a
//! part of the applier with its own state (issue 45): the move in flight,
//! the attempt its source gave up, what it passed over, and the same as of
//! the shard's last commit.
//!
//! From a move's first chunk to its last, the partition applies the move's
//! chunks only: its other messages are passed over, neither applied nor
//! kept in memory, and nothing from the first chunk on is marked applied.
//! The move takes effect at its first chunk. When it ends, the partition is
//! read again from its checkpoint (a *rewind*): the messages passed over
//! are applied then, in their order, and the move's chunks are resends.
//! After a crash the whole exchange is read and decided again the same
//! way. Not persisted: rebuilt from the log.

use metrics::{gauge, Gauge};

use crate::metrics as m;

/// A source: the rename that made a move, as (partition, offset).
pub(super) type Source = (i32, i64);

/// See the module's doc.
pub(super) struct Receiving {
    now: Incoming,
    /// `now` as of the shard's last commit: what a writer reopened at that
    /// commit goes on from.
    committed: Incoming,
    /// A move that passed messages over ended: the partition is to be read
    /// again from the shard's checkpoint.
    rewind: bool,
    in_flight: Gauge,
    waiting: Gauge,
}

#[derive(Default, Clone, Debug, PartialEq, Eq)]
struct Incoming {
    /// The move in flight.
    active: Option<Active>,
    /// An attempt its source gave up (its aborted end): (source, offset of
    /// the aborted end). Its chunks are ignored when read again.
    void: Option<(Source, i64)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Active {
    source: Source,
    /// The position its documents take (its first chunk's offset).
    pos: u64,
    /// Messages passed over so far, read again once it ends.
    passed_over: usize,
}

/// What becomes of a message while a move may be in flight
/// ([`Receiving::admit`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Admit {
    /// Handle it.
    Handle,
    /// A chunk of an attempt its source gave up, read again: ignored
    /// (marked applied).
    Void,
    /// Another message while a move is in flight: passed over, read again
    /// once it ends.
    PassOver,
}

impl Receiving {
    pub fn new(partition: i32) -> Receiving {
        let p = partition.to_string();
        Receiving {
            now: Incoming::default(),
            committed: Incoming::default(),
            rewind: false,
            in_flight: gauge!(m::MOVES_IN_FLIGHT, "partition" => p.clone()),
            waiting: gauge!(m::MOVES_WAITING, "partition" => p),
        }
    }

    /// Forgets everything (the shard moved to another generation: the
    /// partition is read again from its checkpoint there).
    pub fn reset(&mut self) {
        self.now = Incoming::default();
        self.committed = Incoming::default();
        self.rewind = false;
        self.gauges();
    }

    /// The shard committed: a writer reopened from here goes on from the
    /// state as it is now.
    pub fn committed(&mut self) {
        self.committed = self.now.clone();
    }

    /// The shard was reopened at its last commit: so is the state.
    pub fn back_at_commit(&mut self) {
        self.now = self.committed.clone();
        self.gauges();
    }

    /// Whether a move spanning several messages is in flight.
    pub fn moving(&self) -> bool {
        self.now.active.is_some()
    }

    /// The move in flight: its source and the position its documents take.
    pub fn in_flight(&self) -> Option<(Source, u64)> {
        self.now.active.as_ref().map(|a| (a.source, a.pos))
    }

    /// What becomes of the message at `offset`, a chunk of the move made by
    /// `chunk_of` or (`None`) any other message.
    pub fn admit(&mut self, chunk_of: Option<Source>, offset: i64) -> Admit {
        if let (Some(source), Some((void, end))) = (chunk_of, self.now.void) {
            if source == void && offset <= end {
                return Admit::Void;
            }
        }
        match self.now.active.as_mut() {
            Some(active) if chunk_of != Some(active.source) => {
                active.passed_over += 1;
                self.waiting.set(active.passed_over as f64);
                Admit::PassOver
            }
            _ => Admit::Handle,
        }
    }

    /// A chunk that is not the last arrived: the move from `source` is in
    /// flight (from now on, if it was not), its documents at `pos`. Whether
    /// it started now.
    pub fn chunk(&mut self, source: Source, pos: u64) -> bool {
        let started = self.now.active.is_none();
        if started {
            self.now.active = Some(Active { source, pos, passed_over: 0 });
        }
        self.gauges();
        started
    }

    /// The source gave the attempt up, its end read at `offset`: its chunks
    /// are ignored when read again.
    pub fn void(&mut self, source: Source, offset: i64) {
        self.now.void = Some((source, offset));
    }

    /// The move in flight ended (its last chunk, or its aborted end): how
    /// many messages it passed over. If any, a rewind is due.
    pub fn end(&mut self) -> usize {
        let passed_over = self.now.active.take().map_or(0, |a| a.passed_over);
        self.rewind |= passed_over > 0;
        self.gauges();
        passed_over
    }

    /// Whether a rewind is due.
    pub fn rewind_due(&self) -> bool {
        self.rewind
    }

    /// Takes the rewind due (the partition is sought again).
    pub fn take_rewind(&mut self) -> bool {
        std::mem::take(&mut self.rewind)
    }

    fn gauges(&self) {
        self.in_flight.set(usize::from(self.now.active.is_some()) as f64);
        self.waiting.set(self.now.active.as_ref().map_or(0, |a| a.passed_over) as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Source = (1, 40);
    const B: Source = (2, 7);

    #[test]
    fn other_messages_are_passed_over_while_a_move_is_in_flight_and_read_again_after() {
        let mut r = Receiving::new(0);
        assert_eq!(r.admit(None, 10), Admit::Handle);
        assert_eq!(r.admit(Some(A), 11), Admit::Handle);
        assert!(r.chunk(A, 11));
        assert!(!r.chunk(A, 11), "the second chunk continues the move");
        assert_eq!(r.in_flight(), Some((A, 11)));
        assert_eq!(r.admit(None, 12), Admit::PassOver);
        assert_eq!(r.admit(Some(B), 13), Admit::PassOver, "another move's chunk waits too");
        assert_eq!(r.admit(Some(A), 14), Admit::Handle);
        assert_eq!(r.end(), 2);
        assert!(!r.moving());
        assert!(r.rewind_due());
        assert!(r.take_rewind());
        assert!(!r.rewind_due());
    }

    #[test]
    fn a_move_that_passed_nothing_over_needs_no_rewind() {
        let mut r = Receiving::new(0);
        r.chunk(A, 5);
        assert_eq!(r.end(), 0);
        assert!(!r.take_rewind());
    }

    #[test]
    fn the_chunks_of_a_given_up_attempt_are_ignored_up_to_its_end() {
        let mut r = Receiving::new(0);
        r.chunk(A, 5);
        r.void(A, 9);
        r.end();
        assert_eq!(r.admit(Some(A), 6), Admit::Void);
        assert_eq!(r.admit(Some(A), 9), Admit::Void);
        assert_eq!(r.admit(Some(A), 10), Admit::Handle, "a later attempt of the same rename");
        assert_eq!(r.admit(Some(B), 8), Admit::Handle);
    }

    #[test]
    fn a_reopened_writer_goes_on_from_the_state_of_the_last_commit() {
        let mut r = Receiving::new(0);
        r.chunk(A, 5);
        r.committed();
        assert_eq!(r.admit(None, 6), Admit::PassOver);
        r.end();
        r.back_at_commit();
        assert_eq!(r.in_flight(), Some((A, 5)), "in flight again, as committed");
        assert_eq!(r.admit(None, 6), Admit::PassOver);
        assert_eq!(r.end(), 1, "what was passed over since the commit is counted again, once");
        r.reset();
        r.back_at_commit();
        assert!(!r.moving(), "a reset forgets the committed state too");
    }
}
