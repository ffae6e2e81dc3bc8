//! Waiting until an index's checkpoints reach given offsets: a replay
//! reaching the live index's, the live generation reaching a rebuilt
//! one's, the live workers reaching the repairs a verify sent. One wait,
//! on [`crate::retry::poll_until`].

use std::time::Duration;

use super::compare::Positions;
use crate::retry::{poll_until, Polled};

/// A partition not yet at the offset a wait wants: where it is (-1: no
/// checkpoint), and where it should be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Behind {
    pub partition: i32,
    pub at: i64,
    pub want: i64,
}

/// The first of `want` (partition, offset) that `now` has not reached.
pub fn first_behind(now: &Positions, want: impl IntoIterator<Item = (i32, i64)>) -> Option<Behind> {
    want.into_iter().map(|(partition, want)| Behind { partition, at: now.get(&partition).copied().unwrap_or(-1), want }).find(|b| b.at < b.want)
}

/// Reads the positions with `read` every `every` until they reach `want`,
/// for at most `timeout`: `Ok(Ok(positions))` once reached,
/// `Ok(Err(behind))` at the timeout (the partition still behind at the
/// last read), and `Err` as soon as `read` fails (it may also end the wait
/// for reasons of its own: a replay's worker that stopped).
pub fn until_reached<E>(timeout: Duration, every: Duration, want: &[(i32, i64)], mut read: impl FnMut() -> Result<Positions, E>) -> Result<Result<Positions, Behind>, E> {
    let polled = poll_until(timeout, every, || match read() {
        Ok(now) => match first_behind(&now, want.iter().copied()) {
            None => Polled::Done(Ok(now)),
            Some(behind) => Polled::NotYet(behind),
        },
        Err(e) => Polled::Done(Err(e)),
    });
    match polled {
        Ok(Ok(now)) => Ok(Ok(now)),
        Ok(Err(e)) => Err(e),
        // `read` answered at least once before the timeout: every answer
        // ends the wait but a position behind.
        Err(last) => Ok(Err(last.unwrap_or(Behind { partition: want.first().map_or(0, |w| w.0), at: -1, want: want.first().map_or(0, |w| w.1) }))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_partition_behind_is_named_with_where_it_is() {
        let now: Positions = [(0, 5), (1, 2)].into_iter().collect();
        assert_eq!(first_behind(&now, [(0, 5), (1, 3), (2, 0)]), Some(Behind { partition: 1, at: 2, want: 3 }));
        assert_eq!(first_behind(&now, [(0, 4), (2, -1)]), None);
        assert_eq!(first_behind(&now, [(2, 0)]), Some(Behind { partition: 2, at: -1, want: 0 }));
    }

    #[test]
    fn a_wait_ends_when_reached_at_the_timeout_or_at_a_failed_read() {
        let mut reads = 0;
        let reached = until_reached(Duration::from_secs(5), Duration::from_millis(1), &[(0, 3)], || -> Result<Positions, String> {
            reads += 1;
            Ok([(0, reads)].into_iter().collect())
        });
        assert_eq!(reached, Ok(Ok([(0, 3)].into_iter().collect())));
        let timed_out = until_reached(Duration::from_millis(20), Duration::from_millis(1), &[(0, 3)], || -> Result<Positions, String> { Ok([(0, 1)].into_iter().collect()) });
        assert_eq!(timed_out, Ok(Err(Behind { partition: 0, at: 1, want: 3 })));
        let failed = until_reached(Duration::from_secs(5), Duration::from_millis(1), &[(0, 3)], || -> Result<Positions, String> { Err("gone".into()) });
        assert_eq!(failed, Err("gone".to_string()));
    }
}
