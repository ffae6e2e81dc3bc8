//! The stale-owner chaos contract, for any backend: two overlapping owners
//! of a partition, the old one stalled mid-batch and then resuming after
//! the new one has applied and committed the rest of the log. The old
//! owner must be fenced, and the documents must equal the reference model.
//! Run on the stateful test store of `tests/it/elastic_contracts/` and on
//! the Elasticsearch-API server of the suite (`tests/it/scenarios.rs`).

use denorm::apply::{apply, FanOut};
use denorm::command::Command;
use denorm::index::{Backend, Checkpoint, Doc, IndexError, Shard};

/// A seeded log of upserts, deletes, directory renames and file renames
/// over twelve files in three directories of one tree.
pub fn chaos_log(seed: u64, n: usize) -> Vec<Command> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = |m: u64| {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (x >> 33) % m
    };
    let dirs = ["/a/x", "/a/y", "/a/z"];
    let mut model = denorm::model::Model::default();
    let mut log = Vec::new();
    for _ in 0..n {
        let id = format!("f{}", next(12));
        let c = match next(10) {
            0..=4 => Command::UpsertFile { id: id.clone(), path: format!("{}/{id}.txt", dirs[next(3) as usize]), contents: format!("v{}", next(1000)), previous_path: None },
            5 | 6 => Command::DeleteFile { path: model.file_path(&id).unwrap_or("/a/x/gone.txt").to_string(), id },
            7 | 8 => {
                let (from, to) = (next(3) as usize, next(3) as usize);
                if from == to {
                    continue;
                }
                Command::RenamePath { from: dirs[from].into(), to: dirs[to].into() }
            }
            _ => match model.file_path(&id) {
                Some(p) => Command::RenamePath { from: p.to_string(), to: format!("{}/{id}-moved.txt", dirs[next(3) as usize]) },
                None => continue,
            },
        };
        model.apply(&c);
        log.push(c);
    }
    log
}

/// Runs the contract of the module's doc for `seed` on partition 0 of `b`,
/// then compares `live()` (every live document) with the model.
pub fn two_overlapping_owners(b: &dyn Backend, seed: u64, live: impl Fn() -> Vec<Doc>) {
    let log = chaos_log(seed, 90);
    let (committed, stalled, resumed) = (log.len() / 3, log.len() / 2, log.len() / 2 + 6);
    let run = |shard: &mut Box<dyn Shard + Send>, range: std::ops::Range<usize>, commit: bool| -> Result<(), IndexError> {
        for i in range {
            apply(shard.as_mut(), &log[i], i as u64, FanOut::pages_of(4))?;
            shard.mark_applied(Checkpoint::new(i as u64, i as u64));
            if commit && i % 7 == 6 {
                shard.commit()?;
            }
        }
        Ok(())
    };
    let mut old = b.open_shard(0).unwrap();
    run(&mut old, 0..committed, true).unwrap();
    old.commit().unwrap();
    run(&mut old, committed..stalled, false).unwrap();
    // The old owner stalls; the new one resumes from its checkpoint.
    let mut new = b.open_shard(0).unwrap();
    let from = new.checkpoint().map_or(0, |c| c.offset as usize + 1);
    assert_eq!(from, committed, "seed {seed}");
    run(&mut new, from..log.len(), true).unwrap();
    new.commit().unwrap();
    // The old owner resumes.
    let resumed_result = run(&mut old, stalled..resumed, false).and_then(|_| old.commit());
    assert!(matches!(resumed_result, Err(IndexError::Fenced(_))), "seed {seed}: {resumed_result:?}");
    let mut model = denorm::model::Model::default();
    log.iter().for_each(|c| model.apply(c));
    let diffs = denorm::model::diff(model.docs(), live(), 10);
    assert!(diffs.is_empty(), "seed {seed}: the documents differ from the model:\n{}", diffs.join("\n"));
}

/// The files of `live()` as (id, full path, contents), sorted.
fn files(live: &dyn Fn() -> Vec<Doc>) -> Vec<(String, String, String)> {
    let mut got: Vec<_> = live()
        .into_iter()
        .filter_map(|d| match d {
            Doc::File(f) => Some((f.id.clone(), f.full_path(), f.contents)),
            _ => None,
        })
        .collect();
    got.sort();
    got
}

fn upsert(id: &str, path: &str, contents: &str) -> Command {
    Command::UpsertFile { id: id.into(), path: path.into(), contents: contents.into(), previous_path: None }
}

