//! The members of a rebuild (`rebuild --members N --member I`): N
//! processes build one generation together, each the shards of the
//! partitions the rebuild's consumer group gives it, and member 0 cuts over
//! once, when every partition has caught up.
//!
//! They meet in the index, beside the rebuild's state (records
//! `rebuild-member-I`):
//!
//! 1. Member 0 begins (or resumes) the rebuild and records it; the others
//!    wait for that record.
//! 2. Each member runs a worker in the rebuild's group, a static member
//!    (`group.instance.id` `member-I`): a member that dies and is replaced
//!    (an Indexed Job's pod, with the same index) takes its partitions
//!    back without a rebalance, and they resume from their checkpoints.
//!    Each reports, every second, how far its worker has read.
//! 3. When every partition has caught up (its checkpoint, or a member's
//!    reading past transaction markers), member 0 records the stop with the
//!    end offsets it judged against. Each member stops its worker (commits,
//!    releases its writers) and reports that it stopped.
//! 4. Member 0 waits for every member's stop, then checks that what was
//!    judged caught up is durable: a member that died after reporting its
//!    position may not have committed. If not, the stop is withdrawn (the
//!    next epoch) and the members build on. Otherwise it cuts over, and the
//!    others, seeing the rebuild done, exit.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::RebuildError;
use crate::index::generations::{Generations, MemberReport, State};
use crate::index::Checkpoint;
use crate::retry::{poll_until, Polled};

pub use crate::members::Members;

/// How long a member other than 0 waits for member 0 to record the
/// rebuild before it gives up.
pub const BEGIN_WAIT: Duration = Duration::from_secs(600);

/// How often members read the index's records while they wait.
const POLL: Duration = Duration::from_millis(250);

/// Reads the index's records every [`POLL`] (on [`poll_until`]) until
/// `check` gives a value or an error; `Ok(None)` once `timeout` passes.
/// `check` is told when it is time to say what it waits for (every
/// `say_every`, the first time at once when `say_first`).
fn poll_records<T>(timeout: Duration, say_every: Duration, say_first: bool, mut check: impl FnMut(bool) -> Result<Option<T>, RebuildError>) -> Result<Option<T>, RebuildError> {
    let mut said = if say_first { None } else { Some(Instant::now()) };
    let polled = poll_until(timeout, POLL, || {
        let say = said.is_none_or(|t| t.elapsed() >= say_every);
        match check(say) {
            Err(e) => Polled::Done(Err(e)),
            Ok(Some(v)) => Polled::Done(Ok(v)),
            Ok(None) => {
                if say {
                    said = Some(Instant::now());
                }
                Polled::NotYet(())
            }
        }
    });
    match polled {
        Ok(r) => r.map(Some),
        Err(_) => Ok(None),
    }
}

/// [`poll_records`] without a deadline.
fn await_records<T>(say_every: Duration, check: impl FnMut(bool) -> Result<Option<T>, RebuildError>) -> Result<T, RebuildError> {
    Ok(poll_records(crate::retry::UNBOUNDED, say_every, false, check)?.expect("an unbounded wait ends only by its check"))
}

/// The state member 0 recorded (a member other than 0). Blocking.
pub fn await_state(index: &dyn Generations, topic: &str, partitions: i32, m: Members, wait: Duration) -> Result<State, RebuildError> {
    let state = poll_records(wait, Duration::from_secs(30), true, |say| {
        if let Some(s) = index.state().map_err(RebuildError::State)? {
            let (recorded, recorded_partitions) = (s.topic.clone().unwrap_or_else(|| topic.into()), s.partitions.unwrap_or(partitions));
            if recorded != topic || recorded_partitions != partitions {
                return Err(RebuildError::OtherLog { generation: s.generation, recorded, recorded_partitions, topic: topic.into(), partitions });
            }
            if s.members != m.count {
                return Err(RebuildError::OtherMembers { generation: s.generation, recorded: s.members, members: m.count });
            }
            info!(generation = s.generation, member = m.me, members = m.count, "joining the rebuild member 0 recorded");
            return Ok(Some(s));
        }
        if say {
            info!(member = m.me, "waiting for member 0 to begin or resume the rebuild");
        }
        Ok(None)
    })?;
    state.ok_or(RebuildError::NotBegun { secs: wait.as_secs(), member: m.me })
}

