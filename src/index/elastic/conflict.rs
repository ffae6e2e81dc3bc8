//! Who wins where the writers of two partitions meet on one document. On
//! Elasticsearch every partition's shard writes into the same indexes, so
//! a document a cross-key move or an owner change takes to another
//! partition keeps its id, and the log positions of two partitions are
//! offsets of two logs: not comparable. These are the rules, with no I/O;
//! the shard reads the stored version, asks, and writes.
//!
//! Fencing (issue 27, B2): a write may replace another partition's version
//! only from a writer that still owns its own partition. The shard
//! re-reads its partition's meta document (the owner epoch) after reading
//! the version it replaces and before sending the write, and a writer that
//! lost the partition stops ([`crate::index::IndexError::Fenced`]). That is
//! enough: another partition's version can only have been written after
//! this partition's later commands moved the document away, and a newer
//! owner claims the partition before it applies any command; so a writer
//! that finds itself still the owner after reading that version is not
//! replaying a command its successor has already applied past.

use serde_json::Value;

use super::docs::{from_source, is_tombstone, writer};
use crate::index::Kind;

/// The writes of one bulk by `index/id`: each document's kind, its
/// command's position and what the write was.
pub(super) type Sent = std::collections::HashMap<String, (Kind, u64, Write)>;

/// Which rule decides a buffered write's conflicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// A command of this partition: newer positions win.
    Own,
    /// A document a cross-key move or an owner change brings from the
    /// partition `from` ([`crate::index::Shard::take_over`]): it replaces
    /// that partition's copy or tombstone, never a third partition's (which
    /// took the document later). `None`: the source partition is not known
    /// (a backend never bound to its log's partition count; workers always
    /// are), and any other partition's version is replaced.
    TakeOver { from: Option<i32> },
    /// The source's delete of a document a cross-key move handed to the
    /// destination ([`crate::index::Shard::delete_departed`]): decided like
    /// [`Write::Own`], but another partition's document there is the
    /// destination's take-over, which a rebuild's destination may make
    /// before the source's delete lands (it reads the move from the log),
    /// not an owner conflict.
    Departed,
}

/// Whether `stored` was written by a partition other than `partition`.
/// Versions from before the field existed count as this partition's.
pub fn foreign(partition: i32, stored: &Value) -> bool {
    writer(stored).is_some_and(|p| p != partition)
}

/// Whether the write of `partition`'s command at `pos` wins over the
/// stored version `cur` (a 409 showed that `cur` is there now):
/// - over this partition's own version, the newer position wins;
/// - over another partition's tombstone, an ordinary write wins (the
///   document is not there; if this write is a redelivery, this
///   partition's own later commands remove it again);
/// - over another partition's document, an ordinary write loses (it is
///   older than the move that took the document away, or an owner change
///   without its explicit form);
/// - a take-over wins over its source partition's version only.
pub fn wins_over(partition: i32, cur: &Value, kind: Kind, pos: u64, write: Write) -> bool {
    match (writer(cur), write) {
        (Some(p), _) if p == partition => from_source(kind, cur).pos() < pos,
        (Some(p), Write::TakeOver { from }) => from.is_none_or(|f| f == p),
        (Some(_), Write::Own | Write::Departed) => is_tombstone(cur),
        (None, _) => from_source(kind, cur).pos() < pos,
    }
}

/// What a take-over does with the version it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeOver {
    /// Replace it, whatever its position: it is the source partition's (or
    /// from before versions recorded their partition).
    Replace,
    /// Nothing stored, or this partition's own version: the ordinary
    /// position guard decides.
    Guarded,
    /// A third partition holds it: it moved on after this move left its
    /// source, so the move's copy is older. Not written.
    Refuse { held_by: i32 },
}

/// The first decision of a take-over by `partition` from `from` (see
/// [`Write::TakeOver`]), over what it read (`None`: absent).
pub fn take_over(partition: i32, stored: Option<&Value>, from: Option<i32>) -> TakeOver {
    let Some(v) = stored else { return TakeOver::Guarded };
    match writer(v) {
        None => TakeOver::Replace,
        Some(p) if p == partition => TakeOver::Guarded,
        Some(p) if from.is_none_or(|f| f == p) => TakeOver::Replace,
        Some(p) => TakeOver::Refuse { held_by: p },
    }
}

