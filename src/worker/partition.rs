//! One partition's applier: owns the partition's shard writer, applies its
//! messages in log order, commits the index, then publishes the next offset
//! that may be committed to Kafka.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::Offset;
use tracing::{debug, error, info, warn};

use super::admit::{admit, reason, Admitted, NotAdmitted, Rejection};
use super::{OnAbort, Shared, WorkerError};
use crate::apply::apply;
use crate::command::{Command, Envelope};
use crate::dlq::{self, Action, Control, Letter, Parked};
use crate::index::{Checkpoint, IndexError, Shard};
use crate::metrics::{self as m, outcome};

/// What the consumer thread hands an applier.
pub(crate) enum Feed {
    Message(OwnedMessage),
    /// The partition was positioned where the applier asked
    /// ([`Shared::seeks`]): messages before this one were fetched from the
    /// old position and are dropped; the next one comes from the new.
    /// With the partition's low and high watermarks at that time.
    Positioned { watermarks: Option<(i64, i64)> },
}

/// The consumer thread's handle on one partition's applier.
pub(crate) struct Partition {
    /// The applier's queue; its size in bytes is `queued`.
    pub tx: Sender<Feed>,
    /// Bytes of the messages in `tx` not yet taken by the applier
    /// ([`queued_size`] each).
    pub queued: Arc<AtomicUsize>,
    pub stop: Arc<AtomicBool>,
    /// Next offset whose predecessors are durably applied (-1: none yet).
    pub next: Arc<AtomicI64>,
    /// The group's committed offset for the partition: at assignment, then
    /// as commits are confirmed. Never committed below (an index restored
    /// from an older copy catches up without moving the group back).
    pub committed: i64,
    /// Messages fetched while the applier's queue was full.
    pub pending: std::collections::VecDeque<OwnedMessage>,
    pub paused: bool,
    join: Option<JoinHandle<Result<(), WorkerError>>>,
}

impl Partition {
    /// Starts the applier of `partition`, whose group offset is `committed`
    /// (-1: none).
    pub fn spawn(partition: i32, shared: Arc<Shared>, committed: i64) -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicI64::new(-1));
        let queued = Arc::new(AtomicUsize::new(0));
        let (s, n, q) = (stop.clone(), next.clone(), queued.clone());
        let join = std::thread::Builder::new()
            .name(format!("denorm-p{partition}"))
            .spawn(move || {
                let lag_seconds = gauge!(m::CONSUMER_LAG_SECONDS, "partition" => partition.to_string());
                Applier { partition, shared, stop: s, next: n, unpublished: Default::default(), queued: q, lag_seconds, incoming: Default::default() }.run(rx)
            })
            .expect("spawn partition thread");
        Partition { tx, queued, stop, next, committed, pending: Default::default(), paused: false, join: Some(join) }
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

/// What a queued message counts against `--queue-kb`: its key and payload
/// plus the bookkeeping of one message.
pub(crate) fn queued_size(m: &OwnedMessage) -> usize {
    m.payload().map_or(0, <[u8]>::len) + m.key().map_or(0, <[u8]>::len) + 256
}

struct Applier {
    partition: i32,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    next: Arc<AtomicI64>,
    /// An offset committed to the index but not published in `next` yet,
    /// until its writes are searchable ([`Shard::searchable`]).
    unpublished: std::cell::Cell<Option<i64>>,
    queued: Arc<AtomicUsize>,
    /// `denorm_consumer_lag_seconds` of this partition, resolved once.
    lag_seconds: metrics::Gauge,
    /// A cross-key move being received, and what waits for it.
    incoming: std::cell::RefCell<Incoming>,
}

/// The destination side of a cross-key move that spans several messages.
/// From its first chunk to its last, the move's documents are applied and
/// every other message of the partition waits (in memory, uncommitted), so
/// that the move takes effect at one place in this partition's order: its
/// first chunk. Nothing is marked applied meanwhile, so after a crash the
/// whole exchange is redelivered and decided again the same way. Not
/// persisted: rebuilt from the log.
#[derive(Default)]
struct Incoming {
    /// The move in flight: its source, and the position its documents take.
    active: Option<((i32, i64), u64)>,
    /// Messages that arrived while it was in flight, in log order.
    deferred: Vec<OwnedMessage>,
    /// The newest message handled while it was in flight: marked applied
    /// once nothing waits any more.
    latest: Option<Checkpoint>,
}

impl Incoming {
    fn quiet(&self) -> bool {
        self.active.is_none() && self.deferred.is_empty()
    }
}

/// What became of one message.
enum Handled {
    /// Applied, dead-lettered or carried out: the offset may be committed.
    Done { fan_out: bool },
    /// Already applied before (redelivery).
    Duplicate,
    /// Held back until the cross-key move in flight completes (see
    /// [`Incoming`]); handled then.
    Deferred,
}

/// Why an applier step did not finish: every step returns [`Step`].
pub(crate) enum Halt {
    /// A transient failure (index, schema registry) while handling a
    /// message: the caller reopens the shard and handles it again.
    Retry(IndexError),
    /// Stop was requested (revoke, shutdown) while retrying: what is not
    /// committed is left to the next owner.
    Stopped,
    /// A failure that ends the worker.
    Fatal(WorkerError),
    /// The shard was reopened after a failure and the index had moved to a
    /// new generation meanwhile (a rebuild's cutover): the uncommitted batch
    /// is dropped and the partition positioned at the new generation's
    /// checkpoint, never re-applied onto it from where the batch began.
    Moved,
    /// The index refused for good to commit the batch before its last
    /// message (a take-over about to wait, a cross-key rename about to
    /// write its chunks: see [`Applier::commit_before`]): the batch before
    /// it is committed first, finding the command at fault, then the
    /// message is handled again.
    CommitFirst(IndexError),
}

type Step<T> = Result<T, Halt>;

impl From<IndexError> for Halt {
    /// An index failure: retried when it is transient, fatal otherwise.
    fn from(e: IndexError) -> Self {
        if e.is_retryable() {
            Halt::Retry(e)
        } else {
            Halt::Fatal(WorkerError::Index(e))
        }
    }
}

/// What is being retried: its log text and its retry counter.
#[derive(Clone, Copy)]
enum Op {
    Open,
    Apply,
    Reapply,
    Commit,
    Isolate,
    /// A command the index refused, tried again up to `--max-attempts`.
    Rejected,
    DeadLetter,
    /// Writing a cross-key move's documents to the command topic.
    Move,
}

