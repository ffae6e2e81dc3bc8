//! Elasticsearch 8 answers, named by API and situation, in the shapes the
//! published API specification (elastic/elasticsearch-specification) and
//! Elasticsearch's REST tests give them. The tests above compose them
//! (`bulk_reply` picks an item per action of a request); a later check
//! against a live cluster can replay the same requests.

use serde_json::{json, Value};
use wiremock::ResponseTemplate;

/// Any request with wrong credentials: 401 `security_exception`, with
/// the schemes the cluster accepts.
pub fn unauthenticated(user: &str, request: &str) -> ResponseTemplate {
    let challenge = json!(["Basic realm=\"security\", charset=\"UTF-8\"", "ApiKey"]);
    let cause = json!({"type": "security_exception", "reason": format!("unable to authenticate user [{user}] for REST request [{request}]"),
                       "header": {"WWW-Authenticate": challenge}});
    let mut error = cause.clone();
    error["root_cause"] = json!([cause]);
    ResponseTemplate::new(401)
        .insert_header("WWW-Authenticate", "Basic realm=\"security\", charset=\"UTF-8\"")
        .insert_header("WWW-Authenticate", "ApiKey")
        .set_body_json(json!({"error": error, "status": 401}))
}

/// `PUT /<index>` of an index that exists: 400
/// `resource_already_exists_exception`.
pub fn resource_already_exists(index: &str) -> ResponseTemplate {
    let cause = json!({"type": "resource_already_exists_exception", "reason": format!("index [{index}/Qm3vW0cSR1ahVN5uTq0xJg] already exists"),
                       "index_uuid": "Qm3vW0cSR1ahVN5uTq0xJg", "index": index});
    let mut error = cause.clone();
    error["root_cause"] = json!([cause]);
    ResponseTemplate::new(400).set_body_json(json!({"error": error, "status": 400}))
}

/// A request the user's roles do not allow: 403 `security_exception`,
/// naming the privileges that would.
pub fn unauthorized(action: &str, index: &str, privileges: &str) -> ResponseTemplate {
    let cause = json!({"type": "security_exception",
        "reason": format!("action [{action}] is unauthorized for user [denorm] with effective roles [denorm_worker] on indices [{index}], this action is granted by the index privileges [{privileges}]")});
    ResponseTemplate::new(403).set_body_json(json!({"error": {"root_cause": [cause.clone()], "type": cause["type"], "reason": cause["reason"]}, "status": 403}))
}

/// `POST /_security/user/_has_privileges`: what the user has of what
/// was asked.
pub fn has_privileges(user: &str, cluster: &[(&str, bool)], names: &str, index: &[(&str, bool)]) -> ResponseTemplate {
    let all = cluster.iter().chain(index).all(|(_, granted)| *granted);
    let cluster: serde_json::Map<String, Value> = cluster.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    let index: serde_json::Map<String, Value> = index.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    ResponseTemplate::new(200).set_body_json(json!({"username": user, "has_all_requested": all, "cluster": cluster,
        "index": {names: index}, "application": {}}))
}

/// `GET /`: the cluster's name and version (`distribution` is set by
/// OpenSearch only).
pub fn root(number: &str, distribution: Option<&str>) -> ResponseTemplate {
    let mut version = json!({"number": number, "build_flavor": "default", "build_type": "docker",
        "build_hash": "2a8b2f7aa9a2bd4e16af0b3ef7d2f59e0fd2ecb2", "build_date": "2024-08-05T10:05:34.233336849Z", "build_snapshot": false,
        "lucene_version": "9.11.1", "minimum_wire_compatibility_version": "7.17.0", "minimum_index_compatibility_version": "7.0.0"});
    if let Some(d) = distribution {
        version["distribution"] = json!(d);
        version.as_object_mut().unwrap().remove("build_flavor");
    }
    ResponseTemplate::new(200).set_body_json(json!({"name": "es-1", "cluster_name": "denorm-test", "cluster_uuid": "hP2l3Fh6QPaKc4Zb2cFjTw",
        "version": version, "tagline": "You Know, for Search"}))
}

/// A request naming a missing index or alias: 404
/// `index_not_found_exception`.
/// `GET /_alias/<name>` of an alias that does not exist.
pub fn alias_missing(name: &str) -> ResponseTemplate {
    ResponseTemplate::new(404).set_body_json(json!({"error": format!("alias [{name}] missing"), "status": 404}))
}

