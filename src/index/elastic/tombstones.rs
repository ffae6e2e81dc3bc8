//! Tombstones (what a delete leaves on Elasticsearch, see
//! docs/elasticsearch.md) and their removal once expired: one sweep per
//! generation and [`SWEEP_EVERY`], claimed through a meta document so that
//! the writers of all partitions start one between them.

use elasticsearch::Elasticsearch;
use serde_json::{json, Value};

use super::meta::{get_source, put_meta_if};
use super::names::{meta_id, meta_index, DELETED_AT_FIELD, DELETED_FIELD, SWEEP};
use super::{json_or_status, ElasticError};

/// How long a tombstone is kept: far longer than a previous owner can
/// plausibly keep writing after losing its partition (bounded by
/// `--shutdown-timeout-secs`, plus pauses).
pub const TOMBSTONE_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// How often expired tombstones are removed from a generation.
pub const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// The `_delete_by_query` body that removes the tombstones older than
/// [`TOMBSTONE_TTL`] at `now_ms`.
pub fn expired_tombstones(now_ms: u64) -> Value {
    let before = now_ms.saturating_sub(TOMBSTONE_TTL.as_millis() as u64);
    json!({"query": {"bool": {"filter": [{"term": {DELETED_FIELD: true}}, {"range": {DELETED_AT_FIELD: {"lt": before}}}]}}})
}

pub fn now_ms() -> u64 {
    crate::clock::now_millis() as u64
}

/// Whether the writer of `partition` sweeps generation `generation` now.
/// The meta document `sweep` of the generation records when its last sweep
/// began; a writer claims the next one by rewriting it, conditionally on
/// the version it read (a create when there is none), once it is
/// [`SWEEP_EVERY`] old. Of the writers of all partitions, which all look
/// after a rebalance, one wins; the others find it recent, or lose the
/// conditional write.
pub async fn claim(client: &Elasticsearch, prefix: &str, generation: u64, partition: i32) -> Result<bool, ElasticError> {
    let id = meta_id(generation, SWEEP);
    let now = now_ms();
    let version = match get_source(client, &meta_index(prefix), &id).await? {
        Some((v, _)) if now.saturating_sub(v["at"].as_u64().unwrap_or(0)) < SWEEP_EVERY.as_millis() as u64 => return Ok(false),
        Some((_, version)) => Some(version),
        None => None,
    };
    Ok(put_meta_if(client, prefix, &id, json!({"at": now, "partition": partition}), version).await?.is_some())
}

/// Removes the expired tombstones of `targets` (a generation's write
/// aliases): one `_delete_by_query` that proceeds on conflicts and runs as
/// a task (nothing waits for it).
pub async fn sweep(client: &Elasticsearch, targets: &[String]) -> Result<(), ElasticError> {
    let refs: Vec<&str> = targets.iter().map(String::as_str).collect();
    let r = client
        .delete_by_query(elasticsearch::DeleteByQueryParts::Index(&refs))
        .conflicts(elasticsearch::params::Conflicts::Proceed)
        .wait_for_completion(false)
        .body(expired_tombstones(now_ms()))
        .send()
        .await?;
    json_or_status("removing expired tombstones", r).await?;
    Ok(())
}
