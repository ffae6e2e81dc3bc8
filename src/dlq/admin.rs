//! The operator's side of the dead-letter topic (`denorm dlq`): read the
//! letters still open, and reprocess or clear them through control messages
//! on the command topic (see the module documentation of [`crate::dlq`]).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use super::{header, MarkerKind};
use crate::clock::now_millis;
use crate::codec::Codec;
use crate::command::control::{Action, Control};
use crate::command::LogPosition;
use crate::kafka::{KafkaConfig, KafkaSetupError, REQUEST_TIMEOUT};

/// A dead letter as read back.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Entry {
    pub dlq_partition: i32,
    pub dlq_offset: i64,
    /// Message key ("" when it had none).
    pub key: String,
    pub reason: String,
    pub detail: String,
    pub origin_partition: i32,
    pub origin_offset: i64,
    /// Command-topic offset of the message whose handling wrote it
    /// ([`header::AT`]; absent in letters of earlier builds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<i64>,
    pub attempts: u32,
    /// Unix milliseconds.
    pub dead_lettered_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parked_behind: Option<String>,
    /// The command is not in the letter (over the topic's message limit):
    /// its size; `reprocess` reads it from the command topic at its origin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_omitted: Option<usize>,
    pub bytes: usize,
    #[serde(skip)]
    pub payload: Vec<u8>,
}

/// A marker: `key`'s letters of its partition up to `through` are done
/// (`dropped`: the one letter at `through`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub dlq_partition: i32,
    pub dlq_offset: i64,
    pub key: String,
    pub kind: String,
    pub through: i64,
    /// The letters written at or before this command-topic offset are done
    /// too, whatever their dead-letter offset (-1: not recorded).
    pub through_at: i64,
    /// Command partition the letters came from (-1 when not recorded).
    pub origin_partition: i32,
}

impl Marker {
    /// Its identity, when it is of a known kind.
    pub fn id(&self) -> Option<super::MarkerId> {
        Some((self.key.clone(), self.dlq_partition, MarkerKind::parse(&self.kind)?, self.through))
    }

    fn dropped(&self) -> bool {
        self.kind == MarkerKind::Dropped.as_str()
    }

