//! Documents <-> Elasticsearch `_source`, and the point-in-time scanner.

use elasticsearch::{Elasticsearch, OpenPointInTimeParts, SearchParts};
use serde_json::{json, Value};

use super::names::{DELETED_AT_FIELD, DELETED_FIELD, PARTITION_FIELD, POS_FIELD, TENANT_FIELD};
use super::{json_or_status, ElasticError};
use crate::command::tenant::{self, unscoped};
use crate::index::{Author, Doc, FileDoc, Kind, ModelDoc, ModelScan, PostDoc, Recorded, Scan, UserDoc};

/// The `_source` of a document: its fields as the producer wrote them, and
/// its tenant in [`TENANT_FIELD`] (its `_id`, the document's scoped id,
/// keeps two tenants' documents apart).
pub fn to_source(doc: &Doc) -> Value {
    let mut v = match doc {
        Doc::File(f) => json!({"id": unscoped(&f.id), "name": f.name, "path": unscoped(&f.path), "contents": f.contents}),
        Doc::User(u) => json!({"id": unscoped(&u.id), "name": u.name, "email": u.email, "dob": u.dob}),
        Doc::Post(p) => json!({"id": unscoped(&p.id), "title": p.title, "body": p.body, "user": {"id": unscoped(&p.user.id), "name": p.user.name}}),
        Doc::Model(d) => crate::command::generic::value::document_json(d.unscoped_id(), &d.fields, &d.copies),
    };
    if let Some(t) = tenant::of(doc.id()) {
        v[TENANT_FIELD] = json!(t);
    }
    v[POS_FIELD] = json!(doc.pos());
    v
}

/// The clause that keeps a query to one tenant's documents (`None`: the
/// default tenant's, which have no [`TENANT_FIELD`]).
pub fn of_tenant(tenant: Option<&str>) -> Value {
    match tenant {
        Some(t) => json!({"term": {TENANT_FIELD: t}}),
        None => json!({"bool": {"must_not": [{"exists": {"field": TENANT_FIELD}}]}}),
    }
}

