//! Key lanes in-process: a fan-out runs a page at a time in its key's
//! lane, the other keys' commands are applied between its pages, its own
//! key's later commands wait behind it, and what is recorded as applied is
//! the lowest unfinished command's predecessor.

use super::*;
use crate::apply::FanOut;

/// 40 files of key `/a` under `/a/x`, the rename of `/a/x` to `/a/y` (a
/// fan-out of 4 pages of 10), a file of key `/b`, and a later file of key
/// `/a` under `/a/x`, which the rename must not move. The offsets of the
/// rename, of `/b`'s file and of the later file.
pub(super) fn rename_with_traffic(r: &Rig) -> (i64, i64, i64) {
    for i in 0..40 {
        r.produce(upsert(&format!("a{i}"), &format!("/a/x/a{i}.txt")));
    }
    let rename = r.produce(Command::RenamePath { from: "/a/x".into(), to: "/a/y".into() });
    let other = r.produce(upsert("b1", "/b/b1.txt"));
    let late = r.produce(upsert("late", "/a/x/late.txt"));
    (rename, other, late)
}

/// After everything is applied: each renamed file at `/a/y`, the later
/// file left at `/a/x` (it came after the rename), `/b`'s file.
#[cfg(feature = "failpoints")]
fn all_applied(r: &Rig) {
    let mut want: Vec<(String, String)> = (0..40).map(|i| (format!("a{i}"), format!("/a/y/a{i}.txt"))).collect();
    want.push(("b1".into(), "/b/b1.txt".into()));
    want.push(("late".into(), "/a/x/late.txt".into()));
    want.sort();
    assert_eq!(r.files(), want);
}

#[test]
#[cfg(feature = "failpoints")]
fn a_fan_out_in_its_lane_holds_up_its_own_key_only() {
    let r = Rig::new(|c| c.fan_out = FanOut::pages_of(10));
    let (rename, other, late) = rename_with_traffic(&r);
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.hold", "/a");
    let run = r.start();
    eventually("the rename's pages held", || faults.path().join("fanout.hold.reached").exists());
    // `/b`'s file is applied and committed while the rename is held...
    eventually("the other key's file searchable", || r.file_ids().contains(&"b1".to_string()));
    // ... the later file of `/a` waits behind the rename, which has moved
    // nothing yet, and nothing from the rename on is published.
    let files = r.files();
    assert!(!files.iter().any(|(id, _)| id == "late"), "the later file of the held key overtook its rename: {files:?}");
    assert!(files.iter().all(|(id, p)| id == "b1" || p.starts_with("/a/x/")), "{files:?}");
    run.wait_next(rename);
    assert_eq!(run.next(), rename, "published past the unfinished rename (b1 at {other}, late at {late})");
    std::fs::remove_file(faults.path().join("fanout.hold")).unwrap();
    let end = r.end();
    run.wait_next(end);
    assert_eq!(run.part.queue.queued().messages(), 0, "messages still counted as queued");
    assert_eq!(run.stop(), end);
    all_applied(&r);
}

/// A seek served late (seen on tansu: right after an assignment the client
/// fetched from the group's offset, and the seek the applier had asked for
/// took effect a second later): the messages already read come again,
/// behind a second "positioned". They are not applied twice: a rename
/// started again in its busy lane left the partition stuck, its commands
/// never published.
#[test]
fn messages_read_again_after_a_late_seek_are_not_applied_twice() {
    let r = Rig::new(|c| c.fan_out = FanOut::pages_of(10));
    let (rename, _, _) = rename_with_traffic(&r);
    let end = r.end();
    *r.late_seek.lock().unwrap() = Some((end as usize, rename - 5));
    let run = r.start();
    run.wait_next(end);
    eventually("the late seek served", || r.late_seek.lock().unwrap().is_none());
    let more = r.produce(upsert("b2", "/b/b2.txt"));
    run.wait_next(more + 1);
    assert_eq!(run.stop(), more + 1);
    assert_eq!(r.shared.stats.applied.load(Ordering::SeqCst), more as u64 + 1, "a command applied twice");
    let mut want: Vec<(String, String)> = (0..40).map(|i| (format!("a{i}"), format!("/a/y/a{i}.txt"))).collect();
    want.extend([("b1".into(), "/b/b1.txt".into()), ("b2".into(), "/b/b2.txt".into()), ("late".into(), "/a/x/late.txt".into())]);
    want.sort();
    assert_eq!(r.files(), want);
}

