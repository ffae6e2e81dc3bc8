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
