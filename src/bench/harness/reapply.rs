//! The re-application after a rebalance in the middle of a long rename
//! (issue 45). On a topic of one partition, a tree is renamed; while the
//! rename runs, another key sends [`OTHERS`] upserts, which the worker
//! applies beside it (key lanes) and records as done above its checkpoint.
//! The worker is then stopped (SIGTERM: it hands the partition over as in
//! a rebalance) and a new one started in the same group. Measured: how
//! many of the commands the first worker had applied above its checkpoint
//! the new owner applies again (a new owner that knew only the checkpoint
//! would apply all of them again), and how long after the new worker's
//! start another key's command sent then is searchable, against the same
//! restart with nothing in flight, in the same run.

use std::sync::mpsc;
use std::time::Instant;

use serde_json::json;

use super::head_of_line::{other_upsert, tree_under};
use super::latency::watch;
use super::table::{phase, Row};
use super::worker::Worker;
use super::Bench;
use denorm::command::Command;
use denorm::produce::Producer;

/// Upserts of another key applied beside the rename before the stop.
const OTHERS: u64 = 200;

/// What one restart showed.
struct Restart {
    /// From the old worker's stop to another key's command searchable.
    other_secs: f64,
    /// The checkpoint the new owner resumed after (-1: none).
    resumed_at: i64,
}

fn upsert(id: &str) -> Command {
    other_upsert(id, format!("another key's {id}"))
}

impl Bench<'_> {
    /// Runs the phase; adds its rows and results.
    pub(super) async fn reapply(&self, files: u64, run_id: &str, es_url: Option<&str>, rows: &mut Vec<Row>, results: &mut serde_json::Map<String, serde_json::Value>) -> anyhow::Result<()> {
        let (b, index) = self.own_partition("reapply", run_id, es_url).await?;
        let group = format!("denorm-bench-{run_id}-reapply");
        let producer = Producer::new(&b.kafka)?;
        phase(&format!("re-application after a rebalance: loading a tree of {files} files"));
        producer.send_all(tree_under("/re/tree", files), 10_000, |_| {}).await?;
        let worker = b.start_worker(&group, &index).await?;
        b.wait_applied(&worker, &index, None).await?;
        phase("re-application after a rebalance: a restart with nothing in flight (the baseline)");
        let (worker, idle) = b.restart(worker, &group, &index, &producer, "idle").await?;
        b.wait_applied(&worker, &index, None).await?;

        phase(&format!("re-application after a rebalance: {OTHERS} commands of another key beside the rename, then a restart"));
        let rename = producer.send(Command::RenamePath { from: "/re/tree".into(), to: "/re/moved".into() }).await?;
        let ids: Vec<String> = (0..OTHERS).map(|i| format!("beside{i}")).collect();
        let t = Instant::now();
        producer.send_all(ids.iter().map(|id| upsert(id)).collect(), 10_000, |_| {}).await?;
        // Every one of them searchable: applied beside the rename.
        b.seen(&index, &ids, t).await?;
        let before = worker.commands().await?;
        let end = *b.ends()?.get(&0).unwrap_or(&0);
        let (worker, mid) = b.restart(worker, &group, &index, &producer, "mid").await?;
        b.wait_applied(&worker, &index, None).await?;
        let after = worker.commands().await?;
        worker.stop().await?;
        // The rename was in flight at the hand-over when the checkpoint
        // the new owner resumed after was below it (a stop lets a fan-out
        // finish within its bound, 1 s: a short one ends before).
        let running = mid.resumed_at < rename.offset;
        // What the new owner read again: every message after that
        // checkpoint up to the end before the restart. It applies the
        // rename (when unfinished) and the command sent at its start, and
        // applies again or skips as done each of the others; the message
        // at the checkpoint itself is read again to check the log's
        // identity, and counted as skipped too.
        let read_again = (end - 1 - mid.resumed_at).max(0) as u64;
        let again = after.applied.saturating_sub(1 + u64::from(running));
        let skipped = after.duplicate.saturating_sub(u64::from(mid.resumed_at >= 0));
        rows.push(Row::new(
            format!("re-application after a rebalance during a rename of {files} files, {OTHERS} commands of another key applied beside it"),
            format!("{again} applied again, {skipped} skipped as done, of {} read again; another key searchable {:.2} s after the stop", read_again - u64::from(running), mid.other_secs),
            format!("a new owner that knows only the checkpoint: {OTHERS} applied again; restart with nothing in flight: {:.2} s", idle.other_secs),
            Some(mid.other_secs / idle.other_secs.max(0.001)),
            "",
        ));
        if !running {
            rows.push(Row::new("  (the rename finished before the hand-over: nothing was in flight)".to_string(), String::new(), String::new(), None, ""));
        }
        results.insert(
            "reapply".into(),
            json!({"files": files, "others": OTHERS, "rename_running_at_stop": running, "read_again": read_again - u64::from(running), "applied_again": again, "skipped_as_done": skipped, "resumed_at": mid.resumed_at,
                   "first_worker_applied": before.applied, "other_key_seconds": mid.other_secs, "idle_restart_other_key_seconds": idle.other_secs}),
        );
        Ok(())
    }

    /// Stops `worker` (SIGTERM: a hand-over, as in a rebalance), starts
    /// another in its group and sends a command of another key: the time
    /// from the stop until that command is searchable.
    async fn restart(&self, worker: Worker, group: &str, index: &std::path::Path, producer: &Producer, tag: &str) -> anyhow::Result<(Worker, Restart)> {
        let t = Instant::now();
        worker.stop().await?;
        let resumed_at = self.applied(self.embedded(index)?.as_ref()).await?.get(&0).map_or(-1, |&a| a as i64);
        let w = self.start_worker(group, index).await?;
        let id = format!("{tag}-after-restart");
        producer.send(upsert(&id)).await?;
        self.seen(index, std::slice::from_ref(&id), t).await?;
        Ok((w, Restart { other_secs: t.elapsed().as_secs_f64(), resumed_at }))
    }

    /// Waits until each of `ids` is searchable.
    async fn seen(&self, index: &std::path::Path, ids: &[String], since: Instant) -> anyhow::Result<()> {
        let (probe, every) = self.probe(index)?;
        let (tx, rx) = mpsc::channel();
        for id in ids {
            tx.send((id.clone(), since)).ok();
        }
        drop(tx);
        let timeout = self.timeout;
        tokio::task::spawn_blocking(move || watch(probe, every, rx, timeout)).await??;
        Ok(())
    }
}