    /// Whether this marker closes letter `e`: an earlier letter of its key
    /// up to `through`; or, by command-topic position, a letter of its key
    /// and partition written at or before `through_at` (`dropped`: at it),
    /// wherever it is in the dead-letter topic (a rebuild writes its letters
    /// again, after the marker).
    fn closes(&self, e: &Entry) -> bool {
        let by_offset =
            self.dlq_partition == e.dlq_partition && self.key == e.key && self.dlq_offset > e.dlq_offset && if self.dropped() { self.through == e.dlq_offset } else { self.through >= e.dlq_offset };
        let by_position = self.through_at >= 0
            && self.key == e.key
            && self.origin_partition == e.origin_partition
            && e.at.is_some_and(|at| if self.dropped() { at == self.through_at } else { at <= self.through_at });
        by_offset || by_position
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    #[error(transparent)]
    Setup(#[from] KafkaSetupError),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("reading the dead-letter topic {topic}: stopped at offset {at} of partition {partition} before its end {end}")]
    Incomplete { topic: String, partition: i32, at: i64, end: i64 },
    /// A letter without its command, whose command the command topic no
    /// longer holds.
    #[error("the letter at {dlq_partition}@{dlq_offset} does not carry its command (over the topic's message limit), and {topic} no longer holds it at partition {partition}, offset {offset} (retention): `denorm dlq clear --letter {dlq_partition}@{dlq_offset}` drops it")]
    CommandGone { topic: String, partition: i32, offset: i64, dlq_partition: i32, dlq_offset: i64 },
    #[error("waiting for the workers (is `denorm run` running for this group?): {0}")]
    Wait(#[from] crate::kafka::WaitError),
}

/// Reads the whole dead-letter topic `dlq` (up to its current end): letters
/// and markers. Blocking.
pub fn read(cfg: &KafkaConfig, dlq: &str) -> Result<(Vec<Entry>, Vec<Marker>), DlqError> {
    let dcfg = KafkaConfig { topic: dlq.to_string(), ..cfg.clone() };
    let Some(partitions) = dcfg.topic_partitions()? else { return Ok((Vec::new(), Vec::new())) };
    let mut c = cfg.consumer_config();
    c.set("group.id", format!("denorm-dlq-reader-{}", uuid::Uuid::new_v4())).set("enable.auto.commit", "false").set("enable.partition.eof", "false");
    let consumer: BaseConsumer = c.create()?;
    let mut tpl = TopicPartitionList::new();
    let mut remaining: BTreeMap<i32, (i64, i64)> = BTreeMap::new();
    for p in 0..partitions {
        let (low, high) = consumer.fetch_watermarks(dlq, p, REQUEST_TIMEOUT)?;
        if high > low {
            tpl.add_partition_offset(dlq, p, Offset::Offset(low))?;
            remaining.insert(p, (low, high));
        }
    }
    let (mut entries, mut markers) = (Vec::new(), Vec::new());
    if remaining.is_empty() {
        return Ok((entries, markers));
    }
    consumer.assign(&tpl)?;
    let mut idle = std::time::Instant::now();
    while !remaining.is_empty() {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                idle = std::time::Instant::now();
                let (p, o) = (m.partition(), m.offset());
                if let Some((_, high)) = remaining.get(&p).copied() {
                    if o + 1 >= high {
                        remaining.remove(&p);
                    }
                    if o < high {
                        parse(&m, &mut entries, &mut markers);
                    }
                }
            }
            Some(Err(e)) => return Err(e.into()),
            None if idle.elapsed() > REQUEST_TIMEOUT => {
                let (p, (at, end)) = remaining.into_iter().next().expect("not empty");
                return Err(DlqError::Incomplete { topic: dlq.into(), partition: p, at, end });
            }
            None => {}
        }
    }
    Ok((entries, markers))
}

fn parse(m: &rdkafka::message::BorrowedMessage<'_>, entries: &mut Vec<Entry>, markers: &mut Vec<Marker>) {
    let mut h: BTreeMap<&str, String> = BTreeMap::new();
    if let Some(hs) = m.headers() {
        for x in hs.iter() {
            h.insert(x.key, x.value.map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default());
        }
    }
    let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned()).unwrap_or_default();
    let num = |name: &str| h.get(name).and_then(|v| v.parse::<i64>().ok());
    if let Some(kind) = h.get(header::MARKER) {
        markers.push(Marker {
            dlq_partition: m.partition(),
            dlq_offset: m.offset(),
            key,
            kind: kind.clone(),
            through: num(header::THROUGH).unwrap_or(-1),
            through_at: num(header::THROUGH_AT).unwrap_or(-1),
            origin_partition: num(header::ORIGIN_PARTITION).unwrap_or(-1) as i32,
        });
        return;
    }
    let payload = m.payload().unwrap_or_default().to_vec();
    entries.push(Entry {
        dlq_partition: m.partition(),
        dlq_offset: m.offset(),
        key,
        reason: h.get(header::REASON).cloned().unwrap_or_else(|| "unknown".into()),
        detail: h.get(header::DETAIL).cloned().unwrap_or_default(),
        origin_partition: num(header::ORIGIN_PARTITION).unwrap_or(-1) as i32,
        origin_offset: num(header::ORIGIN_OFFSET).unwrap_or(-1),
        at: num(header::AT),
        attempts: num(header::ATTEMPTS).unwrap_or(0) as u32,
        dead_lettered_at: num(header::DEAD_LETTERED_AT).unwrap_or(0),
        command_id: h.get(header::COMMAND_ID).cloned(),
        parked_behind: h.get(header::PARKED_BEHIND).cloned(),
        payload_omitted: num(header::PAYLOAD_OMITTED).map(|n| n as usize),
        bytes: payload.len(),
        payload,
    });
}

/// The letters no marker has closed, in dead-letter order, optionally only
/// those of `key`.
pub fn open(entries: Vec<Entry>, markers: &[Marker], key: Option<&str>) -> Vec<Entry> {
    let mut out: Vec<Entry> = entries.into_iter().filter(|e| key.is_none_or(|k| e.key == k)).filter(|e| !markers.iter().any(|m| m.closes(e))).collect();
    out.sort_by_key(|e| (e.dlq_partition, e.dlq_offset));
    out
}

