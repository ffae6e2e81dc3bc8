//! Log identity: how an index recognises the log it was built from.
//!
//! Every shard checkpoint records, next to the last applied offset, a
//! fingerprint of the message at that offset (its key and payload). A worker
//! assigned a partition fetches from the checkpoint offset itself, so the
//! first message it sees is the one the checkpoint names:
//!
//! - same fingerprint: the same log, carry on after it;
//! - another fingerprint, or a fetch that starts *before* the checkpoint
//!   (the log is shorter than the index): the topic was recreated or
//!   rewritten under the index, and the worker stops with
//!   [`crate::index::IndexError::LogMismatch`];
//! - a fetch that starts *after* the offset following the checkpoint:
//!   retention deleted commands the index never saw, and the partition stops
//!   (a gap, never skipped).
//!
//! The partition count is recorded by the backend ([`crate::index::Backend::bind_log`]).
//! This needs nothing from the broker beyond fetching: librdkafka does not
//! expose Kafka's topic ids to consumers, and the fingerprint also catches a
//! log rewritten in place, which a topic id would not.

use crate::index::Checkpoint;

/// FNV-1a (64 bit) of a message's key and payload, with the key's length
/// first so that the boundary counts. Stable across versions and platforms:
/// it is stored in checkpoints.
pub fn fingerprint(key: Option<&[u8]>, payload: Option<&[u8]>) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    };
    let key = key.unwrap_or_default();
    eat(&(key.len() as u64).to_le_bytes());
    eat(key);
    eat(payload.unwrap_or_default());
    h
}

/// What the first message fetched from a checkpoint says about the log.
#[derive(Debug, PartialEq, Eq)]
pub enum First {
    /// The checkpoint's own message, unchanged (or an empty index's first).
    Same,
    /// The message right after the checkpoint: retention deleted the
    /// checkpoint's own, so the identity cannot be checked; nothing is missed.
    Unverifiable,
    /// Not the log the index was built from; the text says how.
    Changed(String),
    /// Offsets `from..to` (exclusive) are gone before the index applied them.
    Gap { from: i64, to: i64 },
    /// The read did not start where it was positioned: the checkpoint's
    /// own message (`sought`) is in the log (the low watermark is at or
    /// below it), yet the first message came from `offset`, past the one
    /// after it. Taking it would skip the offsets between.
    Misplaced { sought: i64, offset: i64 },
}

/// Classifies the first message (`offset`, `fingerprint`) fetched after
/// positioning at `checkpoint` (at the log's beginning when `None`), given
/// the partition's low watermark when it is known: offsets skipped at or
/// above it are in the log but carry no message (transaction markers,
/// aborted transactions' records), which is no gap.
pub fn first_after(checkpoint: Option<Checkpoint>, offset: i64, fingerprint: u64, low: Option<i64>) -> First {
    let next = checkpoint.map_or(0, |c| c.offset as i64 + 1);
    // A checkpoint names a message the index applied: while the log keeps
    // it, a read from it starts there, and no marker explains a later start.
    if let (Some(c), Some(l)) = (checkpoint, low) {
        if l <= c.offset as i64 && offset > next {
            return First::Misplaced { sought: c.offset as i64, offset };
        }
    }
    if low.is_some_and(|l| l <= next) && offset > next {
        return match checkpoint {
            None => First::Same,
            // The checkpoint's own message is not where it was, though the
            // offsets are kept.
            Some(_) => First::Unverifiable,
        };
    }
    let Some(c) = checkpoint else {
        return if offset == 0 { First::Same } else { First::Gap { from: 0, to: offset } };
    };
    let at = c.offset as i64;
    if offset < at {
        First::Changed(format!("the partition's log now starts over at offset {offset} (it is shorter than the index)"))
    } else if offset == at && c.fingerprint.is_some_and(|f| f != fingerprint) {
        First::Changed("a different message is at that offset now".into())
    } else if offset == at {
        First::Same
    } else if offset == at + 1 {
        First::Unverifiable
    } else {
        First::Gap { from: at + 1, to: offset }
    }
}

