//! Rebuilding an index (`denorm rebuild`): builds the next generation of the index (embedded or
//! Elasticsearch) from the start of the topic while the live workers keep
//! applying commands to the current one and searches keep reading it, then
//! cuts over atomically.
//!
//! How it goes (and how a crash at any point is resumed):
//!
//! 1. The topic must still hold every command (low watermark 0 on every
//!    partition), or the rebuild is refused: a replay could not be exact.
//! 2. The rebuild's state (`<index>/REBUILD`, or the meta document
//!    `rebuild` on Elasticsearch) records the generation being built (N+1).
//!    A rerun after a crash reads it and resumes that generation: its
//!    shards' checkpoints say where each partition goes on.
//! 3. An in-process worker of its own consumer group applies the topic to
//!    generation N+1 (dead letters and parking work as in `denorm run`).
//! 4. Once every partition of N+1 has reached both the end of the log (as
//!    of that check) and the checkpoint of generation N, the rebuild's
//!    worker stops (commits and releases its shard writers), N+1 is made
//!    searchable, and the cutover switches searches to it at once: one
//!    atomic rename of `CURRENT` (embedded), one `_aliases` request
//!    (Elasticsearch). Searches never see a half-built generation.
//! 5. Each live worker notices the switch between two batches (or, on
//!    Elasticsearch, at its next write: the old generation's write aliases
//!    are gone), commits or drops what it had for N, opens N+1's shard and
//!    resumes at N+1's checkpoint: a command that arrived during the
//!    cutover is applied to N+1 by the rebuild or by the live worker, once.
//! 6. Generation N is deleted (`--keep-old` keeps it): on the embedded index
//!    once no writer holds its shards, on Elasticsearch at once (nothing can
//!    write to it any more), then the state is removed.
//!
//! Run as several processes (`--members`), the workers of step 3 are the
//! members' and step 4's stop is agreed through records beside the state
//! ([`members`]); member 0 alone cuts over.

mod build;
pub mod members;
mod placing;
mod replay;
pub mod tenant;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::BaseConsumer;
use tracing::{info, warn};

pub use members::Members;

use crate::http::Health;
use crate::index::generations::{Generations, State};
use crate::index::Checkpoint;
use crate::kafka::{watermarks, KafkaConfig, KafkaSetupError};
use crate::worker::{ReplayOf, WorkerError};
use replay::check_model;
use replay::{replay_config, retention_gaps};