pub fn index_not_found(name: &str) -> ResponseTemplate {
    let cause = json!({"type": "index_not_found_exception", "reason": format!("no such index [{name}]"), "resource.type": "index_or_alias",
                       "resource.id": name, "index_uuid": "_na_", "index": name});
    let mut error = cause.clone();
    error["root_cause"] = json!([cause]);
    ResponseTemplate::new(404).set_body_json(json!({"error": error, "status": 404}))
}

/// `POST /<prefix>-meta/_doc/<id>` or `_create/<id>` done: created
/// (`seq` 0) or updated to `seq`.
pub fn meta_written(id: &str, seq: i64) -> ResponseTemplate {
    let (status, result) = if seq == 0 { (201, "created") } else { (200, "updated") };
    ResponseTemplate::new(status).set_body_json(json!({"_index": "denorm-meta", "_id": id, "_version": seq + 1, "result": result,
        "_shards": {"total": 2, "successful": 1, "failed": 0}, "_seq_no": seq, "_primary_term": 1}))
}

/// `DELETE /<index>/_doc/<id>`: deleted (200) or not found (404, the
/// same body with `result: not_found`).
pub fn doc_deleted(index: &str, id: &str, seq: i64, found: bool) -> ResponseTemplate {
    let (status, result) = if found { (200, "deleted") } else { (404, "not_found") };
    ResponseTemplate::new(status).set_body_json(json!({"_index": index, "_id": id, "_version": seq + 1, "result": result,
        "_shards": {"total": 2, "successful": 1, "failed": 0}, "_seq_no": seq, "_primary_term": 1}))
}

/// [`meta_written`] of a document created.
pub fn meta_created(id: &str) -> ResponseTemplate {
    meta_written(id, 0)
}

/// One `_bulk` item, keyed by its action: done (2xx), or refused with
/// Elasticsearch 8's error for the status (409, 429, 503, 400).
pub fn bulk_item(action: &str, id: &str, status: u16) -> Value {
    let error = |t: &str, reason: String| json!({"type": t, "reason": reason, "index_uuid": "aAsFqTI0Tc2W0LCWgPNrOA", "shard": "0", "index": "denorm-files-000001"});
    let error = match status {
        200..=299 => {
            let mut v = bulk_item_ok(action, id, 0);
            v[action]["status"] = json!(status);
            if status == 201 {
                v[action]["result"] = json!("created");
            }
            return v;
        }
        409 => return bulk_item_version_conflict(action, id, 5, 7),
        429 => {
            json!({"type": "es_rejected_execution_exception", "reason": "rejected execution of coordinating operation [coordinating_and_primary_bytes=0, replica_bytes=0, all_bytes=0, coordinating_operation_bytes=52428800, max_coordinating_and_primary_bytes=52428800]"})
        }
        503 => error(
            "unavailable_shards_exception",
            "[denorm-files-000001][0] primary shard is not active Timeout: [1m], request: [BulkShardRequest [[denorm-files-000001][0]] containing [1] requests]".into(),
        ),
        // Since 8.7 (mapper_parsing_exception before).
        400 => error("document_parsing_exception", format!("[1:21] failed to parse field [dob] of type [date] in document with id '{id}'. Preview of field's value: 'not a date'")),
        other => panic!("no recording of a bulk item with status {other}"),
    };
    json!({action: {"_index": "denorm-files-000001", "_id": id, "status": status, "error": error}})
}

/// `_bulk` item refused with 409 because the document changed since it
/// was read (`if_seq_no`/`if_primary_term`), keyed by its action.
pub fn bulk_item_version_conflict(action: &str, id: &str, required_seq: i64, current_seq: i64) -> Value {
    json!({action: {
        "_index": "denorm-files-000001", "_id": id, "status": 409,
        "error": {
            "type": "version_conflict_engine_exception",
            "reason": format!("[{id}]: version conflict, required seqNo [{required_seq}], primary term [1]. current document has seqNo [{current_seq}] and primary term [1]"),
            "index_uuid": "aAsFqTI0Tc2W0LCWgPNrOA", "shard": "0", "index": "denorm-files-000001"
        }
    }})
}

