//! The verify phase of `denorm bench`: `denorm verify` of the index while
//! its worker runs, against `denorm rebuild` of the same log (the bound:
//! a verify takes at most 1.5 times the rebuild), each a process of its
//! own whose peak memory is sampled.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::json;

use super::table::{mb, phase, Row};
use super::Bench;
use crate::bench::process::Sampler;

/// What one `denorm` process took.
struct Run {
    seconds: f64,
    /// Peak heap (`RssAnon`) and peak mapped files (`RssFile`), sampled
    /// every 10 ms, in kB; their sum bounds the peak resident memory.
    peak_anon_kb: u64,
    peak_file_kb: u64,
    stdout: String,
}

impl Bench<'_> {
    /// Runs `denorm <args>` of `group` on `index` to its end.
    async fn timed(&self, group: &str, index: &Path, args: &[&str], what: &str) -> anyhow::Result<Run> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.work.join("verify.log"))?;
        let mut cmd = self.denorm(group, index);
        cmd.args(args).stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).stderr(log).kill_on_drop(true);
        let t = Instant::now();
        let child = cmd.spawn().with_context(|| format!("starting {what}"))?;
        let sampler = Sampler::start(child.id().context("exited at once")?);
        let out = tokio::time::timeout(self.timeout, child.wait_with_output()).await.with_context(|| format!("{what} did not finish within {:?}", self.timeout))??;
        let seconds = t.elapsed().as_secs_f64();
        let (anon, file) = sampler.stop();
        if !out.status.success() {
            bail!("{what} exited with {} (see {})", out.status, self.work.join("verify.log").display());
        }
        Ok(Run { seconds, peak_anon_kb: anon, peak_file_kb: file, stdout: String::from_utf8_lossy(&out.stdout).into_owned() })
    }

    /// The verify phase, on the index `index` of `group` (its worker
    /// running): a whole verify, a 10 % sample, then the rebuild of the
    /// same log (which cuts the index over to a generation of its own).
    pub(super) async fn verify_phase(&self, group: &str, index: &Path, rows: &mut Vec<Row>, results: &mut serde_json::Map<String, serde_json::Value>) -> anyhow::Result<()> {
        phase("verify: denorm verify of the whole index against its log, while the worker runs");
        let whole = self.timed(group, index, &["verify", "--json"], "denorm verify").await?;
        let report: serde_json::Value = serde_json::from_str(&whole.stdout).context("reading the verify's report")?;
        let (checked, differences) = (report["checked"].as_u64().unwrap_or(0), report["differences_total"].as_u64().unwrap_or(0));
        if differences > 0 {
            bail!("the verify found {differences} difference(s): {}", whole.stdout);
        }
        phase("verify: a 10 % sample of the keys");
        let sample = self.timed(group, index, &["verify", "--json", "--sample", "10"], "denorm verify --sample 10").await?;
        phase("verify: denorm rebuild of the same log (the baseline)");
        let rebuild = self.timed(group, index, &["rebuild", "--metrics-addr", "127.0.0.1:0"], "denorm rebuild").await?;
        let ratio = whole.seconds / rebuild.seconds;
        rows.push(Row::new(
            format!("verify of {checked} documents against their log (worker running)"),
            format!("{:.1} s (peak heap {}, mapped {}; 10 % sample {:.1} s)", whole.seconds, mb(Some(whole.peak_anon_kb)), mb(Some(whole.peak_file_kb)), sample.seconds),
            format!("rebuild {:.1} s (peak heap {}, mapped {})", rebuild.seconds, mb(Some(rebuild.peak_anon_kb)), mb(Some(rebuild.peak_file_kb))),
            Some(ratio),
            "<= 150%",
        ));
        results.insert(
            "verify".into(),
            json!({"documents": checked, "seconds": whole.seconds, "peak_anon_kb": whole.peak_anon_kb, "peak_file_kb": whole.peak_file_kb, "sample_10_seconds": sample.seconds, "sample_10_peak_anon_kb": sample.peak_anon_kb,
                   "rebuild_seconds": rebuild.seconds, "rebuild_peak_anon_kb": rebuild.peak_anon_kb, "rebuild_peak_file_kb": rebuild.peak_file_kb, "ratio": ratio,
                   "measure": "wall time of each process; peak RssAnon and RssFile sampled every 10 ms"}),
        );
        Ok(())
    }
}
