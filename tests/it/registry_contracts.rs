//! Schema-registry framing against recorded exchanges of Confluent's Schema
//! Registry REST API (v1): requests, answers and error bodies as its API
//! reference documents them. The client alone, then `denorm produce` and
//! `denorm run` on a real broker (tansu). No registry server runs here
//! (wiremock plays it); see docs/producers.md for what that does and does
//! not prove.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;

use denorm::codec::registry::{frame, Registry, RegistryConfig, RegistryError, CONTENT_TYPE};
use denorm::codec::{Codec, DecodeError, CURRENT_SCHEMA};
use denorm::command::{Command, Envelope};
use wiremock::matchers::{body_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn registry(server: &MockServer, vars: &[(&str, &str)]) -> Registry {
    let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let cfg = RegistryConfig::from_lookup(&server.uri(), |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())).unwrap();
    Registry::new(cfg).unwrap()
}

/// The registry's JSON, with its content type.
fn answer(status: u16, body: serde_json::Value) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_raw(body.to_string(), CONTENT_TYPE)
}

fn error(status: u16, code: i64, message: &str) -> ResponseTemplate {
    answer(status, serde_json::json!({"error_code": code, "message": message}))
}

#[tokio::test]
async fn produce_looks_the_subject_up_and_registers_only_when_it_is_missing() {
    let server = MockServer::start().await;
    let schema = serde_json::json!({ "schema": CURRENT_SCHEMA });
    // Lookup: subject not found (40401), then registration answers the id.
    Mock::given(method("POST"))
        .and(path("/subjects/denorm.commands-value"))
        .and(header("content-type", CONTENT_TYPE))
        .and(body_json(&schema))
        .respond_with(error(404, 40401, "Subject 'denorm.commands-value' not found."))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST")).and(path("/subjects/denorm.commands-value/versions")).and(body_json(&schema)).respond_with(answer(200, serde_json::json!({"id": 41}))).expect(1).mount(&server).await;
    let r = registry(&server, &[]);
    assert_eq!(r.id_for("denorm.commands-value", CURRENT_SCHEMA, true).await.unwrap(), 41);

    // Already registered: the lookup answers, nothing is registered.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/subjects/t-value"))
        .respond_with(answer(200, serde_json::json!({"subject": "t-value", "id": 7, "version": 2, "schema": CURRENT_SCHEMA})))
        .mount(&server)
        .await;
    Mock::given(method("POST")).and(path("/subjects/t-value/versions")).respond_with(answer(200, serde_json::json!({"id": 8}))).expect(0).mount(&server).await;
    assert_eq!(registry(&server, &[]).id_for("t-value", CURRENT_SCHEMA, true).await.unwrap(), 7);
}

#[tokio::test]
async fn refusals_are_final_and_outages_are_retryable() {
    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/subjects/a-value")).respond_with(error(404, 40403, "Schema not found")).mount(&server).await;
    Mock::given(method("POST"))
        .and(path("/subjects/a-value/versions"))
        .respond_with(error(409, 409, "Schema being registered is incompatible with an earlier schema for subject \"a-value\""))
        .mount(&server)
        .await;
    Mock::given(method("POST")).and(path("/subjects/b-value")).respond_with(error(404, 40401, "Subject 'b-value' not found.")).mount(&server).await;
    Mock::given(method("POST")).and(path("/subjects/b-value/versions")).respond_with(error(422, 42201, "Invalid schema")).mount(&server).await;
    Mock::given(method("POST")).and(path("/subjects/c-value")).respond_with(error(500, 50001, "Error in the backend data store")).mount(&server).await;
    let r = registry(&server, &[]);
    let e = r.id_for("a-value", CURRENT_SCHEMA, true).await.unwrap_err();
    assert!(matches!(e, RegistryError::Refused { status: 409, .. }) && !e.is_retryable(), "{e}");
    let e = r.id_for("b-value", CURRENT_SCHEMA, true).await.unwrap_err();
    assert!(matches!(e, RegistryError::Refused { status: 422, code: 42201, .. }), "{e}");
    // Registration off (auto.register.schemas=false): a missing schema is refused.
    let e = r.id_for("a-value", CURRENT_SCHEMA, false).await.unwrap_err();
    assert!(matches!(e, RegistryError::Refused { status: 404, code: 40403, .. }), "{e}");
    let e = r.id_for("c-value", CURRENT_SCHEMA, true).await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
}

