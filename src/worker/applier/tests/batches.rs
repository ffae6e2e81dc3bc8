//! The applier's batching, positioning, isolation, parking and stopping
//! scenarios.

use super::*;

#[test]
fn commands_are_committed_in_batches_and_only_whole_batches_are_published() {
    // Batches end at 10 commands: the linger and the quiet time are long.
    let r = Rig::new(|c| {
        c.max_batch = 10;
        c.commit_linger = Duration::from_secs(600);
        c.commit_quiet = Duration::from_secs(600);
    });
    for i in 0..25 {
        r.produce(upsert(&format!("f{i}"), &format!("/a/f{i}.txt")));
    }
    let run = r.start();
    let mut seen = std::collections::BTreeSet::new();
    eventually("two batches published", || {
        seen.insert(run.next());
        run.next() >= 20
    });
    for i in 25..30 {
        r.produce(upsert(&format!("f{i}"), &format!("/a/f{i}.txt")));
    }
    eventually("the third batch published", || {
        seen.insert(run.next());
        run.next() >= 30
    });
    assert!(seen.iter().all(|n| [-1, 10, 20, 30].contains(n)), "published offsets {seen:?}: only ends of batches");
    assert_eq!(run.stop(), 30);
    let docs = r.docs();
    assert_eq!(docs.len(), 30);
    assert!(docs.iter().all(|(id, pos)| format!("f{pos}") == *id), "{docs:?}");
}

#[test]
fn a_new_owner_resumes_at_the_checkpoint_itself_and_applies_nothing_twice() {
    let r = Rig::new(|_| {});
    r.produce_files(0..20);
    let first = r.start();
    first.wait_next(20);
    assert_eq!(first.seeks.lock().unwrap().clone(), vec![0], "a fresh shard starts at the beginning");
    assert_eq!(first.stop(), 20);
    let applied = r.shared.stats.applied.load(Ordering::SeqCst);
    assert_eq!(applied, 20);
    // The partition is assigned again (a rebalance): the new owner asks for
    // the checkpoint's own offset, whose message the index applied (its
    // fingerprint is checked), and applies only what follows.
    r.produce_files(20..25);
    let second = r.start();
    second.wait_next(25);
    assert_eq!(second.seeks.lock().unwrap().clone(), vec![19], "resumes at the checkpoint");
    assert_eq!(second.stop(), 25);
    assert_eq!(r.shared.stats.applied.load(Ordering::SeqCst), 25, "nothing applied twice");
    assert_eq!(r.docs().len(), 25);
}

/// Starts overtaken more often than the applier seeks again, from a group
/// offset ahead of the shard's checkpoint (an index restored from an older
/// copy): the first message is past the checkpoint the log keeps. The
/// partition stops and says why, rather than skip what lies between.
#[test]
fn a_fourth_overtaken_seek_stops_the_partition_rather_than_skip_a_range() {
    let r = Rig::new(|_| {});
    r.produce_files(0..20);
    let first = r.start();
    first.wait_next(20);
    assert_eq!(first.stop(), 20);
    r.produce_files(20..30);
    r.stale_from.store(25, Ordering::SeqCst);
    r.stale_starts.store(4, Ordering::SeqCst);
    let second = r.start();
    let error = second.stopped_by_itself().to_string();
    assert!(error.contains("read from offset 25") && error.contains("skip offsets 20..25"), "{error}");
    assert_eq!(r.docs().len(), 20, "nothing past the checkpoint applied: {:?}", r.docs());
}

/// A positioning the applier did not ask for, ahead of what it read (a
/// seek of another applier of the partition served to this one): the
/// partition stops, rather than read on from there over a hole.
#[test]
fn a_positioning_the_applier_did_not_ask_for_past_its_reading_stops_the_partition() {
    let r = Rig::new(|_| {});
    r.produce_files(0..30);
    *r.late_seek.lock().unwrap() = Some((10, 20));
    let run = r.start();
    let error = run.stopped_by_itself().to_string();
    assert!(error.contains("did not ask for"), "{error}");
    let docs = r.docs();
    assert!(docs.iter().all(|(id, _)| id[1..].parse::<usize>().unwrap() < 20), "applied from the stray position: {docs:?}");
}

