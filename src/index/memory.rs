//! In-memory shard: the reference implementation of [`Shard`] for unit and
//! property tests of the command logic (no I/O, writes visible at once).

use std::collections::BTreeMap;

use super::progress::ProgressBook;
use super::{Doc, IndexError, Kind, Scan, Shard};

#[derive(Debug, Default, Clone)]
pub struct MemoryShard {
    pub docs: BTreeMap<(Kind, String), Doc>,
    progress: ProgressBook,
}

impl MemoryShard {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Shard for MemoryShard {
    fn get(&mut self, kind: Kind, id: &str) -> Result<Option<Doc>, IndexError> {
        Ok(self.docs.get(&(kind, id.to_string())).cloned())
    }
    fn put(&mut self, doc: Doc) -> Result<(), IndexError> {
        self.docs.insert((doc.kind(), doc.id().to_string()), doc);
        Ok(())
    }
    fn delete(&mut self, kind: Kind, id: &str, _pos: u64) -> Result<(), IndexError> {
        self.docs.remove(&(kind, id.to_string()));
        Ok(())
    }
    fn rewrite(&mut self, scan: &Scan, _page_size: usize, rewrite: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<u64, IndexError> {
        let new: Vec<Doc> = self.docs.values().filter(|d| scan.matches(d)).filter_map(&mut *rewrite).collect();
        let n = new.len() as u64;
        for d in new {
            self.put(d)?;
        }
        Ok(n)
    }
    fn progress(&self) -> &ProgressBook {
        &self.progress
    }
    fn progress_mut(&mut self) -> &mut ProgressBook {
        &mut self.progress
    }
    fn commit(&mut self) -> Result<(), IndexError> {
        self.progress.committed();
        Ok(())
    }
}
