//! The consumer thread's context: rebalances (appliers started at their
//! shards' checkpoints, drained on a revoke), and offset commits.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{counter, gauge};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, RebalanceProtocol};
use rdkafka::error::KafkaResult;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tracing::{error, info, warn};

use super::applier::Partition;
use super::{Shared, WorkerError};
use crate::http::Health;
use crate::index::IndexError;
use crate::metrics as m;

pub(super) struct WorkerContext {
    pub(super) shared: Arc<Shared>,
    pub(super) parts: Mutex<HashMap<i32, Partition>>,
    pub(super) health: Arc<Health>,
    /// First fatal error of an applier.
    pub(super) fatal: Mutex<Option<WorkerError>>,
    /// Partitions that cannot go on (a retention gap), until revoked: their
    /// messages are dropped and they stay paused.
    pub(super) stopped: Mutex<std::collections::HashSet<i32>>,
}

impl ClientContext for WorkerContext {}

impl ConsumerContext for WorkerContext {
    /// rust-rdkafka's rebalance, with the assigned partitions checked
    /// against the partition count the index was built for first.
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let cooperative = matches!(consumer.rebalance_protocol(), RebalanceProtocol::Cooperative);
        let outcome = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                if let Some(p) = tpl.elements().iter().map(|e| e.partition()).find(|&p| p >= self.shared.log_partitions) {
                    let now = self.shared.cfg.kafka.topic_partitions().ok().flatten().unwrap_or(p + 1);
                    let e = IndexError::partitions_changed(self.shared.log_partitions, now);
                    error!(error = %e, "refusing the assignment");
                    self.fatal.lock().expect("fatal lock").get_or_insert(WorkerError::Index(e));
                }
                self.start_at_checkpoints(consumer, tpl);
                let rebalance = Rebalance::Assign(tpl);
                self.pre_rebalance(consumer, &rebalance);
                let r = if cooperative { consumer.incremental_assign(tpl) } else { consumer.assign(tpl) };
                self.post_rebalance(consumer, &rebalance);
                r
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let rebalance = Rebalance::Revoke(tpl);
                self.pre_rebalance(consumer, &rebalance);
                let r = if cooperative { consumer.incremental_unassign(tpl) } else { consumer.unassign() };
                self.post_rebalance(consumer, &rebalance);
                r
            }
            other => {
                // As rust-rdkafka does: give the assignment up.
                let rebalance = Rebalance::Error(rdkafka::error::KafkaError::Rebalance(other.into()));
                self.pre_rebalance(consumer, &rebalance);
                let r = if cooperative { consumer.incremental_unassign(tpl) } else { consumer.unassign() };
                self.post_rebalance(consumer, &rebalance);
                r
            }
        };
        if let Err(e) = outcome {
            error!(error = %e, "applying the rebalance failed");
        }
    }

    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                counter!(m::REBALANCES_TOTAL, "kind" => "revoke").increment(1);
                let revoked: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                info!(partitions = ?revoked, "partitions revoked, draining");
                let mut parts = self.parts.lock().expect("parts lock");
                let drained = drain(&mut parts, &revoked, self);
                drop(parts);
                self.shared.seeks.lock().expect("seeks lock").retain(|p, _| !revoked.contains(p));
                self.shared.assigned_at.lock().expect("assigned_at lock").retain(|p, _| !revoked.contains(p));
                let mut stopped = self.stopped.lock().expect("stopped lock");
                for p in &revoked {
                    if stopped.remove(p) {
                        gauge!(m::PARTITION_STOPPED, "partition" => p.to_string()).set(0.0);
                        self.health.recovered();
                    }
                }
                drop(stopped);
                commit(consumer, &self.shared.cfg.kafka.topic, &drained, CommitMode::Sync);
                self.health.ready.store(false, Ordering::SeqCst);
            }
            Rebalance::Assign(tpl) => {
                counter!(m::REBALANCES_TOTAL, "kind" => "assign").increment(1);
                gauge!(m::ASSIGNED_PARTITIONS).set(tpl.count() as f64);
                let assigned: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                info!(partitions = ?assigned, "partitions assigned");
            }
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            // Every assigned partition gets its applier now, so that each
            // positions its partition at its shard's checkpoint even when
            // the group's offset is already at the end (an index restored
            // from an older copy catches up with nothing new produced).
            let committed = group_offsets(consumer, tpl);
            let mut parts = self.parts.lock().expect("parts lock");
            for e in tpl.elements() {
                let p = e.partition();
                let floor = committed.get(&p).copied().unwrap_or(-1);
                parts.entry(p).or_insert_with(|| Partition::spawn(p, self.shared.clone(), floor));
            }
            drop(parts);
            // librdkafka may keep a partition paused across a revoke and a
            // new assignment (its maintainers document it so), while its
            // queue state here was dropped with the revoke (a partition's
            // state is created by its first message): nothing would resume
            // it. A partition assigned afresh starts consuming.
            if tpl.count() > 0 {
                if let Err(e) = consumer.resume(tpl) {
                    warn!(error = %e, "resuming newly assigned partitions failed");
                }
            }
            self.health.ready.store(true, Ordering::SeqCst);
        }
    }

    /// A commit counts only once the broker has confirmed it: an offset whose
    /// commit failed (for example refused by a coordinator that restarted)
    /// is sent again at the next interval, even if nothing new arrives.
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(e) = &result {
            warn!(error = %e, "offset commit failed (retried at the next interval)");
            return;
        }
        let mut parts = self.parts.lock().expect("parts lock");
        for e in offsets.elements() {
            match (e.error(), e.offset()) {
                (Ok(()), Offset::Offset(o)) => {
                    if let Some(part) = parts.get_mut(&e.partition()) {
                        part.committed = part.committed.max(o);
                    }
                }
                (Err(err), _) => warn!(partition = e.partition(), error = %err, "offset commit of a partition failed (retried at the next interval)"),
                _ => {}
            }
        }
    }
}

