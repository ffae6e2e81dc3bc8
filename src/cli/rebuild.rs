//! `denorm rebuild`: builds the next generation of the index (embedded or
//! Elasticsearch) from the start of the topic while the live workers keep
//! applying commands to the current one and searches keep reading it, then
//! cuts over atomically.
//!
//! How it goes (and how a crash at any point is resumed):
//!
//! 1. The topic must still hold every command (low watermark 0 on every
//!    partition), or the rebuild is refused: a replay could not be exact.
//! 2. The rebuild's state (`<index>/REBUILD`, or the meta document
//!    `rebuild` on Elasticsearch) records the generation being built (N+1).
//!    A rerun after a crash reads it and resumes that generation: its
//!    shards' checkpoints say where each partition goes on.
//! 3. An in-process worker of its own consumer group applies the topic to
//!    generation N+1 (dead letters and parking work as in `denorm run`).
//! 4. Once every partition of N+1 has reached both the end of the log (as
//!    of that check) and the checkpoint of generation N, the rebuild's
//!    worker stops (commits and releases its shard writers), N+1 is made
//!    searchable, and the cutover switches searches to it at once: one
//!    atomic rename of `CURRENT` (embedded), one `_aliases` request
//!    (Elasticsearch). Searches never see a half-built generation.
//! 5. Each live worker notices the switch between two batches (or, on
//!    Elasticsearch, at its next write: the old generation's write aliases
//!    are gone), commits or drops what it had for N, opens N+1's shard and
//!    resumes at N+1's checkpoint: a command that arrived during the
//!    cutover is applied to N+1 by the rebuild or by the live worker, once.
//! 6. Generation N is deleted (`--keep-old` keeps it): on the embedded index
//!    once no writer holds its shards, on Elasticsearch at once (nothing can
//!    write to it any more), then the state is removed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use rdkafka::consumer::BaseConsumer;
use tracing::{info, warn};

use super::{Cli, UsageError};
use crate::http::{self, Health};
use crate::index::elastic::{setup, backend::ElasticBackend};
use crate::index::embedded::EmbeddedIndex;
use crate::index::generations::{ElasticGenerations, EmbeddedGenerations, Generations, State};
use crate::index::Checkpoint;
use crate::kafka::{watermarks, KafkaConfig};
use crate::worker::{self, Stats, WorkerConfig};

#[derive(Debug, Args)]
pub struct RebuildArgs {
    /// Print the index's generations and the state of a rebuild in progress, and exit
    #[arg(long)]
    status: bool,
    /// With --status: print JSON
    #[arg(long, requires = "status")]
    json: bool,
    /// Keep the previous generation after the cutover (default: deleted once no worker
    /// writes to it: its directory, or its Elasticsearch indexes and meta documents)
    #[arg(long, env = "DENORM_REBUILD_KEEP_OLD")]
    keep_old: bool,
    /// Address of the rebuild's /metrics, /healthz and /readyz endpoint (loopback by default)
    #[arg(long, env = "DENORM_REBUILD_METRICS_ADDR", default_value = "127.0.0.1:9465")]
    metrics_addr: std::net::SocketAddr,
    /// Indexing memory budget per partition shard, in MiB (at least 15)
    #[arg(long, env = "DENORM_INDEX_MEMORY_MB", default_value_t = 64, value_parser = clap::value_parser!(u64).range(15..=4096))]
    index_memory_mb: u64,
    #[command(flatten)]
    takeover: super::TakeoverArgs,
}

/// Commands of the log (`ends`: each partition's watermarks) that a
/// generation with `checkpoints` has applied.
fn applied_of(checkpoints: &BTreeMap<i32, Checkpoint>, ends: &[(i64, i64)]) -> i64 {
    (0..).zip(ends).map(|(p, (_, high))| checkpoints.get(&p).map_or(0, |c| (c.offset as i64 + 1).min(*high))).sum()
}

