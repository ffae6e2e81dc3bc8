//! The rules of [`crate::apply`] driving the embedded index's shard writer:
//! commits, positions from the overlay, a crash's uncommitted work, a
//! commit a kill cut short, and a fan-out's progress commits.

use crate::apply::{apply, FanOut};
use crate::command::Command;
use crate::index::embedded::{EmbeddedIndex, EmbeddedShard};
use crate::index::{Checkpoint, FileQuery, IndexError, Kind, SearchIndex, Shard};

fn upsert(id: &str, p: &str) -> Command {
    Command::UpsertFile { id: id.into(), path: p.into(), contents: format!("hello {id}"), previous_path: None }
}

#[test]
fn shard_applies_commits_and_searches() {
    let dir = tempfile::tempdir().unwrap();
    let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
    let mut shard = idx.open_shard(0, 20_000_000).unwrap();
    let log = [upsert("a", "/c/p/es/README.txt"), upsert("b", "/c/p/x.txt"), Command::RenamePath { from: "/c/p".into(), to: "/c/w".into() }, upsert("c", "/c/w/new.txt")];
    for (pos, c) in log.iter().enumerate() {
        apply(&mut shard, c, pos as u64, FanOut::pages_of(1)).unwrap();
        shard.mark_applied(Checkpoint::new(pos as u64, 0));
    }
    shard.commit().unwrap();
    assert_eq!(shard.applied(), Some(3));
    let s = idx.search().unwrap();
    let mut under = Vec::new();
    s.files(&FileQuery { under: Some("/c/w".into()), ..Default::default() }, 0, &mut |f| under.push(f.full_path())).unwrap();
    under.sort();
    assert_eq!(under, vec!["/c/w/es/README.txt", "/c/w/new.txt", "/c/w/x.txt"]);
    let mut text = Vec::new();
    s.files(&FileQuery { text: Some("hello".into()), dir: Some("/c/w/es".into()), ..Default::default() }, 5, &mut |f| text.push(f.id)).unwrap();
    assert_eq!(text, vec!["a"]);
    drop(shard);
    assert_eq!(idx.open_shard(0, 20_000_000).unwrap().applied(), Some(3));
}

#[test]
fn positions_come_from_the_overlay_then_the_index_and_every_id_stays_unique() {
    let dir = tempfile::tempdir().unwrap();
    let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
    let mut shard = idx.open_shard(0, 20_000_000).unwrap();
    let del = |id: &str| Command::DeleteFile { id: id.into(), path: "/c/x.txt".into() };
    // Committed: a (pos 0), b (pos 1).
    apply(&mut shard, &upsert("a", "/c/a.txt"), 0, FanOut::pages_of(10)).unwrap();
    apply(&mut shard, &upsert("b", "/c/b.txt"), 1, FanOut::pages_of(10)).unwrap();
    shard.commit().unwrap();
    assert_eq!(shard.position(Kind::File, "a").unwrap(), Some(0));
    assert_eq!(shard.position(Kind::File, "zz").unwrap(), None);
    // One batch: a replaced twice, b deleted then created again, c
    // created then replaced, and a stale write of a that must not land.
    let batch = [(upsert("a", "/c/a2.txt"), 2), (upsert("a", "/c/a3.txt"), 3), (del("b"), 4), (upsert("b", "/c/b2.txt"), 5), (upsert("c", "/c/c.txt"), 6), (upsert("c", "/c/c2.txt"), 7)];
    for (c, pos) in &batch {
        assert_eq!(apply(&mut shard, c, *pos, FanOut::pages_of(10)).unwrap(), 1, "{c:?}");
    }
    assert_eq!(apply(&mut shard, &upsert("a", "/c/stale.txt"), 1, FanOut::pages_of(10)).unwrap(), 0);
    assert_eq!(shard.position(Kind::File, "b").unwrap(), Some(5));
    shard.commit().unwrap();
    let mut docs = Vec::new();
    idx.search().unwrap().dump(&mut |d| docs.push((d.id().to_string(), d.pos()))).unwrap();
    docs.sort();
    assert_eq!(docs, vec![("a".into(), 3), ("b".into(), 5), ("c".into(), 7)]);
    for (id, pos) in [("a", 3), ("b", 5), ("c", 7)] {
        assert_eq!(shard.position(Kind::File, id).unwrap(), Some(pos), "{id}");
    }
}

