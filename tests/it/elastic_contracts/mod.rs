//! The Elasticsearch backend against recorded request/response contracts of
//! Elasticsearch 8.x, served by an HTTP test double (wiremock). No live
//! cluster is involved. This module holds the fixtures; the contracts are
//! split by behaviour.

mod bulk_engine;
mod dependents;
mod fan_out;
mod generations;
mod log_identity;
mod owners;
mod recorded;
mod scans;
mod search;
mod startup;
mod store;
mod take_overs;
mod writes;

use std::time::Duration;

use denorm::index::elastic::bulk::{self, BulkLimits, BulkOp, RetryPolicy};
use denorm::index::elastic::config::{env, ElasticConfig};
use denorm::index::elastic::{mapping, names, setup, ElasticError};
use denorm::index::{Checkpoint, Kind};
use serde_json::{json, Value};
use wiremock::matchers::{header, method, path, path_regex};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

use crate::common::chaos;

fn config(server: &MockServer, vars: &[(&'static str, &'static str)]) -> ElasticConfig {
    let vars = vars.to_vec();
    ElasticConfig::from_lookup(&server.uri(), move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())).unwrap()
}

fn fast() -> RetryPolicy {
    RetryPolicy { initial: Duration::from_millis(5), max: Duration::from_millis(20), max_attempts: 5 }
}

fn ndjson(req: &Request) -> Vec<Value> {
    String::from_utf8_lossy(&req.body).lines().filter(|l| !l.is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Ids of the actions of a bulk request body.
fn action_ids(req: &Request) -> Vec<String> {
    ndjson(req).iter().filter_map(|l| l.as_object()?.values().next()?.get("_id")?.as_str().map(String::from)).collect()
}

/// Answers every action of a bulk request as done.
fn bulk_ok(req: &Request) -> ResponseTemplate {
    bulk_reply(req, &[])
}

/// Answers a bulk request as Elasticsearch does: one item per action, keyed
/// by that action, with the status `statuses` gives its id (else done: 201
/// for a create, 200 otherwise).
fn bulk_reply(req: &Request, statuses: &[(&str, u16)]) -> ResponseTemplate {
    let actions: Vec<(String, String)> = ndjson(req)
        .iter()
        .filter_map(|l| {
            let (action, meta) = l.as_object()?.iter().next()?;
            Some((action.clone(), meta.get("_id")?.as_str()?.to_string()))
        })
        .collect();
    recorded::bulk(
        actions
            .iter()
            .map(|(action, id)| {
                let status = statuses.iter().find(|(i, _)| i == id).map(|(_, s)| *s).unwrap_or(if action == "create" { 201 } else { 200 });
                recorded::bulk_item(action, id, status)
            })
            .collect(),
    )
}

/// A backend on the test double, its blocking calls run on `rt`.
fn backend(server: &MockServer, rt: &tokio::runtime::Runtime) -> denorm::index::elastic::backend::ElasticBackend {
    backend_on(server, rt, 0)
}

/// [`backend`] with the read alias on generation `g`.
fn backend_on(server: &MockServer, rt: &tokio::runtime::Runtime, g: u64) -> denorm::index::elastic::backend::ElasticBackend {
    rt.block_on(mount_generation(server, g));
    rt.block_on(mount_meta_writes(server));
    let mut b = denorm::index::elastic::backend::ElasticBackend::new(config(server, &[]).client().unwrap(), "denorm", "t", rt.handle().clone());
    b.policy = fast();
    b
}

/// The read alias of files on generation `g` (see [`mount_read_alias`]).
async fn mount_generation(server: &MockServer, g: u64) {
    mount_read_alias(server, Kind::File, g).await;
}

/// The read alias of `kind` on generation `g`, as Elasticsearch 8 answers
/// the two requests that find it: `GET /_alias/<alias>` (the concrete
/// index, with that alias only) and `GET /<index>/_alias` (all its
/// aliases, the generation's write alias among them).
async fn mount_read_alias(server: &MockServer, kind: Kind, g: u64) {
    let (read, index) = (names::alias("denorm", kind), names::concrete("denorm", kind, g));
    Mock::given(method("GET"))
        .and(path(format!("/_alias/{read}")))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({ index.clone(): {"aliases": { read.clone(): {"is_write_index": true}}} })))
        .mount(server)
        .await;
    Mock::given(method("GET"))
        .and(path(format!("/{index}/_alias")))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            index.clone(): {"aliases": { read: {"is_write_index": true}, names::write_alias("denorm", kind, g): {}}}
        })))
        .mount(server)
        .await;
}

/// Meta document writes answered as Elasticsearch does (created, or the
/// next version), at a lower priority than a test's own mocks: a shard's
/// claim when it opens, and its checkpoint writes. A generation's
/// placement is not recorded (every tenant shared, as before placements).
async fn mount_meta_writes(server: &MockServer) {
    Mock::given(method("GET")).and(path_regex(r"^/denorm-meta/_doc/(g[0-9]+-)?placement$")).respond_with(recorded::doc_missing("denorm-meta", "placement")).with_priority(10).mount(server).await;
    Mock::given(method("POST")).and(path_regex(r"^/denorm-meta/_create/[^/]+$")).respond_with(recorded::meta_written("p0", 0)).with_priority(10).mount(server).await;
    Mock::given(method("POST")).and(path_regex(r"^/denorm-meta/_doc/[^/]+$")).respond_with(recorded::meta_written("p0", 1)).with_priority(10).mount(server).await;
}

