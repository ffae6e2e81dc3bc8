//! Renames under conflicts and failures: the version found mid-rename,
//! searchable before published, expired points in time, missing shards.

use super::*;
use denorm::apply::{apply, FanOut};
use denorm::command::Command;
use denorm::index::Backend;
use wiremock::matchers::query_param;

/// Finding 1: the rewrite of a document that changed under the scan
/// (409) is applied to the version found, not dropped.
#[test]
fn a_conflict_during_a_rename_moves_the_version_found_instead_of_dropping_the_rewrite() {
    let d = Double::new().scan(1);
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        Mock::given(path("/_search")).respond_with(recorded::search_page(vec![hit("a", "/c/a", 5, 1)])).mount(server).await;
        Mock::given(method("POST")).and(path("/_bulk")).respond_with(recorded::bulk(vec![recorded::bulk_item_version_conflict("index", "a", 5, 7)])).up_to_n_times(1).mount(server).await;
        Mock::given(method("POST")).and(path("/_bulk")).respond_with(recorded::bulk(vec![recorded::bulk_item_ok("index", "a", 8)])).mount(server).await;
        // Another writer (an older command, position 8) changed it.
        Mock::given(method("GET")).and(path("/denorm-files-g0/_doc/a")).respond_with(recorded::get_doc("a", 7, file_source("a", "/c/a", "changed", 8))).mount(server).await;
    });
    let b = d.backend();
    let mut shard = b.open_shard(0).unwrap();
    let written = apply(shard.as_mut(), &Command::RenamePath { from: "/c/a".into(), to: "/c/b".into() }, 10, FanOut::pages_of(2)).unwrap();
    assert_eq!(written, 1);
    let bulks = bulks(server, rt);
    assert_eq!(bulks.len(), 2, "the conflicting rewrite must be sent again: {bulks:?}");
    assert_eq!(bulks[1][0]["index"]["if_seq_no"], 7, "against the version found");
    assert_eq!(bulks[1][1]["path"], "/c/b");
    assert_eq!(bulks[1][1]["contents"], "changed", "the version found is the one moved");
    assert_eq!(bulks[1][1]["denorm_pos"], 10);
    rt.block_on(server.verify());
}

/// Issue 27 B3: the worker publishes a commit's offset (which the
/// group commits, and `produce --wait` watches) only once its writes
/// are searchable. A commit itself never waits for a refresh; a shard
/// refreshes its generation once its last write is a second old, or at
/// once when forced (stopping), unless another writer of the backend
/// refreshed after that write; a fan-out's pages count like buffered
/// writes.
#[test]
fn a_commit_is_searchable_before_its_offset_is_published() {
    let d = Double::new().scan(1);
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        Mock::given(method("GET"))
            .and(path("/denorm-meta/_doc/p1"))
            .respond_with(ResponseTemplate::new(404).set_body_json(json!({"_index": "denorm-meta", "_id": "p1", "found": false})))
            .mount(server)
            .await;
        Mock::given(path("/_search")).respond_with(recorded::search_page(vec![hit("a", "/c/a", 5, 1)])).mount(server).await;
        Mock::given(method("POST")).and(path("/_bulk")).respond_with(recorded::bulk(vec![recorded::bulk_item_ok("index", "a", 8)])).mount(server).await;
        Mock::given(path("/denorm-files-g0,denorm-users-g0,denorm-posts-g0/_refresh"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"_shards": {"total": 6, "successful": 3, "failed": 0}})))
            .mount(server)
            .await;
    });
    let refreshes = || rt.block_on(server.received_requests()).unwrap().iter().filter(|r| r.url.path().ends_with("-g0/_refresh")).count();
    let b = d.backend();
    let (mut p0, mut p1) = (b.open_shard(0).unwrap(), b.open_shard(1).unwrap());
    assert!(p0.searchable(false).unwrap(), "nothing written yet");
    // A fan-out: its pages are written during the apply.
    apply(p0.as_mut(), &Command::RenamePath { from: "/c/a".into(), to: "/c/b".into() }, 10, FanOut::pages_of(2)).unwrap();
    p0.mark_applied(Checkpoint::new(10, 0));
    p0.commit().unwrap();
    // A buffered write of another partition, before p0's refresh.
    p1.put(denorm::index::Doc::File(denorm::index::FileDoc { id: "f9".into(), name: "9.txt".into(), path: "/c".into(), contents: "x".into(), pos: 11 })).unwrap();
    p1.mark_applied(Checkpoint::new(11, 0));
    p1.commit().unwrap();
    let (fan_out_refreshes, commits_refreshes) = (1, 0);
    assert_eq!(refreshes(), fan_out_refreshes + commits_refreshes, "one refresh before the fan-out's scan; commits send none");
    assert!(!p0.searchable(false).unwrap(), "not yet: the writes are less than a second old");
    assert_eq!(refreshes(), 1);
    assert!(p0.searchable(true).unwrap(), "forced");
    assert_eq!(refreshes(), 2, "the forced check refreshed the generation");
    assert!(p1.searchable(false).unwrap(), "p1's write came before p0's refresh began: covered");
    assert!(p0.searchable(false).unwrap());
    assert_eq!(refreshes(), 2, "no more refreshes");
    let reqs = rt.block_on(server.received_requests()).unwrap();
    assert!(reqs.iter().all(|r| !r.url.query().unwrap_or("").contains("refresh=")), "no request waits for a refresh");
    // A write after the refresh is not covered; a second later its
    // shard refreshes by itself.
    p1.put(denorm::index::Doc::File(denorm::index::FileDoc { id: "f10".into(), name: "10.txt".into(), path: "/c".into(), contents: "x".into(), pos: 12 })).unwrap();
    p1.mark_applied(Checkpoint::new(12, 0));
    p1.commit().unwrap();
    assert!(!p1.searchable(false).unwrap());
    std::thread::sleep(denorm::index::elastic::backend::SEARCHABLE_WITHIN);
    assert!(p1.searchable(false).unwrap());
    assert_eq!(refreshes(), 3);
}

