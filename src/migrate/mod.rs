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
//! them), an owner change's upsert (`after`, its delete half) and an
//! operator's control messages (`dlq reprocess` and `clear`: the letters'
//! origins and the positions that wrote them, which the dead-letter topic
//! names, and the dead-letter partition of the key's new place). The target
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

use crate::moves::arrivals::{Arrivals, Chunk};

pub mod selection;
pub use selection::Selection;
use selection::Signed;

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
    /// A destination recognises a move's resends by the highest position of
    /// a move it completed from each source partition: the copy would put a
    /// move behind a later one of the same new source partition, and the
    /// rebuild would take it for a resend.
    #[error(
        "the copy would put the cross-key move at partition {partition}, offset {offset} of {topic} behind a later move from the same new \
         source partition at its destination (partition {destination} of the new topic), where a rebuild would take it for a resend and \
         lose its files: this happens when old partitions merge into one; copy into a multiple of {from_partitions} partitions, so that \
         each new partition takes from one old partition only (delete the new topic first)"
    )]
    MovesReordered { topic: String, partition: i32, offset: i64, destination: i32, from_partitions: i32 },
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
    /// Control messages rewritten to the new places of what they name.
    pub controls: u64,
    /// Of those, the ones naming a position no letter of the dead-letter
    /// topic records (expired letters): decided by dead-letter offsets in a
    /// rebuild from the new topic, like controls of earlier builds.
    pub controls_unplaced: u64,
    /// Messages of the dropped tenants left out ([`Selection::drop_tenants`]).
    pub tenant_messages_dropped: u64,
    /// Messages of denorm's own signed in the old topic and in the new.
    pub signed: u64,
    /// Messages of denorm's own without a valid signature in the old topic,
    /// signed for the new ([`Selection::sign_unsigned`]).
    pub signed_anew: u64,
    /// Messages of denorm's own without a valid signature in the old topic,
    /// copied without one while the topics have signing keys.
    pub unsigned: u64,
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
    /// An operator's control message, rewritten (`unplaced`: naming a
    /// position no letter records, left at -1).
    Control { at: LogPosition, payload: Vec<u8>, unplaced: bool },
    /// A cross-key move's chunk that the copy would place behind a later
    /// move of the same new source partition at `destination`
    /// ([`MigrateError::MovesReordered`]).
    Reordered { destination: i32 },
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
    /// of the messages others may name (cross-key renames and deletes,
    /// replays, and the positions letters record).
    named: Vec<Vec<(i64, LogPosition)>>,
    /// Per source partition, the offsets that dead letters name (their
    /// origins, and where they were written), which control messages name.
    lettered: Vec<std::collections::BTreeSet<i64>>,
    /// Partitions of the new dead-letter topic.
    to_dlq_partitions: i32,
    /// Per new destination partition, the moves' chunks as its worker will
    /// take them.
    arrivals: std::collections::HashMap<i32, Arrivals>,
}

impl Plan {
    pub fn new(from_partitions: i32, to_partitions: i32) -> Self {
        Plan {
            to_partitions,
            next: vec![0; to_partitions as usize],
            placed: vec![0; from_partitions as usize],
            named: vec![Vec::new(); from_partitions as usize],
            lettered: vec![Default::default(); from_partitions as usize],
            to_dlq_partitions: to_partitions,
            arrivals: Default::default(),
        }
    }

    /// Records that a dead letter names `at` of the old topic (its origin,
    /// or the message whose handling wrote it): a control message may name
    /// it, so its new place is kept.
    pub fn lettered(&mut self, at: LogPosition) {
        if let Some(set) = self.lettered.get_mut(at.partition as usize) {
            set.insert(at.offset);
        }
    }

    /// Leaves the message at (`partition`, `offset`) of the old topic out:
    /// placed nowhere, so that a message naming it finds no new place.
    pub fn skip(&mut self, partition: i32, offset: i64) {
        self.placed[partition as usize] = offset + 1;
    }

