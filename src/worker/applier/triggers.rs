//! When a batch is committed by its size or its time, a part of the
//! applier with its own state (issue 45): a batch is committed once it
//! holds `--max-batch` messages, once it is `--commit-linger` old, or once
//! its queue stays empty for `--commit-quiet` (a burst has been applied),
//! or `--tenant-commit-ms` after another tenant's command joined it while
//! a flooding tenant is held back ([`Triggers::hurry`]).
//! The other triggers (a fan-out, an awaited offset, the shard's own wish,
//! a move's chunks) are the loop's, which knows what they depend on.

use std::time::{Duration, Instant};

/// The longest wait for a feed: a stop is seen within it.
const MAX_WAIT: Duration = Duration::from_millis(100);

/// See the module's doc.
pub(super) struct Triggers {
    linger: Duration,
    quiet: Duration,
    max_batch: usize,
    /// When the batch in progress is due by its age (`None`: no batch).
    deadline: Option<Instant>,
    /// When the last message arrived.
    last_message: Instant,
}

/// What a wait for a feed that timed out means ([`Triggers::timed_out`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Idle {
    /// Nothing uncommitted.
    NoBatch,
    /// Neither quiet for long enough nor old enough: the wait was cut
    /// short to look at the stop flag.
    Early,
    /// The batch is due.
    Commit,
}

impl Triggers {
    pub fn new(linger: Duration, quiet: Duration, max_batch: usize, now: Instant) -> Triggers {
        Triggers { linger, quiet, max_batch: max_batch.max(1), deadline: None, last_message: now }
    }

    /// A message arrived at `now`.
    pub fn arrived(&mut self, now: Instant) {
        self.last_message = now;
    }

    /// Something joined the batch at `now`: its age counts from the first.
    pub fn started(&mut self, now: Instant) {
        self.deadline.get_or_insert(now + self.linger);
    }

    /// Something that must not wait for the whole linger joined the batch
    /// at `now`: the batch is due `within` of it at the latest.
    pub fn hurry(&mut self, now: Instant, within: Duration) {
        let d = now + within;
        self.deadline = Some(self.deadline.map_or(d, |x| x.min(d)));
    }

    /// A message joined the batch, which now holds `len`: whether the batch
    /// is due by its size or its age.
    pub fn joined(&mut self, len: usize, now: Instant) -> bool {
        self.started(now);
        len >= self.max_batch || self.deadline.is_some_and(|d| now >= d)
    }

    /// The batch was committed, or dropped.
    pub fn reset(&mut self) {
        self.deadline = None;
    }

    /// How long to wait for the next feed at `now`: until the batch is
    /// quiet or old, at most [`MAX_WAIT`].
    pub fn wait(&self, now: Instant) -> Duration {
        match self.deadline {
            Some(d) => d.min(self.last_message + self.quiet).saturating_duration_since(now).min(MAX_WAIT),
            None => MAX_WAIT,
        }
    }

    /// What a wait that timed out at `now` means.
    pub fn timed_out(&self, now: Instant) -> Idle {
        match self.deadline {
            None => Idle::NoBatch,
            Some(d) if now < d.min(self.last_message + self.quiet) => Idle::Early,
            Some(_) => Idle::Commit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_batch_is_due_by_its_size_or_its_age() {
        let t0 = Instant::now();
        let mut t = Triggers::new(100 * MS, 10 * MS, 3, t0);
        assert_eq!(t.timed_out(t0), Idle::NoBatch);
        assert!(!t.joined(1, t0));
        assert_ne!(t.timed_out(t0), Idle::NoBatch);
        assert!(!t.joined(2, t0 + 50 * MS), "the age counts from the first message");
        assert!(t.joined(3, t0 + 60 * MS), "full");
        t.reset();
        assert!(!t.joined(1, t0 + 70 * MS));
        assert!(t.joined(2, t0 + 170 * MS), "100 ms old");
    }

    #[test]
    fn a_hurried_batch_is_due_within_the_time_asked_and_never_later_than_its_age() {
        let t0 = Instant::now();
        let mut t = Triggers::new(100 * MS, 1000 * MS, 1000, t0);
        t.hurry(t0, 20 * MS);
        assert!(!t.joined(1, t0), "the first message of a hurried batch starts no longer wait");
        assert_eq!(t.wait(t0 + 5 * MS), 15 * MS);
        assert!(t.joined(2, t0 + 20 * MS), "due 20 ms after the hurry");
        t.reset();
        assert!(!t.joined(1, t0 + 30 * MS));
        t.hurry(t0 + 120 * MS, 20 * MS);
        assert!(t.joined(2, t0 + 130 * MS), "a hurry never makes a batch due later than its age (100 ms from t0 + 30)");
    }

    #[test]
    fn a_batch_is_committed_once_its_queue_stays_quiet_or_it_is_old() {
        let t0 = Instant::now();
        let mut t = Triggers::new(100 * MS, 10 * MS, 1000, t0);
        assert_eq!(t.timed_out(t0), Idle::NoBatch);
        assert_eq!(t.wait(t0), MAX_WAIT, "nothing to commit: the longest wait");
        t.arrived(t0);
        t.joined(1, t0);
        assert_eq!(t.wait(t0), 10 * MS, "until quiet");
        assert_eq!(t.timed_out(t0 + 5 * MS), Idle::Early);
        assert_eq!(t.timed_out(t0 + 10 * MS), Idle::Commit);
        // A steady trickle is never quiet: the age commits it.
        for i in 1..20 {
            t.arrived(t0 + i * 5 * MS);
        }
        assert_eq!(t.wait(t0 + 95 * MS), 5 * MS, "until 100 ms old");
        assert_eq!(t.timed_out(t0 + 99 * MS), Idle::Early);
        assert_eq!(t.timed_out(t0 + 100 * MS), Idle::Commit);
    }

    #[test]
    fn a_batch_started_without_a_message_keeps_its_first_deadline() {
        let t0 = Instant::now();
        let mut t = Triggers::new(100 * MS, 10 * MS, 1000, t0);
        t.started(t0);
        t.started(t0 + 50 * MS);
        assert!(t.joined(1, t0 + 100 * MS), "due at the first start's deadline");
    }
}
