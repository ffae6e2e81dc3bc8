//! End-to-end behaviour of the pipeline on a real Kafka-protocol broker
//! (tansu): produce -> `denorm run` worker processes -> embedded index.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::*;
use denorm::command::Command;
use denorm::index::{Doc, Kind};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

#[test]
fn every_command_end_to_end_through_produce_worker_and_search() {
    every_command_end_to_end(Rig::new(3));
}

#[test]
fn every_command_end_to_end_through_produce_worker_and_search_on_elasticsearch() {
    every_command_end_to_end(Rig::elastic(3));
}

fn every_command_end_to_end(r: Rig) {
    let (cfg, group, index) = (&r.cfg, r.group.as_str(), r.index.as_path());
    let jsonl = r.dir().join("commands.jsonl");
    std::fs::write(
        &jsonl,
        r#"{"op":"upsert_file","id":"f1","path":"/clinton/projects/elasticsearch/README.txt","contents":"Starting a new Elasticsearch project is easy..."}
{"op":"upsert_file","id":"f2","path":"/clinton/projects/kibana/notes.txt","contents":"dashboards and visualizations"}
{"op":"upsert_file","id":"f3","path":"/bill/a.txt","contents":"to be deleted"}
{"op":"delete_file","id":"f3","path":"/bill/a.txt"}
{"op":"rename","from":"/clinton/projects","to":"/clinton/work"}
{"op":"upsert_user","id":"1","name":"John Smith","email":"john@smith.com","dob":"1970-10-24"}
{"op":"upsert_post","id":"2","user_id":"1","title":"Relationships","body":"It's complicated..."}
{"op":"upsert_post","id":"3","user_id":"1","title":"Gone","body":"deleted soon"}
{"op":"delete_post","id":"3","user_id":"1"}
{"op":"upsert_user","id":"1","name":"Johnny Smith","email":"john@smith.com","dob":"1970-10-24"}
"#,
    )
    .unwrap();
    let (code, out, err) = output(cli(cfg, group, index).args(["produce", "--jsonl"]).arg(&jsonl));
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_lines(&out)[0]["produced"], 10);
    let (code, out, err) = output(cli(cfg, group, index).args(["produce", "upsert-file", "--id", "f4", "--path", "/bill/b.txt", "--contents", "hello bill"]));
    assert_eq!(code, 0, "{err}");
    let delivery = &json_lines(&out)[0];
    assert_eq!(delivery["key"], "/bill");
    assert!(delivery["offset"].as_i64().unwrap() >= 0 && delivery["partition"].as_i64().unwrap() >= 0);

    let worker = Worker::start(cfg, group, index, &[]);
    wait_applied(cfg, group, 11);

    let (code, out, err) = output(cli(cfg, group, index).args(["search", "files", "--under", "/clinton/work", "--limit", "0", "--json"]));
    assert_eq!(code, 0, "{err}");
    let got: BTreeSet<(String, String, String)> = json_lines(&out).iter().map(|v| (v["id"].as_str().unwrap().into(), v["path"].as_str().unwrap().into(), v["name"].as_str().unwrap().into())).collect();
    let want: BTreeSet<(String, String, String)> = [(s("f1"), s("/clinton/work/elasticsearch"), s("README.txt")), (s("f2"), s("/clinton/work/kibana"), s("notes.txt"))].into();
    assert_eq!(got, want);

    let (_, out, _) = output(cli(cfg, group, index).args(["search", "files", "--dir", "/clinton/work/elasticsearch", "--text", "elasticsearch", "--json"]));
    let hits = json_lines(&out);
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0]["contents"], "Starting a new Elasticsearch project is easy...");

    let (_, out, _) = output(cli(cfg, group, index).args(["search", "files", "--dir", "/bill", "--json"]));
    let bill: Vec<_> = json_lines(&out).iter().map(|v| v["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(bill, vec!["f4"], "deleted file f3 must be gone");

    let (_, out, _) = output(cli(cfg, group, index).args(["search", "posts", "--author", "johnny", "--json"]));
    let posts = json_lines(&out);
    assert_eq!(posts.len(), 1, "deleted post 3 must be gone: {out}");
    assert_eq!(posts[0]["id"], "2");
    assert_eq!(posts[0]["user"]["name"], "Johnny Smith");

    let (_, out, _) = output(cli(cfg, group, index).args(["search", "posts", "--text", "relationships", "--group-by-author", "--json"]));
    let groups = json_lines(&out);
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0]["author"], "Johnny Smith");
    assert_eq!(groups[0]["posts"][0]["title"], "Relationships");

    // Read-your-writes: --wait returns once the group has applied the command.
    let (code, _, err) = output(cli(cfg, group, index).args(["produce", "--wait", "60", "upsert-file", "--id", "f5", "--path", "/bill/c.txt", "--contents", "waited"]));
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = output(cli(cfg, group, index).args(["search", "files", "--text", "waited", "--json"]));
    assert_eq!(json_lines(&out).len(), 1, "the waited-for write must be searchable at once: {out}");

    // SIGTERM: drains, commits, leaves, exits 0.
    let status = worker.terminate();
    assert!(status.success(), "worker exit status {status:?}");
    let (code, out, _) = output(cli(cfg, group, index).args(["lag", "--json"]));
    assert_eq!(code, 0);
    let lag = &json_lines(&out)[0];
    assert_eq!(lag["total"], 0);
    let ends: i64 = lag["partitions"].as_array().unwrap().iter().map(|p| p["end"].as_i64().unwrap()).sum();
    assert_eq!(ends, 12);
    for p in lag["partitions"].as_array().unwrap() {
        assert_eq!(p["committed"], p["end"], "{lag}");
    }
}

