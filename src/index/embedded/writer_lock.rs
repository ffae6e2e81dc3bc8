//! The lock a shard's writer holds beside tantivy's own, taken before the
//! index is opened and released only once the writer's merges have ended.
//!
//! tantivy's lock is taken inside `Index::writer`, after `Index::open`
//! has read the managed-file list: files a dying owner listed in between
//! were dropped from the list the new owner rewrites. And when closing the
//! writer fails (an indexing thread failed), tantivy returns before
//! waiting for its merges, and its lock goes while they run. This lock is
//! taken first, and on such a failure it is kept until the process ends:
//! no owner, in this process or another, opens the shard while merges of
//! the old writer may still write to it.

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::index::IndexError;

/// The lock file's name in a shard directory.
const NAME: &str = "denorm-writer.lock";

/// Shards whose writer closed with merges perhaps running (this process).
static KEPT: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

/// A held writer lock of one shard directory.
#[derive(Debug)]
pub(super) struct WriterLock {
    file: Option<File>,
    dir: PathBuf,
}

impl WriterLock {
    /// Takes the lock of the shard in `dir`: [`IndexError::Locked`] while
    /// another writer holds it; a fatal error when this process kept it
    /// after a writer closed with merges perhaps still running.
    pub fn take(dir: &Path) -> Result<WriterLock, IndexError> {
        if KEPT.lock().expect("kept lock").as_ref().is_some_and(|k| k.contains(dir)) {
            return Err(IndexError::Failed {
                kind: crate::retry::Kind::Fatal,
                source: format!(
                    "shard {} cannot be opened again by this process: its last writer closed with merges perhaps still running (see the error logged then); \
                     the worker stops, and a new process opens it safely",
                    dir.display()
                )
                .into(),
            });
        }
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(NAME))?;
        // Per open file description: excludes other processes and other
        // writers of this one alike; the kernel releases it with the process.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EWOULDBLOCK) => Err(IndexError::Locked(format!("{} is held by another writer", dir.join(NAME).display()))),
                _ => Err(e.into()),
            };
        }
        Ok(WriterLock { file: Some(file), dir: dir.to_path_buf() })
    }

    /// Keeps the lock until the process ends, and refuses any later
    /// [`WriterLock::take`] of this shard by this process.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn keep_until_exit(mut self) {
        KEPT.lock().expect("kept lock").get_or_insert_with(HashSet::new).insert(self.dir.clone());
        if let Some(f) = self.file.take() {
            std::mem::forget(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_writer_is_locked_out_until_the_first_goes() {
        let dir = tempfile::tempdir().unwrap();
        let first = WriterLock::take(dir.path()).unwrap();
        assert!(matches!(WriterLock::take(dir.path()), Err(IndexError::Locked(_))));
        drop(first);
        WriterLock::take(dir.path()).unwrap();
    }

    #[test]
    fn a_lock_kept_until_exit_refuses_this_process_and_locks_out_others() {
        let dir = tempfile::tempdir().unwrap();
        WriterLock::take(dir.path()).unwrap().keep_until_exit();
        let e = WriterLock::take(dir.path()).unwrap_err();
        assert_eq!(e.kind(), crate::retry::Kind::Fatal, "{e}");
        // Another process (flock(1) opens a description of its own).
        let busy = std::process::Command::new("flock").args(["-n", "-E", "75"]).arg(dir.path().join(NAME)).arg("true").status().unwrap();
        assert_eq!(busy.code(), Some(75), "another process took the kept lock");
    }
}