impl WorkerContext {
    /// Starts each assigned partition at its shard's checkpoint (the index
    /// decides where to resume), or at the beginning when the shard has
    /// none. Set in the assignment itself, so that the client never starts
    /// from the group's offset first: a seek right after an assignment can
    /// be overtaken by the client's own start. When the checkpoints cannot
    /// be read, the group's offset stays and each applier seeks instead.
    fn start_at_checkpoints(&self, consumer: &BaseConsumer<Self>, tpl: &mut TopicPartitionList) {
        let assigned: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
        let checkpoints = match self.shared.backend.checkpoints(&assigned) {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "reading the shards' checkpoints failed: each applier positions its partition once its shard is open");
                return;
            }
        };
        let topic = &self.shared.cfg.kafka.topic;
        let mut at = self.shared.assigned_at.lock().expect("assigned_at lock");
        for p in assigned {
            let offset = checkpoints.get(&p).map_or(Offset::Beginning, |c| Offset::Offset(c.offset as i64));
            if tpl.set_partition_offset(topic, p, offset).is_ok() {
                let marks = consumer.fetch_watermarks(topic, p, Duration::from_secs(5)).ok();
                at.insert(p, (offset, marks));
            }
        }
    }
}

/// The group's committed offset of each partition of `tpl` (left out: none,
/// or the request failed, which is logged: the floor is then -1).
fn group_offsets(consumer: &BaseConsumer<WorkerContext>, tpl: &TopicPartitionList) -> HashMap<i32, i64> {
    match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
        Ok(c) => c
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((e.partition(), o)),
                _ => None,
            })
            .collect(),
        Err(e) => {
            warn!(error = %e, "reading the group's committed offsets failed: a restored index may move them back");
            HashMap::new()
        }
    }
}

/// Stops the appliers of `partitions`, waits for them (at most the
/// shutdown timeout), and returns the offsets to commit for them: only what
/// is durable. An applier still busy at the deadline (a long fan-out) is left
/// behind: its uncommitted work is discarded with the process, or fenced by
/// the shard's writer lock, and the next owner redoes that command.
pub(super) fn drain(parts: &mut HashMap<i32, Partition>, partitions: &[i32], ctx: &WorkerContext) -> Vec<(i32, i64)> {
    for p in partitions {
        if let Some(part) = parts.get(p) {
            part.stop.store(true, Ordering::SeqCst);
        }
    }
    let deadline = Instant::now() + ctx.shared.cfg.shutdown_timeout;
    let mut out = Vec::new();
    for p in partitions {
        if let Some(mut part) = parts.remove(p) {
            while !part.finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let next = if part.finished() {
                let (result, next) = part.join();
                match result {
                    Ok(()) => {}
                    Err(e @ WorkerError::Gap { .. }) => {
                        error!(partition = p, error = %e, "partition stopped; the worker goes on with its other partitions");
                        gauge!(m::PARTITION_STOPPED, "partition" => p.to_string()).set(1.0);
                        if ctx.stopped.lock().expect("stopped lock").insert(*p) {
                            ctx.health.degraded_one();
                        }
                    }
                    Err(e) => {
                        error!(partition = p, error = %e, "partition applier failed");
                        ctx.fatal.lock().expect("fatal lock").get_or_insert(e);
                    }
                }
                next
            } else {
                let next = part.next.load(Ordering::SeqCst);
                warn!(
                    partition = p,
                    durable_next = next,
                    timeout_secs = ctx.shared.cfg.shutdown_timeout.as_secs_f64(),
                    "shutdown bound reached: leaving the command in progress to the next owner"
                );
                next
            };
            if next > part.committed {
                out.push((*p, next));
            }
            // The new owner reports this partition from now on.
            gauge!(m::CONSUMER_LAG_SECONDS, "partition" => p.to_string()).set(0.0);
            gauge!(m::PARKED_KEYS, "partition" => p.to_string()).set(0.0);
        }
    }
    out
}

/// Sends a commit of `offsets`; an asynchronous one is confirmed (or not)
/// in [`WorkerContext::commit_callback`].
pub(super) fn commit(consumer: &BaseConsumer<WorkerContext>, topic: &str, offsets: &[(i32, i64)], mode: CommitMode) {
    if offsets.is_empty() {
        return;
    }
    let mut tpl = TopicPartitionList::new();
    for &(p, o) in offsets {
        let _ = tpl.add_partition_offset(topic, p, Offset::Offset(o));
    }
    let label = if matches!(mode, CommitMode::Sync) { "sync" } else { "async" };
    counter!(m::OFFSET_COMMITS_TOTAL, "mode" => label).increment(1);
    if crate::faults::active("kafka.commit").is_some() {
        warn!("offset commit lost: injected fault kafka.commit");
        return;
    }
    if let Err(e) = consumer.commit(&tpl, mode) {
        warn!(error = %e, "offset commit failed");
    }
}