pub async fn run(cli: &Cli, a: &RebuildArgs) -> anyhow::Result<()> {
    let kafka = cli.kafka();
    let rt = tokio::runtime::Handle::current();
    let index: Arc<dyn Generations> = match super::elastic_url(cli) {
        Some(url) => {
            let es = super::elastic_config(&url)?;
            let client = es.client()?;
            if !a.status {
                setup::ensure(&client, &es.prefix).await.context("setting up the Elasticsearch indexes")?;
                // A rebuild creates indexes and moves aliases.
                setup::check_privileges(&client, &es.prefix, setup::MANAGE_PRIVILEGES).await?;
            }
            Arc::new(ElasticGenerations { backend: ElasticBackend::new(client, &es.prefix, &kafka.topic, rt.clone()) })
        }
        None => {
            let index = EmbeddedIndex::open_for_rebuild(&cli.index, &kafka.topic).with_context(|| format!("opening the index {}", cli.index.display()))?;
            Arc::new(EmbeddedGenerations { index, budget: (a.index_memory_mb as usize) << 20 })
        }
    };
    if a.status {
        let (k, json) = (kafka.clone(), a.json);
        return tokio::task::spawn_blocking(move || status(&k, index.as_ref(), json)).await?;
    }
    let (k, group, keep_old, addr, waits) = (kafka.clone(), cli.group.clone(), a.keep_old, a.metrics_addr, !a.takeover.no_takeover_waits);
    let handle = crate::metrics::install().map_err(anyhow::Error::msg).context("installing the metrics recorder")?;
    let health = Arc::new(Health::default());
    health.beat();
    let bound = http::serve(addr, handle, health.clone()).await.with_context(|| format!("binding the metrics endpoint {addr}"))?;
    info!(addr = %bound, "serving /metrics, /healthz, /readyz");
    let dlq = KafkaConfig { topic: crate::dlq::default_topic(&kafka.topic), ..kafka.clone() };
    let partitions = kafka.topic_partitions()?.ok_or_else(|| UsageError(format!("topic {} does not exist", kafka.topic)))?;
    dlq.ensure_topic().await.context("cannot reach or create the dead-letter topic")?;
    tokio::task::spawn_blocking(move || rebuild(k, index.as_ref(), &group, partitions, keep_old, waits, health, rt)).await?
}

/// How long the rebuild's progress poll goes on without an answer from the
/// broker before the rebuild gives up.
const BROKER_SILENCE: Duration = Duration::from_secs(120);

