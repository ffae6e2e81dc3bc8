//! Startup against a cluster: indexes behind aliases with the mapping,
//! privileges, existing indexes and mappings, credentials, versions, and
//! the search CLI's JSON contract.

use super::*;

#[tokio::test]
async fn creates_indexes_behind_aliases_with_the_mapping() {
    let server = MockServer::start().await;
    Mock::given(method("GET")).and(path("/")).respond_with(recorded::root("8.15.0", None)).mount(&server).await;
    for kind in ["files", "users", "posts"] {
        Mock::given(method("GET")).and(path(format!("/_alias/denorm-{kind}"))).respond_with(recorded::alias_missing(&format!("denorm-{kind}"))).mount(&server).await;
        Mock::given(method("PUT"))
            .and(path(format!("/denorm-{kind}-000001")))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"acknowledged": true, "shards_acknowledged": true, "index": format!("denorm-{kind}-000001")})))
            .expect(1)
            .mount(&server)
            .await;
    }
    Mock::given(method("PUT"))
        .and(path("/denorm-meta"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"acknowledged": true, "shards_acknowledged": true, "index": "denorm-meta"})))
        .expect(1)
        .mount(&server)
        .await;
    mount_meta_writes(&server).await;
    let client = config(&server, &[]).client().unwrap();
    setup::ensure(&client, "denorm", 1, &Default::default(), None).await.unwrap();
    let received = server.received_requests().await.unwrap();
    // The first generation's placement is recorded, before its indexes:
    // every tenant shared.
    let placement = received.iter().position(|r| r.url.path() == "/denorm-meta/_create/placement").expect("the placement recorded");
    assert_eq!(serde_json::from_slice::<Value>(&received[placement].body).unwrap(), json!({"dedicated": [], "revisions": {}}));
    assert!(received.iter().position(|r| r.url.path() == "/denorm-files-000001").unwrap() > placement);
    let creates: Vec<Request> = received.into_iter().filter(|r| r.method.as_str() == "PUT").collect();
    // Review finding 6: the meta index is created, with nothing in its
    // documents dynamically mapped, rather than auto-created.
    let meta: Value = serde_json::from_slice(&creates.iter().find(|r| r.url.path() == "/denorm-meta").unwrap().body).unwrap();
    assert_eq!(meta["mappings"]["dynamic"], false);
    assert_eq!(meta["settings"]["index"]["number_of_shards"], 1, "one primary unless DENORM_ES_META_SHARDS asks more");
    let files: Value = serde_json::from_slice(&creates.iter().find(|r| r.url.path() == "/denorm-files-000001").unwrap().body).unwrap();
    assert_eq!(files["aliases"]["denorm-files"]["is_write_index"], true);
    assert_eq!(files["aliases"]["denorm-files-g0"], json!({}), "generation 0's write alias");
    assert_eq!(files["settings"]["analysis"]["tokenizer"]["denorm_path_tree"]["type"], "path_hierarchy");
    assert_eq!(files["mappings"]["properties"]["path"]["fields"]["tree"]["analyzer"], "denorm_path_tree");
    assert_eq!(files["mappings"]["properties"]["path"]["type"], "keyword");
    let posts: Value = serde_json::from_slice(&creates.iter().find(|r| r.url.path() == "/denorm-posts-000001").unwrap().body).unwrap();
    assert_eq!(posts["mappings"]["properties"]["user"]["properties"]["name"]["fields"]["raw"]["type"], "keyword");
}

