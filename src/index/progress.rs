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
    /// The commands done above the checkpoint (issue 45).
    pub done: DoneAbove,
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
        if self.done.through >= 0 {
            m.insert("done_through".into(), json!(self.done.through));
            m.insert("pending".into(), json!(self.done.pending.iter().map(|(a, b)| [a, b]).collect::<Vec<_>>()));
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
        let done = match v["done_through"].as_i64() {
            Some(through) => {
                let pending = v["pending"].as_array().map(Vec::as_slice).unwrap_or_default().iter().filter_map(|r| Some((r[0].as_i64()?, r[1].as_i64()?))).collect();
                DoneAbove { through, pending }
            }
            None => DoneAbove::default(),
        };
        Progress { checkpoint, parked, received, done }
    }
}

/// The commands applied above the checkpoint, which key lanes finish out
/// of log order (issue 45): every offset after the checkpoint up to
/// `through` is applied but those in the ranges `pending` (inclusive,
/// ascending). A new owner of the partition, reading again from the
/// checkpoint, skips what is applied: re-application after a rebalance or
/// a crash is bounded by what was in flight, not by how long ago the
/// oldest unfinished fan-out began. `through` -1: nothing recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoneAbove {
    pub through: i64,
    pub pending: Vec<(i64, i64)>,
}

/// The longest [`DoneAbove::to_metadata`] (Kafka's default
/// `offset.metadata.max.bytes` is 4096).
pub const METADATA_MAX: usize = 4000;

impl Default for DoneAbove {
    fn default() -> Self {
        DoneAbove { through: -1, pending: Vec::new() }
    }
}

impl DoneAbove {
    /// At most this many pending ranges are recorded (a few kilobytes in
    /// the commit): past them, only what lies below the first range left
    /// out is recorded as applied (re-applying the rest is harmless).
    pub const MAX_RANGES: usize = 256;

    /// What is applied above `low` when every offset received up to
    /// `through` is applied but `open` (ascending).
    pub fn new(low: i64, through: i64, open: impl IntoIterator<Item = i64>) -> DoneAbove {
        Self::from_ranges(low, through, open.into_iter().take_while(|o| *o <= through).map(|o| (o, o)))
    }

    /// What is applied above `low`, up to `through`, but the offsets of
    /// `pending` (ascending ranges, inclusive), bounded by
    /// [`DoneAbove::MAX_RANGES`].
    fn from_ranges(low: i64, through: i64, pending_ranges: impl IntoIterator<Item = (i64, i64)>) -> DoneAbove {
        let mut pending: Vec<(i64, i64)> = Vec::new();
        let mut through = through;
        for (a, b) in pending_ranges.into_iter().filter(|(_, b)| *b > low) {
            let a = a.max(low + 1);
            if a > through {
                break;
            }
            let full = pending.len() == Self::MAX_RANGES;
            match pending.last_mut() {
                Some((_, end)) if *end + 1 >= a => *end = (*end).max(b),
                _ if full => {
                    through = a - 1;
                    break;
                }
                _ => pending.push((a, b)),
            }
        }
        // Pending up to its end: nothing above the last range is applied.
        if let Some((start, end)) = pending.last().copied() {
            if end >= through {
                pending.pop();
                through = start - 1;
            }
        }
        match through > low {
            true => DoneAbove { through, pending },
            false => DoneAbove::default(),
        }
    }

    /// What is applied above `low` as a reader knows it that has received
    /// every offset up to `seen` and finished all of them but `open`
    /// (ascending), and started from the record `inherited` (what the last
    /// commit recorded): above `seen`, the inherited record still says
    /// what is applied (a new owner has not read those offsets yet;
    /// forgetting them would apply them again).
    pub fn merged(low: i64, seen: i64, open: impl IntoIterator<Item = i64>, inherited: &DoneAbove) -> DoneAbove {
        if inherited.through <= seen {
            return Self::new(low, seen, open);
        }
        let later = inherited.pending.iter().filter(|(_, b)| *b > seen).map(|(a, b)| ((*a).max(seen + 1), *b));
        Self::from_ranges(low, inherited.through, open.into_iter().map(|o| (o, o)).chain(later))
    }

    /// How many offsets from `next` (the checkpoint plus one) up to `end`
    /// (excluded) it records applied.
    pub fn applied_in(&self, next: i64, end: i64) -> i64 {
        let top = self.through.min(end - 1);
        if top < next {
            return 0;
        }
        let pending: i64 = self.pending.iter().map(|(a, b)| ((*b).min(top) - (*a).max(next) + 1).max(0)).sum();
        top - next + 1 - pending
    }

