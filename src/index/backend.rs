//! What an index backend offers the worker and the commands: shard
//! writers, a read view, the checkpoints and records kept with the index.

use serde::Serialize;

use super::{progress, Checkpoint, IndexError, SearchIndex, Shard};

/// An index backend: hands out shard writers and a read view.
pub trait Backend: Send + Sync {
    /// Records the partition count of the topic the index is built from, or
    /// checks it against the one recorded: a topic whose partitions were
    /// added moves keys between partitions, and so between shards
    /// ([`IndexError::LogMismatch`]). The current generation must hold this
    /// handle's model too: after a rebuild's change of model, a worker of
    /// the old one is refused the new generation.
    fn bind_log(&self, partitions: i32) -> Result<(), IndexError>;
    /// The durable checkpoint of each of `partitions`' shards that has one,
    /// read without taking the writer (a worker positions its consumer there
    /// when it is assigned a partition).
    fn checkpoints(&self, partitions: &[i32]) -> Result<std::collections::HashMap<i32, Checkpoint>, IndexError>;
    /// What each of `partitions`' shards that has a checkpoint records
    /// applied: the checkpoint and what is done above it (issue 45), read
    /// like [`Backend::checkpoints`]. By default the checkpoints alone.
    fn applied(&self, partitions: &[i32]) -> Result<std::collections::HashMap<i32, progress::Applied>, IndexError> {
        Ok(self.checkpoints(partitions)?.into_iter().map(|(p, c)| (p, progress::Applied { checkpoint: Some(c), done: Default::default() })).collect())
    }
    /// The generation new shard writers belong to: a worker whose shard is
    /// of another generation moves to this one (see `denorm rebuild`).
    fn generation(&self) -> Result<u64, IndexError> {
        Ok(0)
    }
    /// The writer of `partition`'s shard. Fails with a retryable error while
    /// another owner still holds it.
    fn open_shard(&self, partition: i32) -> Result<Box<dyn Shard + Send>, IndexError>;
    /// A read view of everything committed so far (of the generation a
    /// rebuild's backend is pinned to, or the current one).
    fn search(&self) -> Result<Box<dyn SearchIndex>, IndexError>;
    /// Whether a shard's commit is requests to a server that every shard
    /// and tenant share (Elasticsearch), rather than local work: more,
    /// smaller commits there take from what the others get of it, so the
    /// worker's commits beside a flooding tenant are off by default
    /// ([`crate::worker::WorkerConfig::tenant_commit`]).
    fn commits_are_shared(&self) -> bool {
        false
    }
    /// A small JSON record kept with the index (a file beside the embedded
    /// index's generations, a meta document on Elasticsearch): what the
    /// last `denorm verify` found, a rebuild's state. `None`: none yet, or
    /// a backend that keeps no records.
    fn record(&self, _name: &str) -> Result<Option<serde_json::Value>, IndexError> {
        Ok(None)
    }
    /// Writes a record whole.
    fn save_record(&self, _name: &str, _v: &serde_json::Value) -> Result<(), IndexError> {
        Ok(())
    }
    /// What the last whole `denorm verify` of this index found.
    fn verified(&self) -> Result<Option<Verified>, IndexError> {
        self.verified_of(false)
    }
    /// What the last whole verify, or the last partial one (`--keys`,
    /// `--sample`), found.
    fn verified_of(&self, partial: bool) -> Result<Option<Verified>, IndexError> {
        let v = self.record(verified_record(partial))?;
        v.map(|v| serde_json::from_value(v).map_err(|e| IndexError::Corrupt(format!("the record of the last verify: {e}")))).transpose()
    }
}

/// The record of [`Backend::verified`].
pub const VERIFIED_RECORD: &str = "verified";
/// The record of the last partial verify's verdict (`--keys`, `--sample`):
/// a partial verify never overwrites the whole one's (review of verify,
/// F8). The workers export both, with `scope`.
pub const VERIFIED_PARTIAL_RECORD: &str = "verified-partial";

/// The record of a whole verify's verdict, or of a partial one's.
pub fn verified_record(partial: bool) -> &'static str {
    match partial {
        false => VERIFIED_RECORD,
        true => VERIFIED_PARTIAL_RECORD,
    }
}

/// What the last `denorm verify` of an index found: kept with the index (a
/// file beside the embedded index's generations, a meta document on
/// Elasticsearch), and exported by the workers as the `denorm_verify_*`
/// gauges (a verify's own process is short-lived and not scraped).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Verified {
    /// When it finished, seconds since the Unix epoch.
    pub finished_at: f64,
    /// Documents compared.
    pub checked: u64,
    /// Documents that differed (with `--repair`: those left after it).
    pub differences: u64,
    pub seconds: f64,
    /// When a verify last found no difference (this one or an earlier one).
    pub last_clean_at: Option<f64>,
    /// Whether it verified some keys only (`--keys`, `--sample`).
    pub partial: bool,
    /// Documents not compared: written after the verify's offsets, and
    /// lacking in a partition that moved on (review of verify, F7: a run
    /// that compared little is told from one that compared all). 0 in
    /// records of earlier versions.
    #[serde(default)]
    pub written_since: u64,
    #[serde(default)]
    pub unsettled: u64,
}
