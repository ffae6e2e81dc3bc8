//! Randomized consistency of a declared model (`models/shop.toml`) through
//! the pipeline, on both backends, one test per seed and backend. Three
//! producers at once, each of its own tenant, write random shop commands
//! (customers upserted, patched and deleted; orders with nested lines and
//! tickets copying their customer; products renamed by prefix; orders and
//! products changing owner) in small batches with `denorm produce --model
//! --jsonl`, while the worker is SIGKILLed and restarted throughout and a
//! second worker joins and leaves. At the end:
//!
//! - the index holds exactly the documents of the model's reference
//!   (`model::generic`), applied in the order the topic serialized the
//!   commands (an owner change's upsert after its delete half);
//! - `denorm verify --model` finds it equal to the log;
//! - a replay of the whole topic by a new group into a fresh index gives
//!   the same documents, positions included;
//! - corruptions planted behind the pipeline's back, chosen by the seed (a
//!   changed field, a copy gone stale, a deleted document and a stray one),
//!   are each named by `verify`, and nothing else; `verify --repair` sends
//!   the command that restores each, and the index is the log's again;
//! - `denorm tenant delete` removes one tenant's documents through the log,
//!   and every other tenant's stay.
//!
//! Seeds: `DENORM_MODEL_CONSISTENCY_SEEDS` (default 1 per backend),
//! starting at `DENORM_MODEL_CONSISTENCY_SEED` (default 1); each seed is
//! printed with the command that runs it again.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use denorm::command::generic::{Object, Value};
use denorm::command::tenant;
use denorm::domain::Domain;
use denorm::index::model_doc::ModelDoc;
use denorm::index::open::{Access, Embedded, Location};
use denorm::index::{Doc, Kind};
use denorm::model::generic::DocKey;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use crate::common::shop::ShopLog;
use crate::common::*;
use crate::model_pipeline::{with_model, MODEL};

const PARTITIONS: i32 = 4;
const PRODUCERS: u64 = 3;
const BATCHES: usize = 3;
const PER_BATCH: usize = 30;
const KILLS: usize = 3;

fn domain() -> &'static Domain {
    Domain::load(std::path::Path::new(MODEL)).unwrap().interned()
}

/// A document as the reference holds it: its fields and copies.
type Held = (Object, BTreeMap<String, Object>);

/// Every model document of `index` (with `env` for the Elasticsearch
/// prefix), by its place.
fn model_docs(index: &std::path::Path, d: &'static Domain, env: impl Fn(&str) -> Option<String>) -> BTreeMap<DocKey, ModelDoc> {
    let rt = rt();
    let search = Location::parse_with(index, env).unwrap().search(rt.handle().clone(), Some(d)).unwrap();
    let mut out = BTreeMap::new();
    search
        .dump(&mut |doc| {
            if let Doc::Model(m) = doc {
                let key = DocKey { tenant: tenant::of(&m.id).map(str::to_string), kind: m.kind.as_str().to_string(), id: tenant::unscoped(&m.id).to_string() };
                assert!(out.insert(key.clone(), *m).is_none(), "{key:?} twice in the index");
            }
        })
        .unwrap();
    out
}

fn held(docs: &BTreeMap<DocKey, ModelDoc>) -> BTreeMap<DocKey, Held> {
    docs.iter().map(|(k, m)| (k.clone(), (m.fields.clone(), m.copies.clone()))).collect()
}

/// The first differences between two sets of documents, each with the
/// messages of the topic that name its document (partition, offset).
fn first_difference(expected: &BTreeMap<DocKey, Held>, got: &BTreeMap<DocKey, Held>, logs: &Logs) -> String {
    let keys: BTreeSet<&DocKey> = expected.keys().chain(got.keys()).collect();
    let diffs: Vec<String> = keys
        .into_iter()
        .filter(|k| expected.get(*k) != got.get(*k))
        .take(5)
        .map(|k| {
            let history: Vec<String> = logs
                .iter()
                .enumerate()
                .flat_map(|(p, log)| log.iter().map(move |(o, m)| (p, o, m)))
                .filter_map(|(p, o, m)| match m {
                    denorm::codec::Decoded::Command(e) => match &e.command {
                        denorm::command::Command::Model(b) if b.tenant == k.tenant && b.command.kind == k.kind && b.command.op.id() == Some(k.id.as_str()) => {
                            Some(format!("  {p}/{o} issued {}: {:?}", e.issued_at, b.command.op))
                        }
                        _ => None,
                    },
                    _ => None,
                })
                .collect();
            format!("{k:?}: expected {:?}, found {:?}; its commands:\n{}", expected.get(k), got.get(k), history.join("\n"))
        })
        .collect();
    format!("{} documents expected, {} found; first differences:\n{}", expected.len(), got.len(), diffs.join("\n"))
}