/// Finding 1, the delete path: a conflicting delete is sent again only
/// when what is there is older than the delete.
#[test]
fn a_conflicting_delete_never_deletes_a_newer_version() {
    let d = Double::new().scan(0);
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        Mock::given(method("GET")).and(path("/denorm-files-g0/_doc/f1")).respond_with(recorded::get_doc("f1", 3, file_source("f1", "/c", "old", 5))).up_to_n_times(1).mount(server).await;
        // Before the delete lands, a newer command (position 50) rewrote it.
        Mock::given(method("GET")).and(path("/denorm-files-g0/_doc/f1")).respond_with(recorded::get_doc("f1", 9, file_source("f1", "/c", "newer", 50))).mount(server).await;
        Mock::given(method("POST")).and(path("/_bulk")).respond_with(recorded::bulk(vec![recorded::bulk_item_version_conflict("index", "f1", 3, 9)])).mount(server).await;
    });
    let b = d.backend();
    let mut shard = b.open_shard(0).unwrap();
    apply(shard.as_mut(), &Command::DeleteFile { id: "f1".into(), path: "/c/1.txt".into() }, 20, FanOut::pages_of(2)).unwrap();
    shard.commit().unwrap();
    let bulks = bulks(server, rt);
    assert_eq!(bulks.len(), 1, "the newer version (position 50) must not be deleted by position 20: {bulks:?}");
    assert_eq!(bulks[0][0]["index"]["if_seq_no"], 3, "the delete is a tombstone written over the version read");
    assert_eq!((bulks[0][1]["denorm_deleted"].as_bool(), bulks[0][1]["denorm_pos"].as_u64()), (Some(true), Some(20)));
}

/// Finding 3: a point in time that expired between pages restarts the
/// scan (the position guards make that safe) instead of rejecting a
/// valid rename as a permanent failure.
#[test]
fn an_expired_point_in_time_restarts_the_scan_instead_of_rejecting_the_rename() {
    let d = Double::new().scan(2).bulk_ok();
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        Mock::given(path("/_search")).respond_with(recorded::search_page(vec![hit("a", "/c/a", 1, 1), hit("b", "/c/a", 2, 2)])).up_to_n_times(1).mount(server).await;
        Mock::given(path("/_search")).respond_with(recorded::search_context_missing()).up_to_n_times(1).mount(server).await;
        // After the restart, what was moved no longer matches.
        Mock::given(path("/_search")).respond_with(recorded::search_page(vec![hit("c", "/c/a", 3, 3)])).mount(server).await;
    });
    let b = d.backend();
    let mut shard = b.open_shard(0).unwrap();
    let written = apply(shard.as_mut(), &Command::RenamePath { from: "/c/a".into(), to: "/c/b".into() }, 10, FanOut::pages_of(2)).unwrap();
    assert_eq!(written, 3);
    let searches: Vec<Value> = rt.block_on(server.received_requests()).unwrap().iter().filter(|r| r.url.path() == "/_search").map(|r| serde_json::from_slice(&r.body).unwrap()).collect();
    assert_eq!(searches.len(), 3);
    assert!(searches[2].get("search_after").is_none(), "the scan starts again from the beginning");
    let pit = rt.block_on(server.received_requests()).unwrap().into_iter().find(|r| r.url.path() == "/denorm-files-g0/_pit").unwrap();
    let keep_alive = pit.url.query_pairs().find(|(k, _)| k == "keep_alive").map(|(_, v)| v.to_string()).unwrap();
    assert_eq!(keep_alive, "5m", "a keep-alive longer than bulk retries between pages");
    // Review F10: a point in time sees the last refresh; the pages
    // rewritten before the expiry are refreshed before the scan starts
    // again, or it would read them as they were and send them again.
    let order: Vec<String> =
        rt.block_on(server.received_requests()).unwrap().iter().map(|r| r.url.path().to_string()).filter(|p| p.ends_with("/_pit") || p.ends_with("/_refresh") || p == "/_bulk").collect();
    // Opened at `/<index>/_pit`, closed at `/_pit`.
    let pits: Vec<usize> = order.iter().enumerate().filter(|(_, p)| p.ends_with("/_pit") && *p != "/_pit").map(|(i, _)| i).collect();
    assert_eq!(pits.len(), 2, "{order:?}");
    let between = &order[pits[0]..pits[1]];
    let (bulk, refresh) = (between.iter().position(|p| p == "/_bulk"), between.iter().rposition(|p| p.ends_with("/_refresh")));
    assert!(matches!((bulk, refresh), (Some(b), Some(r)) if r > b), "no refresh after the first page's bulk and before the new point in time: {order:?}");
    rt.block_on(server.verify());
}

