//! The writer of one shard: pending writes over the committed index, its
//! commits with the progress record, and fan-out progress commits.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tantivy::collector::Count;
use tantivy::query::TermQuery;
use tantivy::schema::IndexRecordOption;
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, Term};

use crate::index::progress::ProgressBook;
use crate::index::{Doc, IndexError, Kind, Pages, Scan, Shard};

use super::directory::{committed_progress, committed_shards, open_reader, ShardDirectory};
use super::merge::merge_policy;
use super::schema::{find, find_with, schema, stream, Fields, Paged};

/// Replaces the documents of one page: a single delete of all their keys,
/// then the new versions (added after the delete, so they stay). One
/// delete per page rather than per document: tantivy holds every delete
/// (about 1 KB for a term's) until all segments, including those being
/// merged, have seen it, so on a large index per-document deletes made a
/// fan-out's memory grow with its size.
pub(super) fn replace_page(writer: &IndexWriter, f: &Fields, page: &[Doc]) -> Result<(), IndexError> {
    if page.is_empty() {
        return Ok(());
    }
    writer.delete_query(Box::new(tantivy::query::TermSetQuery::new(page.iter().map(|d| f.key_term(d.kind(), d.id())))))?;
    for doc in page {
        writer.add_document(f.to_tantivy(doc))?;
    }
    Ok(())
}

/// Documents a fan-out rewrites between two commits of its progress.
pub const DEFAULT_FAN_OUT_COMMIT_EVERY: u64 = 50_000;

/// Default bound of a shard's segment merges, in documents (see
/// [`EmbeddedShard::set_merge_max_docs`]).
pub const DEFAULT_MERGE_MAX_DOCS: u32 = 100_000;

/// Readers of the other shards of a generation, opened when first needed.
pub(super) struct Siblings {
    generation_dir: PathBuf,
    partition: i32,
    readers: HashMap<i32, IndexReader>,
}

impl Siblings {
    /// The partition of another shard whose committed documents include
    /// `key` (a `doc_key` term), if one does.
    fn holder(&mut self, term: &Term) -> Result<Option<i32>, IndexError> {
        for (partition, dir) in committed_shards(&self.generation_dir)? {
            if partition == self.partition {
                continue;
            }
            let reader = match self.readers.entry(partition) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => e.insert(open_reader(&dir)?),
            };
            reader.reload()?;
            if reader.searcher().search(&TermQuery::new(term.clone(), IndexRecordOption::Basic), &Count)? > 0 {
                return Ok(Some(partition));
            }
        }
        Ok(None)
    }
}

/// Writer of one shard.
pub struct EmbeddedShard {
    name: String,
    /// The other partitions' shards, to name the holder of a document a
    /// command of this partition misses.
    siblings: Siblings,
    generation: u64,
    writer: IndexWriter,
    reader: IndexReader,
    f: Fields,
    /// Uncommitted single-document writes, so reads see them; handed to
    /// the writer at the commit.
    overlay: HashMap<(Kind, String), Pending>,
    /// The `pos` fast field of each committed segment, opened once.
    pos_columns: HashMap<tantivy::index::SegmentId, tantivy::columnar::Column<u64>>,
    dirty: bool,
    /// Uncommitted fan-out rewrites, which the overlay does not hold.
    fan_out_pending: bool,
    /// The documents of uncommitted pages of fan-outs run a page at a time
    /// ([`Shard::rewrite_page`]): only a read of one of them commits first,
    /// so the other keys' commands between the pages read without a commit.
    paged: std::collections::HashSet<(Kind, String)>,
    /// What the last commit recorded and what the next one records.
    progress: ProgressBook,
    /// Rewritten documents between two commits of a fan-out's progress.
    fan_out_commit_every: u64,
}

/// An uncommitted single-document write of an [`EmbeddedShard`].
#[derive(Debug)]
pub(super) struct Pending {
    /// The new version (`None`: deleted).
    doc: Option<Doc>,
    /// A version committed before must be deleted first.
    replaces: bool,
}

