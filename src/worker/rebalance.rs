//! The consumer thread's context: rebalances (an applier started for each
//! assigned partition, which positions it at its shard's checkpoint;
//! appliers drained on a revoke), and offset commits. Nothing here waits
//! on the network: a callback runs on the consumer thread.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{counter, gauge};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, RebalanceProtocol};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tracing::{debug, error, info, warn};

use super::applier::Partition;
use super::commits::{CommitQueue, FailureRun};
use super::membership::Membership;
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
    /// Whether the membership makes progress (see [`super::membership`]).
    pub(super) membership: Mutex<Membership>,
    /// Where the answers to asynchronous offset commits arrive (set once
    /// the consumer exists; taken before it is dropped).
    pub(super) commits: Mutex<Option<CommitQueue>>,
    /// Failed commits in a row (told once per run, see [`FailureRun`]).
    pub(super) commit_failures: Mutex<FailureRun>,
}

impl ClientContext for WorkerContext {
    /// librdkafka's errors, as rust-rdkafka logs them, but for the end of a
    /// partition: the worker asks for it (`Feed::End`), it is no error.
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        crate::kafka::log_client_error(&error, reason);
    }
}

impl ConsumerContext for WorkerContext {
    /// rust-rdkafka's rebalance, with the assigned partitions checked
    /// against the partition count the index was built for first.
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let cooperative = cooperative(consumer);
        let outcome = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                if let Some(p) = tpl.elements().iter().map(|e| e.partition()).max().filter(|&p| p >= self.shared.log_partitions) {
                    // At least p + 1 partitions now (the exact count is a
                    // metadata request away: not on this thread).
                    let e = IndexError::partitions_changed(self.shared.log_partitions, p + 1);
                    error!(error = %e, "refusing the assignment");
                    self.fatal.lock().expect("fatal lock").get_or_insert(WorkerError::Index(e));
                }
                self.start_where_known(tpl);
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
                // As rust-rdkafka does: give the assignment up, drained and
                // committed as a revoke is, so that no applier keeps its
                // shard locked or is reused unpositioned by the next
                // assignment.
                let given_up: Vec<i32> = match cooperative {
                    true => tpl.elements().iter().map(|e| e.partition()).collect(),
                    false => self.parts.lock().expect("parts lock").keys().copied().collect(),
                };
                let rebalance = Rebalance::Error(rdkafka::error::KafkaError::Rebalance(other.into()));
                self.pre_rebalance(consumer, &rebalance);
                self.give_up(consumer, &given_up);
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
                self.give_up(consumer, &revoked);
            }
            Rebalance::Assign(tpl) => {
                counter!(m::REBALANCES_TOTAL, "kind" => "assign").increment(1);
                let assigned: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                info!(partitions = ?assigned, "partitions assigned");
            }
            Rebalance::Error(e) => warn!(error = %e, "rebalance error: giving the assignment up, drained as a revoke"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            // Every assigned partition gets its applier now, so that each
            // positions its partition at its shard's checkpoint even when
            // the group's offset is already at the end (an index restored
            // from an older copy catches up with nothing new produced).
            let mut parts = self.parts.lock().expect("parts lock");
            for e in tpl.elements() {
                let p = e.partition();
                parts.entry(p).or_insert_with(|| Partition::spawn(p, self.shared.clone()));
            }
            drop(parts);
            let holding = consumer.assignment().map_or(tpl.count(), |a| a.count());
            gauge!(m::ASSIGNED_PARTITIONS).set(holding as f64);
            self.membership.lock().expect("membership lock").assigned(Instant::now(), holding);
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
}

/// Counts a failed commit; logs the first of a run of failures.
fn commit_failed(run: &mut FailureRun, partition: Option<i32>, error: &str) {
    const FIRST: &str = "offset commit failed (sent again at the next interval; until one succeeds, further failures are counted, not logged)";
    counter!(m::OFFSET_COMMIT_FAILURES_TOTAL).increment(1);
    match (run.failed(), partition) {
        (true, Some(p)) => warn!(partition = p, error, "{FIRST}"),
        (true, None) => warn!(error, "{FIRST}"),
        (false, _) => debug!(?partition, error, "offset commit failed again"),
    }
}

