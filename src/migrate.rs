//! `denorm migrate`: copies the command topic into a new, empty topic with
//! another partition count, keeping every key's order, so that an index can
//! be rebuilt from it (`denorm --topic NEW rebuild`).
//!
//! Per-key order holds because every command of a key is in one source
//! partition, which is read in order, and goes to one target partition
//! (Java's murmur2 partitioner, as `denorm produce` uses) through an
//! idempotent producer, which keeps the order per partition.
//!
//! Messages that name a place in the log are rewritten to name the same
//! message in the new topic: a cross-key move's chunks (the rename that made
//! them) and an owner change's upsert (`after`, its delete half). The target
//! topic is empty and written only by the copy, so where each message lands
//! is known when it is sent ([`Plan`]); delivery reports confirm it. A
//! message naming a message not copied yet waits, with the rest of its
//! partition, until it is: every such reference points back in time, so
//! the copy cannot deadlock.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tracing::info;

use crate::codec::{Codec, Decoded};
use crate::command::{Command, LogPosition};
use crate::kafka::{watermarks, KafkaConfig, KafkaSetupError};

/// Why a migration did not finish.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("topic {0} already holds messages: migrate copies into an empty topic only")]
    TargetNotEmpty(String),
    #[error(
        "partition {partition} of {topic} starts at offset {low}: retention has deleted commands, and a copy would hide that the \
         history is incomplete (a rebuild from it could not be exact)"
    )]
    Retention { topic: String, partition: usize, low: i64 },
    #[error("{what} at partition {partition}, offset {offset} of {topic} names offset {names} of partition {names_partition}, which the topic does not hold")]
    Dangling { what: &'static str, topic: String, partition: i32, offset: i64, names_partition: i32, names: i64 },
    #[error("the new topic {topic} got message {got:?} where the copy placed {want:?}: was something else writing to it?")]
    Misplaced { topic: String, want: (i32, i64), got: (i32, i64) },
    #[error("copied {copied} messages but {topic} holds {holds}")]
    Incomplete { topic: String, copied: u64, holds: i64 },
    #[error(transparent)]
    Setup(#[from] KafkaSetupError),
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
}

/// What a finished migration did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Migrated {
    pub copied: u64,
    /// Chunks of cross-key moves copied with the new place of their rename.
    pub moves: u64,
    /// Owner changes whose `after` was rewritten to the new place of their
    /// delete half.
    pub afters: u64,
    /// Chunks left out ([`Placed::Dropped`]).
    pub dropped: u64,
}

/// Where the copy of a message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placed {
    /// To `at` in the new topic; `payload` is the message rewritten (None:
    /// copied as it is).
    Copy { at: LogPosition, payload: Option<Vec<u8>> },
    /// It names a message of the old topic not copied yet: it waits (with
    /// the rest of its partition) until that one is.
    Waits(LogPosition),
    /// A cross-key move's chunk whose rename the copy could not read (a
    /// rename in schema-registry framing): left out, and the rebuild's
    /// workers write that move anew when they apply the rename.
    Dropped,
}

/// The copy's bookkeeping, without I/O: where each message lands in the new
/// topic (each target partition is written in the order messages are
/// placed, from offset 0), and where the messages that others name landed.
pub struct Plan {
    to_partitions: i32,
    /// Next offset of each target partition.
    next: Vec<i64>,
    /// Next offset to place of each source partition.
    placed: Vec<i64>,
    /// Per source partition, in offset order: (old offset, new position)
    /// of the messages others may name (cross-key renames and deletes).
    named: Vec<Vec<(i64, LogPosition)>>,
}

impl Plan {
    pub fn new(from_partitions: i32, to_partitions: i32) -> Self {
        Plan { to_partitions, next: vec![0; to_partitions as usize], placed: vec![0; from_partitions as usize], named: vec![Vec::new(); from_partitions as usize] }
    }

    /// Whether the message at `at` of the old topic has been placed.
    pub fn is_placed(&self, at: LogPosition) -> bool {
        self.placed.get(at.partition as usize).is_some_and(|n| *n > at.offset)
    }