pub fn from_source(kind: Kind, v: &Value) -> Doc {
    // A value that is not a string (written behind the pipeline's back)
    // reads as its JSON text, so that a verify reports what is there
    // (review of verify, F17); a missing one reads as "".
    let s = |x: &Value| match x {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    let pos = v[POS_FIELD].as_u64().unwrap_or(0);
    // Scoped to the document's tenant again.
    let t = v[TENANT_FIELD].as_str();
    let id = |x: &Value| match t {
        None => s(x),
        Some(_) => tenant::scope(t, &s(x)),
    };
    match kind {
        Kind::File => Doc::File(FileDoc { id: id(&v["id"]), name: s(&v["name"]), path: id(&v["path"]), contents: s(&v["contents"]), pos }),
        Kind::User => Doc::User(UserDoc { id: id(&v["id"]), name: s(&v["name"]), email: s(&v["email"]), dob: s(&v["dob"]), pos }),
        Kind::Post => Doc::Post(PostDoc { id: id(&v["id"]), title: s(&v["title"]), body: s(&v["body"]), user: Author { id: id(&v["user"]["id"]), name: s(&v["user"]["name"]) }, pos }),
        Kind::Model(k) => {
            let own = |name: &str| name == TENANT_FIELD || name.starts_with("denorm_");
            // A source the model does not read (written behind the
            // pipeline's back) reads as a document without fields, so
            // that a verify reports it.
            let (doc_id, fields, copies) = crate::command::generic::value::document_from_json(k.domain(), k.decl(), v, &own).unwrap_or_else(|_| (s(&v["id"]), Default::default(), Default::default()));
            Doc::Model(Box::new(ModelDoc::new(k, id(&Value::String(doc_id)), fields, copies, pos)))
        }
    }
}

/// What a `_source` records beside the document's fields: the partition
/// that wrote it and whether its position is there.
pub fn recorded(v: &Value) -> Recorded {
    Recorded { owner: writer(v), pos_lost: !v[POS_FIELD].is_u64() }
}

/// The partition whose shard wrote a stored version (document or
/// tombstone); `None` for versions written before versions recorded it.
pub fn writer(stored: &Value) -> Option<i32> {
    stored[PARTITION_FIELD].as_i64().map(|p| p as i32)
}

/// The `_source` of a tombstone: what deleting `id` at log position `pos`
/// leaves (see [`super::names::DELETED_FIELD`]).
pub fn tombstone(id: &str, pos: u64, now_ms: u64) -> Value {
    let mut v = json!({"id": unscoped(id), POS_FIELD: pos, DELETED_FIELD: true, DELETED_AT_FIELD: now_ms});
    if let Some(t) = tenant::of(id) {
        v[TENANT_FIELD] = json!(t);
    }
    v
}

/// Whether a `_source` is a tombstone.
pub fn is_tombstone(v: &Value) -> bool {
    v[DELETED_FIELD] == json!(true)
}

/// The clause matching tombstones: searches and scans put it in
/// `must_not`.
pub fn is_deleted() -> Value {
    json!({"term": {DELETED_FIELD: true}})
}

/// The kind a scan reads and its query.
pub fn scan_query(scan: &Scan) -> (Kind, Value) {
    match scan {
        Scan::FilesWithin { path } => {
            // The file at `path` itself, or any file beneath the directory
            // `path`, of the path's tenant.
            let (dir, name) = crate::command::path::split(path);
            let file_itself = json!({"bool": {"filter": [{"term": {"path": unscoped(dir)}}, {"term": {"name": name}}]}});
            let within = json!({"bool": {"should": [{"term": {"path.tree": unscoped(path)}}, file_itself], "minimum_should_match": 1}});
            (Kind::File, json!({"bool": {"filter": [within, of_tenant(tenant::of(path))], "must_not": [is_deleted()]}}))
        }
        Scan::PostsOfUserNotNamed { user_id, name } => {
            let filter = [json!({"term": {"user.id": unscoped(user_id)}}), of_tenant(tenant::of(user_id))];
            (Kind::Post, json!({"bool": {"filter": filter, "must_not": [{"term": {"user.name.raw": name}}, is_deleted()]}}))
        }
        // A model's dependents whatever copy they carry (the rule tests
        // it), and a path's documents by its ancestors or itself.
        Scan::Model(m @ ModelScan::Dependents { owner, target, .. }) => {
            let filter = [json!({"term": {target.via.as_str(): owner}}), of_tenant(m.tenant())];
            (Kind::Model(m.kind()), json!({"bool": {"filter": filter, "must_not": [is_deleted()]}}))
        }
        Scan::Model(m @ ModelScan::Within { field, path, .. }) => {
            let within = json!({"bool": {"should": [{"term": {format!("{field}.tree"): path}}, {"term": {field.as_str(): path}}], "minimum_should_match": 1}});
            (Kind::Model(m.kind()), json!({"bool": {"filter": [within, of_tenant(m.tenant())], "must_not": [is_deleted()]}}))
        }
    }
}

/// The query of many owners' dependents at once (`super::dependents`):
/// the documents whose `via` names any of `owners` (unscoped ids of
/// `tenant`), whatever copy they carry; each owner's scan tests its own.
pub fn dependents_query(tenant: Option<&str>, via: &str, owners: &[&str]) -> Value {
    json!({"bool": {"filter": [{"terms": {via: owners}}, of_tenant(tenant)], "must_not": [is_deleted()]}})
}

/// A fan-out's scan read whole when it began (`ElasticShard::small_scan`):
/// the documents, each with the version its conditional write takes
/// (`None`: the one the writer's read recorded).
pub struct EsWhole {
    pub(super) kind: Kind,
    /// Each document with its version: `None` not asked, `Some(None)`
    /// absent, `Some(Some((seq_no, primary_term)))` present.
    pub(super) docs: Vec<(Doc, Option<Option<super::meta::Version>>)>,
}

/// One hit with what a conditional write needs.
#[derive(Debug, Clone)]
pub struct Hit {
    pub id: String,
    pub seq: Option<(i64, i64)>,
    pub source: Value,
    pub score: f32,
}

pub fn hits(response: &Value) -> Vec<Hit> {
    response["hits"]["hits"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| Hit {
            id: h["_id"].as_str().unwrap_or_default().to_string(),
            seq: match (h["_seq_no"].as_i64(), h["_primary_term"].as_i64()) {
                (Some(s), Some(t)) => Some((s, t)),
                _ => None,
            },
            source: h["_source"].clone(),
            score: h["_score"].as_f64().unwrap_or(0.0) as f32,
        })
        .collect()
}

/// Streams every match of a query in pages, through a point in time with
/// `search_after` in `_shard_doc` order (Elasticsearch 7.12 and later;
/// [`super::setup::check_version`] refuses older clusters).
/// [`PitScan::close`] must be called on every path.
pub struct PitScan {
    client: Elasticsearch,
    pit: String,
    query: Value,
    sort: Value,
    page: usize,
    after: Option<Value>,
    done: bool,
    /// Ends at an empty page only, not at a short one (see [`Self::by_id`]).
    to_empty: bool,
    /// Pages sized by bytes ([`Self::bounded`]): the `_source` bytes a
    /// page aims at, and the most documents one may ask for.
    bytes: Option<(usize, usize)>,
}

/// How long a scan's point in time lives between two pages: longer than
/// the bulk retries of a page can take (a context that expires anyway
/// restarts the scan).
pub const KEEP_ALIVE: &str = "5m";

/// The longest pause between a fan-out's pages (`--fan-out-page-pause-ms`)
/// on Elasticsearch: half the point in time's [`KEEP_ALIVE`], the other
/// half left for the page's bulk and its retries. A longer pause would let
/// every paged fan-out's point in time expire between two pages, restart
/// its scan and fail after three restarts, over and over (review F11).
pub const MAX_PAGE_PAUSE: std::time::Duration = std::time::Duration::from_secs(150);

/// Refuses a pause between a fan-out's pages its point in time cannot
/// outlive (see [`MAX_PAGE_PAUSE`]).
pub fn check_page_pause(pause: std::time::Duration) -> Result<(), String> {
    match pause > MAX_PAGE_PAUSE {
        true => Err(format!(
            "--fan-out-page-pause-ms {} is above {} ms, half the {KEEP_ALIVE} a fan-out's point in time lives between two pages on Elasticsearch: every paged fan-out would outlive it and fail",
            pause.as_millis(),
            MAX_PAGE_PAUSE.as_millis()
        )),
        false => Ok(()),
    }
}

impl PitScan {
    pub async fn open(client: &Elasticsearch, index: &str, query: Value, page: usize) -> Result<PitScan, ElasticError> {
        let r = client.open_point_in_time(OpenPointInTimeParts::Index(&[index])).keep_alive(KEEP_ALIVE).send().await?;
        let v = json_or_status(&format!("opening a point in time on {index}"), r).await?;
        let pit = v["id"].as_str().ok_or_else(|| ElasticError::Transport("point in time response has no id".into()))?.to_string();
        Ok(PitScan { client: client.clone(), pit, query, sort: json!([{"_shard_doc": "asc"}]), page: page.max(1), after: None, done: false, to_empty: false, bytes: None })
    }

    /// The same scan with matches best first (`_score`, ties in
    /// `_shard_doc` order): deep paging past `index.max_result_window`.
    pub fn by_score(mut self) -> Self {
        self.sort = json!([{"_score": "desc"}, {"_shard_doc": "asc"}]);
        self
    }

    /// The same scan in `id` order (ties in `_shard_doc` order): one
    /// tenant's documents of a kind in [`crate::index::dump_order`].
    pub fn by_id(mut self) -> Self {
        self.sort = json!([{"id": "asc"}, {"_shard_doc": "asc"}]);
        // A dump reads on past a short page (review of verify, S8: a server
        // or proxy that caps `size` below the page asked for ended the dump
        // early, and every later document was "missing"): one more request
        // per scan.
        self.to_empty = true;
        self
    }

    /// The same scan with pages sized by bytes, for a dump: the first page
    /// asks for [`FIRST_BOUNDED_PAGE`] documents, and each next one for as
    /// many as hold `bytes` of `_source` at the last page's average, at
    /// most the page given to [`Self::open`]. A page of 1,000 documents
    /// held 1,000 times the largest (review of verify, limits).
    pub fn bounded(mut self, bytes: usize) -> Self {
        self.bytes = Some((bytes.max(1), self.page));
        self.page = self.page.min(FIRST_BOUNDED_PAGE);
        self
    }

    /// The next page; empty when the scan is complete.
    pub async fn next_page(&mut self) -> Result<Vec<Hit>, ElasticError> {
        if self.done {
            return Ok(Vec::new());
        }
        let mut body = json!({
            "size": self.page,
            "query": self.query,
            "pit": {"id": self.pit, "keep_alive": KEEP_ALIVE},
            "sort": self.sort,
            "seq_no_primary_term": true,
            "track_total_hits": false
        });
        if let Some(a) = &self.after {
            body["search_after"] = a.clone();
        }
        let r = self.client.search(SearchParts::None).allow_partial_search_results(false).body(body).send().await?;
        // Refused as well as not asked for: a page missing some shards'
        // matches would end the scan with documents never rewritten.
        let v = super::complete_json("reading a point-in-time page", r).await?;
        if let Some(id) = v["pit_id"].as_str() {
            self.pit = id.to_string(); // the id may change between pages
        }
        let page = hits(&v);
        metrics::counter!(crate::metrics::ES_PIT_PAGES_TOTAL).increment(1);
        match v["hits"]["hits"].as_array().and_then(|h| h.last()) {
            Some(last) if page.len() >= self.page || self.to_empty => self.after = Some(last["sort"].clone()),
            _ => self.done = true,
        }
        if let (Some((bytes, most)), false) = (self.bytes, page.is_empty()) {
            self.page = sized_page(bytes, most, &page);
        }
        Ok(page)
    }

    /// Releases the point in time (best effort: it expires after its
    /// keep-alive).
    pub async fn close(self) {
        if let Err(e) = self.client.close_point_in_time().body(json!({"id": self.pit})).send().await {
            tracing::warn!(error = %e, "releasing a point in time failed; it expires after {KEEP_ALIVE}");
        }
    }
}

/// The first page of a scan sized by bytes ([`PitScan::bounded`]).
pub const FIRST_BOUNDED_PAGE: usize = 10;

/// The `_source` bytes a dump's page aims at ([`PitScan::bounded`]).
pub const DUMP_PAGE_BYTES: usize = 16 << 20;

/// As many documents as hold `bytes` at the average size of `page`'s
/// (`_source`, as JSON), between 1 and `most`.
fn sized_page(bytes: usize, most: usize, page: &[Hit]) -> usize {
    let held: usize = page.iter().map(|h| json_bytes(&h.source)).sum::<usize>().max(1);
    (bytes as u128 * page.len() as u128 / held as u128).clamp(1, most.max(1) as u128) as usize
}

/// About the length of `v` written as JSON, without writing it.
fn json_bytes(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) | Value::Number(_) => 8,
        Value::String(s) => s.len() + 2,
        Value::Array(a) => 2 + a.iter().map(|x| json_bytes(x) + 1).sum::<usize>(),
        Value::Object(o) => 2 + o.iter().map(|(k, x)| k.len() + 4 + json_bytes(x)).sum::<usize>(),
    }
}

