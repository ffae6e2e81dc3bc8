//! What an Elasticsearch shard writer wrote that a search may not see yet:
//! Elasticsearch searches only what a refresh has published, but answers
//! a GET of a document written since from memory (its version map). A
//! fan-out's scan therefore searches, and reads again by GET the
//! documents this writer wrote since the last refresh began: those a
//! search found (their versions may be newer) and those of the scan's key
//! (a search may not find them yet). A fan-out reads its own key's
//! documents only, and only this partition's owners write them (a
//! take-over is written by the key it joins), so what a previous owner
//! wrote is covered by a refresh that began after this writer opened the
//! shard.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use super::docs::Hit;
use crate::command::path;
use crate::index::{Doc, Kind, Scan};

/// Documents written since the last refresh began, at most this many: past
/// it, what they are is no longer kept and the next fan-out refreshes
/// first (several fan-outs share one refresh), so that the set stays
/// bounded however long a backlog runs, and however large one fan-out is
/// (a rename's pages recorded every file until a refresh: 279 MB for a
/// rename of 1,000,000 files, `examples/fanout_memory.rs`).
pub(super) const MAX_RECENT: usize = 100_000;

/// Dependents read ahead and kept until the next refresh, at most this
/// many hits: past it, the owners that follow are searched on their own.
pub(super) const MAX_AHEAD: usize = 50_000;

#[derive(Debug)]
pub(super) struct Recent {
    /// Every document written (a tombstone included).
    ids: HashSet<(Kind, String)>,
    /// Those written with a version, by their key (a file's top-level
    /// directory, a post's user id), with what a scan tests of the version
    /// written ([`scanned`]): only this partition writes its keys'
    /// documents, so that is what they hold now, unless deleted since
    /// (the GET that follows tells).
    by_key: HashMap<String, HashMap<(Kind, String), String>>,
    /// Since when this writer knows what was written: its opening.
    pub(super) since: Instant,
    /// [`MAX_RECENT`] documents or more were written since the last
    /// refresh: `ids` and `by_key` are dropped, and every document counts
    /// as written ([`Recent::len`] says so, so no scan relies on them).
    overflowed: bool,
    /// What a search of many owners' dependents found, by owner (a scan's
    /// key), since the last refresh began ([`Recent::read_ahead`]): with
    /// what was written since, what a search of one owner's would find.
    /// Dropped whenever the writes are, so that the two stay complete
    /// together.
    ahead: HashMap<String, Vec<Hit>>,
    ahead_hits: usize,
}

impl Recent {
    pub(super) fn new() -> Self {
        Recent { ids: HashSet::new(), by_key: HashMap::new(), since: Instant::now(), overflowed: false, ahead: HashMap::new(), ahead_hits: 0 }
    }

    /// `doc` was written (or is about to be).
    pub(super) fn wrote(&mut self, doc: &Doc) {
        self.wrote_of(doc.key(), doc.kind(), doc.id(), scanned(doc));
    }

    /// A document of `key` was written, `scanned` being what a scan tests
    /// of it ([`scanned`]).
    pub(super) fn wrote_of(&mut self, key: String, kind: Kind, id: &str, scanned: String) {
        if self.overflowed {
            return;
        }
        let id = (kind, id.to_string());
        self.by_key.entry(key).or_default().insert(id.clone(), scanned);
        self.ids.insert(id);
        self.bound();
    }

    /// The document `kind`/`id` was deleted.
    pub(super) fn deleted(&mut self, kind: Kind, id: &str) {
        if !self.overflowed {
            self.ids.insert((kind, id.to_string()));
            self.bound();
        }
    }

    fn bound(&mut self) {
        if self.ids.len() >= MAX_RECENT {
            (self.ids, self.by_key, self.overflowed) = (HashSet::new(), HashMap::new(), true);
            self.forget_ahead();
        }
    }

    /// `hits`: all the dependents of the owner `key` ([`ahead_slot`]) that a search found,
    /// made while this record held every write since the last refresh
    /// began. Kept up to [`MAX_AHEAD`] hits, until the writes are dropped.
    pub(super) fn read_ahead(&mut self, key: String, hits: Vec<Hit>) {
        if self.overflowed || self.ahead_hits + hits.len() > MAX_AHEAD {
            return;
        }
        self.ahead_hits += hits.len();
        if let Some(old) = self.ahead.insert(key, hits) {
            self.ahead_hits -= old.len();
        }
    }

    /// Whether the dependents of the owner `key` were read ahead.
    pub(super) fn has_ahead(&self, key: &str) -> bool {
        self.ahead.contains_key(key)
    }

    /// The dependents of `scan`'s owner read ahead, if they were: what a
    /// search would have found then, before `scan`'s own test.
    pub(super) fn ahead_of(&self, scan: &Scan) -> Option<&[Hit]> {
        self.ahead.get(&ahead_slot(scan)?).map(Vec::as_slice)
    }

    fn forget_ahead(&mut self) {
        self.ahead.clear();
        self.ahead_hits = 0;
    }

    pub(super) fn contains(&self, kind: Kind, id: &str) -> bool {
        self.overflowed || self.ids.contains(&(kind, id.to_string()))
    }