impl Op {
    fn describe(self) -> &'static str {
        match self {
            Op::Open => "opening the shard",
            Op::Apply => "applying the command",
            Op::Reapply => "re-applying after an index failure",
            Op::Commit => "index commit",
            Op::Isolate => "committing the command",
            Op::Rejected => "applying the command (the index refused it)",
            Op::DeadLetter => "writing to the dead-letter topic",
            Op::Move => "writing a cross-key move's documents to the command topic",
        }
    }

    fn count(self) {
        match self {
            Op::Apply => counter!(m::INDEX_RETRIES_TOTAL, "operation" => "apply").increment(1),
            Op::Commit => counter!(m::INDEX_RETRIES_TOTAL, "operation" => "commit").increment(1),
            Op::DeadLetter => counter!(m::DEAD_LETTER_RETRIES_TOTAL).increment(1),
            Op::Open | Op::Reapply | Op::Isolate | Op::Rejected | Op::Move => {}
        }
    }
}

/// The retry state of one operation: jittered backoff, and the partition
/// reported degraded from its first failure until the operation is over.
struct Retrying<'a> {
    applier: &'a Applier,
    op: Op,
    backoff: Backoff,
    degraded: Option<crate::http::Degraded<'a>>,
}

impl Retrying<'_> {
    /// After a failure: reports the partition degraded (unless the index is
    /// refusing one command, which is no outage), counts and logs the
    /// failure, and waits. `Halt::Stopped` when stop was requested.
    fn failed(&mut self, error: &dyn std::fmt::Display) -> Step<()> {
        let a = self.applier;
        if !matches!(self.op, Op::Isolate | Op::Rejected) {
            self.degraded.get_or_insert_with(|| a.shared.health.degrade());
        }
        self.op.count();
        warn!(partition = a.partition, error = %error, "{} failed, retrying", self.op.describe());
        self.pause()
    }

    /// Waits for an expected condition (another owner releasing the shard):
    /// not a failure. `Halt::Stopped` when stop was requested.
    fn pause(&mut self) -> Step<()> {
        if self.applier.stopping() {
            return Err(Halt::Stopped);
        }
        self.backoff.wait();
        Ok(())
    }
}

/// Where a message came from, for its dead letter. A replayed command keeps
/// the offset it was first written at.
struct Origin<'a> {
    key: Option<&'a [u8]>,
    payload: Option<&'a [u8]>,
    offset: i64,
}

impl<'a> Origin<'a> {
    /// The message key as parking knows it (borrowed when it is UTF-8).
    fn key(&self) -> Option<std::borrow::Cow<'a, str>> {
        self.key.filter(|k| !k.is_empty()).map(String::from_utf8_lossy)
    }

    /// What the key is parked behind, if it is parked. Cheap when nothing is.
    fn parked_behind(&self, shard: &mut dyn Shard) -> Option<String> {
        let parking = shard.parking();
        if parking.is_empty() {
            return None;
        }
        parking.get(self.key()?.as_ref()).map(|p| p.behind.clone())
    }
}

type ShardBox = Box<dyn Shard + Send>;