#[test]
fn uncommitted_work_is_invisible_and_lost_on_crash() {
    let dir = tempfile::tempdir().unwrap();
    let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
    let mut shard = idx.open_shard(0, 20_000_000).unwrap();
    apply(&mut shard, &upsert("a", "/c/a.txt"), 0, FanOut::pages_of(10)).unwrap();
    shard.mark_applied(Checkpoint::new(0, 0));
    shard.commit().unwrap();
    apply(&mut shard, &Command::RenamePath { from: "/c/a.txt".into(), to: "/c/b.txt".into() }, 1, FanOut::pages_of(10)).unwrap();
    drop(shard); // no commit: as if the process died
    let mut paths = Vec::new();
    idx.search().unwrap().files(&FileQuery::default(), 0, &mut |f| paths.push(f.full_path())).unwrap();
    assert_eq!(paths, vec!["/c/a.txt"]);
    assert_eq!(idx.open_shard(0, 20_000_000).unwrap().applied(), Some(0));
}

/// A process killed while committing can leave files of the commit it
/// never finished (here a segment's deletes, written before the new
/// `meta.json`). Redoing the same commands gives the same file names, so
/// the next owner must clear them first: this stalled a partition for
/// good in the randomized test ("FileAlreadyExists ... .del" on every
/// retry).
#[test]
fn files_of_a_commit_a_crash_cut_short_do_not_block_redoing_it() {
    let dir = tempfile::tempdir().unwrap();
    let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
    let meta = idx.shard_dir(0, 0).join("meta.json");
    let mut shard = idx.open_shard(0, 20_000_000).unwrap();
    apply(&mut shard, &upsert("a", "/c/a.txt"), 0, FanOut::pages_of(10)).unwrap();
    apply(&mut shard, &upsert("b", "/c/b.txt"), 1, FanOut::pages_of(10)).unwrap();
    shard.mark_applied(Checkpoint::new(1, 0));
    shard.commit().unwrap();
    drop(shard);
    let before = std::fs::read(&meta).unwrap();
    let del_files = || std::fs::read_dir(idx.shard_dir(0, 0)).unwrap().filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "del")).count();
    assert_eq!(del_files(), 0);
    // Replacing a deletes it in the committed segment: a .del file.
    let redo = |shard: &mut EmbeddedShard| -> Result<(), IndexError> {
        apply(shard, &upsert("a", "/c/a2.txt"), 2, FanOut::pages_of(10))?;
        shard.mark_applied(Checkpoint::new(2, 0));
        shard.commit()
    };
    // Opened afresh, as the next owner of the shard opens it: the same
    // commands then give the same file names.
    let mut shard = idx.open_shard(0, 20_000_000).unwrap();
    redo(&mut shard).unwrap();
    drop(shard);
    assert_eq!(del_files(), 1, "the commit wrote a segment's deletes");
    // As if killed before the new meta.json was in place: the files it
    // wrote stay (and tantivy's list of its files names them).
    std::fs::write(&meta, &before).unwrap();
    let mut shard = idx.open_shard(0, 20_000_000).unwrap();
    assert_eq!(shard.applied(), Some(1));
    assert_eq!(del_files(), 0, "opening the shard deleted the files of the commit cut short");
    redo(&mut shard).expect("the same commit again, over the files of the one cut short");
    drop(shard);
    let mut paths = Vec::new();
    idx.search().unwrap().files(&FileQuery::default(), 0, &mut |f| paths.push(f.full_path())).unwrap();
    paths.sort();
    assert_eq!(paths, vec!["/c/a2.txt", "/c/b.txt"]);
}

