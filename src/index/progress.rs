//! What a shard records beside its applied offset, committed with it: the
//! keys it parked and the moves it received. One record ([`Progress`]),
//! one serialized form (the embedded index's commit payload and
//! Elasticsearch's meta document both), and one book of what is committed
//! and what the next commit records ([`ProgressBook`]), for every backend.
//! No I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::Checkpoint;

/// A shard's durable progress: the last applied position (with the
/// fingerprint of the message there), the keys parked, the moves received.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    pub checkpoint: Option<Checkpoint>,
    pub parked: Parking,
    pub received: Received,
}

impl Progress {
    /// The serialized form: `applied` (absent when nothing is), `fingerprint`
    /// (16 hex digits, absent when unknown: JSON numbers above 2^53 do not
    /// survive every reader, and Elasticsearch maps them to long), `parked` (a list of
    /// `{key, behind, last_dlq, replayed_through}`: keys are not field names
    /// on Elasticsearch) and `received` (a list of `{partition, offset}`),
    /// each absent when empty.
    pub fn to_json(&self) -> Map<String, Value> {
        let mut m = Map::new();
        if let Some(c) = self.checkpoint {
            m.insert("applied".into(), json!(c.offset));
            if let Some(f) = c.fingerprint {
                m.insert("fingerprint".into(), json!(format!("{f:016x}")));
            }
        }
        if !self.parked.is_empty() {
            m.insert("parked".into(), parking_to_json(&self.parked));
        }
        if !self.received.is_empty() {
            m.insert("received".into(), received_to_json(&self.received));
        }
        m
    }

    /// Inverse of [`Progress::to_json`]. Also reads what the embedded index
    /// wrote before the two backends shared this form (`parked` and
    /// `received` as objects keyed by key and by partition).
    pub fn from_json(v: &Value) -> Progress {
        let checkpoint = v["applied"].as_u64().map(|offset| Checkpoint { offset, fingerprint: v["fingerprint"].as_str().and_then(|h| u64::from_str_radix(h, 16).ok()) });
        let parked = match &v["parked"] {
            Value::Object(o) => o.iter().filter_map(|(k, p)| Some((k.clone(), serde_json::from_value::<Parked>(p.clone()).ok()?))).collect(),
            other => parking_from_json(other),
        };
        let received = match &v["received"] {
            Value::Object(o) => o.iter().filter_map(|(p, at)| Some((p.parse().ok()?, at.as_i64()?))).collect(),
            other => received_from_json(other),
        };
        Progress { checkpoint, parked, received }
    }
}

/// A shard writer's progress: what its last commit recorded, and what the
/// next one records ([`crate::index::Shard::mark_applied`],
/// [`crate::index::Shard::parking`] and [`crate::index::Shard::received`]
/// change the latter).
#[derive(Debug, Clone, Default)]
pub struct ProgressBook {
    committed: Progress,
    marked: Progress,
}

impl ProgressBook {
    /// The book of a shard whose last commit recorded `committed`.
    pub fn new(committed: Progress) -> Self {
        ProgressBook { marked: committed.clone(), committed }
    }

    pub fn mark_applied(&mut self, at: Checkpoint) {
        self.marked.checkpoint = Some(at);
    }

    /// The last position durably applied.
    pub fn checkpoint(&self) -> Option<Checkpoint> {
        self.committed.checkpoint
    }

    pub fn parking(&mut self) -> &mut Parking {
        &mut self.marked.parked
    }

    pub fn received(&mut self) -> &mut Received {
        &mut self.marked.received
    }

    /// What the next commit records.
    pub fn marked(&self) -> &Progress {
        &self.marked
    }

    /// Whether the next commit records anything the last one did not.
    pub fn changed(&self) -> bool {
        self.marked != self.committed
    }

    /// The next commit recorded what was marked.
    pub fn committed(&mut self) {
        self.committed = self.marked.clone();
    }
}

/// A parked key: what it waits behind, and the dead-letter bookkeeping that
/// lets an operator's `RESOLVE` tell whether it covers everything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parked {
    /// Id of the aborted command (or `p<partition>@<offset>` when it had none).
    pub behind: String,
    /// Dead-letter offset of the key's newest letter.
    pub last_dlq: i64,
    /// Highest dead-letter offset replayed so far (replays at or below it are
    /// skipped: a `reprocess` cut short and run again applies nothing twice).
    pub replayed_through: i64,
    /// Command-topic offset of the message whose handling wrote the key's
    /// newest letter (-1: none recorded). What an operator's `RESOLVE` is
    /// checked against: unlike `last_dlq`, a rebuild, which writes its
    /// letters again, gets the same.
    #[serde(default = "none")]
    pub last_at: i64,
    /// Command-topic offset of the message whose abort parked the key (-1:
    /// not recorded). A message at or before it was handled before the key
    /// was parked: read again (key lanes record parking ahead of the
    /// checkpoint), it is not held behind the park.
    #[serde(default = "none")]
    pub since: i64,
}

fn none() -> i64 {
    -1
}

