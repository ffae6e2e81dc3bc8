//! The phases of `denorm bench`: the pipeline against raw baselines
//! measured in the same run on the same broker (see docs/benchmark.md). Workers are real
//! `denorm run` processes (this executable), so their memory is their own;
//! the baselines are a plain rdkafka consumer and bare tantivy; against
//! Elasticsearch ([`elastic`]), a plain `_bulk` and `_update_by_query`.

mod elastic;
mod head_of_line;
mod key_concurrency;
mod latency;
mod model_profiles;
mod profiles;
mod reapply;
mod table;
mod tenant_flood;
mod verify;
mod worker;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use rand::rngs::StdRng;
use rand::SeedableRng;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;

use crate::bench::process::{machine, CpuClock};
use denorm::command::Command;
use denorm::index::embedded::{raw, EmbeddedIndex};
use denorm::index::{Doc, FileDoc};
use denorm::kafka::{KafkaConfig, REQUEST_TIMEOUT};
use denorm::produce::Producer;
use denorm::worker::{consumer_config, WorkerConfig};
use latency::{embedded_probe, watch, Latency, Probe};
use table::{mb, per_sec, phase, print_table, Row};
use worker::Worker;

/// Writer memory of the baselines: `denorm run`'s default per shard.
const MEMORY_BUDGET: usize = 64 << 20;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Single-document commands loaded into an empty index (the replay), then as many updates of
    /// the same files
    #[arg(long, default_value_t = 120_000, value_parser = clap::value_parser!(u64).range(1..))]
    docs: u64,
    /// Keys (top-level directories) the single-document commands are spread over
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// Sizes of the directory renames, in files (comma-separated); the largest is the one held
    /// to the rename target, the first and last are compared for memory
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000")]
    renames: Vec<u64>,
    /// Steady rate of the latency phase, in commands per second
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    latency_rate: u64,
    /// Length of the latency phase, in seconds (0 skips it)
    #[arg(long, default_value_t = 20)]
    latency_secs: u64,
    /// Commands of the read-your-writes series after the latency phase, sent one at a time,
    /// each waited for as `denorm produce --wait` does
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    read_your_writes: u64,
    /// Files of the tree renamed in the head-of-line phase (0 skips it), which runs on topics of
    /// one partition of its own, with lanes and with --lanes 1; then the same rename with a
    /// worker replaced in its middle (re-application after a rebalance)
    #[arg(long, default_value_t = 1_000_000)]
    head_of_line_files: u64,
    /// Steady rate of the other key's commands in the head-of-line phase, per second
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    head_of_line_rate: u64,
    /// Single-document commands of the key-concurrency phase (0 skips it), which runs on topics of
    /// one partition of its own, with lanes and with --lanes 1
    #[arg(long, default_value_t = 10_000)]
    key_concurrency_commands: u64,
    /// Numbers of keys the key-concurrency phase spreads its commands over (comma-separated)
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000", value_parser = clap::value_parser!(u64).range(1..))]
    key_concurrency_keys: Vec<u64>,
    /// Commands of a noisy tenant's backlog in the tenant-fairness phase (0 skips it): a quiet
    /// tenant's produce -> searchable latency at --head-of-line-rate, alone and while that
    /// backlog drains in the same partition (a topic of one partition of its own)
    #[arg(long, default_value_t = 100_000)]
    tenant_flood_commands: u64,
    /// Users of the profile-change phase (0 skips it and the mixed-log phase), each with 5 posts:
    /// their profile changes against as many post upserts, then a mixed log of as many users
    /// (a profile, 5 posts, 14 files and a profile change each, interleaved) against a plain
    /// consumer (Elasticsearch: a plain `_bulk` of the same documents)
    #[arg(long, default_value_t = 4000)]
    profile_users: u64,
    /// Skip the verify phase (`denorm verify` of the whole index while its worker runs, a 10 %
    /// sample, and `denorm rebuild` of the same log as the baseline)
    #[arg(long)]
    skip_verify: bool,
    /// Partitions of the benchmark's topic
    #[arg(long = "bench-partitions", default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..=1000))]
    partitions: i32,
    /// Where the results are written as JSON
    #[arg(long, default_value = "bench.json")]
    out: PathBuf,
    /// Directory for the indexes and worker logs (default: a temporary directory, removed
    /// afterwards)
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Extra `denorm run` flag for the workers (repeatable), e.g. --worker-arg=--commit-linger-ms=50
    #[arg(long = "worker-arg", allow_hyphen_values = true)]
    worker_args: Vec<String>,
    /// Process id of the broker, when on this machine: its CPU time is reported per phase
    /// (scripts/bench.sh passes it)
    #[arg(long)]
    broker_pid: Option<u32>,
    /// Give up on a phase after this many seconds
    #[arg(long, default_value_t = 900)]
    timeout_secs: u64,
    /// Run the phases against this Elasticsearch cluster instead of the embedded index, with a
    /// plain `_bulk` and `_update_by_query` as the baselines (credentials from DENORM_ES_*; the
    /// indexes go under a prefix of the run's own, printed at the start and left for inspection)
    #[arg(long, value_name = "URL")]
    elasticsearch: Option<String>,
}

