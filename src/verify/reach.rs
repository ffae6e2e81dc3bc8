//! Waiting until an index's checkpoints reach given offsets (a replay
//! reaching the live index's, the live generation reaching a rebuilt
//! one's), or until given commands are applied (the repairs a verify
//! sent). One wait, on [`crate::retry::poll_until`].

use std::time::Duration;

use std::collections::HashMap;

use super::compare::Positions;
use crate::index::progress::Applied;
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
pub fn until_reached<E>(timeout: Duration, every: Duration, want: &[(i32, i64)], read: impl FnMut() -> Result<Positions, E>) -> Result<Result<Positions, Behind>, E> {
    wait(timeout, every, want, read, |now| first_behind(now, want.iter().copied()))
}

/// The first of `want` (partition, offset) that `applied` does not record
/// applied, by its checkpoint or above it.
pub fn first_unapplied(applied: &HashMap<i32, Applied>, want: impl IntoIterator<Item = (i32, i64)>) -> Option<Behind> {
    want.into_iter().find(|(p, o)| !applied.get(p).is_some_and(|a| a.contains(*o))).map(|(partition, want)| Behind {
        partition,
        at: applied.get(&partition).and_then(|a| a.checkpoint).map_or(-1, |c| c.offset as i64),
        want,
    })
}

/// [`until_reached`] for commands of their own: waits until each of `want`
/// is applied, by the checkpoint or done above it (issue 45). A command
/// applied beside another key's fan-out counts, though the checkpoint stays
/// below that fan-out until it ends (review of verify, F12: a repair's
/// wait timed out behind a rename it did not depend on).
pub fn until_applied<E>(timeout: Duration, every: Duration, want: &[(i32, i64)], read: impl FnMut() -> Result<HashMap<i32, Applied>, E>) -> Result<Result<(), Behind>, E> {
    Ok(wait(timeout, every, want, read, |applied| first_unapplied(applied, want.iter().copied()))?.map(|_| ()))
}

/// Reads with `read` every `every` until `behind` finds nothing behind, for
/// at most `timeout`.
fn wait<T, E>(timeout: Duration, every: Duration, want: &[(i32, i64)], mut read: impl FnMut() -> Result<T, E>, behind: impl Fn(&T) -> Option<Behind>) -> Result<Result<T, Behind>, E> {
    let polled = poll_until(timeout, every, || match read() {
        Ok(now) => match behind(&now) {
            None => Polled::Done(Ok(now)),
            Some(b) => Polled::NotYet(b),
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

    #[test]
    fn a_command_applied_above_the_checkpoint_counts_as_applied() {
        use crate::index::progress::DoneAbove;
        use crate::index::Checkpoint;
        // Partition 0: applied through 10, and 12..=20 done above it while
        // 11 (a fan-out) runs.
        let held = Applied { checkpoint: Some(Checkpoint::new(10, 0)), done: DoneAbove { through: 20, pending: vec![(11, 11)] } };
        let applied: HashMap<i32, Applied> = [(0, held)].into_iter().collect();
        assert_eq!(first_unapplied(&applied, [(0, 9), (0, 15)]), None);
        assert_eq!(first_unapplied(&applied, [(0, 15), (0, 11)]), Some(Behind { partition: 0, at: 10, want: 11 }));
        assert_eq!(first_unapplied(&applied, [(0, 21)]), Some(Behind { partition: 0, at: 10, want: 21 }));
        assert_eq!(first_unapplied(&applied, [(1, 0)]), Some(Behind { partition: 1, at: -1, want: 0 }));
        let waited = until_applied(Duration::from_secs(5), Duration::from_millis(1), &[(0, 15)], || -> Result<_, String> { Ok(applied.clone()) });
        assert_eq!(waited, Ok(Ok(())));
    }
}
