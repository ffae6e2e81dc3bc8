//! Elasticsearch backend, through the official `elasticsearch` crate.
//!
//! Built so far (issue 3, in progress): client construction with basic or
//! API-key authentication and a custom CA ([`config`]), index setup with
//! concrete indexes behind aliases and mapping-conflict detection
//! ([`setup`]), and the bulk engine that retries only the failed items
//! ([`bulk`]). The `Shard`/`SearchIndex` implementations come next; until
//! then the CLI refuses `--index http://...`.

pub mod bulk;
pub mod config;
pub mod docs;
pub mod search;
pub mod setup;
pub mod shard;

/// Failures talking to Elasticsearch.
#[derive(Debug, thiserror::Error)]
pub enum ElasticError {
    #[error("elasticsearch transport: {0}")]
    Transport(String),
    #[error("elasticsearch answered {status} to {what}: {body}")]
    Status { what: String, status: u16, body: String },
    #[error("mapping conflict in {index}: field {field} is {found}, denorm needs {expected}")]
    MappingConflict { index: String, field: String, expected: String, found: String },
    #[error("invalid elasticsearch configuration: {0}")]
    Config(String),
    #[error("bulk request gave up after {attempts} attempts: {reason}")]
    RetriesExhausted { attempts: u32, reason: String },
}

impl ElasticError {
    /// Whether retrying later may succeed: transport errors, 429 and 5xx.
    pub fn is_retryable(&self) -> bool {
        match self {
            ElasticError::Transport(_) | ElasticError::RetriesExhausted { .. } => true,
            ElasticError::Status { status, .. } => is_retryable_status(*status),
            ElasticError::MappingConflict { .. } | ElasticError::Config(_) => false,
        }
    }
}

/// 429 and 5xx are transient; other statuses are answers.
pub fn is_retryable_status(status: u16) -> bool {
    status == 429 || (500..600).contains(&status)
}

impl From<elasticsearch::Error> for ElasticError {
    fn from(e: elasticsearch::Error) -> Self {
        ElasticError::Transport(e.to_string())
    }
}

/// Reads a response: JSON body on 2xx, [`ElasticError::Status`] otherwise.
pub(crate) async fn json_or_status(what: &str, r: elasticsearch::http::response::Response) -> Result<serde_json::Value, ElasticError> {
    let status = r.status_code().as_u16();
    if (200..300).contains(&status) {
        return r.json().await.map_err(ElasticError::from);
    }
    let body = r.text().await.unwrap_or_default();
    Err(ElasticError::Status { what: what.to_string(), status, body: body.chars().take(2000).collect() })
}
