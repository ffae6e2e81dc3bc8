//! The dependents of many owners read in one search: a window of profile
//! changes searches once, not once per change, and each change still
//! rewrites exactly its owner's posts as they are when it runs.

use super::store::*;
use super::*;

/// Searches of an index (a fan-out's, or many owners' dependents'), not
/// the pages of a point in time.
fn index_searches(server: &MockServer, rt: &tokio::runtime::Runtime) -> usize {
    rt.block_on(server.received_requests()).unwrap().iter().filter(|r| r.url.path().ends_with("/_search") && r.url.path() != "/_search").count()
}

/// 13 profile changes of 9 users in one window, with
/// writes of their keys between the read and the changes, and a refresh
/// in the middle of the window. On the stateful
/// store, whose searches see only what a refresh published.
#[test]
fn a_window_of_profile_changes_reads_its_owners_posts_in_one_search() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (server, scans) = scans_server(&rt);
    let b = backend(&server, &rt);
    let mut before = 0;
    let log = crate::common::read_ahead::profile_changes_read_ahead(&b, &mut || before = index_searches(&server, &rt));
    // One before the window, one for the owners still to come after the
    // refresh in its middle.
    assert_eq!(index_searches(&server, &rt) - before, 2, "one search for the window's owners and one after the refresh, none per profile change");
    let mut model = denorm::model::Model::default();
    log.iter().for_each(|c| model.apply(c));
    let expected: Vec<_> = model.docs().into_iter().filter(|d| d.kind() == Kind::Post || d.kind() == Kind::User).collect();
    let mut actual = live_docs(&scans, Kind::Post);
    actual.extend(live_docs(&scans, Kind::User));
    let diffs = denorm::model::diff(expected, actual, 20);
    assert!(diffs.is_empty(), "the store differs from the model:\n{}", diffs.join("\n"));
}

/// The same window as commands of the files-and-posts model: its owners'
/// dependents are read in one search too, and each upsert rewrites
/// exactly its owner's posts.
#[test]
fn a_window_of_a_models_owner_upserts_reads_their_dependents_in_one_search() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (server, _scans) = scans_server(&rt);
    let mut b = backend(&server, &rt);
    let d = denorm::command::generic::legacy::domain();
    b.model = Some(d);
    let mut before = 0;
    let log = crate::common::read_ahead::profile_changes_read_ahead_as(&b, &mut || before = index_searches(&server, &rt), &|c| crate::model_apply::as_files_and_posts(d, c));
    assert_eq!(index_searches(&server, &rt) - before, 2, "one search for the window's owners and one after the refresh, none per owner's upsert");
    let mut shard = denorm::index::Backend::open_shard(&b, 0).unwrap();
    crate::model_apply::assert_files_and_posts_reference(shard.as_mut(), d, &log, "the test store");
}

/// A window of patches of the shop model's customers, whose copies two
/// kinds carry (orders: name and plan; tickets: plan): their dependents
/// are read with one search per kind, not two per patch, and each patch
/// rewrites exactly its customer's.
#[test]
fn a_window_of_patches_of_owners_copied_by_two_kinds_reads_their_dependents_in_one_search_per_kind() {
    use denorm::apply::{apply, dependents_scans, FanOut};
    use denorm::command::generic::bound::Bound;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (server, _scans) = scans_server(&rt);
    let mut b = backend(&server, &rt);
    let d = crate::common::shop::model().interned();
    b.model = Some(d);
    let mut lines = Vec::new();
    for c in 0..8 {
        lines.push(format!(r#"{{"op":"upsert","kind":"customer","id":"c{c}","fields":{{"name":"Old{c}","plan":"free","since":"2026-01-01"}}}}"#));
        for o in 0..2 {
            lines.push(format!(r#"{{"op":"upsert","kind":"order","id":"o{c}-{o}","fields":{{"customer_id":"c{c}","placed":"2026-12-01","status":"open","total":1}}}}"#));
        }
        lines.push(format!(r#"{{"op":"upsert","kind":"ticket","id":"t{c}","fields":{{"customer_id":"c{c}","subject":"Help","open":true}}}}"#));
    }
    // After the commit: a patch read on its own.
    lines.push(r#"{"op":"patch","kind":"customer","id":"c0","set":{"plan":"team"}}"#.into());
    let window: Vec<String> = (0..8).map(|c| format!(r#"{{"op":"patch","kind":"customer","id":"c{c}","set":{{"name":"New{c}","plan":"gold"}}}}"#)).collect();
    let log = denorm::command::generic::jsonl::parse_all(d, [lines.join("\n"), window.join("\n")].join("\n").as_bytes()).unwrap();
    let commands: Vec<_> = log.iter().map(|e| Bound::envelope(d, e.clone()).command).collect();
    let loaded = lines.len() - 1;
    let mut shard = denorm::index::Backend::open_shard(&b, 0).unwrap();
    for (pos, c) in commands.iter().enumerate() {
        if pos == loaded {
            // Committed and published: a search sees it all.
            shard.commit().unwrap();
            assert!(shard.searchable(true).unwrap());
        }
        if pos == lines.len() {
            let scans: Vec<_> = commands[pos..].iter().flat_map(dependents_scans).collect();
            assert_eq!(scans.len(), 16, "each patch reads its customer's orders and tickets");
            let before = index_searches(&server, &rt);
            shard.prefetch_scans(&scans).unwrap();
            for (p, c) in commands.iter().enumerate().skip(pos) {
                apply(shard.as_mut(), c, p as u64, FanOut::pages_of(64)).unwrap();
            }
            assert_eq!(index_searches(&server, &rt) - before, 2, "one search of the orders and one of the tickets, none per patch");
            break;
        }
        apply(shard.as_mut(), c, pos as u64, FanOut::pages_of(64)).unwrap();
    }
    shard.commit().unwrap();
    crate::model_apply::assert_same(shard.as_mut(), d, &crate::model_apply::reference_of(d, &log), &log, "the test store");
}
