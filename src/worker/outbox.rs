//! Where an applier's outbound messages go: dead letters and their markers
//! to the dead-letter topic, a cross-key move's chunks to the command
//! topic. One trait, so that the applier's tests script it; the worker's is
//! the dead-letter writer's Kafka producer.

use rdkafka::error::KafkaError;

use crate::dlq::writer::DeadLetterWriter;
use crate::dlq::{Letter, MarkerKind};

pub(crate) trait Outbox: Send + Sync {
    /// The dead-letter topic (named in logs).
    fn dead_letter_topic(&self) -> &str;
    /// Writes a dead letter; its offset once acknowledged.
    fn dead_letter(&self, letter: &Letter<'_>) -> Result<i64, KafkaError>;
    /// Writes the marker that closes letters of `key` up to `through` (and
    /// those written at or before command-topic offset `through_at`).
    fn marker(&self, dlq_partition: i32, key: &str, kind: MarkerKind, through: i64, through_at: i64, origin_partition: i32) -> Result<i64, KafkaError>;
    /// Writes a message to `partition` of the command topic (a move's chunk).
    fn command(&self, partition: i32, key: &[u8], payload: &[u8]) -> Result<i64, KafkaError>;
}

impl Outbox for DeadLetterWriter {
    fn dead_letter_topic(&self) -> &str {
        &self.topic
    }

    fn dead_letter(&self, letter: &Letter<'_>) -> Result<i64, KafkaError> {
        self.write(letter)
    }

    fn marker(&self, dlq_partition: i32, key: &str, kind: MarkerKind, through: i64, through_at: i64, origin_partition: i32) -> Result<i64, KafkaError> {
        self.mark(dlq_partition, key, kind, through, through_at, origin_partition)
    }

    fn command(&self, partition: i32, key: &[u8], payload: &[u8]) -> Result<i64, KafkaError> {
        self.send_command(partition, key, payload)
    }
}

/// An outbox that writes nothing (a replay that leaves the topics as they
/// are: see [`crate::worker::Mode::writes_to_kafka`]). Each write
/// "succeeds" at an offset of its own, counting down from -2, which no
/// topic holds.
pub(crate) struct Withheld {
    pub(crate) dead_letter_topic: String,
    pub(crate) next: std::sync::atomic::AtomicI64,
}

impl Withheld {
    pub(crate) fn new(dead_letter_topic: &str) -> Self {
        Withheld { dead_letter_topic: dead_letter_topic.to_string(), next: std::sync::atomic::AtomicI64::new(-2) }
    }

    fn offset(&self) -> i64 {
        self.next.fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
    }
}

impl Outbox for Withheld {
    fn dead_letter_topic(&self) -> &str {
        &self.dead_letter_topic
    }

    fn dead_letter(&self, _letter: &Letter<'_>) -> Result<i64, KafkaError> {
        Ok(self.offset())
    }

    fn marker(&self, _dlq_partition: i32, _key: &str, _kind: MarkerKind, _through: i64, _through_at: i64, _origin_partition: i32) -> Result<i64, KafkaError> {
        Ok(self.offset())
    }

    fn command(&self, _partition: i32, _key: &[u8], _payload: &[u8]) -> Result<i64, KafkaError> {
        Ok(self.offset())
    }
}