impl WorkerContext {
    /// Drains the appliers of `revoked` and commits what they applied
    /// before the partitions are released (a revoke, or an assignment given
    /// up on a rebalance error).
    fn give_up(&self, consumer: &BaseConsumer<Self>, revoked: &[i32]) {
        let mut parts = self.parts.lock().expect("parts lock");
        let drained = drain(&mut parts, revoked, self, self.shared.cfg.shutdown_timeout);
        drop(parts);
        self.shared.seeks.lock().expect("seeks lock").retain(|p, _| !revoked.contains(p));
        let mut stopped = self.stopped.lock().expect("stopped lock");
        for p in revoked {
            if stopped.remove(p) {
                gauge!(m::PARTITION_STOPPED, "partition" => p.to_string()).set(0.0);
                self.health.recovered();
            }
        }
        drop(stopped);
        // The one wait on the network here, as the rebalance
        // protocol means it: the revoked partitions' offsets are
        // committed before they are released (an asynchronous commit
        // landing after the new owner's would move the group back).
        commit(consumer, &self.shared.cfg.kafka.topic, &drained, CommitMode::Sync);
        self.health.ready.store(false, Ordering::SeqCst);
        let holding = consumer.assignment().map_or(0, |a| a.count().saturating_sub(revoked.len()));
        self.membership.lock().expect("membership lock").revoked(Instant::now(), if cooperative(consumer) { holding } else { 0 });
    }

    /// Takes the answers to asynchronous commits that arrived, without
    /// waiting. A commit counts only once the broker has confirmed it: an
    /// offset whose commit failed (for example refused by a coordinator that
    /// restarted) is sent again at the next interval, even if nothing new
    /// arrives.
    pub(super) fn settle_commits(&self) {
        let answers = match self.commits.lock().expect("commits lock").as_mut() {
            Some(q) => q.answers(),
            None => return,
        };
        if answers.is_empty() {
            return;
        }
        let mut parts = self.parts.lock().expect("parts lock");
        let mut run = self.commit_failures.lock().expect("commit failures lock");
        for answer in answers {
            match answer {
                Err(e) => commit_failed(&mut run, None, &e),
                Ok(list) => {
                    let mut all_taken = true;
                    for a in list {
                        match a.error {
                            None => {
                                if let Some(part) = parts.get_mut(&a.partition) {
                                    part.committed = part.committed.max(a.offset);
                                }
                            }
                            Some(err) => {
                                all_taken = false;
                                commit_failed(&mut run, Some(a.partition), &err);
                            }
                        }
                    }
                    if all_taken {
                        if let Some(n) = run.succeeded() {
                            info!(failed_in_a_row = n, "offset commits succeed again");
                        }
                    }
                }
            }
        }
    }

    /// Asynchronous commits not answered yet.
    pub(super) fn commits_in_flight(&self) -> usize {
        self.commits.lock().expect("commits lock").as_ref().map_or(0, CommitQueue::in_flight)
    }
}

impl WorkerContext {
    /// Starts each assigned partition where this process last knew its
    /// shard to resume (no request: see [`super::Shared::known`]), and
    /// records it for the applier.
    fn start_where_known(&self, tpl: &mut TopicPartitionList) {
        let topic = &self.shared.cfg.kafka.topic;
        let known = self.shared.known.lock().expect("known lock");
        let mut at = self.shared.assigned_at.lock().expect("assigned_at lock");
        let assigned: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
        for p in assigned {
            if let Some(offset) = known.get(&p) {
                if tpl.set_partition_offset(topic, p, *offset).is_ok() {
                    at.insert(p, *offset);
                }
            }
        }
    }
}

fn cooperative(consumer: &BaseConsumer<WorkerContext>) -> bool {
    matches!(consumer.rebalance_protocol(), RebalanceProtocol::Cooperative)
}

