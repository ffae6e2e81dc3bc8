//! [`SearchIndex`] on Elasticsearch: the same queries and output as the
//! embedded backend. Group-by-author is a `terms` aggregation on
//! `user.name.raw` ordered by each author's best score, with `top_hits`.

use elasticsearch::{Elasticsearch, SearchParts};
use serde_json::{json, Value};
use tokio::runtime::Handle;

use super::complete_json;
use super::docs::{from_source, hits, is_deleted, of_tenant, recorded, PitScan, DUMP_PAGE_BYTES};
pub use super::grouped::MAX_INNER_RESULT_WINDOW;
use super::names::{self, alias, TENANT_FIELD};
use crate::index::filter::Filter;
use crate::index::group::{Group, GroupBy};
use crate::index::{AuthorGroup, Doc, FileDoc, FileQuery, IndexError, Kind, PostDoc, PostQuery, Recorded, SearchIndex};

pub struct ElasticSearch {
    pub client: Elasticsearch,
    pub prefix: String,
    pub runtime: Handle,
    /// Reads this generation's indexes (`None`: the current one, through
    /// the read aliases).
    pub generation: Option<u64>,
    /// The declared model whose kinds are read beside the compiled-in ones.
    pub model: Option<&'static crate::domain::Domain>,
}

/// The query of `denorm search files`.
pub fn file_query(q: &FileQuery) -> Value {
    let mut filter = vec![of_tenant(q.tenant.as_deref())];
    let mut must = Vec::new();
    if let Some(d) = &q.dir {
        filter.push(json!({"term": {"path": d}}));
    }
    if let Some(d) = &q.under {
        filter.push(json!({"term": {"path.tree": d}}));
    }
    if let Some(t) = &q.text {
        must.push(json!({"match": {"contents": t}}));
    }
    json!({"bool": {"filter": filter, "must": must, "must_not": [is_deleted()]}})
}

/// The query of `denorm search posts`.
pub fn post_query(q: &PostQuery) -> Value {
    let mut must = Vec::new();
    if let Some(t) = &q.text {
        must.push(json!({"multi_match": {"query": t, "fields": ["title", "body"]}}));
    }
    if let Some(a) = &q.author {
        must.push(json!({"match": {"user.name": a}}));
    }
    json!({"bool": {"filter": [of_tenant(q.tenant.as_deref())], "must": must, "must_not": [is_deleted()]}})
}

/// The aggregation request of group-by-author.
pub fn group_by_author_body(q: &PostQuery, authors: usize, per_author: usize) -> Value {
    json!({
        "size": 0,
        "query": post_query(q),
        "aggs": {
            "authors": {
                "terms": {"field": "user.name.raw", "size": authors, "order": {"best_score": "desc"}},
                "aggs": {
                    "best_score": {"max": {"script": {"source": "_score"}}},
                    "top": {"top_hits": {"size": per_author}}
                }
            }
        }
    })
}

/// One page of every author: a composite aggregation on `user.name.raw`
/// (in name order, resumed `after` the previous page's last key), with the
/// same best score and top posts as [`group_by_author_body`].
pub fn all_authors_body(q: &PostQuery, authors: usize, per_author: usize, after: Option<&Value>) -> Value {
    let mut composite = json!({"size": authors, "sources": [{"author": {"terms": {"field": "user.name.raw"}}}]});
    if let Some(a) = after {
        composite["after"] = a.clone();
    }
    json!({
        "size": 0,
        "query": post_query(q),
        "aggs": {
            "authors": {
                "composite": composite,
                "aggs": {
                    "best_score": {"max": {"script": {"source": "_score"}}},
                    "top": {"top_hits": {"size": per_author}}
                }
            }
        }
    })
}

/// Parses the group-by-author response (a `terms` or `composite`
/// aggregation: a bucket's key is the name, or `{"author": name}`).
pub fn parse_groups(v: &Value) -> Vec<AuthorGroup> {
    v["aggregations"]["authors"]["buckets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| AuthorGroup {
            author: b["key"].as_str().or_else(|| b["key"]["author"].as_str()).unwrap_or_default().to_string(),
            best_score: b["best_score"]["value"].as_f64().unwrap_or(0.0) as f32,
            posts: hits(&b["top"])
                .iter()
                .filter_map(|h| match from_source(Kind::Post, &h.source) {
                    Doc::Post(p) => Some(p),
                    _ => None,
                })
                .collect(),
        })
        .collect()
}

/// What a search reads: indexes or an alias (comma-separated), and what
/// it must exclude there.
type Read = (String, Option<Value>);

/// `query` without what `hidden` matches.
fn without(query: Value, hidden: Option<Value>) -> Value {
    match hidden {
        Some(h) => json!({"bool": {"must": [query], "must_not": [h]}}),
        None => query,
    }
}

