//! The move protocol's message: a chunk of the documents a cross-key rename
//! hands to its destination (`schemas/move.avsc`), and how a source cuts
//! them into chunks. The rules a destination applies them by are in
//! [`crate::moves`].

use super::path;

/// A chunk of a move's documents, keyed by the destination key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveIn {
    pub move_id: String,
    pub source_partition: i32,
    pub source_offset: i64,
    pub from: String,
    pub to: String,
    pub chunk: i32,
    pub last: bool,
    pub issued_at: i64,
    pub files: Vec<MovedFile>,
    /// On a last chunk only (which then carries no files): the source gave
    /// this attempt of the move up after writing some of its chunks.
    pub aborted: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedFile {
    pub id: String,
    /// Full path at the destination.
    pub path: String,
    pub contents: String,
}

impl MoveIn {
    /// The message key: the destination's top-level directory.
    pub fn key(&self) -> &str {
        path::top_level(&self.to)
    }

    /// Checks the paths: `to` and every file valid, every file beneath `to`
    /// (the paths and ids are scoped to their tenant, one tenant for all).
    pub fn validate(&self) -> Result<(), super::CommandError> {
        super::tenant::validate_path("from", &self.from)?;
        super::tenant::validate_path("to", &self.to)?;
        if super::tenant::of(&self.from) != super::tenant::of(&self.to) {
            let (tenant, other) = (super::tenant::of(&self.from).unwrap_or("").to_string(), super::tenant::of(&self.to).unwrap_or("").to_string());
            return Err(super::CommandError::CrossTenant { field: "to", tenant, other });
        }
        for f in &self.files {
            super::Command::DeleteFile { id: f.id.clone(), path: f.path.clone() }.validate_scoped()?;
            if !path::is_within(&f.path, &self.to) {
                return Err(super::CommandError::InvalidPath { field: "path", path: f.path.clone(), reason: format!("is not beneath the move's destination {:?}", self.to) });
            }
        }
        Ok(())
    }

    /// The move this chunk belongs to: the rename's place in the log.
    pub fn source(&self) -> (i32, i64) {
        (self.source_partition, self.source_offset)
    }
}

/// Bytes a file takes in a chunk, roughly (its strings and their framing).
fn file_size(f: &MovedFile) -> usize {
    f.id.len() + f.path.len() + f.contents.len() + 16
}

/// The largest chunk a source writes (before compression), whatever its
/// `--max-message-bytes`: well below the brokers' default message limit.
pub const MAX_CHUNK_BYTES: usize = 256 << 10;

/// Cuts a stream of files into chunks of at most `max_bytes` each (a file
/// larger than that travels alone: its own command fitted in a message).
pub struct Chunker {
    max_bytes: usize,
    chunk: Vec<MovedFile>,
    size: usize,
}

impl Chunker {
    pub fn new(max_bytes: usize) -> Self {
        Chunker { max_bytes, chunk: Vec::new(), size: 0 }
    }

    /// Adds a file; returns the chunk it no longer fits in, if any.
    pub fn push(&mut self, f: MovedFile) -> Option<Vec<MovedFile>> {
        let n = file_size(&f);
        let full = (self.size + n > self.max_bytes && !self.chunk.is_empty()).then(|| {
            self.size = 0;
            std::mem::take(&mut self.chunk)
        });
        self.size += n;
        self.chunk.push(f);
        full
    }

    /// The last chunk (empty when no file was pushed).
    pub fn finish(self) -> Vec<MovedFile> {
        self.chunk
    }
}

/// Splits `files` into chunks with a [`Chunker`]: always at least one.
pub fn chunks(files: Vec<MovedFile>, max_bytes: usize) -> Vec<Vec<MovedFile>> {
    let mut c = Chunker::new(max_bytes);
    let mut out: Vec<Vec<MovedFile>> = files.into_iter().filter_map(|f| c.push(f)).collect();
    out.push(c.finish());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(id: &str, contents: usize) -> MovedFile {
        MovedFile { id: id.into(), path: format!("/d/{id}"), contents: "x".repeat(contents) }
    }

    #[test]
    fn chunks_stay_under_the_limit_and_keep_every_file_once() {
        let files: Vec<MovedFile> = (0..50).map(|i| file(&format!("f{i}"), i * 10)).collect();
        let out = chunks(files.clone(), 1000);
        assert!(out.len() > 5);
        for c in &out {
            assert!(c.len() == 1 || c.iter().map(file_size).sum::<usize>() <= 1000);
        }
        assert_eq!(out.concat(), files);
        assert_eq!(chunks(Vec::new(), 1000), vec![Vec::<MovedFile>::new()]);
        assert_eq!(chunks(vec![file("big", 5000)], 1000).len(), 1);
    }
}
