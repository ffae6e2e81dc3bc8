//! The tenant-fairness phase (issue 47): on a topic of one partition, a
//! quiet tenant sends single-document upserts at a steady rate, alone, then
//! while a noisy tenant's backlog of commands (sent at once, to the same
//! partition, by a producer of its own) drains. The quiet tenant's produce
//! -> searchable latency, alone (the baseline, measured in the same run)
//! and during the flood; the whole is run twice, each on a topic and index
//! of its own: with the worker's read-ahead past a flooding tenant (its
//! default), and with `--tenant-read-ahead false` (log order only). Then
//! the broker's part, on a third topic: the same produced with no worker,
//! read by a plain consumer (what any consumer gets from the broker).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::head_of_line::other_upsert;
use super::latency::{quantile, read_log, read_log_end};
use super::table::{phase, Row};
use super::Bench;
use crate::bench::process::CpuClock;
use denorm::command::Command;
use denorm::kafka::KafkaConfig;
use denorm::produce::Producer;

/// Length of the quiet tenant's series alone.
const ALONE: Duration = Duration::from_secs(3);

/// The noisy tenant's backlog: `n` upserts over a hundred keys.
fn backlog(n: u64) -> Vec<Command> {
    (0..n).map(|i| Command::UpsertFile { id: format!("n{i}"), path: format!("/k{}/n{i}.txt", i % 100), contents: format!("noisy {i}"), previous_path: None }.scoped(Some("noisy"))).collect()
}

/// The producers of the two tenants' services, which in production run on
/// machines of their own, not on the worker's. Not idempotent, one request
/// in flight (the log order of each key is still the order sent): an
/// idempotent librdkafka 2.12 producer whose five requests are in flight
/// with a batch ready spins its broker thread until a response comes
/// (`rd_kafka_toppar_producer_serve` asks to be woken now for the ready
/// batch, then finds no room in the idempotence window). Measured here,
/// the noisy service's producer spun 4.8 s of CPU in 6 s of the flood on
/// this two-core box, taken from the worker and the broker.
fn services(kafka: &KafkaConfig) -> KafkaConfig {
    let mut k = kafka.clone();
    k.options.extend([("enable.idempotence", "false"), ("max.in.flight.requests.per.connection", "1")].map(|(a, b)| (a.to_string(), b.to_string())));
    k
}

/// One run of the phase: the quiet tenant's latencies alone and during
/// the flood (milliseconds), and how long the backlog took to drain.
struct Series {
    alone: Vec<f64>,
    during: Vec<f64>,
    /// Produce -> acknowledged by the broker, during the flood: what the
    /// broker adds, which no scheduling in the worker can take back.
    during_acked: Vec<f64>,
    drain_secs: f64,
    /// CPU seconds of the bench, the worker and the broker during the flood.
    cpu: serde_json::Value,
    /// How long the backlog took to produce (every message acknowledged):
    /// the quiet tenant's commands sent until then met a broker busy
    /// taking the backlog in; those sent after it, only the worker's
    /// draining of it.
    produced_secs: f64,
    rate: u64,
    /// The noisy tenant's backlog.
    backlog: u64,
}

/// The broker's part ([`Bench::broker_series`]): produce -> read by a
/// plain consumer (ms), alone and during the flood.
struct BrokerPart {
    alone: Vec<f64>,
    during: Vec<f64>,
    /// The quiet tenant's commands sent during the flood (all read).
    sent_during: usize,
    produced_secs: f64,
    /// From the flood's start until the consumer had read the backlog.
    read_secs: f64,
}

impl BrokerPart {
    fn json(&self) -> serde_json::Value {
        json!({"alone_p50_ms": q(&self.alone, 0.5), "alone_p99_ms": q(&self.alone, 0.99), "during_commands": self.during.len(), "sent_during": self.sent_during,
               "during_p50_ms": q(&self.during, 0.5), "during_p99_ms": q(&self.during, 0.99), "produced_seconds": self.produced_secs, "read_seconds": self.read_secs})
    }
}

/// What the quiet tenant's p99 during the flood is held against when the
/// broker is the limit: its p99 alone, or what a plain consumer doing
/// nothing else got from the broker during the same flood (no worker can
/// read a command before the broker hands it out), whichever is larger.
fn against_the_broker(alone_p99: f64, broker_during_p99: f64) -> f64 {
    alone_p99.max(broker_during_p99).max(0.001)
}

