//! The writer of one shard: pending writes over the committed index, its
//! commits with the progress record, and fan-out progress commits.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tantivy::collector::Count;
use tantivy::query::TermQuery;
use tantivy::schema::IndexRecordOption;
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, Term};

use crate::index::progress::ProgressBook;
use crate::index::{Doc, IndexError, Kind, Pages, Scan, Shard};

use super::directory::{committed_progress, committed_shards, open_reader, Fence, ShardDirectory};
use super::fanout::Cursor;
use super::merge::merge_policy;
use super::overlay::Overlay;
use super::schema::{find, find_with, schema, Fields, Stores};
use super::writer_lock::WriterLock;

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
    let mut keys = Vec::with_capacity(page.len());
    for d in page {
        f.key_terms(d.kind(), d.id(), &mut keys);
    }
    writer.delete_query(Box::new(tantivy::query::TermSetQuery::new(keys)))?;
    for doc in page {
        f.add(writer, doc)?;
    }
    Ok(())
}

/// Documents of uncommitted pages kept by id, at most (past it, a read of
/// any document not pending commits first).
pub const PAGED_MAX: usize = 100_000;

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
    /// Closed by `Drop`, after its merges.
    writer: std::mem::ManuallyDrop<IndexWriter>,
    reader: IndexReader,
    f: Fields,
    /// Uncommitted single-document writes and rewrites of fan-outs of one
    /// page, so reads and scans see them; handed to the writer at the
    /// commit.
    overlay: Overlay,
    /// The `pos` fast field of each committed segment, opened once.
    pos_columns: HashMap<tantivy::index::SegmentId, tantivy::columnar::Column<u64>>,
    /// The document store of each committed segment, opened once.
    stores: Stores,
    dirty: bool,
    /// The documents of uncommitted pages of fan-outs of several pages,
    /// written to the writer, which the overlay does not hold: only a read
    /// of one of them commits first, so the other keys' commands between
    /// the pages read without a commit.
    paged: std::collections::HashSet<(Kind, String)>,
    /// More were written than `paged` may hold (`paged_max`): every read
    /// of a document not pending commits first. `paged` grew with the
    /// fan-out under `--fan-out-commit-every 0` (review of lanes, F11).
    paged_overflow: bool,
    paged_max: usize,
    /// The keys of those fan-outs: a later fan-out of one of them scans
    /// after a commit.
    paged_keys: std::collections::HashSet<String>,
    /// What the last commit recorded and what the next one records.
    progress: ProgressBook,
    /// Released as the shard goes, after [`Drop`] has let the writer's
    /// merges end or closed its directory to them (`writer_lock.rs`).
    _lock: WriterLock,
    /// Closes the writer's directory to writes once the writer is let go.
    fence: Arc<Fence>,
    /// Rewritten documents between two commits of a fan-out's progress.
    fan_out_commit_every: u64,
    /// Single-document writes (put, create, delete) so far.
    writes: u64,
}

