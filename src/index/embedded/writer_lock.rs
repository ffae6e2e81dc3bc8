//! The lock a shard's writer holds beside tantivy's own, taken before the
//! index is opened and released only once the writer's merges have ended
//! or its directory is closed to them (`directory.rs`, the fence).
//!
//! tantivy's lock is taken inside `Index::writer`, after `Index::open`
//! has read the managed-file list: files a dying owner listed in between
//! were dropped from the list the new owner rewrites. And when closing the
//! writer fails (an indexing thread failed), tantivy returns before
//! waiting for its merges, and its lock goes while they run. This lock is
//! taken first and released last.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::index::IndexError;

/// The lock file's name in a shard directory.
const NAME: &str = "denorm-writer.lock";

/// A held writer lock of one shard directory.
#[derive(Debug)]
pub(super) struct WriterLock {
    /// Released by the kernel as it is closed.
    _file: File,
}

impl WriterLock {
    /// Takes the lock of the shard in `dir`: [`IndexError::Locked`] while
    /// another writer holds it.
    pub fn take(dir: &Path) -> Result<WriterLock, IndexError> {
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
        Ok(WriterLock { _file: file })
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
}