type Logs = Vec<Vec<(i64, denorm::codec::Decoded)>>;

/// One producer's batches, produced with `denorm produce --model --jsonl`
/// as it writes them; returns how many messages reached the topic (an
/// owner change is two).
fn produce(r: &Rig, d: &'static Domain, seed: u64, p: u64) -> (usize, usize) {
    let tenant = [None, Some("acme"), Some("globex")][p as usize].map(str::to_string);
    let mut log = ShopLog::of_tenants(seed ^ (p << 32), vec![tenant]);
    let mut pace = StdRng::seed_from_u64(seed ^ p);
    let (mut sent, mut owner_changes) = (0, 0);
    for b in 0..BATCHES {
        let batch = log.written(d, PER_BATCH);
        owner_changes += batch.iter().filter(|e| e.command.previous_key(d.kind(&e.command.kind).unwrap()).is_some()).count();
        let file = r.dir().join(format!("producer{p}-{b}.jsonl"));
        std::fs::write(&file, batch.iter().map(|e| denorm::command::generic::jsonl::line(d, e) + "\n").collect::<String>()).unwrap();
        let (code, out, err) = output(with_model(r, &["produce", "--wait", "300", "--jsonl"]).arg(&file));
        assert_eq!(code, 0, "producer {p}, batch {b}: {err}");
        sent += json_lines(&out)[0]["produced"].as_u64().unwrap() as usize;
        std::thread::sleep(Duration::from_millis(pace.random_range(0..100)));
    }
    (sent, owner_changes)
}

