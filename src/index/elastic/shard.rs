//! [`Shard`] on Elasticsearch.
//!
//! Idempotence and concurrency control: every document stores the log
//! position of its last write (`denorm_pos`), and `apply/` writes only when
//! newer. Every write is conditional on the `_seq_no`/`_primary_term` the
//! document was read with (`create` when it was absent), so a stale writer
//! (a previous partition owner still running) can never overwrite a newer
//! write: its write fails with 409, the document is read again and the
//! position guard decides. Kafka offsets are never used as external
//! versions: they restart when a topic is recreated.
//!
//! Reads are realtime GETs; a fan-out scan refreshes the index first so it
//! sees every write before it (read-your-writes), one refresh per fan-out.

mod flush;

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use serde_json::{json, Value};

use super::backend::{ElasticBackend, WriteFirst, SEARCHABLE_WITHIN};
use super::bulk::{self, BulkOp};
use super::conflict::{self, TakeOver, Write};
use super::docs::{from_source, is_tombstone, to_source, EsWhole};
use super::generations;
use super::meta::{self, get_source};
use super::names::{OWNER_FIELD, PARTITION_FIELD, POS_FIELD};
use super::recent::{Recent, MAX_RECENT};
use super::tombstones;
use super::ElasticError;
use crate::index::progress::ProgressBook;
use crate::index::{Doc, IndexError, Kind, Origin, Pages, Scan, Shard, Wanted};
use flush::owner_conflict;

/// Writing first ([`WriteFirst::WhenAbsent`]) starts after a window of at
/// least this many upsert guard reads...
const WRITE_FIRST_MIN_READS: usize = 32;
/// ...of which at most one in this many found a document (and stops as
/// `flush::WRITE_FIRST_CONFLICTS_AT_MOST` says).
const WRITE_FIRST_FOUND_AT_MOST: usize = 20;

impl From<ElasticError> for IndexError {
    /// The error is kept as the cause; whether it is retried follows
    /// [`ElasticError::is_retryable`].
    fn from(e: ElasticError) -> Self {
        let kind = if e.is_retryable() { crate::retry::Kind::Transient } else { crate::retry::Kind::Permanent };
        IndexError::Failed { kind, source: Box::new(e) }
    }
}

/// What [`ElasticShard::read`] found.
enum Read {
    /// This writer's uncommitted write (`None`: a delete).
    Overlay(Option<Doc>),
    /// The stored `_source`, tombstones included (`None`: absent).
    Stored(Option<Value>),
}

pub struct ElasticShard {
    pub(super) b: ElasticBackend,
    /// The partition this shard applies: stamped on every write.
    pub(super) partition: i32,
    /// This writer's owner epoch of the partition.
    owner: u64,
    /// When this writer last removed expired tombstones (`None`: not yet;
    /// its first commit does).
    last_sweep: Option<std::time::Instant>,
    /// The version (`_seq_no`, `_primary_term`) of the partition's meta
    /// document this writer last wrote: its checkpoint writes are
    /// conditional on it.
    meta_version: (i64, i64),
    /// The generation this writer belongs to: it reads and writes through
    /// that generation's write aliases only.
    generation: u64,
    /// Where that generation keeps each tenant's documents.
    placement: std::sync::Arc<super::placement::Placement>,
    meta_id: String,
    /// The document holding the parked keys the meta document names.
    parked: super::parked::Spill,
    /// Buffered writes, with the log position of the command each one
    /// belongs to (what decides a conflict).
    pending: Vec<(Kind, BulkOp, u64, Write)>,
    /// Where each document's write is in `pending`: a document is sent
    /// once per flush ([`ElasticShard::buffer`]).
    pending_at: HashMap<(Kind, String), usize>,
    /// Uncommitted writes, so reads see them (`None`: deleted).
    overlay: HashMap<(Kind, String), Option<Doc>>,
    /// What each document was last read as: `Some(seq)`, or `None` when absent.
    pub(super) seen: HashMap<(Kind, String), Option<(i64, i64)>>,
    /// What Elasticsearch held of each document before this flush's writes
    /// (`None`: absent), as first read since the last flush: what a flush
    /// that met a refusal puts back ([`Self::undo`]).
    pre_images: HashMap<(Kind, String), Option<Value>>,
    /// The writes of the flush under way that Elasticsearch took (see
    /// [`Self::undo`]).
    flushed: Vec<bulk::Written>,
    /// Documents fetched ahead of their reads ([`Shard::prefetch`]), each
    /// taken by its first read; dropped at every flush, before this
    /// writer's writes are sent (the versions they hold may be older than
    /// those writes, a fan-out's included).
    prefetched: HashMap<(Kind, String), Option<(Value, meta::Version)>>,
    /// Whether upserts are written first, without a read (see
    /// [`Shard::upsert_position`], [`WriteFirst`]).
    writing_first: bool,
    /// The upserts of `pending` written first: taken for absent, unread.
    assumed: HashSet<(Kind, String)>,
    /// The documents of `seen` read as another partition's version: a
    /// write over one of them is sent only once [`Self::confirm_owner`].
    seen_foreign: HashSet<(Kind, String)>,
    /// What the last commit recorded and what the next one records.
    progress: ProgressBook,
    /// When this writer's last write reached Elasticsearch, while no
    /// refresh is known to have begun after it (`None`: everything it
    /// wrote is searchable). See [`Shard::searchable`].
    pub(super) unsearchable: Option<Instant>,
    /// The commits not known searchable: the first write of the oldest of
    /// them not known refreshed (from when [`Shard::searchable`] counts its
    /// bound), and the last write the last commit covers (what a refresh
    /// must have begun after). A fan-out's pages written after a commit do
    /// not hold its publication back, and neither do later commits: each
    /// renewed one instant, and during a long rename a commit was
    /// published only when the rename paused.
    committed_writes: Option<(Instant, Instant)>,
    /// What this writer wrote that a search may not see yet (see
    /// [`Recent`]): a fan-out's scan reads it by GET.
    pub(super) recent: Recent,
    /// The scan [`Shard::fan_out_reads_pending`] read, for the fan-out that
    /// begins next (dropped by any write before it).
    ready: Option<(Scan, EsWhole)>,
    /// The owners whose fan-outs are coming ([`Shard::prefetch_scans`]).
    pub(super) coming: super::coming::Coming,
}

