//! Backend-neutral scenarios: the same log applied through the `Backend`
//! trait, with a redelivered suffix, must equal the reference model. Runs on
//! the embedded backend and on the Elasticsearch-API server of the suite
//! (`DENORM_ES_URL`: noida-db from scripts/test.sh, or a cluster of yours).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use denorm::apply::{apply, FanOut};
use denorm::command::Command;
use denorm::index::elastic::backend::WriteFirst;
use denorm::index::{Backend, Checkpoint, Shard};
use denorm::model::{self, Model};

const SHARDS: i32 = 3;

fn log() -> Vec<Command> {
    let mut log = denorm::demo::seed(800, 20, 200, 9);
    let (dir, file) = denorm::demo::race();
    log.extend([file, dir]);
    log.extend(denorm::demo::user_renames(5, 9));
    // A delete names the file's current path: its key decides the shard.
    let f3 = log
        .iter()
        .find_map(|c| match c {
            Command::UpsertFile { id, path, .. } if id == "f3" => Some(path.clone()),
            _ => None,
        })
        .unwrap();
    let f3 = denorm::command::path::renamed(&f3, "/clinton/projects", "/clinton/work").unwrap_or(f3);
    log.push(Command::DeleteFile { id: "f3".into(), path: f3 });
    log.push(Command::DeletePost { id: "p4".into(), user_id: "1".into() });
    log.push(Command::RenamePath { from: "/bill/projects".into(), to: "/bill/archive".into() });
    log
}

fn shard_of(c: &Command) -> i32 {
    let mut h = DefaultHasher::new();
    c.key().hash(&mut h);
    (h.finish() % SHARDS as u64) as i32
}

/// Applies `log` (positions are per-shard offsets, as in Kafka), committing
/// every few commands, then redelivers the last third: the result must equal
/// the model.
fn scenario(backend: &dyn Backend) {
    let log = log();
    let mut shards: Vec<Box<dyn Shard + Send>> = (0..SHARDS).map(|p| backend.open_shard(p).unwrap()).collect();
    let mut next = vec![0u64; SHARDS as usize];
    let mut positioned = Vec::new();
    for c in &log {
        let p = shard_of(c) as usize;
        positioned.push((p, next[p], c.clone()));
        next[p] += 1;
    }
    for (i, (p, pos, c)) in positioned.iter().enumerate() {
        apply(shards[*p].as_mut(), c, *pos, FanOut::pages_of(64)).unwrap();
        shards[*p].mark_applied(Checkpoint::new(*pos, 0));
        if i % 97 == 0 {
            shards[*p].commit().unwrap();
        }
    }
    // Redelivery of the last third, as after a crash before offsets were committed.
    for (p, pos, c) in &positioned[positioned.len() * 2 / 3..] {
        apply(shards[*p].as_mut(), c, *pos, FanOut::pages_of(64)).unwrap();
    }
    for s in &mut shards {
        s.commit().unwrap();
    }
    assert_matches_the_model(backend, &log);
}

/// The backend's documents equal the reference model's for `log`.
fn assert_matches_the_model(backend: &dyn Backend, log: &[Command]) {
    let mut m = Model::default();
    log.iter().for_each(|c| m.apply(c));
    let mut actual = Vec::new();
    backend.search().unwrap().dump(&mut |d| actual.push(d)).unwrap();
    let diffs = model::diff(m.docs(), actual, 20);
    assert!(diffs.is_empty(), "backend differs from the model:\n{}", diffs.join("\n"));
}

#[test]
fn log_with_redelivered_suffix_matches_the_model_on_the_embedded_backend() {
    let (_dir, backend) = own_embedded("scenario");
    scenario(&backend);
}

#[test]
fn log_with_redelivered_suffix_matches_the_model_on_elasticsearch() {
    let es = crate::common::elastic::elastic();
    let rt = crate::common::rt();
    let backend = es.backend(&rt, "scenario");
    rt.block_on(denorm::index::elastic::setup::ensure(&backend.client, &backend.prefix, 1, &Default::default(), None)).unwrap();
    scenario(&backend);
}

/// The stale-owner chaos contract (tests/it/common/chaos.rs) on the
/// Elasticsearch-API server of the suite: the old owner of a partition,
/// stalled mid-batch, resumes after the new owner committed; it is fenced
/// and its writes revert nothing. Each seed under an index prefix of its own.
#[test]
fn chaos_two_overlapping_owners_on_elasticsearch_leave_the_documents_equal_to_the_model() {
    chaos_on_elasticsearch("chaos", 0..8, WriteFirst::WhenAbsent);
}