#[tokio::test]
async fn schema_ids_are_resolved_once_with_credentials_and_unknown_ids_are_final() {
    let server = MockServer::start().await;
    // Basic auth: "svc:hunter2".
    let auth = ("authorization", "Basic c3ZjOmh1bnRlcjI=");
    Mock::given(method("GET")).and(path("/schemas/ids/41")).and(header(auth.0, auth.1)).respond_with(answer(200, serde_json::json!({ "schema": CURRENT_SCHEMA }))).expect(1).mount(&server).await;
    Mock::given(method("GET")).and(path("/schemas/ids/99")).respond_with(error(404, 40403, "Schema 99 not found")).mount(&server).await;
    Mock::given(method("GET")).and(path("/schemas/ids/5")).respond_with(answer(200, serde_json::json!({"schemaType": "PROTOBUF", "schema": "syntax = \"proto3\";"}))).mount(&server).await;
    Mock::given(method("GET")).and(path("/schemas/ids/6")).respond_with(error(401, 401, "Unauthorized")).mount(&server).await;
    let r = Arc::new(registry(&server, &[("DENORM_SCHEMA_REGISTRY_USERNAME", "svc"), ("DENORM_SCHEMA_REGISTRY_PASSWORD", "hunter2")]));
    assert!(!format!("{r:?}").contains("hunter2"));
    let codec = Codec::new().with_registry(r.clone(), tokio::runtime::Handle::current());
    let e = Envelope::new(Command::RenamePath { from: "/a/b".into(), to: "/a/c".into() });
    let framed = frame(41, &codec.datum(&e));
    // The worker decodes on threads outside the runtime.
    let (codec, decoded) = tokio::task::spawn_blocking(move || {
        let first = codec.decode(&framed);
        let second = codec.decode(&framed);
        assert_eq!(first, second);
        let unknown = codec.decode(&frame(99, &[]));
        let protobuf = codec.decode(&frame(5, &[]));
        let unauthorized = codec.decode(&frame(6, &[]));
        (codec, (first, unknown, protobuf, unauthorized))
    })
    .await
    .unwrap();
    let (first, unknown, protobuf, unauthorized) = decoded;
    assert_eq!(first.unwrap(), e);
    match unknown {
        Err(DecodeError::UnknownSchemaId { id: 99, detail }) => assert!(detail.contains("40403"), "{detail}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(protobuf, Err(DecodeError::UnknownSchemaId { id: 5, .. })), "{protobuf:?}");
    // Credentials the registry refuses are an outage to ride out, not a
    // reason to dead-letter valid messages.
    let e = unauthorized.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    drop(codec);
}

#[tokio::test]
async fn an_unreachable_registry_is_transient() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cfg = RegistryConfig::from_lookup(&format!("http://127.0.0.1:{port}"), |_| None).unwrap();
    let r = Registry::new(cfg).unwrap();
    let e = r.schema(1).await.unwrap_err();
    assert!(matches!(e, RegistryError::Unavailable(_)), "{e}");
    let e = r.id_for("x-value", CURRENT_SCHEMA, true).await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
}

/// The recorded registry of a topic: the command schema registered as id
/// 41 (looked up, then registered by `denorm produce`), id 99 unknown.
async fn recorded_registry(topic: &str) -> MockServer {
    let server = MockServer::start().await;
    let subject = format!("/subjects/{topic}-value");
    Mock::given(method("POST")).and(path(subject.as_str())).respond_with(error(404, 40401, "Subject not found.")).mount(&server).await;
    Mock::given(method("POST")).and(path(format!("{subject}/versions"))).respond_with(answer(200, serde_json::json!({"id": 41}))).mount(&server).await;
    Mock::given(method("GET")).and(path("/schemas/ids/41")).respond_with(answer(200, serde_json::json!({ "schema": CURRENT_SCHEMA }))).mount(&server).await;
    Mock::given(method("GET")).and(path("/schemas/ids/99")).respond_with(error(404, 40403, "Schema 99 not found")).mount(&server).await;
    server
}

/// The dead letters are one `unknown_schema` whose detail says `says`.
fn assert_one_unknown_schema(r: &Rig, says: &str) {
    let (code, out, err) = r.run(&["dlq", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let letters = json_lines(&out);
    assert_eq!(letters.len(), 1, "{out}");
    assert_eq!(letters[0]["reason"], "unknown_schema");
    assert!(letters[0]["detail"].as_str().unwrap().contains(says), "{out}");
}

#[test]
fn registry_framed_commands_are_applied_and_an_unknown_id_is_dead_lettered() {
    let rt = rt();
    let r = Rig::new(1);
    let server = rt.block_on(recorded_registry(&r.cfg.topic));
    let url = server.uri();
    let jsonl = r.dir().join("commands.jsonl");
    std::fs::write(
        &jsonl,
        [
            r#"{"op":"upsert_file","id":"r1","path":"/reg/a/one.txt","contents":"one"}"#,
            r#"{"op":"upsert_file","id":"r2","path":"/reg/a/two.txt","contents":"two"}"#,
            r#"{"op":"rename","from":"/reg/a","to":"/reg/b"}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let (code, _, err) = r.run(&["produce", "--schema-registry", &url, "--jsonl", jsonl.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&format!("subject {}-value, schema id 41", r.cfg.topic)), "{err}");
    // A message of a schema id the registry does not know.
    let datum = Codec::new().datum(&Envelope::new(Command::DeleteFile { id: "r1".into(), path: "/bad/x".into() }));
    send_raw(&r.cfg, &[(Some("/bad"), frame(99, &datum))]);

    let w = r.worker(&["--schema-registry", &url]);
    wait_applied(&r.cfg, &r.group, 4);
    let (code, out, err) = r.run(&["search", "files", "--under", "/reg", "--json"]);
    assert_eq!(code, 0, "{err}");
    let mut paths: Vec<String> = json_lines(&out).iter().map(|f| format!("{}/{}", f["path"].as_str().unwrap(), f["name"].as_str().unwrap())).collect();
    paths.sort();
    assert_eq!(paths, vec!["/reg/b/one.txt", "/reg/b/two.txt"]);
    assert_one_unknown_schema(&r, "schema id 99");
    // Id 41 was asked for once: resolved ids are cached.
    let asked = rt.block_on(server.received_requests()).unwrap().iter().filter(|q| q.url.path() == "/schemas/ids/41").count();
    assert_eq!(asked, 1);
    let (_, metrics) = w.http_get("/metrics");
    assert_eq!(metric(&metrics, "denorm_schema_registry_requests_total", &[("outcome", "found")]), 1.0, "{metrics}");
}

#[test]
fn an_unavailable_registry_degrades_the_worker_and_dead_letters_nothing() {
    let rt = rt();
    let r = Rig::new(1);
    let server = rt.block_on(MockServer::start());
    rt.block_on(Mock::given(method("GET")).and(path("/schemas/ids/41")).respond_with(error(503, 50003, "Error while forwarding the request to the primary")).mount(&server));
    let datum = Codec::new().datum(&Envelope::new(Command::UpsertFile { id: "u1".into(), path: "/up/a.txt".into(), contents: "x".into(), previous_path: None }));
    send_raw(&r.cfg, &[(Some("/up"), frame(41, &datum))]);
    let w = r.worker(&["--schema-registry", &server.uri(), "--retry-backoff-max-ms", "300"]);
    assert!(w.wait_for_log("schema registry unavailable", Duration::from_secs(30)), "{}", w.log());
    let body = wait_ready_status(&w, "503");
    assert!(body.contains("degraded"), "{body}");
    assert_eq!(r.dlq_count()["total"], 0, "nothing is dead-lettered while the registry is down");
    // The registry is back: the message is applied, still nothing dead-lettered.
    rt.block_on(async {
        server.reset().await;
        Mock::given(method("GET")).and(path("/schemas/ids/41")).respond_with(answer(200, serde_json::json!({ "schema": CURRENT_SCHEMA }))).mount(&server).await;
    });
    wait_applied(&r.cfg, &r.group, 1);
    wait_ready_status(&w, "200");
    assert_eq!(r.dlq_count()["total"], 0);
    let (code, out, err) = r.run(&["search", "files", "--under", "/up", "--json"]);
    assert_eq!((code, json_lines(&out).len()), (0, 1), "{err}");
}

/// The Avro schema of a model's commands, as `denorm schema --model`
/// prints it and a producer registers it.
fn model_schema(d: &'static denorm::domain::Domain) -> String {
    Codec::new().with_model(d).model_schema_text().unwrap().to_string()
}

fn load(path: &str) -> &'static denorm::domain::Domain {
    denorm::domain::Domain::load(std::path::Path::new(path)).unwrap().interned()
}

#[tokio::test]
async fn a_models_registry_framed_commands_are_read_with_its_own_and_its_earlier_versions_schemas() {
    use crate::model_pipeline::{MODEL, SHOP_V2};
    let (v1, v2) = (load(MODEL), load(SHOP_V2));
    let other = denorm::command::generic::legacy::domain();
    let server = MockServer::start().await;
    for (id, d) in [(51, v1), (52, v2), (53, other)] {
        Mock::given(method("GET")).and(path(format!("/schemas/ids/{id}"))).respond_with(answer(200, serde_json::json!({ "schema": model_schema(d) }))).mount(&server).await;
    }
    let r = Arc::new(registry(&server, &[]));
    let line = denorm::command::generic::jsonl::parse_all(v1, include_str!("../../models/shop.jsonl").as_bytes()).unwrap().remove(1);
    let written = Envelope::new(Command::Model(Box::new(denorm::command::generic::bound::Bound::new(v1, line.tenant.clone(), line.command.clone()))));
    let datum = Codec::new().with_model(v1).datum(&written);
    let foreign = Codec::new().with_model(other).datum(&Envelope::new(denorm::command::generic::legacy::command_of(other, &Envelope::new(Command::DeleteUser { id: "u1".into() }))));
    let (v1_codec, v2_codec, plain) = (
        Codec::new().with_model(v1).with_registry(r.clone(), tokio::runtime::Handle::current()),
        Codec::new().with_model(v2).with_registry(r.clone(), tokio::runtime::Handle::current()),
        Codec::new().with_registry(r.clone(), tokio::runtime::Handle::current()),
    );
    let decoded = tokio::task::spawn_blocking(move || {
        let mine = v1_codec.decode(&frame(51, &datum));
        let earlier = v2_codec.decode(&frame(51, &datum));
        let newer = v1_codec.decode(&frame(52, &datum));
        let foreign = v1_codec.decode(&frame(53, &foreign));
        let without = plain.decode(&frame(51, &datum));
        (mine, earlier, newer, foreign, without)
    })
    .await
    .unwrap();
    let (mine, earlier, newer, foreign, without) = decoded;
    let bound = |e: Result<Envelope, DecodeError>| match e {
        Ok(Envelope { command: Command::Model(b), .. }) => b,
        other => panic!("not a command of the model: {other:?}"),
    };
    let mine = bound(mine);
    assert!(std::ptr::eq(mine.domain, v1) && mine.validate().is_ok() && mine.command == line.command, "{mine:?}");
    // Version 1's schema id, read by a worker of version 2: bound to version 2.
    let earlier = bound(earlier);
    assert!(std::ptr::eq(earlier.domain, v2) && earlier.validate().is_ok() && earlier.command == line.command, "{earlier:?}");
    let unknown = |e: Result<Envelope, DecodeError>, id: u32, says: &[&str]| match e {
        Err(DecodeError::UnknownSchemaId { id: got, detail }) if got == id => assert!(says.iter().all(|s| detail.contains(s)), "{detail}"),
        other => panic!("schema id {id}: {other:?}"),
    };
    // A later version, another model, and a worker without a model are told apart, each named.
    unknown(newer, 52, &["the commands of model shop", "this worker reads model shop version 1"]);
    unknown(foreign, 53, &["the commands of model files_and_posts", "this worker reads model shop version 1"]);
    unknown(without, 51, &["the commands of model shop", "without --model"]);
}

#[test]
fn a_models_commands_are_registered_produced_in_registry_framing_applied_and_searched() {
    registered_produced_applied_and_searched(Rig::new(3));
}

#[test]
fn a_models_commands_are_registered_produced_in_registry_framing_applied_and_searched_on_elasticsearch() {
    registered_produced_applied_and_searched(Rig::elastic(3));
}

fn registered_produced_applied_and_searched(r: Rig) {
    use crate::model_pipeline::{assert_shop_searched, shop_log, shop_log_messages, with_model, MODEL};
    let rt = rt();
    let (shop, other) = (model_schema(load(MODEL)), model_schema(denorm::command::generic::legacy::domain()));
    let server = rt.block_on(async {
        let server = MockServer::start().await;
        let subject = format!("/subjects/{}-value", r.cfg.topic);
        Mock::given(method("POST")).and(path(subject.as_str())).respond_with(error(404, 40401, "Subject not found.")).mount(&server).await;
        // What is registered is the model's schema, once.
        Mock::given(method("POST"))
            .and(path(format!("{subject}/versions")))
            .and(body_json(serde_json::json!({ "schema": shop })))
            .respond_with(answer(200, serde_json::json!({"id": 51})))
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("GET")).and(path("/schemas/ids/51")).respond_with(answer(200, serde_json::json!({ "schema": shop }))).mount(&server).await;
        Mock::given(method("GET")).and(path("/schemas/ids/53")).respond_with(answer(200, serde_json::json!({ "schema": other }))).mount(&server).await;
        server
    });
    let url = server.uri();
    let log = r.dir().join("shop.jsonl");
    let text = shop_log();
    std::fs::write(&log, &text).unwrap();
    let w = r.worker(&["--model", MODEL, "--schema-registry", &url]);
    let (code, _, err) = output(with_model(&r, &["produce", "--wait", "120", "--schema-registry", &url, "--jsonl"]).arg(&log));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&format!("subject {}-value, schema id 51 (model shop version 1)", r.cfg.topic)), "{err}");
    // A registry-framed message of another model's schema.
    let files = denorm::command::generic::legacy::domain();
    let datum = Codec::new().with_model(files).datum(&Envelope::new(denorm::command::generic::legacy::command_of(files, &Envelope::new(Command::DeleteUser { id: "u1".into() }))));
    send_raw(&r.cfg, &[(Some("u1"), frame(53, &datum))]);
    wait_applied(&r.cfg, &r.group, shop_log_messages(&text) + 1);
    assert_shop_searched(&r);
    assert_one_unknown_schema(&r, "schema id 53: the commands of model files_and_posts");
    drop(w);
}
