//! Reads and writes of documents by id: the meta documents (checkpoints,
//! log bindings, rebuild state) with their conditional writes, and the
//! realtime GET every backend read goes through.

use elasticsearch::{DeleteParts, Elasticsearch, GetParts, IndexParts, MgetParts};
use std::collections::HashMap;

use serde_json::{json, Value};

use super::names::meta_index;
use super::{json_or_status, ElasticError};
use crate::index::Checkpoint;

/// A document's version as a conditional write takes it: (seq_no,
/// primary_term).
pub(crate) type Version = (i64, i64);

/// GET a document by id (realtime): its source and (seq_no, primary_term).
/// A missing document is `None`; a missing index or alias is an error
/// ([`ElasticError::Gone`]), never taken for an absent document.
pub(crate) async fn get_source(client: &Elasticsearch, index: &str, id: &str) -> Result<Option<(Value, (i64, i64))>, ElasticError> {
    let get = client.get(GetParts::IndexId(index, id));
    let r = match super::names::routing(index, id) {
        Some(t) => get.routing(t).send().await?,
        None => get.send().await?,
    };
    let what = format!("reading {index}/{id}");
    if r.status_code().as_u16() == 404 {
        let body = r.text().await.unwrap_or_default();
        return match serde_json::from_str::<Value>(&body) {
            Ok(v) if v["found"] == json!(false) => Ok(None),
            _ => Err(super::status_error(&what, 404, &body)),
        };
    }
    let v = json_or_status(&what, r).await?;
    if v["found"] == json!(false) {
        return Ok(None);
    }
    let seq = (v["_seq_no"].as_i64().unwrap_or(0), v["_primary_term"].as_i64().unwrap_or(1));
    Ok(Some((v["_source"].clone(), seq)))
}

/// One `_mget` of `docs` (index or alias, id): for each, its source and
/// version, `None` when absent; an item Elasticsearch could not read
/// (its own `error`, a missing index among them) is left out of the map,
/// so its reader falls back to [`get_source`], which reports the error.
/// One document of an `_mget`: a tenant's with its routing.
fn mget_doc(index: &str, id: &str) -> Value {
    match super::names::routing(index, id) {
        Some(t) => json!({"_index": index, "_id": id, "routing": t}),
        None => json!({"_index": index, "_id": id}),
    }
}

pub(crate) async fn mget_sources(client: &Elasticsearch, docs: &[(String, String)]) -> Result<Vec<Option<Option<(Value, (i64, i64))>>>, ElasticError> {
    let body = json!({"docs": docs.iter().map(|(index, id)| mget_doc(index, id)).collect::<Vec<_>>()});
    let r = client.mget(MgetParts::None).body(body).send().await?;
    let v = json_or_status("reading documents (_mget)", r).await?;
    let items = v["docs"].as_array().map(Vec::as_slice).unwrap_or_default();
    if items.len() != docs.len() {
        return Err(ElasticError::Transport(format!("_mget: {} answers for {} documents", items.len(), docs.len())));
    }
    Ok(items
        .iter()
        .map(|d| match d["found"].as_bool() {
            _ if d.get("error").is_some() => None,
            Some(true) => Some(Some((d["_source"].clone(), (d["_seq_no"].as_i64().unwrap_or(0), d["_primary_term"].as_i64().unwrap_or(1))))),
            Some(false) => Some(None),
            None => None,
        })
        .collect())
}