/// Applies `c` at `pos` and commits it.
fn commit_one(shard: &mut Box<dyn Shard + Send>, c: &Command, pos: u64) {
    apply(shard.as_mut(), c, pos, FanOut::pages_of(2)).unwrap();
    shard.mark_applied(Checkpoint::new(pos, pos));
    shard.commit().unwrap();
}

/// A cross-key rename from partition `src` to partition `dst`, both
/// sides, committed: `src` streams its files under `from` at offset `at`,
/// `dst` takes them over at its offset `dst_at`, `src` removes what is
/// left. Returns the chunk `dst` applied, to be replayed.
fn move_between(src: &mut Box<dyn Shard + Send>, (sp, at): (i32, u64), dst: &mut Box<dyn Shard + Send>, dst_at: u64, from: &str, to: &str) -> denorm::command::moves::MoveIn {
    use denorm::moves::{move_in, move_out, remove_moved};
    let mut files = Vec::new();
    move_out(src.as_mut(), from, to, at, FanOut::pages_of(2), &mut |f| files.push(f)).unwrap();
    let ids: Vec<String> = files.iter().map(|f| f.id.clone()).collect();
    let chunk = denorm::command::moves::MoveIn {
        move_id: format!("{sp}-{at}"),
        source_partition: sp,
        source_offset: at as i64,
        from: from.into(),
        to: to.into(),
        chunk: 0,
        last: true,
        issued_at: 0,
        files,
        aborted: false,
    };
    move_in(dst.as_mut(), &chunk, dst_at).unwrap();
    dst.mark_applied(Checkpoint::new(dst_at, dst_at));
    dst.commit().unwrap();
    remove_moved(src.as_mut(), &ids, from, at).unwrap();
    src.mark_applied(Checkpoint::new(at, at));
    src.commit().unwrap();
    chunk
}

/// Issue 27 B2, the stale owner: the old owner of partition 0 stages a
/// write of `x` and stalls; the new owner applies the same command, then
/// moves `x` to partition 1, which deletes it. The old owner's write,
/// resumed, finds partition 1's tombstone, which an ordinary write may
/// replace: it must be fenced before it is sent, and `x` stays deleted.
pub fn a_stale_owner_cannot_bring_back_a_document_that_moved_away(b: &dyn Backend, live: impl Fn() -> Vec<Doc>) {
    let mut old = b.open_shard(0).unwrap();
    commit_one(&mut old, &upsert("x", "/s/x.txt", "v1"), 1);
    commit_one(&mut old, &upsert("y", "/s/y.txt", "y"), 2);
    apply(old.as_mut(), &upsert("x", "/s/x.txt", "stale"), 3, FanOut::pages_of(2)).unwrap();
    // The new owner, from the old one's checkpoint.
    let mut new = b.open_shard(0).unwrap();
    assert_eq!(new.checkpoint().map(|c| c.offset), Some(2));
    commit_one(&mut new, &upsert("x", "/s/x.txt", "v2"), 3);
    let mut dst = b.open_shard(1).unwrap();
    move_between(&mut new, (0, 4), &mut dst, 1, "/s", "/d");
    commit_one(&mut dst, &Command::DeleteFile { id: "x".into(), path: "/d/x.txt".into() }, 2);
    assert_eq!(files(&live), vec![("y".into(), "/d/y.txt".into(), "y".into())]);
    // The old owner resumes.
    old.mark_applied(Checkpoint::new(3, 3));
    let resumed = old.commit();
    assert!(matches!(resumed, Err(IndexError::Fenced(_))), "{resumed:?}");
    assert_eq!(files(&live), vec![("y".into(), "/d/y.txt".into(), "y".into())], "the stale owner's write brought back a document deleted after it moved away");
}

/// Issue 27 B2, the take-over: `x` moves from partition 0 to 2, then on
/// from 2 to 1. Partition 2 replays the first move's chunk (its checkpoint
/// was behind it): the chunk comes from partition 0, and `x` is partition
/// 1's now, so the replay must not take it back, and `x` stays at its last
/// path, once.
pub fn a_take_over_replaces_only_its_source_partitions_copy(b: &dyn Backend, live: impl Fn() -> Vec<Doc>) {
    use denorm::moves::move_in;
    let (mut s0, mut s1, mut s2) = (b.open_shard(0).unwrap(), b.open_shard(1).unwrap(), b.open_shard(2).unwrap());
    commit_one(&mut s0, &upsert("x", "/s/x.txt", "v1"), 1);
    let first = move_between(&mut s0, (0, 2), &mut s2, 1, "/s", "/e");
    assert_eq!(files(&live), vec![("x".into(), "/e/x.txt".into(), "v1".into())]);
    move_between(&mut s2, (2, 2), &mut s1, 1, "/e", "/d");
    let want = vec![("x".to_string(), "/d/x.txt".to_string(), "v1".to_string())];
    assert_eq!(files(&live), want);
    // Partition 2 replays from before the first chunk.
    assert_eq!(move_in(s2.as_mut(), &first, 1).unwrap(), 0, "a chunk from partition 0 took over partition 1's document");
    s2.mark_applied(Checkpoint::new(1, 1));
    s2.commit().unwrap();
    move_between(&mut s2, (2, 2), &mut s1, 1, "/e", "/d");
    assert_eq!(files(&live), want);
}

