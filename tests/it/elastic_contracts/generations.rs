//! Generations (`denorm rebuild` on Elasticsearch): concrete indexes per
//! generation, write aliases, the atomic alias swap and the meta documents.

use super::*;
use denorm::index::generations::{ElasticGenerations, Generations, State};
use denorm::index::{Backend, Doc, FileDoc};

fn ok(body: Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(body)
}

fn file(id: &str, pos: u64) -> Doc {
    Doc::File(FileDoc::at(id, "/a/b.txt", "c", pos))
}

#[test]
fn a_shard_reads_and_writes_only_through_its_generations_write_alias() {
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    let b = backend_on(server, rt, 2);
    rt.block_on(async {
        Mock::given(method("POST"))
            .and(path("/denorm-meta/_mget"))
            .respond_with(ok(json!({"docs": [
                {"_index": "denorm-meta", "_id": "g2-p0", "_version": 1, "_seq_no": 0, "_primary_term": 1, "found": true, "_source": {"topic": "t", "applied": 7, "parked": []}}
            ]})))
            .mount(server)
            .await;
        Mock::given(method("GET"))
            .and(path("/denorm-meta/_doc/g2-p0"))
            .respond_with(recorded::get_doc_in("denorm-meta", "g2-p0", 0, json!({"topic": "t", "applied": 7, "parked": []})))
            .mount(server)
            .await;
        Mock::given(method("GET"))
            .and(path("/denorm-files-g2/_doc/f1"))
            .respond_with(ResponseTemplate::new(404).set_body_json(json!({"_index": "denorm-files-000003", "_id": "f1", "found": false})))
            .mount(server)
            .await;
        Mock::given(method("POST")).and(path("/_bulk")).respond_with(bulk_ok).mount(server).await;
        Mock::given(method("POST")).and(path("/denorm-meta/_doc/g2-p0")).respond_with(recorded::meta_created("g2-p0")).mount(server).await;
    });
    assert_eq!(b.generation().unwrap(), 2);
    assert_eq!(b.checkpoints(&[0]).unwrap()[&0].offset, 7, "generation 2's checkpoint");
    let mut shard = b.open_shard(0).unwrap();
    assert_eq!((shard.generation(), shard.applied()), (2, Some(7)));
    assert_eq!(shard.get(Kind::File, "f1").unwrap(), None);
    shard.create(file("f1", 8)).unwrap();
    shard.mark_applied(Checkpoint::new(8, 1));
    shard.commit().unwrap();

    let reqs = rt.block_on(server.received_requests()).unwrap();
    let bulk = reqs.iter().find(|r| r.url.path() == "/_bulk").expect("a bulk request");
    assert!(bulk.url.query().unwrap_or("").contains("require_alias=true"), "writes never let Elasticsearch create an index: {}", bulk.url);
    assert_eq!(ndjson(bulk)[0]["create"]["_index"], "denorm-files-g2");
    let writes: Vec<&Request> = reqs.iter().filter(|r| r.url.path() == "/denorm-meta/_doc/g2-p0" && r.method.as_str() == "POST").collect();
    assert_eq!(writes.len(), 2, "the claim when the shard opened, then the checkpoint");
    let claim: Value = serde_json::from_slice(&writes[0].body).unwrap();
    assert_eq!((claim["owner"].as_u64(), claim["applied"].as_u64()), (Some(1), Some(7)), "the claim keeps the checkpoint");
    assert!(writes[0].url.query().unwrap_or("").contains("if_seq_no=0"), "conditional on the version read: {}", writes[0].url);
    assert_eq!(serde_json::from_slice::<Value>(&writes[1].body).unwrap()["applied"], 8);
    let paths: Vec<&str> = reqs.iter().map(|r| r.url.path()).collect();
    assert!(!paths.iter().any(|p| p.starts_with("/denorm-files/_doc") || *p == "/denorm-meta/_doc/p0"), "nothing of the read alias or generation 0: {paths:?}");
    assert_eq!(paths.iter().filter(|p| **p == "/_alias/denorm-files").count(), 1, "the generation is read once per second, not per call: {paths:?}");
}