#[cfg(test)]
mod tests {
    use super::super::names::PARTITION_FIELD;
    use super::*;
    use serde_json::json;

    fn doc(partition: Option<i32>, pos: u64) -> Value {
        let mut v = json!({"id": "x", "name": "x.txt", "path": "/a", "contents": "c", "denorm_pos": pos});
        if let Some(p) = partition {
            v[PARTITION_FIELD] = json!(p);
        }
        v
    }

    fn tomb(partition: i32, pos: u64) -> Value {
        let mut v = super::super::docs::tombstone("x", pos, 0);
        v[PARTITION_FIELD] = json!(partition);
        v
    }

    #[test]
    fn own_versions_are_ordered_by_position_and_untagged_ones_count_as_own() {
        for cur in [doc(Some(0), 10), doc(None, 10), tomb(0, 10)] {
            assert!(wins_over(0, &cur, Kind::File, 11, Write::Own), "{cur}");
            assert!(!wins_over(0, &cur, Kind::File, 10, Write::Own), "{cur}");
            assert!(!wins_over(0, &cur, Kind::File, 9, Write::TakeOver { from: Some(1) }), "{cur}");
        }
    }

    #[test]
    fn an_ordinary_write_beats_another_partitions_tombstone_never_its_document() {
        assert!(wins_over(0, &tomb(1, 1_000), Kind::File, 1, Write::Own));
        assert!(!wins_over(0, &doc(Some(1), 1), Kind::File, 1_000, Write::Own));
    }

    /// A move's source deleting what it handed over is decided like its own
    /// writes: it never removes the destination's take-over (which the
    /// shard then does not count as an owner conflict).
    #[test]
    fn a_departed_documents_delete_is_decided_like_an_own_write() {
        for (cur, pos) in [(doc(Some(0), 10), 11), (doc(Some(0), 10), 10), (tomb(1, 1_000), 1), (doc(Some(1), 1), 1_000), (doc(None, 10), 11)] {
            assert_eq!(wins_over(0, &cur, Kind::File, pos, Write::Departed), wins_over(0, &cur, Kind::File, pos, Write::Own), "{cur} at {pos}");
        }
        assert!(!wins_over(0, &doc(Some(1), 1), Kind::File, 1_000, Write::Departed), "the destination's copy stays");
    }

    /// Issue 27 B2: a take-over replaces its source's copy only; a third
    /// partition's version is newer than the move, whatever the positions.
    #[test]
    fn a_take_over_wins_over_its_source_partition_only() {
        let from = Write::TakeOver { from: Some(1) };
        assert!(wins_over(0, &doc(Some(1), 1_000), Kind::File, 1, from));
        assert!(wins_over(0, &tomb(1, 1_000), Kind::File, 1, from));
        assert!(!wins_over(0, &doc(Some(2), 1), Kind::File, 1_000, from));
        assert!(!wins_over(0, &tomb(2, 1), Kind::File, 1_000, from));
        // An unknown source keeps the rule from before: any other partition.
        assert!(wins_over(0, &doc(Some(2), 1_000), Kind::File, 1, Write::TakeOver { from: None }));

        assert_eq!(take_over(0, None, Some(1)), TakeOver::Guarded);
        assert_eq!(take_over(0, Some(&doc(Some(0), 5)), Some(1)), TakeOver::Guarded);
        assert_eq!(take_over(0, Some(&doc(None, 5)), Some(1)), TakeOver::Replace);
        assert_eq!(take_over(0, Some(&doc(Some(1), 5)), Some(1)), TakeOver::Replace);
        assert_eq!(take_over(0, Some(&tomb(1, 5)), Some(1)), TakeOver::Replace);
        assert_eq!(take_over(0, Some(&doc(Some(2), 5)), Some(1)), TakeOver::Refuse { held_by: 2 });
        assert_eq!(take_over(0, Some(&tomb(2, 5)), Some(1)), TakeOver::Refuse { held_by: 2 });
        assert_eq!(take_over(0, Some(&doc(Some(2), 5)), None), TakeOver::Replace);
    }

    #[test]
    fn foreign_means_stamped_by_another_partition() {
        assert!(foreign(0, &doc(Some(1), 1)));
        assert!(!foreign(0, &doc(Some(0), 1)));
        assert!(!foreign(0, &doc(None, 1)));
    }
}
