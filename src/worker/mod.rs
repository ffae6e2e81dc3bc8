//! The worker (`denorm run`): a consumer-group member that applies commands
//! in per-partition log order (hence per-key order), commits Kafka offsets
//! only past commands whose effects are durable in the index, and drains and
//! commits revoked partitions before a rebalance releases them.
//!
//! Threads: one consumer thread polls Kafka, dispatches each message to its
//! partition's applier over a bounded queue (pausing the partition when the
//! queue is full) and commits offsets; one applier thread per partition owns
//! that partition's shard writer (see [`partition`]).

pub mod admit;
mod applier;
mod commits;
mod config;
mod fetch_stall;
mod membership;
mod outbox;
mod probe;
mod rebalance;
pub mod replay;
pub mod settings;
mod stats;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{debug, error, info, trace, warn};

use crate::codec::Codec;
use crate::dlq::writer::DeadLetterWriter;
use crate::http::Health;
use crate::index::{Backend, IndexError};
use crate::kafka::KafkaConfig;
use crate::metrics as m;
use applier::{Feed, Partition, Record, Refused};
pub use config::{defaults, OnAbort, WorkerConfig};
use membership::{Membership, Verdict};
use outbox::Outbox;
use probe::{BrokerProbe, LogProbe};
use rebalance::{commit, drain, WorkerContext};
pub use replay::{letters_written, KeySample, LettersWritten, Mode, Replay, ReplayOf};
pub use stats::Stats;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A setting out of range (see [`WorkerConfig::validate`]).
    #[error("invalid worker configuration: {0}")]
    Config(String),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(transparent)]
    Index(IndexError),
    #[error("a partition applier panicked")]
    Panicked,
    #[error("dead-letter topic {0} does not exist (`denorm run` creates it)")]
    MissingDlq(String),
    #[error(transparent)]
    Setup(#[from] crate::kafka::KafkaSetupError),
    /// One partition cannot go on (the rest of the worker does).
    #[error("partition {partition} stopped: {detail}")]
    Gap { partition: i32, detail: String },
    /// The broker delivered a record batch whose CRC does not match its
    /// bytes (`check.crcs`): the worker stops before reading past it.
    #[error("damaged record batch from the broker: {0}")]
    Corrupt(String),
    /// The schema registry could not resolve a schema id (retried while
    /// the worker runs; this is what is left at its end).
    #[error("schema registry: {0}")]
    Registry(String),
}

/// What every applier shares.
pub(crate) struct Shared {
    cfg: WorkerConfig,
    backend: Arc<dyn Backend>,
    codec: Codec,
    stats: Arc<Stats>,
    outbox: Box<dyn Outbox>,
    health: Arc<Health>,
    /// Where appliers want their partition positioned (their shard's
    /// checkpoint), with the asking applier's [`Partition::id`]; the
    /// consumer thread seeks, then feeds [`Feed::Positioned`], for the
    /// applier that holds the partition now only.
    seeks: Mutex<HashMap<i32, (u64, Offset)>>,
    /// Where each partition's shard resumes, as last known to this process
    /// (read once before joining the group, then left by each applier that
    /// stops): an assignment starts its partitions there, without a request
    /// on the consumer thread. Stale when another worker moved the shard on
    /// meanwhile: its applier then seeks.
    known: Mutex<HashMap<i32, Offset>>,
    /// Where the assignment started each partition (from `known`): an
    /// applier whose shard's checkpoint is there needs no seek.
    assigned_at: Mutex<HashMap<i32, Offset>>,
    /// The broker's answers outside the group protocol (watermarks, the
    /// group's offsets), asked from the appliers' threads.
    probe: Box<dyn LogProbe>,
    /// The topic's partition count the index was built for.
    log_partitions: i32,
    /// Take-overs of this process waiting for a partition to be applied up
    /// to an offset (partition, offset): that partition's applier commits
    /// as soon as it passes it, instead of at its batch's end.
    awaited: Mutex<Vec<(i32, i64)>>,
    /// How many entries `awaited` has (read for every message, without the lock).
    awaiting: std::sync::atomic::AtomicUsize,
    /// The fan-outs in lanes of every partition, against
    /// `--max-lane-fan-outs`.
    lane_fan_outs: applier::LaneFanOuts,
}