impl ElasticShard {
    /// The writer of `partition`'s shard of `generation`, claimed as owner
    /// epoch `owner` (its meta document `meta_id` at `meta_version`).
    pub(super) fn new(
        b: ElasticBackend,
        partition: i32,
        (generation, placement): (u64, std::sync::Arc<super::placement::Placement>),
        (meta_id, parked): (String, super::parked::Spill),
        owner: u64,
        meta_version: (i64, i64),
        progress: ProgressBook,
    ) -> Self {
        ElasticShard {
            b: b.clone(),
            partition,
            generation,
            placement,
            meta_id,
            parked,
            owner,
            last_sweep: None,
            meta_version,
            pending: Vec::new(),
            pending_at: HashMap::new(),
            overlay: HashMap::new(),
            seen: HashMap::new(),
            pre_images: HashMap::new(),
            flushed: Vec::new(),
            seen_foreign: HashSet::new(),
            prefetched: HashMap::new(),
            writing_first: b.write_first == WriteFirst::Always,
            assumed: HashSet::new(),
            // A shard another writer committed: whether a refresh began
            // after its last writes is not known here, so its checkpoint is
            // searchable once one does (review of Elasticsearch, F4).
            unsearchable: progress.checkpoint().map(|_| Instant::now()),
            committed_writes: progress.checkpoint().map(|_| (Instant::now(), Instant::now())),
            progress,
            recent: Recent::new(),
            ready: None,
            coming: Default::default(),
        }
    }

    /// Whether this writer knows every write a search may not see yet (see
    /// [`Shard::fan_out_reads_pending`]).
    pub(super) fn scans_recent(&self) -> bool {
        self.b.refreshed_since(self.generation, self.recent.since) && self.recent.len() < MAX_RECENT
    }

    /// Refreshes the generation: every write sent so far is searchable.
    fn refresh(&mut self) -> Result<(), IndexError> {
        let started = Instant::now();
        self.b.runtime.block_on(generations::refresh(&self.b.client, &self.b.prefix, self.generation, &self.placement, &self.b.kinds()))?;
        self.b.record_refresh(self.generation, started);
        self.published(started);
        Ok(())
    }

    /// A refresh that began at `started` published what this writer had
    /// sent before.
    fn published(&mut self, started: Instant) {
        if self.unsearchable.is_some_and(|w| w <= started) {
            self.unsearchable = None;
        }
        self.committed_writes = match self.committed_writes {
            Some((_, last)) if last <= started => None,
            // What the refresh covered is searchable: the bound counts
            // from it for the rest.
            Some((first, last)) => Some((first.max(started), last)),
            None => None,
        };
        if self.pending.is_empty() && self.unsearchable.is_none() {
            self.recent.refreshed(started);
        }
    }

