//! Searches: partial answers, the result window, authors' groups.

use super::*;
use denorm::apply::{apply, FanOut};
use denorm::command::Command;
use denorm::index::Backend;

fn search_index(server: &MockServer, rt: &tokio::runtime::Runtime) -> denorm::index::elastic::search::ElasticSearch {
    denorm::index::elastic::search::ElasticSearch { client: config(server, &[]).client().unwrap(), prefix: "denorm".into(), runtime: rt.handle().clone(), generation: None, model: None }
}

fn searches(server: &MockServer, rt: &tokio::runtime::Runtime) -> Vec<Value> {
    rt.block_on(server.received_requests()).unwrap().iter().filter(|r| r.url.path().ends_with("/_search")).map(|r| serde_json::from_slice(&r.body).unwrap()).collect()
}

/// Issue 27 B8: a user search or grouping some shards did not answer is
/// an error, not a short answer; so is a refresh before a fan-out's scan
/// that some shards missed (the scan could miss earlier writes).
#[test]
fn partial_searches_and_refreshes_are_errors_not_short_answers() {
    use denorm::index::{FileQuery, PostQuery, SearchIndex};
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        for index in ["/denorm-files/_search", "/denorm-posts/_search"] {
            Mock::given(method("POST")).and(path(index)).respond_with(recorded::search_page_partial(vec![])).mount(server).await;
        }
    });
    let es = search_index(server, rt);
    let err = es.files(&FileQuery { text: Some("x".into()), ..Default::default() }, 10, &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("1 of 2 shards failed") && err.to_string().contains("Node not connected"), "{err}");
    let q = PostQuery { text: Some("x".into()), ..Default::default() };
    let err = es.posts_by_author(&q, 0, 3).unwrap_err();
    assert!(err.to_string().contains("1 of 2 shards failed"), "{err}");
    let asked = rt.block_on(server.received_requests()).unwrap();
    assert!(asked.iter().all(|r| r.url.query().unwrap_or("").contains("allow_partial_search_results=false")), "partial results are not asked for");

    let server = rt.block_on(MockServer::start());
    rt.block_on(async {
        Mock::given(path("/denorm-files-g0/_refresh"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"_shards": {"total": 2, "successful": 1, "failed": 1,
                "failures": [{"shard": 1, "index": "denorm-files-000001", "status": "SERVICE_UNAVAILABLE",
                              "reason": {"type": "no_shard_available_action_exception", "reason": "[denorm-files-000001][1] no shard available"}}]}})))
            .mount(&server)
            .await;
        Mock::given(method("POST")).and(path("/denorm-files-g0/_pit")).respond_with(ResponseTemplate::new(200).set_body_json(json!({"id": "pit-1"}))).expect(0).mount(&server).await;
        Mock::given(method("GET"))
            .and(path("/denorm-meta/_doc/p0"))
            .respond_with(ResponseTemplate::new(404).set_body_json(json!({"_index": "denorm-meta", "_id": "p0", "found": false})))
            .mount(&server)
            .await;
    });
    let b = backend(&server, rt);
    let mut shard = b.open_shard(0).unwrap();
    let err = apply(shard.as_mut(), &Command::RenamePath { from: "/c/a".into(), to: "/c/b".into() }, 10, FanOut::pages_of(2)).unwrap_err();
    assert_eq!(err.kind(), denorm::retry::Kind::Transient, "retryable: {err:?}");
    assert!(err.to_string().contains("refreshing before a fan-out") && err.to_string().contains("1 of 2 shards failed"), "{err}");
    rt.block_on(server.verify());
}

