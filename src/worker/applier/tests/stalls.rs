//! Messages that wait on something the log may never bring: an owner
//! change whose delete half is never applied, a move whose rest never
//! comes. Each waits at most `--wait-limit-secs`, is then dead-lettered
//! with a reason of its own and parks its key, and the partition's other
//! keys go on.

use super::moves::{chunk, destination};
use super::*;

/// The first of `names` whose key is on partition 0 of `partitions`.
fn on_partition_0(partitions: i32, names: impl Fn(usize) -> String) -> String {
    (0..).map(names).find(|k| crate::command::partitioner::partition_of(k, partitions) == 0).unwrap()
}

#[test]
fn an_owner_change_whose_delete_half_is_never_applied_is_dead_lettered_past_the_wait_limit() {
    let r = Rig::of(2, |c| {
        c.commit_quiet = Duration::from_millis(20);
        c.wait_limit = Duration::from_millis(300);
    });
    let user = on_partition_0(2, |i| format!("u{i}"));
    let dir = on_partition_0(2, |i| format!("/k{i}"));
    let post = |id: &str, previous: Option<&str>| Command::UpsertPost { id: id.into(), user_id: user.clone(), title: "t".into(), body: "b".into(), previous_user_id: previous.map(Into::into) };
    // Its delete half named at an offset partition 1 never reaches.
    let mut e = Envelope::new(post("p", Some("old")));
    e.after = Some(crate::command::LogPosition { partition: 1, offset: i64::MAX / 2 });
    let waiting = r.append(&user, r.codec.encode(&e));
    let behind = r.append(&user, r.codec.encode(&Envelope::new(post("p2", None))));
    let other = r.produce(upsert("q", &format!("{dir}/q.txt")));
    let run = r.start();
    run.wait_next_within(Duration::from_secs(30), other + 1);
    assert_eq!(run.stop(), other + 1);
    assert_eq!(
        r.letters(),
        vec![Sent { reason: "takeover_timeout".into(), origin_offset: waiting, key: user.clone() }, Sent { reason: "parked".into(), origin_offset: behind, key: user.clone() }],
        "the upsert dead-lettered and its key parked behind it"
    );
    let ids: Vec<String> = r.docs().into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, vec!["q"], "the partition's other key applied, the waiting key's posts not");
}

#[test]
fn a_move_whose_rest_never_comes_is_ended_past_the_wait_limit_and_its_chunk_dead_lettered() {
    let r = destination(|c| c.wait_limit = Duration::from_millis(300));
    let before = r.produce(upsert("d0", "/dst/old.txt"));
    // A first chunk (at source offset 0: no take-over wait) whose last
    // chunk is never written.
    let started = r.produce_move(&chunk(0, 0, false, &["m1"]));
    let run = r.start();
    let parked = r.produce(upsert("d1", "/dst/new.txt"));
    let other = r.produce(upsert("x", "/x/x.txt"));
    run.wait_next_within(Duration::from_secs(30), other + 1);
    assert_eq!(run.stop(), other + 1);
    assert_eq!(
        r.letters(),
        vec![Sent { reason: "move_incomplete".into(), origin_offset: started, key: "/dst".into() }, Sent { reason: "parked".into(), origin_offset: parked, key: "/dst".into() }],
        "the chunk dead-lettered with its files, its key parked behind it"
    );
    assert_eq!(r.file_ids(), vec!["d0", "x"], "the move's file withdrawn, the other key applied (d0 at {before} came before)");
}

/// A move's chunks that keep coming in time are never expired, however
/// long the whole move takes: the limit counts from its last chunk.
#[test]
fn a_move_whose_chunks_keep_coming_is_not_expired() {
    let r = destination(|c| c.wait_limit = Duration::from_secs(2));
    let run = r.start();
    r.produce_move(&chunk(0, 0, false, &["m0"]));
    r.produce(upsert("x", "/x/x.txt"));
    // Five more chunks, a quarter of the limit apart: the move lasts
    // longer than the limit, no chunk comes later than it.
    for n in 1..6 {
        std::thread::sleep(Duration::from_millis(500));
        r.produce_move(&chunk(0, n, n == 5, &[&format!("m{n}")]));
    }
    let end = r.end();
    run.wait_next_within(Duration::from_secs(30), end);
    assert_eq!(run.stop(), end);
    assert!(r.letters().is_empty(), "{:?}", r.letters());
    assert_eq!(r.file_ids(), vec!["m0", "m1", "m2", "m3", "m4", "m5", "x"]);
}