#[test]
fn rejects_invalid_input_before_sending_anything() {
    let r = Rig::new(2);
    let (cfg, index) = (&r.cfg, r.index.as_path());
    let cases = [
        ("{\"op\":\"rename\",\"from\":\"/a/b\",\"to\":\"/a/b/c\"}", "line 2: rename of \"/a/b\" into itself"),
        ("{\"op\":\"rename\",\"from\":\"/a/b\",\"to\":\"/c\"}", "only a top-level directory can become one"),
        ("{\"op\":\"upsert_file\",\"id\":\"x\",\"path\":\"relative/x\",\"contents\":\"\"}", "absolute"),
        ("{\"op\":\"nope\"}", "line 2: unknown variant"),
    ];
    for (bad, want) in cases {
        let f = r.dir().join("bad.jsonl");
        std::fs::write(&f, format!("{{\"op\":\"upsert_file\",\"id\":\"ok\",\"path\":\"/a/ok.txt\",\"contents\":\"\"}}\n{bad}\n")).unwrap();
        let (code, _, err) = output(cli(cfg, "g", index).args(["produce", "--jsonl"]).arg(&f));
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains(want), "{bad}: stderr {err:?} lacks {want:?}");
    }
    let (code, _, err) = output(cli(cfg, "g", index).args(["produce", "rename", "--from", "/clinton", "--to", "/bill/c"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("can only be renamed to a top-level directory"), "{err}");
    let (code, _, _) = output(cli(cfg, "g", index).args(["produce", "--no-such-flag"]));
    assert_eq!(code, 2);
    let report = denorm::kafka::group_lag(cfg, "g").unwrap();
    assert_eq!(report.partitions.iter().map(|p| p.end).sum::<i64>(), 0, "nothing may be produced");
    let (code, _, err) = output(cli(cfg, "g", &r.dir().join("missing")).args(["search", "files"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no denorm index"), "{err}");
}

#[test]
fn concurrent_renames_of_a_tree_and_a_file_in_it_match_the_model() {
    concurrent_renames_of_a_tree_and_a_file_in_it_match_the_model_on(Rig::new(3));
}

#[test]
fn concurrent_renames_of_a_tree_and_a_file_in_it_match_the_model_on_elasticsearch() {
    concurrent_renames_of_a_tree_and_a_file_in_it_match_the_model_on(Rig::elastic(3));
}

fn concurrent_renames_of_a_tree_and_a_file_in_it_match_the_model_on(r: Rig) {
    let (cfg, group, index) = (&r.cfg, r.group.as_str(), r.index.as_path());
    let _worker = Worker::start(cfg, group, index, &[]);
    let mut seed = denorm::demo::seed(4000, 50, 500, 11);
    seed.extend(files_under("b", "/bill/projects", 300));
    let mut log = produce(cfg, seed);
    // The race: both renames, plus new files under the old name, concurrently.
    let (dir_rename, file_rename) = denorm::demo::race();
    let late = files_under("late", "/clinton/projects/elasticsearch", 200);
    let raced = rt().block_on(async {
        let p = denorm::produce::Producer::new(cfg).unwrap();
        let (a, b, c) = tokio::join!(p.send(dir_rename.clone()), p.send(file_rename.clone()), p.send_all(late.clone(), 50, |_| {}));
        let mut out = vec![(a.unwrap(), dir_rename), (b.unwrap(), file_rename)];
        out.extend(c.unwrap().into_iter().zip(late));
        out
    });
    log.extend(raced);
    log.extend(produce(cfg, denorm::demo::user_renames(10, 11)));
    wait_applied(cfg, group, log.len());
    assert_matches_model(index, &log);
    let readme = model_of(&log).file_path("f0").unwrap().to_string();
    assert!(readme.starts_with("/clinton/work/elasticsearch/README."), "{readme}");
}

#[test]
fn resumes_after_worker_killed_mid_rename() {
    resumes_after_workers_killed_mid_rename(Rig::new(2));
}

/// Issue 27's restart: two workers killed mid-rename could not start again
/// against an independent Elasticsearch-API server (the alias lookup).
#[test]
fn resumes_after_workers_killed_mid_rename_on_elasticsearch() {
    resumes_after_workers_killed_mid_rename(Rig::elastic(2));
}

/// Two workers load a tree and the rename race; both are SIGKILLed in the
/// middle of a rename of the tree; two new workers start on the same index
/// and the result equals the model.
fn resumes_after_workers_killed_mid_rename(r: Rig) {
    let (cfg, group, index) = (&r.cfg, r.group.as_str(), r.index.as_path());
    // Smaller on Elasticsearch, whose writes are slower here (noida-db):
    // its 50 throttled pages (below) still outlast the wait for the
    // rename's start, each page a read and a write of 100 files.
    let tree = if r.is_elastic() { 5_000 } else { 20_000 };
    let mut files = files_under("big", "/big/tree", tree);
    let (dir_rename, file_rename) = denorm::demo::race();
    files.extend(denorm::demo::seed(1000, 20, 100, 7));
    files.extend([dir_rename, file_rename]);
    let mut log = produce(cfg, files);
    // A short session timeout: the group notices the killed members sooner.
    let fast = ["-X", "session.timeout.ms=6000", "-X", "heartbeat.interval.ms=500"];
    // Throttled fan-out (pages of 100, 10 ms apart): the kill lands mid-rename
    // however loaded the machine is.
    let throttled = ["--page-size", "100", "--fan-out-page-pause-ms", "10"];
    let args = [&fast[..], &throttled[..]].concat();
    let workers = [Worker::start(cfg, group, index, &args), Worker::start(cfg, group, index, &args)];
    wait_applied_by(cfg, group, log.len(), &[&workers[0], &workers[1]]);
    assert_matches_model(index, &log);
    let before = dump(index);

    log.extend(produce(
        cfg,
        vec![
            Command::RenamePath { from: s("/big/tree"), to: s("/big/moved") },
            // After the rename: a new file at the old name must stay there.
            Command::UpsertFile { id: s("new"), path: s("/big/tree/new.txt"), contents: s("after"), previous_path: None },
        ],
    ));
    // The rename of /big (the load's fan-outs were of other keys).
    let logged = |what: &str| workers.iter().any(|w| w.log().lines().any(|l| l.contains(what) && l.contains("/big")));
    eventually(Duration::from_secs(60), || format!("rename never started:\n{}\n{}", workers[0].log(), workers[1].log()), || logged("fan-out started").then_some(()));
    let finished_before_kill = logged("fan-out applied");
    for w in workers {
        w.kill();
    }
    assert!(!finished_before_kill, "the rename finished before the kill; the test did not exercise a crash");
    if !r.is_elastic() {
        // Nothing of the half-done rename is visible: the embedded index
        // commits a fan-out whole (Elasticsearch shows its pages as they
        // are written: docs/elasticsearch.md).
        let after_kill = dump(index);
        assert_eq!(denorm::model::diff(before, after_kill, 5), Vec::<String>::new());
    }

    let again = [Worker::start(cfg, group, index, &fast), Worker::start(cfg, group, index, &fast)];
    wait_applied_by(cfg, group, log.len(), &[&again[0], &again[1]]);
    assert_matches_model(index, &log);
    let docs = dump(index);
    let moved = docs.iter().filter(|d| matches!(d, Doc::File(f) if f.path.starts_with("/big/moved/"))).count();
    assert_eq!(moved, tree);
}

/// Sets the group's committed offsets of every partition back to 0.
fn rewind(cfg: &denorm::kafka::KafkaConfig, group: &str) {
    let mut c = cfg.client_config();
    c.set("group.id", group).set("enable.auto.commit", "false");
    let consumer: BaseConsumer = c.create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..cfg.partitions {
        tpl.add_partition_offset(&cfg.topic, p, Offset::Offset(0)).unwrap();
    }
    consumer.commit(&tpl, CommitMode::Sync).unwrap();
}

#[test]
fn a_rewound_group_changes_nothing_because_the_index_decides_where_to_resume() {
    let r = Rig::new(3);
    let (cfg, group, index) = (&r.cfg, r.group.as_str(), r.index.as_path());
    let mut cmds = denorm::demo::seed(1500, 30, 300, 5);
    let (a, r) = denorm::demo::race();
    cmds.extend([a, r]);
    cmds.extend(denorm::demo::user_renames(5, 5));
    let log = produce(cfg, cmds);
    let worker = Worker::start(cfg, group, index, &[]);
    wait_applied(cfg, group, log.len());
    assert!(worker.terminate().success());
    let first = dump(index);

    rewind(cfg, group);
    assert_eq!(denorm::kafka::group_lag(cfg, group).unwrap().total, log.len() as i64);
    let worker = Worker::start(cfg, group, index, &[]);
    wait_applied(cfg, group, log.len());
    let second = dump(index);
    // Byte for byte the same documents, bookkeeping included.
    let key = |d: &Doc| (d.kind(), d.id().to_string());
    let mut a = first.clone();
    let mut b = second;
    a.sort_by_key(key);
    b.sort_by_key(key);
    assert_eq!(a, b);
    // Each partition resumes at its shard's checkpoint, whose own message is
    // read again (to check the log's identity) and skipped: nothing of the
    // rewound range is fetched again. (The group's offset may pass the end
    // before that: the checkpoint is committed as soon as the shard opens.)
    worker.assert_resumed_at_checkpoints(3);
    assert_matches_model(index, &log);
}

#[test]
fn two_workers_share_partitions_and_the_result_is_exact() {
    two_workers_share_partitions(Rig::new(6));
}

/// Also with the meta index over three primaries (review of
/// Elasticsearch, F12): the partitions' checkpoints are conditional writes
/// routed by id, read by `_mget` across the shards.
#[test]
fn two_workers_share_partitions_and_the_result_is_exact_on_elasticsearch() {
    std::env::set_var(denorm::index::elastic::config::env::META_SHARDS, "3");
    two_workers_share_partitions(Rig::elastic(6));
}

fn two_workers_share_partitions(r: Rig) {
    let (cfg, group, index) = (&r.cfg, r.group.as_str(), r.index.as_path());
    let seed = denorm::demo::seed(6000, 100, 1000, 3);
    let (first_half, second_half) = seed.split_at(seed.len() / 2);
    let a = Worker::start(cfg, group, index, &[]);
    let mut log = produce(cfg, first_half.to_vec());
    // A second worker joins mid-stream: the group rebalances.
    let b2 = Worker::start(cfg, group, index, &[]);
    log.extend(produce(cfg, second_half.to_vec()));
    let (x, y) = denorm::demo::race();
    log.extend(produce(cfg, vec![x, y]));
    log.extend(produce(cfg, denorm::demo::user_renames(20, 3)));
    wait_applied_by(cfg, group, log.len(), &[&a, &b2]);
    assert!(b2.wait_for_log("partitions assigned", Duration::from_secs(30)));
    assert!(a.log_contains("partitions revoked"), "the first worker never gave partitions up:\n{}", a.log());
    assert_matches_model(index, &log);

    // The first worker leaves: the second takes every partition over.
    assert!(a.terminate().success());
    log.extend(produce(cfg, files_under("x", "/hillary/extra", 500)));
    log.extend(produce(cfg, vec![Command::RenamePath { from: s("/hillary/extra"), to: s("/hillary/more") }]));
    wait_applied_by(cfg, group, log.len(), &[&b2]);
    assert_matches_model(index, &log);
    if r.is_elastic() {
        let rt = rt();
        let es = elastic::backend(&index.to_string_lossy(), &rt, "");
        let shards = rt.block_on(denorm::index::elastic::setup::meta_shards_of(&es.client, &es.prefix)).unwrap();
        assert_eq!(shards, Some(3), "the meta index's primaries, as DENORM_ES_META_SHARDS asked");
    }
}

#[test]
fn hostile_messages_are_dead_lettered_with_distinct_reasons_without_stopping_the_partition() {
    let r = Rig::new(1);
    let (cfg, group, index) = (&r.cfg, r.group.as_str(), r.index.as_path());
    let codec = denorm::codec::Codec::new();
    let valid = |id: &str| codec.encode(&denorm::command::Envelope::new(Command::UpsertFile { id: s(id), path: format!("/a/{id}.txt"), contents: s("x"), previous_path: None }));
    let truncated = valid("t")[..14].to_vec();
    let invalid = codec.encode(&denorm::command::Envelope::new(Command::UpsertFile { id: s("bad"), path: s("/a/../etc"), contents: s("x"), previous_path: None }));
    let unknown_schema = {
        let mut b = valid("u");
        b[4] ^= 0xff;
        b
    };
    // (key, payload): every kind of hostile input, between valid commands.
    let messages: Vec<(Option<&str>, Vec<u8>)> = vec![
        (Some("/a"), valid("v1")),
        (Some("/a"), b"random garbage bytes".to_vec()),
        (Some("/a"), valid("v2")),
        (Some("/a"), truncated),
        (Some("/a"), Vec::new()),
        (Some("/a"), invalid),
        (Some("/a"), unknown_schema),
        (None, valid("nokey")),
        (Some("/elsewhere"), valid("wrongkey")),
        (Some("/a"), vec![0xC3; 3000]),
        (Some("/a"), valid("v3")),
    ];
    send_raw(cfg, &messages);
    // `skip`: the valid commands of key /a after the hostile ones are
    // applied anyway (parking is tested in tests/it/faults.rs).
    let worker = Worker::start(cfg, group, index, &["--max-message-bytes", "2048", "--on-abort", "skip"]);
    wait_applied(cfg, group, messages.len());
    let ids: BTreeSet<String> = dump(index).iter().filter(|d| d.kind() == Kind::File).map(|d| d.id().to_string()).collect();
    assert_eq!(ids, BTreeSet::from([s("v1"), s("v2"), s("v3")]));
    let (_, metrics) = worker.http_get("/metrics");
    for (reason, n) in
        [("not_single_object", 1.0), ("undecodable", 1.0), ("empty_payload", 1.0), ("invalid_command", 1.0), ("unknown_schema", 1.0), ("missing_key", 1.0), ("key_mismatch", 1.0), ("oversized", 1.0)]
    {
        assert_eq!(metric(&metrics, "denorm_messages_rejected_total", &[("reason", reason)]), n, "{reason}:\n{metrics}");
    }
    assert_eq!(metric(&metrics, "denorm_commands_total", &[("outcome", "applied")]), 3.0);
    assert_eq!(metric(&metrics, "denorm_dead_letters_total", &[]), 8.0, "{metrics}");
    assert!(worker.log_contains("command aborted and dead-lettered partition=0 offset=1 reason=\"not_single_object\""), "{}", worker.log());

    // The dead-letter topic holds each one with its reason, origin and
    // original bytes, committed only after the letter was written.
    let (code, out, err) = output(cli(cfg, group, index).args(["dlq", "list", "--json"]));
    assert_eq!(code, 0, "{err}");
    let listed = json_lines(&out);
    let got: Vec<(i64, String)> = listed.iter().map(|e| (e["origin_offset"].as_i64().unwrap(), e["reason"].as_str().unwrap().to_string())).collect();
    let want: Vec<(i64, String)> =
        [(1, "not_single_object"), (3, "undecodable"), (4, "empty_payload"), (5, "invalid_command"), (6, "unknown_schema"), (7, "missing_key"), (8, "key_mismatch"), (9, "oversized")]
            .iter()
            .map(|(o, r)| (*o, s(r)))
            .collect();
    assert_eq!(got, want, "{out}");
    assert!(listed.iter().all(|e| e["attempts"] == 1 && e["origin_partition"] == 0), "{out}");
    let (letters, _) = denorm::dlq::admin::read(cfg, &denorm::dlq::default_topic(&cfg.topic)).unwrap();
    for l in &letters {
        assert_eq!(l.payload, messages[l.origin_offset as usize].1, "letter of offset {} keeps the original bytes", l.origin_offset);
        assert_eq!(l.key, messages[l.origin_offset as usize].0.unwrap_or(""));
    }
    let (code, out, _) = output(cli(cfg, group, index).args(["dlq", "count", "--json"]));
    assert_eq!(code, 0);
    let count: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(count["total"], 8, "{out}");
    assert_eq!(count["by_reason"]["oversized"], 1, "{out}");
}

#[test]
fn metrics_health_and_readiness_endpoints() {
    let r = Rig::new(2);
    let (cfg, group, index) = (&r.cfg, r.group.as_str(), r.index.as_path());
    let worker = Worker::start(cfg, group, index, &[]);
    let log = produce(cfg, denorm::demo::seed(200, 5, 20, 1));
    wait_applied(cfg, group, log.len());
    assert!(worker.http_get("/healthz").0.contains("200"));
    assert!(worker.http_get("/readyz").0.contains("200"));
    assert!(worker.http_get("/nope").0.contains("404"));
    // Lag gauges are refreshed every few seconds: wait for both partitions at 0.
    let at_zero = |m: &str| (0..2).all(|p| m.contains(&format!("denorm_consumer_lag_messages{{partition=\"{p}\"}} 0\n")));
    let metrics = eventually(
        Duration::from_secs(30),
        || format!("lag gauges never reached 0:\n{}", worker.http_get("/metrics").1),
        || {
            let (_, m) = worker.http_get("/metrics");
            at_zero(&m).then_some(m)
        },
    );
    for name in ["denorm_consumer_lag_seconds", "denorm_commands_total", "denorm_command_documents_bucket", "denorm_index_commit_seconds_bucket", "denorm_consumer_rebalances_total"] {
        assert!(metrics.contains(name), "{name} missing:\n{metrics}");
    }
    assert_eq!(metric(&metrics, "denorm_commands_total", &[("outcome", "applied")]), log.len() as f64);
    match std::process::Command::new("promtool").args(["check", "metrics"]).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn() {
        Ok(mut child) => {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(metrics.as_bytes()).unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "promtool check metrics failed:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        }
        Err(_) => {
            eprintln!("promtool not installed: checking the text format by hand");
            for line in metrics.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
                let value = line.rsplit(' ').next().unwrap();
                assert!(value.parse::<f64>().is_ok() || value == "+Inf", "bad sample line {line:?}");
                assert!(line.starts_with("denorm_"), "unexpected metric {line:?}");
            }
        }
    }
}

/// A command that holds its partition (held at its apply by the fault
/// point `apply.hold`) shows on the worker's metrics: the other keys'
/// commands waiting behind it, and how long it has been at it; both go
/// back to 0 once it is applied.
#[test]
fn a_command_holding_its_partition_shows_what_waits_behind_it_and_for_how_long() {
    holding_shows_on_the_metrics(Rig::new(1));
}

#[test]
fn a_command_holding_its_partition_shows_what_waits_behind_it_and_for_how_long_on_elasticsearch() {
    holding_shows_on_the_metrics(Rig::elastic(1));
}

fn holding_shows_on_the_metrics(r: Rig) {
    use denorm::metrics::{OLDEST_UNFINISHED_SECONDS, WAITING_COMMANDS};
    let w = r.worker(&[]);
    r.on_fault("apply.hold", "/held\n");
    let file = |dir: &str| Command::UpsertFile { id: format!("{dir}-1"), path: format!("/{dir}/1.txt"), contents: s("x"), previous_path: None };
    let log = produce(&r.cfg, vec![file("held"), file("b"), file("c"), file("d")]);
    let p = [("partition", "0")];
    let read = || {
        let m = w.http_get("/metrics").1;
        let present = m.contains(&format!("{WAITING_COMMANDS}{{")) && m.contains(&format!("{OLDEST_UNFINISHED_SECONDS}{{"));
        (present, metric(&m, WAITING_COMMANDS, &p), metric(&m, OLDEST_UNFINISHED_SECONDS, &p))
    };
    let last = std::cell::Cell::new((false, 0.0, 0.0));
    let shown = |want: fn(f64, f64) -> bool| {
        let now = read();
        last.set(now);
        (now.0 && want(now.1, now.2)).then_some(())
    };
    // The three other keys wait behind the held one, which has been at it
    // for seconds (the gauges are refreshed every few seconds).
    eventually(Duration::from_secs(60), || format!("held: (present, waiting, seconds) = {:?}\n{}", last.get(), w.log()), || shown(|waiting, secs| waiting == 3.0 && secs >= 2.0));
    r.off_fault("apply.hold");
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&w]);
    eventually(Duration::from_secs(60), || format!("released: (present, waiting, seconds) = {:?}\n{}", last.get(), w.log()), || shown(|waiting, secs| waiting == 0.0 && secs == 0.0));
}

/// Key lanes: a rename held between its pages (fault point
/// `fanout.hold`) holds up only its own key. Another key's file behind it
/// is searchable at once, the held key's later file waits, the busy-lanes
/// gauge shows the rename, and the group's offset stays at the rename.
#[test]
fn a_fan_out_holds_up_only_its_own_key() {
    a_fan_out_in_a_lane(Rig::new(1));
}

#[test]
fn a_fan_out_holds_up_only_its_own_key_on_elasticsearch() {
    a_fan_out_in_a_lane(Rig::elastic(1));
}

fn a_fan_out_in_a_lane(r: Rig) {
    use denorm::metrics::{PARTITION_BUSY_LANES, WAITING_COMMANDS};
    let index = r.index.clone();
    let w = r.worker(&["--page-size", "10"]);
    r.on_fault("fanout.hold", "/held\n");
    let mut commands = files_under("h", "/held/x", 30);
    commands.push(Command::RenamePath { from: s("/held/x"), to: s("/held/y") });
    commands.push(Command::UpsertFile { id: s("other"), path: s("/other/1.txt"), contents: s("x"), previous_path: None });
    commands.push(Command::UpsertFile { id: s("late"), path: s("/held/x/late.txt"), contents: s("x"), previous_path: None });
    let log = produce(&r.cfg, commands);
    let p = [("partition", "0")];
    let has = |id: &str| dump_once_created(&index).iter().any(|d| d.id() == id);
    eventually(Duration::from_secs(60), || format!("the other key's file while the rename is held\n{}", w.log()), || has("other").then_some(()));
    assert!(!has("late"), "the held key's later file overtook its rename");
    assert!(dump(&index).iter().all(|d| d.id() == "other" || d.pos() != log[30].0.offset as u64), "a page of the held rename was written");
    let lag = denorm::kafka::group_lag(&r.cfg, &r.group).unwrap().total;
    assert!(lag >= 3, "the group's offset passed the unfinished rename: lag {lag}");
    eventually(
        Duration::from_secs(60),
        || format!("busy lanes and waiting\n{}", w.http_get("/metrics").1),
        || {
            let m = w.http_get("/metrics").1;
            (metric(&m, PARTITION_BUSY_LANES, &p) == 1.0 && metric(&m, WAITING_COMMANDS, &p) == 1.0).then_some(())
        },
    );
    r.off_fault("fanout.hold");
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&w]);
    assert_matches_model(&index, &log);
    eventually(Duration::from_secs(60), || w.http_get("/metrics").1, || (w.metric(PARTITION_BUSY_LANES, &p) == 0.0).then_some(()));
}

