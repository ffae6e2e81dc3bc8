//! The verdict a verify records in the live index, where the workers export
//! it as the `denorm_verify_*` gauges. A verify run as several processes
//! (`--members N`) records one part per member, and the member that
//! completes the set combines them into one verdict.

use serde::{Deserialize, Serialize};

use crate::index::{Backend, IndexError, Verified};
use crate::members::Members;

/// One member's verdict on its share of the partitions (the record
/// `verified-part-I`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Part {
    /// The run the members share (in the chart, the Job's name).
    pub run: String,
    pub member: u32,
    pub members: u32,
    pub finished_at: f64,
    pub checked: u64,
    pub differences: u64,
    pub seconds: f64,
    pub partial: bool,
    #[serde(default)]
    pub written_since: u64,
    #[serde(default)]
    pub unsettled: u64,
}

/// What one verify found, to record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Found {
    pub checked: u64,
    /// Differences left (after a repair, those it did not mend).
    pub differences: u64,
    pub seconds: f64,
    /// Some keys only (`--keys`, `--sample`).
    pub partial: bool,
    /// Documents not compared (see [`Verified::written_since`]).
    pub written_since: u64,
    pub unsettled: u64,
}

fn part_record(member: u32, partial: bool) -> String {
    format!("{}-part-{member}", crate::index::verified_record(partial))
}

/// The verdict of `parts`, one per member of one run, with `before` the
/// verdict recorded until now: counts add up, the run took as long as its
/// slowest member, and it is clean only if every member is.
pub fn combine(parts: &[Part], before: Option<&Verified>) -> Verified {
    let finished_at = parts.iter().map(|p| p.finished_at).fold(0.0, f64::max);
    let differences = parts.iter().map(|p| p.differences).sum();
    Verified {
        finished_at,
        checked: parts.iter().map(|p| p.checked).sum(),
        differences,
        seconds: parts.iter().map(|p| p.seconds).fold(0.0, f64::max),
        last_clean_at: if differences == 0 { Some(finished_at) } else { before.and_then(|v| v.last_clean_at) },
        partial: parts.iter().any(|p| p.partial),
        written_since: parts.iter().map(|p| p.written_since).sum(),
        unsettled: parts.iter().map(|p| p.unsettled).sum(),
    }
}

/// When the verify of `v` started (seconds since the Unix epoch).
fn started(v: &Verified) -> f64 {
    v.finished_at - v.seconds
}

/// What [`record`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Recorded {
    /// The verdict, recorded.
    Verdict(Verified),
    /// This member's part, recorded; the verdict waits for the others'.
    Waiting,
    /// Not recorded: a verify that started later has recorded its verdict
    /// already (review of verify, F18: two verifies at once, the last to
    /// finish won, even one that started earlier and judged older state).
    Superseded { by_started_at: f64 },
}

impl Recorded {
    pub fn verdict(self) -> Option<Verified> {
        match self {
            Recorded::Verdict(v) => Some(v),
            _ => None,
        }
    }
}