/// A fan-out commits its progress every few documents; a crash after
/// that leaves the rename part-way at the previous command's position,
/// and redelivering the rename finishes it with nothing lost or doubled.
#[test]
fn a_fan_out_commits_its_progress_and_redelivery_after_a_crash_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
    let all_paths = || {
        let mut paths = Vec::new();
        idx.search().unwrap().files(&FileQuery::default(), 0, &mut |f| paths.push(f.full_path())).unwrap();
        paths.sort();
        paths
    };
    let mut shard = idx.open_shard(0, 20_000_000).unwrap();
    shard.set_fan_out_commit_every(10);
    for i in 0..95u64 {
        apply(&mut shard, &upsert(&format!("f{i}"), &format!("/c/old/f{i}.txt")), i, FanOut::pages_of(7)).unwrap();
        shard.mark_applied(Checkpoint::new(i, 0));
    }
    shard.commit().unwrap();
    let rename = Command::RenamePath { from: "/c/old".into(), to: "/c/new".into() };
    assert_eq!(apply(&mut shard, &rename, 95, FanOut::pages_of(7)).unwrap(), 95);
    drop(shard); // the process dies before the rename's own commit
    let midway = all_paths();
    let moved = midway.iter().filter(|p| p.starts_with("/c/new/")).count();
    assert_eq!(midway.len(), 95, "no file lost or doubled mid-way");
    assert!((10..95).contains(&moved), "progress was committed part-way ({moved} of 95 moved)");
    let mut shard = idx.open_shard(0, 20_000_000).unwrap();
    assert_eq!(shard.applied(), Some(94), "progress is committed at the previous command's position");
    // Redelivery of the rename.
    apply(&mut shard, &rename, 95, FanOut::pages_of(7)).unwrap();
    shard.mark_applied(Checkpoint::new(95, 0));
    shard.commit().unwrap();
    let want: Vec<String> = {
        let mut w: Vec<String> = (0..95).map(|i| format!("/c/new/f{i}.txt")).collect();
        w.sort();
        w
    };
    assert_eq!(all_paths(), want);
}

/// The documents of an embedded index, without bookkeeping, in order.
fn dump(idx: &EmbeddedIndex) -> Vec<crate::index::Doc> {
    let mut docs = Vec::new();
    idx.search().unwrap().dump(&mut |d| docs.push(d.without_pos())).unwrap();
    docs.sort_by_key(|d| (d.kind(), d.id().to_string()));
    docs
}

fn model_of(log: &[Command]) -> Vec<crate::index::Doc> {
    let mut model = crate::model::Model::default();
    log.iter().for_each(|c| model.apply(c));
    let mut docs = model.docs();
    docs.sort_by_key(|d| (d.kind(), d.id().to_string()));
    docs
}

fn user(id: &str, name: &str) -> Command {
    Command::UpsertUser { id: id.into(), name: name.into(), email: "e@x".into(), dob: "1970-01-01".into() }
}

fn post(id: &str, user: &str, title: &str) -> Command {
    Command::UpsertPost { id: id.into(), user_id: user.into(), title: title.into(), body: "b".into(), previous_user_id: None }
}

/// A profile change whose posts were written, changed and deleted in the
/// same batch: its scan reads them from the pending writes, no commit is
/// made for it (the committed index is as before until the batch's own
/// commit), and the result is the reference model's. Run whole, as in one
/// page of a lane, and paged (pages of 2 over 5 posts).
#[test]
fn a_profile_change_reads_the_batchs_pending_writes_without_a_commit() {
    for page in [1000, 2] {
        let dir = tempfile::tempdir().unwrap();
        let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
        let mut shard = idx.open_shard(0, 20_000_000).unwrap();
        let committed = [user("u", "Ann"), post("p1", "u", "one"), post("p3", "u", "three"), post("p4", "u", "four"), post("p5", "u", "five"), post("p6", "u", "six")];
        let batch = [post("p1", "u", "one, edited"), post("p2", "u", "two, new"), Command::DeletePost { id: "p3".into(), user_id: "u".into() }, post("p4", "v", "four, now v's"), user("u", "Bob")];
        let log: Vec<Command> = committed.iter().chain(&batch).cloned().collect();
        for (pos, c) in committed.iter().enumerate() {
            apply(&mut shard, c, pos as u64, FanOut::pages_of(page)).unwrap();
        }
        shard.commit().unwrap();
        let before = dump(&idx);
        for (i, c) in batch.iter().enumerate() {
            let pos = (committed.len() + i) as u64;
            if let Some(scan) = crate::apply::fan_out_scan(c) {
                assert!(shard.fan_out_reads_pending(&scan, page), "the batch holds no pages of fan-outs");
                // As a lane runs it: begun, then a page at a time.
                let mut pages = shard.rewrite_begin(&scan, page).unwrap();
                let mut written = 0;
                loop {
                    let (n, done) = shard.rewrite_page(&mut pages, &mut |d| crate::apply::fan_out_rule(c, pos, d)).unwrap();
                    written += n;
                    if done {
                        break;
                    }
                }
                assert_eq!(written, 4, "p1, p2, p5 and p6 renamed (page {page})");
                crate::apply::fan_out_finish(&mut shard, c, pos).unwrap();
            } else {
                apply(&mut shard, c, pos, FanOut::pages_of(page)).unwrap();
            }
        }
        if page == 1000 {
            assert_eq!(dump(&idx), before, "a fan-out of one page commits nothing of its own");
        }
        shard.commit().unwrap();
        assert_eq!(dump(&idx), model_of(&log), "page size {page}");
    }
}