/// Why a rebuild did not finish.
#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    #[error(
        "partition {partition} of {topic} starts at offset {low}: retention has deleted {low} command(s), so a replay cannot rebuild \
         the index exactly. Keep the command topic's whole history (retention.ms=-1, retention.bytes=-1), restore the \
         index from a copy and let `denorm run` catch it up from its checkpoints, or accept the loss: `denorm rebuild \
         --accept-gaps` rebuilds from what is left and says what it skipped"
    )]
    Retention { topic: String, partition: usize, low: i64 },
    /// Partitions were added to the topic in place (an operator's mistake
    /// to fix with `denorm migrate`).
    #[error(
        "topic {topic} has {partitions} partitions, but the index was built from it with {recorded}: partitions added in \
         place moved keys to other partitions, and a replay would split their commands between shards. Copy the topic \
         into a new one (`denorm migrate --to-topic NEW --to-partitions {partitions}`), then rebuild from it \
         (`denorm --topic NEW rebuild`); see docs/rebuild.md"
    )]
    PartitionsAdded { topic: String, partitions: i32, recorded: i32 },
    #[error(transparent)]
    Kafka(#[from] KafkaSetupError),
    #[error("the broker has not said where the topic ends for {secs}s")]
    BrokerSilent {
        secs: u64,
        #[source]
        source: KafkaSetupError,
    },
    /// The index's generations could not be read or changed.
    #[error(transparent)]
    Index(#[from] crate::index::IndexError),
    /// The worker settings the live workers recorded cannot be used.
    #[error("the worker settings the live workers recorded: {0}")]
    Settings(#[from] crate::worker::settings::SettingsError),
    /// The dead-letter topic's markers could not be read.
    #[error("reading the markers of {topic}: {source}")]
    Markers {
        topic: String,
        #[source]
        source: crate::dlq::admin::DlqError,
    },
    #[error("the rebuild's worker failed")]
    Worker(#[source] WorkerError),
    #[error("the rebuild's worker panicked")]
    WorkerPanicked,
    #[error("the rebuild's worker stopped before the rebuild was done")]
    WorkerStopped,
    /// The state of a rebuild that did not finish cannot be read.
    #[error("the state of the rebuild in progress cannot be read ({0:#}): `denorm rebuild --abandon` removes it, and the generation it was building")]
    State(#[source] crate::index::IndexError),
    /// The rebuild's writers met documents another key's partition held:
    /// the new generation may differ from the live one there.
    #[error(
        "the rebuild of generation {generation} met {total} document(s) held by another key's partition than the command's \
         (owner changes sent without previous_path or previous_user_id, whose outcome depends on which writer comes first: \
         the new generation may differ from the live one there), so it does not cut over: {}. Send those owner changes \
         again in their explicit form, then `denorm rebuild --accept-owner-conflicts` cuts over (or `--abandon` gives the \
         rebuild up); see docs/cross-key.md",
        documents.join(", ")
    )]
    OwnerConflicts { generation: u64, total: usize, documents: Vec<String> },
    /// `--verify`: the new generation differs from the live one.
    #[error(
        "generation {generation} differs from the live generation in {total} document(s) over what both have applied, so the \
         rebuild does not cut over: {}. Where the live generation is wrong (changed behind the pipeline's back), the new one \
         is the replay of the log: `denorm rebuild --verify --force` cuts over anyway; `denorm verify` tells which side the \
         log agrees with; see docs/rebuild.md",
        documents.join("; ")
    )]
    Differs { generation: u64, total: usize, documents: Vec<String> },
    /// A rebuild with another model than the live generation's, not asked
    /// to change it.
    #[error(
        "the live generation {generation} holds {live}, and this rebuild would build {new}: a change of model. Pass \
         --change-model to rebuild into it (at the cutover the live workers of the old model stop; start them again with \
         the new --model), or give the rebuild the live generation's model; see docs/model.md, \"Changing a model\""
    )]
    ModelChange { generation: u64, live: String, new: String },
    /// A change of model whose new model cannot read the commands the
    /// topic holds of the old one.
    #[error(
        "the live generation {generation} holds {live}, and the topic holds its commands, written with its schema: {}. Name \
         the file of each under `earlier` in the new model's file, which then reads their commands as its own; see \
         docs/model.md, \"Changing a model\"",
        match unread { Some(v) => format!("{new} reads none of {v}"), None => "a rebuild without --model would dead-letter them".into() }
    )]
    UnreadCommands { generation: u64, live: String, new: String, unread: Option<String> },
    /// `--verify` of a change of model: the generations' documents follow
    /// two models.
    #[error("--verify compares the new generation with the live one document by document, but the live one holds {live} and the new one {new}: a change of model is verified after its cutover with `denorm verify --model`")]
    VerifyModelChange { live: String, new: String },
    /// `--verify` could not compare the generations.
    #[error("comparing the new generation with the live one before the cutover")]
    Verify(#[source] crate::verify::VerifyError),
    /// `--verify` of a rebuild from another topic than the live
    /// generation's: their offsets are not comparable.
    #[error("--verify compares the generations over the offsets both have applied, which needs the topic the live generation was built from ({recorded}); a rebuild from {topic} (after `denorm migrate`) is verified after its cutover with `denorm verify`")]
    VerifyOtherLog { recorded: String, topic: String },
    /// A rebuild that did not finish was building from another log.
    #[error(
        "a rebuild of generation {generation} from topic {recorded} ({recorded_partitions} partitions) did not finish: rerun it \
         with --topic {recorded}, or give it up with `denorm rebuild --abandon` (the generation it was building is deleted) \
         before rebuilding from {topic} ({partitions} partitions)"
    )]
    OtherLog { generation: u64, recorded: String, recorded_partitions: i32, topic: String, partitions: i32 },
    /// `rebuild --tenant` from another topic than the live generation's.
    #[error("a rebuild of tenant {tenant} alone replays the topic the live generation was built from ({recorded}), not {topic}: after `denorm migrate`, rebuild every tenant")]
    TenantOtherLog { tenant: String, recorded: String, topic: String },
    /// `rebuild --tenant` while a rebuild of every tenant is in progress.
    #[error("a rebuild of every tenant is in progress: let it finish (or `denorm rebuild --abandon` it) before rebuilding tenant {tenant} alone")]
    TenantDuringRebuild { tenant: String },
    /// `--abandon` of a tenant's rebuild whose cutover was made.
    #[error("the rebuild of tenant {tenant}'s indexes cut over to revision {revision} already: run `denorm rebuild --tenant {tenant}` to finish it (nothing is given up)")]
    TenantCutOver { tenant: String, revision: u64 },
    /// A rebuild of every tenant while one tenant's is in progress.
    #[error("a rebuild of tenant {tenant}'s own indexes is in progress: let it finish (`denorm rebuild --tenant {tenant}` resumes it) or give it up (`denorm rebuild --tenant {tenant} --abandon`) before rebuilding every tenant")]
    DuringTenantRebuild { tenant: String },
    /// A rebuild begun by another number of members.
    #[error(
        "the rebuild of generation {generation} was begun by {recorded} member(s): resume it with --members {recorded} (and every \
         member number below it), or give it up with `denorm rebuild --abandon` before rebuilding with {members}"
    )]
    OtherMembers { generation: u64, recorded: u32, members: u32 },
    /// A member other than 0 found no rebuild to join.
    #[error("member {member} found no rebuild in progress after {secs}s: member 0 (`--member 0`) begins or resumes it; is it running?")]
    NotBegun { secs: u64, member: u32 },
    /// The rebuild a member worked for was given up (`--abandon`) or
    /// replaced by another.
    #[error("the rebuild of generation {generation} was given up while this member worked for it")]
    GivenUp { generation: u64 },
}

