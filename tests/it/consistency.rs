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
//!
//! Three tenants (issue 47): producer 0 writes the default tenant's
//! commands, producers 1 and 2 those of tenants `acme` and `globex`, each
//! its trees and users renamed so that all three tenants have the same
//! paths and user ids (`/t0`, `u3`, ...), renamed, moved and written at
//! once. The model keeps them apart as the index must.
//!
//! An operator takes part too (issue 29): a poison message parks one
//! producer's tree, whose later commands wait as letters, and the index
//! refuses a command that lands between the chunks of a move (its source
//! paused after the first). At the end the operator fixes the index, drops
//! the poison and reprocesses both keys; the model applies each released
//! command at its `REPLAY`. Then `denorm rebuild` replays the topic into
//! the next generation: the topic itself, positions and all; or, in half
//! the seeds (both kinds among the suite's), a copy `denorm migrate` made
//! with twice the partitions, which must give the same documents.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use denorm::codec::Decoded;
use denorm::command::{path, Command, LogPosition};
use denorm::index::{Doc, Kind};
use denorm::kafka::KafkaConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TREES: usize = 6;
/// Trees no producer writes to directly: moves may end there.
const SPARE_TREES: usize = 2;
const USERS: usize = 12;
const PRODUCERS: u64 = 3;
const COMMANDS_PER_PRODUCER: usize = 400;
const KILLS: usize = 4;
/// The document id the index refuses until the operator fixes it.
const REFUSED: &str = "op-refused";

/// The tree the poison parks: one of a producer's.
fn poisoned_tree(seed: u64) -> usize {
    (seed % TREES as u64) as usize
}

/// The tenant of producer `p`'s commands.
fn tenant(p: u64) -> Option<&'static str> {
    [None, Some("acme"), Some("globex")][p as usize]
}

/// The name producer `p` gives tree `t` (`/t{n}`) or user `u` (`u{n}`)
/// in its tenant: shifted by `p`, so that every tenant's own trees and
/// users have the same names (a bijection of the names: the producer's
/// bookkeeping holds as it was).
fn relabel(p: u64, n: usize, of: usize) -> usize {
    (n + of - p as usize) % of
}

/// Producer `p`'s command in its tenant: its trees and users renamed
/// ([`relabel`]), scoped to the tenant.
fn in_tenant(p: u64, c: Command) -> Command {
    let tree = |path: String| {
        let rest = &path[2..];
        let end = rest.find('/').unwrap_or(rest.len());
        let n: usize = rest[..end].parse().expect("/t<n>");
        format!("/t{}{}", relabel(p, n, TREES + SPARE_TREES), &rest[end..])
    };
    let user = |id: String| {
        let (n, rest) = id[1..].split_once('-').map_or((&id[1..], ""), |(n, r)| (n, r));
        let n: usize = n.parse().expect("u<n>");
        let sep = if rest.is_empty() { "" } else { "-" };
        format!("u{}{sep}{rest}", relabel(p, n, USERS))
    };
    let c = match c {
        Command::UpsertFile { id, path, contents, previous_path } => Command::UpsertFile { id, path: tree(path), contents, previous_path: previous_path.map(tree) },
        Command::DeleteFile { id, path } => Command::DeleteFile { id, path: tree(path) },
        Command::RenamePath { from, to } => Command::RenamePath { from: tree(from), to: tree(to) },
        Command::UpsertUser { id, name, email, dob } => Command::UpsertUser { id: user(id), name, email, dob },
        Command::UpsertPost { id, user_id, title, body, previous_user_id } => Command::UpsertPost { id: user(id), user_id: user(user_id), title, body, previous_user_id: previous_user_id.map(user) },
        Command::DeletePost { id, user_id } => Command::DeletePost { id: user(id), user_id: user(user_id) },
        Command::DeleteUser { id } => Command::DeleteUser { id: user(id) },
        Command::Model(_) => unreachable!("the generator writes compiled-in commands"),
    };
    c.scoped(tenant(p))
}

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
/// names again either. It gives no file of the poisoned tree to another
/// tree: the delete half would wait parked while the upsert took the file
/// over, and the embedded index would hold it under both keys until the
/// release (docs/cross-key.md, "Parked keys"), which the model does not
/// follow.
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
        let c = match rng.random_range(0..106) {
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
            75..=92 => Command::UpsertPost { user_id: format!("u{post_user}"), title: format!("post {post_id}"), body: format!("by p{producer} #{}", out.len()), id: post_id, previous_user_id: None },
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
            102..=103 if !mine.is_empty() && t != poisoned_tree(seed) => {
                let (id, from) = mine[rng.random_range(0..mine.len())].clone();
                let depth = rng.random_range(1..=2);
                let to = format!("{}/{}", dir(&mut rng, other, depth), path::split(&from).1);
                Command::UpsertFile { id, path: to, contents: format!("p{producer} #{} moved", out.len()), previous_path: Some(from) }
            }
            // A profile deleted (its posts stay; a later profile change
            // creates it again).
            104..=105 => Command::DeleteUser { id: format!("u{u}") },
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
    run_on(seed, false)
}

