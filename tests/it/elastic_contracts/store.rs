//! Stateful test doubles of Elasticsearch: the partition's meta document,
//! a document store that enforces `if_seq_no`/`if_primary_term` and
//! create-if-absent and answers point-in-time scans, and a slow `_bulk`.

use super::*;

/// The partition's meta document as Elasticsearch keeps it: reads,
/// creates that fail when it exists, and writes conditional on
/// `if_seq_no`/`if_primary_term` that fail with 409 on any other version.
#[derive(Clone, Default)]
pub(super) struct MetaDoc(pub(super) std::sync::Arc<std::sync::Mutex<Option<(Value, i64)>>>);

impl wiremock::Respond for MetaDoc {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let mut doc = self.0.lock().unwrap();
        let conflict = |current: i64| {
            let cause = json!({"type": "version_conflict_engine_exception",
                "reason": format!("[p0]: version conflict, current document has seqNo [{current}] and primary term [1]"),
                "index_uuid": "mQ3PvW3cS9GlQe6Zy0f1nA", "shard": "0", "index": "denorm-meta"});
            let mut error = cause.clone();
            error["root_cause"] = json!([cause]);
            ResponseTemplate::new(409).set_body_json(json!({"error": error, "status": 409}))
        };
        let query: std::collections::HashMap<String, String> = req.url.query_pairs().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        match (req.method.as_str(), req.url.path()) {
            ("GET", _) => match &*doc {
                Some((source, seq)) => ResponseTemplate::new(200).set_body_json(json!({"_index": "denorm-meta", "_id": "p0", "_version": seq + 1,
                    "_seq_no": seq, "_primary_term": 1, "found": true, "_source": source})),
                None => ResponseTemplate::new(404).set_body_json(json!({"_index": "denorm-meta", "_id": "p0", "found": false})),
            },
            ("POST", "/denorm-meta/_create/p0") if doc.is_some() => conflict(doc.as_ref().unwrap().1),
            ("POST", _) => {
                let current = doc.as_ref().map(|(_, seq)| *seq);
                if let Some(required) = query.get("if_seq_no") {
                    if Some(required.parse::<i64>().unwrap()) != current || query.get("if_primary_term").map(String::as_str) != Some("1") {
                        return conflict(current.unwrap_or(-1));
                    }
                }
                let seq = current.map_or(0, |s| s + 1);
                *doc = Some((serde_json::from_slice(&req.body).unwrap(), seq));
                recorded::meta_written("p0", seq)
            }
            _ => ResponseTemplate::new(405),
        }
    }
}

/// Test support, not Elasticsearch: a stateful store of documents that
/// answers `GET /<index>/_doc/<id>`, `POST /<index>/_doc|_create/<id>`
/// and `_bulk` (index, create, delete) and enforces `if_seq_no` /
/// `if_primary_term` and create-only-if-absent as Elasticsearch does
/// (409 `version_conflict_engine_exception`). Aliases are names here.
#[derive(Clone, Default)]
pub(super) struct Store(pub(super) Shared<std::collections::HashMap<(String, String), (Value, i64)>>);

/// A document in a point in time: id, source, seq_no.
pub(super) type PitDoc = (String, Value, i64);

/// State the test server's handlers share.
type Shared<T> = std::sync::Arc<std::sync::Mutex<T>>;

impl Store {
    pub(super) fn get(&self, index: &str, id: &str) -> Option<Value> {
        self.0.lock().unwrap().get(&(index.to_string(), id.to_string())).map(|(v, _)| v.clone())
    }

    /// Applies one write; `Err(current seq)` on a conflict.
    pub(super) fn write(&self, action: &str, index: &str, id: &str, source: Option<Value>, cond: Option<(i64, i64)>) -> Result<i64, i64> {
        let mut docs = self.0.lock().unwrap();
        let key = (index.to_string(), id.to_string());
        let current = docs.get(&key).map(|(_, seq)| *seq);
        let next = docs.values().map(|(_, seq)| *seq).max().map_or(0, |m| m + 1);
        if let (true, Some(seq)) = (action == "create", current) {
            return Err(seq);
        }
        if let Some((seq, term)) = cond {
            if current != Some(seq) || term != 1 {
                return Err(current.unwrap_or(-1));
            }
        }
        match source {
            Some(v) => {
                docs.insert(key, (v, next));
            }
            None => {
                docs.remove(&key);
            }
        }
        Ok(next)
    }