/// Letters dropped one by one (`clear --letter`) whose key no `reprocess`
/// or `clear` has resumed since, optionally only those of `key`. The next
/// operation on the key must cover them: a key parked behind a dropped
/// poison message resumes only when the operator's `through` reaches it.
pub fn pending_drops(markers: &[Marker], key: Option<&str>) -> Vec<Marker> {
    markers
        .iter()
        .filter(|m| m.dropped() && key.is_none_or(|k| m.key == k))
        .filter(|m| !markers.iter().any(|r| !r.dropped() && r.dlq_partition == m.dlq_partition && r.key == m.key && r.dlq_offset > m.dlq_offset && r.through >= m.through))
        .cloned()
        .collect()
}

/// Each command once: a worker that crashed after writing a letter but
/// before committing writes it again.
pub fn distinct(mut letters: Vec<Entry>) -> Vec<Entry> {
    let mut seen = HashSet::new();
    letters.retain(|e| e.origin_partition < 0 || seen.insert((e.origin_partition, e.origin_offset, e.key.clone())));
    letters
}

/// Open letters by reason.
pub fn count_by_reason(open: &[Entry]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in open {
        *out.entry(e.reason.clone()).or_insert(0) += 1;
    }
    out
}

/// One operation's unit: the open letters of one key from one partition,
/// in their original order.
#[derive(Debug, Clone)]
pub struct Group {
    pub origin_partition: i32,
    pub dlq_partition: i32,
    pub key: String,
    /// Distinct commands, in original order.
    pub entries: Vec<Entry>,
    /// The last dead-letter offset this group covers (duplicates included).
    pub through: i64,
    /// The highest command-topic offset at which a letter it covers was
    /// written (-1 when a letter does not say: decided by `through`).
    pub through_at: i64,
}

/// Groups open letters by key and partition, each in original (command
/// topic) order. A group's `through` covers its key's pending drops too,
/// and a key with nothing open but pending drops gets a group of its own
/// (no letters to replay; the operation only resumes the key).
pub fn groups(open: Vec<Entry>, drops: &[Marker]) -> Vec<Group> {
    let mut by: BTreeMap<(i32, i32, String), Vec<Entry>> = BTreeMap::new();
    for e in open {
        by.entry((e.origin_partition, e.dlq_partition, e.key.clone())).or_default().push(e);
    }
    for m in drops.iter().filter(|m| m.origin_partition >= 0) {
        by.entry((m.origin_partition, m.dlq_partition, m.key.clone())).or_default();
    }
    by.into_iter()
        .map(|((origin_partition, dlq_partition, key), entries)| {
            let dropped: Vec<&Marker> = drops.iter().filter(|m| m.dlq_partition == dlq_partition && m.key == key).collect();
            let through = entries.iter().map(|e| e.dlq_offset).chain(dropped.iter().map(|m| m.through)).max().unwrap_or(-1);
            let ats: Option<Vec<i64>> = entries.iter().map(|e| e.at).chain(dropped.iter().map(|m| (m.through_at >= 0).then_some(m.through_at))).collect();
            let through_at = ats.and_then(|a| a.into_iter().max()).unwrap_or(-1);
            let mut entries = distinct(entries);
            entries.sort_by_key(|e| (e.origin_offset, e.dlq_offset));
            Group { origin_partition, dlq_partition, key, entries, through, through_at }
        })
        .collect()
}

