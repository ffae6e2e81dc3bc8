//! The applier's scenarios in-process: a scripted feed plays the consumer
//! thread (it serves the seeks the applier asks for, from a log held in
//! memory), a scripted outbox takes the dead letters and move chunks, and
//! the index is the embedded one in a temporary directory. No broker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::Offset;

use super::{Feed, Partition, Record, Refused};
use crate::codec::Codec;
use crate::command::moves::{MoveIn, MovedFile};
use crate::command::{Command, Envelope};
use crate::dlq::{Letter, MarkerKind};
use crate::index::embedded::{EmbeddedBackend, EmbeddedIndex};
use crate::index::{Doc, Kind, SearchIndex};
use crate::kafka::KafkaConfig;
use crate::worker::outbox::Outbox;
use crate::worker::probe::LogProbe;
use crate::worker::{Mode, Replay, ReplayOf, Shared, Stats, WorkerConfig};

/// A dead letter as the outbox received it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    reason: String,
    origin_offset: i64,
    key: String,
}

/// The broker's answers of the tests, from the log held in memory: the
/// group has committed nothing.
struct LogOf(Arc<Mutex<Log>>);

/// One partition's log: its messages, and its end (offsets may carry no
/// message, like a transaction's marker).
#[derive(Default, Clone)]
struct Log {
    records: Vec<Record>,
    /// Its low watermark: what retention left starts there.
    low: i64,
    end: i64,
}

impl Log {
    fn append(&mut self, key: &[u8], payload: Vec<u8>) -> i64 {
        self.append_signed(key, payload, None)
    }

    fn append_signed(&mut self, key: &[u8], payload: Vec<u8>, signature: Option<Vec<u8>>) -> i64 {
        let offset = self.end;
        self.records.push(Record { offset, key: Some(key.to_vec()), payload: Some(payload), timestamp_ms: None, signature });
        self.end += 1;
        offset
    }

    /// The index of the first message at or after `offset`.
    fn from(&self, offset: i64) -> usize {
        self.records.partition_point(|r| r.offset < offset)
    }
}

impl LogProbe for LogOf {
    fn watermarks(&self, _: i32) -> Option<(i64, i64)> {
        let log = self.0.lock().unwrap();
        Some((log.low, log.end))
    }

    fn committed(&self, _: i32) -> Option<i64> {
        None
    }

    fn group_lag(&self) -> Option<i64> {
        None
    }
}

/// The outbox of the tests: keeps the letters it is given, in order, and
/// appends the messages for the command topic to the partition's log (the
/// tests have one partition: a cross-key move's chunks land there).
#[derive(Default)]
struct Scripted {
    letters: Mutex<Vec<Sent>>,
    log: Arc<Mutex<Log>>,
    /// The topics' message limit in bytes, like a broker's (0: none).
    limit: std::sync::atomic::AtomicUsize,
    /// Letters written without their command: (origin offset, its size).
    omitted: Mutex<Vec<(i64, usize)>>,
    /// The dead-letter offset of the first letter (letters already in the
    /// topic, for a replay).
    base: i64,
    /// Markers written: (key, kind).
    markers: Mutex<Vec<(String, MarkerKind)>>,
    /// Signs the messages for the command topic, as a worker does.
    signing: Option<Arc<crate::signing::Signing>>,
}

impl Scripted {
    fn refuse_over(&self, bytes: usize) -> Result<(), rdkafka::error::KafkaError> {
        let limit = self.limit.load(Ordering::SeqCst);
        match limit > 0 && bytes > limit {
            true => Err(rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::MessageSizeTooLarge)),
            false => Ok(()),
        }
    }
}

impl Outbox for Arc<Scripted> {
    fn dead_letter_topic(&self) -> &str {
        "t.dlq"
    }

