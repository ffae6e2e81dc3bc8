//! A shard's directory: tantivy's, with a fault point on every write; the
//! commit payload it records; the committed shards of a generation.

use std::path::{Path, PathBuf};

use tantivy::{Index, IndexReader, ReloadPolicy};

use crate::index::progress::Progress;
use crate::index::{Checkpoint, IndexError};

/// The shard directory, with the `index.io` fault point on every write
/// (inactive unless built with the `failpoints` feature).
#[derive(Debug, Clone)]
pub(super) struct ShardDirectory(pub(super) tantivy::directory::MmapDirectory);

impl tantivy::Directory for ShardDirectory {
    fn get_file_handle(&self, path: &Path) -> Result<std::sync::Arc<dyn tantivy::directory::FileHandle>, tantivy::directory::error::OpenReadError> {
        self.0.get_file_handle(path)
    }
    fn delete(&self, path: &Path) -> Result<(), tantivy::directory::error::DeleteError> {
        self.0.delete(path)
    }
    fn exists(&self, path: &Path) -> Result<bool, tantivy::directory::error::OpenReadError> {
        self.0.exists(path)
    }
    fn open_write(&self, path: &Path) -> Result<tantivy::directory::WritePtr, tantivy::directory::error::OpenWriteError> {
        crate::faults::io("index.io").map_err(|e| tantivy::directory::error::OpenWriteError::wrap_io_error(e, path.to_path_buf()))?;
        self.0.open_write(path)
    }
    fn atomic_read(&self, path: &Path) -> Result<Vec<u8>, tantivy::directory::error::OpenReadError> {
        self.0.atomic_read(path)
    }
    fn atomic_write(&self, path: &Path, data: &[u8]) -> std::io::Result<()> {
        crate::faults::io("index.io")?;
        self.0.atomic_write(path, data)
    }
    fn sync_directory(&self) -> std::io::Result<()> {
        crate::faults::io("index.io")?;
        self.0.sync_directory()
    }
    fn acquire_lock(&self, lock: &tantivy::directory::Lock) -> Result<tantivy::directory::DirectoryLock, tantivy::directory::error::LockError> {
        self.0.acquire_lock(lock)
    }
    fn watch(&self, cb: tantivy::directory::WatchCallback) -> tantivy::Result<tantivy::directory::WatchHandle> {
        self.0.watch(cb)
    }
}

/// The committed shards of a generation directory, by partition: each
/// `p<N>` with a `meta.json` (a shard being created by its first owner has
/// none yet). None when the directory does not exist yet.
pub(super) fn committed_shards(generation_dir: &Path) -> Result<Vec<(i32, PathBuf)>, IndexError> {
    let Ok(dirs) = std::fs::read_dir(generation_dir) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for entry in dirs {
        let dir = entry?.path();
        let partition = dir.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_prefix('p')).and_then(|n| n.parse::<i32>().ok());
        if let Some(partition) = partition.filter(|_| dir.join("meta.json").exists()) {
            out.push((partition, dir));
        }
    }
    out.sort();
    Ok(out)
}

/// The progress a shard's last commit recorded (its payload, in the form
/// every backend shares: [`Progress::to_json`]).
pub(super) fn committed_progress(index: &Index) -> Result<Progress, IndexError> {
    let payload = index.load_metas()?.payload;
    Ok(payload.and_then(|p| serde_json::from_str::<serde_json::Value>(&p).ok()).map(|v| Progress::from_json(&v)).unwrap_or_default())
}

/// The checkpoint a committed shard directory records.
pub(super) fn shard_checkpoint(dir: &Path) -> Result<Option<Checkpoint>, IndexError> {
    Ok(shard_progress(dir)?.checkpoint)
}

/// The progress a committed shard directory records.
pub(super) fn shard_progress(dir: &Path) -> Result<Progress, IndexError> {
    committed_progress(&Index::open_in_dir(dir)?)
}

/// A reader of a shard directory, reloaded only when asked.
pub(super) fn open_reader(dir: &Path) -> Result<IndexReader, IndexError> {
    Ok(Index::open_in_dir(dir)?.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?)
}