/// The same contract with every upsert written first, unread (the mode a
/// replay into empty indexes switches to): the server's 409s on creates
/// that meet a version, and the positions, decide alone.
#[test]
fn chaos_with_every_upsert_written_first_on_elasticsearch_leaves_the_documents_equal_to_the_model() {
    chaos_on_elasticsearch("chaos-first", 0..4, WriteFirst::Always);
}

/// The chaos contract for each seed on the suite's Elasticsearch-API
/// server, each under an index prefix of its own.
fn chaos_on_elasticsearch(name: &str, seeds: std::ops::Range<u64>, write_first: WriteFirst) {
    let es = crate::common::elastic::elastic();
    let rt = crate::common::rt();
    let base = crate::common::elastic::prefix();
    for seed in seeds {
        let mut backend = es.backend(&rt, name);
        backend.prefix = format!("{base}-{name}-{seed}");
        backend.write_first = write_first;
        rt.block_on(denorm::index::elastic::setup::ensure(&backend.client, &backend.prefix, 1, &Default::default(), None)).unwrap();
        let search = backend.search().unwrap();
        crate::common::chaos::two_overlapping_owners(&backend, seed, || {
            let mut docs = Vec::new();
            search.dump(&mut |d| docs.push(d)).unwrap();
            docs
        });
    }
}

/// A backend of its own (under this process's prefix plus `name`) on the
/// Elasticsearch-API server of the suite, and a dump of its documents.
fn own_elastic(name: &str) -> (crate::common::elastic::Elastic, tokio::runtime::Runtime, denorm::index::elastic::backend::ElasticBackend) {
    let es = crate::common::elastic::elastic();
    let rt = crate::common::rt();
    let mut backend = es.backend(&rt, name);
    backend.prefix = format!("{}-{name}", crate::common::elastic::prefix());
    rt.block_on(denorm::index::elastic::setup::ensure(&backend.client, &backend.prefix, 1, &Default::default(), None)).unwrap();
    (es, rt, backend)
}

/// An embedded backend in a scratch directory of its own (kept while the
/// directory lives).
fn own_embedded(name: &str) -> (tempfile::TempDir, denorm::index::embedded::EmbeddedBackend) {
    let dir = tempfile::tempdir().unwrap();
    let index = denorm::index::embedded::EmbeddedIndex::open(dir.path(), name).unwrap();
    (dir, denorm::index::embedded::EmbeddedBackend::new(index, 20 << 20))
}

fn live(backend: &dyn Backend) -> Vec<denorm::index::Doc> {
    let mut docs = Vec::new();
    backend.search().unwrap().dump(&mut |d| docs.push(d)).unwrap();
    docs
}

/// Issue 27 B2 on the Elasticsearch-API server of the suite (see
/// tests/it/common/chaos.rs): a stale owner's write is fenced before it can
/// replace another partition's tombstone.
#[test]
fn a_stale_owner_cannot_bring_back_a_document_that_moved_away_on_elasticsearch() {
    let (_es, _rt, b) = own_elastic("stale");
    crate::common::chaos::a_stale_owner_cannot_bring_back_a_document_that_moved_away(&b, || live(&b));
}

/// Issue 27 B2: a take-over replaces its source partition's copy only.
#[test]
fn a_take_over_replaces_only_its_source_partitions_copy_on_elasticsearch() {
    let (_es, _rt, b) = own_elastic("takeover");
    crate::common::chaos::a_take_over_replaces_only_its_source_partitions_copy(&b, || live(&b));
}

/// Review of Elasticsearch, F1: a fan-out's page leaves alone a document
/// another partition took over since its scan (see tests/it/common/chaos.rs).
#[test]
fn a_fan_out_page_does_not_take_over_a_document_another_partition_took_since_its_scan_on_elasticsearch() {
    let (_es, _rt, b) = own_elastic("pagetake");
    crate::common::chaos::a_fan_out_page_does_not_take_over_a_document_another_partition_took_since_its_scan(&b, || live(&b));
}

/// A take-over's read is not one fetched ahead before its departure (a
/// rebuild from a migrated topic lost two of a move's documents so).
#[test]
fn a_take_over_reads_past_what_was_fetched_ahead_before_its_departure_on_elasticsearch() {
    let (_es, _rt, b) = own_elastic("ahead");
    crate::common::chaos::a_take_over_reads_past_what_was_fetched_ahead_before_its_departure(&b, || live(&b));
}

