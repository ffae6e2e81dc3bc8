//! Renames that cross ordering keys: the messages and rules of the move
//! protocol (see docs/cross-key.md). No I/O.
//!
//! A rename whose `from` and `to` lie under different top-level directories
//! is keyed by its source. The source's worker, applying it in the source's
//! log order, scans the files under `from`, writes them (renamed) as
//! [`MoveIn`] messages keyed by the destination, waits for their
//! acknowledgement, and only then deletes them from its shard. The
//! destination's worker applies a [`MoveIn`] in the destination's log order:
//! the move takes effect there at its first chunk. Every decision depends
//! only on the worker's own partition's log, so redelivery and replay repeat
//! it exactly.

use std::collections::BTreeMap;

use crate::command::path;
use crate::index::{Doc, FileDoc};

/// A chunk of a move's documents, keyed by the destination key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveIn {
    pub move_id: String,
    pub source_partition: i32,
    pub source_offset: i64,
    pub from: String,
    pub to: String,
    pub chunk: i32,
    pub last: bool,
    pub issued_at: i64,
    pub files: Vec<MovedFile>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedFile {
    pub id: String,
    /// Full path at the destination.
    pub path: String,
    pub contents: String,
}

impl MoveIn {
    /// The message key: the destination's top-level directory.
    pub fn key(&self) -> &str {
        path::top_level(&self.to)
    }

    /// Checks the paths: `to` and every file valid, every file beneath `to`.
    pub fn validate(&self) -> Result<(), crate::command::CommandError> {
        path::validate("from", &self.from)?;
        path::validate("to", &self.to)?;
        for f in &self.files {
            crate::command::Command::DeleteFile { id: f.id.clone(), path: f.path.clone() }.validate()?;
            if !path::is_within(&f.path, &self.to) {
                return Err(crate::command::CommandError::InvalidPath { field: "path", path: f.path.clone(), reason: format!("is not beneath the move's destination {:?}", self.to) });
            }
        }
        Ok(())
    }

    /// The move this chunk belongs to: the rename's place in the log.
    pub fn source(&self) -> (i32, i64) {
        (self.source_partition, self.source_offset)
    }

    /// The chunk's files as documents written at log position `pos`.
    pub fn docs(&self, pos: u64) -> impl Iterator<Item = Doc> + '_ {
        self.files.iter().map(move |f| Doc::File(FileDoc::at(&f.id, &f.path, &f.contents, pos)))
    }
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

/// Whether a take-over may be applied whose documents left their
/// partition at `departure` (a cross-key rename's offset, or an owner
/// change's delete half), given the last offset that partition's shard has
/// applied: once everything before the departure is. Live, that is so when
/// the take-over arrives; a replay or rebuild waits for it, so the
/// documents change hands in the order they did live (see
/// docs/cross-key.md).
pub fn departed(applied: Option<u64>, departure: i64) -> bool {
    departure <= 0 || applied.is_some_and(|a| a as i64 >= departure - 1)
}

/// What a destination does with a chunk, given what it has completed and
/// the move it is in the middle of (if any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// A resend of a move already complete here: ignored.
    Duplicate,
    /// A chunk of the move in progress: applied at the move's position.
    Continues,
    /// The first chunk of a new move: the move takes effect here.
    Starts,
    /// A chunk of another move while one is in progress: it waits.
    Waits,
}

pub fn arrival(received: &Received, in_progress: Option<(i32, i64)>, m: &MoveIn) -> Arrival {
    if received.get(&m.source_partition).is_some_and(|done| m.source_offset <= *done) {
        return Arrival::Duplicate;
    }
    match in_progress {
        Some(s) if s == m.source() => Arrival::Continues,
        Some(_) => Arrival::Waits,
        None => Arrival::Starts,
    }
}

/// Bytes a file takes in a chunk, roughly (its strings and their framing).
fn file_size(f: &MovedFile) -> usize {
    f.id.len() + f.path.len() + f.contents.len() + 16
}

/// The largest chunk a source writes (before compression), whatever its
/// `--max-message-bytes`: well below the brokers' default message limit.
pub const MAX_CHUNK_BYTES: usize = 256 << 10;

/// Cuts a stream of files into chunks of at most `max_bytes` each (a file
/// larger than that travels alone: its own command fitted in a message).
pub struct Chunker {
    max_bytes: usize,
    chunk: Vec<MovedFile>,
    size: usize,
}