/// Stops the appliers of `partitions`, waits for them (at most `bound`),
/// and returns the offsets to commit for them: only what
/// is durable. An applier still busy at the deadline (a long fan-out) is left
/// behind: its uncommitted work is discarded with the process, or fenced by
/// the shard's writer lock, and the next owner redoes that command.
pub(super) fn drain(parts: &mut HashMap<i32, Partition>, partitions: &[i32], ctx: &WorkerContext, bound: Duration) -> Vec<(i32, i64, String)> {
    for p in partitions {
        if let Some(part) = parts.get(p) {
            part.stop.store(true, Ordering::SeqCst);
        }
    }
    let deadline = Instant::now() + bound;
    let mut out = Vec::new();
    for p in partitions {
        if let Some(mut part) = parts.remove(p) {
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = crate::retry::poll_until(left, Duration::from_millis(10), || match part.finished() {
                true => crate::retry::Polled::Done(()),
                false => crate::retry::Polled::NotYet(()),
            });
            if part.finished() {
                match part.join() {
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
            } else {
                warn!(partition = p, durable_next = part.next.load(Ordering::SeqCst), timeout_secs = bound.as_secs_f64(), "shutdown bound reached: leaving the command in progress to the next owner");
            }
            if let Some((next, metadata)) = part.next_commit() {
                out.push((*p, next, metadata));
            }
            // Where its shard resumes (its checkpoint's own message), if
            // this process gets the partition back.
            let next = part.next.load(Ordering::SeqCst);
            let mut known = ctx.shared.known.lock().expect("known lock");
            if next > 0 {
                known.insert(*p, Offset::Offset(next - 1));
            } else {
                known.remove(p);
            }
            drop(known);
            ctx.shared.assigned_at.lock().expect("assigned_at lock").remove(p);
            // The new owner reports this partition from now on.
            gauge!(m::CONSUMER_LAG_SECONDS, "partition" => p.to_string()).set(0.0);
            gauge!(m::UNAPPLIED_COMMANDS, "partition" => p.to_string()).set(0.0);
            gauge!(m::PARKED_KEYS, "partition" => p.to_string()).set(0.0);
            gauge!(m::WAITING_COMMANDS, "partition" => p.to_string()).set(0.0);
            gauge!(m::OLDEST_UNFINISHED_SECONDS, "partition" => p.to_string()).set(0.0);
            gauge!(m::PARTITION_BUSY_LANES, "partition" => p.to_string()).set(0.0);
        }
    }
    out
}

/// Sends a commit of `offsets`, each with its metadata (what is applied
/// above it, issue 45); an asynchronous one is confirmed (or not) in
/// [`WorkerContext::settle_commits`].
pub(super) fn commit(consumer: &BaseConsumer<WorkerContext>, topic: &str, offsets: &[(i32, i64, String)], mode: CommitMode) {
    if offsets.is_empty() {
        return;
    }
    let mut tpl = TopicPartitionList::new();
    for (p, o, metadata) in offsets {
        let _ = tpl.add_partition_offset(topic, *p, Offset::Offset(*o));
        if let Some(mut e) = tpl.find_partition(topic, *p) {
            e.set_metadata(metadata.as_str());
        }
    }
    let label = if matches!(mode, CommitMode::Sync) { "sync" } else { "async" };
    counter!(m::OFFSET_COMMITS_TOTAL, "mode" => label).increment(1);
    if crate::faults::active("kafka.commit").is_some() {
        warn!("offset commit lost: injected fault kafka.commit");
        return;
    }
    let sent = match mode {
        CommitMode::Sync => consumer.commit(&tpl, mode),
        CommitMode::Async => match consumer.context().commits.lock().expect("commits lock").as_mut() {
            Some(q) => q.send(consumer, &tpl),
            None => consumer.commit(&tpl, mode),
        },
    };
    if let Err(e) = sent {
        warn!(error = %e, "offset commit failed");
    }
}

#[cfg(test)]
mod tests {
    //! The rebalance callback on the applier rig's appliers
    //! (`applier/tests`): a consumer that reaches no broker, called as
    //! librdkafka calls it.

    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
    use rdkafka::types::RDKafkaRespErr;
    use rdkafka::{ClientConfig, TopicPartitionList};

    use super::WorkerContext;
    use crate::worker::applier::tests::{eventually, Rig};
    use crate::worker::applier::Partition;
    use crate::worker::membership::Membership;

    /// A consumer of `r`'s shared state whose context holds the appliers of
    /// `partitions`, as the consumer thread does after an assignment.
    fn consumer_holding(r: &Rig, partitions: &[i32]) -> BaseConsumer<WorkerContext> {
        let parts = partitions.iter().map(|&p| (p, Partition::spawn(p, r.shared.clone()))).collect::<HashMap<_, _>>();
        let ctx = WorkerContext {
            shared: r.shared.clone(),
            parts: Mutex::new(parts),
            health: r.shared.health.clone(),
            fatal: Mutex::new(None),
            stopped: Mutex::default(),
            membership: Mutex::new(Membership::joining(Instant::now(), Duration::from_secs(30))),
            commits: Mutex::new(None),
            commit_failures: Mutex::default(),
        };
        ClientConfig::new().set("bootstrap.servers", "127.0.0.1:9").set("group.id", "g").create_with_context(ctx).unwrap()
    }

    /// A rebalance error is given up as a revoke is: the partition's applier
    /// is stopped and removed, its shard let go, so that a later assignment
    /// starts an applier that positions the partition (and the partition's new
    /// owner can open the shard). Left running, it kept the shard locked and
    /// was reused unpositioned by the next assignment.
    #[test]
    fn a_rebalance_error_drains_the_appliers_as_a_revoke_does() {
        let r = Rig::new(|c| c.shutdown_timeout = Duration::from_secs(10));
        r.produce_files(0..5);
        let consumer = consumer_holding(&r, &[0]);
        // The applier has opened its shard and asked to be positioned.
        eventually("the applier asks its position", || r.shared.seeks.lock().unwrap().contains_key(&0));
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition("t", 0);
        consumer.context().rebalance(&consumer, RDKafkaRespErr::RD_KAFKA_RESP_ERR__FAIL, &mut tpl);
        let left: Vec<i32> = consumer.context().parts.lock().unwrap().keys().copied().collect();
        assert!(left.is_empty(), "appliers left running after the rebalance error: {left:?}");
        assert!(r.shared.seeks.lock().unwrap().is_empty(), "a seek of a given-up partition left behind");
        assert!(consumer.context().fatal.lock().unwrap().is_none(), "the drain failed: {:?}", consumer.context().fatal.lock().unwrap());
        // The shard is free: a new applier opens it and applies the log.
        let run = r.start();
        let end = r.end();
        run.wait_next(end);
        assert_eq!(run.stop(), end);
        assert_eq!(r.files().len(), 5);
    }

    /// A seek asked by an applier that no longer holds the partition (one
    /// left behind by a drain, the partition assigned back meanwhile) is
    /// dropped, never served to the partition's new applier; the new
    /// applier's own seek waits until the partition can be sought.
    #[test]
    fn a_seek_asked_by_an_applier_that_no_longer_holds_the_partition_is_dropped() {
        let r = Rig::new(|_| {});
        let consumer = consumer_holding(&r, &[0]);
        eventually("the applier asks its position", || r.shared.seeks.lock().unwrap().contains_key(&0));
        let holder = consumer.context().parts.lock().unwrap()[&0].id;
        let own = r.shared.seeks.lock().unwrap()[&0];
        assert_eq!(own.0, holder);
        // Not assigned here: the holder's seek cannot be served yet, and stays.
        crate::worker::seek_as_asked(&consumer, "t");
        assert_eq!(r.shared.seeks.lock().unwrap().get(&0), Some(&own), "the holder's seek was dropped");
        r.shared.seeks.lock().unwrap().insert(0, (holder + 1000, rdkafka::Offset::Offset(5)));
        crate::worker::seek_as_asked(&consumer, "t");
        assert_eq!(r.shared.seeks.lock().unwrap().get(&0), None, "another applier's seek was kept for the holder");
    }
}
