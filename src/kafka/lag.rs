//! A consumer group's lag on the command topic, and the waits on it
//! (`denorm lag`, `produce --wait`, the tests): committed offsets, end
//! offsets, and what each commit's metadata records applied above it.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use super::{told, KafkaConfig, KafkaSetupError, REQUEST_TIMEOUT};
use crate::index::progress::DoneAbove;

/// Lag of one partition for a consumer group.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PartitionLag {
    pub partition: i32,
    /// Committed offset (next message to apply); 0 when nothing is committed.
    pub committed: i64,
    /// End offset (high watermark).
    pub end: i64,
    pub lag: i64,
    /// Commands not applied: `lag` less what the commit's metadata records
    /// applied above the committed offset (issue 45; equal to `lag` where
    /// the broker keeps no metadata, tansu 0.6).
    pub unapplied: i64,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LagReport {
    pub total: i64,
    /// Commands not applied, summed ([`PartitionLag::unapplied`]).
    pub unapplied: i64,
    pub partitions: Vec<PartitionLag>,
}

/// The low and high watermarks of partitions `0..partitions` of `topic`, in
/// partition order. Blocking.
pub fn watermarks<C: rdkafka::consumer::ConsumerContext>(consumer: &BaseConsumer<C>, topic: &str, partitions: i32) -> Result<Vec<(i64, i64)>, KafkaSetupError> {
    (0..partitions).map(|p| Ok(consumer.fetch_watermarks(topic, p, REQUEST_TIMEOUT)?)).collect()
}

/// Committed offset, end offset and lag of every partition of the topic for
/// `group`. Blocking.
pub fn group_lag(cfg: &KafkaConfig, group: &str) -> Result<LagReport, KafkaSetupError> {
    let consumer = group_client(cfg, group)?;
    let partitions = cfg.topic_partitions()?.ok_or_else(|| KafkaSetupError::MissingTopic(cfg.topic.clone()))?;
    lag_of(&consumer, &cfg.topic, partitions, REQUEST_TIMEOUT)
}

/// Whether a consumer error reports a damaged record batch: a CRC
/// mismatch (`check.crcs`, see [`KafkaConfig::consumer_config`]) or bytes
/// librdkafka cannot parse. librdkafka skips such a batch and reads on, so
/// a reader that goes on reads the partition with a hole in it.
pub fn is_damaged(e: &KafkaError) -> bool {
    matches!(e, KafkaError::MessageConsumption(c) | KafkaError::MessageConsumptionFatal(c) if *c == RDKafkaErrorCode::BadMessage)
}

/// A client that carries `group`'s id, to read its offsets, and never joins
/// the group.
pub fn group_client(cfg: &KafkaConfig, group: &str) -> Result<BaseConsumer, KafkaSetupError> {
    let mut c = cfg.consumer_config();
    c.set("group.id", group).set("enable.auto.commit", "false");
    Ok(c.create()?)
}

/// The lag of partitions `0..partitions` of `topic` for the group of
/// `consumer` (see [`group_client`]), each request waiting at most
/// `timeout`. Blocking.
pub fn lag_of<C: rdkafka::consumer::ConsumerContext>(consumer: &BaseConsumer<C>, topic: &str, partitions: i32, timeout: Duration) -> Result<LagReport, KafkaSetupError> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = consumer.committed_offsets(tpl, timeout).map_err(|e| told(consumer, e))?;
    let mut out = Vec::new();
    for p in 0..partitions {
        let (low, end) = consumer.fetch_watermarks(topic, p, timeout).map_err(|e| told(consumer, e))?;
        let entry = committed.find_partition(topic, p);
        let (committed, done) = match entry.as_ref().map(|e| e.offset()) {
            Some(Offset::Offset(o)) => (o, entry.map(|e| DoneAbove::from_metadata(e.metadata(), o)).unwrap_or_default()),
            _ => (low.max(0), DoneAbove::default()),
        };
        let lag = (end - committed).max(0);
        out.push(PartitionLag { partition: p, committed, end, lag, unapplied: (lag - done.applied_in(committed, end)).max(0) });
    }
    Ok(LagReport { total: out.iter().map(|p| p.lag).sum(), unapplied: out.iter().map(|p| p.unapplied).sum(), partitions: out })
}

/// Polls the group's lag until every partition's committed offset reaches
/// its end offset and at least `min_end` messages exist in the topic, or
/// `timeout` passes. `progress` sees each report. Blocking.
pub fn wait_until_applied(cfg: &KafkaConfig, group: &str, min_end: i64, timeout: Duration, mut progress: impl FnMut(&LagReport)) -> Result<LagReport, WaitError> {
    wait_on_lag(cfg, group, timeout, Duration::from_millis(50), |r| {
        progress(r);
        let end: i64 = r.partitions.iter().map(|p| p.end).sum();
        r.total == 0 && end >= min_end
    })
}