fn index_op(id: &str) -> BulkOp {
    BulkOp::Index { index: "denorm-files".into(), id: id.into(), source: json!({"id": id}), if_seq_no: None }
}

/// A bulk response to index actions with these statuses.
fn items(statuses: &[(&str, u16)]) -> Value {
    json!({
        "took": 3,
        "errors": statuses.iter().any(|(_, s)| *s >= 300),
        "items": statuses.iter().map(|(id, s)| recorded::bulk_item("index", id, *s)).collect::<Vec<_>>()
    })
}

fn file_source(id: &str, dir: &str, contents: &str, pos: u64) -> Value {
    json!({"id": id, "name": "1.txt", "path": dir, "contents": contents, "denorm_pos": pos})
}

fn hit(id: &str, dir: &str, seq: i64, sort: i64) -> Value {
    json!({"_index": "denorm-files-000001", "_id": id, "_seq_no": seq, "_primary_term": 1, "_score": null,
           "_source": file_source(id, dir, "c", 1), "sort": [sort]})
}

async fn mount_scan_basics(server: &MockServer, pit_opens: u64) {
    mount_scan(server, Some(pit_opens), None).await;
}

/// A shard's scan: no meta document yet, the refresh, a point in time
/// opened and closed, expected that many times when given.
async fn mount_scan(server: &MockServer, pit_opens: Option<u64>, pit_closes: Option<u64>) {
    Mock::given(method("GET"))
        .and(path("/denorm-meta/_doc/p0"))
        .respond_with(ResponseTemplate::new(404).set_body_json(json!({"_index": "denorm-meta", "_id": "p0", "found": false})))
        .mount(server)
        .await;
    Mock::given(path("/denorm-files-g0/_refresh")).respond_with(ResponseTemplate::new(200).set_body_json(json!({"_shards": {"total": 2, "successful": 1, "failed": 0}}))).mount(server).await;
    let open = Mock::given(method("POST"))
        .and(path("/denorm-files-g0/_pit"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"id": "pit-1", "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0}})));
    match pit_opens {
        Some(n) => open.expect(n),
        None => open,
    }
    .mount(server)
    .await;
    let close = Mock::given(method("DELETE")).and(path("/_pit")).respond_with(ResponseTemplate::new(200).set_body_json(json!({"succeeded": true, "num_freed": 1})));
    match pit_closes {
        Some(n) => close.expect(n),
        None => close,
    }
    .mount(server)
    .await;
}

/// The test double of one contract, built by chained calls: a wiremock
/// server on a runtime of its own, with the answers the contract needs
/// mounted. A contract mounts its own answers on `server` (inside
/// `rt.block_on`) and builds the backend with [`Double::backend`].
struct Double {
    rt: tokio::runtime::Runtime,
    server: MockServer,
}

impl Double {
    fn new() -> Self {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let server = rt.block_on(MockServer::start());
        Double { rt, server }
    }

    /// A shard's scan around a point in time, opened `pit_opens` times
    /// (see [`mount_scan_basics`]).
    fn scan(self, pit_opens: u64) -> Self {
        self.rt.block_on(mount_scan_basics(&self.server, pit_opens));
        self
    }

    /// A shard's scan whose point in time is closed `pit_closes` times (see
    /// [`mount_scan`]).
    fn pit_scan(self, pit_closes: u64) -> Self {
        self.rt.block_on(mount_scan(&self.server, None, Some(pit_closes)));
        self
    }

    /// A shard with no applied position yet, whose files `ids` do not exist.
    fn new_shard(self, ids: &[&str]) -> Self {
        self.rt.block_on(async {
            Mock::given(path("/denorm-meta/_doc/p0")).and(method("GET")).respond_with(ResponseTemplate::new(404).set_body_json(json!({"found": false}))).mount(&self.server).await;
            for id in ids {
                Mock::given(method("GET")).and(path(format!("/denorm-files-g0/_doc/{id}"))).respond_with(ResponseTemplate::new(404).set_body_json(json!({"found": false}))).mount(&self.server).await;
            }
        });
        self
    }

    /// Every bulk request answered as done.
    fn bulk_ok(self) -> Self {
        self.rt.block_on(Mock::given(method("POST")).and(path("/_bulk")).respond_with(bulk_ok).mount(&self.server));
        self
    }

    /// A backend on this double (read alias on generation 0).
    fn backend(&self) -> denorm::index::elastic::backend::ElasticBackend {
        backend(&self.server, &self.rt)
    }
}

fn bulks(server: &MockServer, rt: &tokio::runtime::Runtime) -> Vec<Vec<Value>> {
    rt.block_on(server.received_requests()).unwrap().iter().filter(|r| r.url.path() == "/_bulk").map(ndjson).collect()
}
