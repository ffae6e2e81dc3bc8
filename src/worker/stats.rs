//! The worker's running totals, for the demo's report and the tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Running totals, for the demo's report and tests.
#[derive(Debug, Default)]
pub struct Stats {
    /// Commands applied.
    pub applied: AtomicU64,
    /// Documents written.
    pub documents: AtomicU64,
    /// Documents of the largest fan-out, and its duration in microseconds.
    pub largest_fan_out_documents: AtomicU64,
    pub largest_fan_out_micros: AtomicU64,
    /// Per partition, the offset up to which everything is applied (or
    /// carries no message), as of the last commit interval: what a
    /// rebuild's cutover waits for.
    pub positions: std::sync::Mutex<std::collections::BTreeMap<i32, i64>>,
    /// The offsets of the fan-outs finished in key lanes, in the order
    /// they finished (the applier's tests).
    #[cfg(test)]
    pub lane_fan_outs_finished: std::sync::Mutex<Vec<i64>>,
    /// What became of each message, in order: its offset and the step (the
    /// applier's tests trace a message's way through the loop).
    #[cfg(test)]
    pub events: std::sync::Mutex<Vec<(i64, &'static str)>>,
    /// The most messages a partition held at once (the applier's tests).
    #[cfg(test)]
    pub held_peak: AtomicU64,
    /// Messages read past and left to be read again (the applier's tests).
    #[cfg(test)]
    pub spilled: AtomicU64,
    /// Messages of a spilled tenant that found the spill file full and
    /// waited (the applier's tests).
    #[cfg(test)]
    pub spill_full: AtomicU64,
    /// Batches hurried by a command beside a held tenant (the applier's
    /// tests).
    #[cfg(test)]
    pub hurried: AtomicU64,
}

impl Stats {
    pub(super) fn record(&self, docs: u64, fan_out: bool, elapsed: Duration) {
        self.applied.fetch_add(1, Ordering::Relaxed);
        self.documents.fetch_add(docs, Ordering::Relaxed);
        if fan_out && docs > self.largest_fan_out_documents.load(Ordering::Relaxed) {
            self.largest_fan_out_documents.store(docs, Ordering::Relaxed);
            self.largest_fan_out_micros.store(elapsed.as_micros() as u64, Ordering::Relaxed);
        }
    }
}