/// Read-your-writes: waits until `group` has applied every one of
/// `deliveries` (its committed offset of each partition passes the
/// delivered offset). Blocking.
///
/// One client, made once, asks the group's coordinator for the committed
/// offsets of the partitions concerned every 10 ms (one request; no
/// watermarks, no metadata): it used to make a client and read the lag of
/// every partition each 100 ms, which cost more than the wait itself.
pub fn wait_for_deliveries(cfg: &KafkaConfig, group: &str, deliveries: &[crate::command::LogPosition], timeout: Duration) -> Result<(), WaitError> {
    use crate::retry::{poll_until, Polled};
    let need = awaited(deliveries);
    if need.is_empty() {
        return Ok(());
    }
    let consumer = group_client(cfg, group).map_err(WaitError::Kafka)?;
    let mut tpl = TopicPartitionList::new();
    for p in need.keys() {
        tpl.add_partition(&cfg.topic, *p);
    }
    let mut error = None;
    let deadline = std::time::Instant::now() + timeout;
    let mut answered = false;
    let polled = poll_until(timeout, Duration::from_millis(10), || {
        // The first read may take the whole request timeout (a group's
        // coordinator answers its first request in about a second): the
        // wait then ends with where the group stands, not a bare timeout.
        // Later reads stop at the deadline.
        let left = match answered {
            false => REQUEST_TIMEOUT,
            true => REQUEST_TIMEOUT.min(deadline.saturating_duration_since(std::time::Instant::now())),
        };
        match consumer.committed_offsets(tpl.clone(), left) {
            Ok(committed) => {
                answered = true;
                let at: BTreeMap<i32, Committed> = need
                    .keys()
                    .map(|p| {
                        let e = committed.find_partition(&cfg.topic, *p);
                        let next = match e.as_ref().map(|e| e.offset()) {
                            Some(Offset::Offset(o)) => o,
                            _ => 0,
                        };
                        let done = e.map(|e| DoneAbove::from_metadata(e.metadata(), next)).unwrap_or_default();
                        (*p, Committed { next, done })
                    })
                    .collect();
                match lagging(&need, &at).is_empty() {
                    true => Polled::Done(()),
                    false => Polled::NotYet(at),
                }
            }
            Err(e) => {
                error = Some(KafkaSetupError::from(e));
                Polled::Unknown
            }
        }
    });
    match polled {
        Ok(()) => Ok(()),
        Err(Some(at)) => Err(WaitError::Behind(lagging(&need, &at))),
        Err(None) => Err(error.map_or(WaitError::Timeout(None), WaitError::Kafka)),
    }
}

/// Per partition, `deliveries`' offsets.
fn awaited(deliveries: &[crate::command::LogPosition]) -> BTreeMap<i32, Vec<i64>> {
    let mut need: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for d in deliveries {
        need.entry(d.partition).or_default().push(d.offset);
    }
    need
}

/// Where a group stands in a partition: its committed offset, and what its
/// commit's metadata records as applied above it (issue 45; nothing where
/// the broker does not keep the metadata, tansu 0.6).
#[derive(Debug, Clone, Default)]
struct Committed {
    next: i64,
    done: DoneAbove,
}

impl Committed {
    /// Whether the command at `offset` is applied: below the committed
    /// offset, or recorded applied above it.
    fn applied(&self, offset: i64) -> bool {
        offset < self.next || (self.next > 0 && self.done.contains(Some(self.next as u64 - 1), offset))
    }
}

/// The partitions with an awaited offset not applied, judged command by
/// command (`at`: where the group stands; committed 0 when absent): each
/// with its committed offset and the highest offset awaited and not
/// applied.
fn lagging(need: &BTreeMap<i32, Vec<i64>>, at: &BTreeMap<i32, Committed>) -> Vec<(i32, i64, i64)> {
    need.iter()
        .filter_map(|(p, offsets)| {
            let c = at.get(p).cloned().unwrap_or_default();
            offsets.iter().filter(|o| !c.applied(**o)).max().map(|o| (*p, c.next, *o))
        })
        .collect()
}

