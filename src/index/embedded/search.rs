//! The read-only view over every shard: searches, the dump, group-bys.

use std::collections::HashMap;

use tantivy::collector::{Count, TopDocs};
use tantivy::query::{AllQuery, BooleanQuery, Occur, Query, QueryParser};
use tantivy::schema::Field;
use tantivy::{Index, IndexReader};

use crate::index::{AuthorGroup, Doc, FileDoc, FileQuery, IndexError, Kind, PostDoc, PostQuery, SearchIndex};

use super::schema::{find_with, kind_term, schema, stream, Fields};
use crate::command::tenant;

/// Read-only view over every shard.
/// Builds a shard's query (each shard has its own fields).
type QueryOf<'a> = dyn Fn(&Index) -> Result<Box<dyn Query>, IndexError> + 'a;

pub struct EmbeddedSearch {
    shards: Vec<(Index, IndexReader)>,
    f: Fields,
}

impl EmbeddedSearch {
    pub(super) fn over(shards: Vec<(Index, IndexReader)>, model: Option<&'static crate::domain::Domain>) -> Self {
        EmbeddedSearch { shards, f: schema(model).1 }
    }

    fn parse(&self, index: &Index, fields: Vec<Field>, text: &str) -> Result<Box<dyn Query>, IndexError> {
        QueryParser::for_index(index, fields).parse_query(text).map_err(|e| IndexError::Backend(format!("invalid query {text:?}: {e}")))
    }

    fn file_query(&self, index: &Index, q: &FileQuery) -> Result<Box<dyn Query>, IndexError> {
        let f = &self.f;
        // The tenant's own terms (see `schema::Fields`).
        let t = q.tenant.as_deref();
        let mut must = vec![(Occur::Must, f.term(f.kind, &kind_term(Kind::File, t)))];
        if let Some(d) = &q.dir {
            must.push((Occur::Must, f.term(f.path, &tenant::scope(t, d))));
        }
        if let Some(d) = &q.under {
            must.push((Occur::Must, f.term(f.path_tree, &tenant::scope(t, d))));
        }
        if let Some(t) = &q.text {
            must.push((Occur::Must, self.parse(index, vec![f.contents], t)?));
        }
        Ok(Box::new(BooleanQuery::new(must)))
    }

    fn post_query(&self, index: &Index, q: &PostQuery) -> Result<Box<dyn Query>, IndexError> {
        let f = &self.f;
        let mut must = vec![(Occur::Must, f.term(f.kind, &kind_term(Kind::Post, q.tenant.as_deref())))];
        if let Some(t) = &q.text {
            must.push((Occur::Must, self.parse(index, vec![f.title, f.body], t)?));
        }
        if let Some(a) = &q.author {
            must.push((Occur::Must, self.parse(index, vec![f.user_name], a)?));
        }
        Ok(Box::new(BooleanQuery::new(must)))
    }

    /// Best `limit` (0: all, unordered) matches over every shard.
    fn matches(&self, build: &QueryOf<'_>, limit: usize, out: &mut dyn FnMut(f32, Doc)) -> Result<(), IndexError> {
        if limit == 0 {
            for (index, reader) in &self.shards {
                let q = build(index)?;
                stream(&reader.searcher(), q.as_ref(), &mut |store, doc| {
                    out(0.0, self.f.doc_of(&store.get(doc)?)?);
                    Ok(())
                })?;
            }
            return Ok(());
        }
        let mut hits: Vec<(f32, Doc)> = Vec::new();
        for (index, reader) in &self.shards {
            let searcher = reader.searcher();
            let q = build(index)?;
            for (score, addr) in searcher.search(q.as_ref(), &TopDocs::with_limit(limit))? {
                hits.push((score, self.f.doc_of(&searcher.doc(addr)?)?));
            }
        }
        hits.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (score, doc) in hits.into_iter().take(limit) {
            out(score, doc);
        }
        Ok(())
    }

    /// Sees what was committed since this view was opened (shards created
    /// since are not added).
    pub fn reload(&self) -> Result<(), IndexError> {
        for (_, reader) in &self.shards {
            reader.reload()?;
        }
        Ok(())
    }

