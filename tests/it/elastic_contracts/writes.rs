//! Writing: prefetched reads after a fan-out, upserts written first while
//! their documents are absent, page bulks in flight.

use super::store::*;
use super::*;
use denorm::apply::{apply, FanOut};
use denorm::command::Command;
use denorm::index::Backend;
use denorm::index::Wanted;

/// The upsert of file `f<i>` at `/a/f<i>.txt`.
fn upsert(i: usize, contents: &str) -> Command {
    Command::UpsertFile { id: format!("f{i}"), path: format!("/a/f{i}.txt"), contents: contents.into(), previous_path: None }
}

/// A window of upserts (file, position, contents) as the worker applies
/// it: their documents fetched ahead, then applied and committed.
fn window(shard: &mut Box<dyn denorm::index::Shard + Send>, log: &[(usize, u64, &str)]) {
    let wanted: Vec<Wanted> = log.iter().flat_map(|(i, _, c)| denorm::apply::reads(&upsert(*i, c))).collect();
    shard.prefetch(&wanted).unwrap();
    for (i, pos, contents) in log {
        apply(shard.as_mut(), &upsert(*i, contents), *pos, FanOut::pages_of(10)).unwrap();
    }
    let last = log.iter().map(|(_, p, _)| *p).max().unwrap();
    shard.mark_applied(Checkpoint::new(last, last));
    shard.commit().unwrap();
}

/// Documents fetched ahead (`Shard::prefetch`, one `_mget` for a
/// window of commands) never hide this writer's own later writes: after
/// a fan-out moved the file, its read shows the new path, not the
/// version fetched before.
#[test]
fn a_prefetched_document_is_read_again_after_the_writers_own_fan_out() {
    use denorm::index::{Checkpoint, Doc};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (server, _scans) = scans_server(&rt);
    let b = backend(&server, &rt);
    let mut shard = b.open_shard(0).unwrap();
    let upsert = |id: &str| Command::UpsertFile { id: id.into(), path: format!("/a/{id}.txt"), contents: "c".into(), previous_path: None };
    apply(shard.as_mut(), &upsert("x"), 1, FanOut::pages_of(2)).unwrap();
    apply(shard.as_mut(), &upsert("y"), 2, FanOut::pages_of(2)).unwrap();
    shard.mark_applied(Checkpoint::new(2, 2));
    shard.commit().unwrap();
    shard.prefetch(&[Wanted::contents(Kind::File, "x"), Wanted::contents(Kind::File, "y")]).unwrap();
    let mgets = rt.block_on(server.received_requests()).unwrap().iter().filter(|r| r.url.path() == "/_mget").count();
    assert_eq!(mgets, 1, "the two reads fetched with one _mget");
    apply(shard.as_mut(), &Command::RenamePath { from: "/a".into(), to: "/b".into() }, 3, FanOut::pages_of(2)).unwrap();
    for id in ["x", "y"] {
        match shard.get(Kind::File, id).unwrap() {
            Some(Doc::File(f)) => assert_eq!((f.full_path(), f.pos), (format!("/b/{id}.txt"), 3), "a version fetched before the fan-out was read"),
            other => panic!("{id}: {other:?}"),
        }
    }
}