/// Elasticsearch's default `index.max_result_window`: `from + size` of one
/// search may not exceed it.
pub const MAX_RESULT_WINDOW: usize = 10_000;

/// Authors per page of the composite aggregation of "all authors".
const AUTHOR_PAGE: usize = 1000;

impl ElasticSearch {
    /// A dump is for exact comparisons: makes every write searchable first.
    fn refresh_all(&self) -> Result<(), IndexError> {
        let names = names::kinds(self.model).iter().map(|k| self.index_of(*k).map(|(i, _)| i)).collect::<Result<Vec<String>, _>>()?;
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        self.runtime.block_on(async {
            let r = self.client.indices().refresh(elasticsearch::indices::IndicesRefreshParts::Index(&names)).send().await?;
            complete_json("refreshing before a dump", r).await
        })?;
        Ok(())
    }

    /// Every index of `kind` in generation `g` a search reads,
    /// comma-separated, with the clause that hides what the shared read
    /// alias hides (see [`super::placement::Placement::hidden_by_name`]).
    fn indexes_of(&self, kind: Kind, g: u64) -> Result<Read, IndexError> {
        let placement = self.runtime.block_on(super::placement::read(&self.client, &self.prefix, g))?;
        Ok((placement.searched(&self.prefix, kind, g).join(","), placement.hidden_by_name(&self.prefix, kind, g)))
    }

    /// The first tenant after `after` (in order; `None`: the first of all)
    /// with documents in `index`.
    fn next_tenant(&self, index: &str, after: Option<&str>) -> Result<Option<String>, IndexError> {
        let mut filter = vec![json!({"exists": {"field": TENANT_FIELD}})];
        if let Some(a) = after {
            filter.push(json!({"range": {TENANT_FIELD: {"gt": a}}}));
        }
        let body = json!({"size": 1, "query": {"bool": {"filter": filter, "must_not": [is_deleted()]}}, "sort": [{TENANT_FIELD: "asc"}], "_source": [TENANT_FIELD]});
        let v = self.runtime.block_on(async {
            let r = self.client.search(SearchParts::Index(&[index])).allow_partial_search_results(false).body(body).send().await?;
            complete_json(&format!("finding the next tenant of {index}"), r).await
        })?;
        Ok(hits(&v).first().and_then(|h| h.source[TENANT_FIELD].as_str().map(str::to_string)))
    }

    /// What a search of `kind` reads: the pinned generation's indexes
    /// (comma-separated), or the read alias (on every index of the current
    /// generation, each tenant's own among them).
    fn index_of(&self, kind: Kind) -> Result<Read, IndexError> {
        match self.generation {
            Some(g) => self.indexes_of(kind, g),
            None => Ok((alias(&self.prefix, kind), None)),
        }
    }

    /// What a point in time over `kind` is opened on (comma-separated):
    /// the indexes [`Self::index_of`] reads, named one by one.
    ///
    /// Not the read alias itself: noida-db opens a point in time on one
    /// index of an alias that has several (Elasticsearch on all of them;
    /// docs/elasticsearch.md). And a read alias on several shared indexes
    /// (an operator's mistake) is refused: read through it, every document
    /// of both would come twice, and a verify would call the copies
    /// "unexpected" and `--repair` delete the real ones (review of verify,
    /// F16).
    fn scanned_index(&self, kind: Kind) -> Result<Read, IndexError> {
        if self.generation.is_some() {
            return self.index_of(kind);
        }
        match self.runtime.block_on(super::generations::read_generation(&self.client, &self.prefix, kind))? {
            None => self.index_of(kind),
            Some((g, _)) => self.indexes_of(kind, g),
        }
    }

    /// A search of the model's `kind` of `tenant` matching every filter:
    /// its kind, the index it reads and its query.
    fn model_search(&self, tenant: Option<&str>, kind: &str, filters: &[Filter]) -> Result<(Kind, String, Value), IndexError> {
        let Some(model) = self.model else { return Err(IndexError::Backend("a search of a model's kind needs --model".into())) };
        let Some(k) = crate::index::ModelKind::of(model, kind) else { return Err(IndexError::Backend(format!("{kind:?} is not a kind of model {}", model.name))) };
        let kind = Kind::Model(k);
        let (index, hidden) = self.scanned_index(kind)?;
        Ok((kind, index, without(json!({"bool": {"filter": [super::model::query(filters), of_tenant(tenant)], "must_not": [is_deleted()]}}), hidden)))
    }

    /// Every match of `query` in `index` (comma-separated), in id order,
    /// through a point in time a page of [`DUMP_PAGE_BYTES`] at a time.
    fn scan_by_id(&self, index: &str, query: Value, out: &mut dyn FnMut(&super::docs::Hit)) -> Result<(), IndexError> {
        self.scan_by_id_first(index, query, 0, out)
    }