/// Bounded memory: a key's lane far behind its held rename (3,000 commands
/// of that key behind it) does not take them all into memory: once
/// `--queue-kb` holds what waits, the partition is paused and the rest
/// stays in the topic. Released, everything is applied in order.
#[test]
fn a_lane_far_behind_its_fan_out_stays_within_the_queue_bound() {
    a_lane_far_behind(Rig::new(1));
}

#[test]
fn a_lane_far_behind_its_fan_out_stays_within_the_queue_bound_on_elasticsearch() {
    a_lane_far_behind(Rig::elastic(1));
}

fn a_lane_far_behind(r: Rig) {
    use denorm::metrics::WAITING_COMMANDS;
    r.on_fault("fanout.hold", "/held\n");
    let w = r.worker(&["--queue-kb", "64", "--fetch-buffer-kb", "64", "--page-size", "10", "--log", "info,denorm::worker=debug"]);
    let mut commands = files_under("h", "/held/x", 30);
    commands.push(Command::RenamePath { from: s("/held/x"), to: s("/held/y") });
    let behind = 3000;
    commands.extend((0..behind).map(|i| Command::UpsertFile { id: format!("l{i}"), path: format!("/held/x/l{i}.txt"), contents: "c".repeat(200), previous_path: None }));
    let log = produce(&r.cfg, commands);
    assert!(w.wait_for_log("partition paused: its queue is full", Duration::from_secs(60)), "never paused:\n{}", w.log());
    // 64 KiB hold about 110 of these messages (payload, key and 256 bytes
    // of bookkeeping each); one fetch of at most 64 KiB may come on top.
    let p = [("partition", "0")];
    let bound = 400.0;
    let mut seen = Vec::new();
    let watched = std::time::Instant::now();
    while watched.elapsed() < Duration::from_secs(7) {
        let waiting = metric(&w.http_get("/metrics").1, WAITING_COMMANDS, &p);
        assert!(waiting <= bound, "{waiting} commands held in memory behind the rename (bound {bound}); seen {seen:?}");
        seen.push(waiting);
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(seen.iter().any(|&n| n > 0.0), "the gauge never showed the lane: {seen:?}");
    r.off_fault("fanout.hold");
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&w]);
    assert_matches_model(&r.index, &log);
}