fn q(v: &[f64], p: f64) -> f64 {
    quantile(&mut v.to_vec(), p)
}

/// p50/p99 of `v` as text.
fn pq(v: &[f64]) -> String {
    if v.is_empty() {
        "-".to_string()
    } else {
        format!("{:.0}/{:.0} ms", q(v, 0.5), q(v, 0.99))
    }
}

impl Series {
    fn json(&self) -> serde_json::Value {
        json!({"alone_commands": self.alone.len(), "alone_p50_ms": q(&self.alone, 0.5), "alone_p99_ms": q(&self.alone, 0.99),
               "during_commands": self.during.len(), "during_p50_ms": q(&self.during, 0.5), "during_p99_ms": q(&self.during, 0.99),
               "during_acked_p50_ms": q(&self.during_acked, 0.5), "during_acked_p99_ms": q(&self.during_acked, 0.99), "drain_seconds": self.drain_secs, "produced_seconds": self.produced_secs,
               "after_produced_commands": self.split().1.len(), "after_produced_p50_ms": q(self.split().1, 0.5), "after_produced_p99_ms": q(self.split().1, 0.99),
               "worker_part_p50_ms": q(&self.worker_part(), 0.5), "worker_part_p99_ms": q(&self.worker_part(), 0.99), "cpu": self.cpu, "ratio": q(&self.during, 0.99) / q(&self.alone, 0.99).max(0.001),
               "index_commands_per_sec": self.index_rate(), "quiet_share_of_index": self.quiet_share()})
    }

    /// The quiet tenant's latencies during the flood sent while the backlog
    /// was being produced, and after (they are sent at `rate` per second
    /// from the flood's start).
    fn split(&self) -> (&[f64], &[f64]) {
        let at = ((self.produced_secs * self.rate as f64) as usize).min(self.during.len());
        self.during.split_at(at)
    }

    /// Acknowledged by the broker -> searchable, per command during the
    /// flood: the worker's part of the latency.
    fn worker_part(&self) -> Vec<f64> {
        self.during.iter().zip(&self.during_acked).map(|(s, a)| (s - a).max(0.0)).collect()
    }

    /// Commands applied per second while the backlog drained, both
    /// tenants' (every quiet command sent then is applied by its end).
    fn index_rate(&self) -> f64 {
        (self.backlog as f64 + self.during.len() as f64) / self.drain_secs.max(0.001)
    }

    /// The quiet tenant's rate as a share of what the index took during
    /// the flood. Above one half, the quiet tenant asks for more than a
    /// fair share of the index: its commands queue up however the worker
    /// schedules, and its p99 grows with the flood.
    fn quiet_share(&self) -> f64 {
        self.rate as f64 / self.index_rate().max(0.001)
    }

    fn during(&self) -> String {
        let (producing, after) = self.split();
        format!(
            "{:.0}/{:.0} ms ({} commands; acknowledged by the broker {:.0}/{:.0} ms, then searchable {}; backlog produced in {:.1} s, drained in {:.1} s; sent while it was produced {} ({}), after {} ({}); the index took {:.0} commands/s during the flood, the quiet tenant's {} being {:.0} % of it)",
            q(&self.during, 0.5),
            q(&self.during, 0.99),
            self.during.len(),
            q(&self.during_acked, 0.5),
            q(&self.during_acked, 0.99),
            pq(&self.worker_part()),
            self.produced_secs,
            self.drain_secs,
            pq(producing),
            producing.len(),
            pq(after),
            after.len(),
            self.index_rate(),
            self.rate,
            self.quiet_share() * 100.0
        )
    }
}