/// One seed, on Elasticsearch (`elastic`) or the embedded index.
fn run_on(seed: u64, elastic: bool) {
    let on = if elastic { " on Elasticsearch" } else { "" };
    let again = if elastic { "DENORM_CONSISTENCY_ELASTIC=1 " } else { "" };
    eprintln!("consistency seed: {seed}{on} (again with {again}DENORM_CONSISTENCY_SEED={seed})");
    let started = std::time::Instant::now();
    let r = if elastic { Rig::elastic(6) } else { Rig::new(6) };
    // Static membership: a restarted worker takes its partitions back at
    // once instead of waiting out its predecessor's session.
    // Small messages, so that many moves take several (the destination
    // holds its other messages back meanwhile).
    let args: &[&str] = &["--instance-id", "w0", "--session-timeout-ms", "60000", "--shutdown-timeout-secs", "5", "--max-message-bytes", "2048"];
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5EED);
    r.on_fault("index.reject-commit", REFUSED);
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (cfg, group) = (r.cfg.clone(), r.group.clone());
            let all: Vec<Command> = commands(seed, p).into_iter().map(|c| in_tenant(p, c)).collect();
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
    let operator = {
        let (cfg, faults) = (r.cfg.clone(), r.dir().join("faults"));
        std::thread::spawn(move || operate(&cfg, &faults, seed))
    };
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
    let operator = operator.join().unwrap_or_else(|_| panic!("the operator failed (its error is above); the current worker's log:\n{}", worker.log()));
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
    // The fix, then the release of both keys.
    r.off_fault("index.reject-commit");
    let produced = started.elapsed().as_secs_f64();
    let (parked, replayed) = release(&r, &operator);
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&worker]);
    if r.dlq_count()["total"] != 0 {
        let (_, open, _) = r.run(&["dlq", "list", "--json"]);
        panic!("letters open after the release:\n{open}\nthe current worker's log:\n{}", worker.log());
    }
    drop(worker);
    let logs = read_decodable(&r.cfg);
    operator.refused_inside_its_move(&logs);
    let renames = log.iter().filter(|(_, c)| matches!(c, Command::RenamePath { .. })).count();
    let cross = log.iter().filter(|(_, c)| c.destination_key().is_some()).count();
    let owner_changes = |file: bool| log.iter().filter(|(_, c)| c.previous_key().is_some() && matches!(c, Command::UpsertFile { .. }) == file).count();
    let (file_owners, post_owners) = (owner_changes(true), owner_changes(false));
    let (moves, chunked) = assert_matches_model_of_logs(&logs, &r.index);
    assert_verify_clean(&r.cfg, &r.group, &r.index);
    eprintln!(
        "seed {seed}{on}: {} commands from {PRODUCERS} producers ({renames} renames, {cross} of them across trees, {moves} of which moved files, {chunked} in several messages; {file_owners} files and {post_owners} posts changed owner), {kills} kills, a second worker joined and left; a poison parked {parked} commands until released, a refusal inside a move; produced in {produced:.1}s, released and checked by {:.1}s",
        log.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(moves > 0, "no cross-key rename moved anything");
    assert!(file_owners > 0 && post_owners > 0, "no owner change of a file or of a post");

    // The topic again, from the start (the poison and the operator's
    // requests included), into the next generation: from the topic itself,
    // or, in half the seeds, from a copy made by `denorm migrate`.
    let live = by_id(dump(&r.index));
    let started = std::time::Instant::now();
    match migrates(seed) {
        false => rebuild_in_place(&r, &live),
        true => migrate_and_rebuild(&r, seed, &live, replayed),
    }
    eprintln!("seed {seed}{on}: rebuilt{} in {:.1}s", if migrates(seed) { " from a migrated copy" } else { "" }, started.elapsed().as_secs_f64());
    // The model has documents of every kind, or the check proves little.
    for kind in [Kind::File, Kind::User, Kind::Post] {
        assert!(live.keys().any(|(k, _)| *k == kind), "no {kind:?} document at the end");
    }
}

