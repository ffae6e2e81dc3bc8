//! The bulk engine: which items are retried, backoff, limits; a shard's
//! commit outlasting failures.

use super::*;

#[tokio::test]
async fn retries_only_failed_bulk_items() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/_bulk"))
        .respond_with(ResponseTemplate::new(200).set_body_json(items(&[("a", 201), ("b", 200), ("c", 409), ("d", 429), ("e", 503)])))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST")).and(path("/_bulk")).respond_with(ResponseTemplate::new(200).set_body_json(items(&[("d", 201), ("e", 200)]))).up_to_n_times(1).mount(&server).await;
    let client = config(&server, &[]).client().unwrap();
    let ops = ["a", "b", "c", "d", "e"].map(index_op).to_vec();
    let report = bulk::execute(&client, ops, BulkLimits::default(), fast()).await.unwrap();
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2);
    assert_eq!(action_ids(&requests[0]), ["a", "b", "c", "d", "e"]);
    assert_eq!(action_ids(&requests[1]), ["d", "e"], "the retry must resend only the items that failed with 429/5xx");
    assert_eq!(report.done, 4);
    assert_eq!(report.conflicts.iter().map(|o| o.id()).collect::<Vec<_>>(), ["c"]);
    assert!(report.failed.is_empty());
}

#[tokio::test]
async fn whole_request_429_backs_off_and_retries() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/_bulk"))
        .respond_with(ResponseTemplate::new(429).set_body_json(json!({"error": {"type": "es_rejected_execution_exception"}, "status": 429})))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(method("POST")).and(path("/_bulk")).respond_with(ResponseTemplate::new(200).set_body_json(items(&[("a", 201), ("b", 201)]))).mount(&server).await;
    let client = config(&server, &[]).client().unwrap();
    let report = bulk::execute(&client, vec![index_op("a"), index_op("b")], BulkLimits::default(), fast()).await.unwrap();
    assert_eq!(report.requests, 3);
    assert_eq!(report.done, 2);
    for r in server.received_requests().await.unwrap() {
        assert_eq!(action_ids(&r), ["a", "b"]);
    }
}

#[tokio::test]
async fn permanent_item_failures_are_reported_not_retried() {
    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/_bulk")).respond_with(ResponseTemplate::new(200).set_body_json(items(&[("a", 201), ("bad", 400)]))).mount(&server).await;
    let client = config(&server, &[]).client().unwrap();
    let report = bulk::execute(&client, vec![index_op("a"), index_op("bad")], BulkLimits::default(), fast()).await.unwrap();
    assert_eq!(report.requests, 1);
    assert_eq!(report.failed.len(), 1);
    assert!(report.failed[0].1.contains("document_parsing_exception"), "{:?}", report.failed);
}

#[tokio::test]
async fn gives_up_after_the_attempt_limit_with_a_retryable_error() {
    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/_bulk")).respond_with(ResponseTemplate::new(503)).mount(&server).await;
    let client = config(&server, &[]).client().unwrap();
    let err = bulk::execute(&client, vec![index_op("a")], BulkLimits::default(), fast()).await.unwrap_err();
    assert!(matches!(err, ElasticError::RetriesExhausted { attempts: 5, .. }), "{err}");
    assert!(err.is_retryable());
    assert_eq!(server.received_requests().await.unwrap().len(), 5);
}

#[tokio::test]
async fn splits_requests_by_documents_and_bytes() {
    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/_bulk")).respond_with(bulk_ok).mount(&server).await;
    let client = config(&server, &[]).client().unwrap();
    let ops: Vec<BulkOp> = (0..25).map(|i| index_op(&format!("d{i}"))).collect();
    let report = bulk::execute(&client, ops, BulkLimits { max_docs: 10, max_bytes: 1 << 20 }, fast()).await.unwrap();
    assert_eq!(report.done, 25);
    let sizes: Vec<usize> = server.received_requests().await.unwrap().iter().map(|r| action_ids(r).len()).collect();
    assert_eq!(sizes, [10, 10, 5]);
    let big: Vec<BulkOp> = (0..4).map(|i| BulkOp::Index { index: "i".into(), id: format!("b{i}"), source: json!({"contents": "x".repeat(400)}), if_seq_no: None }).collect();
    server.reset().await;
    Mock::given(method("POST")).and(path("/_bulk")).respond_with(bulk_ok).mount(&server).await;
    bulk::execute(&client, big, BulkLimits { max_docs: 100, max_bytes: 1000 }, fast()).await.unwrap();
    let sizes: Vec<usize> = server.received_requests().await.unwrap().iter().map(|r| action_ids(r).len()).collect();
    assert_eq!(sizes, [2, 2]);
}

