//! One partition's applier: owns the partition's shard writer, applies its
//! messages in log order, commits the index, then publishes the next offset
//! that may be committed to Kafka.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use rdkafka::message::{Message, OwnedMessage};
use tracing::{debug, error, info, warn};

use super::admit::{admit, reason};
use super::{Shared, WorkerError};
use crate::apply::apply;
use crate::index::{IndexError, Shard};
use crate::metrics::{self as m, outcome};

/// The consumer thread's handle on one partition's applier.
pub(crate) struct Partition {
    pub tx: SyncSender<OwnedMessage>,
    pub stop: Arc<AtomicBool>,
    /// Next offset whose predecessors are durably applied (-1: none yet).
    pub next: Arc<AtomicI64>,
    /// Last offset committed to Kafka by the consumer thread.
    pub committed: i64,
    /// Messages fetched while the applier's queue was full.
    pub pending: std::collections::VecDeque<OwnedMessage>,
    pub paused: bool,
    join: Option<JoinHandle<Result<(), WorkerError>>>,
}

impl Partition {
    pub fn spawn(partition: i32, shared: Arc<Shared>) -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel(shared.cfg.queue_capacity.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicI64::new(-1));
        let (s, n) = (stop.clone(), next.clone());
        let join = std::thread::Builder::new()
            .name(format!("denorm-p{partition}"))
            .spawn(move || {
                let lag_seconds = gauge!(m::CONSUMER_LAG_SECONDS, "partition" => partition.to_string());
                Applier { partition, shared, stop: s, next: n, lag_seconds }.run(rx)
            })
            .expect("spawn partition thread");
        Partition { tx, stop, next, committed: -1, pending: Default::default(), paused: false, join: Some(join) }
    }

    pub fn finished(&self) -> bool {
        self.join.as_ref().is_none_or(|j| j.is_finished())
    }

    /// Waits for the applier to finish (after [`Partition::stop`] was set or
    /// on its own). Returns its result and the next committable offset.
    pub fn join(&mut self) -> (Result<(), WorkerError>, i64) {
        let r = match self.join.take() {
            Some(j) => j.join().unwrap_or_else(|_| Err(WorkerError::Panicked)),
            None => Ok(()),
        };
        (r, self.next.load(Ordering::SeqCst))
    }
}

struct Applier {
    partition: i32,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    next: Arc<AtomicI64>,
    /// `denorm_consumer_lag_seconds` of this partition, resolved once.
    lag_seconds: metrics::Gauge,
}

/// What became of one message.
enum Handled {
    /// Applied or skipped for good: the offset may be committed.
    Done { fan_out: bool },
    /// Already applied before (redelivery).
    Duplicate,
    /// Stop was requested while retrying: leave it to the next owner.
    Interrupted,
}