/// A take-over reads what its source wrote up to the departure, even where
/// the destination fetched those documents ahead, absent, before the
/// source wrote them (its later commands name them). A rebuild from a
/// migrated topic refused two of a move's documents so, as held by another
/// partition, and then the destination's own later commands on them.
pub fn a_take_over_reads_past_what_was_fetched_ahead_before_its_departure(b: &dyn Backend, live: impl Fn() -> Vec<Doc>) {
    use denorm::index::{Kind, Wanted};
    let (mut s0, mut s1) = (b.open_shard(0).unwrap(), b.open_shard(1).unwrap());
    s1.prefetch(&[Wanted::contents(Kind::File, "x"), Wanted::contents(Kind::File, "y")]).unwrap();
    commit_one(&mut s0, &upsert("x", "/s/x.txt", "v1"), 1);
    commit_one(&mut s0, &upsert("y", "/s/y.txt", "v2"), 2);
    move_between(&mut s0, (0, 3), &mut s1, 1, "/s", "/d");
    let want: Vec<(String, String, String)> = vec![("x".into(), "/d/x.txt".into(), "v1".into()), ("y".into(), "/d/y.txt".into(), "v2".into())];
    assert_eq!(files(&live), want, "the move's documents were not all taken over");
}

/// Review of Elasticsearch, F1 (review of lanes, F13): a profile change's
/// page meets a post that another partition took over since its scan read
/// it (an owner change whose producer skipped the barrier): the conflict's
/// resolution applied the rename to the document there now, wrote the old
/// user's new name and this partition's stamp onto the other user's post,
/// and the owner change's delete half, applied next here, then deleted it.
/// The post stays the new owner's, with its user's name.
pub fn a_fan_out_page_does_not_take_over_a_document_another_partition_took_since_its_scan(b: &dyn Backend, live: impl Fn() -> Vec<Doc>) {
    let s = |x: &str| x.to_string();
    let user = |id: &str, name: &str| Command::UpsertUser { id: s(id), name: s(name), email: s(""), dob: s("1970-01-01") };
    let post = |id: &str, user_id: &str, previous: Option<&str>| Command::UpsertPost { id: s(id), user_id: s(user_id), title: s("t"), body: s("b"), previous_user_id: previous.map(s) };
    let (mut a, mut bb) = (b.open_shard(0).unwrap(), b.open_shard(1).unwrap());
    let mut model = denorm::model::Model::default();
    for (pos, c) in [user("u1", "Old"), post("p", "u1", None), post("q1", "u1", None), post("q2", "u1", None)].into_iter().enumerate() {
        commit_one(&mut a, &c, pos as u64 + 1);
        model.apply(&c);
    }
    let two = user("u2", "Two");
    commit_one(&mut bb, &two, 1);
    model.apply(&two);
    // Partition 0 begins renaming u1 (position 10): its scan reads p.
    let rename = user("u1", "New");
    let scan = denorm::apply::fan_out_scan(&rename).unwrap();
    let mut pages = a.rewrite_begin(&scan, 2).unwrap();
    // Partition 1 takes p over for u2 (its producer did not wait for the
    // delete half under u1).
    let change = post("p", "u2", Some("u1"));
    commit_one(&mut bb, &change, 2);
    denorm::apply::fan_out_rest(a.as_mut(), &rename, 10, &mut pages).unwrap();
    a.mark_applied(Checkpoint::new(10, 10));
    a.commit().unwrap();
    let delete = change.owner_change_delete().expect("an owner change");
    commit_one(&mut a, &delete, 12);
    for c in [rename, delete, change] {
        model.apply(&c);
    }
    let posts = |docs: Vec<Doc>| -> Vec<(String, String, String)> {
        let mut out: Vec<_> = docs.into_iter().filter_map(|d| if let Doc::Post(p) = d { Some((p.id, p.user.id, p.user.name)) } else { None }).collect();
        out.sort();
        out
    };
    assert_eq!(posts(live()), posts(model.docs()), "the posts differ from the model");
}
