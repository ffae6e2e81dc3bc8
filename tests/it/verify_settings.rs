//! The replay decides as the live workers did (issue 44, review of verify
//! F1 and F20), on both backends: the workers record the settings that
//! change what they apply in the index, `verify` and `rebuild` replay with
//! them, a verify that cannot know them refuses to judge, and workers that
//! disagree are reported.

use std::time::Duration;

use denorm::index::Kind;

use crate::common::*;

/// The files of the live index under `dir`.
fn files_in(r: &Rig, dir: &str) -> usize {
    dump(&r.index).iter().filter(|d| d.kind() == Kind::File && d.key().starts_with(dir)).count()
}

/// The scenario: workers with `--on-abort skip`, a poison message
/// under `/k1` between 100 files and 50 more. The 50 are applied, as skip
/// promises. `verify` called them "unexpected" (exit 1), and `--repair`
/// deleted them and exited 0; `rebuild` parked `/k1` and cut over without
/// them. Now: exit 0, nothing sent, 150 files, and the rebuild keeps them.
fn a_worker_that_skips_after_an_abort_verifies_clean_and_repair_deletes_nothing(r: Rig) {
    let worker = r.worker(&["--on-abort", "skip"]);
    let mut n = produce(&r.cfg, files_under("a", "/k1", 100)).len();
    send_raw(&r.cfg, &[(Some("/k1"), b"garbage".to_vec())]);
    n += 1 + produce(&r.cfg, files_under("b", "/k1", 50)).len();
    wait_applied_by(&r.cfg, &r.group, n, &[&worker]);
    assert_eq!(files_in(&r, "/k1"), 150, "{}", worker.log());
    let before = r.topic_end();

    let (code, out, err) = r.run(&["verify", "--json"]);
    let report = report_of(code, &out, &err);
    assert_eq!((code, &report["differences_total"]), (0, &serde_json::json!(0)), "{report}\n{err}");
    let (code, out, err) = r.run(&["verify", "--json", "--repair"]);
    let report = report_of(code, &out, &err);
    assert_eq!(code, 0, "{report}\n{err}");
    assert!(report["repair"]["sent"].as_array().is_none_or(Vec::is_empty), "{report}");
    assert_eq!(r.topic_end(), before, "the verify wrote to the command topic");
    assert_eq!(files_in(&r, "/k1"), 150);

    // The rebuild replays with them too (F20): /k1's later files are in
    // the new generation.
    let (code, out, err) = r.run(&["rebuild", "--metrics-addr", "127.0.0.1:0"]);
    assert_eq!(code, 0, "{out}\n{err}");
    eventually(Duration::from_secs(60), || format!("files under /k1 after the rebuild: {}", files_in(&r, "/k1")), || (files_in(&r, "/k1") == 150).then_some(()));
    let log = worker.log();
    assert!(worker.terminate().success(), "{log}");
}

#[test]
fn a_worker_that_skips_after_an_abort_verifies_clean_and_repair_deletes_nothing_on_the_embedded_index() {
    a_worker_that_skips_after_an_abort_verifies_clean_and_repair_deletes_nothing(Rig::new(1));
}

#[test]
fn a_worker_that_skips_after_an_abort_verifies_clean_and_repair_deletes_nothing_on_elasticsearch() {
    a_worker_that_skips_after_an_abort_verifies_clean_and_repair_deletes_nothing(Rig::elastic(1));
}

/// Removes the workers' settings recorded in the index: a file beside the
/// embedded index's generations, a meta document on Elasticsearch.
fn forget_settings(r: &Rig) {
    let name = denorm::worker::settings::RECORD;
    if r.is_elastic() {
        let meta = denorm::index::elastic::names::meta_index(&crate::common::elastic::prefix());
        let url = format!("{}/{meta}/_doc/{name}?refresh=true", r.index.display());
        let status = rt().block_on(async { reqwest::Client::new().delete(&url).send().await.unwrap().status() });
        assert!(status.is_success(), "{url}: {status}");
    } else {
        std::fs::remove_file(r.index.join(name.to_uppercase())).unwrap();
    }
}

/// A second worker with other settings: it says so at its start, and the
/// first one exports `denorm_worker_settings_mismatch` once the record is
/// the second's. Without any record, verify refuses (exit 2) and names
/// what it lacks.
fn workers_that_disagree_are_reported_and_a_verify_without_their_settings_refuses(r: Rig) {
    let first = r.worker(&["--on-abort", "skip"]);
    let n = produce(&r.cfg, files_under("a", "/k1", 10)).len();
    wait_applied_by(&r.cfg, &r.group, n, &[&first]);
    assert_eq!(first.metric("denorm_worker_settings_mismatch", &[]), 0.0);
    let second = r.worker(&["--max-message-bytes", "2097152"]);
    assert!(second.wait_for_log("differ from those the index recorded", Duration::from_secs(30)), "{}", second.log());
    assert!(second.log_contains("on_abort: park vs skip") && second.log_contains("max_message_bytes: 2097152 vs 1048576"), "{}", second.log());
    eventually(Duration::from_secs(30), || first.log(), || (first.metric("denorm_worker_settings_mismatch", &[]) == 1.0).then_some(()));
    assert!(first.log_contains("differ from those another worker of this index recorded"), "{}", first.log());
    for w in [first, second] {
        let log = w.log();
        assert!(w.terminate().success(), "{log}");
    }

    forget_settings(&r);
    let (code, out, err) = r.run(&["verify", "--json"]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(err.contains("records no worker settings") && err.contains("abort policy"), "{err}");
}

#[test]
fn workers_that_disagree_are_reported_and_a_verify_without_their_settings_refuses_on_the_embedded_index() {
    workers_that_disagree_are_reported_and_a_verify_without_their_settings_refuses(Rig::new(1));
}

#[test]
fn workers_that_disagree_are_reported_and_a_verify_without_their_settings_refuses_on_elasticsearch() {
    workers_that_disagree_are_reported_and_a_verify_without_their_settings_refuses(Rig::elastic(1));
}
