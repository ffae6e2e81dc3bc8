//! Tenants (issue 47) against a real broker, on both backends: three
//! tenants (the default one, `acme`, `globex`) write the same paths, file
//! ids, user ids and post ids; each renames, moves or renames a profile of
//! its own. The index equals the model of the topic, and no search the CLI
//! offers returns another tenant's document.

use crate::common::*;

const TENANTS: [Option<&str>; 3] = [None, Some("acme"), Some("globex")];

fn name(t: Option<&str>) -> &str {
    t.unwrap_or("default")
}

/// Every tenant's commands as JSONL lines: the same documents, with
/// contents, bodies and author names that name the tenant.
fn lines() -> Vec<String> {
    let mut out = Vec::new();
    for t in TENANTS {
        let n = name(t);
        let tenant = t.map_or(String::new(), |t| format!(r#","tenant":"{t}""#));
        for i in 0..5 {
            out.push(format!(r#"{{"op":"upsert_file","id":"f{i}","path":"/docs/d{}/f{i}.txt","contents":"shared words mark-{n}"{tenant}}}"#, i % 2));
        }
        out.push(format!(r#"{{"op":"upsert_user","id":"1","name":"John {n}","email":"j@{n}.example","dob":"1970-01-01"{tenant}}}"#));
        for p in 1..=2 {
            out.push(format!(r#"{{"op":"upsert_post","id":"p{p}","user_id":"1","title":"relationships {p}","body":"mark-{n}"{tenant}}}"#));
        }
    }
    // Each tenant changes its own: a rename within /docs, a move of the
    // whole tree to another key, a profile change.
    out.push(r#"{"op":"rename","from":"/docs/d0","to":"/docs/e0","tenant":"acme"}"#.to_string());
    out.push(r#"{"op":"rename","from":"/docs","to":"/papers","tenant":"globex"}"#.to_string());
    out.push(r#"{"op":"upsert_user","id":"1","name":"Johnny default","email":"j@default.example","dob":"1970-01-01"}"#.to_string());
    out
}

/// `denorm search` as tenant `t` sees it: the JSON lines it printed.
pub(crate) fn search(r: &Rig, t: Option<&str>, args: &[&str]) -> Vec<serde_json::Value> {
    let tenant: Vec<&str> = match t {
        Some(t) => vec!["--tenant", t],
        None => vec!["--default-tenant"],
    };
    // Every match (a group-by, 100 authors: noida-db has no composite
    // aggregation, which every author takes on Elasticsearch).
    let limit = if args.contains(&"--group-by-author") { "100" } else { "0" };
    let all: Vec<&str> = ["search"].into_iter().chain(tenant).chain(args.iter().copied()).chain(["--json", "--limit", limit]).collect();
    let (code, out, err) = r.run(&all);
    assert_eq!(code, 0, "{all:?}: {err}");
    json_lines(&out)
}

#[test]
fn three_tenants_with_the_same_paths_and_ids_never_meet() {
    three_tenants_with_the_same_paths_and_ids_never_meet_on(Rig::new(3));
}

#[test]
fn three_tenants_with_the_same_paths_and_ids_never_meet_on_elasticsearch() {
    three_tenants_with_the_same_paths_and_ids_never_meet_on(Rig::elastic(3));
}

/// [`lines`] in a JSONL file of the test's, for `denorm produce --jsonl`.
pub(crate) fn lines_file(r: &Rig) -> String {
    let jsonl = r.dir().join("tenants.jsonl");
    std::fs::write(&jsonl, lines().join("\n")).unwrap();
    jsonl.to_str().unwrap().to_string()
}

fn three_tenants_with_the_same_paths_and_ids_never_meet_on(r: Rig) {
    let w = r.worker(&[]);
    let (code, _, err) = r.run(&["produce", "--wait", "120", "--jsonl", &lines_file(&r)]);
    assert_eq!(code, 0, "{err}\n{}", w.log());
    let (moves, _) = assert_matches_topic_model(&r.cfg, &r.index);
    assert_eq!(moves, 1, "globex's tree moved");

    // Every search the CLI offers, as each tenant: only its own documents,
    // as many as it has.
    for t in TENANTS {
        let mark = format!("mark-{}", name(t));
        let files = |args: &[&str], want: usize| {
            let got = search(&r, t, &[&["files"], args].concat());
            assert_eq!(got.len(), want, "{t:?} files {args:?}: {got:?}");
            for f in &got {
                assert_eq!(f["contents"], format!("shared words {mark}"), "{t:?} files {args:?} found another tenant's: {f}");
                assert!(!f["path"].as_str().unwrap().contains('\u{1f}') && !f["id"].as_str().unwrap().contains('\u{1f}'), "{f}");
            }
        };
        let (under_docs, in_d1) = match t {
            Some("globex") => (0, 0),
            _ => (5, 2),
        };
        files(&["--under", "/docs"], under_docs);
        files(&["--dir", "/docs/d1"], in_d1);
        files(&["--text", "shared"], 5);
        files(&["--text", "shared", "--under", "/papers"], if t == Some("globex") { 5 } else { 0 });
        let posts = |args: &[&str]| {
            let got = search(&r, t, &[&["posts"], args].concat());
            assert_eq!(got.len(), 2, "{t:?} posts {args:?}: {got:?}");
            for p in &got {
                assert_eq!(p["body"], mark, "{t:?} posts {args:?} found another tenant's: {p}");
                assert_eq!(p["user"]["id"], "1");
            }
            got
        };
        let author = if t.is_none() { "Johnny default".to_string() } else { format!("John {}", name(t)) };
        for p in posts(&["--text", "relationships"]) {
            assert_eq!(p["user"]["name"], author.as_str(), "a profile change reached another tenant's posts, or missed its own");
        }
        // Words every tenant's authors share: unfiltered, it would match
        // them all.
        posts(&["--author", &format!("{author} John")]);
        let groups = search(&r, t, &["posts", "--text", "relationships", "--group-by-author"]);
        assert_eq!(groups.len(), 1, "{t:?}: {groups:?}");
        assert_eq!(groups[0]["author"], author.as_str());
        assert!(groups[0]["posts"].as_array().unwrap().iter().all(|p| p["body"] == mark.as_str()), "{groups:?}");
    }

    // The worker's log shows a tenant's key as its producer wrote it,
    // with the tenant beside it, never the separator.
    let log = w.log();
    assert!(log.contains(r#"command="rename" key="/docs (tenant acme)""#), "{log}");
    assert!(!log.contains('\u{1f}') && !log.contains("u{1f}"), "{log}");

    // `verify --tenant`: a document of acme's changed behind the
    // pipeline's back is acme's difference, and no other tenant's.
    drop(w);
    crate::verify::corrupt(&r, "acme\u{1f}f1", "acme\u{1f}/docs", "changed behind the pipeline's back");
    let verify = |t: &str| {
        let (code, out, err) = r.run(&["verify", "--tenant", t, "--json"]);
        (code, report_of(code, &out, &err))
    };
    let (code, acme) = verify("acme");
    assert_eq!(code, 1, "{acme}");
    assert_eq!(acme["differences_total"], 1, "{acme}");
    assert_eq!(acme["tenant"], "acme", "{acme}");
    assert_eq!((&acme["differences"][0]["tenant"], &acme["differences"][0]["id"]), (&serde_json::json!("acme"), &serde_json::json!("f1")), "shown as its producer wrote it: {acme}");
    // Five files, a user and two posts each (the differing one among them).
    assert_eq!(acme["checked"], 8, "{acme}");
    let (code, globex) = verify("globex");
    assert_eq!((code, globex["checked"].as_u64()), (0, Some(8)), "{globex}");
    let (code, out, err) = r.run(&["verify", "--json"]);
    let all = report_of(code, &out, &err);
    assert_eq!((code, all["differences_total"].as_u64()), (1, Some(1)), "every tenant at once: {all}");

    // Once tenants exist, a search names its tenant.
    let (code, _, err) = r.run(&["search", "files", "--text", "shared"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("\"acme\", \"globex\"") && err.contains("--tenant"), "{err}");
    let (code, _, err) = r.run(&["search", "--tenant", "Acme", "files", "--text", "shared"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("a-z, 0-9"), "{err}");
}

fn file(id: &str, path: &str, tenant: &str) -> denorm::command::Command {
    denorm::command::Command::UpsertFile { id: s(id), path: s(path), contents: format!("mark-{tenant}"), previous_path: None }.scoped(Some(tenant))
}

/// `denorm dlq ... --tenant`: a poison in `acme`'s `/docs` parks that key
/// only; its letters are counted, listed and released as `acme`'s, with
/// the key as the producer wrote it.
#[test]
fn a_tenants_dead_letters_are_counted_listed_and_released_apart() {
    let r = Rig::new(3);
    let w = r.worker(&[]);
    // In the key's partition, as the producers' partitioner puts it.
    let key = "acme\u{1f}/docs";
    rt().block_on(async {
        use rdkafka::producer::{FutureProducer, FutureRecord};
        let p: FutureProducer = r.cfg.client_config().create().unwrap();
        let partition = denorm::command::partitioner::partition_of(key, r.cfg.partitions);
        let record = FutureRecord::to(&r.cfg.topic).key(key).payload(b"a poison: not an avro message".as_slice()).partition(partition);
        p.send(record, std::time::Duration::from_secs(30)).await.unwrap();
    });
    produce(&r.cfg, vec![file("f1", "/docs/a.txt", "acme"), file("f1", "/docs/a.txt", "globex")]);
    wait_applied(&r.cfg, &r.group, 3);
    let count = |args: &[&str]| {
        let (code, out, err) = r.run(&[&["dlq", "count", "--json"], args].concat());
        report_of(code, &out, &err)["total"].as_u64().unwrap()
    };
    assert_eq!(count(&["--tenant", "acme"]), 2, "the poison and the command parked behind it:\n{}", w.log());
    assert_eq!(count(&["--tenant", "globex"]), 0);
    assert_eq!(count(&[]), 2);
    assert_eq!(count(&["--key", "/docs"]), 0, "the default tenant's /docs has none");
    let (code, out, err) = r.run(&["dlq", "list", "--tenant", "acme", "--key", "/docs", "--json"]);
    assert_eq!(code, 0, "{err}");
    let letters = json_lines(&out);
    assert_eq!(letters.len(), 2, "{out}");
    assert!(letters.iter().all(|e| e["key"] == "/docs" && e["tenant"] == "acme"), "{out}");
    let poison = letters.iter().find(|e| e["reason"] == "not_single_object").unwrap_or_else(|| panic!("{out}"));
    let letter = format!("{}@{}", poison["dlq_partition"], poison["dlq_offset"]);
    let (code, _, err) = r.run(&["dlq", "clear", "--tenant", "acme", "--key", "/docs", "--letter", &letter, "--yes"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("--tenant acme --key /docs"), "the hint names the key as the producer wrote it: {err}");
    let (code, out, err) = r.run(&["dlq", "reprocess", "--tenant", "acme", "--key", "/docs", "--json"]);
    assert_eq!(report_of(code, &out, &err)["still_open"], 0, "{err}");
    let (code, out, err) = r.run(&["search", "--tenant", "acme", "files", "--dir", "/docs", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_lines(&out).len(), 1, "the parked command applied once released: {out}");
    let (code, _, err) = r.run(&["dlq", "count", "--tenant", "ACME"]);
    assert_eq!(code, 2, "{err}");
}

/// `denorm tenant delete` with a key of the tenant parked behind a dead
/// letter: the deletes of that key's documents are parked too, so those
/// documents are left, and it says so (exit 1). Once the letters are
/// released, the deletes are applied in their place and nothing is left.
#[test]
fn a_tenant_delete_reports_what_a_parked_key_left() {
    let r = Rig::new(3);
    let w = r.worker(&[]);
    produce(&r.cfg, vec![file("f1", "/docs/a.txt", "acme"), file("f2", "/other/b.txt", "acme"), file("f1", "/docs/a.txt", "globex")]);
    wait_applied(&r.cfg, &r.group, 3);
    let key = "acme\u{1f}/docs";
    rt().block_on(async {
        use rdkafka::producer::{FutureProducer, FutureRecord};
        let p: FutureProducer = r.cfg.client_config().create().unwrap();
        let partition = denorm::command::partitioner::partition_of(key, r.cfg.partitions);
        let record = FutureRecord::to(&r.cfg.topic).key(key).payload(b"a poison: not an avro message".as_slice()).partition(partition);
        p.send(record, std::time::Duration::from_secs(30)).await.unwrap();
    });
    let (code, out, err) = r.run(&["tenant", "delete", "acme", "--yes", "--wait", "60"]);
    assert_eq!(code, 1, "{out}\n{err}\n{}", w.log());
    let report = &json_lines(&out)[0];
    assert_eq!((&report["deleted"]["files"], &report["left"]), (&serde_json::json!(2), &serde_json::json!(1)), "{out}");
    assert!(err.contains("parked behind a dead letter") && err.contains("dlq count --tenant acme"), "{err}");
    let left = search(&r, Some("acme"), &["files", "--text", "mark"]);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["path"], "/docs", "{left:?}");

    // The poison dropped and the parked delete released: nothing left.
    let (code, out, err) = r.run(&["dlq", "list", "--tenant", "acme", "--json"]);
    assert_eq!(code, 0, "{err}");
    let letters = json_lines(&out);
    let poison = letters.iter().find(|e| e["reason"] == "not_single_object").unwrap_or_else(|| panic!("{out}"));
    let letter = format!("{}@{}", poison["dlq_partition"], poison["dlq_offset"]);
    let (code, _, err) = r.run(&["dlq", "clear", "--tenant", "acme", "--key", "/docs", "--letter", &letter, "--yes"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = r.run(&["dlq", "reprocess", "--tenant", "acme", "--key", "/docs", "--json"]);
    assert_eq!(report_of(code, &out, &err)["still_open"], 0, "{err}");
    let (code, out, err) = r.run(&["tenant", "delete", "acme", "--yes", "--wait", "60"]);
    assert_eq!(code, 0, "{out}\n{err}\n{}", w.log());
    assert_eq!(json_lines(&out)[0]["left"], 0, "{out}");
    assert_eq!(search(&r, Some("globex"), &["files", "--text", "mark"]).len(), 1, "globex's file stays");
}

/// The per-tenant metrics have bounded labels: with `--metrics-tenants 1`,
/// the busy tenant gets series of its own once it has sent 100 commands,
/// the quiet ones and the busy one's first 99 are summed as `_other`, and
/// the default tenant is `_default`.
#[test]
fn a_busy_tenant_gets_series_of_its_own_and_the_others_are_summed() {
    use denorm::command::Command;
    let r = Rig::new(3);
    let w = r.worker(&["--metrics-tenants", "1"]);
    let user = |id: String, t: Option<&str>| Command::UpsertUser { id, name: s("n"), email: s("e@x"), dob: s("1970-01-01") }.scoped(t);
    let mut commands: Vec<Command> = (0..120).map(|i| user(format!("u{i}"), Some("busy"))).collect();
    commands.extend((0..5).map(|i| user(format!("u{i}"), Some("quiet-a"))));
    commands.extend((0..5).map(|i| user(format!("u{i}"), Some("quiet-b"))));
    commands.extend((0..3).map(|i| user(format!("u{i}"), None)));
    produce(&r.cfg, commands);
    wait_applied(&r.cfg, &r.group, 133);
    let applied = |tenant: &str| w.metric("denorm_tenant_commands_total", &[("tenant", tenant), ("outcome", "applied")]);
    assert_eq!(applied("busy"), 21.0, "the 100th and later");
    assert_eq!(applied("_other"), 99.0 + 10.0, "busy's first 99 and the quiet tenants'");
    assert_eq!(applied("_default"), 3.0);
    assert_eq!(applied("quiet-a"), 0.0, "no series of its own");
    assert_eq!(w.metric("denorm_tenant_apply_delay_seconds_count", &[("tenant", "busy")]), 21.0);
}

/// Elasticsearch: `denorm tenant alias acme` puts acme's filtered read
/// aliases on the current generation. Read through them as a tenant's own
/// application would (a plain search request), they hold acme's documents
/// only, stored as its producer wrote them and routed by the tenant; and
/// a rebuild's cutover takes them to the new generation.
#[test]
fn a_tenants_filtered_aliases_read_its_documents_only_and_follow_a_rebuild_on_elasticsearch() {
    let r = Rig::elastic(3);
    let w = r.worker(&[]);
    let jsonl = r.dir().join("tenants.jsonl");
    std::fs::write(&jsonl, lines().join("\n")).unwrap();
    let (code, _, err) = r.run(&["produce", "--wait", "120", "--jsonl", jsonl.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}\n{}", w.log());
    let (code, out, err) = r.run(&["tenant", "alias", "acme"]);
    assert_eq!(code, 0, "{err}");
    let prefix = crate::common::elastic::prefix();
    let names: Vec<&str> = out.lines().collect();
    assert_eq!(names, ["files", "users", "posts"].map(|k| format!("{prefix}-t-acme-{k}")), "{out}");
    let url = r.index.display().to_string();
    let read = |alias: &str| -> Vec<serde_json::Value> {
        let v: serde_json::Value = rt().block_on(async { reqwest::get(format!("{url}/{alias}/_search?size=100")).await.unwrap().json().await.unwrap() });
        v["hits"]["hits"].as_array().unwrap_or_else(|| panic!("{alias}: {v}")).to_vec()
    };
    let check = |when: &str| {
        let files = read(names[0]);
        assert_eq!(files.len(), 5, "{when}: {files:?}");
        for h in &files {
            assert_eq!(h["_source"]["tenant"], "acme", "{when}: {h}");
            assert_eq!(h["_source"]["contents"], "shared words mark-acme", "{when}: {h}");
            assert!(!h["_source"]["id"].as_str().unwrap().contains('\u{1f}') && h["_source"]["path"].as_str().unwrap().starts_with("/docs/"), "stored as the producer wrote it: {h}");
        }
        assert_eq!(read(names[1]).len(), 1, "{when}: acme's user");
        let posts = read(names[2]);
        assert_eq!(posts.len(), 2, "{when}: {posts:?}");
        assert!(posts.iter().all(|h| h["_source"]["body"] == "mark-acme"), "{when}: {posts:?}");
    };
    check("before the rebuild");
    let (code, _, err) = r.run(&["rebuild", "--metrics-addr", "127.0.0.1:0"]);
    assert_eq!(code, 0, "{err}");
    let on: serde_json::Value = rt().block_on(async { reqwest::get(format!("{url}/_alias/{}", names[0])).await.unwrap().json().await.unwrap() });
    let indexes: Vec<&String> = on.as_object().unwrap().keys().collect();
    assert_eq!(indexes, [&format!("{prefix}-files-000002")], "the alias follows the cutover: {on}");
    check("after the rebuild");
    // On the embedded index there are no aliases.
    let (code, _, err) = output(cli(&r.cfg, &r.group, &r.dir().join("embedded")).args(["tenant", "alias", "acme"]));
    assert_eq!(code, 2, "{err}");
}

/// Reading ahead past a flooding tenant, against tansu: a topic of one
/// partition holds a quiet tenant's files interleaved with a noisy
/// tenant's backlog of 3,000 when the worker starts, which commits often
/// (applying slower than reading, as on Elasticsearch). It holds the noisy
/// tenant (its log says so), and the index ends exact: `verify` replays
/// the topic into the model and finds no difference.
#[test]
fn a_flooding_tenant_is_read_ahead_past_and_the_index_ends_exact() {
    a_flooding_tenant_is_read_ahead_past_and_the_index_ends_exact_on(Rig::new(1), &[]);
}

#[test]
fn a_flooding_tenant_is_read_ahead_past_and_the_index_ends_exact_on_elasticsearch() {
    a_flooding_tenant_is_read_ahead_past_and_the_index_ends_exact_on(Rig::elastic(1), &[]);
}

/// A queue of 640 KiB (some 1,400 of these messages; the hold keeps three
/// eighths): the flood does not fit, its messages past the hold are
/// spilled to a file and taken back from it, many times over.
#[test]
fn a_flood_larger_than_the_queue_is_spilled_to_a_file_and_the_index_ends_exact() {
    a_flooding_tenant_is_read_ahead_past_and_the_index_ends_exact_on(Rig::new(1), &["--queue-kb", "640"]);
}

/// With the quiet tenant's commands committed within 20 ms beside the
/// flood (`--tenant-commit-ms`, the embedded index's default, off by
/// default on Elasticsearch): many small commits, and the index still ends
/// exact.
#[test]
fn a_flood_larger_than_the_queue_is_spilled_to_a_file_and_the_index_ends_exact_on_elasticsearch() {
    a_flooding_tenant_is_read_ahead_past_and_the_index_ends_exact_on(Rig::elastic(1), &["--queue-kb", "640", "--tenant-commit-ms", "20"]);
}

fn a_flooding_tenant_is_read_ahead_past_and_the_index_ends_exact_on(r: Rig, args: &[&str]) {
    let mut commands = vec![file("q0", "/q/q0.txt", "quiet")];
    for i in 0..3000 {
        commands.push(file(&format!("n{i}"), &format!("/k{}/n{i}.txt", i % 50), "noisy"));
        if i % 200 == 199 {
            commands.push(file(&format!("q{i}"), &format!("/q/q{i}.txt"), "quiet"));
        }
    }
    let n = commands.len();
    produce(&r.cfg, commands);
    // A commit every 10 commands: applying is slower than reading, as on
    // a remote index (here the embedded index keeps up with tansu, and
    // nothing would be worth reading ahead of).
    let w = r.worker(&[&["--max-batch", "10"], args].concat());
    wait_applied(&r.cfg, &r.group, n);
    let log = w.log();
    assert!(log.contains("reading ahead past this tenant's flood") && log.contains("tenant=\"noisy\""), "the noisy tenant was not held:\n{log}");
    let spilled = log.contains("the flood is larger than the hold");
    assert_eq!(spilled, !args.is_empty(), "read past and again from the broker with a queue of {args:?}:\n{log}");
    // Each command handled once: none taken both as handled before and as
    // read again (the index would skip the second as a duplicate).
    assert_eq!(w.metric("denorm_commands_total", &[("outcome", "applied")]), n as f64, "{log}");
    assert_eq!(w.metric("denorm_commands_total", &[("outcome", "duplicate")]), 0.0, "{log}");
    // Everything read again: nothing is left spilled (the gauge stayed at
    // its last spill before).
    assert_eq!(w.metric("denorm_partition_spilled_messages", &[]), 0.0, "{log}");
    drop(w);
    let (code, out, err) = r.run(&["verify", "--json"]);
    let report = report_of(code, &out, &err);
    assert_eq!((code, &report["differences_total"], &report["checked"]), (0, &serde_json::json!(0), &serde_json::json!(n)), "{report}");
    let (code, out, err) = r.run(&["search", "--tenant", "quiet", "files", "--under", "/q", "--json", "--limit", "100"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_lines(&out).len(), 16, "{out}");
}

#[test]
fn a_tenant_is_deleted_through_the_log_and_nothing_of_it_is_left() {
    a_tenant_is_deleted_through_the_log_and_nothing_of_it_is_left_on(Rig::new(3));
}

#[test]
fn a_tenant_is_deleted_through_the_log_and_nothing_of_it_is_left_on_elasticsearch() {
    a_tenant_is_deleted_through_the_log_and_nothing_of_it_is_left_on(Rig::elastic(3));
}

/// `denorm tenant delete`: acme's documents go, through deletes in the log
/// (the index equals the topic's model, and verify's replay agrees); the
/// other tenants, with the same paths and ids, keep theirs.
fn a_tenant_is_deleted_through_the_log_and_nothing_of_it_is_left_on(r: Rig) {
    let w = r.worker(&[]);
    // Sent without waiting: the delete first waits for what the topic holds.
    let (code, _, err) = r.run(&["produce", "--jsonl", &lines_file(&r)]);
    assert_eq!(code, 0, "{err}");
    let count = |t: Option<&str>| search(&r, t, &["files", "--text", "shared"]).len() + search(&r, t, &["posts", "--text", "relationships"]).len();

    // Without --yes: the count, nothing sent.
    let (code, _, err) = r.run(&["tenant", "delete", "acme"]);
    assert_eq!(code, 2, "{err}\n{}", w.log());
    assert!(err.contains("tenant acme: 5 files, 1 users, 2 posts") && err.contains("--yes"), "{err}");
    assert_eq!(count(Some("acme")), 7);

    let (code, out, err) = r.run(&["tenant", "delete", "acme", "--yes", "--wait", "120"]);
    assert_eq!(code, 0, "{err}\n{}", w.log());
    let report = &json_lines(&out)[0];
    assert_eq!(report["deleted"], serde_json::json!({"files": 5, "users": 1, "posts": 2}), "{out}");
    assert_eq!(report["left"], 0, "{out}");
    assert_eq!(count(Some("acme")), 0);
    for t in [None, Some("globex")] {
        assert_eq!(count(t), 7, "{t:?} lost documents with acme's");
    }
    // The deletes are in the log: the index is the topic's model, and a
    // replay of the topic (verify's) has nothing of acme's either.
    assert_matches_topic_model(&r.cfg, &r.index);
    drop(w);
    let (code, out, err) = r.run(&["verify", "--tenant", "acme", "--json"]);
    let acme = report_of(code, &out, &err);
    assert_eq!((code, acme["checked"].as_u64()), (0, Some(0)), "{acme}");
    let (code, out, err) = r.run(&["verify", "--json"]);
    let all = report_of(code, &out, &err);
    assert_eq!((code, all["checked"].as_u64()), (0, Some(16)), "{all}");

    // Erasure from the log: the topic copied without acme's messages, the
    // index rebuilt from the copy; it holds nothing of acme's, and verify
    // against the copy finds the index equal to it.
    let old = per_key(&r.cfg);
    let acme = |k: &[u8]| k.starts_with(b"acme\x1f");
    let of_acme: usize = old.iter().filter(|(k, _)| acme(k)).map(|(_, v)| v.len()).sum();
    assert!(of_acme >= 16, "acme's upserts and deletes: {of_acme}");
    let new = denorm::kafka::KafkaConfig { topic: unique("denorm-test-erased"), ..r.cfg.clone() };
    let partitions = r.cfg.partitions.to_string();
    let (code, out, err) = output(cli(&r.cfg, &r.group, &r.index).args(["migrate", "--to-topic", &new.topic, "--to-partitions", &partitions, "--drop-tenant", "acme"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("left out {of_acme} message(s) of tenant(s) acme")), "{out}");
    let copied = per_key(&new);
    assert!(!copied.keys().any(|k| acme(k)), "acme's messages were copied");
    // (Payloads naming a place in the log are rewritten: compared by count.)
    let counts = |m: &std::collections::BTreeMap<Vec<u8>, Vec<Vec<u8>>>| -> Vec<(String, usize)> {
        m.iter().filter(|(k, _)| !acme(k)).map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.len())).collect()
    };
    assert_eq!(counts(&copied), counts(&old), "every other key's messages copied");
    let (code, _, err) = output(cli(&new, &r.group, &r.index).args(["rebuild", "--metrics-addr", "127.0.0.1:0"]));
    assert_eq!(code, 0, "{err}");
    assert_eq!(count(Some("acme")), 0);
    for t in [None, Some("globex")] {
        assert_eq!(count(t), 7, "{t:?}'s documents after the rebuild from the copy");
    }
    assert_matches_topic_model(&new, &r.index);
    let (code, out, err) = output(cli(&new, &r.group, &r.index).args(["verify", "--json"]));
    let all = report_of(code, &out, &err);
    assert_eq!((code, all["checked"].as_u64()), (0, Some(16)), "{all}");
}