fn run_on(seed: u64, elastic: bool) {
    let on = if elastic { " on Elasticsearch" } else { "" };
    eprintln!("model consistency seed: {seed}{on} (again with DENORM_MODEL_CONSISTENCY_SEED={seed})");
    let started = std::time::Instant::now();
    let r = if elastic { Rig::elastic(PARTITIONS) } else { Rig::new(PARTITIONS) };
    let d = domain();
    let args: &[&str] = &["--model", MODEL, "--instance-id", "w0", "--session-timeout-ms", "60000", "--shutdown-timeout-secs", "5"];
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5EED);
    let producers: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                s.spawn({
                    let r = &r;
                    move || produce(r, d, seed, p)
                })
            })
            .collect();
        let mut worker = r.worker(args);
        let mut second: Option<Worker> = None;
        for kill in 0..KILLS {
            assert!(worker.wait_for_log("partitions assigned", Duration::from_secs(60)), "no assignment:\n{}", worker.log());
            // A random moment of its work.
            std::thread::sleep(Duration::from_millis(rng.random_range(50..1500)));
            worker.kill();
            worker = r.worker(args);
            if kill == 0 {
                second = Some(r.worker(&["--model", MODEL, "--shutdown-timeout-secs", "5"]));
            }
            if kill == KILLS - 2 {
                let w = second.take().expect("the second worker");
                assert!(w.wait_for_log("partitions assigned", Duration::from_secs(60)), "the second worker never joined:\n{}", w.log());
                let (status, log) = w.terminate_with_log();
                assert!(status.success(), "{status:?}\n{log}");
            }
        }
        let sent: Vec<(usize, usize)> = handles.into_iter().map(|h| h.join().unwrap_or_else(|_| panic!("a producer failed (its error is above); the worker's log:\n{}", worker.log()))).collect();
        let total = sent.iter().map(|s| s.0).sum();
        wait_applied_by(&r.cfg, &r.group, total, &[&worker]);
        let status = worker.terminate();
        assert!(status.success(), "{status:?}");
        sent
    });
    let sent: usize = producers.iter().map(|s| s.0).sum();
    let owner_changes: usize = producers.iter().map(|s| s.1).sum();
    assert!(owner_changes > 0, "no owner change in the workload");

    // The reference of the topic as it serialized the commands.
    let logs = denorm::kafka::read_topic(&r.cfg, &denorm::codec::Codec::new().with_model(d)).unwrap();
    assert_eq!(logs.iter().map(Vec::len).sum::<usize>(), sent, "every message on the topic decodes with the model");
    let (reference, _) = denorm::model::serialized_with(&logs, Some(d)).unwrap();
    let expected: BTreeMap<DocKey, Held> = reference.generic().unwrap().docs().iter().map(|(k, s)| (k.clone(), (s.fields.clone(), s.copies.clone()))).collect();
    let live = model_docs(&r.index, d, |k| std::env::var(k).ok());
    assert!(expected == held(&live), "the index is not the reference's, seed {seed}{on}: {}", first_difference(&expected, &held(&live), &logs));
    for kind in ["customer", "order", "ticket", "product"] {
        assert!(expected.keys().filter(|k| k.kind == kind).count() >= 2, "few {kind} documents: the log tests little");
    }
    assert!(expected.values().any(|(f, c)| matches!(f.get("lines"), Some(Value::Objects(l)) if !l.is_empty()) && c.values().any(|o| !o.is_empty())), "no order with lines and a copy");
    let (code, out, err) = output(&mut with_model(&r, &["verify", "--json", "--rounds", "1"]));
    assert_eq!(code, 0, "verify: {out}\n{err}");
    eprintln!(
        "seed {seed}{on}: {sent} messages from {PRODUCERS} producers ({owner_changes} owner changes), {KILLS} kills, a second worker joined and left; {} documents, checked in {:.1}s",
        expected.len(),
        started.elapsed().as_secs_f64()
    );

    // The whole topic again, by a new group into a fresh index.
    let (group, index, prefix) = if elastic {
        let p = unique("dt");
        crate::common::elastic::remove_when_done(&p);
        ("replay".to_string() + &r.group, r.index.clone(), Some(p))
    } else {
        ("replay".to_string() + &r.group, r.dir().join("replay-index"), None)
    };
    let env: Vec<(&str, &std::ffi::OsStr)> = prefix.iter().map(|p| (denorm::index::elastic::config::env::PREFIX, std::ffi::OsStr::new(p))).collect();
    let replayer = Worker::start_env(&r.cfg, &group, &index, &["--model", MODEL], &env);
    wait_applied_by(&r.cfg, &group, sent, &[&replayer]);
    assert!(replayer.terminate().success());
    let replayed = model_docs(&index, d, |k| match (k, &prefix) {
        (denorm::index::elastic::config::env::PREFIX, Some(p)) => Some(p.clone()),
        _ => std::env::var(k).ok(),
    });
    let positions = |m: &BTreeMap<DocKey, ModelDoc>| m.iter().map(|(k, d)| (k.clone(), d.pos)).collect::<BTreeMap<_, _>>();
    assert!(held(&replayed) == held(&live), "the replay differs: {}", first_difference(&held(&live), &held(&replayed), &logs));
    assert_eq!(positions(&replayed), positions(&live), "the replay's positions");
    eprintln!("seed {seed}{on}: replayed alike by {:.1}s", started.elapsed().as_secs_f64());

    fooled(&r, d, &live, seed, args, &|what: &str| eprintln!("seed {seed}{on}: {what} by {:.1}s", started.elapsed().as_secs_f64()));
}

