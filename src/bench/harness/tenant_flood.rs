//! The tenant-fairness phase (issue 47): on a topic of one partition, a
//! quiet tenant sends single-document upserts at a steady rate, alone, then
//! while a noisy tenant's backlog of commands (sent at once, to the same
//! partition) drains. The quiet tenant's produce -> searchable latency,
//! alone (the baseline, measured in the same run) and during the flood.
//! Nothing schedules tenants fairly yet: the figure is what a quiet tenant
//! waits today (docs/tenants.md).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::head_of_line::other_upsert;
use super::latency::quantile;
use super::table::{phase, Row};
use super::Bench;
use denorm::command::Command;
use denorm::produce::Producer;

/// Length of the quiet tenant's series alone.
const ALONE: Duration = Duration::from_secs(3);

/// The noisy tenant's backlog: `n` upserts over a hundred keys.
fn backlog(n: u64) -> Vec<Command> {
    (0..n).map(|i| Command::UpsertFile { id: format!("n{i}"), path: format!("/k{}/n{i}.txt", i % 100), contents: format!("noisy {i}"), previous_path: None }.scoped(Some("noisy"))).collect()
}

impl Bench<'_> {
    /// Runs the phase; adds its row and results.
    pub(super) async fn tenant_flood(
        &self,
        n: u64,
        rate: u64,
        run_id: &str,
        es_url: Option<&str>,
        rows: &mut Vec<Row>,
        results: &mut serde_json::Map<String, serde_json::Value>,
    ) -> anyhow::Result<()> {
        let (b, index) = self.own_partition("flood", run_id, es_url).await?;
        let group = format!("denorm-bench-{run_id}-flood");
        let producer = Arc::new(Producer::new(&b.kafka)?);
        producer.send(other_upsert("first", "the index's first document".into()).scoped(Some("quiet"))).await?;
        let worker = b.start_worker_with(&group, &index, &[]).await?;
        b.wait_applied(&worker, &index, None).await?;
        phase(&format!("tenant fairness: a quiet tenant at {rate}/s, alone"));
        let alone = b.other_key(&producer, &index, rate, Some("quiet"), "alone", &|| false, ALONE).await?;
        phase(&format!("tenant fairness: the same while a noisy tenant's backlog of {n} commands drains, in the same partition"));
        let done = AtomicBool::new(false);
        let is_done = || done.load(Ordering::SeqCst);
        let t = Instant::now();
        let (drained, during) = tokio::join!(
            async {
                let r = async {
                    producer.send_all(backlog(n), 10_000, |_| {}).await?;
                    b.wait_applied(&worker, &index, None).await
                }
                .await;
                done.store(true, Ordering::SeqCst);
                r
            },
            b.other_key(&producer, &index, rate, Some("quiet"), "during", &is_done, b.timeout)
        );
        drained?;
        let drain_secs = t.elapsed().as_secs_f64();
        let during = during?;
        worker.stop().await?;
        let q = |v: &[f64], p: f64| quantile(&mut v.to_vec(), p);
        let (alone99, during99) = (q(&alone, 0.99), q(&during, 0.99));
        rows.push(Row::new(
            format!("tenant fairness: a quiet tenant at {rate}/s while a noisy tenant's backlog of {n} commands drains, p50/p99 produce -> searchable"),
            format!("{:.0}/{:.0} ms ({} commands, backlog drained in {drain_secs:.1} s)", q(&during, 0.5), during99, during.len()),
            format!("alone {:.0}/{:.0} ms", q(&alone, 0.5), alone99),
            Some(during99 / alone99.max(0.001)),
            "<= 2x alone p99 (issue 47; no fair scheduling yet)",
        ));
        results.insert(
            "tenant_flood".into(),
            json!({"backlog": n, "rate": rate, "alone_commands": alone.len(), "alone_p50_ms": q(&alone, 0.5), "alone_p99_ms": alone99,
                   "during_commands": during.len(), "during_p50_ms": q(&during, 0.5), "during_p99_ms": during99, "drain_seconds": drain_secs,
                   "ratio": during99 / alone99.max(0.001)}),
        );
        Ok(())
    }
}
