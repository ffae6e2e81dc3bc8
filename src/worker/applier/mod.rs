//! One partition's applier: owns the partition's shard writer, applies its
//! messages in log order, commits the index, then publishes the next offset
//! that may be committed to Kafka. Split by role: the loop and batch
//! triggers (`batch`), positioning (`position`), recovery and retries
//! (`retry`), dispatch (`dispatch`), both sides of a move (`moves`), and
//! dead-lettering (`dead_letter`).

mod batch;
mod dead_letter;
mod dispatch;
mod hold;
mod lanes;
mod moves;
mod position;
mod publication;
mod queue;
mod receiving;
mod retry;
mod spill;
mod spill_file;
#[cfg(test)]
pub(super) mod tests;
mod tracker;
mod triggers;
mod turn;

pub(crate) use lanes::LaneFanOuts;
pub(crate) use queue::{queued_size, FeedQueue, Queued, Refused};

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use rdkafka::Offset;
use tracing::{debug, error, info, warn};

use super::admit::{admit, reason, Admitted, NotAdmitted, Rejection};
use super::{OnAbort, Shared, WorkerError};
use crate::apply::apply;
use crate::command::control::{Action, Control};
use crate::command::{Command, Envelope};
use crate::dlq::{self, Letter};
use crate::index::progress::{DoneAbove, Parked};
use crate::index::{Checkpoint, IndexError, Shard};
use crate::metrics::{self as m, outcome};
use crate::retry::Backoff;
use dead_letter::Origin;
use publication::Publication;
use retry::{Op, Retrying};

/// A message of the command topic as an applier sees it: no client types,
/// so that the applier runs without a broker (its tests feed it records).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// When it was produced (the message's timestamp), in milliseconds.
    pub timestamp_ms: Option<i64>,
    /// Its `denorm-signature` header ([`crate::signing`]), if any.
    pub signature: Option<Vec<u8>>,
}

impl Record {
    /// A copy of a client message.
    pub fn of(m: &impl rdkafka::message::Message) -> Record {
        let signature = crate::signing::signature_in(m.headers());
        Record { offset: m.offset(), key: m.key().map(<[u8]>::to_vec), payload: m.payload().map(<[u8]>::to_vec), timestamp_ms: m.timestamp().to_millis(), signature }
    }

    pub fn offset(&self) -> i64 {
        self.offset
    }

    pub fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }

    pub fn payload(&self) -> Option<&[u8]> {
        self.payload.as_deref()
    }
}

/// What the consumer thread hands an applier.
pub(crate) enum Feed {
    Message(Record),
    /// The partition was positioned where the applier asked
    /// ([`Shared::seeks`]), at this offset: messages before this one were
    /// fetched from the old position and are dropped; the next one comes
    /// from the new.
    Positioned(Offset),
    /// The partition was read to its end: the consumer's position, past
    /// offsets that carry no message (transaction markers, aborted
    /// records) as well as every message fed before this.
    End(i64),
}

/// [`Partition::floor`] before the group's offset was read.
pub(crate) const FLOOR_UNKNOWN: i64 = i64::MIN;

