//! `denorm demo`: the main job on embedded defaults. An in-process
//! Kafka-protocol broker (librdkafka's mock cluster), two workers in one
//! consumer group sharing one embedded index, a realistic data set, the
//! seed's rename race, example searches, and a check of the whole index
//! against the reference model.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use rdkafka::mocking::MockCluster;

use super::Cli;
use denorm::command::Command;
use denorm::command::LogPosition;
use denorm::demo;
use denorm::http::Health;
use denorm::index::embedded::{EmbeddedBackend, EmbeddedIndex};
use denorm::index::{FileQuery, PostQuery, SearchIndex};
use denorm::kafka::{self, KafkaConfig};
use denorm::model;
use denorm::produce::Producer;
use denorm::worker::{self, Stats, WorkerConfig};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Index directory (default: a temporary directory, removed afterwards)
    #[arg(long)]
    dir: Option<PathBuf>,
    #[command(flatten)]
    data: super::DataSetArgs,
    /// Partitions of the in-process topic
    #[arg(long = "demo-partitions", default_value_t = 6)]
    partitions: i32,
    /// Give up waiting for the workers after this many seconds
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
}

fn step(n: u32, text: &str) {
    eprintln!("[{n}/7] {text}");
}

pub async fn run(cli: &Cli, a: &DemoArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let tmp;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir().context("creating a temporary directory")?;
            tmp.path().join("index")
        }
    };
    if dir.join("shards").exists() {
        bail!(super::UsageError(format!("{} already holds an index; give an empty --dir", dir.display())));
    }
    let cluster = MockCluster::new(3).context("starting the in-process Kafka cluster")?;
    let topic = "denorm.demo";
    cluster.create_topic(topic, a.partitions, 1).context("creating the demo topic")?;
    cluster.create_topic(&denorm::dlq::default_topic(topic), a.partitions, 1).context("creating the demo's dead-letter topic")?;
    let mut kafka = KafkaConfig::new(cluster.bootstrap_servers(), topic);
    kafka.partitions = a.partitions;
    // The in-process broker keeps at most 5 MiB per partition (a fixed limit
    // of librdkafka's mock cluster); the producer's lz4 batches keep the data
    // set well inside it, and `check_retained` fails loudly if it is not.
    let group = cli.group.clone();
    eprintln!("denorm demo: in-process Kafka ({} brokers), topic {topic} with {} partitions, index at {}", 3, a.partitions, dir.display());

    step(1, &format!("generating data: {} files in {} top-level trees, {} users, {} posts", a.data.files, demo::TOP_DIRS.len(), a.data.users, a.data.posts));
    let seed = a.data.load();

    step(2, "starting two workers in one consumer group, sharing the index");
    let shutdown = Arc::new(AtomicBool::new(false));
    let backend = Arc::new(EmbeddedBackend::new(EmbeddedIndex::open(&dir, topic)?, 64 << 20));
    let mut workers = Vec::new();
    let mut stats = Vec::new();
    worker::settings::announce(backend.as_ref(), &WorkerConfig::new(kafka.clone(), group.clone()))?;
    for _ in 0..2 {
        let mut cfg = WorkerConfig::new(kafka.clone(), group.clone());
        // The in-process broker loses no heartbeat to a network. Under load
        // its coordinator has answered the follower's first SyncGroup with
        // INVALID_REQUEST, then held the join that followed for a whole
        // session timeout, though both workers had joined again within 3 s
        // (librdkafka's cgrp debug log): at the default 45 s the demo took
        // 54 s instead of 12 (one run in six, six demos at once), and 142 s
        // in the test suite. 6 s is the least brokers accept.
        cfg.session_timeout = Duration::from_secs(6);
        let s = Arc::new(Stats::default());
        stats.push(s.clone());
        let stop = shutdown.clone();
        let b = backend.clone();
        workers.push(std::thread::spawn(move || worker::run(cfg, b, stop, Arc::new(Health::default()), s)));
    }

    step(3, &format!("producing {} commands", seed.len()));
    let producer = Producer::new(&kafka)?;
    let bar = super::progress(seed.len() as u64, "produced");
    let t = Instant::now();
    let deliveries = producer.send_all(seed.clone(), 10_000, |n| bar.set_position(n as u64)).await?;
    bar.finish_and_clear();
    eprintln!("      produced {} commands in {:.1}s", seed.len(), t.elapsed().as_secs_f64());
    let mut log: Vec<(LogPosition, Command)> = deliveries.into_iter().zip(seed).collect();
    check_retained(&kafka)?;
    let load = wait(&kafka, &group, log.len(), a.timeout_secs, "applying").await?;
    eprintln!("      load applied; lag drained to 0 in {load:.1}s after producing");

    step(4, "race: rename /clinton/projects -> /clinton/work while README.txt is renamed; user renames with many posts");
    let (dir_rename, file_rename) = demo::race();
    let docs_before: u64 = stats.iter().map(|s| s.documents.load(Ordering::Relaxed)).sum();
    let t = Instant::now();
    let (p1, p2) = (&producer, &producer);
    let (d1, d2) = tokio::join!(p1.send(dir_rename.clone()), p2.send(file_rename.clone()));
    let (d1, d2) = (d1?, d2?);
    let first = if d1.offset < d2.offset { "directory rename" } else { "README rename" };
    eprintln!("      both renames keyed /clinton (partition {}); the log ordered the {first} first", d1.partition);
    log.push((d1, dir_rename));
    log.push((d2, file_rename));
    let renames = a.data.user_renames();
    let deliveries = producer.send_all(renames.clone(), 1000, |_| {}).await?;
    log.extend(deliveries.into_iter().zip(renames));
    check_retained(&kafka)?;
    let race_secs = wait(&kafka, &group, log.len(), a.timeout_secs, "rewriting").await?;
    let race_total = t.elapsed().as_secs_f64().max(race_secs);
    let docs_after: u64 = stats.iter().map(|s| s.documents.load(Ordering::Relaxed)).sum();
    let (big_docs, big_us) = stats.iter().map(|s| (s.largest_fan_out_documents.load(Ordering::Relaxed), s.largest_fan_out_micros.load(Ordering::Relaxed))).max().unwrap_or((0, 0));
    eprintln!(
        "      {} documents rewritten in {race_total:.1}s; largest rename: {big_docs} files in {:.2}s ({:.0} documents/s); lag drained to 0",
        docs_after - docs_before,
        big_us as f64 / 1e6,
        big_docs as f64 / (big_us as f64 / 1e6).max(1e-9)
    );

    step(5, "moves between trees: /hillary/projects -> /bill/hillary-projects, the README's directory to /chelsea, /al renamed /albert; owner changes: a file of /bill given to /tipper, a post given to another user; two tenants with the same paths");
    // Owner changes in their explicit form: an upsert naming where the
    // document is now (previous_path, previous_user_id). Each is sent as
    // the delete there, acknowledged once applied, then the upsert.
    let handed = log.iter().find_map(|(_, c)| match c {
        Command::UpsertFile { id, path, .. } if path.starts_with("/bill/projects/") => Some((id.clone(), path.clone())),
        _ => None,
    });
    let reattributed = log.iter().find_map(|(_, c)| match c {
        Command::UpsertPost { id, user_id, title, body, .. } => Some((id.clone(), user_id.clone(), title.clone(), body.clone())),
        _ => None,
    });
    let to_user = log.iter().rev().find_map(|(_, c)| match (c, &reattributed) {
        (Command::UpsertUser { id, .. }, Some((_, from, _, _))) if id != from => Some(id.clone()),
        _ => None,
    });
    let mut moves = demo::moves();
    if let Some((id, path)) = &handed {
        let to = format!("/tipper/from-bill/{}", denorm::command::path::split(path).1);
        moves.push(Command::UpsertFile { id: id.clone(), path: to, contents: "handed over from /bill, then edited".into(), previous_path: Some(path.clone()) });
    }
    if let (Some((id, from, title, body)), Some(to)) = (&reattributed, &to_user) {
        moves.push(Command::UpsertPost { id: id.clone(), user_id: to.clone(), title: title.clone(), body: body.clone(), previous_user_id: Some(from.clone()) });
    }
    let owner_changes = moves.iter().filter(|c| c.previous_key().is_some()).count();
    let moves = denorm::command::expand_owner_changes(moves);
    let t = Instant::now();
    let (deliveries, _) = producer.send_ordered(&kafka, &group, moves.clone(), 1000, Duration::from_secs(a.timeout_secs), |_| {}).await?;
    log.extend(deliveries.into_iter().zip(moves));
    check_retained(&kafka)?;
    wait(&kafka, &group, log.len(), a.timeout_secs, "moving").await?;
    eprintln!(
        "      {} renames across top-level directories and {owner_changes} owner changes, each acknowledged once applied at its source; all applied in {:.1}s",
        demo::moves().len(),
        t.elapsed().as_secs_f64()
    );

    let scoped = demo::tenants();
    let deliveries = producer.send_all(scoped.clone(), 1000, |_| {}).await?;
    log.extend(deliveries.into_iter().zip(scoped));
    wait(&kafka, &group, log.len(), a.timeout_secs, "applying the tenants' commands").await?;
    eprintln!("      two tenants, acme and globex, wrote the same paths, file ids and user ids; acme renamed its /clinton/work/notes, globex its user 1");

    shutdown.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().map_err(|_| anyhow::anyhow!("a worker panicked"))?.context("worker failed")?;
    }
    drop(producer);
    // The model is computed from the topic itself, in the order the
    // partitions' logs serialized the commands and the moves.
    let logs = tokio::task::spawn_blocking({
        let k = kafka.clone();
        move || kafka::read_topic(&k, &denorm::codec::Codec::new())
    })
    .await?
    .map_err(|e| anyhow::anyhow!("reading the topic back: {e}"))?;
    // `denorm verify`, as an operator runs it: the log replayed up to the
    // index's checkpoints into a scratch copy, compared document by document
    // (shown in step 7, beside the model check).
    let verified = {
        let (k, g, live, rt) = (kafka.clone(), group.clone(), backend.clone(), tokio::runtime::Handle::current());
        let timeout = Duration::from_secs(a.timeout_secs);
        tokio::task::spawn_blocking(move || -> anyhow::Result<denorm::verify::Report> {
            let scratch = tempfile::Builder::new().prefix("denorm-verify-").tempdir()?;
            let v = denorm::verify::Verify {
                members: Default::default(),
                kafka: k,
                live: live.as_ref(),
                scratch: scratch.path(),
                group: g,
                budget: 64 << 20,
                max_differences: 20,
                for_repair: false,
                timeout,
                keys: None,
                rounds: 1,
                delete_group: false,
                model: None,
                runtime: rt,
            };
            Ok(denorm::verify::run(v, |_| {})?)
        })
        .await?
        .context("denorm verify")?
    };
    drop(cluster);

    step(6, "example searches");
    let index = EmbeddedIndex::open_existing(&dir)?;
    let search = index.search()?;
    let mut n = 0;
    search.files(&FileQuery { under: Some("/clinton/work".into()), ..Default::default() }, 0, &mut |_| n += 1)?;
    println!("  files anywhere under /clinton/work: {n}");
    let mut hits = Vec::new();
    search.files(&FileQuery { text: Some("elasticsearch project".into()), dir: Some("/chelsea/elasticsearch".into()), ..Default::default() }, 3, &mut |f| hits.push(f.full_path()))?;
    println!("  'elasticsearch project' in /chelsea/elasticsearch (moved from /clinton/work): {hits:?}");
    let mut posts = Vec::new();
    search.posts(&PostQuery { text: Some("relationships".into()), author: Some("John".into()), ..Default::default() }, 3, &mut |p| posts.push(format!("{} by {}", p.title, p.user.name)))?;
    println!("  posts about relationships by someone called John: {posts:?}");
    let groups = search.posts_by_author(&PostQuery { text: Some("relationships".into()), ..Default::default() }, 3, 2)?;
    for g in groups {
        println!("  author {:?} (best score {:.2}): {:?}", g.author, g.best_score, g.posts.iter().map(|p| &p.title).collect::<Vec<_>>());
    }

    let mut moved = 0;
    search.files(&FileQuery { under: Some("/albert".into()), ..Default::default() }, 0, &mut |_| moved += 1)?;
    println!("  files under /albert (renamed from /al): {moved}");
    let mut handed_over = Vec::new();
    search.files(&FileQuery { under: Some("/tipper/from-bill".into()), ..Default::default() }, 0, &mut |f| handed_over.push(format!("{} {:?}", f.full_path(), f.contents)))?;
    println!("  the file handed from /bill to /tipper: {handed_over:?}");

    for t in demo::TENANTS {
        let tenant = Some(t.to_string());
        let mut notes = Vec::new();
        search.files(&FileQuery { tenant: tenant.clone(), under: Some("/clinton".into()), ..Default::default() }, 0, &mut |f| notes.push(f.unscoped().full_path()))?;
        notes.sort();
        let mut authors = Vec::new();
        search.posts(&PostQuery { tenant, text: Some("relationships".into()), ..Default::default() }, 0, &mut |p| authors.push(p.user.name))?;
        println!("  tenant {t}: files under /clinton: {notes:?}; its posts about relationships are by {authors:?}");
    }

    step(7, "comparing the whole index with the reference model of the log, and with a replay of the log (denorm verify)");
    let (m, moves) = model::serialized(&logs).map_err(|e| anyhow::anyhow!("the reference model: {e}"))?;
    println!("  cross-key renames that moved files: {}", moves.arrived);
    let expected = m.docs();
    let mut actual = Vec::new();
    search.dump(&mut |d| actual.push(d))?;
    let (n_expected, n_actual) = (expected.len(), actual.len());
    let diffs = model::diff(expected, actual, 20);
    let applied: u64 = stats.iter().map(|s| s.applied.load(Ordering::Relaxed)).sum();
    println!("  commands: {} produced, {applied} applied by 2 workers; documents: {n_actual} in the index, {n_expected} in the model", log.len());
    println!("  peak memory (VmHWM): {}", peak_memory());
    println!("  total time: {:.1}s", started.elapsed().as_secs_f64());
    if !diffs.is_empty() {
        for d in &diffs {
            println!("  DIFFERENCE: {d}");
        }
        bail!("model check FAILED: the index differs from the reference model");
    }
    println!("model check passed: all {n_actual} documents match the reference model");
    println!("denorm verify: {} documents equal to a replay of the log up to the index's checkpoints ({:.1}s; docs/verify.md)", verified.outcome.checked, verified.seconds);
    if !verified.clean() {
        for d in &verified.outcome.differences {
            println!("  VERIFY DIFFERENCE: {} {}: {:?} {:?}", d.kind, d.id, d.problem, d.fields);
        }
        bail!("denorm verify FAILED: {} document(s) differ from the replay of the log", verified.outcome.differences_total);
    }
    if a.dir.is_some() {
        println!("index kept at {}; try: denorm search --default-tenant files --index {} --under /clinton/work --limit 5 (or --tenant acme)", dir.display(), dir.display());
    }
    Ok(())
}