    /// The record as an offset commit's metadata, for the group's offset
    /// `next` (the checkpoint plus one): `d1:<through>:<ranges>`, offsets
    /// relative to `next`, a range `a-b` or a single `a`, comma-separated.
    /// Kafka keeps at most `offset.metadata.max.bytes` (4096 by default):
    /// past [`METADATA_MAX`] bytes, what lies below the first range left
    /// out is recorded. Empty when nothing above `next` is recorded.
    pub fn to_metadata(&self, next: i64) -> String {
        let mut through = self.through;
        let mut ranges = String::new();
        for (a, b) in self.pending.iter().filter(|(_, b)| *b >= next) {
            let a = (*a).max(next);
            let item = if a == *b { format!("{}", a - next) } else { format!("{}-{}", a - next, b - next) };
            if ranges.len() + item.len() + 32 > METADATA_MAX {
                through = a - 1;
                break;
            }
            if !ranges.is_empty() {
                ranges.push(',');
            }
            ranges.push_str(&item);
        }
        match through >= next {
            true => format!("d1:{}:{ranges}", through - next),
            false => String::new(),
        }
    }

    /// Inverse of [`DoneAbove::to_metadata`] (nothing recorded for
    /// anything else: a commit of another client, or of an older worker).
    pub fn from_metadata(metadata: &str, next: i64) -> DoneAbove {
        let parse = || -> Option<DoneAbove> {
            let rest = metadata.strip_prefix("d1:")?;
            let (through, ranges) = rest.split_once(':')?;
            let mut pending = Vec::new();
            for item in ranges.split(',').filter(|i| !i.is_empty()) {
                let (a, b) = item.split_once('-').unwrap_or((item, item));
                pending.push((next + a.parse::<i64>().ok()?, next + b.parse::<i64>().ok()?));
            }
            Some(DoneAbove { through: next + through.parse::<i64>().ok()?, pending })
        };
        parse().unwrap_or_default()
    }

    /// Whether the command at `offset` is recorded applied, above the
    /// checkpoint `applied`.
    pub fn contains(&self, applied: Option<u64>, offset: i64) -> bool {
        applied.is_some_and(|a| offset > a as i64) && offset <= self.through && !self.pending.iter().any(|(a, b)| (*a..=*b).contains(&offset))
    }
}

/// What a shard's last commit records applied: every command up to its
/// checkpoint, and those done above it (issue 45). What a take-over of
/// another partition judges its departure by.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    pub checkpoint: Option<Checkpoint>,
    pub done: DoneAbove,
}

impl Applied {
    /// The record of a committed progress.
    pub fn of(p: &Progress) -> Applied {
        Applied { checkpoint: p.checkpoint, done: p.done.clone() }
    }

    /// Whether the command at `offset` is recorded applied.
    pub fn contains(&self, offset: i64) -> bool {
        let applied = self.checkpoint.map(|c| c.offset);
        applied.is_some_and(|a| offset <= a as i64) || self.done.contains(applied, offset)
    }
}