/// Review finding 5: a user without `maintenance` would have every rename
/// refused (403 on the refresh before its scan) and dead-lettered; the
/// worker refuses to start instead, naming what is missing.
#[tokio::test]
async fn a_user_without_the_privileges_a_worker_needs_is_refused_at_startup() {
    let server = MockServer::start().await;
    Mock::given(method("GET")).and(path("/")).respond_with(recorded::root("8.15.0", None)).mount(&server).await;
    Mock::given(method("POST"))
        .and(path("/_security/user/_has_privileges"))
        .respond_with(recorded::has_privileges("denorm", &[("monitor", true)], "denorm-*", &[("read", true), ("write", true), ("view_index_metadata", true), ("maintenance", false)]))
        .expect(1)
        .mount(&server)
        .await;
    let client = config(&server, &[(env::API_KEY_ENCODED, "a2lkOnMzY3JldA==")]).client().unwrap();
    let err = setup::ensure(&client, "denorm", 1, &Default::default(), None).await.unwrap_err();
    assert!(err.to_string().contains("the Elasticsearch user denorm lacks maintenance on denorm-*"), "{err}");
    assert!(!err.is_retryable());
    let asked: Value = serde_json::from_slice(&server.received_requests().await.unwrap().iter().find(|r| r.url.path() == "/_security/user/_has_privileges").unwrap().body).unwrap();
    assert_eq!(asked["index"][0]["names"], json!(["denorm-*"]));
    assert_eq!(asked["index"][0]["privileges"], json!(["read", "write", "view_index_metadata", "maintenance"]));
    assert_eq!(asked["cluster"], json!(["monitor"]));
}

/// Issue 27 B1: the documented `denorm_worker` role (no `manage`, no
/// `create_index`) starts `denorm run` against indexes that exist.
/// Elasticsearch checks `indices:admin/create` before existence, so the
/// `PUT /denorm-meta` sent before the fix was refused with 403 even though
/// the index was there; startup now only reads until something is
/// missing, and asks `_has_privileges` for exactly what it does.
#[tokio::test]
async fn the_worker_role_starts_against_existing_indexes_without_create_or_manage() {
    let server = MockServer::start().await;
    mount_existing_indexes(&server, 200).await;
    Mock::given(method("POST"))
        .and(path("/_security/user/_has_privileges"))
        .respond_with(recorded::has_privileges("worker", &[("monitor", true)], "denorm-*", &[("read", true), ("write", true), ("view_index_metadata", true), ("maintenance", true)]))
        .mount(&server)
        .await;
    let client = config(&server, &[]).client().unwrap();
    setup::ensure(&client, "denorm", 1, &Default::default(), None).await.unwrap();
    let reqs = server.received_requests().await.unwrap();
    let asked: Vec<Value> = reqs.iter().filter(|r| r.url.path() == "/_security/user/_has_privileges").map(|r| serde_json::from_slice(&r.body).unwrap()).collect();
    assert_eq!(asked.len(), 1, "nothing to create: manage is not asked for");
    assert_eq!(asked[0]["index"][0]["privileges"], json!(setup::WORKER_PRIVILEGES));
    assert!(reqs.iter().all(|r| matches!(r.method.as_str(), "GET" | "HEAD") || r.url.path() == "/_security/user/_has_privileges"), "only reads");
    server.verify().await;

    // With the meta index missing, manage is asked for before creating it,
    // and a user without it is told so instead of getting a 403.
    let server = MockServer::start().await;
    mount_existing_indexes(&server, 404).await;
    Mock::given(method("POST"))
        .and(path("/_security/user/_has_privileges"))
        .respond_with(recorded::has_privileges("worker", &[("monitor", true)], "denorm-*", &[("manage", false)]))
        .mount(&server)
        .await;
    let err = setup::ensure(&config(&server, &[]).client().unwrap(), "denorm", 1, &Default::default(), None).await.unwrap_err();
    assert!(err.to_string().contains("lacks manage on denorm-*"), "{err}");
    server.verify().await;
}

