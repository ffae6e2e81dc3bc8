//! Bare tantivy with the shards' schema and no pipeline (no log, overlay,
//! position guards or checkpoints): the baselines `denorm bench` compares
//! the pipeline with.

use std::path::Path;

use tantivy::{Index, IndexWriter, ReloadPolicy};

use crate::index::{Doc, IndexError, Scan};

use super::schema::{schema, stream, Fields};
use super::shard::replace_page;

pub(super) const PAGE: usize = 1000;

pub(super) fn open(dir: &Path, memory_budget: usize) -> Result<(Index, IndexWriter, Fields), IndexError> {
    std::fs::create_dir_all(dir)?;
    let (schema, f) = schema(None);
    let index = Index::open_or_create(tantivy::directory::MmapDirectory::open(dir).map_err(|e| IndexError::Backend(e.to_string()))?, schema)?;
    let writer = index.writer_with_num_threads(1, memory_budget.max(15_000_000))?;
    Ok((index, writer, f))
}

/// Adds `docs` to the tantivy index at `dir` with one writer thread and
/// commits once. Returns how many were added.
pub fn index(dir: &Path, memory_budget: usize, docs: impl IntoIterator<Item = Doc>) -> Result<u64, IndexError> {
    let (_, mut writer, f) = open(dir, memory_budget)?;
    let mut n = 0;
    for d in docs {
        f.add(&writer, &d)?;
        n += 1;
    }
    writer.commit()?;
    Ok(n)
}

/// Moves every file of directory `from` (and below) to `to` in the
/// index at `dir`: scans, rewrites the documents in pages of 1000 (one
/// delete of the page's keys, then the adds) and commits once. Returns
/// how many were rewritten.
pub fn rename_dir(dir: &Path, memory_budget: usize, from: &str, to: &str) -> Result<u64, IndexError> {
    let (index, mut writer, f) = open(dir, memory_budget)?;
    let searcher = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?.searcher();
    let query = f.scan_query(&Scan::FilesWithin { path: from.to_string() });
    let (mut n, mut page) = (0, Vec::with_capacity(PAGE));
    stream(&searcher, query.as_ref(), &mut |store, doc| {
        if let Doc::File(mut d) = f.doc_of(&store.get(doc)?)? {
            let Some(rest) = d.path.strip_prefix(from) else { return Ok(()) };
            d.path = format!("{to}{rest}");
            page.push(Doc::File(d));
            n += 1;
            if page.len() == PAGE {
                replace_page(&writer, &f, &page)?;
                page.clear();
            }
        }
        Ok(())
    })?;
    replace_page(&writer, &f, &page)?;
    writer.commit()?;
    Ok(n)
}