/// Records what this member found. Alone, that is the verdict; one of
/// several (of `run`), its part, and the verdict once every member's part
/// of the run is there, unless a verify that started later recorded its
/// own already.
pub fn record(live: &dyn Backend, found: Found, members: Members, run: &str) -> Result<Recorded, IndexError> {
    let now = crate::clock::now_millis() as f64 / 1000.0;
    let part = Part {
        run: run.to_string(),
        member: members.me,
        members: members.count,
        finished_at: now,
        checked: found.checked,
        differences: found.differences,
        seconds: found.seconds,
        partial: found.partial,
        written_since: found.written_since,
        unsettled: found.unsettled,
    };
    let partial = found.partial;
    if members.count > 1 {
        live.save_record(&part_record(members.me, partial), &serde_json::to_value(&part).map_err(|e| IndexError::Backend(e.to_string()))?)?;
    }
    let mut parts = vec![part];
    for i in members.others() {
        let Some(v) = live.record(&part_record(i, partial))? else { return Ok(Recorded::Waiting) };
        match serde_json::from_value::<Part>(v) {
            Ok(p) if p.run == run && p.members == members.count => parts.push(p),
            // Another run's (an earlier one, or one not finished): this
            // run's verdict waits for that member.
            _ => return Ok(Recorded::Waiting),
        }
    }
    let before = live.verified_of(partial)?;
    let verdict = combine(&parts, before.as_ref());
    // Both starts as the verdicts record them (the last end less the
    // longest member's time), so that a run's own verdict, recorded again
    // by a member replaced, is never taken for a later run's.
    if let Some(b) = before.as_ref().filter(|b| started(b) > started(&verdict)) {
        return Ok(Recorded::Superseded { by_started_at: started(b) });
    }
    live.save_record(crate::index::verified_record(partial), &serde_json::to_value(&verdict).map_err(|e| IndexError::Backend(e.to_string()))?)?;
    Ok(Recorded::Verdict(verdict))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::embedded::{EmbeddedBackend, EmbeddedIndex};

    fn found(checked: u64, differences: u64) -> Found {
        Found { checked, differences, seconds: checked as f64, partial: false, written_since: 0, unsettled: 0 }
    }

    #[test]
    fn members_verdicts_combine_into_one_once_every_member_of_the_run_has_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let live = EmbeddedBackend::new(EmbeddedIndex::open(dir.path(), "t").unwrap(), 15 << 20);
        let m = |me| Members::new(3, me).unwrap();
        // A part of an earlier run is not this run's.
        record(&live, found(7, 7), m(2), "run-1").unwrap();
        assert_eq!(record(&live, found(10, 0), m(0), "run-2").unwrap(), Recorded::Waiting);
        assert_eq!(record(&live, found(20, 2), m(1), "run-2").unwrap(), Recorded::Waiting, "member 2's part is of run-1");
        assert_eq!(live.verified().unwrap(), None, "nothing combined before every member recorded");
        let v = record(&live, found(30, 0), m(2), "run-2").unwrap().verdict().expect("the last part completes the set");
        assert_eq!((v.checked, v.differences, v.seconds, v.last_clean_at), (60, 2, 30.0, None));
        assert_eq!(live.verified().unwrap(), Some(v.clone()));
        // The next run, clean: its own verdict, clean as of its end.
        for i in 0..3 {
            record(&live, found(10, 0), m(i), "run-3").unwrap();
        }
        let v = live.verified().unwrap().unwrap();
        assert_eq!((v.checked, v.differences, v.last_clean_at), (30, 0, Some(v.finished_at)));
        // A member replaced and run again records again: the same verdict.
        let again = record(&live, found(10, 0), m(1), "run-3").unwrap().verdict().unwrap();
        assert_eq!((again.checked, again.differences), (30, 0));
    }

    /// Review F8: a whole verify finds a difference; a partial one of
    /// other keys is clean. The whole verdict stands (it used to be
    /// overwritten, and the alert resolved while the difference remained);
    /// the partial one is recorded apart.
    #[test]
    fn a_partial_verify_does_not_overwrite_the_whole_ones_verdict() {
        let dir = tempfile::tempdir().unwrap();
        let live = EmbeddedBackend::new(EmbeddedIndex::open(dir.path(), "t").unwrap(), 15 << 20);
        record(&live, found(50, 3), Members::default(), "").unwrap().verdict().unwrap();
        let partial = record(&live, Found { partial: true, written_since: 2, unsettled: 1, ..found(5, 0) }, Members::default(), "").unwrap().verdict().unwrap();
        let whole = live.verified().unwrap().unwrap();
        assert_eq!((whole.checked, whole.differences, whole.partial), (50, 3, false));
        assert_eq!(live.verified_of(true).unwrap(), Some(partial.clone()));
        assert_eq!((partial.checked, partial.differences, partial.partial, partial.written_since, partial.unsettled), (5, 0, true, 2, 1));
    }

    #[test]
    fn alone_the_verdict_is_recorded_at_once_and_a_dirty_one_keeps_the_last_clean_time() {
        let dir = tempfile::tempdir().unwrap();
        let live = EmbeddedBackend::new(EmbeddedIndex::open(dir.path(), "t").unwrap(), 15 << 20);
        let clean = record(&live, found(5, 0), Members::default(), "").unwrap().verdict().unwrap();
        let dirty = record(&live, found(5, 1), Members::default(), "").unwrap().verdict().unwrap();
        assert_eq!(dirty.last_clean_at, clean.last_clean_at);
        assert_eq!(dirty.differences, 1);
    }

    /// Review F18: two verifies at once. The one that started later (and
    /// judged newer state) finished first; the earlier one's verdict, which
    /// finished last, overwrote it. It is not recorded now.
    #[test]
    fn a_verify_that_started_earlier_does_not_overwrite_a_later_ones_verdict() {
        let dir = tempfile::tempdir().unwrap();
        let live = EmbeddedBackend::new(EmbeddedIndex::open(dir.path(), "t").unwrap(), 15 << 20);
        // Started 5 s ago, clean.
        let later = record(&live, Found { seconds: 5.0, ..found(10, 0) }, Members::default(), "").unwrap().verdict().unwrap();
        // Started 100 s ago, found a difference since repaired.
        let earlier = record(&live, Found { seconds: 100.0, ..found(10, 1) }, Members::default(), "").unwrap();
        assert!(matches!(earlier, Recorded::Superseded { .. }), "{earlier:?}");
        assert_eq!(live.verified().unwrap(), Some(later));
    }
}