/// A cluster where denorm's indexes exist as they should, `HEAD
/// /denorm-meta` answers `meta_status`, and the user may not create or
/// change anything (every PUT is refused, and expected never to be sent).
async fn mount_existing_indexes(server: &MockServer, meta_status: u16) {
    Mock::given(method("GET")).and(path("/")).respond_with(recorded::root("8.15.0", None)).mount(server).await;
    for kind in [Kind::File, Kind::User, Kind::Post] {
        mount_existing(server, kind, mapping::mapping(kind)).await;
    }
    Mock::given(method("GET"))
        .and(path("/denorm-files/_settings"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"denorm-files-000001": {"settings": {"index": mapping::settings()}}})))
        .mount(server)
        .await;
    Mock::given(method("HEAD")).and(path("/denorm-meta")).respond_with(ResponseTemplate::new(meta_status)).mount(server).await;
    Mock::given(method("PUT")).respond_with(recorded::unauthorized("indices:admin/create", "denorm-meta", "create_index,manage,all")).expect(0).mount(server).await;
}

/// Generation 0 of `kind` as it exists on a cluster: its concrete index
/// behind both aliases ([`mount_read_alias`]), with `mappings`
/// (`GET /<alias>/_mapping`).
async fn mount_existing(server: &MockServer, kind: Kind, mappings: Value) {
    let (read, index) = (names::alias("denorm", kind), names::concrete("denorm", kind, 0));
    mount_read_alias(server, kind, 0).await;
    Mock::given(method("GET")).and(path(format!("/{read}/_mapping"))).respond_with(ResponseTemplate::new(200).set_body_json(json!({ index: {"mappings": mappings} }))).mount(server).await;
}

/// An index created before tombstones existed gets their two fields added
/// to its mapping (the only mapping change made in place); anything else
/// missing is still a conflict.
#[tokio::test]
async fn an_index_from_before_tombstones_gets_their_fields_added() {
    let server = MockServer::start().await;
    Mock::given(method("GET")).and(path("/")).respond_with(recorded::root("8.15.0", None)).mount(&server).await;
    for kind in [Kind::File, Kind::User, Kind::Post] {
        let mut old = mapping::mapping(kind);
        // Files from before tombstones and the writing partition; users and
        // posts from between the two.
        let gone: &[&str] = if kind == Kind::File { &["denorm_deleted", "denorm_deleted_at", "denorm_partition"] } else { &["denorm_partition"] };
        for field in gone {
            old["properties"].as_object_mut().unwrap().remove(*field);
        }
        mount_existing(&server, kind, old).await;
        Mock::given(method("PUT"))
            .and(path(format!("/{}/_mapping", names::concrete("denorm", kind, 0))))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"acknowledged": true})))
            .expect(1)
            .mount(&server)
            .await;
    }
    Mock::given(method("GET"))
        .and(path("/denorm-files/_settings"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"denorm-files-000001": {"settings": {"index": mapping::settings()}}})))
        .mount(&server)
        .await;
    Mock::given(method("PUT")).and(path("/denorm-meta")).respond_with(recorded::resource_already_exists("denorm-meta")).mount(&server).await;
    let client = config(&server, &[]).client().unwrap();
    setup::ensure(&client, "denorm", 1, &Default::default(), None).await.unwrap();
    let puts: Vec<Value> =
        server.received_requests().await.unwrap().iter().filter(|r| r.url.path().ends_with("/_mapping") && r.method.as_str() == "PUT").map(|r| serde_json::from_slice(&r.body).unwrap()).collect();
    assert_eq!(puts.len(), 3);
    assert_eq!(puts[0], json!({"properties": {"denorm_deleted": {"type": "boolean"}, "denorm_deleted_at": {"type": "date", "format": "epoch_millis"}, "denorm_partition": {"type": "integer"}}}));
    assert_eq!(puts[1], json!({"properties": {"denorm_partition": {"type": "integer"}}}), "only what is missing");
    server.verify().await;
}

