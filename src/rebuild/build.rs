//! One member's part of a rebuild: its worker on the new generation, run
//! until the stop (see [`super::members`] for how members agree on it).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::BaseConsumer;
use tracing::{info, warn};

use super::members::{self, Members};
use super::{applied_of, RebuildError, Tick, BROKER_SILENCE};
use crate::http::Health;
use crate::index::generations::{Generations, MemberReport, State};
use crate::kafka::{watermarks, KafkaConfig};
use crate::worker::{self, Stats, WorkerConfig};

/// What a member's build needs.
pub(super) struct Build<'a> {
    pub kafka: &'a KafkaConfig,
    pub consumer: &'a BaseConsumer,
    pub index: &'a dyn Generations,
    /// The worker's configuration (its group, its instance id).
    pub cfg: WorkerConfig,
    pub health: Arc<Health>,
    pub runtime: tokio::runtime::Handle,
    pub partitions: i32,
    /// The live generation, which the new one must also reach when both
    /// are built from the same topic.
    pub live: Option<u64>,
    pub members: Members,
    /// Owner conflicts earlier runs of this rebuild met.
    pub conflicts_before: usize,
    /// Called once, the first time every partition has caught up; the
    /// build then goes on, its worker running, until they have caught up
    /// again (a tenant's rebuild fences the live workers here).
    pub on_caught_up: Option<&'a dyn Fn() -> Result<(), RebuildError>>,
}