    /// [`ElasticSearch::scan_by_id`] of the first `limit` matches (0: all).
    fn scan_by_id_first(&self, index: &str, query: Value, limit: usize, out: &mut dyn FnMut(&super::docs::Hit)) -> Result<(), IndexError> {
        let page = if limit == 0 { 1000 } else { limit.min(1000) };
        let mut pit = self.runtime.block_on(PitScan::open(&self.client, index, query, page))?.by_id().bounded(DUMP_PAGE_BYTES);
        let mut left = if limit == 0 { usize::MAX } else { limit };
        let result = (|| -> Result<(), IndexError> {
            while left > 0 {
                let page = self.runtime.block_on(pit.next_page())?;
                if page.is_empty() {
                    return Ok(());
                }
                page.iter().take(left).for_each(&mut *out);
                left = left.saturating_sub(page.len());
            }
            Ok(())
        })();
        self.runtime.block_on(pit.close());
        result
    }

    fn run(&self, kind: Kind, query: Value, limit: usize, out: &mut dyn FnMut(Doc)) -> Result<(), IndexError> {
        if limit == 0 || limit > MAX_RESULT_WINDOW {
            let (index, hidden) = self.scanned_index(kind)?;
            let query = without(query, hidden);
            // Every match (in index order), or more than one search may
            // return (best first, through a point in time).
            let page = if limit == 0 { 1000 } else { MAX_RESULT_WINDOW };
            let mut pit = self.runtime.block_on(PitScan::open(&self.client, &index, query, page))?;
            pit = match limit {
                0 => pit.bounded(DUMP_PAGE_BYTES),
                _ => pit.by_score(),
            };
            let mut left = if limit == 0 { usize::MAX } else { limit };
            let result = (|| -> Result<(), IndexError> {
                while left > 0 {
                    let page = self.runtime.block_on(pit.next_page())?;
                    if page.is_empty() {
                        break;
                    }
                    for h in page.iter().take(left) {
                        out(from_source(kind, &h.source));
                    }
                    left = left.saturating_sub(page.len());
                }
                Ok(())
            })();
            self.runtime.block_on(pit.close());
            return result;
        }
        let (index, hidden) = self.index_of(kind)?;
        let body = json!({"size": limit, "query": without(query, hidden)});
        let v = self.runtime.block_on(async {
            let r = self.client.search(SearchParts::Index(&[&index])).allow_partial_search_results(false).body(body).send().await?;
            complete_json(&format!("searching {index}"), r).await
        })?;
        hits(&v).iter().for_each(|h| out(from_source(kind, &h.source)));
        Ok(())
    }
}

impl SearchIndex for ElasticSearch {
    fn files(&self, q: &FileQuery, limit: usize, out: &mut dyn FnMut(FileDoc)) -> Result<(), IndexError> {
        self.run(Kind::File, file_query(q), limit, &mut |d| {
            if let Doc::File(f) = d {
                out(f)
            }
        })
    }

    fn posts(&self, q: &PostQuery, limit: usize, out: &mut dyn FnMut(PostDoc)) -> Result<(), IndexError> {
        self.run(Kind::Post, post_query(q), limit, &mut |d| {
            if let Doc::Post(p) = d {
                out(p)
            }
        })
    }

    fn posts_by_author(&self, q: &PostQuery, limit: usize, per_author: usize) -> Result<Vec<AuthorGroup>, IndexError> {
        if per_author > MAX_INNER_RESULT_WINDOW {
            return Err(IndexError::Rejected(format!("--per-author {per_author} is above Elasticsearch's index.max_inner_result_window ({MAX_INNER_RESULT_WINDOW})")));
        }
        let (index, hidden) = self.index_of(Kind::Post)?;
        let search = |mut body: Value| {
            body["query"] = without(body["query"].take(), hidden.clone());
            self.runtime.block_on(async {
                let r = self.client.search(SearchParts::Index(&[&index])).allow_partial_search_results(false).body(body).send().await?;
                complete_json(&format!("grouping posts of {index}"), r).await
            })
        };
        if limit > 0 && limit <= MAX_RESULT_WINDOW {
            return Ok(parse_groups(&search(group_by_author_body(q, limit, per_author))?));
        }
        // Every author (or more than a terms aggregation may return): page
        // through a composite aggregation, then order by best score here.
        let mut groups = Vec::new();
        let mut after: Option<Value> = None;
        loop {
            let v = search(all_authors_body(q, AUTHOR_PAGE, per_author, after.as_ref()))?;
            let page = parse_groups(&v);
            let n = page.len();
            groups.extend(page);
            match v["aggregations"]["authors"]["after_key"].clone() {
                Value::Null => break,
                _ if n < AUTHOR_PAGE => break,
                key => after = Some(key),
            }
        }
        groups.sort_by(|a, b| b.best_score.total_cmp(&a.best_score).then_with(|| a.author.cmp(&b.author)));
        if limit > 0 {
            groups.truncate(limit);
        }
        Ok(groups)
    }

