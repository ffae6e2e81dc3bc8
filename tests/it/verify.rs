//! `denorm verify` (issue 31) on both backends: a live index equals the
//! replay of its log, also while its worker applies more traffic and
//! renames; a document changed behind the pipeline's back is named with
//! its field, its two values and its offsets; the topics are left as they
//! were.

use std::time::Duration;

use crate::common::*;

/// The demo's generator (files, users, posts, renames of trees and of
/// users), then three files moved across top-level directories and one of
/// them deleted.
fn load(r: &Rig) -> std::path::PathBuf {
    let (code, out, err) = r.run(&["generate", "--files", "300", "--users", "20", "--posts", "100", "--renamed-users", "5"]);
    assert_eq!(code, 0, "{err}");
    with_move(r, "v", out)
}

/// One round of live traffic after [`load`], with ids of its own: 200
/// files in five trees, a rename in one of them, one of the generator's
/// users renamed (their posts follow).
fn traffic(round: usize) -> Vec<denorm::command::Command> {
    use denorm::command::Command;
    let t = round % 5;
    let mut out: Vec<Command> = (0..200)
        .map(|i| Command::UpsertFile { id: format!("w{round}-{i}"), path: format!("/wt{}/d{}/w{round}-{i}.txt", i % 5, i % 10), contents: format!("w {round} {i}"), previous_path: None })
        .collect();
    out.push(Command::RenamePath { from: format!("/wt{t}/d{}", round % 10), to: format!("/wt{t}/r{round}") });
    out.push(Command::UpsertUser { id: format!("{}", round % 20 + 1), name: format!("Renamed {round}"), email: format!("r{round}@example.com"), dob: "2000-01-01".into() });
    out
}

/// `jsonl`, then three files of key `/<name>src` moved to `/<name>dst`
/// and one of them deleted, written to a file of the test.
fn with_move(r: &Rig, name: &str, mut jsonl: String) -> std::path::PathBuf {
    for i in 1..=3 {
        jsonl.push_str(&format!("{{\"op\":\"upsert_file\",\"id\":\"{name}m{i}\",\"path\":\"/{name}src/a/{name}m{i}.txt\",\"contents\":\"{name} {i}\"}}\n"));
    }
    jsonl.push_str(&format!("{{\"op\":\"rename\",\"from\":\"/{name}src/a\",\"to\":\"/{name}dst/a\"}}\n"));
    jsonl.push_str(&format!("{{\"op\":\"delete_file\",\"id\":\"{name}m3\",\"path\":\"/{name}dst/a/{name}m3.txt\"}}\n"));
    let path = r.dir().join(format!("{name}.jsonl"));
    std::fs::write(&path, jsonl).unwrap();
    path
}