/// While a fan-out is held in its lane, another key's command after it is
/// committed as applied above the checkpoint, without a stop: what a wait
/// on that command alone (a verify's repair, review of verify F12) reads.
#[test]
#[cfg(feature = "failpoints")]
fn a_command_beside_a_held_fan_out_is_committed_as_applied_while_the_fan_out_runs() {
    let r = Rig::new(|c| c.fan_out = FanOut::pages_of(10));
    let (rename, other, _) = rename_with_traffic(&r);
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.hold", "/a");
    let run = r.start();
    eventually("the other key's command recorded applied by a commit", || r.shared.backend.applied(&[0]).unwrap().get(&0).is_some_and(|a| a.contains(other)));
    let applied = r.shared.backend.applied(&[0]).unwrap()[&0].clone();
    assert!(!applied.contains(rename), "the held rename is recorded applied: {applied:?}");
    std::fs::remove_file(faults.path().join("fanout.hold")).unwrap();
    let end = r.end();
    run.wait_next(end);
    run.stop();
    all_applied(&r);
}

/// Stopped (a revoke, a shutdown, a crash after a commit) during a
/// fan-out in its lane: what is recorded applied stops before the fan-out,
/// though a command of another key after it is applied and committed. The
/// next owner resumes at the fan-out. Issue 45: it used to apply those
/// other commands again (harmless, but a rebalance re-applied everything
/// since the oldest unfinished fan-out began); the commit now records
/// what is applied above the checkpoint, and the next owner skips it.
#[test]
#[cfg(feature = "failpoints")]
fn a_stop_during_a_lanes_fan_out_resumes_at_its_offset_and_skips_what_was_applied_after_it() {
    let r = Rig::new(|c| c.fan_out = FanOut::pages_of(10));
    let (rename, other, late) = rename_with_traffic(&r);
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.hold", "/a");
    let run = r.start();
    eventually("the other key's file applied", || r.file_ids().contains(&"b1".to_string()));
    // What is recorded applied stops before the rename, though `/b`'s
    // file after it is committed, and recorded as applied above it.
    assert_eq!(run.stop(), rename);
    {
        let shard = r.shared.backend.open_shard(0).unwrap();
        assert!(shard.progress().done_above(other), "the commit does not record {other} applied: {:?}", shard.progress().marked());
    }
    std::fs::remove_file(faults.path().join("fanout.hold")).unwrap();
    let before = r.docs().into_iter().find(|(id, _)| id == "b1");
    // (Counted from here: the stop may let the held rename finish, not
    // recorded as applied.)
    let applied_before = r.shared.stats.applied.load(Ordering::SeqCst);
    let run = r.start();
    let end = r.end();
    run.wait_next(end);
    assert_eq!(run.stop(), end);
    all_applied(&r);
    assert_eq!(r.docs().into_iter().find(|(id, _)| id == "b1"), before);
    // Applied again: the rename and the later file of its key, nothing
    // else.
    assert_eq!(r.shared.stats.applied.load(Ordering::SeqCst), applied_before + 2, "commands applied again (rename {rename}, late {late})");
    assert!(r.letters().is_empty(), "{:?}", r.letters());
}

