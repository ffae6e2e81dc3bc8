//! A partition's parked keys in a meta document of their own (review of
//! Elasticsearch, F12). The partition's meta document is written at every
//! commit (about ten times a second per busy partition); with the parked
//! keys inline, each of those writes carried the whole list, and so did
//! every read of the checkpoints (`produce --wait`, take-over waits, the
//! verify). Now the list is written only when it changes, to a new
//! document, and the meta document names it (`parked_ref`), in the same
//! conditional write that moves the checkpoint: the checkpoint and the
//! parked keys it goes with still change together.
//!
//! A crash between the list's write and the meta document's leaves an
//! unreferenced list (the meta document still names the one before); the
//! list a meta document stops naming is deleted after that write. A
//! fenced writer's list is never referenced. Meta documents written before
//! this (the list inline) are read as they are.

use elasticsearch::Elasticsearch;
use serde_json::{json, Map, Value};

use super::meta::{delete_meta, get_meta, put_meta};
use super::ElasticError;

/// The meta field naming the document holding the parked keys.
pub const REF_FIELD: &str = "parked_ref";

/// The field of the progress record holding the parked keys
/// ([`crate::index::progress::Progress::to_json`]).
const PARKED: &str = "parked";

/// Puts the parked keys `meta` names back in it, as the progress record
/// has them inline. A named list that is missing is an error: the parked
/// keys that go with the checkpoint cannot be known, and taking them for
/// none would apply commands an operator has not released.
pub async fn inline(client: &Elasticsearch, prefix: &str, meta: &mut Value) -> Result<(), ElasticError> {
    let Some(id) = meta[REF_FIELD].as_str().map(str::to_string) else {
        return Ok(());
    };
    match get_meta(client, prefix, &id).await? {
        Some(doc) => {
            meta[PARKED] = doc[PARKED].clone();
            Ok(())
        }
        None => Err(ElasticError::Transport(format!("the parked keys the partition's checkpoint names ({id}) are missing from the meta index"))),
    }
}

/// The parked keys one writer of a partition last had referenced.
#[derive(Debug, Default)]
pub struct Spill {
    /// The document the meta document names, and what it holds.
    current: Option<(String, Value)>,
    /// Lists written by this writer, to name the next.
    written: u64,
}

/// What a commit is about to reference ([`Spill::prepare`]), made current
/// by [`Spill::committed`] once the meta document is written.
#[derive(Debug)]
pub enum Prepared {
    /// The list named now, unchanged (nothing is cloned or written).
    Same,
    /// Another list (`None`: no key is parked).
    Next(Option<(String, Value)>),
}

impl Spill {
    /// The state of a writer that opened a partition whose meta document
    /// is `meta` (as read, the list inline by [`inline`]).
    pub fn opened(meta: &Value) -> Spill {
        let current = meta[REF_FIELD].as_str().map(|id| (id.to_string(), meta[PARKED].clone()));
        Spill { current, written: 0 }
    }

    /// Takes the parked keys out of the meta document `body` about to be
    /// written and names the document holding them instead, writing a new
    /// one first when they changed. `meta_id` and `owner` name it.
    pub async fn prepare(&mut self, client: &Elasticsearch, prefix: &str, meta_id: &str, owner: u64, body: &mut Map<String, Value>) -> Result<Prepared, ElasticError> {
        let Some(parked) = body.remove(PARKED) else {
            return Ok(Prepared::Next(None));
        };
        if let Some((id, held)) = &self.current {
            if *held == parked {
                body.insert(REF_FIELD.into(), json!(id));
                return Ok(Prepared::Same);
            }
        }
        self.written += 1;
        let id = format!("{meta_id}-parked-{owner}-{}", self.written);
        put_meta(client, prefix, &id, json!({ PARKED: parked })).await?;
        body.insert(REF_FIELD.into(), json!(id));
        Ok(Prepared::Next(Some((id, parked))))
    }

    /// The meta document naming `prepared` was written: the list it no
    /// longer names is deleted (best effort: one left behind is only a
    /// small document nothing reads).
    pub async fn committed(&mut self, client: &Elasticsearch, prefix: &str, prepared: Prepared) {
        let Prepared::Next(next) = prepared else { return };
        if let Some((old, _)) = std::mem::replace(&mut self.current, next) {
            if let Err(error) = delete_meta(client, prefix, &old).await {
                tracing::warn!(document = %old, %error, "could not delete parked keys no checkpoint names any more");
            }
        }
    }
}

/// Deletes the parked-keys document the meta document `meta_id` names, if
/// any (the generation's meta documents are being deleted).
pub async fn remove(client: &Elasticsearch, prefix: &str, meta_id: &str) -> Result<(), ElasticError> {
    if let Some(meta) = get_meta(client, prefix, meta_id).await? {
        if let Some(id) = meta[REF_FIELD].as_str() {
            delete_meta(client, prefix, id).await?;
        }
    }
    Ok(())
}
