//! The bulk engine: bounded requests (documents and bytes), per-item
//! outcomes, and retries of only the items that failed with 429 or 5xx,
//! with jittered exponential backoff. A whole-request 429 or 5xx backs off
//! and resends the request; other statuses are answers.

use std::time::{Duration, Instant};

use elasticsearch::{BulkParts, Elasticsearch};
use metrics::{counter, histogram};
use serde_json::{json, Value};

use super::{is_retryable_status, ElasticError};
use crate::metrics as m;

/// One bulk action.
#[derive(Debug, Clone, PartialEq)]
pub enum BulkOp {
    /// Create or replace; with `if_seq_no` only if the document is unchanged
    /// since it was read.
    Index {
        index: String,
        id: String,
        source: Value,
        if_seq_no: Option<(i64, i64)>,
    },
    /// Create; fails with 409 when the document exists.
    Create {
        index: String,
        id: String,
        source: Value,
    },
    Delete {
        index: String,
        id: String,
        if_seq_no: Option<(i64, i64)>,
    },
}

impl BulkOp {
    pub fn id(&self) -> &str {
        match self {
            BulkOp::Index { id, .. } | BulkOp::Create { id, .. } | BulkOp::Delete { id, .. } => id,
        }
    }

    /// Its index (or alias) and id, taken out of it.
    fn into_target(self) -> (String, String) {
        match self {
            BulkOp::Index { index, id, .. } | BulkOp::Create { index, id, .. } | BulkOp::Delete { index, id, .. } => (index, id),
        }
    }

    /// The index (or alias) it writes.
    pub fn index(&self) -> &str {
        match self {
            BulkOp::Index { index, .. } | BulkOp::Create { index, .. } | BulkOp::Delete { index, .. } => index,
        }
    }

    /// The action's lines as `_bulk` takes them (newline-terminated), each
    /// serialized once: its size bounds the request, and the same bytes
    /// are sent again when it is retried.
    pub fn encode(&self) -> Vec<u8> {
        let (action, index, id, cond, source) = match self {
            BulkOp::Index { index, id, source, if_seq_no } => ("index", index, id, if_seq_no, Some(source)),
            BulkOp::Create { index, id, source } => ("create", index, id, &None, Some(source)),
            BulkOp::Delete { index, id, if_seq_no } => ("delete", index, id, if_seq_no, None),
        };
        let mut meta = json!({ "_index": index, "_id": id });
        if let Some(t) = super::names::routing(index, id) {
            meta["routing"] = json!(t);
        }
        if let Some((seq, term)) = cond {
            meta["if_seq_no"] = json!(seq);
            meta["if_primary_term"] = json!(term);
        }
        let mut out = Vec::with_capacity(128);
        // Serializing a `Value` to memory cannot fail.
        serde_json::to_writer(&mut out, &json!({ action: meta })).expect("serializing a bulk action");
        out.push(b'\n');
        if let Some(source) = source {
            serde_json::to_writer(&mut out, source).expect("serializing a document");
            out.push(b'\n');
        }
        out
    }
}

/// Bounds of one bulk request.
#[derive(Debug, Clone, Copy)]
pub struct BulkLimits {
    pub max_docs: usize,
    pub max_bytes: usize,
}

impl Default for BulkLimits {
    /// 1000 actions or 5 MiB, the usual starting point for bulk sizing.
    fn default() -> Self {
        BulkLimits { max_docs: 1000, max_bytes: 5 << 20 }
    }
}

/// Backoff of retries.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max: Duration,
    /// Give up after this many attempts of one request (0: never); the
    /// worker then retries the whole command.
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { initial: Duration::from_millis(100), max: Duration::from_secs(10), max_attempts: 10 }
    }
}

impl RetryPolicy {
    fn backoff(&self) -> crate::retry::Backoff {
        crate::retry::Backoff::new(self.initial, self.max)
    }
}

/// Outcome of one item of a bulk response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// 409: the document changed since it was read, or exists already.
    Conflict,
    /// 429 or 5xx: send again.
    Retry(u16),
    /// Rejected for good (mapping or parse error, ...).
    Failed {
        status: u16,
        reason: String,
    },
    /// The target index or alias is not there (every write requires an
    /// alias): the writer's generation was replaced (see `denorm rebuild`).
    Gone(String),
}

