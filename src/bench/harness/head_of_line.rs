//! The head-of-line phase: on a topic of one partition, a rename of a large
//! tree of one key while another key of the same partition receives
//! commands at a steady rate. That key's produce -> searchable latency,
//! idle and during the rename, with key lanes (the worker's default) and
//! with `--lanes 1` (one command at a time, the baseline), each in the same
//! run on a topic and index of its own, with the worker's peak heap during
//! the rename. Then the tree is renamed back while the other key sends a
//! `produce --wait` every 100 ms: how long each wait takes, idle and
//! during that rename (issue 45: acknowledged per command where the broker
//! keeps the commit's metadata).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde_json::json;

use super::latency::{quantile, watch};
use super::table::{mb, phase, Row};
use super::{lanes_arg, Bench};
use denorm::command::Command;
use denorm::produce::Producer;

/// The other key's latency, idle and during the rename (milliseconds),
/// and the worker's heap (`RssAnon`, KiB) before and at its peak during
/// the rename.
struct Series {
    idle: Vec<f64>,
    during: Vec<f64>,
    /// `produce --wait` of the other key (ms), idle and during the rename.
    wait_idle: Vec<f64>,
    wait_during: Vec<f64>,
    rename_secs: f64,
    heap_before_kb: u64,
    heap_peak_kb: u64,
}

/// Length of the idle series.
const IDLE: Duration = Duration::from_secs(3);

/// How often the other key sends a `produce --wait` (issue 45: every
/// 100 ms), beside its steady upserts.
const WAIT_EVERY: Duration = Duration::from_millis(100);

/// A tree of `files` files under `root`, a hundred directories.
pub(super) fn tree_under(root: &str, files: u64) -> Vec<Command> {
    (0..files).map(|i| Command::UpsertFile { id: format!("t{i}"), path: format!("{root}/d{}/t{i}.txt", i % 100), contents: format!("tree file {i}"), previous_path: None }).collect()
}

/// An upsert of file `id` of the other key, `/other`.
pub(super) fn other_upsert(id: &str, contents: String) -> Command {
    Command::UpsertFile { id: id.to_string(), path: format!("/other/{id}.txt"), contents, previous_path: None }
}

/// Another key's latencies, in milliseconds ([`Bench::other_key`]).
pub(super) struct Latencies {
    /// Produce -> searchable, each command.
    pub searchable: Vec<f64>,
    /// Produce -> acknowledged by the broker, each command.
    pub acked: Vec<f64>,
    /// Where each command was written (partition, offset) and when it was
    /// sent: for [`Latencies::read`].
    pub sent: Vec<((i32, i64), Instant)>,
}

impl Latencies {
    /// Produce -> read by the plain consumer whose reads are `at`, for
    /// each command it read.
    pub fn read(&self, at: &super::latency::ReadAt) -> Vec<f64> {
        self.sent.iter().filter_map(|(pos, sent)| at.get(pos).map(|r| r.saturating_duration_since(*sent).as_secs_f64() * 1000.0)).collect()
    }
}

