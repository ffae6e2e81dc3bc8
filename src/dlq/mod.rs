//! Dead letters: commands a worker gave up on, kept on the dead-letter topic
//! (`<topic>.dlq` by default) with their original key and bytes, and the
//! operator's way back.
//!
//! - A command is **aborted** after a permanent failure (it cannot be
//!   admitted, or the index rejected it `--max-attempts` times). It is written
//!   to the dead-letter topic, acknowledged, and only then is its offset
//!   committed.
//! - With `--on-abort=park` (the default) its key is then **parked**: later
//!   commands of that key are dead-lettered too (reason `parked`, naming the
//!   aborted command), so they are never applied out of order. Other keys
//!   keep flowing. Which keys are parked is part of the partition's
//!   checkpoint in the index, committed with the applied offset.
//! - `denorm dlq reprocess` writes [`Control`](crate::command::control::Control) messages to the partition the
//!   letters came from: a `REPLAY` per letter, in original order, then a
//!   `RESOLVE`. The worker applies the replays, and at the `RESOLVE` writes a
//!   marker to the dead-letter topic (those letters are done) and resumes the
//!   key, unless something was dead-lettered for it since the operator
//!   started (then it stays parked, and the new letters wait for the next
//!   `reprocess`). `denorm dlq clear` does the same with `DISCARD` and no
//!   replays.
//!
//! Entries are written to dead-letter partition `origin partition mod
//! partitions`, so one applier writes all letters of a key, in order, and
//! offsets of that dead-letter partition order them.

pub mod admin;
pub mod writer;

use serde::Serialize;

use crate::command::control::Action;

/// The dead-letter topic of `topic` by default.
pub fn default_topic(topic: &str) -> String {
    format!("{topic}.dlq")
}

/// Dead-letter partition for letters from command partition `origin`.
pub fn partition_for(origin: i32, dlq_partitions: i32) -> i32 {
    origin.rem_euclid(dlq_partitions.max(1))
}

/// Kafka headers of dead-letter records.
pub mod header {
    /// Why the command was dead-lettered (see [`super::reason`]).
    pub const REASON: &str = "denorm.reason";
    /// The error, for people.
    pub const DETAIL: &str = "denorm.detail";
    pub const ORIGIN_TOPIC: &str = "denorm.origin.topic";
    pub const ORIGIN_PARTITION: &str = "denorm.origin.partition";
    /// Offset of the command when it was first written to the command topic
    /// (a replayed command keeps its first offset).
    pub const ORIGIN_OFFSET: &str = "denorm.origin.offset";
    /// Times the worker tried to apply it.
    pub const ATTEMPTS: &str = "denorm.attempts";
    /// Unix milliseconds.
    pub const DEAD_LETTERED_AT: &str = "denorm.dead-lettered-at";
    pub const COMMAND_ID: &str = "denorm.command-id";
    /// For parked commands: the aborted command they wait behind.
    pub const PARKED_BEHIND: &str = "denorm.parked-behind";
    /// A letter without its command, which was over the topic's message
    /// limit: the command's size in bytes (it stays in the command topic at
    /// its origin, where `denorm dlq reprocess` reads it).
    pub const PAYLOAD_OMITTED: &str = "denorm.payload-omitted";
    /// On markers only: `reprocessed`, `cleared` or `dropped`.
    pub const MARKER: &str = "denorm.marker";
    /// On markers: the key's letters up to this offset are done (`dropped`:
    /// the one letter at this offset).
    pub const THROUGH: &str = "denorm.through";
    /// On letters: the command-topic offset of the message whose handling
    /// wrote it (the command's own, or the `REPLAY` that replayed it). A
    /// rebuild, which writes its letters again, writes the same.
    pub const AT: &str = "denorm.at";
    /// On markers: the key's letters written at or before this command-topic
    /// offset ([`AT`]) are done, whatever their dead-letter offset (a
    /// rebuild's copies too; `dropped`: those written at this offset).
    pub const THROUGH_AT: &str = "denorm.through-at";
}