    pub(super) async fn mount(&self, server: &MockServer) {
        Mock::given(path_regex(r"^/(_bulk|_mget|[a-z0-9-]+/(_doc|_create)/[^/]+)$")).respond_with(self.clone()).with_priority(1).mount(server).await;
    }
}

impl wiremock::Respond for Store {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let segments: Vec<&str> = req.url.path().trim_start_matches('/').split('/').collect();
        let query: std::collections::HashMap<String, String> = req.url.query_pairs().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let cond = |q: &dyn Fn(&str) -> Option<i64>| q("if_seq_no").zip(q("if_primary_term"));
        match (req.method.as_str(), segments.as_slice()) {
            ("GET", [index, "_doc", id]) => match self.0.lock().unwrap().get(&(index.to_string(), id.to_string())) {
                Some((source, seq)) => recorded::get_doc_in(index, id, *seq, source.clone()),
                None => recorded::doc_missing(index, id),
            },
            ("POST", [index, action @ ("_doc" | "_create"), id]) => {
                let action = if *action == "_create" { "create" } else { "index" };
                let c = cond(&|k| query.get(k).and_then(|v| v.parse().ok()));
                match self.write(action, index, id, Some(serde_json::from_slice(&req.body).unwrap()), c) {
                    Ok(seq) => recorded::meta_written(id, seq),
                    Err(current) => {
                        let error = recorded::bulk_item_version_conflict(action, id, c.map_or(-1, |c| c.0), current)[action]["error"].clone();
                        ResponseTemplate::new(409).set_body_json(json!({"error": {"root_cause": [error.clone()], "type": error["type"], "reason": error["reason"]}, "status": 409}))
                    }
                }
            }
            ("DELETE", [index, "_doc", id]) if self.get(index, id).is_none() => recorded::doc_deleted(index, id, 0, false),
            ("DELETE", [index, "_doc", id]) => match self.write("delete", index, id, None, None) {
                Ok(seq) => recorded::doc_deleted(index, id, seq, true),
                Err(_) => unreachable!("an unconditional delete"),
            },
            ("POST", ["_mget"]) => {
                let body: Value = serde_json::from_slice(&req.body).unwrap();
                let docs: Vec<Value> = body["docs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| {
                        let (index, id) = (d["_index"].as_str().unwrap(), d["_id"].as_str().unwrap());
                        match self.0.lock().unwrap().get(&(index.to_string(), id.to_string())) {
                            Some((source, seq)) => json!({"_index": index, "_id": id, "_seq_no": seq, "_primary_term": 1, "found": true, "_source": source}),
                            None => json!({"_index": index, "_id": id, "found": false}),
                        }
                    })
                    .collect();
                ResponseTemplate::new(200).set_body_json(json!({ "docs": docs }))
            }
            ("POST", ["_bulk"]) => {
                let lines = ndjson(req);
                let mut items = Vec::new();
                let mut i = 0;
                while i < lines.len() {
                    let (action, meta) = lines[i].as_object().unwrap().iter().next().map(|(a, m)| (a.clone(), m.clone())).unwrap();
                    let source = (action != "delete").then(|| lines[i + 1].clone());
                    i += if action == "delete" { 1 } else { 2 };
                    let (index, id) = (meta["_index"].as_str().unwrap(), meta["_id"].as_str().unwrap());
                    let c = meta["if_seq_no"].as_i64().zip(meta["if_primary_term"].as_i64());
                    items.push(match self.write(&action, index, id, source, c) {
                        Ok(seq) => recorded::bulk_item_ok(&action, id, seq),
                        Err(current) => recorded::bulk_item_version_conflict(&action, id, c.map_or(-1, |c| c.0), current),
                    });
                }
                recorded::bulk(items)
            }
            _ => ResponseTemplate::new(405),
        }
    }
}

