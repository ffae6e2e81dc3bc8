//! The failure report of a system test (`common/forensics.rs`), on the
//! failure the chaos test could not explain: one key's later commands
//! missing, with the group's offsets at the end. A record the worker
//! refuses parks its key (as a record damaged on its way would), the later
//! commands of the key are dead-lettered, the model comparison fails, and
//! the report says why.

use crate::common::*;
use denorm::command::{Command, Envelope};

fn file(id: &str, path: &str) -> Command {
    Command::UpsertFile { id: id.into(), path: path.into(), contents: format!("contents of {id}"), previous_path: None }
}

#[test]
fn a_failed_comparison_reports_the_dead_letters_the_progress_the_workers_logs_and_the_writers() {
    let r = Rig::new(2);
    let _w = r.worker(&[]);
    let codec = denorm::codec::Codec::new();
    let encode = |c: Command| codec.encode(&Envelope::new(c));
    let mut messages: Vec<(Option<&str>, Vec<u8>)> = vec![(Some("/a"), b"not an avro message".to_vec())];
    for i in 0..5 {
        messages.push((Some("/a"), encode(file(&format!("a{i}"), &format!("/a/{i}.txt")))));
    }
    messages.push((Some("/b"), encode(file("b0", "/b/b0.txt"))));
    send_raw_placed(&r.cfg, &messages, true);
    wait_applied(&r.cfg, &r.group, messages.len());
    // The model of the topic holds /a's files; the index does not.
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| assert_matches_topic_model(&r.cfg, &r.index)));
    assert!(failed.is_err(), "the index matched the model although /a was parked");
    let report = forensics::last_report().expect("the failure printed a report");
    let a = denorm::command::partitioner::partition_of("/a", 2);
    for want in [
        "dead letters in",
        "\"not_single_object\": 1",
        "\"parked\": 5",
        "key parked",
        "command aborted and dead-lettered",
        "partition  committed        end  checkpoint",
        "written by:",
        &format!("{a}@1 key \"/a\""),
    ] {
        assert!(report.contains(want), "the report lacks {want:?}:\n{report}");
    }
    let dir = report.split("(files in ").nth(1).and_then(|r| r.split(')').next()).expect("the report names its directory");
    let logs = std::fs::read_dir(dir).unwrap().filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with("worker-")).count();
    assert_eq!(logs, 1, "the worker's log kept in {dir}");
    let kept = std::fs::read_to_string(std::path::Path::new(dir).join("report.txt")).unwrap();
    assert!(kept.starts_with("--- panicked at ") && kept.contains("tests/it/"), "report.txt names the failed assertion and where: {}", &kept[..kept.len().min(600)]);
}

/// The report opens an index the way its workers did: a worker of a
/// declared model, on Elasticsearch under a prefix of its own (as a replay
/// into a fresh index is), has its shards' progress read through its model
/// and prefix.
#[test]
fn the_report_reads_the_progress_of_a_models_workers_under_their_own_prefix() {
    let r = Rig::elastic(2);
    let prefix = unique("dt");
    crate::common::elastic::remove_when_done(&prefix);
    let env = [(denorm::index::elastic::config::env::PREFIX, std::ffi::OsStr::new(&prefix))];
    let worker = Worker::start_env(&r.cfg, &r.group, &r.index, &["--model", crate::model_pipeline::MODEL], &env);
    let log = r.dir().join("c1.jsonl");
    std::fs::write(&log, r#"{"op":"upsert","kind":"customer","id":"c1","fields":{"name":"Ann","plan":"free","since":"2026-01-01"}}"#).unwrap();
    let (code, _, err) = output(crate::model_pipeline::with_model(&r, &["produce", "--jsonl"]).arg(&log));
    assert_eq!(code, 0, "{err}");
    wait_applied_by(&r.cfg, &r.group, 1, &[&worker]);
    let failed = std::panic::catch_unwind(|| panic!("a check of this test failed"));
    assert!(failed.is_err());
    let report = forensics::last_report().expect("the failure printed a report");
    assert!(!report.contains("progress not read"), "{report}");
    let c1 = denorm::command::partitioner::partition_of("c1", 2);
    let section = report.split("--- topic ").find(|s| s.contains(&format!("(prefix {prefix})"))).unwrap_or_else(|| panic!("no section of the prefix {prefix}:\n{report}"));
    let row = section.lines().find(|l| l.split_whitespace().next() == Some(&c1.to_string())).unwrap_or_else(|| panic!("no row of partition {c1}:\n{section}"));
    assert_eq!(row.split_whitespace().nth(3), Some("0"), "the checkpoint of partition {c1} at the customer's offset: {row}");
}
