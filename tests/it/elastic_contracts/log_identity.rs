//! The log document.

use super::*;
use denorm::index::{Backend, IndexError};

fn get_log(found: Option<Value>) -> ResponseTemplate {
    match found {
        Some(source) => ResponseTemplate::new(200).set_body_json(json!({"_index": "denorm-meta", "_id": "log", "found": true, "_seq_no": 0, "_primary_term": 1, "_source": source})),
        None => ResponseTemplate::new(404).set_body_json(json!({"_index": "denorm-meta", "_id": "log", "found": false})),
    }
}

/// The log document is absent at the first read; the create is answered
/// `created`; later reads find `found`. The generation records no model.
fn mount_log_document(rt: &tokio::runtime::Runtime, server: &MockServer, created: ResponseTemplate, found: Value) {
    rt.block_on(async {
        Mock::given(method("GET")).and(path("/denorm-meta/_doc/model")).respond_with(recorded::doc_missing("denorm-meta", "model")).mount(server).await;
        Mock::given(method("GET")).and(path("/denorm-meta/_doc/log")).respond_with(get_log(None)).up_to_n_times(1).mount(server).await;
        Mock::given(method("POST")).and(path("/denorm-meta/_create/log")).respond_with(created).mount(server).await;
        Mock::given(method("GET")).and(path("/denorm-meta/_doc/log")).respond_with(get_log(Some(found))).mount(server).await;
    });
}

#[test]
fn the_partition_count_is_recorded_once_then_compared() {
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    let created = ResponseTemplate::new(201).set_body_json(json!({"_index": "denorm-meta", "_id": "log", "result": "created", "_seq_no": 0, "_primary_term": 1}));
    mount_log_document(rt, server, created, json!({"topic": "t", "partitions": 6}));
    let b = d.backend();
    b.bind_log(6).unwrap();
    let reqs = rt.block_on(server.received_requests()).unwrap();
    let created = reqs.iter().find(|r| r.url.path().ends_with("/_create/log")).expect("the log document is created");
    assert_eq!(serde_json::from_slice::<Value>(&created.body).unwrap(), json!({"topic": "t", "partitions": 6}));
    // Afterwards: the same count passes, another is refused with the fix.
    b.bind_log(6).unwrap();
    match b.bind_log(8) {
        Err(IndexError::LogMismatch(m)) => assert!(m.contains("topic of 6 partitions, the topic now has 8") && m.contains("denorm rebuild"), "{m}"),
        other => panic!("expected a log mismatch, got {other:?}"),
    }
    assert_eq!(rt.block_on(server.received_requests()).unwrap().iter().filter(|r| r.url.path().ends_with("/_create/log")).count(), 1);
}

#[test]
fn of_two_workers_creating_the_log_document_the_second_reads_the_first_ones() {
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    let conflict = ResponseTemplate::new(409)
        .set_body_json(json!({"error": {"type": "version_conflict_engine_exception", "reason": "[log]: version conflict, document already exists (current version [1])"}, "status": 409}));
    mount_log_document(rt, server, conflict, json!({"topic": "t", "partitions": 4}));
    let b = d.backend();
    assert!(matches!(b.bind_log(6), Err(IndexError::LogMismatch(_))), "the first worker's count wins");
    assert!(matches!(d.backend().bind_log(4), Ok(())));
}

#[test]
fn checkpoints_are_read_in_one_multi_get_without_the_writer() {
    let d = Double::new();
    let (rt, server) = (&d.rt, &d.server);
    rt.block_on(async {
        Mock::given(method("POST"))
            .and(path("/denorm-meta/_mget"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"docs": [
                {"_index": "denorm-meta", "_id": "p0", "_version": 3, "_seq_no": 7, "_primary_term": 1, "found": true,
                 "_source": {"topic": "t", "applied": 41, "fingerprint": "51c016c89e230cf1", "parked": []}},
                {"_index": "denorm-meta", "_id": "p1", "found": false},
                {"_index": "denorm-meta", "_id": "p2", "_version": 1, "_seq_no": 2, "_primary_term": 1, "found": true,
                 "_source": {"topic": "t", "applied": 5, "parked": []}}
            ]})))
            .mount(server)
            .await;
    });
    let c = d.backend().checkpoints(&[0, 1, 2]).unwrap();
    assert_eq!(c.len(), 2);
    assert_eq!(c[&0], Checkpoint::new(41, 0x51c0_16c8_9e23_0cf1));
    assert_eq!(c[&2], Checkpoint { offset: 5, fingerprint: None }, "a checkpoint from before fingerprints");
    let reqs = rt.block_on(server.received_requests()).unwrap();
    let mget = reqs.iter().find(|r| r.url.path() == "/denorm-meta/_mget").expect("one multi-get");
    assert_eq!(serde_json::from_slice::<Value>(&mget.body).unwrap(), json!({"ids": ["p0", "p1", "p2"]}));
}
