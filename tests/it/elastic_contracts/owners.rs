//! Ownership of a partition: a previous owner fenced, tombstones swept by
//! one writer, the chaos contract of two overlapping owners, privileges.

use super::store::*;
use super::*;
use denorm::apply::{apply, FanOut};
use denorm::command::Command;
use denorm::index::Backend;

/// Finding 2, the checkpoint: a previous owner that resumes after a new
/// owner took the partition over (abandoned by a shutdown bound or a
/// rebalance) can no longer move the checkpoint back or rewrite the
/// parked keys: the new owner's claim fenced it.
#[test]
fn a_previous_owner_that_resumes_cannot_move_the_checkpoint_or_the_parked_keys() {
    use denorm::index::{Checkpoint, IndexError};
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    let meta = MetaDoc::default();
    rt.block_on(Mock::given(path_regex(r"^/denorm-meta/(_doc|_create)/p0$")).respond_with(meta.clone()).with_priority(1).mount(server));
    // The parked keys' own documents (review F12).
    let store = Store::default();
    rt.block_on(Mock::given(path_regex(r"^/denorm-meta/_doc/p0-parked-[0-9-]+$")).respond_with(store.clone()).with_priority(1).mount(server));
    let b = d.backend();
    let mut old = b.open_shard(0).unwrap();
    old.mark_applied(Checkpoint::new(5, 1));
    old.commit().unwrap();
    // The old owner stalls; the partition moves to a new owner.
    let mut new = b.open_shard(0).unwrap();
    assert_eq!(new.checkpoint().map(|c| c.offset), Some(5), "the new owner starts where the old one committed");
    // The new owner parks a key behind an aborted command.
    new.parking().insert("/d".into(), denorm::index::progress::Parked { behind: "c-8".into(), last_dlq: 0, replayed_through: -1, last_at: 8, since: -1 });
    new.mark_applied(Checkpoint::new(9, 2));
    new.commit().unwrap();
    // The old owner resumes with an older position and no parked key:
    // written, it would move the checkpoint back and un-park "/d".
    old.mark_applied(Checkpoint::new(7, 3));
    let err = old.commit().unwrap_err();
    assert!(matches!(err, IndexError::Fenced(_)) && err.is_retryable(), "fenced, retryable (never a rejected command): {err:?}");
    assert!(err.to_string().contains("claimed by another owner"), "{err}");
    let (stored, _) = meta.0.lock().unwrap().clone().unwrap();
    assert_eq!((stored["applied"].as_u64(), stored["owner"].as_u64()), (Some(9), Some(2)), "{stored}");
    let parked = store.get("denorm-meta", stored["parked_ref"].as_str().expect("the parked keys' document")).unwrap();
    assert_eq!(parked["parked"][0]["key"], "/d", "{parked}");
}