/// Applies an upsert of each file `ids[i]` at position `i`, and marks it.
fn upsert_files(shard: &mut dyn denorm::index::Shard, ids: &[&str]) {
    for (pos, id) in ids.iter().enumerate() {
        let c = denorm::command::Command::UpsertFile { id: id.to_string(), path: format!("/c/{id}.txt"), contents: "x".into(), previous_path: None };
        denorm::apply::apply(shard, &c, pos as u64, denorm::apply::FanOut::pages_of(10)).unwrap();
        shard.mark_applied(Checkpoint::new(pos as u64, 0));
    }
}

/// How many times partition 0's applied position was written.
fn meta_writes(reqs: &[wiremock::Request]) -> usize {
    reqs.iter().filter(|r| r.url.path() == "/denorm-meta/_doc/p0" && r.method.as_str() == "POST").count()
}

#[test]
fn a_failed_commit_keeps_its_writes_and_sends_them_again() {
    use denorm::apply::{apply, FanOut};
    use denorm::command::Command;
    use denorm::index::Backend;
    let d = Double::new().new_shard(&["f1"]);
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        // The cluster is unavailable for the whole first commit (5 attempts).
        Mock::given(method("POST")).and(path("/_bulk")).respond_with(ResponseTemplate::new(503)).up_to_n_times(5).mount(server).await;
        Mock::given(method("POST")).and(path("/_bulk")).respond_with(|r: &Request| bulk_reply(r, &[("f1", 201)])).mount(server).await;
        Mock::given(method("POST")).and(path("/denorm-meta/_doc/p0")).respond_with(recorded::meta_written("p0", 1)).mount(server).await;
    });
    let b = d.backend();
    let mut shard = b.open_shard(0).unwrap();
    let cmd = Command::UpsertFile { id: "f1".into(), path: "/c/a.txt".into(), contents: "x".into(), previous_path: None };
    apply(shard.as_mut(), &cmd, 3, FanOut::pages_of(10)).unwrap();
    shard.mark_applied(Checkpoint::new(3, 0));
    let err = shard.commit().unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert_eq!(shard.applied(), None, "nothing may be recorded as applied after a failed commit");
    shard.commit().unwrap();
    assert_eq!(shard.applied(), Some(3));
    let reqs = rt.block_on(server.received_requests()).unwrap();
    let bulks: Vec<Vec<String>> = reqs.iter().filter(|r| r.url.path() == "/_bulk").map(action_ids).collect();
    assert_eq!(bulks.len(), 6);
    assert_eq!(bulks.last().unwrap(), &vec!["f1".to_string()], "the write is sent again by the second commit");
}