/// The consumer thread's handle on one partition's applier.
pub(crate) struct Partition {
    /// This applier's identity, unique in the process: its seeks carry it.
    pub id: u64,
    /// The applier's queue, bounded by `--queue-kb` (`queue.rs`).
    pub queue: FeedQueue,
    /// When the applier started on the message it is handling now
    /// (milliseconds since the epoch; 0 while it handles none): what
    /// `denorm_partition_oldest_unfinished_seconds` reports.
    pub busy_since_ms: Arc<AtomicI64>,
    pub stop: Arc<AtomicBool>,
    /// Next offset whose predecessors are durably applied (-1: none yet).
    pub next: Arc<AtomicI64>,
    /// What is durably applied above `next` (issue 45), published with it.
    pub done: Arc<std::sync::Mutex<DoneAbove>>,
    /// The metadata of the last commit sent.
    sent_metadata: String,
    /// The group's committed offset for the partition, as commits are
    /// confirmed.
    pub committed: i64,
    /// The group's committed offset when the applier started (-1: none;
    /// [`FLOOR_UNKNOWN`] until read). Never committed below: an index
    /// restored from an older copy catches up without moving the group
    /// back.
    pub floor: Arc<AtomicI64>,
    /// Messages (and ends of the partition) fetched while the applier's
    /// queue was full.
    pub pending: std::collections::VecDeque<Feed>,
    /// Since when the partition is paused (its queue full, or a replay's
    /// partition applied up to where it stops).
    pub paused: Option<Instant>,
    /// Whether the group's offset is committed (see
    /// [`Mode::commits_offsets`](crate::worker::Mode::commits_offsets)).
    commits: bool,
    join: Option<JoinHandle<Result<(), WorkerError>>>,
}

impl Partition {
    /// Starts the applier of `partition`.
    pub fn spawn(partition: i32, shared: Arc<Shared>) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let (queue, rx) = queue::feed_queue(shared.cfg.queue_bytes);
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicI64::new(-1));
        let done: Arc<std::sync::Mutex<DoneAbove>> = Arc::default();
        let floor = Arc::new(AtomicI64::new(FLOOR_UNKNOWN));
        let queued = queue.queued().clone();
        let busy_since_ms = Arc::new(AtomicI64::new(0));
        let (s, n, q, f, busy, d) = (stop.clone(), next.clone(), queued.clone(), floor.clone(), busy_since_ms.clone(), done.clone());
        let commits = shared.cfg.mode.commits_offsets();
        let join = std::thread::Builder::new()
            .name(format!("denorm-p{partition}"))
            .spawn(move || Applier::new(partition, id, shared, s, Publication::new(n, d), f, q, busy).run(rx))
            .expect("spawn partition thread");
        Partition { id, queue, busy_since_ms, stop, next, done, sent_metadata: String::new(), committed: -1, floor, pending: Default::default(), paused: None, commits, join: Some(join) }
    }

    /// The offset to commit for the partition, with its metadata (what is
    /// applied above it, [`DoneAbove::to_metadata`]), if it moved past what
    /// the group has, or what is applied above it changed (nothing while
    /// the group's offset is not known yet).
    pub fn next_commit(&mut self) -> Option<(i64, String)> {
        if !self.commits {
            return None;
        }
        let (next, floor) = (self.next.load(Ordering::SeqCst), self.floor.load(Ordering::SeqCst));
        if floor == FLOOR_UNKNOWN || next < self.committed.max(floor) || next < 0 {
            return None;
        }
        let metadata = self.done.lock().expect("done lock").to_metadata(next);
        let moved = next > self.committed.max(floor);
        if !moved && metadata == self.sent_metadata {
            return None;
        }
        self.sent_metadata = metadata.clone();
        Some((next, metadata))
    }

    pub fn finished(&self) -> bool {
        self.join.as_ref().is_none_or(|j| j.is_finished())
    }

    /// Waits for the applier to finish (after [`Partition::stop`] was set or
    /// on its own). Returns its result.
    pub fn join(&mut self) -> Result<(), WorkerError> {
        match self.join.take() {
            Some(j) => j.join().unwrap_or_else(|_| Err(WorkerError::Panicked)),
            None => Ok(()),
        }
    }
}

