//! A shard's pending writes: the single-document writes (and the rewrites
//! of fan-outs of one page) since the last commit, which reads see before
//! the commit hands them to tantivy's writer. Indexed by their key too, so
//! that a fan-out's scan finds the pending documents of its key without
//! reading them all.

use std::collections::{HashMap, HashSet};

use tantivy::{IndexWriter, Term};

use crate::index::{Doc, IndexError, Kind, Scan};

use super::schema::Fields;

/// An uncommitted write.
#[derive(Debug)]
pub(super) struct Pending {
    /// The new version (`None`: deleted).
    pub(super) doc: Option<Doc>,
    /// A version committed before must be deleted first.
    replaces: bool,
}

/// The pending writes of one shard.
#[derive(Debug, Default)]
pub(super) struct Overlay {
    writes: HashMap<(Kind, String), Pending>,
    /// The documents written with a version, by their key (a file's
    /// top-level directory, a post's user id). An entry may be stale (the
    /// document deleted or moved to another key since): the scan's
    /// predicate is judged on the pending version.
    by_key: HashMap<String, HashSet<(Kind, String)>>,
}

impl Overlay {
    pub(super) fn get(&self, kind: Kind, id: &str) -> Option<&Pending> {
        self.writes.get(&(kind, id.to_string()))
    }

    pub(super) fn contains(&self, kind: Kind, id: &str) -> bool {
        self.writes.contains_key(&(kind, id.to_string()))
    }

    pub(super) fn len(&self) -> usize {
        self.writes.len()
    }

    /// The ids of the pending writes, for a fan-out that reads the
    /// committed snapshot past its first page (those ids' committed
    /// versions are stale).
    pub(super) fn ids(&self) -> HashSet<(Kind, String)> {
        self.writes.keys().cloned().collect()
    }

    /// The ids of pending writes that may fail a commit (the fault
    /// `index.reject-commit` names documents by id).
    pub(super) fn document_ids(&self) -> impl Iterator<Item = &str> {
        self.writes.keys().map(|(_, id)| id.as_str())
    }

    /// Records a write. `replaces`: a committed version may exist (put,
    /// delete) or not (create); an earlier write of the batch knows better.
    pub(super) fn stage(&mut self, kind: Kind, id: String, doc: Option<Doc>, replaces: bool) {
        if let Some(d) = &doc {
            self.by_key.entry(d.key()).or_default().insert((kind, id.clone()));
        }
        match self.writes.entry((kind, id)) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().doc = doc,
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Pending { doc, replaces });
            }
        }
    }

    /// The pending documents that match `scan` (of its key: a fan-out
    /// reads nothing else).
    pub(super) fn matching(&self, scan: &Scan) -> Vec<Doc> {
        let Some(ids) = self.by_key.get(scan.key()) else { return Vec::new() };
        ids.iter().filter_map(|k| self.writes.get(k)?.doc.as_ref()).filter(|d| scan.matches(d)).cloned().collect()
    }

    /// Hands the writes to the writer: one delete of every id that
    /// replaces something, then the new versions. Per-document delete
    /// terms (about 1 KB each in tantivy, held until every segment,
    /// including those being merged, has seen them) made memory grow with
    /// the batch and with merge times.
    pub(super) fn flush(&self, writer: &IndexWriter, f: &Fields) -> Result<(), IndexError> {
        let mut replaced: Vec<Term> = Vec::new();
        for ((kind, id), _) in self.writes.iter().filter(|(_, p)| p.replaces) {
            f.key_terms(*kind, id, &mut replaced);
        }
        if !replaced.is_empty() {
            writer.delete_query(Box::new(tantivy::query::TermSetQuery::new(replaced)))?;
        }
        for doc in self.writes.values().filter_map(|p| p.doc.as_ref()) {
            f.add(writer, doc)?;
        }
        Ok(())
    }

    pub(super) fn clear(&mut self) {
        self.writes.clear();
        self.by_key.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{Author, FileDoc, PostDoc};

    fn post(id: &str, user: &str, name: &str) -> Doc {
        Doc::Post(PostDoc { id: id.into(), title: "t".into(), body: "b".into(), user: Author { id: user.into(), name: name.into() }, pos: 1 })
    }

    #[test]
    fn a_scan_finds_the_pending_documents_of_its_key_as_they_are_now() {
        let mut o = Overlay::default();
        o.stage(Kind::Post, "p1".into(), Some(post("p1", "u", "Ann")), true);
        o.stage(Kind::Post, "p2".into(), Some(post("p2", "u", "Bob")), false);
        o.stage(Kind::Post, "p3".into(), Some(post("p3", "v", "Ann")), false);
        // p2 deleted, p1 moved to another user: neither is u's any more.
        o.stage(Kind::Post, "p2".into(), None, true);
        o.stage(Kind::Post, "p4".into(), Some(post("p4", "u", "Ann")), false);
        o.stage(Kind::Post, "p1".into(), Some(post("p1", "w", "Ann")), true);
        let mut found: Vec<String> = o.matching(&Scan::PostsOfUserNotNamed { user_id: "u".into(), name: "Cy".into() }).iter().map(|d| d.id().to_string()).collect();
        found.sort();
        assert_eq!(found, vec!["p4"]);
        assert!(o.matching(&Scan::PostsOfUserNotNamed { user_id: "u".into(), name: "Ann".into() }).is_empty());
        let file = Doc::File(FileDoc::at("f", "/a/b/c.txt", "x", 2));
        o.stage(Kind::File, "f".into(), Some(file.clone()), false);
        assert_eq!(o.matching(&Scan::FilesWithin { path: "/a/b".into() }), vec![file.clone()]);
        assert_eq!(o.matching(&Scan::FilesWithin { path: "/a/b/c.txt".into() }), vec![file]);
        assert!(o.matching(&Scan::FilesWithin { path: "/a/x".into() }).is_empty());
        assert_eq!(o.len(), 5);
        o.clear();
        assert!(o.len() == 0 && o.matching(&Scan::FilesWithin { path: "/a/b".into() }).is_empty());
    }
}