/// A seek right after an assignment can be overtaken by the client's own
/// start from the group's offset (here: the beginning): the first message
/// is then not the one sought. The applier seeks again rather than taking
/// the log for another one (it used to stop the worker: "the partition's
/// log now starts over at offset 0").
#[test]
fn a_seek_overtaken_by_the_partitions_own_start_is_made_again() {
    let r = Rig::new(|_| {});
    r.produce_files(0..20);
    let first = r.start();
    first.wait_next(20);
    assert_eq!(first.stop(), 20);
    r.produce_files(20..25);
    r.stale_starts.store(2, Ordering::SeqCst);
    let second = r.start();
    second.wait_next(25);
    assert_eq!(second.seeks.lock().unwrap().clone(), vec![19, 19, 19], "sought again after each overtaken start");
    assert_eq!(second.stop(), 25);
    assert_eq!(r.shared.stats.applied.load(Ordering::SeqCst), 25, "nothing applied twice");
    assert_eq!(r.docs().len(), 25);
}

/// A rig whose batches wait to be committed (until the feed goes quiet),
/// with commits holding a write of document `id` refused (fault point
/// `index.reject-commit`, on while the directory returned lives).
#[cfg(feature = "failpoints")]
fn refusing_commits_of(id: &str) -> (Rig, tempfile::TempDir) {
    let r = Rig::new(|c| {
        c.max_attempts = 2;
        c.commit_linger = Duration::from_secs(600);
        c.commit_quiet = Duration::from_millis(50);
    });
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "index.reject-commit", &format!("{id}\n"));
    (r, faults)
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
fn a_command_the_index_refuses_at_commit_is_isolated_and_the_rest_of_its_batch_applied() {
    #[cfg(feature = "failpoints")]
    {
        // A commit holding a write of "bad" is refused: the batch cannot
        // say which command; the applier commits them one at a time.
        let (r, _faults) = refusing_commits_of("bad");
        let mut bad_at = 0;
        // "bad" under a key of its own: the key is parked behind it, and
        // the others' commands are applied.
        for i in 0..12 {
            if i == 5 {
                bad_at = r.produce(upsert("bad", "/bad/bad.txt"));
            } else {
                r.produce(upsert(&format!("f{i}"), &format!("/a/f{i}.txt")));
            }
        }
        r.produce(upsert("after", "/b/after.txt"));
        let run = r.start();
        run.wait_next(13);
        assert_eq!(run.stop(), 13);
        let letters = r.letters();
        assert_eq!(letters, vec![Sent { reason: "index_rejected".into(), origin_offset: bad_at, key: "/bad".into() }]);
        let ids = r.file_ids();
        assert_eq!(ids.len(), 12, "{ids:?}");
        assert!(!ids.contains(&"bad".to_string()));
    }
}