/// A refusal while a lane is busy: the lanes are dropped and the partition
/// read again from the checkpoint one command at a time, where isolation
/// finds the refused command; nothing else is lost or applied out of order.
#[test]
#[cfg(feature = "failpoints")]
fn a_refusal_while_lanes_are_busy_falls_back_to_one_command_at_a_time() {
    let r = Rig::new(|c| {
        c.fan_out = FanOut::pages_of(10);
        c.max_attempts = 1;
    });
    let (_, _, _) = rename_with_traffic(&r);
    let refused = r.produce(upsert("c2", "/c/c2.txt"));
    let after = r.produce(upsert("c3", "/c/c3.txt"));
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.hold", "/a");
    fault(faults.path(), "index.reject-commit", "c2");
    let run = r.start();
    let end = r.end();
    run.wait_next(end);
    assert_eq!(run.stop(), end);
    assert_eq!(r.letters(), vec![Sent { reason: "index_rejected".into(), origin_offset: refused, key: "/c".into() }, Sent { reason: "parked".into(), origin_offset: after, key: "/c".into() }]);
    let files: Vec<String> = r.files().into_iter().map(|(id, p)| format!("{id} {p}")).collect();
    assert!(files.contains(&"a0 /a/y/a0.txt".to_string()) && files.contains(&"late /a/x/late.txt".to_string()) && files.contains(&"b1 /b/b1.txt".to_string()), "{files:?}");
    assert!(!files.iter().any(|f| f.starts_with("c2 ") || f.starts_with("c3 ")), "{files:?}");
}

/// A page that fails while lanes are busy: the lanes are dropped (the
/// messages waiting in them leave the queue's count) and the partition is
/// read again from the checkpoint, one command at a time up to where it had
/// read; nothing is lost, applied twice out of order, or dead-lettered.
#[test]
#[cfg(feature = "failpoints")]
fn a_failed_page_falls_back_to_the_checkpoint_and_loses_nothing() {
    let r = Rig::new(|c| c.fan_out = FanOut::pages_of(10));
    let (rename, _, _) = rename_with_traffic(&r);
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.page-fail", "/a");
    let run = r.start();
    eventually("a page failed", || faults.path().join("fanout.page-fail.reached").exists());
    std::fs::remove_file(faults.path().join("fanout.page-fail")).unwrap();
    let end = r.end();
    run.wait_next(end);
    // Sought again, to the last commit: at or before the rename (the files
    // before it are not committed first: the rename's scan read them from
    // the shard's pending writes).
    let seeks = run.seeks.lock().unwrap().clone();
    assert!(seeks.len() >= 2 && seeks[1..].iter().all(|&s| s <= rename), "not read again from the checkpoint at or before the rename: seeks {seeks:?}");
    assert_eq!(run.part.queue.queued().messages(), 0, "messages still counted as queued");
    assert_eq!(run.stop(), end);
    all_applied(&r);
    assert!(r.letters().is_empty(), "{:?}", r.letters());
}

/// A key parked while lanes were busy is recorded with the offset of its
/// abort, ahead of the checkpoint: a message of that key before the abort,
/// read again after a restart, is not held behind it.
#[test]
fn a_key_parked_ahead_of_the_checkpoint_holds_only_what_came_after_its_abort() {
    let parked = crate::index::progress::Parked { behind: "c-1".into(), last_dlq: 0, replayed_through: -1, last_at: 12, since: 10 };
    let mut shard = crate::index::memory::MemoryShard::new();
    crate::index::Shard::parking(&mut shard).insert("/c".into(), parked);
    let at = |offset| super::super::dead_letter::Origin { key: Some(b"/c"), payload: None, offset, at: offset };
    assert_eq!(at(9).parked_behind(&mut shard), None);
    assert_eq!(at(10).parked_behind(&mut shard), None, "the abort itself, read again, is handled again");
    assert_eq!(at(11).parked_behind(&mut shard), Some("c-1".into()));
}

/// With `--lanes 1` the rename runs whole, in log order: the pages' hold
/// does not apply, and nothing overtakes it.
#[test]
#[cfg(feature = "failpoints")]
fn one_lane_applies_one_command_at_a_time() {
    let r = Rig::new(|c| {
        c.fan_out = FanOut::pages_of(10);
        c.lanes = 1;
    });
    rename_with_traffic(&r);
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.hold", "/a");
    let run = r.start();
    let end = r.end();
    run.wait_next(end);
    assert_eq!(run.stop(), end);
    assert!(!faults.path().join("fanout.hold.reached").exists(), "a page ran in a lane");
    all_applied(&r);
}