#[test]
fn a_take_over_reads_past_what_was_fetched_ahead_before_its_departure_on_the_embedded_backend() {
    let dir = tempfile::tempdir().unwrap();
    let index = denorm::index::embedded::EmbeddedIndex::open(dir.path(), "ahead").unwrap();
    let b = denorm::index::embedded::EmbeddedBackend::new(index, 20 << 20);
    crate::common::chaos::a_take_over_reads_past_what_was_fetched_ahead_before_its_departure(&b, || live(&b));
}

/// A profile change and a rename applied right after writes of their own
/// key that are not committed (on Elasticsearch: still buffered, not sent):
/// each fan-out reads them from the shard's pending writes, without a
/// commit first, runs as one page, and the documents equal the model's.
/// Then the same after a commit, whose writes a search may not see yet
/// on Elasticsearch (the shard reads them again by GET).
fn fan_outs_over_pending_writes(backend: &dyn Backend) {
    let user = |id: &str, name: &str| Command::UpsertUser { id: id.into(), name: name.into(), email: "e@x".into(), dob: "1970-01-01".into() };
    let post = |id: &str, u: &str, title: &str| Command::UpsertPost { id: id.into(), user_id: u.into(), title: title.into(), body: "b".into(), previous_user_id: None };
    let file = |id: &str, path: &str| Command::UpsertFile { id: id.into(), path: path.into(), contents: format!("contents of {id}"), previous_path: None };
    let committed = vec![user("u", "Ann"), post("p1", "u", "one"), post("p3", "u", "three"), post("p5", "u", "five"), file("f1", "/d/x/f1"), file("f2", "/d/x/f2")];
    let pending = vec![
        post("p1", "u", "one, edited"),
        post("p2", "u", "two, new"),
        Command::DeletePost { id: "p3".into(), user_id: "u".into() },
        file("f2", "/d/x/f2-moved-in-place"),
        file("f3", "/d/x/y/f3"),
        Command::DeleteFile { id: "f1".into(), path: "/d/x/f1".into() },
        user("u", "Bob"),
        Command::RenamePath { from: "/d/x".into(), to: "/d/z".into() },
    ];
    let after_commit = vec![post("p6", "u", "six"), user("u", "Cy"), file("f4", "/d/z/f4"), Command::RenamePath { from: "/d/z".into(), to: "/d/w".into() }];
    // Every command of this log is of key `u` or `/d`: one shard.
    let mut shard = backend.open_shard(0).unwrap();
    let mut pos = 0u64;
    let mut run = |shard: &mut Box<dyn Shard + Send>, log: &[Command]| {
        for c in log {
            match denorm::apply::fan_out_scan(c) {
                Some(scan) => {
                    assert!(shard.fan_out_reads_pending(&scan, 64), "{c:?}: the scan reads the pending writes");
                    let mut pages = shard.rewrite_begin(&scan, 64).unwrap();
                    assert!(pages.is_one_page(), "{c:?}: read whole as it began");
                    denorm::apply::fan_out_rest(shard.as_mut(), c, pos, &mut pages).unwrap();
                }
                None => {
                    apply(shard.as_mut(), c, pos, FanOut::pages_of(64)).unwrap();
                }
            }
            shard.mark_applied(Checkpoint::new(pos, 0));
            pos += 1;
        }
    };
    run(&mut shard, &committed);
    shard.commit().unwrap();
    run(&mut shard, &pending);
    shard.commit().unwrap();
    run(&mut shard, &after_commit);
    shard.commit().unwrap();
    let log: Vec<Command> = committed.iter().chain(&pending).chain(&after_commit).cloned().collect();
    assert_matches_the_model(backend, &log);
}

#[test]
fn fan_outs_over_pending_writes_match_the_model_on_the_embedded_backend() {
    let (_dir, backend) = own_embedded("pending");
    fan_outs_over_pending_writes(&backend);
}

#[test]
fn fan_outs_over_pending_writes_match_the_model_on_elasticsearch() {
    let (_es, _rt, backend) = own_elastic("pending");
    fan_outs_over_pending_writes(&backend);
}

/// Profile changes whose owners' posts were read ahead in one request
/// (`Shard::prefetch_scans`), with writes of their keys in between
/// (tests/it/common/read_ahead.rs), match the model on both backends.
#[test]
fn profile_changes_read_ahead_match_the_model_on_the_embedded_backend() {
    let (_dir, backend) = own_embedded("ahead");
    let log = crate::common::read_ahead::profile_changes_read_ahead(&backend, &mut || {});
    assert_matches_the_model(&backend, &log);
}

#[test]
fn profile_changes_read_ahead_match_the_model_on_elasticsearch() {
    let (_es, _rt, backend) = own_elastic("ahead");
    let log = crate::common::read_ahead::profile_changes_read_ahead(&backend, &mut || {});
    assert_matches_the_model(&backend, &log);
}