/// Finding 9: `--limit` above `index.max_result_window` (10,000) would
/// be refused with 400; it pages through a point in time, best first. The
/// point in time is opened on the current generation's indexes by name
/// (noida-db opens one on a single index of an alias on several).
#[test]
fn a_search_beyond_the_result_window_pages_through_a_point_in_time_best_first() {
    use denorm::index::{FileQuery, SearchIndex};
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        mount_read_alias(server, Kind::File, 0).await;
        mount_meta_writes(server).await;
        Mock::given(method("POST")).and(path("/denorm-files-000001/_pit")).respond_with(ResponseTemplate::new(200).set_body_json(json!({"id": "pit-1"}))).expect(1).mount(server).await;
        Mock::given(method("DELETE")).and(path("/_pit")).respond_with(ResponseTemplate::new(200).set_body_json(json!({"succeeded": true, "num_freed": 1}))).expect(1).mount(server).await;
        Mock::given(method("POST"))
            .and(path("/_search"))
            .respond_with(|req: &Request| {
                let body: Value = serde_json::from_slice(&req.body).unwrap();
                let size = body["size"].as_u64().unwrap();
                let from = body["search_after"][1].as_u64().map_or(0, |a| a + 1);
                let hits = (from..from + size)
                    .map(|i| {
                        json!({"_index": "denorm-files-000001", "_id": format!("f{i}"), "_score": 2.0, "sort": [2.0, i],
                                     "_source": {"id": format!("f{i}"), "name": "a.txt", "path": "/d", "contents": "x", "denorm_pos": 1}})
                    })
                    .collect();
                ResponseTemplate::new(200).set_body_json(recorded::search_response(Some("pit-1"), hits))
            })
            .mount(server)
            .await;
    });
    let mut ids = Vec::new();
    search_index(server, rt).files(&FileQuery { text: Some("x".into()), ..Default::default() }, 15_000, &mut |f| ids.push(f.id)).unwrap();
    assert_eq!(ids.len(), 15_000);
    assert_eq!((ids[0].as_str(), ids[14_999].as_str()), ("f0", "f14999"));
    let searches = searches(server, rt);
    assert!(searches.iter().all(|s| s["size"].as_u64().unwrap() <= 10_000), "no search above the result window");
    assert_eq!(searches[0]["sort"][0], json!({"_score": "desc"}), "best first, as a single search would be");
    assert_eq!(searches[1]["search_after"], json!([2.0, 9999]));
    rt.block_on(server.verify());
}

/// Finding 9: `--per-author` above `index.max_inner_result_window` is
/// refused before any request, with the reason.
#[test]
fn more_posts_per_author_than_elasticsearch_allows_is_refused_with_the_reason() {
    use denorm::index::{PostQuery, SearchIndex};
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    let err = search_index(server, rt).posts_by_author(&PostQuery::default(), 5, 101).unwrap_err();
    assert!(err.to_string().contains("index.max_inner_result_window (100)"), "{err}");
    assert!(rt.block_on(server.received_requests()).unwrap().is_empty());
}

/// Finding 9: every author (`--limit 0`) pages through a composite
/// aggregation instead of stopping silently at 10,000 authors.
#[test]
fn every_author_pages_through_a_composite_aggregation_ordered_by_best_score() {
    use denorm::index::{PostQuery, SearchIndex};
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    let bucket = |i: usize| {
        json!({"key": {"author": format!("author {i:05}")}, "doc_count": 1, "best_score": {"value": (i % 7) as f64},
               "top": {"hits": {"total": {"value": 1, "relation": "eq"}, "max_score": 1.0, "hits": []}}})
    };
    rt.block_on(async {
        Mock::given(method("POST"))
            .and(path("/denorm-posts/_search"))
            .respond_with(move |req: &Request| {
                let body: Value = serde_json::from_slice(&req.body).unwrap();
                let size = body["aggs"]["authors"]["composite"]["size"].as_u64().unwrap() as usize;
                let from = match &body["aggs"]["authors"]["composite"]["after"] {
                    Value::Null => 0,
                    after => after["author"].as_str().unwrap()[7..].parse::<usize>().unwrap() + 1,
                };
                let buckets: Vec<Value> = (from..(from + size).min(1_002)).map(bucket).collect();
                let mut v = recorded::search_response(None, vec![]);
                v["aggregations"] = json!({"authors": {"after_key": buckets.last().map(|b| b["key"].clone()), "buckets": buckets}});
                ResponseTemplate::new(200).set_body_json(v)
            })
            .mount(server)
            .await;
    });
    let groups = search_index(server, rt).posts_by_author(&PostQuery::default(), 0, 3).unwrap();
    assert_eq!(groups.len(), 1_002, "every author, across pages");
    assert!(groups.windows(2).all(|w| w[0].best_score >= w[1].best_score), "ordered by best score");
    assert_eq!(groups[0].author, "author 00006");
    let searches = searches(server, rt);
    assert_eq!(searches.len(), 2);
    assert_eq!(searches[1]["aggs"]["authors"]["composite"]["after"], json!({"author": "author 00999"}));
}