/// Corruptions behind the pipeline's back, each named by `verify` and
/// nothing else: a changed field, a stale copy, a deleted document, a
/// stray one.
/// `args` are the live worker's: its static membership takes its partitions
/// back at once (a new member would wait out the stopped one's session).
fn fooled(r: &Rig, d: &'static Domain, live: &BTreeMap<DocKey, ModelDoc>, seed: u64, args: &[&str], progress: &dyn Fn(&str)) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xF001);
    let of =
        |kind: &str, with_copy: bool| -> Vec<&ModelDoc> { live.iter().filter(|(k, m)| k.kind == kind && (!with_copy || m.copies.values().any(|c| c.contains_key("name")))).map(|(_, m)| m).collect() };
    let mut changed = (*of("product", false).choose(&mut rng).expect("a product")).clone();
    changed.fields.insert("title".into(), Value::Str("Rusty rake".into()));
    let mut stale = (*of("order", true).choose(&mut rng).expect("an order with its customer's name")).clone();
    stale.copies.get_mut("customer").unwrap().insert("name".into(), Value::Str("Stale Name".into()));
    let lost = (*of("customer", false).choose(&mut rng).expect("a customer")).clone();
    // A ticket of a customer's that the log never wrote.
    let mut stray = (*of("ticket", false).choose(&mut rng).expect("a ticket")).clone();
    stray.id = tenant::scope(tenant::of(&stray.id), "t-stray");

    let rt = rt();
    let tuning = Embedded { model: Some(d), ..Embedded::with_memory(20 << 20) };
    let backend = rt.block_on(Location::parse(&r.index).unwrap().backend(&r.cfg.topic, Access::Existing, tuning)).unwrap();
    let shard_of = |m: &ModelDoc| backend.open_shard(denorm::command::partitioner::partition_of(&m.key, PARTITIONS)).unwrap();
    for m in [&changed, &stale, &stray] {
        let mut shard = shard_of(m);
        shard.put(Doc::Model(Box::new(m.clone()))).unwrap();
        shard.commit().unwrap();
    }
    let mut shard = shard_of(&lost);
    shard.delete(Kind::Model(lost.kind), &lost.id, 0).unwrap();
    shard.commit().unwrap();
    drop(shard);
    drop(backend);

    progress("corruptions planted");
    // One verify names them and repairs them through the log: an upsert of
    // each changed, stale or lost document and the delete of the stray,
    // applied by a worker.
    let worker = r.worker(args);
    let (code, out, err) = output(&mut with_model(r, &["verify", "--json", "--rounds", "1", "--repair"]));
    let report: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let named: BTreeSet<(String, String, String)> = report["differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (s(&x["kind"]), s(&x["tenant"]), s(&x["id"]), s(&x["problem"])))
        .map(|(k, t, i, p)| (k, tenant::scope((!t.is_empty()).then_some(t.as_str()), &i), p))
        .collect();
    let want: BTreeSet<(String, String, String)> =
        [(&changed, "differs"), (&stale, "differs"), (&lost, "missing"), (&stray, "unexpected")].into_iter().map(|(m, p)| (m.kind.as_str().to_string(), m.id.clone(), p.to_string())).collect();
    assert_eq!(named, want, "seed {seed}: {report}");
    let sent: BTreeSet<(String, String)> = report["repair"]["sent"].as_array().unwrap().iter().map(|x| (s(&x["id"]), s(&x["command"]))).collect();
    let commands: BTreeSet<(String, String)> = want.iter().map(|(_, id, p)| (id.clone(), if p == "unexpected" { "delete" } else { "upsert" }.to_string())).collect();
    assert_eq!((code, sent, &report["repair"]["after"]["differences_total"]), (0, commands, &serde_json::json!(0)), "seed {seed}: {report}\n{err}\n{}", worker.log());
    assert!(held(&model_docs(&r.index, d, |k| std::env::var(k).ok())) == held(live), "seed {seed}: the repaired index is not the live one before the corruptions");

    progress("named and repaired");
    // A tenant deleted through the log: its documents go, every other
    // tenant's stay, and the index is the log's (its repairs included).
    let (code, out, err) = output(&mut with_model(r, &["tenant", "delete", "globex", "--yes"]));
    assert_eq!(code, 0, "{out}\n{err}\n{}", worker.log());
    let report = json_lines(&out).pop().unwrap();
    let globex = |k: &DocKey| k.tenant.as_deref() == Some("globex");
    let counted: u64 = report["deleted"]["model"].as_object().map_or(0, |m| m.values().map(|v| v.as_u64().unwrap()).sum());
    assert_eq!((counted, &report["left"]), (live.keys().filter(|k| globex(k)).count() as u64, &serde_json::json!(0)), "{report}");
    assert!(counted > 0, "tenant globex has no documents");
    assert!(worker.terminate().success());
    let after = model_docs(&r.index, d, |k| std::env::var(k).ok());
    let others: BTreeMap<DocKey, Held> = held(live).into_iter().filter(|(k, _)| !globex(k)).collect();
    assert!(held(&after) == others, "seed {seed}: after the tenant's delete: {}", first_difference(&others, &held(&after), &Vec::new()));
    progress("tenant deleted");
    let (code, out, err) = output(&mut with_model(r, &["verify", "--json", "--rounds", "1"]));
    assert_eq!(code, 0, "after the tenant's delete: {out}\n{err}");
}

fn seeds() -> std::ops::Range<u64> {
    let first = std::env::var("DENORM_MODEL_CONSISTENCY_SEED").map(|s| s.parse().unwrap()).unwrap_or(1);
    let n: u64 = std::env::var("DENORM_MODEL_CONSISTENCY_SEEDS").map(|s| s.parse().unwrap()).unwrap_or(1);
    first..first + n
}

#[test]
fn a_models_randomized_log_under_kills_equals_its_reference_on_the_embedded_index() {
    for seed in seeds() {
        run_on(seed, false);
    }
}

#[test]
fn a_models_randomized_log_under_kills_equals_its_reference_on_elasticsearch() {
    let _es = crate::common::elastic::elastic();
    for seed in seeds() {
        run_on(seed, true);
    }
}