mod pending_scans {
    use super::*;
    use proptest::prelude::*;

    /// Commands whose documents never cross keys (a post's id names its
    /// user, a file's id its top-level directory), with contents and
    /// titles that differ, so that a lost write shows.
    fn command() -> impl Strategy<Value = Command> {
        let top = prop::sample::select(vec!["/a", "/b"]);
        let sub = prop::sample::select(vec!["", "/x", "/x/y", "/z"]);
        let n = 0..4u8;
        let word = prop::sample::select(vec!["red", "green", "blue"]);
        let u = prop::sample::select(vec!["1", "2"]);
        prop_oneof![
            4 => (top.clone(), sub.clone(), n.clone(), word.clone()).prop_map(|(t, d, n, w)| Command::UpsertFile {
                id: format!("{t}{n}"),
                path: format!("{t}{d}/f{n}"),
                contents: w.into(),
                previous_path: None
            }),
            1 => (top.clone(), n.clone()).prop_map(|(t, n)| Command::DeleteFile { id: format!("{t}{n}"), path: format!("{t}/f{n}") }),
            2 => (top, sub.clone(), sub).prop_filter("within one key, not into itself", |(_, f, t)| !f.is_empty() && !t.is_empty() && !crate::command::path::is_within(t, f) && !crate::command::path::is_within(f, t))
                .prop_map(|(t, f, to)| Command::RenamePath { from: format!("{t}{f}"), to: format!("{t}{to}") }),
            2 => (u.clone(), prop::sample::select(vec!["Ann", "Bob", "Cy"])).prop_map(|(u, name)| user(u, name)),
            4 => (u.clone(), n.clone(), word).prop_map(|(u, n, w)| post(&format!("u{u}p{n}"), u, w)),
            1 => (u.clone(), n).prop_map(|(u, n)| Command::DeletePost { id: format!("u{u}p{n}"), user_id: u.into() }),
            1 => u.prop_map(|u| Command::DeleteUser { id: u.into() }),
        ]
    }

    /// What the applier does with a log, on one shard: a fan-out begins
    /// without a commit where the shard reads pending writes, and its pages
    /// interleave with the next commands of other keys (the lanes), while
    /// commits fall at random points.
    fn run(log: &[Command], page: usize, commit_at: &[bool], interleave: &[bool]) -> Vec<crate::index::Doc> {
        let dir = tempfile::tempdir().unwrap();
        let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
        let mut shard = idx.open_shard(0, 20_000_000).unwrap();
        let mut running: Option<(usize, crate::index::Pages)> = None;
        let finish = |shard: &mut EmbeddedShard, (at, mut pages): (usize, crate::index::Pages)| loop {
            let c = &log[at];
            let (_, done) = shard.rewrite_page(&mut pages, &mut |d| crate::apply::fan_out_rule(c, at as u64, d)).unwrap();
            if done {
                crate::apply::fan_out_finish(shard, c, at as u64).unwrap();
                return;
            }
        };
        for (pos, c) in log.iter().enumerate() {
            let same_key = running.as_ref().is_some_and(|(at, _)| log[*at].key() == c.key());
            if let Some(job) = running.take() {
                if same_key || c.is_fan_out() || !interleave[pos % interleave.len()] {
                    finish(&mut shard, job);
                } else {
                    // One page of it before this command of another key.
                    let (at, mut pages) = job;
                    let (_, done) = shard.rewrite_page(&mut pages, &mut |d| crate::apply::fan_out_rule(&log[at], at as u64, d)).unwrap();
                    match done {
                        true => {
                            crate::apply::fan_out_finish(&mut shard, &log[at], at as u64).unwrap();
                        }
                        false => running = Some((at, pages)),
                    }
                }
            }
            match crate::apply::fan_out_scan(c) {
                Some(scan) if running.is_none() => {
                    if !shard.fan_out_reads_pending(&scan, page) {
                        shard.commit().unwrap();
                    }
                    running = Some((pos, shard.rewrite_begin(&scan, page).unwrap()));
                }
                Some(_) => unreachable!("a fan-out finishes the one running first"),
                None => {
                    apply(&mut shard, c, pos as u64, FanOut::pages_of(page)).unwrap();
                }
            }
            if commit_at[pos % commit_at.len()] {
                shard.commit().unwrap();
            }
        }
        if let Some(job) = running.take() {
            finish(&mut shard, job);
        }
        shard.commit().unwrap();
        dump(&idx)
    }