/// `_bulk` item done, keyed by its action.
pub fn bulk_item_ok(action: &str, id: &str, seq: i64) -> Value {
    let (result, status) = match action {
        "create" => ("created", 201),
        "delete" => ("deleted", 200),
        _ => ("updated", 200),
    };
    json!({action: {"_index": "denorm-files-000001", "_id": id, "_version": 2, "result": result,
        "_shards": {"total": 2, "successful": 1, "failed": 0}, "_seq_no": seq, "_primary_term": 1, "status": status}})
}

/// A `_bulk` response of `items`.
pub fn bulk(items: Vec<Value>) -> ResponseTemplate {
    let errors = items.iter().any(|i| i.as_object().and_then(|o| o.values().next()).and_then(|v| v["status"].as_u64()).unwrap_or(200) >= 300);
    ResponseTemplate::new(200).set_body_json(json!({"took": 4, "errors": errors, "items": items}))
}

/// `GET /<index>/_doc/<id>` of an existing file document.
pub fn get_doc(id: &str, seq: i64, source: Value) -> ResponseTemplate {
    get_doc_in("denorm-files-000001", id, seq, source)
}

/// `GET /<index>/_doc/<id>` of an existing document of `index`.
pub fn get_doc_in(index: &str, id: &str, seq: i64, source: Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({"_index": index, "_id": id, "_version": seq + 1,
        "_seq_no": seq, "_primary_term": 1, "found": true, "_source": source}))
}

/// `GET /<index>/_doc/<id>` of a missing document.
pub fn doc_missing(index: &str, id: &str) -> ResponseTemplate {
    ResponseTemplate::new(404).set_body_json(json!({"_index": index, "_id": id, "found": false}))
}

/// `POST /_search` with a point in time whose search context expired
/// (keep-alive elapsed, or the node restarted): 404.
pub fn search_context_missing() -> ResponseTemplate {
    let cause = json!({"type": "search_context_missing_exception", "reason": "No search context found for id [2719]"});
    ResponseTemplate::new(404).set_body_json(json!({
        "error": {
            "root_cause": [cause],
            "type": "search_phase_execution_exception", "reason": "all shards failed", "phase": "query", "grouped": true,
            "failed_shards": [{"shard": -1, "index": null, "reason": cause}],
            "caused_by": cause
        },
        "status": 404
    }))
}

/// A page of a point-in-time search.
pub fn search_page(hits: Vec<Value>) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(search_response(Some("pit-1"), hits))
}

/// A complete `_search` response (`pit` set for point-in-time searches).
pub fn search_response(pit: Option<&str>, hits: Vec<Value>) -> Value {
    let mut v = json!({"took": 3, "timed_out": false,
        "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
        "hits": {"total": {"value": hits.len(), "relation": "eq"}, "max_score": null, "hits": hits}});
    if let Some(pit) = pit {
        v["pit_id"] = json!(pit);
    }
    v
}

/// `_search` refused: 400 `search_phase_execution_exception`, here for a
/// query on a field that cannot be searched.
pub fn search_bad_request() -> ResponseTemplate {
    let cause = json!({"type": "query_shard_exception", "reason": "failed to create query: Cannot search on field [contents] since it is not indexed.",
                       "index_uuid": "aAsFqTI0Tc2W0LCWgPNrOA", "index": "denorm-files-000001"});
    ResponseTemplate::new(400).set_body_json(json!({"error": {"root_cause": [cause], "type": "search_phase_execution_exception",
        "reason": "all shards failed", "phase": "query", "grouped": true,
        "failed_shards": [{"shard": 0, "index": "denorm-files-000001", "node": "b2RGA5HWTWK6Eg1bXWb7zA", "reason": cause}]}, "status": 400}))
}

/// A page answered by only some shards (`allow_partial_search_results`
/// defaults to true): the other shards' matches are missing.
pub fn search_page_partial(hits: Vec<Value>) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({"pit_id": "pit-1", "took": 3, "timed_out": false,
        "_shards": {"total": 2, "successful": 1, "skipped": 0, "failed": 1, "failures": [{
            "shard": 1, "index": "denorm-files-000001", "node": "b2RGA5HWTWK6Eg1bXWb7zA",
            "reason": {"type": "node_not_connected_exception", "reason": "[es-2][10.0.0.7:9300] Node not connected"}}]},
        "hits": {"total": {"value": hits.len(), "relation": "eq"}, "max_score": null, "hits": hits}}))
}