struct Applier {
    partition: i32,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    /// What is published to the consumer thread (`publication.rs`): the
    /// next offset, what is applied above it, the end reported.
    publication: std::cell::RefCell<publication::Publication>,
    /// See [`Partition::floor`].
    floor: Arc<AtomicI64>,
    queued: Arc<Queued>,
    /// See [`Partition::busy_since_ms`].
    busy_since_ms: Arc<AtomicI64>,
    /// `denorm_consumer_lag_seconds` of this partition, resolved once.
    lag_seconds: metrics::Gauge,
    /// `denorm_partition_held_messages` and `_spilled_messages` of this
    /// partition, resolved once (set at every held or spilled message).
    held_messages: metrics::Gauge,
    spilled_messages: metrics::Gauge,
    /// The receiving side of a cross-key move (`receiving.rs`).
    receiving: std::cell::RefCell<receiving::Receiving>,
    /// The partition's low watermark, when read at positioning.
    low: std::cell::Cell<Option<i64>>,
    /// Key lanes: the fan-outs in progress, the messages waiting behind
    /// them, and which offset may be recorded as applied (`lanes.rs`).
    lanes: std::cell::RefCell<lanes::Lanes>,
    /// See [`Partition::id`].
    id: u64,
    /// What was received since the last seek asked
    /// ([`Applier::received`]).
    reading: std::cell::Cell<position::Reading>,
    /// The offset of a `PLACE` control handled again after the shard was
    /// reopened to read the placement afresh: not taken then either, it
    /// names a placement move that was never recorded.
    place_reread: std::cell::Cell<Option<i64>>,
}

impl Applier {
    #[allow(clippy::too_many_arguments)]
    fn new(partition: i32, id: u64, shared: Arc<Shared>, stop: Arc<AtomicBool>, publication: Publication, floor: Arc<AtomicI64>, queued: Arc<Queued>, busy_since_ms: Arc<AtomicI64>) -> Applier {
        let label = partition.to_string();
        Applier {
            partition,
            id,
            shared,
            stop,
            publication: std::cell::RefCell::new(publication),
            floor,
            queued,
            busy_since_ms,
            lag_seconds: gauge!(m::CONSUMER_LAG_SECONDS, "partition" => label.clone()),
            held_messages: gauge!(m::PARTITION_HELD_MESSAGES, "partition" => label.clone()),
            spilled_messages: gauge!(m::PARTITION_SPILLED_MESSAGES, "partition" => label),
            receiving: std::cell::RefCell::new(receiving::Receiving::new(partition)),
            low: Default::default(),
            lanes: Default::default(),
            reading: Default::default(),
            place_reread: Default::default(),
        }
    }

    /// Records the step `what` of the message at `offset` (the applier's
    /// tests trace a message's way through the loop, and read the order
    /// commands were applied in from the [`APPLIED`] steps; nothing
    /// otherwise).
    #[inline]
    fn trace(&self, offset: i64, what: &'static str) {
        #[cfg(test)]
        self.shared.stats.events.lock().expect("events lock").push((offset, what));
        #[cfg(not(test))]
        let _ = (offset, what);
    }

    /// An applier of partition 0 on `shared` that no thread runs: the
    /// tests call its steps one by one.
    #[cfg(test)]
    fn idle(shared: Arc<Shared>) -> Applier {
        let publication = Publication::new(Arc::new(AtomicI64::new(-1)), Arc::default());
        Applier::new(0, 0, shared, Arc::default(), publication, Arc::new(AtomicI64::new(FLOOR_UNKNOWN)), Arc::default(), Arc::default())
    }
}

/// The step [`Applier::trace`] records for a command applied (in the loop,
/// or its fan-out finished in a lane).
const APPLIED: &str = "applied";

/// What became of one message.
enum Handled {
    /// Applied, dead-lettered or carried out: the offset may be committed.
    Done { fan_out: bool },
    /// Already applied before (redelivery).
    Duplicate,
    /// Passed over while a cross-key move is in flight (`receiving.rs`):
    /// read again and handled once it ends.
    PassedOver,
    /// A fan-out started in its key's lane, run a page at a time.
    Deferred(Box<lanes::Job>),
}