/// Reads into each letter of `groups` that does not carry its command (see
/// [`Entry::payload_omitted`]) the command from the command topic at its
/// origin. Returns how many were read. Blocking.
pub fn fill_omitted(cfg: &KafkaConfig, groups: &mut [Group]) -> Result<usize, DlqError> {
    let mut filled = 0;
    let mut consumer: Option<BaseConsumer> = None;
    for e in groups.iter_mut().flat_map(|g| g.entries.iter_mut()).filter(|e| e.payload_omitted.is_some()) {
        let c = match &consumer {
            Some(c) => c,
            None => {
                let mut c = cfg.consumer_config();
                c.set("group.id", format!("denorm-dlq-reader-{}", uuid::Uuid::new_v4())).set("enable.auto.commit", "false");
                consumer.insert(c.create()?)
            }
        };
        let gone = || DlqError::CommandGone { topic: cfg.topic.clone(), partition: e.origin_partition, offset: e.origin_offset, dlq_partition: e.dlq_partition, dlq_offset: e.dlq_offset };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&cfg.topic, e.origin_partition, Offset::Offset(e.origin_offset))?;
        c.assign(&tpl)?;
        let started = std::time::Instant::now();
        let payload = loop {
            match c.poll(Duration::from_millis(200)) {
                Some(Ok(m)) if m.offset() == e.origin_offset => break m.payload().unwrap_or_default().to_vec(),
                Some(Ok(_)) => return Err(gone()),
                Some(Err(err)) => return Err(err.into()),
                None if started.elapsed() > REQUEST_TIMEOUT => return Err(gone()),
                None => {}
            }
        };
        e.bytes = payload.len();
        e.payload = payload;
        filled += 1;
    }
    Ok(filled)
}

/// What a reprocess or a clear came to ([`carry_out`]).
#[derive(Debug)]
pub struct CarriedOut {
    /// Letters without their command, read from the command topic at their
    /// origin (a reprocess).
    pub filled: usize,
    /// The groups handed to the workers.
    pub groups: Vec<Group>,
    /// Once the workers applied the requests, the letters of those keys
    /// open again (a replay failed again, or new commands came meanwhile:
    /// the key stays parked); `None` when not waited for.
    pub still_open: Option<Vec<Entry>>,
}

/// Carries out an operator's reprocess (`reprocess`) or clear of `groups`
/// of the dead-letter topic `dlq`: fills in the letters without their
/// command (a reprocess), writes the control messages to the command
/// topic, and with `wait` waits until `group`'s workers have applied them,
/// then reads what is open again for those keys.
pub async fn carry_out(cfg: &KafkaConfig, dlq: &str, group: &str, mut groups: Vec<Group>, reprocess: bool, wait: Option<Duration>) -> Result<CarriedOut, DlqError> {
    let mut filled = 0;
    if reprocess {
        let k = cfg.clone();
        let (n, g) = tokio::task::spawn_blocking(move || fill_omitted(&k, &mut groups).map(|n| (n, groups))).await.expect("the blocking task")?;
        (filled, groups) = (n, g);
    }
    let deliveries = send(cfg, &groups, reprocess).await?;
    let Some(timeout) = wait else { return Ok(CarriedOut { filled, groups, still_open: None }) };
    let (k, g, t) = (cfg.clone(), group.to_string(), dlq.to_string());
    let (entries, markers) = tokio::task::spawn_blocking(move || -> Result<_, DlqError> {
        crate::kafka::wait_for_deliveries(&k, &g, &deliveries, timeout)?;
        read(&k, &t)
    })
    .await
    .expect("the blocking task")?;
    let keys: HashSet<&str> = groups.iter().map(|g| g.key.as_str()).collect();
    let still = distinct(open(entries, &markers, None).into_iter().filter(|e| keys.contains(e.key.as_str())).collect());
    Ok(CarriedOut { filled, groups, still_open: Some(still) })
}

/// Drops `letters` from the dead-letter topic `dlq` one by one (a marker
/// each), with every crash-duplicate of the same command among `open`.
/// Returns the letters dropped. Blocking.
pub fn drop_letters(cfg: &KafkaConfig, dlq: &str, letters: &[Entry], open: &[Entry]) -> Result<Vec<Entry>, DlqError> {
    // Markers only: small.
    let writer = super::writer::DeadLetterWriter::new(cfg, dlq, 1, 0)?;
    let mut dropped = Vec::new();
    for l in letters {
        for e in open.iter().filter(|e| e.key == l.key && e.origin_partition == l.origin_partition && e.origin_offset == l.origin_offset) {
            writer.mark(e.dlq_partition, &e.key, MarkerKind::Dropped, e.dlq_offset, e.at.unwrap_or(-1), e.origin_partition)?;
            dropped.push(e.clone());
        }
    }
    Ok(dropped)
}