    /// The new offset of offset `offset` of source partition `partition`
    /// (-1 stays -1, and so does one not kept).
    fn new_offset(&self, partition: i32, offset: i64) -> Option<i64> {
        match offset {
            o if o < 0 => Some(-1),
            o => self.new_place(LogPosition { partition, offset: o }).map(|p| p.offset),
        }
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
        let to = match key {
            Some(k) if !k.is_empty() => crate::command::partitioner::partition_of_bytes(k, self.to_partitions),
            _ => partition.rem_euclid(self.to_partitions),
        };
        let mut unplaced = false;
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
                let chunk = Chunk { old: source, new: s, last: m.last, aborted: m.aborted };
                if !self.arrivals.entry(to).or_default().arrive(chunk) {
                    return Placed::Reordered { destination: to };
                }
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
            // The positions it names are of its own partition, before it:
            // placed already.
            Some(Decoded::Control(c)) => {
                let (origin, through_at) = (self.new_offset(partition, c.origin_offset), self.new_offset(partition, c.through_at));
                unplaced = origin.is_none() || through_at.is_none();
                let c = crate::command::control::Control {
                    origin_offset: origin.unwrap_or(-1),
                    through_at: through_at.unwrap_or(-1),
                    dlq_partition: crate::dlq::partition_for(to, self.to_dlq_partitions),
                    ..c.clone()
                };
                Some(codec.encode_control(&c))
            }
            _ => None,
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
            // A replayed rename's chunks name its `REPLAY`.
            Some(Decoded::Control(c)) => c.action == crate::command::control::Action::Replay,
            _ => false,
        };
        if named || self.lettered[partition as usize].contains(&offset) {
            self.named[partition as usize].push((offset, at));
        }
        match decoded {
            Some(Decoded::Control(_)) => Placed::Control { at, payload: rewritten.expect("rewritten"), unplaced },
            _ => Placed::Copy { at, payload: rewritten },
        }
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
/// waits), their bytes, and whether it is paused for that.
#[derive(Default)]
struct Held {
    messages: VecDeque<OwnedMessage>,
    bytes: usize,
    paused: bool,
}

/// Bytes a source partition may hold behind a message that waits before it
/// is paused. Not pausing at once: a paused partition drops what the client
/// prefetched for it and fetches it again when resumed, which cost most of
/// a copy's time when moves were frequent (30 s for 1,600 messages on
/// tansu, each chunk read before its rename paused its partition).
const HELD_BYTES: usize = 8 << 20;

fn size(m: &OwnedMessage) -> usize {
    m.payload().map_or(0, <[u8]>::len) + m.key().map_or(0, <[u8]>::len) + 64
}

/// The positions of the command topic that `letters` (its dead-letter
/// topic's, as read by `dlq::admin::read`) name: their origins and where
/// they were written, which control messages name in turn.
pub fn lettered(letters: &[crate::dlq::admin::Entry]) -> Vec<LogPosition> {
    letters.iter().filter(|e| e.origin_partition >= 0).flat_map(|e| [Some(e.origin_offset), e.at].into_iter().flatten().map(|offset| LogPosition { partition: e.origin_partition, offset })).collect()
}

/// Copies topic `from` (with `partitions` partitions) into the empty topic
/// `to` (created, with `to.partitions`). `lettered` are the positions of
/// `from` that its dead letters name (origins, and where they were
/// written), which control messages name in turn. `selection` says what
/// is left out and how denorm's own messages are signed. `progress(copied,
/// total)` sees the copy go on. Blocking.
pub fn copy(from: &KafkaConfig, partitions: i32, to: &KafkaConfig, lettered: &[LogPosition], selection: &Selection, mut progress: impl FnMut(u64, u64)) -> Result<Migrated, MigrateError> {
    let started = Instant::now();
    let mut cc = from.consumer_config();
    cc.set("group.id", format!("denorm-migrate-{}", uuid::Uuid::new_v4().simple())).set("enable.auto.commit", "false").set("enable.partition.eof", "true");
    let consumer: BaseConsumer<crate::kafka::ReadsToEnd> = cc.create_with_context(crate::kafka::ReadsToEnd).map_err(KafkaSetupError::from)?;
    // Watermarks through a client of their own: on the reading one, each
    // request queued behind a fetch waiting at the end of a partition
    // (half a second each on tansu: 9 of a 12 s copy).
    let probe: BaseConsumer = cc.create().map_err(KafkaSetupError::from)?;
    if watermarks(&probe, &to.topic, to.partitions)?.iter().any(|(_, high)| *high > 0) {
        return Err(MigrateError::TargetNotEmpty(to.topic.clone()));
    }
    let mut marks = watermarks(&probe, &from.topic, partitions)?;
    if let Some((p, (low, _))) = marks.iter().enumerate().find(|(_, (low, _))| *low > 0) {
        return Err(MigrateError::Retention { topic: from.topic.clone(), partition: p, low: *low });
    }
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(&from.topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let context = Deliveries { topic: to.topic.clone(), failed: Mutex::new(None) };
    let producer: ThreadedProducer<Deliveries> = to.producer_config(&[("linger.ms", "5"), ("compression.type", "lz4"), ("message.timeout.ms", "300000")]).create_with_context(context)?;
    let codec = Codec::new();
    let mut plan = Plan::new(partitions, to.partitions);
    for at in lettered {
        plan.lettered(*at);
    }
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
                    if selection.drops(m.key()) {
                        plan.skip(p, m.offset());
                        h.bytes -= h.messages.pop_front().as_ref().map_or(0, size);
                        done.tenant_messages_dropped += 1;
                        moved = true;
                        continue;
                    }
                    let (at, payload) = match plan.place(&codec, p, m.offset(), m.key(), m.payload()) {
                        Placed::Copy { at, payload } => {
                            match payload.as_deref().map(|b| codec.is_move(b)) {
                                Some(true) => done.moves += 1,
                                Some(false) => done.afters += 1,
                                None => {}
                            }
                            (at, payload)
                        }
                        Placed::Control { at, payload, unplaced } => {
                            done.controls += 1;
                            done.controls_unplaced += u64::from(unplaced);
                            (at, Some(payload))
                        }
                        Placed::Waits(_) => break,
                        Placed::Reordered { destination } => {
                            return Err(MigrateError::MovesReordered { topic: from.topic.clone(), partition: p, offset: m.offset(), destination, from_partitions: partitions })
                        }
                        Placed::Dropped => {
                            h.bytes -= h.messages.pop_front().as_ref().map_or(0, size);
                            done.dropped += 1;
                            moved = true;
                            continue;
                        }
                    };
                    let m = h.messages.pop_front().expect("front");
                    h.bytes -= size(&m);
                    let (headers, signed) = selection.headers(&codec, from, to, &m, payload.as_deref().or(m.payload()));
                    match signed {
                        Signed::NotSigned => {}
                        Signed::Kept => done.signed += 1,
                        Signed::Anew => done.signed_anew += 1,
                        Signed::Unsigned => done.unsigned += 1,
                    }
                    send(&producer, &to.topic, &m, at, payload.as_deref(), headers)?;
                    done.copied += 1;
                    moved = true;
                }
                // A partition is paused while it holds too much behind its
                // first message, which waits; resumed once that is copied.
                if (h.paused && h.messages.is_empty()) || (!h.paused && h.bytes > HELD_BYTES) {
                    let mut t = TopicPartitionList::new();
                    t.add_partition(&from.topic, p);
                    if h.paused {
                        consumer.resume(&t)?
                    } else {
                        consumer.pause(&t)?
                    }
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
            let now = watermarks(&probe, &from.topic, partitions)?;
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
                let m = m.detach();
                held[p].bytes += size(&m);
                held[p].messages.push_back(m);
            }
        }
    }
    producer.flush(Duration::from_secs(300))?;
    if let Some(e) = producer.context().failed.lock().expect("deliveries lock").take() {
        return Err(e);
    }
    let holds: i64 = watermarks(&probe, &to.topic, to.partitions)?.iter().map(|(_, h)| h).sum();
    if holds != done.copied as i64 {
        return Err(MigrateError::Incomplete { topic: to.topic.clone(), copied: done.copied, holds });
    }
    info!(
        copied = done.copied,
        moves = done.moves,
        afters = done.afters,
        dropped = done.dropped,
        controls = done.controls,
        tenant_messages_dropped = done.tenant_messages_dropped,
        unsigned = done.unsigned,
        secs = started.elapsed().as_secs_f64(),
        "topic copied"
    );
    Ok(done)
}

/// Sends `m` to `at` of `topic` (its payload replaced by `payload` when
/// given) with `headers`, waiting while the producer's queue is full.
fn send(producer: &ThreadedProducer<Deliveries>, topic: &str, m: &OwnedMessage, at: LogPosition, payload: Option<&[u8]>, headers: rdkafka::message::OwnedHeaders) -> Result<(), MigrateError> {
    let mut record: BaseRecord<'_, [u8], [u8], Box<LogPosition>> = BaseRecord::with_opaque_to(topic, Box::new(at)).partition(at.partition).headers(headers);
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
mod tests;