/// Review finding 7: an index that already exists when created is checked
/// again for its aliases, so writes never go to an index without them.
#[tokio::test]
async fn an_existing_index_without_its_alias_is_refused_not_used() {
    let server = MockServer::start().await;
    Mock::given(method("GET")).and(path("/")).respond_with(recorded::root("8.15.0", None)).mount(&server).await;
    for alias in ["denorm-files", "denorm-users", "denorm-posts"] {
        Mock::given(method("GET")).and(path(format!("/_alias/{alias}"))).respond_with(recorded::alias_missing(alias)).mount(&server).await;
    }
    Mock::given(method("PUT")).and(path("/denorm-files-000001")).respond_with(recorded::resource_already_exists("denorm-files-000001")).mount(&server).await;
    Mock::given(method("PUT")).and(path("/denorm-meta")).respond_with(recorded::resource_already_exists("denorm-meta")).mount(&server).await;
    mount_meta_writes(&server).await;
    let client = config(&server, &[]).client().unwrap();
    let err = setup::ensure(&client, "denorm", 1, &Default::default(), None).await.unwrap_err();
    assert!(err.to_string().contains("index denorm-files-000001 exists but the alias denorm-files is not on it"), "{err}");
    assert!(!err.is_retryable());
}

/// Review finding 11: an index whose mappings match but whose path analyzer
/// is defined differently is refused (its `path.tree` searches would be
/// wrong), with the setting named.
#[tokio::test]
async fn refuses_an_index_whose_path_analyzer_differs() {
    let server = MockServer::start().await;
    Mock::given(method("GET")).and(path("/")).respond_with(recorded::root("8.15.0", None)).mount(&server).await;
    let (read, index) = (names::alias("denorm", Kind::File), names::concrete("denorm", Kind::File, 0));
    mount_existing(&server, Kind::File, mapping::mapping(Kind::File)).await;
    // As GET /<index>/_settings answers: every value a string.
    Mock::given(method("GET"))
        .and(path(format!("/{read}/_settings")))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({ index.clone(): {"settings": {"index": {
            "number_of_shards": "1", "number_of_replicas": "1", "provided_name": index, "creation_date": "1731000000000",
            "uuid": "aAsFqTI0Tc2W0LCWgPNrOA", "version": {"created": "8512000"},
            "analysis": {"tokenizer": {"denorm_path_tree": {"type": "path_hierarchy", "delimiter": "\\"}},
                         "analyzer": {"denorm_path_tree": {"type": "custom", "tokenizer": "denorm_path_tree"}}}}}} })))
        .expect(1)
        .mount(&server)
        .await;
    let client = config(&server, &[]).client().unwrap();
    let err = setup::ensure(&client, "denorm", 1, &Default::default(), None).await.unwrap_err();
    assert!(err.to_string().contains("setting index.analysis.tokenizer.denorm_path_tree.delimiter is \\, denorm needs /"), "{err}");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn accepts_a_matching_mapping_and_refuses_a_conflicting_one() {
    let server = MockServer::start().await;
    Mock::given(method("GET")).and(path("/")).respond_with(recorded::root("8.15.0", None)).mount(&server).await;
    for kind in [Kind::User, Kind::Post] {
        mount_existing(&server, kind, mapping::mapping(kind)).await;
    }
    let mut wrong = mapping::mapping(Kind::File);
    wrong["properties"]["path"] = json!({"type": "text"});
    mount_existing(&server, Kind::File, wrong).await;
    let client = config(&server, &[]).client().unwrap();
    let err = setup::ensure(&client, "denorm", 1, &Default::default(), None).await.unwrap_err();
    match &err {
        ElasticError::MappingConflict { index, field, expected, found } => {
            assert_eq!((index.as_str(), field.as_str(), expected.as_str(), found.as_str()), ("denorm-files-000001", "path", "keyword", "text"));
        }
        other => panic!("expected a mapping conflict, got {other}"),
    }
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("field path is text, denorm needs keyword"), "{err}");
}

