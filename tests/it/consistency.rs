//! Model-based randomized consistency, one test per seed: three producers at
//! once send random commands over eight top-level trees and twelve users
//! (nested renames, moves between trees, whole trees renamed, upserts that
//! move files within their tree, deletes, user renames, posts and their
//! deletes) while the worker is SIGKILLed and
//! restarted throughout, and a second worker joins and leaves. At the end the
//! index equals the reference model applied in the order the log serialized
//! the commands, and a replay of the whole topic into a fresh index, by a new
//! group, gives identical documents (positions included).
//!
//! Twenty seeds are fixed, one test each, so that a failure is reproducible
//! from the test name. The suite runs the first few and every seed that ever
//! failed; the others are ignored by default and run in an extended run:
//! nextest's `--run-ignored all` runs them as tests of their own, or, with
//! it, `DENORM_CONSISTENCY_SEEDS=N` runs N of them one after another in
//! `requested_seeds` (all of them with 16) and `DENORM_CONSISTENCY_SEED=<seed>`
//! any other seed (docs/development.md). Every seed is printed; a seed that ever fails is marked in the list
//! below with a line on why, and runs in every suite from then on.
//!
//! Renames across top-level directories (whole trees renamed, subtrees and
//! single files moved between trees, in every direction at once) go through
//! the move protocol (docs/cross-key.md); the model splits each into the
//! files leaving the source and arriving at the destination, where the
//! topic's logs put them. Owner changes are generated in their explicit
//! forms: a file upserted under another tree with its `previous_path`, a
//! post given to another user with its `previous_user_id` (each sent as its
//! delete under the old key, then a take-over upsert); the model applies
//! such an upsert after that delete.