impl Bench<'_> {
    /// Runs the phase; adds its rows and results.
    pub(super) async fn tenant_flood(
        &self,
        n: u64,
        rate: u64,
        run_id: &str,
        es_url: Option<&str>,
        rows: &mut Vec<Row>,
        results: &mut serde_json::Map<String, serde_json::Value>,
    ) -> anyhow::Result<()> {
        let fair = self.flood_series(n, rate, run_id, es_url, true).await?;
        let strict = self.flood_series(n, rate, run_id, es_url, false).await?;
        let broker = self.broker_series(n, rate, run_id).await?;
        let (alone99, during99, broker99) = (q(&fair.alone, 0.99), q(&fair.during, 0.99), q(&broker.during, 0.99));
        rows.push(Row::new(
            format!("tenant fairness: a quiet tenant at {rate}/s while a noisy tenant's backlog of {n} commands drains, p50/p99 produce -> searchable"),
            fair.during(),
            format!("alone {:.0}/{:.0} ms", q(&fair.alone, 0.5), alone99),
            Some(during99 / alone99.max(0.001)),
            "<= 2x alone p99 (issue 47)",
        ));
        rows.push(Row::new(
            "tenant fairness, log order only (--tenant-read-ahead false): the same, p50/p99".to_string(),
            strict.during(),
            format!("alone {:.0}/{:.0} ms", q(&strict.alone, 0.5), q(&strict.alone, 0.99)),
            Some(q(&strict.during, 0.99) / q(&strict.alone, 0.99).max(0.001)),
            "",
        ));
        rows.push(Row::new(
            "tenant fairness, the broker's part: the same produced with no worker, p50/p99 produce -> read by a plain consumer".to_string(),
            format!("{} (backlog produced in {:.1} s, read in {:.1} s)", pq(&broker.during), broker.produced_secs, broker.read_secs),
            format!("alone {}", pq(&broker.alone)),
            Some(broker99 / q(&broker.alone, 0.99).max(0.001)),
            "",
        ));
        let bound = against_the_broker(alone99, broker99);
        rows.push(Row::new(
            "tenant fairness against what the broker allows: the quiet tenant's p99 during, over the larger of its p99 alone and the plain consumer's p99 during".to_string(),
            format!("{during99:.0} ms"),
            format!("max({alone99:.0}, {broker99:.0}) ms"),
            Some(during99 / bound),
            "<= 2x (issue 47, where the broker is the limit)",
        ));
        let mut t = fair.json();
        let extra = json!({"backlog": n, "rate": rate, "log_order": strict.json(), "broker": broker.json(), "broker_bounded_ratio": during99 / bound});
        if let (Some(t), serde_json::Value::Object(extra)) = (t.as_object_mut(), extra) {
            t.extend(extra);
        }
        results.insert("tenant_flood".into(), t);
        Ok(())
    }

    /// The broker's part, on a topic of its own: the same two services'
    /// commands with no worker, read by a plain consumer (the worker's
    /// consumer settings) from the topic's end. How soon any consumer can
    /// read the quiet tenant's commands, alone and while the backlog is
    /// produced and read: what no worker can do better than.
    async fn broker_series(&self, n: u64, rate: u64, run_id: &str) -> anyhow::Result<BrokerPart> {
        let (b, _) = self.own_partition("flood-broker", run_id, None).await?;
        let k = services(&b.kafka);
        let (quiet, noisy) = (Arc::new(Producer::new(&k)?), Producer::new(&k)?);
        // Read until `target` messages are (known once everything is sent).
        let (read, target) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(usize::MAX)));
        let reader = {
            let (read, target) = (read.clone(), target.clone());
            read_log(b.plain_consumer(&b.ends()?)?, b.timeout, move |seen| {
                read.store(seen, Ordering::SeqCst);
                seen >= target.load(Ordering::SeqCst)
            })
        };
        phase("tenant fairness, the broker's part: a quiet tenant's commands read by a plain consumer, alone");
        let alone = b.other_key(&quiet, None, rate, Some("quiet"), "alone", &|| false, ALONE).await?;
        phase(&format!("tenant fairness, the broker's part: the same while a noisy tenant's backlog of {n} commands is produced and read"));
        let t = Instant::now();
        let produced = Arc::new(AtomicBool::new(false));
        // On a task of its own: a broker that takes the backlog at once
        // would otherwise have it produced before the quiet tenant sends.
        let flood = {
            let produced = produced.clone();
            tokio::spawn(async move {
                let r = noisy.send_all(backlog(n), 10_000, |_| {}).await;
                produced.store(true, Ordering::SeqCst);
                r.map(|_| t.elapsed().as_secs_f64())
            })
        };
        let read_all = alone.sent.len() + n as usize;
        let is_done = || produced.load(Ordering::SeqCst) && read.load(Ordering::SeqCst) >= read_all;
        let during = b.other_key(&quiet, None, rate, Some("quiet"), "during", &is_done, b.timeout).await?;
        let produced_secs = flood.await??;
        let read_secs = t.elapsed().as_secs_f64();
        target.store(read_all + during.sent.len(), Ordering::SeqCst);
        let at = read_log_end(reader).await?;
        Ok(BrokerPart { alone: alone.read(&at), during: during.read(&at), sent_during: during.sent.len(), produced_secs, read_secs })
    }

    /// One run on a topic and index of its own, with the worker's
    /// read-ahead past a flooding tenant on or off.
    async fn flood_series(&self, n: u64, rate: u64, run_id: &str, es_url: Option<&str>, read_ahead: bool) -> anyhow::Result<Series> {
        let tag = if read_ahead { "flood" } else { "flood-strict" };
        let (b, index) = self.own_partition(tag, run_id, es_url).await?;
        let group = format!("denorm-bench-{run_id}-{tag}");
        // Two services: each tenant's commands come from a producer of its
        // own (one producer's queue would hold the quiet tenant's commands
        // behind the noisy tenant's before they reach the broker).
        let k = services(&b.kafka);
        let (quiet, noisy) = (Arc::new(Producer::new(&k)?), Producer::new(&k)?);
        quiet.send(other_upsert("first", "the index's first document".into()).scoped(Some("quiet"))).await?;
        let flags = [format!("--tenant-read-ahead={read_ahead}")];
        let worker = b.start_worker_with(&group, &index, &flags).await?;
        b.wait_applied(&worker, &index, None).await?;
        let how = if read_ahead { "" } else { " (log order only)" };
        phase(&format!("tenant fairness{how}: a quiet tenant at {rate}/s, alone"));
        let alone = b.other_key(&quiet, Some(&index), rate, Some("quiet"), "alone", &|| false, ALONE).await?;
        phase(&format!("tenant fairness{how}: the same while a noisy tenant's backlog of {n} commands drains, in the same partition"));
        let done = AtomicBool::new(false);
        let is_done = || done.load(Ordering::SeqCst);
        let clock = CpuClock::start(b.pids(Some(&worker)));
        let t = Instant::now();
        let mut produced_secs = 0.0;
        let (drained, during) = tokio::join!(
            async {
                let r = async {
                    noisy.send_all(backlog(n), 10_000, |_| {}).await?;
                    produced_secs = t.elapsed().as_secs_f64();
                    b.wait_applied(&worker, &index, None).await
                }
                .await;
                done.store(true, Ordering::SeqCst);
                r
            },
            b.other_key(&quiet, Some(&index), rate, Some("quiet"), "during", &is_done, b.timeout)
        );
        drained?;
        let drain_secs = t.elapsed().as_secs_f64();
        let cpu = clock.stop(&format!("the flood{how}"));
        let during = during?;
        worker.stop().await?;
        Ok(Series { alone: alone.searchable, during: during.searchable, during_acked: during.acked, drain_secs, cpu, produced_secs, rate, backlog: n })
    }
}