/// The checkpoints of what partitions' shards record applied.
pub fn checkpoints(applied: std::collections::HashMap<i32, Applied>) -> std::collections::HashMap<i32, Checkpoint> {
    applied.into_iter().filter_map(|(p, a)| Some((p, a.checkpoint?))).collect()
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

    pub fn mark_applied(&mut self, at: Checkpoint, done: DoneAbove) {
        self.marked.checkpoint = Some(at);
        self.marked.done = done;
    }

    /// Moves the checkpoint the next commit records to `at`, keeping what
    /// it records applied above it (a record that lags behind: it says
    /// less is applied than is, never more).
    pub fn mark_low(&mut self, at: Checkpoint) {
        self.marked.checkpoint = Some(at);
    }

    /// What the last commit recorded as applied above its checkpoint.
    pub fn committed_done(&self) -> &DoneAbove {
        &self.committed.done
    }

    /// Whether the last commit recorded the command at `offset` applied
    /// above its checkpoint ([`DoneAbove`]).
    pub fn done_above(&self, offset: i64) -> bool {
        self.committed.done.contains(self.committed.checkpoint.map(|c| c.offset), offset)
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
    fn applied_is_the_checkpoint_and_what_is_done_above_it() {
        let a = Applied { checkpoint: Some(Checkpoint { offset: 4, fingerprint: None }), done: DoneAbove::new(4, 9, [5, 8]) };
        let applied: Vec<i64> = (0..12).filter(|&o| a.contains(o)).collect();
        assert_eq!(applied, vec![0, 1, 2, 3, 4, 6, 7, 9]);
        assert!(!Applied::default().contains(0), "nothing applied without a checkpoint");
    }

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
        book.mark_applied(Checkpoint::new(5, 1), DoneAbove::default());
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

    /// Issue 45: what is applied above the checkpoint is recorded as the
    /// ranges still pending below the highest offset applied, bounded, and
    /// read back as it was written.
    #[test]
    fn the_commands_done_above_the_checkpoint_are_recorded_bounded() {
        let d = DoneAbove::new(10, 20, [11, 12, 15, 25]);
        assert_eq!(d, DoneAbove { through: 20, pending: vec![(11, 12), (15, 15)] });
        let applied = |o: i64| d.contains(Some(10), o);
        assert_eq!((9..=22).filter(|o| applied(*o)).collect::<Vec<_>>(), vec![13, 14, 16, 17, 18, 19, 20]);
        assert!(!d.contains(None, 13), "nothing applied without a checkpoint");
        // Nothing open below the highest: nothing above the low mark to say.
        assert_eq!(DoneAbove::new(10, 10, [11]), DoneAbove::default());
        // Pending up to the highest: the last range is cut off.
        assert_eq!(DoneAbove::new(10, 20, [15, 19, 20]), DoneAbove { through: 18, pending: vec![(15, 15)] });
        assert_eq!(DoneAbove::new(10, 12, [11, 12]), DoneAbove::default());
        // Past the bound, what lies below the first range left out.
        let open: Vec<i64> = (0..1000).map(|i| 100 + 2 * i).collect();
        let d = DoneAbove::new(99, 3000, open.iter().copied());
        assert_eq!(d.pending.len(), DoneAbove::MAX_RANGES);
        assert_eq!(d.through, open[DoneAbove::MAX_RANGES] - 1);
        assert!(d.contains(Some(99), 101) && !d.contains(Some(99), 100) && !d.contains(Some(99), d.through + 1));
        // A new owner that has read up to 41 of a record through 60: above
        // 41 the record still says what is applied.
        let inherited = DoneAbove::new(39, 60, [40, 45, 50]);
        let d = DoneAbove::merged(40, 41, [], &inherited);
        assert_eq!(d, DoneAbove { through: 60, pending: vec![(45, 45), (50, 50)] });
        let d = DoneAbove::merged(40, 47, [47], &inherited);
        assert_eq!(d, DoneAbove { through: 60, pending: vec![(47, 47), (50, 50)] }, "45 finished since, 47 open");
        assert_eq!(DoneAbove::merged(61, 61, [], &inherited), DoneAbove::default(), "read past the record: the tracker alone");
        assert_eq!(DoneAbove::merged(40, 61, [40, 45], &inherited), DoneAbove { through: 61, pending: vec![(45, 45)] });
        // Counted between the checkpoint and the log's end.
        let d = DoneAbove::new(10, 20, [11, 12, 15]);
        assert_eq!((d.applied_in(11, 30), d.applied_in(11, 16), d.applied_in(21, 30), d.applied_in(11, 11)), (7, 2, 0, 0));
        // As an offset commit's metadata, relative to the group's offset.
        let d = DoneAbove::new(10, 20, [11, 12, 15]);
        assert_eq!(d.to_metadata(11), "d1:9:0-1,4");
        assert_eq!(DoneAbove::from_metadata(&d.to_metadata(11), 11), d);
        assert_eq!(DoneAbove::default().to_metadata(11), "");
        assert_eq!(DoneAbove::from_metadata("", 11), DoneAbove::default());
        assert_eq!(DoneAbove::from_metadata("d1:x:", 11), DoneAbove::default());
        let wide = DoneAbove::new(99, 1 << 60, (0..256).map(|i| 100 + 1_000_000_000_000 * i));
        let m = wide.to_metadata(100);
        assert!(m.len() <= METADATA_MAX, "{} bytes", m.len());
        let back = DoneAbove::from_metadata(&m, 100);
        assert!(back.through < wide.through && back.through > 100 && back.contains(Some(99), 101) && !back.contains(Some(99), 100));
        // One form, with the rest of the progress.
        let p = Progress { checkpoint: Some(Checkpoint::new(10, 3)), done: DoneAbove::new(10, 20, [11, 12, 15]), ..Default::default() };
        let v = Value::Object(p.to_json());
        assert_eq!((&v["done_through"], &v["pending"]), (&json!(20), &json!([[11, 12], [15, 15]])), "{v}");
        assert_eq!(Progress::from_json(&v), p);
    }
}