    /// Whether the document is in the view.
    pub fn contains(&self, kind: Kind, id: &str) -> Result<bool, IndexError> {
        let term = self.f.key_term(kind, id);
        for (_, reader) in &self.shards {
            if find_with(&reader.searcher(), &term, &mut |_, _| Ok(()))?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn count(&self, build: &QueryOf<'_>) -> Result<usize, IndexError> {
        let mut n = 0;
        for (index, reader) in &self.shards {
            n += reader.searcher().search(build(index)?.as_ref(), &Count)?;
        }
        Ok(n)
    }
}

impl SearchIndex for EmbeddedSearch {
    fn model_documents(&self, tenant: Option<&str>, kind: &str, filters: &[crate::index::filter::Filter], limit: usize) -> Result<Vec<(String, String)>, IndexError> {
        let Some(m) = self.f.model else { return Err(IndexError::Backend("a search of a model's kind needs --model".into())) };
        let mut out = Vec::new();
        for (_, reader) in &self.shards {
            out.extend(m.matching(&reader.searcher(), tenant, kind, filters).map_err(|e| IndexError::Backend(e.to_string()))?);
        }
        out.sort();
        if limit > 0 {
            out.truncate(limit);
        }
        Ok(out)
    }

    fn files(&self, q: &FileQuery, limit: usize, out: &mut dyn FnMut(FileDoc)) -> Result<(), IndexError> {
        self.matches(&|i| self.file_query(i, q), limit, &mut |_, d| {
            if let Doc::File(f) = d {
                out(f)
            }
        })
    }

    fn posts(&self, q: &PostQuery, limit: usize, out: &mut dyn FnMut(PostDoc)) -> Result<(), IndexError> {
        self.matches(&|i| self.post_query(i, q), limit, &mut |_, d| {
            if let Doc::Post(p) = d {
                out(p)
            }
        })
    }

    fn posts_by_author(&self, q: &PostQuery, limit: usize, per_author: usize) -> Result<Vec<AuthorGroup>, IndexError> {
        let build = |i: &Index| self.post_query(i, q);
        let all = self.count(&build)?;
        let mut groups: HashMap<String, AuthorGroup> = HashMap::new();
        // Every match, best first: an author's first hit is its best.
        self.matches(&build, all.max(1), &mut |score, d| {
            let Doc::Post(p) = d else { return };
            let g = groups.entry(p.user.name.clone()).or_insert_with(|| AuthorGroup { author: p.user.name.clone(), best_score: score, posts: Vec::new() });
            if g.posts.len() < per_author {
                g.posts.push(p);
            }
        })?;
        let mut out: Vec<AuthorGroup> = groups.into_values().collect();
        out.sort_by(|a, b| b.best_score.total_cmp(&a.best_score).then_with(|| a.author.cmp(&b.author)));
        if limit > 0 {
            out.truncate(limit);
        }
        Ok(out)
    }

    fn tenants(&self, limit: usize) -> Result<Vec<String>, IndexError> {
        // A tenant's documents have their own `kind` terms.
        let mut out = std::collections::BTreeSet::new();
        for (_, reader) in &self.shards {
            for segment in reader.searcher().segment_readers() {
                let inverted = segment.inverted_index(self.f.kind)?;
                let mut terms = inverted.terms().stream()?;
                while terms.advance() {
                    if let (Some(t), _) = tenant::split(&String::from_utf8_lossy(terms.key())) {
                        out.insert(t.to_string());
                    }
                }
            }
        }
        Ok(out.into_iter().take(limit).collect())
    }

    fn dump(&self, out: &mut dyn FnMut(Doc)) -> Result<(), IndexError> {
        for (_, reader) in &self.shards {
            stream(&reader.searcher(), &AllQuery, &mut |store, doc| {
                let t = store.get(doc)?;
                if !self.f.is_nested_object(&t) {
                    out(self.f.doc_of(&t)?);
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    fn dump_sorted(&self, out: &mut dyn FnMut(Doc)) -> Result<(), IndexError> {
        let searchers: Vec<_> = self.shards.iter().map(|(_, reader)| reader.searcher()).collect();
        super::sorted::dump_sorted(&searchers, &self.f, out)
    }
}
