//! The worker's side of the dead-letter topic: writes a letter and waits for
//! its acknowledgement, so nothing is committed past a command that is
//! neither applied nor dead-lettered.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::{header, partition_for, Letter, MarkerKind};
use crate::clock::now_millis;
use crate::kafka::KafkaConfig;

/// Longest a dead-letter write waits before it counts as failed (and is
/// retried by the caller).
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest detail kept in a header.
const MAX_DETAIL: usize = 1000;
/// What a letter or a move's chunk adds to the message it carries: headers,
/// a path of up to 4 KiB, record framing.
const OVERHEAD: usize = 64 << 10;

/// Whether a write failed for the message's size (the producer's limit, or
/// the broker's): a permanent failure, which retrying never mends.
pub fn too_large(e: &KafkaError) -> bool {
    e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::MessageSizeTooLarge)
}

pub struct DeadLetterWriter {
    producer: FutureProducer,
    /// The dead-letter topic.
    pub topic: String,
    origin_topic: String,
    partitions: i32,
    /// Signs the messages written to the command topic.
    signing: Option<std::sync::Arc<crate::signing::Signing>>,
}

impl DeadLetterWriter {
    /// A writer to `topic` (which has `partitions` partitions) for letters
    /// from `cfg.topic`, whose messages are at most `max_message_bytes`
    /// (what the worker accepts): a letter or a move's chunk carries one
    /// such message, plus headers or paths, and the producer takes it.
    pub fn new(cfg: &KafkaConfig, topic: &str, partitions: i32, max_message_bytes: usize) -> Result<Self, KafkaError> {
        let timeout = DELIVERY_TIMEOUT.as_millis().to_string();
        // librdkafka's default, 1,000,000, is below the 1 MiB a worker
        // accepts by default.
        let max = (max_message_bytes + OVERHEAD).max(1_000_000).to_string();
        // lz4: a cross-key move's documents are large, repetitive messages.
        let c = cfg.producer_config(&[("linger.ms", "0"), ("message.timeout.ms", &timeout), ("compression.type", "lz4"), ("message.max.bytes", &max)]);
        Ok(DeadLetterWriter { producer: c.create()?, topic: topic.into(), origin_topic: cfg.topic.clone(), partitions, signing: cfg.signing.clone() })
    }

    /// The dead-letter partition of letters from `origin`.
    pub fn partition(&self, origin: i32) -> i32 {
        partition_for(origin, self.partitions)
    }

    /// Writes `letter` and waits for the acknowledgement. Returns its
    /// offset in the dead-letter topic.
    pub fn write(&self, l: &Letter<'_>) -> Result<i64, KafkaError> {
        let (partition, offset, attempts, at, written_at) = (l.origin_partition.to_string(), l.origin_offset.to_string(), l.attempts.to_string(), now_millis().to_string(), l.at.to_string());
        let detail = truncate(&l.detail, MAX_DETAIL);
        let mut h = OwnedHeaders::new();
        for (key, value) in [
            (header::REASON, l.reason),
            (header::DETAIL, detail),
            (header::ORIGIN_TOPIC, self.origin_topic.as_str()),
            (header::ORIGIN_PARTITION, partition.as_str()),
            (header::ORIGIN_OFFSET, offset.as_str()),
            (header::AT, written_at.as_str()),
            (header::ATTEMPTS, attempts.as_str()),
            (header::DEAD_LETTERED_AT, at.as_str()),
        ] {
            h = h.insert(Header { key, value: Some(value) });
        }
        if let Some(id) = &l.command_id {
            h = h.insert(Header { key: header::COMMAND_ID, value: Some(id.as_str()) });
        }
        if let Some(b) = &l.parked_behind {
            h = h.insert(Header { key: header::PARKED_BEHIND, value: Some(b.as_str()) });
        }
        let omitted = l.payload_omitted.map(|n| n.to_string());
        if let Some(n) = &omitted {
            h = h.insert(Header { key: header::PAYLOAD_OMITTED, value: Some(n.as_str()) });
        }
        self.send(self.partition(l.origin_partition), l.key, l.payload, h)
    }

    /// Writes a marker: `key`'s letters in `dlq_partition` up to `through`
    /// are done (a `Dropped` marker: the letter at `through`), and those
    /// written at or before command-topic offset `through_at` (-1: unknown).
    /// Their commands came from command partition `origin_partition`.
    pub fn mark(&self, dlq_partition: i32, key: &str, kind: MarkerKind, through: i64, through_at: i64, origin_partition: i32) -> Result<i64, KafkaError> {
        let (through, origin, through_at) = (through.to_string(), origin_partition.to_string(), through_at.to_string());
        let at = now_millis().to_string();
        let h = OwnedHeaders::new()
            .insert(Header { key: header::MARKER, value: Some(kind.as_str()) })
            .insert(Header { key: header::THROUGH, value: Some(through.as_str()) })
            .insert(Header { key: header::THROUGH_AT, value: Some(through_at.as_str()) })
            .insert(Header { key: header::ORIGIN_PARTITION, value: Some(origin.as_str()) })
            .insert(Header { key: header::DEAD_LETTERED_AT, value: Some(at.as_str()) });
        let key = (!key.is_empty()).then_some(key.as_bytes());
        self.send(dlq_partition, key, None, h)
    }

    /// Writes a message of the worker's own to the command topic (a
    /// cross-key move's documents), signed when there are keys, and waits
    /// for the acknowledgement. Its offset there.
    pub fn send_command(&self, partition: i32, key: &[u8], payload: &[u8]) -> Result<i64, KafkaError> {
        crate::faults::io("move.send").map_err(|_| KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::BrokerTransportFailure))?;
        let headers = crate::signing::headers(self.signing.as_deref(), &self.origin_topic, Some(key), payload);
        self.send_to(&self.origin_topic, partition, Some(key), Some(payload), headers)
    }

    fn send(&self, partition: i32, key: Option<&[u8]>, payload: Option<&[u8]>, headers: OwnedHeaders) -> Result<i64, KafkaError> {
        crate::faults::io("dlq.send").map_err(|_| KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::BrokerTransportFailure))?;
        self.send_to(&self.topic, partition, key, payload, headers)
    }

    fn send_to(&self, topic: &str, partition: i32, key: Option<&[u8]>, payload: Option<&[u8]>, headers: OwnedHeaders) -> Result<i64, KafkaError> {
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).partition(partition).headers(headers);
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(p) = payload {
            record = record.payload(p);
        }
        let ack = self.producer.send_result(record).map_err(|(e, _)| e)?;
        match futures::executor::block_on(ack) {
            Ok(Ok(d)) => Ok(d.offset),
            Ok(Err((e, _))) => Err(e),
            Err(_) => Err(KafkaError::Canceled),
        }
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