/// How the benchmark reaches the broker, and how its `denorm run` workers
/// are given the same client options.
#[derive(Debug, Clone)]
pub struct Launch {
    pub kafka: KafkaConfig,
    /// `--kafka-options-file`, passed on to the workers.
    pub kafka_options_file: Option<PathBuf>,
    /// The librdkafka options given on the command line or in the
    /// environment, passed on to the workers.
    pub kafka_options: Vec<(String, String)>,
}

/// Why a benchmark did not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The benchmark's settings cannot be run.
    #[error("{0}")]
    Usage(String),
    /// A phase failed; the cause says which and why.
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// Runs every phase and writes the results (see [`BenchArgs`]).
pub async fn run(launch: &Launch, a: &BenchArgs) -> Result<(), BenchError> {
    if a.renames.is_empty() || a.renames.contains(&0) {
        return Err(BenchError::Usage("--renames needs one or more sizes above 0".into()));
    }
    Ok(phases(launch, a).await?)
}

async fn phases(launch: &Launch, a: &BenchArgs) -> anyhow::Result<()> {
    let tmp;
    let work = match &a.dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            d.clone()
        }
        None => {
            tmp = tempfile::tempdir().context("creating a temporary directory")?;
            tmp.path().to_path_buf()
        }
    };
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let mut kafka = launch.kafka.clone();
    kafka.topic = format!("denorm.bench.{run_id}");
    kafka.partitions = a.partitions;
    kafka.ensure_topic().await.with_context(|| format!("cannot reach the broker at {} or create the benchmark topic", kafka.brokers))?;
    let es = match &a.elasticsearch {
        Some(url) => Some(elastic::backend(url, &run_id, &kafka.topic)?),
        None => None,
    };
    let b = Bench { launch, a, kafka, work: work.clone(), timeout: Duration::from_secs(a.timeout_secs), exe: std::env::current_exe()?, es, model: None };
    eprintln!("denorm bench: broker {}, topic {} ({} partitions), work directory {}", b.kafka.brokers, b.kafka.topic, a.partitions, work.display());
    let producer = Producer::new(&b.kafka)?;
    if let (Some(url), Some(es)) = (&a.elasticsearch, &b.es) {
        let (rows, results) = elastic::run(&b, url, es, &producer, &run_id).await?;
        return b.finish(&rows, results);
    }
    let mut rows = Vec::new();
    let mut results = serde_json::Map::new();

    // 1. Replay: a topic of single-document commands into an empty index.
    let index_dir = work.join("index");
    let group = format!("denorm-bench-{run_id}");
    let load = single_docs(a.docs, a.keys, 0);
    phase("replay: producing single-document commands");
    let t = Instant::now();
    let start = b.ends()?;
    producer.send_all(load.clone(), 10_000, |_| {}).await?;
    let produce_rate = a.docs as f64 / t.elapsed().as_secs_f64();
    phase("replay: raw baselines (plain consumer, bare tantivy indexing)");
    let clock = CpuClock::start(b.pids(None));
    let consume1 = b.raw_consume(&start, a.docs)?;
    let cpu_consume = clock.stop("the plain consumer");
    // What checking every batch's CRC costs (every reader of denorm's does).
    let unchecked = b.raw_consume_with(&start, a.docs, &[("check.crcs", "false")])?;
    rows.push(Row::new(
        format!("plain consumer of {} commands, CRCs checked", a.docs),
        per_sec(consume1, "messages"),
        format!("unchecked {}", per_sec(unchecked, "")),
        Some(consume1 / unchecked),
        "reported",
    ));
    results.insert("crc_check".into(), json!({"messages": a.docs, "checked_rate": consume1, "unchecked_rate": unchecked, "ratio": consume1 / unchecked}));
    let index_rate = raw_index_rate(&work.join("raw-load"), &load)?;
    phase("replay: denorm run into an empty index");
    let (worker, replay, cpu_replay) = b.catch_up(&group, &index_dir, "the replay").await?;
    let replay_rate = a.docs as f64 / replay.as_secs_f64();
    let floor = consume1.min(index_rate);
    rows.push(Row::new(
        format!("replay of {} commands into an empty index", a.docs),
        per_sec(replay_rate, "commands"),
        format!("min(consume {}, index {})", per_sec(consume1, ""), per_sec(index_rate, "")),
        Some(replay_rate / floor),
        ">= 90%",
    ));
    results.insert(
        "replay".into(),
        json!({"commands": a.docs, "seconds": replay.as_secs_f64(), "rate": replay_rate, "raw_consume_rate": consume1, "raw_index_rate": index_rate, "ratio": replay_rate / floor, "produce_rate": produce_rate,
               "cpu": cpu_replay, "raw_consume_cpu": cpu_consume}),
    );

    // 2. Single-document updates of existing documents, consumed as a backlog.
    phase("single-document updates: stopping the worker, producing as many updates");
    worker.stop().await?;
    let start = b.ends()?;
    producer.send_all(single_docs(a.docs, a.keys, 1), 10_000, |_| {}).await?;
    let consume2 = b.raw_consume(&start, a.docs)?;
    phase("single-document updates: denorm run catches up");
    let (worker, updates, cpu_updates) = b.catch_up(&group, &index_dir, "the updates").await?;
    let update_rate = a.docs as f64 / updates.as_secs_f64();
    let consume = consume1.max(consume2);
    rows.push(Row::new(
        format!("{} single-document updates", a.docs),
        per_sec(update_rate, "commands"),
        format!("plain consumer {}", per_sec(consume, "messages")),
        Some(update_rate / consume),
        ">= 90%",
    ));
    results.insert(
        "single_document".into(),
        json!({"commands": a.docs, "seconds": updates.as_secs_f64(), "rate": update_rate, "raw_consume_rate": consume, "raw_consume_runs": [consume1, consume2], "ratio": update_rate / consume, "cpu": cpu_updates}),
    );
    // 3. Profile changes (small fan-outs) and a mixed log.
    let worker = b.profiles_phase(worker, &group, &index_dir, &producer, &mut rows, &mut results).await?;
    b.model_profiles_phase(&run_id, None, &mut rows, &mut results).await?;

    // 3. Directory renames, with the worker's memory.
    let mut renames = Vec::new();
    let mut rename_rates = Vec::new();
    for &size in &a.renames {
        phase(&format!("rename of {size} files: loading the tree"));
        let files = tree(size);
        let t = Instant::now();
        producer.send_all(files.clone(), 10_000, |_| {}).await?;
        let loaded = b.wait_applied(&worker, &index_dir, None).await?;
        let load_secs = t.elapsed().as_secs_f64().max(loaded.as_secs_f64());
        phase(&format!("rename of {size} files: raw baseline (bare tantivy scan + rewrite + commit)"));
        let raw_dir = work.join(format!("raw-tree-{size}"));
        raw::index(&raw_dir, MEMORY_BUDGET, files.iter().enumerate().map(|(i, c)| file_doc(c, i as u64)))?;
        let t = Instant::now();
        let raw_n = raw::rename_dir(&raw_dir, MEMORY_BUDGET, &tree_dir(size), &moved_dir(size))?;
        let raw_secs = t.elapsed().as_secs_f64();
        if raw_n != size {
            bail!("the raw rename rewrote {raw_n} documents, expected {size}");
        }
        std::fs::remove_dir_all(&raw_dir).ok();
        drop(files);
        phase(&format!("rename of {size} files: denorm run"));
        worker.reset_peak()?;
        let rss_before = worker.status_kb("VmRSS:");
        let anon_before = worker.status_kb("RssAnon:");
        let sampler = worker.sample_peaks();
        let clock = CpuClock::start(b.pids(Some(&worker)));
        let t = Instant::now();
        producer.send(Command::RenamePath { from: tree_dir(size), to: moved_dir(size) }).await?;
        let took = b.wait_applied(&worker, &index_dir, Some(t)).await?;
        let peak = worker.status_kb("VmHWM:");
        let (peak_anon, peak_file) = sampler.stop();
        let cpu = clock.stop("the rename");
        let (rate, raw_rate) = (size as f64 / took.as_secs_f64(), size as f64 / raw_secs);
        let rise = peak_anon.saturating_sub(anon_before.unwrap_or(0));
        renames.push((size, peak_anon, rise));
        rename_rates.push((size, rate));
        rows.push(Row::new(
            format!("rename of a directory of {size} files"),
            format!("{} (peak RSS {}: heap {} (+{} in the rename), mapped index {})", per_sec(rate, "docs"), mb(peak), mb(Some(peak_anon)), mb(Some(rise)), mb(Some(peak_file))),
            format!("tantivy {}", per_sec(raw_rate, "docs")),
            Some(rate / raw_rate),
            if Some(&size) == a.renames.iter().max() { ">= 90%" } else { "" },
        ));
        results.insert(
            format!("rename_{size}"),
            json!({"files": size, "seconds": took.as_secs_f64(), "rate": rate, "raw_seconds": raw_secs, "raw_rate": raw_rate, "ratio": rate / raw_rate,
                   "worker_rss_before_kb": rss_before, "worker_peak_rss_kb": peak, "worker_anon_before_kb": anon_before,
                   "worker_peak_anon_kb": peak_anon, "worker_peak_file_kb": peak_file, "load_seconds": load_secs, "load_rate": size as f64 / load_secs, "cpu": cpu}),
        );
    }
    // 4. The largest renamed directory moved to another top-level
    // directory (another key): the move protocol against the rename within
    // a tree just measured.
    if let Some(&(size, within)) = rename_rates.iter().max_by_key(|(size, _)| *size) {
        phase(&format!("move of {size} files to another top-level directory: denorm run"));
        let t = Instant::now();
        producer.send(Command::RenamePath { from: moved_dir(size), to: format!("/x{size}/moved") }).await?;
        // The source first: once it has applied the rename, the files are in
        // the destination's partition, whose end is read again.
        b.wait_applied(&worker, &index_dir, Some(t)).await?;
        let took = b.wait_applied(&worker, &index_dir, Some(t)).await?;
        let rate = size as f64 / took.as_secs_f64();
        rows.push(Row::new(
            format!("move of a directory of {size} files to another top-level directory"),
            per_sec(rate, "docs"),
            format!("rename within the tree {}", per_sec(within, "docs")),
            Some(rate / within),
            "",
        ));
        results.insert(format!("move_{size}"), json!({"files": size, "seconds": took.as_secs_f64(), "rate": rate, "rename_within_rate": within, "ratio": rate / within}));
    }
    if let (Some(&(small, p0, r0)), Some(&(large, p1, r1))) = (renames.first(), renames.last()) {
        if large > small && p0 > 0 {
            let rise_ratio = (r0 > 0).then(|| r1 as f64 / r0 as f64);
            let growth = p1 as f64 / p0 as f64 - 1.0;
            rows.push(Row::new(
                format!("worker peak heap (RssAnon), rename of {large} vs {small} files"),
                format!("{} vs {}", mb(Some(p1)), mb(Some(p0))),
                String::new(),
                Some(1.0 + growth),
                "<= 110%",
            ));
            rows.push(Row::new(format!("  heap added by the rename itself, {large} vs {small} files"), format!("{} vs {}", mb(Some(r1)), mb(Some(r0))), String::new(), rise_ratio, ""));
            results.insert("rename_memory".into(), json!({"measure": "peak RssAnon sampled every 10 ms", "small": small, "large": large, "small_peak_kb": p0, "large_peak_kb": p1, "growth": growth, "small_rise_kb": r0, "large_rise_kb": r1, "rise_ratio": rise_ratio}));
        }
    }

    // 4. Produce -> searchable latency at a steady rate.
    if a.latency_secs > 0 {
        phase(&format!("latency: {} commands/s for {} s, produce -> searchable", a.latency_rate, a.latency_secs));
        let l = b.latency(Producer::new(&b.kafka)?, &index_dir).await?;
        l.report(a.latency_rate, &mut rows, &mut results);
        phase("latency: read-your-writes, one command at a time as `denorm produce --wait` sends it");
        let (probe, every) = b.probe(&index_dir)?;
        let r = latency::read_your_writes(&b.kafka, &group, &producer, probe, every, a.read_your_writes, b.timeout).await?;
        r.report(&mut rows, &mut results);
    }
    // 5. Verify against rebuild: the whole index (every phase's documents),
    // its worker running.
    if !a.skip_verify {
        b.verify_phase(&group, &index_dir, &mut rows, &mut results).await?;
    }
    worker.stop().await?;
    // 6. Head of line: another key of the partition during a large rename.
    if a.head_of_line_files > 0 {
        b.head_of_line(a.head_of_line_files, a.head_of_line_rate, &run_id, None, &mut rows, &mut results).await?;
    }
    // 7. Key concurrency: single-document commands of many keys.
    if a.key_concurrency_commands > 0 {
        b.key_concurrency(a.key_concurrency_commands, &a.key_concurrency_keys, &run_id, None, &mut rows, &mut results).await?;
    }
    // 8. Tenant fairness: a quiet tenant beside a noisy one's backlog.
    if a.tenant_flood_commands > 0 {
        b.tenant_flood(a.tenant_flood_commands, a.head_of_line_rate, &run_id, None, &mut rows, &mut results).await?;
    }
    b.finish(&rows, results)
}

