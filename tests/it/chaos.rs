//! Chaos against the reference model: a generated mixed workload of more
//! than 50,000 commands, applied by `denorm run` processes that are
//! SIGKILLed at random moments and restarted, while a second worker joins
//! and leaves gracefully (rebalances). At the end the index must equal the model of the
//! topic's log in partition order. The seed is printed; replay a failure
//! with `DENORM_CHAOS_SEED=<seed>`.

use std::time::{Duration, Instant};

use crate::common::*;
use denorm::command::Command;
use denorm::model::Model;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// At least this many SIGKILLs.
const KILLS: usize = 12;

/// The demo's data set plus a tail of mixed commands: file upserts (moves
/// within their tree) and deletes, directory renames (two of the whole
/// `/clinton/projects` tree, ~15,000 files each) and renames of prolific users.
fn workload(seed: u64) -> Vec<Command> {
    let files = 36_000;
    let mut out = denorm::demo::seed(files, 400, 10_000, seed);
    let top_of: Vec<String> = out[..files]
        .iter()
        .map(|c| match c {
            Command::UpsertFile { path, .. } => denorm::command::path::top_level(path).to_string(),
            _ => unreachable!(),
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(seed ^ 0xC4A05);
    let renames: [(usize, &str, &str); 5] = [
        (800, "/clinton/projects", "/clinton/work"),
        (1600, "/clinton/work/kafka", "/clinton/work/streams"),
        (2000, "/bill/projects", "/bill/archive"),
        (2600, "/clinton/work", "/clinton/projects"),
        (3200, "/hillary/projects/lucene", "/hillary/lucene"),
    ];
    for i in 0..4000 {
        if let Some((_, from, to)) = renames.iter().find(|(at, _, _)| *at == i) {
            out.push(Command::RenamePath { from: from.to_string(), to: to.to_string() });
            continue;
        }
        let r: f64 = rng.random();
        let f = rng.random_range(0..files);
        let top = &top_of[f];
        out.push(if r < 0.6 {
            Command::UpsertFile { id: format!("f{f}"), path: format!("{top}/projects/chaos/c{}/file{f}.txt", i % 7), contents: format!("chaos {i}"), previous_path: None }
        } else if r < 0.85 {
            Command::DeleteFile { id: format!("f{f}"), path: format!("{top}/gone.txt") }
        } else {
            let u = rng.random_range(1..=20);
            Command::UpsertUser { id: u.to_string(), name: format!("Renamed {u} v{i}"), email: format!("u{u}@example.org"), dob: "1970-01-01".into() }
        });
    }
    out
}

#[test]
fn chaos_kills_and_rebalances_lose_nothing_and_break_no_order() {
    let seed: u64 = std::env::var("DENORM_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("chaos seed: {seed} (replay with DENORM_CHAOS_SEED={seed})");
    let commands = workload(seed);
    assert!(commands.len() >= 50_000, "{}", commands.len());
    // The renames touch at least 10,000 files: count them in the model.
    let mut m = Model::default();
    let mut moved = 0usize;
    for c in &commands {
        if let Command::RenamePath { from, .. } = c {
            moved += m.docs().iter().filter(|d| matches!(d, denorm::index::Doc::File(f) if denorm::command::path::is_within(&f.full_path(), from))).count();
        }
        m.apply(c);
    }
    assert!(moved >= 10_000, "renames move {moved} files");

    let r = Rig::new(6);
    let (cfg, group, index) = (&r.cfg, r.group.as_str(), r.index.as_path());
    let mut rng = StdRng::seed_from_u64(seed);
    let start = |extra: &[&str]| Worker::start(cfg, group, index, extra);
    // A short session timeout: the group notices killed members sooner.
    let args: &[&str] = &["--shutdown-timeout-secs", "5", "-X", "session.timeout.ms=6000", "-X", "heartbeat.interval.ms=500"];
    let t = Instant::now();
    let (n, producer_cfg) = (commands.len(), cfg.clone());
    let producer = std::thread::spawn(move || produce(&producer_cfg, commands));
    let mut main = Some(start(args));
    let mut second: Option<Worker> = None;
    let (mut kills, mut joins, mut leaves) = (0usize, 0usize, 0usize);
    while kills < KILLS || !producer.is_finished() {
        // The chaos schedule: the next fault in 0.5-4 s.
        std::thread::sleep(Duration::from_millis(rng.random_range(500..4000)));
        match rng.random_range(0..10) {
            0..=5 => {
                main.take().expect("main worker").kill();
                kills += 1;
                main = Some(start(args));
            }
            // A killed worker is restarted, as a supervisor would (tansu
            // 0.6 leaves the partitions of a member that times out while
            // the group is stable unassigned until the next join).
            6..=7 => match second.take() {
                Some(w) => {
                    w.kill();
                    kills += 1;
                    second = Some(start(args));
                }
                None => {
                    second = Some(start(args));
                    joins += 1;
                }
            },
            _ => match second.take() {
                Some(w) => {
                    let (status, log) = w.terminate_with_log();
                    assert!(status.success(), "{status:?}\n{log}");
                    leaves += 1;
                }
                None => {
                    second = Some(start(args));
                    joins += 1;
                }
            },
        }
    }
    let log = producer.join().unwrap();
    let chaos = t.elapsed();
    let nudges = applied_with_nudges(cfg, group, n, || start(args));
    eprintln!(
        "chaos: {n} commands, {kills} SIGKILLs, {joins} joins, {leaves} graceful leaves over {:.1}s; all applied after {:.1}s ({} fresh joins to get past tansu's orphaned partitions)",
        chaos.as_secs_f64(),
        t.elapsed().as_secs_f64(),
        nudges.len()
    );
    assert!(kills >= KILLS);
    // The workload holds no invalid command: a dead letter means a message
    // refused, and its key parked (the failure report lists them).
    assert_eq!(r.dlq_count()["total"], 0, "dead letters in a workload without an invalid command");
    assert_matches_model(index, &log);
    assert_verify_clean(cfg, group, index);
    drop(main);
    drop(second);
}

/// Trees of the lanes storm.
const STORM_TREES: usize = 8;

/// Repeated rebalances while fan-outs run in key lanes, as users of
/// parallel consumers hit them (issue 30): the group scales 1 -> 3 -> 1
/// while every tree (of `files` files) is renamed again and again (a page at a
/// time, paused; one held in its lane throughout) between other keys'
/// single-document commands. The two members that join are dynamic
/// and leave gracefully; the first is static and is SIGKILLed twice,
/// with the others in the group and alone. (tansu 0.6 assigns
/// partitions to a killed dynamic member until its session ends and then
/// starts no rebalance, which only a fresh join undoes: the chaos test
/// covers that case, with such joins.) No partition may stall (the last
/// member applies everything, with no fresh join to help it), no committed
/// offset may go back (sampled every 100 ms throughout), and the index must
/// equal the model.
fn storm(r: Rig, files: usize) {
    let (cfg, group) = (&r.cfg, r.group.as_str());
    let tree = |t: usize| format!("/lane{t}");
    let mut base = Vec::new();
    for t in 0..STORM_TREES {
        base.extend((0..files).map(|i| Command::UpsertFile { id: format!("t{t}f{i}"), path: format!("{}/a/d{}/f{i}.txt", tree(t), i % 20), contents: format!("file {i}"), previous_path: None }));
    }
    let mut log = produce(cfg, base);
    let common: &[&str] = &["--page-size", "150", "--fan-out-page-pause-ms", "20", "--shutdown-timeout-secs", "5"];
    let with = |extra: &[&str]| -> Worker { r.worker(&[common, extra].concat()) };
    // The first member is static: restarted under its id, it takes its
    // partitions back without a rebalance. Its session outlasts a restart.
    let fixed: &[&str] = &["--instance-id", "storm-0", "--session-timeout-ms", "60000"];
    // Committed offsets, sampled throughout: (partition, from, to) of each
    // step back.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let monitor = {
        let (cfg, group, stop) = (cfg.clone(), group.to_string(), stop.clone());
        std::thread::spawn(move || {
            let client = denorm::kafka::group_client(&cfg, &group).unwrap();
            let (mut high, mut back, mut samples) = (vec![0i64; cfg.partitions as usize], Vec::new(), 0usize);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(r) = denorm::kafka::lag_of(&client, &cfg.topic, cfg.partitions, Duration::from_secs(5)) {
                    samples += 1;
                    for p in r.partitions {
                        let h = &mut high[p.partition as usize];
                        if p.committed < *h {
                            back.push((p.partition, *h, p.committed));
                        }
                        *h = (*h).max(p.committed);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            (back, samples)
        })
    };
    // Renames of every tree, back and forth, between other keys' files.
    // Until the storm ends.
    let calm = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let (cfg, calm) = (cfg.clone(), calm.clone());
        std::thread::spawn(move || {
            let mut sent = Vec::new();
            for round in 0.. {
                if calm.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let (from, to) = if round % 2 == 0 { ("a", "b") } else { ("b", "a") };
                for t in 0..STORM_TREES {
                    let mut batch = vec![Command::RenamePath { from: format!("{}/{from}", tree(t)), to: format!("{}/{to}", tree(t)) }];
                    batch.extend((0..10).map(|i| Command::UpsertFile {
                        id: format!("r{round}t{t}n{i}"),
                        path: format!("{}/x/n{i}.txt", tree((t + 1 + i) % STORM_TREES)),
                        contents: format!("round {round}"),
                        previous_path: None,
                    }));
                    sent.extend(produce(&cfg, batch));
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
            sent
        })
    };
    // Each step waits for the group to settle (every partition assigned
    // among the members alive), so that each change is a rebalance of its
    // own: tansu 0.6 left a group whose members changed mid-rebalance
    // waiting for a member that had died.
    let n = cfg.partitions;
    let mut logs = Vec::new();
    // One rename is held in its lane for the whole storm (fault point
    // fanout.hold): every revoke of its partition finds a fan-out
    // unfinished. The others run a page at a time between the revokes.
    r.on_fault("fanout.hold", "/lane0\n");
    let mut first = with(fixed);
    wait_covered(&[&first], n);
    assert!(first.wait_for_log(r#"command="rename" key="/lane0""#, Duration::from_secs(60)), "the held rename never started:\n{}", first.log());
    // 1 -> 3: two members join.
    let (joined, other) = (with(&[]), with(&[]));
    wait_covered(&[&first, &joined, &other], n);
    // The first member is killed mid-work and comes back under its id:
    // it takes its partitions back without a rebalance and resumes from
    // the committed offsets.
    logs.push(first.log());
    first.kill();
    first = with(fixed);
    wait_covered(&[&first, &joined, &other], n);
    // 3 -> 1: both leave gracefully.
    let (status, text) = other.terminate_with_log();
    assert!(status.success(), "{status:?}\n{text}");
    logs.push(text);
    wait_covered(&[&first, &joined], n);
    let (status, text) = joined.terminate_with_log();
    assert!(status.success(), "{status:?}\n{text}");
    logs.push(text);
    wait_covered(&[&first], n);
    // Killed again, alone.
    logs.push(first.log());
    first.kill();
    first = with(fixed);
    wait_covered(&[&first], n);
    calm.store(true, std::sync::atomic::Ordering::SeqCst);
    r.off_fault("fanout.hold");
    log.extend(producer.join().expect("the producer"));
    // Nothing stalled: the last member alone applies everything.
    wait_applied_by(cfg, group, log.len(), &[&first]);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (back, samples) = monitor.join().unwrap();
    logs.push(first.log());
    let stopped_in_lanes = logs.iter().map(|l| l.matches("stopping between the pages of fan-outs in key lanes").count()).sum::<usize>();
    eprintln!("lanes storm: {} commands, 1 -> 3 -> 1 members and 2 SIGKILLs; {stopped_in_lanes} partitions stopped with fan-outs unfinished in lanes (in the logs of members that stopped); {samples} samples of the committed offsets", log.len());
    assert!(back.is_empty(), "committed offsets went back (partition, from, to): {back:?}");
    assert!(samples > 10, "the committed offsets were sampled {samples} times");
    assert!(stopped_in_lanes >= 2, "{stopped_in_lanes} partitions were revoked while a fan-out ran in a lane: the held one alone is revoked at the joins and at each leave");
    drop(first);
    assert_eq!(r.dlq_count()["total"], 0, "dead letters in a workload without an invalid command");
    assert_matches_model(&r.index, &log);
    assert_verify_clean(&r.cfg, &r.group, &r.index);
}

#[test]
fn a_rebalance_storm_while_fan_outs_run_in_lanes_stalls_no_partition_and_resets_no_offset() {
    storm(Rig::new(6), 1500);
}

#[test]
fn a_rebalance_storm_while_fan_outs_run_in_lanes_stalls_no_partition_and_resets_no_offset_on_elasticsearch() {
    storm(Rig::elastic(6), 500);
}