/// Review of Elasticsearch, F12: the partition's meta document is written
/// at every commit. With 500 keys parked, it carried them all each time
/// (and every read of the checkpoints read them back). Now they are
/// written to a document of their own when they change, which the meta
/// document names in the same conditional write; a new owner reads them
/// back, and the list no checkpoint names any more is deleted.
#[test]
fn the_parked_keys_are_written_when_they_change_not_with_every_checkpoint() {
    use denorm::index::progress::Parked;
    use denorm::index::Checkpoint;
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    let store = Store::default();
    rt.block_on(store.mount(server));
    let b = d.backend();
    let mut shard = b.open_shard(0).unwrap();
    for i in 0..500 {
        shard.parking().insert(format!("/key-{i:03}"), Parked { behind: format!("c-{i}"), last_dlq: i, replayed_through: -1, last_at: i, since: -1 });
    }
    for offset in 1..=10 {
        shard.mark_applied(Checkpoint::new(offset, offset));
        shard.commit().unwrap();
    }
    let writes = |of: &dyn Fn(&str) -> bool| -> Vec<usize> {
        let requests = rt.block_on(server.received_requests()).unwrap();
        requests.iter().filter(|r| r.method.as_str() == "POST" && r.url.path().trim_start_matches('/').split('/').nth(2).is_some_and(of)).map(|r| r.body.len()).collect()
    };
    let (meta, lists) = (writes(&|d| d == "p0"), writes(&|d| d.starts_with("p0-parked-")));
    let meta: Vec<usize> = meta.into_iter().skip(1).collect(); // the claim
    println!(
        "10 commits with 500 parked keys: {} meta writes of at most {} bytes; {} write(s) of the keys, {} bytes",
        meta.len(),
        meta.iter().max().unwrap(),
        lists.len(),
        lists.iter().sum::<usize>()
    );
    assert_eq!(lists.len(), 1, "the parked keys written once for ten commits");
    assert!(meta.len() == 10 && meta.iter().all(|n| *n < 1024), "each meta write without the keys: {meta:?}");
    // One key released: a new list, the old one deleted.
    shard.parking().remove("/key-000");
    shard.mark_applied(Checkpoint::new(11, 11));
    shard.commit().unwrap();
    let stored = store.get("denorm-meta", "p0").unwrap();
    let named = stored["parked_ref"].as_str().unwrap().to_string();
    let lists: Vec<String> = store.0.lock().unwrap().keys().filter(|(_, id)| id.starts_with("p0-parked-")).map(|(_, id)| id.clone()).collect();
    assert_eq!(lists, vec![named.clone()], "only the list the checkpoint names is kept");
    // A new owner reads them back.
    drop(shard);
    let mut next = b.open_shard(0).unwrap();
    assert_eq!(next.checkpoint().map(|c| c.offset), Some(11));
    assert_eq!(next.parking().len(), 499);
    assert!(next.parking().contains_key("/key-001") && !next.parking().contains_key("/key-000"));
    // Its claim keeps the same list, and so does its first commit: not
    // written again.
    assert_eq!(store.get("denorm-meta", "p0").unwrap()["parked_ref"], json!(named));
    next.mark_applied(Checkpoint::new(12, 12));
    next.commit().unwrap();
    assert_eq!(store.get("denorm-meta", "p0").unwrap()["parked_ref"], json!(named));
    assert_eq!(writes(&|d| d.starts_with("p0-parked-")).len(), 2, "the first list and the one after the release");
}

/// Issue 27 B7: the writers of every partition look for expired
/// tombstones after a rebalance, but one sweep runs per generation and
/// hour (before, each of them sent its own `_delete_by_query`, each
/// leaving a task document behind).
#[test]
fn one_writer_of_a_generation_sweeps_expired_tombstones() {
    use denorm::index::Checkpoint;
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    let store = Store::default();
    rt.block_on(store.mount(server));
    let b = d.backend();
    let upsert = |id: &str| Command::UpsertFile { id: id.into(), path: format!("/d/{id}.txt"), contents: "c".into(), previous_path: None };
    for p in 0..4 {
        let mut shard = b.open_shard(p).unwrap();
        apply(shard.as_mut(), &upsert(&format!("f{p}")), 1, FanOut::pages_of(10)).unwrap();
        shard.mark_applied(Checkpoint::new(1, 1));
        shard.commit().unwrap();
    }
    let sweeps = rt.block_on(server.received_requests()).unwrap().into_iter().filter(|r| r.url.path().ends_with("/_delete_by_query")).count();
    assert_eq!(sweeps, 1, "one sweep for four writers");
    let claim = store.get("denorm-meta", "sweep").expect("the claim of the sweep");
    assert_eq!(claim["partition"], 0, "the first to look: {claim}");
}