    /// Cases of the property below: fewer in the debug build, where each
    /// takes about four times as long, and the suite runs it again only
    /// for its debug assertions (scripts/test.sh).
    const PENDING_SCAN_CASES: u32 = if cfg!(debug_assertions) { 32 } else { 96 };

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(PENDING_SCAN_CASES))]
        #[test]
        fn fan_outs_over_pending_writes_agree_with_the_model(
            log in prop::collection::vec(command(), 1..40),
            page in 1usize..4,
            commit_at in prop::collection::vec(prop::bool::weighted(0.2), 1..8),
            interleave in prop::collection::vec(any::<bool>(), 1..8),
        ) {
            prop_assert_eq!(run(&log, page, &commit_at, &interleave), model_of(&log));
        }
    }
}

/// Review of lanes, F11: under `--fan-out-commit-every 0` the ids of the
/// documents written by uncommitted pages grew with the fan-out (one entry
/// per renamed file). They are bounded: past the bound a read of a
/// document not pending commits first, and still sees the page's write.
#[test]
fn the_ids_of_uncommitted_pages_stay_bounded_without_progress_commits() {
    let dir = tempfile::tempdir().unwrap();
    let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
    let mut shard = idx.open_shard(0, 20_000_000).unwrap();
    shard.set_fan_out_commit_every(0);
    shard.set_paged_max(100);
    for i in 0..1000u64 {
        apply(&mut shard, &upsert(&format!("f{i}"), &format!("/c/old/f{i}.txt")), i, FanOut::pages_of(50)).unwrap();
    }
    shard.mark_applied(Checkpoint::new(999, 0));
    shard.commit().unwrap();
    let rename = Command::RenamePath { from: "/c/old".into(), to: "/c/new".into() };
    let scan = crate::apply::fan_out_scan(&rename).unwrap();
    let mut pages = shard.rewrite_begin(&scan, 50).unwrap();
    let mut most = 0;
    loop {
        let (_, done) = shard.rewrite_page(&mut pages, &mut |d| crate::apply::fan_out_rule(&rename, 1000, d)).unwrap();
        most = most.max(shard.paged_ids());
        if done {
            break;
        }
    }
    assert!(most <= 100, "{most} ids of uncommitted pages kept");
    // A document a page wrote, read before any commit.
    let f7 = shard.get(Kind::File, "f7").unwrap().expect("f7");
    assert_eq!(f7.key(), "/c", "{f7:?}");
    assert!(matches!(&f7, crate::index::Doc::File(f) if f.full_path() == "/c/new/f7.txt"), "{f7:?}");
}

/// The page cursor is typed: a shard handed a cursor another backend made
/// refuses it, naming it, and a fan-out run in one page cannot be run
/// again; the shard's own cursor runs.
#[test]
fn a_shard_refuses_a_fan_outs_pages_it_did_not_make() {
    use crate::index::{Cursor, Pages, Scan};
    let dir = tempfile::tempdir().unwrap();
    let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
    let mut shard = idx.open_shard(0, 20_000_000).unwrap();
    apply(&mut shard, &upsert("a", "/c/p/a.txt"), 0, FanOut::pages_of(10)).unwrap();
    let scan = Scan::FilesWithin { path: "/c/p".into() };
    let mut foreign = Pages::new(Cursor::Whole { scan: scan.clone(), page_size: 10 });
    let e = shard.rewrite_page(&mut foreign, &mut |d| Some(d.clone())).unwrap_err();
    assert!(e.to_string().contains("another backend: a whole scan"), "{e}");
    let mut own = shard.rewrite_begin(&scan, 10).unwrap();
    assert_eq!(shard.rewrite_page(&mut own, &mut |d| Some(d.clone())).unwrap(), (1, true));
    let mut taken = Pages::new(Cursor::Taken);
    assert!(shard.rewrite_page(&mut taken, &mut |d| Some(d.clone())).unwrap_err().to_string().contains("a finished fan-out's"));
}

