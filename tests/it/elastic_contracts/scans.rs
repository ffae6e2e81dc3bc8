//! A shard's scans and writes.

use super::*;
use denorm::apply::{apply, FanOut};
use denorm::command::Command;
use denorm::index::elastic::search::{group_by_author_body, parse_groups};
use denorm::index::{Backend, PostQuery};

fn file_hit(id: &str, path: &str, seq: i64, sort: i64) -> Value {
    let (dir, name) = path.rsplit_once('/').unwrap();
    json!({"_index": "denorm-files-000001", "_id": id, "_seq_no": seq, "_primary_term": 1, "_score": null,
           "_source": {"id": id, "name": name, "path": dir, "contents": "c", "denorm_pos": 1}, "sort": [sort]})
}

#[test]
fn rename_pages_through_a_point_in_time_writes_conditionally_and_closes_it() {
    let d = Double::new().pit_scan(1);
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        Mock::given(path("/_search"))
            .respond_with(ResponseTemplate::new(200).set_body_json(recorded::search_response(Some("pit-2"), vec![file_hit("a", "/c/a/1.txt", 5, 1), file_hit("b", "/c/a/x/2.txt", 6, 2)])))
            .up_to_n_times(1)
            .mount(server)
            .await;
        Mock::given(path("/_search")).respond_with(ResponseTemplate::new(200).set_body_json(recorded::search_response(Some("pit-2"), vec![file_hit("c", "/c/a/3.txt", 7, 3)]))).mount(server).await;
        Mock::given(method("POST")).and(path("/_bulk")).respond_with(bulk_ok).mount(server).await;
    });
    let b = d.backend();
    let mut shard = b.open_shard(0).unwrap();
    let cmd = Command::RenamePath { from: "/c/a".into(), to: "/c/b".into() };
    let written = apply(shard.as_mut(), &cmd, 10, FanOut::pages_of(2)).unwrap();
    assert_eq!(written, 3);
    let reqs = rt.block_on(server.received_requests()).unwrap();
    let searches: Vec<Value> = reqs.iter().filter(|r| r.url.path() == "/_search").map(|r| serde_json::from_slice(&r.body).unwrap()).collect();
    assert_eq!(searches.len(), 2);
    assert_eq!(searches[0]["pit"]["id"], "pit-1");
    assert_eq!(searches[0]["size"], 2);
    assert!(searches[0].get("search_after").is_none());
    assert_eq!(searches[1]["pit"]["id"], "pit-2", "the newest pit id is used");
    assert_eq!(searches[1]["search_after"], json!([2]));
    assert_eq!(searches[0]["query"]["bool"]["filter"][0]["bool"]["should"][0]["term"]["path.tree"], "/c/a");
    // The default tenant's documents only (issue 47).
    assert_eq!(searches[0]["query"]["bool"]["filter"][1], json!({"bool": {"must_not": [{"exists": {"field": "tenant"}}]}}));
    let mut bulks: Vec<Vec<Value>> = reqs.iter().filter(|r| r.url.path() == "/_bulk").map(ndjson).collect();
    assert_eq!(bulks.len(), 2, "one bulk request per page");
    // Pages' bulks are in flight together: they may arrive in either
    // order (a CI run received the second page's first).
    bulks.sort_by_key(|b| b[0]["index"]["if_seq_no"].as_i64());
    assert_eq!(bulks[0][0]["index"]["if_seq_no"], 5);
    assert_eq!(bulks[0][1]["path"], "/c/b");
    assert_eq!(bulks[0][1]["denorm_pos"], 10);
    assert_eq!(bulks[0][3]["path"], "/c/b/x");
    let refresh = reqs.iter().position(|r| r.url.path() == "/denorm-files-g0/_refresh").unwrap();
    let pit = reqs.iter().position(|r| r.url.path() == "/denorm-files-g0/_pit").unwrap();
    assert!(refresh < pit, "refresh before the scan: read-your-writes");
}

#[test]
fn closes_the_point_in_time_when_a_page_fails() {
    let d = Double::new().pit_scan(1);
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        Mock::given(path("/_search")).respond_with(recorded::search_bad_request()).mount(server).await;
    });
    let b = d.backend();
    let mut shard = b.open_shard(0).unwrap();
    let cmd = Command::RenamePath { from: "/c/a".into(), to: "/c/b".into() };
    let err = apply(shard.as_mut(), &cmd, 10, FanOut::pages_of(2)).unwrap_err();
    assert!(err.to_string().contains("400"), "{err}");
    // `expect(1)` on DELETE /_pit is verified when the server drops.
    drop(shard);
    rt.block_on(server.verify());
}