    fn dead_letter(&self, l: &Letter<'_>) -> Result<i64, rdkafka::error::KafkaError> {
        self.refuse_over(l.payload.map_or(0, <[u8]>::len))?;
        if let Some(n) = l.payload_omitted {
            self.omitted.lock().unwrap().push((l.origin_offset, n));
        }
        let mut letters = self.letters.lock().unwrap();
        letters.push(Sent { reason: l.reason.into(), origin_offset: l.origin_offset, key: String::from_utf8_lossy(l.key.unwrap_or_default()).into() });
        Ok(self.base + letters.len() as i64 - 1)
    }

    fn marker(&self, _: i32, key: &str, kind: MarkerKind, _: i64, _: i64, _: i32) -> Result<i64, rdkafka::error::KafkaError> {
        self.markers.lock().unwrap().push((key.to_string(), kind));
        Ok(0)
    }

    fn command(&self, _: i32, key: &[u8], payload: &[u8]) -> Result<i64, rdkafka::error::KafkaError> {
        self.refuse_over(payload.len())?;
        let signature = self.signing.as_ref().map(|s| s.sign("t", Some(key), payload).into_bytes());
        Ok(self.log.lock().unwrap().append_signed(key, payload.to_vec(), signature))
    }
}

/// One partition's log, an index, and what an applier shares.
pub(in crate::worker) struct Rig {
    dir: tempfile::TempDir,
    log: Arc<Mutex<Log>>,
    outbox: Arc<Scripted>,
    pub(in crate::worker) shared: Arc<Shared>,
    codec: Codec,
    /// Seeks still to be overtaken by the partition's own start (served
    /// from offset 0 instead of where they asked).
    stale_starts: Arc<std::sync::atomic::AtomicUsize>,
    /// Where a stale start fetches from (the group's offset; 0 unless set).
    stale_from: Arc<std::sync::atomic::AtomicI64>,
    /// A seek served late, as the client may serve one made right after an
    /// assignment once it has fetched from the group's offset: once this
    /// many messages were fed, the partition is said positioned again and
    /// served again from the offset given.
    late_seek: Arc<Mutex<Option<(usize, i64)>>>,
    /// The feed offers each message as the consumer thread does, and waits
    /// while the queue holds `--queue-kb` (the consumer pauses the
    /// partition then); otherwise it queues everything at once.
    bounded: Arc<AtomicBool>,
}

/// A running applier and the feed that serves it.
pub(in crate::worker) struct Running {
    part: Partition,
    feeding: Arc<AtomicBool>,
    feeder: Option<std::thread::JoinHandle<()>>,
    /// The offsets the applier asked to be positioned at.
    seeks: Arc<Mutex<Vec<i64>>>,
    /// Messages fed so far.
    sent: Arc<std::sync::atomic::AtomicUsize>,
}

pub(in crate::worker) fn eventually(what: &str, check: impl FnMut() -> bool) {
    eventually_within(Duration::from_secs(30), what, check);
}