/// Why an applier step did not finish: every step returns [`Step`].
pub(crate) enum Halt {
    /// A transient failure (index, schema registry) while handling a
    /// message: the caller reopens the shard and handles it again.
    Retry(Transient),
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
    /// write its chunks, a fan-out about to scan: see
    /// [`Applier::commit_before`]): the batch is
    /// committed one message at a time, finding the command at fault.
    CommitFirst(IndexError),
}

type Step<T> = Result<T, Halt>;

/// A failure that may pass: retried (with backoff, the partition reported
/// degraded) for as long as it lasts.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Transient {
    #[error(transparent)]
    Index(IndexError),
    /// The schema registry could not resolve a message's schema id now.
    #[error("{0}")]
    Registry(String),
    /// A tenant moved between placements (a `PLACE` control message) since
    /// the shard was opened: it is reopened to read the placement. Not a
    /// failure: the partition is not reported degraded.
    #[error("{0}")]
    Placement(String),
}

impl From<Transient> for WorkerError {
    fn from(t: Transient) -> Self {
        match t {
            Transient::Index(e) => WorkerError::Index(e),
            Transient::Registry(e) => WorkerError::Registry(e),
            Transient::Placement(e) => WorkerError::Index(IndexError::Fenced(e)),
        }
    }
}

impl From<IndexError> for Halt {
    /// An index failure where no command is to blame: retried when it is
    /// transient, fatal otherwise.
    fn from(e: IndexError) -> Self {
        if e.kind() == crate::retry::Kind::Transient {
            Halt::Retry(Transient::Index(e))
        } else {
            Halt::Fatal(WorkerError::Index(e))
        }
    }
}

type ShardBox = Box<dyn Shard + Send>;

impl Applier {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Whether a replay that stops at given offsets
    /// ([`Mode::until`](crate::worker::Mode::until)) is past this partition's.
    fn past_until(&self, offset: i64) -> bool {
        self.shared.cfg.mode.until(self.partition).is_some_and(|last| offset > last)
    }

    fn retrying(&self, op: Op) -> Retrying<'_> {
        Retrying { applier: self, op, backoff: Backoff::new(Duration::from_millis(50), self.shared.cfg.retry_backoff_max), degraded: None }
    }

    fn run(self, rx: Receiver<Feed>) -> Result<(), WorkerError> {
        match self.apply_until_stopped(rx) {
            Ok(()) | Err(Halt::Stopped | Halt::Moved) => Ok(()),
            Err(Halt::Fatal(e)) => Err(e),
            Err(Halt::Retry(e)) => Err(e.into()),
            Err(Halt::CommitFirst(e)) => Err(WorkerError::Index(e)),
        }
    }
}

/// How often an idle or between-batches applier looks for a new index
/// generation.
const GENERATION_CHECK: Duration = Duration::from_millis(100);

/// The most feeds received ahead of the message being handled so that the
/// documents they read are fetched together (see `Applier::prefetch`).
const PREFETCH_WINDOW: usize = 256;

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

/// Where fetching resumes for a shard at `checkpoint`: the checkpoint's own
/// message (read again to check the log), or the beginning.
pub(crate) fn target_of(checkpoint: Option<Checkpoint>) -> Offset {
    checkpoint.map_or(Offset::Beginning, |c| Offset::Offset(c.offset as i64))
}

/// The checkpoint that names `msg`: its offset and fingerprint.
fn checkpoint_of(msg: &Record) -> Checkpoint {
    Checkpoint::new(msg.offset() as u64, crate::logid::fingerprint(msg.key(), msg.payload()))
}

fn count(kind: &'static str, outcome: &'static str) {
    counter!(m::COMMANDS_TOTAL, "type" => kind, "outcome" => outcome).increment(1);
}

fn age_seconds(msg: &Record) -> f64 {
    let now = crate::clock::now_millis();
    msg.timestamp_ms.map(|t| ((now - t).max(0)) as f64 / 1000.0).unwrap_or(0.0)
}

impl From<IndexError> for WorkerError {
    fn from(e: IndexError) -> Self {
        WorkerError::Index(e)
    }
}
