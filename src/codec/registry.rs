//! A Confluent Schema Registry client: the framing most Kafka shops'
//! serializers write (magic byte `0`, 4-byte big-endian schema id, binary
//! datum), following the registry's REST API (v1).
//!
//! - The worker resolves a message's schema id once (`GET /schemas/ids/ID`)
//!   and caches it for the life of the process: ids are immutable.
//! - An id the registry does not know (404) is final: the message is
//!   dead-lettered as `unknown_schema` with the id in the detail.
//! - Anything else (unreachable, timeouts, 5xx, 401/403, 429) is transient:
//!   the worker retries and reports degraded; a valid message is never
//!   dead-lettered because the registry is down.
//! - `denorm produce` looks the subject up (`POST /subjects/SUBJECT`) and
//!   registers the schema when it is new (`POST /subjects/SUBJECT/versions`).
//!
//! Credentials come from `DENORM_SCHEMA_REGISTRY_*` (values or files), never
//! from the URL, and never appear in logs or errors.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use apache_avro::schema::Schema;
use metrics::counter;
use reqwest::{StatusCode, Url};

use crate::secret::{read_secret, Secret};

/// Content type of the registry's API, version 1.
pub const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// Environment variables read by [`RegistryConfig::from_lookup`].
pub mod env {
    pub const URL: &str = "DENORM_SCHEMA_REGISTRY_URL";
    pub const USERNAME: &str = "DENORM_SCHEMA_REGISTRY_USERNAME";
    pub const PASSWORD: &str = "DENORM_SCHEMA_REGISTRY_PASSWORD";
    pub const PASSWORD_FILE: &str = "DENORM_SCHEMA_REGISTRY_PASSWORD_FILE";
    pub const CA_CERT: &str = "DENORM_SCHEMA_REGISTRY_CA_CERT";
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("schema registry configuration: {0}")]
    Config(String),
    /// The registry does not know the schema id (final).
    #[error("schema id {id} is not in the schema registry ({message})")]
    UnknownId { id: u32, message: String },
    /// The registry refused a request for good (an incompatible or invalid
    /// schema, an unknown subject on lookup).
    #[error("schema registry refused {what}: HTTP {status}, error code {code}: {message}")]
    Refused { what: String, status: u16, code: i64, message: String },
    /// Unreachable, overloaded, or not letting us in: try again later.
    #[error("schema registry unavailable: {0}")]
    Unavailable(String),
    /// The registry answered something that is not a usable Avro schema.
    #[error("schema id {id}: {message}")]
    BadSchema { id: u32, message: String },
}

impl RegistryError {
    /// Whether a later retry may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, RegistryError::Unavailable(_))
    }
}

/// Where and how to reach the registry.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    pub url: Url,
    /// Basic authentication (`username`, password).
    pub basic: Option<(String, Secret)>,
    /// PEM file of a CA certificate to trust.
    pub ca_cert: Option<PathBuf>,
    pub timeout: Duration,
}