impl Applier {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn run(self, rx: Receiver<OwnedMessage>) -> Result<(), WorkerError> {
        let Some(mut shard) = self.open_shard()? else { return Ok(()) };
        if let Some(a) = shard.applied() {
            self.next.store(a as i64 + 1, Ordering::SeqCst);
        }
        info!(partition = self.partition, applied = ?shard.applied(), "partition assigned, shard open");
        let max_batch = self.shared.cfg.max_batch.max(1);
        let linger = self.shared.cfg.commit_linger;
        // Applied but not yet committed: (count, last offset, commit deadline).
        let mut uncommitted: Option<(usize, i64, Instant)> = None;
        while !self.stopping() {
            let wait = match uncommitted {
                Some((_, _, deadline)) => deadline.saturating_duration_since(Instant::now()),
                None => Duration::from_millis(100),
            };
            match rx.recv_timeout(wait) {
                Ok(msg) => {
                    self.lag_seconds.set(age_seconds(&msg));
                    match self.handle(shard.as_mut(), &msg) {
                        Handled::Done { fan_out } => {
                            shard.mark_applied(msg.offset() as u64);
                            let (n, _, deadline) = uncommitted.unwrap_or((0, 0, Instant::now() + linger));
                            uncommitted = Some((n + 1, msg.offset(), deadline));
                            if fan_out || n + 1 >= max_batch {
                                // Fan-outs are committed on their own so that
                                // their effects are visible and bounded.
                                if !self.commit(shard.as_mut(), msg.offset())? {
                                    return Ok(());
                                }
                                uncommitted = None;
                            }
                        }
                        Handled::Duplicate => {}
                        Handled::Interrupted => break,
                    }
                }
                Err(RecvTimeoutError::Timeout) if uncommitted.is_none() => {
                    // Idle with everything committed: nothing is waiting.
                    self.lag_seconds.set(0.0);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if let Some((_, offset, deadline)) = uncommitted {
                if Instant::now() >= deadline {
                    if !self.commit(shard.as_mut(), offset)? {
                        return Ok(());
                    }
                    uncommitted = None;
                }
            }
        }
        // Stopping: make what is applied durable, so the next owner resumes
        // after it.
        if let Some((_, offset, _)) = uncommitted {
            self.commit(shard.as_mut(), offset)?;
        }
        Ok(())
    }

    /// Opens the shard, waiting while a previous owner still holds it.
    /// `None` when stopped before that.
    fn open_shard(&self) -> Result<Option<Box<dyn Shard + Send>>, WorkerError> {
        let mut backoff = Backoff::new(self.shared.cfg.retry_backoff_max);
        loop {
            match self.shared.backend.open_shard(self.partition) {
                Ok(s) => return Ok(Some(s)),
                Err(e) if e.is_retryable() => {
                    if self.stopping() {
                        return Ok(None);
                    }
                    debug!(partition = self.partition, error = %e, "waiting for shard");
                    backoff.wait();
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Commits the shard (retrying transient failures) and publishes
    /// `offset + 1`. `false` when stopped while retrying.
    fn commit(&self, shard: &mut dyn Shard, offset: i64) -> Result<bool, WorkerError> {
        let mut backoff = Backoff::new(self.shared.cfg.retry_backoff_max);
        loop {
            let t = Instant::now();
            match shard.commit() {
                Ok(()) => {
                    histogram!(m::INDEX_COMMIT_SECONDS).record(t.elapsed().as_secs_f64());
                    self.next.store(offset + 1, Ordering::SeqCst);
                    return Ok(true);
                }
                Err(e) if e.is_retryable() && !self.stopping() => {
                    counter!(m::INDEX_RETRIES_TOTAL, "operation" => "commit").increment(1);
                    warn!(partition = self.partition, error = %e, "index commit failed, retrying");
                    backoff.wait();
                }
                Err(e) if e.is_retryable() => return Ok(false),
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn handle(&self, shard: &mut dyn Shard, msg: &OwnedMessage) -> Handled {
        let (partition, offset) = (self.partition, msg.offset());
        let count = |kind: &'static str, outcome: &'static str| {
            counter!(m::COMMANDS_TOTAL, "type" => kind, "outcome" => outcome).increment(1);
        };
        if shard.applied().is_some_and(|a| offset as u64 <= a) {
            count("unknown", outcome::DUPLICATE);
            return Handled::Duplicate;
        }
        let envelope = match admit(&self.shared.codec, msg.key(), msg.payload(), self.shared.cfg.max_message_bytes) {
            Ok(e) => e,
            Err(r) => {
                warn!(partition, offset, reason = r.reason, detail = %r.detail, "skipping rejected message");
                counter!(m::MESSAGES_REJECTED_TOTAL, "reason" => r.reason).increment(1);
                let outcome = if r.reason == reason::INVALID_COMMAND { outcome::INVALID } else { outcome::UNDECODABLE };
                count("unknown", outcome);
                self.shared.stats.skipped.fetch_add(1, Ordering::Relaxed);
                return Handled::Done { fan_out: false };
            }
        };
        let cmd = &envelope.command;
        if cmd.is_fan_out() {
            info!(partition, offset, command = cmd.kind(), key = cmd.key(), "fan-out started");
        }
        let mut backoff = Backoff::new(self.shared.cfg.retry_backoff_max);
        loop {
            let t = Instant::now();
            match apply(shard, cmd, offset as u64, self.shared.cfg.fan_out) {
                Ok(docs) => {
                    let elapsed = t.elapsed();
                    histogram!(m::COMMAND_DOCUMENTS, "type" => cmd.kind()).record(docs as f64);
                    histogram!(m::COMMAND_SECONDS, "type" => cmd.kind()).record(elapsed.as_secs_f64());
                    count(cmd.kind(), outcome::APPLIED);
                    self.shared.stats.record(docs, cmd.is_fan_out(), elapsed);
                    if cmd.is_fan_out() {
                        info!(partition, offset, command = cmd.kind(), documents = docs, ms = elapsed.as_millis() as u64, "fan-out applied");
                    }
                    return Handled::Done { fan_out: cmd.is_fan_out() };
                }
                Err(e) if e.is_retryable() => {
                    if self.stopping() {
                        return Handled::Interrupted;
                    }
                    counter!(m::INDEX_RETRIES_TOTAL, "operation" => "apply").increment(1);
                    warn!(partition, offset, error = %e, "applying command failed, retrying");
                    backoff.wait();
                }
                Err(error) => {
                    error!(partition, offset, command_id = %envelope.command_id, %error, "command rejected by the index, skipped");
                    count(cmd.kind(), outcome::FAILED);
                    self.shared.stats.skipped.fetch_add(1, Ordering::Relaxed);
                    return Handled::Done { fan_out: false };
                }
            }
        }
    }
}

fn age_seconds(msg: &OwnedMessage) -> f64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    msg.timestamp().to_millis().map(|t| ((now - t).max(0)) as f64 / 1000.0).unwrap_or(0.0)
}

/// Jittered exponential backoff from 50 ms up to `max`.
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(max: Duration) -> Self {
        Backoff { next: Duration::from_millis(50), max }
    }
    pub fn wait(&mut self) {
        let jitter = rand::random_range(0.5..1.0);
        std::thread::sleep(self.next.mul_f64(jitter));
        self.next = (self.next * 2).min(self.max);
    }
}

impl From<IndexError> for WorkerError {
    fn from(e: IndexError) -> Self {
        WorkerError::Index(e)
    }
}