impl Parked {
    /// Whether the letters an operator's request covers (up to dead-letter
    /// offset `through`, written up to command-topic offset `through_at`;
    /// -1 when the request does not say) include the key's newest letter.
    pub fn covered_by(&self, through: i64, through_at: i64) -> bool {
        match through_at >= 0 && self.last_at >= 0 {
            true => self.last_at <= through_at,
            false => self.last_dlq <= through,
        }
    }
}

/// Parked keys of one partition.
pub type Parking = BTreeMap<String, Parked>;

/// `parking` as a JSON list (Elasticsearch's meta document: keys are not
/// field names there).
fn parking_to_json(parking: &Parking) -> serde_json::Value {
    serde_json::Value::Array(
        parking
            .iter()
            .map(|(k, p)| serde_json::json!({"key": k, "behind": p.behind, "last_dlq": p.last_dlq, "replayed_through": p.replayed_through, "last_at": p.last_at, "since": p.since}))
            .collect(),
    )
}

/// Inverse of [`parking_to_json`]; anything else is no parking.
fn parking_from_json(v: &serde_json::Value) -> Parking {
    let Some(list) = v.as_array() else { return Parking::new() };
    list.iter()
        .filter_map(|e| {
            let key = e["key"].as_str()?.to_string();
            Some((key, serde_json::from_value::<Parked>(e.clone()).ok()?))
        })
        .collect()
}

/// Moves a destination shard has completed: source partition -> offset of
/// the last rename from it whose documents were all applied. Renames of one
/// source partition are applied (and their chunks written) in offset order,
/// so a chunk at or below this offset is a resend and is ignored. Committed
/// with the shard's checkpoint.
pub type Received = BTreeMap<i32, i64>;

/// `received` as a JSON list (Elasticsearch's meta document).
fn received_to_json(r: &Received) -> serde_json::Value {
    serde_json::Value::Array(r.iter().map(|(p, o)| serde_json::json!({"partition": p, "offset": o})).collect())
}

/// Inverse of [`received_to_json`]; anything else is nothing received.
fn received_from_json(v: &serde_json::Value) -> Received {
    let Some(list) = v.as_array() else { return Received::new() };
    list.iter().filter_map(|e| Some((e["partition"].as_i64()? as i32, e["offset"].as_i64()?))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_has_one_form_and_reads_the_embedded_indexs_older_one() {
        let mut p = Progress { checkpoint: Some(Checkpoint { offset: 41, fingerprint: Some(0xabc) }), ..Default::default() };
        p.parked.insert("/a.b".into(), Parked { behind: "id-1".into(), last_dlq: 7, replayed_through: -1, last_at: -1, since: -1 });
        p.received.insert(3, 99);
        let v = Value::Object(p.to_json());
        assert_eq!(v["applied"], 41);
        assert_eq!(v["fingerprint"], "0000000000000abc");
        assert!(v["parked"].is_array() && v["received"].is_array(), "{v}");
        assert_eq!(Progress::from_json(&v), p);
        // The embedded index's commit payload before this form.
        let older = json!({"applied": 41, "fingerprint": "0000000000000abc", "parked": {"/a.b": {"behind": "id-1", "last_dlq": 7, "replayed_through": -1}}, "received": {"3": 99}});
        assert_eq!(Progress::from_json(&older), p);
        assert_eq!(Progress::from_json(&json!({})), Progress::default());
        assert_eq!(Value::Object(Progress::default().to_json()), json!({}));
    }

    #[test]
    fn the_book_commits_what_was_marked_and_nothing_twice() {
        let mut book = ProgressBook::new(Progress::default());
        assert!(!book.changed(), "nothing marked");
        book.parking().insert("k".into(), Parked { behind: "c".into(), last_dlq: 0, replayed_through: -1, last_at: 3, since: -1 });
        assert!(book.changed());
        book.mark_applied(Checkpoint::new(5, 1));
        assert_eq!(book.marked().checkpoint, Some(Checkpoint::new(5, 1)));
        assert_eq!(book.checkpoint(), None, "not committed yet");
        book.committed();
        assert_eq!(book.checkpoint(), Some(Checkpoint::new(5, 1)));
        assert!(!book.changed(), "committed already");
        book.received().insert(1, 2);
        assert!(book.changed(), "a move received changes the record");
        assert_eq!(ProgressBook::new(book.marked().clone()).checkpoint(), Some(Checkpoint::new(5, 1)));
    }

    #[test]
    fn parking_round_trips_through_json() {
        let mut p = Parking::new();
        p.insert("/a.b".into(), Parked { behind: "id-1".into(), last_dlq: 7, replayed_through: -1, last_at: 40, since: -1 });
        p.insert("u1".into(), Parked { behind: "p3@9".into(), last_dlq: 2, replayed_through: 1, last_at: -1, since: 5 });
        assert_eq!(parking_from_json(&parking_to_json(&p)), p);
        assert!(parking_from_json(&serde_json::Value::Null).is_empty());
    }
}