/// Review F3: a fan-out's scan refreshes only when a search may not see
/// something yet: a rename right after a refresh of the generation that
/// covered every write sends none; one after a write sends one.
#[test]
fn a_fan_out_refreshes_only_when_something_written_is_not_searchable_yet() {
    let d = Double::new().scan(2);
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        // More than a page: each rename scans through a point in time.
        let page = vec![hit("a", "/c/x", 1, 1), hit("b", "/c/x", 2, 2), hit("c", "/c/x", 3, 3)];
        Mock::given(path("/denorm-files-g0/_search")).respond_with(recorded::search_page(page)).mount(server).await;
        Mock::given(path("/_search")).respond_with(recorded::search_page(vec![])).mount(server).await;
        Mock::given(method("POST")).and(path("/_bulk")).respond_with(recorded::bulk(vec![recorded::bulk_item_ok("index", "f9", 1)])).mount(server).await;
        Mock::given(path("/denorm-files-g0,denorm-users-g0,denorm-posts-g0/_refresh"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"_shards": {"total": 6, "successful": 3, "failed": 0}})))
            .mount(server)
            .await;
    });
    let fan_out_refreshes = || rt.block_on(server.received_requests()).unwrap().iter().filter(|r| r.url.path() == "/denorm-files-g0/_refresh").count();
    let b = d.backend();
    let mut p0 = b.open_shard(0).unwrap();
    p0.put(denorm::index::Doc::File(denorm::index::FileDoc { id: "f9".into(), name: "9.txt".into(), path: "/c/a".into(), contents: "x".into(), pos: 9 })).unwrap();
    p0.mark_applied(Checkpoint::new(9, 0));
    p0.commit().unwrap();
    // The write made searchable by a refresh of the generation (as the
    // worker's once-a-second check does).
    assert!(p0.searchable(true).unwrap());
    apply(p0.as_mut(), &Command::RenamePath { from: "/c/x".into(), to: "/c/y".into() }, 10, FanOut::pages_of(2)).unwrap();
    assert_eq!(fan_out_refreshes(), 0, "everything written was searchable already");
    p0.put(denorm::index::Doc::File(denorm::index::FileDoc { id: "f9".into(), name: "9.txt".into(), path: "/c/b".into(), contents: "y".into(), pos: 11 })).unwrap();
    apply(p0.as_mut(), &Command::RenamePath { from: "/c/b".into(), to: "/c/z".into() }, 12, FanOut::pages_of(2)).unwrap();
    assert_eq!(fan_out_refreshes(), 1, "a write since: its scan must see it");
}

/// Finding 4: partial results are refused, both by asking for none and
/// by checking each page, so a scan never ends early with documents
/// silently left unrewritten.
#[test]
fn a_page_missing_shards_fails_the_scan_retryably_instead_of_ending_it() {
    let d = Double::new().scan(1).bulk_ok();
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        Mock::given(path("/_search")).and(query_param("allow_partial_search_results", "false")).respond_with(recorded::search_page_partial(vec![hit("a", "/c/a", 1, 1)])).mount(server).await;
    });
    let b = d.backend();
    let mut shard = b.open_shard(0).unwrap();
    let err = apply(shard.as_mut(), &Command::RenamePath { from: "/c/a".into(), to: "/c/b".into() }, 10, FanOut::pages_of(2)).unwrap_err();
    assert_eq!(err.kind(), denorm::retry::Kind::Transient, "retryable, not a rejection: {err:?}");
    assert!(err.to_string().contains("1 of 2 shards failed"), "{err}");
    assert!(bulks(server, rt).is_empty(), "nothing of a partial page is written");
}