/// Per partition, the furthest any of `reports` has read.
pub fn merged_positions<'a>(own: &BTreeMap<i32, i64>, reports: impl IntoIterator<Item = &'a MemberReport>) -> BTreeMap<i32, i64> {
    let mut all = own.clone();
    for r in reports {
        for (p, at) in &r.positions {
            let e = all.entry(*p).or_insert(*at);
            *e = (*e).max(*at);
        }
    }
    all
}

/// The partitions that have not caught up with `highs` (each partition's
/// end offset): neither its checkpoint nor a position reaches it.
pub fn behind(highs: &[i64], built: &BTreeMap<i32, Checkpoint>, positions: &BTreeMap<i32, i64>) -> Vec<i32> {
    (0..)
        .zip(highs)
        .filter(|(p, high)| {
            let at = built.get(p).map_or(-1, |c| c.offset as i64);
            !(at + 1 >= **high || positions.get(p).is_some_and(|n| n >= high))
        })
        .map(|(p, _)| p)
        .collect()
}

/// The reports of the others for the current stop, once every one has
/// stopped (member 0). Blocking.
pub fn await_stopped(index: &dyn Generations, state: &State, m: Members) -> Result<Vec<MemberReport>, RebuildError> {
    await_records(Duration::from_secs(10), |say| {
        let mut reports = Vec::new();
        let mut waiting = Vec::new();
        for i in m.others() {
            match index.member_report(i)? {
                Some(r) if r.generation == state.generation && r.epoch == state.epoch && r.stopped => reports.push(r),
                _ => waiting.push(i),
            }
        }
        if waiting.is_empty() {
            return Ok(Some(reports));
        }
        if say {
            info!(members = ?waiting, "waiting for these members to stop their workers (a member that died stops once it is replaced)");
        }
        Ok(None)
    })
}

/// What became of the rebuild a member other than 0 stopped for.
#[derive(Debug)]
pub enum Outcome {
    /// Member 0 cut over.
    CutOver,
    /// Member 0 withdrew the stop: build on.
    Resumed(State),
}

/// Waits for member 0 to cut over or to withdraw the stop of `epoch` (a
/// member other than 0). Blocking.
pub fn await_outcome(index: &dyn Generations, target: u64, epoch: u64) -> Result<Outcome, RebuildError> {
    await_records(Duration::from_secs(30), |say| {
        match index.state().map_err(RebuildError::State)? {
            None if index.current()? == target => return Ok(Some(Outcome::CutOver)),
            None => return Err(RebuildError::GivenUp { generation: target }),
            Some(s) if s.generation != target => return Err(RebuildError::GivenUp { generation: target }),
            Some(s) if s.stop_at.is_none() || s.epoch != epoch => return Ok(Some(Outcome::Resumed(s))),
            Some(_) => {}
        }
        if say {
            info!(generation = target, "stopped: waiting for member 0 to cut over");
        }
        Ok(None)
    })
}

