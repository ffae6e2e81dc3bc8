//! The latency phase's measure: when each produced document is first
//! searchable, and the report of the figures.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::Message;
use serde_json::json;

use super::Row;
use denorm::command::Command;
use denorm::index::embedded::EmbeddedIndex;
use denorm::index::Kind;
use denorm::kafka::KafkaConfig;
use denorm::produce::Producer;

impl Latency {
    /// The latency rows of the table, and the results' `latency`.
    pub(super) fn report(&self, rate: u64, rows: &mut Vec<Row>, results: &mut serde_json::Map<String, serde_json::Value>) {
        rows.push(Row::new(
            format!("produce -> searchable at {}/s: p50 / p99 / max", rate),
            format!("{:.1} / {:.1} / {:.1} ms", self.p50, self.p99, self.max),
            format!("plain consumer p50 / p99 {:.1} / {:.1} ms (producer ack {:.1} / {:.1})", self.plain_p50, self.plain_p99, self.ack_p50, self.ack_p99),
            None,
            "p99 <= 100 ms",
        ));
        rows.push(Row::new("  of which after the plain consumer got it: p50 / p99", format!("{:.1} / {:.1} ms", self.own_p50, self.own_p99), String::new(), None, ""));
        results.insert("latency".into(), json!({"rate": rate, "commands": self.n, "p50_ms": self.p50, "p90_ms": self.p90, "p99_ms": self.p99, "max_ms": self.max, "achieved_rate": self.achieved_rate, "produce_ack_p50_ms": self.ack_p50, "produce_ack_p99_ms": self.ack_p99, "plain_consumer_p50_ms": self.plain_p50, "plain_consumer_p99_ms": self.plain_p99, "added_p50_ms": self.own_p50, "added_p99_ms": self.own_p99}));
    }
}

/// `denorm produce --wait` as its caller sees it, per command: the
/// producer's acknowledgement, the document searchable, the wait returned.
pub(super) struct ReadYourWrites {
    n: usize,
    ack: Vec<f64>,
    /// Produce -> the wait returned, milliseconds.
    returned: Vec<f64>,
    /// Searchable -> the wait returned, milliseconds: what the wait adds.
    after_searchable: Vec<f64>,
    /// The broker's part, measured beside: a plain client's offset commit
    /// until it reads the offset back, milliseconds.
    broker_commit: Vec<f64>,
}

impl ReadYourWrites {
    pub(super) fn report(mut self, rows: &mut Vec<Row>, results: &mut serde_json::Map<String, serde_json::Value>) {
        let (a50, a99) = (quantile(&mut self.ack, 0.5), quantile(&mut self.ack, 0.99));
        let (r50, r99) = (quantile(&mut self.returned, 0.5), quantile(&mut self.returned, 0.99));
        let (s50, s99) = (quantile(&mut self.after_searchable, 0.5), quantile(&mut self.after_searchable, 0.99));
        rows.push(Row::new(
            format!("read-your-writes, {} commands one at a time: produce -> wait returned, p50 / p99", self.n),
            format!("{r50:.1} / {r99:.1} ms"),
            format!("producer ack p50 / p99 {a50:.1} / {a99:.1} ms"),
            None,
            "",
        ));
        let (b50, b99) = (quantile(&mut self.broker_commit, 0.5), quantile(&mut self.broker_commit, 0.99));
        rows.push(Row::new(
            "  of which after the document was searchable: p50 / p99",
            format!("{s50:.1} / {s99:.1} ms"),
            format!("broker: offset commit -> read back p50 / p99 {b50:.1} / {b99:.1} ms"),
            None,
            "p99 <= 100 ms",
        ));
        results.insert(
            "read_your_writes".into(),
            json!({"commands": self.n, "produce_ack_p50_ms": a50, "produce_ack_p99_ms": a99, "returned_p50_ms": r50, "returned_p99_ms": r99, "after_searchable_p50_ms": s50, "after_searchable_p99_ms": s99,
                   "broker_commit_p50_ms": b50, "broker_commit_p99_ms": b99}),
        );
    }
}