/// With one lane the rename runs in one call: the shutdown bound ends it.
#[test]
fn sigterm_during_a_long_fan_out_stops_within_the_bound_and_the_next_worker_finishes() {
    sigterm_during_a_long_fan_out("1");
}

/// In a lane the rename runs a page at a time: the worker stops between
/// two pages, well within the bound, and the next worker finishes it.
#[test]
fn sigterm_during_a_long_fan_out_in_a_lane_stops_between_its_pages() {
    sigterm_during_a_long_fan_out("8");
}

fn sigterm_during_a_long_fan_out(lanes: &str) {
    let r = Rig::new(1);
    let (cfg, group, index) = (&r.cfg, r.group.as_str(), r.index.as_path());
    let mut log = produce(cfg, files_under("f", "/big/tree", 10_000));
    // 100 pages, 100 ms apart: a rename of about 10 s, against a 1 s bound.
    let slow = ["--page-size", "100", "--fan-out-page-pause-ms", "100", "--shutdown-timeout-secs", "1", "--lanes", lanes];
    let worker = Worker::start(cfg, group, index, &slow);
    wait_applied(cfg, group, log.len());
    let before = dump(index);
    log.extend(produce(cfg, vec![Command::RenamePath { from: s("/big/tree"), to: s("/big/moved") }]));
    assert!(worker.wait_for_log("fan-out started", Duration::from_secs(60)), "{}", worker.log());
    let started = std::time::Instant::now();
    let (status, log_text) = worker.terminate_with_log();
    let took = started.elapsed();
    assert!(status.success(), "exit status {status:?}");
    // The bound, by the worker's own clock: from the signal to giving the
    // command up (one lane) or to the stop between two pages (lanes), 1 s
    // and a few polls of 10 ms at most. The process's exit after it
    // (leaving the group) is bounded by the grace, and checked loosely.
    let bound = Duration::from_millis(1250);
    match lanes {
        "1" => {
            let gap = log_gap(&log_text, "SIGTERM received", "shutdown bound reached");
            eprintln!("the command was given up {gap:?} after the SIGTERM");
            assert!(gap >= Duration::from_secs(1) && gap < bound, "the command was given up {gap:?} after the SIGTERM, against a bound of 1 s:\n{log_text}");
        }
        _ => {
            assert!(!log_text.contains("shutdown bound reached"), "not stopped between pages:\n{log_text}");
            let gap = log_gap(&log_text, "SIGTERM received", "worker stopped");
            eprintln!("stopped {gap:?} after the SIGTERM");
            assert!(gap < Duration::from_secs(1), "stopped {gap:?} after the SIGTERM, not within the 1 s bound:\n{log_text}");
        }
    }
    assert!(took < Duration::from_secs(8), "the process exited {took:?} after the SIGTERM, against the rename's own 10 s");
    // Nothing of the interrupted rename is visible, and its offset was not committed.
    assert_eq!(denorm::model::diff(before, dump(index), 5), Vec::<String>::new());
    assert_eq!(denorm::kafka::group_lag(cfg, group).unwrap().total, 1);
    let _next = Worker::start(cfg, group, index, &[]);
    wait_applied(cfg, group, log.len());
    assert_matches_model(index, &log);
}