use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use denorm::command::{path, Command};
use denorm::index::{Doc, Kind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TREES: usize = 6;
/// Trees no producer writes to directly: moves may end there.
const SPARE_TREES: usize = 2;
const USERS: usize = 12;
const PRODUCERS: u64 = 3;
const COMMANDS_PER_PRODUCER: usize = 400;
const KILLS: usize = 4;


fn dir(rng: &mut StdRng, tree: usize, depth: usize) -> String {
    const NAMES: [&str; 4] = ["a", "b", "c", "d"];
    let mut p = format!("/t{tree}");
    for _ in 0..depth {
        p.push('/');
        p.push_str(NAMES[rng.random_range(0..NAMES.len())]);
    }
    p
}

/// One producer's commands. Producer `p` owns trees `t` with
/// `t % PRODUCERS == p` and users likewise: only it writes files, renames
/// and moves out of them, so it knows where each file it created is. It
/// moves subtrees, single files and whole trees to any tree (its own,
/// another producer's, a spare one), concurrently with the others' moves;
/// a file it moved out of its trees it never names again. It gives files
/// and posts to other owners in the explicit forms (`previous_path`,
/// `previous_user_id`); a post given to another producer's user it never
/// names again either.
fn commands(seed: u64, producer: u64) -> Vec<Command> {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(producer));
    let own: Vec<usize> = (0..TREES).filter(|t| *t as u64 % PRODUCERS == producer).collect();
    let users: Vec<usize> = (0..USERS).filter(|u| *u as u64 % PRODUCERS == producer).collect();
    // Files this producer created and still owns: id -> full path.
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    let mut next_id = 0;
    // Posts this producer named: id -> the user (index) it belongs to now.
    // Moved to another producer's user: gone from here.
    let mut posts: BTreeMap<String, usize> = BTreeMap::new();
    let mut gone_posts = std::collections::BTreeSet::new();
    let mut out = Vec::with_capacity(COMMANDS_PER_PRODUCER);
    while out.len() < COMMANDS_PER_PRODUCER {
        let t = own[rng.random_range(0..own.len())];
        let u = users[rng.random_range(0..users.len())];
        let other = rng.random_range(0..TREES + SPARE_TREES);
        let mine: Vec<(String, String)> = files.iter().filter(|(_, p)| path::top_level(p) == format!("/t{t}")).map(|(i, p)| (i.clone(), p.clone())).collect();
        let post_id = format!("u{u}-p{}", rng.random_range(0..15));
        if gone_posts.contains(&post_id) {
            continue;
        }
        let post_user = posts.get(&post_id).copied().unwrap_or(u);
        let c = match rng.random_range(0..104) {
            0..=34 => {
                let d = rng.random_range(1..=3);
                let id = match mine.is_empty() || rng.random_bool(0.4) {
                    true => {
                        next_id += 1;
                        format!("p{producer}-f{next_id}")
                    }
                    false => mine[rng.random_range(0..mine.len())].0.clone(),
                };
                // Up to a few hundred bytes: with the workers' small message
                // limit, a move of more than a few files takes several.
                let contents = format!("p{producer} #{} {}", out.len(), "x".repeat(rng.random_range(0..400)));
                Command::UpsertFile { path: format!("{}/{id}.txt", dir(&mut rng, t, d)), id, contents, previous_path: None }
            }
            35..=41 if !mine.is_empty() => {
                let (id, path) = mine[rng.random_range(0..mine.len())].clone();
                Command::DeleteFile { id, path }
            }
            42..=53 => {
                let (from_depth, to_depth) = (rng.random_range(1..=2), rng.random_range(1..=2));
                Command::RenamePath { from: dir(&mut rng, t, from_depth), to: dir(&mut rng, t, to_depth) }
            }
            // A subtree moved to another tree.
            54..=61 => {
                let (from_depth, to_depth) = (rng.random_range(1..=2), rng.random_range(1..=2));
                Command::RenamePath { from: dir(&mut rng, t, from_depth), to: dir(&mut rng, other, to_depth) }
            }
            // One file moved to another tree.
            62..=64 if !mine.is_empty() => {
                let (_, from) = mine[rng.random_range(0..mine.len())].clone();
                let to = format!("{}/{}", dir(&mut rng, other, 1), path::split(&from).1);
                Command::RenamePath { from, to }
            }
            // A whole tree renamed.
            65..=66 => Command::RenamePath { from: format!("/t{t}"), to: format!("/t{other}") },
            67..=74 => {
                let name = format!("User {u} v{}", rng.random_range(0..1000));
                Command::UpsertUser { id: format!("u{u}"), name, email: format!("u{u}@example.org"), dob: "1980-01-01".into() }
            }
            75..=92 => Command::UpsertPost {
                user_id: format!("u{post_user}"),
                title: format!("post {post_id}"),
                body: format!("by p{producer} #{}", out.len()),
                id: post_id,
                previous_user_id: None,
            },
            93..=99 => Command::DeletePost { id: post_id, user_id: format!("u{post_user}") },
            // A post given to another user, any producer's.
            100..=101 => {
                let to = rng.random_range(0..USERS);
                if to == post_user {
                    continue;
                }
                Command::UpsertPost {
                    user_id: format!("u{to}"),
                    title: format!("post {post_id}"),
                    body: format!("moved by p{producer} #{}", out.len()),
                    id: post_id,
                    previous_user_id: Some(format!("u{post_user}")),
                }
            }
            // A file upserted under another tree: its owner changes.
            102..=103 if !mine.is_empty() => {
                let (id, from) = mine[rng.random_range(0..mine.len())].clone();
                let depth = rng.random_range(1..=2);
                let to = format!("{}/{}", dir(&mut rng, other, depth), path::split(&from).1);
                Command::UpsertFile { id, path: to, contents: format!("p{producer} #{} moved", out.len()), previous_path: Some(from) }
            }
            _ => continue,
        };
        // Renames into themselves (or of a directory to itself) are invalid.
        if c.validate().is_err() {
            continue;
        }
        match &c {
            // Given to another tree: never named again.
            Command::UpsertFile { id, .. } if c.previous_key().is_some() => {
                files.remove(id);
            }
            Command::UpsertFile { id, path, .. } => {
                files.insert(id.clone(), path.clone());
            }
            Command::DeleteFile { id, .. } => {
                files.remove(id);
            }
            Command::UpsertPost { id, user_id, .. } | Command::DeletePost { id, user_id } => {
                let to: usize = user_id[1..].parse().expect("u<n>");
                if to as u64 % PRODUCERS == producer {
                    posts.insert(id.clone(), to);
                } else {
                    posts.remove(id);
                    gone_posts.insert(id.clone());
                }
            }
            Command::RenamePath { from, to } => {
                let cross = c.destination_key().is_some();
                files.retain(|_, p| match path::renamed(p, from, to) {
                    // Moved out of this producer's trees: never named again.
                    Some(_) if cross => false,
                    Some(new) => {
                        *p = new;
                        true
                    }
                    None => true,
                });
            }
            _ => {}
        }
        out.push(c);
    }
    out
}