/// Whether the seed rebuilds from a copy made by `denorm migrate` (half of
/// them) rather than from the topic itself.
fn migrates(seed: u64) -> bool {
    seed & 4 != 0
}

/// `denorm rebuild` from the live topic: every document as it was,
/// positions included, and the letters the rebuild writes again stay
/// closed by the live run's markers.
fn rebuild_in_place(r: &Rig, live: &BTreeMap<(Kind, String), Doc>) {
    let (code, out, err) = r.run(&["rebuild", "--metrics-addr", "127.0.0.1:0"]);
    assert_eq!(code, 0, "{out}{err}");
    let rebuilt = by_id(dump(&r.index));
    assert_eq!(live.len(), rebuilt.len(), "the rebuild has another number of documents");
    for (k, d) in live {
        assert_eq!(Some(d), rebuilt.get(k), "{k:?} differs after a rebuild");
    }
    assert_eq!(r.dlq_count()["total"], 0, "the rebuild's letters are closed by the live run's markers");
}

/// `denorm migrate` to twice the partitions (a multiple: each new partition
/// takes from one old one, which keeps the moves in the order their
/// destinations need), then `denorm rebuild` from the copy: the same
/// documents (at the new topic's positions), and the model of the copy
/// agrees; the rebuild parks and releases keys as the live run did, so
/// no letter of the new dead-letter topic stays open.
fn migrate_and_rebuild(r: &Rig, seed: u64, live: &BTreeMap<(Kind, String), Doc>, replayed: usize) {
    let new = KafkaConfig { topic: unique("denorm-test-migrated"), partitions: 12, ..r.cfg.clone() };
    let (code, out, err) = r.run(&["migrate", "--to-topic", &new.topic, "--to-partitions", "12"]);
    assert_eq!(code, 0, "{out}{err}");
    eprintln!("seed {seed}: {}", out.trim());
    // Each letter replayed, and a RESOLVE for each key.
    assert!(out.contains(&format!(" {} operator request(s)", replayed + 2)), "{out}");
    assert!(!out.contains("left out"), "a move of the log was left out: {out}");
    let (code, out, err) = output(cli(&new, &r.group, &r.index).args(["rebuild", "--metrics-addr", "127.0.0.1:0"]));
    assert_eq!(code, 0, "{out}{err}");
    let (m, _, _) = model_of_topic(&new);
    let diffs = denorm::model::diff(live.values().cloned().collect(), m.docs(), 20);
    assert!(diffs.is_empty(), "the model of the migrated topic differs from the live index:\n{}", diffs.join("\n"));
    let (code, letters, err) = output(cli(&new, &r.group, &r.index).args(["dlq", "count", "--json"]));
    assert_eq!(code, 0, "{err}");
    let diffs = denorm::model::diff(live.values().cloned().collect(), dump(&r.index), 20);
    assert!(diffs.is_empty(), "the rebuild from the migrated topic differs from the live index (open letters: {letters}):\n{}", diffs.join("\n"));
    assert_eq!(serde_json::from_str::<serde_json::Value>(&letters).unwrap()["total"], 0, "letters open after the rebuild from the migrated topic: {letters}");
}

/// What the operator did during the run.
struct Operated {
    poisoned: String,
    poison: LogPosition,
    /// The move the refused command landed in, and that command.
    moved: (String, String),
    refused: LogPosition,
}

impl Operated {
    /// Asserts that the refused command lies between the chunks of its
    /// move in the destination's log: after one that is not the last,
    /// before the last.
    fn refused_inside_its_move(&self, logs: &[Vec<(i64, Decoded)>]) {
        let chunks: Vec<(i64, bool)> = logs[self.refused.partition as usize]
            .iter()
            .filter_map(|(o, m)| match m {
                Decoded::Move(mv) if (mv.from.as_str(), mv.to.as_str()) == (self.moved.0.as_str(), self.moved.1.as_str()) => Some((*o, mv.last)),
                _ => None,
            })
            .collect();
        let at = self.refused.offset;
        assert!(chunks.iter().any(|(o, last)| !last && *o < at) && chunks.iter().any(|(o, last)| *last && *o > at), "the refused command (offset {at}) is not inside its move's chunks {chunks:?}");
    }
}