impl Bench<'_> {
    /// Runs the phase with lanes and with one lane; adds its rows and
    /// results.
    pub(super) async fn head_of_line(
        &self,
        files: u64,
        rate: u64,
        run_id: &str,
        es_url: Option<&str>,
        rows: &mut Vec<Row>,
        results: &mut serde_json::Map<String, serde_json::Value>,
    ) -> anyhow::Result<()> {
        let lanes = self.series(files, rate, run_id, es_url, None).await?;
        let one = self.series(files, rate, run_id, es_url, Some(1)).await?;
        let q = |v: &[f64], p: f64| quantile(&mut v.to_vec(), p);
        let (idle99, during99, one99) = (q(&lanes.idle, 0.99), q(&lanes.during, 0.99), q(&one.during, 0.99));
        rows.push(Row::new(
            format!("head of line: another key at {rate}/s during a rename of {files} files, p50/p99 produce -> searchable"),
            format!("{:.0}/{:.0} ms with lanes ({} commands, rename {:.1} s)", q(&lanes.during, 0.5), during99, lanes.during.len(), lanes.rename_secs),
            format!("idle {:.0}/{:.0} ms; --lanes 1 during: {:.0}/{:.0} ms", q(&lanes.idle, 0.5), idle99, q(&one.during, 0.5), one99),
            Some(during99 / idle99.max(0.001)),
            "<= 2x idle p99",
        ));
        rows.push(Row::new(
            "  worker peak heap during the rename".to_string(),
            format!("{} with lanes (before the rename {})", mb(Some(lanes.heap_peak_kb)), mb(Some(lanes.heap_before_kb))),
            format!("--lanes 1 {} (before {})", mb(Some(one.heap_peak_kb)), mb(Some(one.heap_before_kb))),
            Some(lanes.heap_peak_kb as f64 / one.heap_peak_kb.max(1) as f64),
            "",
        ));
        let (wait_idle99, wait_during99) = (q(&lanes.wait_idle, 0.99), q(&lanes.wait_during, 0.99));
        rows.push(Row::new(
            format!("  the other key's produce --wait every {} ms during the rename back, p50/p99", WAIT_EVERY.as_millis()),
            format!("{:.0}/{:.0} ms with lanes ({} commands)", q(&lanes.wait_during, 0.5), wait_during99, lanes.wait_during.len()),
            format!("idle {:.0}/{:.0} ms; --lanes 1 during: {:.0}/{:.0} ms", q(&lanes.wait_idle, 0.5), wait_idle99, q(&one.wait_during, 0.5), q(&one.wait_during, 0.99)),
            Some(wait_during99 / wait_idle99.max(0.001)),
            "<= 2x idle p99 where the broker keeps commit metadata",
        ));
        let of = |s: &Series| {
            json!({"idle_commands": s.idle.len(), "idle_p50_ms": q(&s.idle, 0.5), "idle_p99_ms": q(&s.idle, 0.99),
                   "wait_idle_commands": s.wait_idle.len(), "wait_idle_p50_ms": q(&s.wait_idle, 0.5), "wait_idle_p99_ms": q(&s.wait_idle, 0.99),
                   "wait_during_commands": s.wait_during.len(), "wait_during_p50_ms": q(&s.wait_during, 0.5), "wait_during_p99_ms": q(&s.wait_during, 0.99),
                   "during_commands": s.during.len(), "during_p50_ms": q(&s.during, 0.5), "during_p99_ms": q(&s.during, 0.99), "rename_seconds": s.rename_secs,
                   "worker_anon_before_kb": s.heap_before_kb, "worker_peak_anon_kb": s.heap_peak_kb})
        };
        results.insert("head_of_line".into(), json!({"files": files, "rate": rate, "lanes": of(&lanes), "one_lane": of(&one), "ratio": during99 / idle99.max(0.001)}));
        // The same rename, with a rebalance in its middle.
        self.reapply(files, run_id, es_url, rows, results).await
    }

    /// One run: a topic of one partition, a worker (`lanes` if given), the
    /// tree loaded, then the idle series and the series during the rename.
    async fn series(&self, files: u64, rate: u64, run_id: &str, es_url: Option<&str>, lanes: Option<usize>) -> anyhow::Result<Series> {
        let name = lanes.map_or("lanes".to_string(), |n| format!("lanes{n}"));
        let (b, index) = self.own_partition(&format!("hol-{name}"), run_id, es_url).await?;
        let group = format!("denorm-bench-{run_id}-hol-{name}");
        let producer = Arc::new(Producer::new(&b.kafka)?);
        let extra = lanes_arg(lanes);
        phase(&format!("head of line ({name}): loading a tree of {files} files"));
        producer.send_all(tree_under("/hol/tree", files), 10_000, |_| {}).await?;
        let worker = b.start_worker_with(&group, &index, &extra).await?;
        b.wait_applied(&worker, &index, None).await?;
        phase(&format!("head of line ({name}): another key at {rate}/s, idle"));
        let idle = b.other_key(&producer, Some(&index), rate, None, "idle", &|| false, IDLE).await?.searchable;
        phase(&format!("head of line ({name}): the same during the rename of the tree"));
        producer.send(Command::RenamePath { from: "/hol/tree".into(), to: "/hol/moved".into() }).await?;
        let done = AtomicBool::new(false);
        let is_done = || done.load(Ordering::SeqCst);
        let heap_before_kb = worker.status_kb("RssAnon:").unwrap_or(0);
        let sampler = worker.sample_peaks();
        let t = Instant::now();
        let (applied, during) = tokio::join!(
            async {
                let r = b.wait_applied(&worker, &index, None).await;
                done.store(true, Ordering::SeqCst);
                r
            },
            b.other_key(&producer, Some(&index), rate, None, "during", &is_done, b.timeout)
        );
        applied?;
        let during = during.map(|s| s.searchable);
        let rename_secs = t.elapsed().as_secs_f64();
        let (heap_peak_kb, _) = sampler.stop();
        // `produce --wait` apart from the series above: its waits poll the
        // broker, and would slow what the series above measures. Idle, then
        // during the rename of the tree back.
        phase(&format!("head of line ({name}): another key's produce --wait every {} ms, idle", WAIT_EVERY.as_millis()));
        let wait_idle = b.waits(&producer, &group, "wait-idle", &|| false, IDLE).await?;
        phase(&format!("head of line ({name}): the same during the rename of the tree back"));
        producer.send(Command::RenamePath { from: "/hol/moved".into(), to: "/hol/tree".into() }).await?;
        let back = AtomicBool::new(false);
        let is_back = || back.load(Ordering::SeqCst);
        let (applied, wait_during) = tokio::join!(
            async {
                let r = b.wait_applied(&worker, &index, None).await;
                back.store(true, Ordering::SeqCst);
                r
            },
            b.waits(&producer, &group, "wait-during", &is_back, b.timeout)
        );
        applied?;
        worker.stop().await?;
        Ok(Series { idle, during: during?, wait_idle, wait_during: wait_during?, rename_secs, heap_before_kb, heap_peak_kb })
    }

    /// Upserts of key `/other`, one every [`WAIT_EVERY`] until `stop` says
    /// so or `max` has passed, each sent and waited for as `denorm produce
    /// --wait` does (the group's committed offset, and the record of what
    /// is applied above it in the commit's metadata where the broker keeps
    /// it): each one's time from send to the wait's return (ms). The waits
    /// overlap, as separate `produce --wait` calls would.
    async fn waits(&self, producer: &Arc<Producer>, group: &str, tag: &str, stop: &(dyn Fn() -> bool + Sync), max: Duration) -> anyhow::Result<Vec<f64>> {
        let start = Instant::now();
        let mut waits = Vec::new();
        for i in 0.. {
            tokio::time::sleep_until((start + WAIT_EVERY * i).into()).await;
            if stop() || start.elapsed() >= max {
                break;
            }
            let id = format!("{tag}{i}");
            let cmd = other_upsert(&id, format!("{tag} {i}"));
            let (p, kafka, group, timeout) = (producer.clone(), self.kafka.clone(), group.to_string(), self.timeout);
            waits.push(tokio::spawn(async move {
                let at = Instant::now();
                let sent = p.send(cmd).await?;
                tokio::task::spawn_blocking(move || denorm::kafka::wait_for_deliveries(&kafka, &group, &[sent], timeout)).await??;
                anyhow::Ok(at.elapsed().as_secs_f64() * 1000.0)
            }));
        }
        let mut out = Vec::new();
        for w in waits {
            out.push(w.await??);
        }
        anyhow::ensure!(!out.is_empty(), "no produce --wait samples");
        Ok(out)
    }

    /// Upserts of a file of key `/other` (of `tenant`) at `rate` until
    /// `stop` says so or `max` has passed: each one's produce ->
    /// searchable time (ms) in `index` (none without one), and produce ->
    /// acknowledged by the broker.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn other_key(
        &self,
        producer: &Arc<Producer>,
        index: Option<&std::path::Path>,
        rate: u64,
        tenant: Option<&str>,
        tag: &str,
        stop: &(dyn Fn() -> bool + Sync),
        max: Duration,
    ) -> anyhow::Result<Latencies> {
        let (tx, rx) = mpsc::channel::<(String, Instant)>();
        let timeout = self.timeout;
        let watcher = match index {
            Some(index) => {
                let (probe, every) = self.probe(index)?;
                Some(std::thread::spawn(move || watch(probe, every, rx, timeout)))
            }
            None => None,
        };
        let start = Instant::now();
        let mut sent = Vec::new();
        let mut sends = Vec::new();
        for i in 0.. {
            tokio::time::sleep_until((start + Duration::from_secs_f64(i as f64 / rate as f64)).into()).await;
            if stop() || start.elapsed() >= max {
                break;
            }
            let cmd = other_upsert(&format!("{tag}{i}"), format!("{tag} {i}")).scoped(tenant);
            // The document's id as the index holds it (scoped to its tenant).
            let id = denorm::command::tenant::scope(tenant, &format!("{tag}{i}"));
            let at = Instant::now();
            tx.send((id.clone(), at)).ok();
            sent.push((id, at));
            let p = producer.clone();
            sends.push(tokio::spawn(async move { p.send(cmd).await.map(|d| ((d.partition, d.offset), at, at.elapsed().as_secs_f64() * 1000.0)) }));
        }
        drop(tx);
        let (mut acked, mut written) = (Vec::with_capacity(sends.len()), Vec::with_capacity(sends.len()));
        for s in sends {
            let (pos, at, ms) = s.await??;
            acked.push(ms);
            written.push((pos, at));
        }
        let Some(watcher) = watcher else { return Ok(Latencies { searchable: Vec::new(), acked, sent: written }) };
        let seen = tokio::task::spawn_blocking(move || watcher.join()).await?.map_err(|_| anyhow::anyhow!("the watcher panicked"))??;
        Ok(Latencies { searchable: sent.iter().map(|(id, at)| seen[id].saturating_duration_since(*at).as_secs_f64() * 1000.0).collect(), acked, sent: written })
    }
}