#[cfg(test)]
mod tests {
    use super::against_the_broker;

    #[test]
    fn the_quiet_tenant_is_held_against_its_time_alone_or_the_brokers_during_the_flood_whichever_is_larger() {
        // A fast broker: the time alone decides.
        assert_eq!(against_the_broker(80.0, 20.0), 80.0);
        // A broker that is itself the limit during the flood.
        assert_eq!(against_the_broker(135.0, 3796.0), 3796.0);
        // Nothing measured: no division by zero.
        assert!(against_the_broker(0.0, 0.0) > 0.0);
    }

    #[test]
    fn the_quiet_tenants_share_of_the_index_counts_both_tenants_commands_over_the_drain() {
        // 100,000 of the flood and 80,000 quiet commands in 600 s: the index
        // took 300 a second, and the quiet tenant's 200 are two thirds.
        let s = super::Series { alone: vec![], during: vec![1.0; 80_000], during_acked: vec![], drain_secs: 600.0, cpu: serde_json::Value::Null, produced_secs: 1.0, rate: 200, backlog: 100_000 };
        assert!((s.index_rate() - 300.0).abs() < 1e-9, "{}", s.index_rate());
        assert!((s.quiet_share() - 2.0 / 3.0).abs() < 1e-9, "{}", s.quiet_share());
    }
}
