//! The tantivy schema of the shards: the fields, a document's conversion
//! to and from tantivy, and the reads every part shares (one document by
//! term, a stream of matches one segment at a time).

use tantivy::query::{BooleanQuery, EnableScoring, Occur, Query, TermQuery};
use tantivy::schema::{Field, IndexRecordOption, Schema, Value, FAST, INDEXED, STORED, STRING, TEXT};
use tantivy::store::StoreReader;
use tantivy::{DocId, DocSet, Searcher, TantivyDocument, Term, TERMINATED};

use crate::command::tenant;
use crate::domain::Domain;
use crate::index::{Author, Doc, FileDoc, IndexError, Kind, ModelDoc, ModelScan, PostDoc, Scan, UserDoc};

use super::model::{doc_key_of, marked, ModelSchema, Shared, MARK};

/// The tantivy fields. Dotted names of DESIGN.md map to underscores. A
/// tenant's documents hold their identifiers scoped (`id`, `path`,
/// `path_tree`, `full_path`, `user_id`; see [`crate::command::tenant`]),
/// and their `kind` too ([`kind_term`]): every term a query or a scan
/// names is its tenant's.
#[derive(Clone, Copy)]
pub(super) struct Fields {
    pub(super) doc_key: Field,
    pub(super) kind: Field,
    pub(super) id: Field,
    pub(super) name: Field,
    pub(super) path: Field,
    pub(super) path_tree: Field,
    pub(super) full_path: Field,
    pub(super) contents: Field,
    pub(super) user_name: Field,
    pub(super) user_name_raw: Field,
    pub(super) email: Field,
    pub(super) dob: Field,
    pub(super) user_id: Field,
    pub(super) title: Field,
    pub(super) body: Field,
    pub(super) pos: Field,
    /// The fields of the model the shards hold beside the compiled-in
    /// kinds, if any.
    pub(super) model: Option<&'static ModelSchema>,
}

/// The shards' schema: the compiled-in kinds' fields, and `model`'s.
pub(super) fn schema(model: Option<&'static Domain>) -> (Schema, Fields) {
    let mut b = Schema::builder();
    let mut f = Fields {
        doc_key: b.add_text_field("doc_key", STRING),
        kind: b.add_text_field("kind", STRING | STORED),
        id: b.add_text_field("id", STRING | STORED),
        name: b.add_text_field("name", STRING | STORED),
        path: b.add_text_field("path", STRING | STORED),
        path_tree: b.add_text_field("path_tree", STRING),
        full_path: b.add_text_field("full_path", STRING),
        contents: b.add_text_field("contents", TEXT | STORED),
        user_name: b.add_text_field("user_name", TEXT | STORED),
        user_name_raw: b.add_text_field("user_name_raw", STRING),
        email: b.add_text_field("email", STORED),
        dob: b.add_text_field("dob", STORED),
        user_id: b.add_text_field("user_id", STRING | STORED),
        title: b.add_text_field("title", TEXT | STORED),
        body: b.add_text_field("body", TEXT | STORED),
        pos: b.add_u64_field("pos", INDEXED | STORED | FAST),
        model: None,
    };
    let Some(d) = model else { return (b.build(), f) };
    let declared = ModelSchema::declare(&mut b, d);
    let schema = b.build();
    f.model = Some(interned(d, || ModelSchema::finish(d, schema.clone(), Shared { key: f.doc_key, kind: f.kind, id: f.id }, declared)));
    (schema, f)
}

