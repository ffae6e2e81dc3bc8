//! The key-concurrency phase: on a topic of one partition, single-document
//! commands spread over 1, 10, 100 and 1,000 keys, applied as a backlog by
//! a worker with key lanes (the worker's default) and with `--lanes 1` (one
//! command at a time, the baseline), each on a topic and index of its own.
//!
//! What it shows: whether lanes speed up single-document commands of many
//! keys. They do not need to: the applier already batches them whatever
//! their keys (the documents they read fetched ahead together, one bulk or
//! one commit per batch), and lanes only let other keys' commands pass a
//! fan-out. docs/benchmark.md, "Key lanes", has the figures.

use serde_json::json;

use super::table::{per_sec, phase, Row};
use super::{lanes_arg, Bench};
use denorm::command::Command;
use denorm::produce::Producer;

impl Bench<'_> {
    /// Runs the phase for each of `keys`; adds its rows and results.
    pub(super) async fn key_concurrency(
        &self,
        n: u64,
        keys: &[u64],
        run_id: &str,
        es_url: Option<&str>,
        rows: &mut Vec<Row>,
        results: &mut serde_json::Map<String, serde_json::Value>,
    ) -> anyhow::Result<()> {
        let mut runs = Vec::new();
        for &k in keys {
            let lanes = self.keys_backlog(n, k, run_id, es_url, None).await?;
            let one = self.keys_backlog(n, k, run_id, es_url, Some(1)).await?;
            rows.push(Row::new(
                format!("key concurrency: {n} single-document commands over {k} key(s) of one partition"),
                format!("{} with lanes", per_sec(lanes, "commands")),
                format!("--lanes 1 {}", per_sec(one, "")),
                Some(lanes / one),
                if k == 100 { ">= 10x on Elasticsearch" } else { "" },
            ));
            runs.push(json!({"keys": k, "lanes_rate": lanes, "one_lane_rate": one, "ratio": lanes / one}));
        }
        results.insert("key_concurrency".into(), json!({"commands": n, "runs": runs}));
        Ok(())
    }

    /// `n` upserts over `keys` top-level directories produced to a topic of
    /// one partition, then applied by a worker (`lanes` if given) as a
    /// backlog: commands per second.
    async fn keys_backlog(&self, n: u64, keys: u64, run_id: &str, es_url: Option<&str>, lanes: Option<usize>) -> anyhow::Result<f64> {
        let name = lanes.map_or("lanes".to_string(), |l| format!("lanes{l}"));
        let tag = format!("keys{keys}-{name}");
        phase(&format!("key concurrency ({name}): {n} single-document commands over {keys} key(s)"));
        let (b, index) = self.own_partition(&tag, run_id, es_url).await?;
        let commands: Vec<Command> =
            (0..n).map(|i| Command::UpsertFile { id: format!("c{i}"), path: format!("/c{}/d{}/c{i}.txt", i % keys, i % 20), contents: format!("command {i}"), previous_path: None }).collect();
        Producer::new(&b.kafka)?.send_all(commands, 10_000, |_| {}).await?;
        let group = format!("denorm-bench-{run_id}-{tag}");
        let worker = b.start_worker_with(&group, &index, &lanes_arg(lanes)).await?;
        let took = b.wait_applied(&worker, &index, None).await?;
        worker.stop().await?;
        Ok(n as f64 / took.as_secs_f64())
    }
}
