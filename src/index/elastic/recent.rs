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

use crate::index::{Doc, Kind};

/// Documents written since the last refresh began, at most this many: past
/// it, the next fan-out refreshes first (several fan-outs share one
/// refresh), so that the set stays bounded however long a backlog runs.
pub(super) const MAX_RECENT: usize = 100_000;

#[derive(Debug)]
pub(super) struct Recent {
    /// Every document written (a tombstone included).
    ids: HashSet<(Kind, String)>,
    /// Those written with a version, by their key (a file's top-level
    /// directory, a post's user id). An entry may be stale (the document
    /// since deleted or moved): the scan's predicate is judged on what a
    /// GET reads.
    by_key: HashMap<String, HashSet<(Kind, String)>>,
    /// Since when this writer knows what was written: its opening.
    pub(super) since: Instant,
}

impl Recent {
    pub(super) fn new() -> Self {
        Recent { ids: HashSet::new(), by_key: HashMap::new(), since: Instant::now() }
    }

    /// `doc` was written (or is about to be).
    pub(super) fn wrote(&mut self, doc: &Doc) {
        self.wrote_of(doc.key(), doc.kind(), doc.id());
    }

    /// A document of `key` was written.
    pub(super) fn wrote_of(&mut self, key: String, kind: Kind, id: &str) {
        let id = (kind, id.to_string());
        self.by_key.entry(key).or_default().insert(id.clone());
        self.ids.insert(id);
    }

    /// The document `kind`/`id` was deleted.
    pub(super) fn deleted(&mut self, kind: Kind, id: &str) {
        self.ids.insert((kind, id.to_string()));
    }

    pub(super) fn contains(&self, kind: Kind, id: &str) -> bool {
        self.ids.contains(&(kind, id.to_string()))
    }

    /// The documents of `key` written with a version.
    pub(super) fn of_key(&self, key: &str) -> impl Iterator<Item = &(Kind, String)> {
        self.by_key.get(key).into_iter().flatten()
    }

    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }

    /// A refresh that began at `started` published everything written
    /// before it (the caller sent every pending write first).
    pub(super) fn refreshed(&mut self, started: Instant) {
        self.ids.clear();
        self.by_key.clear();
        self.since = self.since.max(started);
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
        assert_eq!(r.of_key("u").collect::<Vec<_>>(), vec![&(Kind::Post, "p".to_string())]);
        assert_eq!(r.of_key("/top").collect::<Vec<_>>(), vec![&(Kind::File, "f".to_string())]);
        assert_eq!(r.of_key("v").count(), 0);
        assert_eq!(r.len(), 3);
        let started = Instant::now();
        r.refreshed(started);
        assert_eq!((r.len(), r.of_key("u").count(), r.since), (0, 0, started));
    }
}
