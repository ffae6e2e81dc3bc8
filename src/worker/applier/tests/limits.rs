//! Messages over the topics' size limit (issue 29, 5): a letter or a move's
//! chunk the broker refuses for its size fails for good, and used to be
//! retried for ever, holding its partition.

use super::*;

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
fn a_letter_over_the_topics_limit_is_written_without_its_command() {
    #[cfg(feature = "failpoints")]
    {
        let r = Rig::new(|c| c.max_attempts = 1);
        r.outbox.limit.store(2000, Ordering::SeqCst);
        let faults = tempfile::tempdir().unwrap();
        fault(faults.path(), "index.reject", "/big\n");
        let big = r.produce(Command::UpsertFile { id: "big".into(), path: "/big/f.txt".into(), contents: "x".repeat(3000), previous_path: None });
        let after = r.produce(upsert("a", "/a/a.txt"));
        let run = r.start();
        run.wait_next(after + 1);
        assert_eq!(run.stop(), after + 1);
        assert_eq!(r.letters(), vec![Sent { reason: "index_rejected".into(), origin_offset: big, key: "/big".into() }]);
        let omitted = r.outbox.omitted.lock().unwrap().clone();
        assert_eq!(omitted.len(), 1);
        assert_eq!(omitted[0].0, big);
        assert!(omitted[0].1 > 3000, "the command's size: {omitted:?}");
        assert_eq!(r.file_ids(), vec!["a"]);
    }
}

#[test]
fn a_chunk_over_the_topics_limit_gives_its_rename_up_and_the_partition_goes_on() {
    let r = Rig::new(|c| c.max_attempts = 2);
    r.produce(Command::UpsertFile { id: "small".into(), path: "/s/a/small.txt".into(), contents: "s".into(), previous_path: None });
    r.produce(Command::UpsertFile { id: "big".into(), path: "/s/a/big.txt".into(), contents: "x".repeat(3000), previous_path: None });
    r.outbox.limit.store(2000, Ordering::SeqCst);
    let rename = r.produce(Command::RenamePath { from: "/s/a".into(), to: "/t/a".into() });
    r.start().rename_given_up(&r, rename, "index_rejected");
    let ids = r.file_ids();
    assert_eq!(ids, vec!["big", "later", "small"], "nothing lost");
}