/// The other keys get as much of the applier's time between two pages as
/// the last page took, and at least `PAGE_EVERY` messages; a page held by
/// its pause costs nothing.
#[test]
fn a_page_is_due_once_the_other_keys_had_as_much_time_as_it_took() {
    use super::super::lanes::{PageShare, PAGE_EVERY};
    let t0 = Instant::now();
    let mut share = PageShare::default();
    share.paged(t0, true, t0 + Duration::from_millis(100));
    for _ in 0..PAGE_EVERY {
        share.handled();
    }
    assert!(!share.due(t0 + Duration::from_millis(150)), "50 ms of messages after a page of 100 ms");
    assert!(share.due(t0 + Duration::from_millis(200)), "100 ms of messages after a page of 100 ms");
    // A page that did not move: the last page's cost stays the measure.
    share.paged(t0 + Duration::from_millis(200), false, t0 + Duration::from_millis(200));
    for _ in 0..PAGE_EVERY - 1 {
        share.handled();
    }
    assert!(!share.due(t0 + Duration::from_secs(10)), "fewer than PAGE_EVERY messages");
    share.handled();
    assert!(!share.due(t0 + Duration::from_millis(250)) && share.due(t0 + Duration::from_millis(300)));
    // A cheap page: PAGE_EVERY messages are enough.
    share.paged(t0 + Duration::from_millis(300), true, t0 + Duration::from_millis(300));
    for _ in 0..PAGE_EVERY {
        share.handled();
    }
    assert!(share.due(t0 + Duration::from_millis(300)));
}

/// Review of Elasticsearch, F11: lanes multiplied the fan-outs a process
/// runs at once (on Elasticsearch a point in time and page bulks each).
/// Four renames of four keys, each paused between its pages so that all
/// four would overlap: with `--max-lane-fan-outs 2` at most two run in
/// lanes at once, the others wait their turn, and everything is applied.
#[test]
fn the_processs_fan_outs_in_lanes_are_bounded() {
    let r = Rig::new(|c| {
        c.fan_out = FanOut { page_size: 10, page_pause: Duration::from_millis(30) };
        c.max_lane_fan_outs = 2;
    });
    let keys = ["/a", "/b", "/c", "/d"];
    for k in keys {
        for i in 0..40 {
            r.produce(upsert(&format!("{k}{i}"), &format!("{k}/x/{i}.txt")));
        }
    }
    for k in keys {
        r.produce(Command::RenamePath { from: format!("{k}/x"), to: format!("{k}/y") });
    }
    r.produce(upsert("e1", "/e/e1.txt"));
    let run = r.start();
    let end = r.end();
    run.wait_next(end);
    assert_eq!(run.stop(), end);
    assert_eq!(r.shared.lane_fan_outs.peak(), 2, "fan-outs in lanes at once");
    assert_eq!(r.shared.lane_fan_outs.open(), 0, "every slot given back");
    let files = r.files();
    assert_eq!(files.len(), 161);
    assert!(files.iter().all(|(id, p)| id == "e1" || p.contains("/y/")), "{files:?}");
}

