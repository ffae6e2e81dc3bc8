//! Placements on Elasticsearch (issue 47): a tenant named in
//! `DENORM_ES_DEDICATED_TENANTS` when a generation is created has indexes
//! of its own in that generation, and a rebuild moves tenants between the
//! shared indexes and their own while the others are served and updated.
//! Checked against the suite's Elasticsearch-API server (noida-db) with
//! plain HTTP requests, as an operator or a tenant's application would
//! look.

use std::ffi::OsStr;

use crate::common::*;
use crate::tenants::{lines_file, search};
use denorm::command::Command;

pub(crate) const DEDICATED: &str = "DENORM_ES_DEDICATED_TENANTS";

/// `GET <url>/<path>` as JSON, with its status.
fn get(url: &str, path: &str) -> (u16, serde_json::Value) {
    rt().block_on(async {
        let r = reqwest::get(format!("{url}/{path}")).await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    })
}

/// The documents of `tenant` in `index` (a concrete index or an alias):
/// their count, or `None` when the index does not exist.
pub(crate) fn count_of(url: &str, index: &str, tenant: &str) -> Option<u64> {
    let (status, v) = get(url, &format!("{index}/_count?q=tenant:{tenant}"));
    match status {
        404 => None,
        200 => Some(v["count"].as_u64().unwrap()),
        other => panic!("{index}: {other} {v}"),
    }
}

/// How many documents the alias `alias` shows (tombstones hidden), all of
/// them `tenant`'s.
pub(crate) fn shown_through(url: &str, alias: &str, tenant: &str) -> usize {
    let (status, v) = get(url, &format!("{alias}/_search?size=100"));
    assert_eq!(status, 200, "{alias}: {v}");
    let hits = v["hits"]["hits"].as_array().unwrap();
    assert!(hits.iter().all(|h| h["_source"]["tenant"] == tenant), "{alias} returned another tenant's: {v}");
    hits.len()
}

/// Every search of files, as each tenant: its own five files only.
fn each_tenant_finds_its_files(r: &Rig, when: &str) {
    for t in [None, Some("acme"), Some("globex")] {
        let got = search(r, t, &["files", "--text", "shared"]);
        let mark = format!("mark-{}", t.unwrap_or("default"));
        assert_eq!(got.len(), 5, "{when}: {t:?}: {got:?}");
        assert!(got.iter().all(|f| f["contents"] == format!("shared words {mark}")), "{when}: {t:?} found another tenant's: {got:?}");
    }
}

fn verify_is_clean(r: &Rig, args: &[&str], checked: u64) {
    let all: Vec<&str> = ["verify", "--json"].into_iter().chain(args.iter().copied()).collect();
    let (code, out, err) = r.run(&all);
    let report = report_of(code, &out, &err);
    assert_eq!((code, report["checked"].as_u64()), (0, Some(checked)), "{all:?}: {report}");
}