/// Every document by (kind, id), positions included.
fn by_id(docs: Vec<Doc>) -> BTreeMap<(Kind, String), Doc> {
    let mut out = BTreeMap::new();
    for d in docs {
        let k = (d.kind(), d.id().to_string());
        assert!(out.insert(k.clone(), d).is_none(), "{k:?} is in the index twice");
    }
    out
}

fn run(seed: u64) {
    eprintln!("consistency seed: {seed} (again with DENORM_CONSISTENCY_SEED={seed})");
    let r = Rig::new(6);
    // Static membership: a restarted worker takes its partitions back at
    // once instead of waiting out its predecessor's session.
    // Small messages, so that many moves take several (the destination
    // holds its other messages back meanwhile).
    let args: &[&str] = &[
        "--instance-id",
        "w0",
        "--session-timeout-ms",
        "60000",
        "--shutdown-timeout-secs",
        "5",
        "--max-message-bytes",
        "2048",
    ];
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5EED);
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (cfg, group) = (r.cfg.clone(), r.group.clone());
            let all = commands(seed, p);
            std::thread::spawn(move || {
                let mut pace = StdRng::seed_from_u64(seed ^ p);
                rt().block_on(async {
                    let producer = denorm::produce::Producer::new(&cfg).unwrap();
                    let mut log = Vec::new();
                    // In small batches, so that the producers interleave with
                    // each other and with the kills.
                    for batch in all.chunks(25) {
                        // A cross-key rename, or a post's delete before its
                        // owner changes, is acknowledged once applied at its
                        // source: what follows it is sent after that.
                        let batch = denorm::command::expand_owner_changes(batch.to_vec());
                        let (d, _) = producer.send_ordered(&cfg, &group, batch.clone(), 1000, Duration::from_secs(180), |_| {}).await.unwrap();
                        assert_eq!(d.len(), batch.len());
                        log.extend(d.into_iter().zip(batch));
                        tokio::time::sleep(Duration::from_millis(pace.random_range(0..60))).await;
                    }
                    log
                })
            })
        })
        .collect();
    let mut worker = r.worker(args);
    // A second, dynamic member joins after the first kill and leaves
    // gracefully before the last: a rebalance each way.
    let mut second: Option<Worker> = None;
    let mut kills = 0;
    while kills < KILLS {
        // Each worker gets its partitions before it is killed at a random
        // moment of its work.
        assert!(worker.wait_for_log("partitions assigned", Duration::from_secs(60)), "no assignment:\n{}", worker.log());
        std::thread::sleep(Duration::from_millis(rng.random_range(50..1000)));
        worker.kill();
        kills += 1;
        worker = r.worker(args);
        if kills == 1 {
            second = Some(r.worker(&["--shutdown-timeout-secs", "5", "--max-message-bytes", "2048"]));
        }
        if kills == KILLS - 1 {
            let w = second.take().expect("the second worker");
            assert!(w.wait_for_log("partitions assigned", Duration::from_secs(60)), "the second worker never joined:\n{}", w.log());
            let (status, log) = w.terminate_with_log();
            assert!(status.success(), "{status:?}\n{log}");
        }
    }
    let mut log = Vec::new();
    for p in producers {
        match p.join() {
            Ok(sent) => log.extend(sent),
            // A barrier that timed out: what the worker was doing is the
            // clue (earlier, killed workers' logs are gone).
            Err(_) => panic!("a producer failed (its error is above); the current worker's log:\n{}", worker.log()),
        }
    }
    assert!(log.iter().any(|(_, c)| matches!(c, Command::RenamePath { .. })), "the workload renames nothing");
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&worker]);
    drop(worker);
    let renames = log.iter().filter(|(_, c)| matches!(c, Command::RenamePath { .. })).count();
    let cross = log.iter().filter(|(_, c)| c.destination_key().is_some()).count();
    let owner_changes = |file: bool| log.iter().filter(|(_, c)| c.previous_key().is_some() && matches!(c, Command::UpsertFile { .. }) == file).count();
    let (file_owners, post_owners) = (owner_changes(true), owner_changes(false));
    let (moves, chunked) = assert_matches_topic_model(&r.cfg, &r.index);
    eprintln!(
        "seed {seed}: {} commands from {PRODUCERS} producers ({renames} renames, {cross} of them across trees, {moves} of which moved files, {chunked} in several messages; {file_owners} files and {post_owners} posts changed owner), {kills} kills, a second worker joined and left",
        log.len()
    );
    assert!(moves > 0, "no cross-key rename moved anything");
    assert!(file_owners > 0 && post_owners > 0, "no owner change of a file or of a post");

    // The topic again, from the start, into an empty index.
    let fresh = r.dir().join("replay");
    let group = unique("replay");
    let replay_started = std::time::Instant::now();
    let w = Worker::start(&r.cfg, &group, &fresh, &[]);
    wait_applied_by(&r.cfg, &group, log.len(), &[&w]);
    let replay_secs = replay_started.elapsed().as_secs_f64();
    // Partitions run at their own pace here: a take-over reached before
    // the partition its documents leave passed their departure waited.
    let waited = w.metric("denorm_takeover_waits_total", &[]);
    eprintln!("seed {seed}: replayed in {replay_secs:.1}s; its take-overs waited for the partition they leave {waited} times");
    // The replay's sources wrote their moves again; the destinations ignore
    // the resends, so applying those changes nothing either.
    drop(w);
    let (live, replayed) = (by_id(dump(&r.index)), by_id(dump(&fresh)));
    assert_eq!(live.len(), replayed.len(), "the replay has another number of documents");
    for (k, d) in &live {
        assert_eq!(Some(d), replayed.get(k), "{k:?} differs after a replay");
    }
    // The model has documents of every kind, or the check proves little.
    for kind in [Kind::File, Kind::User, Kind::Post] {
        assert!(live.keys().any(|(k, _)| *k == kind), "no {kind:?} document at the end");
    }
}

