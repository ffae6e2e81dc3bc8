//! A declared model end to end on a real Kafka-protocol broker (tansu):
//! `denorm produce --model` -> `denorm run --model` -> the embedded index,
//! or the suite's Elasticsearch-API server (noida-db) -> `denorm search
//! KIND`, with the searches the model promises
//! (`tests/fixtures/shop-searches.json`) giving the listed documents, and
//! `denorm verify --model` finding the index equal to the log.

use crate::common::*;

pub(crate) const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/shop.toml");

/// Version 2 of the shop model, which reads version 1's commands
/// (`earlier`, relative to the fixture).
pub(crate) const SHOP_V2: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/shop-v2.toml");

#[derive(serde::Deserialize)]
struct Search {
    kind: String,
    filters: Vec<serde_json::Value>,
    ids: Vec<String>,
}

/// The log of the searches' fixture, then an owner change of an order
/// between two customers no search names (two messages: its delete under
/// the customer it leaves, then its upsert).
pub(crate) fn shop_log() -> String {
    let mut text = include_str!("../../models/shop-example.jsonl").to_string();
    for line in [
        r#"{"op":"upsert","kind":"customer","id":"c3","fields":{"name":"Cy","plan":"team","since":"2026-03-01"}}"#,
        r#"{"op":"upsert","kind":"customer","id":"c4","fields":{"name":"Di","plan":"team","since":"2026-03-02"}}"#,
        r#"{"op":"upsert","kind":"order","id":"o9","fields":{"customer_id":"c3","placed":"2026-12-01","status":"held","total":1}}"#,
        r#"{"op":"upsert","kind":"order","id":"o9","previous_customer_id":"c3","fields":{"customer_id":"c4","placed":"2026-12-01","status":"held","total":1}}"#,
        // Groups of booleans and of integers on both backends.
        r#"{"op":"upsert","kind":"ticket","id":"t2","fields":{"customer_id":"c3","subject":"A billing question","open":false}}"#,
        r#"{"op":"upsert","kind":"product","id":"p8","fields":{"path":"/home/chair","title":"Oak chair","price":40,"stock":10,"tags":["wood"]}}"#,
        r#"{"op":"upsert","kind":"product","id":"p9","fields":{"path":"/home/table","title":"Oak table","price":90,"stock":9,"tags":["wood"]}}"#,
    ] {
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// How many messages [`shop_log`] is: a line each, and two for the owner
/// change.
pub(crate) fn shop_log_messages(text: &str) -> usize {
    text.lines().count() + 1
}

/// `denorm` with the shop model, on the rig's broker, group and index.
pub(crate) fn with_model(r: &Rig, args: &[&str]) -> std::process::Command {
    let mut c = cli(&r.cfg, &r.group, &r.index);
    c.args(["--model", MODEL]).args(args);
    c
}

/// Every search of the fixture gives its documents, and the owner change
/// of [`shop_log`] left o9 with c4 and its copy, nothing under c3.
pub(crate) fn assert_shop_searched(r: &Rig) {
    assert_shop_searched_as(r, &[]);
}

/// [`assert_shop_searched`], each search given `scope` (a tenant's:
/// `--tenant T`, or `--default-tenant`).
pub(crate) fn assert_shop_searched_as(r: &Rig, scope: &[&str]) {
    // The scope right after `search`, before the kind.
    let search = |args: &[&str]| output(&mut with_model(r, &[&args[..1], scope, &args[1..]].concat()));
    let searches: Vec<Search> = serde_json::from_str(include_str!("../fixtures/shop-searches.json")).unwrap();
    for s in &searches {
        let mut args = vec!["search".to_string(), s.kind.clone(), "--limit".into(), "0".into()];
        for f in &s.filters {
            args.extend(["--filter".to_string(), f.to_string()]);
        }
        let (code, out, err) = search(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(code, 0, "{args:?} {scope:?}: {err}");
        let ids: Vec<&str> = out.lines().collect();
        assert_eq!(ids, s.ids, "{args:?} {scope:?}");
    }
    let (code, out, err) = search(&["search", "order", "--term", "customer_id=c4", "--json"]);
    assert_eq!(code, 0, "{err}");
    let o9 = json_lines(&out);
    assert_eq!((o9.len(), &o9[0]["id"], &o9[0]["customer"]["name"], &o9[0]["customer"]["plan"]), (1, &"o9".into(), &"Di".into(), &"team".into()), "{scope:?}: {out}");
    let (_, out, _) = search(&["search", "order", "--term", "customer_id=c3"]);
    assert_eq!(out, "", "o9 left c3 ({scope:?})");
    assert_grouped(&search);
}

/// What a command run gives: its exit code, stdout and stderr.
type Ran = (i32, String, String);

/// A search grouped by a copied field holds, for each value, the
/// documents a search of that value finds, and every document once.
fn assert_grouped(search: &dyn Fn(&[&str]) -> Ran) {
    let ids = |args: &[&str]| {
        let (code, out, err) = search(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        out.lines().map(str::to_string).collect::<Vec<_>>()
    };
    let (code, out, err) = search(&["search", "order", "--group-by", "customer.plan", "--per-group", "0", "--limit", "0", "--json"]);
    assert_eq!(code, 0, "{err}");
    let groups = json_lines(&out);
    assert!(groups.len() >= 3, "{out}");
    let mut counts: Vec<u64> = groups.iter().map(|g| g["count"].as_u64().unwrap()).collect();
    assert!(counts.windows(2).all(|w| w[0] >= w[1]), "the largest group first: {out}");
    for g in &groups {
        let plan = g["value"].as_str().unwrap();
        let found: Vec<String> = g["ids"].as_array().unwrap().iter().map(|i| i.as_str().unwrap().to_string()).collect();
        assert_eq!(found, ids(&["search", "order", "--term", &format!("customer.plan={plan}"), "--limit", "0"]), "{plan}");
    }
    counts.sort();
    let every = ids(&["search", "order", "--limit", "0"]);
    assert_eq!(counts.iter().sum::<u64>() as usize, every.len(), "{out}");
    assert_eq!(ids(&["search", "order", "--limit", "2"]), every[..2], "the first in id order");
    let (code, out, _) = search(&["search", "order", "--group-by", "customer.plan", "--per-group", "1", "--limit", "1"]);
    assert_eq!((code, out.lines().count()), (0, 2), "one group, one id: {out}");
    for (kind, field) in [("order", "customer.plan"), ("order", "status"), ("ticket", "open"), ("product", "stock"), ("product", "tags"), ("customer", "name.raw")] {
        assert_groups_agree(search, kind, field);
    }
    let (code, _, err) = search(&["search", "order", "--group-by", "total"]);
    assert_eq!(code, 2);
    assert!(err.contains("float"), "{err}");
}

/// `kind`'s groups by `field` are the same read from every match (every
/// id of each group) as aggregated (on Elasticsearch, at most 100 ids a
/// group): each value's ids are what a term search of it finds, the
/// largest group first, ties in the order of their values.
fn assert_groups_agree(search: &dyn Fn(&[&str]) -> Ran, kind: &str, field: &str) {
    let groups = |per_group: &str, limit: &str| {
        let (code, out, err) = search(&["search", kind, "--group-by", field, "--per-group", per_group, "--limit", limit, "--json"]);
        assert_eq!(code, 0, "{kind} by {field}: {err}");
        json_lines(&out)
    };
    let every = groups("0", "0");
    assert!(every.len() >= 2, "{kind} by {field}: {every:?}");
    assert_eq!(groups("100", "0"), every, "{kind} by {field}: aggregated as counted");
    assert_eq!(groups("100", "1"), every[..1], "{kind} by {field}: the largest group");
    let first: Vec<serde_json::Value> = every.iter().map(|g| serde_json::json!({"value": g["value"], "count": g["count"], "ids": g["ids"].as_array().unwrap()[..1]})).collect();
    assert_eq!(groups("1", "0"), first, "{kind} by {field}: each group's first id");
    for pair in every.windows(2) {
        let (a, b) = (pair[0]["count"].as_u64().unwrap(), pair[1]["count"].as_u64().unwrap());
        let in_order = match (&pair[0]["value"], &pair[1]["value"]) {
            (serde_json::Value::Number(x), serde_json::Value::Number(y)) => x.as_f64() < y.as_f64(),
            (serde_json::Value::Bool(x), serde_json::Value::Bool(y)) => !x & y,
            (serde_json::Value::String(x), serde_json::Value::String(y)) => x < y,
            other => panic!("{kind} by {field}: values of two types {other:?}"),
        };
        assert!(a > b || (a == b && in_order), "{kind} by {field}: {pair:?}");
    }
    for g in &every {
        let value = g["value"].as_str().map_or_else(|| g["value"].to_string(), str::to_string);
        let filter = serde_json::json!({"term": {"field": field, "value": value}}).to_string();
        let (code, out, err) = search(&["search", kind, "--filter", &filter, "--limit", "0"]);
        assert_eq!(code, 0, "{err}");
        let found: Vec<&str> = out.lines().collect();
        let ids: Vec<&str> = g["ids"].as_array().unwrap().iter().map(|i| i.as_str().unwrap()).collect();
        assert_eq!((ids.as_slice(), g["count"].as_u64().unwrap() as usize), (found.as_slice(), found.len()), "{kind} by {field}: {g}");
    }
}

#[test]
fn a_models_commands_are_produced_applied_searched_and_verified_through_the_pipeline() {
    through_the_pipeline(Rig::new(3));
}

#[test]
fn a_models_commands_are_produced_applied_searched_and_verified_through_the_pipeline_on_elasticsearch() {
    let _es = crate::common::elastic::elastic();
    through_the_pipeline(Rig::elastic(3));
}

fn through_the_pipeline(r: Rig) {
    let (cfg, group, index) = (&r.cfg, r.group.as_str(), r.index.as_path());
    let with_model = |args: &[&str]| with_model(&r, args);
    let log = r.dir().join("shop.jsonl");
    let text = shop_log();
    std::fs::write(&log, &text).unwrap();
    let sent = shop_log_messages(&text);

    let worker = Worker::start(cfg, group, index, &["--model", MODEL]);
    let (code, out, err) = output(with_model(&["produce", "--wait", "120", "--jsonl"]).arg(&log));
    assert_eq!(code, 0, "{err}\n{}", worker.log());
    assert_eq!(json_lines(&out)[0]["produced"], sent as i64, "{out}");
    wait_applied_by(cfg, group, sent, &[&worker]);
    assert_shop_searched(&r);
    let (code, _, err) = output(&mut with_model(&["search", "order", "--under", "status=/x"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("status.tree"), "a field the kind does not have is named: {err}");

    // Usage errors name what is wrong.
    let (code, _, err) = output(&mut with_model(&["search", "invoice"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is not a kind of model shop") && err.contains("customer"), "{err}");
    let (code, _, err) = output(cli(cfg, group, index).args(["search", "order"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--model"), "{err}");
    // verify replays the log with the model and finds the index equal to
    // it; without the model, it cannot decide (exit 2) and says which
    // model the index holds.
    let verify = |c: &mut std::process::Command| {
        let (code, out, err) = output(c.args(["verify", "--json"]));
        (code, serde_json::from_str::<serde_json::Value>(&out).unwrap_or(serde_json::Value::Null), err)
    };
    let (code, report, err) = verify(&mut with_model(&[]));
    assert_eq!((code, &report["differences_total"]), (0, &serde_json::json!(0)), "{report}\n{err}");
    assert!(report["checked"].as_u64().unwrap() >= 6, "{report}");
    let (code, _, err) = verify(&mut cli(cfg, group, index));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("holds model shop"), "{err}");

    // An index written with a model refuses a worker without it.
    let status = worker.terminate();
    assert!(status.success(), "{status:?}");

    // An order changed behind the pipeline's back is named by verify.
    {
        use denorm::command::generic::value::Value;
        use denorm::index::open::{Access, Embedded, Location};
        use denorm::index::{Doc, Kind, ModelKind};
        let d = denorm::domain::Domain::load(std::path::Path::new(MODEL)).unwrap().interned();
        let rt = rt();
        let tuning = Embedded { model: Some(d), ..Embedded::with_memory(20 << 20) };
        let backend = rt.block_on(Location::parse(index).unwrap().backend(&cfg.topic, Access::Existing, tuning)).unwrap();
        let mut shard = backend.open_shard(denorm::command::partitioner::partition_of("c1", cfg.partitions)).unwrap();
        let Some(Doc::Model(mut o1)) = shard.get(Kind::Model(ModelKind::of(d, "order").unwrap()), "o1").unwrap() else { panic!("no order o1") };
        o1.fields.insert("status".into(), Value::Str("lost".into()));
        shard.put(Doc::Model(o1)).unwrap();
        shard.commit().unwrap();
    }
    let (code, report, err) = verify(&mut with_model(&[]));
    assert_eq!((code, &report["differences_total"], &report["differences"][0]["id"]), (1, &serde_json::json!(1), &serde_json::json!("o1")), "{report}\n{err}");
    // A verify of the order's key finds it, one of another key does not;
    // so does a full sample; of two members, the one whose partitions
    // hold its key does.
    let found = |extra: &[&str]| {
        let (code, out, err) = output(with_model(&["verify", "--json"]).args(extra));
        let report = serde_json::from_str::<serde_json::Value>(&out).unwrap_or(serde_json::Value::Null);
        assert!(code == 0 || code == 1, "{extra:?}: {err}");
        let ids: Vec<String> = report["differences"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap().to_string()).collect();
        (code, ids)
    };
    assert_eq!(found(&["--keys", "c1"]), (1, vec!["o1".to_string()]));
    assert_eq!(found(&["--keys", "c2,/garden"]), (0, vec![]));
    assert_eq!(found(&["--sample", "100"]), (1, vec!["o1".to_string()]));
    let holder = denorm::members::Members::new(2, 0).unwrap();
    let c1 = denorm::command::partitioner::partition_of("c1", cfg.partitions);
    for member in 0..2u32 {
        let scratch = r.dir().join(format!("model-scratch-{member}"));
        let (code, ids) = found(&["--members", "2", "--member", &member.to_string(), "--run", "model-job", "--scratch-dir", scratch.to_str().unwrap()]);
        let holds = (member == 0) == holder.owns(c1);
        assert_eq!((code, ids.len()), if holds { (1, 1) } else { (0, 0) }, "member {member}");
    }
    // A repair sends the order's upsert through the log; a worker applies
    // it, and the index equals the log again.
    let worker = Worker::start(cfg, group, index, &["--model", MODEL]);
    let (code, out, err) = output(&mut with_model(&["verify", "--json", "--repair"]));
    let report = serde_json::from_str::<serde_json::Value>(&out).unwrap_or(serde_json::Value::Null);
    let sent = &report["repair"]["sent"];
    assert_eq!((code, &sent[0]["id"], &sent[0]["command"], sent.as_array().map(Vec::len)), (0, &serde_json::json!("o1"), &serde_json::json!("upsert"), Some(1)), "{report}\n{err}\n{}", worker.log());
    assert_eq!(report["repair"]["after"]["differences_total"], 0, "{report}");
    let (code, report, err) = verify(&mut with_model(&[]));
    assert_eq!((code, &report["differences_total"]), (0, &serde_json::json!(0)), "{report}\n{err}");
    let (code, out, _) = output(&mut with_model(&["search", "order", "--term", "status=lost"]));
    assert_eq!((code, out.as_str()), (0, ""), "o1 is restored");
    assert!(worker.terminate().success());
    let (code, _, err) = output(cli(cfg, group, index).args(["run", "--metrics-addr", "127.0.0.1:0"]));
    assert_ne!(code, 0);
    assert!(err.contains("holds model shop"), "{err}");
    // A tenant delete with the model counts the tenant's documents (the
    // randomized model test deletes a tenant's); without it, it is refused.
    let (code, _, err) = output(&mut with_model(&["tenant", "delete", "acme"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("tenant acme: 0 files, 0 users, 0 posts") && err.contains("add --yes"), "{err}");
    let (code, _, err) = output(cli(cfg, group, index).args(["tenant", "delete", "acme", "--yes"]));
    assert_ne!(code, 0);
    assert!(err.contains("holds model shop"), "{err}");
    // A rebuild without the model would build the compiled-in kinds only:
    // a change of model, refused before it builds anything unless asked.
    let (code, _, err) = output(cli(cfg, group, index).args(["rebuild", "--metrics-addr", "127.0.0.1:0"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("holds model shop") && err.contains("--change-model"), "{err}");
    let (code, out, err) = output(&mut with_model(&["search", "order", "--term", "customer_id=c4"]));
    assert_eq!((code, out.as_str()), (0, "o9\n"), "the index is as it was: {err}");
}

#[test]
fn a_models_commands_parked_behind_a_poison_are_letters_and_reprocessed_through_the_model() {
    parked_and_reprocessed(Rig::new(3));
}

#[test]
fn a_models_commands_parked_behind_a_poison_are_letters_and_reprocessed_through_the_model_on_elasticsearch() {
    let _es = crate::common::elastic::elastic();
    parked_and_reprocessed(Rig::elastic(3));
}

/// A poison keyed by a customer parks the key: the model's commands behind
/// it wait as letters, listed by `denorm dlq`; once the poison is cleared
/// and the key reprocessed, they are applied through the model in their
/// order, and the index equals the log.
fn parked_and_reprocessed(r: Rig) {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let (cfg, group) = (&r.cfg, r.group.as_str());
    let worker = r.worker(&["--model", MODEL, "--on-abort", "park"]);
    let poison = rt().block_on(async {
        let p: FutureProducer = cfg.client_config().create().unwrap();
        let partition = denorm::command::partitioner::partition_of("c1", cfg.partitions);
        let d = p.send(FutureRecord::to(&cfg.topic).key("c1").payload(&b"a poison: not an avro message".to_vec()).partition(partition), std::time::Duration::from_secs(30)).await.unwrap();
        (d.partition, d.offset)
    });
    let log = r.dir().join("parked.jsonl");
    std::fs::write(
        &log,
        [
            r#"{"op":"upsert","kind":"customer","id":"c1","fields":{"name":"Ann","plan":"free","since":"2026-01-01"}}"#,
            r#"{"op":"upsert","kind":"order","id":"o1","fields":{"customer_id":"c1","placed":"2026-12-01","status":"open","total":3,"lines":[{"sku":"a-1","quantity":2,"price":1.5}]}}"#,
            r#"{"op":"patch","kind":"customer","id":"c1","set":{"name":"Ann Lee"}}"#,
            r#"{"op":"upsert","kind":"customer","id":"c2","fields":{"name":"Bob","plan":"gold","since":"2026-01-02"}}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let (code, _, err) = output(with_model(&r, &["produce", "--jsonl"]).arg(&log));
    assert_eq!(code, 0, "{err}");
    wait_applied_by(cfg, group, 5, &[&worker]);
    let search = |args: &[&str]| {
        let (code, out, err) = output(&mut with_model(&r, args));
        assert_eq!(code, 0, "{args:?}: {err}");
        out
    };
    assert_eq!(search(&["search", "customer", "--term", "plan=gold"]), "c2\n", "another key is applied");
    assert_eq!(search(&["search", "order"]), "", "the parked key's order waits");

    let (code, out, err) = r.run(&["dlq", "list", "--key", "c1", "--json"]);
    assert_eq!(code, 0, "{err}");
    let letters = json_lines(&out);
    let reasons: Vec<&str> = letters.iter().map(|l| l["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons, ["not_single_object", "parked", "parked", "parked"], "{out}");
    let first = &letters[0];
    assert_eq!((first["origin_partition"].as_i64(), first["origin_offset"].as_i64()), (Some(poison.0 as i64), Some(poison.1)), "{first}");
    let letter = format!("{}@{}", first["dlq_partition"], first["dlq_offset"]);
    let (code, _, err) = r.run(&["dlq", "clear", "--key", "c1", "--letter", &letter, "--yes"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = r.run(&["dlq", "reprocess", "--key", "c1", "--json"]);
    assert_eq!(code, 0, "{err}");
    let report = json_lines(&out).pop().unwrap_or_else(|| panic!("no report: {err}"));
    assert_eq!(report["still_open"], 0, "{out}\n{err}\n{}", worker.log());
    wait_applied_by(cfg, group, r.topic_end() as usize, &[&worker]);
    let (code, out, err) = output(&mut with_model(&r, &["search", "order", "--json"]));
    assert_eq!(code, 0, "{err}");
    let orders = json_lines(&out);
    assert_eq!((orders.len(), &orders[0]["id"], &orders[0]["customer"]["name"]), (1, &"o1".into(), &"Ann Lee".into()), "applied in their order: {out}\n{}", worker.log());
    assert_eq!(r.dlq_count()["total"], 0);
    let (code, out, err) = output(&mut with_model(&r, &["verify", "--json"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(worker.terminate().success());
}