#[test]
fn a_run_of_503_and_429_responses_is_outlasted_and_nothing_is_lost() {
    use denorm::index::Backend;
    let d = Double::new().new_shard(&["f1", "f2"]);
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        // An outage longer than one commit's attempts (5): 7 x 503, then
        // 4 x 429 (overloaded while recovering), then the cluster is back.
        Mock::given(method("POST")).and(path("/_bulk")).respond_with(ResponseTemplate::new(503)).up_to_n_times(7).mount(server).await;
        Mock::given(method("POST")).and(path("/_bulk")).respond_with(ResponseTemplate::new(429)).up_to_n_times(4).mount(server).await;
        Mock::given(method("POST")).and(path("/_bulk")).respond_with(|r: &Request| bulk_reply(r, &[("f1", 201), ("f2", 201)])).mount(server).await;
        Mock::given(method("POST")).and(path("/denorm-meta/_doc/p0")).respond_with(recorded::meta_written("p0", 1)).mount(server).await;
    });
    let b = d.backend();
    // What the worker does on a transient failure: a fresh shard writer,
    // the uncommitted batch applied again, the commit retried.
    let mut failures = 0;
    let shard = loop {
        let mut shard = b.open_shard(0).unwrap();
        upsert_files(shard.as_mut(), &["f1", "f2"]);
        match shard.commit() {
            Ok(()) => break shard,
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                failures += 1;
                assert!(failures < 10, "never recovered");
            }
        }
    };
    assert_eq!(failures, 2, "two commits fail during the outage");
    assert_eq!(shard.applied(), Some(1));
    let reqs = rt.block_on(server.received_requests()).unwrap();
    let bulks: Vec<Vec<String>> = reqs.iter().filter(|r| r.url.path() == "/_bulk").map(action_ids).collect();
    assert_eq!(bulks.len(), 12, "7 + 4 refused, 1 accepted");
    assert_eq!(bulks.last().unwrap(), &vec!["f1".to_string(), "f2".to_string()], "every write reaches the cluster once it is back");
    let metas = meta_writes(&reqs);
    assert_eq!(metas, 1, "the position is recorded only after the writes are in");
}

#[test]
fn an_item_refused_for_good_fails_the_commit_permanently() {
    use denorm::index::Backend;
    let d = Double::new().new_shard(&["f1", "f2"]);
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        Mock::given(method("POST")).and(path("/_bulk")).respond_with(|r: &Request| bulk_reply(r, &[("f1", 201), ("f2", 400)])).mount(server).await;
    });
    let b = d.backend();
    let mut shard = b.open_shard(0).unwrap();
    upsert_files(shard.as_mut(), &["f1", "f2"]);
    // Not retryable: the worker commits the batch command by command to
    // find the refused one and dead-letters it (tests/it/faults.rs).
    let err = shard.commit().unwrap_err();
    assert!(!err.is_retryable(), "{err}");
    assert!(err.to_string().contains("f2") && err.to_string().contains("document_parsing_exception"), "{err}");
    assert_eq!(shard.applied(), None, "nothing is recorded as applied");
    let metas = meta_writes(&rt.block_on(server.received_requests()).unwrap());
    assert_eq!(metas, 0);
}

/// Review F8: Elasticsearch may work on a bulk for longer than 30 s (it
/// waits up to its `timeout` for unavailable primaries, and an overloaded
/// write pool queues it). The client used to give up after 30 s and send
/// the whole request again while the first copy was still being executed:
/// twice the load on an overloaded cluster, and 409s to read back. Now the
/// bulk asks the server to give up first (`timeout`), and the client waits
/// longer than that.
#[test]
fn a_slow_bulk_is_waited_for_not_sent_again_while_the_server_still_works_on_it() {
    use denorm::index::Backend;
    let d = Double::new().new_shard(&["f1"]);
    let (rt, server) = (&d.rt, &d.server);
    let slow = Duration::from_secs(32);
    rt.block_on(async {
        Mock::given(method("POST")).and(path("/_bulk")).respond_with(move |r: &Request| bulk_reply(r, &[("f1", 201)]).set_delay(slow)).mount(server).await;
        Mock::given(method("POST")).and(path("/denorm-meta/_doc/p0")).respond_with(recorded::meta_written("p0", 1)).mount(server).await;
    });
    let b = d.backend();
    let mut shard = b.open_shard(0).unwrap();
    upsert_files(shard.as_mut(), &["f1"]);
    shard.commit().unwrap();
    let reqs = rt.block_on(server.received_requests()).unwrap();
    let bulks: Vec<&wiremock::Request> = reqs.iter().filter(|r| r.url.path() == "/_bulk").collect();
    assert_eq!(bulks.len(), 1, "the bulk was sent again while the server still worked on it");
    let wait = bulks[0].url.query_pairs().find(|(k, _)| k == "timeout").map(|(_, v)| v.to_string());
    assert_eq!(wait.as_deref(), Some(denorm::index::elastic::bulk::SERVER_WAIT), "the server gives up first");
}
