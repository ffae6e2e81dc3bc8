//! How a rebuild replays the log: what of it is left to read, the
//! settings and the model its worker replays with, and whether that model
//! may replace the live generation's.

use std::sync::Arc;

use tracing::{info, warn};

use super::RebuildError;
use crate::index::generations::Generations;
use crate::kafka::KafkaConfig;
use crate::worker::{Mode, Replay, ReplayOf, WorkerConfig};

/// The partitions whose start retention deleted (partition, first offset
/// left), of a topic with watermarks `marks`: refused unless `accept_gaps`,
/// as a replay would miss commands.
pub(super) fn retention_gaps(topic: &str, marks: &[(i64, i64)], accept_gaps: bool) -> Result<Vec<(i32, i64)>, RebuildError> {
    let skipped: Vec<(i32, i64)> = (0..).zip(marks).filter(|(_, (low, _))| *low > 0).map(|(p, (low, _))| (p, *low)).collect();
    match skipped.first() {
        Some(&(p, low)) if !accept_gaps => return Err(RebuildError::Retention { topic: topic.to_string(), partition: p as usize, low }),
        Some(_) => warn!(topic, skipped = ?skipped, "retention deleted the start of these partitions (partition, first offset left): rebuilding from what is left (--accept-gaps)"),
        None => {}
    }
    Ok(skipped)
}

/// The configuration of a rebuild's worker in the consumer group
/// `run_group`: it replays `of` as the live workers decided (below), and
/// writes none of the operators' requests (dead-letter markers) the live
/// run carried out again.
pub(super) fn replay_config(
    index: &dyn Generations,
    kafka: &KafkaConfig,
    run_group: &str,
    (takeover_waits, any_partitioner): (bool, bool),
    of: ReplayOf,
    model: Option<&'static crate::domain::Domain>,
) -> Result<WorkerConfig, RebuildError> {
    let mut cfg = WorkerConfig::new(kafka.clone(), run_group.to_string());
    cfg.model = model;
    cfg.takeover_waits = takeover_waits;
    cfg.any_partitioner = any_partitioner;
    replay_as_recorded(index, &mut cfg)?;
    let dlq = crate::dlq::default_topic(&kafka.topic);
    let (letters, markers) = crate::dlq::admin::read(kafka, &dlq).map_err(|source| RebuildError::Markers { topic: dlq.clone(), source })?;
    cfg.mode = Mode::Replay(Replay { markers_written: Arc::new(markers.iter().filter_map(|m| m.id()).collect()), letters_written: Arc::new(crate::worker::letters_written(&letters)), of });
    Ok(cfg)
}

/// The replay decides as the live workers did, so that the new
/// generation holds what the live one holds: with the settings they
/// recorded in the index (abort policy, message size limit, schema
/// registry, partitioner rule, attempts). An index no
/// worker of this version has recorded them in is built with the defaults
/// and the flags given, said in a warning.
fn replay_as_recorded(index: &dyn Generations, cfg: &mut WorkerConfig) -> Result<(), RebuildError> {
    use crate::worker::settings;
    let given = settings::ApplySettings::of(cfg);
    match settings::recorded(index.record(settings::RECORD)?)? {
        Some(recorded) => {
            let differences = given.differences(&recorded);
            if !differences.is_empty() {
                warn!(differences = %differences.join(", "), "the flags given (first) differ from the settings the live workers recorded (second): the rebuild replays with the recorded ones");
            }
            recorded.apply_to(cfg)?;
            info!(settings = ?recorded, "replaying with the settings the live workers recorded");
        }
        None => warn!(settings = ?given, "the index records no worker settings (its workers are of an earlier version, or none ran): replaying with these"),
    }
    Ok(())
}

/// A rebuild into `model` of an index whose live generation `current`
/// holds another is a change of model: done only when asked
/// (`change_model`), and not compared with the live generation
/// (`verify`), whose documents follow the other model.
pub(super) fn check_model(index: &dyn Generations, current: u64, model: Option<&'static crate::domain::Domain>, change_model: bool, verify: bool) -> Result<(), RebuildError> {
    use crate::index::recorded_model::{holds, named, record_of};
    let held = index.model_record(current)?;
    if holds(held.as_ref(), model) {
        return Ok(());
    }
    let (live, new) = (named(held.as_ref()), named(model.map(record_of).as_ref()));
    if !change_model {
        return Err(RebuildError::ModelChange { generation: current, live, new });
    }
    if let Some(h) = &held {
        let unread = model.and_then(|d| crate::index::recorded_model::unread_versions(h, d));
        if model.is_none() || unread.is_some() {
            return Err(RebuildError::UnreadCommands { generation: current, live, new, unread });
        }
    }
    if verify {
        return Err(RebuildError::VerifyModelChange { live, new });
    }
    warn!(generation = current, live = %live, new = %new, "changing the model: the new generation holds the new one; at the cutover the live workers of the old one stop, to be started again with the new --model");
    Ok(())
}