/// Writing first: a window of upserts whose documents are all absent
/// (a replay into empty indexes) makes the writer send the next
/// windows' upserts as creates without reading them (no `_mget`, no
/// GET). Where they then meet existing documents, each conflict is
/// decided by the positions (a redelivery older than the stored
/// version changes nothing), and the writer reads first again.
#[test]
fn upserts_are_written_first_while_their_documents_are_absent() {
    use denorm::index::Doc;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (server, scans) = scans_server(&rt);
    let b = backend(&server, &rt);
    let mut shard = b.open_shard(0).unwrap();
    let reads = |r: &Request| r.url.path() == "/_mget" || (r.method.as_str() == "GET" && r.url.path().starts_with("/denorm-files-g0/_doc/"));
    let count_reads = || rt.block_on(server.received_requests()).unwrap().iter().filter(|r| reads(r)).count();
    let first: Vec<(usize, u64, &str)> = (0..40).map(|i| (i, i as u64 + 1, "v1")).collect();
    window(&mut shard, &first);
    assert_eq!(count_reads(), 1, "the first window is read with one _mget");
    let second: Vec<(usize, u64, &str)> = (40..80).map(|i| (i, i as u64 + 1, "v1")).collect();
    window(&mut shard, &second);
    assert_eq!(count_reads(), 1, "upserts of absent documents were read: they are written first once a window found them absent");
    // Existing documents: newer upserts of the even ones, a stale
    // redelivery (older than the stored version) of the odd ones.
    let third: Vec<(usize, u64, &str)> = (0..40).map(|i| if i % 2 == 0 { (i, 100 + i as u64, "v2") } else { (i, 0, "stale") }).collect();
    window(&mut shard, &third);
    let docs = live_files(&scans);
    assert_eq!(docs.len(), 80);
    for d in &docs {
        let Doc::File(f) = d else { panic!("{d:?}") };
        let i: usize = f.id[1..].parse().unwrap();
        let expected = if i < 40 && i.is_multiple_of(2) { ("v2", 100 + i as u64) } else { ("v1", i as u64 + 1) };
        assert_eq!((f.contents.as_str(), f.pos), expected, "{}", f.id);
    }
    // Every create of the third window met a document: reading first again.
    let before = rt.block_on(server.received_requests()).unwrap().iter().filter(|r| r.url.path() == "/_mget").count();
    window(&mut shard, &(0..40).map(|i| (i, 200 + i as u64, "v3")).collect::<Vec<_>>());
    let after = rt.block_on(server.received_requests()).unwrap().iter().filter(|r| r.url.path() == "/_mget").count();
    assert_eq!(after, before + 1, "after its creates met existing documents the writer reads first again");
    assert!(live_files(&scans).iter().filter(|d| matches!(d, Doc::File(f) if f.id[1..].parse::<usize>().unwrap() < 40)).all(|d| matches!(d, Doc::File(f) if f.contents == "v3")));
}

/// An upsert written first, unread, over a document another
/// partition holds (an owner change sent without its explicit form)
/// is refused at its conflict, as a read would have refused it: the
/// other partition's version stays, whatever the positions.
#[test]
fn an_upsert_written_first_leaves_another_partitions_document_alone() {
    use denorm::index::Doc;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (server, scans) = scans_server(&rt);
    let mut b = backend(&server, &rt);
    b.write_first = denorm::index::elastic::backend::WriteFirst::Always;
    let upsert = |contents: &str| Command::UpsertFile { id: "x".into(), path: "/a/x.txt".into(), contents: contents.into(), previous_path: None };
    let mut holder = b.open_shard(1).unwrap();
    apply(holder.as_mut(), &upsert("partition 1's"), 5, FanOut::pages_of(10)).unwrap();
    holder.mark_applied(Checkpoint::new(5, 5));
    holder.commit().unwrap();
    let mut other = b.open_shard(0).unwrap();
    apply(other.as_mut(), &upsert("partition 0's"), 900, FanOut::pages_of(10)).unwrap();
    other.mark_applied(Checkpoint::new(900, 900));
    other.commit().unwrap();
    let docs = live_files(&scans);
    assert!(matches!(docs.as_slice(), [Doc::File(f)] if f.contents == "partition 1's" && f.pos == 5), "{docs:?}");
}

/// A fan-out keeps several page bulks in flight: with every bulk
/// answered only after a delay, the second page's bulk reaches the
/// server before the first page's could have been answered. The
/// rename is complete all the same.
#[test]
fn a_fan_out_has_several_page_bulks_in_flight() {
    use std::time::Instant;
    let delay = Duration::from_millis(800);
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Every bulk answered `delay` after it arrived, once `slow` is set.
    let (scans, server) = (Scans::default(), rt.block_on(MockServer::start()));
    let slow = SlowBulk { store: scans.store.clone(), delay, slow: Default::default(), arrivals: Default::default() };
    let (on, arrivals) = (slow.slow.clone(), slow.arrivals.clone());
    rt.block_on(Mock::given(path("/_bulk")).respond_with(slow).with_priority(1).mount(&server));
    let (server, scans) = scans_server_on(&rt, server, scans);
    let b = backend(&server, &rt);
    let mut shard = b.open_shard(0).unwrap();
    for i in 0..6 {
        let c = Command::UpsertFile { id: format!("f{i}"), path: format!("/a/f{i}.txt"), contents: "c".into(), previous_path: None };
        apply(shard.as_mut(), &c, i + 1, FanOut::pages_of(2)).unwrap();
    }
    shard.mark_applied(Checkpoint::new(6, 6));
    shard.commit().unwrap();
    on.store(true, std::sync::atomic::Ordering::SeqCst);
    apply(shard.as_mut(), &Command::RenamePath { from: "/a".into(), to: "/b".into() }, 7, FanOut::pages_of(2)).unwrap();
    let arrivals: Vec<Instant> = arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 3, "one bulk per page of two files");
    assert!(arrivals[1] < arrivals[0] + delay, "the second page's bulk was sent only after the first was answered");
    assert!(live_files(&scans).iter().all(|d| matches!(d, denorm::index::Doc::File(f) if f.full_path().starts_with("/b/"))));
}

