//! `denorm rebuild --tenant T` on Elasticsearch: a new revision of one
//! tenant's own indexes, replayed from the topic (the tenant's commands
//! only) while every tenant is served and updated, then cut over for that
//! tenant alone. A tenant in the shared indexes that the configuration
//! names dedicated moves into its first own indexes this way (its fence:
//! [`super::placing`]). How the cutover hands the tenant from the live workers to
//! the new revision: [`crate::index::tenant_generations`].

use std::sync::Arc;
use std::time::Instant;

use rdkafka::consumer::BaseConsumer;
use tracing::info;

use super::{build, Done, Members, RebuildError, Tick};
use crate::http::Health;
use crate::index::generations::Generations;
use crate::index::tenant_generations::TenantGenerations;
use crate::kafka::{watermarks, KafkaConfig, KafkaSetupError};
use crate::worker::{KeySample, ReplayOf};

/// What a tenant's rebuild needs.
pub struct TenantRebuild<'a> {
    pub kafka: KafkaConfig,
    pub index: &'a TenantGenerations,
    /// The live workers' group (the rebuild's own is named after it).
    pub group: String,
    pub partitions: i32,
    /// Keep the replaced revision of the tenant's indexes.
    pub keep_old: bool,
    pub takeover_waits: bool,
    pub any_partitioner: bool,
    pub health: Arc<Health>,
    pub runtime: tokio::runtime::Handle,
}