/// `rebuild --status --json`'s `tenant_rebuilds`.
fn tenant_rebuilds(r: &Rig) -> serde_json::Value {
    let (code, out, err) = r.run(&["rebuild", "--status", "--json"]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str::<serde_json::Value>(&out).unwrap()["tenant_rebuilds"].clone()
}

/// A file of `tenant` (`/docs/a9.txt`), applied by the live worker `w`.
fn produce_after(r: &Rig, w: &Worker, tenant: &str) {
    let (code, _, err) = r.run(&["produce", "--tenant", tenant, "--wait", "120", "upsert-file", "--id", "a9", "--path", "/docs/a9.txt", "--contents", "after words"]);
    assert_eq!(code, 0, "{err}\n{}", w.log());
}

/// `rebuild --tenant acme --to-shared`, held once fenced, after it has
/// written acme's five files into the shared index of files `shared` (its
/// worker goes on while held).
fn acme_leaving_held(r: &Rig, shared: &str) -> std::process::Child {
    let child = crate::rebuild::rebuild_in(r, "leave-faults", &[("rebuild.fenced", "")], &["--tenant", "acme", "--to-shared"]);
    let reached = r.dir().join("leave-faults").join("rebuild.fenced.reached");
    eventually(std::time::Duration::from_secs(120), || "the move never fenced".into(), || reached.exists().then_some(()));
    let url = r.index.display().to_string();
    eventually(std::time::Duration::from_secs(60), || format!("acme's files never reached {shared}"), || (count_of(&url, shared, "acme") == Some(5)).then_some(()));
    child
}

/// A rig on Elasticsearch whose worker started with `acme` dedicated,
/// once it has applied the three tenants' documents ([`lines_file`]).
fn acme_dedicated_with_three_tenants() -> (Rig, Worker) {
    let r = Rig::elastic(3);
    let w = Worker::start_env(&r.cfg, &r.group, &r.index, &[], &[(DEDICATED, OsStr::new("acme")), ("DENORM_FAULTS", r.faults_dir().as_os_str())]);
    let (code, _, err) = r.run(&["produce", "--wait", "120", "--jsonl", &lines_file(&r)]);
    assert_eq!(code, 0, "{err}\n{}", w.log());
    (r, w)
}

/// acme starts in indexes of its own; a rebuild with `globex` configured
/// moves acme to the shared indexes and globex to its own, while a worker
/// started with the old configuration keeps applying (it follows the
/// generation's placement, not its own configuration) and the default
/// tenant's producer writes on. Every search, the tenants' aliases,
/// `verify` and the model agree before and after.
#[test]
fn a_dedicated_tenant_lives_in_its_own_indexes_and_moves_by_a_rebuild_on_elasticsearch() {
    let (r, w) = acme_dedicated_with_three_tenants();
    let (url, prefix) = (r.index.display().to_string(), crate::common::elastic::prefix());
    assert_matches_topic_model(&r.cfg, &r.index);

    // acme's documents are in its own indexes, and only there.
    let own = |t: &str, g: u32| format!("{prefix}-t-{t}-files-{g:06}");
    let shared = |g: u32| format!("{prefix}-files-{g:06}");
    assert_eq!(count_of(&url, &own("acme", 1), "acme"), Some(5));
    assert_eq!(count_of(&url, &shared(1), "acme"), Some(0));
    assert_eq!(count_of(&url, &shared(1), "globex"), Some(5));
    assert_eq!(count_of(&url, &own("globex", 1), "globex"), None, "globex is shared");
    assert_eq!(count_of(&url, &format!("{prefix}-t-acme-posts-000001"), "acme"), Some(2));
    assert_eq!(shown_through(&url, &format!("{prefix}-t-acme-files"), "acme"), 5);
    each_tenant_finds_its_files(&r, "acme in its own indexes");
    verify_is_clean(&r, &["--tenant", "acme"], 8);
    verify_is_clean(&r, &[], 24);
    // Its aliases exist already: `tenant alias` names them.
    let (code, out, err) = r.run(&["tenant", "alias", "acme"]);
    assert_eq!((code, out.lines().next()), (0, Some(format!("{prefix}-t-acme-files").as_str())), "{err}");

    // The move: a rebuild with globex configured, while the default
    // tenant's producer writes.
    let extra = r.dir().join("extra.jsonl");
    let more: Vec<String> = (0..30).map(|i| format!(r#"{{"op":"upsert_file","id":"x{i}","path":"/more/x{i}.txt","contents":"later words"}}"#)).collect();
    std::fs::write(&extra, more.join("\n")).unwrap();
    let (rebuilt, produced) = std::thread::scope(|s| {
        let rebuild = s.spawn(|| output(cli(&r.cfg, &r.group, &r.index).env(DEDICATED, "globex").args(["rebuild", "--metrics-addr", "127.0.0.1:0"])));
        let produced = r.run(&["produce", "--wait", "120", "--jsonl", extra.to_str().unwrap()]);
        (rebuild.join().unwrap(), produced)
    });
    assert_eq!(rebuilt.0, 0, "{}", rebuilt.2);
    assert_eq!(produced.0, 0, "{}", produced.2);
    // After the cutover, a command of each tenant, applied by the worker
    // started with acme configured.
    let after = r.dir().join("after.jsonl");
    let lines = [
        r#"{"op":"upsert_file","id":"a9","path":"/docs/a9.txt","contents":"after words","tenant":"acme"}"#,
        r#"{"op":"upsert_file","id":"g9","path":"/docs/g9.txt","contents":"after words","tenant":"globex"}"#,
    ];
    std::fs::write(&after, lines.join("\n")).unwrap();
    let (code, _, err) = r.run(&["produce", "--wait", "120", "--jsonl", after.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}\n{}", w.log());
    assert_matches_topic_model(&r.cfg, &r.index);

    assert_eq!(count_of(&url, &shared(2), "acme"), Some(6), "acme moved to the shared indexes");
    assert_eq!(count_of(&url, &own("acme", 1), "acme"), None, "acme's own indexes deleted with the old generation");
    assert_eq!(count_of(&url, &own("acme", 2), "acme"), None);
    assert_eq!(count_of(&url, &own("globex", 2), "globex"), Some(6), "globex moved to its own indexes");
    assert_eq!(count_of(&url, &shared(2), "globex"), Some(0));
    // Each tenant's alias reads it where it is now.
    assert_eq!(shown_through(&url, &format!("{prefix}-t-acme-files"), "acme"), 6);
    assert_eq!(shown_through(&url, &format!("{prefix}-t-globex-files"), "globex"), 6);
    each_tenant_finds_its_files(&r, "after the move");
    assert_eq!(search(&r, None, &["files", "--text", "later"]).len(), 30, "the default tenant was updated during the rebuild");
    verify_is_clean(&r, &[], 24 + 30 + 2);
    drop(w);
}

/// The mapping check covers a tenant's own indexes: one found with a
/// mapping that conflicts with denorm's is refused at startup, named, as
/// a shared index is.
#[test]
fn a_tenants_own_index_with_a_conflicting_mapping_is_refused_at_startup_on_elasticsearch() {
    let r = Rig::elastic(1);
    let url = r.index.display().to_string();
    let prefix = crate::common::elastic::prefix();
    let acme = [(DEDICATED, OsStr::new("acme"))];
    let w = Worker::start_env(&r.cfg, &r.group, &r.index, &[], &acme);
    assert!(w.wait_for_log("elasticsearch indexes ready", std::time::Duration::from_secs(60)), "{}", w.log());
    w.terminate();
    let index = format!("{prefix}-t-acme-posts-000001");
    let (status, v) = get(&url, &format!("{index}/_alias"));
    assert_eq!(status, 200, "acme's own index was created: {v}");
    // Replaced by one whose `title` is a number, with the same aliases.
    let body = serde_json::json!({
        "mappings": {"properties": {"title": {"type": "integer"}}},
        "aliases": {format!("{prefix}-posts"): {"is_write_index": false}, format!("{prefix}-t-acme-posts"): {}, format!("{prefix}-t-acme-posts-g0"): {}}
    });
    rt().block_on(async {
        let c = reqwest::Client::new();
        assert!(c.delete(format!("{url}/{index}")).send().await.unwrap().status().is_success());
        let r = c.put(format!("{url}/{index}")).json(&body).send().await.unwrap();
        assert!(r.status().is_success(), "{:?}", r.text().await);
    });
    let (status, log) = Worker::start_env(&r.cfg, &r.group, &r.index, &[], &acme).wait_exit(std::time::Duration::from_secs(60));
    assert!(!status.success(), "{log}");
    // The first difference named: its `dynamic`, left at the default.
    assert!(log.contains(&format!("mapping conflict in {index}: field (dynamic) is true (the default), denorm needs strict")), "{log}");
}

/// Changes document `id` of `kind` (its index's name: `files`, `order`)
/// in `tenant`'s own indexes behind the pipeline's back, setting `doc`'s
/// fields (through its alias: one index, routed by `_id`).
pub(crate) fn corrupt_own(r: &Rig, (tenant, kind): (&str, &str), id: &str, doc: serde_json::Value) {
    let alias = format!("{}-t-{tenant}-{kind}", crate::common::elastic::prefix());
    let url = format!("{}/{alias}/_update/{tenant}%1F{id}?refresh=true", r.index.display());
    let status = rt().block_on(async { reqwest::Client::new().post(&url).json(&serde_json::json!({ "doc": doc })).send().await.unwrap().status() });
    assert!(status.is_success(), "{url}: {status}");
}

/// `denorm rebuild --tenant acme`, acme having indexes of its own: one of
/// acme's files and one of globex's are changed behind the pipeline's
/// back; the rebuild, run while every tenant's producer writes (acme's
/// renames among them), replays acme alone into a new revision of its
/// indexes and cuts acme over. acme's file is right again, globex's
/// change is still there (the rebuild did not touch it), the live worker
/// applies acme's commands after the cutover, and nothing is
/// dead-lettered. A tenant in the shared indexes, and the embedded
/// index, are refused, and so is a rebuild of every tenant meanwhile.
#[test]
fn a_tenant_is_rebuilt_alone_while_every_tenant_is_served_and_updated_on_elasticsearch() {
    let (r, w) = acme_dedicated_with_three_tenants();
    let (url, prefix) = (r.index.display().to_string(), crate::common::elastic::prefix());
    corrupt_own(&r, ("acme", "files"), "f1", serde_json::json!({"contents": "changed behind the pipeline's back"}));
    crate::verify::corrupt(&r, "globex\u{1f}f1", "globex\u{1f}/docs", "changed behind the pipeline's back");

    // Refused: a tenant in the shared indexes; the embedded index.
    let (code, _, err) = r.run(&["rebuild", "--tenant", "globex", "--metrics-addr", "127.0.0.1:0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("tenant globex is in the shared indexes of generation 0"), "{err}");
    let (code, _, err) = output(cli(&r.cfg, &r.group, &r.dir().join("embedded")).args(["rebuild", "--tenant", "acme"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the embedded index keeps every tenant in one placement"), "{err}");

    // Every tenant writes during the rebuild: 20 files each, and acme
    // renames a directory.
    let during = r.dir().join("during.jsonl");
    let mut lines = Vec::new();
    for i in 0..20 {
        for t in [None, Some("acme"), Some("globex")] {
            let tenant = t.map_or(String::new(), |t| format!(r#","tenant":"{t}""#));
            lines.push(format!(r#"{{"op":"upsert_file","id":"n{i}","path":"/new/n{i}.txt","contents":"during words"{tenant}}}"#));
        }
        if i == 10 {
            lines.push(r#"{"op":"rename","from":"/docs/d1","to":"/docs/e1","tenant":"acme"}"#.to_string());
        }
    }
    std::fs::write(&during, lines.join("\n")).unwrap();
    // The rebuild is held once it has fenced the live worker off acme's
    // indexes: acme's commands sent then wait (the worker's writes fail as
    // "index gone" and are retried) and are applied after the cutover.
    // (Sent without waiting for them to be applied: a partition holding
    // one of acme's commands waits while the rebuild is held.)
    let child = crate::rebuild::rebuild_in(&r, "tenant-faults", &[("rebuild.caught-up", ""), ("rebuild.fenced", "")], &["--tenant", "acme"]);
    let produced = r.run(&["produce", "--jsonl", during.to_str().unwrap()]);
    assert_eq!(produced.0, 0, "{}", produced.2);
    // Between the rebuild's catch-up and its fence, the live worker
    // applies one of acme's files to the current revision, and commits it:
    // the new revision must have it too. (The rebuild builds on after its
    // fence until it has what the live worker committed; its own worker
    // reads on meanwhile, so this passes without that too: a test that
    // makes the rebuild's worker lag at that moment is not written.)
    let reached = r.dir().join("tenant-faults").join("rebuild.caught-up.reached");
    eventually(std::time::Duration::from_secs(120), || "the rebuild never caught up".into(), || reached.exists().then_some(()));
    let (code, _, err) = r.run(&["produce", "--tenant", "acme", "--wait", "120", "upsert-file", "--id", "c1", "--path", "/caught/c1.txt", "--contents", "caught words"]);
    assert_eq!(code, 0, "{err}\n{}", w.log());
    std::fs::remove_file(r.dir().join("tenant-faults").join("rebuild.caught-up")).unwrap();
    let reached = r.dir().join("tenant-faults").join("rebuild.fenced.reached");
    eventually(std::time::Duration::from_secs(120), || "the rebuild never fenced".into(), || reached.exists().then_some(()));
    let fenced = r.dir().join("fenced.jsonl");
    let held = [r#"{"op":"upsert_file","id":"h1","path":"/docs/e0/h1.txt","contents":"fenced words","tenant":"acme"}"#, r#"{"op":"rename","from":"/docs/e0","to":"/docs/f0","tenant":"acme"}"#];
    std::fs::write(&fenced, held.join("\n")).unwrap();
    let (code, _, err) = r.run(&["produce", "--jsonl", fenced.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(w.wait_for_log("index gone", std::time::Duration::from_secs(60)), "the live worker was not fenced off acme's indexes:\n{}", w.log());
    // The other tenants' commits are still published: the refresh that
    // makes a commit searchable does not fail on acme's fenced aliases.
    assert!(!w.wait_for_log("making the last commit searchable failed", std::time::Duration::from_secs(3)), "{}", w.log());
    // Searches are served meanwhile, acme's from its current indexes.
    assert_eq!(search(&r, Some("globex"), &["files", "--under", "/papers"]).len(), 5);
    assert!(search(&r, Some("acme"), &["files", "--dir", "/docs/f0"]).is_empty(), "acme's rename sent while fenced is not applied yet");
    // A rebuild of every tenant waits for it.
    let (code, _, err) = r.run(&["rebuild", "--metrics-addr", "127.0.0.1:0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("a rebuild of tenant acme's own indexes is in progress"), "{err}");
    // `rebuild --status` shows it.
    assert_eq!(tenant_rebuilds(&r), serde_json::json!(["acme"]));
    std::fs::remove_file(r.dir().join("tenant-faults").join("rebuild.fenced")).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}\n{}", w.log());
    assert!(stdout.contains("rebuilt tenant acme's indexes as revision 1"), "{stdout}");
    assert!(stderr.contains("the live workers are fenced off the tenant's indexes"), "{stderr}");
    // After the cutover: the live worker applies acme's commands to the
    // new revision.
    let after = r.dir().join("after.jsonl");
    std::fs::write(&after, r#"{"op":"upsert_file","id":"a9","path":"/docs/a9.txt","contents":"after words","tenant":"acme"}"#).unwrap();
    let (code, _, err) = r.run(&["produce", "--wait", "120", "--jsonl", after.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}\n{}", w.log());

    let (own, rebuilt_own) = (format!("{prefix}-t-acme-files-000001"), format!("{prefix}-t-acme-files-000001-r1"));
    assert_eq!(count_of(&url, &own, "acme"), None, "the replaced revision is deleted");
    assert_eq!(count_of(&url, &rebuilt_own, "acme"), Some(5 + 20 + 1 + 1 + 1));
    assert_eq!(shown_through(&url, &format!("{prefix}-t-acme-files"), "acme"), 28);
    assert_eq!(search(&r, Some("acme"), &["files", "--under", "/caught"]).len(), 1, "acme's file applied live between the catch-up and the fence");
    let renamed = search(&r, Some("acme"), &["files", "--dir", "/docs/e1"]);
    assert_eq!(renamed.len(), 2, "acme's rename during the rebuild: {renamed:?}");
    let moved = search(&r, Some("acme"), &["files", "--dir", "/docs/f0"]);
    assert_eq!(moved.len(), 4, "acme's file and rename sent while fenced, applied after the cutover: {moved:?}");
    verify_is_clean(&r, &["--tenant", "acme"], 5 + 20 + 1 + 1 + 1 + 3);
    let (code, out, err) = r.run(&["verify", "--tenant", "globex", "--json"]);
    let globex = report_of(code, &out, &err);
    assert_eq!((code, globex["differences_total"].as_u64()), (1, Some(1)), "globex's change is not the rebuild's to mend: {globex}");
    assert_eq!(r.dlq_count()["total"], 0, "nothing dead-lettered while the live worker was fenced");
    drop(w);
}

/// A tenant's rebuild killed between its cutover's aliases and the
/// placement's record of them: `--abandon` refuses (it would delete the
/// indexes the live workers now write), and running the rebuild again
/// finishes the cutover.
#[test]
fn a_tenants_rebuild_killed_in_its_cutover_is_finished_by_running_it_again_on_elasticsearch() {
    let (r, w) = acme_dedicated_with_three_tenants();
    let (url, prefix) = (r.index.display().to_string(), crate::common::elastic::prefix());
    let killed = crate::rebuild::rebuild_in(&r, "tenant-faults", &[("rebuild.tenant-aliases", "")], &["--tenant", "acme"]).wait_with_output().unwrap();
    assert!(!killed.status.success(), "{}", String::from_utf8_lossy(&killed.stderr));
    let (code, _, err) = r.run(&["rebuild", "--tenant", "acme", "--abandon"]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("cut over to revision 1 already"), "{err}");
    let (code, out, err) = r.run(&["rebuild", "--tenant", "acme", "--metrics-addr", "127.0.0.1:0"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("revision 1"), "{out}");
    assert_eq!(count_of(&url, &format!("{prefix}-t-acme-files-000001"), "acme"), None, "the replaced revision is deleted");
    assert_eq!(count_of(&url, &format!("{prefix}-t-acme-files-000001-r1"), "acme"), Some(5));
    let (code, out, err) = r.run(&["rebuild", "--tenant", "acme", "--abandon"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("no rebuild of tenant acme in progress"), "{out}");
    verify_is_clean(&r, &["--tenant", "acme"], 8);

    // A rebuild of acme and one of every tenant started at the same moment:
    // each reads the other's record (none yet), then records its state,
    // then reads the other's again (both held at each step). They do not
    // both go on: released first, the rebuild of every tenant sees acme's
    // and refuses, withdrawing its own; then acme's goes on. (Before, each
    // read the other's record only before recording its own: both went on.)
    let faults = [("rebuild.checked", ""), ("rebuild.begun", "")];
    let tenant = crate::rebuild::rebuild_in(&r, "race-tenant", &faults, &["--tenant", "acme"]);
    let whole = crate::rebuild::rebuild_in(&r, "race-whole", &faults, &[]);
    let step = |dir: &str, point: &str| {
        let reached = r.dir().join(dir).join(format!("{point}.reached"));
        eventually(std::time::Duration::from_secs(60), || format!("{dir}: never reached {point}"), || reached.exists().then_some(()));
    };
    let both = ["race-tenant", "race-whole"];
    both.iter().for_each(|dir| step(dir, "rebuild.checked"));
    both.iter().for_each(|dir| std::fs::remove_file(r.dir().join(dir).join("rebuild.checked")).unwrap());
    both.iter().for_each(|dir| step(dir, "rebuild.begun"));
    std::fs::remove_file(r.dir().join("race-whole").join("rebuild.begun")).unwrap();
    let out = whole.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "the rebuild of every tenant went on beside acme's: {err}");
    assert!(err.contains("a rebuild of tenant acme's own indexes is in progress"), "{err}");
    std::fs::remove_file(r.dir().join("race-tenant").join("rebuild.begun")).unwrap();
    let out = tenant.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("revision 2"), "{}", String::from_utf8_lossy(&out.stdout));
    let (code, out, err) = r.run(&["rebuild", "--status", "--json"]);
    assert_eq!(code, 0, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((&status["rebuild"], &status["tenant_rebuilds"]), (&serde_json::Value::Null, &serde_json::json!([])), "{out}");

    // Killed after the cutover's record, before its clean-up: run again,
    // it cleans up. (Before, the run again took the recorded revision for
    // its target: it fenced the live worker off it, "cut over" from
    // revision 3 to itself, and deleted revision 3, the tenant's live
    // indexes, exiting 0.)
    let killed = crate::rebuild::rebuild_in(&r, "tenant-faults", &[("rebuild.tenant-recorded", "")], &["--tenant", "acme"]).wait_with_output().unwrap();
    assert!(!killed.status.success(), "{}", String::from_utf8_lossy(&killed.stderr));
    let (code, out, err) = r.run(&["rebuild", "--tenant", "acme", "--metrics-addr", "127.0.0.1:0"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("revision 3"), "{out}");
    assert!(err.contains("the cutover was recorded: cleaning up"), "{err}");
    assert_eq!(count_of(&url, &format!("{prefix}-t-acme-files-000001-r2"), "acme"), None, "the replaced revision is deleted");
    assert_eq!(count_of(&url, &format!("{prefix}-t-acme-files-000001-r3"), "acme"), Some(5));
    assert_eq!(tenant_rebuilds(&r), serde_json::json!([]));
    verify_is_clean(&r, &["--tenant", "acme"], 8);
    drop(w);
}

/// A tenant in the shared indexes moves into indexes of its own by a
/// rebuild of that tenant alone (`rebuild --tenant globex`, globex named in
/// `DENORM_ES_DEDICATED_TENANTS`), while the live worker started with the
/// old configuration applies every tenant. The placement records globex
/// as moving first; a globex file applied by the live worker then (its
/// shard opened before) reaches the new indexes too. Once the live worker
/// has reopened on its `PLACE` message, its writes of globex wait for the
/// cutover, while searches still read globex in the shared indexes. After
/// the cutover, globex's documents are in its own indexes only, each
/// found once by every search, and the shared read alias hides globex.
#[test]
fn a_shared_tenant_moves_into_its_own_indexes_alone_while_every_tenant_is_served_on_elasticsearch() {
    let (r, w) = acme_dedicated_with_three_tenants();
    let (url, prefix) = (r.index.display().to_string(), crate::common::elastic::prefix());
    let (code, _, err) = r.run(&["tenant", "alias", "globex"]);
    assert_eq!(code, 0, "{err}");
    let (shared, own) = (format!("{prefix}-files-000001"), format!("{prefix}-t-globex-files-000001-r1"));

    let faults = [("rebuild.placed", ""), ("rebuild.fenced", ""), ("rebuild.cut-over", "")];
    let child = crate::rebuild::rebuild_with_env(&r, "move-faults", &faults, &["--tenant", "globex"], &[(DEDICATED, "acme,globex")]);
    let dir = r.dir().join("move-faults");
    let step = |point: &str| {
        let reached = dir.join(format!("{point}.reached"));
        eventually(std::time::Duration::from_secs(120), || format!("the move never reached {point}"), || reached.exists().then_some(()));
    };
    // Placed, not yet announced: the live worker still writes globex to
    // the shared indexes, and the rebuild must have that file too.
    step("rebuild.placed");
    let (code, _, err) = r.run(&["produce", "--tenant", "globex", "--wait", "120", "upsert-file", "--id", "p1", "--path", "/placed/p1.txt", "--contents", "placed words"]);
    assert_eq!(code, 0, "{err}\n{}", w.log());
    assert_eq!(count_of(&url, &shared, "globex"), Some(6));
    // Announced, and the live worker held before its PLACE message: the
    // fence waits for it (it failed to when the wait was skipped).
    r.on_fault("apply.place", "");
    std::fs::remove_file(dir.join("rebuild.placed")).unwrap();
    step("rebuild.awaits-acks");
    let held = r.faults_dir().join("apply.place.reached");
    eventually(std::time::Duration::from_secs(60), || "the live worker never reached its PLACE message".to_string(), || held.exists().then_some(()));
    assert!(!dir.join("rebuild.fenced.reached").exists(), "fenced while a live writer had not taken the placement");
    r.off_fault("apply.place");
    step("rebuild.fenced");
    assert!(w.wait_for_log("reopening the shard to read the placement", std::time::Duration::from_secs(10)), "{}", w.log());
    // Fenced: globex's commands wait; searches read it in the shared
    // indexes meanwhile.
    let fenced = r.dir().join("fenced.jsonl");
    let held =
        [r#"{"op":"upsert_file","id":"h1","path":"/papers/d0/h1.txt","contents":"fenced words","tenant":"globex"}"#, r#"{"op":"rename","from":"/papers/d0","to":"/papers/f0","tenant":"globex"}"#];
    std::fs::write(&fenced, held.join("\n")).unwrap();
    let (code, _, err) = r.run(&["produce", "--jsonl", fenced.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(w.wait_for_log("index gone", std::time::Duration::from_secs(60)), "the live worker was not fenced off globex's shared documents:\n{}", w.log());
    assert_eq!(count_of(&url, &shared, "globex"), Some(6), "nothing more of globex in the shared indexes");
    assert_eq!(search(&r, Some("globex"), &["files", "--under", "/placed"]).len(), 1);
    assert_eq!(tenant_rebuilds(&r), serde_json::json!(["globex"]));
    std::fs::remove_file(dir.join("rebuild.fenced")).unwrap();
    // Cut over, not cleaned up: globex's documents are in both places,
    // and every search finds each once (through the read alias, and by
    // the indexes' names: a verify's dump).
    step("rebuild.cut-over");
    assert_eq!(count_of(&url, &shared, "globex"), Some(6));
    each_tenant_finds_its_files(&r, "globex cut over, its shared documents not deleted yet");
    verify_is_clean(&r, &["--tenant", "globex"], 5 + 1 + 1 + 3);
    std::fs::remove_file(dir.join("rebuild.cut-over")).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}\n{}", w.log());
    assert!(stdout.contains("moved tenant globex from the shared indexes into indexes of its own as revision 1"), "{stdout}");

    // After the cutover: the live worker writes globex to its own indexes.
    produce_after(&r, &w, "globex");
    assert_matches_topic_model(&r.cfg, &r.index);
    assert_eq!(count_of(&url, &shared, "globex"), Some(0), "globex's documents in the shared indexes are deleted");
    assert_eq!(count_of(&url, &own, "globex"), Some(5 + 1 + 1 + 1));
    assert_eq!(shown_through(&url, &format!("{prefix}-t-globex-files"), "globex"), 8);
    let (_, aliases) = get(&url, &format!("_alias/{prefix}-t-globex-files"));
    assert_eq!(aliases.as_object().unwrap().keys().collect::<Vec<_>>(), [&own], "globex's alias is on its own index only: {aliases}");
    let (_, read) = get(&url, &format!("_alias/{prefix}-files"));
    assert!(read[&shared]["aliases"][format!("{prefix}-files")]["filter"].to_string().contains("globex"), "the shared read alias hides globex: {read}");
    each_tenant_finds_its_files(&r, "after globex moved");
    assert_eq!(search(&r, Some("globex"), &["files", "--dir", "/papers/f0"]).len(), 4, "globex's rename sent while fenced, applied after the cutover");
    verify_is_clean(&r, &["--tenant", "globex"], 5 + 1 + 1 + 1 + 3);
    verify_is_clean(&r, &[], 24 + 1 + 1 + 1);
    assert_eq!(tenant_rebuilds(&r), serde_json::json!([]));
    drop(w);
}

/// A move of a shared tenant given up after its fence (`rebuild --tenant
/// globex --abandon`, the rebuild killed while fenced): the placement puts
/// globex back in the shared indexes, the live worker's waiting writes of
/// it reopen its shard with that placement and go there, and the new
/// indexes are deleted.
#[test]
fn a_shared_tenants_move_given_up_after_its_fence_leaves_it_shared_on_elasticsearch() {
    let (r, w) = acme_dedicated_with_three_tenants();
    let (url, prefix) = (r.index.display().to_string(), crate::common::elastic::prefix());
    let (shared, own) = (format!("{prefix}-files-000001"), format!("{prefix}-t-globex-files-000001-r1"));
    let mut child = crate::rebuild::rebuild_with_env(&r, "move-faults", &[("rebuild.fenced", "")], &["--tenant", "globex"], &[(DEDICATED, "acme,globex")]);
    let reached = r.dir().join("move-faults").join("rebuild.fenced.reached");
    eventually(std::time::Duration::from_secs(120), || "the move never fenced".into(), || reached.exists().then_some(()));
    child.kill().unwrap();
    child.wait().unwrap();
    // Sent while fenced: waits until the move is given up.
    let fenced = r.dir().join("fenced.jsonl");
    std::fs::write(&fenced, r#"{"op":"upsert_file","id":"h1","path":"/papers/d0/h1.txt","contents":"fenced words","tenant":"globex"}"#).unwrap();
    let (code, _, err) = r.run(&["produce", "--jsonl", fenced.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(w.wait_for_log("index gone", std::time::Duration::from_secs(60)), "{}", w.log());
    let (code, out, err) = r.run(&["rebuild", "--tenant", "globex", "--abandon"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("gave up the rebuild of revision 1 of tenant globex"), "{out}");
    produce_after(&r, &w, "globex");
    assert_matches_topic_model(&r.cfg, &r.index);
    assert_eq!(count_of(&url, &shared, "globex"), Some(5 + 1 + 1), "globex's writes went on in the shared indexes");
    assert_eq!(count_of(&url, &own, "globex"), None, "the new indexes are deleted");
    each_tenant_finds_its_files(&r, "after the move was given up");
    verify_is_clean(&r, &["--tenant", "globex"], 5 + 1 + 1 + 3);
    assert_eq!(tenant_rebuilds(&r), serde_json::json!([]));
    drop(w);
}

/// A dedicated tenant moves into the shared indexes alone (`rebuild
/// --tenant acme --to-shared`, acme out of the configuration), while the
/// live worker started with acme configured applies every tenant. The
/// rebuild writes acme into the shared indexes, hidden there from every
/// search until the cutover; its fence is a dedicated tenant's (its own
/// write aliases removed). After it, acme's documents are in the shared
/// indexes only, its alias is the filtered one there, its own indexes are
/// deleted, and every search finds each document once. Refused for a
/// shared tenant, and while the configuration names the tenant.
#[test]
fn a_dedicated_tenant_moves_into_the_shared_indexes_alone_on_elasticsearch() {
    let (r, w) = acme_dedicated_with_three_tenants();
    let (url, prefix) = (r.index.display().to_string(), crate::common::elastic::prefix());
    let (shared, own) = (format!("{prefix}-files-000001"), format!("{prefix}-t-acme-files-000001"));
    let (code, _, err) = r.run(&["rebuild", "--tenant", "globex", "--to-shared", "--metrics-addr", "127.0.0.1:0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("tenant globex is in the shared indexes of generation 0 already"), "{err}");
    let (code, _, err) = output(cli(&r.cfg, &r.group, &r.index).env(DEDICATED, "acme").args(["rebuild", "--tenant", "acme", "--to-shared", "--metrics-addr", "127.0.0.1:0"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("DENORM_ES_DEDICATED_TENANTS names tenant acme"), "{err}");

    // Rebuilt into the shared indexes, hidden there: every search finds
    // acme's documents once, in its own indexes.
    let child = acme_leaving_held(&r, &shared);
    each_tenant_finds_its_files(&r, "acme rebuilt into the shared indexes, not cut over");
    assert_eq!(shown_through(&url, &format!("{prefix}-t-acme-files"), "acme"), 5);
    // A file of acme sent while fenced waits for the cutover.
    let fenced = r.dir().join("fenced.jsonl");
    std::fs::write(&fenced, r#"{"op":"upsert_file","id":"h1","path":"/docs/e0/h1.txt","contents":"fenced words","tenant":"acme"}"#).unwrap();
    let (code, _, err) = r.run(&["produce", "--jsonl", fenced.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(w.wait_for_log("index gone", std::time::Duration::from_secs(60)), "{}", w.log());
    std::fs::remove_file(r.dir().join("leave-faults").join("rebuild.fenced")).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}\n{}", w.log());
    assert!(stdout.contains("moved tenant acme from its own indexes into the shared ones"), "{stdout}");

    produce_after(&r, &w, "acme");
    assert_matches_topic_model(&r.cfg, &r.index);
    assert_eq!(count_of(&url, &shared, "acme"), Some(5 + 1 + 1), "acme's documents are in the shared indexes");
    assert_eq!(count_of(&url, &own, "acme"), None, "acme's own indexes are deleted");
    assert_eq!(shown_through(&url, &format!("{prefix}-t-acme-files"), "acme"), 7);
    let (_, aliases) = get(&url, &format!("_alias/{prefix}-t-acme-files"));
    assert_eq!(aliases.as_object().unwrap().keys().collect::<Vec<_>>(), [&shared], "acme's alias is on the shared index only: {aliases}");
    each_tenant_finds_its_files(&r, "after acme moved into the shared indexes");
    verify_is_clean(&r, &["--tenant", "acme"], 8 + 2);
    verify_is_clean(&r, &[], 24 + 2);
    assert_eq!(tenant_rebuilds(&r), serde_json::json!([]));
    drop(w);
}

/// A move into the shared indexes given up after its fence (the rebuild
/// killed, then `--abandon`): what it wrote into the shared indexes is
/// deleted, the live worker gets acme's write aliases back, and acme stays
/// in its own indexes.
#[test]
fn a_move_into_the_shared_indexes_given_up_leaves_the_tenant_in_its_own_on_elasticsearch() {
    let (r, w) = acme_dedicated_with_three_tenants();
    let (url, prefix) = (r.index.display().to_string(), crate::common::elastic::prefix());
    let (shared, own) = (format!("{prefix}-files-000001"), format!("{prefix}-t-acme-files-000001"));
    let mut child = acme_leaving_held(&r, &shared);
    // The rebuild's last write lands just before it is killed: written,
    // not refreshed yet (Elasticsearch's `_delete_by_query` deletes what
    // the last refresh shows).
    let late = rt().block_on(async {
        let doc = serde_json::json!({"id": "f0", "name": "f0.txt", "path": "/docs/e0", "contents": "late words", "tenant": "acme"});
        reqwest::Client::new().put(format!("{url}/{shared}/_doc/acme%1Ff0?routing=acme")).json(&doc).send().await.unwrap().status().as_u16()
    });
    assert_eq!(late, 200, "the late write");
    child.kill().unwrap();
    child.wait().unwrap();
    let (code, out, err) = r.run(&["rebuild", "--tenant", "acme", "--abandon"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("gave up the rebuild of revision 1 of tenant acme"), "{out}");
    produce_after(&r, &w, "acme");
    assert_eq!(count_of(&url, &shared, "acme"), Some(0), "what the move wrote into the shared indexes is deleted");
    assert_eq!(count_of(&url, &own, "acme"), Some(6));
    assert_eq!(shown_through(&url, &format!("{prefix}-t-acme-files"), "acme"), 6);
    let (_, read) = get(&url, &format!("_alias/{prefix}-files"));
    assert!(!read[&shared]["aliases"][format!("{prefix}-files")]["filter"].to_string().contains("acme"), "the shared read alias hides acme no more: {read}");
    each_tenant_finds_its_files(&r, "after the move into the shared indexes was given up");
    verify_is_clean(&r, &["--tenant", "acme"], 8 + 1);

    // The move again, killed after its cutover's record: acme is shared,
    // its own indexes are left, and so is the rebuild's state. Run again
    // (without --to-shared, as acme is shared now), it cleans up.
    let killed = crate::rebuild::rebuild_in(&r, "leave-faults", &[("rebuild.tenant-recorded", "")], &["--tenant", "acme", "--to-shared"]).wait_with_output().unwrap();
    assert!(!killed.status.success(), "{}", String::from_utf8_lossy(&killed.stderr));
    assert_eq!(tenant_rebuilds(&r), serde_json::json!(["acme"]));
    let (code, out, err) = r.run(&["rebuild", "--tenant", "acme", "--metrics-addr", "127.0.0.1:0"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("the cutover was recorded: cleaning up"), "{err}");
    assert!(out.contains("rebuilt tenant acme"), "{out}");
    assert_eq!(count_of(&url, &own, "acme"), None, "acme's own indexes are deleted");
    assert_eq!(count_of(&url, &shared, "acme"), Some(6));
    assert_eq!(tenant_rebuilds(&r), serde_json::json!([]));
    produce_after(&r, &w, "acme");
    each_tenant_finds_its_files(&r, "after the move into the shared indexes was finished by running it again");
    verify_is_clean(&r, &["--tenant", "acme"], 8 + 1);
    drop(w);
}

/// A `PLACE` control that names a placement move the index never recorded
/// (any producer can write one) would have the live worker reopen its
/// shard for ever: the shard is reopened once to read the placement
/// afresh, then the control is dead-lettered as `invalid_control`, parking
/// nothing, and the partition's commands after it are applied.
#[test]
fn a_place_naming_a_move_never_recorded_is_dead_lettered_on_elasticsearch() {
    use denorm::command::control::{Action, Control};
    let r = Rig::elastic(1);
    let w = r.worker(&[]);
    let before = produce(&r.cfg, vec![Command::UpsertFile { id: "a".into(), path: "/p/a.txt".into(), contents: "before".into(), previous_path: None }]);
    wait_applied_by(&r.cfg, &r.group, before.len(), &[&w]);
    let place =
        Control { action: Action::Place, key: String::new(), dlq_partition: -1, dlq_offset: -1, through: 1_000_000_000, origin_offset: 0, payload: Vec::new(), requested_at: 0, through_at: -1 };
    send_raw(&r.cfg, &[(None, denorm::codec::Codec::new().encode_control(&place))]);
    let after = produce(&r.cfg, vec![Command::UpsertFile { id: "b".into(), path: "/p/b.txt".into(), contents: "after".into(), previous_path: None }]);
    wait_applied_by(&r.cfg, &r.group, 3, &[&w]);
    let mut ids: Vec<String> = dump(&r.index).iter().map(|d| d.id().to_string()).collect();
    ids.sort();
    assert_eq!(ids, vec!["a", "b"], "the command after the control applied ({after:?})");
    let count = r.dlq_count();
    assert_eq!((count["total"].as_u64(), count["by_reason"]["invalid_control"].as_u64()), (Some(1), Some(1)), "{count}\n{}", w.log());
}
