//! [`SearchIndex`] on Elasticsearch: the same queries and output as the
//! embedded backend. Group-by-author is a `terms` aggregation on
//! `user.name.raw` ordered by each author's best score, with `top_hits`.

use elasticsearch::{Elasticsearch, SearchParts};
use serde_json::{json, Value};
use tokio::runtime::Handle;

use super::docs::{from_source, hits, PitScan};
use super::setup::alias;
use super::json_or_status;
use crate::index::{AuthorGroup, Doc, FileDoc, FileQuery, IndexError, Kind, PostDoc, PostQuery, SearchIndex};

pub struct ElasticSearch {
    pub client: Elasticsearch,
    pub prefix: String,
    pub runtime: Handle,
}

/// The query of `denorm search files`.
pub fn file_query(q: &FileQuery) -> Value {
    let mut filter = Vec::new();
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
    json!({"bool": {"filter": filter, "must": must}})
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
    json!({"bool": {"must": must}})
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

/// Parses the group-by-author response.
pub fn parse_groups(v: &Value) -> Vec<AuthorGroup> {
    v["aggregations"]["authors"]["buckets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| AuthorGroup {
            author: b["key"].as_str().unwrap_or_default().to_string(),
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

impl ElasticSearch {
    fn run(&self, kind: Kind, query: Value, limit: usize, out: &mut dyn FnMut(Doc)) -> Result<(), IndexError> {
        let index = alias(&self.prefix, kind);
        if limit == 0 {
            let mut pit = self.runtime.block_on(PitScan::open(&self.client, &index, query, 1000))?;
            let result = (|| -> Result<(), IndexError> {
                loop {
                    let page = self.runtime.block_on(pit.next_page())?;
                    if page.is_empty() {
                        return Ok(());
                    }
                    page.iter().for_each(|h| out(from_source(kind, &h.source)));
                }
            })();
            self.runtime.block_on(pit.close());
            return result;
        }
        let body = json!({"size": limit, "query": query});
        let v = self.runtime.block_on(async {
            let r = self.client.search(SearchParts::Index(&[&index])).body(body).send().await?;
            json_or_status(&format!("searching {index}"), r).await
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
        let index = alias(&self.prefix, Kind::Post);
        let authors = if limit == 0 { 10_000 } else { limit };
        let body = group_by_author_body(q, authors, per_author);
        let v = self.runtime.block_on(async {
            let r = self.client.search(SearchParts::Index(&[&index])).body(body).send().await?;
            json_or_status(&format!("grouping posts of {index}"), r).await
        });
        Ok(parse_groups(&v?))
    }

    fn dump(&self, out: &mut dyn FnMut(Doc)) -> Result<(), IndexError> {
        // A dump is for exact comparisons: make every write searchable first.
        let aliases: Vec<String> = [Kind::File, Kind::User, Kind::Post].iter().map(|k| alias(&self.prefix, *k)).collect();
        let names: Vec<&str> = aliases.iter().map(String::as_str).collect();
        self.runtime.block_on(async {
            let r = self.client.indices().refresh(elasticsearch::indices::IndicesRefreshParts::Index(&names)).send().await?;
            json_or_status("refreshing before a dump", r).await
        })?;
        for kind in [Kind::File, Kind::User, Kind::Post] {
            self.run(kind, json!({"match_all": {}}), 0, out)?;
        }
        Ok(())
    }
}
