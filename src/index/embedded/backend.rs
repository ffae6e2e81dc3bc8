//! [`EmbeddedIndex`] as a [`Backend`].

use std::collections::HashMap;

use crate::index::{Backend, Checkpoint, IndexError, SearchIndex, Shard};

use super::layout::EmbeddedIndex;
use super::shard::{DEFAULT_FAN_OUT_COMMIT_EVERY, DEFAULT_MERGE_MAX_DOCS};

/// [`EmbeddedIndex`] as a [`Backend`] with a fixed writer memory budget.
#[derive(Debug, Clone)]
pub struct EmbeddedBackend {
    pub index: EmbeddedIndex,
    pub memory_budget: usize,
    /// A fan-out commits its progress after this many rewritten documents
    /// (see [`EmbeddedShard::set_fan_out_commit_every`]).
    pub fan_out_commit_every: u64,
    /// Bound of a shard's segment merges (see
    /// [`EmbeddedShard::set_merge_max_docs`]).
    pub merge_max_docs: u32,
    /// Writes go to this generation (a rebuild's) instead of the current one.
    pub pinned: Option<u64>,
}

impl EmbeddedBackend {
    pub fn new(index: EmbeddedIndex, memory_budget: usize) -> Self {
        EmbeddedBackend { index, memory_budget, fan_out_commit_every: DEFAULT_FAN_OUT_COMMIT_EVERY, merge_max_docs: DEFAULT_MERGE_MAX_DOCS, pinned: None }
    }
}

impl Backend for EmbeddedBackend {
    fn bind_log(&self, partitions: i32) -> Result<(), IndexError> {
        match self.pinned {
            // A rebuild's generation: the log it is built from is recorded at
            // its cutover.
            Some(_) => Ok(()),
            None => {
                self.index.check_current_model(false)?;
                self.index.bind_log(partitions)
            }
        }
    }
    fn checkpoints(&self, partitions: &[i32]) -> Result<HashMap<i32, Checkpoint>, IndexError> {
        self.index.checkpoints_of(self.generation()?, partitions)
    }
    fn applied(&self, partitions: &[i32]) -> Result<HashMap<i32, crate::index::progress::Applied>, IndexError> {
        self.index.applied_of(self.generation()?, partitions)
    }
    fn generation(&self) -> Result<u64, IndexError> {
        match self.pinned {
            Some(g) => Ok(g),
            None => self.index.current_generation(),
        }
    }
    fn open_shard(&self, partition: i32) -> Result<Box<dyn Shard + Send>, IndexError> {
        let mut shard = self.index.open_shard_in(self.generation()?, partition, self.memory_budget)?;
        shard.set_fan_out_commit_every(self.fan_out_commit_every);
        shard.set_merge_max_docs(self.merge_max_docs);
        Ok(Box::new(shard))
    }
    fn search(&self) -> Result<Box<dyn SearchIndex>, IndexError> {
        Ok(Box::new(self.index.search_in(self.generation()?)?))
    }
    fn record(&self, name: &str) -> Result<Option<serde_json::Value>, IndexError> {
        self.index.record(name)
    }
    fn save_record(&self, name: &str, v: &serde_json::Value) -> Result<(), IndexError> {
        self.index.save_record(name, v)
    }
}