/// What a rebuild needs.
pub struct Rebuild<'a> {
    pub kafka: KafkaConfig,
    pub index: &'a dyn Generations,
    /// The live workers' group (the rebuild's own groups are named after it).
    pub group: String,
    pub partitions: i32,
    /// Keep the previous generation after the cutover.
    pub keep_old: bool,
    pub takeover_waits: bool,
    /// Accept messages in any partition (see `WorkerConfig::any_partitioner`).
    pub any_partitioner: bool,
    /// Rebuild from what retention left of the topic (see
    /// `ReplayOf::Rebuild`).
    pub accept_gaps: bool,
    /// Cut over even if the rebuild's writers met documents another key's
    /// partition held ([`Generations::owner_conflicts`]).
    pub accept_owner_conflicts: bool,
    /// `--verify`: compare the new generation with the live one before
    /// the cutover.
    pub verify: Option<CutoverCheck>,
    pub health: Arc<Health>,
    /// The runtime the rebuild's worker resolves schema ids on.
    pub runtime: tokio::runtime::Handle,
    /// Which of the rebuild's processes this is.
    pub members: Members,
    /// The model the new generation holds (`None`: the compiled-in kinds
    /// alone); the index's generations handle was opened with it.
    pub model: Option<&'static crate::domain::Domain>,
    /// `--change-model`: the live generation may hold another model.
    pub change_model: bool,
}

/// How `--verify` checks a rebuild before its cutover.
#[derive(Debug, Clone, Copy)]
pub struct CutoverCheck {
    /// Cut over despite differences (they are logged and reported).
    pub force: bool,
    /// How long to wait for the live generation to apply as much as the new one.
    pub wait: Duration,
}

/// What `--verify` found before the cutover.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The new generation's checkpoints the two were compared at.
    pub at: crate::verify::compare::Positions,
    pub outcome: crate::verify::compare::Outcome,
}

/// Where a rebuild stands, at each turn of its progress poll.
#[derive(Debug, Clone, Copy)]
pub struct Tick {
    pub generation: u64,
    /// Commands of the log the new generation has applied.
    pub applied: i64,
    /// Commands in the log as of this turn.
    pub of: i64,
}

