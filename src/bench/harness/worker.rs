//! A `denorm run` worker the bench starts: its readiness, memory and stop.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::bench::process::{status_kb, Sampler};

/// A `denorm run` child process.
pub(super) struct Worker {
    pub(super) child: tokio::process::Child,
    pub(super) pid: u32,
    pub(super) port: u16,
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

    /// SIGTERM, then waits for a clean exit.
    pub(super) async fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .context("the worker did not stop within 60 s")??;
        if !status.success() {
            bail!("the worker exited with {status}");
        }
        Ok(())
    }
}
