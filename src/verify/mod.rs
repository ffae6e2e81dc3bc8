//! `denorm verify`: proves that a live index equals its log. Reads where
//! the live index stands (its shards' checkpoints) and its documents,
//! replays the log up to exactly those offsets into a scratch index with
//! the worker itself (no offsets committed, nothing written to Kafka), and
//! compares the two document by document ([`compare`]). See docs/verify.md.
//!
//! The scratch copy is an embedded index in a directory of its own, for an
//! embedded and an Elasticsearch live index alike: the same apply code
//! writes both (the suite holds both to one model), and a verify then needs
//! no room in the cluster.

pub mod compare;
pub mod cutover;
pub mod log;
pub mod reach;
pub mod repair;
pub mod session;
pub mod verdict;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::info;

use crate::http::Health;
use crate::index::embedded::{EmbeddedBackend, EmbeddedIndex};
use crate::index::{Backend, IndexError};
use crate::kafka::KafkaConfig;
use crate::members::Members;
use crate::worker::settings::{self, ApplySettings};
use crate::worker::{self, KeySample, Mode, Replay, ReplayOf, Stats, WorkerConfig, WorkerError};
use compare::{Outcome, Positions};

/// Why a verify could not decide (exit status 2).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("reading the live index: {0}")]
    Live(#[source] IndexError),
    /// Review F14 f: the scratch copy's reader failed, not the live one's.
    #[error("reading the replay's scratch copy: {0}")]
    ReplayRead(#[source] IndexError),
    /// Review F14 g: another topic's log, or the topic recreated.
    #[error("the live index was not built from this topic's log: {0}")]
    NotItsLog(#[source] IndexError),
    /// Review F14 d: the replay needs the whole log.
    #[error("retention deleted offsets 0..{} of partition {partition} (its first offset is {low} now): a verify replays the whole log, which the topic no longer holds, so it cannot judge the index. Keep the topic's messages for ever (retention.ms=-1); `denorm rebuild --accept-gaps` builds an index of what is left", low - 1)]
    Retention { partition: i32, low: i64 },
    #[error("reading the dead-letter topic {topic}: {error}")]
    DeadLetters { topic: String, error: String },
    /// Review F14 c.
    #[error("the replay has had a partition retrying a failure, or stopped, for {secs} s (its error is in the log above: a full scratch disk, say): no verdict")]
    ReplayStuck { secs: u64 },
    /// Review F16: checkpoints of one generation, documents of another.
    #[error("a rebuild cut over during the verify (generation {from} to {to}): the checkpoints it read and the documents it compared may be of different generations; verify again")]
    CutOver { from: u64, to: u64 },
    #[error("the messages at the live index's checkpoints in partition(s) {partitions:?} did not arrive within {secs} s: the log's identity could not be checked")]
    CheckpointUnread { partitions: Vec<i32>, secs: u64 },
    #[error("the scratch index in {dir}: {source}")]
    Scratch {
        dir: String,
        #[source]
        source: IndexError,
    },
    #[error(transparent)]
    Kafka(#[from] crate::kafka::KafkaSetupError),
    #[error("no topic {0}")]
    NoTopic(String),
    #[error("the replay's worker failed")]
    Worker(#[source] WorkerError),
    #[error("the replay's worker panicked")]
    WorkerPanicked,
    #[error("reading an index's documents panicked")]
    ReaderPanicked,
    #[error("the replay's worker stopped before it reached the live index's offsets")]
    WorkerStopped,
    #[error("the replay did not reach the live index's offsets within {secs} s (partition {partition} at {at} of {want})")]
    Timeout { secs: u64, partition: i32, at: i64, want: i64 },
    /// Review F4.
    #[error("the live index holds documents of partition(s) {partitions:?} but no checkpoint for them: they cannot be placed against the log (an index restored without its checkpoints, or a worker's first commit not done yet). Let the workers commit, or restore the checkpoints with the documents (on Elasticsearch, <prefix>-meta)")]
    NoCheckpoint { partitions: Vec<i32> },
    /// Review F1: the replay decides as the live workers did, or not at all.
    #[error("the live index records no worker settings (the abort policy, message size limit, schema registry, partitioner rule and attempts its workers apply with): its workers are of a version before they were recorded, or none ran on it. Start the workers of this version once; verify does not guess them")]
    NoSettings,
    #[error(transparent)]
    Settings(#[from] crate::worker::settings::SettingsError),
    /// Review F14: a scratch directory that could not be emptied after a
    /// verify would make the next one refuse it.
    #[error("emptying the scratch directory {dir}: {source}")]
    Emptying {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    /// A repair could not be sent.
    #[error("sending a repair: {0}")]
    Repair(String),
    /// Review F7: `--keys` or `--sample` that matched nothing (`--tenant`
    /// alone may: a tenant without documents).
    #[error("no document of the keys asked about was compared (--keys names a key exactly, as /clinton or a user id; a small --sample of few keys may hold none)")]
    NothingCompared,
}

/// What a verify needs.
pub struct Verify<'a> {
    pub kafka: KafkaConfig,
    /// The index to verify.
    pub live: &'a dyn Backend,
    /// An empty directory for the scratch index (removed by the caller).
    pub scratch: &'a Path,
    /// The live workers' group; the replay's is named after it.
    pub group: String,
    /// Indexing memory of the scratch index, per partition.
    pub budget: usize,
    /// Differences kept in the report (all are counted): the first ones
    /// (in the comparison's order), or with `for_repair` any ones, for a
    /// repair to mend (review F13: memory is bounded by this, not by the
    /// differences found).
    pub max_differences: usize,
    pub for_repair: bool,
    /// Gives up a replay that has not reached the live offsets by then.
    pub timeout: Duration,
    /// Verify these keys only (`--keys`, `--sample`): the replay applies
    /// their messages only, and the comparison takes their documents only.
    pub keys: Option<KeySample>,
    /// Rounds at most: while a round leaves documents written since its
    /// snapshot or not judged, the next one checks everything again at the
    /// live index's newer offsets (replaying only the log between).
    pub rounds: u32,
    /// Delete the replay's consumer group afterwards (it holds no offsets).
    /// Not on librdkafka's in-process mock cluster (the demo): its
    /// DeleteGroups aborts the process (`rd_kafka_q_destroy0` assertion).
    pub delete_group: bool,
    pub runtime: tokio::runtime::Handle,
    /// Which member of a verify run as several processes this is: it
    /// verifies its share of the partitions ([`Members::owns`]).
    pub members: Members,
    /// The declared model the live index holds, if any: the replay decodes
    /// and applies its commands, and the scratch index records it.
    pub model: Option<&'static crate::domain::Domain>,
}

/// Where a replay stands, at each turn of its progress poll.
#[derive(Debug, Clone, Copy)]
pub struct Tick {
    pub applied: i64,
    pub of: i64,
}

/// A finished verify.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub topic: String,
    /// The live index's offsets the replay stopped at.
    pub at: Positions,
    /// The keys verified (`--keys`), and the percent of all keys
    /// (`--sample`); neither: all.
    pub keys: Vec<String>,
    /// The tenant verified (`--tenant`): its keys only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub sample_percent: Option<f64>,
    /// Which sample of that share (`--sample-rotation`).
    pub sample_rotation: u64,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Rounds run (see [`Verify::rounds`]); the outcome is the last one's.
    pub rounds: u32,
    pub seconds: f64,
    /// With `--members`: this member and how many verify the index
    /// together (each its share of the partitions, those in `at`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<(u32, u32)>,
    /// With `--repair`: the repairs sent, and the verify of their keys
    /// after the live workers applied them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair: Option<repair::Repaired>,
    /// With `--repair`: the differences the exit status counts (those not
    /// repaired, and those the verify after the repairs still found).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining: Option<usize>,
}

impl Report {
    pub fn clean(&self) -> bool {
        self.outcome.differences_total == 0
    }
}

/// Per partition, the last offset the index `b` applied (-1: none).
pub fn positions(b: &dyn Backend, partitions: i32) -> Result<Positions, IndexError> {
    let all: Vec<i32> = (0..partitions).collect();
    let got = b.checkpoints(&all)?;
    Ok(all.iter().map(|p| (*p, got.get(p).map_or(-1, |c| c.offset as i64))).collect())
}

/// Merges the documents of `live` and `replay` (of the keys in `keys`),
/// each streamed in [`compare::order`] by a thread of its own through a
/// bounded channel: neither index is held in memory, nor more differences
/// than `keep` says.
pub(crate) fn merge(
    live: &dyn Backend,
    replay: &dyn Backend,
    keys: Option<&KeySample>,
    members: Members,
    at: &Positions,
    partitions: i32,
    keep: &compare::Keep<'_>,
) -> Result<compare::Compared, VerifyError> {
    let stream = |b: &dyn Backend, tx: std::sync::mpsc::SyncSender<compare::Live>| -> Result<(), IndexError> {
        b.search()?.dump_sorted_recorded(&mut |d, recorded| {
            let key = d.key();
            if keys.is_none_or(|k| k.admits(&key)) && (members.count == 1 || members.owns(crate::command::partitioner::partition_of(&key, partitions))) {
                // The merge hung up only if the other side failed.
                let _ = tx.send(compare::Live(d, recorded));
            }
        })
    };
    let ((live_tx, live_rx), (replay_tx, replay_rx)) = (std::sync::mpsc::sync_channel(1024), std::sync::mpsc::sync_channel(1024));
    std::thread::scope(|s| {
        let l = s.spawn(|| stream(live, live_tx));
        let r = s.spawn(|| stream(replay, replay_tx));
        let compared = compare::compare_kept(live_rx.iter(), replay_rx.iter().map(|l| l.0), at, partitions, keep);
        // A side that failed ended its stream early: its error, not the
        // comparison, is the answer.
        l.join().map_err(|_| VerifyError::ReaderPanicked)?.map_err(VerifyError::Live)?;
        r.join().map_err(|_| VerifyError::ReaderPanicked)?.map_err(VerifyError::ReplayRead)?;
        Ok(compared)
    })
}

/// The partitions that may hold effects past `at`: a checkpoint read in
/// `seen` is not `at`, or the log (its end offsets, read now) holds more.
pub(crate) fn moved_past(kafka: &KafkaConfig, partitions: i32, at: &Positions, seen: &[&Positions]) -> Result<std::collections::BTreeSet<i32>, VerifyError> {
    let consumer: rdkafka::consumer::BaseConsumer = kafka.consumer_config().create().map_err(crate::kafka::KafkaSetupError::from)?;
    let ends = crate::kafka::watermarks(&consumer, &kafka.topic, partitions)?;
    let stop = |p: &i32| at.get(p).copied().unwrap_or(-1);
    let (mut moved, mut beyond) = (std::collections::BTreeSet::new(), Vec::new());
    for p in 0..partitions {
        if seen.iter().any(|s| s.get(&p).copied().unwrap_or(-1) != stop(&p)) {
            moved.insert(p);
        } else if ends.get(p as usize).is_some_and(|(_, high)| *high > stop(&p) + 1) {
            beyond.push((p, stop(&p) + 1));
        }
    }
    // Offsets past the stop may carry no message (review F6).
    moved.extend(log::messages_past(kafka, &beyond)?);
    Ok(moved)
}

/// What names a missing document across rounds: it, and the replay's copy.
fn proof(d: &compare::Difference) -> (&'static str, String, i32, Option<u64>) {
    (d.kind, d.id.clone(), d.partition, d.replay_offset)
}

/// Commands of the log up to `at`.
fn count(at: &Positions) -> i64 {
    at.values().map(|o| o + 1).sum()
}

/// Verifies the live index; `progress` sees each turn of the replay's
/// progress poll. Blocking.
pub fn run(v: Verify<'_>, mut progress: impl FnMut(&Tick)) -> Result<Report, VerifyError> {
    let started = Instant::now();
    let partitions = v.kafka.topic_partitions()?.ok_or_else(|| VerifyError::NoTopic(v.kafka.topic.clone()))?;
    let settings = settings::recorded(v.live.record(settings::RECORD).map_err(VerifyError::Live)?)?.ok_or(VerifyError::NoSettings)?;
    info!(settings = ?settings, "replaying with the settings the live workers recorded");
    let all: Vec<i32> = (0..partitions).collect();
    let checkpoints = v.live.checkpoints(&all).map_err(VerifyError::Live)?;
    log::check(&v.kafka, partitions, &checkpoints, |p| v.members.owns(p))?;
    let scratch_err = |source| VerifyError::Scratch { dir: v.scratch.display().to_string(), source };
    let index = EmbeddedIndex::open(v.scratch, &v.kafka.topic).map_err(scratch_err)?.with_model(v.model);
    index.check_current_model(true).map_err(scratch_err)?;
    let backend: Arc<dyn Backend> = Arc::new(EmbeddedBackend::new(index, v.budget));
    let mut at: Positions = BTreeMap::new();
    // The letters the live run wrote: the replay parks keys by their
    // offsets, as the live run did (review F15).
    let dlq = crate::dlq::default_topic(&v.kafka.topic);
    let letters = crate::dlq::admin::read(&v.kafka, &dlq).map_err(|e| VerifyError::DeadLetters { topic: dlq, error: e.to_string() })?.0;
    let letters = Arc::new(crate::worker::letters_written(&letters));
    let mut rounds = 0;
    let mut proven = std::collections::HashSet::new();
    let outcome = loop {
        rounds += 1;
        // Where the live index stands: the replay stops exactly there (a
        // round after the first goes on from where the last one stopped).
        let generation = v.live.generation().map_err(VerifyError::Live)?;
        let now = positions(v.live, partitions).map_err(VerifyError::Live)?;
        at = now.into_iter().filter(|(p, _)| v.members.owns(*p)).map(|(p, o)| (p, o.max(at.get(&p).copied().unwrap_or(-1)))).collect();
        info!(round = rounds, at = ?at, "replaying the log up to the live index's offsets");
        crate::faults::hold("verify.replay");
        replay_to(&v, &settings, &letters, &backend, &at, partitions, &mut progress)?;
        // Both sides streamed and merged; what the live index wrote past
        // `at` meanwhile is not compared.
        // The differences kept whole are bounded (review F13): judged alike
        // by their problem, partition and whether a former round proved
        // them, the first `max_differences` of each are enough to list the
        // first `max_differences` of all; a repair takes any.
        let marked = |d: &compare::Difference| d.problem == compare::Problem::Missing && proven.contains(&proof(d));
        let total = if v.for_repair { v.max_differences } else { usize::MAX };
        let ends = log::last_offsets(&v.kafka, partitions)?;
        let keep = compare::Keep { per_class: v.max_differences, total, marked: &marked, log_ends: Some(&ends) };
        let mut compared = merge(v.live, backend.as_ref(), v.keys.as_ref(), v.members, &at, partitions, &keep)?;
        // A live document written past the log's end as it stands now was
        // written by no command: its position is forged.
        compared.past_the_log(&log::last_offsets(&v.kafka, partitions)?);
        match v.live.generation().map_err(VerifyError::Live)? {
            g if g != generation => return Err(VerifyError::CutOver { from: generation, to: g }),
            _ => {}
        }
        if !compared.without_checkpoint.is_empty() {
            return Err(VerifyError::NoCheckpoint { partitions: compared.without_checkpoint.into_iter().collect() });
        }
        // Where the live index and its log stand once it was read whole: a
        // partition whose checkpoint moved, or whose log holds anything
        // past `at`, may have applied a delete past `at` (the other keys'
        // commands while a fan-out runs in a lane are committed below it;
        // Elasticsearch has a shard's writes before its checkpoint), so
        // what the live index lacks there is not judged. The replay stops
        // exactly at `at`: only the live side can be ahead.
        let after = positions(v.live, partitions).map_err(VerifyError::Live)?;
        let moved = moved_past(&v.kafka, partitions, &at, &[&after])?;
        // A document a former round proved missing (its partition was
        // quiet then) stays a difference while the replay's copy is the
        // same one (review F5: a later round dropped it as unsettled once
        // its partition moved on).
        let unsettled = |d: &compare::Difference| d.problem == compare::Problem::Missing && moved.contains(&d.partition) && !marked(d);
        let outcome = compared.settle(&unsettled, v.max_differences);
        proven.extend(outcome.differences.iter().filter(|d| d.problem == compare::Problem::Missing).map(proof));
        // What was written since, or not judged, is checked again at the
        // live index's newer offsets: the next round replays only the log
        // between the two and compares everything again.
        if rounds >= v.rounds.max(1) || outcome.written_since + outcome.unsettled == 0 {
            break outcome;
        }
        info!(round = rounds, written_since = outcome.written_since, unsettled = outcome.unsettled, differences = outcome.differences_total, "checking again at the live index's newer offsets");
        crate::faults::hold("verify.round");
    };
    // A tenant alone may have no documents (removed by `denorm tenant
    // delete`): that is its answer. Keys or a sample that matched nothing
    // are a mistake to report.
    let chosen = v.keys.as_ref().is_some_and(|k| !k.keys.is_empty() || k.percent.is_some());
    if chosen && outcome.checked + outcome.written_since + outcome.unsettled + outcome.differences_total as u64 == 0 {
        return Err(VerifyError::NothingCompared);
    }
    let (keys, tenant, sample_percent, sample_rotation) =
        v.keys.map_or((Vec::new(), None, None, 0), |k| (k.keys.iter().map(|k| crate::command::tenant::unscoped(k).to_string()).collect(), k.tenant, k.percent, k.rotation));
    let member = (v.members.count > 1).then_some((v.members.me, v.members.count));
    Ok(Report { topic: v.kafka.topic.clone(), at, keys, tenant, sample_percent, sample_rotation, outcome, rounds, seconds: started.elapsed().as_secs_f64(), member, repair: None, remaining: None })
}

/// Runs the replay's worker on the scratch index `backend` until every
/// partition has applied exactly up to `at` (it resumes where the scratch
/// index's checkpoints are), then stops it.
fn replay_to(
    v: &Verify<'_>,
    settings: &ApplySettings,
    letters: &Arc<crate::worker::LettersWritten>,
    backend: &Arc<dyn Backend>,
    at: &Positions,
    partitions: i32,
    progress: &mut impl FnMut(&Tick),
) -> Result<(), VerifyError> {
    let scratch_err = |source| VerifyError::Scratch { dir: v.scratch.display().to_string(), source };
    let group = format!("{}.verify-{}", v.group, &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut cfg = WorkerConfig::new(v.kafka.clone(), group.clone());
    cfg.mode = Mode::Replay(Replay { letters_written: letters.clone(), of: ReplayOf::Verify { until: Arc::new(at.clone()), keys: v.keys.clone().map(Arc::new) }, ..Default::default() });
    settings.apply_to(&mut cfg)?;
    cfg.model = v.model;
    // A member replays its share of the partitions only: a take-over
    // would wait for ever for a departure in a partition it does not
    // replay. The scratch index's shards are separate, which replay right
    // without those waits (docs/cross-key.md).
    if v.members.count > 1 {
        cfg.takeover_waits = false;
    }
    let shutdown = Arc::new(AtomicBool::new(false));
    let health = Arc::new(Health::default());
    let (flag, handle, replay, h) = (shutdown.clone(), v.runtime.clone(), backend.clone(), health.clone());
    let worker = std::thread::spawn(move || {
        let _rt = handle.enter();
        worker::run(cfg, replay, flag, h, Arc::new(Stats::default()))
    });
    // Since when the replay has had a partition retrying a failure or
    // stopped (review F14 c: a full scratch disk retried until the timeout,
    // then reported as a timeout).
    let mut degraded_since: Option<Instant> = None;
    let of = count(at);
    let want: Vec<(i32, i64)> = at.iter().map(|(p, o)| (*p, *o)).collect();
    // Each round's replay has the whole timeout, from its own start (review
    // F11: measured from the verify's start, a long first round made the
    // second fail at its first poll).
    // Ended early: `None` when the replay's worker stopped by itself.
    let waited = reach::until_reached(v.timeout, Duration::from_millis(100), &want, || {
        if worker.is_finished() {
            return Err(None);
        }
        let now = positions(backend.as_ref(), partitions).map_err(|e| Some(scratch_err(e)))?;
        progress(&Tick { applied: now.iter().filter_map(|(p, o)| Some(o.min(at.get(p)?) + 1)).sum(), of });
        degraded_since = match health.degraded.load(Ordering::SeqCst) {
            0 => None,
            _ => degraded_since.or(Some(Instant::now())),
        };
        let stuck = STUCK_AFTER.min(v.timeout / 2);
        if reach::first_behind(&now, want.iter().copied()).is_some() && degraded_since.is_some_and(|since| since.elapsed() >= stuck) {
            return Err(Some(VerifyError::ReplayStuck { secs: stuck.as_secs() }));
        }
        Ok(now)
    });
    let reached = match waited {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(b)) => Err(VerifyError::Timeout { secs: v.timeout.as_secs(), partition: b.partition, at: b.at, want: b.want }),
        Err(Some(e)) => Err(e),
        Err(None) => {
            worker.join().map_err(|_| VerifyError::WorkerPanicked)?.map_err(VerifyError::Worker)?;
            return Err(VerifyError::WorkerStopped);
        }
    };
    shutdown.store(true, Ordering::SeqCst);
    let stopped = worker.join().map_err(|_| VerifyError::WorkerPanicked)?.map_err(VerifyError::Worker);
    if v.delete_group {
        crate::kafka::delete_group(&v.kafka, &group, &v.runtime);
    }
    reached?;
    stopped
}

/// How long the replay may have a partition retrying a failure, or
/// stopped, before the verify gives up (at most half its timeout).
const STUCK_AFTER: Duration = Duration::from_secs(120);

/// The offsets of a map of partitions, for messages: `0:12 1:-1`.
pub fn describe(at: &BTreeMap<i32, i64>) -> String {
    at.iter().map(|(p, o)| format!("{p}:{o}")).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch copy whose reader fails (a full disk, say).
    struct Unreadable;

    impl Backend for Unreadable {
        fn bind_log(&self, _: i32) -> Result<(), IndexError> {
            unreachable!("a verify never binds its scratch copy's reader")
        }
        fn checkpoints(&self, _: &[i32]) -> Result<std::collections::HashMap<i32, crate::index::Checkpoint>, IndexError> {
            Ok(Default::default())
        }
        fn open_shard(&self, _: i32) -> Result<Box<dyn crate::index::Shard + Send>, IndexError> {
            unreachable!("the merge only reads")
        }
        fn search(&self) -> Result<Box<dyn crate::index::SearchIndex>, IndexError> {
            Err(IndexError::Backend("No space left on device".into()))
        }
    }

    /// Review F14 f: a failure of the replay's side was reported as one of
    /// the live index.
    #[test]
    fn a_failing_scratch_reader_is_not_blamed_on_the_live_index() {
        let dir = tempfile::tempdir().unwrap();
        let live = EmbeddedBackend::new(EmbeddedIndex::open(dir.path(), "t").unwrap(), 16 << 20);
        let err = merge(&live, &Unreadable, None, Members::default(), &BTreeMap::new(), 1, &compare::Keep::all()).expect_err("the merge must fail");
        assert!(matches!(err, VerifyError::ReplayRead(_)), "{err}");
        assert!(err.to_string().starts_with("reading the replay's scratch copy: "), "{err}");
        let err = merge(&Unreadable, &live, None, Members::default(), &BTreeMap::new(), 1, &compare::Keep::all()).expect_err("the merge must fail");
        assert!(err.to_string().starts_with("reading the live index: "), "{err}");
    }
}
