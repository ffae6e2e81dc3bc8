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
    assert!(std::path::Path::new(dir).join("report.txt").exists());
}