/// The `p` quantile of `v` (sorted here); NaN when empty.
pub(super) fn quantile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or(f64::NAN)
}

/// Sends `n` commands one at a time, each followed by the read-your-writes
/// wait `denorm produce --wait` makes ([`denorm::kafka::wait_for_deliveries`])
/// for `group`, while `probe` finds when each document is searchable.
pub(super) async fn read_your_writes(kafka: &KafkaConfig, group: &str, producer: &Producer, probe: Probe, every: Duration, n: u64, timeout: Duration) -> anyhow::Result<ReadYourWrites> {
    let (tx, rx) = mpsc::channel::<(String, Instant)>();
    let watcher = std::thread::spawn(move || watch(probe, every, rx, timeout));
    let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1000.0;
    let mut times = Vec::with_capacity(n as usize);
    for i in 0..n {
        let id = format!("ryw{i}");
        let cmd = Command::UpsertFile { id: id.clone(), path: format!("/ryw/file{i}.txt"), contents: format!("read your writes {i}"), previous_path: None };
        let sent = Instant::now();
        tx.send((id.clone(), sent)).ok();
        let d = producer.send(cmd).await?;
        let acked = Instant::now();
        let (k, g) = (kafka.clone(), group.to_string());
        tokio::task::spawn_blocking(move || denorm::kafka::wait_for_deliveries(&k, &g, &[d], timeout)).await??;
        times.push((id, sent, acked, Instant::now()));
    }
    drop(tx);
    let searchable = tokio::task::spawn_blocking(move || watcher.join()).await?.map_err(|_| anyhow::anyhow!("read-your-writes watcher panicked"))??;
    let k = kafka.clone();
    let broker_commit = tokio::task::spawn_blocking(move || commit_round_trips(&k, 50)).await??;
    let mut out = ReadYourWrites { n: times.len(), ack: Vec::new(), returned: Vec::new(), after_searchable: Vec::new(), broker_commit };
    for (id, sent, acked, returned) in times {
        out.ack.push(ms(sent, acked));
        out.returned.push(ms(sent, returned));
        out.after_searchable.push(ms(searchable[&id], returned));
    }
    Ok(out)
}

