//! [`EmbeddedIndex`] as a [`Backend`].

use std::collections::HashMap;

use crate::index::{Backend, Checkpoint, IndexError, SearchIndex, Shard, Verified};

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
        EmbeddedBackend {
            index,
            memory_budget,
            fan_out_commit_every: DEFAULT_FAN_OUT_COMMIT_EVERY,
            merge_max_docs: DEFAULT_MERGE_MAX_DOCS,
            pinned: None,
        }
    }
}

impl Backend for EmbeddedBackend {
    fn bind_log(&self, partitions: i32) -> Result<(), IndexError> {
        match self.pinned {
            // A rebuild's generation: the log it is built from is recorded at
            // its cutover.
            Some(_) => Ok(()),
            None => self.index.bind_log(partitions),
        }
    }
    fn checkpoints(&self, partitions: &[i32]) -> Result<HashMap<i32, Checkpoint>, IndexError> {
        self.index.checkpoints_of(self.generation()?, partitions)
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
    fn verified(&self) -> Result<Option<Verified>, IndexError> {
        let path = self.index.root().join(VERIFIED);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| IndexError::Corrupt(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
    fn record_verified(&self, v: &Verified) -> Result<(), IndexError> {
        let json = serde_json::to_vec(v).map_err(|e| IndexError::Backend(e.to_string()))?;
        super::write_atomically(&self.index.root().join(VERIFIED), &json)
    }
}

/// The file of [`Backend::verified`], beside the generations.
const VERIFIED: &str = "VERIFIED";
