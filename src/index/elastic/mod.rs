//! Elasticsearch backend, through the official `elasticsearch` crate.
//!
//! By role, each module importing only those above it in this list:
//! - no I/O: [`names`] (indexes, aliases, meta documents, bookkeeping
//!   fields), [`mapping`] (settings, mappings, and how a found mapping is
//!   compared), [`conflict`] (who wins where two partitions' writers meet),
//!   [`docs`] (documents to and from `_source`, tombstones, scans);
//! - client helpers: this module (errors, response checks), [`config`]
//!   (client construction with basic or API-key authentication and a
//!   custom CA), [`bulk`] (the bulk engine that retries only the failed
//!   items), [`meta`] (reads by id, meta documents and checkpoints),
//!   [`placement`] (which tenants have indexes of their own);
//! - [`generations`] (index generations for `denorm rebuild`), [`setup`]
//!   (startup: what exists, what is missing, the mapping check),
//!   [`tombstones`] (the sweep of expired ones), [`search`];
//! - [`backend`]: the connection and the state its writers share;
//! - [`shard`]: the backend's operations ([`crate::index::Backend`]) and its
//!   shard writers.

pub mod backend;
pub mod bulk;
pub mod bulk_load;
mod coming;
pub mod config;
pub mod conflict;
mod dependents;
pub mod docs;
mod fanout;
pub mod generations;
pub mod grouped;
pub mod mapping;
pub mod meta;
pub mod model;
pub mod names;
mod ops;
pub mod parked;
pub mod placement;
mod recent;
pub mod search;
pub mod setup;
pub mod shard;
pub mod tenants;
pub mod tombstones;

pub use docs::EsWhole;
pub(crate) use fanout::EsPages;

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
    /// The index or alias is not there (`index_not_found_exception`): for a
    /// shard writer, its generation was replaced by a rebuild's cutover.
    #[error("index gone: {0}")]
    Gone(String),
    /// A scan's point in time expired (404
    /// `search_context_missing_exception`): the scan starts again.
    #[error("scan context expired: {0}")]
    ScanExpired(String),
    /// A search page some shards did not answer, or that timed out: its
    /// matches are incomplete, so it is not used.
    #[error("incomplete search results: {0}")]
    Incomplete(String),
}

impl ElasticError {
    /// Whether retrying later may succeed: transport errors, 429 and 5xx,
    /// and 401/403: credentials and privileges are the deployment's, not
    /// the command's, so the partition waits for an operator to fix them
    /// instead of dead-lettering every command meanwhile.
    pub fn is_retryable(&self) -> bool {
        match self {
            // A writer whose generation is gone follows the new one when
            // it retries (see `denorm rebuild`).
            ElasticError::Transport(_) | ElasticError::RetriesExhausted { .. } | ElasticError::Gone(_) | ElasticError::ScanExpired(_) | ElasticError::Incomplete(_) => true,
            ElasticError::Status { status, .. } => is_retryable_status(*status) || matches!(status, 401 | 403),
            ElasticError::MappingConflict { .. } | ElasticError::Config(_) => false,
        }
    }
}

/// 429 and 5xx are transient; other statuses are answers.
pub fn is_retryable_status(status: u16) -> bool {
    status == 429 || (500..600).contains(&status)
}

impl From<elasticsearch::Error> for ElasticError {
    /// The error with its causes, which say what failed under "error
    /// sending request" (a refused certificate, a refused connection).
    fn from(e: elasticsearch::Error) -> Self {
        ElasticError::Transport(with_causes(&e))
    }
}

/// An error's message followed by each of its sources' that adds to it.
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// Reads a response: JSON body on 2xx, [`ElasticError::Gone`] on a missing
/// index or alias, [`ElasticError::Status`] otherwise.
pub(crate) async fn json_or_status(what: &str, r: elasticsearch::http::response::Response) -> Result<serde_json::Value, ElasticError> {
    let status = r.status_code().as_u16();
    if (200..300).contains(&status) {
        return r.json().await.map_err(ElasticError::from);
    }
    let body = r.text().await.unwrap_or_default();
    Err(status_error(what, status, &body))
}

/// [`json_or_status`] for answers that report shards (searches,
/// refreshes): one some shards failed to answer, or that timed out, is an
/// [`ElasticError::Incomplete`], never used as if it were whole.
pub async fn complete_json(what: &str, r: elasticsearch::http::response::Response) -> Result<serde_json::Value, ElasticError> {
    let v = json_or_status(what, r).await?;
    match incomplete(what, &v) {
        Some(e) => Err(e),
        None => Ok(v),
    }
}

/// The error of a non-2xx answer to `what`.
pub(crate) fn status_error(what: &str, status: u16, body: &str) -> ElasticError {
    if status == 404 && body.contains(INDEX_NOT_FOUND) {
        return ElasticError::Gone(format!("{what}: {}", body.chars().take(500).collect::<String>()));
    }
    if status == 404 && body.contains(SEARCH_CONTEXT_MISSING) {
        return ElasticError::ScanExpired(format!("{what}: {}", body.chars().take(500).collect::<String>()));
    }
    ElasticError::Status { what: what.to_string(), status, body: body.chars().take(2000).collect() }
}

/// The error type of a request to a missing index or alias.
pub(crate) const INDEX_NOT_FOUND: &str = "index_not_found_exception";

/// The error type of a search through an expired point in time.
pub(crate) const SEARCH_CONTEXT_MISSING: &str = "search_context_missing_exception";

/// A search response some shards failed to answer, or that timed out.
pub(crate) fn incomplete(what: &str, v: &serde_json::Value) -> Option<ElasticError> {
    let failed = v["_shards"]["failed"].as_u64().unwrap_or(0);
    if failed > 0 {
        let total = v["_shards"]["total"].as_u64().unwrap_or(0);
        let reason = v["_shards"]["failures"][0]["reason"]["reason"].as_str().unwrap_or("no reason given");
        return Some(ElasticError::Incomplete(format!("{what}: {failed} of {total} shards failed (first: {reason})")));
    }
    if v["timed_out"].as_bool() == Some(true) {
        return Some(ElasticError::Incomplete(format!("{what}: the search timed out")));
    }
    None
}

#[cfg(test)]
mod tests {
    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("error sending request")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn an_error_is_told_with_its_causes() {
        let e = Outer(std::io::Error::other("invalid peer certificate: UnknownIssuer"));
        assert_eq!(super::with_causes(&e), "error sending request: invalid peer certificate: UnknownIssuer");
    }
}