/// A finished rebuild.
#[derive(Debug, Clone)]
pub struct Done {
    pub generation: u64,
    pub partitions: i32,
    pub applied: u64,
    pub elapsed: Duration,
    /// With `accept_gaps`: per partition, the offsets retention had
    /// deleted (`0..low`), whose effects the new generation lacks.
    pub skipped: Vec<(i32, i64)>,
    /// With `--verify`: the comparison before the cutover.
    pub verified: Option<Verified>,
    /// Set on a member other than 0: the member that cut over.
    pub cut_over_by: Option<u32>,
}

/// Commands of the log (`ends`: each partition's watermarks) that a
/// generation with `checkpoints` has applied.
pub fn applied_of(checkpoints: &BTreeMap<i32, Checkpoint>, ends: &[(i64, i64)]) -> i64 {
    (0..).zip(ends).map(|(p, (_, high))| checkpoints.get(&p).map_or(0, |c| (c.offset as i64 + 1).min(*high))).sum()
}

/// How long the rebuild's progress poll goes on without an answer from the
/// broker before the rebuild gives up.
const BROKER_SILENCE: Duration = Duration::from_secs(120);

/// Rebuilds (or resumes rebuilding) the next generation and cuts over to it;
/// `progress` sees each turn of the progress poll. Blocking.
pub fn run(r: Rebuild<'_>, mut progress: impl FnMut(&Tick)) -> Result<Done, RebuildError> {
    let Rebuild { kafka, index, group, partitions, keep_old, takeover_waits, any_partitioner, accept_gaps, accept_owner_conflicts, verify, health, runtime: rt, members: m, model, change_model } = r;
    let group = group.as_str();
    let started = Instant::now();
    let consumer: BaseConsumer = kafka.consumer_config().create().map_err(KafkaSetupError::from)?;
    let marks = watermarks(&consumer, &kafka.topic, partitions)?;
    let skipped = retention_gaps(&kafka.topic, &marks, accept_gaps)?;
    // Rebuilt from the topic the live generation was built from, the new one
    // must also reach the live one's checkpoints; from another topic (after
    // `denorm migrate`) their offsets are not comparable.
    let recorded_topic = index.recorded_topic()?;
    let same_log = recorded_topic == kafka.topic;
    if verify.is_some() && !same_log {
        return Err(RebuildError::VerifyOtherLog { recorded: recorded_topic, topic: kafka.topic.clone() });
    }
    // Partitions added to the topic in place moved keys to other
    // partitions: a replay would split them across shards (the workers
    // refuse such a topic too). Only a copy into a new topic keeps them.
    if same_log {
        if let Some(recorded) = index.recorded_partitions()?.filter(|n| *n != partitions) {
            return Err(RebuildError::PartitionsAdded { topic: kafka.topic.clone(), partitions, recorded });
        }
    }
    let current = index.current()?;
    check_model(index, current, model, change_model, verify.is_some())?;
    let tenants = || -> Result<Option<RebuildError>, RebuildError> { Ok(index.tenant_rebuilds()?.first().map(|t| RebuildError::DuringTenantRebuild { tenant: t.clone() })) };
    let mut verified = None;
    let mut state = match m.leads() {
        true => begin_alone(index, (&kafka.topic, partitions, group, m.count), tenants)?,
        false => match tenants()? {
            Some(e) => return Err(e),
            None => members::await_state(index, &kafka.topic, partitions, m, members::BEGIN_WAIT)?,
        },
    };
    let conflicts_before = state.owner_conflicts_total;
    let target = state.generation;

    if current != target {
        index.prepare(target)?;
        // Alone, a group of this run's own: a run killed moments ago may
        // still be a member of the last one, holding its partitions until
        // the broker evicts it (tansu 0.6 was seen not to within minutes).
        // Members share the rebuild's group as static members: a member
        // replaced under its number takes its partitions back at once.
        // Positions come from the shards' checkpoints, never from the
        // group's offsets.
        let run_group = match m.count {
            1 => format!("{}-{}", state.group, &uuid::Uuid::new_v4().simple().to_string()[..8]),
            _ => state.group.clone(),
        };
        let mut cfg = replay_config(index, &kafka, &run_group, (takeover_waits, any_partitioner), ReplayOf::Rebuild { accept_gaps }, model)?;
        if m.count > 1 {
            cfg.instance_id = Some(format!("member-{}", m.me));
        }
        info!(group = %run_group, member = m.me, members = m.count, "the rebuild's worker joins a consumer group of its own (it commits no offsets there; members of one rebuild share it)");
        let b = build::Build {
            kafka: &kafka,
            consumer: &consumer,
            index,
            cfg,
            health,
            runtime: rt.clone(),
            partitions,
            live: same_log.then_some(current),
            members: m,
            conflicts_before,
            on_caught_up: None,
        };
        // Built until caught up, and, after a `--verify`, built on until the
        // new generation has what the live workers applied meanwhile.
        'built: loop {
            let reports = loop {
                let positions = match state.stop_at {
                    None => build::until_stop(&b, &mut state, &mut progress)?,
                    // Resumed after the stop: this run's worker has read nothing.
                    Some(_) => Default::default(),
                };
                if !m.leads() {
                    index.save_member_report(&build::report(&b, &state, true, positions))?;
                    info!(generation = target, member = m.me, "stopped: the partitions this member held are committed");
                    match members::await_outcome(index, target, state.epoch)? {
                        members::Outcome::CutOver => {
                            let applied = applied_of(&index.checkpoints_in(target, partitions)?, &watermarks(&consumer, &kafka.topic, partitions)?) as u64;
                            return Ok(Done { generation: target, partitions, applied, elapsed: started.elapsed(), skipped, verified: None, cut_over_by: Some(0) });
                        }
                        members::Outcome::Resumed(s) => {
                            info!(generation = target, epoch = s.epoch, "member 0 withdrew the stop: building on");
                            state = s;
                            continue;
                        }
                    }
                }
                let reports = members::await_stopped(index, &state, m)?;
                // What was judged caught up must be durable: a member that
                // died after reporting its position may not have committed.
                let stop_at = state.stop_at.clone().unwrap_or_default();
                let positions = members::merged_positions(&positions, &reports);
                let behind = members::behind(&stop_at, &index.checkpoints_in(target, partitions)?, &positions);
                if behind.is_empty() {
                    break reports;
                }
                warn!(partitions = ?behind, "after the stop these partitions are behind where they were judged caught up (a member died before it committed): withdrawing the stop");
                state.stop_at = None;
                state.epoch += 1;
                index.save_state(&state)?;
            };
            let mut found = index.owner_conflicts();
            found.extend(reports.iter().flat_map(|r| r.owner_conflicts.iter().cloned()));
            if state.record_conflicts(&found, conflicts_before) {
                index.save_state(&state)?;
            }
            if state.owner_conflicts_total > 0 && !accept_owner_conflicts {
                return Err(RebuildError::OwnerConflicts { generation: target, total: state.owner_conflicts_total, documents: state.owner_conflicts.clone() });
            }
            if let Some(check) = verify.filter(|_| verified.is_none()) {
                verified = Some(check_before_cutover(index, &kafka, current, target, partitions, check)?);
                crate::faults::hold("rebuild.verified");
                // The live workers went on during the verify: cut over now, and
                // searches would read the new generation without what they
                // applied meanwhile until they follow it and apply it again
                // (review of Elasticsearch, F4 b). The stop is withdrawn, as
                // for a member that died before it committed; the build goes
                // on until it has caught up with the live generation again.
                if build::lags(&index.checkpoints_in(target, partitions)?, &index.checkpoints_in(current, partitions)?, partitions) {
                    info!(generation = target, live = current, "the live workers applied commands during the verify: building on until the new generation has them too, then cutting over");
                    state.stop_at = None;
                    state.epoch += 1;
                    index.save_state(&state)?;
                    continue 'built;
                }
            }
            break 'built;
        }
        if m.count == 1 {
            crate::kafka::delete_group(&kafka, &run_group, &rt);
        }
        index.cut_over(current, target, partitions)?;
        info!(from = current, to = target, "cut over: searches and live workers use the new generation");
        if crate::faults::active("rebuild.after-cutover").is_some() {
            warn!("injected fault rebuild.after-cutover: aborting");
            std::process::abort();
        }
    } else if !m.leads() {
        // Member 0 cut over already, and is cleaning up.
        let applied = applied_of(&index.checkpoints_in(target, partitions)?, &marks) as u64;
        return Ok(Done { generation: target, partitions, applied, elapsed: started.elapsed(), skipped, verified: None, cut_over_by: Some(0) });
    }

    if !keep_old {
        for g in index.list()?.into_iter().filter(|&g| g != target) {
            index.remove(g, partitions)?;
        }
    }
    index.clear_state()?;
    members::clear_reports(index, m);
    let built = index.checkpoints_in(target, partitions)?;
    let applied: u64 = built.values().map(|c| c.offset + 1).sum();
    Ok(Done { generation: target, partitions, applied, elapsed: started.elapsed(), skipped, verified, cut_over_by: None })
}