/// Sends a message that does not decode, keyed `key`, to the key's
/// partition.
fn send_poison(cfg: &KafkaConfig, key: &str) -> LogPosition {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let partition = denorm::command::partitioner::partition_of(key, cfg.partitions);
    rt().block_on(async {
        let p: FutureProducer = cfg.client_config().create().unwrap();
        let payload = b"a poison: not an avro message".to_vec();
        let d = p.send(FutureRecord::to(&cfg.topic).key(key).payload(&payload).partition(partition), Duration::from_secs(30)).await.unwrap();
        LogPosition { partition: d.partition, offset: d.offset }
    })
}

/// The operator's part during the run, beside the producers and the
/// kills: a poison parks a producer's tree; then a spare tree's directory
/// is moved to the other spare tree in several messages, its source paused
/// after the first, and a command the index refuses (`REFUSED`) is sent
/// to the destination meanwhile, so that it lands between the chunks.
fn operate(cfg: &KafkaConfig, faults: &std::path::Path, seed: u64) -> Operated {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0BE7);
    // The tree's key in its producer's tenant.
    let t = poisoned_tree(seed);
    let poisoned = in_tenant(t as u64 % PRODUCERS, Command::DeleteFile { id: s("x"), path: format!("/t{t}/x") }).key().to_string();
    std::thread::sleep(Duration::from_millis(rng.random_range(200..1500)));
    let poison = send_poison(cfg, &poisoned);
    std::thread::sleep(Duration::from_millis(rng.random_range(200..1500)));
    let (from, to) = (format!("/t{TREES}/op"), format!("/t{}/op", TREES + 1));
    // 12 files of 300 bytes: about 6 messages at the workers' limit.
    let files = (0..12).map(|i| Command::UpsertFile { id: format!("op-f{i}"), path: format!("{from}/f{i}.txt"), contents: "o".repeat(300), previous_path: None });
    produce(cfg, files.collect());
    // Fault points are files (Rig::on_fault).
    let pause = faults.join("move.pause-between-chunks");
    std::fs::write(&pause, "").unwrap();
    produce(cfg, vec![Command::RenamePath { from: from.clone(), to: to.clone() }]);
    let paused = faults.join("move.pause-between-chunks.reached");
    let moving = format!("{from} -> {to}");
    eventually(Duration::from_secs(120), || format!("the move {moving} never paused after a chunk"), || std::fs::read_to_string(&paused).ok().filter(|s| s.lines().any(|l| l == moving)));
    let x = Command::UpsertFile { id: REFUSED.into(), path: format!("/t{}/kept/refused.txt", TREES + 1), contents: s("refused until the fix"), previous_path: None };
    let refused = produce(cfg, vec![x]).remove(0).0;
    std::fs::remove_file(&pause).unwrap();
    Operated { poisoned, poison, moved: (from, to), refused }
}