impl EmbeddedShard {
    /// Opens the writer of the shard in `dir` (of generation `generation`,
    /// in `generation_dir`), clearing what a commit a crash cut short left.
    pub(super) fn open(dir: &Path, generation_dir: PathBuf, generation: u64, partition: i32, memory_budget: usize, model: Option<&'static crate::domain::Domain>) -> Result<Self, IndexError> {
        std::fs::create_dir_all(dir)?;
        // Before the index is opened: it reads the managed-file list, which
        // only the lock's holder may rely on (`writer_lock.rs`).
        let lock = WriterLock::take(dir)?;
        let (schema, fields) = schema(model);
        let directory = tantivy::directory::MmapDirectory::open(dir).map_err(|e| IndexError::Backend(e.to_string()))?;
        let fence = Arc::new(Fence::default());
        let index = Index::open_or_create(ShardDirectory::new(directory, fence.clone()), schema)?;
        // One merge thread per shard: concurrent merges each hold per-document
        // state, and the shards of a worker already merge side by side.
        let options = tantivy::indexer::IndexWriterOptions::builder().num_worker_threads(1).num_merge_threads(1).memory_budget_per_thread(memory_budget.max(15_000_000)).build();
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
        // A new writer's first operation takes the opstamp of the last
        // commit, and a segment whose deletes are up to date at that opstamp
        // counts a delete of that opstamp as applied: a merge of it before
        // this writer's first commit kept the documents that delete removed
        // (the replaced versions of a whole commit's upserts, live beside
        // the new ones; `apply::embedded_tests`, a writer reopened at once).
        // An empty batch takes that opstamp, so no operation carries it.
        writer.run(Vec::<tantivy::indexer::UserOperation>::new())?;
        let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?;
        let progress = ProgressBook::new(committed_progress(&index)?);
        Ok(EmbeddedShard {
            name: format!("p{partition}"),
            siblings: Siblings { generation_dir, partition, readers: HashMap::new() },
            generation,
            writer: std::mem::ManuallyDrop::new(writer),
            _lock: lock,
            fence,
            reader,
            f: fields,
            overlay: Overlay::default(),
            pos_columns: HashMap::new(),
            stores: Stores::default(),
            dirty: false,
            paged: Default::default(),
            paged_overflow: false,
            paged_max: PAGED_MAX,
            paged_keys: Default::default(),
            progress,
            fan_out_commit_every: DEFAULT_FAN_OUT_COMMIT_EVERY,
            writes: 0,
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

    /// Records a write in the overlay (see [`Overlay::stage`]).
    /// Whether an uncommitted page may have written the document (a read
    /// of it commits first).
    fn written_by_a_page(&self, kind: Kind, id: &str) -> bool {
        self.paged_overflow || (!self.paged.is_empty() && self.paged.contains(&(kind, id.to_string())))
    }

    /// Bounds the documents of uncommitted pages kept by id (tests).
    #[cfg(test)]
    pub fn set_paged_max(&mut self, n: usize) {
        self.paged_max = n;
    }

    /// The ids of uncommitted pages kept (tests).
    #[cfg(test)]
    pub fn paged_ids(&self) -> usize {
        self.paged.len()
    }

    fn stage(&mut self, kind: Kind, id: String, doc: Option<Doc>, replaces: bool) {
        self.overlay.stage(kind, id, doc, replaces);
        self.dirty = true;
    }
}

impl Drop for EmbeddedShard {
    /// Lets the writer's merges end before the writer goes, and its lock
    /// with it. Dropped while a merge ran, tantivy's writer let the
    /// merge's background work go on after the lock was released, and a
    /// writer opened at once on the same shard (a reopen after a failure;
    /// a partition assigned back to the same worker) ended with documents
    /// lost or written twice (`apply::embedded_tests`, a writer dropped
    /// during merges). Waits for the merges running then, and for those
    /// their ends start (each of at most `merge_max_docs` documents); what
    /// was not committed is written to segments first, then discarded.
    /// tantivy's close returns before the merges when an indexing thread
    /// failed: the directory's fence then closes it to whatever they would
    /// still write, before the lock goes. A killed process leaves nothing
    /// running.
    fn drop(&mut self) {
        // SAFETY: taken once, here, as the shard goes; never used after.
        let writer = unsafe { std::mem::ManuallyDrop::take(&mut self.writer) };
        let started = std::time::Instant::now();
        if crate::faults::active("shard.close-early").is_some() {
            // What tantivy's close does when an indexing thread failed.
            drop(writer);
        } else {
            match writer.wait_merging_threads() {
                Ok(()) => tracing::debug!(shard = %self.name, waited_ms = started.elapsed().as_millis() as u64, "shard writer closed after its merges"),
                Err(error) => {
                    tracing::warn!(shard = %self.name, %error, "the shard's writer failed as it closed, its merges perhaps still running: its directory is closed to them (the committed index is unaffected)")
                }
            }
        }
        self.fence.close();
    }
}

impl Shard for EmbeddedShard {
    fn get(&mut self, kind: Kind, id: &str) -> Result<Option<Doc>, IndexError> {
        if let Some(p) = self.overlay.get(kind, id) {
            return Ok(p.doc.clone());
        }
        if self.written_by_a_page(kind, id) {
            self.commit()?;
        }
        let searcher = self.reader.searcher();
        find(&searcher, &self.f.key_term(kind, id), &mut self.stores)?.map(|t| self.f.doc_of(&t)).transpose()
    }

    fn position(&mut self, kind: Kind, id: &str) -> Result<Option<u64>, IndexError> {
        if let Some(p) = self.overlay.get(kind, id) {
            return Ok(p.doc.as_ref().map(Doc::pos));
        }
        if self.written_by_a_page(kind, id) {
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
        self.writes += 1;
        self.stage(doc.kind(), doc.id().to_string(), Some(doc), true);
        Ok(())
    }

    fn create(&mut self, doc: Doc) -> Result<(), IndexError> {
        // Nothing committed has this key: no delete unless an earlier
        // write of this batch says otherwise.
        self.writes += 1;
        self.stage(doc.kind(), doc.id().to_string(), Some(doc), false);
        Ok(())
    }

    fn held_elsewhere(&mut self, kind: Kind, id: &str) -> Result<Option<i32>, IndexError> {
        let term = self.f.key_term(kind, id);
        self.siblings.holder(&term)
    }

    fn delete(&mut self, kind: Kind, id: &str, _pos: u64) -> Result<(), IndexError> {
        self.writes += 1;
        self.stage(kind, id.to_string(), None, true);
        Ok(())
    }

    fn rewrite(&mut self, scan: &Scan, page_size: usize, rewrite: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<u64, IndexError> {
        crate::index::rewrite_in_pages(self, scan, page_size, rewrite)
    }

    fn fan_out_reads_pending(&mut self, scan: &Scan, _page_size: usize) -> bool {
        !self.paged_keys.contains(scan.key())
    }

    fn wants_commit(&self) -> bool {
        self.fan_out_commit_every > 0 && (self.overlay.len() + self.paged.len()) as u64 >= self.fan_out_commit_every
    }

    fn rewrite_begin(&mut self, scan: &Scan, page_size: usize) -> Result<Pages, IndexError> {
        // Pages of an earlier fan-out of this key are in the writer only:
        // the scan reads them once committed (the worker commits first,
        // `fan_out_reads_pending`).
        if self.paged_keys.contains(scan.key()) {
            self.commit()?;
        }
        Ok(match Cursor::begin(self.reader.searcher(), &self.f, &mut self.stores, scan, page_size, &self.overlay, self.writes)? {
            whole @ Cursor::Whole(_) => Pages::one(crate::index::Cursor::Embedded(whole)),
            paged => Pages::new(crate::index::Cursor::Embedded(paged)),
        })
    }

    fn rewrite_page(&mut self, pages: &mut Pages, rewrite: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<(u64, bool), IndexError> {
        let cursor = match pages.cursor() {
            crate::index::Cursor::Embedded(c) => c,
            other => return Err(other.mismatch()),
        };
        let f = self.f;
        let (mut page, done) = cursor.next(&f, &mut self.stores)?;
        // A page writes by key, over whatever version is there: a document
        // another command wrote since the scan began (its snapshot) keeps
        // that write; the page passes over it, as Elasticsearch's page,
        // conditional on the version it read, does (review of lanes, F4:
        // the snapshot's version, rewritten, undid a later upsert or
        // delete of another key). Checked only once a write came.
        if cursor.writes_at().is_some_and(|w| w != self.writes) {
            let mut kept = Vec::with_capacity(page.len());
            for d in page {
                if self.position(d.kind(), d.id())? == Some(d.pos()) {
                    kept.push(d);
                }
            }
            page = kept;
        }
        let new: Vec<Doc> = page.iter().filter_map(&mut *rewrite).collect();
        let written = new.len() as u64;
        // A fan-out of one page, and a pending document, stay in the
        // overlay (reads see them without a commit); the pages of a longer
        // fan-out go to the writer, whose memory is bounded.
        let mut direct = Vec::new();
        for doc in new {
            if cursor.paged_key().is_none() || self.overlay.contains(doc.kind(), doc.id()) {
                self.stage(doc.kind(), doc.id().to_string(), Some(doc), true);
            } else {
                direct.push(doc);
            }
        }
        replace_page(&self.writer, &f, &direct)?;
        if let (false, Some(key)) = (direct.is_empty(), cursor.paged_key()) {
            self.dirty = true;
            if self.paged.len() + direct.len() > self.paged_max {
                self.paged.clear();
                self.paged_overflow = true;
            }
            if !self.paged_overflow {
                self.paged.extend(direct.iter().map(|d| (d.kind(), d.id().to_string())));
            }
            if !self.paged_keys.contains(key) {
                self.paged_keys.insert(key.to_string());
            }
        }
        // What pages leave uncommitted stays bounded: progress is committed
        // at the position of the last finished command, and a crash redoes
        // the fan-out, whose position guards skip what it rewrote. The last
        // page is committed with the command by the caller.
        if !done && self.fan_out_commit_every > 0 && self.paged.len() as u64 >= self.fan_out_commit_every {
            self.commit()?;
        }
        Ok((written, done))
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
            if let Some(id) = self.overlay.document_ids().find(|id| ids.lines().any(|l| l.trim() == *id)) {
                return Err(IndexError::Rejected(format!("injected fault index.reject-commit: document {id}")));
            }
        }
        self.overlay.flush(&self.writer, &self.f)?;
        let mut prepared = self.writer.prepare_commit()?;
        let marked = self.progress.marked();
        if marked.checkpoint.is_some() {
            prepared.set_payload(&serde_json::Value::Object(marked.to_json()).to_string());
        }
        prepared.commit()?;
        self.reader.reload()?;
        let live: std::collections::HashSet<_> = self.reader.searcher().segment_readers().iter().map(|s| s.segment_id()).collect();
        self.pos_columns.retain(|id, _| live.contains(id));
        self.stores.retain(&live);
        self.overlay.clear();
        self.dirty = false;
        self.paged.clear();
        self.paged_overflow = false;
        self.paged_keys.clear();
        self.progress.committed();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// A shard that goes closes its writer's directory before its lock
    /// goes: the next writer may take the lock at once.
    #[test]
    fn a_shard_that_goes_closes_its_directory_and_frees_its_lock() {
        let dir = tempfile::tempdir().unwrap();
        let idx = super::super::EmbeddedIndex::open(dir.path(), "t").unwrap();
        let shard = idx.open_shard(0, 20_000_000).unwrap();
        let fence = shard.fence.clone();
        assert!(!fence.is_closed());
        drop(shard);
        assert!(fence.is_closed(), "the directory of a writer let go still takes writes");
        drop(idx.open_shard(0, 20_000_000).expect("the lock went with the shard"));
    }
}