    /// The alias the document `id` (scoped) of `kind`, or the documents of
    /// the key `id`, are read and written through: its tenant's in this
    /// generation's placement.
    pub(super) fn target(&self, kind: Kind, id: &str) -> String {
        self.placement.write_target(&self.b.prefix, kind, self.generation, crate::command::tenant::of(id))
    }

    /// The document as this writer sees it: its uncommitted write, or what
    /// Elasticsearch holds (realtime GET), whose version is remembered for
    /// the conditional write that may follow.
    fn read(&mut self, kind: Kind, id: &str) -> Result<Read, IndexError> {
        let key = (kind, id.to_string());
        if let Some(d) = self.overlay.get(&key) {
            return Ok(Read::Overlay(d.clone()));
        }
        let got = match self.prefetched.remove(&key) {
            Some(got) => got,
            None => self.b.runtime.block_on(get_source(&self.b.client, &self.target(kind, id), id))?,
        };
        if got.as_ref().is_some_and(|(v, _)| self.foreign(v)) {
            self.seen_foreign.insert(key.clone());
        }
        self.seen.insert(key.clone(), got.as_ref().map(|(_, seq)| *seq));
        self.pre_images.entry(key).or_insert_with(|| got.as_ref().map(|(v, _)| v.clone()));
        Ok(Read::Stored(got.map(|(v, _)| v)))
    }

    /// Whether a stored `_source` (document or tombstone) was written by
    /// another partition's shard (see [`conflict`]).
    fn foreign(&self, v: &Value) -> bool {
        conflict::foreign(self.partition, v)
    }

    /// Fails as fenced unless this writer still owns its partition: its
    /// meta document still holds this writer's owner epoch. Asked before a
    /// write that replaces another partition's version, after that version
    /// was read (see [`conflict`] for why this closes the stale owner's
    /// window).
    fn confirm_owner(&self) -> Result<(), IndexError> {
        let meta = self.b.runtime.block_on(get_source(&self.b.client, &self.b.meta_index(), &self.meta_id))?;
        let owner = meta.as_ref().and_then(|(v, _)| v[OWNER_FIELD].as_u64());
        if owner == Some(self.owner) {
            return Ok(());
        }
        Err(IndexError::Fenced(format!(
            "{}: the partition was claimed by another owner (epoch {}, this writer's {}); its writes over other partitions' documents are not sent",
            self.meta_id,
            owner.map_or("none".to_string(), |o| o.to_string()),
            self.owner
        )))
    }

    pub(super) fn stamp(&self, mut source: Value) -> Value {
        source[PARTITION_FIELD] = json!(self.partition);
        source
    }

    /// The write of `source` as document `id`: a create when it was read
    /// as absent, conditional on the version read when it was read.
    fn write_op(&self, kind: Kind, id: &str, source: Value) -> BulkOp {
        let mut source = self.stamp(source);
        if crate::faults::lists("index.reject-commit", id) {
            // The fault on Elasticsearch: a position the mapping (a long)
            // refuses, so that the server itself refuses the item at the
            // flush (a `document_parsing_exception`, 400), and the refusal
            // takes the real path from the bulk answer to the worker.
            source[POS_FIELD] = json!("refused: injected fault index.reject-commit");
        }
        let index = self.target(kind, id);
        let id = id.to_string();
        match self.seen.get(&(kind, id.clone())) {
            Some(None) => BulkOp::Create { index, id, source },
            Some(Some(seq)) => BulkOp::Index { index, id, source, if_seq_no: Some(*seq) },
            None => BulkOp::Index { index, id, source, if_seq_no: None },
        }
    }

    /// Removes expired tombstones from this generation, once per
    /// [`tombstones::SWEEP_EVERY`] for the whole generation: each writer
    /// looks at its first commit and then hourly, and sweeps only if it
    /// wins the claim ([`tombstones::claim`]). Best effort: in the
    /// background of the cluster, and a failed sweep is tried again later.
    fn sweep_tombstones(&mut self) {
        if self.last_sweep.is_some_and(|at| at.elapsed() < tombstones::SWEEP_EVERY) {
            return;
        }
        self.last_sweep = Some(std::time::Instant::now());
        let targets = self.placement.write_aliases(&self.b.prefix, self.generation, &self.b.kinds());
        let r = self.b.runtime.block_on(async {
            if !tombstones::claim(&self.b.client, &self.b.prefix, self.generation, self.partition).await? {
                return Ok(());
            }
            tombstones::sweep(&self.b.client, &targets).await
        });
        if let Err(e) = r {
            tracing::warn!(error = %e, "removing expired tombstones failed; tried again later");
        }
    }
}