/// Point-in-time scans over a [`Store`]: a snapshot of the index at
/// opening, filtered by the scan queries' clauses (`bool`, `term`, with
/// `path.tree` as the `path_hierarchy` analyzer indexes it, `terms`), in
/// id order; and searches of an index, over what its last refresh
/// published. Test support for the chaos test, not Elasticsearch.
#[derive(Clone, Default)]
pub(super) struct Scans {
    pub(super) store: Store,
    /// Each open point in time: its documents (id, source, seq_no).
    pub(super) pits: Shared<std::collections::HashMap<String, Vec<PitDoc>>>,
    /// What each index's last refresh published: what a search of it sees.
    pub(super) refreshed: Shared<std::collections::HashMap<String, Vec<PitDoc>>>,
}

pub(super) fn field<'a>(v: &'a Value, dotted: &str) -> &'a Value {
    dotted.split('.').fold(v, |v, k| &v[k])
}

/// Whether `source` matches the clauses denorm's scans use.
pub(super) fn matches(q: &Value, source: &Value) -> bool {
    if let Some(b) = q.get("bool") {
        let all = |k: &str| b[k].as_array().into_iter().flatten().all(|c| matches(c, source));
        let should: Vec<&Value> = b["should"].as_array().into_iter().flatten().collect();
        let minimum = b["minimum_should_match"].as_u64().unwrap_or(if should.is_empty() { 0 } else { 1 }) as usize;
        return all("filter") && all("must") && !b["must_not"].as_array().into_iter().flatten().any(|c| matches(c, source)) && should.iter().filter(|c| matches(c, source)).count() >= minimum;
    }
    if let Some((name, value)) = q.get("term").and_then(Value::as_object).and_then(|t| t.iter().next()) {
        let value = value.as_str().map_or(value.to_string(), String::from);
        if name == "path.tree" {
            let dir = source["path"].as_str().unwrap_or_default();
            return dir == value || dir.starts_with(&format!("{value}/"));
        }
        let found = field(source, name);
        return found.as_str().map_or(found.to_string(), String::from) == value;
    }
    if let Some((name, values)) = q.get("terms").and_then(Value::as_object).and_then(|t| t.iter().next()) {
        let found = field(source, name);
        return values.as_array().unwrap().iter().any(|v| v == found);
    }
    if let Some(f) = q.get("exists").and_then(|e| e["field"].as_str()) {
        return !field(source, f).is_null();
    }
    panic!("the scan test support does not know the clause {q}");
}