#[test]
fn kafka_secrets_never_reach_the_log() {
    let r = Rig::new(1);
    let (cfg, group) = (&r.cfg, r.group.as_str());
    let secret = "s3cr3t-Pa55word-never-logged";
    // SASL settings pass through to every client (the broker here speaks
    // no SASL, so commands that work without them fail with them); with
    // debug logging on, the password must still not appear.
    let sasl = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanism=PLAIN", "-X", "sasl.username=denorm", "-X", &format!("sasl.password={secret}"), "-X", "debug=security,broker"];
    let (code, _, err) = output(cli(cfg, group, r.dir()).args(["lag"]));
    assert_eq!(code, 0, "{err}");
    for sub in [&["run", "--metrics-addr", "127.0.0.1:0"][..], &["lag"][..]] {
        let (code, out, err) = output(cli(cfg, group, &r.dir().join("index")).args(sasl).args(["--log", "debug"]).args(sub));
        assert_ne!(code, 0, "{sub:?}: the SASL settings were not used: {err}");
        assert!(!out.contains(secret) && !err.contains(secret), "{sub:?} logged the password:\n{err}");
    }
}

/// A backlog on one partition of more than 20 times the queue bound drains
/// on tansu: the partition is paused whenever its queue is full and resumed
/// at half, also after a worker joins and leaves the group meanwhile, and the
/// result is exact.
#[test]
fn a_backlog_far_beyond_the_queue_bound_drains_without_stalling() {
    // A broker of its own: on tansu a resume refetches from a table holding
    // every message of the broker, so the shared one would only be slower.
    let r = Rig::on(Broker::private(), 12);
    let mut commands = files_under("b", "/backlog", 20_000);
    commands.push(Command::RenamePath { from: s("/backlog/d7"), to: s("/backlog/moved") });
    // Sizes as the worker counts them against --queue-kb: key, payload and
    // 256 bytes of bookkeeping per message.
    let codec = denorm::codec::Codec::new();
    let backlog_bytes: usize = commands.iter().map(|c| codec.encode(&denorm::command::Envelope::new(c.clone())).len() + c.key().len() + 256).sum();
    let queue_kb = 256;
    assert!(backlog_bytes > 20 * queue_kb * 1024, "the backlog ({backlog_bytes} bytes) is at least 20 times the queue bound");
    let log = produce(&r.cfg, commands);
    let args = ["--queue-kb", &queue_kb.to_string(), "--fetch-buffer-kb", "256"];
    let w = r.worker(&args);
    // Rebalances while the partition is paused: librdkafka keeps a paused
    // partition paused through a revoke and a new assignment.
    eventually(Duration::from_secs(60), || format!("the queue bound was never hit:\n{}", w.log()), || (w.metric("denorm_consumer_partition_pauses_total", &[]) >= 1.0).then_some(()));
    let joiner = r.worker(&args);
    assert!(joiner.wait_for_log("partitions assigned", Duration::from_secs(60)), "{}", joiner.log());
    let status = joiner.terminate();
    assert!(status.success(), "{status:?}");
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&w]);
    assert_matches_model(&r.index, &log);
    let (_, metrics) = w.http_get("/metrics");
    let pauses = metric(&metrics, "denorm_consumer_partition_pauses_total", &[]);
    assert!(pauses >= 10.0, "the queue bound was hit ({pauses} pauses):\n{metrics}");
    assert!(metric(&metrics, "denorm_consumer_rebalances_total", &[("kind", "assign")]) >= 2.0, "the worker went through rebalances:\n{metrics}");
    // The time the consumer was held back by the queue's bound (issue 45):
    // a pause that a revoke ended is not resumed, so not every one counts.
    let (held, held_for) = (metric(&metrics, "denorm_consumer_partition_paused_seconds_count", &[]), metric(&metrics, "denorm_consumer_partition_paused_seconds_sum", &[]));
    assert!(held >= 1.0 && held <= pauses && held_for > 0.0, "{held} pauses resumed, {held_for} s:\n{metrics}");
    println!("{} commands ({backlog_bytes} bytes) on one partition drained with a {queue_kb} KiB queue: {pauses} pauses, {held} resumed after {held_for:.1} s in all", log.len());
}