impl RegistryConfig {
    /// Settings for `url`, credentials from `lookup` (the environment in
    /// production; a map in tests).
    pub fn from_lookup(url: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, RegistryError> {
        let config = |m: String| RegistryError::Config(m);
        let mut url = Url::parse(url).map_err(|e| config(format!("{url:?} is not a URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(config(format!("{url} must be http:// or https://")));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(config(format!("put credentials in {} / {} (or {}), not in the URL", env::USERNAME, env::PASSWORD, env::PASSWORD_FILE)));
        }
        // Paths are joined below the URL's own path (a registry behind a
        // prefix): it must end with a slash for that.
        if !url.path().ends_with('/') {
            url.set_path(&format!("{}/", url.path()));
        }
        let password = read_secret(&lookup, env::PASSWORD, env::PASSWORD_FILE).map_err(config)?;
        let basic = match (lookup(env::USERNAME), password) {
            (Some(u), Some(p)) => Some((u, p)),
            (None, None) => None,
            (Some(_), None) => return Err(config(format!("{} is set but no password", env::USERNAME))),
            (None, Some(_)) => return Err(config(format!("a password is set but no {}", env::USERNAME))),
        };
        Ok(RegistryConfig { url, basic, ca_cert: lookup(env::CA_CERT).map(PathBuf::from), timeout: Duration::from_secs(10) })
    }

    pub fn from_env(url: &str) -> Result<Self, RegistryError> {
        Self::from_lookup(url, |k| std::env::var(k).ok())
    }
}

/// A writer schema resolved from the registry.
#[derive(Debug)]
pub struct Writer {
    pub schema: Schema,
    /// CRC-64-AVRO of its Parsing Canonical Form (little-endian): the
    /// fingerprint the same schema has in single-object encoding (none
    /// when denorm's canonical form does not read it: then it is no
    /// model's schema, and it decodes as the compiled-in commands').
    pub fingerprint: Option<[u8; 8]>,
}

/// A registry client with a cache of resolved schema ids.
pub struct Registry {
    cfg: RegistryConfig,
    http: reqwest::Client,
    cache: Mutex<HashMap<u32, Arc<Writer>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

/// The registry's error body: `{"error_code": 40403, "message": "..."}`.
#[derive(serde::Deserialize, Default)]
struct ErrorBody {
    #[serde(default)]
    error_code: i64,
    #[serde(default)]
    message: String,
}

impl Registry {
    pub fn new(cfg: RegistryConfig) -> Result<Self, RegistryError> {
        let mut b = reqwest::Client::builder().timeout(cfg.timeout).connect_timeout(cfg.timeout);
        if let Some(path) = &cfg.ca_cert {
            let pem = std::fs::read(path).map_err(|e| RegistryError::Config(format!("cannot read CA certificate {}: {e}", path.display())))?;
            let cert = reqwest::Certificate::from_pem(&pem).map_err(|e| RegistryError::Config(format!("CA certificate {}: {e}", path.display())))?;
            b = b.add_root_certificate(cert);
        }
        let http = b.build().map_err(|e| RegistryError::Config(e.to_string()))?;
        Ok(Registry { cfg, http, cache: Mutex::new(HashMap::new()) })
    }

    pub fn url(&self) -> &Url {
        &self.cfg.url
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let url = self.cfg.url.join(path).expect("registry paths are relative URLs");
        let mut r = self.http.request(method, url).header(reqwest::header::ACCEPT, CONTENT_TYPE);
        if let Some((user, password)) = &self.cfg.basic {
            r = r.basic_auth(user, Some(password.expose()));
        }
        r
    }

    /// Sends `r`; the body of a 2xx answer, or the status and error body.
    async fn send(r: reqwest::RequestBuilder) -> Result<Result<serde_json::Value, (StatusCode, ErrorBody)>, RegistryError> {
        // The error is shown without its URL's query or credentials: the
        // URL holds neither (credentials travel in a header).
        let resp = r.send().await.map_err(|e| RegistryError::Unavailable(e.without_url().to_string()))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| RegistryError::Unavailable(e.without_url().to_string()))?;
        if status.is_success() {
            return serde_json::from_str(&text).map(Ok).map_err(|e| RegistryError::Unavailable(format!("unreadable answer (HTTP {status}): {e}")));
        }
        let body = serde_json::from_str::<ErrorBody>(&text).unwrap_or_else(|_| ErrorBody { error_code: 0, message: text.chars().take(200).collect() });
        Ok(Err((status, body)))
    }

    /// The writer schema of `id`, from the cache or the registry.
    pub async fn schema(&self, id: u32) -> Result<Arc<Writer>, RegistryError> {
        if let Some(s) = self.cache.lock().expect("cache lock").get(&id) {
            return Ok(s.clone());
        }
        let outcome = |o: &'static str| counter!(crate::metrics::SCHEMA_REGISTRY_REQUESTS_TOTAL, "outcome" => o).increment(1);
        let answer = match Self::send(self.request(reqwest::Method::GET, &format!("schemas/ids/{id}"))).await {
            Ok(a) => a,
            Err(e) => {
                outcome("error");
                return Err(e);
            }
        };
        let body = match answer {
            Ok(body) => body,
            Err((StatusCode::NOT_FOUND, e)) => {
                outcome("not_found");
                return Err(RegistryError::UnknownId { id, message: format!("error code {}: {}", e.error_code, e.message) });
            }
            Err((status, e)) => {
                outcome("error");
                return Err(RegistryError::Unavailable(format!("HTTP {status} for schema id {id}, error code {}: {}", e.error_code, e.message)));
            }
        };
        outcome("found");
        let bad = |message: String| RegistryError::BadSchema { id, message };
        // Absent means AVRO; the registry also holds JSON Schema and Protobuf.
        if let Some(t) = body.get("schemaType").and_then(|t| t.as_str()).filter(|t| *t != "AVRO") {
            return Err(bad(format!("is a {t} schema, not Avro")));
        }
        let text = body.get("schema").and_then(|s| s.as_str()).ok_or_else(|| bad("the registry's answer has no \"schema\"".into()))?;
        let schema = Schema::parse_str(text).map_err(|e| bad(format!("not a valid Avro schema: {e}")))?;
        if let Some(name) = recursive_record(&schema) {
            // A datum of it may nest without bound, and Avro decoding
            // recurses: a deep one would overflow the applier's stack.
            return Err(bad(format!("is recursive (record {name} contains itself), which no command schema is: refused")));
        }
        let fingerprint = super::canonical::fingerprint(text).ok();
        let writer = Arc::new(Writer { schema, fingerprint });
        self.cache.lock().expect("cache lock").insert(id, writer.clone());
        Ok(writer)
    }

    /// The id of `schema` under `subject`: looked up, and registered when
    /// it is not there yet and `register` is set.
    pub async fn id_for(&self, subject: &str, schema: &str, register: bool) -> Result<u32, RegistryError> {
        let subject_path = encode_segment(subject);
        let body = serde_json::json!({ "schema": schema });
        let lookup = self.request(reqwest::Method::POST, &format!("subjects/{subject_path}")).header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE).json(&body);
        let refused = |what: String, status: StatusCode, e: ErrorBody| RegistryError::Refused { what, status: status.as_u16(), code: e.error_code, message: e.message };
        match Self::send(lookup).await? {
            Ok(found) => return id_of(&found),
            // 40401: no such subject; 40403: the schema is not in it.
            Err((StatusCode::NOT_FOUND, _)) if register => {}
            Err((StatusCode::NOT_FOUND, e)) => return Err(refused(format!("the lookup of the schema under subject {subject:?} (registration is off)"), StatusCode::NOT_FOUND, e)),
            Err((status, e)) if is_transient(status) => return Err(RegistryError::Unavailable(format!("HTTP {status} looking up subject {subject:?}: {}", e.message))),
            Err((status, e)) => return Err(refused(format!("the lookup under subject {subject:?}"), status, e)),
        }
        let reg = self.request(reqwest::Method::POST, &format!("subjects/{subject_path}/versions")).header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE).json(&body);
        match Self::send(reg).await? {
            Ok(created) => id_of(&created),
            Err((status, e)) if is_transient(status) => Err(RegistryError::Unavailable(format!("HTTP {status} registering under subject {subject:?}: {}", e.message))),
            Err((status, e)) => Err(refused(format!("the registration under subject {subject:?}"), status, e)),
        }
    }

    /// [`Registry::schema`] from a thread outside the async runtime.
    pub fn schema_blocking(&self, runtime: &tokio::runtime::Handle, id: u32) -> Result<Arc<Writer>, RegistryError> {
        if let Some(s) = self.cache.lock().expect("cache lock").get(&id) {
            return Ok(s.clone());
        }
        runtime.block_on(self.schema(id))
    }
}

fn is_transient(status: StatusCode) -> bool {
    status.is_server_error() || matches!(status, StatusCode::TOO_MANY_REQUESTS | StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::REQUEST_TIMEOUT)
}

fn id_of(body: &serde_json::Value) -> Result<u32, RegistryError> {
    body.get("id").and_then(|v| v.as_u64()).and_then(|v| u32::try_from(v).ok()).ok_or_else(|| RegistryError::Unavailable(format!("the registry's answer has no schema id: {body}")))
}

/// Percent-encodes a subject for a URL path segment.
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The subject of a topic's message values under the default
/// TopicNameStrategy.
pub fn value_subject(topic: &str) -> String {
    format!("{topic}-value")
}

/// The Confluent wire framing: magic byte 0 and the schema id, big-endian.
pub fn frame(id: u32, datum: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + datum.len());
    out.push(0);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(datum);
    out
}