/// One [`ModelSchema`] per model for the process (a shard opened again
/// finds its model's).
fn interned(d: &'static Domain, make: impl FnOnce() -> ModelSchema) -> &'static ModelSchema {
    static SCHEMAS: std::sync::Mutex<Vec<(usize, &'static ModelSchema)>> = std::sync::Mutex::new(Vec::new());
    let mut all = SCHEMAS.lock().unwrap_or_else(|e| e.into_inner());
    let at = d as *const Domain as usize;
    if let Some((_, m)) = all.iter().find(|(p, _)| *p == at) {
        return m;
    }
    let m: &'static ModelSchema = Box::leak(Box::new(make()));
    all.push((at, m));
    m
}

/// A document's unique term: `kind:id`, and `kind;<tenant>\u{1f}<id>` for
/// a tenant's (scoped) id. So the terms sort in
/// [`crate::index::dump_order`]: by kind, the default tenant's first
/// (`:` sorts before `;`), then tenant by tenant, then by id.
pub(super) fn doc_key(kind: Kind, id: &str) -> String {
    match kind {
        Kind::Model(k) => doc_key_of(&marked(k.as_str()), id),
        _ => doc_key_of(kind.as_str(), id),
    }
}

/// A [`doc_key`] as people read it (logs): its kind, and its id as its
/// producer wrote it with its tenant beside it ([`tenant::Shown`]); the
/// separators never show.
pub(super) fn shown_doc_key(key: &str) -> (&str, tenant::Shown<'_>) {
    let (kind, id) = key.split_at(key.find([':', ';']).unwrap_or(key.len()));
    (kind, tenant::Shown(id.get(1..).unwrap_or("")))
}

/// The `kind` term of a document of `kind` whose id is `id`: scoped to
/// its tenant (`acme\u{1f}file`), so that a query of one tenant's
/// documents, which always names their kind, names their tenant too.
pub(super) fn kind_term(kind: Kind, tenant: Option<&str>) -> String {
    match kind {
        Kind::Model(k) => tenant::scope(tenant, &marked(k.as_str())),
        _ => tenant::scope(tenant, kind.as_str()),
    }
}

impl Fields {
    pub(super) fn key_term(&self, kind: Kind, id: &str) -> Term {
        Term::from_field_text(self.doc_key, &doc_key(kind, id))
    }

    /// The terms of every tantivy document of `kind`/`id`: its own, and
    /// the objects of its nested lists.
    pub(super) fn key_terms(&self, kind: Kind, id: &str, out: &mut Vec<Term>) {
        out.push(self.key_term(kind, id));
        if let (Kind::Model(k), Some(m)) = (kind, self.model) {
            if m.has_nested(k.decl()) {
                out.push(m.parent_term(tenant::of(id), k.as_str(), tenant::unscoped(id)));
            }
        }
    }

    /// Adds the tantivy documents of `doc` to `writer`.
    pub(super) fn add(&self, writer: &tantivy::IndexWriter, doc: &Doc) -> Result<(), IndexError> {
        match (doc, self.model) {
            (Doc::Model(d), Some(m)) => {
                let mut docs = m.documents(d.tenant(), d.kind.as_str(), d.unscoped_id(), &d.fields, &d.copies).into_iter();
                let mut own = docs.next().expect("a document's own");
                own.add_u64(self.pos, d.pos);
                writer.add_document(own)?;
                for child in docs {
                    writer.add_document(child)?;
                }
            }
            (Doc::Model(d), None) => return Err(IndexError::Backend(format!("a document of model {} in a shard opened without it", d.kind.domain().name))),
            _ => {
                writer.add_document(self.tantivy_doc(doc))?;
            }
        }
        Ok(())
    }

    pub(super) fn term(&self, field: Field, value: &str) -> Box<dyn Query> {
        Box::new(TermQuery::new(Term::from_field_text(field, value), IndexRecordOption::Basic))
    }

    pub(super) fn tantivy_doc(&self, doc: &Doc) -> TantivyDocument {
        let mut t = TantivyDocument::new();
        t.add_text(self.doc_key, doc_key(doc.kind(), doc.id()));
        t.add_text(self.kind, kind_term(doc.kind(), tenant::of(doc.id())));
        t.add_text(self.id, doc.id());
        t.add_u64(self.pos, doc.pos());
        match doc {
            Doc::File(d) => {
                t.add_text(self.name, &d.name);
                t.add_text(self.path, &d.path);
                for a in d.tree() {
                    t.add_text(self.path_tree, a);
                }
                t.add_text(self.full_path, d.full_path());
                t.add_text(self.contents, &d.contents);
            }
            Doc::User(d) => {
                t.add_text(self.user_name, &d.name);
                t.add_text(self.user_name_raw, &d.name);
                t.add_text(self.email, &d.email);
                t.add_text(self.dob, &d.dob);
            }
            Doc::Post(d) => {
                t.add_text(self.user_id, &d.user.id);
                t.add_text(self.user_name, &d.user.name);
                t.add_text(self.user_name_raw, &d.user.name);
                t.add_text(self.title, &d.title);
                t.add_text(self.body, &d.body);
            }
            // Written by `add`, with its nested objects.
            Doc::Model(_) => {}
        }
        t
    }

    /// Whether `t` is an object of a model's nested list (a part of its
    /// parent's document, not a document).
    pub(super) fn is_nested_object(&self, t: &TantivyDocument) -> bool {
        self.model.is_some_and(|m| m.is_nested_object(t))
    }

    pub(super) fn doc_of(&self, t: &TantivyDocument) -> Result<Doc, IndexError> {
        let s = |f: Field| t.get_first(f).and_then(|v| v.as_str()).unwrap_or("").to_string();
        let pos = t.get_first(self.pos).and_then(|v| v.as_u64()).unwrap_or(0);
        Ok(match tenant::unscoped(&s(self.kind)) {
            "file" => Doc::File(FileDoc { id: s(self.id), name: s(self.name), path: s(self.path), contents: s(self.contents), pos }),
            "user" => Doc::User(UserDoc { id: s(self.id), name: s(self.user_name), email: s(self.email), dob: s(self.dob), pos }),
            "post" => Doc::Post(PostDoc { id: s(self.id), title: s(self.title), body: s(self.body), user: Author { id: s(self.user_id), name: s(self.user_name) }, pos }),
            other => match other.strip_prefix(MARK) {
                Some(kind) => return self.model_doc_of(kind, t, s(self.id), pos),
                None => return Err(IndexError::Corrupt(format!("unknown kind {other:?}"))),
            },
        })
    }

    fn model_doc_of(&self, kind: &str, t: &TantivyDocument, id: String, pos: u64) -> Result<Doc, IndexError> {
        let corrupt = |why: String| IndexError::Corrupt(format!("{kind} {:?}: {why}", tenant::Shown(&id)));
        let Some(m) = self.model else { return Err(IndexError::Corrupt(format!("unknown kind {kind:?} (a model's, in an index opened without its model?)"))) };
        let Some(k) = m.kind_named(kind) else { return Err(IndexError::Corrupt(format!("unknown kind {kind:?}"))) };
        let source = m.source_of(t).ok_or_else(|| corrupt("no stored source".into()))?;
        let json: serde_json::Value = serde_json::from_str(source).map_err(|e| corrupt(e.to_string()))?;
        let (_, fields, copies) = crate::command::generic::value::document_from_json(k.domain(), k.decl(), &json, &|_| false).map_err(|e| corrupt(e.to_string()))?;
        Ok(Doc::Model(Box::new(ModelDoc::new(k, id, fields, copies, pos))))
    }

    pub(super) fn scan_query(&self, scan: &Scan) -> Box<dyn Query> {
        match scan {
            Scan::FilesWithin { path } => Box::new(BooleanQuery::new(vec![(Occur::Should, self.term(self.path_tree, path)), (Occur::Should, self.term(self.full_path, path))])),
            // Only posts have a `user_id` (a clause on the kind would
            // intersect with every post of the shard).
            Scan::PostsOfUserNotNamed { user_id, name } => Box::new(BooleanQuery::new(vec![(Occur::Must, self.term(self.user_id, user_id)), (Occur::MustNot, self.term(self.user_name_raw, name))])),
            Scan::Model(m) => self.model_scan_query(m),
        }
    }

    /// A model's scan: the documents of its kind and tenant that name the
    /// owner, or whose path has the prefix among its ancestors. A shard
    /// without the model matches nothing.
    fn model_scan_query(&self, scan: &ModelScan) -> Box<dyn Query> {
        let kind = scan.kind();
        let named = |field: String, value: &str| match self.model.and_then(|m| m.field_named(&field)) {
            Some(f) => self.term(f, value),
            None => Box::new(tantivy::query::EmptyQuery),
        };
        let on = match scan {
            ModelScan::Dependents { owner, target, .. } => named(format!("{}.{}", kind.as_str(), target.via), owner),
            ModelScan::Within { field, path, .. } => named(format!("{}.{field}.tree", kind.as_str()), path),
        };
        Box::new(BooleanQuery::new(vec![(Occur::Must, self.term(self.kind, &kind_term(Kind::Model(kind), scan.tenant()))), (Occur::Must, on)]))
    }
}

/// Streams the live documents matching `query` in `searcher`, one segment at
/// a time (memory does not grow with the number of matches).
pub(super) fn stream(searcher: &Searcher, query: &dyn Query, visit: &mut dyn FnMut(&StoreReader, DocId) -> Result<(), IndexError>) -> Result<(), IndexError> {
    let weight = query.weight(EnableScoring::disabled_from_searcher(searcher))?;
    for segment in searcher.segment_readers() {
        let store = segment.get_store_reader(16)?;
        let mut scorer = weight.scorer(segment, 1.0)?;
        let mut doc = scorer.doc();
        while doc != TERMINATED {
            if !segment.is_deleted(doc) {
                visit(&store, doc)?;
            }
            doc = scorer.advance();
        }
    }
    Ok(())
}

/// A scan of the live documents matching a query in one snapshot, read a
/// page at a time ([`crate::index::Shard::rewrite_page`]): the snapshot
/// stays as it was when the scan began, whatever is written or committed
/// between pages.
pub(crate) struct Paged {
    searcher: Searcher,
    weight: Box<dyn tantivy::query::Weight>,
    page_size: usize,
    /// The segment being read, and the first document not visited in it.
    segment: usize,
    next: DocId,
}

impl Paged {
    pub(super) fn new(searcher: Searcher, query: &dyn Query, page_size: usize) -> Result<Self, IndexError> {
        let weight = query.weight(EnableScoring::disabled_from_searcher(&searcher))?;
        Ok(Paged { searcher, weight, page_size: page_size.max(1), segment: 0, next: 0 })
    }

    /// Visits the next page of matches, reading documents through
    /// `stores`. Returns whether the scan is done.
    pub(super) fn next(&mut self, stores: &mut Stores, visit: &mut dyn FnMut(&StoreReader, DocId) -> Result<(), IndexError>) -> Result<bool, IndexError> {
        let mut visited = 0;
        let segments = self.searcher.segment_readers();
        while self.segment < segments.len() && visited < self.page_size {
            let segment = &segments[self.segment];
            let store = stores.of(segment)?;
            let mut scorer = self.weight.scorer(segment, 1.0)?;
            let mut doc = if self.next == 0 { scorer.doc() } else { scorer.seek(self.next) };
            while doc != TERMINATED && visited < self.page_size {
                if !segment.is_deleted(doc) {
                    visit(store, doc)?;
                    visited += 1;
                }
                doc = scorer.advance();
            }
            if doc == TERMINATED {
                (self.segment, self.next) = (self.segment + 1, 0);
            } else {
                self.next = doc;
            }
        }
        Ok(self.segment >= segments.len())
    }
}

/// The document stores of a shard's segments, each opened once and kept
/// with its cache of decompressed blocks until its segment leaves the
/// index (a segment's stored documents never change): reads of documents
/// stored near each other (a user's posts, a directory's files) decompress
/// their block once, not once per read.
#[derive(Default)]
pub(super) struct Stores(std::collections::HashMap<tantivy::index::SegmentId, StoreReader>);

/// Decompressed blocks each segment's store keeps.
const STORE_CACHE_BLOCKS: usize = 16;

impl Stores {
    pub(super) fn of(&mut self, segment: &tantivy::SegmentReader) -> Result<&StoreReader, IndexError> {
        Ok(match self.0.entry(segment.segment_id()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(segment.get_store_reader(STORE_CACHE_BLOCKS)?),
        })
    }

    /// Drops the stores of segments no longer in `live`.
    pub(super) fn retain(&mut self, live: &std::collections::HashSet<tantivy::index::SegmentId>) {
        self.0.retain(|id, _| live.contains(id));
    }
}

/// First live document with `term` in `searcher`, read through `stores`.
pub(super) fn find(searcher: &Searcher, term: &Term, stores: &mut Stores) -> Result<Option<TantivyDocument>, IndexError> {
    find_with(searcher, term, &mut |segment, doc| Ok(stores.of(segment)?.get(doc)?))
}

/// `read` of the first live document with `term` in `searcher`.
pub(super) fn find_with<T>(searcher: &Searcher, term: &Term, read: &mut dyn FnMut(&tantivy::SegmentReader, DocId) -> Result<T, IndexError>) -> Result<Option<T>, IndexError> {
    for segment in searcher.segment_readers() {
        let inverted = segment.inverted_index(term.field())?;
        if let Some(mut postings) = inverted.read_postings(term, IndexRecordOption::Basic)? {
            let mut doc = postings.doc();
            while doc != TERMINATED {
                if !segment.is_deleted(doc) {
                    return read(segment, doc).map(Some);
                }
                doc = postings.advance();
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_key_is_shown_as_its_kind_and_its_id_with_the_tenant_beside_it() {
        let scoped = doc_key(Kind::File, &tenant::scope(Some("acme"), "f"));
        let (kind, id) = shown_doc_key(&scoped);
        assert_eq!((kind, id.to_string().as_str()), ("file", "f (tenant acme)"));
        assert!(!format!("{kind} {id} {id:?}").contains(['\u{1f}', ';', ':']), "{scoped:?}");
        let plain = doc_key(Kind::User, "u:1");
        let (kind, id) = shown_doc_key(&plain);
        assert_eq!((kind, id.to_string().as_str()), ("user", "u:1"));
    }
}