/// The worker flag for `lanes` (none: the worker's default).
fn lanes_arg(lanes: Option<usize>) -> Vec<String> {
    lanes.map(|n| vec![format!("--lanes={n}")]).unwrap_or_default()
}

/// `n` upserts of files `b0..b<n>` spread over `keys` top-level directories;
/// `round` changes their contents (0: the load, 1: the updates).
fn single_docs(n: u64, keys: u64, round: u64) -> Vec<Command> {
    let mut rng = StdRng::seed_from_u64(n ^ (round << 32));
    (0..n)
        .map(|i| Command::UpsertFile {
            id: format!("b{i}"),
            path: format!("/k{}/docs/section{}/file{i}.txt", i % keys, i % 50),
            contents: denorm::demo::words(&mut rng, 8 + (i % 16) as usize),
            previous_path: None,
        })
        .collect()
}

fn tree_dir(size: u64) -> String {
    format!("/r{size}/tree")
}

fn moved_dir(size: u64) -> String {
    format!("/r{size}/moved")
}

/// A directory of `size` files in 100 subdirectories, one key.
fn tree(size: u64) -> Vec<Command> {
    let mut rng = StdRng::seed_from_u64(size);
    (0..size)
        .map(|i| Command::UpsertFile {
            id: format!("r{size}-{i}"),
            path: format!("{}/d{}/file{i}.txt", tree_dir(size), i % 100),
            contents: denorm::demo::words(&mut rng, 8 + (i % 16) as usize),
            previous_path: None,
        })
        .collect()
}