impl Shard for ElasticShard {
    fn shares_documents(&self) -> bool {
        true
    }

    /// Searchable once a refresh of this generation began after the last
    /// write the last commit covers: one another writer of this backend
    /// made (shared, [`ElasticBackend::refreshed`]), or one this writer
    /// makes once the oldest write not known refreshed of the commits not
    /// published is [`SEARCHABLE_WITHIN`] old (or at once, `force`).
    /// So a worker refreshes at most about once a second whatever its
    /// partitions and commits, no commit waits for a refresh, and the
    /// offset the group commits (which `produce --wait` and `lag` watch)
    /// never passes a command a search cannot see yet.
    fn searchable(&mut self, force: bool) -> Result<bool, IndexError> {
        let Some((first, written)) = self.committed_writes else { return Ok(true) };
        if self.b.building {
            // Searched only after its cutover, which refreshes it; what a
            // fan-out's scan must read is refreshed by the scan
            // (`unsearchable` stays set for it).
            return Ok(true);
        }
        if self.b.refreshed_since(self.generation, written) {
            self.published(written);
            return Ok(true);
        }
        if !force && first.elapsed() < SEARCHABLE_WITHIN {
            return Ok(false);
        }
        self.refresh()?;
        Ok(true)
    }

    /// Whether a fan-out's scan can read this writer's writes a search may
    /// not see yet ([`Recent`]): once a refresh began after this writer
    /// opened the shard (the previous owner's writes are searchable), and
    /// while what it wrote since the last refresh stays under
    /// [`MAX_RECENT`]. Otherwise one refresh of the generation first
    /// (sending the buffered writes), which the fan-outs after it share.
    /// A failure leaves the caller to commit first, as before.
    ///
    /// The scan is read here ([`ElasticShard::small_scan`]) and kept for
    /// the [`Shard::rewrite_begin`] that follows. One of more than a page
    /// sends the buffered writes when it begins (its point in time must see
    /// them): with writes buffered, the caller commits them first.
    fn fan_out_reads_pending(&mut self, scan: &Scan, page_size: usize) -> bool {
        self.ready = None;
        if !self.scans_recent() {
            if let Err(error) = self.flush().and_then(|()| self.refresh()) {
                tracing::debug!(partition = self.partition, %error, "refreshing before a fan-out failed: the batch is committed first");
                return false;
            }
        }
        match self.small_scan(scan, page_size) {
            Ok(Some(whole)) => {
                self.ready = Some((scan.clone(), whole));
                true
            }
            Ok(None) => self.pending.is_empty(),
            Err(error) => {
                tracing::debug!(partition = self.partition, %error, "a fan-out's search failed: the batch is committed first");
                false
            }
        }
    }

    fn get(&mut self, kind: Kind, id: &str) -> Result<Option<Doc>, IndexError> {
        match self.read(kind, id)? {
            Read::Overlay(d) => Ok(d),
            // A tombstone reads as absent; its version is still the one to
            // write over.
            Read::Stored(v) => Ok(v.filter(|v| !is_tombstone(v)).map(|v| from_source(kind, &v))),
        }
    }

    /// The position of the document, or of the tombstone a delete left:
    /// a write older than a delete is refused like one older than a write.
    /// A version another partition wrote counts as newer than anything
    /// here (`u64::MAX`).
    fn position(&mut self, kind: Kind, id: &str) -> Result<Option<u64>, IndexError> {
        match self.read(kind, id)? {
            Read::Overlay(d) => Ok(d.as_ref().map(Doc::pos)),
            // Another partition's tombstone: absent for this partition.
            Read::Stored(Some(v)) if self.foreign(&v) && is_tombstone(&v) => Ok(None),
            // Another partition's document: newer than anything of this
            // partition (see `wins_over`); only a take-over replaces it.
            Read::Stored(Some(v)) if self.foreign(&v) => {
                owner_conflict(&self.b, kind, id, &v, self.partition);
                Ok(Some(u64::MAX))
            }
            Read::Stored(v) => Ok(v.map(|v| v[POS_FIELD].as_u64().unwrap_or(0))),
        }
    }

