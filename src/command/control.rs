//! Control messages (`schemas/control.avsc`): what an operator asks of the
//! worker through the command topic (`denorm dlq reprocess` and `clear`,
//! see [`crate::dlq`]; `denorm rebuild --tenant`, moving a tenant between
//! placements).

use serde::Serialize;

/// What an operator asks of the worker, through the command topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Action {
    Replay,
    Resolve,
    Discard,
    /// A tenant moved between placements in generation
    /// `origin_offset`: the live worker takes the placement recorded
    /// (`through`: its count of moves).
    Place,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Replay => "REPLAY",
            Action::Resolve => "RESOLVE",
            Action::Discard => "DISCARD",
            Action::Place => "PLACE",
        }
    }
    pub fn parse(s: &str) -> Option<Action> {
        [Action::Replay, Action::Resolve, Action::Discard, Action::Place].into_iter().find(|a| a.as_str() == s)
    }
}

/// A control message (`schemas/control.avsc`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    pub action: Action,
    /// Key of the letters concerned ("" for keyless messages).
    pub key: String,
    pub dlq_partition: i32,
    /// `REPLAY`: the replayed letter's offset; otherwise -1.
    pub dlq_offset: i64,
    /// Last letter of `key` this operation covers.
    pub through: i64,
    /// `REPLAY`: the command's first offset in the command topic.
    pub origin_offset: i64,
    /// `REPLAY`: the original message bytes.
    pub payload: Vec<u8>,
    pub requested_at: i64,
    /// The highest command-topic offset at which a letter this operation
    /// covers was written (-1: unknown, decide by `through`).
    pub through_at: i64,
}