    /// The documents of `scan`'s key written with a version that `scan`
    /// matches (files under its path, posts of its user named otherwise).
    pub(super) fn matching<'a>(&'a self, scan: &'a Scan) -> impl Iterator<Item = &'a (Kind, String)> + 'a {
        debug_assert!(!self.overflowed, "a scan relied on writes no longer kept");
        self.by_key
            .get(scan.key())
            .into_iter()
            .flatten()
            .filter(move |((kind, _), value)| match scan {
                Scan::FilesWithin { path: p } => *kind == Kind::File && path::is_within(value, p),
                Scan::PostsOfUserNotNamed { name, .. } => *kind == Kind::Post && value.as_str() != name.as_str(),
                // Every document of the scan's kind in its key: the
                // fan-out's rule tests each.
                Scan::Model(m) => *kind == Kind::Model(m.kind()),
            })
            .map(|(id, _)| id)
    }

    /// Documents written since the last refresh, up to [`MAX_RECENT`].
    pub(super) fn len(&self) -> usize {
        if self.overflowed {
            MAX_RECENT
        } else {
            self.ids.len()
        }
    }

    /// A refresh that began at `started` published everything written
    /// before it (the caller sent every pending write first).
    pub(super) fn refreshed(&mut self, started: Instant) {
        self.ids.clear();
        self.by_key.clear();
        self.forget_ahead();
        self.overflowed = false;
        self.since = self.since.max(started);
    }
}

/// Under what the dependents of `scan`'s owner are read ahead: a scan of
/// an owner's dependents names its owner (a post's user, scoped to its
/// tenant; a model's dependents by the kind, the field naming the owner and
/// the owner), any other scan none.
pub(super) fn ahead_slot(scan: &Scan) -> Option<String> {
    match scan {
        Scan::PostsOfUserNotNamed { user_id, .. } => Some(user_id.clone()),
        Scan::Model(m @ crate::index::ModelScan::Dependents { owner, target, .. }) => {
            Some(format!("{}\u{1e}{}\u{1e}{}", target.kind.as_str(), target.via, crate::command::tenant::scope(m.tenant(), owner)))
        }
        _ => None,
    }
}

/// What a fan-out's scan tests of a document: a file's full path, a
/// post's author name (a user is not scanned).
pub(super) fn scanned(doc: &Doc) -> String {
    match doc {
        Doc::File(f) => f.full_path(),
        Doc::Post(p) => p.user.name.clone(),
        Doc::User(_) | Doc::Model(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{Author, FileDoc, PostDoc};

    #[test]
    fn documents_are_found_by_id_and_by_their_key_until_a_refresh() {
        let mut r = Recent::new();
        let post = Doc::Post(PostDoc { id: "p".into(), title: "t".into(), body: "b".into(), user: Author { id: "u".into(), name: "n".into() }, pos: 3 });
        r.wrote(&post);
        r.wrote(&Doc::File(FileDoc::at("f", "/top/d/f.txt", "x", 4)));
        r.deleted(Kind::Post, "gone");
        assert!(r.contains(Kind::Post, "p") && r.contains(Kind::Post, "gone") && r.contains(Kind::File, "f"));
        assert!(!r.contains(Kind::File, "p"));
        let posts = |user: &str, name: &str| Scan::PostsOfUserNotNamed { user_id: user.into(), name: name.into() };
        let files = |p: &str| Scan::FilesWithin { path: p.into() };
        assert_eq!(r.matching(&posts("u", "m")).collect::<Vec<_>>(), vec![&(Kind::Post, "p".to_string())]);
        assert_eq!(r.matching(&posts("u", "n")).count(), 0, "already named n");
        assert_eq!(r.matching(&files("/top")).collect::<Vec<_>>(), vec![&(Kind::File, "f".to_string())]);
        assert_eq!(r.matching(&files("/top/d/f.txt")).count(), 1);
        assert_eq!(r.matching(&files("/top/e")).count(), 0, "elsewhere in its key");
        assert_eq!(r.matching(&posts("v", "m")).count(), 0);
        // Written again elsewhere in its key: found where it is now.
        r.wrote(&Doc::File(FileDoc::at("f", "/top/e/f.txt", "x", 5)));
        assert_eq!((r.matching(&files("/top/d")).count(), r.matching(&files("/top/e")).count()), (0, 1));
        assert_eq!(r.len(), 3);
        let started = Instant::now();
        r.refreshed(started);
        assert_eq!((r.len(), r.matching(&posts("u", "m")).count(), r.since), (0, 0, started));
    }

    /// The bound holds within one fan-out too: past [`MAX_RECENT`] writes,
    /// nothing more is kept and every document counts as written, until a
    /// refresh.
    #[test]
    fn past_the_bound_nothing_is_kept_until_a_refresh() {
        let mut r = Recent::new();
        for i in 0..MAX_RECENT + 10 {
            r.wrote(&Doc::File(FileDoc::at(&format!("f{i}"), &format!("/top/d/f{i}.txt"), "x", i as u64)));
        }
        assert_eq!(r.len(), MAX_RECENT);
        assert!(r.ids.is_empty() && r.by_key.is_empty(), "what was written is no longer kept");
        assert!(r.contains(Kind::File, "never-written"), "every document counts as written");
        r.refreshed(Instant::now());
        assert_eq!(r.len(), 0);
        assert!(!r.contains(Kind::File, "f1"));
        r.deleted(Kind::File, "f1");
        assert!(r.contains(Kind::File, "f1") && !r.contains(Kind::File, "f2"));
    }
}