    /// One `_mget` of the documents not read yet. Best effort: on any
    /// failure the reads fall back to their own GETs. Versions read here
    /// may be overtaken before this writer's write, as those of a GET may:
    /// the writes are conditional on them, and a conflict is resolved by
    /// reading again.
    fn prefetches(&self) -> bool {
        true
    }

    fn prefetch_scans(&mut self, scans: &[Scan]) -> Result<(), IndexError> {
        self.expect_scans(scans)
    }

    /// While writing first, the upserts' own documents are not fetched
    /// (they are not read at all); the others are. Otherwise a window
    /// whose upsert reads found (nearly) nothing starts writing first.
    fn prefetch(&mut self, docs: &[Wanted]) -> Result<(), IndexError> {
        // Each document once, and an upsert's only if nothing else reads it.
        let mut wanted: Vec<((Kind, String), bool)> = Vec::new();
        for w in docs {
            let key = (w.kind, w.id.clone());
            if self.overlay.contains_key(&key) || self.prefetched.contains_key(&key) {
                continue;
            }
            match wanted.iter_mut().find(|(k, _)| *k == key) {
                Some((_, upsert)) => *upsert &= w.upsert,
                None => wanted.push((key, w.upsert)),
            }
        }
        if self.writing_first {
            wanted.retain(|(_, upsert)| !upsert);
        }
        if wanted.len() < 2 {
            return Ok(()); // one read is one request either way
        }
        let targets: Vec<(String, String)> = wanted.iter().map(|((k, id), _)| (self.target(*k, id), id.clone())).collect();
        match self.b.runtime.block_on(meta::mget_sources(&self.b.client, &targets)) {
            Ok(found) => {
                let (mut upserts, mut existing) = (0, 0);
                for ((key, upsert), got) in wanted.into_iter().zip(found) {
                    if let Some(got) = got {
                        if upsert {
                            upserts += 1;
                            existing += usize::from(got.is_some());
                        }
                        self.prefetched.insert(key, got);
                    }
                }
                if self.b.write_first == WriteFirst::WhenAbsent && upserts >= WRITE_FIRST_MIN_READS && existing * WRITE_FIRST_FOUND_AT_MOST <= upserts {
                    tracing::debug!(partition = self.partition, upserts, existing, "upserts' documents are absent: writing them first, unread");
                    self.writing_first = true;
                }
            }
            Err(e) => tracing::debug!(error = %e, "prefetching documents failed; each is read on its own"),
        }
        Ok(())
    }

    /// Writing first, a document this writer has neither read, fetched nor
    /// written since its last flush is taken for absent: the upsert is
    /// sent as a create, and a version found there makes it a conflict
    /// that [`Self::resolve`] decides by reading it, as it decides any.
    fn upsert_position(&mut self, kind: Kind, id: &str) -> Result<Option<u64>, IndexError> {
        if !self.writing_first {
            return self.position(kind, id);
        }
        let key = (kind, id.to_string());
        if self.overlay.contains_key(&key) || self.prefetched.contains_key(&key) || self.seen.contains_key(&key) {
            return self.position(kind, id);
        }
        self.seen.insert(key.clone(), None);
        // Written as a create: it can only have been absent.
        self.pre_images.entry(key.clone()).or_insert(None);
        self.assumed.insert(key);
        Ok(None)
    }

    fn put(&mut self, doc: Doc) -> Result<(), IndexError> {
        self.ready = None;
        self.recent.wrote(&doc);
        let op = self.write_op(doc.kind(), doc.id(), to_source(&doc));
        self.buffer(doc.kind(), op, doc.pos(), Write::Own);
        self.overlay.insert((doc.kind(), doc.id().to_string()), Some(doc));
        if self.pending.len() >= self.b.limits.max_docs {
            // Keep the buffer bounded; the overlay stays valid because GETs
            // are realtime.
            self.flush()?;
        }
        Ok(())
    }