/// The worker's consumer settings (also the raw consumer's of `denorm
/// bench`): offsets stored and committed by the worker only, from the
/// earliest offset, prefetch bounded to `fetch_buffer_kb`, then `extra`
/// settings; the pass-through options come last, so they win.
pub fn consumer_config(kafka: &KafkaConfig, group: &str, fetch_buffer_kb: usize, extra: &[(&str, &str)]) -> rdkafka::ClientConfig {
    let mut cc = kafka.consumer_config();
    cc.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        // A broker answers a fetch when data arrives; tansu 0.6 waits the
        // whole fetch.wait.max.ms (librdkafka's default 500 ms) instead.
        .set("fetch.wait.max.ms", "50")
        .set("queued.max.messages.kbytes", fetch_buffer_kb.max(1).to_string());
    for (k, v) in extra {
        cc.set(*k, *v);
    }
    // The pass-through options again, last, so that they win over these.
    for (k, v) in &kafka.options {
        cc.set(k, v);
    }
    kafka.poll_interval_follows_session(&mut cc);
    cc
}

/// Runs a worker until `shutdown` is set, then drains, commits and leaves
/// the group. Blocking.
pub fn run(cfg: WorkerConfig, backend: Arc<dyn Backend>, shutdown: Arc<AtomicBool>, health: Arc<Health>, stats: Arc<Stats>) -> Result<(), WorkerError> {
    cfg.validate()?;
    let topic = cfg.kafka.topic.clone();
    let session_ms = cfg.session_timeout.as_millis().to_string();
    // The end of a partition is reported to its applier (`Feed::End`).
    let mut membership = vec![("session.timeout.ms", session_ms.as_str()), ("enable.partition.eof", "true")];
    if let Some(id) = &cfg.instance_id {
        membership.push(("group.instance.id", id.as_str()));
    }
    let cc = consumer_config(&cfg.kafka, &cfg.group, cfg.fetch_buffer_kb, &membership);
    let commit_interval = cfg.commit_interval;
    let lag_interval = cfg.lag_interval;
    let dlq_cfg = KafkaConfig { topic: cfg.dlq_topic.clone(), ..cfg.kafka.clone() };
    let dlq_partitions = dlq_cfg.topic_partitions()?.ok_or_else(|| WorkerError::MissingDlq(cfg.dlq_topic.clone()))?;
    let outbox: Box<dyn Outbox> = match cfg.mode.writes_to_kafka() {
        true => Box::new(DeadLetterWriter::new(&cfg.kafka, &cfg.dlq_topic, dlq_partitions, cfg.max_message_bytes)?),
        false => Box::new(outbox::Withheld::new(&cfg.dlq_topic)),
    };
    // Appliers resolve schema ids on this (blocking-pool) thread's runtime.
    let codec = match &cfg.registry {
        Some(r) => Codec::new().with_registry(r.clone(), tokio::runtime::Handle::current()),
        None => Codec::new(),
    };
    let codec = match cfg.model {
        Some(d) => codec.with_model(d),
        None => codec,
    };
    // The index must be built from this topic as it is now.
    let log_partitions = cfg.kafka.topic_partitions()?.ok_or_else(|| crate::kafka::KafkaSetupError::MissingTopic(topic.clone()))?;
    backend.bind_log(log_partitions).map_err(WorkerError::Index)?;
    // Where the shards resume, read here (before the consumer loop) so that
    // assignments start there without a request in the rebalance callback:
    // a seek right after an assignment costs a second fetch (seconds on a
    // deep partition of tansu).
    let all: Vec<i32> = (0..log_partitions).collect();
    let known: HashMap<i32, Offset> = match backend.checkpoints(&all) {
        Ok(c) => all.iter().map(|p| (*p, applier::target_of(c.get(p).copied()))).collect(),
        Err(e) => {
            warn!(error = %e, "reading the shards' checkpoints failed: each applier positions its partition once its shard is open");
            HashMap::new()
        }
    };
    let probe = Arc::new(BrokerProbe::new(&cfg.kafka, &cfg.group, log_partitions)?);
    probe.warm_up();
    let patience = cfg.session_timeout;
    let shared = Arc::new(Shared {
        cfg,
        backend,
        codec,
        stats,
        outbox,
        health: health.clone(),
        seeks: Mutex::new(HashMap::new()),
        known: Mutex::new(known),
        assigned_at: Mutex::new(HashMap::new()),
        probe: Box::new(probe),
        log_partitions,
        awaited: Mutex::new(Vec::new()),
        awaiting: Default::default(),
        lane_fan_outs: Default::default(),
    });
    let ctx = WorkerContext {
        shared: shared.clone(),
        parts: Mutex::new(HashMap::new()),
        health: health.clone(),
        fatal: Mutex::new(None),
        stopped: Mutex::new(Default::default()),
        membership: Mutex::new(Membership::joining(Instant::now(), patience)),
        commits: Mutex::new(None),
        commit_failures: Mutex::new(Default::default()),
    };
    let consumer: BaseConsumer<WorkerContext> = cc.create_with_context(ctx)?;
    *consumer.context().commits.lock().expect("commits lock") = Some(commits::CommitQueue::new(&consumer));
    consumer.subscribe(&[&topic])?;
    info!(topic = %topic, group = %shared.cfg.group, "worker started");
    let watch = GroupWatch::start(shared.clone(), lag_interval);

    let mut last_commit = Instant::now();
    let mut last_lag = Instant::now();
    let mut stalls = fetch_stall::FetchStalls::new(shared.cfg.fetch_stall_after);
    // The consumer's last error: librdkafka names no partition in it, the
    // stall detector does (`fetch_stall.rs`).
    let mut last_error: Option<String> = None;
    let mut last_settle = Instant::now();
    while !shutdown.load(Ordering::SeqCst) {
        health.beat();
        // Short, so that progress an applier publishes is committed within
        // a few milliseconds (`commit_interval`) even with nothing to read.
        let polled = consumer.poll(Duration::from_millis(5));
        let ctx = consumer.context();
        let msg = match polled {
            Some(Ok(msg)) => Some((msg.partition(), Feed::Message(Record::of(&msg)))),
            // Read to the end: where the consumer stands (a local call),
            // past transaction markers, which deliver no message.
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => consumer.position().ok().and_then(|t| t.find_partition(&topic, p).map(|e| e.offset())).and_then(|o| match o {
                rdkafka::Offset::Offset(o) => Some((p, Feed::End(o))),
                _ => None,
            }),
            Some(Err(e)) if crate::kafka::is_damaged(&e) => {
                // librdkafka skips the damaged batch and reads on: going on
                // would apply the partition with a hole in it.
                error!(error = %e, "a record batch failed its CRC check: stopping without reading past it (the broker served damaged bytes)");
                ctx.fatal.lock().expect("fatal lock").get_or_insert(WorkerError::Corrupt(e.to_string()));
                break;
            }
            Some(Err(e)) => {
                warn!(error = %e, "kafka consumer error");
                last_error = Some(e.to_string());
                watch.troubled.store(true, Ordering::SeqCst);
                None
            }
            None => None,
        };
        if route(&consumer, msg) {
            // An applier only ends by itself on a fatal error.
            let mut parts = ctx.parts.lock().expect("parts lock");
            let dead: Vec<i32> = parts.iter().filter(|(_, p)| p.finished()).map(|(k, _)| *k).collect();
            let offsets = drain(&mut parts, &dead, ctx, ctx.shared.cfg.shutdown_timeout);
            drop(parts);
            commit(&consumer, &topic, &offsets, CommitMode::Async);
            pause_stopped(&consumer, &topic);
        }
        seek_as_asked(&consumer, &topic);
        // Not for every message: answers come at most once per commit.
        if last_settle.elapsed() >= Duration::from_millis(5) {
            last_settle = Instant::now();
            ctx.settle_commits();
        }
        if ctx.fatal.lock().expect("fatal lock").is_some() {
            break;
        }
        // One periodic commit in flight at a time: until it is answered,
        // the group's offset is not known to have moved, and the same
        // offsets would be sent again.
        if last_commit.elapsed() >= commit_interval && ctx.commits_in_flight() == 0 {
            last_commit = Instant::now();
            // `committed` moves when the broker confirms (commit_callback).
            let offsets: Vec<(i32, i64, String)> = {
                let mut parts = ctx.parts.lock().expect("parts lock");
                ctx.shared.stats.positions.lock().expect("positions lock").extend(parts.iter().map(|(p, part)| (*p, part.next.load(Ordering::SeqCst))));
                parts.iter_mut().filter_map(|(p, part)| part.next_commit().map(|(next, metadata)| (*p, next, metadata))).collect()
            };
            commit(&consumer, &topic, &offsets, CommitMode::Async);
        }
        if last_lag.elapsed() >= lag_interval {
            last_lag = Instant::now();
            let ends = watch.ends.lock().expect("ends lock").clone();
            update_lag(&consumer, &topic, &mut stalls, &ends, last_error.as_deref());
            watch_membership(&consumer, &topic, &watch);
        }
    }
    let stopping = Instant::now();
    let grace = shared.cfg.shutdown_grace;
    watch.stop();

    info!(grace_secs = grace.as_secs_f64(), "shutting down: draining partitions");
    let ctx = consumer.context();
    let mut parts = ctx.parts.lock().expect("parts lock");
    let all: Vec<i32> = parts.keys().copied().collect();
    let offsets = drain(&mut parts, &all, ctx, shared.cfg.shutdown_timeout.min(grace));
    drop(parts);
    commit(&consumer, &topic, &offsets, CommitMode::Async);
    let fatal = ctx.fatal.lock().expect("fatal lock").take();
    leave(consumer, stopping + grace);
    info!("worker stopped");
    match fatal {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Waits for the commits in flight to be answered, then leaves the group
/// (the revoke of a close drains nothing more: the appliers are gone),
/// until `deadline`. A broker that does not answer by then is given up on:
/// what was not committed is replayed by the next owner from the shard's
/// checkpoint, and the group sees this member go at its session timeout.
fn leave(consumer: BaseConsumer<WorkerContext>, deadline: Instant) {
    let ctx = consumer.context();
    loop {
        ctx.settle_commits();
        if ctx.commits_in_flight() == 0 || Instant::now() >= deadline {
            break;
        }
        consumer.poll(Duration::from_millis(20));
    }
    let unanswered = ctx.commits_in_flight();
    // The queue goes before the client it belongs to.
    drop(ctx.commits.lock().expect("commits lock").take());
    let closed = match consumer.close_queue() {
        Ok(()) => {
            while !consumer.closed() && Instant::now() < deadline {
                consumer.poll(Duration::from_millis(50));
            }
            consumer.closed()
        }
        Err(e) => {
            warn!(error = %e, "leaving the group failed");
            false
        }
    };
    if closed {
        if unanswered > 0 {
            warn!(unanswered_commits = unanswered, "the last offset commit was not answered within the shutdown grace (the next owner replays what it covered from the shards' checkpoints)");
        }
        drop(consumer);
        return;
    }
    warn!(
        unanswered_commits = unanswered,
        "shutdown grace reached with the broker not answering: exiting without leaving the group (the next owner replays what was not committed from the shards' checkpoints)"
    );
    // Dropping the client would wait for the broker again.
    std::mem::forget(consumer);
}

/// Acts on the membership's verdict (see [`membership`]): a warning for a
/// rebalance that does not complete, and a new join for a member left
/// holding nothing while the group has lag.
fn watch_membership(consumer: &BaseConsumer<WorkerContext>, topic: &str, watch: &GroupWatch) {
    let ctx = consumer.context();
    let now = Instant::now();
    let mut membership = ctx.membership.lock().expect("membership lock");
    gauge!(m::REBALANCE_SECONDS).set(membership.rebalance_age(now).as_secs_f64());
    watch.wanted.store(membership.idle_for(now).is_some(), Ordering::SeqCst);
    let lag = watch.lag.load(Ordering::SeqCst);
    let verdict = membership.check(now, (lag >= 0).then_some(lag));
    drop(membership);
    match verdict {
        Verdict::Fine => {}
        Verdict::RebalanceStuck(age) => warn!(
            secs = age.as_secs(),
            "a rebalance of the group has not completed: this worker holds no partition meanwhile (the coordinator may be waiting for a member that died; see docs/reliability.md)"
        ),
        Verdict::Rejoin { idle, lag } => {
            warn!(idle_secs = idle.as_secs(), group_lag = lag, "holding no partition past the session timeout while the group has lag: leaving the group and joining it again");
            counter!(m::GROUP_REJOINS_TOTAL).increment(1);
            watch.lag.store(-1, Ordering::SeqCst);
            consumer.unsubscribe();
            if let Err(e) = consumer.subscribe(&[topic]) {
                warn!(error = %e, "joining the group again failed");
            }
        }
    }
}

/// A thread that reads the group's lag while the consumer loop wants it
/// (this member holds no partition): a request the consumer thread must
/// not wait for.
struct GroupWatch {
    wanted: Arc<AtomicBool>,
    /// The group's lag as last read; -1: not known.
    lag: Arc<AtomicI64>,
    /// Set by the consumer loop at a consumer error: the partitions' ends
    /// are then read from the broker (`ends`), since a partition whose
    /// fetch fails learns its end from no fetch response.
    troubled: Arc<AtomicBool>,
    /// The partitions' ends as last read while troubled.
    ends: Arc<Mutex<HashMap<i32, i64>>>,
    stop: Arc<AtomicBool>,
}

impl GroupWatch {
    fn start(shared: Arc<Shared>, every: Duration) -> Self {
        let (wanted, lag, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicI64::new(-1)), Arc::new(AtomicBool::new(false)));
        let (troubled, ends) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(HashMap::new())));
        let (w, l, s, t, e) = (wanted.clone(), lag.clone(), stop.clone(), troubled.clone(), ends.clone());
        std::thread::Builder::new()
            .name("denorm-group-watch".into())
            .spawn(move || {
                let tick = Duration::from_millis(100).min(every);
                let (mut last, mut last_verified, mut last_ends): (Option<Instant>, Option<Instant>, Option<Instant>) = (None, None, None);
                let (mine, mut mismatch) = (settings::ApplySettings::of(&shared.cfg), Vec::new());
                while !s.load(Ordering::SeqCst) {
                    if last_verified.is_none_or(|t| t.elapsed() >= every) {
                        last_verified = Some(Instant::now());
                        export_verified(shared.backend.as_ref());
                        settings::check(shared.backend.as_ref(), &mine, &mut mismatch);
                    }
                    if last_ends.is_none_or(|t| t.elapsed() >= every) && t.swap(false, Ordering::SeqCst) {
                        last_ends = Some(Instant::now());
                        let read: Vec<(i32, i64)> = (0..shared.log_partitions).filter_map(|p| shared.probe.watermarks(p).map(|(_, high)| (p, high))).collect();
                        e.lock().expect("ends lock").extend(read);
                    }
                    if !w.load(Ordering::SeqCst) {
                        l.store(-1, Ordering::SeqCst);
                        last = None;
                    } else if last.is_none_or(|t| t.elapsed() >= every) {
                        last = Some(Instant::now());
                        l.store(shared.probe.group_lag().unwrap_or(-1), Ordering::SeqCst);
                    }
                    std::thread::sleep(tick);
                }
            })
            .expect("spawn the group watch");
        GroupWatch { wanted, lag, troubled, ends, stop }
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Exports the record of the index's last `denorm verify`
/// ([`Backend::verified`]): its process is short-lived and not scraped.
fn export_verified(backend: &dyn Backend) {
    for (scope, partial) in [("whole", false), ("partial", true)] {
        match backend.verified_of(partial) {
            Ok(Some(v)) => {
                gauge!(m::VERIFY_LAST_RUN, "scope" => scope).set(v.finished_at);
                gauge!(m::VERIFY_CHECKED, "scope" => scope).set(v.checked as f64);
                gauge!(m::VERIFY_DIFFERENCES, "scope" => scope).set(v.differences as f64);
                gauge!(m::VERIFY_SECONDS, "scope" => scope).set(v.seconds);
                // 0: verified, never clean (an alert on its age fires).
                gauge!(m::VERIFY_LAST_CLEAN, "scope" => scope).set(v.last_clean_at.unwrap_or(0.0));
                gauge!(m::VERIFY_NOT_COMPARED, "scope" => scope, "reason" => "written_since").set(v.written_since as f64);
                gauge!(m::VERIFY_NOT_COMPARED, "scope" => scope, "reason" => "unsettled").set(v.unsettled as f64);
            }
            Ok(None) => {}
            Err(error) => debug!(%error, scope, "reading the record of the last verify"),
        }
    }
}

/// Keeps the stopped partitions paused (their messages are dropped).
fn pause_stopped(consumer: &BaseConsumer<WorkerContext>, topic: &str) {
    let mut tpl = TopicPartitionList::new();
    for p in consumer.context().stopped.lock().expect("stopped lock").iter() {
        tpl.add_partition(topic, *p);
    }
    if tpl.count() > 0 {
        if let Err(e) = consumer.pause(&tpl) {
            warn!(error = %e, "pausing stopped partitions failed");
        }
    }
}

/// Positions the partitions whose appliers asked for it (at their shard's
/// checkpoint), drops what was fetched for them from the old position, and
/// tells each applier. A partition whose fetcher has not started yet
/// (right after the assignment) refuses the seek: it is tried again at the
/// next turn of the loop.
fn seek_as_asked(consumer: &BaseConsumer<WorkerContext>, topic: &str) {
    let ctx = consumer.context();
    let asked: Vec<(i32, u64, Offset)> = ctx.shared.seeks.lock().expect("seeks lock").iter().map(|(p, (id, o))| (*p, *id, *o)).collect();
    for (p, id, offset) in asked {
        let mut parts = ctx.parts.lock().expect("parts lock");
        let Some(part) = parts.get_mut(&p).filter(|part| part.id == id) else {
            // Revoked meanwhile, or asked by an applier left behind by a
            // drain: the partition's applier now did not ask for it.
            debug!(partition = p, ?offset, "a seek of an applier that no longer holds the partition: dropped");
            let mut seeks = ctx.shared.seeks.lock().expect("seeks lock");
            if seeks.get(&p).is_some_and(|(asker, _)| *asker == id) {
                seeks.remove(&p);
            }
            continue;
        };
        match consumer.seek(topic, p, offset, Duration::from_secs(1)) {
            Ok(()) => {
                debug!(partition = p, ?offset, "partition positioned at its shard's checkpoint");
                // Messages routed before the seek are stale: dropped here,
                // or by the applier up to the marker.
                part.pending.clear();
                part.queue.positioned(offset);
                let mut seeks = ctx.shared.seeks.lock().expect("seeks lock");
                if seeks.get(&p) == Some(&(id, offset)) {
                    seeks.remove(&p);
                }
            }
            Err(e) => debug!(partition = p, error = %e, "seek not possible yet"),
        }
    }
}

/// One pass under one lock: queues the polled message behind its
/// partition's pending messages, moves pending messages into the appliers'
/// queues while they hold less than `queue_bytes`, pauses partitions whose
/// queue is full and resumes them once it is down to half, counting the
/// time each stays paused so. Returns whether an applier has ended (only a
/// fatal error ends one).
fn route(consumer: &BaseConsumer<WorkerContext>, msg: Option<(i32, Feed)>) -> bool {
    let ctx = consumer.context();
    let mut parts = ctx.parts.lock().expect("parts lock");
    if let Some((p, msg)) = msg.filter(|(p, _)| !ctx.stopped.lock().expect("stopped lock").contains(p)) {
        let part = parts.entry(p).or_insert_with(|| Partition::spawn(p, ctx.shared.clone()));
        if let (true, true, Feed::Message(m)) = (part.paused.is_some(), part.pending.is_empty(), &msg) {
            trace!(partition = p, offset = m.offset(), "message of a paused partition");
        }
        part.pending.push_back(msg);
    }
    let mut ended = false;
    for (p, part) in parts.iter_mut() {
        while let Some(feed) = part.pending.pop_front() {
            match part.queue.offer(feed) {
                Ok(()) => {}
                // Full, or the applier has ended (the partition is drained
                // below): held.
                Err(Refused::Full(feed) | Refused::Ended(feed)) => {
                    part.pending.push_front(feed);
                    break;
                }
            }
        }
        // A replay's partition applied up to where it stops (`until`)
        // reads nothing more: its messages would be dropped.
        let done = ctx.shared.cfg.mode.until(*p).is_some_and(|last| last < 0 || part.next.load(Ordering::SeqCst) > last);
        let full = !part.pending.is_empty() || part.paused.is_some() && !part.queue.below_half();
        let want_paused = done || full;
        if want_paused != part.paused.is_some() {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&ctx.shared.cfg.kafka.topic, *p);
            let done = if want_paused { consumer.pause(&tpl) } else { consumer.resume(&tpl) };
            if done.is_ok() {
                let queued = part.queue.queued().bytes();
                if want_paused {
                    part.paused = Some(Instant::now());
                    counter!(m::PARTITION_PAUSES_TOTAL).increment(1);
                    debug!(partition = p, queued, pending = part.pending.len(), "partition paused: its queue is full");
                } else {
                    // The time the consumer thread was held back by the
                    // applier (the queue's bound, issue 45).
                    let held = part.paused.take().map_or(0.0, |since| since.elapsed().as_secs_f64());
                    histogram!(m::PARTITION_PAUSED_SECONDS).record(held);
                    debug!(partition = p, queued, held, "partition resumed");
                }
            }
        }
        ended |= part.finished();
    }
    ended
}

