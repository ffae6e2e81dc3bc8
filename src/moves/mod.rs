//! Renames that cross ordering keys: the move protocol's one home (see
//! docs/cross-key.md). Here: its rules (this file, no I/O), the writes it
//! makes on a shard (`effects`), and the check that a copy of the topic
//! keeps each move where its destination applies it (`arrivals`, no I/O).
//! Elsewhere, each for a reason: the messages, with the topic's other
//! messages (`command::moves`); the four `Shard` methods that place a
//! moved document differently on each backend (`index`); and the
//! applier's sending, receiving and waiting, which are a partition's
//! (`worker/applier/moves.rs`, `receiving.rs`).
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

pub(crate) mod arrivals;
pub mod effects;
pub use effects::{move_in, move_out, remove_moved, withdraw_move};

use crate::command::moves::MoveIn;
use crate::index::progress::Received;
use crate::index::{Doc, FileDoc};

/// Whether a move's take-over (its first chunk) may be applied whose
/// files left their partition at `departure` (the cross-key rename's
/// offset), given the last offset that partition's shard has applied: once
/// everything before the rename is (the source marks the rename itself
/// applied only after writing the chunks). Live, that is so when the
/// take-over arrives; a replay or rebuild waits for it, so the documents
/// change hands in the order they did live (see docs/cross-key.md).
pub fn departed(applied: Option<u64>, departure: i64) -> bool {
    departure <= 0 || applied.is_some_and(|a| a as i64 >= departure - 1)
}

/// Whether an owner change's upsert may take its document over, given the
/// last offset applied by the partition it leaves: once that partition
/// has applied the delete half at `delete` itself. Before, the delete
/// could still land where the document's new key writes it (Elasticsearch,
/// where partitions share documents).
pub fn delete_half_applied(applied: Option<u64>, delete: i64) -> bool {
    applied.is_some_and(|a| a as i64 >= delete)
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

impl MoveIn {
    /// The chunk's files as documents written at log position `pos`.
    pub fn docs(&self, pos: u64) -> impl Iterator<Item = Doc> + '_ {
        self.files.iter().map(move |f| Doc::File(FileDoc::at(&f.id, &f.path, &f.contents, pos)))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::moves::MoveIn;
    use crate::index::progress::Received;

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
    fn an_owner_change_waits_until_its_delete_half_itself_is_applied() {
        assert!(!delete_half_applied(None, 10) && !delete_half_applied(None, 0), "nothing applied yet");
        assert!(!delete_half_applied(Some(9), 10), "everything before the delete half, not the delete");
        assert!(delete_half_applied(Some(10), 10) && delete_half_applied(Some(500), 10));
        assert!(delete_half_applied(Some(0), 0));
    }

    #[test]
    fn resends_of_completed_moves_are_recognised() {
        let m = |p, o| MoveIn { move_id: "m".into(), source_partition: p, source_offset: o, from: "/s/a".into(), to: "/d/a".into(), chunk: 0, last: true, issued_at: 0, files: vec![], aborted: false };
        let mut r = Received::new();
        r.insert(1, 10);
        assert_eq!(arrival(&r, None, &m(1, 10)), Arrival::Duplicate);
        assert_eq!(arrival(&r, None, &m(1, 9)), Arrival::Duplicate);
        assert_eq!(arrival(&r, None, &m(1, 11)), Arrival::Starts);
        assert_eq!(arrival(&r, None, &m(2, 3)), Arrival::Starts);
        assert_eq!(arrival(&r, Some((1, 11)), &m(1, 11)), Arrival::Continues);
        assert_eq!(arrival(&r, Some((1, 11)), &m(2, 3)), Arrival::Waits);
    }
}