fn rebuild(
    kafka: KafkaConfig,
    index: &dyn Generations,
    group: &str,
    partitions: i32,
    keep_old: bool,
    takeover_waits: bool,
    health: Arc<Health>,
    rt: tokio::runtime::Handle,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let consumer: BaseConsumer = kafka.client_config().create()?;
    let marks = watermarks(&consumer, &kafka.topic, partitions)?;
    if let Some((p, (low, _))) = marks.iter().enumerate().find(|(_, (low, _))| *low > 0) {
        bail!(
            "partition {p} of {} starts at offset {low}: retention has deleted {low} command(s), so a replay cannot rebuild \
             the index exactly. Keep the command topic's whole history (retention.ms=-1, retention.bytes=-1), or restore the \
             index from a copy and let `denorm run` catch it up from its checkpoints",
            kafka.topic
        );
    }
    // Rebuilt from the topic the live generation was built from, the new one
    // must also reach the live one's checkpoints; from another topic (after
    // `denorm migrate`) their offsets are not comparable.
    let same_log = index.recorded_topic()? == kafka.topic;
    // Partitions added to the topic in place moved keys to other
    // partitions: a replay would split them across shards (the workers
    // refuse such a topic too). Only a copy into a new topic keeps them.
    if same_log {
        if let Some(recorded) = index.recorded_partitions()?.filter(|n| *n != partitions) {
            return Err(UsageError(format!(
                "topic {topic} has {partitions} partitions, but the index was built from it with {recorded}: partitions added in \
                 place moved keys to other partitions, and a replay would split their commands between shards. Copy the topic \
                 into a new one (`denorm migrate --to-topic NEW --to-partitions {partitions}`), then rebuild from it \
                 (`denorm --topic NEW rebuild`); see docs/rebuild.md",
                topic = kafka.topic
            ))
            .into());
        }
    }
    let current = index.current()?;
    let state = match index.state()? {
        Some(s) => {
            info!(generation = s.generation, "resuming the rebuild in progress");
            s
        }
        None => {
            let generation = index.list()?.into_iter().max().unwrap_or(0).max(current) + 1;
            let s = State { generation, group: format!("{group}.rebuild-{generation}-{}", uuid::Uuid::new_v4().simple()) };
            index.save_state(&s)?;
            info!(generation, "rebuilding the index into a new generation");
            s
        }
    };
    let target = state.generation;
    let total: i64 = marks.iter().map(|(_, high)| high).sum();

    if current != target {
        index.prepare(target)?;
        // The rebuild's worker, on generation `target`.
        let backend = index.writer(target);
        let shutdown = Arc::new(AtomicBool::new(false));
        // A group of this run's own: a run killed moments ago may still be a
        // member of the last one, holding its partitions until the broker
        // evicts it (tansu 0.6 was seen not to within minutes). Positions
        // come from the shards' checkpoints, never from the group's offsets.
        let run_group = format!("{}-{}", state.group, &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let mut cfg = WorkerConfig::new(kafka.clone(), run_group);
        cfg.takeover_waits = takeover_waits;
        let (flag, h) = (shutdown.clone(), health.clone());
        let worker = std::thread::spawn(move || {
            let _rt = rt.enter();
            worker::run(cfg, backend, flag, h, Arc::new(Stats::default()))
        });

        let bar = super::progress(total.max(0) as u64, "rebuild");
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
        if !terminal {
            bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        let mut last_report = Instant::now();
        let mut unanswered: Option<Instant> = None;
        loop {
            if worker.is_finished() {
                let r = worker.join().map_err(|_| anyhow::anyhow!("the rebuild's worker panicked"))?;
                r.context("the rebuild's worker failed")?;
                bail!("the rebuild's worker stopped before the rebuild was done");
            }
            // A poll the broker did not answer in time (a busy broker) is
            // polled again: the worker goes on meanwhile. Only a broker
            // silent for minutes ends the rebuild.
            let ends = match watermarks(&consumer, &kafka.topic, partitions) {
                Ok(e) => {
                    unanswered = None;
                    e
                }
                Err(e) => {
                    let since = *unanswered.get_or_insert_with(|| {
                        warn!(error = %e, "reading the topic's end offsets failed; polled again every second");
                        Instant::now()
                    });
                    if since.elapsed() >= BROKER_SILENCE {
                        return Err(e).context(format!("the broker has not said where the topic ends for {}s", BROKER_SILENCE.as_secs()));
                    }
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            let built = index.checkpoints_in(target, partitions)?;
            let live = if same_log { index.checkpoints_in(current, partitions)? } else { Default::default() };
            let applied = applied_of(&built, &ends);
            let all: i64 = ends.iter().map(|(_, high)| high).sum();
            bar.set_length(all.max(0) as u64);
            bar.set_position(applied.max(0) as u64);
            metrics::gauge!("denorm_rebuild_remaining_messages").set((all - applied).max(0) as f64);
            metrics::gauge!("denorm_rebuild_generation").set(target as f64);
            if !terminal && last_report.elapsed() >= Duration::from_secs(5) {
                last_report = Instant::now();
                let rate = applied as f64 / started.elapsed().as_secs_f64().max(0.001);
                info!(generation = target, applied, of = all, rate = rate as u64, "rebuild progress");
            }
            // Caught up: with the log as of this check, and with the live
            // generation (so a search never sees the index go back).
            let caught_up = (0..partitions).all(|p| {
                let high = ends[p as usize].1;
                let at = built.get(&p).map_or(-1, |c| c.offset as i64);
                let live_at = live.get(&p).map_or(-1, |c| c.offset as i64);
                at + 1 >= high && at >= live_at
            });
            if caught_up {
                bar.finish_and_clear();
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        // The rebuild's worker stops first (commits, releases its writers):
        // from the cutover on, live workers are the only writers of `target`.
        shutdown.store(true, Ordering::SeqCst);
        worker.join().map_err(|_| anyhow::anyhow!("the rebuild's worker panicked"))?.context("the rebuild's worker failed")?;
        index.cut_over(current, target, partitions)?;
        info!(from = current, to = target, "cut over: searches and live workers use the new generation");
        if crate::faults::active("rebuild.after-cutover").is_some() {
            warn!("injected fault rebuild.after-cutover: aborting");
            std::process::abort();
        }
    }

    if !keep_old {
        for g in index.list()?.into_iter().filter(|&g| g != target) {
            index.remove(g, partitions)?;
        }
    }
    index.clear_state()?;
    let secs = started.elapsed().as_secs_f64();
    let built = index.checkpoints_in(target, partitions)?;
    let applied: u64 = built.values().map(|c| c.offset + 1).sum();
    println!(
        "rebuilt generation {target} from {} partitions: {applied} commands in {secs:.1}s ({:.0}/s); searches and workers now use it",
        partitions,
        applied as f64 / secs.max(0.001)
    );
    Ok(())
}

fn status(kafka: &KafkaConfig, index: &dyn Generations, json: bool) -> anyhow::Result<()> {
    let current = index.current()?;
    let generations = index.list()?;
    let state = index.state()?;
    let target = state.as_ref().map(|s| s.generation);
    let partitions = kafka.topic_partitions()?.unwrap_or(0);
    let consumer: BaseConsumer = kafka.client_config().create()?;
    let ends = watermarks(&consumer, &kafka.topic, partitions)?;
    let progress = |g: u64| -> anyhow::Result<(i64, i64)> {
        let c = index.checkpoints_in(g, partitions)?;
        Ok((applied_of(&c, &ends), ends.iter().map(|(_, h)| h).sum()))
    };
    let (live_applied, end) = progress(current)?;
    let building = target.map(progress).transpose()?;
    if json {
        let v = serde_json::json!({
            "current": current,
            "generations": generations,
            "current_applied": live_applied,
            "end": end,
            "rebuild": target.map(|g| serde_json::json!({"generation": g, "applied": building.map(|b| b.0)})),
        });
        println!("{v}");
        return Ok(());
    }
    println!("current generation: {current} ({live_applied} of {end} commands applied)");
    println!("generations: {generations:?}");
    match (target, building) {
        (Some(g), Some((applied, end))) => println!("rebuild in progress: generation {g}, {applied} of {end} commands applied (run `denorm rebuild` to resume it)"),
        _ => println!("no rebuild in progress"),
    }
    Ok(())
}
