//! Retrying and waiting, once: what kind a failure is, jittered
//! exponential backoff, and polling a condition until a deadline.

use std::time::{Duration, Instant};

/// What a failure means for the command at hand, and so what the worker
/// does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// It may pass (an index or registry outage, a locked shard): retried
    /// for as long as it lasts, nothing committed past it meanwhile.
    Transient,
    /// This command will fail again (a mapping conflict, a malformed
    /// document): retried `--max-attempts` times, then dead-lettered and
    /// its key parked.
    Permanent,
    /// Nothing can go on (the index belongs to another log or topic): the
    /// worker stops and says what to do.
    Fatal,
}

/// Jittered exponential backoff: the n-th delay is `initial · 2ⁿ` capped at
/// `max`, times a random factor in [0.5, 1) so that retries of many
/// partitions or workers spread out.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max, attempt: 0 }
    }

    /// The delay before retry number `attempt` (0 first), without jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        self.initial.saturating_mul(1u32 << attempt.min(16)).min(self.max)
    }

    /// The delay before retry number `attempt`, jittered.
    pub fn jittered(&self, attempt: u32) -> Duration {
        self.ceiling(attempt).mul_f64(rand::random_range(0.5..1.0))
    }

    /// The next delay, jittered; each call doubles the next one's ceiling.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.jittered(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        d
    }

    /// Sleeps the next delay, in slices of at most 100 ms, and returns
    /// early (false) once `stop` says so: a stop is seen within 100 ms
    /// whatever the backoff has grown to.
    pub fn wait_unless(&mut self, stop: impl Fn() -> bool) -> bool {
        let until = Instant::now() + self.next_delay();
        loop {
            if stop() {
                return false;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            std::thread::sleep(left.min(Duration::from_millis(100)));
        }
    }
}

/// A [`poll_until`] timeout for a wait that ends only by its check (a
/// hundred years: an `Instant` this far ahead is still representable).
pub const UNBOUNDED: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// [`poll_until`] without a deadline: asks `check` every `every` until it
/// gives a value (a wait that ends only by its check, a stop included).
pub fn poll_until_done<T, L>(every: Duration, check: impl FnMut() -> Polled<T, L>) -> T {
    match poll_until(UNBOUNDED, every, check) {
        Ok(v) => v,
        Err(_) => unreachable!("an unbounded wait ends only by its check"),
    }
}

/// Asks `check` every `every` until it gives a value or `timeout` passes;
/// the last answer it gave is returned with the timeout (`None` if it
/// never answered). Blocking.
pub fn poll_until<T, L>(timeout: Duration, every: Duration, mut check: impl FnMut() -> Polled<T, L>) -> Result<T, Option<L>> {
    let deadline = Instant::now() + timeout;
    let mut last = None;
    loop {
        match check() {
            Polled::Done(v) => return Ok(v),
            Polled::NotYet(l) => last = Some(l),
            Polled::Unknown => {}
        }
        if Instant::now() >= deadline {
            return Err(last);
        }
        std::thread::sleep(every.min(deadline.saturating_duration_since(Instant::now())));
    }
}

/// One answer of a [`poll_until`] check.
pub enum Polled<T, L> {
    /// The condition holds: this is the result.
    Done(T),
    /// Not yet; this is where things stand.
    NotYet(L),
    /// Could not tell this time (a request failed).
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap_with_jitter_below_the_ceiling() {
        let mut b = Backoff::new(Duration::from_millis(50), Duration::from_millis(300));
        let ceilings: Vec<u64> = (0..6).map(|n| b.ceiling(n).as_millis() as u64).collect();
        assert_eq!(ceilings, [50, 100, 200, 300, 300, 300]);
        for n in 0..6 {
            let d = b.next_delay();
            assert!(d >= b.ceiling(n) / 2 && d < b.ceiling(n), "delay {n}: {d:?}");
        }
        assert!(Backoff::new(Duration::from_millis(1), Duration::from_secs(1)).ceiling(u32::MAX) == Duration::from_secs(1));
    }

    #[test]
    fn a_wait_ends_early_on_stop() {
        let mut b = Backoff::new(Duration::from_secs(3600), Duration::from_secs(3600));
        let t = Instant::now();
        assert!(!b.wait_unless(|| true));
        assert!(t.elapsed() < Duration::from_secs(1));
        let mut quick = Backoff::new(Duration::from_millis(1), Duration::from_millis(1));
        assert!(quick.wait_unless(|| false));
    }

    #[test]
    fn polling_returns_the_value_or_the_last_state_at_the_deadline() {
        let mut n = 0;
        let done: Result<i32, Option<i32>> = poll_until(Duration::from_secs(5), Duration::from_millis(1), || {
            n += 1;
            if n == 3 {
                Polled::Done(n)
            } else {
                Polled::NotYet(n)
            }
        });
        assert_eq!(done, Ok(3));
        let late: Result<(), Option<&str>> = poll_until(Duration::from_millis(20), Duration::from_millis(1), || Polled::NotYet("behind"));
        assert_eq!(late, Err(Some("behind")));
        let never: Result<(), Option<()>> = poll_until(Duration::from_millis(5), Duration::from_millis(1), || Polled::Unknown);
        assert_eq!(never, Err(None));
    }
}
