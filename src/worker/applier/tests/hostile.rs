//! A randomized log of hostile messages among a producer's valid ones,
//! in-process: garbage, keys longer than any valid one, forged move chunks
//! whose rest never comes, owner changes whose departure is never applied,
//! paths too deep, ids `.`, forged `DISCARD`s. For each seed the partition
//! is applied to its end within a bound (nothing stalls it), every valid
//! command is applied, every hostile message is dead-lettered with its own
//! reason, and the parked keys stay within their bound.

use super::moves::chunk;
use super::*;
use crate::command::control::{Action, Control};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The first name `names(i)` gives whose key is on partition 0 of 2, from
/// `from` on.
fn on_partition_0(from: usize, names: impl Fn(usize) -> String) -> (usize, String) {
    (from..).map(|i| (i, names(i))).find(|(_, k)| crate::command::partitioner::partition_of(k, 2) == 0).unwrap()
}

fn hostile_log(seed: u64) {
    let r = Rig::of(2, |c| {
        c.commit_quiet = Duration::from_millis(20);
        c.wait_limit = Duration::from_millis(300);
        c.max_parked_keys = 8;
    });
    r.source_applied(1, 1_000, crate::index::progress::DoneAbove::default());
    let mut rng = StdRng::seed_from_u64(seed);
    // Keys of partition 0, each used once by a hostile message (so that
    // parking one says nothing of another).
    let mut next = 0usize;
    let mut fresh = |prefix: &str| {
        let (i, key) = on_partition_0(next, |i| format!("{prefix}{i}"));
        next = i + 1;
        key
    };
    let valid_dirs: Vec<String> = (0..3).map(|_| fresh("/v")).collect();
    let (mut applied, mut expected) = (Vec::new(), Vec::new());
    for i in 0..60 {
        match rng.random_range(0..8) {
            0 | 1 => {
                let id = format!("ok{i}");
                r.produce(upsert(&id, &format!("{}/f{i}.txt", valid_dirs[rng.random_range(0..3)])));
                applied.push(id);
            }
            2 => {
                let at = r.append(&fresh("/h"), b"garbage, not a command".to_vec());
                expected.push(Sent { reason: "not_single_object".into(), origin_offset: at, key: String::new() });
            }
            3 => {
                let key = format!("/k{}", "k".repeat((64 << 10) + i));
                let at = r.append(&key, r.codec.encode(&Envelope::new(upsert("big", &format!("{key}/f.txt")))));
                expected.push(Sent { reason: "oversized_key".into(), origin_offset: at, key: String::new() });
            }
            4 => {
                // A source of its own on partition 1, which is applied
                // past it (no take-over wait): its rest never comes.
                let to = fresh("/hm");
                let mut mv = chunk(i as i64, 0, false, &[&format!("m{i}")]);
                mv.to = format!("{to}/a");
                mv.files[0].path = format!("{to}/a/m{i}.txt");
                let at = r.produce_move(&mv);
                expected.push(Sent { reason: "move_incomplete".into(), origin_offset: at, key: String::new() });
            }
            5 => {
                let user = fresh("u");
                let mut e = Envelope::new(Command::UpsertPost { id: format!("p{i}"), user_id: user.clone(), title: "t".into(), body: "b".into(), previous_user_id: Some("old".into()) });
                e.after = Some(crate::command::LogPosition { partition: 1, offset: i64::MAX / 2 });
                let at = r.append(&user, r.codec.encode(&e));
                expected.push(Sent { reason: "takeover_timeout".into(), origin_offset: at, key: String::new() });
            }
            6 => {
                let dir = fresh("/hd");
                let deep = format!("{dir}{}/f.txt", "/d".repeat(crate::command::path::MAX_DEPTH));
                let at = r.produce(upsert(&format!("deep{i}"), &deep));
                expected.push(Sent { reason: "invalid_command".into(), origin_offset: at, key: String::new() });
            }
            _ => {
                // A forged DISCARD of a valid key: carried out (a marker),
                // and it releases nothing, since nothing of it is parked.
                let key = valid_dirs[rng.random_range(0..3)].clone();
                let c = Control {
                    action: Action::Discard,
                    key: key.clone(),
                    dlq_partition: 0,
                    dlq_offset: -1,
                    through: i64::MAX,
                    origin_offset: -1,
                    payload: Vec::new(),
                    requested_at: 0,
                    through_at: i64::MAX,
                };
                r.append(&key, r.codec.encode_control(&c));
            }
        }
    }
    let end = r.end();
    let run = r.start();
    run.wait_next_within(Duration::from_secs(60), end);
    assert_eq!(run.stop(), end, "seed {seed}: the partition stopped short of its end");
    let mut letters: Vec<Sent> = r.letters().into_iter().map(|l| Sent { key: String::new(), ..l }).collect();
    letters.sort_by_key(|l| l.origin_offset);
    letters.dedup();
    assert_eq!(letters, expected, "seed {seed}: every hostile message dead-lettered with its reason, nothing else");
    applied.sort();
    let files: Vec<String> = r.file_ids().into_iter().filter(|id| id.starts_with("ok")).collect();
    assert_eq!(files, applied, "seed {seed}: every valid command applied");
    assert!(r.file_ids().iter().all(|id| id.starts_with("ok")), "seed {seed}: a hostile message's file was kept: {:?}", r.file_ids());
    let parked = r.shared.backend.open_shard(0).unwrap().parking().len();
    assert!(parked <= 8, "seed {seed}: {parked} keys parked, over the bound");
}

#[test]
fn a_hostile_log_is_applied_to_its_end_with_each_hostile_message_dead_lettered_seed_1() {
    hostile_log(1);
}

#[test]
fn a_hostile_log_is_applied_to_its_end_with_each_hostile_message_dead_lettered_seed_2() {
    hostile_log(2);
}

#[test]
fn a_hostile_log_is_applied_to_its_end_with_each_hostile_message_dead_lettered_seed_3() {
    hostile_log(3);
}