/// Review F9 (`../shared/reviews/elasticsearch.md`): the conflicts of a
/// flush are read again with one `_mget` a round, not a GET each. Here 40
/// upserts written first, unread, meet the documents they replace.
#[test]
fn a_flushs_conflicts_are_read_with_one_mget_not_a_get_each() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (server, scans) = scans_server(&rt);
    let b = backend(&server, &rt);
    let mut shard = b.open_shard(0).unwrap();
    // Absent documents: the writer then writes upserts first, unread.
    window(&mut shard, &(0..40).map(|i| (i, i as u64 + 1, "v1")).collect::<Vec<_>>());
    let requests = || rt.block_on(server.received_requests()).unwrap();
    window(&mut shard, &(40..80).map(|i| (i, i as u64 + 1, "v1")).collect::<Vec<_>>());
    let before = requests().len();
    // Existing documents, newer versions: 40 creates meet them.
    window(&mut shard, &(40..80).map(|i| (i, 100 + i as u64, "v2")).collect::<Vec<_>>());
    let all = requests();
    let gets = all[before..].iter().filter(|r| r.method.as_str() == "GET" && r.url.path().starts_with("/denorm-files-g0/_doc/")).count();
    let mgets = all[before..].iter().filter(|r| r.url.path() == "/_mget").count();
    assert_eq!((gets, mgets), (0, 1), "the round's 40 conflicts read with one _mget, not a GET each");
    assert!(live_files(&scans).iter().all(|d| matches!(d, denorm::index::Doc::File(f) if f.contents == if f.id[1..].parse::<usize>().unwrap() < 40 { "v1" } else { "v2" })));
}

/// Review of Elasticsearch, F2: two writes of one document in one flush
/// were judged by the last one's position (the flush's conflicts were
/// looked up by `index/id`): when another writer changed the document
/// between the read and the flush (position 6), the first write (position
/// 5) was sent again over it, taking the document back to an older
/// version. A flush now sends each document once, its last version.
#[test]
fn two_writes_of_one_document_in_a_flush_never_send_the_older_one_over_a_newer_version() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (server, scans) = scans_server(&rt);
    let b = backend(&server, &rt);
    let mut shard = b.open_shard(0).unwrap();
    apply(shard.as_mut(), &upsert(1, "v1"), 1, FanOut::pages_of(2)).unwrap();
    shard.mark_applied(Checkpoint::new(1, 1));
    shard.commit().unwrap();
    let sent_before = bulks(&server, &rt).len();
    apply(shard.as_mut(), &upsert(1, "v5"), 5, FanOut::pages_of(2)).unwrap();
    apply(shard.as_mut(), &upsert(1, "v7"), 7, FanOut::pages_of(2)).unwrap();
    // Another writer, between the read and the flush.
    let theirs = file_source("f1", "/a", "v6", 6);
    scans.store.write("index", "denorm-files-g0", "f1", Some(theirs), None).unwrap();
    shard.mark_applied(Checkpoint::new(7, 7));
    shard.commit().unwrap();
    let older: Vec<Value> = bulks(&server, &rt)[sent_before..].iter().flatten().filter(|v| v["denorm_pos"] == 5).cloned().collect();
    assert!(older.is_empty(), "the older write was sent: {older:?}");
    assert_eq!(scans.store.get("denorm-files-g0", "f1").unwrap()["contents"], "v7");
}

