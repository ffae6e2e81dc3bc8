//! The applier's scenarios in-process: a scripted feed plays the consumer
//! thread (it serves the seeks the applier asks for, from a log held in
//! memory), a scripted outbox takes the dead letters and move chunks, and
//! the index is the embedded one in a temporary directory. No broker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::Offset;

use super::{queued_size, Feed, Partition, Record};
use crate::codec::Codec;
use crate::command::moves::{MoveIn, MovedFile};
use crate::command::{Command, Envelope};
use crate::dlq::{Letter, MarkerKind};
use crate::index::embedded::{EmbeddedBackend, EmbeddedIndex};
use crate::index::{Doc, Kind, SearchIndex};
use crate::kafka::KafkaConfig;
use crate::worker::outbox::Outbox;
use crate::worker::probe::LogProbe;
use crate::worker::{Shared, Stats, WorkerConfig};

/// A dead letter as the outbox received it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    reason: String,
    origin_offset: i64,
    key: String,
}

/// The broker's answers of the tests, from the log held in memory: the
/// group has committed nothing.
struct LogOf(Arc<Mutex<Vec<Record>>>);

impl LogProbe for LogOf {
    fn watermarks(&self, _: i32) -> Option<(i64, i64)> {
        Some((0, self.0.lock().unwrap().len() as i64))
    }

    fn committed(&self, _: i32) -> Option<i64> {
        None
    }

    fn group_lag(&self) -> Option<i64> {
        None
    }
}

/// The outbox of the tests: keeps what it is given, in order.
#[derive(Default)]
struct Scripted {
    letters: Mutex<Vec<Sent>>,
}

impl Outbox for Arc<Scripted> {
    fn dead_letter_topic(&self) -> &str {
        "t.dlq"
    }

    fn dead_letter(&self, l: &Letter<'_>) -> Result<i64, rdkafka::error::KafkaError> {
        let mut letters = self.letters.lock().unwrap();
        letters.push(Sent { reason: l.reason.into(), origin_offset: l.origin_offset, key: String::from_utf8_lossy(l.key.unwrap_or_default()).into() });
        Ok(letters.len() as i64 - 1)
    }

    fn marker(&self, _: i32, _: &str, _: MarkerKind, _: i64, _: i32) -> Result<i64, rdkafka::error::KafkaError> {
        Ok(0)
    }

    fn command(&self, _: i32, _: &[u8], _: &[u8]) -> Result<i64, rdkafka::error::KafkaError> {
        Ok(0)
    }
}

/// One partition's log, an index, and what an applier shares.
struct Rig {
    dir: tempfile::TempDir,
    log: Arc<Mutex<Vec<Record>>>,
    outbox: Arc<Scripted>,
    shared: Arc<Shared>,
    codec: Codec,
    /// Seeks still to be overtaken by the partition's own start (served
    /// from offset 0 instead of where they asked).
    stale_starts: Arc<std::sync::atomic::AtomicUsize>,
}

