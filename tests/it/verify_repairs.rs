//! `denorm verify --repair` never brings back what moved on (issue 44,
//! review of verify F3), on both backends.

use std::process::Stdio;
use std::time::Duration;

use denorm::command::Command;
use denorm::index::Kind;

use crate::common::*;

fn s(v: &str) -> String {
    v.to_string()
}

/// A post lost behind the pipeline's back is `missing` in a quiet
/// partition; between the verify's judgement and its repair plan, the
/// producer deletes that post (not applied yet: the workers are stopped).
/// The plan read only checkpoints, sent the upsert, and once the workers
/// ran the post was back although the producer deleted it (and a verify
/// was clean: the replay resurrected it too). Now the plan reads the log's
/// end as well: nothing is sent, the post is "verify again", and stays
/// deleted.
fn a_repair_is_not_sent_for_a_document_a_later_command_in_the_log_may_have_deleted(r: Rig) {
    let worker = r.worker(&[]);
    let user = Command::UpsertUser { id: s("u1"), name: s("Ann"), email: s("ann@example.com"), dob: s("1990-01-01") };
    let post = |id: &str| Command::UpsertPost { id: s(id), user_id: s("u1"), title: s("t"), body: s("b"), previous_user_id: None };
    let n = produce(&r.cfg, vec![user, post("p1"), post("p2")]).len();
    wait_applied_by(&r.cfg, &r.group, n, &[&worker]);
    let log = worker.log();
    assert!(worker.terminate().success(), "{log}");
    crate::verify::lose_post(&r, "p1", "u1");

    let faults = r.dir().join("repair-faults");
    std::fs::create_dir_all(&faults).unwrap();
    std::fs::write(faults.join("verify.before-plan"), "").unwrap();
    let child = cli(&r.cfg, &r.group, &r.index)
        .args(["verify", "--json", "--repair", "--timeout-secs", "15"])
        .env("DENORM_FAULTS", &faults)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(60), || "the verify never reached its repair plan".into(), || faults.join("verify.before-plan.reached").exists().then_some(()));
    produce(&r.cfg, vec![Command::DeletePost { id: s("p1"), user_id: s("u1") }]);
    std::fs::remove_file(faults.join("verify.before-plan")).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout:?}\n{stderr}"));
    assert_eq!(out.status.code(), Some(1), "{report}\n{stderr}");
    assert_eq!(report["differences"][0]["id"], "p1", "{report}");
    assert!(report["repair"]["sent"].as_array().is_some_and(Vec::is_empty), "{report}");
    assert_eq!(report["repair"]["not_repaired"][0]["id"], "p1", "{report}");

    // The workers apply the delete: the post stays deleted, and the index
    // equals its log.
    let worker = r.worker(&[]);
    wait_applied_by(&r.cfg, &r.group, n + 1, &[&worker]);
    let posts: Vec<String> = dump(&r.index).iter().filter(|d| d.kind() == Kind::Post).map(|d| d.id().to_string()).collect();
    assert_eq!(posts, vec![s("p2")]);
    let (code, out, err) = r.run(&["verify", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let log = worker.log();
    assert!(worker.terminate().success(), "{log}");
}

#[test]
#[cfg(feature = "failpoints")]
fn a_repair_is_not_sent_for_a_document_a_later_command_in_the_log_may_have_deleted_on_the_embedded_index() {
    a_repair_is_not_sent_for_a_document_a_later_command_in_the_log_may_have_deleted(Rig::new(1));
}

#[test]
#[cfg(feature = "failpoints")]
fn a_repair_is_not_sent_for_a_document_a_later_command_in_the_log_may_have_deleted_on_elasticsearch() {
    a_repair_is_not_sent_for_a_document_a_later_command_in_the_log_may_have_deleted(Rig::elastic(1));
}