#[test]
fn a_stale_write_never_overwrites_a_newer_one() {
    let d = Double::new().pit_scan(0);
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        // The file is absent when read, then another writer creates it
        // at a later position before our create lands.
        Mock::given(method("GET")).and(path("/denorm-files-g0/_doc/f1")).respond_with(ResponseTemplate::new(404).set_body_json(json!({"found": false}))).up_to_n_times(1).mount(server).await;
        Mock::given(method("GET"))
            .and(path("/denorm-files-g0/_doc/f1"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"_index": "denorm-files-000001", "_id": "f1", "found": true, "_seq_no": 9, "_primary_term": 1,
                "_source": {"id": "f1", "name": "n.txt", "path": "/c", "contents": "newer", "denorm_pos": 50}})))
            .mount(server)
            .await;
        Mock::given(method("POST")).and(path("/_bulk")).respond_with(|r: &Request| bulk_reply(r, &[("f1", 409)])).mount(server).await;
        Mock::given(method("POST")).and(path("/denorm-meta/_doc/p0")).respond_with(recorded::meta_written("p0", 1)).mount(server).await;
    });
    let b = d.backend();
    let mut shard = b.open_shard(0).unwrap();
    let cmd = Command::UpsertFile { id: "f1".into(), path: "/c/n.txt".into(), contents: "older".into(), previous_path: None };
    apply(shard.as_mut(), &cmd, 20, FanOut::pages_of(2)).unwrap();
    shard.mark_applied(Checkpoint::new(20, 0));
    shard.commit().unwrap();
    let reqs = rt.block_on(server.received_requests()).unwrap();
    let bulks: Vec<Vec<Value>> = reqs.iter().filter(|r| r.url.path() == "/_bulk").map(ndjson).collect();
    assert_eq!(bulks.len(), 1, "the newer document (position 50) must not be overwritten by position 20");
    assert!(bulks[0][0].get("create").is_some(), "an absent document is created, not blindly indexed: {:?}", bulks[0][0]);
    let meta = reqs.iter().find(|r| r.url.path() == "/denorm-meta/_doc/p0" && r.method.as_str() == "POST").expect("applied position recorded");
    let meta: Value = serde_json::from_slice(&meta.body).unwrap();
    // The progress in the form every backend shares (nothing parked: no
    // `parked`), with the topic and the owner.
    assert_eq!(meta, json!({"topic": "t", "applied": 20, "fingerprint": "0000000000000000", "owner": 1}));
}

#[test]
fn group_by_author_is_a_terms_aggregation_with_top_hits() {
    let body = group_by_author_body(&PostQuery { text: Some("relationships".into()), ..Default::default() }, 3, 2);
    assert_eq!(body["size"], 0);
    assert_eq!(body["aggs"]["authors"]["terms"]["field"], "user.name.raw");
    assert_eq!(body["aggs"]["authors"]["terms"]["order"], json!({"best_score": "desc"}));
    assert_eq!(body["aggs"]["authors"]["aggs"]["top"]["top_hits"]["size"], 2);
    let response = json!({"hits": {"hits": []}, "aggregations": {"authors": {"buckets": [
        {"key": "John Smith", "doc_count": 3, "best_score": {"value": 4.5}, "top": {"hits": {"hits": [
            {"_id": "2", "_score": 4.5, "_source": {"id": "2", "title": "Relationships", "body": "It's complicated", "user": {"id": "1", "name": "John Smith"}, "denorm_pos": 3}}
        ]}}},
        {"key": "Ann Lee", "doc_count": 1, "best_score": {"value": 1.5}, "top": {"hits": {"hits": []}}}
    ]}}});
    let groups = parse_groups(&response);
    assert_eq!(groups.iter().map(|g| (g.author.as_str(), g.best_score)).collect::<Vec<_>>(), [("John Smith", 4.5), ("Ann Lee", 1.5)]);
    assert_eq!(groups[0].posts[0].title, "Relationships");
    assert_eq!(groups[0].posts[0].user.name, "John Smith");
}

/// Review of verify, S8: a dump (`by_id`, what a verify reads) took a page
/// shorter than the size asked for as the end. A server or proxy that caps
/// `size` below 1000 ended the dump early, and every later document was
/// "missing". It reads on until a page is empty now.
#[test]
fn a_dump_reads_on_past_a_short_page() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(MockServer::start());
    rt.block_on(async {
        Mock::given(method("POST")).and(path("/idx/_pit")).respond_with(ResponseTemplate::new(200).set_body_json(json!({"id": "pit-1"}))).mount(&server).await;
        // A server that answers at most two hits a page.
        for page in [vec![file_hit("a", "/c/a.txt", 1, 1), file_hit("b", "/c/b.txt", 2, 2)], vec![file_hit("c", "/c/c.txt", 3, 3)], vec![]] {
            Mock::given(path("/_search")).respond_with(ResponseTemplate::new(200).set_body_json(recorded::search_response(Some("pit-1"), page))).up_to_n_times(1).mount(&server).await;
        }
    });
    let transport = elasticsearch::http::transport::Transport::single_node(&server.uri()).unwrap();
    let client = elasticsearch::Elasticsearch::new(transport);
    let ids = rt.block_on(async {
        let mut scan = denorm::index::elastic::docs::PitScan::open(&client, "idx", json!({"match_all": {}}), 1000).await.unwrap().by_id();
        let mut ids = Vec::new();
        loop {
            let page = scan.next_page().await.unwrap();
            if page.is_empty() {
                break ids;
            }
            ids.extend(page.into_iter().map(|h| h.id));
        }
    });
    assert_eq!(ids, vec!["a", "b", "c"], "the dump ended at the first short page");
}