/// The meta document `id` (`None` when it, or the meta index, is missing).
pub async fn get_meta(client: &Elasticsearch, prefix: &str, id: &str) -> Result<Option<Value>, ElasticError> {
    match get_source(client, &meta_index(prefix), id).await {
        Ok(found) => Ok(found.map(|(v, _)| v)),
        Err(ElasticError::Gone(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Creates or replaces the meta document `id`.
pub async fn put_meta(client: &Elasticsearch, prefix: &str, id: &str, body: Value) -> Result<(), ElasticError> {
    let index = meta_index(prefix);
    let r = client.index(IndexParts::IndexId(&index, id)).body(body).send().await?;
    json_or_status(&format!("writing {index}/{id}"), r).await?;
    Ok(())
}

/// Writes the meta document `id` only if it is still at `version` (its
/// `_seq_no` and `_primary_term` as last read or written), or, for `None`,
/// only if it does not exist yet. Returns its new version, or `None` when
/// another writer changed it first (409).
pub async fn put_meta_if(client: &Elasticsearch, prefix: &str, id: &str, body: Value, version: Option<(i64, i64)>) -> Result<Option<(i64, i64)>, ElasticError> {
    let index = meta_index(prefix);
    let r = match version {
        Some((seq, term)) => client.index(IndexParts::IndexId(&index, id)).if_seq_no(seq).if_primary_term(term).body(body).send().await?,
        None => client.create(elasticsearch::CreateParts::IndexId(&index, id)).body(body).send().await?,
    };
    if r.status_code().as_u16() == 409 {
        return Ok(None);
    }
    let v = json_or_status(&format!("writing {index}/{id}"), r).await?;
    match (v["_seq_no"].as_i64(), v["_primary_term"].as_i64()) {
        (Some(seq), Some(term)) => Ok(Some((seq, term))),
        _ => Err(ElasticError::Transport(format!("writing {index}/{id}: the answer has no _seq_no/_primary_term: {v}"))),
    }
}

/// Deletes the meta document `id` (done when it is missing).
pub async fn delete_meta(client: &Elasticsearch, prefix: &str, id: &str) -> Result<(), ElasticError> {
    let index = meta_index(prefix);
    let r = client.delete(DeleteParts::IndexId(&index, id)).send().await?;
    if r.status_code().as_u16() != 404 {
        json_or_status(&format!("deleting {index}/{id}"), r).await?;
    }
    Ok(())
}

/// The checkpoints in a `_mget` answer of the partitions' meta documents.
/// Elasticsearch answers 200 with an `error` in place of each document it
/// could not read (a meta shard unavailable, say): taking that for "no
/// checkpoint" would replay the partition from the start, and resurrect
/// documents whose tombstones have expired. Any such error but a missing
/// index is retryable; a missing index holds no checkpoint.
pub fn checkpoints_from_mget(partitions: &[i32], v: &Value) -> Result<HashMap<i32, Checkpoint>, ElasticError> {
    Ok(crate::index::progress::checkpoints(applied_from_mget(partitions, v)?))
}

/// [`checkpoints_from_mget`], with what each records done above its
/// checkpoint.
pub fn applied_from_mget(partitions: &[i32], v: &Value) -> Result<HashMap<i32, crate::index::progress::Applied>, ElasticError> {
    let docs = v["docs"].as_array().map(Vec::as_slice).unwrap_or_default();
    if docs.len() != partitions.len() {
        return Err(ElasticError::Transport(format!("reading the partitions' checkpoints: {} answers for {} partitions", docs.len(), partitions.len())));
    }
    let mut out = HashMap::new();
    for (p, doc) in partitions.iter().zip(docs) {
        if let Some(error) = doc.get("error") {
            if error["type"].as_str() == Some(super::INDEX_NOT_FOUND) {
                continue;
            }
            let id = doc["_id"].as_str().unwrap_or("?");
            return Err(ElasticError::Transport(format!("reading the checkpoint of partition {p} ({id}) failed: {error}")));
        }
        match doc["found"].as_bool() {
            Some(true) => {
                let progress = crate::index::progress::Progress::from_json(&doc["_source"]);
                if progress.checkpoint.is_some() {
                    out.insert(*p, crate::index::progress::Applied::of(&progress));
                }
            }
            Some(false) => {}
            None => return Err(ElasticError::Transport(format!("reading the checkpoint of partition {p}: an answer with neither found nor error: {doc}"))),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    /// Issue 47: a tenant's document is read with its routing.
    #[test]
    fn a_tenants_document_is_read_with_its_routing() {
        assert_eq!(super::mget_doc("i", "acme\u{1f}1"), json!({"_index": "i", "_id": "acme\u{1f}1", "routing": "acme"}));
        assert_eq!(super::mget_doc("i", "1"), json!({"_index": "i", "_id": "1"}));
    }

    use super::*;
    use crate::index::IndexError;

    /// Issue 27 B4: an `_mget` item error is not "no checkpoint".
    #[test]
    fn an_unreadable_checkpoint_is_a_retryable_error_not_a_replay_from_the_start() {
        let found = json!({"_index": "denorm-meta", "_id": "p0", "found": true, "_source": {"topic": "t", "applied": 41}});
        let absent = json!({"_index": "denorm-meta", "_id": "p1", "found": false});
        let unavailable = json!({"_index": "denorm-meta", "_id": "p2", "error": {"type": "no_shard_available_action_exception", "reason": "No shard available for [get [denorm-meta][p2]]"}});
        let no_index = json!({"_index": "denorm-meta", "_id": "p2", "error": {"type": "index_not_found_exception", "reason": "no such index [denorm-meta]"}});

        let got = checkpoints_from_mget(&[0, 1, 2], &json!({"docs": [found, absent, no_index]})).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[&0].offset, 41);

        let err = checkpoints_from_mget(&[0, 1, 2], &json!({"docs": [found, absent, unavailable]})).unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert!(err.to_string().contains("partition 2") && err.to_string().contains("no_shard_available_action_exception"), "{err}");
        assert!(IndexError::from(err).is_retryable());

        // An answer that does not cover every partition is not trusted either.
        assert!(checkpoints_from_mget(&[0, 1], &json!({"docs": [found]})).unwrap_err().is_retryable());
    }
}