/// A running applier and the feed that serves it.
struct Running {
    part: Partition,
    feeding: Arc<AtomicBool>,
    feeder: Option<std::thread::JoinHandle<()>>,
    /// The offsets the applier asked to be positioned at.
    seeks: Arc<Mutex<Vec<i64>>>,
    /// Messages fed so far.
    sent: Arc<std::sync::atomic::AtomicUsize>,
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "not within 30 s: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Rig {
    fn new(tune: impl FnOnce(&mut WorkerConfig)) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let index = EmbeddedIndex::open(dir.path(), "t").unwrap();
        let mut cfg = WorkerConfig::new(KafkaConfig::new("127.0.0.1:9", "t"), "g");
        cfg.retry_backoff_max = Duration::from_millis(50);
        tune(&mut cfg);
        let outbox = Arc::new(Scripted::default());
        let log: Arc<Mutex<Vec<Record>>> = Arc::default();
        let shared = Arc::new(Shared {
            cfg,
            backend: Arc::new(EmbeddedBackend::new(index, 20 << 20)),
            codec: Codec::new(),
            stats: Arc::new(Stats::default()),
            outbox: Box::new(outbox.clone()),
            health: Arc::default(),
            seeks: Mutex::default(),
            known: Mutex::default(),
            assigned_at: Mutex::default(),
            probe: Box::new(LogOf(log.clone())),
            log_partitions: 1,
            awaited: Mutex::default(),
            awaiting: Default::default(),
        });
        Rig { dir, log, outbox, shared, codec: Codec::new(), stale_starts: Arc::default() }
    }

    fn append(&self, key: &str, payload: Vec<u8>) -> i64 {
        let mut log = self.log.lock().unwrap();
        let offset = log.len() as i64;
        log.push(Record { offset, key: Some(key.as_bytes().to_vec()), payload: Some(payload), timestamp_ms: None });
        offset
    }

    /// Appends a command to the log; its offset.
    fn produce(&self, c: Command) -> i64 {
        let key = c.key().to_string();
        self.append(&key, self.codec.encode(&Envelope::new(c)))
    }

    /// Upserts of files `f{i}` at `/a/f{i}.txt` for each `i` of `ids`.
    fn produce_files(&self, ids: std::ops::Range<usize>) {
        for i in ids {
            self.produce(upsert(&format!("f{i}"), &format!("/a/f{i}.txt")));
        }
    }

    fn produce_move(&self, m: &MoveIn) -> i64 {
        self.append(m.key(), self.codec.encode_move(m))
    }

    /// Starts an applier of partition 0, and the feed that plays the
    /// consumer thread: at each seek the applier asks for it says the
    /// partition is positioned and serves the log from there, then what is
    /// appended.
    fn start(&self) -> Running {
        let part = Partition::spawn(0, self.shared.clone());
        let (tx, queued) = (part.tx.clone(), part.queued.clone());
        let (shared, log) = (self.shared.clone(), self.log.clone());
        let feeding = Arc::new(AtomicBool::new(true));
        let seeks: Arc<Mutex<Vec<i64>>> = Arc::default();
        let sent: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let (go, asked, fed, stale) = (feeding.clone(), seeks.clone(), sent.clone(), self.stale_starts.clone());
        let feeder = std::thread::spawn(move || {
            let mut cursor: Option<usize> = None;
            while go.load(Ordering::SeqCst) {
                if let Some(offset) = shared.seeks.lock().unwrap().remove(&0) {
                    let at = match offset {
                        Offset::Offset(o) => o as usize,
                        _ => 0,
                    };
                    asked.lock().unwrap().push(at as i64);
                    if tx.send(Feed::Positioned).is_err() {
                        return;
                    }
                    // The client's own start overtaking the seek: fetching
                    // from the beginning all the same.
                    let stale = stale.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
                    cursor = Some(if stale { 0 } else { at });
                }
                let next = cursor.and_then(|c| log.lock().unwrap().get(c).cloned());
                match next {
                    Some(r) => {
                        queued.fetch_add(queued_size(&r), Ordering::SeqCst);
                        if tx.send(Feed::Message(r)).is_err() {
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
        search.dump(&mut |d: Doc| if d.kind() == Kind::File { out.push(d.id().to_string()) }).unwrap();
        out.sort();
        out
    }

    fn letters(&self) -> Vec<Sent> {
        self.outbox.letters.lock().unwrap().clone()
    }
}

impl Running {
    /// The next offset whose predecessors are durably applied.
    fn next(&self) -> i64 {
        self.part.next.load(Ordering::SeqCst)
    }

    fn wait_next(&self, at_least: i64) {
        eventually(&format!("offset {at_least} published (at {})", self.next()), || self.next() >= at_least);
    }

    /// Stops the applier (as a revoke or a shutdown does) and the feed; the
    /// next committable offset.
    fn stop(mut self) -> i64 {
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

#[test]
fn commands_are_committed_in_batches_and_only_whole_batches_are_published() {
    // Batches end at 10 commands: the linger and the quiet time are long.
    let r = Rig::new(|c| {
        c.max_batch = 10;
        c.commit_linger = Duration::from_secs(600);
        c.commit_quiet = Duration::from_secs(600);
    });
    for i in 0..25 {
        r.produce(upsert(&format!("f{i}"), &format!("/a/f{i}.txt")));
    }
    let run = r.start();
    let mut seen = std::collections::BTreeSet::new();
    eventually("two batches published", || {
        seen.insert(run.next());
        run.next() >= 20
    });
    for i in 25..30 {
        r.produce(upsert(&format!("f{i}"), &format!("/a/f{i}.txt")));
    }
    eventually("the third batch published", || {
        seen.insert(run.next());
        run.next() >= 30
    });
    assert!(seen.iter().all(|n| [-1, 10, 20, 30].contains(n)), "published offsets {seen:?}: only ends of batches");
    assert_eq!(run.stop(), 30);
    let docs = r.docs();
    assert_eq!(docs.len(), 30);
    assert!(docs.iter().all(|(id, pos)| format!("f{pos}") == *id), "{docs:?}");
}

#[test]
fn a_new_owner_resumes_at_the_checkpoint_itself_and_applies_nothing_twice() {
    let r = Rig::new(|_| {});
    r.produce_files(0..20);
    let first = r.start();
    first.wait_next(20);
    assert_eq!(first.seeks.lock().unwrap().clone(), vec![0], "a fresh shard starts at the beginning");
    assert_eq!(first.stop(), 20);
    let applied = r.shared.stats.applied.load(Ordering::SeqCst);
    assert_eq!(applied, 20);
    // The partition is assigned again (a rebalance): the new owner asks for
    // the checkpoint's own offset, whose message the index applied (its
    // fingerprint is checked), and applies only what follows.
    r.produce_files(20..25);
    let second = r.start();
    second.wait_next(25);
    assert_eq!(second.seeks.lock().unwrap().clone(), vec![19], "resumes at the checkpoint");
    assert_eq!(second.stop(), 25);
    assert_eq!(r.shared.stats.applied.load(Ordering::SeqCst), 25, "nothing applied twice");
    assert_eq!(r.docs().len(), 25);
}

/// A seek right after an assignment can be overtaken by the client's own
/// start from the group's offset (here: the beginning): the first message
/// is then not the one sought. The applier seeks again rather than taking
/// the log for another one (it used to stop the worker: "the partition's
/// log now starts over at offset 0").
#[test]
fn a_seek_overtaken_by_the_partitions_own_start_is_made_again() {
    let r = Rig::new(|_| {});
    r.produce_files(0..20);
    let first = r.start();
    first.wait_next(20);
    assert_eq!(first.stop(), 20);
    r.produce_files(20..25);
    r.stale_starts.store(2, Ordering::SeqCst);
    let second = r.start();
    second.wait_next(25);
    assert_eq!(second.seeks.lock().unwrap().clone(), vec![19, 19, 19], "sought again after each overtaken start");
    assert_eq!(second.stop(), 25);
    assert_eq!(r.shared.stats.applied.load(Ordering::SeqCst), 25, "nothing applied twice");
    assert_eq!(r.docs().len(), 25);
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
fn a_command_the_index_refuses_at_commit_is_isolated_and_the_rest_of_its_batch_applied() {
    #[cfg(feature = "failpoints")]
    {
        let r = Rig::new(|c| {
            c.max_attempts = 2;
            c.commit_linger = Duration::from_secs(600);
            c.commit_quiet = Duration::from_millis(50);
        });
        let faults = tempfile::tempdir().unwrap();
        // A commit holding a write of "bad" is refused: the batch cannot
        // say which command; the applier commits them one at a time.
        fault(faults.path(), "index.reject-commit", "bad\n");
        let mut bad_at = 0;
        // "bad" under a key of its own: the key is parked behind it, and
        // the others' commands are applied.
        for i in 0..12 {
            if i == 5 {
                bad_at = r.produce(upsert("bad", "/bad/bad.txt"));
            } else {
                r.produce(upsert(&format!("f{i}"), &format!("/a/f{i}.txt")));
            }
        }
        r.produce(upsert("after", "/b/after.txt"));
        let run = r.start();
        run.wait_next(13);
        assert_eq!(run.stop(), 13);
        let letters = r.letters();
        assert_eq!(letters, vec![Sent { reason: "index_rejected".into(), origin_offset: bad_at, key: "/bad".into() }]);
        let ids = r.file_ids();
        assert_eq!(ids.len(), 12, "{ids:?}");
        assert!(!ids.contains(&"bad".to_string()));
    }
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
fn an_aborted_command_parks_its_key_and_the_keys_later_commands_wait_in_the_dead_letter_topic() {
    #[cfg(feature = "failpoints")]
    {
        let r = Rig::new(|c| c.max_attempts = 2);
        let faults = tempfile::tempdir().unwrap();
        // Commands of key /p are rejected by the index for good.
        fault(faults.path(), "index.reject", "/p\n");
        let aborted = r.produce(upsert("p1", "/p/1.txt"));
        r.produce(upsert("q1", "/q/1.txt"));
        // Accepted by the index now, but behind the aborted command.
        let later = r.produce(upsert("p2", "/p/2.txt"));
        let run = r.start();
        eventually("the first letter", || !r.letters().is_empty());
        std::fs::remove_file(faults.path().join("index.reject")).unwrap();
        run.wait_next(3);
        assert_eq!(run.stop(), 3);
        assert_eq!(
            r.letters(),
            vec![
                Sent { reason: "index_rejected".into(), origin_offset: aborted, key: "/p".into() },
                Sent { reason: "parked".into(), origin_offset: later, key: "/p".into() },
            ]
        );
        assert_eq!(r.file_ids(), vec!["q1".to_string()], "other keys flow; the parked key's later command waits");
    }
}

#[test]
fn a_move_in_several_chunks_holds_the_partitions_other_commands_until_its_last_chunk() {
    let r = Rig::new(|c| {
        c.commit_quiet = Duration::from_millis(20);
        // The source partition is not in this test: no take-over wait.
        c.takeover_waits = false;
    });
    r.produce(upsert("d0", "/dst/old.txt"));
    let run = r.start();
    run.wait_next(1);
    let chunk = |n: i32, last: bool, ids: &[&str]| MoveIn {
        move_id: "m1".into(),
        source_partition: 1,
        source_offset: 7,
        from: "/src/a".into(),
        to: "/dst/a".into(),
        chunk: n,
        last,
        issued_at: 0,
        files: ids.iter().map(|id| MovedFile { id: id.to_string(), path: format!("/dst/a/{id}.txt"), contents: "moved".into() }).collect(),
    };
    let started = r.produce_move(&chunk(0, false, &["m1", "m2"]));
    // Behind the move's first chunk: a delete of a moved file, which must
    // take effect after the move (at its later position), and a command of
    // the same key that must wait too.
    r.produce(Command::DeleteFile { id: "m1".into(), path: "/dst/a/m1.txt".into() });
    r.produce(upsert("d1", "/dst/new.txt"));
    eventually("the applier took every message fed", || run.sent.load(Ordering::SeqCst) == 4 && run.part.queued.load(Ordering::SeqCst) == 0);
    // The partition is revoked while the move is open: nothing from its
    // first chunk on was committed, so the next owner gets it all again.
    assert_eq!(run.stop(), started, "committed past an open move");
    let run = r.start();
    r.produce_move(&chunk(1, true, &["m3"]));
    run.wait_next(5);
    assert_eq!(run.stop(), 5);
    assert_eq!(r.file_ids(), vec!["d0", "d1", "m2", "m3"], "m1 deleted after it arrived");
    let pos = |id: &str| r.docs().into_iter().find(|(i, _)| i == id).map(|(_, p)| p);
    assert_eq!(pos("m2"), Some(started as u64), "a move's documents take its first chunk's position");
}

#[test]
fn a_stop_in_the_middle_of_a_batch_commits_what_is_applied_and_publishes_it() {
    let r = Rig::new(|c| {
        c.commit_linger = Duration::from_secs(600);
        c.commit_quiet = Duration::from_secs(600);
    });
    for i in 0..30 {
        r.produce(upsert(&format!("f{i}"), &format!("/a/f{i}.txt")));
    }
    let run = r.start();
    eventually("30 commands applied", || r.shared.stats.applied.load(Ordering::SeqCst) >= 30);
    assert_eq!(run.next(), -1, "nothing committed yet: the batch is open");
    assert_eq!(run.stop(), 30, "the stop commits the open batch and publishes it");
    assert_eq!(r.docs().len(), 30);
    let checkpoint = EmbeddedIndex::open_existing(r.dir.path()).unwrap().checkpoints().unwrap();
    assert_eq!(checkpoint.get(&0).map(|c| c.offset), Some(29));
}