/// `--verify`: compares generation `target` with the live `current` over
/// what both have applied; differences stop the rebuild unless forced.
fn check_before_cutover(index: &dyn Generations, kafka: &KafkaConfig, current: u64, target: u64, partitions: i32, check: CutoverCheck) -> Result<Verified, RebuildError> {
    info!(generation = target, live = current, "comparing the new generation with the live one before the cutover (--verify)");
    let (at, outcome) = crate::verify::cutover::compare_generations(index, kafka, current, target, partitions, check.wait, 20).map_err(RebuildError::Verify)?;
    info!(checked = outcome.checked, differences = outcome.differences_total, "compared the generations");
    if outcome.differences_total > 0 {
        let documents = outcome.differences.iter().map(|d| {
            let fields: Vec<&str> = d.fields.iter().map(|f| f.field.as_str()).collect();
            let what = match d.problem {
                crate::verify::compare::Problem::Missing => "only in the new generation".to_string(),
                crate::verify::compare::Problem::Unexpected => "only in the live generation".to_string(),
                crate::verify::compare::Problem::Differs => format!("differs in {}", fields.join(", ")),
            };
            format!("{} {}: {what}", d.kind, d.id)
        });
        let documents: Vec<String> = documents.collect();
        if !check.force {
            return Err(RebuildError::Differs { generation: target, total: outcome.differences_total, documents });
        }
        warn!(total = outcome.differences_total, documents = ?documents, "the new generation differs from the live one: cutting over anyway (--force)");
    }
    Ok(Verified { at, outcome })
}