#[test]
fn a_generation_whose_alias_is_gone_fails_retryably_and_is_never_read_as_empty() {
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    let b = d.backend();
    rt.block_on(async {
        Mock::given(method("GET")).and(path("/denorm-meta/_doc/p0")).respond_with(recorded::doc_missing("denorm-meta", "p0")).mount(server).await;
        Mock::given(method("GET")).and(path("/denorm-files-g0/_doc/f1")).respond_with(recorded::index_not_found("denorm-files-g0")).mount(server).await;
        Mock::given(method("POST"))
            .and(path("/_bulk"))
            .respond_with(ok(json!({"took": 1, "errors": true, "items": [
                {"index": {"_index": "denorm-files-g0", "_id": "f2", "status": 404, "error": {"type": "index_not_found_exception",
                  "reason": "no such index [[require_alias] request flag is [true] and [denorm-files-g0] is not an alias]", "index": "denorm-files-g0"}}}
            ]})))
            .mount(server)
            .await;
    });
    let mut shard = b.open_shard(0).unwrap();
    let err = shard.get(Kind::File, "f1").unwrap_err();
    assert!(err.is_retryable() && err.to_string().contains("index gone"), "a missing alias is not a missing document: {err}");
    shard.put(file("f2", 3)).unwrap();
    shard.mark_applied(Checkpoint::new(3, 1));
    let err = shard.commit().unwrap_err();
    assert!(err.is_retryable() && err.to_string().contains("denorm-files-g0"), "{err}");
    let reqs = rt.block_on(server.received_requests()).unwrap();
    assert_eq!(reqs.iter().filter(|r| r.url.path() == "/_bulk").count(), 1, "a gone generation is not retried in place");
    assert!(!reqs.iter().any(|r| r.url.path().starts_with("/denorm-meta/_doc/p0") && r.method.as_str() != "GET"), "no checkpoint written");
}

