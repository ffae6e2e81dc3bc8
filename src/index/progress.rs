//! What a shard records beside its applied offset, committed with it: the
//! keys it parked and the moves it received. No I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
}

/// Parked keys of one partition.
pub type Parking = BTreeMap<String, Parked>;

/// `parking` as a JSON list (Elasticsearch's meta document: keys are not
/// field names there).
pub fn parking_to_json(parking: &Parking) -> serde_json::Value {
    serde_json::Value::Array(
        parking
            .iter()
            .map(|(k, p)| serde_json::json!({"key": k, "behind": p.behind, "last_dlq": p.last_dlq, "replayed_through": p.replayed_through}))
            .collect(),
    )
}

/// Inverse of [`parking_to_json`]; anything else is no parking.
pub fn parking_from_json(v: &serde_json::Value) -> Parking {
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
pub fn received_to_json(r: &Received) -> serde_json::Value {
    serde_json::Value::Array(r.iter().map(|(p, o)| serde_json::json!({"partition": p, "offset": o})).collect())
}

/// Inverse of [`received_to_json`]; anything else is nothing received.
pub fn received_from_json(v: &serde_json::Value) -> Received {
    let Some(list) = v.as_array() else { return Received::new() };
    list.iter().filter_map(|e| Some((e["partition"].as_i64()? as i32, e["offset"].as_i64()?))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parking_round_trips_through_json() {
        let mut p = Parking::new();
        p.insert("/a.b".into(), Parked { behind: "id-1".into(), last_dlq: 7, replayed_through: -1 });
        p.insert("u1".into(), Parked { behind: "p3@9".into(), last_dlq: 2, replayed_through: 1 });
        assert_eq!(parking_from_json(&parking_to_json(&p)), p);
        assert!(parking_from_json(&serde_json::Value::Null).is_empty());
    }
}