/// [`eventually`] with its own bound (a long test in the debug build,
/// under the suite's load).
fn eventually_within(bound: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !check() {
        assert!(Instant::now() < deadline, "not within {bound:?}: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Rig {
    pub(in crate::worker) fn new(tune: impl FnOnce(&mut WorkerConfig)) -> Rig {
        Rig::on(Arc::default(), 0, 1, tune)
    }

    /// Partition 0 of a topic of `partitions`.
    fn of(partitions: i32, tune: impl FnOnce(&mut WorkerConfig)) -> Rig {
        Rig::on(Arc::default(), 0, partitions, tune)
    }

    /// A fresh index, as a rebuild has, replaying `self`'s log; its letters
    /// go after the `already` the dead-letter topic holds, which also holds
    /// the markers `markers`.
    fn replay(&self, already: i64, markers: Vec<crate::dlq::MarkerId>) -> Rig {
        let log = Arc::new(Mutex::new(self.log.lock().unwrap().clone()));
        Rig::on(log, already, 1, |c| c.mode = Mode::Replay(Replay { markers_written: Arc::new(markers.into_iter().collect()), ..Default::default() }))
    }

    fn on(log: Arc<Mutex<Log>>, base: i64, log_partitions: i32, tune: impl FnOnce(&mut WorkerConfig)) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let index = EmbeddedIndex::open(dir.path(), "t").unwrap();
        let mut cfg = WorkerConfig::new(KafkaConfig::new("127.0.0.1:9", "t"), "g");
        cfg.retry_backoff_max = Duration::from_millis(50);
        tune(&mut cfg);
        let writes = cfg.mode.writes_to_kafka();
        let outbox = Arc::new(Scripted { log: log.clone(), base, signing: cfg.kafka.signing.clone(), ..Scripted::default() });
        let shared = Arc::new(Shared {
            cfg,
            backend: Arc::new(EmbeddedBackend::new(index, 20 << 20)),
            codec: Codec::new(),
            stats: Arc::new(Stats::default()),
            // As `worker::run` chooses: a replay that writes nothing to
            // Kafka (a verify's) has the outbox that withholds.
            outbox: match writes {
                true => Box::new(outbox.clone()),
                false => Box::new(crate::worker::outbox::Withheld::new("t.dlq")),
            },
            health: Arc::default(),
            seeks: Mutex::default(),
            known: Mutex::default(),
            assigned_at: Mutex::default(),
            probe: Box::new(LogOf(log.clone())),
            log_partitions,
            awaited: Mutex::default(),
            awaiting: Default::default(),
            lane_fan_outs: Default::default(),
        });
        Rig { dir, log, outbox, shared, codec: Codec::new(), stale_starts: Arc::default(), stale_from: Arc::default(), late_seek: Arc::default(), bounded: Arc::default() }
    }

    fn append(&self, key: &str, payload: Vec<u8>) -> i64 {
        self.log.lock().unwrap().append(key.as_bytes(), payload)
    }

    /// Appends a message signed with `signing`'s first key, as a worker or
    /// an operator with the keys writes one.
    fn append_signed(&self, key: &str, payload: Vec<u8>, signing: &crate::signing::Signing) -> i64 {
        let signature = signing.sign("t", Some(key.as_bytes()), &payload).into_bytes();
        self.log.lock().unwrap().append_signed(key.as_bytes(), payload, Some(signature))
    }

    /// An offset without a message (a transaction's marker).
    fn marker(&self) {
        self.log.lock().unwrap().end += 1;
    }

    /// Retention deletes the messages before `offset`.
    fn trim(&self, offset: i64) {
        let mut log = self.log.lock().unwrap();
        log.records.retain(|r| r.offset >= offset);
        log.low = offset;
    }

    /// Appends a command to the log; its offset.
    fn produce(&self, c: Command) -> i64 {
        let key = c.key().to_string();
        self.append(&key, self.codec.encode(&Envelope::new(c)))
    }

    /// Upserts of files `f{i}` at `/a/f{i}.txt` for each `i` of `ids`.
    pub(in crate::worker) fn produce_files(&self, ids: std::ops::Range<usize>) {
        for i in ids {
            self.produce(upsert(&format!("f{i}"), &format!("/a/f{i}.txt")));
        }
    }

    /// Commits, as another partition's writer would, that `partition`'s
    /// shard applied everything up to `checkpoint` and `done` above it.
    fn source_applied(&self, partition: i32, checkpoint: u64, done: crate::index::progress::DoneAbove) {
        let mut source = self.shared.backend.open_shard(partition).unwrap();
        source.progress_mut().mark_applied(crate::index::Checkpoint { offset: checkpoint, fingerprint: None }, done);
        source.commit().unwrap();
    }

    fn produce_move(&self, m: &MoveIn) -> i64 {
        self.append(m.key(), self.codec.encode_move(m))
    }

    /// Starts an applier of partition 0, and the feed that plays the
    /// consumer thread: at each seek the applier asks for it says the
    /// partition is positioned and serves the log from there, then what is
    /// appended.
    pub(in crate::worker) fn start(&self) -> Running {
        let part = Partition::spawn(0, self.shared.clone());
        let tx = part.queue.clone();
        let (shared, log) = (self.shared.clone(), self.log.clone());
        let feeding = Arc::new(AtomicBool::new(true));
        let seeks: Arc<Mutex<Vec<i64>>> = Arc::default();
        let sent: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let (go, asked, fed, stale, late) = (feeding.clone(), seeks.clone(), sent.clone(), self.stale_starts.clone(), self.late_seek.clone());
        let stale_from = self.stale_from.clone();
        let bounded = self.bounded.clone();
        let feeder = std::thread::spawn(move || {
            let mut cursor: Option<usize> = None;
            // The end last reported (`Feed::End`), as a consumer does once
            // it has read everything.
            let mut reported: Option<i64> = None;
            while go.load(Ordering::SeqCst) {
                if let Some((_, offset)) = shared.seeks.lock().unwrap().remove(&0) {
                    let at = match offset {
                        Offset::Offset(o) => o as usize,
                        _ => 0,
                    };
                    asked.lock().unwrap().push(at as i64);
                    if !tx.positioned(offset) {
                        return;
                    }
                    // The client's own start overtaking the seek: fetching
                    // from the beginning all the same.
                    let stale = stale.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
                    cursor = Some(log.lock().unwrap().from(if stale { stale_from.load(Ordering::SeqCst) } else { at as i64 }));
                    reported = None;
                }
                let late_now = {
                    let mut late = late.lock().unwrap();
                    match *late {
                        Some((after, from)) if fed.load(Ordering::SeqCst) >= after => late.take().map(|_| from),
                        _ => None,
                    }
                };
                if let Some(from) = late_now {
                    if !tx.positioned(Offset::Offset(from)) {
                        return;
                    }
                    cursor = Some(log.lock().unwrap().from(from));
                }
                let (next, end) = {
                    let log = log.lock().unwrap();
                    (cursor.and_then(|c| log.records.get(c).cloned()), log.end)
                };
                if next.is_none() && cursor.is_some() && reported != Some(end) {
                    reported = Some(end);
                    if !tx.send_unbounded(Feed::End(end)) {
                        return;
                    }
                }
                match next {
                    Some(r) if bounded.load(Ordering::SeqCst) => match tx.offer(Feed::Message(r)) {
                        Ok(()) => {
                            fed.fetch_add(1, Ordering::SeqCst);
                            cursor = cursor.map(|c| c + 1);
                        }
                        // Paused until the applier has taken some.
                        Err(Refused::Full(_)) => std::thread::sleep(Duration::from_millis(1)),
                        Err(Refused::Ended(_)) => return,
                    },
                    Some(r) => {
                        if !tx.send_unbounded(Feed::Message(r)) {
                            return;
                        }
                        fed.fetch_add(1, Ordering::SeqCst);
                        cursor = cursor.map(|c| c + 1);
                    }
                    None => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Running { part, feeding, feeder: Some(feeder), seeks, sent }
    }

    /// The documents of the index, as committed: (id, position).
    fn docs(&self) -> Vec<(String, u64)> {
        let search = EmbeddedIndex::open_existing(self.dir.path()).unwrap().search().unwrap();
        let mut out = Vec::new();
        search.dump(&mut |d: Doc| out.push((d.id().to_string(), d.pos()))).unwrap();
        out.sort();
        out
    }

    fn file_ids(&self) -> Vec<String> {
        let search = EmbeddedIndex::open_existing(self.dir.path()).unwrap().search().unwrap();
        let mut out = Vec::new();
        search
            .dump(&mut |d: Doc| {
                if d.kind() == Kind::File {
                    out.push(d.id().to_string())
                }
            })
            .unwrap();
        out.sort();
        out
    }

    /// The files of the index, as committed: (id, full path), by id.
    pub(in crate::worker) fn files(&self) -> Vec<(String, String)> {
        let search = EmbeddedIndex::open_existing(self.dir.path()).unwrap().search().unwrap();
        let mut out = Vec::new();
        search
            .dump(&mut |d: Doc| {
                if let Doc::File(f) = d {
                    out.push((f.id.clone(), f.full_path()))
                }
            })
            .unwrap();
        out.sort();
        out
    }

    /// The chunks of cross-key moves in the log, in log order: (offset, chunk).
    fn chunks(&self) -> Vec<(i64, MoveIn)> {
        let log = self.log.lock().unwrap();
        log.records
            .iter()
            .filter_map(|r| match self.codec.decode_message(r.payload.as_deref()?) {
                Ok(crate::codec::Decoded::Move(m)) => Some((r.offset, m)),
                _ => None,
            })
            .collect()
    }

    /// The offset the next message appended gets.
    pub(in crate::worker) fn end(&self) -> i64 {
        self.log.lock().unwrap().end
    }

    fn letters(&self) -> Vec<Sent> {
        self.outbox.letters.lock().unwrap().clone()
    }
}

impl Running {
    /// Once the rename at `rename` (of `/s`) is given up, its letter
    /// written with `reason`: a later command of the destination `/t` is
    /// applied, everything is published, and that letter is the only one.
    fn rename_given_up(self, r: &Rig, rename: i64, reason: &str) {
        eventually("the rename given up", || !r.letters().is_empty());
        let later = r.produce(upsert("later", "/t/later.txt"));
        self.wait_next(later + 1);
        let end = r.end();
        self.wait_next(end);
        assert_eq!(self.stop(), end);
        assert_eq!(r.letters(), vec![Sent { reason: reason.into(), origin_offset: rename, key: "/s".into() }]);
    }

    /// The next offset whose predecessors are durably applied.
    fn next(&self) -> i64 {
        self.part.next.load(Ordering::SeqCst)
    }

    pub(in crate::worker) fn wait_next(&self, at_least: i64) {
        self.wait_next_within(Duration::from_secs(30), at_least);
    }

    /// Waits for `at_least` to be published, failing once nothing more is
    /// published for `bound`: a stall, told apart from a slow run (a debug
    /// build under the suite's load applies a long log several times slower
    /// than alone).
    fn wait_next_within(&self, bound: Duration, at_least: i64) {
        let began = self.next();
        let (mut seen, mut since) = (began, Instant::now());
        loop {
            let now = self.next();
            if now >= at_least {
                return;
            }
            if now > seen {
                (seen, since) = (now, Instant::now());
            }
            assert!(since.elapsed() < bound, "offset {at_least} not published: nothing published past {seen} for {bound:?} (at {began} when the wait began)");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for the applier to end by itself; its error.
    fn stopped_by_itself(mut self) -> crate::worker::WorkerError {
        eventually("the partition stopped by itself", || self.part.finished());
        self.feeding.store(false, Ordering::SeqCst);
        self.part.join().expect_err("the applier ended without an error")
    }

    /// Stops the applier (as a revoke or a shutdown does) and the feed; the
    /// next committable offset.
    pub(in crate::worker) fn stop(mut self) -> i64 {
        self.part.stop.store(true, Ordering::SeqCst);
        self.part.join().expect("the applier ended without error");
        let next = self.part.next.load(Ordering::SeqCst);
        self.feeding.store(false, Ordering::SeqCst);
        if let Some(f) = self.feeder.take() {
            f.join().unwrap();
        }
        next
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.part.stop.store(true, Ordering::SeqCst);
        self.feeding.store(false, Ordering::SeqCst);
    }
}

fn upsert(id: &str, path: &str) -> Command {
    Command::UpsertFile { id: id.into(), path: path.into(), contents: format!("contents of {id}"), previous_path: None }
}

/// Faults of the `failpoints` build, switched on for this test process
/// (nextest runs each test in a process of its own).
#[cfg(feature = "failpoints")]
fn fault(dir: &std::path::Path, name: &str, arg: &str) {
    std::env::set_var("DENORM_FAULTS", dir);
    std::fs::write(dir.join(name), arg).unwrap();
}

mod batches;
mod hold;
mod hostile;
mod lanes;
mod lanes_review;
mod limits;
mod moves;
mod provenance;
mod stalls;