/// A grouped search of a model's kind is one `terms` aggregation, its
/// groups the server's buckets (a boolean's keyed 0 and 1, as
/// Elasticsearch keys them): no document is read, through a point in
/// time or otherwise. A date's groups are counted from the matches.
#[test]
fn a_grouped_search_of_a_models_kind_is_one_terms_aggregation() {
    use denorm::domain::FieldType;
    use denorm::index::group::GroupBy;
    use denorm::index::SearchIndex;
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    let bucket = |key: u64, as_string: &str, n: u64, ids: &[&str]| json!({"key": key, "key_as_string": as_string, "doc_count": n, "top": {"hits": {"hits": ids.iter().map(|i| json!({"_source": {"id": i}})).collect::<Vec<_>>()}}});
    let buckets = vec![bucket(1, "true", 2, &["t1", "t4"]), bucket(0, "false", 1, &["t2"])];
    rt.block_on(async {
        let mut v = recorded::search_response(None, vec![]);
        v["aggregations"] = json!({"groups": {"buckets": buckets, "sum_other_doc_count": 0, "doc_count_error_upper_bound": 0}});
        // No generation yet: the read aliases are searched.
        Mock::given(method("GET")).respond_with(ResponseTemplate::new(404).set_body_json(json!({"error": "alias missing", "status": 404}))).mount(server).await;
        Mock::given(method("POST")).and(path("/denorm-ticket/_search")).respond_with(ResponseTemplate::new(200).set_body_json(v)).mount(server).await;
    });
    let shop = denorm::domain::Domain::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/shop.toml")).unwrap().interned();
    let search = denorm::index::elastic::search::ElasticSearch { model: Some(shop), ..search_index(server, rt) };
    let by = GroupBy { field: "open".into(), ty: FieldType::Boolean, limit: 0, per_group: 2 };
    let groups = search.model_groups(Some("acme"), "ticket", &[], &by).unwrap();
    assert_eq!(groups.iter().map(|g| (g.value.clone(), g.count, g.ids.clone())).collect::<Vec<_>>(), [(json!(true), 2, vec!["t1".to_string(), "t4".into()]), (json!(false), 1, vec!["t2".into()])]);
    let requests = rt.block_on(server.received_requests()).unwrap();
    assert!(requests.iter().all(|r| !r.url.path().contains("_pit")), "no document read");
    let searches = searches(server, rt);
    assert_eq!(searches.len(), 1, "{searches:?}");
    assert_eq!((&searches[0]["size"], &searches[0]["aggs"]["groups"]["terms"]["field"]), (&json!(0), &json!("open")));
    assert!(searches[0]["query"].to_string().contains("acme"), "the tenant's documents: {}", searches[0]["query"]);

    let by_date = GroupBy { field: "since".into(), ty: FieldType::Date, limit: 0, per_group: 2 };
    let _ = search.model_groups(None, "customer", &[], &by_date);
    assert!(rt.block_on(server.received_requests()).unwrap().iter().any(|r| r.url.path().ends_with("/_pit")), "a date's groups read the matches");
}