/// The broker's part of read-your-writes, `n` times: a plain client of a
/// group of its own commits an offset and reads it back (what
/// [`denorm::kafka::wait_for_deliveries`] waits on), milliseconds.
fn commit_round_trips(kafka: &KafkaConfig, n: i64) -> anyhow::Result<Vec<f64>> {
    use rdkafka::consumer::{CommitMode, Consumer};
    let c = denorm::kafka::group_client(kafka, &format!("denorm-bench-commit-{}", uuid::Uuid::new_v4().simple()))?;
    let mut out = Vec::new();
    for offset in 1..=n {
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset(&kafka.topic, 0, rdkafka::Offset::Offset(offset))?;
        let start = Instant::now();
        c.commit(&tpl, CommitMode::Sync)?;
        loop {
            let got = c.committed_offsets(tpl.clone(), denorm::kafka::REQUEST_TIMEOUT)?;
            if got.find_partition(&kafka.topic, 0).map(|e| e.offset()) == Some(rdkafka::Offset::Offset(offset)) {
                break;
            }
            if start.elapsed() > denorm::kafka::REQUEST_TIMEOUT {
                bail!("a committed offset was not read back within {:?}", denorm::kafka::REQUEST_TIMEOUT);
            }
        }
        out.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(out)
}

pub(super) struct Latency {
    pub(super) n: usize,
    pub(super) p50: f64,
    pub(super) p90: f64,
    pub(super) p99: f64,
    pub(super) max: f64,
    pub(super) achieved_rate: f64,
    /// Producer acknowledgement (acks=all), milliseconds.
    pub(super) ack_p50: f64,
    pub(super) ack_p99: f64,
    /// Received by the plain consumer -> searchable, milliseconds: what the
    /// pipeline adds to the broker's delivery.
    pub(super) own_p50: f64,
    pub(super) own_p99: f64,
    /// Produce -> received by a plain consumer, milliseconds.
    pub(super) plain_p50: f64,
    pub(super) plain_p99: f64,
}

/// Which of the given file ids a search finds now.
pub(super) type Probe = Box<dyn FnMut(&[String]) -> anyhow::Result<Vec<String>> + Send>;

/// The embedded index's searcher, reloaded at each look.
pub(super) fn embedded_probe(index: EmbeddedIndex) -> anyhow::Result<Probe> {
    let search = index.search()?;
    Ok(Box::new(move |ids: &[String]| {
        search.reload()?;
        let mut found = Vec::new();
        for id in ids {
            if search.contains(Kind::File, id)? {
                found.push(id.clone());
            }
        }
        Ok(found)
    }))
}

/// The most documents one look of the watcher asks for.
const PROBE_AT_ONCE: usize = 200;

/// When each sent document was first found by `probe`; looks `every` so
/// often, for the [`PROBE_AT_ONCE`] oldest it has not found yet.
pub(super) fn watch(mut probe: Probe, every: Duration, rx: mpsc::Receiver<(String, Instant)>, timeout: Duration) -> anyhow::Result<HashMap<String, Instant>> {
    let mut waiting: HashMap<String, Instant> = HashMap::new();
    let mut out = HashMap::new();
    let mut open = true;
    while open || !waiting.is_empty() {
        loop {
            match rx.try_recv() {
                Ok((id, t)) => {
                    waiting.insert(id, t);
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        // The oldest waiting documents only: a key's documents become
        // searchable in the order they were sent, and a look at thousands
        // of ids at once (an Elasticsearch `ids` query every 10 ms, while a
        // long rename holds them up) loads the server being measured.
        let mut oldest: Vec<(&String, &Instant)> = waiting.iter().collect();
        oldest.sort_unstable_by_key(|(_, t)| **t);
        let ids: Vec<String> = oldest.into_iter().take(PROBE_AT_ONCE).map(|(id, _)| id.clone()).collect();
        let seen = if ids.is_empty() { Vec::new() } else { probe(&ids)? };
        let now = Instant::now();
        for (id, sent) in &waiting {
            if now.duration_since(*sent) > timeout && !seen.contains(id) {
                bail!("document {id} not searchable {timeout:?} after it was produced");
            }
        }
        for id in seen {
            waiting.remove(&id);
            out.insert(id, now);
        }
        std::thread::sleep(every);
    }
    if out.is_empty() {
        bail!("no latency samples");
    }
    Ok(out)
}

/// When a plain consumer read each message, by partition and offset.
pub(super) type ReadAt = HashMap<(i32, i64), Instant>;

/// When a plain consumer (`c`, already assigned) reads each message: the
/// baseline of what the broker lets any consumer see. Reads on a thread of
/// its own until `done(messages read)`, and fails when no message comes
/// for `timeout` before that.
pub(super) fn read_log(c: BaseConsumer, timeout: Duration, done: impl Fn(usize) -> bool + Send + 'static) -> std::thread::JoinHandle<anyhow::Result<ReadAt>> {
    std::thread::spawn(move || {
        let mut seen = HashMap::new();
        let mut last = Instant::now();
        while !done(seen.len()) {
            match c.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    last = Instant::now();
                    seen.insert((m.partition(), m.offset()), last);
                }
                Some(Err(e)) => return Err(e).context("plain consumer"),
                None if last.elapsed() > timeout => bail!("the plain consumer read {} messages, then nothing for {timeout:?}", seen.len()),
                None => {}
            }
        }
        Ok(seen)
    })
}

/// Joins a [`read_log`] thread.
pub(super) async fn read_log_end(reader: std::thread::JoinHandle<anyhow::Result<ReadAt>>) -> anyhow::Result<ReadAt> {
    tokio::task::spawn_blocking(move || reader.join()).await?.map_err(|_| anyhow::anyhow!("the plain consumer panicked"))?
}