impl EmbeddedShard {
    /// Opens the writer of the shard in `dir` (of generation `generation`,
    /// in `generation_dir`), clearing what a commit a crash cut short left.
    pub(super) fn open(dir: &Path, generation_dir: PathBuf, generation: u64, partition: i32, memory_budget: usize) -> Result<Self, IndexError> {
        std::fs::create_dir_all(dir)?;
        let (schema, fields) = schema();
        let directory = tantivy::directory::MmapDirectory::open(dir).map_err(|e| IndexError::Backend(e.to_string()))?;
        let index = Index::open_or_create(ShardDirectory(directory), schema)?;
        // One merge thread per shard: concurrent merges each hold per-document
        // state, and the shards of a worker already merge side by side.
        let options = tantivy::indexer::IndexWriterOptions::builder()
            .num_worker_threads(1)
            .num_merge_threads(1)
            .memory_budget_per_thread(memory_budget.max(15_000_000))
            .build();
        let writer: IndexWriter = index.writer_with_options(options)?;
        writer.set_merge_policy(merge_policy(DEFAULT_MERGE_MAX_DOCS));
        // A process killed in the middle of a commit leaves the files it had
        // written but not yet listed in `meta.json`. Redoing the same
        // commands from the checkpoint writes files of the same names (a
        // segment's deletes are named by the commit's opstamp), which
        // tantivy refuses to overwrite: every retry would fail. Its own
        // clean-up runs only after a commit that succeeded, so it is run
        // here, before anything is written.
        let cleared = writer.garbage_collect_files().wait()?.deleted_files.len();
        if cleared > 0 {
            tracing::info!(partition, generation, files = cleared, "deleted files the last commit does not list (left by a commit a crash cut short)");
        }
        let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?;
        let progress = ProgressBook::new(committed_progress(&index)?);
        Ok(EmbeddedShard {
            name: format!("p{partition}"),
            siblings: Siblings { generation_dir, partition, readers: HashMap::new() },
            generation,
            writer,
            reader,
            f: fields,
            overlay: HashMap::new(),
            pos_columns: HashMap::new(),
            dirty: false,
            fan_out_pending: false,
            paged: Default::default(),
            progress,
            fan_out_commit_every: DEFAULT_FAN_OUT_COMMIT_EVERY,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A fan-out commits its progress after every `n` rewritten documents
    /// (0: only at the end), so what a fan-out leaves uncommitted (one
    /// delete per page, segments not yet published) stays bounded. The
    /// progress is committed at the position of the last finished
    /// command: a crash redoes the fan-out, whose position guards
    /// skip what it had already rewritten. Searches meanwhile see the
    /// rename part-way (some files at the new path, the rest at the old).
    pub fn set_fan_out_commit_every(&mut self, n: u64) {
        self.fan_out_commit_every = n;
    }

    /// Bounds the shard's segment merges to `max_docs` documents each (0:
    /// tantivy's default, unbounded). A merge holds per-document state for
    /// what it merges, so this bounds a shard's merge memory, whatever the
    /// shard's size, at the price of more segments in a large shard
    /// (at least documents / `max_docs`).
    pub fn set_merge_max_docs(&mut self, max_docs: u32) {
        self.writer.set_merge_policy(merge_policy(max_docs));
    }

    /// Records a single-document write in the overlay. `replaces`: a
    /// committed version may exist (put, delete) or not (create); an
    /// earlier write of the batch knows better.
    fn stage(&mut self, kind: Kind, id: String, doc: Option<Doc>, replaces: bool) {
        match self.overlay.entry((kind, id)) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().doc = doc,
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Pending { doc, replaces });
            }
        }
        self.dirty = true;
    }

    /// Hands the overlay to the writer: one delete of every key that
    /// replaces something, then the new versions. Called by the commit
    /// only; a shard whose commit failed is dropped and reopened, so the
    /// overlay is never handed over twice. Per-document delete
    /// terms (about 1 KB each in tantivy, held until every segment,
    /// including those being merged, has seen them) made memory grow with
    /// the batch and with merge times.
    fn flush_overlay(&mut self) -> Result<(), IndexError> {
        let f = self.f;
        let replaced: Vec<Term> = self.overlay.iter().filter(|(_, p)| p.replaces).map(|((kind, id), _)| f.key_term(*kind, id)).collect();
        if !replaced.is_empty() {
            self.writer.delete_query(Box::new(tantivy::query::TermSetQuery::new(replaced)))?;
        }
        for doc in self.overlay.values().filter_map(|p| p.doc.as_ref()) {
            self.writer.add_document(f.to_tantivy(doc))?;
        }
        Ok(())
    }
}

impl Shard for EmbeddedShard {
    fn get(&mut self, kind: Kind, id: &str) -> Result<Option<Doc>, IndexError> {
        if let Some(p) = self.overlay.get(&(kind, id.to_string())) {
            return Ok(p.doc.clone());
        }
        if self.fan_out_pending || self.paged.contains(&(kind, id.to_string())) {
            self.commit()?;
        }
        let searcher = self.reader.searcher();
        find(&searcher, &self.f.key_term(kind, id))?.map(|t| self.f.from_tantivy(&t)).transpose()
    }