/// The index's generations and a rebuild in progress, with how much of the
/// log each has applied.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Status {
    pub current: u64,
    pub generations: Vec<u64>,
    pub current_applied: i64,
    pub end: i64,
    /// The generation being rebuilt and what it has applied.
    pub rebuild: Option<(u64, i64)>,
    /// The tenants whose own indexes a `rebuild --tenant` is rebuilding.
    pub tenant_rebuilds: Vec<String>,
}

/// [`begin`], where a rebuild of another kind may be in progress (of every
/// tenant, or of one tenant's own indexes), which `other` reads: refused
/// while it is. Each kind records its state before it reads the other's,
/// so of two started at the same moment at least one sees the other (both
/// may: then both refuse). A state recorded by this call is withdrawn when
/// it refuses.
pub(super) fn begin_alone(
    index: &dyn Generations,
    (topic, partitions, group, members): (&str, i32, &str, u32),
    other: impl Fn() -> Result<Option<RebuildError>, RebuildError>,
) -> Result<State, RebuildError> {
    if let Some(e) = other()? {
        return Err(e);
    }
    crate::faults::hold("rebuild.checked");
    let fresh = index.state().map_err(RebuildError::State)?.is_none();
    let state = begin(index, topic, partitions, group, members)?;
    crate::faults::hold("rebuild.begun");
    if let Some(e) = other()? {
        if fresh {
            index.clear_state()?;
        }
        return Err(e);
    }
    Ok(state)
}