/// A fan-out's page does not undo a write made since its scan began (review
/// of lanes, F4): while a rename of several pages is in progress (in a key
/// lane, other keys' commands are applied between its pages), files under
/// the renamed directory are moved away by another key and deleted, one
/// such write committed and one still pending when the pages run. The
/// documents equal the model's on both backends: the embedded pages wrote
/// by key over the snapshot's versions, and undid both.
fn pages_keep_writes_made_since_the_scan_began(backend: &dyn Backend) {
    let file = |id: &str, path: &str| Command::UpsertFile { id: id.into(), path: path.into(), contents: format!("contents of {id}"), previous_path: None };
    let mut log: Vec<Command> = (0..30).map(|i| file(&format!("f{i}"), &format!("/d/x/f{i}"))).collect();
    let rename = Command::RenamePath { from: "/d/x".into(), to: "/d/y".into() };
    log.push(rename.clone());
    let since =
        vec![file("f5", "/d/f5-out"), Command::DeleteFile { id: "f6".into(), path: "/d/x/f6".into() }, file("f25", "/d/f25-out"), Command::DeleteFile { id: "f26".into(), path: "/d/x/f26".into() }];
    let mut shard = backend.open_shard(0).unwrap();
    for (pos, c) in log.iter().enumerate().take(30) {
        apply(shard.as_mut(), c, pos as u64, FanOut::pages_of(10)).unwrap();
    }
    shard.mark_applied(Checkpoint::new(29, 0));
    shard.commit().unwrap();
    let scan = denorm::apply::fan_out_scan(&rename).unwrap();
    let mut pages = shard.rewrite_begin(&scan, 10).unwrap();
    assert!(!pages.is_one_page(), "a scan of several pages");
    // Between the pages: two writes committed, two left pending.
    for (i, c) in since.iter().enumerate() {
        apply(shard.as_mut(), c, 31 + i as u64, FanOut::pages_of(10)).unwrap();
        if i == 1 {
            shard.commit().unwrap();
        }
    }
    denorm::apply::fan_out_rest(shard.as_mut(), &rename, 30, &mut pages).unwrap();
    shard.mark_applied(Checkpoint::new(34, 0));
    shard.commit().unwrap();
    log.extend(since);
    assert_matches_the_model(backend, &log);
}

#[test]
fn pages_keep_writes_made_since_the_scan_began_on_the_embedded_backend() {
    let (_dir, backend) = own_embedded("since");
    pages_keep_writes_made_since_the_scan_began(&backend);
}

#[test]
fn pages_keep_writes_made_since_the_scan_began_on_elasticsearch() {
    let (_es, _rt, backend) = own_elastic("since");
    pages_keep_writes_made_since_the_scan_began(&backend);
}

/// Review of Elasticsearch, F13: the read alias hides tombstones, so a
/// reader of the alias other than denorm (Kibana, `_count`) sees what
/// `denorm search` sees, before and after a cutover to a new generation.
#[test]
fn the_read_alias_hides_deleted_documents_on_elasticsearch() {
    let (es, rt, b) = own_elastic("tombalias");
    let count = |b: &denorm::index::elastic::backend::ElasticBackend| -> u64 {
        let alias = denorm::index::elastic::names::alias(&b.prefix, denorm::index::Kind::File);
        let r = rt.block_on(b.client.count(elasticsearch::CountParts::Index(&[&alias])).send()).unwrap();
        rt.block_on(r.json::<serde_json::Value>()).unwrap()["count"].as_u64().unwrap()
    };
    let file = |id: &str| Command::UpsertFile { id: id.into(), path: format!("/d/{id}"), contents: "c".into(), previous_path: None };
    let mut shard = b.open_shard(0).unwrap();
    for (pos, c) in [file("f1"), file("f2"), Command::DeleteFile { id: "f2".into(), path: "/d/f2".into() }].iter().enumerate() {
        apply(shard.as_mut(), c, pos as u64, FanOut::pages_of(10)).unwrap();
    }
    shard.mark_applied(Checkpoint::new(2, 0));
    shard.commit().unwrap();
    assert!(shard.searchable(true).unwrap());
    drop(shard);
    assert_eq!(live(&b).len(), 1);
    assert_eq!(count(&b), 1, "the read alias counts the tombstone");
    // A new generation, cut over to: the moved alias hides them too.
    rt.block_on(async {
        for kind in [denorm::index::Kind::File, denorm::index::Kind::User, denorm::index::Kind::Post] {
            denorm::index::elastic::generations::create(&b.client, &b.prefix, kind, 1, false).await.unwrap();
        }
        let kinds = denorm::index::elastic::names::kinds(None);
        let kinds = denorm::index::elastic::generations::CutoverKinds { from: &kinds, to: &kinds };
        denorm::index::elastic::generations::cut_over(&b.client, &b.prefix, (0, 1), (&Default::default(), &Default::default()), &kinds).await.unwrap();
    });
    // A backend that reads the current generation afresh.
    let b = {
        let mut fresh = es.backend(&rt, "tombalias");
        fresh.prefix = b.prefix.clone();
        fresh
    };
    let mut shard = b.open_shard(0).unwrap();
    for (pos, c) in [file("f3"), Command::DeleteFile { id: "f3".into(), path: "/d/f3".into() }].iter().enumerate() {
        apply(shard.as_mut(), c, pos as u64, FanOut::pages_of(10)).unwrap();
    }
    shard.mark_applied(Checkpoint::new(1, 0));
    shard.commit().unwrap();
    assert!(shard.searchable(true).unwrap());
    assert_eq!((live(&b).len(), count(&b)), (0, 0), "after the cutover");
}