/// A shard's writer dropped while tantivy merges its segments, and the
/// shard opened again at once: after a failure (the applier reopens it) or
/// when a partition is assigned back to the same worker. Random commands
/// (creates, moves within the tree, deletes, renames of one tree into
/// another) through one shard, with commits, and "crashes": the writer is
/// dropped with its uncommitted work, reopened at once, and the log
/// applied again from its checkpoint, as the applier does. Small merges
/// keep some running. The index must equal the model of the log, with no
/// document twice. Before the writer waited for its merges when dropped,
/// this seed ended with files whose last rename was lost (or applied
/// twice): the merge's background work went on after the writer's lock
/// was released, under the next writer. Timing decides where; this seed
/// failed in every run before the fix. Release builds only (a debug build
/// takes minutes, and the merges' timing is another).
#[cfg(not(debug_assertions))]
#[test]
fn a_writer_dropped_during_merges_and_reopened_at_once_leaves_the_index_exact() {
    dropped_during_merges_and_reopened_at_once();
}

/// The same, with every close returning before the merges were waited
/// for, as tantivy's does when an indexing thread failed (an I/O error
/// writing a segment), and as a killed process leaves the shard: the old
/// writer's merges are cut, its directory refusing what they would still
/// write once it is let go. This seed failed in every run (eight) while a
/// new writer's first operation took the last commit's opstamp: the
/// shard's first commit after the reopen deletes the replaced versions of
/// its upserts in one operation, and a merge started during that commit
/// kept them live beside the new ones in the segment it wrote (three
/// files twice, then their later renames lost).
#[cfg(all(not(debug_assertions), feature = "failpoints"))]
#[test]
fn a_writer_whose_close_returned_early_and_reopened_at_once_leaves_the_index_exact() {
    let faults = tempfile::tempdir().unwrap();
    std::env::set_var("DENORM_FAULTS", faults.path());
    std::fs::write(faults.path().join("shard.close-early"), "").unwrap();
    dropped_during_merges_and_reopened_at_once();
}

#[cfg(not(debug_assertions))]
fn dropped_during_merges_and_reopened_at_once() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let dir = tempfile::tempdir().unwrap();
    let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
    let open = |idx: &EmbeddedIndex| {
        let mut s = idx.open_shard(0, 20_000_000).unwrap();
        s.set_merge_max_docs(500);
        s.set_fan_out_commit_every(0);
        s
    };
    let mut shard = open(&idx);
    let (mut log, mut reopens) = (Vec::new(), 0);
    let dirs = ["/c/a", "/c/b", "/c/a/x", "/c/b/y"];
    let n = 6000;
    for i in 0..n {
        let r: f64 = rng.random();
        let c = if i < n / 3 || r < 0.6 {
            let f = rng.random_range(0..3000);
            upsert(&format!("f{f}"), &format!("{}/file{f}.txt", dirs[rng.random_range(0..dirs.len())]))
        } else if r < 0.8 {
            Command::DeleteFile { id: format!("f{}", rng.random_range(0..3000)), path: "/c/gone.txt".into() }
        } else {
            let (a, b) = (dirs[rng.random_range(0..dirs.len())], dirs[rng.random_range(0..dirs.len())]);
            if a == b || crate::command::path::is_within(b, a) || crate::command::path::is_within(a, b) {
                continue;
            }
            Command::RenamePath { from: a.into(), to: b.into() }
        };
        log.push(c);
        let pos = log.len() as u64 - 1;
        apply(&mut shard, &log[pos as usize], pos, FanOut::pages_of(rng.random_range(1..200))).unwrap();
        shard.mark_applied(Checkpoint::new(pos, 0));
        if rng.random_bool(0.02) {
            shard.commit().unwrap();
        }
        if rng.random_bool(0.01) {
            drop(shard);
            shard = open(&idx);
            reopens += 1;
            for p in shard.applied().map_or(0, |a| a + 1)..log.len() as u64 {
                apply(&mut shard, &log[p as usize], p, FanOut::pages_of(rng.random_range(1..200))).unwrap();
                shard.mark_applied(Checkpoint::new(p, 0));
            }
        }
    }
    shard.commit().unwrap();
    assert!(reopens >= 20, "{reopens} reopens");
    let mut m = crate::model::Model::default();
    for c in &log {
        m.apply(c);
    }
    let mut docs = Vec::new();
    idx.search().unwrap().dump(&mut |d| docs.push(d)).unwrap();
    let diffs = crate::model::diff(m.docs(), docs, 10);
    assert!(diffs.is_empty(), "after {reopens} reopens the index differs from the model:\n{}", diffs.join("\n"));
}