#[tokio::test]
async fn sends_basic_and_api_key_credentials_without_leaking_them() {
    let server = MockServer::start().await;
    // base64("elastic:hunter2") and base64("kid:s3cret")
    Mock::given(method("POST"))
        .and(path("/_bulk"))
        .and(header("authorization", "Basic ZWxhc3RpYzpodW50ZXIy"))
        .respond_with(ResponseTemplate::new(200).set_body_json(items(&[("a", 201)])))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/_bulk"))
        .and(header("authorization", "ApiKey a2lkOnMzY3JldA=="))
        .respond_with(ResponseTemplate::new(200).set_body_json(items(&[("a", 201)])))
        .expect(2)
        .mount(&server)
        .await;
    let basic = config(&server, &[(env::USERNAME, "elastic"), (env::PASSWORD, "hunter2")]);
    let key = config(&server, &[(env::API_KEY_ID, "kid"), (env::API_KEY, "s3cret")]);
    // Review finding 10: the `encoded` form Elastic hands out.
    let encoded = config(&server, &[(env::API_KEY_ENCODED, "a2lkOnMzY3JldA==")]);
    for c in [&basic, &key, &encoded] {
        let report = bulk::execute(&c.client().unwrap(), vec![index_op("a")], BulkLimits::default(), fast()).await.unwrap();
        assert_eq!(report.done, 1);
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("s3cret") && !shown.contains("a2lkOnMzY3JldA"), "{shown}");
    }
    // A rejected request's error shows the body, not the credentials.
    server.reset().await;
    Mock::given(method("POST")).and(path("/_bulk")).respond_with(recorded::unauthenticated("elastic", "/_bulk")).mount(&server).await;
    let err = bulk::execute(&basic.client().unwrap(), vec![index_op("a")], BulkLimits::default(), fast()).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("401") && !text.contains("hunter2"), "{text}");
    assert!(err.is_retryable(), "credentials are the deployment's: the command waits for them, it is not dead-lettered");
}

/// Review finding 8: the scroll fallback for clusters without point in
/// time could never trigger (7.x answers the request differently, 7.10
/// lacks `_shard_doc`); clusters too old for the scans are refused at
/// startup instead, by version.
#[tokio::test]
async fn refuses_clusters_too_old_for_point_in_time_scans_and_opensearch() {
    for (number, distribution, accepted) in [("7.9.3", None, false), ("7.16.3", None, false), ("7.17.24", None, true), ("8.15.0", None, true), ("2.11.0", Some("opensearch"), false)] {
        let server = MockServer::start().await;
        Mock::given(method("GET")).and(path("/")).respond_with(recorded::root(number, distribution)).mount(&server).await;
        let client = config(&server, &[]).client().unwrap();
        let result = setup::check_version(&client).await;
        assert_eq!(result.is_ok(), accepted, "{number}: {result:?}");
        if let Err(e) = result {
            assert!(!e.is_retryable());
            assert!(e.to_string().contains("denorm supports Elasticsearch 7.17 and 8.x"), "{e}");
        }
    }
}

#[tokio::test]
async fn search_cli_queries_elasticsearch_and_prints_the_json_contract() {
    let server = MockServer::start().await;
    Mock::given(path("/denorm-files/_search"))
        .respond_with(ResponseTemplate::new(200).set_body_json(recorded::search_response(None, vec![
            json!({"_index": "denorm-files-000001", "_id": "f1", "_score": 1.0, "_source": {"id": "f1", "name": "README.txt", "path": "/clinton/work/elasticsearch", "contents": "Starting...", "denorm_pos": 4}})
        ])))
        .expect(1)
        .mount(&server)
        .await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_denorm"))
        .args(["--index", &server.uri(), "search", "--default-tenant", "files", "--under", "/clinton/work", "--limit", "5", "--json"])
        .env_remove("DENORM_ES_USERNAME")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line, json!({"id": "f1", "name": "README.txt", "path": "/clinton/work/elasticsearch", "contents": "Starting..."}));
    let req = &server.received_requests().await.unwrap()[0];
    let body: Value = serde_json::from_slice(&req.body).unwrap();
    assert_eq!(body["size"], 5);
    assert_eq!(body["query"]["bool"]["filter"][1]["term"]["path.tree"], "/clinton/work");
    assert_eq!(body["query"]["bool"]["filter"][0], json!({"bool": {"must_not": [{"exists": {"field": "tenant"}}]}}), "the default tenant's documents only");
}