macro_rules! seed_test {
    (run $name:ident $seed:expr) => {
        #[test]
        fn $name() {
            run($seed);
        }
    };
    (extended $name:ident $seed:expr) => {
        #[test]
        #[ignore = "extended run: DENORM_CONSISTENCY_SEEDS=N, or nextest --run-ignored all (docs/development.md)"]
        fn $name() {
            run($seed);
        }
    };
}

macro_rules! seeds {
    ($($kind:ident $name:ident = $seed:expr;)*) => {
        $(seed_test!($kind $name $seed);)*
        /// Every fixed seed in order, with whether the suite runs it.
        const SEEDS: &[(u64, &str)] = &[$(($seed, stringify!($kind))),*];
    };
}

// Fixed, so that a failure is reproducible from the test name. The first
// three run in every suite, and so does every seed that ever failed; the
// others are an extended run's.
seeds! {
    run seed_01 = 0x9E37_79B9;
    run seed_02 = 0x85EB_CA6B;
    run seed_03 = 0xC2B2_AE35;
    extended seed_04 = 0x27D4_EB2F;
    extended seed_05 = 0x1656_67B1;
    extended seed_06 = 0xD3A2_646C;
    extended seed_07 = 0xFD70_46C5;
    extended seed_08 = 0xB55A_4F09;
    extended seed_09 = 0x6A09_E667;
    extended seed_10 = 0xBB67_AE85;
    extended seed_11 = 0x3C6E_F372;
    extended seed_12 = 0xA54F_F53A;
    extended seed_13 = 0x510E_527F;
    // Failed once (cb1b60e): a kill cut an embedded commit short, and the
    // redo hit FileAlreadyExists on a segment's .del file at every retry,
    // stalling a partition.
    run seed_14 = 0x9B05_688C;
    extended seed_15 = 0x1F83_D9AB;
    extended seed_16 = 0x5BE0_CD19;
    extended seed_17 = 0xCBBB_9D5D;
    extended seed_18 = 0x629A_292A;
    extended seed_19 = 0x9159_015A;
    extended seed_20 = 0x152F_ECD8;
}

