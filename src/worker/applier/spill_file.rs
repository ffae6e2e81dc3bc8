//! The spilled messages of a partition ([`super::spill`]), first in first
//! out, in a file of their own: an unnamed temporary file (gone with the
//! process), appended to as messages are spilled and read from the front
//! as they are taken back. Writes are gathered in memory up to
//! [`FLUSH_AT`]; reads fetch [`READ_AHEAD`] at a time. The file is emptied
//! whenever every message in it was taken back, so it holds at most what
//! is spilled at once.
//!
//! A record: its length (u32), the offset (i64), the timestamp (a flag
//! byte and i64), the key and the payload (each a length, u32::MAX for
//! none, and the bytes); little-endian.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::Record;

/// Bytes gathered in memory before they are written.
const FLUSH_AT: usize = 256 << 10;

/// Bytes read from the file at a time.
const READ_AHEAD: usize = 1 << 20;

const NONE: u32 = u32::MAX;

/// See the module's doc.
#[derive(Debug, Default)]
pub(super) struct SpillFile {
    /// Created at the first write, in the directory that write names.
    file: Option<File>,
    /// Bytes written to the file.
    written: u64,
    /// Bytes appended after them, not written yet.
    pending: Vec<u8>,
    /// Where the next record starts (counted as `written`, then into
    /// `pending`).
    read: u64,
    /// Bytes read ahead from the file, starting at `read`.
    ahead: VecDeque<u8>,
    /// Records in the file, and the offset of the first.
    count: usize,
    offsets: VecDeque<i64>,
}

impl SpillFile {
    /// Records not taken back.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Bytes of the records not taken back.
    pub fn bytes(&self) -> u64 {
        self.written + self.pending.len() as u64 - self.read
    }

    /// The offset of the oldest record.
    pub fn first(&self) -> Option<i64> {
        self.offsets.front().copied()
    }

    /// Appends `msg`; the file is made in `dir` if it is not yet. An error
    /// writing leaves the record in memory, to be written at the next
    /// append.
    pub fn push(&mut self, msg: &Record, dir: &Path) -> io::Result<()> {
        let start = self.pending.len();
        self.pending.extend_from_slice(&0u32.to_le_bytes());
        self.pending.extend_from_slice(&msg.offset.to_le_bytes());
        match msg.timestamp_ms {
            Some(t) => {
                self.pending.push(1);
                self.pending.extend_from_slice(&t.to_le_bytes());
            }
            None => self.pending.extend_from_slice(&[0; 9]),
        }
        for part in [&msg.key, &msg.payload, &msg.signature] {
            match part {
                Some(b) => {
                    self.pending.extend_from_slice(&(b.len() as u32).to_le_bytes());
                    self.pending.extend_from_slice(b);
                }
                None => self.pending.extend_from_slice(&NONE.to_le_bytes()),
            }
        }
        let len = (self.pending.len() - start - 4) as u32;
        self.pending[start..start + 4].copy_from_slice(&len.to_le_bytes());
        self.count += 1;
        self.offsets.push_back(msg.offset);
        if self.pending.len() >= FLUSH_AT {
            self.flush(dir)?;
        }
        Ok(())
    }

    /// Takes the oldest record back.
    pub fn pop(&mut self) -> io::Result<Option<Record>> {
        if self.count == 0 {
            return Ok(None);
        }
        if let Err(e) = crate::faults::io("spill.read") {
            crate::faults::reached("spill.read");
            return Err(e);
        }
        let len = u32::from_le_bytes(self.bytes_at(4)?.try_into().expect("four bytes")) as usize;
        let body = self.bytes_at(len)?;
        self.count -= 1;
        self.offsets.pop_front();
        if self.count == 0 {
            self.empty()?;
        }
        Ok(Some(decode(&body)))
    }

    /// Forgets every record (the file is emptied).
    pub fn clear(&mut self) -> io::Result<()> {
        self.count = 0;
        self.offsets.clear();
        self.empty()
    }

    fn empty(&mut self) -> io::Result<()> {
        (self.written, self.read) = (0, 0);
        self.pending.clear();
        self.ahead.clear();
        match &self.file {
            Some(f) => f.set_len(0),
            None => Ok(()),
        }
    }

