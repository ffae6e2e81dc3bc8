//! `denorm rebuild --verify`: before the cutover, the new generation is
//! compared with the live one over what both have applied. The new
//! generation's builder has stopped at its checkpoints; the live workers
//! go on. Once the live generation has applied at least as much in every
//! partition, the two are compared as a verify compares the live index
//! with its replay: the new generation plays the replay, stopped at its
//! checkpoints ([`compare::compare`]).

use std::time::Duration;

use super::compare::{self, Outcome, Positions};
use super::{merge, moved_past, positions, reach, VerifyError};
use crate::index::generations::Generations;
use crate::kafka::KafkaConfig;

/// Compares generation `target` (stopped) with the live generation
/// `current`, waiting at most `wait` for the live one to reach `target`'s
/// checkpoints. At most `max` differences are kept.
pub fn compare_generations(index: &dyn Generations, kafka: &KafkaConfig, current: u64, target: u64, partitions: i32, wait: Duration, max: usize) -> Result<(Positions, Outcome), VerifyError> {
    let (built, live) = (index.writer(target), index.writer(current));
    let at = positions(built.as_ref(), partitions).map_err(VerifyError::Live)?;
    let want: Vec<(i32, i64)> = at.iter().map(|(p, o)| (*p, *o)).collect();
    if let Err(b) = reach::until_reached(wait, Duration::from_millis(200), &want, || positions(live.as_ref(), partitions)).map_err(VerifyError::Live)? {
        return Err(VerifyError::Timeout { secs: wait.as_secs(), partition: b.partition, at: b.at, want: b.want });
    }
    let before = positions(live.as_ref(), partitions).map_err(VerifyError::Live)?;
    let keep = compare::Keep { per_class: max, total: usize::MAX, marked: &|_| false, log_ends: None };
    let compared = merge(live.as_ref(), built.as_ref(), None, crate::members::Members::default(), &at, partitions, &keep)?;
    let after = positions(live.as_ref(), partitions).map_err(VerifyError::Live)?;
    // A document one side lacks is judged only in a partition the live
    // generation has applied exactly as far as the new one, with nothing
    // after in the log: either side may have applied a delete past `at`
    // (the new generation's builder may have gone on past its checkpoint
    // while it stopped, the live workers have gone on).
    let moved = moved_past(kafka, partitions, &at, &[&before, &after])?;
    let unsettled = |d: &compare::Difference| d.problem != compare::Problem::Differs && moved.contains(&d.partition);
    Ok((at.clone(), compared.settle(&unsettled, max)))
}