/// The operator's release once the index is fixed: the poison dropped
/// alone, then both keys reprocessed (every letter replayed in order, the
/// keys resumed). Returns how many commands waited behind the poison, and
/// how many letters were replayed in all.
fn release(r: &Rig, o: &Operated) -> (usize, usize) {
    let list = |key: &str| {
        let (code, out, err) = r.run(&["dlq", "list", "--key", key, "--json"]);
        assert_eq!(code, 0, "{err}");
        json_lines(&out)
    };
    let origin = |e: &serde_json::Value, at: LogPosition| e["origin_partition"] == at.partition && e["origin_offset"] == at.offset;
    let letters = list(&o.poisoned);
    let poison = letters.iter().find(|e| origin(e, o.poison)).unwrap_or_else(|| panic!("the poison is not listed: {letters:?}"));
    assert_eq!(poison["reason"], "not_single_object", "{poison}");
    let parked = letters.iter().filter(|e| e["reason"] == "parked").count();
    assert!(parked > 0, "nothing of {} waited behind the poison: {letters:?}", o.poisoned);
    let letter = format!("{}@{}", poison["dlq_partition"], poison["dlq_offset"]);
    let (code, _, err) = r.run(&["dlq", "clear", "--key", &o.poisoned, "--letter", &letter, "--yes"]);
    assert_eq!(code, 0, "{err}");
    let destination = path::top_level(&o.moved.1).to_string();
    let refused = list(&destination);
    assert!(refused.iter().any(|e| origin(e, o.refused) && e["reason"] == "index_rejected"), "the refused command is not dead-lettered: {refused:?}");
    // Behind it, what other producers gave to that tree meanwhile.
    let replayed = parked + refused.len();
    for key in [&o.poisoned, &destination] {
        let (code, out, err) = r.run(&["dlq", "reprocess", "--key", key, "--json"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap()["still_open"], 0, "{key}: {out}\n{err}");
    }
    (parked, replayed)
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
// two run in every suite, and so does every seed that ever failed; the
// others are an extended run's (the third moved there when the suite
// passed its 15 minutes, 2026-11-27).
seeds! {
    run seed_01 = 0x9E37_79B9;
    run seed_02 = 0x85EB_CA6B;
    extended seed_03 = 0xC2B2_AE35;
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

/// The suite's seeds on Elasticsearch (the suite's own Elasticsearch-API
/// server): an extended run's, at about three times an embedded seed's
/// time, which the default suite's budget has no room for. The default
/// suite's randomized test on Elasticsearch is `verify_fooled`'s.
macro_rules! elastic_seeds {
    ($($name:ident = $seed:expr;)*) => {
        $(
            #[test]
            #[ignore = "extended run: scripts/test.sh --extended (docs/development.md)"]
            fn $name() {
                run_on($seed, true);
            }
        )*
    };
}

elastic_seeds! {
    elastic_seed_01 = 0x9E37_79B9;
    elastic_seed_02 = 0x85EB_CA6B;
    elastic_seed_03 = 0xC2B2_AE35;
}

/// `DENORM_CONSISTENCY_SEEDS=N` runs the first N fixed seeds the suite does
/// not run by default, here, one after another;
/// `DENORM_CONSISTENCY_SEED=<seed>` runs one more seed, on Elasticsearch
/// with `DENORM_CONSISTENCY_ELASTIC=1`. Part of the extended run: with
/// neither variable it would check nothing.
#[test]
#[ignore = "extended run: DENORM_CONSISTENCY_SEEDS=N or DENORM_CONSISTENCY_SEED=<seed>, with nextest --run-ignored all (docs/development.md)"]
fn requested_seeds() {
    let count = std::env::var("DENORM_CONSISTENCY_SEEDS").ok().map(|s| s.parse::<usize>().expect("DENORM_CONSISTENCY_SEEDS is a number of seeds"));
    let extra = std::env::var("DENORM_CONSISTENCY_SEED").ok().map(|s| s.parse::<u64>().expect("DENORM_CONSISTENCY_SEED is a number"));
    let more = SEEDS.iter().filter(|(_, kind)| *kind == "extended").map(|(s, _)| *s).take(count.unwrap_or(0));
    let seeds: Vec<u64> = more.chain(extra).collect();
    assert!(!seeds.is_empty(), "no seed requested: set DENORM_CONSISTENCY_SEEDS or DENORM_CONSISTENCY_SEED");
    let elastic = std::env::var("DENORM_CONSISTENCY_ELASTIC").is_ok_and(|v| v == "1");
    for s in &seeds {
        run_on(*s, elastic);
    }
    eprintln!("{} requested seed(s) run beside the suite's {}", seeds.len(), SEEDS.iter().filter(|(_, kind)| *kind == "run").count());
}

#[test]
fn the_suites_seeds_rebuild_both_from_the_topic_and_from_a_migrated_copy() {
    let suite: Vec<u64> = SEEDS.iter().filter(|(_, kind)| *kind == "run").map(|(s, _)| *s).collect();
    assert!(suite.iter().any(|s| migrates(*s)) && suite.iter().any(|s| !migrates(*s)), "{suite:x?}");
}

#[test]
fn every_tenant_has_the_same_trees_and_users() {
    for p in 0..PRODUCERS {
        let c = |n: usize| in_tenant(p, Command::UpsertPost { id: format!("u{n}-p1"), user_id: format!("u{n}"), title: s("t"), body: s("b"), previous_user_id: None });
        let own: Vec<Command> = (0..USERS).filter(|u| *u as u64 % PRODUCERS == p).map(c).collect();
        let want: Vec<Command> =
            [0, 3, 6, 9].map(|u| Command::UpsertPost { id: format!("u{u}-p1"), user_id: format!("u{u}"), title: s("t"), body: s("b"), previous_user_id: None }.scoped(tenant(p))).to_vec();
        assert_eq!(own, want);
        let trees: Vec<String> = (0..TREES).filter(|t| *t as u64 % PRODUCERS == p).map(|t| in_tenant(p, Command::DeleteFile { id: s("x"), path: format!("/t{t}/a/x") }).key().to_string()).collect();
        assert_eq!(trees, ["/t0", "/t3"].map(|t| denorm::command::tenant::scope(tenant(p), t)));
    }
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
                Command::UpsertUser { .. } | Command::DeleteUser { .. } | Command::Model(_) => {}
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
