//! A model's searches on both backends, from `tests/fixtures/`: the same
//! log of the shop model, the same searches, the same answers.
//!
//! On the embedded index, a model's tantivy schema
//! (`denorm::index::embedded::model`), in two tenants.
//!
//! On Elasticsearch, a model's mapping (`denorm::index::elastic::model`)
//! on the suite's Elasticsearch-API server (noida-db): the shop model's kinds take their
//! mappings, the reference model's documents index under them, and the
//! searches a model promises find what they should: one nested object at
//! a time, copies by their owner's current value, paths by an ancestor,
//! text by its analyzer (`tests/fixtures/shop-searches.json`, which the
//! embedded index runs too), dates by range; a stray field is refused.

use std::collections::BTreeMap;

use serde_json::{json, Value as Json};

use crate::common::elastic::{elastic, prefix};
use crate::common::rt;
use denorm::command::generic::jsonl::parse_all;
use denorm::command::generic::value::document_json;
use denorm::command::generic::Value;
use denorm::domain::Domain;
use denorm::index::elastic::{mapping::settings, model};
use denorm::index::filter::Filter;
use denorm::model::generic::ModelReference;

/// One search of `tests/fixtures/shop-searches.json`, run on both backends.
#[derive(serde::Deserialize)]
struct Search {
    kind: String,
    filters: Vec<Filter>,
    ids: Vec<String>,
    #[serde(default)]
    why: String,
}

#[test]
fn a_models_mapping_indexes_its_documents_and_answers_its_searches() {
    let es = elastic();
    let d = Domain::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/shop.toml")).unwrap();
    let mut reference = ModelReference::new(d.clone());
    let log = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/shop-example.jsonl")).unwrap();
    for e in parse_all(&d, log.as_bytes()).unwrap() {
        reference.apply(&e);
    }
    let index = |kind: &str| format!("{}-model-shop-{kind}", prefix());
    let client = reqwest::Client::new();
    let url = es.url.clone();
    // One runtime for the request and its body: a response read on
    // another runtime than the one that sent it loses its connection.
    let runtime = rt();
    let send = |method: reqwest::Method, path: String, body: Json| -> (u16, Json) {
        runtime.block_on(async {
            let r = client.request(method, format!("{url}/{path}")).json(&body).send().await.unwrap();
            let status = r.status().as_u16();
            let text = r.text().await.unwrap();
            (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {status} with a body that is not JSON ({e}): {text}")))
        })
    };
    for kind in denorm::index::ModelKind::all(d.clone().interned()) {
        let (status, body) =
            send(reqwest::Method::PUT, index(kind.as_str()), json!({ "settings": settings(), "mappings": denorm::index::elastic::mapping::mapping(denorm::index::Kind::Model(kind)) }));
        assert_eq!(status, 200, "{}: {body}", kind.as_str());
    }
    for (k, doc) in reference.docs() {
        let (status, body) = send(reqwest::Method::PUT, format!("{}/_doc/{}?refresh=true", index(&k.kind), k.id), document_json(&k.id, &doc.fields, &doc.copies));
        assert!(status == 200 || status == 201, "{k:?}: {body}");
    }
    let ids = |kind: &str, query: Json| -> Vec<String> {
        let (status, body) = send(reqwest::Method::POST, format!("{}/_search", index(kind)), json!({ "query": query, "size": 100 }));
        assert_eq!(status, 200, "{query}: {body}");
        let mut out: Vec<String> = body["hits"]["hits"].as_array().unwrap_or_else(|| panic!("{query}: no hits in {body}")).iter().map(|h| h["_id"].as_str().unwrap().to_string()).collect();
        out.sort();
        out
    };
    let searches: Vec<Search> = serde_json::from_str(&std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/shop-searches.json")).unwrap()).unwrap();
    assert!(searches.len() >= 10);
    for s in &searches {
        assert_eq!(ids(&s.kind, model::query(&s.filters)), s.ids, "{:?} {:?}: {}", s.kind, s.filters, s.why);
    }
    // What the shared searches do not say: a date's range.
    assert_eq!(ids("order", json!({ "range": { "placed": { "gte": "2026-12-01" } } })), ["o1"]);
    let stray = document_json("c9", &BTreeMap::from([("name".into(), Value::Str("X".into())), ("nickname".into(), Value::Str("x".into()))]), &BTreeMap::new());
    let (status, body) = send(reqwest::Method::PUT, format!("{}/_doc/c9", index("customer")), stray);
    assert_eq!(status, 400, "a field the model does not declare is refused: {body}");
}

#[test]
fn the_shop_models_searches_find_on_the_embedded_index_what_they_find_on_elasticsearch() {
    let d = Domain::parse("shop.toml", include_str!("../../models/shop.toml")).unwrap();
    let mut reference = ModelReference::new(d.clone());
    let log = include_str!("../../models/shop-example.jsonl");
    // The same log in tenant acme, whose documents no search of the
    // default tenant may find.
    let acme: String = log.lines().map(|l| l.replacen("{", r#"{"tenant":"acme","#, 1) + "\n").collect();
    for e in parse_all(&d, log.as_bytes()).unwrap().into_iter().chain(parse_all(&d, acme.as_bytes()).unwrap()) {
        reference.apply(&e);
    }
    let schema = denorm::index::embedded::model_schema(d.clone().interned());
    let index = tantivy::Index::create_in_ram(schema.schema());
    let mut writer: tantivy::IndexWriter = index.writer(15_000_000).unwrap();
    for (k, doc) in reference.docs() {
        for t in schema.documents(k.tenant.as_deref(), &k.kind, &k.id, &doc.fields, &doc.copies) {
            writer.add_document(t).unwrap();
        }
    }
    writer.commit().unwrap();
    let searcher = index.reader().unwrap().searcher();
    let searches: Vec<Search> = serde_json::from_str(include_str!("../fixtures/shop-searches.json")).unwrap();
    assert!(searches.len() >= 10);
    for s in &searches {
        assert_eq!(schema.search(&searcher, None, &s.kind, &s.filters).unwrap(), s.ids, "{:?} {:?}: {}", s.kind, s.filters, s.why);
        assert_eq!(schema.search(&searcher, Some("acme"), &s.kind, &s.filters).unwrap(), s.ids, "in tenant acme: {:?} {:?}", s.kind, s.filters);
    }
    // A rewrite replaces the document and its nested objects.
    let (t, kind, id) = (None, "order", "o2");
    writer.delete_term(schema.key_term(t, kind, id));
    writer.delete_term(schema.parent_term(t, kind, id));
    writer.commit().unwrap();
    let searcher = index.reader().unwrap().searcher();
    assert_eq!(schema.search(&searcher, None, "order", &searches[0].filters).unwrap(), Vec::<String>::new());
    assert_eq!(schema.search(&searcher, Some("acme"), "order", &searches[0].filters).unwrap(), ["o2"]);
}