    /// Over the source partition's version (its copy or its tombstone)
    /// whatever its position, and over one written before versions recorded
    /// their partition (whose position may be another partition's offset);
    /// over this partition's own only when older; over a third partition's
    /// never (see [`conflict::take_over`]).
    fn take_over(&mut self, doc: Doc, origin: &Origin) -> Result<u64, IndexError> {
        let from = origin.partition.or_else(|| self.b.partition_of(origin.key));
        // Read again: a version fetched ahead may predate the departure
        // this take-over waited for (`await_departure`).
        self.prefetched.remove(&(doc.kind(), doc.id().to_string()));
        let stored = match self.read(doc.kind(), doc.id())? {
            Read::Stored(v) => v,
            Read::Overlay(_) => None,
        };
        match conflict::take_over(self.partition, stored.as_ref(), from) {
            TakeOver::Guarded => return crate::index::put_guarded(self, doc),
            TakeOver::Refuse { held_by } => {
                let what = format!("a moved document is held by a partition other than the one it left ({from:?}): it moved on since (or this is a stale redelivery); not taken over");
                self.b.owner_conflict(doc.kind(), doc.id(), &held_by, self.partition, &what);
                return Ok(0);
            }
            TakeOver::Replace => {}
        }
        self.ready = None;
        self.recent.wrote(&doc);
        let op = self.write_op(doc.kind(), doc.id(), to_source(&doc));
        self.buffer(doc.kind(), op, doc.pos(), Write::TakeOver { from });
        self.overlay.insert((doc.kind(), doc.id().to_string()), Some(doc));
        if self.pending.len() >= self.b.limits.max_docs {
            self.flush()?;
        }
        Ok(1)
    }

    fn delete(&mut self, kind: Kind, id: &str, pos: u64) -> Result<(), IndexError> {
        self.tombstone(kind, id, pos, Write::Own)
    }

    fn delete_departed(&mut self, kind: Kind, id: &str, pos: u64) -> Result<(), IndexError> {
        self.tombstone(kind, id, pos, Write::Departed)
    }

    fn rewrite(&mut self, scan: &Scan, page_size: usize, rewrite: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<u64, IndexError> {
        crate::index::rewrite_in_pages(self, scan, page_size, rewrite)
    }

    /// A scan of at most a page, while this writer knows what a search
    /// may not see ([`ElasticShard::scans_recent`]), is read at once
    /// ([`ElasticShard::small_scan`]): no refresh, no point in time, and
    /// its rewrites join the buffered writes. A longer one is a point-in-
    /// time scan after a refresh.
    fn rewrite_begin(&mut self, scan: &Scan, page_size: usize) -> Result<Pages, IndexError> {
        if let Some((read, whole)) = self.ready.take() {
            if read == *scan {
                return Ok(Pages::one(crate::index::Cursor::ElasticWhole(whole)));
            }
        }
        if self.scans_recent() {
            if let Some(whole) = self.small_scan(scan, page_size)? {
                return Ok(Pages::one(crate::index::Cursor::ElasticWhole(whole)));
            }
        }
        self.fan_out_pages(scan, page_size)
    }

    fn rewrite_page(&mut self, pages: &mut Pages, rewrite: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<(u64, bool), IndexError> {
        self.fan_out_next(pages, rewrite)
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
    fn placement_taken(&self, generation: u64, moves: u64) -> bool {
        generation != self.generation || self.placement.moves() >= moves
    }

    fn commit(&mut self) -> Result<(), IndexError> {
        self.flush()?;
        if self.progress.changed() {
            let marked = self.progress.marked();
            if marked.checkpoint.is_some() {
                // The shard's progress in the form every backend shares,
                // with the topic and the owner's epoch.
                let mut body = marked.to_json();
                body.insert("topic".into(), json!(self.b.topic));
                body.insert(OWNER_FIELD.into(), json!(self.owner));
                // The parked keys in a document of their own, written when
                // they change (review of Elasticsearch, F12).
                let prepared = self.b.runtime.block_on(self.parked.prepare(&self.b.client, &self.b.prefix, &self.meta_id, self.owner, &mut body))?;
                let body = serde_json::Value::Object(body);
                let written = self.b.runtime.block_on(meta::put_meta_if(&self.b.client, &self.b.prefix, &self.meta_id, body, Some(self.meta_version)))?;
                match written {
                    Some(version) => {
                        self.meta_version = version;
                        self.b.runtime.block_on(self.parked.committed(&self.b.client, &self.b.prefix, prepared));
                    }
                    // Retryable: the worker drops this shard; a worker that
                    // still owns the partition claims it again on reopening.
                    None => return Err(IndexError::Fenced(format!("{}: the partition was claimed by another owner (this writer's epoch was {})", self.meta_id, self.owner))),
                }
            }
            self.progress.committed();
        }
        self.committed_writes = self.unsearchable.map(|last| (self.committed_writes.map_or(last, |(first, _)| first), last));
        // After the checkpoint: a fenced writer does not sweep.
        self.sweep_tombstones();
        Ok(())
    }
}