fn file_doc(c: &Command, pos: u64) -> Doc {
    match c {
        Command::UpsertFile { id, path, contents, .. } => Doc::File(FileDoc::at(id, path, contents, pos)),
        other => unreachable!("the benchmark's loads are file upserts, not {other:?}"),
    }
}

/// Bare tantivy indexing rate of the documents of `commands`.
fn raw_index_rate(dir: &Path, commands: &[Command]) -> anyhow::Result<f64> {
    let docs: Vec<Doc> = commands.iter().enumerate().map(|(i, c)| file_doc(c, i as u64)).collect();
    let t = Instant::now();
    let n = raw::index(dir, MEMORY_BUDGET, docs)?;
    let rate = n as f64 / t.elapsed().as_secs_f64();
    std::fs::remove_dir_all(dir).ok();
    Ok(rate)
}

struct Bench<'a> {
    launch: &'a Launch,
    a: &'a BenchArgs,
    kafka: KafkaConfig,
    work: PathBuf,
    timeout: Duration,
    exe: PathBuf,
    /// The Elasticsearch the phases run against (`--elasticsearch`); the
    /// embedded index when `None`.
    es: Option<denorm::index::elastic::backend::ElasticBackend>,
    /// The model file its workers run (`--model`), if any.
    model: Option<PathBuf>,
}