/// Finding 2, the documents: a previous owner that resumes with a
/// create it staged before a newer command deleted the document cannot
/// bring it back, because the delete left a tombstone with its position.
#[test]
fn a_previous_owners_create_cannot_bring_back_a_document_a_newer_command_deleted() {
    use denorm::index::{Checkpoint, IndexError};
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    let store = Store::default();
    rt.block_on(store.mount(server));
    let b = d.backend();
    let upsert = Command::UpsertFile { id: "f1".into(), path: "/d/1.txt".into(), contents: "c".into(), previous_path: None };
    // The old owner reads f1 as absent and stages its create (offset 5),
    // then stalls before committing.
    let mut old = b.open_shard(0).unwrap();
    apply(old.as_mut(), &upsert, 5, FanOut::pages_of(10)).unwrap();
    // The new owner applies the same command, then a delete (offset 7).
    let mut new = b.open_shard(0).unwrap();
    apply(new.as_mut(), &upsert, 5, FanOut::pages_of(10)).unwrap();
    new.mark_applied(Checkpoint::new(5, 1));
    new.commit().unwrap();
    apply(new.as_mut(), &Command::DeleteFile { id: "f1".into(), path: "/d/1.txt".into() }, 7, FanOut::pages_of(10)).unwrap();
    new.mark_applied(Checkpoint::new(7, 2));
    new.commit().unwrap();
    // The old owner resumes.
    old.mark_applied(Checkpoint::new(5, 1));
    let err = old.commit().unwrap_err();
    assert!(matches!(err, IndexError::Fenced(_)), "{err:?}");
    let f1 = store.get("denorm-files-g0", "f1").expect("the tombstone");
    assert_eq!((f1["denorm_deleted"].as_bool(), f1["denorm_pos"].as_u64()), (Some(true), Some(7)), "f1 must stay deleted: {f1}");
    assert_eq!(new.get(Kind::File, "f1").unwrap(), None, "a tombstone reads as absent");
    // A newer command may bring it back.
    apply(new.as_mut(), &upsert, 9, FanOut::pages_of(10)).unwrap();
    new.commit().unwrap();
    assert_eq!(store.get("denorm-files-g0", "f1").unwrap()["denorm_pos"], 9);
    // Tombstones expire: a writer's first commit asks the cluster to
    // remove those older than a day, in the background.
    let sweeps: Vec<Request> = rt.block_on(server.received_requests()).unwrap().into_iter().filter(|r| r.url.path().ends_with("/_delete_by_query")).collect();
    assert_eq!(sweeps.len(), 1, "the new writer's first commit; the fenced one does not sweep");
    assert_eq!(sweeps[0].url.path(), "/denorm-files-g0,denorm-users-g0,denorm-posts-g0/_delete_by_query");
    let q = sweeps[0].url.query().unwrap_or("");
    assert!(q.contains("conflicts=proceed") && q.contains("wait_for_completion=false"), "{q}");
    let body: Value = serde_json::from_slice(&sweeps[0].body).unwrap();
    assert_eq!(body["query"]["bool"]["filter"][0], json!({"term": {"denorm_deleted": true}}));
    let before = body["query"]["bool"]["filter"][1]["range"]["denorm_deleted_at"]["lt"].as_u64().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    assert!((now - before).abs_diff(24 * 3600 * 1000) < 60_000, "a day's margin: {}", now - before);
}

/// Issue 11's chaos test: two owners of a partition overlap. The old one
/// applies and commits part of the log, stages more, stalls; the new
/// one takes over from the old one's checkpoint and applies the whole
/// rest; then the old one resumes, applies a few more commands and
/// commits (it is fenced, but its writes reach the store first). Against
/// the stateful test store, which enforces `if_seq_no`/`if_primary_term`
/// and create-if-absent as Elasticsearch does, the documents must equal
/// the reference model of the whole log, for every seed.
#[test]
fn chaos_two_overlapping_owners_leave_the_documents_equal_to_the_model() {
    for seed in 0..20 {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (server, scans) = scans_server(&rt);
        let b = backend(&server, &rt);
        chaos::two_overlapping_owners(&b, seed, || live_files(&scans));
    }
}

/// The chaos contract with every upsert written first, unread: each
/// create that meets a version is decided by the conflict path alone.
#[test]
fn chaos_with_every_upsert_written_first_leaves_the_documents_equal_to_the_model() {
    for seed in 0..20 {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (server, scans) = scans_server(&rt);
        let mut b = backend(&server, &rt);
        b.write_first = denorm::index::elastic::backend::WriteFirst::Always;
        chaos::two_overlapping_owners(&b, seed, || live_files(&scans));
    }
}

/// Finding 5 at run time (privileges removed after startup): the 403 on
/// the refresh before a rename leaves the command to be retried, with
/// the reason, instead of dead-lettering every rename.
#[test]
fn a_refresh_refused_for_lack_of_privileges_is_retried_not_dead_lettered() {
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        Mock::given(method("GET")).and(path("/denorm-meta/_doc/p0")).respond_with(recorded::doc_missing("denorm-meta", "p0")).mount(server).await;
        Mock::given(path("/denorm-files-g0/_refresh")).respond_with(recorded::unauthorized("indices:admin/refresh", "denorm-files-000001", "maintenance,manage,all")).mount(server).await;
    });
    let b = d.backend();
    let mut shard = b.open_shard(0).unwrap();
    let err = apply(shard.as_mut(), &Command::RenamePath { from: "/c/a".into(), to: "/c/b".into() }, 10, FanOut::pages_of(2)).unwrap_err();
    assert_eq!(err.kind(), denorm::retry::Kind::Transient, "retryable, not rejected: {err:?}");
    assert!(std::error::Error::source(&err).is_some_and(|c| c.to_string().contains("403")), "the Elasticsearch error is kept as the cause: {err:?}");
    assert!(err.to_string().contains("403") && err.to_string().contains("maintenance"), "{err}");
}
