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
    let log = [
        upsert("a", "/c/p/es/README.txt"),
        upsert("b", "/c/p/x.txt"),
        Command::RenamePath { from: "/c/p".into(), to: "/c/w".into() },
        upsert("c", "/c/w/new.txt"),
    ];
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
