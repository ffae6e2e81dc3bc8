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
    let start = |extra: &[&str]| Worker::start(&cfg, &group, &index, extra);
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
    let nudges = applied_with_nudges(&cfg, &group, n, || start(args));
    eprintln!(
        "chaos: {n} commands, {kills} SIGKILLs, {joins} joins, {leaves} graceful leaves over {:.1}s; all applied after {:.1}s ({} fresh joins to get past tansu's orphaned partitions)",
        chaos.as_secs_f64(),
        t.elapsed().as_secs_f64(),
        nudges.len()
    );
    assert!(kills >= KILLS);
    assert_matches_model(&index, &log);
    drop(main);
    drop(second);
}