fn produce_jsonl(r: &Rig, path: &std::path::Path) {
    let (code, _, err) = r.run(&["produce", "--wait", "120", "--jsonl", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
}

fn verify(r: &Rig) -> (i32, serde_json::Value, String) {
    let (code, out, err) = r.run(&["verify", "--json"]);
    let report = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out:?}\n{err}"));
    (code, report, err)
}

fn messages(r: &Rig) -> usize {
    read_topic(&r.cfg).iter().map(Vec::len).sum()
}

/// Changes file `id`'s contents to `contents` behind the pipeline's back:
/// a plain HTTP request on Elasticsearch, a test-only write of the shard on
/// the embedded index (its worker stopped).
pub(crate) fn corrupt(r: &Rig, id: &str, key: &str, contents: &str) {
    use denorm::index::{Backend, Doc, Kind};
    if r.is_elastic() {
        let alias = denorm::index::elastic::names::alias(&crate::common::elastic::prefix(), Kind::File);
        // A tenant's `_id` is scoped (its separator percent-encoded), and
        // its document routed by the tenant.
        let routing = denorm::command::tenant::of(id).map_or(String::new(), |t| format!("&routing={t}"));
        let url = format!("{}/{alias}/_update/{}?refresh=true{routing}", r.index.display(), id.replace('\u{1f}', "%1F"));
        let status = rt().block_on(async { reqwest::Client::new().post(&url).json(&serde_json::json!({"doc": {"contents": contents}})).send().await.unwrap().status() });
        assert!(status.is_success(), "{url}: {status}");
        return;
    }
    let index = denorm::index::embedded::EmbeddedIndex::open_existing(&r.index).unwrap();
    let backend = denorm::index::embedded::EmbeddedBackend::new(index, 20 << 20);
    let mut shard = backend.open_shard(denorm::command::partitioner::partition_of(key, r.cfg.partitions)).unwrap();
    let Some(Doc::File(mut f)) = shard.get(Kind::File, id).unwrap() else { panic!("no file {id}") };
    f.contents = contents.to_string();
    shard.put(Doc::File(f)).unwrap();
    shard.commit().unwrap();
}

/// Deletes post `id` of user `user` behind the pipeline's back: a plain
/// HTTP delete on Elasticsearch, a test-only write of the shard on the
/// embedded index (its worker stopped).
pub(crate) fn lose_post(r: &Rig, id: &str, user: &str) {
    use denorm::index::{Backend, Kind};
    if r.is_elastic() {
        let alias = denorm::index::elastic::names::alias(&crate::common::elastic::prefix(), Kind::Post);
        let url = format!("{}/{alias}/_doc/{id}?refresh=true", r.index.display());
        let status = rt().block_on(async { reqwest::Client::new().delete(&url).send().await.unwrap().status() });
        assert!(status.is_success(), "{url}: {status}");
        return;
    }
    let index = denorm::index::embedded::EmbeddedIndex::open_existing(&r.index).unwrap();
    let backend = denorm::index::embedded::EmbeddedBackend::new(index, 20 << 20);
    let mut shard = backend.open_shard(denorm::command::partitioner::partition_of(user, r.cfg.partitions)).unwrap();
    assert!(shard.get(Kind::Post, id).unwrap().is_some(), "no post {id}");
    shard.delete(Kind::Post, id, 0).unwrap();
    shard.commit().unwrap();
}

/// The user of the last upsert of post `id` in a JSONL file.
fn user_of_post(jsonl: &std::path::Path, id: &str) -> String {
    let text = std::fs::read_to_string(jsonl).unwrap();
    let line = text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()).rfind(|v| v["op"] == "upsert_post" && v["id"] == id);
    line.unwrap_or_else(|| panic!("no post {id}"))["user_id"].as_str().unwrap().to_string()
}