    fn flush(&mut self, dir: &Path) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        if self.file.is_none() {
            std::fs::create_dir_all(dir)?;
            let file = tempfile::tempfile_in(dir)?;
            // Tenants' commands: for the worker's user only (an unnamed
            // file came out 0644 here).
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            self.file = Some(file);
        }
        let file = self.file.as_ref().expect("created");
        file.write_all_at(&self.pending, self.written)?;
        self.written += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    /// The next `n` bytes from `read` on, consumed.
    fn bytes_at(&mut self, n: usize) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            if !self.ahead.is_empty() {
                let take = (n - out.len()).min(self.ahead.len());
                out.extend(self.ahead.drain(..take));
                self.read += take as u64;
                continue;
            }
            if self.read >= self.written {
                // Not written yet: from memory (a record is appended
                // whole, so it is all there).
                let at = (self.read - self.written) as usize;
                let take = n - out.len();
                out.extend_from_slice(&self.pending[at..at + take]);
                self.read += take as u64;
                continue;
            }
            let want = (READ_AHEAD as u64).min(self.written - self.read) as usize;
            let mut buf = vec![0; want];
            self.file.as_ref().expect("written").read_exact_at(&mut buf, self.read)?;
            self.ahead.extend(buf);
        }
        Ok(out)
    }
}

fn decode(b: &[u8]) -> Record {
    let i64_at = |at: usize| i64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"));
    let offset = i64_at(0);
    let timestamp_ms = (b[8] == 1).then(|| i64_at(9));
    let mut at = 17;
    let mut part = || {
        let len = u32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes"));
        at += 4;
        if len == NONE {
            return None;
        }
        let bytes = b[at..at + len as usize].to_vec();
        at += len as usize;
        Some(bytes)
    };
    let key = part();
    let payload = part();
    let signature = part();
    Record { offset, key, payload, timestamp_ms, signature }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(offset: i64, size: usize) -> Record {
        Record {
            offset,
            key: (offset % 3 != 0).then(|| format!("k{offset}").into_bytes()),
            payload: (offset % 5 != 0).then(|| vec![offset as u8; size]),
            timestamp_ms: (offset % 2 == 0).then_some(offset * 1000),
            signature: (offset % 7 == 0).then(|| vec![b'a'; 64]),
        }
    }

    #[test]
    fn records_come_back_in_order_across_writes_reads_and_interleaving() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = SpillFile::default();
        let (mut next_in, mut next_out) = (0i64, 0i64);
        // Sizes that cross FLUSH_AT and READ_AHEAD many times.
        for round in 0..40 {
            for _ in 0..(round * 37 % 300 + 1) {
                f.push(&rec(next_in, (next_in as usize * 7919) % 9000), dir.path()).unwrap();
                next_in += 1;
            }
            assert_eq!(f.first(), Some(next_out));
            for _ in 0..(round * 53 % 250 + 1) {
                let Some(r) = f.pop().unwrap() else { break };
                let want = rec(next_out, (next_out as usize * 7919) % 9000);
                assert_eq!((r.offset, &r.key, &r.payload, r.timestamp_ms), (want.offset, &want.key, &want.payload, want.timestamp_ms));
                next_out += 1;
            }
            assert_eq!(f.len() as i64, next_in - next_out);
        }
        while let Some(r) = f.pop().unwrap() {
            assert_eq!(r.offset, next_out);
            next_out += 1;
        }
        assert_eq!(next_out, next_in);
        assert_eq!(f.bytes(), 0);
        assert!(f.file.is_some(), "the test wrote to the file, not only memory");
        // Without a name, and readable by its owner only.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the spill file has a name in the directory");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(f.file.as_ref().unwrap().metadata().unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(f.file.as_ref().unwrap().metadata().unwrap().len(), 0, "emptied once everything was taken back");
    }

    #[test]
    fn cleared_it_holds_nothing_and_takes_records_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = SpillFile::default();
        for o in 0..1000 {
            f.push(&rec(o, 600), dir.path()).unwrap();
        }
        assert!(f.bytes() > FLUSH_AT as u64);
        f.clear().unwrap();
        assert_eq!((f.len(), f.bytes(), f.first()), (0, 0, None));
        assert!(f.pop().unwrap().is_none());
        f.push(&rec(5000, 10), dir.path()).unwrap();
        assert_eq!(f.pop().unwrap().map(|r| r.offset), Some(5000));
    }
}