/// Found by the randomized consistency test: a fan-out's scan reads
/// committed state, so the embedded index commits the batch's earlier
/// writes inside it. When that commit was refused for a write of an
/// earlier command, the fan-out took the blame and was dead-lettered in its
/// place (a user's profile change, for the operator's refused file).
#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
fn a_refusal_met_by_a_fan_out_is_traced_to_the_earlier_command_of_its_batch() {
    #[cfg(feature = "failpoints")]
    {
        let (r, _faults) = refusing_commits_of("bad");
        r.produce(upsert("f1", "/a/x/f1.txt"));
        r.produce(upsert("f2", "/a/x/f2.txt"));
        let bad_at = r.produce(upsert("bad", "/bad/bad.txt"));
        // In the same batch as the refused write: fan-outs of other keys.
        r.produce(Command::RenamePath { from: "/a/x".into(), to: "/a/y".into() });
        r.produce(Command::UpsertUser { id: "u1".into(), name: "Ada".into(), email: "".into(), dob: "1970-01-01".into() });
        let run = r.start();
        run.wait_next(5);
        assert_eq!(run.stop(), 5);
        assert_eq!(r.letters(), vec![Sent { reason: "index_rejected".into(), origin_offset: bad_at, key: "/bad".into() }]);
        let mut docs = Vec::new();
        let search = crate::index::embedded::EmbeddedIndex::open_existing(r.dir.path()).unwrap().search().unwrap();
        search.dump(&mut |d| docs.push(d)).unwrap();
        let paths: Vec<String> = docs
            .iter()
            .filter_map(|d| match d {
                crate::index::Doc::File(f) => Some(f.full_path()),
                _ => None,
            })
            .collect();
        assert_eq!(paths.len(), 2, "{docs:?}");
        assert!(paths.iter().all(|p| p.starts_with("/a/y/")), "the rename was applied: {paths:?}");
        assert!(docs.iter().any(|d| matches!(d, crate::index::Doc::User(u) if u.name == "Ada")), "the user was applied: {docs:?}");
    }
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
fn an_aborted_command_parks_its_key_and_the_keys_later_commands_wait_in_the_dead_letter_topic() {
    #[cfg(feature = "failpoints")]
    {
        let r = Rig::new(|c| c.max_attempts = 2);
        let faults = tempfile::tempdir().unwrap();
        // Commands of key /p are rejected by the index for good.
        fault(faults.path(), "index.reject", "/p\n");
        let aborted = r.produce(upsert("p1", "/p/1.txt"));
        r.produce(upsert("q1", "/q/1.txt"));
        // Accepted by the index now, but behind the aborted command.
        let later = r.produce(upsert("p2", "/p/2.txt"));
        let run = r.start();
        eventually("the first letter", || !r.letters().is_empty());
        std::fs::remove_file(faults.path().join("index.reject")).unwrap();
        run.wait_next(3);
        assert_eq!(run.stop(), 3);
        assert_eq!(r.letters(), vec![Sent { reason: "index_rejected".into(), origin_offset: aborted, key: "/p".into() }, Sent { reason: "parked".into(), origin_offset: later, key: "/p".into() },]);
        assert_eq!(r.file_ids(), vec!["q1".to_string()], "other keys flow; the parked key's later command waits");
    }
}

#[test]
fn a_stop_in_the_middle_of_a_batch_commits_what_is_applied_and_publishes_it() {
    let r = Rig::new(|c| {
        c.commit_linger = Duration::from_secs(600);
        c.commit_quiet = Duration::from_secs(600);
    });
    for i in 0..30 {
        r.produce(upsert(&format!("f{i}"), &format!("/a/f{i}.txt")));
    }
    let run = r.start();
    eventually("30 commands applied", || r.shared.stats.applied.load(Ordering::SeqCst) >= 30);
    assert_eq!(run.next(), -1, "nothing committed yet: the batch is open");
    assert_eq!(run.stop(), 30, "the stop commits the open batch and publishes it");
    assert_eq!(r.docs().len(), 30);
    let checkpoint = EmbeddedIndex::open_existing(r.dir.path()).unwrap().checkpoints().unwrap();
    assert_eq!(checkpoint.get(&0).map(|c| c.offset), Some(29));
}

/// Issue 29, 3: an operator's `clear` resumed a key in the live index; a
/// rebuild wrote the key's letters again, at higher dead-letter offsets,
/// which the `DISCARD` (covering letters up to an offset) no longer covered:
/// the key stayed parked in the new generation and its later commands were
/// dead-lettered. Parking is decided on command-topic positions now.
#[test]
fn a_key_an_operator_released_is_released_in_a_replay_too() {
    use crate::command::control::{Action, Control};
    let live = Rig::new(|_| {});
    let poison = live.append("/p", b"not an avro message".to_vec());
    let parked = live.produce(upsert("q", "/p/q.txt"));
    let run = live.start();
    run.wait_next(parked + 1);
    assert_eq!(live.letters().len(), 2);
    // `denorm dlq clear --key /p`: the letters up to dead-letter offset 1,
    // written at command-topic offsets up to `parked`.
    let discard = Control { action: Action::Discard, key: "/p".into(), dlq_partition: 0, dlq_offset: -1, through: 1, origin_offset: -1, payload: Vec::new(), requested_at: 0, through_at: parked };
    live.append("/p", live.codec.encode_control(&discard));
    let later = live.produce(upsert("later", "/p/later.txt"));
    run.wait_next(later + 1);
    assert_eq!(run.stop(), later + 1);
    assert_eq!(live.file_ids(), vec!["later"], "resumed");
    assert_eq!(live.outbox.markers.lock().unwrap().clone(), vec![("/p".to_string(), MarkerKind::Cleared)]);
    // A rebuild replays the same log; the dead-letter topic holds the two
    // letters and the marker.
    let rebuilt = live.replay(3, vec![("/p".into(), 0, MarkerKind::Cleared, 1)]);
    let run = rebuilt.start();
    run.wait_next(later + 1);
    assert_eq!(run.stop(), later + 1);
    assert_eq!(rebuilt.file_ids(), vec!["later"], "resumed in the replay too: {:?}", rebuilt.letters());
    let letters: Vec<(String, i64)> = rebuilt.letters().into_iter().map(|l| (l.reason, l.origin_offset)).collect();
    assert_eq!(letters, vec![("not_single_object".into(), poison), ("parked".into(), parked)]);
    // Issue 29, 13: the rebuild does not write the marker again.
    assert!(rebuilt.outbox.markers.lock().unwrap().is_empty());
}

/// Review of verify, F15: an operator's request of an earlier format (or
/// one `migrate` copied with expired letters) says which letters it covers
/// by dead-letter offset alone (`through_at` -1). Live, the key's second
/// letter is past it and the key stays parked. The verify's replay writes
/// no letters: its own offsets (counting down from -2) were always
/// "covered", so it released the key and applied its later commands, which
/// the verify then reported, and `--repair` had parked live every run. It
/// now parks by the offsets of the live run's letters.
#[test]
fn a_replay_that_writes_no_letters_parks_by_the_live_letters_offsets() {
    use crate::command::control::{Action, Control};
    let live = Rig::new(|_| {});
    let poison = live.append("/p", b"not an avro message".to_vec());
    let parked = live.produce(upsert("q", "/p/q.txt"));
    let run = live.start();
    run.wait_next(parked + 1);
    // `clear` of the first letter only (dead-letter offset 0), in the
    // earlier format.
    let discard = Control { action: Action::Discard, key: "/p".into(), dlq_partition: 0, dlq_offset: -1, through: 0, origin_offset: -1, payload: Vec::new(), requested_at: 0, through_at: -1 };
    live.append("/p", live.codec.encode_control(&discard));
    let later = live.produce(upsert("later", "/p/later.txt"));
    run.wait_next(later + 1);
    assert_eq!(run.stop(), later + 1);
    assert!(live.file_ids().is_empty(), "live, the key stays parked: {:?}", live.letters());
    let letters: Vec<(i64, i64)> = live.letters().iter().enumerate().map(|(i, l)| (l.origin_offset, i as i64)).collect();
    assert_eq!(letters.len(), 3, "the poison, q and later: {:?}", live.letters());
    // The verify's replay: no letters written, the live ones' offsets known.
    let log = Arc::new(Mutex::new(live.log.lock().unwrap().clone()));
    let written: crate::worker::LettersWritten = letters.iter().map(|&(origin, dlq)| ((0, origin), dlq)).collect();
    let replay =
        Rig::on(log, 0, 1, |c| c.mode = Mode::Replay(Replay { letters_written: Arc::new(written), of: ReplayOf::Verify { until: Arc::new([(0, later)].into()), keys: None }, ..Default::default() }));
    let run = replay.start();
    run.wait_next(later + 1);
    assert_eq!(run.stop(), later + 1);
    assert!(replay.file_ids().is_empty(), "the replay released the key the live run kept parked (poison at {poison})");
}

/// A top-level directory `/{prefix}{n}` whose murmur2 partition of 4 is,
/// or (`home` false) is not, 0.
fn tree(prefix: &str, home: bool) -> String {
    (0..).map(|n| format!("/{prefix}{n}")).find(|t| (crate::command::partitioner::partition_of(t, 4) == 0) == home).unwrap()
}

/// Issue 29, 12: placement was never checked. A message whose key does not
/// hash to its partition (a producer with another partitioner) is
/// dead-lettered; with `--any-partitioner` it is applied, and renames
/// across top-level directories are refused instead (their files would go
/// to the murmur2 partition, which the key's own commands never reach).
#[test]
fn a_message_in_another_partition_than_its_keys_is_dead_lettered_unless_any_partitioner() {
    let (home, away) = (tree("home", true), tree("away", false));
    let r = Rig::of(4, |_| {});
    r.produce(upsert("h", &format!("{home}/h.txt")));
    let misplaced = r.produce(upsert("a", &format!("{away}/a.txt")));
    let run = r.start();
    run.wait_next(2);
    assert_eq!(run.stop(), 2);
    assert_eq!(r.letters(), vec![Sent { reason: "wrong_partition".into(), origin_offset: misplaced, key: away.clone() }]);
    assert_eq!(r.file_ids(), vec!["h"]);

    let r = Rig::of(4, |c| c.any_partitioner = true);
    r.produce(upsert("h", &format!("{home}/h.txt")));
    r.produce(upsert("a", &format!("{away}/a.txt")));
    let rename = r.produce(Command::RenamePath { from: format!("{home}/h.txt"), to: format!("{away}/h.txt") });
    let run = r.start();
    run.wait_next(3);
    assert_eq!(run.stop(), 3);
    assert_eq!(r.file_ids(), vec!["a", "h"]);
    assert_eq!(r.letters(), vec![Sent { reason: "invalid_command".into(), origin_offset: rename, key: home }]);
}

/// Issue 29, 8: offsets that carry no message (a transactional producer's
/// markers, an aborted transaction's records) used to hold the published
/// offset short of the end, where `produce --wait` and a rebuild's cutover
/// wait, for ever; and a partition whose first message is not at offset 0
/// read as a gap, which stopped it.
#[test]
fn offsets_without_messages_are_published_past_and_are_no_gap() {
    let r = Rig::new(|c| c.commit_quiet = Duration::from_millis(20));
    // A first transaction aborted: two offsets, no message.
    r.marker();
    r.marker();
    let first = r.produce(upsert("a", "/a/a.txt"));
    r.marker();
    let run = r.start();
    run.wait_next(first + 2);
    let second = r.produce(upsert("b", "/a/b.txt"));
    r.marker();
    run.wait_next(second + 2);
    assert_eq!(run.stop(), second + 2);
    // A new owner: the checkpoint's message, then a marker, then the end.
    let run = r.start();
    run.wait_next(second + 2);
    assert_eq!(run.stop(), second + 2);
    assert_eq!(r.file_ids(), vec!["a", "b"]);
    assert_eq!(r.shared.stats.applied.load(Ordering::SeqCst), 2, "nothing applied twice");
}

/// Issue 29, 9: a partition whose first offsets retention deleted stops
/// (nothing skipped silently), unless the operator accepts the loss
/// (`rebuild --accept-gaps`): then what is left is applied.
#[test]
fn a_gap_stops_the_partition_unless_the_loss_is_accepted() {
    let gone = |r: &Rig| {
        r.produce(upsert("gone", "/a/gone.txt"));
        r.produce(upsert("kept", "/a/kept.txt"));
        r.trim(1);
    };
    let r = Rig::new(|_| {});
    gone(&r);
    let mut run = r.start();
    eventually("the partition stopped", || run.part.finished());
    let error = run.part.join().unwrap_err();
    assert!(error.to_string().contains("--accept-gaps"), "{error}");
    let r = Rig::new(|c| c.mode = Mode::Replay(Replay { of: ReplayOf::Rebuild { accept_gaps: true }, ..Default::default() }));
    gone(&r);
    let run = r.start();
    run.wait_next(2);
    assert_eq!(run.stop(), 2);
    assert_eq!(r.file_ids(), vec!["kept"]);
}

/// Issue 47: a `PLACE` control message (a tenant moved between placements
/// on Elasticsearch) is carried out without effect where there are no
/// placements, live and in a replay: not dead-lettered, the commands
/// around it applied. The model of the topic passes it too.
#[test]
fn a_tenants_move_between_placements_passes_an_index_without_placements() {
    use crate::command::control::{Action, Control};
    let live = Rig::new(|_| {});
    live.produce(upsert("a", "/p/a.txt"));
    let place = Control { action: Action::Place, key: String::new(), dlq_partition: -1, dlq_offset: -1, through: 1, origin_offset: 0, payload: Vec::new(), requested_at: 0, through_at: -1 };
    live.append("", live.codec.encode_control(&place));
    let last = live.produce(upsert("b", "/p/b.txt"));
    let run = live.start();
    run.wait_next(last + 1);
    assert_eq!(run.stop(), last + 1);
    assert_eq!(live.file_ids(), vec!["a", "b"]);
    assert!(live.letters().is_empty(), "{:?}", live.letters());
    let rebuilt = live.replay(3, Vec::new());
    let run = rebuilt.start();
    run.wait_next(last + 1);
    assert_eq!(run.stop(), last + 1);
    assert_eq!(rebuilt.file_ids(), vec!["a", "b"]);
    assert!(rebuilt.letters().is_empty());
}
