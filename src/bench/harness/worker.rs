//! A `denorm run` worker the bench starts: its readiness, memory and stop.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::Bench;

use crate::bench::process::{status_kb, Sampler};

/// A `denorm run` child process.
pub(super) struct Worker {
    pub(super) child: tokio::process::Child,
    pub(super) pid: u32,
    pub(super) port: u16,
}

/// `denorm_commands_total` summed over command types, by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Commands {
    pub applied: u64,
    /// Skipped as applied before (redelivered, or done above the checkpoint).
    pub duplicate: u64,
}

impl Commands {
    fn of(metrics: &str) -> Commands {
        let mut c = Commands::default();
        for line in metrics.lines().filter(|l| l.starts_with("denorm_commands_total{")) {
            let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else { continue };
            if line.contains("outcome=\"applied\"") {
                c.applied += value as u64;
            } else if line.contains("outcome=\"duplicate\"") {
                c.duplicate += value as u64;
            }
        }
        c
    }
}

impl Worker {
    pub(super) fn alive(&self) -> bool {
        Path::new(&format!("/proc/{}/status", self.pid)).exists() && self.status_kb("VmRSS:").is_some()
    }

    /// A `/proc/<pid>/status` figure in kB (VmRSS, VmHWM).
    pub(super) fn status_kb(&self, key: &str) -> Option<u64> {
        status_kb(self.pid, key)
    }

    /// Samples the worker's anonymous and file-backed resident memory every
    /// 10 ms until stopped.
    pub(super) fn sample_peaks(&self) -> Sampler {
        Sampler::start(self.pid)
    }

    /// Resets the peak resident set size (VmHWM) to the current one.
    pub(super) fn reset_peak(&self) -> anyhow::Result<()> {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid), "5").context("resetting the worker's peak memory (/proc/<pid>/clear_refs)")
    }

    /// The commands the worker has handled, from its `/metrics`.
    pub(super) async fn commands(&self) -> anyhow::Result<Commands> {
        let text = reqwest::get(format!("http://127.0.0.1:{}/metrics", self.port)).await?.error_for_status()?.text().await?;
        Ok(Commands::of(&text))
    }

    /// SIGTERM, then waits for a clean exit.
    pub(super) async fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await.context("the worker did not stop within 60 s")??;
        if !status.success() {
            bail!("the worker exited with {status}");
        }
        Ok(())
    }
}

impl Bench<'_> {
    /// Starts a `denorm run` of `group` on `index` and waits for its
    /// readiness.
    pub(super) async fn start_worker(&self, group: &str, index: &Path) -> anyhow::Result<Worker> {
        self.start_worker_with(group, index, &[]).await
    }

    /// [`Bench::start_worker`] with `extra` flags of `denorm run`.
    pub(super) async fn start_worker_with(&self, group: &str, index: &Path, extra: &[String]) -> anyhow::Result<Worker> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.work.join("worker.log"))?;
        let mut cmd = self.denorm(group, index);
        cmd.args(["run", "--metrics-addr", &format!("127.0.0.1:{port}")])
            .args(&self.a.worker_args)
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        let child = cmd.spawn().with_context(|| format!("starting {}", self.exe.display()))?;
        let w = Worker { pid: child.id().context("worker exited at once")?, child, port };
        let http = reqwest::Client::new();
        let deadline = Instant::now() + self.timeout;
        loop {
            let ok = http.get(format!("http://127.0.0.1:{}/readyz", w.port)).send().await.map(|r| r.status().is_success()).unwrap_or(false);
            if ok {
                return Ok(w);
            }
            if Instant::now() > deadline {
                bail!("the worker was not ready after {:?}; see {}", self.timeout, self.work.join("worker.log").display());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `denorm` with the bench's broker, topic, client options, `group`
    /// and `index`: a subcommand and its flags follow.
    pub(super) fn denorm(&self, group: &str, index: &Path) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.exe);
        cmd.args(["--brokers", &self.kafka.brokers, "--topic", &self.kafka.topic, "--group", group]).arg("--index").arg(index).args(["--partitions", &self.kafka.partitions.to_string()]);
        if let Some(f) = &self.launch.kafka_options_file {
            cmd.arg("--kafka-options-file").arg(f);
        }
        // In the environment, not on the command line, where `ps` would show
        // secrets such as sasl.password. A value holding the environment's `;`
        // separator can only go on the command line, and then all of them must
        // (clap ignores the variable once the flag is given).
        let opts = &self.launch.kafka_options;
        cmd.env_remove("DENORM_KAFKA_OPTIONS");
        if opts.iter().any(|(_, v)| v.contains(';')) {
            for (k, v) in opts {
                cmd.arg("-X").arg(format!("{k}={v}"));
            }
        } else if !opts.is_empty() {
            cmd.env("DENORM_KAFKA_OPTIONS", opts.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(";"));
        }
        if let Some(es) = &self.es {
            cmd.env(denorm::index::elastic::config::env::PREFIX, &es.prefix);
        }
        cmd.env_remove("DENORM_MODEL");
        if let Some(m) = &self.model {
            cmd.arg("--model").arg(m);
        }
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_summed_over_types_by_outcome() {
        let text = "# TYPE denorm_commands_total counter\ndenorm_commands_total{type=\"upsert_file\",outcome=\"applied\"} 5\ndenorm_commands_total{type=\"rename\",outcome=\"applied\"} 1\ndenorm_commands_total{type=\"unknown\",outcome=\"duplicate\"} 7\ndenorm_commands_total{type=\"upsert_file\",outcome=\"parked\"} 2\ndenorm_commands_applied_other 9\n";
        assert_eq!(Commands::of(text), Commands { applied: 6, duplicate: 7 });
    }
}
