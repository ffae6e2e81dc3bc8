//! A model's mapping (`denorm::index::elastic::model`) on the suite's
//! Elasticsearch-API server (noida-db): the shop model's kinds take their
//! mappings, the reference model's documents index under them, and the
//! searches a model promises find what they should: one nested object at
//! a time, copies by their owner's current value, paths by an ancestor,
//! text by its analyzer, dates by range; a stray field is refused.

use std::collections::BTreeMap;

use serde_json::{json, Value as Json};

use crate::common::elastic::{elastic, prefix};
use crate::common::rt;
use denorm::command::generic::jsonl::parse_all;
use denorm::domain::Domain;
use denorm::index::elastic::{mapping::settings, model};
use denorm::model::generic::ModelReference;

const LOG: &str = r#"{"op":"upsert","kind":"customer","id":"c1","fields":{"name":"Ann","plan":"free","since":"2026-01-02"}}
{"op":"upsert","kind":"customer","id":"c2","fields":{"name":"Bo Ek","plan":"free","since":"2025-06-30"}}
{"op":"upsert","kind":"order","id":"o1","fields":{"customer_id":"c1","placed":"2026-12-04T10:00:00Z","status":"open","total":19,"lines":[{"sku":"a-1","quantity":2,"price":4.5},{"sku":"b-2","quantity":5,"price":2}]}}
{"op":"upsert","kind":"order","id":"o2","fields":{"customer_id":"c2","placed":"2026-11-01","status":"open","total":22.5,"lines":[{"sku":"a-1","quantity":5,"price":4.5}]}}
{"op":"patch","kind":"customer","id":"c1","set":{"name":"Ann Lee","plan":"gold"}}
{"op":"upsert","kind":"ticket","id":"t1","fields":{"customer_id":"c1","subject":"The app crashes at start","open":true}}
{"op":"upsert","kind":"product","id":"p7","fields":{"path":"/garden/tools/rake","title":"Steel rake","price":12.5,"stock":3,"tags":["steel","long"]}}
{"op":"rename_prefix","kind":"product","from":"/garden/tools","to":"/garden/kit"}
"#;

#[test]
fn a_models_mapping_indexes_its_documents_and_answers_its_searches() {
    let es = elastic();
    let d = Domain::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/shop.toml")).unwrap();
    let mut reference = ModelReference::new(d.clone());
    for e in parse_all(&d, LOG.as_bytes()).unwrap() {
        reference.apply(&e);
    }
    let index = |kind: &str| format!("{}-model-shop-{kind}", prefix());
    let client = reqwest::Client::new();
    let url = es.url.clone();
    let send = |method: reqwest::Method, path: String, body: Json| {
        let r = rt().block_on(client.request(method, format!("{url}/{path}")).json(&body).send()).unwrap();
        let status = r.status().as_u16();
        (status, rt().block_on(r.json::<Json>()).unwrap_or(Json::Null))
    };
    for kind in &d.kinds {
        let (status, body) = send(reqwest::Method::PUT, index(&kind.name), json!({ "settings": settings(), "mappings": model::mapping(&d, kind) }));
        assert_eq!(status, 200, "{}: {body}", kind.name);
    }
    for (k, doc) in reference.docs() {
        let (status, body) = send(reqwest::Method::PUT, format!("{}/_doc/{}?refresh=true", index(&k.kind), k.id), model::source(&k.id, &doc.fields, &doc.copies));
        assert!(status == 200 || status == 201, "{k:?}: {body}");
    }
    let ids = |kind: &str, query: Json| -> Vec<String> {
        let (status, body) = send(reqwest::Method::POST, format!("{}/_search", index(kind)), json!({ "query": query, "size": 100 }));
        assert_eq!(status, 200, "{query}: {body}");
        let mut out: Vec<String> = body["hits"]["hits"].as_array().unwrap().iter().map(|h| h["_id"].as_str().unwrap().to_string()).collect();
        out.sort();
        out
    };
    let line = |sku: &str, more_than: i64| json!({ "nested": { "path": "lines", "query": { "bool": { "filter": [ { "term": { "lines.sku": sku } }, { "range": { "lines.quantity": { "gt": more_than } } } ] } } } });
    assert_eq!(ids("order", line("a-1", 2)), ["o2"], "o1 has a line of a-1 and a line of quantity 5, not one line of both");
    assert_eq!(ids("order", line("b-2", 2)), ["o1"]);
    assert_eq!(ids("order", json!({ "term": { "customer.name.raw": "Ann Lee" } })), ["o1"], "the copy has the owner's name after its patch");
    assert_eq!(ids("order", json!({ "term": { "customer.name.raw": "Ann" } })), Vec::<String>::new());
    assert_eq!(ids("order", json!({ "term": { "customer.plan": "gold" } })), ["o1"]);
    assert_eq!(ids("ticket", json!({ "term": { "customer.plan": "gold" } })), ["t1"]);
    assert_eq!(ids("order", json!({ "range": { "placed": { "gte": "2026-12-01" } } })), ["o1"]);
    assert_eq!(ids("product", json!({ "term": { "path.tree": "/garden/kit" } })), ["p7"], "renamed, found by its new ancestor");
    assert_eq!(ids("product", json!({ "term": { "path.tree": "/garden/tools" } })), Vec::<String>::new());
    assert_eq!(ids("product", json!({ "term": { "tags": "steel" } })), ["p7"]);
    assert_eq!(ids("customer", json!({ "match": { "name": "lee" } })), ["c1"], "standard: words, lowercased");
    assert_eq!(ids("ticket", json!({ "match": { "subject": "crash" } })), ["t1"], "english: stemmed");
    let stray = model::source("c9", &BTreeMap::from([("name".into(), denorm::command::generic::Value::Str("X".into())), ("nickname".into(), denorm::command::generic::Value::Str("x".into()))]), &BTreeMap::new());
    let (status, body) = send(reqwest::Method::PUT, format!("{}/_doc/c9", index("customer")), stray);
    assert_eq!(status, 400, "a field the model does not declare is refused: {body}");
}