/// How often a member other than 0 reports how far its worker has read.
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// Runs a worker on the state's generation until the stop: member 0
/// records it in `state` once every partition has caught up; the others
/// read it there. Stops the worker (it commits and releases its writers)
/// and returns, per partition, how far it had read. Blocking.
pub(super) fn until_stop(b: &Build<'_>, state: &mut State, progress: &mut dyn FnMut(&Tick)) -> Result<BTreeMap<i32, i64>, RebuildError> {
    let target = state.generation;
    let backend = b.index.writer(target);
    let shutdown = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(Stats::default());
    let worker = {
        let (cfg, flag, health, handle, stats) = (b.cfg.clone(), shutdown.clone(), b.health.clone(), b.runtime.clone(), stats.clone());
        std::thread::spawn(move || {
            let _rt = handle.enter();
            worker::run(cfg, backend, flag, health, stats)
        })
    };
    let stopped = |worker: std::thread::JoinHandle<Result<(), worker::WorkerError>>| -> Result<(), RebuildError> {
        shutdown.store(true, Ordering::SeqCst);
        worker.join().map_err(|_| RebuildError::WorkerPanicked)?.map_err(RebuildError::Worker)
    };
    let mut unanswered: Option<Instant> = None;
    let mut reported = Instant::now() - REPORT_EVERY;
    let mut first_catch_up = b.on_caught_up;
    loop {
        if worker.is_finished() {
            worker.join().map_err(|_| RebuildError::WorkerPanicked)?.map_err(RebuildError::Worker)?;
            return Err(RebuildError::WorkerStopped);
        }
        // A poll the broker did not answer in time (a busy broker) is
        // polled again: the worker goes on meanwhile. Only a broker silent
        // for minutes ends the rebuild.
        let ends = match watermarks(b.consumer, &b.kafka.topic, b.partitions) {
            Ok(e) => {
                unanswered = None;
                e
            }
            Err(e) => {
                let since = *unanswered.get_or_insert_with(|| {
                    warn!(error = %e, "reading the topic's end offsets failed; polled again every second");
                    Instant::now()
                });
                if since.elapsed() >= BROKER_SILENCE {
                    stopped(worker)?;
                    return Err(RebuildError::BrokerSilent { secs: BROKER_SILENCE.as_secs(), source: e });
                }
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        let built = b.index.checkpoints_in(target, b.partitions)?;
        let applied = applied_of(&built, &ends);
        let all: i64 = ends.iter().map(|(_, high)| high).sum();
        metrics::gauge!("denorm_rebuild_remaining_messages").set((all - applied).max(0) as f64);
        metrics::gauge!("denorm_rebuild_generation").set(target as f64);
        progress(&Tick { generation: target, applied, of: all });
        let own = stats.positions.lock().expect("positions lock").clone();
        if b.members.leads() {
            let reports = reports_of(b.index, b.members, target)?;
            let mut found = b.index.owner_conflicts();
            found.extend(reports.iter().flat_map(|r| r.owner_conflicts.iter().cloned()));
            if !found.is_empty() && state.record_conflicts(&found, b.conflicts_before) {
                warn!(documents = state.owner_conflicts_total, first = ?state.owner_conflicts.iter().take(5).collect::<Vec<_>>(), "the rebuild met documents another key's partition held (owner changes sent without their explicit form): it will not cut over unless --accept-owner-conflicts");
                b.index.save_state(state)?;
            }
            // Caught up: with the log as of this check (its last message
            // applied, or, when offsets without messages such as
            // transaction markers end it, a worker past them), and with
            // the live generation (so a search never sees the index go
            // back).
            let highs: Vec<i64> = ends.iter().map(|(_, high)| *high).collect();
            let positions = members::merged_positions(&own, &reports);
            let live = match b.live {
                Some(g) => b.index.checkpoints_in(g, b.partitions)?,
                None => Default::default(),
            };
            let behind_live = lags(&built, &live, b.partitions);
            if members::behind(&highs, &built, &positions).is_empty() && !behind_live {
                if let Some(caught_up) = first_catch_up.take() {
                    if let Err(e) = caught_up() {
                        stopped(worker)?;
                        return Err(e);
                    }
                    continue;
                }
                state.stop_at = Some(highs);
                b.index.save_state(state)?;
                info!(generation = target, epoch = state.epoch, members = b.members.count, "every partition has caught up: stopping the rebuild's workers");
                break;
            }
        } else {
            if reported.elapsed() >= REPORT_EVERY {
                reported = Instant::now();
                b.index.save_member_report(&report(b, state, false, own))?;
            }
            match b.index.state().map_err(RebuildError::State)? {
                Some(s) if s.generation == target && s.stop_at.is_some() => {
                    *state = s;
                    break;
                }
                Some(s) if s.generation == target => {}
                _ => {
                    stopped(worker)?;
                    return Err(RebuildError::GivenUp { generation: target });
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stopped(worker)?;
    let positions = stats.positions.lock().expect("positions lock").clone();
    Ok(positions)
}

/// Whether the generation with checkpoints `built` has applied less of
/// some partition than the one with `live`.
pub(super) fn lags(built: &BTreeMap<i32, crate::index::Checkpoint>, live: &BTreeMap<i32, crate::index::Checkpoint>, partitions: i32) -> bool {
    let at = |c: &BTreeMap<i32, crate::index::Checkpoint>, p: i32| c.get(&p).map_or(-1, |c| c.offset as i64);
    (0..partitions).any(|p| at(built, p) < at(live, p))
}

/// This member's report of `state`'s epoch.
pub(super) fn report(b: &Build<'_>, state: &State, stopped: bool, positions: BTreeMap<i32, i64>) -> MemberReport {
    let mut owner_conflicts = b.index.owner_conflicts();
    owner_conflicts.truncate(State::CONFLICTS_KEPT);
    MemberReport { generation: state.generation, member: b.members.me, epoch: state.epoch, stopped, positions, owner_conflicts }
}

/// The others' reports of generation `target`, whatever their epoch.
pub(super) fn reports_of(index: &dyn Generations, m: Members, target: u64) -> Result<Vec<MemberReport>, RebuildError> {
    let mut out = Vec::new();
    for i in m.others() {
        if let Some(r) = index.member_report(i)?.filter(|r| r.generation == target) {
            out.push(r);
        }
    }
    Ok(out)
}