/// What a commit claims applied is searchable within the bound
/// (`SEARCHABLE_WITHIN`, 1 s: a refresh then) although a fan-out keeps
/// writing pages after it. Each page's writes made the Elasticsearch shard
/// wait for a refresh after *them*, so a commit was not published until
/// the fan-out paused for a second: another key's `produce --wait` during
/// a 20,000-file rename on noida-db took p99 15 s (issue 45's benchmark).
fn a_commit_is_searchable_within_the_bound_while_a_fan_out_writes(backend: &dyn Backend) {
    let file = |id: &str, path: &str| Command::UpsertFile { id: id.into(), path: path.into(), contents: format!("contents of {id}"), previous_path: None };
    let mut shard = backend.open_shard(0).unwrap();
    for i in 0..60 {
        apply(shard.as_mut(), &file(&format!("f{i}"), &format!("/d/x/f{i}")), i, FanOut::pages_of(10)).unwrap();
    }
    shard.mark_applied(Checkpoint::new(59, 0));
    shard.commit().unwrap();
    assert!(shard.searchable(true).unwrap());
    let rename = Command::RenamePath { from: "/d/x".into(), to: "/d/y".into() };
    let mut pages = shard.rewrite_begin(&denorm::apply::fan_out_scan(&rename).unwrap(), 2).unwrap();
    // Another key's command, committed: what the commit claims.
    apply(shard.as_mut(), &file("other", "/o/1"), 61, FanOut::pages_of(10)).unwrap();
    shard.mark_applied(Checkpoint::new(61, 0));
    shard.commit().unwrap();
    let committed = std::time::Instant::now();
    // A page every 100 ms after the commit, for 3 s at most, and after
    // each page another commit of the other key (as the applier commits
    // between pages): each new commit must not put the first one's
    // publication off either.
    let mut searchable_after = None;
    let mut pos = 62;
    while committed.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(100));
        let (_, done) = shard.rewrite_page(&mut pages, &mut |d| denorm::apply::fan_out_rule(&rename, 60, d)).unwrap();
        assert!(!done, "the fan-out ran out of pages: make it longer");
        apply(shard.as_mut(), &file(&format!("other{pos}"), &format!("/o/{pos}")), pos, FanOut::pages_of(10)).unwrap();
        shard.mark_applied(Checkpoint::new(pos, 0));
        shard.commit().unwrap();
        pos += 1;
        if shard.searchable(false).unwrap() {
            searchable_after = Some(committed.elapsed());
            break;
        }
    }
    let after = searchable_after.unwrap_or_else(|| panic!("the commit was not searchable 3 s after it, while the fan-out wrote a page every 100 ms"));
    assert!(after < Duration::from_millis(1800), "searchable {after:?} after the commit");
    assert!(live(backend).iter().any(|d| d.id() == "other"));
}

#[test]
fn a_commit_is_searchable_within_the_bound_while_a_fan_out_writes_on_the_embedded_backend() {
    let (_dir, backend) = own_embedded("bound");
    a_commit_is_searchable_within_the_bound_while_a_fan_out_writes(&backend);
}

#[test]
fn a_commit_is_searchable_within_the_bound_while_a_fan_out_writes_on_elasticsearch() {
    let (_es, _rt, backend) = own_elastic("bound");
    a_commit_is_searchable_within_the_bound_while_a_fan_out_writes(&backend);
}