/// Review of verify, F18: `denorm_repairs_total` was also counted by the
/// replays (a rebuild's worker exports it), so every rebuild added the
/// log's repairs again. The live worker counts a repair; a rebuild's and a
/// verify's replay of the same log do not. (The global recorder is this
/// test's own: nextest runs each test in a process of its own.)
#[test]
fn a_repair_is_counted_by_the_live_worker_and_not_by_a_replay() {
    let Ok(prometheus) = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder() else {
        panic!("another recorder is installed: run with nextest (a process per test)");
    };
    let applied = || {
        let text = prometheus.render();
        let line = text.lines().find(|l| l.starts_with(crate::metrics::REPAIRS_TOTAL) && l.contains(r#"outcome="applied""#))?.to_string();
        line.rsplit(' ').next()?.parse::<f64>().ok()
    };
    let r = Rig::new(|_| {});
    let mut repair = Envelope::new(upsert("a", "/a/a.txt"));
    repair.repair = Some(crate::command::Repair { unchanged_since: -1, seen: Some(false) });
    let at = r.append("/a", r.codec.encode(&repair));
    let run = r.start();
    run.wait_next(at + 1);
    run.stop();
    assert_eq!(applied(), Some(1.0));
    let verify = ReplayOf::Verify { until: Arc::new([(0, at)].into()), keys: None };
    for of in [ReplayOf::Rebuild { accept_gaps: false }, verify] {
        let tune = move |c: &mut WorkerConfig| c.mode = Mode::Replay(Replay { of, ..Default::default() });
        let replay = Rig::on(Arc::new(Mutex::new(r.log.lock().unwrap().clone())), 0, 1, tune);
        let run = replay.start();
        run.wait_next(at + 1);
        run.stop();
        assert_eq!(replay.file_ids(), vec!["a"], "the replay applied the repair");
        assert_eq!(applied(), Some(1.0), "a replay counted the repair again");
    }
}

/// A message that is dead-lettered as it is (here undecodable) of another
/// key, while a fan-out is held in its lane: it was routed as a barrier,
/// waiting for every fan-out of the partition to end, and every message
/// after it with it (held here: nothing was dead-lettered, applied after
/// it, or committed). It is now handled at once, and the partition goes
/// on.
#[test]
#[cfg(feature = "failpoints")]
fn an_undecodable_message_does_not_wait_for_another_keys_fan_out() {
    let r = Rig::new(|c| c.fan_out = crate::apply::FanOut::pages_of(10));
    for i in 0..40 {
        r.produce(upsert(&format!("a{i}"), &format!("/a/x/a{i}.txt")));
    }
    r.produce(Command::RenamePath { from: "/a/x".into(), to: "/a/y".into() });
    let poison = r.append("/c", b"not a command".to_vec());
    r.produce(upsert("d", "/d/d.txt"));
    let faults = tempfile::tempdir().unwrap();
    fault(faults.path(), "fanout.hold", "/a");
    let run = r.start();
    eventually("the file after the undecodable message applied", || r.file_ids().contains(&"d".to_string()));
    assert_eq!(r.letters().iter().map(|l| (l.origin_offset, l.key.as_str())).collect::<Vec<_>>(), vec![(poison, "/c")]);
    std::fs::remove_file(faults.path().join("fanout.hold")).unwrap();
    let end = r.end();
    run.wait_next(end);
    assert_eq!(run.stop(), end);
}

/// Garbage keyed by keys no valid message has (64 KiB each) is
/// dead-lettered without its key and parks nothing; garbage under valid
/// but distinct keys parks at most `--max-parked-keys` of them, and the
/// commands of a key past that bound are applied.
#[test]
fn hostile_keys_park_at_most_the_bound_and_oversized_ones_nothing() {
    let r = Rig::new(|c| c.max_parked_keys = 5);
    let long = "k".repeat(64 << 10);
    for i in 0..50 {
        r.append(&format!("{i}-{long}"), b"junk".to_vec());
    }
    for i in 0..8 {
        r.append(&format!("/junk{i}"), b"junk".to_vec());
    }
    let after = r.produce(upsert("j7", "/junk7/f.txt"));
    let run = r.start();
    run.wait_next(after + 1);
    assert_eq!(run.stop(), after + 1);
    let letters = r.letters();
    assert_eq!(letters.iter().filter(|l| l.reason == "oversized_key").count(), 50, "{letters:?}");
    assert!(letters.iter().filter(|l| l.reason == "oversized_key").all(|l| l.key.is_empty()), "a letter kept an oversized key");
    let parked = r.shared.backend.open_shard(0).unwrap().parking().len();
    assert_eq!(parked, 5, "parked keys: the bound");
    assert_eq!(r.file_ids(), vec!["j7"], "a key past the bound is not parked: its later command applied");
}

/// A command of the default tenant keyed with tenant globex's key (any
/// producer can write one) is dead-lettered, and does not park globex's
/// key: globex's own command behind it is applied.
#[test]
fn a_command_keyed_with_another_tenants_key_parks_nothing() {
    let r = Rig::new(|_| {});
    let user = |name: &str| Command::UpsertUser { id: "u8".into(), name: name.into(), email: String::new(), dob: "1970-01-01".into() };
    let forged = r.append("globex\u{1f}u8", r.codec.encode(&Envelope::new(user("Mallory"))));
    let own = r.append("globex\u{1f}u8", r.codec.encode(&Envelope::new(user("Grace")).of_tenant(Some("globex"))));
    let run = r.start();
    run.wait_next(own + 1);
    assert_eq!(run.stop(), own + 1);
    assert_eq!(r.letters(), vec![Sent { reason: "key_mismatch".into(), origin_offset: forged, key: "globex\u{1f}u8".into() }]);
    assert!(r.shared.backend.open_shard(0).unwrap().parking().is_empty(), "globex's key parked by another tenant's message");
    assert_eq!(r.docs().len(), 1, "globex's user applied: {:?}", r.docs());
}
