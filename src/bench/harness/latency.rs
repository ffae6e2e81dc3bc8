//! The latency phase's measure: when each produced document is first
//! searchable, and the report of the figures.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;

use super::Row;
use crate::index::embedded::EmbeddedIndex;
use crate::index::Kind;

impl Latency {
    /// The latency rows of the table, and the results' `latency`.
    pub(super) fn report(&self, rate: u64, rows: &mut Vec<Row>, results: &mut serde_json::Map<String, serde_json::Value>) {
        rows.push(Row::new(
            format!("produce -> searchable at {}/s: p50 / p99 / max", rate),
            format!("{:.1} / {:.1} / {:.1} ms", self.p50, self.p99, self.max),
            format!(
                "plain consumer p50 / p99 {:.1} / {:.1} ms (producer ack {:.1} / {:.1})",
                self.plain_p50, self.plain_p99, self.ack_p50, self.ack_p99
            ),
            None,
            "p99 <= 100 ms",
        ));
        rows.push(Row::new(
            "  of which after the plain consumer got it: p50 / p99",
            format!("{:.1} / {:.1} ms", self.own_p50, self.own_p99),
            String::new(),
            None,
            "",
        ));
        results.insert("latency".into(), json!({"rate": rate, "commands": self.n, "p50_ms": self.p50, "p90_ms": self.p90, "p99_ms": self.p99, "max_ms": self.max, "achieved_rate": self.achieved_rate, "produce_ack_p50_ms": self.ack_p50, "produce_ack_p99_ms": self.ack_p99, "plain_consumer_p50_ms": self.plain_p50, "plain_consumer_p99_ms": self.plain_p99, "added_p50_ms": self.own_p50, "added_p99_ms": self.own_p99}));
    }
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

/// When each sent document was first found by `probe`; looks `every` so
/// often.
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
        let ids: Vec<String> = waiting.keys().cloned().collect();
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