    /// The new place of the message at `at` of the old topic, when it is one
    /// that others name and it has been placed.
    pub fn new_place(&self, at: LogPosition) -> Option<LogPosition> {
        let named = self.named.get(at.partition as usize)?;
        named.binary_search_by_key(&at.offset, |(o, _)| *o).ok().map(|i| named[i].1)
    }

    /// Places the message at (`partition`, `offset`) of the old topic: its
    /// target partition by its key (or its source partition when it has
    /// none), rewritten when it names another message.
    pub fn place(&mut self, codec: &Codec, partition: i32, offset: i64, key: Option<&[u8]>, payload: Option<&[u8]>) -> Placed {
        let decoded = payload.and_then(|p| codec.decode_message(p).ok());
        let rewritten = match &decoded {
            Some(Decoded::Move(m)) => {
                let source = LogPosition { partition: m.source_partition, offset: m.source_offset };
                if !self.is_placed(source) {
                    return Placed::Waits(source);
                }
                let Some(s) = self.new_place(source) else {
                    self.placed[partition as usize] = offset + 1;
                    return Placed::Dropped;
                };
                Some(codec.encode_move(&crate::command::moves::MoveIn { source_partition: s.partition, source_offset: s.offset, ..m.clone() }))
            }
            Some(Decoded::Command(e)) => match e.after {
                Some(at) if !self.is_placed(at) => return Placed::Waits(at),
                Some(at) => {
                    // The new place of the delete it names; naming
                    // anything else, it is left out (the upsert is then
                    // applied without waiting).
                    let mut e = e.clone();
                    e.after = self.new_place(at);
                    Some(codec.encode(&e))
                }
                None => None,
            },
            _ => None,
        };
        let to = match key {
            Some(k) if !k.is_empty() => crate::command::partitioner::partition_of_bytes(k, self.to_partitions),
            _ => partition.rem_euclid(self.to_partitions),
        };
        let at = LogPosition { partition: to, offset: self.next[to as usize] };
        self.next[to as usize] += 1;
        self.placed[partition as usize] = offset + 1;
        let named = match &decoded {
            Some(Decoded::Command(e)) => match &e.command {
                Command::RenamePath { .. } => e.command.destination_key().is_some(),
                Command::DeleteFile { .. } | Command::DeletePost { .. } => true,
                _ => false,
            },
            _ => false,
        };
        if named {
            self.named[partition as usize].push((offset, at));
        }
        Placed::Copy { at, payload: rewritten }
    }
}

/// Checks each delivery against where the copy placed it.
struct Deliveries {
    topic: String,
    failed: Mutex<Option<MigrateError>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = Box<LogPosition>;

    fn delivery(&self, result: &DeliveryResult<'_>, want: Box<LogPosition>) {
        let error = match result {
            Ok(m) if (m.partition(), m.offset()) == (want.partition, want.offset) => return,
            Ok(m) => MigrateError::Misplaced { topic: self.topic.clone(), want: (want.partition, want.offset), got: (m.partition(), m.offset()) },
            Err((e, _)) => MigrateError::Kafka(e.clone()),
        };
        self.failed.lock().expect("deliveries lock").get_or_insert(error);
    }
}

/// A source partition's messages read but not copied yet (behind one that
/// waits), and whether it is paused for that.
#[derive(Default)]
struct Held {
    messages: VecDeque<OwnedMessage>,
    paused: bool,
}