/// The rebuild to resume (its state is recorded: a run that did not finish),
/// which must be of `topic` with `partitions`, or a new one, recorded now.
pub fn begin(index: &dyn Generations, topic: &str, partitions: i32, group: &str, members: u32) -> Result<State, RebuildError> {
    let current = index.current()?;
    match index.state().map_err(RebuildError::State)? {
        Some(s) => {
            let (recorded, recorded_partitions) = (s.topic.clone().unwrap_or_else(|| topic.into()), s.partitions.unwrap_or(partitions));
            if recorded != topic || recorded_partitions != partitions {
                return Err(RebuildError::OtherLog { generation: s.generation, recorded, recorded_partitions, topic: topic.into(), partitions });
            }
            if s.members != members {
                return Err(RebuildError::OtherMembers { generation: s.generation, recorded: s.members, members });
            }
            info!(generation = s.generation, "resuming the rebuild in progress");
            Ok(s)
        }
        None => {
            let generation = index.list()?.into_iter().max().unwrap_or(0).max(current) + 1;
            let group = format!("{group}.rebuild-{generation}-{}", uuid::Uuid::new_v4().simple());
            let s = State { generation, group, topic: Some(topic.into()), partitions: Some(partitions), members, ..Default::default() };
            index.save_state(&s)?;
            info!(generation, "rebuilding the index into a new generation");
            Ok(s)
        }
    }
}

/// Gives up the rebuild that did not finish (`rebuild --abandon`): deletes
/// the generation it was building (the generation above the current one
/// when its state cannot be read) and its state. The generation it was
/// building, if any. Stop the rebuild first: a running one keeps writing.
pub fn abandon(index: &dyn Generations, partitions: i32) -> Result<Option<u64>, RebuildError> {
    let current = index.current()?;
    let generations = index.list()?;
    let target = match index.state() {
        Ok(Some(s)) => {
            members::clear_reports(index, Members { count: s.members, me: 0 });
            Some(s.generation)
        }
        Ok(None) => None,
        Err(e) => {
            warn!(error = %format!("{e:#}"), "the rebuild's state cannot be read: giving up the generation above the current one");
            generations.iter().copied().filter(|g| *g > current).max()
        }
    };
    let removed = target.filter(|g| *g != current && generations.contains(g));
    if let Some(g) = removed {
        index.remove(g, partitions)?;
    }
    index.clear_state()?;
    Ok(removed.or(target))
}

