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
//!
//! A move whose next chunk does not come within the wait limit *expires*
//! ([`Receiving::expire`]): it ends as if its source had given it up, and
//! when the partition is read again its chunks read so far are
//! dead-lettered ([`Admit::Expired`]) instead of applied.

use std::time::{Duration, Instant};

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
    /// An attempt its source gave up, or that expired here. Its chunks
    /// are ignored (or, expired, dead-lettered) when read again.
    void: Option<Void>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Void {
    source: Source,
    /// The offset of its aborted end, or the last one read before it
    /// expired: its chunks at or below it belong to it.
    through: i64,
    expired: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Active {
    source: Source,
    /// The position its documents take (its first chunk's offset).
    pos: u64,
    /// Messages passed over so far, read again once it ends.
    passed_over: usize,
    /// When its last chunk so far was applied.
    chunk_at: Instant,
    /// The last offset read while it is in flight.
    read: i64,
    /// Where its documents go (the rename's destination).
    to: String,
}

/// A move that expired ([`Receiving::expire`]): its source, and the
/// position its documents took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Expired {
    pub source: Source,
    pub pos: u64,
    pub to: String,
    /// How long it waited for its next chunk.
    pub waited: Duration,
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
    /// A chunk of a move that expired here, read again: dead-lettered
    /// (reason `move_incomplete`) with its files.
    Expired,
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

    /// Where the move in flight takes its documents.
    pub fn destination(&self) -> Option<&str> {
        self.now.active.as_ref().map(|a| a.to.as_str())
    }

    /// The move in flight: its source and the position its documents take.
    pub fn in_flight(&self) -> Option<(Source, u64)> {
        self.now.active.as_ref().map(|a| (a.source, a.pos))
    }

    /// What becomes of the message at `offset`, a chunk of the move made by
    /// `chunk_of` or (`None`) any other message.
    pub fn admit(&mut self, chunk_of: Option<Source>, offset: i64) -> Admit {
        if let (Some(source), Some(void)) = (chunk_of, self.now.void) {
            if source == void.source && offset <= void.through {
                return if void.expired { Admit::Expired } else { Admit::Void };
            }
        }
        if let Some(active) = self.now.active.as_mut() {
            active.read = active.read.max(offset);
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
    pub fn chunk(&mut self, source: Source, pos: u64, to: &str, now: Instant) -> bool {
        let started = self.now.active.is_none();
        match self.now.active.as_mut() {
            None => self.now.active = Some(Active { source, pos, passed_over: 0, chunk_at: now, read: pos as i64, to: to.to_string() }),
            Some(active) => active.chunk_at = now,
        }
        self.gauges();
        started
    }

    /// The source gave the attempt up, its end read at `offset`: its chunks
    /// are ignored when read again.
    pub fn void(&mut self, source: Source, offset: i64) {
        self.now.void = Some(Void { source, through: offset, expired: false });
    }

    /// Ends the move in flight if its next chunk has not come for `limit`
    /// as of `now`: its chunks read so far are dead-lettered when read
    /// again, and the partition is read again from its checkpoint (before
    /// the move) if it passed anything over. `None` if no move expired.
    pub fn expire(&mut self, now: Instant, limit: Duration) -> Option<Expired> {
        let active = self.now.active.as_ref()?;
        let waited = now.saturating_duration_since(active.chunk_at);
        if waited < limit {
            return None;
        }
        let expired = Expired { source: active.source, pos: active.pos, to: active.to.clone(), waited };
        self.now.void = Some(Void { source: active.source, through: active.read, expired: true });
        // Read again from before the move, even if it passed nothing over:
        // its chunks are to be dead-lettered.
        self.end();
        self.rewind = true;
        Some(expired)
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
        assert!(r.chunk(A, 11, "/d", Instant::now()));
        assert!(!r.chunk(A, 11, "/d", Instant::now()), "the second chunk continues the move");
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
        r.chunk(A, 5, "/d", Instant::now());
        assert_eq!(r.end(), 0);
        assert!(!r.take_rewind());
    }

    #[test]
    fn the_chunks_of_a_given_up_attempt_are_ignored_up_to_its_end() {
        let mut r = Receiving::new(0);
        r.chunk(A, 5, "/d", Instant::now());
        r.void(A, 9);
        r.end();
        assert_eq!(r.admit(Some(A), 6), Admit::Void);
        assert_eq!(r.admit(Some(A), 9), Admit::Void);
        assert_eq!(r.admit(Some(A), 10), Admit::Handle, "a later attempt of the same rename");
        assert_eq!(r.admit(Some(B), 8), Admit::Handle);
    }

    #[test]
    fn a_move_whose_next_chunk_does_not_come_expires_and_its_chunks_are_dead_lettered_when_read_again() {
        let mut r = Receiving::new(0);
        let t0 = Instant::now();
        let limit = Duration::from_secs(60);
        assert_eq!(r.expire(t0 + limit * 2, limit), None, "no move in flight");
        r.chunk(A, 5, "/d", t0);
        assert_eq!(r.admit(None, 6), Admit::PassOver);
        r.chunk(A, 5, "/d", t0 + limit / 2);
        assert_eq!(r.admit(Some(A), 7), Admit::Handle);
        assert_eq!(r.expire(t0 + limit, limit), None, "its last chunk came half a limit ago");
        assert_eq!(r.admit(None, 8), Admit::PassOver);
        let e = r.expire(t0 + limit * 2, limit).expect("expired");
        assert_eq!((e.source, e.pos, e.waited), (A, 5, limit * 3 / 2));
        assert!(!r.moving() && r.take_rewind());
        // Read again from the checkpoint: its chunks are dead-lettered,
        // the messages it passed over handled.
        assert_eq!(r.admit(Some(A), 5), Admit::Expired);
        assert_eq!(r.admit(None, 6), Admit::Handle);
        assert_eq!(r.admit(Some(A), 7), Admit::Expired);
        assert_eq!(r.admit(Some(A), 9), Admit::Handle, "a chunk read after it expired is another attempt's");
        assert_eq!(r.admit(Some(B), 6), Admit::Handle);
    }

    #[test]
    fn a_reopened_writer_goes_on_from_the_state_of_the_last_commit() {
        let mut r = Receiving::new(0);
        r.chunk(A, 5, "/d", Instant::now());
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