/// The first record of `schema` that contains itself (through a field, an
/// array, a map or a union), by its full name.
pub fn recursive_record(schema: &Schema) -> Option<String> {
    fn walk<'a>(s: &'a Schema, enclosing: &mut Vec<&'a apache_avro::schema::Name>) -> Option<String> {
        match s {
            Schema::Record(r) => {
                enclosing.push(&r.name);
                let found = r.fields.iter().find_map(|f| walk(&f.schema, enclosing));
                enclosing.pop();
                found
            }
            Schema::Array(a) => walk(&a.items, enclosing),
            Schema::Map(m) => walk(&m.types, enclosing),
            Schema::Union(u) => u.variants().iter().find_map(|v| walk(v, enclosing)),
            Schema::Ref { name } => enclosing.iter().any(|e| e.fullname(None) == name.fullname(None)).then(|| name.fullname(None)),
            _ => None,
        }
    }
    walk(schema, &mut Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recursive_writer_schemas_are_told_apart_from_shared_named_types() {
        let linked = Schema::parse_str(r#"{"type":"record","name":"N","namespace":"x","fields":[{"name":"n","type":["null","N"]}]}"#).unwrap();
        assert_eq!(recursive_record(&linked).as_deref(), Some("x.N"));
        let deep = Schema::parse_str(
            r#"{"type":"record","name":"T","fields":[{"name":"kids","type":{"type":"array","items":{"type":"record","name":"K","fields":[{"name":"t","type":{"type":"map","values":"T"}}]}}}]}"#,
        )
        .unwrap();
        assert_eq!(recursive_record(&deep).as_deref(), Some("T"));
        // A named type used twice is not recursion.
        let shared =
            Schema::parse_str(r#"{"type":"record","name":"P","fields":[{"name":"a","type":{"type":"record","name":"Q","fields":[{"name":"v","type":"int"}]}},{"name":"b","type":"Q"}]}"#).unwrap();
        assert_eq!(recursive_record(&shared), None);
        // denorm's own schemas, every version: none is recursive.
        let ours = [crate::codec::CURRENT_SCHEMA, crate::codec::CONTROL_SCHEMA, crate::codec::MOVE_SCHEMA]
            .into_iter()
            .chain(crate::codec::HISTORY.iter().copied())
            .chain(crate::codec::MOVE_HISTORY.iter().copied());
        for text in ours {
            assert_eq!(recursive_record(&Schema::parse_str(text).unwrap()), None, "{text}");
        }
    }

    #[test]
    fn config_reads_credentials_from_the_environment_only() {
        let vars: HashMap<&str, &str> = [(env::USERNAME, "svc"), (env::PASSWORD, "hunter2")].into_iter().collect();
        let c = RegistryConfig::from_lookup("https://sr.example:8081/prefix", |k| vars.get(k).map(|v| v.to_string())).unwrap();
        assert_eq!(c.url.as_str(), "https://sr.example:8081/prefix/");
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(RegistryConfig::from_lookup("http://u:p@sr:8081", |_| None).is_err());
        assert!(RegistryConfig::from_lookup("ftp://sr", |_| None).is_err());
        assert!(RegistryConfig::from_lookup("http://sr", |k| (k == env::USERNAME).then(|| "u".to_string())).is_err());
    }

    #[test]
    fn frames_and_encodes_subjects() {
        assert_eq!(frame(0x01020304, &[9]), vec![0, 1, 2, 3, 4, 9]);
        assert_eq!(encode_segment("denorm.commands-value"), "denorm.commands-value");
        assert_eq!(encode_segment("a/b c"), "a%2Fb%20c");
        assert_eq!(value_subject("t"), "t-value");
    }
}