/// Reads [`Status`]. Blocking.
pub fn status(kafka: &KafkaConfig, index: &dyn Generations) -> Result<Status, RebuildError> {
    let current = index.current()?;
    let generations = index.list()?;
    let target = index.state().map_err(RebuildError::State)?.map(|s| s.generation);
    let partitions = kafka.topic_partitions()?.unwrap_or(0);
    let consumer: BaseConsumer = kafka.consumer_config().create().map_err(KafkaSetupError::from)?;
    let ends = watermarks(&consumer, &kafka.topic, partitions)?;
    let end = ends.iter().map(|(_, h)| h).sum();
    let applied = |g: u64| -> Result<i64, RebuildError> { Ok(applied_of(&index.checkpoints_in(g, partitions)?, &ends)) };
    let current_applied = applied(current)?;
    let rebuild = match target {
        Some(g) => Some((g, applied(g)?)),
        None => None,
    };
    let tenant_rebuilds = index.tenant_rebuilds()?;
    Ok(Status { current, generations, current_applied, end, rebuild, tenant_rebuilds })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::embedded::EmbeddedIndex;
    use crate::index::generations::EmbeddedGenerations;

    fn generations(root: &std::path::Path, topic: &str) -> EmbeddedGenerations {
        EmbeddedGenerations { index: EmbeddedIndex::open_for_rebuild(root, topic).unwrap(), budget: 20 << 20 }
    }

    /// Issue 29, 10: a rebuild killed and rerun with another topic used to
    /// resume the generation built from the first one, and loop on the log
    /// mismatch.
    #[test]
    fn a_rebuild_that_did_not_finish_is_resumed_only_from_its_own_log() {
        let dir = tempfile::tempdir().unwrap();
        EmbeddedIndex::open(dir.path(), "a").unwrap();
        let g = generations(dir.path(), "a");
        let s = begin(&g, "a", 2, "grp", 1).unwrap();
        assert_eq!((s.generation, s.topic.as_deref(), s.partitions), (1, Some("a"), Some(2)));
        assert_eq!(begin(&g, "a", 2, "grp", 1).unwrap(), s, "resumed");
        for (topic, partitions) in [("b", 2), ("a", 3)] {
            let e = begin(&generations(dir.path(), topic), topic, partitions, "grp", 1).unwrap_err();
            assert!(matches!(e, RebuildError::OtherLog { generation: 1, .. }), "{e}");
            assert!(e.to_string().contains("--topic a") && e.to_string().contains("--abandon"), "{e}");
        }
        // A state of an earlier build (no topic recorded) is resumed.
        g.save_state(&State { topic: None, partitions: None, ..s.clone() }).unwrap();
        assert_eq!(begin(&g, "a", 2, "grp", 1).unwrap().generation, 1);
    }

    /// Issue 29, 10: a torn state file used to break every `rebuild`,
    /// `--status` included; `--abandon` gives the rebuild up, whatever its
    /// state.
    #[test]
    fn an_unreadable_state_is_named_and_abandon_gives_the_rebuild_up() {
        let dir = tempfile::tempdir().unwrap();
        EmbeddedIndex::open(dir.path(), "a").unwrap();
        let g = generations(dir.path(), "a");
        std::fs::create_dir_all(dir.path().join("generations/1")).unwrap();
        std::fs::write(dir.path().join("REBUILD"), b"{\"generation\": 1, \"gro").unwrap();
        let e = begin(&g, "a", 2, "grp", 1).unwrap_err();
        assert!(matches!(e, RebuildError::State(_)) && e.to_string().contains("denorm rebuild --abandon"), "{e}");
        assert_eq!(abandon(&g, 2).unwrap(), Some(1));
        assert!(!dir.path().join("generations/1").exists() && !dir.path().join("REBUILD").exists());
        assert_eq!(abandon(&g, 2).unwrap(), None, "nothing left to give up");
        let s = begin(&g, "b", 4, "grp", 1).unwrap();
        assert_eq!((s.generation, s.topic.as_deref()), (1, Some("b")));
        assert_eq!(abandon(&g, 4).unwrap(), Some(1));
    }

    /// Issue 29, 10: the embedded cutover recorded the new topic, then
    /// switched `CURRENT`: a crash between left the old generation bound to
    /// the new topic, and its live workers refused it. Now one write of
    /// `CURRENT` switches both.
    #[test]
    fn the_embedded_cutover_switches_the_generation_and_its_log_in_one_write() {
        let dir = tempfile::tempdir().unwrap();
        let old = EmbeddedIndex::open(dir.path(), "a").unwrap();
        old.bind_log(2).unwrap();
        let marker = std::fs::read(dir.path().join("denorm-index.json")).unwrap();
        generations(dir.path(), "b").cut_over(0, 1, 5).unwrap();
        assert_eq!(std::fs::read(dir.path().join("denorm-index.json")).unwrap(), marker, "only CURRENT is written");
        let index = EmbeddedIndex::open_existing(dir.path()).unwrap();
        assert_eq!((index.current_generation().unwrap(), index.recorded_topic().unwrap(), index.recorded_partitions().unwrap()), (1, "b".to_string(), Some(5)));
        assert!(matches!(EmbeddedIndex::open(dir.path(), "a"), Err(crate::index::IndexError::WrongTopic { .. })));
        EmbeddedIndex::open(dir.path(), "b").unwrap().bind_log(5).unwrap();
        // `CURRENT` as earlier builds wrote it: the generation alone, the
        // log in the marker.
        std::fs::write(dir.path().join("CURRENT"), b"1").unwrap();
        assert_eq!((index.current_generation().unwrap(), index.recorded_topic().unwrap(), index.recorded_partitions().unwrap()), (1, "a".to_string(), Some(2)));
    }
}