impl Applier {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn retrying(&self, op: Op) -> Retrying<'_> {
        Retrying { applier: self, op, backoff: Backoff::new(self.shared.cfg.retry_backoff_max), degraded: None }
    }

    fn run(self, rx: Receiver<Feed>) -> Result<(), WorkerError> {
        match self.apply_until_stopped(rx) {
            Ok(()) | Err(Halt::Stopped | Halt::Moved) => Ok(()),
            Err(Halt::Fatal(e)) => Err(e),
            Err(Halt::Retry(e) | Halt::CommitFirst(e)) => Err(WorkerError::Index(e)),
        }
    }

    fn apply_until_stopped(&self, rx: Receiver<Feed>) -> Step<()> {
        let mut shard = self.open_shard()?;
        let mut checkpoint = self.took(shard.as_mut());
        // Started at the checkpoint by the assignment already, or sought now.
        let assigned = self.shared.assigned_at.lock().expect("assigned_at lock").remove(&self.partition);
        let mut positioned = match assigned {
            Some((at, watermarks)) if at == target_of(checkpoint) => self.positioned(checkpoint, watermarks)?,
            _ => self.seek_to(checkpoint),
        };
        let mut first = true;
        let mut generation_checked = Instant::now();
        let max_batch = self.shared.cfg.max_batch.max(1);
        let linger = self.shared.cfg.commit_linger;
        let quiet = self.shared.cfg.commit_quiet;
        // Messages handled since the last commit, kept until it succeeds: if
        // the index fails meanwhile, the shard is reopened (dropping whatever
        // state the failure left in the writer) and they are handled again.
        let mut batch: Vec<OwnedMessage> = Vec::new();
        let mut deadline: Option<Instant> = None;
        // Feeds already received, in order, whose documents were prefetched
        // with those of the message before them (see `prefetch`).
        let mut ahead: VecDeque<Feed> = VecDeque::new();
        while !self.stopping() {
            // A batch is committed once its queue stays empty for `quiet`
            // (a burst has been applied), or when it is `linger` old.
            let wait = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(quiet),
                None => Duration::from_millis(100),
            };
            let (next, fresh) = match ahead.pop_front() {
                Some(feed) => (Ok(feed), false),
                None => (rx.recv_timeout(wait), true),
            };
            match next {
                Ok(Feed::Positioned { watermarks }) => positioned = self.positioned(checkpoint, watermarks)?,
                Ok(Feed::Message(msg)) => {
                    self.queued.fetch_sub(queued_size(&msg), Ordering::SeqCst);
                    if !positioned {
                        continue; // fetched from the group's offset, before the seek
                    }
                    if fresh && shard.prefetches() {
                        self.prefetch(shard.as_mut(), &msg, &rx, &mut ahead);
                    }
                    if std::mem::take(&mut first) {
                        let fingerprint = crate::logid::fingerprint(msg.key(), msg.payload());
                        self.judge(checkpoint, crate::logid::first_after(checkpoint, msg.offset(), fingerprint))?;
                    }
                    self.lag_seconds.set(age_seconds(&msg));
                    batch.push(msg);
                    let fan_out = match self.handle_last(&mut shard, &mut batch) {
                        Err(Halt::Stopped) => break,
                        other => other,
                    };
                    let d = *deadline.get_or_insert_with(|| Instant::now() + linger);
                    // Fan-outs are committed on their own so that their
                    // effects are visible and bounded.
                    let step = fan_out.and_then(|fan_out| match fan_out || batch.len() >= max_batch || Instant::now() >= d || self.awaited(&batch) {
                        true => self.commit(&mut shard, &mut batch).map(|()| deadline = None),
                        false => Ok(()),
                    });
                    if let Err(Halt::Moved) = step {
                        checkpoint = self.moved(&mut shard, &mut batch);
                        (positioned, first, deadline) = (false, true, None);
                    } else {
                        step?;
                    }
                }
                Err(RecvTimeoutError::Timeout) if deadline.is_none() => {
                    // Idle with everything committed: nothing is waiting
                    // but, maybe, the last commit to become searchable.
                    self.lag_seconds.set(0.0);
                    self.publish_pending(shard.as_mut(), false);
                }
                Err(RecvTimeoutError::Timeout) => {
                    deadline = None;
                    match self.commit(&mut shard, &mut batch) {
                        Err(Halt::Moved) => {
                            checkpoint = self.moved(&mut shard, &mut batch);
                            (positioned, first) = (false, true);
                        }
                        other => other?,
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
            // Between batches (nothing uncommitted), at most every 100 ms: a
            // rebuild may have switched the index to a new generation.
            if batch.is_empty() && generation_checked.elapsed() >= GENERATION_CHECK {
                generation_checked = Instant::now();
                if self.follow_generation(&mut shard)? {
                    checkpoint = self.took(shard.as_mut());
                    (positioned, first) = (self.seek_to(checkpoint), true);
                }
            }
        }
        // Stopping: make what is applied durable, so the next owner resumes
        // after it, and searchable, so that its offset is published.
        let result = self.commit(&mut shard, &mut batch);
        self.publish_pending(shard.as_mut(), true);
        result
    }

    /// Receives what is already waiting behind `msg` (up to
    /// [`PREFETCH_WINDOW`] feeds, without waiting) into `ahead`, and lets the
    /// shard fetch the documents all of them read at once: on
    /// Elasticsearch one `_mget` instead of a GET per command. Messages stay
    /// counted as queued until they are handled.
    fn prefetch(&self, shard: &mut dyn Shard, msg: &OwnedMessage, rx: &Receiver<Feed>, ahead: &mut VecDeque<Feed>) {
        while ahead.len() < PREFETCH_WINDOW {
            match rx.try_recv() {
                Ok(feed @ Feed::Message(_)) => ahead.push_back(feed),
                Ok(feed) => {
                    ahead.push_back(feed);
                    break;
                }
                Err(_) => break,
            }
        }
        if ahead.is_empty() {
            return;
        }
        let messages = std::iter::once(msg).chain(ahead.iter().filter_map(|f| match f {
            Feed::Message(m) => Some(m),
            _ => None,
        }));
        let mut reads = Vec::new();
        for m in messages {
            if let Ok(Admitted::Command(e)) = admit(&self.shared.codec, m.key(), m.payload(), self.shared.cfg.max_message_bytes) {
                reads.extend(crate::apply::reads(&e.command));
            }
        }
        if let Err(e) = shard.prefetch(&reads) {
            debug!(partition = self.partition, error = %e, "prefetching failed; each command reads its documents on its own");
        }
    }

    /// After [`Halt::Moved`]: the batch is dropped (its commands reach the
    /// new generation from its checkpoint) and the partition sought there.
    fn moved(&self, shard: &mut ShardBox, batch: &mut Vec<OwnedMessage>) -> Option<Checkpoint> {
        info!(partition = self.partition, dropped = batch.len(), generation = shard.generation(), "the index moved to a new generation during a batch: resuming at its checkpoint");
        batch.clear();
        self.reset_incoming();
        let checkpoint = self.took(shard.as_mut());
        self.seek_to(checkpoint);
        checkpoint
    }

    /// A shard was opened: the offset after its checkpoint is what may be
    /// committed, and where fetching goes on. Returns the checkpoint.
    fn took(&self, shard: &mut dyn Shard) -> Option<Checkpoint> {
        let checkpoint = shard.checkpoint();
        // What a previous writer kept unpublished is below this checkpoint,
        // or of another generation.
        self.unpublished.set(None);
        if let Some(c) = checkpoint {
            self.next.store(c.offset as i64 + 1, Ordering::SeqCst);
        }
        self.parked_gauge(shard);
        info!(partition = self.partition, applied = ?checkpoint.map(|c| c.offset), parked = shard.parking().len(), generation = shard.generation(), "partition assigned, shard open");
        checkpoint
    }

    /// The index decides where to resume: asks the consumer thread to fetch
    /// from the shard's checkpoint itself, whose message must still be the
    /// one the index applied (see `crate::logid`). Not positioned until the
    /// consumer thread says so ([`Feed::Positioned`]).
    fn seek_to(&self, checkpoint: Option<Checkpoint>) -> bool {
        self.shared.seeks.lock().expect("seeks lock").insert(self.partition, target_of(checkpoint));
        false
    }

    /// The partition fetches from the checkpoint now; its watermarks, when
    /// known, say at once whether the checkpoint is in the log.
    fn positioned(&self, checkpoint: Option<Checkpoint>, watermarks: Option<(i64, i64)>) -> Step<bool> {
        if let Some((low, high)) = watermarks {
            self.judge(checkpoint, crate::logid::range_against(checkpoint, low, high))?;
        }
        Ok(true)
    }

    /// Moves to the backend's current generation when the shard is of
    /// another one (a rebuild's cutover): the old writer is released, the
    /// new generation's shard opened (waiting while the rebuild still holds
    /// it). Whether it moved; the caller positions the partition anew.
    fn follow_generation(&self, shard: &mut ShardBox) -> Step<bool> {
        let now = match self.shared.backend.generation() {
            Ok(g) => g,
            Err(e) => {
                debug!(partition = self.partition, error = %e, "reading the index generation failed; checked again later");
                return Ok(false);
            }
        };
        let was = shard.generation();
        if now == was {
            return Ok(false);
        }
        if !self.bound()? {
            return Ok(false);
        }
        *shard = Box::new(crate::index::memory::MemoryShard::new());
        *shard = self.open_shard()?;
        info!(partition = self.partition, from = was, to = now, "the index moved to a new generation: following it");
        Ok(true)
    }

    /// Whether this worker's topic is the one the current generation was
    /// built from: it may have been rebuilt from another topic (after
    /// `denorm migrate`), and then this worker must not write to it (fatal).
    /// `false` when the binding could not be read (checked again later).
    fn bound(&self) -> Step<bool> {
        match self.shared.backend.bind_log(self.shared.log_partitions) {
            Ok(()) => Ok(true),
            Err(e) if e.is_retryable() => {
                debug!(partition = self.partition, error = %e, "reading the index's log binding failed; checked again later");
                Ok(false)
            }
            Err(e) => Err(Halt::Fatal(WorkerError::Index(e))),
        }
    }

    /// What the first message fetched from the checkpoint, or the
    /// partition's watermarks before any, say about the log (see
    /// [`crate::logid`]): a changed log ends the worker, a gap stops the
    /// partition.
    fn judge(&self, checkpoint: Option<Checkpoint>, verdict: crate::logid::First) -> Step<()> {
        use crate::logid::First;
        match verdict {
            First::Same => Ok(()),
            First::Unverifiable => {
                warn!(partition = self.partition, checkpoint = ?checkpoint.map(|c| c.offset), "the checkpoint's message was deleted by retention: the log's identity cannot be checked");
                Ok(())
            }
            First::Changed(detail) => {
                let at = checkpoint.map_or(0, |c| c.offset);
                Err(Halt::Fatal(WorkerError::Index(IndexError::LogMismatch(crate::logid::log_changed(self.partition, at, &detail)))))
            }
            First::Gap { from, to } => Err(self.gap(from, to)),
        }
    }

    /// Offsets `from..to` are gone (retention) before the index applied
    /// them: the partition stops, since skipping them would leave the index
    /// silently wrong.
    fn gap(&self, from: i64, to: i64) -> Halt {
        Halt::Fatal(WorkerError::Gap {
            partition: self.partition,
            detail: format!(
                "offsets {from}..{} are no longer in the topic (retention deleted them) and the index never applied them; \
                 a rebuild cannot be exact either: restore the index from a copy whose checkpoint is at or after offset {}, or accept the loss by \
                 rebuilding from what is left",
                to - 1,
                to - 1
            ),
        })
    }

    /// Opens the shard, waiting while a previous owner still holds it.
    fn open_shard(&self) -> Step<ShardBox> {
        let mut retry = self.retrying(Op::Open);
        loop {
            match self.shared.backend.open_shard(self.partition) {
                Ok(s) => return Ok(s),
                Err(e @ IndexError::Locked(_)) => {
                    debug!(partition = self.partition, error = %e, "waiting for shard");
                    retry.pause()?;
                }
                Err(e) if e.is_retryable() => retry.failed(&e)?,
                Err(e) => return Err(Halt::Fatal(e.into())),
            }
        }
    }

    /// Handles the last message of `batch`, recovering from transient
    /// failures for as long as they last. Whether it was a fan-out.
    fn handle_last(&self, shard: &mut ShardBox, batch: &mut Vec<OwnedMessage>) -> Step<bool> {
        let mut retry = self.retrying(Op::Apply);
        loop {
            let msg = batch.last().expect("batch holds the message");
            match self.handle(shard.as_mut(), msg) {
                Ok(Handled::Done { fan_out }) => return Ok(fan_out),
                Ok(Handled::Duplicate) => {
                    batch.pop();
                    return Ok(false);
                }
                Ok(Handled::Deferred) => return Ok(false),
                Err(Halt::CommitFirst(e)) if batch.len() > 1 => {
                    warn!(partition = self.partition, error = %e, commands = batch.len() - 1, "the index refused a write of the batch before a cross-key step: committing the batch first");
                    let msg = batch.pop().expect("batch holds the message");
                    self.reopen(shard, batch)?;
                    self.commit(shard, batch)?;
                    batch.push(msg);
                }
                Err(Halt::Retry(e) | Halt::CommitFirst(e)) => {
                    let n = batch.len() - 1;
                    let recovered = retry.failed(&e).and_then(|()| self.reopen(shard, &batch[..n]));
                    if let Err(halt) = recovered {
                        // The writer may hold half of this command: nothing
                        // of the batch is committed on the way out, the next
                        // owner redoes it.
                        batch.clear();
                        return Err(halt);
                    }
                }
                Err(halt) => {
                    // Stopped within the command (its permanent-failure
                    // retries, or its dead letter): the earlier messages of
                    // the batch are still committed on the way out.
                    batch.pop();
                    return Err(halt);
                }
            }
        }
    }

    /// Replaces the shard writer with a fresh one (back at the last commit)
    /// and handles `replay` again.
    fn reopen(&self, shard: &mut ShardBox, replay: &[OwnedMessage]) -> Step<()> {
        let mut retry = self.retrying(Op::Reapply);
        let generation = shard.generation();
        'open: loop {
            // The old writer must go first: it holds the shard's lock.
            *shard = Box::new(crate::index::memory::MemoryShard::new());
            *shard = self.open_shard()?;
            // Back at the last commit: a move in flight is decided again
            // from the replayed messages.
            self.reset_incoming();
            if shard.generation() != generation {
                match self.bound()? {
                    true => return Err(Halt::Moved),
                    false => {
                        retry.failed(&"reading the index's log binding failed")?;
                        continue 'open;
                    }
                }
            }
            for msg in replay {
                match self.handle(shard.as_mut(), msg) {
                    Ok(_) => {}
                    Err(Halt::Retry(e)) => {
                        retry.failed(&e)?;
                        continue 'open;
                    }
                    Err(halt) => return Err(halt),
                }
            }
            info!(partition = self.partition, reapplied = replay.len(), "shard reopened after an index failure");
            return Ok(());
        }
    }

    /// Commits the shard and publishes the offset after `batch`, retrying
    /// (with a fresh writer) while the index fails. Nothing of `batch` is
    /// published when stopped meanwhile.
    fn commit(&self, shard: &mut ShardBox, batch: &mut Vec<OwnedMessage>) -> Step<()> {
        let Some(last) = batch.last().map(|m| m.offset()) else { return Ok(()) };
        if !self.incoming.borrow().quiet() {
            // A cross-key move is in flight: nothing is committed until it
            // completes (the batch is redelivered if this worker stops).
            return Ok(());
        }
        let mut retry = self.retrying(Op::Commit);
        loop {
            let t = Instant::now();
            match shard.commit() {
                Ok(()) => {
                    histogram!(m::INDEX_COMMIT_SECONDS).record(t.elapsed().as_secs_f64());
                    self.publish(shard.as_mut(), last + 1, false);
                    batch.clear();
                    self.parked_gauge(shard.as_mut());
                    return Ok(());
                }
                Err(e) if e.is_retryable() => {
                    retry.failed(&format_args!("{e}; reopening the shard"))?;
                    self.reopen(shard, batch)?;
                }
                Err(error) => {
                    warn!(partition = self.partition, %error, commands = batch.len(), "the index refused a write of this batch: committing its commands one by one to find it");
                    return self.isolate(shard, batch);
                }
            }
        }
    }

    /// Publishes `next` (the offset after a commit) once the shard says
    /// the commit is searchable, else keeps it for [`Self::publish_pending`].
    fn publish(&self, shard: &mut dyn Shard, next: i64, force: bool) {
        self.unpublished.set(Some(next));
        self.publish_pending(shard, force);
    }

    /// Publishes the offset kept by [`Self::publish`] if its commit has
    /// become searchable (asked again at every commit and every idle
    /// moment; a failed check is asked again then).
    fn publish_pending(&self, shard: &mut dyn Shard, force: bool) {
        let Some(next) = self.unpublished.get() else { return };
        match shard.searchable(force) {
            Ok(true) => {
                self.next.fetch_max(next, Ordering::SeqCst);
                self.unpublished.set(None);
            }
            Ok(false) => {}
            Err(error) => warn!(partition = self.partition, %error, "making the last commit searchable failed; tried again"),
        }
    }

    /// After a commit the index refused for good: applies and commits the
    /// batch one command at a time from a fresh writer; the command whose
    /// commit is refused `max_attempts` times is aborted. Publishes progress
    /// after each command.
    fn isolate(&self, shard: &mut ShardBox, batch: &mut Vec<OwnedMessage>) -> Step<()> {
        // A fresh writer back at the last commit; again after every failure.
        self.reopen(shard, &[])?;
        while let Some(msg) = batch.first() {
            let mut retry = self.retrying(Op::Isolate);
            let mut attempts = 0u32;
            let mut abort_with: Option<IndexError> = None;
            loop {
                let handled = match &abort_with {
                    None => self.handle(shard.as_mut(), msg),
                    Some(e) => self.abort_message(shard.as_mut(), msg, e, attempts),
                };
                let failure = match handled {
                    Err(Halt::Retry(e)) => e.to_string(),
                    Err(halt) => return Err(halt),
                    Ok(_) => match shard.commit() {
                        Ok(()) => break,
                        Err(e) if !e.is_retryable() && abort_with.is_none() => {
                            attempts += 1;
                            let shown = e.to_string();
                            if attempts >= self.shared.cfg.max_attempts.max(1) {
                                abort_with = Some(e);
                            }
                            shown
                        }
                        Err(e) => e.to_string(),
                    },
                };
                retry.failed(&format_args!("{failure} (offset {}, attempt {attempts})", msg.offset()))?;
                self.reopen(shard, &[])?;
            }
            self.publish(shard.as_mut(), msg.offset() + 1, false);
            batch.remove(0);
        }
        self.parked_gauge(shard.as_mut());
        Ok(())
    }

    /// Aborts `msg` after the index refused its writes at commit time.
    fn abort_message(&self, shard: &mut dyn Shard, msg: &OwnedMessage, error: &IndexError, attempts: u32) -> Step<Handled> {
        let (key, max) = (msg.key(), self.shared.cfg.max_message_bytes);
        let (payload, offset, command_id) = match admit(&self.shared.codec, key, msg.payload(), max) {
            Ok(Admitted::Command(e)) => (msg.payload().map(<[u8]>::to_vec), msg.offset(), Some(e.command_id)),
            // A replay: the letter is the replayed command.
            Ok(Admitted::Control(c)) => {
                let id = match admit(&self.shared.codec, key, Some(&c.payload), max) {
                    Ok(Admitted::Command(e)) => Some(e.command_id),
                    _ => None,
                };
                (Some(c.payload), c.origin_offset, id)
            }
            Ok(Admitted::Move(_)) | Err(_) => (msg.payload().map(<[u8]>::to_vec), msg.offset(), None),
        };
        let origin = Origin { key, payload: payload.as_deref(), offset };
        let handled = self.abort(shard, &origin, dlq::reason::INDEX_REJECTED, error.to_string(), attempts, command_id)?;
        shard.mark_applied(checkpoint_of(msg));
        Ok(handled)
    }

    fn parked_gauge(&self, shard: &mut dyn Shard) {
        gauge!(m::PARKED_KEYS, "partition" => self.partition.to_string()).set(shard.parking().len() as f64);
    }

    /// Handles one message. `Halt::Retry` is a transient failure (the
    /// caller reopens the shard and tries again); permanent failures end in
    /// the dead-letter topic.
    fn handle(&self, shard: &mut dyn Shard, msg: &OwnedMessage) -> Step<Handled> {
        let offset = msg.offset();
        if shard.applied().is_some_and(|a| offset as u64 <= a) {
            count("unknown", outcome::DUPLICATE);
            return Ok(Handled::Duplicate);
        }
        let origin = Origin { key: msg.key(), payload: msg.payload(), offset };
        let admitted = match admit(&self.shared.codec, msg.key(), msg.payload(), self.shared.cfg.max_message_bytes) {
            Err(NotAdmitted::Unavailable(e)) => return Err(Halt::Retry(IndexError::Dependency(e))),
            Err(NotAdmitted::Rejected(r)) => Err(r),
            Ok(a) => Ok(a),
        };
        let in_flight = self.incoming.borrow().active.map(|(source, _)| source);
        if let Some(source) = in_flight {
            if !matches!(&admitted, Ok(Admitted::Move(m)) if m.source() == source) {
                let mut incoming = self.incoming.borrow_mut();
                incoming.deferred.push(msg.clone());
                gauge!(m::MOVES_WAITING, "partition" => self.partition.to_string()).set(incoming.deferred.len() as f64);
                return Ok(Handled::Deferred);
            }
        }
        let handled = match admitted {
            Err(r) => self.reject(shard, &origin, r)?,
            Ok(Admitted::Control(c)) => self.control(shard, msg, c)?,
            Ok(Admitted::Move(mv)) => return self.move_in(shard, msg, &mv),
            Ok(Admitted::Command(e)) => match origin.parked_behind(shard) {
                Some(behind) => self.park(shard, &origin, Some(e.command_id.clone()), behind, e.command.kind())?,
                None => {
                    if let Some(previous) = e.command.previous_key() {
                        let id = match &e.command {
                            Command::UpsertFile { id, .. } | Command::UpsertPost { id, .. } => id.as_str(),
                            _ => "",
                        };
                        let what = format!("the owner change of {id:?} ({}) from {previous:?}", e.command.kind());
                        match e.after {
                            Some(at) => self.await_departure(shard, at, offset, &what)?,
                            None => warn_without_after(self.partition, offset, &what),
                        }
                    }
                    self.command(shard, &e, offset, &origin)?
                }
            },
        };
        if let Handled::Done { .. } = handled {
            self.mark(shard, msg);
        }
        Ok(handled)
    }

    /// Marks `msg` applied, or, while a cross-key move is in flight,
    /// remembers it to be marked once nothing waits any more.
    fn mark(&self, shard: &mut dyn Shard, msg: &OwnedMessage) {
        let mut incoming = self.incoming.borrow_mut();
        if incoming.quiet() {
            shard.mark_applied(checkpoint_of(msg));
        } else {
            incoming.latest = Some(checkpoint_of(msg));
        }
    }

    fn reset_incoming(&self) {
        *self.incoming.borrow_mut() = Incoming::default();
        self.move_gauges(0, 0);
    }

    fn move_gauges(&self, in_flight: usize, waiting: usize) {
        gauge!(m::MOVES_IN_FLIGHT, "partition" => self.partition.to_string()).set(in_flight as f64);
        gauge!(m::MOVES_WAITING, "partition" => self.partition.to_string()).set(waiting as f64);
    }

    /// The destination side of a cross-key move: applies a chunk of its
    /// documents (see [`Incoming`] and [`crate::moves::arrival`]).
    fn move_in(&self, shard: &mut dyn Shard, msg: &OwnedMessage, mv: &crate::moves::MoveIn) -> Step<Handled> {
        use crate::moves::Arrival;
        let in_flight = self.incoming.borrow().active.map(|(source, _)| source);
        let pos = match crate::moves::arrival(shard.received(), in_flight, mv) {
            Arrival::Duplicate => {
                counter!(m::MOVES_TOTAL, "side" => "destination", "outcome" => "duplicate").increment(1);
                debug!(partition = self.partition, offset = msg.offset(), source = ?mv.source(), chunk = mv.chunk, "a resent chunk of a move completed before: ignored");
                self.mark(shard, msg);
                return Ok(Handled::Done { fan_out: false });
            }
            Arrival::Waits => unreachable!("deferred by handle"),
            Arrival::Continues => self.incoming.borrow().active.map(|(_, pos)| pos).expect("in flight"),
            Arrival::Starts => {
                let from = crate::command::LogPosition { partition: mv.source_partition, offset: mv.source_offset };
                self.await_departure(shard, from, msg.offset(), &format!("the move {:?} -> {:?}", mv.from, mv.to))?;
                msg.offset() as u64
            }
        };
        let docs = crate::apply::move_in(shard, mv, pos)?;
        histogram!(m::COMMAND_DOCUMENTS, "type" => "move_in").record(docs as f64);
        if !mv.last {
            let mut incoming = self.incoming.borrow_mut();
            if incoming.active.is_none() {
                info!(partition = self.partition, offset = msg.offset(), from = %mv.from, to = %mv.to, source = ?mv.source(), "a cross-key move spanning several messages started: the partition's other messages wait for its last chunk");
                incoming.active = Some((mv.source(), pos));
            }
            incoming.latest = Some(checkpoint_of(msg));
            drop(incoming);
            self.move_gauges(1, self.incoming.borrow().deferred.len());
            return Ok(Handled::Done { fan_out: false });
        }
        // The move is complete here.
        shard.received().insert(mv.source_partition, mv.source_offset);
        counter!(m::MOVES_TOTAL, "side" => "destination", "outcome" => "completed").increment(1);
        let age = (crate::dlq::now_millis() - mv.issued_at).max(0) as f64 / 1000.0;
        histogram!(m::MOVE_SECONDS).record(age);
        info!(partition = self.partition, offset = msg.offset(), from = %mv.from, to = %mv.to, source = ?mv.source(), chunks = mv.chunk + 1, "cross-key move received");
        let waiting = {
            let mut incoming = self.incoming.borrow_mut();
            incoming.active = None;
            incoming.latest = Some(checkpoint_of(msg));
            std::mem::take(&mut incoming.deferred)
        };
        // What waited is handled now, in its order (a chunk of another move
        // among it opens that move, and the rest waits again).
        for w in &waiting {
            self.handle(shard, w)?;
        }
        let mut incoming = self.incoming.borrow_mut();
        if incoming.quiet() {
            if let Some(at) = incoming.latest.take() {
                shard.mark_applied(at);
            }
        }
        self.move_gauges(usize::from(incoming.active.is_some()), incoming.deferred.len());
        Ok(Handled::Done { fan_out: true })
    }

    /// Before a take-over (a cross-key move's first chunk, an owner
    /// change's upsert): waits until the partition the documents leave has
    /// applied its log up to `departure` (the rename, or the owner change's
    /// delete half), in this index. Live, the producer's barrier (a move's
    /// source commits before it writes the chunks) makes this so at once;
    /// a replay or a rebuild, whose partitions run at their own pace, then
    /// takes documents over in the order they changed owners, which is
    /// what Elasticsearch, where partitions share documents, needs (see
    /// docs/cross-key.md). Every dependency points at an earlier event of
    /// the live run, so waits never form a cycle; what this partition
    /// applied is committed first, for the partitions that wait for it.
    fn await_departure(&self, shard: &mut dyn Shard, departure: crate::command::LogPosition, offset: i64, what: &str) -> Step<()> {
        let (from, partition) = (departure.partition, self.partition);
        // This partition's own log orders it.
        if from == partition || !self.shared.cfg.takeover_waits {
            return Ok(());
        }
        if !(0..self.shared.log_partitions).contains(&from) {
            warn!(partition, offset, from, "{what} names partition {from}, which the topic does not have: applied without waiting");
            return Ok(());
        }
        let ready = || -> Result<bool, IndexError> {
            Ok(crate::moves::departed(self.shared.backend.checkpoints(&[from])?.get(&from).map(|c| c.offset), departure.offset))
        };
        if ready()? {
            return Ok(());
        }
        self.commit_before(shard)?;
        counter!(m::TAKEOVER_WAITS_TOTAL).increment(1);
        let target = (from, departure.offset - 1);
        self.shared.awaited.lock().expect("awaited lock").push(target);
        self.shared.awaiting.fetch_add(1, Ordering::SeqCst);
        let waiting = gauge!(m::TAKEOVERS_WAITING, "partition" => partition.to_string());
        waiting.set(1.0);
        info!(partition, offset, from, departure = departure.offset, "{what} waits until partition {from} is applied up to its departure (a replay or rebuild)");
        let started = Instant::now();
        let mut said = started;
        let result = loop {
            if self.stopping() {
                break Err(Halt::Stopped);
            }
            std::thread::sleep(Duration::from_millis(20));
            match ready() {
                Ok(true) => break Ok(()),
                Ok(false) => {}
                Err(e) => break Err(e.into()),
            }
            if said.elapsed() >= Duration::from_secs(60) {
                said = Instant::now();
                warn!(partition, offset, from, departure = departure.offset, waited_secs = started.elapsed().as_secs(), "{what} still waits for partition {from}: is a worker applying it?");
            }
        };
        {
            let mut awaited = self.shared.awaited.lock().expect("awaited lock");
            if let Some(i) = awaited.iter().position(|a| *a == target) {
                awaited.swap_remove(i);
            }
            self.shared.awaiting.fetch_sub(1, Ordering::SeqCst);
        }
        waiting.set(0.0);
        if result.is_ok() {
            info!(partition, offset, from, ms = started.elapsed().as_millis() as u64, "{what}: partition {from} reached the departure, taking over");
        }
        result
    }

    /// Whether a take-over of this process waits for this partition to pass
    /// an offset the batch has reached (it then commits at once).
    fn awaited(&self, batch: &[OwnedMessage]) -> bool {
        if self.shared.awaiting.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let Some(at) = batch.last().map(|m| m.offset()) else { return false };
        self.shared.awaited.lock().expect("awaited lock").iter().any(|&(p, o)| p == self.partition && o <= at)
    }

    /// Commits what the batch applied so far, before its last message: a
    /// take-over about to wait (another partition may be waiting for this
    /// one's progress), a cross-key rename about to write its chunks (whose
    /// destination waits for it). A refusal for good is
    /// [`Halt::CommitFirst`].
    fn commit_before(&self, shard: &mut dyn Shard) -> Step<()> {
        match shard.commit() {
            Ok(()) => Ok(()),
            Err(e) if e.is_retryable() => Err(Halt::Retry(e)),
            Err(e) => Err(Halt::CommitFirst(e)),
        }
    }

    /// A message that cannot be admitted: aborted at once (decoding and
    /// validation are deterministic: retrying changes nothing).
    fn reject(&self, shard: &mut dyn Shard, origin: &Origin<'_>, r: Rejection) -> Step<Handled> {
        counter!(m::MESSAGES_REJECTED_TOTAL, "reason" => r.reason).increment(1);
        count("unknown", if r.reason == reason::INVALID_COMMAND { outcome::INVALID } else { outcome::UNDECODABLE });
        self.abort(shard, origin, r.reason, r.detail, 1, None)
    }

    /// Applies a command, retrying a permanent index failure up to
    /// `max_attempts` times before aborting it.
    fn command(&self, shard: &mut dyn Shard, e: &Envelope, pos: i64, origin: &Origin<'_>) -> Step<Handled> {
        let (partition, cmd) = (self.partition, &e.command);
        while crate::faults::lists("apply.hold", &cmd.key()) && !self.stopping() {
            std::thread::sleep(Duration::from_millis(20));
        }
        if cmd.is_fan_out() {
            info!(partition, offset = pos, command = cmd.kind(), key = cmd.key(), "fan-out started");
        }
        let mut retry = self.retrying(Op::Rejected);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let t = Instant::now();
            let result = if crate::faults::lists("index.reject", &cmd.key()) {
                Err(IndexError::Rejected("injected fault index.reject".into()))
            } else if let (Command::RenamePath { from, to }, Some(_)) = (cmd, cmd.destination_key()) {
                self.move_out(shard, e, from, to, pos)?
            } else {
                apply(shard, cmd, pos as u64, self.shared.cfg.fan_out)
            };
            match result {
                Ok(docs) => {
                    let elapsed = t.elapsed();
                    histogram!(m::COMMAND_DOCUMENTS, "type" => cmd.kind()).record(docs as f64);
                    histogram!(m::COMMAND_SECONDS, "type" => cmd.kind()).record(elapsed.as_secs_f64());
                    count(cmd.kind(), outcome::APPLIED);
                    self.shared.stats.record(docs, cmd.is_fan_out(), elapsed);
                    if cmd.is_fan_out() {
                        info!(partition, offset = pos, command = cmd.kind(), documents = docs, ms = elapsed.as_millis() as u64, "fan-out applied");
                    }
                    return Ok(Handled::Done { fan_out: cmd.is_fan_out() });
                }
                Err(e) if e.is_retryable() => return Err(Halt::Retry(e)),
                Err(error) if attempts < self.shared.cfg.max_attempts.max(1) => {
                    retry.failed(&format_args!("{error} (offset {pos}, attempt {attempts})"))?;
                }
                Err(error) => {
                    count(cmd.kind(), outcome::FAILED);
                    return self.abort(shard, origin, dlq::reason::INDEX_REJECTED, error.to_string(), attempts, Some(e.command_id.clone()));
                }
            }
        }
    }

    /// The source side of a cross-key rename (see [`crate::moves`]): the
    /// files under `from`, renamed, are written to the command topic keyed
    /// by the destination, in chunks, each acknowledged before the next;
    /// only then are they deleted here. A crash before this command is
    /// committed writes them again; the destination ignores a resend of a
    /// move it completed. Writing fails only transiently (retried here, like
    /// a dead letter); index failures are the caller's.
    fn move_out(&self, shard: &mut dyn Shard, e: &Envelope, from: &str, to: &str, pos: i64) -> Step<Result<u64, IndexError>> {
        let key = crate::command::path::top_level(to);
        let partition = crate::moves::partition_of(key, self.shared.log_partitions);
        // Everything before the rename is made durable first: the
        // destination takes the documents over once this partition is
        // applied up to here (`await_departure`).
        self.commit_before(shard)?;
        // Half the largest message a worker accepts, and at most 256 KiB,
        // well below the brokers' default limit of 1 MiB.
        let mut chunker = crate::moves::Chunker::new((self.shared.cfg.max_message_bytes / 2).clamp(1024, crate::moves::MAX_CHUNK_BYTES));
        let (mut ids, mut sent, mut halted) = (Vec::new(), 0usize, None);
        let chunk = |files, last, i: usize| crate::moves::MoveIn {
            move_id: e.command_id.clone(),
            source_partition: self.partition,
            source_offset: pos,
            from: from.to_string(),
            to: to.to_string(),
            chunk: i as i32,
            last,
            issued_at: e.issued_at,
            files,
        };
        // Chunks are written as the scan fills them: only the files' ids
        // are kept, for the deletes.
        let scanned = crate::apply::move_out(shard, from, to, pos as u64, self.shared.cfg.fan_out, &mut |f| {
            if halted.is_some() {
                return;
            }
            ids.push(f.id.clone());
            if let Some(full) = chunker.push(f) {
                match self.send_chunk(&chunk(full, false, sent), partition) {
                    Ok(()) => sent += 1,
                    Err(h) => halted = Some(h),
                }
            }
        });
        if let Some(h) = halted {
            return Err(h);
        }
        if let Err(err) = scanned {
            return Ok(Err(err));
        }
        if ids.is_empty() {
            counter!(m::MOVES_TOTAL, "side" => "source", "outcome" => "empty").increment(1);
            return Ok(Ok(0));
        }
        self.send_chunk(&chunk(chunker.finish(), true, sent), partition)?;
        if crate::faults::active("move.crash-after-send").is_some() {
            error!(partition = self.partition, offset = pos, "crashing after a move's documents were handed over (fault point move.crash-after-send)");
            std::process::abort();
        }
        counter!(m::MOVES_TOTAL, "side" => "source", "outcome" => "sent").increment(1);
        info!(partition = self.partition, offset = pos, from, to, files = ids.len(), chunks = sent + 1, to_partition = partition, "cross-key rename: documents handed to the destination");
        Ok(crate::apply::remove_moved(shard, &ids, from, pos as u64).map(|_| ids.len() as u64))
    }

    /// Writes one chunk of a move to the destination's partition and waits
    /// for the acknowledgement, retrying for as long as the topic fails.
    fn send_chunk(&self, mv: &crate::moves::MoveIn, partition: i32) -> Step<()> {
        let payload = self.shared.codec.encode_move(mv);
        let mut retry = self.retrying(Op::Move);
        let at = loop {
            match self.shared.dlq.send_command(partition, mv.key().as_bytes(), &payload) {
                Ok(at) => break at,
                Err(err) => retry.failed(&format_args!("{err} (topic {}, partition {partition}; nothing is committed past this rename meanwhile)", self.shared.cfg.kafka.topic))?,
            }
        };
        debug!(partition = self.partition, offset = mv.source_offset, to_partition = partition, to_offset = at, chunk = mv.chunk, "cross-key move chunk written");
        if !mv.last && crate::faults::active("move.pause-between-chunks").is_some() {
            info!(partition = self.partition, offset = mv.source_offset, chunk = mv.chunk, "paused between a move's chunks (fault point move.pause-between-chunks)");
            while crate::faults::active("move.pause-between-chunks").is_some() && !self.stopping() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// Dead-letters a command given up on and, with `--on-abort=park`,
    /// parks its key.
    fn abort(&self, shard: &mut dyn Shard, origin: &Origin<'_>, reason: &'static str, detail: String, attempts: u32, command_id: Option<String>) -> Step<Handled> {
        let behind = command_id.clone().unwrap_or_else(|| format!("p{}@{}", self.partition, origin.offset));
        let at = self.dead_letter(origin, reason, detail.clone(), attempts, command_id, None)?;
        error!(partition = self.partition, offset = origin.offset, reason, %detail, key = ?origin.key(), dlq_offset = at, "command aborted and dead-lettered");
        if let (OnAbort::Park, Some(k)) = (self.shared.cfg.on_abort, origin.key()) {
            warn!(partition = self.partition, key = %k, "key parked: its later commands wait in the dead-letter topic for `denorm dlq reprocess` or `clear`");
            let p = shard.parking().entry(k.into_owned()).or_insert(Parked { behind: String::new(), last_dlq: -1, replayed_through: -1 });
            p.behind = behind;
            p.last_dlq = at;
        }
        Ok(Handled::Done { fan_out: false })
    }

    /// Dead-letters a command of a parked key.
    fn park(&self, shard: &mut dyn Shard, origin: &Origin<'_>, command_id: Option<String>, behind: String, kind: &'static str) -> Step<Handled> {
        let detail = format!("its key is parked behind command {behind}");
        let at = self.dead_letter(origin, dlq::reason::PARKED, detail, 0, command_id, Some(behind))?;
        count(kind, outcome::PARKED);
        if let Some(p) = origin.key().and_then(|k| shard.parking().get_mut(k.as_ref())) {
            p.last_dlq = at;
        }
        Ok(Handled::Done { fan_out: false })
    }

    /// Carries out an operator's control message (see [`crate::dlq`]).
    fn control(&self, shard: &mut dyn Shard, msg: &OwnedMessage, c: Control) -> Step<Handled> {
        count("control", outcome::CONTROL);
        match c.action {
            Action::Replay => {
                let origin = Origin { key: msg.key(), payload: Some(&c.payload), offset: c.origin_offset };
                if let Some(p) = shard.parking().get(&c.key).cloned() {
                    if p.last_dlq > c.through {
                        // Something of this key was dead-lettered after the
                        // operator looked: replaying now would overtake it.
                        return self.park(shard, &origin, None, p.behind, "control");
                    }
                    if c.dlq_offset <= p.replayed_through {
                        return Ok(Handled::Done { fan_out: false });
                    }
                }
                let handled = match admit(&self.shared.codec, msg.key(), Some(&c.payload), self.shared.cfg.max_message_bytes) {
                    Err(NotAdmitted::Unavailable(e)) => return Err(Halt::Retry(IndexError::Dependency(e))),
                    Err(NotAdmitted::Rejected(r)) => self.reject(shard, &origin, r)?,
                    Ok(Admitted::Control(_)) => {
                        let r = Rejection { reason: reason::INVALID_COMMAND, detail: "a control message cannot be replayed".into() };
                        self.reject(shard, &origin, r)?
                    }
                    Ok(Admitted::Command(e)) => self.command(shard, &e, msg.offset(), &origin)?,
                    // A move's chunk that was dead-lettered (the index
                    // refused one of its documents): its files are written
                    // as of now, like upserts.
                    Ok(Admitted::Move(mv)) => {
                        crate::apply::move_in(shard, &mv, msg.offset() as u64)?;
                        Handled::Done { fan_out: false }
                    }
                };
                if let (Handled::Done { .. }, Some(p)) = (&handled, shard.parking().get_mut(&c.key)) {
                    p.replayed_through = p.replayed_through.max(c.dlq_offset);
                }
                Ok(handled)
            }
            Action::Resolve | Action::Discard => {
                let kind = c.action.marker();
                self.retry_dead_letter(|| self.shared.dlq.mark(c.dlq_partition, &c.key, kind, c.through, self.partition))?;
                let parked = shard.parking().get(&c.key).map(|p| p.last_dlq);
                match parked {
                    Some(last) if last <= c.through => {
                        shard.parking().remove(&c.key);
                        info!(partition = self.partition, key = %c.key, marker = kind.as_str(), "key resumed");
                    }
                    Some(_) => warn!(
                        partition = self.partition,
                        key = %c.key,
                        "key stays parked: more of its commands were dead-lettered after the operator's request; run `denorm dlq reprocess` again"
                    ),
                    None => {}
                }
                Ok(Handled::Done { fan_out: false })
            }
        }
    }

    /// Writes the letter of `origin`, retrying for as long as the
    /// dead-letter topic fails. Its offset there.
    fn dead_letter(&self, origin: &Origin<'_>, reason: &'static str, detail: String, attempts: u32, command_id: Option<String>, parked_behind: Option<String>) -> Step<i64> {
        let letter = Letter {
            key: origin.key,
            payload: origin.payload,
            reason,
            detail,
            origin_partition: self.partition,
            origin_offset: origin.offset,
            attempts,
            command_id,
            parked_behind,
        };
        let at = self.retry_dead_letter(|| self.shared.dlq.write(&letter))?;
        counter!(m::DEAD_LETTERS_TOTAL, "reason" => reason).increment(1);
        Ok(at)
    }

    fn retry_dead_letter(&self, mut write: impl FnMut() -> Result<i64, rdkafka::error::KafkaError>) -> Step<i64> {
        let mut retry = self.retrying(Op::DeadLetter);
        loop {
            match write() {
                Ok(at) => return Ok(at),
                Err(e) => retry.failed(&format_args!("{e} (topic {}; nothing is committed past this message meanwhile)", self.shared.dlq.topic))?,
            }
        }
    }
}

/// How often an idle or between-batches applier looks for a new index
/// generation.
const GENERATION_CHECK: Duration = Duration::from_millis(100);

/// The most feeds received ahead of the message being handled so that the
/// documents they read are fetched together (see `Applier::prefetch`).
const PREFETCH_WINDOW: usize = 256;

/// Where fetching resumes for a shard at `checkpoint`: the checkpoint's own
/// message (read again to check the log), or the beginning.
/// An owner change's upsert without `after` (a producer that does not set
/// it, or a topic copied by `denorm migrate`) is applied without waiting
/// for its delete half: said once per process, since a replay into
/// Elasticsearch of a document that changes owner through such upserts more
/// than once may then lose it (docs/cross-key.md).
fn warn_without_after(partition: i32, offset: i64, what: &str) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        warn!(partition, offset, "{what} does not say where its delete half is (the envelope's after): applied without waiting for it; a replay into Elasticsearch of a document changing owner so more than once may lose it (said once)");
    }
}

fn target_of(checkpoint: Option<Checkpoint>) -> Offset {
    checkpoint.map_or(Offset::Beginning, |c| Offset::Offset(c.offset as i64))
}

/// The checkpoint that names `msg`: its offset and fingerprint.
fn checkpoint_of(msg: &OwnedMessage) -> Checkpoint {
    Checkpoint::new(msg.offset() as u64, crate::logid::fingerprint(msg.key(), msg.payload()))
}

fn count(kind: &'static str, outcome: &'static str) {
    counter!(m::COMMANDS_TOTAL, "type" => kind, "outcome" => outcome).increment(1);
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
