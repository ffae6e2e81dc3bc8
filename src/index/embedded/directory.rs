//! A shard's directory: tantivy's, closed to a writer's threads once it
//! is let go, with a fault point on every write; the
//! commit payload it records; the committed shards of a generation.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tantivy::{Index, IndexReader, ReloadPolicy};

use crate::index::progress::Progress;
use crate::index::{Checkpoint, IndexError};

/// The shard directory of one writer, with the `index.io` fault point on
/// every write (inactive unless built with the `failpoints` feature), and
/// its [`Fence`]: once the writer is let go, none of its threads writes,
/// deletes or syncs anything more.
#[derive(Debug, Clone)]
pub(super) struct ShardDirectory {
    inner: tantivy::directory::MmapDirectory,
    fence: Arc<Fence>,
}

impl ShardDirectory {
    pub(super) fn new(inner: tantivy::directory::MmapDirectory, fence: Arc<Fence>) -> Self {
        ShardDirectory { inner, fence }
    }
}

/// What closes a writer's directory to writes for good: tantivy's close
/// returns before waiting for the merges when an indexing thread failed,
/// and those merges would go on writing files, the managed-file list and
/// deletions under the shard's next writer. Each write holds the fence
/// open while it runs; [`Fence::close`] waits for those running, and
/// every later one fails.
#[derive(Debug, Default)]
pub(super) struct Fence(RwLock<bool>);

impl Fence {
    /// Runs `op` unless the fence is closed, holding it open meanwhile.
    fn pass<T>(&self, op: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
        let closed = self.0.read().unwrap_or_else(|e| e.into_inner());
        if *closed {
            return Err(std::io::Error::other("the shard's writer was let go: its directory takes no more writes"));
        }
        op()
    }

    /// Closes the fence, once every write running has ended.
    pub(super) fn close(&self) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = true;
    }

    #[cfg(test)]
    pub(super) fn is_closed(&self) -> bool {
        *self.0.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// A file being written through a [`ShardDirectory`]: each write passes
/// its fence.
struct FencedWrite {
    inner: Box<dyn tantivy::directory::TerminatingWrite>,
    fence: Arc<Fence>,
}

impl std::io::Write for FencedWrite {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let (inner, fence) = (&mut self.inner, &self.fence);
        fence.pass(|| inner.write(buf))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let (inner, fence) = (&mut self.inner, &self.fence);
        fence.pass(|| inner.flush())
    }
}

impl tantivy::directory::TerminatingWrite for FencedWrite {
    fn terminate_ref(&mut self, token: tantivy::directory::AntiCallToken) -> std::io::Result<()> {
        let (inner, fence) = (&mut self.inner, &self.fence);
        fence.pass(|| inner.terminate_ref(token))
    }
}

impl tantivy::Directory for ShardDirectory {
    fn get_file_handle(&self, path: &Path) -> Result<Arc<dyn tantivy::directory::FileHandle>, tantivy::directory::error::OpenReadError> {
        self.inner.get_file_handle(path)
    }
    fn delete(&self, path: &Path) -> Result<(), tantivy::directory::error::DeleteError> {
        let refused = |e| tantivy::directory::error::DeleteError::IoError { io_error: Arc::new(e), filepath: path.to_path_buf() };
        self.fence.pass(|| Ok(self.inner.delete(path))).map_err(refused)?
    }
    fn exists(&self, path: &Path) -> Result<bool, tantivy::directory::error::OpenReadError> {
        self.inner.exists(path)
    }
    fn open_write(&self, path: &Path) -> Result<tantivy::directory::WritePtr, tantivy::directory::error::OpenWriteError> {
        use tantivy::directory::error::OpenWriteError;
        let refused = |e| OpenWriteError::wrap_io_error(e, path.to_path_buf());
        let opened = self.fence.pass(|| crate::faults::io("index.io").map(|()| self.inner.open_write(path))).map_err(refused)?;
        let file = opened?.into_inner().map_err(|e| refused(e.into_error()))?;
        Ok(std::io::BufWriter::new(Box::new(FencedWrite { inner: file, fence: self.fence.clone() })))
    }
    fn atomic_read(&self, path: &Path) -> Result<Vec<u8>, tantivy::directory::error::OpenReadError> {
        self.inner.atomic_read(path)
    }
    fn atomic_write(&self, path: &Path, data: &[u8]) -> std::io::Result<()> {
        self.fence.pass(|| {
            crate::faults::io("index.io")?;
            self.inner.atomic_write(path, data)
        })
    }
    fn sync_directory(&self) -> std::io::Result<()> {
        self.fence.pass(|| {
            crate::faults::io("index.io")?;
            self.inner.sync_directory()
        })
    }
    fn acquire_lock(&self, lock: &tantivy::directory::Lock) -> Result<tantivy::directory::DirectoryLock, tantivy::directory::error::LockError> {
        self.inner.acquire_lock(lock)
    }
    fn watch(&self, cb: tantivy::directory::WatchCallback) -> tantivy::Result<tantivy::directory::WatchHandle> {
        self.inner.watch(cb)
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use tantivy::directory::TerminatingWrite;
    use tantivy::Directory;

    use super::*;

    /// Once closed, the fence refuses every write, delete and sync of the
    /// writer's directory, of files opened before as well; reads go on.
    #[test]
    fn a_closed_fence_refuses_every_write_of_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let fence = Arc::new(Fence::default());
        let d = ShardDirectory::new(tantivy::directory::MmapDirectory::open(dir.path()).unwrap(), fence.clone());
        d.atomic_write(Path::new("kept"), b"1").unwrap();
        let mut open = d.open_write(Path::new("open")).unwrap();
        open.write_all(b"before").unwrap();
        open.flush().unwrap();
        fence.close();
        assert!(open.write_all(&[0; 1 << 16]).is_err(), "a file opened before wrote after the close");
        assert!(open.terminate().is_err());
        assert!(d.open_write(Path::new("new")).is_err());
        assert!(d.atomic_write(Path::new("kept"), b"2").is_err());
        assert!(d.delete(Path::new("kept")).is_err());
        assert!(d.sync_directory().is_err());
        assert_eq!(d.atomic_read(Path::new("kept")).unwrap(), b"1");
        assert!(!dir.path().join("new").exists());
    }
}