fn verify_names_exactly_what_was_changed_behind_the_pipelines_back(r: Rig) {
    let worker = r.worker(&[]);
    let loaded = load(&r);
    produce_jsonl(&r, &loaded);
    let before = messages(&r);
    let (code, report, err) = verify(&r);
    assert_eq!(code, 0, "{report}\n{err}");
    assert_eq!(report["differences_total"], 0, "{report}");
    assert!(report["checked"].as_u64().unwrap() > 300, "{report}");
    assert_eq!(messages(&r), before, "the verify wrote to the command topic");

    // During live traffic: rounds of files, renames and user renames go
    // on until the verify is done; it starts once some were applied.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (code, report, err, during) = std::thread::scope(|s| {
        let producer = s.spawn(|| {
            let mut round = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                produce(&r.cfg, traffic(round));
                round += 1;
            }
        });
        eventually(
            Duration::from_secs(60),
            || "the worker applied none of the traffic".into(),
            || {
                let lag = denorm::kafka::group_lag(&r.cfg, &r.group).ok()?;
                (lag.partitions.iter().map(|p| p.committed.max(0)).sum::<i64>() as usize > before + 100).then_some(())
            },
        );
        // One round: the rounds are checked in the held fan-out's test; a
        // second round here would compare everything again under traffic.
        let (code, out, err) = r.run(&["verify", "--json", "--rounds", "1"]);
        let report: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out:?}\n{err}"));
        let during = messages(&r);
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        producer.join().unwrap();
        (code, report, err, during)
    });
    assert_eq!(code, 0, "a false difference during live traffic: {report}\n{err}\n{}", worker.log());
    assert_eq!(report["differences_total"], 0, "{report}");
    // It did run during the traffic: it stopped its replay after the
    // traffic started, and the log went on past that while it ran.
    let stopped_at: i64 = report["at"].as_object().unwrap().values().map(|o| o.as_i64().unwrap() + 1).sum();
    assert!(before < stopped_at as usize && (stopped_at as usize) < during, "{before} < {stopped_at} < {during}");
    wait_applied(&r.cfg, &r.group, messages(&r));
    let (code, report, err) = verify(&r);
    assert_eq!((code, &report["differences_total"], &report["written_since"]), (0, &serde_json::json!(0), &serde_json::json!(0)), "{report}\n{err}");

    let log = worker.log();
    assert!(worker.terminate().success(), "{log}");
    corrupt(&r, "vm1", "/vdst", "corrupted");
    let (code, report, err) = verify(&r);
    assert_eq!(code, 1, "{report}\n{err}");
    assert_eq!(report["differences_total"], 1, "{report}");
    let d = &report["differences"][0];
    assert_eq!((d["kind"].as_str(), d["id"].as_str(), d["problem"].as_str()), (Some("file"), Some("vm1"), Some("differs")), "{report}");
    assert_eq!(d["fields"], serde_json::json!([{"field": "contents", "expected": "v 1", "actual": "corrupted"}]), "{report}");
    assert_eq!(d["partition"], denorm::command::partitioner::partition_of("/vdst", r.cfg.partitions), "{report}");
    assert!(d["live_offset"].is_u64() && d["live_offset"] == d["replay_offset"], "{report}");
    let (code, out, _) = r.run(&["verify"]);
    assert_eq!(code, 1);
    assert!(out.contains("file vm1: differs") && out.contains(r#"contents: expected "v 1", found "corrupted""#), "{out}");

    // Some keys only: the corrupted key's, or another one's.
    let all = report["checked"].as_u64().unwrap();
    let (code, out, err) = r.run(&["verify", "--json", "--keys", "/vdst"]);
    let some: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    assert_eq!((code, &some["differences_total"], &some["differences"][0]["id"]), (1, &serde_json::json!(1), &serde_json::json!("vm1")), "{some}");
    assert_eq!(some["checked"], 2, "/vdst holds vm1 and vm2: {some}");
    let (code, out, _) = r.run(&["verify", "--json", "--keys", "/wt0,/wt1"]);
    let other: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((code, &other["differences_total"]), (0, &serde_json::json!(0)), "{other}");
    assert!(other["checked"].as_u64().unwrap() > 0 && other["checked"].as_u64().unwrap() < all, "{other}");
    let (code, out, _) = r.run(&["verify", "--json", "--sample", "100"]);
    let whole: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((code, &whole["checked"]), (1, &serde_json::json!(all)), "{whole}");
    let (code, _, err) = r.run(&["verify", "--sample", "0"]);
    assert_eq!(code, 2, "{err}");

    // Repaired through the log while the workers run: the corrupted file,
    // and a post lost behind the pipeline's back.
    let user = user_of_post(&loaded, "p1");
    lose_post(&r, "p1", &user);
    let worker = r.worker(&[]);
    // The worker exports the verdict the last whole verify recorded in the
    // index (the corrupted file; the partial ones since are recorded apart,
    // review F8).
    let gauge = |name: &str| worker.metric(name, &[("scope", "whole")]);
    eventually(Duration::from_secs(30), || worker.log(), || (gauge("denorm_verify_differences") == 1.0).then_some(()));
    assert_eq!(gauge("denorm_verify_documents_checked"), whole["checked"].as_f64().unwrap());
    let (run, clean) = (gauge("denorm_verify_last_run_timestamp_seconds"), gauge("denorm_verify_last_clean_timestamp_seconds"));
    assert!(clean > 0.0 && run > clean, "last run {run}, last clean {clean}");
    let (code, out, err) = r.run(&["verify", "--json", "--repair"]);
    let rep: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    assert_eq!(code, 0, "{rep}\n{err}\n{}", worker.log());
    assert_eq!(rep["differences_total"], 2, "{rep}");
    let sent: Vec<(&str, &str, &str, &str)> =
        rep["repair"]["sent"].as_array().unwrap().iter().map(|s| (s["kind"].as_str().unwrap(), s["id"].as_str().unwrap(), s["command"].as_str().unwrap(), s["key"].as_str().unwrap())).collect();
    let mut want = vec![("file", "vm1", "upsert_file", "/vdst"), ("post", "p1", "upsert_post", user.as_str())];
    want.sort_by_key(|w| w.3);
    assert_eq!(sent, want, "{rep}");
    assert_eq!(rep["repair"]["not_repaired"], serde_json::json!([]), "{rep}");
    let after = &rep["repair"]["after"];
    assert_eq!((&after["differences_total"], &after["keys"]), (&serde_json::json!(0), &serde_json::json!(want.iter().map(|w| w.3).collect::<Vec<_>>())), "{rep}");
    assert!(after["checked"].as_u64().unwrap() >= 3, "{rep}");
    assert_eq!(worker.metric("denorm_repairs_total", &[("outcome", "applied")]), 2.0);
    let (code, report, err) = verify(&r);
    assert_eq!((code, &report["differences_total"]), (0, &serde_json::json!(0)), "{report}\n{err}");
    let checked = report["checked"].as_f64().unwrap();
    eventually(Duration::from_secs(30), || worker.log(), || (gauge("denorm_verify_differences") == 0.0 && gauge("denorm_verify_documents_checked") == checked).then_some(()));
    assert!(gauge("denorm_verify_last_clean_timestamp_seconds") >= run, "a clean verify recorded");

    // A repair made before a later write of its document is refused: it is
    // dead-lettered with its reason, and the later write stays.
    let vdst = denorm::command::partitioner::partition_of("/vdst", r.cfg.partitions);
    let at = report["at"][vdst.to_string()].as_i64().unwrap();
    let file = |contents: &str| denorm::command::Command::UpsertFile { id: s("vm1"), path: s("/vdst/a/vm1.txt"), contents: s(contents), previous_path: None };
    produce(&r.cfg, vec![file("v later")]);
    let mut stale = denorm::command::Envelope::new(file("v 1"));
    stale.repair = Some(denorm::command::Repair { unchanged_since: at, seen: Some(true) });
    rt().block_on(async { denorm::produce::Producer::new(&r.cfg).unwrap().send_envelope(&stale).await.unwrap() });
    wait_applied_by(&r.cfg, &r.group, messages(&r), &[&worker]);
    assert_eq!(worker.metric("denorm_repairs_total", &[("outcome", "refused")]), 1.0);
    assert_eq!(r.dlq_count()["by_reason"]["repair_refused"], 1, "{}", worker.log());
    let (code, out, err) = r.run(&["verify", "--json", "--keys", "/vdst"]);
    let vdst_report: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    assert_eq!((code, &vdst_report["differences_total"]), (0, &serde_json::json!(0)), "{vdst_report}");
    let (code, out, _) = r.run(&["search", "files", "--json", "--dir", "/vdst/a"]);
    assert!(code == 0 && out.lines().any(|l| l.contains(r#""id":"vm1""#) && l.contains(r#""contents":"v later""#)), "{out}");
    let log = worker.log();
    assert!(worker.terminate().success(), "{log}");
}

#[test]
fn verify_names_exactly_what_was_changed_behind_the_pipelines_back_on_the_embedded_index() {
    verify_names_exactly_what_was_changed_behind_the_pipelines_back(Rig::new(2));
}

#[test]
fn verify_names_exactly_what_was_changed_behind_the_pipelines_back_on_elasticsearch() {
    verify_names_exactly_what_was_changed_behind_the_pipelines_back(Rig::elastic(2));
}

/// Exit status 2, not 0 or 1, when there is nothing to verify against.
#[test]
fn verify_without_an_index_cannot_verify() {
    let r = Rig::new(1);
    let (code, _, err) = r.run(&["verify"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("opening the index"), "{err}");
}

/// The demo (the README's first command) ends with `denorm verify` beside
/// its model check; at a small size here.
#[test]
fn the_demo_ends_with_a_clean_verify_beside_its_model_check() {
    let (code, out, err) = output(denorm().args(["demo", "--files", "2000", "--users", "50", "--posts", "300", "--renamed-users", "5"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("model check passed"), "{out}");
    let line = out.lines().find(|l| l.starts_with("denorm verify: ")).unwrap_or_else(|| panic!("{out}"));
    let checked: usize = line["denorm verify: ".len()..].split_whitespace().next().unwrap().parse().unwrap();
    let in_index: usize = out.lines().find_map(|l| l.strip_prefix("model check passed: all ")).and_then(|r| r.split_whitespace().next()).unwrap().parse().unwrap();
    assert_eq!(checked, in_index, "{out}");
    // Two tenants with the same paths, searched apart (issue 47).
    assert!(
        out.contains(r#"tenant acme: files under /clinton: ["/clinton/archive/1.txt", "/clinton/archive/2.txt", "/clinton/archive/3.txt"]; its posts about relationships are by ["John acme"]"#),
        "{out}"
    );
    assert!(
        out.contains(
            r#"tenant globex: files under /clinton: ["/clinton/work/notes/1.txt", "/clinton/work/notes/2.txt", "/clinton/work/notes/3.txt"]; its posts about relationships are by ["Jonathan globex"]"#
        ),
        "{out}"
    );
}

/// A delete of another key applied while a fan-out of its partition is
/// held in its lane is in the live index, but the partition's checkpoint
/// stays below it (the lowest unfinished command): a verify then must not
/// report the deleted file as missing. It is counted as not judged, and
/// once the fan-out is done a verify judges everything again.
fn a_delete_beside_a_held_fan_out_is_not_a_false_difference(r: Rig) {
    use denorm::command::Command;
    let w = r.worker(&["--page-size", "10"]);
    let mut commands = files_under("h", "/held/x", 30);
    commands.push(Command::UpsertFile { id: s("gone"), path: s("/other/gone.txt"), contents: s("x"), previous_path: None });
    let mut log = produce(&r.cfg, commands);
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&w]);
    r.on_fault("fanout.hold", "/held\n");
    log.extend(produce(&r.cfg, vec![Command::RenamePath { from: s("/held/x"), to: s("/held/y") }, Command::DeleteFile { id: s("gone"), path: s("/other/gone.txt") }]));
    let index = r.index.clone();
    eventually(Duration::from_secs(60), || format!("the other key's delete while the rename is held\n{}", w.log()), || (!dump(&index).iter().any(|d| d.id() == "gone")).then_some(()));
    let (code, report, err) = verify(&r);
    assert_eq!((code, &report["differences_total"]), (0, &serde_json::json!(0)), "a false difference beside a held fan-out: {report}\n{err}");
    assert_eq!(report["unsettled"], 1, "the deleted file is not judged: {report}");
    // It was checked again in a second round (the default), still held.
    assert_eq!(report["rounds"], 2, "{report}");
    let (code, out, _) = r.run(&["verify", "--json", "--rounds", "1"]);
    let one: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((code, &one["rounds"], &one["unsettled"]), (0, &serde_json::json!(1), &serde_json::json!(1)), "{one}");
    r.off_fault("fanout.hold");
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&w]);
    let (code, report, err) = verify(&r);
    assert_eq!((code, &report["differences_total"], &report["unsettled"]), (0, &serde_json::json!(0), &serde_json::json!(0)), "{report}\n{err}");
    assert_eq!(report["rounds"], 1, "nothing left to check again: {report}");
}

#[test]
fn a_delete_beside_a_held_fan_out_is_not_a_false_difference_on_the_embedded_index() {
    a_delete_beside_a_held_fan_out_is_not_a_false_difference(Rig::new(1));
}

#[test]
fn a_delete_beside_a_held_fan_out_is_not_a_false_difference_on_elasticsearch() {
    a_delete_beside_a_held_fan_out_is_not_a_false_difference(Rig::elastic(1));
}

/// Issue 43, 2: `verify --members 3`, the three processes a Job with
/// `parallelism: 3` runs, each replaying and comparing its share of the
/// partitions; member 1 is killed (SIGKILL) in the middle and replaced (a
/// new pod: a fresh scratch directory). Each difference behind the
/// pipeline's back is named by exactly the member that owns its partition,
/// their counts add up to a single verify's, and one verdict is recorded
/// once every member's is in.
fn a_verify_by_members(r: Rig) {
    use denorm::index::Backend;
    let worker = r.worker(&[]);
    let loaded = load(&r);
    produce_jsonl(&r, &loaded);
    let log = worker.log();
    assert!(worker.terminate().success(), "{log}");
    corrupt(&r, "vm1", "/vdst", "corrupted");
    let user = user_of_post(&loaded, "p1");
    lose_post(&r, "p1", &user);
    let runtime = rt();
    let live: Box<dyn Backend> = match r.is_elastic() {
        true => Box::new(elastic::backend(&r.index.to_string_lossy(), &runtime, &r.cfg.topic)),
        false => Box::new(denorm::index::embedded::EmbeddedBackend::new(denorm::index::embedded::EmbeddedIndex::open_existing(&r.index).unwrap(), 15 << 20)),
    };
    let member = |i: u32, scratch: &std::path::Path| {
        cli(&r.cfg, &r.group, &r.index)
            .args(["verify", "--json", "--members", "3", "--member", &i.to_string(), "--run", "job-1", "--scratch-dir", scratch.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let scratch = |name: &str| r.dir().join(name);
    let mut children: Vec<_> = (0..3).map(|i| member(i, &scratch(&format!("scratch-{i}")))).collect();
    // Not `eventually`: this races member 1, polling every 5 ms, to kill it
    // once its replay has begun writing its scratch index.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while std::fs::read_dir(scratch("scratch-1")).map_or(true, |mut d| d.next().is_none()) {
        assert!(std::time::Instant::now() < deadline && children[1].try_wait().unwrap().is_none(), "member 1 never began");
        std::thread::sleep(Duration::from_millis(5));
    }
    children[1].kill().unwrap();
    let killed = children.remove(1).wait_with_output().unwrap();
    assert!(!killed.status.success(), "member 1 finished before it was killed");
    let mut reports = Vec::new();
    for child in children {
        let o = child.wait_with_output().unwrap();
        reports.push((o.status.code(), serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)))));
    }
    assert_eq!(live.verified().unwrap(), None, "a verdict recorded without member 1's");
    let o = member(1, &scratch("scratch-1-replaced")).wait_with_output().unwrap();
    reports.insert(1, (o.status.code(), serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)))));

    // Each member verified its share: the partitions p with p mod 3 = i.
    let owner = |key: &str| denorm::command::partitioner::partition_of(key, r.cfg.partitions) as usize % 3;
    for (i, (code, report)) in reports.iter().enumerate() {
        let at: Vec<i32> = report["at"].as_object().unwrap().keys().map(|p| p.parse().unwrap()).collect();
        assert_eq!(at, (0..r.cfg.partitions).filter(|p| *p as usize % 3 == i).collect::<Vec<_>>(), "member {i}: {report}");
        let named: Vec<&str> = report["differences"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap()).collect();
        let want: Vec<&str> = [("vm1", owner("/vdst")), ("p1", owner(&user))].into_iter().filter(|(_, o)| *o == i).map(|(id, _)| id).collect();
        let mut named_sorted = named.clone();
        named_sorted.sort();
        assert_eq!(named_sorted, want, "member {i}: {report}");
        assert_eq!(*code, Some(if want.is_empty() { 0 } else { 1 }), "member {i}: {report}");
    }
    // One verdict, recorded by the replaced member 1, which completed the set.
    let checked: u64 = reports.iter().map(|(_, r)| r["checked"].as_u64().unwrap()).sum();
    let verdict = live.verified().unwrap().expect("no verdict recorded");
    assert_eq!((verdict.checked, verdict.differences, verdict.last_clean_at), (checked, 2, None), "{verdict:?}");
    let (code, whole, err) = verify(&r);
    assert_eq!((code, &whole["differences_total"]), (1, &serde_json::json!(2)), "{whole}\n{err}");
    assert_eq!(checked, whole["checked"].as_u64().unwrap(), "the members' shares do not add up to the whole");

    // Review F7: keys that match nothing are no clean verify.
    let (code, _, err) = r.run(&["verify", "--keys", "no-such-key"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no document of the keys asked about was compared"), "{err}");
    // Review F4: an index that lost a partition's checkpoint (restored
    // without its meta documents) cannot be verified; its documents used
    // to count as written since, and the verify as clean.
    if r.is_elastic() {
        let url = format!("{}/{}-meta/_doc/p0?refresh=true", r.index.display(), crate::common::elastic::prefix());
        let status = rt().block_on(async { reqwest::Client::new().delete(&url).send().await.unwrap().status() });
        assert!(status.is_success(), "{url}: {status}");
        let (code, _, err) = r.run(&["verify"]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("holds documents of partition(s) [0] but no checkpoint"), "{err}");
    }
}

#[test]
fn a_verify_by_three_members_with_one_killed_midway_names_every_difference_once_and_records_one_verdict() {
    a_verify_by_members(Rig::new(4));
}

#[test]
fn a_verify_by_three_members_with_one_killed_midway_names_every_difference_once_and_records_one_verdict_on_elasticsearch() {
    a_verify_by_members(Rig::elastic(4));
}

/// Review of verify, S2: the embedded index's sorted dump (a verify's
/// live side) held a page of 512 stored documents per segment, so its
/// memory grew with the segments and the documents' size. Eight shards of
/// one segment each, 100 files of 128 KiB: 100 MiB of contents, which the
/// dump held whole; now it holds a document per segment. Peak anonymous
/// memory, sampled while the dump runs, against what it was before.
#[test]
fn the_embedded_sorted_dump_holds_a_document_per_segment_not_a_page() {
    use denorm::index::SearchIndex;
    let dir = tempfile::tempdir().unwrap();
    let index = denorm::index::embedded::EmbeddedIndex::open(dir.path(), "t").unwrap();
    let fan = denorm::apply::FanOut::pages_of(100);
    let (shards, files, size) = (8, 100, 128 << 10);
    let mut pos = 0;
    for p in 0..shards {
        let mut shard = index.open_shard(p, 64 << 20).unwrap();
        for i in 0..files {
            let contents: String = format!("shard {p} file {i} ").repeat(size / 16).chars().take(size).collect();
            let cmd = denorm::command::Command::UpsertFile { id: format!("f{p}-{i}"), path: format!("/k{p}/f{i}.txt"), contents, previous_path: None };
            denorm::apply::apply(&mut shard, &cmd, pos, fan).unwrap();
            pos += 1;
        }
        denorm::index::Shard::commit(&mut shard).unwrap();
    }
    let search = index.search().unwrap();
    let mut seen = 0;
    let ((), before, peak) = denorm::alloc::peak_anon_during(|| search.dump_sorted(&mut |_| seen += 1).unwrap());
    assert_eq!(seen, shards as usize * files);
    let added_mib = peak.saturating_sub(before) / 1024;
    let contents_mib = (shards as usize * files * size) >> 20;
    println!("sorted dump of {contents_mib} MiB of contents: {added_mib} MiB of anonymous memory added at its peak");
    assert!(added_mib < 24, "the dump added {added_mib} MiB for {contents_mib} MiB of contents in {shards} segments");
}

/// The Elasticsearch dumps (a verify's sorted one, and the plain one) ask
/// for pages sized by bytes (`PitScan::bounded`, 16 MiB of
/// `_source`), not for 1,000 documents whatever their size: 240 files of
/// 512 KiB (120 MiB) were one page, held three times over (the response,
/// its JSON, the hits).
#[test]
fn the_elasticsearch_sorted_dump_holds_a_page_of_bytes_not_of_documents() {
    elasticsearch_dump_holds_a_page_of_bytes(true);
}

#[test]
fn the_elasticsearch_dump_holds_a_page_of_bytes_not_of_documents() {
    elasticsearch_dump_holds_a_page_of_bytes(false);
}

/// One dump per test process: the allocator keeps what a first dump
/// freed, which a second's peak would not show.
fn elasticsearch_dump_holds_a_page_of_bytes(sorted: bool) {
    use denorm::index::Backend;
    let es = elastic::elastic();
    let rt = rt();
    let backend = es.backend(&rt, "t");
    rt.block_on(denorm::index::elastic::setup::ensure(&backend.client, &backend.prefix, 1, &Default::default(), None)).unwrap();
    let (files, size) = (240, 512 << 10);
    let mut shard = backend.open_shard(0).unwrap();
    for i in 0..files {
        let contents: String = format!("file {i} of the dump ").repeat(size / 16).chars().take(size).collect();
        let cmd = denorm::command::Command::UpsertFile { id: format!("f{i:03}"), path: format!("/big/f{i}.txt"), contents, previous_path: None };
        denorm::apply::apply(shard.as_mut(), &cmd, i as u64, denorm::apply::FanOut::pages_of(100)).unwrap();
        if i % 20 == 19 {
            shard.commit().unwrap();
        }
    }
    shard.commit().unwrap();
    let search = backend.search().unwrap();
    let (contents_mib, what) = ((files * size) >> 20, if sorted { "sorted dump" } else { "dump" });
    let mut seen = 0;
    let ((), before, peak) = denorm::alloc::peak_anon_during(|| match sorted {
        true => search.dump_sorted(&mut |_| seen += 1).unwrap(),
        false => search.dump(&mut |_| seen += 1).unwrap(),
    });
    assert_eq!(seen, files);
    let added_mib = peak.saturating_sub(before) / 1024;
    println!("Elasticsearch {what} of {contents_mib} MiB of contents: {added_mib} MiB of anonymous memory added at its peak");
    assert!(added_mib < 96, "the {what} added {added_mib} MiB for {contents_mib} MiB of contents");
}