/// Refreshes `denorm_consumer_lag_messages`, and what waits behind the
/// command in progress (`denorm_partition_waiting_commands`,
/// `denorm_partition_oldest_unfinished_seconds`), for every assigned
/// partition, from local state only: it runs on the consumer loop, and a request to a
/// busy broker here (watermarks, committed offsets) would stop the loop
/// from feeding every partition (seen on tansu: 12 watermark requests took
/// longer than the refresh interval, and the worker routed one message per
/// refresh).
fn update_lag(consumer: &BaseConsumer<WorkerContext>, topic: &str, stalls: &mut fetch_stall::FetchStalls, ends: &HashMap<i32, i64>, last_error: Option<&str>) {
    let Ok(assignment) = consumer.assignment() else { return };
    let ctx = consumer.context();
    let parts = ctx.parts.lock().expect("parts lock");
    let position = consumer.position().ok();
    let now = crate::clock::now_millis();
    for p in stalls.forget_unassigned(|p| assignment.find_partition(topic, p).is_some()) {
        fetch_stall_ended(ctx, p, "revoked");
    }
    for e in assignment.elements() {
        let p = e.partition();
        if let Some(part) = parts.get(&p) {
            let (waiting, busy_for) = occupancy(part, now);
            gauge!(m::WAITING_COMMANDS, "partition" => p.to_string()).set(waiting as f64);
            gauge!(m::OLDEST_UNFINISHED_SECONDS, "partition" => p.to_string()).set(busy_for.as_secs_f64());
        }
        let Some(high) = cached_high_watermark(consumer, topic, p) else { continue };
        // A partition whose fetches fail learns its end from no response:
        // the end the watch read from the broker then.
        let high = high.max(ends.get(&p).copied().unwrap_or(-1));
        let fetched = position.as_ref().and_then(|t| t.find_partition(topic, p)).and_then(|e| match e.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        });
        if let (Some(part), Some(at)) = (parts.get(&p), fetched) {
            let idle = part.paused.is_none() && occupancy(part, now).0 == 0;
            match stalls.observe(p, at, high, idle, Instant::now()) {
                fetch_stall::Verdict::Stalled { position, high, waited } => {
                    error!(
                        partition = p,
                        position,
                        high,
                        waited_secs = waited.as_secs(),
                        last_consumer_error = last_error.unwrap_or("none"),
                        "the consumer reads nothing of this partition although the broker holds offsets up to {high}: a batch at {position} that cannot be fetched or decoded (a compression codec, a corrupt batch, a broker failing to serve it); the partition is degraded (runbook: docs/kubernetes.md, DenormPartitionFetchStalled)"
                    );
                    gauge!(m::PARTITION_FETCH_STALLED, "partition" => p.to_string()).set(1.0);
                    ctx.health.degraded_one();
                }
                fetch_stall::Verdict::Recovered => fetch_stall_ended(ctx, p, "reads again"),
                fetch_stall::Verdict::Same => {}
            }
        }
        // The next offset to apply: what the applier made durable, what was
        // committed, or (before the first message) the fetch position.
        let next = match parts.get(&p) {
            Some(part) => part.next.load(Ordering::SeqCst).max(part.committed),
            None => match position.as_ref().and_then(|t| t.find_partition(topic, p)).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => continue,
            },
        };
        if next < 0 {
            continue;
        }
        gauge!(m::CONSUMER_LAG_MESSAGES, "partition" => p.to_string()).set((high - next).max(0) as f64);
        let above = parts.get(&p).map_or(0, |part| part.done.lock().expect("done lock").applied_in(next, high));
        gauge!(m::UNAPPLIED_COMMANDS, "partition" => p.to_string()).set((high - next - above).max(0) as f64);
    }
}