/// Reads the group's lag every `every` until `done` says so or `timeout`
/// passes: the timeout carries the last report, or the last error when no
/// report was ever read.
fn wait_on_lag(cfg: &KafkaConfig, group: &str, timeout: Duration, every: Duration, mut done: impl FnMut(&LagReport) -> bool) -> Result<LagReport, WaitError> {
    use crate::retry::{poll_until, Polled};
    // One client and one look at the partitions for the whole wait (a new
    // client each time cost more than the requests).
    let consumer = group_client(cfg, group).map_err(WaitError::Kafka)?;
    let partitions = cfg.topic_partitions().map_err(WaitError::Kafka)?.ok_or_else(|| WaitError::Kafka(KafkaSetupError::MissingTopic(cfg.topic.clone())))?;
    let mut error = None;
    poll_until(timeout, every, || match lag_of(&consumer, &cfg.topic, partitions, REQUEST_TIMEOUT) {
        Ok(r) if done(&r) => Polled::Done(r),
        Ok(r) => Polled::NotYet(r),
        Err(e) => {
            error = Some(e);
            Polled::Unknown
        }
    })
    .map_err(|last| match (last, error) {
        (None, Some(e)) => WaitError::Kafka(e),
        (last, _) => WaitError::Timeout(last),
    })
}

#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("timed out waiting for the group to apply everything ({})", pending(.0))]
    Timeout(Option<LagReport>),
    /// Timed out: the partitions still behind what was awaited, each with
    /// the group's committed offset and the offset awaited there.
    #[error("timed out with {}; is a worker of the group running? `denorm lag` shows more", behind(.0))]
    Behind(Vec<(i32, i64, i64)>),
    #[error(transparent)]
    Kafka(KafkaSetupError),
}

fn behind(parts: &[(i32, i64, i64)]) -> String {
    let each: Vec<String> = parts.iter().map(|(p, committed, at)| format!("partition {p} applied up to offset {} (waiting for {at})", committed - 1)).collect();
    each.join(", ")
}

/// The partitions still behind in a lag report, for a timeout's message.
fn pending(report: &Option<LagReport>) -> String {
    let Some(r) = report else { return "no lag report could be read".into() };
    let behind: Vec<String> = r.partitions.iter().filter(|p| p.lag > 0).map(|p| format!("partition {}: {} unapplied", p.partition, p.lag)).collect();
    if behind.is_empty() {
        "no partition was behind at the last report".into()
    } else {
        format!("{}; is a worker of the group running? `denorm lag` shows more", behind.join(", "))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_wait_timeout_names_the_partitions_behind() {
        let p = |partition, lag| super::PartitionLag { partition, committed: 10, end: 10 + lag, lag, unapplied: lag };
        let r = super::LagReport { total: 3, unapplied: 3, partitions: vec![p(0, 0), p(4, 3)] };
        let msg = super::WaitError::Timeout(Some(r)).to_string();
        assert!(msg.contains("partition 4: 3 unapplied"), "{msg}");
        assert!(!msg.contains("partition 0"), "{msg}");
        assert!(super::WaitError::Timeout(None).to_string().contains("no lag report"));
    }

    #[test]
    fn read_your_writes_waits_for_each_delivery_command_by_command() {
        use super::Committed;
        use crate::command::LogPosition;
        use crate::index::progress::DoneAbove;
        use std::collections::BTreeMap;
        let at = |partition, offset| LogPosition { partition, offset };
        let upto = |c: &[(i32, i64)]| -> BTreeMap<i32, Committed> { c.iter().map(|(p, n)| (*p, Committed { next: *n, done: DoneAbove::default() })).collect() };
        let need = super::awaited(&[at(0, 4), at(2, 9), at(0, 7)]);
        assert_eq!(need.into_iter().collect::<Vec<_>>(), vec![(0, vec![4, 7]), (2, vec![9])]);
        let need = super::awaited(&[at(0, 7), at(2, 9)]);
        // Committed 8 on partition 0 (offset 7 applied); nothing on 2.
        assert_eq!(super::lagging(&need, &upto(&[(0, 8)])), vec![(2, 0, 9)]);
        let committed = upto(&[(0, 7), (2, 10)]);
        assert_eq!(super::lagging(&need, &committed), vec![(0, 7, 7)], "committed 7: offset 7 not applied yet");
        let msg = super::WaitError::Behind(super::lagging(&need, &committed)).to_string();
        assert!(msg.contains("partition 0 applied up to offset 6 (waiting for 7)"), "{msg}");
        assert!(super::lagging(&need, &upto(&[(0, 8), (2, 10)])).is_empty());
        // Issue 45: the group's offset held at 5 by a fan-out (5 and 6
        // unfinished), its commit's metadata recording 7 and 8 applied:
        // a wait for 7 is over, one for 6 is not.
        let held: BTreeMap<i32, Committed> = [(0, Committed { next: 5, done: DoneAbove::from_metadata(&DoneAbove::new(4, 8, [5, 6]).to_metadata(5), 5) })].into_iter().collect();
        assert!(super::lagging(&super::awaited(&[at(0, 7)]), &held).is_empty());
        assert_eq!(super::lagging(&super::awaited(&[at(0, 6), at(0, 8)]), &held), vec![(0, 5, 6)]);
    }
}