impl Bench<'_> {
    /// Prints the table and writes the results.
    fn finish(&self, rows: &[Row], results: serde_json::Map<String, serde_json::Value>) -> anyhow::Result<()> {
        print_table(rows);
        let doc = json!({
            "machine": machine(),
            "broker": self.kafka.brokers,
            "partitions": self.a.partitions,
            "worker_args": self.a.worker_args,
            "index": self.a.elasticsearch.as_deref().unwrap_or("embedded"),
            "index_prefix": self.es.as_ref().map(|e| e.prefix.clone()),
            "results": results,
        });
        std::fs::write(&self.a.out, serde_json::to_string_pretty(&doc)? + "\n").with_context(|| format!("writing {}", self.a.out.display()))?;
        println!("results written to {}", self.a.out.display());
        Ok(())
    }

    /// The checkpoint of each partition in the index (`index`: the
    /// embedded index's directory, unused on Elasticsearch). On
    /// Elasticsearch on a blocking thread of its own: `block_in_place`
    /// would also suspend the branches joined with this one (the head-of-
    /// line phase's sender), and a bench run on Elasticsearch was seen to
    /// hang with the sender never resumed.
    async fn applied(&self, embedded: Option<&EmbeddedIndex>) -> anyhow::Result<HashMap<i32, u64>> {
        let all: Vec<i32> = (0..self.kafka.partitions).collect();
        let got = match (&self.es, embedded) {
            (Some(es), _) => {
                let es = es.clone();
                tokio::task::spawn_blocking(move || denorm::index::Backend::checkpoints(&es, &all)).await??.into_iter().collect()
            }
            (None, Some(index)) => index.checkpoints()?.into_iter().collect::<HashMap<_, _>>(),
            (None, None) => bail!("no index to read checkpoints from"),
        };
        Ok(got.into_iter().map(|(p, c): (i32, denorm::index::Checkpoint)| (p, c.offset)).collect())
    }

    /// The processes whose CPU time a phase reports.
    fn pids(&self, worker: Option<&Worker>) -> Vec<(&'static str, u32)> {
        let mut v = vec![("bench", std::process::id())];
        v.extend(worker.map(|w| ("worker", w.pid)));
        v.extend(self.a.broker_pid.map(|p| ("broker", p)));
        v
    }

    /// End offsets of every partition of the topic.
    fn ends(&self) -> anyhow::Result<BTreeMap<i32, i64>> {
        let c: BaseConsumer = self.kafka.consumer_config().create()?;
        (0..self.kafka.partitions).map(|p| Ok((p, c.fetch_watermarks(&self.kafka.topic, p, REQUEST_TIMEOUT)?.1))).collect()
    }

    /// A plain consumer with the worker's settings reads `n` messages from
    /// `from`; messages per second from its assignment to its last message.
    fn raw_consume(&self, from: &BTreeMap<i32, i64>, n: u64) -> anyhow::Result<f64> {
        self.raw_consume_with(from, n, &[])
    }

    /// [`Bench::raw_consume`] with `extra` consumer settings.
    fn raw_consume_with(&self, from: &BTreeMap<i32, i64>, n: u64, extra: &[(&str, &str)]) -> anyhow::Result<f64> {
        let c = self.plain_consumer_with(from, extra)?;
        let start = Instant::now();
        let deadline = start + self.timeout;
        let (mut got, mut bytes) = (0u64, 0usize);
        while got < n {
            match c.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    bytes += m.payload().map_or(0, |p| p.len());
                    got += 1;
                }
                Some(Err(e)) => return Err(e).context("raw consumer"),
                None if Instant::now() > deadline => bail!("the raw consumer read {got} of {n} messages before timing out"),
                None => {}
            }
        }
        let secs = start.elapsed().as_secs_f64();
        eprintln!("       plain consumer: {n} messages ({:.1} MB) in {secs:.2}s", bytes as f64 / 1e6);
        Ok(n as f64 / secs)
    }

    /// A consumer with the worker's settings, connected, reading from `from`.
    fn plain_consumer(&self, from: &BTreeMap<i32, i64>) -> anyhow::Result<BaseConsumer> {
        self.plain_consumer_with(from, &[])
    }

    /// [`Bench::plain_consumer`] with `extra` settings; the pass-through
    /// options still win.
    fn plain_consumer_with(&self, from: &BTreeMap<i32, i64>, extra: &[(&str, &str)]) -> anyhow::Result<BaseConsumer> {
        let fetch_kb = WorkerConfig::new(self.kafka.clone(), "").fetch_buffer_kb;
        let c: BaseConsumer = consumer_config(&self.kafka, &format!("denorm-bench-raw-{}", uuid::Uuid::new_v4().simple()), fetch_kb, extra).create()?;
        let mut tpl = TopicPartitionList::new();
        for (&p, &o) in from {
            tpl.add_partition_offset(&self.kafka.topic, p, Offset::Offset(o))?;
        }
        c.fetch_watermarks(&self.kafka.topic, 0, REQUEST_TIMEOUT)?;
        c.assign(&tpl)?;
        Ok(c)
    }

    /// Starts a worker and waits until it has applied the whole topic: the
    /// worker, the time from its readiness, and the CPU time meanwhile.
    async fn catch_up(&self, group: &str, index: &Path, phase: &str) -> anyhow::Result<(Worker, Duration, serde_json::Value)> {
        let worker = self.start_worker(group, index).await?;
        let clock = CpuClock::start(self.pids(Some(&worker)));
        let took = self.wait_applied(&worker, index, None).await?;
        let cpu = clock.stop(phase);
        Ok((worker, took, cpu))
    }

    /// A benchmark on a topic of one partition of its own
    /// (`denorm.bench.<run>.<tag>`) and an index of its own: a directory, or
    /// indexes under a prefix of their own on Elasticsearch (they belong to
    /// one topic). Returns it and its index argument.
    async fn own_partition<'b>(&'b self, tag: &str, run_id: &str, es_url: Option<&str>) -> anyhow::Result<(Bench<'b>, PathBuf)> {
        self.own_topic(tag, run_id, es_url, 1, None).await
    }

    /// [`Bench::own_partition`] with `partitions`, its workers running
    /// `model`.
    async fn own_topic<'b>(&'b self, tag: &str, run_id: &str, es_url: Option<&str>, partitions: i32, model: Option<&Path>) -> anyhow::Result<(Bench<'b>, PathBuf)> {
        let mut kafka = self.kafka.clone();
        (kafka.topic, kafka.partitions) = (format!("denorm.bench.{run_id}.{tag}"), partitions);
        kafka.ensure_topic().await?;
        let (es, index) = match (&self.es, es_url) {
            (Some(es), Some(url)) => {
                let es = denorm::index::elastic::backend::ElasticBackend::new(es.client.clone(), &format!("{}-{tag}", es.prefix), &kafka.topic, es.runtime.clone());
                (Some(es), PathBuf::from(url))
            }
            _ => (None, self.work.join(format!("index-{tag}"))),
        };
        Ok((Bench { kafka, es, work: self.work.clone(), exe: self.exe.clone(), model: model.map(Path::to_path_buf), ..*self }, index))
    }

    /// The embedded index at `index`, to read checkpoints from (`None` on
    /// Elasticsearch, whose checkpoints [`Bench::applied`] reads itself).
    fn embedded(&self, index: &Path) -> anyhow::Result<Option<EmbeddedIndex>> {
        Ok(match self.es {
            Some(_) => None,
            None => Some(EmbeddedIndex::open_existing(index)?),
        })
    }

    /// Waits until the index has applied every message of the topic as of
    /// now; the time since `since` (default: now).
    async fn wait_applied(&self, w: &Worker, index: &Path, since: Option<Instant>) -> anyhow::Result<Duration> {
        let t = since.unwrap_or_else(Instant::now);
        let ends = self.ends()?;
        let index = self.embedded(index)?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let applied = self.applied(index.as_ref()).await?;
            if ends.iter().all(|(p, &end)| end == 0 || applied.get(p).is_some_and(|&a| a as i64 >= end - 1)) {
                return Ok(t.elapsed());
            }
            if !w.alive() {
                bail!("the worker exited; see {}", self.work.join("worker.log").display());
            }
            if Instant::now() > deadline {
                bail!("the worker had applied {applied:?} of {ends:?} after {:?}", self.timeout);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// What looks for documents in the index, and how often: a search
    /// request per look on Elasticsearch every 10 ms, so that the looking
    /// does not load the server it measures.
    fn probe(&self, index_dir: &Path) -> anyhow::Result<(Probe, Duration)> {
        Ok(match &self.es {
            Some(es) => (elastic::probe(es.clone()), Duration::from_millis(10)),
            None => (embedded_probe(EmbeddedIndex::open_existing(index_dir)?)?, Duration::from_millis(1)),
        })
    }

    /// Produces at a steady rate while a watcher thread polls the index for
    /// each command's document.
    async fn latency(&self, producer: Producer, index_dir: &Path) -> anyhow::Result<Latency> {
        let (rate, n) = (self.a.latency_rate, self.a.latency_rate * self.a.latency_secs);
        let (tx, rx) = mpsc::channel::<(String, Instant)>();
        let (probe, every) = self.probe(index_dir)?;
        let timeout = self.timeout;
        let watcher = std::thread::spawn(move || watch(probe, every, rx, timeout));
        // The baseline: a plain consumer of the same messages, alongside.
        let plain = latency::read_log(self.plain_consumer(&self.ends()?)?, timeout, move |seen| seen as u64 >= n);
        let producer = Arc::new(producer);
        let start = Instant::now();
        let mut sends = Vec::with_capacity(n as usize);
        for i in 0..n {
            tokio::time::sleep_until((start + Duration::from_secs_f64(i as f64 / rate as f64)).into()).await;
            let id = format!("lat{i}");
            let cmd = Command::UpsertFile { id: id.clone(), path: format!("/lat{}/file{i}.txt", i % self.a.keys), contents: format!("latency probe {i}"), previous_path: None };
            let sent = Instant::now();
            tx.send((id, sent)).ok();
            let p = producer.clone();
            sends.push(tokio::spawn(async move { p.send(cmd).await.map(|d| (d, sent, sent.elapsed().as_secs_f64() * 1000.0)) }));
        }
        let achieved_rate = n as f64 / start.elapsed().as_secs_f64();
        drop(tx);
        let mut acks = Vec::with_capacity(sends.len());
        let mut delivered = Vec::with_capacity(sends.len());
        for s in sends {
            let (d, sent, ack) = s.await??;
            acks.push(ack);
            delivered.push((d, sent));
        }
        let received = latency::read_log_end(plain).await?;
        let searchable = tokio::task::spawn_blocking(move || watcher.join()).await?.map_err(|_| anyhow::anyhow!("latency watcher panicked"))??;
        let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1000.0;
        let (mut all, mut plain_ms, mut own) = (Vec::new(), Vec::new(), Vec::new());
        for (i, (d, sent)) in delivered.iter().enumerate() {
            let seen = searchable[&format!("lat{i}")];
            all.push(ms(*sent, seen));
            if let Some(&r) = received.get(&(d.partition, d.offset)) {
                plain_ms.push(ms(*sent, r));
                own.push(ms(r, seen));
            }
        }
        let ms = &mut all;
        let q = |v: &mut Vec<f64>, p: f64| latency::quantile(v, p);
        Ok(Latency {
            n: ms.len(),
            p50: q(ms, 0.5),
            p90: q(ms, 0.9),
            p99: q(ms, 0.99),
            max: q(ms, 1.0),
            own_p50: q(&mut own, 0.5),
            own_p99: q(&mut own, 0.99),
            achieved_rate,
            ack_p50: q(&mut acks, 0.5),
            ack_p99: q(&mut acks, 0.99),
            plain_p50: q(&mut plain_ms, 0.5),
            plain_p99: q(&mut plain_ms, 0.99),
        })
    }
}