/// Review of Elasticsearch, F4 (a): a writer that opens a shard another
/// writer committed (a rebalance, a reopen after a failure) does not know
/// whether a refresh began after that writer's last writes: its checkpoint
/// is searchable only once one did. It was taken as searchable at once, so
/// the group's offset and `produce --wait` passed commands a search might
/// not see (for good under `refresh_interval: -1`).
#[test]
fn a_shard_opened_after_another_writers_commit_is_searchable_only_after_a_refresh() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (server, _scans) = scans_server(&rt);
    let refreshes = || rt.block_on(server.received_requests()).unwrap().iter().filter(|r| r.url.path().ends_with("/_refresh")).count();
    {
        // The previous writer: in another process, whose refreshes this
        // backend does not know of.
        let b = backend(&server, &rt);
        let mut s1 = b.open_shard(0).unwrap();
        apply(s1.as_mut(), &upsert(1, "v1"), 1, FanOut::pages_of(2)).unwrap();
        s1.mark_applied(Checkpoint::new(1, 1));
        s1.commit().unwrap();
    }
    let before = refreshes();
    let b = backend(&server, &rt);
    let mut s2 = b.open_shard(0).unwrap();
    assert_eq!(s2.checkpoint().map(|c| c.offset), Some(1));
    assert!(!s2.searchable(false).unwrap(), "the previous writer's commit taken as searchable without a refresh");
    assert!(s2.searchable(true).unwrap());
    assert_eq!(refreshes(), before + 1);
    // A shard never written to holds nothing a search could miss.
    let mut fresh = b.open_shard(1).unwrap();
    assert!(fresh.searchable(false).unwrap());
}

/// Review of verify, S7, on Elasticsearch, whose writes outlive a crashed
/// worker's checkpoint: a repair applied, then its document's next write
/// or delete, then the repair delivered again. The guard finds the later
/// position (of the document, or of the tombstone its delete left) and
/// passes the repair as superseded, which the position guard then skips:
/// before, it was dead-lettered as refused. A repair of a document
/// written after the verify and before the repair is still refused.
#[test]
fn a_repair_delivered_again_after_its_documents_next_write_or_delete_is_superseded() {
    use denorm::apply::{repair_guard, RepairGuard};
    use denorm::command::Repair;
    use denorm::index::{Doc, Kind};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (server, _scans) = scans_server(&rt);
    let b = backend(&server, &rt);
    let mut shard = b.open_shard(0).unwrap();
    // The verify compared the index at offset 5, and found the files.
    let verified = Repair { unchanged_since: 5, seen: Some(true) };
    window(&mut shard, &[(1, 3, "v1"), (2, 4, "v1")]);
    window(&mut shard, &[(1, 8, "repaired"), (2, 10, "repaired"), (3, 6, "written since")]);
    window(&mut shard, &[(1, 9, "later")]);
    apply(shard.as_mut(), &Command::DeleteFile { id: "f2".into(), path: "/a/f2.txt".into() }, 11, FanOut::pages_of(10)).unwrap();
    shard.mark_applied(Checkpoint::new(11, 11));
    shard.commit().unwrap();
    assert_eq!(repair_guard(shard.as_mut(), &upsert(1, "repaired"), verified, 8).unwrap(), RepairGuard::Superseded);
    assert_eq!(repair_guard(shard.as_mut(), &upsert(2, "repaired"), verified, 10).unwrap(), RepairGuard::Superseded, "after its delete");
    assert_eq!(apply(shard.as_mut(), &upsert(1, "repaired"), 8, FanOut::pages_of(10)).unwrap(), 0);
    assert_eq!(apply(shard.as_mut(), &upsert(2, "repaired"), 10, FanOut::pages_of(10)).unwrap(), 0, "not brought back");
    assert!(matches!(shard.get(Kind::File, "f1").unwrap(), Some(Doc::File(f)) if f.contents == "later"));
    assert!(shard.get(Kind::File, "f2").unwrap().is_none());
    let refused = repair_guard(shard.as_mut(), &upsert(3, "x"), verified, 12).unwrap();
    assert!(refused.refusal().is_some_and(|r| r.contains("written at offset 6")), "{refused:?}");
}