/// Copies topic `from` (with `partitions` partitions) into the empty topic
/// `to` (created, with `to.partitions`). `progress(copied, total)` sees the
/// copy go on. Blocking.
pub fn copy(from: &KafkaConfig, partitions: i32, to: &KafkaConfig, mut progress: impl FnMut(u64, u64)) -> Result<Migrated, MigrateError> {
    let started = Instant::now();
    let mut cc = from.client_config();
    cc.set("group.id", format!("denorm-migrate-{}", uuid::Uuid::new_v4().simple()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true");
    let consumer: BaseConsumer = cc.create().map_err(KafkaSetupError::from)?;
    if watermarks(&consumer, &to.topic, to.partitions)?.iter().any(|(_, high)| *high > 0) {
        return Err(MigrateError::TargetNotEmpty(to.topic.clone()));
    }
    let mut marks = watermarks(&consumer, &from.topic, partitions)?;
    if let Some((p, (low, _))) = marks.iter().enumerate().find(|(_, (low, _))| *low > 0) {
        return Err(MigrateError::Retention { topic: from.topic.clone(), partition: p, low: *low });
    }
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(&from.topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let context = Deliveries { topic: to.topic.clone(), failed: Mutex::new(None) };
    let producer: ThreadedProducer<Deliveries> =
        to.producer_config(&[("linger.ms", "5"), ("compression.type", "lz4"), ("message.timeout.ms", "300000")]).create_with_context(context)?;
    let codec = Codec::new();
    let mut plan = Plan::new(partitions, to.partitions);
    let mut held: Vec<Held> = (0..partitions).map(|_| Held::default()).collect();
    // Partitions read to their end (the consumer said so: offsets of
    // transaction markers at the end never deliver a message).
    let mut at_end = vec![false; partitions as usize];
    let mut done = Migrated::default();
    let total = |m: &[(i64, i64)]| m.iter().map(|(_, h)| *h).sum::<i64>().max(0) as u64;
    loop {
        if let Some(e) = producer.context().failed.lock().expect("deliveries lock").take() {
            return Err(e);
        }
        // Copies what can be, until nothing moves.
        let mut moved = true;
        while moved {
            moved = false;
            for (p, h) in (0..).zip(held.iter_mut()) {
                while let Some(m) = h.messages.front() {
                    let (at, payload) = match plan.place(&codec, p, m.offset(), m.key(), m.payload()) {
                        Placed::Copy { at, payload } => (at, payload),
                        Placed::Waits(_) => break,
                        Placed::Dropped => {
                            h.messages.pop_front();
                            done.dropped += 1;
                            moved = true;
                            continue;
                        }
                    };
                    let m = h.messages.pop_front().expect("front");
                    match payload.as_deref().map(|b| codec.is_move(b)) {
                        Some(true) => done.moves += 1,
                        Some(false) => done.afters += 1,
                        None => {}
                    }
                    send(&producer, &to.topic, &m, at, payload.as_deref())?;
                    done.copied += 1;
                    moved = true;
                }
                // A partition waits, unread, while its first message does.
                if h.messages.is_empty() == h.paused {
                    let mut t = TopicPartitionList::new();
                    t.add_partition(&from.topic, p);
                    if h.paused { consumer.resume(&t)? } else { consumer.pause(&t)? }
                    h.paused = !h.paused;
                }
            }
        }
        progress(done.copied, total(&marks));
        let waiting = held.iter().any(|h| !h.messages.is_empty());
        if (0..partitions as usize).all(|p| at_end[p] || !held[p].messages.is_empty()) {
            if waiting {
                // Every other partition is read to its end: what a message
                // waits for is not in the topic.
                let (p, h) = (0..).zip(&held).find(|(_, h)| !h.messages.is_empty()).expect("waiting");
                let m = h.messages.front().expect("not empty");
                if let Placed::Waits(on) = plan.place(&codec, p, m.offset(), m.key(), m.payload()) {
                    let what = if m.payload().is_some_and(|b| codec.is_move(b)) { "a cross-key move's chunk" } else { "an owner change's upsert" };
                    return Err(MigrateError::Dangling { what, topic: from.topic.clone(), partition: p, offset: m.offset(), names_partition: on.partition, names: on.offset });
                }
                continue;
            }
            // Done with the log as of the last look: look again, so that
            // commands written meanwhile are copied too.
            producer.flush(Duration::from_secs(300))?;
            let now = watermarks(&consumer, &from.topic, partitions)?;
            if now == marks {
                break;
            }
            for (p, (a, b)) in now.iter().zip(&marks).enumerate() {
                at_end[p] &= a.1 == b.1;
            }
            marks = now;
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => at_end[p as usize] = true,
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(m)) => {
                let p = m.partition() as usize;
                at_end[p] = false;
                held[p].messages.push_back(m.detach());
            }
        }
    }
    producer.flush(Duration::from_secs(300))?;
    if let Some(e) = producer.context().failed.lock().expect("deliveries lock").take() {
        return Err(e);
    }
    let holds: i64 = watermarks(&consumer, &to.topic, to.partitions)?.iter().map(|(_, h)| h).sum();
    if holds != done.copied as i64 {
        return Err(MigrateError::Incomplete { topic: to.topic.clone(), copied: done.copied, holds });
    }
    info!(copied = done.copied, moves = done.moves, afters = done.afters, dropped = done.dropped, secs = started.elapsed().as_secs_f64(), "topic copied");
    Ok(done)
}

/// Sends `m` to `at` of `topic` (its payload replaced by `payload` when
/// given), waiting while the producer's queue is full.
fn send(producer: &ThreadedProducer<Deliveries>, topic: &str, m: &OwnedMessage, at: LogPosition, payload: Option<&[u8]>) -> Result<(), MigrateError> {
    let mut record: BaseRecord<'_, [u8], [u8], Box<LogPosition>> = BaseRecord::with_opaque_to(topic, Box::new(at)).partition(at.partition);
    if let Some(k) = m.key() {
        record = record.key(k);
    }
    if let Some(v) = payload.or(m.payload()) {
        record = record.payload(v);
    }
    if let Some(ts) = m.timestamp().to_millis() {
        record = record.timestamp(ts);
    }
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((e, r)) if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) => {
                producer.poll(Duration::from_millis(50));
                record = r;
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::moves::{MoveIn, MovedFile};
    use crate::command::partitioner::partition_of;
    use crate::command::Envelope;

    fn at(partition: i32, offset: i64) -> LogPosition {
        LogPosition { partition, offset }
    }

    fn command(codec: &Codec, c: Command, after: Option<LogPosition>) -> (Vec<u8>, Vec<u8>) {
        let key = c.key().as_bytes().to_vec();
        let mut e = Envelope::new(c);
        e.after = after;
        (key, codec.encode(&e))
    }

    fn chunk(codec: &Codec, source: LogPosition) -> (Vec<u8>, Vec<u8>) {
        let m = MoveIn {
            move_id: "m".into(),
            source_partition: source.partition,
            source_offset: source.offset,
            from: "/s/a".into(),
            to: "/d/a".into(),
            chunk: 0,
            last: true,
            issued_at: 0,
            files: vec![MovedFile { id: "f".into(), path: "/d/a/f.txt".into(), contents: String::new() }],
            aborted: false,
        };
        (b"/d".to_vec(), codec.encode_move(&m))
    }

    fn copied(p: Placed) -> (LogPosition, Option<Vec<u8>>) {
        match p {
            Placed::Copy { at, payload } => (at, payload),
            other => panic!("not copied: {other:?}"),
        }
    }

    #[test]
    fn each_message_lands_in_its_keys_partition_at_the_next_offset_there() {
        let codec = Codec::new();
        let mut plan = Plan::new(2, 3);
        let mut ends = [0i64; 3];
        for (i, dir) in ["/a", "/b", "/c", "/a", "/d", "/e"].iter().enumerate() {
            let (k, v) = command(&codec, Command::UpsertFile { id: format!("f{i}"), path: format!("{dir}/f.txt"), contents: String::new(), previous_path: None }, None);
            let (placed, payload) = copied(plan.place(&codec, (i % 2) as i32, (i / 2) as i64, Some(&k), Some(&v)));
            let want = partition_of(dir, 3);
            assert_eq!(placed, at(want, ends[want as usize]), "{dir}");
            ends[want as usize] += 1;
            assert_eq!(payload, None, "copied as it is");
        }
        // Without a key: its source partition's number.
        let (placed, _) = copied(plan.place(&codec, 1, 3, None, Some(b"x")));
        assert_eq!(placed.partition, 1);
    }

    #[test]
    fn a_moves_chunk_waits_for_its_rename_then_names_the_renames_new_place() {
        let codec = Codec::new();
        let mut plan = Plan::new(2, 4);
        // The chunk (partition 1) is read before its rename (partition 0,
        // offset 1) is copied: it waits.
        let (ck, cv) = chunk(&codec, at(0, 1));
        assert_eq!(plan.place(&codec, 1, 0, Some(&ck), Some(&cv)), Placed::Waits(at(0, 1)));
        let (k, v) = command(&codec, Command::UpsertFile { id: "x".into(), path: "/s/x.txt".into(), contents: String::new(), previous_path: None }, None);
        copied(plan.place(&codec, 0, 0, Some(&k), Some(&v)));
        let (k, v) = command(&codec, Command::RenamePath { from: "/s/a".into(), to: "/d/a".into() }, None);
        let (rename_at, _) = copied(plan.place(&codec, 0, 1, Some(&k), Some(&v)));
        assert_eq!(rename_at, at(partition_of("/s", 4), 1), "after the upsert of the same key");
        let (chunk_at, payload) = copied(plan.place(&codec, 1, 0, Some(&ck), Some(&cv)));
        assert_eq!(chunk_at.partition, partition_of("/d", 4));
        let Ok(Decoded::Move(m)) = codec.decode_message(&payload.expect("rewritten")) else { panic!("a move") };
        assert_eq!((m.source_partition, m.source_offset), (rename_at.partition, rename_at.offset));
        assert_eq!(m.files.len(), 1, "the rest of the chunk kept");
    }

    #[test]
    fn an_owner_changes_after_names_its_deletes_new_place() {
        let codec = Codec::new();
        let mut plan = Plan::new(2, 3);
        let upsert = Command::UpsertFile { id: "f".into(), path: "/n/f.txt".into(), contents: String::new(), previous_path: Some("/o/f.txt".into()) };
        let (uk, uv) = command(&codec, upsert.clone(), Some(at(0, 0)));
        assert_eq!(plan.place(&codec, 1, 0, Some(&uk), Some(&uv)), Placed::Waits(at(0, 0)));
        let (k, v) = command(&codec, Command::DeleteFile { id: "f".into(), path: "/o/f.txt".into() }, None);
        let (delete_at, _) = copied(plan.place(&codec, 0, 0, Some(&k), Some(&v)));
        let (_, payload) = copied(plan.place(&codec, 1, 0, Some(&uk), Some(&uv)));
        let e = codec.decode(&payload.expect("rewritten")).unwrap();
        assert_eq!(e.after, Some(delete_at));
        assert_eq!(e.command, upsert);
        // An `after` naming something else than a delete is left out.
        let (k, v) = command(&codec, Command::UpsertUser { id: "u".into(), name: "n".into(), email: "e".into(), dob: "d".into() }, None);
        copied(plan.place(&codec, 0, 1, Some(&k), Some(&v)));
        let (uk, uv) = command(&codec, upsert, Some(at(0, 1)));
        let (_, payload) = copied(plan.place(&codec, 1, 1, Some(&uk), Some(&uv)));
        assert_eq!(codec.decode(&payload.expect("rewritten")).unwrap().after, None);
    }

    #[test]
    fn a_chunk_whose_rename_cannot_be_read_is_left_out() {
        let codec = Codec::new();
        let mut plan = Plan::new(1, 2);
        copied(plan.place(&codec, 0, 0, Some(b"/s"), Some(b"\0\0\0\0\x07registry framed")));
        let (ck, cv) = chunk(&codec, at(0, 0));
        assert_eq!(plan.place(&codec, 0, 1, Some(&ck), Some(&cv)), Placed::Dropped);
        assert!(plan.is_placed(at(0, 1)));
    }
}