/// Writes the control messages of `groups` to the command topic: for
/// `reprocess`, a `REPLAY` per letter then a `RESOLVE`; otherwise only a
/// `DISCARD`. Returns the delivery of each group's last message (once the
/// worker group has committed past them, the operation is done).
pub async fn send(cfg: &KafkaConfig, groups: &[Group], reprocess: bool) -> Result<Vec<LogPosition>, DlqError> {
    // A replay carries a command of up to the size a worker accepts.
    let largest = groups.iter().flat_map(|g| &g.entries).map(|e| e.payload.len()).max().unwrap_or(0);
    let max = (largest + (64 << 10)).max(1_000_000).to_string();
    let producer: FutureProducer = cfg.producer_config(&[("message.timeout.ms", "120000"), ("message.max.bytes", &max)]).create()?;
    let codec = Codec::new();
    let now = now_millis();
    let mut acks = Vec::new();
    for g in groups {
        let control = |action, e: Option<&Entry>| Control {
            action,
            key: g.key.clone(),
            dlq_partition: g.dlq_partition,
            dlq_offset: e.map_or(-1, |e| e.dlq_offset),
            through: g.through,
            origin_offset: e.map_or(-1, |e| e.origin_offset),
            payload: e.map(|e| e.payload.clone()).unwrap_or_default(),
            requested_at: now,
            through_at: g.through_at,
        };
        let mut messages = Vec::new();
        if reprocess {
            messages.extend(g.entries.iter().map(|e| control(Action::Replay, Some(e))));
        }
        messages.push(control(if reprocess { Action::Resolve } else { Action::Discard }, None));
        let last = messages.len() - 1;
        for (i, m) in messages.iter().enumerate() {
            let bytes = codec.encode_control(m);
            let key = (!g.key.is_empty()).then_some(g.key.as_bytes());
            let headers = crate::signing::headers(cfg.signing.as_deref(), &cfg.topic, key, &bytes);
            let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&cfg.topic).partition(g.origin_partition).payload(&bytes[..]).headers(headers);
            if let Some(k) = key {
                record = record.key(k);
            }
            // In order per partition: each is enqueued before the next.
            let ack = producer.send_result(record).map_err(|(e, _)| e)?;
            if i == last {
                acks.push(ack);
            }
        }
    }
    let mut out = Vec::new();
    for ack in acks {
        match ack.await {
            Ok(Ok(d)) => out.push(LogPosition { partition: d.partition, offset: d.offset }),
            Ok(Err((e, _))) => return Err(e.into()),
            Err(_) => return Err(rdkafka::error::KafkaError::Canceled.into()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(p: i32, o: i64, key: &str, origin: i64) -> Entry {
        Entry {
            dlq_partition: p,
            dlq_offset: o,
            key: key.into(),
            reason: "parked".into(),
            detail: String::new(),
            origin_partition: p,
            origin_offset: origin,
            at: Some(origin),
            attempts: 1,
            dead_lettered_at: 0,
            command_id: None,
            parked_behind: None,
            payload_omitted: None,
            bytes: 0,
            payload: Vec::new(),
        }
    }

    #[test]
    fn markers_close_earlier_letters_of_their_key_and_partition_only() {
        let entries = vec![entry(0, 0, "a", 10), entry(0, 1, "b", 11), entry(0, 2, "a", 12), entry(1, 0, "a", 5), entry(0, 4, "a", 20)];
        let markers = vec![Marker { dlq_partition: 0, dlq_offset: 3, key: "a".into(), kind: "cleared".into(), through: 2, through_at: -1, origin_partition: 0 }];
        let got: Vec<(i32, i64)> = open(entries, &markers, None).iter().map(|e| (e.dlq_partition, e.dlq_offset)).collect();
        assert_eq!(got, vec![(0, 1), (0, 4), (1, 0)]);
    }

    #[test]
    fn duplicates_of_one_command_are_listed_once_and_groups_keep_original_order() {
        // A re-dead-lettered replay (origin 10) written after a newer command (origin 12).
        let entries = vec![entry(0, 5, "a", 12), entry(0, 6, "a", 10), entry(0, 7, "a", 10), entry(0, 8, "b", 3)];
        let open = open(entries, &[], None);
        assert_eq!(distinct(open.clone()).len(), 3);
        let g = groups(open, &[]);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].key, "a");
        assert_eq!(g[0].entries.iter().map(|e| e.origin_offset).collect::<Vec<_>>(), vec![10, 12]);
        assert_eq!(g[0].through, 7, "the duplicate is covered too");
        assert_eq!(count_by_reason(&g[0].entries)["parked"], 2);
    }

    fn marker(kind: &str, at: i64, key: &str, through: i64) -> Marker {
        Marker { dlq_partition: 0, dlq_offset: at, key: key.into(), kind: kind.into(), through, through_at: -1, origin_partition: 0 }
    }

    #[test]
    fn a_dropped_letter_alone_is_closed_and_the_next_operation_covers_it() {
        // Poison at 0, valid commands at 1 and 2 (key a); another key at 3.
        let entries = vec![entry(0, 0, "a", 10), entry(0, 1, "a", 11), entry(0, 2, "a", 12), entry(0, 3, "b", 13)];
        let markers = vec![marker("dropped", 4, "a", 0)];
        let left = open(entries.clone(), &markers, Some("a"));
        assert_eq!(left.iter().map(|e| e.dlq_offset).collect::<Vec<_>>(), vec![1, 2]);
        let drops = pending_drops(&markers, Some("a"));
        assert_eq!(drops.len(), 1);
        let g = groups(left, &drops);
        assert_eq!((g.len(), g[0].entries.len(), g[0].through), (1, 2, 2));
        // The poison was the newest letter: the operation still reaches it.
        let markers = vec![marker("dropped", 4, "a", 2)];
        let g = groups(open(entries.clone(), &markers, Some("a")), &pending_drops(&markers, Some("a")));
        assert_eq!((g[0].entries.len(), g[0].through), (2, 2));
        // Nothing left but the drop: a group with no letters resumes the key.
        let only = vec![entry(0, 0, "c", 10)];
        let markers = vec![marker("dropped", 1, "c", 0)];
        assert!(open(only.clone(), &markers, None).is_empty());
        let g = groups(Vec::new(), &pending_drops(&markers, None));
        assert_eq!((g.len(), g[0].entries.len(), g[0].through, g[0].key.as_str()), (1, 0, 0, "c"));
        // Once a reprocess resolved the key, the drop is no longer pending.
        let markers = vec![marker("dropped", 1, "c", 0), marker("reprocessed", 2, "c", 0)];
        assert!(pending_drops(&markers, None).is_empty());
        // A drop never closes another letter or another key's letter.
        let markers = vec![marker("dropped", 9, "b", 0)];
        assert_eq!(open(entries, &markers, None).len(), 4);
    }

    /// Issue 29, 3: a rebuild writes its letters again, after the markers
    /// that closed them: those copies are closed by position (the
    /// command-topic offset they were written at), not reopened.
    #[test]
    fn a_marker_closes_the_letters_a_rebuild_writes_again() {
        // Live: letters at dead-letter offsets 0 and 1 (written at command
        // offsets 10 and 11); the operator's marker at 2 covers them.
        let live = vec![entry(0, 0, "a", 10), entry(0, 1, "a", 11)];
        let markers = vec![Marker { dlq_partition: 0, dlq_offset: 2, key: "a".into(), kind: "cleared".into(), through: 1, through_at: 11, origin_partition: 0 }];
        // A rebuild's copies, and a command of the key dead-lettered later.
        let mut all = live.clone();
        all.extend([entry(0, 3, "a", 10), entry(0, 4, "a", 11), entry(0, 5, "a", 12)]);
        let open: Vec<i64> = open(all.clone(), &markers, None).iter().map(|e| e.dlq_offset).collect();
        assert_eq!(open, vec![5], "only the later command is open");
        // A marker of an earlier build (no position) closes by offset only.
        let old = vec![Marker { through_at: -1, ..markers[0].clone() }];
        assert_eq!(open_count(all, &old), 3);
        // An operation covering letters that say where they were written
        // carries the highest position; one that does not, -1.
        let g = groups(live.clone(), &[]);
        assert_eq!((g[0].through, g[0].through_at), (1, 11));
        let unknown = vec![Entry { at: None, ..live[0].clone() }, live[1].clone()];
        assert_eq!(groups(unknown, &[])[0].through_at, -1);
    }

    fn open_count(entries: Vec<Entry>, markers: &[Marker]) -> usize {
        open(entries, markers, None).len()
    }
}