/// The partition's offsets (`low..high`, its watermarks) against the
/// checkpoint, before any message is fetched: `Same` when the offset the
/// index needs next is in the log (or the log is empty and so is the index).
pub fn range_against(checkpoint: Option<Checkpoint>, low: i64, high: i64) -> First {
    let next = checkpoint.map_or(0, |c| c.offset as i64 + 1);
    match checkpoint {
        Some(c) if c.offset as i64 >= high => First::Changed(format!("the partition's log ends at offset {high}, before it (it is shorter than the index)")),
        _ if low > next => First::Gap { from: next, to: low },
        _ => First::Same,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_stable_and_tell_key_from_payload() {
        // Recorded in checkpoints: a change of the function breaks every index.
        assert_eq!(fingerprint(None, None), fingerprint(Some(b""), Some(b"")));
        // Golden values from an independent FNV-1a in Python.
        assert_eq!(fingerprint(None, None), 0xa8c7_f832_281a_39c5);
        assert_eq!(fingerprint(Some(b"k"), Some(b"v")), 0x51c0_16c8_9e23_0cf1);
        assert_ne!(fingerprint(Some(b"ab"), Some(b"c")), fingerprint(Some(b"a"), Some(b"bc")));
        assert_ne!(fingerprint(Some(b"k"), Some(b"v1")), fingerprint(Some(b"k"), Some(b"v2")));
    }

    #[test]
    fn the_first_message_after_the_checkpoint_tells_same_changed_and_gaps_apart() {
        let c = Some(Checkpoint::new(10, 7));
        assert_eq!(first_after(c, 10, 7, None), First::Same);
        assert!(matches!(first_after(c, 10, 8, None), First::Changed(t) if t.contains("different message")));
        assert!(matches!(first_after(c, 3, 7, None), First::Changed(t) if t.contains("starts over at offset 3")));
        assert_eq!(first_after(c, 11, 1, None), First::Unverifiable);
        assert_eq!(first_after(c, 15, 1, None), First::Gap { from: 11, to: 15 });
        // A checkpoint written before fingerprints: only the offsets count.
        assert_eq!(first_after(Some(Checkpoint { offset: 10, fingerprint: None }), 10, 99, None), First::Same);
        // An empty index needs the log from offset 0.
        assert_eq!(first_after(None, 0, 1, None), First::Same);
        assert_eq!(first_after(None, 4, 1, None), First::Gap { from: 0, to: 4 });
    }

    /// Issue 29, 8: offsets without messages (a transaction's marker, an
    /// aborted transaction's records) are no gap when the low watermark
    /// says the log keeps them; retention still is one.
    #[test]
    fn offsets_the_log_keeps_without_messages_are_no_gap() {
        assert_eq!(first_after(None, 3, 1, Some(0)), First::Same, "a first transaction aborted");
        assert_eq!(first_after(None, 3, 1, Some(3)), First::Gap { from: 0, to: 3 }, "retention");
        let c = Some(Checkpoint::new(10, 7));
        assert_eq!(first_after(c, 10, 7, Some(0)), First::Same);
        assert_eq!(first_after(c, 12, 1, Some(11)), First::Unverifiable, "retention took the checkpoint's message; a marker after it");
        assert_eq!(first_after(c, 11, 1, Some(0)), First::Unverifiable, "read from the message after the checkpoint: nothing skipped");
        assert_eq!(first_after(c, 15, 1, Some(14)), First::Gap { from: 11, to: 15 });
    }

    /// A read that did not start at the checkpoint the log still keeps is
    /// no marker: the offsets between would be skipped.
    #[test]
    fn a_first_message_past_a_checkpoint_the_log_keeps_is_misplaced() {
        let c = Some(Checkpoint::new(10, 7));
        assert_eq!(first_after(c, 15, 1, Some(0)), First::Misplaced { sought: 10, offset: 15 });
        assert_eq!(first_after(c, 12, 1, Some(10)), First::Misplaced { sought: 10, offset: 12 });
        assert_eq!(first_after(c, 15, 1, Some(11)), First::Unverifiable, "retention took 10: markers may follow");
    }

    #[test]
    fn the_watermarks_tell_a_shorter_log_and_gaps_before_any_message() {
        let c = Some(Checkpoint::new(10, 7));
        assert_eq!(range_against(c, 0, 11), First::Same);
        assert_eq!(range_against(c, 11, 20), First::Same, "the checkpoint's own message may be gone");
        assert_eq!(range_against(c, 12, 20), First::Gap { from: 11, to: 12 });
        assert!(matches!(range_against(c, 0, 10), First::Changed(t) if t.contains("ends at offset 10")));
        assert!(matches!(range_against(c, 0, 0), First::Changed(_)), "an emptied log");
        assert_eq!(range_against(None, 0, 0), First::Same);
        assert_eq!(range_against(None, 5, 9), First::Gap { from: 0, to: 5 });
    }
}
