//! The read side of an index: the searches `denorm search` offers, and
//! the ordered dump verify and the model checks compare.

use serde::Serialize;

use super::{Doc, FileDoc, IndexError, PostDoc};

/// The order of [`SearchIndex::dump_sorted`]: the kind's name, the tenant
/// (the default tenant first), the id (as bytes), then the key. Documents
/// are unique by kind and id but where shards are separate (embedded): an
/// owner change sent without its explicit form leaves a copy under each
/// key. The embedded index's `doc_key` terms (`kind:id`, `kind;tenant id`,
/// every kind's name four letters long) and Elasticsearch's scans sorted
/// on the `id` keyword, kind by kind and tenant by tenant, give this
/// order.
pub fn dump_order(d: &Doc) -> (&'static str, Option<String>, String, String) {
    let (tenant, id) = crate::command::tenant::split(d.id());
    (d.kind().as_str(), tenant.map(str::to_string), id.to_string(), d.key())
}

/// What a backend records beside a document's fields, which a verify
/// compares too (review of verify, F17): the partition whose shard wrote it
/// (Elasticsearch, where all partitions write into one index; `None`
/// where the backend does not record it), and whether its position was
/// lost (such a version reads as position 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recorded {
    pub owner: Option<i32>,
    pub pos_lost: bool,
}

/// Filters of `denorm search files`. Every search reads one tenant's
/// documents (`tenant`, `None`: the default tenant's).
#[derive(Debug, Clone, Default)]
pub struct FileQuery {
    pub tenant: Option<String>,
    /// Exact directory.
    pub dir: Option<String>,
    /// Whole subtree.
    pub under: Option<String>,
    /// Full text on contents.
    pub text: Option<String>,
}

/// Filters of `denorm search posts`.
#[derive(Debug, Clone, Default)]
pub struct PostQuery {
    pub tenant: Option<String>,
    pub text: Option<String>,
    pub author: Option<String>,
}

/// Posts of one author, for group-by-author.
#[derive(Debug, Clone, Serialize)]
pub struct AuthorGroup {
    pub author: String,
    pub best_score: f32,
    pub posts: Vec<PostDoc>,
}

/// Read side of an index: what `denorm search` and the model checks use.
pub trait SearchIndex {
    /// Files matching `q`, best first; `limit` 0 streams every match.
    fn files(&self, q: &FileQuery, limit: usize, out: &mut dyn FnMut(FileDoc)) -> Result<(), IndexError>;
    /// Posts matching `q`, best first; `limit` 0 streams every match.
    fn posts(&self, q: &PostQuery, limit: usize, out: &mut dyn FnMut(PostDoc)) -> Result<(), IndexError>;
    /// Authors ordered by their best-scoring matching post, each with its
    /// `per_author` best posts; `limit` authors (0: all).
    fn posts_by_author(&self, q: &PostQuery, limit: usize, per_author: usize) -> Result<Vec<AuthorGroup>, IndexError>;
    /// The tenants (other than the default one) that have documents here,
    /// in order, at most `limit` of them.
    fn tenants(&self, limit: usize) -> Result<Vec<String>, IndexError>;
    /// Every document of every shard, without bookkeeping.
    fn dump(&self, out: &mut dyn FnMut(Doc)) -> Result<(), IndexError>;
    /// Every document of the named `tenant` (what `denorm tenant delete`
    /// removes). This default filters a whole [`SearchIndex::dump`].
    fn dump_tenant(&self, tenant: &str, out: &mut dyn FnMut(Doc)) -> Result<(), IndexError> {
        self.dump(&mut |d| {
            if crate::command::tenant::of(d.id()) == Some(tenant) {
                out(d)
            }
        })
    }
    /// Every document in [`dump_order`], a page at a time where the
    /// backend can (both do): a comparison of two indexes merges two such
    /// streams, in memory that does not grow with the index. This default
    /// holds and sorts a whole dump.
    fn dump_sorted(&self, out: &mut dyn FnMut(Doc)) -> Result<(), IndexError> {
        let mut all = Vec::new();
        self.dump(&mut |d| all.push(d))?;
        all.sort_by_cached_key(dump_order);
        all.into_iter().for_each(out);
        Ok(())
    }
    /// The documents of the declared model's `kind` of `tenant` that every
    /// filter matches, as (id, source), in id order, the first `limit` (0:
    /// all; docs/model.md, "Searches").
    fn model_documents(&self, tenant: Option<&str>, kind: &str, filters: &[crate::index::filter::Filter], limit: usize) -> Result<Vec<(String, String)>, IndexError>;
    /// The matches of [`SearchIndex::model_documents`] grouped `by` a
    /// field ([`crate::index::group`]). This default counts every match's
    /// document; a backend that aggregates answers the same.
    fn model_groups(&self, tenant: Option<&str>, kind: &str, filters: &[crate::index::filter::Filter], by: &crate::index::group::GroupBy) -> Result<Vec<crate::index::group::Group>, IndexError> {
        Ok(crate::index::group::group(&self.model_documents(tenant, kind, filters, 0)?, by))
    }
    /// [`SearchIndex::dump_sorted`], each document with what the backend
    /// records beside its fields. This default records nothing more.
    fn dump_sorted_recorded(&self, out: &mut dyn FnMut(Doc, Recorded)) -> Result<(), IndexError> {
        self.dump_sorted(&mut |d| out(d, Recorded::default()))
    }
}