/// `DENORM_CONSISTENCY_SEEDS=N` runs the first N fixed seeds the suite does
/// not run by default, here, one after another;
/// `DENORM_CONSISTENCY_SEED=<seed>` runs one more seed. Part of the
/// extended run: with neither variable it would check nothing.
#[test]
#[ignore = "extended run: DENORM_CONSISTENCY_SEEDS=N or DENORM_CONSISTENCY_SEED=<seed>, with nextest --run-ignored all (docs/development.md)"]
fn requested_seeds() {
    let count = std::env::var("DENORM_CONSISTENCY_SEEDS").ok().map(|s| s.parse::<usize>().expect("DENORM_CONSISTENCY_SEEDS is a number of seeds"));
    let extra = std::env::var("DENORM_CONSISTENCY_SEED").ok().map(|s| s.parse::<u64>().expect("DENORM_CONSISTENCY_SEED is a number"));
    let more = SEEDS.iter().filter(|(_, kind)| *kind == "extended").map(|(s, _)| *s).take(count.unwrap_or(0));
    let seeds: Vec<u64> = more.chain(extra).collect();
    assert!(!seeds.is_empty(), "no seed requested: set DENORM_CONSISTENCY_SEEDS or DENORM_CONSISTENCY_SEED");
    for s in &seeds {
        run(*s);
    }
    eprintln!("{} requested seed(s) run beside the suite's {}", seeds.len(), SEEDS.iter().filter(|(_, kind)| *kind == "run").count());
}

#[test]
fn the_generator_changes_owners_only_in_the_explicit_form() {
    let (mut cross, mut owner_changes) = (0, 0);
    for p in 0..PRODUCERS {
        // Played alone, a producer's commands: each document it names is
        // under the key it names it with (or not there at all), except in
        // an owner change, which names where the document is now.
        let mut m = denorm::model::Model::default();
        let mut post_users: BTreeMap<String, String> = BTreeMap::new();
        for c in commands(7, p) {
            match &c {
                Command::UpsertFile { id, previous_path: Some(previous), .. } if c.previous_key().is_some() => {
                    assert_eq!(m.file_path(id), Some(previous.as_str()), "{c:?} names another previous path");
                    owner_changes += 1;
                }
                Command::UpsertFile { id, path, .. } | Command::DeleteFile { id, path } => {
                    if let Some(at) = m.file_path(id) {
                        assert_eq!(path::top_level(at), path::top_level(path), "{c:?} changes the owner of {id}");
                    }
                }
                Command::UpsertPost { id, previous_user_id: Some(previous), .. } if c.previous_key().is_some() => {
                    assert_eq!(post_users.get(id).map_or_else(|| id.split('-').next().unwrap(), String::as_str), previous, "{c:?}");
                    owner_changes += 1;
                }
                Command::UpsertPost { id, user_id, .. } | Command::DeletePost { id, user_id } => {
                    assert_eq!(post_users.get(id).map_or_else(|| id.split('-').next().unwrap(), String::as_str), user_id, "{c:?} changes the owner of {id}");
                }
                Command::RenamePath { .. } => cross += usize::from(c.destination_key().is_some()),
                Command::UpsertUser { .. } => {}
            }
            if let Command::UpsertPost { id, user_id, .. } = &c {
                post_users.insert(id.clone(), user_id.clone());
            }
            m.apply(&c);
        }
    }
    assert!(cross >= 30, "only {cross} cross-key renames");
    assert!(owner_changes >= 20, "only {owner_changes} owner changes");
}