/// Issue 47: the pages of the fan-outs in lanes go to the tenants in turn.
/// Loads 100 files into each tenant's directory of `dirs` and commits
/// them (a fan-out that reads uncommitted writes of its batch runs whole,
/// not in a lane), produces `before`, then renames each directory's `x` to
/// `y` and applies everything: the renames' offsets, and the order their
/// fan-outs finished in. Every file is checked renamed. The renames' pages
/// are held (fault `fanout.hold`) until `together` of them are in lanes at
/// once: which one finishes first is then decided by the turns alone, not
/// by how soon the feed delivers the later renames (the applier ran the
/// first rename's pages alone while a loaded machine delivered the others
/// late, and it finished first).
#[cfg(feature = "failpoints")]
fn renames_in_lanes(r: &Rig, dirs: &[(&str, &str)], before: &[Command], together: usize) -> (Vec<i64>, Vec<i64>) {
    for (t, d) in dirs {
        for i in 0..100 {
            r.produce(upsert(&format!("{d}-{i}"), &format!("{d}/x/{i}.txt")).scoped(Some(t)));
        }
    }
    let run = r.start();
    run.wait_next(r.end());
    run.stop();
    for c in before {
        r.produce(c.clone());
    }
    let renames: Vec<i64> = dirs.iter().map(|(t, d)| r.produce(Command::RenamePath { from: format!("{d}/x"), to: format!("{d}/y") }.scoped(Some(t)))).collect();
    let faults = tempfile::tempdir().unwrap();
    let keys: Vec<String> = dirs.iter().map(|(t, d)| crate::command::tenant::scope(Some(t), d)).collect();
    fault(faults.path(), "fanout.hold", &keys.join("\n"));
    let run = r.start();
    eventually(&format!("{together} renames in lanes at once"), || r.shared.lane_fan_outs.open() >= together);
    std::fs::remove_file(faults.path().join("fanout.hold")).unwrap();
    let end = r.end();
    run.wait_next(end);
    assert_eq!(run.stop(), end);
    let files = r.files();
    assert_eq!(files.len(), dirs.len() * 100 + before.len());
    let renamed = |id: &str| dirs.iter().any(|(t, d)| id.starts_with(&crate::command::tenant::scope(Some(t), &format!("{d}-"))));
    assert!(files.iter().filter(|(id, _)| renamed(id)).all(|(_, p)| p.contains("/y/")), "{files:?}");
    let finished = r.shared.stats.lane_fan_outs_finished.lock().unwrap().clone();
    assert_eq!(finished.len(), dirs.len(), "each rename ran in a lane: {finished:?}");
    (renames, finished)
}

/// `acme` renames three directories and `globex` one, each of 10 pages:
/// `globex`'s rename finishes first, while `acme`'s three share the other
/// half of the pages. With the keys alone in turn, `globex` had one page
/// in four and finished last (it started last). Everything is applied.
#[test]
#[cfg(feature = "failpoints")]
fn the_pages_of_fan_outs_in_lanes_go_to_the_tenants_in_turn() {
    let r = Rig::new(|c| c.fan_out = FanOut::pages_of(10));
    let (renames, finished) = renames_in_lanes(&r, &[("acme", "/a1"), ("acme", "/a2"), ("acme", "/a3"), ("globex", "/b")], &[], 4);
    assert_eq!(finished[0], renames[3], "globex's rename (at {}) did not finish first: {finished:?}", renames[3]);
}

/// A tenant's share of the lanes (issue 47): with two lanes, `acme`'s two
/// renames no longer take both while `globex` is active. `acme`'s second
/// is held until its first is done, and `globex`'s rename, sent after
/// both, takes the other lane: it finishes before `acme`'s second. With
/// every lane `acme`'s, `globex`'s rename waited for a lane and finished
/// last. Everything is applied.
#[test]
#[cfg(feature = "failpoints")]
fn one_tenant_takes_all_the_lanes_but_one_while_another_is_active() {
    let r = Rig::new(|c| {
        c.fan_out = FanOut::pages_of(10);
        c.lanes = 2;
    });
    // globex is active before acme's renames come.
    let active = upsert("b-new", "/b/new.txt").scoped(Some("globex"));
    // acme's first and globex's rename in the two lanes; acme's second held.
    let (renames, finished) = renames_in_lanes(&r, &[("acme", "/a1"), ("acme", "/a2"), ("globex", "/b")], &[active], 2);
    let at = |pos: i64| finished.iter().position(|f| *f == pos).unwrap();
    assert!(at(renames[2]) < at(renames[1]), "globex's rename (at {}) waited for acme's second (at {}): {finished:?}", renames[2], renames[1]);
}