/// A partition reported stalled ([`fetch_stall`]) is no longer: `why`.
fn fetch_stall_ended(ctx: &WorkerContext, partition: i32, why: &str) {
    info!(partition, "the partition's fetch stall ended: {why}");
    gauge!(m::PARTITION_FETCH_STALLED, "partition" => partition.to_string()).set(0.0);
    ctx.health.recovered();
}

/// What waits for a partition's applier (messages queued for it, or held
/// while the partition is paused) and how long it has been at the message
/// it is handling (zero when idle), at `now_ms`.
fn occupancy(part: &Partition, now_ms: i64) -> (usize, Duration) {
    let held = part.pending.iter().filter(|f| matches!(f, Feed::Message(_))).count();
    let since = part.busy_since_ms.load(Ordering::SeqCst);
    let busy_for = if since > 0 { Duration::from_millis((now_ms - since).max(0) as u64) } else { Duration::ZERO };
    (part.queue.queued().messages() + held, busy_for)
}

/// The partition's high watermark as of the last fetch response (librdkafka
/// caches it); `None` before the first one. Makes no request.
fn cached_high_watermark(consumer: &BaseConsumer<WorkerContext>, topic: &str, partition: i32) -> Option<i64> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client handle lives as long as `consumer`; the topic is a
    // valid C string for the duration of the call; low and high are valid
    // out-pointers.
    let err = unsafe { rdkafka::bindings::rd_kafka_get_watermark_offsets(consumer.client().native_ptr(), topic.as_ptr(), partition, &mut low, &mut high) };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
}