/// Dead-letter reasons besides the admission reasons of
/// [`crate::worker::admit::reason`].
pub mod reason {
    /// Waited behind an aborted command of the same key.
    pub const PARKED: &str = "parked";
    /// The index rejected the command `--max-attempts` times.
    pub const INDEX_REJECTED: &str = "index_rejected";
    /// The message's key does not hash (murmur2) to the partition it is in:
    /// its producer uses another partitioner.
    pub const WRONG_PARTITION: &str = "wrong_partition";
    /// A repair (`denorm verify --repair`) whose document was written
    /// after the verify compared it: not applied. Its key is not parked.
    pub const REPAIR_REFUSED: &str = "repair_refused";
    /// A take-over (an owner change's upsert, a move's first chunk) whose
    /// departure the partition it waited for did not reach within
    /// `--wait-limit-secs`: an `after` or a source position that names a
    /// place the log never reaches, or a partition nobody applies.
    pub const TAKEOVER_TIMEOUT: &str = "takeover_timeout";
    /// A chunk of a move spanning several messages whose next chunk did
    /// not come within `--wait-limit-secs`: the move is ended, its
    /// documents withdrawn, and each of its chunks read so far
    /// dead-lettered with its files.
    pub const MOVE_INCOMPLETE: &str = "move_incomplete";
    /// A control message that cannot be carried out as it stands (a
    /// `PLACE` naming a placement move that was never recorded).
    pub const INVALID_CONTROL: &str = "invalid_control";
    /// A move's chunk or a control message without a valid signature
    /// while the workers have signing keys (`--signing-key-file`): not
    /// written by a worker or an operator. No key is parked.
    pub const FORGED: &str = "forged";
}

impl Action {
    /// The marker a worker writes when it carries out a `RESOLVE` or
    /// `DISCARD`.
    pub fn marker(self) -> MarkerKind {
        if self == Action::Discard {
            MarkerKind::Cleared
        } else {
            MarkerKind::Reprocessed
        }
    }
}

/// A command the worker gives up on (or parks), as written to the
/// dead-letter topic.
#[derive(Debug, Clone)]
pub struct Letter<'a> {
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    pub reason: &'static str,
    pub detail: String,
    pub origin_partition: i32,
    pub origin_offset: i64,
    /// See [`header::AT`].
    pub at: i64,
    pub attempts: u32,
    pub command_id: Option<String>,
    pub parked_behind: Option<String>,
    /// The command's size when it is not in the letter (see
    /// [`header::PAYLOAD_OMITTED`]).
    pub payload_omitted: Option<usize>,
}

/// What identifies a marker written for an operator's control message: its
/// key, dead-letter partition, kind and `through`, all taken from the
/// control message, so a rebuild replaying it finds the marker the live
/// run wrote.
pub type MarkerId = (String, i32, MarkerKind, i64);

/// Markers close letters of a key up to an offset, or (`Dropped`) one
/// letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MarkerKind {
    Reprocessed,
    Cleared,
    /// `denorm dlq clear --letter`: this one letter is discarded; the key
    /// stays parked until `reprocess` replays the rest (or `clear`).
    Dropped,
}

impl MarkerKind {
    pub fn parse(s: &str) -> Option<MarkerKind> {
        [MarkerKind::Reprocessed, MarkerKind::Cleared, MarkerKind::Dropped].into_iter().find(|k| k.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MarkerKind::Reprocessed => "reprocessed",
            MarkerKind::Cleared => "cleared",
            MarkerKind::Dropped => "dropped",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::control::Control;

    #[test]
    fn control_messages_round_trip_and_are_told_from_commands() {
        let codec = crate::codec::Codec::new();
        let c = Control { action: Action::Replay, key: "/docs".into(), dlq_partition: 3, dlq_offset: 17, through: 20, origin_offset: 1234, payload: vec![1, 2, 3], requested_at: 99, through_at: 1300 };
        let bytes = codec.encode_control(&c);
        assert_eq!(codec.decode_message(&bytes).unwrap(), crate::codec::Decoded::Control(c.clone()));
        // Version 1 (no `through_at`): read as -1, decided by `through`.
        let v1 = apache_avro::Schema::parse_str(crate::codec::CONTROL_HISTORY[0]).unwrap();
        let apache_avro::types::Value::Record(mut fields) = apache_avro::from_avro_datum(&apache_avro::Schema::parse_str(crate::codec::CONTROL_SCHEMA).unwrap(), &mut &bytes[10..], None).unwrap()
        else {
            panic!("a record")
        };
        fields.retain(|(name, _)| name != "through_at");
        let old = crate::codec::encode_value(&v1, crate::codec::canonical::fingerprint(crate::codec::CONTROL_HISTORY[0]).unwrap(), apache_avro::types::Value::Record(fields));
        assert_eq!(codec.decode_message(&old).unwrap(), crate::codec::Decoded::Control(Control { through_at: -1, ..c }));
        assert!(codec.decode(&bytes).is_err(), "a control message is not a command");
        assert_eq!(partition_for(13, 12), 1);
        assert_eq!(Action::parse("DISCARD"), Some(Action::Discard));
        assert_eq!(Action::parse("discard"), None);
    }
}
