//! The log a verify replays, checked before the replay (review of verify,
//! F14 d and g):
//!
//! - the whole log is still in the topic: the replay starts at offset 0,
//!   and a partition whose first offsets retention deleted would stop the
//!   replay's partition at once (a gap, never skipped) and leave the verify
//!   waiting its whole timeout;
//! - it is the log the live index was built from: each checkpoint's offset
//!   is in the topic and holds the message whose fingerprint the checkpoint
//!   records ([`crate::logid`]). A verify given another topic (or one
//!   recreated under the same name) would otherwise replay the wrong log
//!   and report every document as a difference, which `--repair` would
//!   then "mend".

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::index::{Checkpoint, IndexError};
use crate::kafka::KafkaConfig;
use crate::logid::{self, First};

use super::VerifyError;

/// How long the messages at the checkpoints may take to arrive.
const FETCH_WITHIN: Duration = Duration::from_secs(30);

/// Judges the partitions a verify replays (`owned`) by their watermarks
/// (`ends[p]`: low, high) and the live index's `checkpoints`: the
/// checkpoints whose message is still to be compared with its fingerprint.
pub fn judge_ends(ends: &[(i64, i64)], checkpoints: &HashMap<i32, Checkpoint>, owned: impl Fn(i32) -> bool) -> Result<Vec<(i32, Checkpoint)>, VerifyError> {
    let mut to_fetch = Vec::new();
    for (p, &(low, high)) in (0..).zip(ends).filter(|(p, _)| owned(*p)) {
        let checkpoint = checkpoints.get(&p).copied();
        if let First::Changed(detail) = logid::range_against(checkpoint, low, high) {
            return Err(VerifyError::NotItsLog(IndexError::log_changed(p, checkpoint.map_or(0, |c| c.offset), &detail)));
        }
        if low > 0 {
            return Err(VerifyError::Retention { partition: p, low });
        }
        if let Some(c) = checkpoint.filter(|c| c.fingerprint.is_some()) {
            to_fetch.push((p, c));
        }
    }
    Ok(to_fetch)
}

/// A consumer that reads the topic where it is assigned (never
/// subscribed: it joins no group and commits nothing), reporting each
/// partition's end with `eof`.
fn reader(kafka: &KafkaConfig, eof: bool) -> Result<BaseConsumer, VerifyError> {
    let mut c = kafka.consumer_config();
    c.set("group.id", "denorm-verify-log-check").set("enable.auto.commit", "false").set("enable.partition.eof", eof.to_string());
    Ok(c.create().map_err(crate::kafka::KafkaSetupError::from)?)
}

/// Assigns `consumer` the partitions of `from`, each at its offset.
fn assign(consumer: &BaseConsumer, topic: &str, from: impl IntoIterator<Item = (i32, i64)>) -> Result<(), VerifyError> {
    let mut tpl = TopicPartitionList::new();
    for (p, o) in from {
        tpl.add_partition_offset(topic, p, Offset::Offset(o)).map_err(crate::kafka::KafkaSetupError::from)?;
    }
    Ok(consumer.assign(&tpl).map_err(crate::kafka::KafkaSetupError::from)?)
}

/// Checks the topic of `kafka` against the live index's `checkpoints` for
/// the partitions `owned` (see the module). Blocking.
pub fn check(kafka: &KafkaConfig, partitions: i32, checkpoints: &HashMap<i32, Checkpoint>, owned: impl Fn(i32) -> bool) -> Result<(), VerifyError> {
    let consumer = reader(kafka, false)?;
    let ends = crate::kafka::watermarks(&consumer, &kafka.topic, partitions)?;
    let mut left: HashMap<i32, Checkpoint> = judge_ends(&ends, checkpoints, owned)?.into_iter().collect();
    if left.is_empty() {
        return Ok(());
    }
    assign(&consumer, &kafka.topic, left.iter().map(|(p, c)| (*p, c.offset as i64)))?;
    let started = Instant::now();
    while !left.is_empty() && started.elapsed() < FETCH_WITHIN {
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else { continue };
        let msg = msg.map_err(crate::kafka::KafkaSetupError::from)?;
        let Some(c) = left.remove(&msg.partition()) else { continue };
        let low = ends.get(msg.partition() as usize).map(|(low, _)| *low);
        let first = logid::first_after(Some(c), msg.offset(), logid::fingerprint(msg.key(), msg.payload()), low);
        if let First::Changed(detail) = first {
            return Err(VerifyError::NotItsLog(IndexError::log_changed(msg.partition(), c.offset, &detail)));
        }
    }
    if !left.is_empty() {
        let mut partitions: Vec<i32> = left.into_keys().collect();
        partitions.sort_unstable();
        return Err(VerifyError::CheckpointUnread { partitions, secs: FETCH_WITHIN.as_secs() });
    }
    Ok(())
}