    fn tenants(&self, limit: usize) -> Result<Vec<String>, IndexError> {
        let read = names::kinds(self.model).iter().map(|k| self.index_of(*k)).collect::<Result<Vec<Read>, _>>()?;
        let names: Vec<&str> = read.iter().map(|(i, _)| i.as_str()).collect();
        let must_not: Vec<Value> = std::iter::once(is_deleted()).chain(read.iter().filter_map(|(_, h)| h.clone())).collect();
        let body =
            json!({"size": 0, "query": {"bool": {"must_not": must_not}}, "aggs": {"tenants": {"terms": {"field": TENANT_FIELD, "size": limit.clamp(1, MAX_RESULT_WINDOW), "order": {"_key": "asc"}}}}});
        let v = self.runtime.block_on(async {
            let r = self.client.search(SearchParts::Index(&names)).allow_partial_search_results(false).body(body).send().await?;
            complete_json("listing the tenants", r).await
        })?;
        let buckets = v["aggregations"]["tenants"]["buckets"].as_array().cloned().unwrap_or_default();
        Ok(buckets.iter().filter_map(|b| b["key"].as_str().map(str::to_string)).take(limit).collect())
    }

    fn dump(&self, out: &mut dyn FnMut(Doc)) -> Result<(), IndexError> {
        self.refresh_all()?;
        for kind in names::kinds(self.model) {
            self.run(kind, json!({"bool": {"must_not": [is_deleted()]}}), 0, out)?;
        }
        Ok(())
    }

    fn dump_tenant(&self, tenant: &str, out: &mut dyn FnMut(Doc)) -> Result<(), IndexError> {
        self.refresh_all()?;
        for kind in names::kinds(self.model) {
            self.run(kind, json!({"bool": {"filter": [of_tenant(Some(tenant))], "must_not": [is_deleted()]}}), 0, out)?;
        }
        Ok(())
    }

    fn dump_sorted(&self, out: &mut dyn FnMut(Doc)) -> Result<(), IndexError> {
        self.dump_sorted_recorded(&mut |d, _| out(d))
    }

    fn model_documents(&self, tenant: Option<&str>, kind: &str, filters: &[Filter], limit: usize) -> Result<Vec<(String, String)>, IndexError> {
        let (kind, index, query) = self.model_search(tenant, kind, filters)?;
        let mut out = Vec::new();
        self.scan_by_id_first(&index, query, limit, &mut |h| {
            if let Doc::Model(d) = from_source(kind, &h.source) {
                let source = crate::command::generic::value::document_json(d.unscoped_id(), &d.fields, &d.copies);
                out.push((d.unscoped_id().to_string(), source.to_string()));
            }
        })?;
        Ok(out)
    }

    fn model_groups(&self, tenant: Option<&str>, kind: &str, filters: &[Filter], by: &GroupBy) -> Result<Vec<Group>, IndexError> {
        // What one aggregation does not answer: counted from every match.
        let counted = || Ok(crate::index::group::group(&self.model_documents(tenant, kind, filters, 0)?, by));
        let Some(size) = super::grouped::size(by) else { return counted() };
        let (_, index, query) = self.model_search(tenant, kind, filters)?;
        let v = self.runtime.block_on(async {
            let r = self.client.search(SearchParts::Index(&[&index])).allow_partial_search_results(false).body(super::grouped::body(query, by, size)).send().await?;
            complete_json(&format!("grouping {kind} documents of {index} by {}", by.field), r).await
        })?;
        super::grouped::parse(&v, by).map_or_else(counted, Ok)
    }

    fn dump_sorted_recorded(&self, out: &mut dyn FnMut(Doc, Recorded)) -> Result<(), IndexError> {
        self.refresh_all()?;
        let mut kinds = names::kinds(self.model);
        kinds.sort_by_key(|k| k.as_str());
        for kind in kinds {
            let (index, hidden) = self.scanned_index(kind)?;
            // Tenant by tenant, the default one first (a sort on the
            // tenant would leave the default tenant's, which have none, to
            // the server's handling of missing values and of `null` in
            // `search_after`): each scan sorted by id.
            let mut tenant: Option<String> = None;
            loop {
                let query = without(json!({"bool": {"filter": [of_tenant(tenant.as_deref())], "must_not": [is_deleted()]}}), hidden.clone());
                self.scan_by_id(&index, query, &mut |h| out(from_source(kind, &h.source), recorded(&h.source)))?;
                match self.next_tenant(&index, tenant.as_deref())? {
                    Some(t) => tenant = Some(t),
                    None => break,
                }
            }
        }
        Ok(())
    }
}