impl Chunker {
    pub fn new(max_bytes: usize) -> Self {
        Chunker { max_bytes, chunk: Vec::new(), size: 0 }
    }

    /// Adds a file; returns the chunk it no longer fits in, if any.
    pub fn push(&mut self, f: MovedFile) -> Option<Vec<MovedFile>> {
        let n = file_size(&f);
        let full = (self.size + n > self.max_bytes && !self.chunk.is_empty()).then(|| {
            self.size = 0;
            std::mem::take(&mut self.chunk)
        });
        self.size += n;
        self.chunk.push(f);
        full
    }

    /// The last chunk (empty when no file was pushed).
    pub fn finish(self) -> Vec<MovedFile> {
        self.chunk
    }
}

/// Splits `files` into chunks with a [`Chunker`]: always at least one.
pub fn chunks(files: Vec<MovedFile>, max_bytes: usize) -> Vec<Vec<MovedFile>> {
    let mut c = Chunker::new(max_bytes);
    let mut out: Vec<Vec<MovedFile>> = files.into_iter().filter_map(|f| c.push(f)).collect();
    out.push(c.finish());
    out
}

/// Java's murmur2 (as Kafka's default partitioner and librdkafka's
/// `murmur2_random` hash keys).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of `key` among `partitions` under the Java client's
/// default partitioner (what `denorm produce` and the workers use).
pub fn partition_of(key: &str, partitions: i32) -> i32 {
    (murmur2(key.as_bytes()) & 0x7fff_ffff) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_take_over_waits_until_everything_before_its_departure_is_applied() {
        // The departure at offset 10: its partition must be applied up to 9.
        assert!(!departed(None, 10), "nothing applied yet");
        assert!(!departed(Some(8), 10));
        assert!(departed(Some(9), 10), "everything before the rename or the delete half");
        assert!(departed(Some(10), 10) && departed(Some(500), 10));
        // Nothing comes before the first message of a log.
        assert!(departed(None, 0));
    }

    #[test]
    fn murmur2_matches_the_java_client() {
        // Kafka's UtilsTest vectors.
        for (s, want) in [
            ("21", -973932308),
            ("foobar", -790332482),
            ("a-little-bit-long-string", -985981536),
            ("a-little-bit-longer-string", -1486304829),
            ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
            ("abc", 479470107),
        ] {
            assert_eq!(murmur2(s.as_bytes()), want, "{s}");
        }
    }

    fn file(id: &str, contents: usize) -> MovedFile {
        MovedFile { id: id.into(), path: format!("/d/{id}"), contents: "x".repeat(contents) }
    }

    #[test]
    fn chunks_stay_under_the_limit_and_keep_every_file_once() {
        let files: Vec<MovedFile> = (0..50).map(|i| file(&format!("f{i}"), i * 10)).collect();
        let out = chunks(files.clone(), 1000);
        assert!(out.len() > 5);
        for c in &out {
            assert!(c.len() == 1 || c.iter().map(file_size).sum::<usize>() <= 1000);
        }
        assert_eq!(out.concat(), files);
        assert_eq!(chunks(Vec::new(), 1000), vec![Vec::<MovedFile>::new()]);
        assert_eq!(chunks(vec![file("big", 5000)], 1000).len(), 1);
    }

    #[test]
    fn resends_of_completed_moves_are_recognised() {
        let m = |p, o| MoveIn { move_id: "m".into(), source_partition: p, source_offset: o, from: "/s/a".into(), to: "/d/a".into(), chunk: 0, last: true, issued_at: 0, files: vec![] };
        let mut r = Received::new();
        r.insert(1, 10);
        assert_eq!(arrival(&r, None, &m(1, 10)), Arrival::Duplicate);
        assert_eq!(arrival(&r, None, &m(1, 9)), Arrival::Duplicate);
        assert_eq!(arrival(&r, None, &m(1, 11)), Arrival::Starts);
        assert_eq!(arrival(&r, None, &m(2, 3)), Arrival::Starts);
        assert_eq!(arrival(&r, Some((1, 11)), &m(1, 11)), Arrival::Continues);
        assert_eq!(arrival(&r, Some((1, 11)), &m(2, 3)), Arrival::Waits);
        assert_eq!(received_from_json(&received_to_json(&r)), r);
    }
}