/// Per partition, the last offset of its log (its high watermark minus
/// one). Blocking.
pub fn last_offsets(kafka: &KafkaConfig, partitions: i32) -> Result<super::Positions, VerifyError> {
    let consumer: BaseConsumer = kafka.consumer_config().create().map_err(crate::kafka::KafkaSetupError::from)?;
    let ends = crate::kafka::watermarks(&consumer, &kafka.topic, partitions)?;
    Ok((0..).zip(ends).map(|(p, (_, high))| (p, high - 1)).collect())
}

/// Of the partitions `from` (partition, offset), those whose log holds a
/// message at or past the offset. Offsets without a message (a
/// transaction's markers, an aborted transaction's records, which a
/// read-committed consumer never sees) do not count: a partition that ends
/// in a marker has its checkpoint below its end for ever (review of
/// verify, F6). A partition that neither shows a message nor its end in
/// time counts as holding one (it is then not judged: never a false
/// difference). Blocking.
pub fn messages_past(kafka: &KafkaConfig, from: &[(i32, i64)]) -> Result<std::collections::BTreeSet<i32>, VerifyError> {
    let mut holding = std::collections::BTreeSet::new();
    if from.is_empty() {
        return Ok(holding);
    }
    let consumer = reader(kafka, true)?;
    assign(&consumer, &kafka.topic, from.iter().copied())?;
    let mut pending: std::collections::BTreeSet<i32> = from.iter().map(|(p, _)| *p).collect();
    let started = Instant::now();
    while !pending.is_empty() && started.elapsed() < FETCH_WITHIN {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(msg)) if pending.remove(&msg.partition()) => {
                holding.insert(msg.partition());
            }
            Some(Ok(_)) => {}
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                pending.remove(&p);
            }
            Some(Err(e)) => return Err(crate::kafka::KafkaSetupError::from(e).into()),
            None => {}
        }
    }
    holding.extend(pending);
    Ok(holding)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(pairs: &[(i32, u64)]) -> HashMap<i32, Checkpoint> {
        pairs.iter().map(|&(p, o)| (p, Checkpoint::new(o, 7))).collect()
    }

    #[test]
    fn a_log_trimmed_by_retention_cannot_be_replayed_whole() {
        let err = judge_ends(&[(0, 10), (4, 10)], &at(&[(0, 5), (1, 5)]), |_| true).unwrap_err();
        assert!(matches!(err, VerifyError::Retention { partition: 1, low: 4 }), "{err}");
        assert!(err.to_string().contains("retention deleted offsets 0..3 of partition 1"), "{err}");
        // A partition another member replays is not this one's concern.
        assert_eq!(judge_ends(&[(0, 10), (4, 10)], &at(&[(0, 5)]), |p| p == 0).unwrap(), vec![(0, Checkpoint::new(5, 7))]);
    }

    #[test]
    fn a_log_shorter_than_the_checkpoints_is_not_the_index_s_log() {
        let err = judge_ends(&[(0, 10), (0, 3)], &at(&[(0, 5), (1, 5)]), |_| true).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("partition 1: the index's checkpoint is offset 5") && text.contains("ends at offset 3"), "{text}");
    }

    #[test]
    fn checkpoints_with_a_fingerprint_are_compared_with_their_message() {
        let mut cps = at(&[(0, 5)]);
        cps.insert(1, Checkpoint { offset: 2, fingerprint: None });
        // Partition 2 has no checkpoint: replayed from 0, nothing to compare.
        assert_eq!(judge_ends(&[(0, 10), (0, 10), (0, 0)], &cps, |_| true).unwrap(), vec![(0, Checkpoint::new(5, 7))]);
    }
}
