//! The schema-registry client against recorded exchanges of Confluent's
//! Schema Registry REST API (v1): requests, answers and error bodies as its
//! API reference documents them. No registry server runs here (wiremock
//! plays it); see the README for what that does and does not prove.

use std::sync::Arc;

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
    Mock::given(method("POST"))
        .and(path("/subjects/denorm.commands-value/versions"))
        .and(body_json(&schema))
        .respond_with(answer(200, serde_json::json!({"id": 41})))
        .expect(1)
        .mount(&server)
        .await;
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
    Mock::given(method("GET"))
        .and(path("/schemas/ids/41"))
        .and(header(auth.0, auth.1))
        .respond_with(answer(200, serde_json::json!({ "schema": CURRENT_SCHEMA })))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET")).and(path("/schemas/ids/99")).respond_with(error(404, 40403, "Schema 99 not found")).mount(&server).await;
    Mock::given(method("GET"))
        .and(path("/schemas/ids/5"))
        .respond_with(answer(200, serde_json::json!({"schemaType": "PROTOBUF", "schema": "syntax = \"proto3\";"})))
        .mount(&server)
        .await;
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
