//! The findings of the key lanes review (`shared/reviews/lanes.md`), each
//! with the test that failed before its fix.

#[cfg(feature = "failpoints")]
use super::lanes::rename_with_traffic;
use super::*;
use crate::apply::FanOut;

/// Waits until every message of the log was fed and all but `waiting` were
/// taken off the queue (those wait in a lane); the end of the partition,
/// fed right after the last message, is then handled within a few turns of
/// the loop. That has no effect to observe while lanes are busy (nothing is
/// published): the short pause after stands for it.
#[cfg(feature = "failpoints")]
fn fed_and_handled_but(r: &Rig, run: &Running, waiting: usize) {
    let records = r.log.lock().unwrap().records.len();
    eventually("every message fed and handled", || run.sent.load(Ordering::SeqCst) == records && run.part.queue.queued().messages() == waiting);
    std::thread::sleep(Duration::from_millis(100));
}

/// F1: when a fan-out finishes, its key's waiting messages (older than the
/// end of the partition already reported) are handled again; they made the
/// applier forget that end, and a tail without messages (a transaction's
/// marker) was never published past: `next` stayed at `end - 1`.
#[test]
#[cfg(feature = "failpoints")]
fn the_end_past_a_marker_is_published_after_a_lanes_waiting_messages() {
    let r = Rig::new(|c| {
        c.fan_out = FanOut::pages_of(10);
        c.commit_quiet = Duration::from_millis(20);
    });
    let (rename, _, _late) = rename_with_traffic(&r);
    r.marker();
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.hold", "/a");
    let run = r.start();
    run.wait_next(rename);
    // `late` (of `/a`) waits in the rename's lane; the end is reported.
    fed_and_handled_but(&r, &run, 1);
    std::fs::remove_file(faults.path().join("fanout.hold")).unwrap();
    let end = r.end();
    run.wait_next(end);
    assert_eq!(run.stop(), end);
}

/// F2: a barrier (here an owner change's upsert) that must wait for the
/// lanes to drain sat at the head of the queue, and the loop never reached
/// the quiet and linger commits: the commands applied before it stayed
/// uncommitted, not searchable, until every lane finished.
#[test]
#[cfg(feature = "failpoints")]
fn commands_before_a_blocked_barrier_are_committed_while_the_lane_is_held() {
    let r = Rig::new(|c| {
        c.fan_out = FanOut::pages_of(10);
        c.commit_quiet = Duration::from_secs(1);
        c.commit_linger = Duration::from_secs(10);
    });
    let (rename, other, _) = rename_with_traffic(&r);
    let barrier = r.produce(Command::UpsertFile { id: "o1".into(), path: "/c/o1.txt".into(), contents: "o".into(), previous_path: Some("/d/o1.txt".into()) });
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.hold", "/a");
    let run = r.start();
    eventually(&format!("b1 (offset {other}) searchable while /a is held, before the barrier at {barrier}"), || r.file_ids().contains(&"b1".to_string()));
    run.wait_next(rename);
    assert_eq!(run.next(), rename, "published past the held rename");
    std::fs::remove_file(faults.path().join("fanout.hold")).unwrap();
    let end = r.end();
    run.wait_next(end);
    assert_eq!(run.stop(), end);
    assert!(r.file_ids().contains(&"o1".to_string()));
}

/// F9: a waiting message handled again when its lane finished, and
/// deferred again (a fan-out starting its own lane, or waiting once more),
/// broke the tracker's assertion that offsets are deferred in increasing
/// order: two renames of one key back to back panicked a debug build.
#[test]
#[cfg(feature = "failpoints")]
fn two_fan_outs_of_one_key_back_to_back_are_applied_in_order() {
    let r = Rig::new(|c| c.fan_out = FanOut::pages_of(10));
    for i in 0..40 {
        r.produce(upsert(&format!("a{i}"), &format!("/a/x/a{i}.txt")));
    }
    r.produce(Command::RenamePath { from: "/a/x".into(), to: "/a/y".into() });
    r.produce(Command::RenamePath { from: "/a/y".into(), to: "/a/z".into() });
    r.produce(upsert("b1", "/b/b1.txt"));
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.hold", "/a");
    let run = r.start();
    // The second rename waits in the first one's lane.
    fed_and_handled_but(&r, &run, 1);
    std::fs::remove_file(faults.path().join("fanout.hold")).unwrap();
    let end = r.end();
    run.wait_next(end);
    assert_eq!(run.stop(), end);
    let mut want: Vec<(String, String)> = (0..40).map(|i| (format!("a{i}"), format!("/a/z/a{i}.txt"))).collect();
    want.push(("b1".into(), "/b/b1.txt".into()));
    want.sort();
    assert_eq!(r.files(), want);
}