/// Waits until the group has applied `produced` messages; returns seconds waited.
async fn wait(kafka: &KafkaConfig, group: &str, produced: usize, timeout: u64, what: &'static str) -> anyhow::Result<f64> {
    let t = Instant::now();
    let (k, g) = (kafka.clone(), group.to_string());
    let bar = super::progress(produced as u64, what);
    let b = bar.clone();
    tokio::task::spawn_blocking(move || {
        kafka::wait_until_applied(&k, &g, produced as i64, Duration::from_secs(timeout), |r| {
            let end: i64 = r.partitions.iter().map(|p| p.end).sum();
            b.set_position((end - r.total).max(0) as u64)
        })
    })
    .await?
    .context("waiting for the workers")?;
    bar.finish_and_clear();
    Ok(t.elapsed().as_secs_f64())
}

/// Fails when the in-process broker has dropped the start of a partition.
fn check_retained(kafka: &KafkaConfig) -> anyhow::Result<()> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = kafka.consumer_config().create()?;
    for p in 0..kafka.partitions {
        let (low, _) = c.fetch_watermarks(&kafka.topic, p, kafka::REQUEST_TIMEOUT)?;
        if low > 0 {
            bail!("the in-process broker dropped the first {low} messages of partition {p} (it keeps at most 5 MiB per partition); use a smaller data set (--files)");
        }
    }
    Ok(())
}

fn peak_memory() -> String {
    std::fs::read_to_string("/proc/self/status").ok().and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| l["VmHWM:".len()..].trim().to_string())).unwrap_or_else(|| "unknown".into())
}
