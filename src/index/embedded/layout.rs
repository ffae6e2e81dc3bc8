//! The index directory: its marker (topic, partition count), generations
//! and `CURRENT`, shard directories and their checkpoints, and the owner
//! audit across shards.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tantivy::collector::Count;
use tantivy::query::TermQuery;
use tantivy::schema::IndexRecordOption;
use tantivy::{Index, ReloadPolicy, Searcher, Term};

use crate::domain::Domain;
use crate::index::{Checkpoint, IndexError};

use super::directory::{committed_shards, open_reader, shard_checkpoint};
use super::schema::schema;
use super::search::EmbeddedSearch;
use super::shard::EmbeddedShard;

pub(super) const MARKER: &str = "denorm-index.json";
pub(super) const CURRENT: &str = "CURRENT";

#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Marker {
    format: u32,
    topic: String,
    /// The topic's partition count when the index was first run against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    partitions: Option<i32>,
}

/// What `CURRENT` holds since rebuilds record the log there: the current
/// generation and the log it was built from, switched together by one
/// rename. (Earlier builds wrote the generation's number alone, and the log
/// in the marker.)
#[derive(serde::Serialize, serde::Deserialize)]
struct Current {
    generation: u64,
    topic: String,
    partitions: i32,
}

/// Replaces `path` with `data` at once: each writer writes its own temporary
/// file and renames it into place, so readers and concurrent writers only
/// ever see a whole file.
pub fn write_atomically(path: &Path, data: &[u8]) -> Result<(), IndexError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = path.with_file_name(format!("{name}.{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&tmp, data)?;
    std::fs::rename(tmp, path)?;
    Ok(())
}

/// An embedded index directory.
#[derive(Debug, Clone)]
pub struct EmbeddedIndex {
    root: PathBuf,
    /// The topic this handle works on, when it writes (checked against the
    /// marker by [`EmbeddedIndex::bind_log`]).
    topic: Option<String>,
    /// The declared model whose documents the shards hold beside the
    /// compiled-in kinds ([`EmbeddedIndex::with_model`]).
    model: Option<&'static Domain>,
}

impl EmbeddedIndex {
    /// Opens (creating when missing) the index directory for `topic`, and
    /// refuses one that belongs to another topic.
    pub fn open(root: &Path, topic: &str) -> Result<Self, IndexError> {
        std::fs::create_dir_all(root)?;
        let index = EmbeddedIndex { root: root.to_path_buf(), topic: Some(topic.into()), model: None };
        match index.marker().and_then(|m| index.binding_of(m)) {
            Ok(m) if m.topic != topic => Err(IndexError::WrongTopic { path: root.display().to_string(), found: m.topic, expected: topic.into() }),
            Ok(_) => Ok(index),
            Err(IndexError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                // Several workers may create the index at once.
                index.write_marker(&Marker { format: 1, topic: topic.into(), partitions: None })?;
                Ok(index)
            }
            Err(e) => Err(e),
        }
    }

    fn marker(&self) -> Result<Marker, IndexError> {
        let path = self.root.join(MARKER);
        let text = std::fs::read_to_string(&path)?;
        serde_json::from_str(&text).map_err(|e| IndexError::Corrupt(format!("{}: {e}", path.display())))
    }

    /// The log the current generation was built from: what `CURRENT`
    /// records, else the marker's.
    fn binding_of(&self, marker: Marker) -> Result<Marker, IndexError> {
        Ok(match self.current()? {
            Some(Ok(c)) => Marker { format: marker.format, topic: c.topic, partitions: Some(c.partitions) },
            _ => marker,
        })
    }

    fn binding(&self) -> Result<Marker, IndexError> {
        self.binding_of(self.marker()?)
    }

    /// What `CURRENT` holds: `None` when it does not exist, `Err(n)` when
    /// it holds a generation's number alone.
    fn current(&self) -> Result<Option<Result<Current, u64>>, IndexError> {
        let path = self.root.join(CURRENT);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let corrupt = |e: &dyn std::fmt::Display| IndexError::Corrupt(format!("{}: {e}", path.display()));
        match text.trim_start().starts_with('{') {
            true => serde_json::from_str(&text).map(|c| Some(Ok(c))).map_err(|e| corrupt(&e)),
            false => text.trim().parse().map(|n| Some(Err(n))).map_err(|e| corrupt(&e)),
        }
    }

    fn write_marker(&self, m: &Marker) -> Result<(), IndexError> {
        write_atomically(&self.root.join(MARKER), &serde_json::to_vec(m).expect("json"))
    }

    /// Opens (creating when missing) the index directory to rebuild it from
    /// `topic`, which may differ from the topic it was built from so far
    /// (after `denorm migrate`): the cutover records the new one.
    pub fn open_for_rebuild(root: &Path, topic: &str) -> Result<Self, IndexError> {
        match Self::open(root, topic) {
            Err(IndexError::WrongTopic { .. }) => Ok(EmbeddedIndex { root: root.to_path_buf(), topic: Some(topic.into()), model: None }),
            other => other,
        }
    }

    /// Records the topic's partition count in the marker the first time,
    /// and refuses a different count afterwards (see [`Backend::bind_log`]).
    pub fn bind_log(&self, partitions: i32) -> Result<(), IndexError> {
        let m = self.binding()?;
        if let Some(topic) = self.topic.as_ref().filter(|t| **t != m.topic) {
            // A rebuild from another topic (after `denorm migrate`) cut over.
            return Err(IndexError::WrongTopic { path: self.root.display().to_string(), found: m.topic, expected: topic.clone() });
        }
        match m.partitions {
            Some(recorded) if recorded == partitions => Ok(()),
            Some(recorded) => Err(IndexError::partitions_changed(recorded, partitions)),
            // Never rebuilt: the first worker records the count.
            None => {
                let mut marker = self.marker()?;
                marker.partitions = Some(partitions);
                self.write_marker(&marker)
            }
        }
    }

    /// The topic the current generation is built from.
    pub fn recorded_topic(&self) -> Result<String, IndexError> {
        Ok(self.binding()?.topic)
    }

    /// That topic's partition count, once a worker recorded it.
    pub fn recorded_partitions(&self) -> Result<Option<i32>, IndexError> {
        Ok(self.binding()?.partitions)
    }

    /// Switches searches and live workers to `generation`, built from this
    /// handle's topic with `partitions`: one atomic rename of `CURRENT`,
    /// which records both (a crash leaves the old generation and its log,
    /// or the new ones, never a mix).
    pub fn cut_over_to(&self, generation: u64, partitions: i32) -> Result<(), IndexError> {
        let topic = match &self.topic {
            Some(t) => t.clone(),
            None => self.recorded_topic()?,
        };
        let c = Current { generation, topic, partitions };
        write_atomically(&self.root.join(CURRENT), &serde_json::to_vec(&c).expect("json"))
    }

    /// How many of `generation`'s shards a writer holds right now (tried
    /// through tantivy's writer lock, released at once).
    pub fn writers_held(&self, generation: u64) -> Result<usize, IndexError> {
        let mut held = 0;
        let Ok(dirs) = std::fs::read_dir(self.generation_dir(generation)) else { return Ok(0) };
        for e in dirs {
            let dir = e?.path();
            let directory = tantivy::directory::MmapDirectory::open(&dir).map_err(|e| IndexError::Backend(e.to_string()))?;
            match tantivy::Directory::acquire_lock(&directory, &tantivy::directory::INDEX_WRITER_LOCK) {
                Ok(_lock) => {}
                Err(tantivy::directory::error::LockError::LockBusy) => held += 1,
                Err(e) => return Err(IndexError::Backend(format!("{}: {e}", dir.display()))),
            }
        }
        Ok(held)
    }

    /// Opens an index directory that must already exist (for searches).
    pub fn open_existing(root: &Path) -> Result<Self, IndexError> {
        if !root.join(MARKER).exists() {
            return Err(IndexError::Io(std::io::Error::new(std::io::ErrorKind::NotFound, format!("no denorm index at {} (run `denorm run` or `denorm demo` first, or pass --index)", root.display()))));
        }
        Ok(EmbeddedIndex { root: root.to_path_buf(), topic: None, model: None })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file of record `name` beside the generations: the name in
    /// capitals (`verified` is `VERIFIED`, `rebuild-member-1` is
    /// `REBUILD-MEMBER-1`).
    fn record_path(&self, name: &str) -> std::path::PathBuf {
        self.root.join(name.to_uppercase())
    }

    /// A small JSON record kept beside the generations (see
    /// [`crate::index::Backend::record`]).
    pub fn record(&self, name: &str) -> Result<Option<serde_json::Value>, IndexError> {
        let path = self.record_path(name);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| IndexError::Corrupt(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes a record whole or not at all.
    pub fn save_record(&self, name: &str, v: &serde_json::Value) -> Result<(), IndexError> {
        let json = serde_json::to_vec(v).map_err(|e| IndexError::Backend(e.to_string()))?;
        write_atomically(&self.record_path(name), &json)
    }

    pub fn clear_record(&self, name: &str) -> Result<(), IndexError> {
        match std::fs::remove_file(self.record_path(name)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => Ok(other?),
        }
    }

    /// The generation searches and live workers use: the number in
    /// `CURRENT`, 0 (the `shards` directory) when there is none. `denorm
    /// rebuild` builds the next generation beside it and switches `CURRENT`
    /// with one atomic rename.
    pub fn current_generation(&self) -> Result<u64, IndexError> {
        Ok(match self.current()? {
            None => 0,
            Some(Ok(c)) => c.generation,
            Some(Err(n)) => n,
        })
    }

    /// Makes `generation` the one searches and live workers use, keeping
    /// the recorded log (tests; a rebuild uses [`Self::cut_over_to`]).
    pub fn set_current_generation(&self, generation: u64) -> Result<(), IndexError> {
        match self.current()? {
            Some(Ok(c)) => write_atomically(&self.root.join(CURRENT), &serde_json::to_vec(&Current { generation, ..c }).expect("json")),
            _ => write_atomically(&self.root.join(CURRENT), generation.to_string().as_bytes()),
        }
    }

    /// The directory of `generation`'s shards.
    pub fn generation_dir(&self, generation: u64) -> PathBuf {
        match generation {
            0 => self.root.join("shards"),
            g => self.root.join("generations").join(g.to_string()),
        }
    }

    /// Every generation with a directory, in order.
    pub fn generations(&self) -> Result<Vec<u64>, IndexError> {
        let mut out = vec![];
        if self.root.join("shards").is_dir() {
            out.push(0);
        }
        if let Ok(dirs) = std::fs::read_dir(self.root.join("generations")) {
            for e in dirs {
                if let Some(g) = e?.file_name().to_str().and_then(|n| n.parse().ok()) {
                    out.push(g);
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    pub(crate) fn shard_dir(&self, generation: u64, partition: i32) -> PathBuf {
        self.generation_dir(generation).join(format!("p{partition:04}"))
    }

    /// Opens the writer of `partition`'s shard in the current generation.
    /// Fails with [`IndexError::Locked`] while another process or thread
    /// owns it.
    pub fn open_shard(&self, partition: i32, memory_budget: usize) -> Result<EmbeddedShard, IndexError> {
        self.open_shard_in(self.current_generation()?, partition, memory_budget)
    }

    /// [`EmbeddedIndex::open_shard`] in `generation`.
    pub fn open_shard_in(&self, generation: u64, partition: i32, memory_budget: usize) -> Result<EmbeddedShard, IndexError> {
        self.check_model(generation, true)?;
        EmbeddedShard::open(&self.shard_dir(generation, partition), self.generation_dir(generation), generation, partition, memory_budget, self.model)
    }

    /// This handle for the documents of `model` (`None`: the compiled-in
    /// kinds only). Each generation records the model it was first written
    /// with; a writer or a reader with another is refused.
    pub fn with_model(mut self, model: Option<&'static Domain>) -> Self {
        self.model = model;
        self
    }

    /// Refuses a current generation written with another model than this
    /// handle's; `record` (a writer, as it starts): records this handle's
    /// in one that has none yet.
    pub fn check_current_model(&self, record: bool) -> Result<(), IndexError> {
        self.check_model(self.current_generation()?, record)
    }

    /// Refuses a generation written with another model than this handle's;
    /// `record`: a writer's, which records its model in a generation that
    /// has none yet.
    pub fn check_model(&self, generation: u64, record: bool) -> Result<(), IndexError> {
        let name = format!("model-g{generation}");
        let held = self.record(&name)?;
        let written = held.is_none() && self.model.is_some() && !committed_shards(&self.generation_dir(generation))?.is_empty();
        match crate::index::recorded_model::decide(&self.root.display().to_string(), generation, held.as_ref(), self.model, written, record)? {
            crate::index::recorded_model::Decision::Agrees => Ok(()),
            crate::index::recorded_model::Decision::Record(ours) => self.save_record(&name, &ours),
        }
    }

    /// A read-only view of every shard of the current generation, as
    /// committed so far.
    pub fn search(&self) -> Result<EmbeddedSearch, IndexError> {
        self.search_in(self.current_generation()?)
    }

    /// A read view of generation `g`.
    pub fn search_in(&self, g: u64) -> Result<EmbeddedSearch, IndexError> {
        if self.model.is_some() || self.record(&format!("model-g{g}"))?.is_some() {
            self.check_model(g, false)?;
        }
        let mut shards = Vec::new();
        for (_, dir) in committed_shards(&self.generation_dir(g))? {
            let index = Index::open_in_dir(&dir)?;
            let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?;
            shards.push((index, reader));
        }
        Ok(EmbeddedSearch::over(shards, self.model))
    }
}

impl EmbeddedIndex {
    /// Documents that more than one partition's shard of the current
    /// generation holds, as committed: `("kind:id", partitions)`. A
    /// document has one owner key, so this is an owner change written
    /// without its explicit form (docs/cross-key.md), or a move caught
    /// between its two sides. Reads every shard's `doc_key` terms once,
    /// merged in order, and checks the few found in several shards for a
    /// live document (deleted documents keep their terms until a merge).
    pub fn held_by_several_partitions(&self) -> Result<Vec<(String, Vec<i32>)>, IndexError> {
        use std::cmp::Reverse;
        let f = schema(None).1;
        let mut shards: Vec<(i32, Searcher)> = Vec::new();
        for (partition, dir) in committed_shards(&self.generation_dir(self.current_generation()?))? {
            shards.push((partition, open_reader(&dir)?.searcher()));
        }
        let mut inverted = Vec::new();
        for (i, (_, searcher)) in shards.iter().enumerate() {
            for segment in searcher.segment_readers() {
                inverted.push((i, segment.inverted_index(f.doc_key)?));
            }
        }
        let mut streams = Vec::with_capacity(inverted.len());
        for (i, ii) in &inverted {
            streams.push((*i, ii.terms().stream()?));
        }
        let mut heap = std::collections::BinaryHeap::new();
        for (k, (_, stream)) in streams.iter_mut().enumerate() {
            if stream.advance() {
                heap.push(Reverse((stream.key().to_vec(), k)));
            }
        }
        let mut out = Vec::new();
        while let Some(Reverse((key, k))) = heap.pop() {
            let mut holders = vec![streams[k].0];
            let mut next = vec![k];
            while heap.peek().is_some_and(|Reverse((other, _))| *other == key) {
                let Reverse((_, j)) = heap.pop().expect("peeked");
                holders.push(streams[j].0);
                next.push(j);
            }
            for j in next {
                if streams[j].1.advance() {
                    heap.push(Reverse((streams[j].1.key().to_vec(), j)));
                }
            }
            holders.sort_unstable();
            holders.dedup();
            if holders.len() < 2 {
                continue;
            }
            let key = String::from_utf8_lossy(&key).into_owned();
            let query = TermQuery::new(Term::from_field_text(f.doc_key, &key), IndexRecordOption::Basic);
            let mut live = Vec::new();
            for i in holders {
                if shards[i].1.search(&query, &Count)? > 0 {
                    live.push(shards[i].0);
                }
            }
            if live.len() > 1 {
                live.sort_unstable();
                out.push((key, live));
            }
        }
        Ok(out)
    }

    /// The checkpoint of each partition's shard, as of its last commit
    /// (shards never committed are left out).
    pub fn checkpoints(&self) -> Result<std::collections::BTreeMap<i32, Checkpoint>, IndexError> {
        self.checkpoints_in(self.current_generation()?)
    }

    /// [`EmbeddedIndex::checkpoints`] of `generation` (empty when it has no
    /// shards yet).
    pub fn checkpoints_in(&self, generation: u64) -> Result<std::collections::BTreeMap<i32, Checkpoint>, IndexError> {
        let mut out = std::collections::BTreeMap::new();
        for (p, dir) in committed_shards(&self.generation_dir(generation))? {
            if let Some(c) = shard_checkpoint(&dir)? {
                out.insert(p, c);
            }
        }
        Ok(out)
    }

    /// [`EmbeddedIndex::checkpoints_in`] of `partitions` only.
    pub fn checkpoints_of(&self, generation: u64, partitions: &[i32]) -> Result<HashMap<i32, Checkpoint>, IndexError> {
        Ok(crate::index::progress::checkpoints(self.applied_of(generation, partitions)?))
    }

    /// What the shards of `partitions` that have a checkpoint record
    /// applied (what a waiting take-over polls).
    pub fn applied_of(&self, generation: u64, partitions: &[i32]) -> Result<HashMap<i32, crate::index::progress::Applied>, IndexError> {
        let mut out = HashMap::new();
        for &p in partitions {
            let dir = self.shard_dir(generation, p);
            if dir.join("meta.json").exists() {
                let progress = super::directory::shard_progress(&dir)?;
                if progress.checkpoint.is_some() {
                    out.insert(p, crate::index::progress::Applied::of(&progress));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_writer_of_a_shard_is_locked_out() {
        let dir = tempfile::tempdir().unwrap();
        let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
        let _owner = idx.open_shard(3, 20_000_000).unwrap();
        assert!(matches!(idx.open_shard(3, 20_000_000), Err(IndexError::Locked(_))));
    }

    #[test]
    fn concurrent_opens_of_a_new_index_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let p = dir.path().to_path_buf();
                std::thread::spawn(move || EmbeddedIndex::open(&p, "t").map(|_| ()))
            })
            .collect();
        for h in handles {
            h.join().unwrap().unwrap();
        }
    }

    #[test]
    fn refuses_an_index_of_another_topic() {
        let dir = tempfile::tempdir().unwrap();
        EmbeddedIndex::open(dir.path(), "a").unwrap();
        assert!(matches!(EmbeddedIndex::open(dir.path(), "b"), Err(IndexError::WrongTopic { .. })));
    }
}
