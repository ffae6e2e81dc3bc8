//! Static group membership (`--instance-id`) on the real broker: a worker
//! that comes back under the same id takes its own partitions back, and the
//! other member keeps its partitions throughout (no rebalance).


use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::common::*;

/// Far longer than the test may take: if the restarted worker were a new
/// member, its predecessor's partitions would stay with the dead member
/// until this expires, and `wait_applied` (180 s) would fail first.
const SESSION_TIMEOUT_MS: &str = "900000";

/// The partitions of a worker's last "partitions assigned" log line.
fn last_assignment(w: &Worker) -> BTreeSet<i32> {
    let log = w.log();
    let line = log.lines().filter(|l| l.contains("partitions assigned")).last().unwrap_or_else(|| panic!("no assignment:\n{log}"));
    let list = line.split("partitions=[").nth(1).and_then(|r| r.split(']').next()).unwrap_or_else(|| panic!("unparsed: {line}"));
    list.split(',').filter(|s| !s.trim().is_empty()).map(|s| s.trim().parse().unwrap()).collect()
}

/// Waits until both workers hold a non-empty share of all `n` partitions.
fn wait_split(a: &Worker, b: &Worker, n: i32) -> (BTreeSet<i32>, BTreeSet<i32>) {
    eventually(Duration::from_secs(120), || format!("the group never split the partitions:\n{}\n-----\n{}", a.log(), b.log()), || {
        if !(a.log_contains("partitions assigned") && b.log_contains("partitions assigned")) {
            return None;
        }
        let (pa, pb) = (last_assignment(a), last_assignment(b));
        (!pa.is_empty() && !pb.is_empty() && pa.is_disjoint(&pb) && pa.len() + pb.len() == n as usize).then_some((pa, pb))
    })
}

fn restart_keeps_assignment(how: &str) {
    let r = Rig::new(4);
    let args = |id: &'static str| ["--instance-id", id, "--session-timeout-ms", SESSION_TIMEOUT_MS];
    let a = r.worker(&args("denorm-0"));
    let b = r.worker(&args("denorm-1"));
    let (before_a, before_b) = wait_split(&a, &b, 4);
    assert!(a.log_contains("static group membership"), "{}", a.log());
    let trees: Vec<String> = (0..16).map(|t| format!("/tree{t}")).collect();
    let mut log = Vec::new();
    for t in &trees {
        log.extend(produce(&r.cfg, files_under(&format!("{t}-a-"), t, 5)));
    }
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&a, &b]);
    let assignments_of_b = b.log().matches("partitions assigned").count();

    let t = Instant::now();
    match how {
        "kill" => a.kill(),
        _ => assert!(a.terminate().success()),
    }
    let a = r.worker(&args("denorm-0"));
    for t in &trees {
        log.extend(produce(&r.cfg, files_under(&format!("{t}-b-"), t, 5)));
    }
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&a, &b]);
    eprintln!("static membership ({how}): every partition applied again {:.1}s after the restart (session timeout {SESSION_TIMEOUT_MS} ms)", t.elapsed().as_secs_f64());
    assert_eq!(last_assignment(&a), before_a, "the restarted member got other partitions:\n{}", a.log());
    assert_eq!(last_assignment(&b), before_b);
    assert_eq!(b.log().matches("partitions assigned").count(), assignments_of_b, "the other member was rebalanced:\n{}", b.log());
    assert!(!b.log_contains("partitions revoked"), "the other member lost partitions:\n{}", b.log());
    drop((a, b));
    assert_matches_model(&r.index, &log);
}

#[test]
fn a_static_member_killed_and_restarted_takes_its_partitions_back_without_a_rebalance() {
    restart_keeps_assignment("kill");
}

#[test]
fn a_static_member_stopped_and_restarted_takes_its_partitions_back_without_a_rebalance() {
    restart_keeps_assignment("term");
}

#[test]
fn instance_ids_are_checked_before_anything_starts() {
    let r = Rig::new(1);
    let (code, _, err) = r.run(&["run", "--instance-id", "pod/0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("an instance id is 1 to 249 letters"), "{err}");
}