impl Outcome {
    /// The `outcome` label's values of `denorm_es_bulk_items_total`.
    const LABELS: [&'static str; 5] = ["done", "conflict", "retry", "failed", "gone"];

    fn label_index(&self) -> usize {
        match self {
            Outcome::Done => 0,
            Outcome::Conflict => 1,
            Outcome::Retry(_) => 2,
            Outcome::Failed { .. } => 3,
            Outcome::Gone(_) => 4,
        }
    }
}

/// Adds a response's items to `denorm_es_bulk_items_total`, per outcome.
fn count_outcomes(counts: &[u64; 5]) {
    for (label, n) in Outcome::LABELS.iter().zip(counts) {
        if *n > 0 {
            counter!(m::ES_BULK_ITEMS_TOTAL, "outcome" => *label).increment(*n);
        }
    }
}

/// Per-item outcomes of a bulk response, in request order. A delete of a
/// missing document is done.
pub fn classify(response: &Value) -> Result<Vec<Outcome>, ElasticError> {
    let items = response.get("items").and_then(Value::as_array).ok_or_else(|| ElasticError::Transport("bulk response has no items".into()))?;
    Ok(items
        .iter()
        .map(|item| {
            let (action, r) = item.as_object().and_then(|o| o.iter().next()).map(|(k, v)| (k.as_str(), v)).unwrap_or(("", &Value::Null));
            let status = r.get("status").and_then(Value::as_u64).unwrap_or(0) as u16;
            let error_type = r["error"].get("type").and_then(Value::as_str);
            match status {
                200..=299 => Outcome::Done,
                404 if error_type == Some(super::INDEX_NOT_FOUND) => Outcome::Gone(r["error"].get("reason").and_then(Value::as_str).unwrap_or_default().to_string()),
                404 if action == "delete" => Outcome::Done,
                409 => Outcome::Conflict,
                s if is_retryable_status(s) => Outcome::Retry(s),
                // The cluster's state, not the document: retried (the
                // worker keeps retrying past the attempt limit, degraded)
                // instead of dead-lettering every command meanwhile.
                s if error_type.is_some_and(is_operational) => Outcome::Retry(s),
                s => {
                    let e = &r["error"];
                    let reason = format!("{}: {}", e.get("type").and_then(Value::as_str).unwrap_or("error"), e.get("reason").and_then(Value::as_str).unwrap_or(""));
                    Outcome::Failed { status: s, reason }
                }
            }
        })
        .collect())
}

/// The version (`_seq_no`, `_primary_term`) each item of a bulk answer
/// wrote, in request order (`None` where it gave none: a failed item, a
/// delete of a missing document).
fn written_versions(response: &Value) -> Vec<Option<(i64, i64)>> {
    let items = response.get("items").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    items
        .iter()
        .map(|item| {
            let r = item.as_object().and_then(|o| o.values().next())?;
            Some((r.get("_seq_no")?.as_i64()?, r.get("_primary_term")?.as_i64()?))
        })
        .collect()
}

/// Error types of a bulk item that say something about the cluster or
/// the credentials, not the document: a write block during maintenance
/// (`cluster_block_exception`), a closed index, privileges removed
/// (`security_exception`), a shard not available. Elasticsearch answers
/// them per item (403, 400 or 503 inside a 200): they are retried, never
/// dead-lettered.
pub const OPERATIONAL_ERRORS: &[&str] =
    &["cluster_block_exception", "index_closed_exception", "security_exception", "unavailable_shards_exception", "no_shard_available_action_exception", "es_rejected_execution_exception"];

fn is_operational(error_type: &str) -> bool {
    OPERATIONAL_ERRORS.contains(&error_type)
}

/// An item written: the index or alias, the id, the version written.
pub type Written = (String, String, Option<(i64, i64)>);

/// What a bulk execution did.
#[derive(Debug, Default)]
pub struct BulkReport {
    pub done: usize,
    /// The items written (index or alias, id, and the version written,
    /// when the answer gave it), in the order of the answers.
    pub written: Vec<Written>,
    pub conflicts: Vec<BulkOp>,
    pub failed: Vec<(BulkOp, String)>,
    /// Bulk requests sent, retries included.
    pub requests: u32,
}

impl BulkReport {
    /// Items Elasticsearch refused for good (mapping or parse errors) fail
    /// the operation permanently: the worker then finds the command they
    /// belong to and dead-letters it.
    pub fn refused(&self) -> Result<(), crate::index::IndexError> {
        match self.failed.first() {
            None => Ok(()),
            Some((op, reason)) => Err(crate::index::IndexError::Rejected(format!("{} document(s) refused, first {}: {reason}", self.failed.len(), op.id()))),
        }
    }
}

/// How long Elasticsearch waits, within a bulk, for what its actions need
/// (unavailable primaries, index creation, mapping updates) before it
/// answers them with an error (its `timeout`, 1 m by default): below the
/// client's timeout ([`super::config::REQUEST_TIMEOUT`]), so that the
/// server gives up first and the client never sends again a request the
/// server still works on (review F8).
pub const SERVER_WAIT: &str = "30s";

/// Sends `ops` in bounded requests, retrying what failed transiently.
pub async fn execute(client: &Elasticsearch, ops: Vec<BulkOp>, limits: BulkLimits, policy: RetryPolicy) -> Result<BulkReport, ElasticError> {
    let mut report = BulkReport::default();
    let mut chunk = Vec::new();
    let mut bytes = 0;
    for op in ops {
        let encoded = op.encode();
        let size = encoded.len();
        if !chunk.is_empty() && (chunk.len() >= limits.max_docs || bytes + size > limits.max_bytes) {
            send(client, std::mem::take(&mut chunk), policy, &mut report).await?;
            bytes = 0;
        }
        bytes += size;
        chunk.push((op, encoded));
    }
    if !chunk.is_empty() {
        send(client, chunk, policy, &mut report).await?;
    }
    Ok(report)
}

/// One request of `ops` (each with its encoding), resent while items or
/// the whole request fail transiently.
async fn send(client: &Elasticsearch, mut ops: Vec<(BulkOp, Vec<u8>)>, policy: RetryPolicy, report: &mut BulkReport) -> Result<(), ElasticError> {
    let mut attempt = 0u32;
    loop {
        // Each encoding ends with a newline, so the body adds none.
        let body: Vec<&[u8]> = ops.iter().map(|(_, encoded)| encoded.as_slice()).collect();
        let started = Instant::now();
        report.requests += 1;
        // Every action names an alias: never let Elasticsearch create an
        // index on its own (a removed generation's alias must stay gone).
        let sent = client.bulk(BulkParts::None).require_alias(true).timeout(SERVER_WAIT).body(body).send().await;
        histogram!(m::ES_BULK_SECONDS).record(started.elapsed().as_secs_f64());
        let retry_reason = match sent {
            // Counted apart: a request the server may still be working on.
            Err(e) if e.is_timeout() => format!("timeout: {e}"),
            Err(e) => format!("transport: {e}"),
            Ok(r) => {
                let status = r.status_code().as_u16();
                if is_retryable_status(status) {
                    format!("status {status}")
                } else if !(200..300).contains(&status) {
                    let body = r.text().await.unwrap_or_default();
                    return Err(ElasticError::Status { what: "bulk request".into(), status, body: body.chars().take(2000).collect() });
                } else {
                    let json: Value = r.json().await?;
                    let outcomes = classify(&json)?;
                    let versions = written_versions(&json);
                    if outcomes.len() != ops.len() {
                        return Err(ElasticError::Transport(format!("bulk response has {} items for {} actions", outcomes.len(), ops.len())));
                    }
                    let mut again = Vec::new();
                    // Counted per label once per response, not per item.
                    let mut counts = [0u64; 5];
                    for (((op, encoded), outcome), version) in ops.into_iter().zip(outcomes).zip(versions) {
                        counts[outcome.label_index()] += 1;
                        match outcome {
                            Outcome::Done => {
                                report.done += 1;
                                let (index, id) = op.into_target();
                                report.written.push((index, id, version));
                            }
                            Outcome::Conflict => report.conflicts.push(op),
                            Outcome::Retry(_) => again.push((op, encoded)),
                            Outcome::Failed { status, reason } => {
                                tracing::error!(id = op.id(), status, %reason, "document rejected by elasticsearch");
                                report.failed.push((op, reason));
                            }
                            // Nothing of this request can be kept: the
                            // writer starts over on the new generation.
                            Outcome::Gone(reason) => {
                                count_outcomes(&counts);
                                return Err(ElasticError::Gone(reason));
                            }
                        }
                    }
                    count_outcomes(&counts);
                    if again.is_empty() {
                        return Ok(());
                    }
                    ops = again;
                    "items 429/5xx".to_string()
                }
            }
        };
        attempt += 1;
        let label = match retry_reason.split(':').next().unwrap_or_default() {
            "items 429/5xx" => "items",
            "timeout" => "timeout",
            _ => "request",
        };
        counter!(m::ES_RETRIES_TOTAL, "reason" => label).increment(1);
        if policy.max_attempts > 0 && attempt >= policy.max_attempts {
            return Err(ElasticError::RetriesExhausted { attempts: attempt, reason: retry_reason });
        }
        tracing::warn!(attempt, reason = %retry_reason, actions = ops.len(), "bulk request retried");
        tokio::time::sleep(policy.backoff().jittered(attempt)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_mixed_item_results() {
        let r = json!({"errors": true, "items": [
            {"index": {"_id": "a", "status": 201}},
            {"index": {"_id": "b", "status": 200}},
            {"index": {"_id": "c", "status": 409, "error": {"type": "version_conflict_engine_exception"}}},
            {"index": {"_id": "d", "status": 429, "error": {"type": "es_rejected_execution_exception"}}},
            {"index": {"_id": "e", "status": 500}},
            {"index": {"_id": "f", "status": 400, "error": {"type": "mapper_parsing_exception", "reason": "failed to parse"}}},
            {"delete": {"_id": "g", "status": 404, "result": "not_found"}},
            {"delete": {"_id": "h", "status": 404, "error": {"type": "index_not_found_exception", "reason": "no such index [denorm-files-g0]"}}},
        ]});
        assert_eq!(
            classify(&r).unwrap(),
            vec![
                Outcome::Done,
                Outcome::Done,
                Outcome::Conflict,
                Outcome::Retry(429),
                Outcome::Retry(500),
                Outcome::Failed { status: 400, reason: "mapper_parsing_exception: failed to parse".into() },
                Outcome::Done,
                Outcome::Gone("no such index [denorm-files-g0]".into()),
            ]
        );
    }

    /// Issue 27 B5: a write block, a closed index or removed privileges
    /// answered per item are retried, not refused for good (which
    /// dead-lettered the command).
    #[test]
    fn operational_item_errors_are_retried_not_refused() {
        let item = |status: u16, ty: &str| json!({"index": {"_id": "a", "status": status, "error": {"type": ty, "reason": "..."}}});
        let r = json!({"errors": true, "items": [
            item(403, "cluster_block_exception"),
            item(400, "index_closed_exception"),
            item(403, "security_exception"),
            item(400, "document_parsing_exception"),
        ]});
        assert_eq!(classify(&r).unwrap(), vec![Outcome::Retry(403), Outcome::Retry(400), Outcome::Retry(403), Outcome::Failed { status: 400, reason: "document_parsing_exception: ...".into() },]);
    }

    #[test]
    fn renders_conditional_writes() {
        let lines = |op: &BulkOp| -> Vec<Value> {
            let text = String::from_utf8(op.encode()).unwrap();
            assert!(text.ends_with('\n'), "{text:?}");
            text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
        };
        let op = BulkOp::Index { index: "i".into(), id: "1".into(), source: json!({"a": 1}), if_seq_no: Some((7, 2)) };
        assert_eq!(lines(&op), vec![json!({"index": {"_index": "i", "_id": "1", "if_seq_no": 7, "if_primary_term": 2}}), json!({"a": 1})]);
        let create = BulkOp::Create { index: "i".into(), id: "2".into(), source: json!({"b": "x\ny"}) };
        assert_eq!(lines(&create), vec![json!({"create": {"_index": "i", "_id": "2"}}), json!({"b": "x\ny"})]);
        let del = BulkOp::Delete { index: "i".into(), id: "1".into(), if_seq_no: None };
        assert_eq!(lines(&del), vec![json!({"delete": {"_index": "i", "_id": "1"}})]);
        // A tenant's document is routed by its tenant (issue 47).
        let routed = BulkOp::Delete { index: "i".into(), id: "acme\u{1f}1".into(), if_seq_no: None };
        assert_eq!(lines(&routed), vec![json!({"delete": {"_index": "i", "_id": "acme\u{1f}1", "routing": "acme"}})]);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy { initial: Duration::from_millis(100), max: Duration::from_secs(1), max_attempts: 0 };
        assert!(p.backoff().jittered(1) <= Duration::from_millis(200));
        assert!(p.backoff().jittered(10) <= Duration::from_secs(1) && p.backoff().jittered(10) >= Duration::from_millis(500));
    }
}