impl wiremock::Respond for Scans {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let segments: Vec<&str> = req.url.path().trim_start_matches('/').split('/').collect();
        match (req.method.as_str(), segments.as_slice()) {
            (_, [indexes, "_refresh"]) => {
                let store = self.store.0.lock().unwrap();
                let mut refreshed = self.refreshed.lock().unwrap();
                for index in indexes.split(',') {
                    let docs = store.iter().filter(|((i, _), _)| i == index).map(|((_, id), (v, seq))| (id.clone(), v.clone(), *seq)).collect();
                    refreshed.insert(index.to_string(), docs);
                }
                ResponseTemplate::new(200).set_body_json(json!({"_shards": {"total": 1, "successful": 1, "failed": 0}}))
            }
            (_, [_, "_delete_by_query"]) => ResponseTemplate::new(200).set_body_json(json!({"task": "n1:1"})),
            ("POST", [index, "_pit"]) => {
                let mut snapshot: Vec<(String, Value, i64)> = self.store.0.lock().unwrap().iter().filter(|((i, _), _)| i == index).map(|((_, id), (v, seq))| (id.clone(), v.clone(), *seq)).collect();
                snapshot.sort_by(|a, b| a.0.cmp(&b.0));
                let mut pits = self.pits.lock().unwrap();
                let id = format!("pit-{}", pits.len());
                pits.insert(id.clone(), snapshot);
                ResponseTemplate::new(200).set_body_json(json!({"id": id}))
            }
            ("DELETE", ["_pit"]) => ResponseTemplate::new(200).set_body_json(json!({"succeeded": true, "num_freed": 1})),
            // A search of an index, not of a point in time: what its last
            // refresh published, in id order.
            ("POST", [index, "_search"]) => {
                let body: Value = serde_json::from_slice(&req.body).unwrap();
                let refreshed = self.refreshed.lock().unwrap();
                let mut docs: Vec<(&String, &Value, i64)> = refreshed.get(*index).into_iter().flatten().map(|(id, v, seq)| (id, v, *seq)).collect();
                docs.sort_by(|a, b| a.0.cmp(b.0));
                let hits: Vec<Value> = docs
                    .into_iter()
                    .filter(|(_, v, _)| matches(&body["query"], v))
                    .take(body["size"].as_u64().unwrap_or(10) as usize)
                    .map(|(id, v, seq)| json!({"_index": index, "_id": id, "_seq_no": seq, "_primary_term": 1, "_score": 1.0, "_source": v}))
                    .collect();
                ResponseTemplate::new(200).set_body_json(recorded::search_response(None, hits))
            }
            ("POST", ["_search"]) => {
                let body: Value = serde_json::from_slice(&req.body).unwrap();
                let pits = self.pits.lock().unwrap();
                let snapshot = &pits[body["pit"]["id"].as_str().unwrap()];
                let from = body["search_after"][0].as_u64().map_or(0, |a| a as usize + 1);
                let hits: Vec<Value> = snapshot
                    .iter()
                    .enumerate()
                    .skip(from)
                    .filter(|(_, (_, v, _))| matches(&body["query"], v))
                    .take(body["size"].as_u64().unwrap() as usize)
                    .map(|(i, (id, v, seq))| json!({"_index": "denorm-files-000001", "_id": id, "_seq_no": seq, "_primary_term": 1, "_score": null, "_source": v, "sort": [i]}))
                    .collect();
                ResponseTemplate::new(200).set_body_json(recorded::search_response(Some(body["pit"]["id"].as_str().unwrap()), hits))
            }
            _ => ResponseTemplate::new(405),
        }
    }
}

/// A test server whose documents live in a stateful [`Store`] that
/// [`Scans`] can search.
pub(super) fn scans_server(rt: &tokio::runtime::Runtime) -> (MockServer, Scans) {
    scans_server_on(rt, rt.block_on(MockServer::start()), Scans::default())
}

/// [`scans_server`] on `server`, whose mocks mounted before take precedence.
pub(super) fn scans_server_on(rt: &tokio::runtime::Runtime, server: MockServer, scans: Scans) -> (MockServer, Scans) {
    rt.block_on(async {
        scans.store.mount(&server).await;
        Mock::given(path_regex(r"^/([a-z0-9,-]+/(_refresh|_pit|_delete_by_query|_search)|_pit|_search)$")).respond_with(scans.clone()).with_priority(1).mount(&server).await;
    });
    (server, scans)
}

/// The files of generation 0 in the store, tombstones left out.
pub(super) fn live_files(scans: &Scans) -> Vec<denorm::index::Doc> {
    live_docs(scans, Kind::File)
}

/// The documents of `kind` of generation 0 in the store, tombstones left out.
pub(super) fn live_docs(scans: &Scans, kind: Kind) -> Vec<denorm::index::Doc> {
    use denorm::index::elastic::docs::{from_source, is_tombstone};
    let index = format!("denorm-{}s-g0", kind.as_str());
    let store = scans.store.0.lock().unwrap();
    store.iter().filter(|((i, _), (v, _))| *i == index && !is_tombstone(v)).map(|(_, (v, _))| from_source(kind, v)).collect()
}

/// The store's bulk; once `slow` is set, answered `delay` after it
/// arrived, and its arrival recorded.
pub(super) struct SlowBulk {
    pub(super) store: Store,
    pub(super) delay: Duration,
    pub(super) slow: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub(super) arrivals: std::sync::Arc<std::sync::Mutex<Vec<std::time::Instant>>>,
}

impl wiremock::Respond for SlowBulk {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        if !self.slow.load(std::sync::atomic::Ordering::SeqCst) {
            return self.store.respond(req);
        }
        self.arrivals.lock().unwrap().push(std::time::Instant::now());
        self.store.respond(req).set_delay(self.delay)
    }
}