#[test]
fn a_rebuild_creates_its_generation_records_its_log_and_swaps_every_alias_in_one_request() {
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    let gens = ElasticGenerations { backend: d.backend() };
    rt.block_on(async {
        for kind in ["files", "users", "posts"] {
            Mock::given(method("PUT"))
                .and(path(format!("/denorm-{kind}-000002")))
                .respond_with(ok(json!({"acknowledged": true, "shards_acknowledged": true, "index": format!("denorm-{kind}-000002")})))
                .up_to_n_times(1)
                .mount(server)
                .await;
            // A resumed rebuild finds it there.
            Mock::given(method("PUT"))
                .and(path(format!("/denorm-{kind}-000002")))
                .respond_with(ResponseTemplate::new(400).set_body_json(json!({"error": {"type": "resource_already_exists_exception",
                    "reason": format!("index [denorm-{kind}-000002/abc] already exists")}, "status": 400})))
                .mount(server)
                .await;
        }
        Mock::given(method("POST")).and(path("/denorm-meta/_doc/g1-log")).respond_with(recorded::meta_created("g1-log")).mount(server).await;
        Mock::given(path("/denorm-files-g1,denorm-users-g1,denorm-posts-g1/_refresh")).respond_with(ok(json!({"_shards": {"total": 6, "successful": 3, "failed": 0}}))).mount(server).await;
        Mock::given(method("POST")).and(path("/_aliases")).respond_with(ok(json!({"acknowledged": true, "errors": false}))).mount(server).await;
        mount_settings(server, "1").await;
        // The old generation's aliases, a tenant's filtered ones among
        // them (issue 47), as Elasticsearch lists them.
        for kind in ["files", "users", "posts"] {
            let index = format!("denorm-{kind}-000001");
            let aliases = json!({index.clone(): {"aliases": {
                format!("denorm-{kind}"): {"filter": {"bool": {"must_not": [{"term": {"denorm_deleted": true}}]}}, "is_write_index": true},
                format!("denorm-{kind}-g0"): {},
                format!("denorm-t-acme-{kind}"): {"filter": {"term": {"tenant": "acme"}}, "index_routing": "acme", "search_routing": "acme"}
            }}});
            Mock::given(method("GET")).and(path(format!("/{index}/_alias"))).respond_with(ok(aliases)).with_priority(1).mount(server).await;
        }
    });
    gens.prepare(1).unwrap();
    gens.prepare(1).unwrap();
    gens.cut_over(0, 1, 4).unwrap();

    let reqs = rt.block_on(server.received_requests()).unwrap();
    let created: Value = serde_json::from_slice(&reqs.iter().find(|r| r.url.path() == "/denorm-files-000002").unwrap().body).unwrap();
    assert_eq!(created["aliases"], json!({"denorm-files-g1": {}}), "only its write alias: searches must not see it before the cutover");
    assert_eq!(created["mappings"], mapping::mapping(Kind::File));
    assert_eq!(created["settings"], mapping::settings());
    let order: Vec<&str> = reqs.iter().map(|r| r.url.path()).filter(|p| !p.ends_with("_alias")).collect();
    let at = |p: &str| order.iter().position(|x| x.contains(p)).unwrap_or_else(|| panic!("{p} in {order:?}"));
    assert!(at("g1-log") < at("_refresh") && at("_refresh") < at("/_aliases"), "log recorded, then refreshed, then swapped: {order:?}");
    let log: Value = serde_json::from_slice(&reqs[reqs.iter().position(|r| r.url.path().ends_with("g1-log")).unwrap()].body).unwrap();
    assert_eq!(log, json!({"topic": "t", "partitions": 4}));
    // Built without refreshes or replicas, then given the live
    // generation's back (and checked) before anything searches it.
    let bodies = |p: &str| -> Vec<Value> { reqs.iter().filter(|r| r.method.as_str() == "PUT" && r.url.path() == p).map(|r| serde_json::from_slice(&r.body).unwrap()).collect() };
    assert_eq!(bodies("/denorm-files-000002,denorm-users-000002,denorm-posts-000002/_settings"), vec![json!({"index": {"refresh_interval": "-1", "number_of_replicas": 0}}); 2]);
    assert_eq!(bodies("/denorm-files-000002/_settings"), vec![json!({"index.refresh_interval": null, "index.number_of_replicas": "1"})]);
    let restored = order.iter().position(|p| *p == "/denorm-posts-000002/_settings/index.refresh_interval,index.number_of_replicas").expect("read back");
    assert!(restored < at("_refresh"), "restored and read back before the cutover: {order:?}");
    let swaps: Vec<&Request> = reqs.iter().filter(|r| r.url.path() == "/_aliases").collect();
    assert_eq!(swaps.len(), 1, "one atomic request");
    let actions: Value = serde_json::from_slice(&swaps[0].body).unwrap();
    let actions = actions["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 15);
    for kind in ["files", "users", "posts"] {
        for expected in [
            // A tenant's filtered alias moves with its filter and routing.
            json!({"remove": {"index": format!("denorm-{kind}-000001"), "alias": format!("denorm-t-acme-{kind}")}}),
            json!({"add": {"index": format!("denorm-{kind}-000002"), "alias": format!("denorm-t-acme-{kind}"), "filter": {"term": {"tenant": "acme"}}, "index_routing": "acme", "search_routing": "acme"}}),
            json!({"remove": {"index": format!("denorm-{kind}-000001"), "alias": format!("denorm-{kind}")}}),
            // The read alias hides tombstones (review of Elasticsearch, F13).
            json!({"add": {"index": format!("denorm-{kind}-000002"), "alias": format!("denorm-{kind}"), "is_write_index": true, "filter": {"bool": {"must_not": [{"term": {"denorm_deleted": true}}]}}}}),
            json!({"remove": {"index": format!("denorm-{kind}-000001"), "alias": format!("denorm-{kind}-g0")}}),
        ] {
            assert!(actions.contains(&expected), "{expected} in {actions:?}");
        }
    }
}

#[test]
fn the_old_generation_and_its_meta_documents_are_deleted_and_the_state_survives_a_restart() {
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    let gens = ElasticGenerations { backend: backend_on(server, rt, 1) };
    rt.block_on(async {
        Mock::given(method("GET"))
            .and(path("/denorm-files-*/_alias"))
            .respond_with(ok(json!({
                "denorm-files-000001": {"aliases": {}},
                "denorm-files-000002": {"aliases": {"denorm-files": {"is_write_index": true}, "denorm-files-g1": {}}}
            })))
            .mount(server)
            .await;
        Mock::given(method("GET")).and(path("/denorm-meta/_doc/log")).respond_with(recorded::get_doc_in("denorm-meta", "log", 0, json!({"topic": "t", "partitions": 2}))).mount(server).await;
        mount_no_models(server).await;
        Mock::given(method("DELETE")).and(path("/denorm-files-000001,denorm-users-000001,denorm-posts-000001")).respond_with(ok(json!({"acknowledged": true}))).mount(server).await;
        // p0 names its parked keys (review F12), deleted with it; p1 has
        // no meta document.
        Mock::given(method("GET"))
            .and(path("/denorm-meta/_doc/p0"))
            .respond_with(recorded::get_doc_in("denorm-meta", "p0", 4, json!({"topic": "t", "applied": 9, "parked_ref": "p0-parked-3-1"})))
            .mount(server)
            .await;
        Mock::given(method("GET")).and(path("/denorm-meta/_doc/p1")).respond_with(recorded::doc_missing("denorm-meta", "p1")).mount(server).await;
        for id in ["p0", "p1", "log", "p0-parked-3-1"] {
            Mock::given(method("DELETE")).and(path(format!("/denorm-meta/_doc/{id}"))).respond_with(ok(json!({"_id": id, "result": "deleted"}))).expect(1).mount(server).await;
        }
        Mock::given(method("POST")).and(path("/denorm-meta/_doc/rebuild")).respond_with(recorded::meta_created("rebuild")).mount(server).await;
        Mock::given(method("GET"))
            .and(path("/denorm-meta/_doc/rebuild"))
            .respond_with(recorded::get_doc_in("denorm-meta", "rebuild", 0, json!({"generation": 2, "group": "g.rebuild-2"})))
            .mount(server)
            .await;
    });
    assert_eq!(gens.current().unwrap(), 1);
    assert_eq!(gens.list().unwrap(), vec![0, 1]);
    gens.remove(0, 6).unwrap();
    gens.save_state(&State { generation: 2, group: "g.rebuild-2".into(), ..Default::default() }).unwrap();
    let state = gens.state().unwrap().expect("state read back");
    assert_eq!((state.generation, state.group.as_str()), (2, "g.rebuild-2"));

    let reqs = rt.block_on(server.received_requests()).unwrap();
    let deleted = reqs.iter().find(|r| r.method.as_str() == "DELETE" && r.url.path().contains("-000001")).expect("indexes deleted");
    assert!(deleted.url.query().unwrap_or("").contains("ignore_unavailable=true"), "{}", deleted.url);
    // The generation's own partition count (2), not the topic's now (6).
    assert!(!reqs.iter().any(|r| r.url.path() == "/denorm-meta/_doc/p2"), "only the old generation's partitions");
    let saved: Value = serde_json::from_slice(&reqs.iter().find(|r| r.method.as_str() == "POST" && r.url.path().ends_with("/rebuild")).unwrap().body).unwrap();
    assert_eq!(saved, json!({"generation": 2, "group": "g.rebuild-2"}));
}

/// The settings of generations 0 (`denorm-*-000001`, with `replicas`
/// replicas, no refresh interval set, as Elasticsearch creates it) and 1,
/// which answers what was put last.
async fn mount_settings(server: &MockServer, replicas: &str) {
    let names = "index.refresh_interval,index.number_of_replicas";
    for kind in ["files", "users", "posts"] {
        let live = format!("denorm-{kind}-000001");
        Mock::given(method("GET")).and(path(format!("/{live}/_settings/{names}"))).respond_with(ok(json!({ live.clone(): {"settings": {"index.number_of_replicas": replicas}}}))).mount(server).await;
        let new = format!("denorm-{kind}-000002");
        Mock::given(method("PUT")).and(path(format!("/{new}/_settings"))).respond_with(ok(json!({"acknowledged": true}))).mount(server).await;
        Mock::given(method("GET")).and(path(format!("/{new}/_settings/{names}"))).respond_with(ok(json!({ new.clone(): {"settings": {"index.number_of_replicas": replicas}}}))).mount(server).await;
    }
    Mock::given(method("PUT")).and(path("/denorm-files-000002,denorm-users-000002,denorm-posts-000002/_settings")).respond_with(ok(json!({"acknowledged": true}))).mount(server).await;
    mount_no_models(server).await;
}

/// Generations 0 and 1 record no model: they hold the compiled-in kinds
/// alone.
async fn mount_no_models(server: &MockServer) {
    for id in ["model", "g1-model"] {
        Mock::given(method("GET")).and(path(format!("/denorm-meta/_doc/{id}"))).respond_with(recorded::doc_missing("denorm-meta", id)).mount(server).await;
    }
}

/// A generation whose bulk-load settings did not take back the live
/// generation's (a settings request refused in part, a cluster-level
/// template overriding it) is not cut over to.
#[test]
fn a_generation_left_on_its_bulk_load_settings_is_not_cut_over_to() {
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    let gens = ElasticGenerations { backend: d.backend() };
    rt.block_on(async {
        // Its files index still has no refreshes after the restore.
        let names = "index.refresh_interval,index.number_of_replicas";
        Mock::given(method("GET"))
            .and(path(format!("/denorm-files-000002/_settings/{names}")))
            .respond_with(ok(json!({"denorm-files-000002": {"settings": {"index.number_of_replicas": "1", "index.refresh_interval": "-1"}}})))
            .with_priority(1)
            .mount(server)
            .await;
        mount_settings(server, "1").await;
        Mock::given(method("POST")).and(path("/_aliases")).respond_with(ok(json!({"acknowledged": true, "errors": false}))).expect(0).mount(server).await;
    });
    let err = gens.cut_over(0, 1, 4).unwrap_err();
    assert!(format!("{err:#}").contains("denorm-files-000002 kept the settings"), "{err:#}");
    rt.block_on(server.verify());
}