/// Deletes the others' reports (member 0, once the rebuild is done or
/// given up): best effort, as a report of an older generation is ignored.
pub fn clear_reports(index: &dyn Generations, m: Members) {
    for i in m.others() {
        if let Err(e) = index.clear_member_report(i) {
            warn!(member = i, error = %format!("{e:#}"), "could not delete a rebuild member's report (it is ignored by later rebuilds)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(member: u32, positions: &[(i32, i64)]) -> MemberReport {
        MemberReport { generation: 1, member, positions: positions.iter().copied().collect(), ..Default::default() }
    }

    #[test]
    fn a_partition_has_caught_up_by_its_checkpoint_or_by_any_members_reading_past_its_end() {
        let cp = |offset| Checkpoint { offset, fingerprint: None };
        let built: BTreeMap<i32, Checkpoint> = [(0, cp(9)), (1, cp(3)), (2, cp(3))].into_iter().collect();
        // Partition 1 ends in transaction markers (offsets 4, 5): member 2
        // read past them; partition 2's messages 4, 5 are not applied.
        let own = [(0, 10)].into_iter().collect();
        let reports = [report(1, &[(2, 4)]), report(2, &[(1, 6), (2, 3)])];
        let positions = merged_positions(&own, &reports);
        assert_eq!(positions, [(0, 10), (1, 6), (2, 4)].into_iter().collect());
        assert_eq!(behind(&[10, 6, 6], &built, &positions), vec![2]);
        assert_eq!(behind(&[10, 6, 4], &built, &positions), Vec::<i32>::new());
        // A partition no member has read and no checkpoint covers, unless empty.
        assert_eq!(behind(&[10, 6, 4, 0, 1], &built, &positions), vec![4]);
    }

    fn generations(dir: &std::path::Path) -> crate::index::generations::EmbeddedGenerations {
        crate::index::embedded::EmbeddedIndex::open(dir, "t").unwrap();
        crate::index::generations::EmbeddedGenerations { index: crate::index::embedded::EmbeddedIndex::open_for_rebuild(dir, "t").unwrap(), budget: 20 << 20 }
    }

    #[test]
    fn member_0_waits_for_every_others_stop_of_this_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let g = generations(dir.path());
        let m = Members { count: 3, me: 0 };
        let state = State { generation: 1, members: 3, stop_at: Some(vec![5]), epoch: 2, ..Default::default() };
        let stopped = |member, epoch| MemberReport { generation: 1, member, epoch, stopped: true, ..Default::default() };
        g.save_member_report(&stopped(1, 2)).unwrap();
        // Member 2 stopped for the withdrawn epoch 1 only: not enough.
        g.save_member_report(&stopped(2, 1)).unwrap();
        let waiter = {
            let (dir, state) = (dir.path().to_path_buf(), state.clone());
            std::thread::spawn(move || await_stopped(&generations(&dir), &state, m).unwrap())
        };
        std::thread::sleep(POLL * 3);
        assert!(!waiter.is_finished(), "member 0 went on without member 2's stop");
        g.save_member_report(&stopped(2, 2)).unwrap();
        let reports = waiter.join().unwrap();
        assert_eq!(reports.iter().map(|r| r.member).collect::<Vec<_>>(), vec![1, 2]);
        clear_reports(&g, m);
        assert_eq!(g.member_report(1).unwrap(), None);
    }

    #[test]
    fn a_stopped_member_learns_whether_member_0_cut_over_resumed_or_gave_up() {
        let dir = tempfile::tempdir().unwrap();
        let g = generations(dir.path());
        let stopping = State { generation: 1, members: 2, stop_at: Some(vec![5]), epoch: 0, ..Default::default() };
        g.save_state(&State { epoch: 1, stop_at: None, ..stopping.clone() }).unwrap();
        assert!(matches!(await_outcome(&g, 1, 0).unwrap(), Outcome::Resumed(s) if s.epoch == 1));
        g.clear_state().unwrap();
        assert!(matches!(await_outcome(&g, 1, 0), Err(RebuildError::GivenUp { generation: 1 })), "no state, generation 0 current");
        g.cut_over(0, 1, 1).unwrap();
        assert!(matches!(await_outcome(&g, 1, 0).unwrap(), Outcome::CutOver));
    }

    #[test]
    fn a_member_joins_only_the_rebuild_of_its_log_and_member_count() {
        let dir = tempfile::tempdir().unwrap();
        let g = generations(dir.path());
        let m = Members { count: 2, me: 1 };
        assert!(matches!(await_state(&g, "t", 3, m, Duration::ZERO), Err(RebuildError::NotBegun { member: 1, .. })));
        let s = State { generation: 1, topic: Some("t".into()), partitions: Some(3), members: 2, ..Default::default() };
        g.save_state(&s).unwrap();
        assert_eq!(await_state(&g, "t", 3, m, Duration::ZERO).unwrap(), s);
        let e = await_state(&g, "t", 3, Members { count: 4, me: 1 }, Duration::ZERO).unwrap_err();
        assert!(matches!(e, RebuildError::OtherMembers { recorded: 2, members: 4, .. }), "{e}");
        assert!(matches!(await_state(&g, "u", 3, m, Duration::ZERO), Err(RebuildError::OtherLog { .. })));
    }
}
