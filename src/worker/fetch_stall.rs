//! Partitions the consumer cannot read: a batch librdkafka cannot fetch or
//! decode (a codec it lacks, a corrupt batch, a broker that fails to serve
//! it) is fetched again for ever, and librdkafka reports only a consumer
//! error that names no partition. A partition whose fetch position stays
//! below the broker's end while nothing waits for its applier is judged
//! stalled once that lasts `--fetch-stall-secs`: it is reported degraded
//! (`/readyz`, `denorm_partition_fetch_stalled`), until it reads again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What [`FetchStalls::observe`] concluded of a partition.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It stalled now: at `position`, below the broker's end `high`, for
    /// `waited`.
    Stalled { position: i64, high: i64, waited: Duration },
    /// It was stalled and reads again (or has nothing left to read).
    Recovered,
    /// No change.
    Same,
}

/// See the module's doc.
#[derive(Debug)]
pub(crate) struct FetchStalls {
    after: Duration,
    seen: HashMap<i32, Seen>,
}

#[derive(Debug)]
struct Seen {
    position: i64,
    since: Instant,
    stalled: bool,
}

impl FetchStalls {
    pub fn new(after: Duration) -> FetchStalls {
        FetchStalls { after, seen: HashMap::new() }
    }

    /// A partition's fetch position and the broker's end seen at `now`,
    /// with nothing waiting for its applier (`idle`: its queue empty, the
    /// partition not paused).
    pub fn observe(&mut self, partition: i32, position: i64, high: i64, idle: bool, now: Instant) -> Verdict {
        let seen = self.seen.entry(partition).or_insert(Seen { position, since: now, stalled: false });
        if !(idle && position < high) || position != seen.position {
            (seen.position, seen.since) = (position, now);
            return match std::mem::take(&mut seen.stalled) {
                true => Verdict::Recovered,
                false => Verdict::Same,
            };
        }
        let waited = now.saturating_duration_since(seen.since);
        if !seen.stalled && waited >= self.after {
            seen.stalled = true;
            return Verdict::Stalled { position, high, waited };
        }
        Verdict::Same
    }

    /// Forgets the partitions `assigned` no longer holds: the stalled ones
    /// among them, which recover with their revocation.
    pub fn forget_unassigned(&mut self, assigned: impl Fn(i32) -> bool) -> Vec<i32> {
        let gone: Vec<i32> = self.seen.keys().copied().filter(|p| !assigned(*p)).collect();
        gone.into_iter().filter(|p| self.seen.remove(p).is_some_and(|s| s.stalled)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_that_reads_nothing_while_the_broker_holds_more_stalls_and_recovers_when_it_reads() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut w = FetchStalls::new(s * 60);
        assert_eq!(w.observe(0, 10, 20, true, t0), Verdict::Same);
        assert_eq!(w.observe(0, 10, 20, true, t0 + s * 59), Verdict::Same, "not for long enough yet");
        assert_eq!(w.observe(0, 10, 20, true, t0 + s * 60), Verdict::Stalled { position: 10, high: 20, waited: s * 60 });
        assert_eq!(w.observe(0, 10, 20, true, t0 + s * 90), Verdict::Same, "told once");
        assert_eq!(w.observe(0, 11, 20, true, t0 + s * 91), Verdict::Recovered);
        assert_eq!(w.observe(0, 11, 20, true, t0 + s * 151), Verdict::Stalled { position: 11, high: 20, waited: s * 60 });
    }

    #[test]
    fn a_partition_that_is_busy_paused_or_read_to_its_end_is_not_stalled() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut w = FetchStalls::new(s * 60);
        for i in 0..10 {
            // Its applier has work queued (or the partition is paused).
            assert_eq!(w.observe(0, 10, 20, false, t0 + s * 60 * i), Verdict::Same);
            // Read to the end.
            assert_eq!(w.observe(1, 20, 20, true, t0 + s * 60 * i), Verdict::Same);
            // Reading.
            assert_eq!(w.observe(2, 10 + i as i64, 20, true, t0 + s * 60 * i), Verdict::Same);
        }
    }

    #[test]
    fn a_stalled_partition_revoked_is_forgotten_and_recovers() {
        let t0 = Instant::now();
        let mut w = FetchStalls::new(Duration::from_secs(1));
        w.observe(0, 1, 5, true, t0);
        w.observe(1, 1, 5, true, t0);
        assert!(matches!(w.observe(0, 1, 5, true, t0 + Duration::from_secs(2)), Verdict::Stalled { .. }));
        assert_eq!(w.forget_unassigned(|p| p == 1), vec![0]);
        assert_eq!(w.forget_unassigned(|_| false), Vec::<i32>::new(), "partition 1 was not stalled");
    }
}