#[cfg(test)]
mod sized_page_tests {
    use super::*;

    fn page(n: usize, contents: usize) -> Vec<Hit> {
        (0..n).map(|i| Hit { id: format!("f{i}"), seq: None, source: json!({"id": format!("f{i}"), "contents": "x".repeat(contents)}), score: 0.0 }).collect()
    }

    #[test]
    fn a_page_of_large_documents_is_followed_by_fewer_and_small_ones_by_the_most() {
        // 10 documents of about 1 MiB: 16 MiB hold 15 of them.
        assert_eq!(sized_page(16 << 20, 1000, &page(10, 1 << 20)), 15);
        // Of a little over 8 MiB (as JSON), or of 64 MiB: one at a time.
        assert_eq!(sized_page(16 << 20, 1000, &page(3, 8 << 20)), 1);
        assert_eq!(sized_page(16 << 20, 1000, &page(1, 64 << 20)), 1);
        // Small documents: the most asked for.
        assert_eq!(sized_page(16 << 20, 1000, &page(10, 100)), 1000);
        let one = json_bytes(&page(1, 100)[0].source);
        assert!((100..140).contains(&one), "{one}");
    }
}

#[cfg(test)]
mod page_pause_tests {
    #[test]
    fn a_pause_between_pages_must_leave_the_point_in_time_alive() {
        use std::time::Duration;
        assert!(super::check_page_pause(Duration::from_secs(150)).is_ok());
        let e = super::check_page_pause(Duration::from_secs(300)).unwrap_err();
        assert!(e.contains("300000") && e.contains("150000") && e.contains("5m"), "{e}");
    }
}