/// F8: the end of a move marked the shard applied without the lanes'
/// tracker, whose low mark stayed before the move: the next command
/// finished while a lane was busy recorded that stale mark, and the shard's
/// committed checkpoint went back by the move's span.
#[test]
#[cfg(feature = "failpoints")]
fn the_checkpoint_does_not_go_back_after_a_move_while_a_lane_is_busy() {
    let r = super::moves::destination(|c| c.fan_out = FanOut::pages_of(10));
    for i in 0..40 {
        r.produce(upsert(&format!("a{i}"), &format!("/a/x/a{i}.txt")));
    }
    let moved = r.produce_move(&super::moves::chunk(7, 0, true, &["m1"]));
    r.produce(Command::RenamePath { from: "/a/x".into(), to: "/a/y".into() });
    r.produce(upsert("b1", "/b/b1.txt"));
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.hold", "/a");
    let _run = r.start();
    eventually("b1 searchable while /a is held", || r.file_ids().contains(&"b1".to_string()));
    let checkpoint = EmbeddedIndex::open_existing(r.dir.path()).unwrap().checkpoints().unwrap()[&0].offset;
    assert!(checkpoint as i64 >= moved, "the checkpoint went back to {checkpoint}, before the move at {moved}");
}

/// F14: a partition stopped (revoked) with a fan-out in its lane kept
/// exporting its busy lanes, beside the next owner's. (The global recorder
/// is this test's own: nextest runs each test in a process of its own.)
#[test]
#[cfg(feature = "failpoints")]
fn a_stopped_partition_exports_no_busy_lanes() {
    let Ok(prometheus) = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder() else {
        panic!("another recorder is installed: run with nextest (a process per test)");
    };
    let busy = || {
        let text = prometheus.render();
        let line = text.lines().find(|l| l.starts_with(crate::metrics::PARTITION_BUSY_LANES) && l.contains(r#"partition="0""#))?.to_string();
        line.rsplit(' ').next()?.parse::<f64>().ok()
    };
    let r = Rig::new(|c| c.fan_out = FanOut::pages_of(10));
    rename_with_traffic(&r);
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.hold", "/a");
    let run = r.start();
    eventually("the rename's lane busy", || busy() == Some(1.0));
    run.stop();
    assert_eq!(busy(), Some(0.0), "the stopped partition still exports its busy lanes");
}

/// F10: a page that failed fell back without dropping the batch, so a stop
/// during the fall-back's backoff (before the writer is reopened) committed
/// the writer that had just failed, with the other keys' commands applied
/// on it, and published the end of the partition, past the unfinished
/// rename (the next owner would have started after it: lost). A failed
/// writer's state is never committed: what it applied is read again by the
/// next owner, from before the rename.
#[test]
#[cfg(feature = "failpoints")]
fn a_stop_while_falling_back_from_a_failed_page_commits_nothing_of_the_failed_writer() {
    let r = Rig::new(|c| {
        c.fan_out = FanOut::pages_of(10);
        c.commit_quiet = Duration::from_secs(60);
        c.commit_linger = Duration::from_secs(60);
    });
    let (rename, _, _) = rename_with_traffic(&r);
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.hold", "/a");
    fault(faults.path(), "lanes.fall-back", "");
    let run = r.start();
    // The files before the rename and b1 applied, b1 not committed.
    eventually("b1 applied", || r.shared.stats.applied.load(Ordering::SeqCst) == 41);
    fault(faults.path(), "fanout.page-fail", "/a");
    std::fs::remove_file(faults.path().join("fanout.hold")).unwrap();
    eventually("the fall-back reached", || faults.path().join("lanes.fall-back.reached").exists());
    run.part.stop.store(true, Ordering::SeqCst);
    std::fs::remove_file(faults.path().join("lanes.fall-back")).unwrap();
    assert!(run.stop() <= rename);
    assert!(!r.file_ids().contains(&"b1".to_string()), "the failed writer's batch was committed: {:?}", r.file_ids());
}

/// F15: the abort that parked a key, read again after a restart (recorded
/// neither below the checkpoint nor as done above it), is handled again;
/// when it now succeeds, the key stayed parked behind a command that was
/// applied, and its later commands were dead-lettered. The key is now as
/// it was before the abort: parked again only if the command aborts again.
#[test]
fn an_abort_handled_again_that_succeeds_leaves_its_key_unparked() {
    let r = Rig::new(|c| c.max_attempts = 1);
    let first = r.produce(upsert("f0", "/f/f0.txt"));
    let abort = r.produce(upsert("c1", "/c/c1.txt"));
    let later = r.produce(upsert("c2", "/c/c2.txt"));
    {
        let mut shard = r.shared.backend.open_shard(0).unwrap();
        crate::apply::apply(shard.as_mut(), &upsert("f0", "/f/f0.txt"), first as u64, FanOut::pages_of(10)).unwrap();
        let parked = crate::index::progress::Parked { behind: "c1-id".into(), last_dlq: 0, replayed_through: -1, last_at: abort, since: abort };
        shard.parking().insert("/c".into(), parked);
        shard.mark_applied(crate::index::Checkpoint { offset: first as u64, fingerprint: None });
        shard.commit().unwrap();
    }
    let run = r.start();
    run.wait_next(later + 1);
    assert_eq!(run.stop(), later + 1);
    assert!(r.letters().is_empty(), "{:?}", r.letters());
    assert_eq!(r.file_ids(), vec!["c1", "c2", "f0"]);
    assert!(r.shared.backend.open_shard(0).unwrap().parking().is_empty(), "the key stayed parked");
}

/// F5: the embedded worker looked for a rebuild's new generation only with
/// no lane busy, so after a cutover during a long fan-out it kept writing
/// the generation searches no longer read, and every key of the partition
/// was invisible until the lanes drained. It now follows between pages.
#[test]
#[cfg(feature = "failpoints")]
fn a_cutover_during_a_lanes_fan_out_is_followed_at_once() {
    let r = Rig::new(|c| c.fan_out = FanOut::pages_of(10));
    rename_with_traffic(&r);
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.hold", "/a");
    let run = r.start();
    eventually("the rename's pages held", || faults.path().join("fanout.hold.reached").exists());
    {
        // A rebuild's new generation, empty, and its cutover.
        let index = EmbeddedIndex::open_existing(r.dir.path()).unwrap();
        let mut shard = index.open_shard_in(1, 0, 20 << 20).unwrap();
        crate::index::Shard::commit(&mut shard).unwrap();
        drop(shard);
        index.cut_over_to(1, 1).unwrap();
    }
    r.produce(upsert("c1", "/c/c1.txt"));
    eventually("c1 searchable in the new generation while /a is held", || r.file_ids().contains(&"c1".to_string()));
    assert_eq!(EmbeddedIndex::open_existing(r.dir.path()).unwrap().current_generation().unwrap(), 1);
    drop(run);
}

/// F4: an embedded page deleted its documents by key and added the
/// snapshot's versions back, undoing a write to one of them committed after
/// the scan began (here an upsert of another key, after the rename in the
/// log, that moves the file out from under the renamed directory).
/// Elasticsearch's pages are conditional on the version they read.
#[test]
#[cfg(feature = "failpoints")]
fn a_write_of_another_key_to_a_document_under_a_held_rename_is_not_undone_by_its_pages() {
    let r = Rig::new(|c| {
        c.fan_out = FanOut::pages_of(10);
        c.commit_quiet = Duration::from_millis(20);
    });
    rename_with_traffic(&r);
    r.produce(upsert("a3", "/b/a3.txt"));
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.hold", "/a");
    let run = r.start();
    eventually("a3 under /b committed", || r.files().contains(&("a3".into(), "/b/a3.txt".into())));
    std::fs::remove_file(faults.path().join("fanout.hold")).unwrap();
    let end = r.end();
    run.wait_next(end);
    run.stop();
    let files = r.files();
    assert!(files.contains(&("a3".into(), "/b/a3.txt".into())), "{files:?}");
    assert!(files.contains(&("a4".into(), "/a/y/a4.txt".into())), "{files:?}");
}

/// F12: after a restart from a checkpoint held below a fan-out in its lane,
/// the embedded index (whose deletes leave no position) re-applied an
/// upsert of a document deleted later, and the document was back, and
/// searchable, until its delete was re-applied (here for as long as a
/// profile change of its user between the two runs again in its lane). The
/// commit now records what is done above the checkpoint (issue 45), and
/// the next owner skips both.
#[test]
#[cfg(feature = "failpoints")]
fn a_deleted_document_does_not_come_back_while_a_restart_reads_again() {
    let r = Rig::new(|c| {
        c.fan_out = FanOut::pages_of(10);
        c.fan_out.page_pause = Duration::from_millis(50);
        c.commit_quiet = Duration::from_millis(20);
    });
    let (rename, _, _) = rename_with_traffic(&r);
    // Of key `u`: the post, a profile change of several pages, its delete
    // (which waits behind the profile change when read again).
    let user = |name: &str| Command::UpsertUser { id: "u".into(), name: name.into(), email: "u@x".into(), dob: "1970-01-01".into() };
    let post = |id: &str| Command::UpsertPost { id: id.into(), user_id: "u".into(), title: "t".into(), body: "b".into(), previous_user_id: None };
    r.produce(user("Ann"));
    for i in 0..40 {
        r.produce(post(&format!("p{i}")));
    }
    r.produce(post("d"));
    r.produce(user("Bob"));
    let deleted = r.produce(Command::DeletePost { id: "d".into(), user_id: "u".into() });
    // A later name: read again, the profile change to Bob scans every post
    // (none is named Bob), a page at a time.
    let last = r.produce(user("Cy"));
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.hold", "/a");
    let run = r.start();
    eventually("the delete and the last profile change applied and committed", || {
        let done = run.part.done.lock().unwrap();
        done.contains(Some(rename as u64 - 1), deleted) && done.contains(Some(rename as u64 - 1), last)
    });
    assert_eq!(run.stop(), rename);
    let has_d = || r.docs().iter().any(|(id, _)| id == "d");
    assert!(!has_d());
    std::fs::remove_file(faults.path().join("fanout.hold")).unwrap();
    let run = r.start();
    let end = r.end();
    // Sampled while the partition is read again from the rename.
    let deadline = Instant::now() + Duration::from_secs(30);
    while run.next() < end {
        assert!(!has_d(), "the deleted post came back");
        assert!(Instant::now() < deadline, "not read to the end within 30 s");
    }
    run.stop();
    assert!(!has_d());
}