/// Rebuilds (or resumes rebuilding) the tenant's next revision and cuts
/// the tenant over to it. Blocking.
pub fn run(r: TenantRebuild<'_>, mut progress: impl FnMut(&Tick)) -> Result<Done, RebuildError> {
    let TenantRebuild { kafka, index, group, partitions, keep_old, takeover_waits, any_partitioner, health, runtime } = r;
    let started = Instant::now();
    let consumer: BaseConsumer = kafka.consumer_config().create().map_err(KafkaSetupError::from)?;
    let marks = watermarks(&consumer, &kafka.topic, partitions)?;
    super::retention_gaps(&kafka.topic, &marks, false)?;
    // The live generation's offsets are the ones the new revision's are
    // compared with, and its placement is the one rebuilt.
    let recorded = index.recorded_topic()?;
    if recorded != kafka.topic {
        return Err(RebuildError::TenantOtherLog { tenant: index.tenant.clone(), recorded, topic: kafka.topic.clone() });
    }
    if let Some(recorded) = index.recorded_partitions()?.filter(|n| *n != partitions) {
        return Err(RebuildError::PartitionsAdded { topic: kafka.topic.clone(), partitions, recorded });
    }
    let current = index.current()?;
    let whole =
        || -> Result<Option<RebuildError>, RebuildError> { Ok(crate::index::Backend::record(&index.backend, "rebuild")?.map(|_| RebuildError::TenantDuringRebuild { tenant: index.tenant.clone() })) };
    let mut state = super::begin_alone(index, (&kafka.topic, partitions, &group, 1), whole)?;
    let target = state.generation;
    let done = |applied| Done { generation: target, partitions, applied, elapsed: started.elapsed(), skipped: Vec::new(), verified: None, cut_over_by: None };
    if target != current && index.live_on_revision(target)? {
        // Stopped between the cutover's aliases and its record: finished.
        info!(tenant = %index.tenant, revision = target, "the cutover was made: recording it");
        index.record_revision(target)?;
        return finish(index, (current, target), partitions, keep_old, index.entering).map(|()| done(0));
    }
    if target == current {
        // Stopped after the cutover's record (a new rebuild's target is
        // above the current revision): only the clean-up is left, of the
        // revision below, or of the shared indexes a move left.
        info!(tenant = %index.tenant, revision = target, "the cutover was recorded: cleaning up");
        let moved_in = index.hides_in_shared()?;
        return finish(index, (target.saturating_sub(1), target), partitions, keep_old, moved_in).map(|()| done(0));
    }
    let conflicts_before = state.owner_conflicts_total;
    index.prepare(target)?;
    let run_group = format!("{}-{}", state.group, &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let keys = KeySample { tenant: Some(index.tenant.clone()), ..Default::default() };
    let cfg = super::replay_config(index, &kafka, &run_group, (takeover_waits, any_partitioner), ReplayOf::Tenant { keys: Arc::new(keys) }, index.backend.model)?;
    info!(tenant = %index.tenant, revision = target, group = %run_group, "rebuilding a tenant's own indexes into a new revision");
    // Caught up with the live workers, the rebuild fences them off the
    // tenant's indexes, its worker running: from then on they apply
    // nothing of the tenant, and the rebuild goes on until it has applied
    // what the topic holds after the fence (a run resumed after the fence
    // fences no more).
    let fenced_at = std::cell::Cell::new(None);
    let fence = || -> Result<(), RebuildError> {
        crate::faults::hold("rebuild.caught-up");
        // From when a live writer may begin to wait: a tenant moving in,
        // from the placement's record, before every writer has taken it.
        let began = Instant::now();
        if index.entering {
            super::placing::fence(index, &kafka, partitions, target, &runtime)?;
        } else {
            index.fence(current)?;
        }
        fenced_at.set(Some(if index.entering { began } else { Instant::now() }));
        info!(tenant = %index.tenant, "the live workers are fenced off the tenant's indexes (their writes of it wait) until the cutover");
        crate::faults::hold("rebuild.fenced");
        Ok(())
    };
    let fenced = index.fenced(partitions)?;
    let members = Members { count: 1, me: 0 };
    let on_caught_up: Option<&dyn Fn() -> Result<(), RebuildError>> = if fenced { None } else { Some(&fence) };
    let b = build::Build { kafka: &kafka, consumer: &consumer, index, cfg, health, runtime: runtime.clone(), partitions, live: Some(current), members, conflicts_before, on_caught_up };
    build::until_stop(&b, &mut state, &mut progress)?;
    if state.record_conflicts(&index.owner_conflicts(), conflicts_before) {
        index.save_state(&state)?;
    }
    if state.owner_conflicts_total > 0 {
        return Err(RebuildError::OwnerConflicts { generation: target, total: state.owner_conflicts_total, documents: state.owner_conflicts.clone() });
    }
    crate::kafka::delete_group(&kafka, &run_group, &runtime);
    let applied = super::applied_of(&index.checkpoints_in(target, partitions)?, &watermarks(&consumer, &kafka.topic, partitions)?) as u64;
    index.cut_over(current, target, partitions)?;
    // How long the live workers' writes of the tenant waited (unknown to
    // a run resumed after its fence).
    let fenced_ms = fenced_at.get().map(|t| t.elapsed().as_millis() as u64);
    info!(tenant = %index.tenant, from = current, to = target, fenced_ms, "cut over: the tenant's searches and live writes use the new revision");
    crate::faults::hold("rebuild.cut-over");
    finish(index, (current, target), partitions, keep_old, index.entering)?;
    Ok(done(applied))
}

/// After the cutover from revision `from` to `to`: `from` is deleted
/// (unless kept), and so are the rebuild's checkpoints and state. A tenant
/// `moved_in` from the shared indexes had no `from`: its documents there
/// are deleted instead.
fn finish(index: &TenantGenerations, (from, to): (u64, u64), partitions: i32, keep_old: bool, moved_in: bool) -> Result<(), RebuildError> {
    if !keep_old {
        // Also any documents an earlier move kept in the shared indexes.
        if !moved_in {
            index.remove(from, partitions)?;
        }
        index.remove_from_shared()?;
    }
    index.remove_checkpoints(to, partitions)?;
    index.clear_state()?;
    Ok(())
}

/// Gives up a tenant's rebuild that did not finish: the live workers get
/// the tenant's current indexes back if they were fenced off them, and the
/// revision it was building is deleted. That revision, if any.
pub fn abandon(index: &TenantGenerations, partitions: i32) -> Result<Option<u64>, RebuildError> {
    let current = index.current()?;
    if index.entering {
        // The live writers' next write of the tenant reopens their shards
        // with the placement that puts it back in the shared indexes.
        index.unfence_entering()?;
        info!(tenant = %index.tenant, "the tenant stays in the shared indexes");
    } else if index.fenced(partitions)? {
        index.unfence(current)?;
        info!(tenant = %index.tenant, "the live workers have the tenant's indexes back");
    }
    let target = index.state().map_err(RebuildError::State)?.map(|s| s.generation).filter(|g| *g != current);
    if let Some(g) = target {
        if index.live_on_revision(g)? {
            return Err(RebuildError::TenantCutOver { tenant: index.tenant.clone(), revision: g });
        }
        if index.leaving {
            // What its rebuild wrote into the shared indexes goes.
            index.give_up_leaving(g)?;
            info!(tenant = %index.tenant, "the tenant stays in its own indexes");
        }
        index.remove(g, partitions)?;
    }
    index.clear_state()?;
    Ok(target)
}