    fn position(&mut self, kind: Kind, id: &str) -> Result<Option<u64>, IndexError> {
        if let Some(p) = self.overlay.get(&(kind, id.to_string())) {
            return Ok(p.doc.as_ref().map(Doc::pos));
        }
        if self.fan_out_pending || self.paged.contains(&(kind, id.to_string())) {
            self.commit()?;
        }
        // The fast field: no stored document to decompress.
        let searcher = self.reader.searcher();
        let columns = &mut self.pos_columns;
        let pos = find_with(&searcher, &self.f.key_term(kind, id), &mut |segment, doc| {
            let column = match columns.entry(segment.segment_id()) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => e.insert(segment.fast_fields().u64("pos")?),
            };
            Ok(column.first(doc).unwrap_or(0))
        })?;
        Ok(pos)
    }

    fn put(&mut self, doc: Doc) -> Result<(), IndexError> {
        self.stage(doc.kind(), doc.id().to_string(), Some(doc), true);
        Ok(())
    }

    fn create(&mut self, doc: Doc) -> Result<(), IndexError> {
        // Nothing committed has this key: no delete unless an earlier
        // write of this batch says otherwise.
        self.stage(doc.kind(), doc.id().to_string(), Some(doc), false);
        Ok(())
    }

    fn held_elsewhere(&mut self, kind: Kind, id: &str) -> Result<Option<i32>, IndexError> {
        let term = self.f.key_term(kind, id);
        self.siblings.holder(&term)
    }

    fn delete(&mut self, kind: Kind, id: &str, _pos: u64) -> Result<(), IndexError> {
        self.stage(kind, id.to_string(), None, true);
        Ok(())
    }

    fn rewrite(
        &mut self,
        scan: &Scan,
        page_size: usize,
        rewrite: &mut dyn FnMut(&Doc) -> Option<Doc>,
    ) -> Result<u64, IndexError> {
        // The scan reads committed state: make earlier writes part of it.
        if self.dirty {
            self.commit()?;
        }
        // The snapshot streamed stays as it is while progress is committed.
        let searcher = self.reader.searcher();
        let query = self.f.scan_query(scan);
        let f = self.f;
        let mut page: Vec<Doc> = Vec::with_capacity(page_size);
        let (mut written, mut uncommitted) = (0u64, 0u64);
        // `between_pages`: more pages follow, so progress may be committed
        // (the last page is committed with the command by the caller).
        let mut flush = |this: &mut Self, page: &mut Vec<Doc>, between_pages: bool| -> Result<(), IndexError> {
            let new: Vec<Doc> = page.drain(..).filter_map(|doc| rewrite(&doc)).collect();
            replace_page(&this.writer, &f, &new)?;
            written += new.len() as u64;
            uncommitted += new.len() as u64;
            if uncommitted > 0 {
                this.dirty = true;
                this.fan_out_pending = true;
            }
            if between_pages && this.fan_out_commit_every > 0 && uncommitted >= this.fan_out_commit_every {
                this.commit()?;
                uncommitted = 0;
            }
            Ok(())
        };
        stream(&searcher, query.as_ref(), &mut |store, doc| {
            page.push(f.from_tantivy(&store.get(doc)?)?);
            if page.len() >= page_size {
                flush(self, &mut page, true)?;
            }
            Ok(())
        })?;
        flush(self, &mut page, false)?;
        Ok(written)
    }

    fn rewrite_begin(&mut self, scan: &Scan, page_size: usize) -> Result<Pages, IndexError> {
        if self.dirty {
            self.commit()?;
        }
        Ok(Pages::new(Paged::new(self.reader.searcher(), self.f.scan_query(scan).as_ref(), page_size)?))
    }

    fn rewrite_page(&mut self, pages: &mut Pages, rewrite: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<(u64, bool), IndexError> {
        let paged = pages.cursor::<Paged>().ok_or_else(|| IndexError::Backend("a fan-out's pages of another backend".into()))?;
        let f = self.f;
        let mut page = Vec::new();
        let done = paged.next(&mut |store, doc| {
            page.push(f.from_tantivy(&store.get(doc)?)?);
            Ok(())
        })?;
        let new: Vec<Doc> = page.iter().filter_map(|d| rewrite(d)).collect();
        replace_page(&self.writer, &f, &new)?;
        if !new.is_empty() {
            self.dirty = true;
            self.paged.extend(new.iter().map(|d| (d.kind(), d.id().to_string())));
        }
        // What pages leave uncommitted stays bounded, as in `rewrite`.
        if self.fan_out_commit_every > 0 && self.paged.len() as u64 >= self.fan_out_commit_every {
            self.commit()?;
        }
        Ok((new.len() as u64, done))
    }

    fn progress(&self) -> &ProgressBook {
        &self.progress
    }

    fn progress_mut(&mut self) -> &mut ProgressBook {
        &mut self.progress
    }

    fn generation(&self) -> u64 {
        self.generation
    }

    fn commit(&mut self) -> Result<(), IndexError> {
        if !self.dirty && !self.progress.changed() {
            return Ok(());
        }
        if let Some(ids) = crate::faults::active("index.reject-commit") {
            if let Some((_, id)) = self.overlay.keys().find(|(_, id)| ids.lines().any(|l| l.trim() == id)) {
                return Err(IndexError::Rejected(format!("injected fault index.reject-commit: document {id}")));
            }
        }
        self.flush_overlay()?;
        let mut prepared = self.writer.prepare_commit()?;
        let marked = self.progress.marked();
        if marked.checkpoint.is_some() {
            prepared.set_payload(&serde_json::Value::Object(marked.to_json()).to_string());
        }
        prepared.commit()?;
        self.reader.reload()?;
        let live: std::collections::HashSet<_> = self.reader.searcher().segment_readers().iter().map(|s| s.segment_id()).collect();
        self.pos_columns.retain(|id, _| live.contains(id));
        self.overlay.clear();
        self.dirty = false;
        self.fan_out_pending = false;
        self.paged.clear();
        self.progress.committed();
        Ok(())
    }
}
