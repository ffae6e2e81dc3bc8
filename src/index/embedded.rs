//! Embedded index on tantivy: `<root>/shards/p<partition>/` is one tantivy
//! index per topic partition, written only by that partition's current
//! owner (tantivy's writer lock is an OS file lock, released when the owner
//! exits or dies), while searches read every shard. Each commit stores the
//! last applied log position in the commit payload, atomically with the
//! documents.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tantivy::collector::{Count, TopDocs};
use tantivy::query::{AllQuery, BooleanQuery, EnableScoring, Occur, Query, QueryParser, TermQuery};
use tantivy::schema::{Field, IndexRecordOption, Schema, Value, FAST, INDEXED, STORED, STRING, TEXT};
use tantivy::store::StoreReader;
use tantivy::{DocId, DocSet, Index, IndexReader, IndexWriter, ReloadPolicy, Searcher, TantivyDocument, Term, TERMINATED};

use crate::dlq::Parking;
use crate::moves::Received;

use super::{Author, AuthorGroup, Backend, Checkpoint, Doc, FileDoc, FileQuery, IndexError, Kind, PostDoc, PostQuery, Scan, SearchIndex, Shard, UserDoc};

const MARKER: &str = "denorm-index.json";
const CURRENT: &str = "CURRENT";

impl From<tantivy::TantivyError> for IndexError {
    fn from(e: tantivy::TantivyError) -> Self {
        match e {
            tantivy::TantivyError::LockFailure(_, msg) => IndexError::Locked(msg.unwrap_or_default()),
            tantivy::TantivyError::IoError(io) => IndexError::Io(std::io::Error::new(io.kind(), io.to_string())),
            other => IndexError::Backend(other.to_string()),
        }
    }
}

/// The tantivy fields. Dotted names of DESIGN.md map to underscores.
#[derive(Clone, Copy)]
struct Fields {
    doc_key: Field,
    kind: Field,
    id: Field,
    name: Field,
    path: Field,
    path_tree: Field,
    full_path: Field,
    contents: Field,
    user_name: Field,
    user_name_raw: Field,
    email: Field,
    dob: Field,
    user_id: Field,
    title: Field,
    body: Field,
    pos: Field,
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let f = Fields {
        doc_key: b.add_text_field("doc_key", STRING),
        kind: b.add_text_field("kind", STRING | STORED),
        id: b.add_text_field("id", STRING | STORED),
        name: b.add_text_field("name", STRING | STORED),
        path: b.add_text_field("path", STRING | STORED),
        path_tree: b.add_text_field("path_tree", STRING),
        full_path: b.add_text_field("full_path", STRING),
        contents: b.add_text_field("contents", TEXT | STORED),
        user_name: b.add_text_field("user_name", TEXT | STORED),
        user_name_raw: b.add_text_field("user_name_raw", STRING),
        email: b.add_text_field("email", STORED),
        dob: b.add_text_field("dob", STORED),
        user_id: b.add_text_field("user_id", STRING | STORED),
        title: b.add_text_field("title", TEXT | STORED),
        body: b.add_text_field("body", TEXT | STORED),
        pos: b.add_u64_field("pos", INDEXED | STORED | FAST),
    };
    (b.build(), f)
}

/// The committed shards of a generation directory, by partition: each
/// `p<N>` with a `meta.json` (a shard being created by its first owner has
/// none yet). None when the directory does not exist yet.
fn committed_shards(generation_dir: &Path) -> Result<Vec<(i32, PathBuf)>, IndexError> {
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

/// The checkpoint a committed shard directory records.
fn shard_checkpoint(dir: &Path) -> Result<Option<Checkpoint>, IndexError> {
    let payload = Index::open_in_dir(dir)?.load_metas()?.payload;
    Ok(payload.and_then(|p| serde_json::from_str::<CommitPayload>(&p).ok()).map(|c| c.checkpoint()))
}

/// A reader of a shard directory, reloaded only when asked.
fn open_reader(dir: &Path) -> Result<IndexReader, IndexError> {
    Ok(Index::open_in_dir(dir)?.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?)
}

fn doc_key(kind: Kind, id: &str) -> String {
    format!("{}:{id}", kind.as_str())
}

impl Fields {
    fn key_term(&self, kind: Kind, id: &str) -> Term {
        Term::from_field_text(self.doc_key, &doc_key(kind, id))
    }

    fn term(&self, field: Field, value: &str) -> Box<dyn Query> {
        Box::new(TermQuery::new(Term::from_field_text(field, value), IndexRecordOption::Basic))
    }

    fn to_tantivy(&self, doc: &Doc) -> TantivyDocument {
        let mut t = TantivyDocument::new();
        t.add_text(self.doc_key, doc_key(doc.kind(), doc.id()));
        t.add_text(self.kind, doc.kind().as_str());
        t.add_text(self.id, doc.id());
        t.add_u64(self.pos, doc.pos());
        match doc {
            Doc::File(d) => {
                t.add_text(self.name, &d.name);
                t.add_text(self.path, &d.path);
                for a in d.tree() {
                    t.add_text(self.path_tree, a);
                }
                t.add_text(self.full_path, d.full_path());
                t.add_text(self.contents, &d.contents);
            }
            Doc::User(d) => {
                t.add_text(self.user_name, &d.name);
                t.add_text(self.user_name_raw, &d.name);
                t.add_text(self.email, &d.email);
                t.add_text(self.dob, &d.dob);
            }
            Doc::Post(d) => {
                t.add_text(self.user_id, &d.user.id);
                t.add_text(self.user_name, &d.user.name);
                t.add_text(self.user_name_raw, &d.user.name);
                t.add_text(self.title, &d.title);
                t.add_text(self.body, &d.body);
            }
        }
        t
    }

    fn from_tantivy(&self, t: &TantivyDocument) -> Result<Doc, IndexError> {
        let s = |f: Field| t.get_first(f).and_then(|v| v.as_str()).unwrap_or("").to_string();
        let pos = t.get_first(self.pos).and_then(|v| v.as_u64()).unwrap_or(0);
        Ok(match s(self.kind).as_str() {
            "file" => Doc::File(FileDoc { id: s(self.id), name: s(self.name), path: s(self.path), contents: s(self.contents), pos }),
            "user" => Doc::User(UserDoc { id: s(self.id), name: s(self.user_name), email: s(self.email), dob: s(self.dob), pos }),
            "post" => Doc::Post(PostDoc {
                id: s(self.id),
                title: s(self.title),
                body: s(self.body),
                user: Author { id: s(self.user_id), name: s(self.user_name) },
                pos,
            }),
            other => return Err(IndexError::Corrupt(format!("unknown kind {other:?}"))),
        })
    }

    fn scan_query(&self, scan: &Scan) -> Box<dyn Query> {
        match scan {
            Scan::FilesWithin { path } => Box::new(BooleanQuery::new(vec![
                (Occur::Should, self.term(self.path_tree, path)),
                (Occur::Should, self.term(self.full_path, path)),
            ])),
            Scan::PostsOfUserNotNamed { user_id, name } => Box::new(BooleanQuery::new(vec![
                (Occur::Must, self.term(self.kind, "post")),
                (Occur::Must, self.term(self.user_id, user_id)),
                (Occur::MustNot, self.term(self.user_name_raw, name)),
            ])),
        }
    }
}

/// Streams the live documents matching `query` in `searcher`, one segment at
/// a time (memory does not grow with the number of matches).
fn stream(
    searcher: &Searcher,
    query: &dyn Query,
    visit: &mut dyn FnMut(&StoreReader, DocId) -> Result<(), IndexError>,
) -> Result<(), IndexError> {
    let weight = query.weight(EnableScoring::disabled_from_searcher(searcher))?;
    for segment in searcher.segment_readers() {
        let store = segment.get_store_reader(16)?;
        let mut scorer = weight.scorer(segment, 1.0)?;
        let mut doc = scorer.doc();
        while doc != TERMINATED {
            if !segment.is_deleted(doc) {
                visit(&store, doc)?;
            }
            doc = scorer.advance();
        }
    }
    Ok(())
}

/// First live document with `term` in `searcher`.
fn find(searcher: &Searcher, term: &Term) -> Result<Option<TantivyDocument>, IndexError> {
    find_with(searcher, term, &mut |segment, doc| Ok(segment.get_store_reader(1)?.get(doc)?))
}

/// `read` of the first live document with `term` in `searcher`.
fn find_with<T>(
    searcher: &Searcher,
    term: &Term,
    read: &mut dyn FnMut(&tantivy::SegmentReader, DocId) -> Result<T, IndexError>,
) -> Result<Option<T>, IndexError> {
    for segment in searcher.segment_readers() {
        let inverted = segment.inverted_index(term.field())?;
        if let Some(mut postings) = inverted.read_postings(term, IndexRecordOption::Basic)? {
            let mut doc = postings.doc();
            while doc != TERMINATED {
                if !segment.is_deleted(doc) {
                    return read(segment, doc).map(Some);
                }
                doc = postings.advance();
            }
        }
    }
    Ok(None)
}

/// Replaces the documents of one page: a single delete of all their keys,
/// then the new versions (added after the delete, so they stay). One
/// delete per page rather than per document: tantivy holds every delete
/// (about 1 KB for a term's) until all segments, including those being
/// merged, have seen it, so on a large index per-document deletes made a
/// fan-out's memory grow with its size.
fn replace_page(writer: &IndexWriter, f: &Fields, page: &[Doc]) -> Result<(), IndexError> {
    if page.is_empty() {
        return Ok(());
    }
    writer.delete_query(Box::new(tantivy::query::TermSetQuery::new(page.iter().map(|d| f.key_term(d.kind(), d.id())))))?;
    for doc in page {
        writer.add_document(f.to_tantivy(doc))?;
    }
    Ok(())
}

/// tantivy's `LogMergePolicy`, with no merge producing more than
/// `max_docs` documents. A merge holds per-document state (document id
/// mappings, field norms) for what it merges, so unbounded merges made a
/// shard's memory grow with its size: renaming a directory of 1,000,000
/// files raised a shard's peak heap by 50 % over one of 100,000, all of it
/// in merges (none with merges off). Sizes count live documents, so a
/// segment that deletes have thinned merges again.
#[derive(Debug)]
struct BoundedMergePolicy {
    log: tantivy::indexer::LogMergePolicy,
    max_docs: u32,
}

/// The shards' merge policy: merges of at most `max_docs` documents, or
/// tantivy's default (unbounded) for 0.
fn merge_policy(max_docs: u32) -> Box<dyn tantivy::indexer::MergePolicy> {
    if max_docs == 0 {
        Box::new(tantivy::indexer::LogMergePolicy::default())
    } else {
        Box::new(BoundedMergePolicy::new(max_docs))
    }
}

impl BoundedMergePolicy {
    fn new(max_docs: u32) -> Self {
        let mut log = tantivy::indexer::LogMergePolicy::default();
        // A segment over half the bound has little left to merge with.
        log.set_max_docs_before_merge((max_docs / 2) as usize);
        BoundedMergePolicy { log, max_docs }
    }
}

impl tantivy::indexer::MergePolicy for BoundedMergePolicy {
    fn compute_merge_candidates(&self, segments: &[tantivy::index::SegmentMeta]) -> Vec<tantivy::indexer::MergeCandidate> {
        let size: HashMap<_, _> = segments.iter().map(|s| (s.id(), s.num_docs())).collect();
        let mut bounded = Vec::new();
        for candidate in self.log.compute_merge_candidates(segments) {
            let (mut chunk, mut docs) = (Vec::new(), 0u32);
            for id in candidate.0 {
                let n = size.get(&id).copied().unwrap_or(0);
                if !chunk.is_empty() && docs.saturating_add(n) > self.max_docs {
                    if chunk.len() > 1 {
                        bounded.push(tantivy::indexer::MergeCandidate(std::mem::take(&mut chunk)));
                    }
                    chunk.clear();
                    docs = 0;
                }
                chunk.push(id);
                docs = docs.saturating_add(n);
            }
            if chunk.len() > 1 {
                bounded.push(tantivy::indexer::MergeCandidate(chunk));
            }
        }
        bounded
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Marker {
    format: u32,
    topic: String,
    /// The topic's partition count when the index was first run against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    partitions: Option<i32>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CommitPayload {
    applied: u64,
    /// Fingerprint of the message at `applied` (see `crate::logid`).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "super::hex_fingerprint")]
    fingerprint: Option<u64>,
    /// Keys parked behind an aborted command (see `dlq`).
    #[serde(default, skip_serializing_if = "Parking::is_empty")]
    parked: Parking,
    /// Cross-key moves received completely (see `moves`).
    #[serde(default, skip_serializing_if = "Received::is_empty")]
    received: Received,
}

impl CommitPayload {
    fn checkpoint(&self) -> Checkpoint {
        Checkpoint { offset: self.applied, fingerprint: self.fingerprint }
    }
}

/// The shard directory, with the `index.io` fault point on every write
/// (inactive unless built with the `failpoints` feature).
#[derive(Debug, Clone)]
struct ShardDirectory(tantivy::directory::MmapDirectory);

impl tantivy::Directory for ShardDirectory {
    fn get_file_handle(&self, path: &Path) -> Result<std::sync::Arc<dyn tantivy::directory::FileHandle>, tantivy::directory::error::OpenReadError> {
        self.0.get_file_handle(path)
    }
    fn delete(&self, path: &Path) -> Result<(), tantivy::directory::error::DeleteError> {
        self.0.delete(path)
    }
    fn exists(&self, path: &Path) -> Result<bool, tantivy::directory::error::OpenReadError> {
        self.0.exists(path)
    }
    fn open_write(&self, path: &Path) -> Result<tantivy::directory::WritePtr, tantivy::directory::error::OpenWriteError> {
        crate::faults::io("index.io").map_err(|e| tantivy::directory::error::OpenWriteError::wrap_io_error(e, path.to_path_buf()))?;
        self.0.open_write(path)
    }
    fn atomic_read(&self, path: &Path) -> Result<Vec<u8>, tantivy::directory::error::OpenReadError> {
        self.0.atomic_read(path)
    }
    fn atomic_write(&self, path: &Path, data: &[u8]) -> std::io::Result<()> {
        crate::faults::io("index.io")?;
        self.0.atomic_write(path, data)
    }
    fn sync_directory(&self) -> std::io::Result<()> {
        crate::faults::io("index.io")?;
        self.0.sync_directory()
    }
    fn acquire_lock(&self, lock: &tantivy::directory::Lock) -> Result<tantivy::directory::DirectoryLock, tantivy::directory::error::LockError> {
        self.0.acquire_lock(lock)
    }
    fn watch(&self, cb: tantivy::directory::WatchCallback) -> tantivy::Result<tantivy::directory::WatchHandle> {
        self.0.watch(cb)
    }
}

/// Replaces `path` with `data` at once: each writer writes its own temporary
/// file and renames it into place, so readers and concurrent writers only
/// ever see a whole file.
fn write_atomically(path: &Path, data: &[u8]) -> Result<(), IndexError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = path.with_file_name(format!("{name}.{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&tmp, data)?;
    std::fs::rename(tmp, path)?;
    Ok(())
}

/// An embedded index directory.
#[derive(Debug, Clone)]
pub struct EmbeddedIndex {
    root: PathBuf,
    /// The topic this handle works on, when it writes (checked against the
    /// marker by [`EmbeddedIndex::bind_log`]).
    topic: Option<String>,
}

impl EmbeddedIndex {
    /// Opens (creating when missing) the index directory for `topic`, and
    /// refuses one that belongs to another topic.
    pub fn open(root: &Path, topic: &str) -> Result<Self, IndexError> {
        std::fs::create_dir_all(root)?;
        let index = EmbeddedIndex { root: root.to_path_buf(), topic: Some(topic.into()) };
        match index.marker() {
            Ok(m) if m.topic != topic => Err(IndexError::WrongTopic { path: root.display().to_string(), found: m.topic, expected: topic.into() }),
            Ok(_) => Ok(index),
            Err(IndexError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                // Several workers may create the index at once.
                index.write_marker(&Marker { format: 1, topic: topic.into(), partitions: None })?;
                Ok(index)
            }
            Err(e) => Err(e),
        }
    }

    fn marker(&self) -> Result<Marker, IndexError> {
        let path = self.root.join(MARKER);
        let text = std::fs::read_to_string(&path)?;
        serde_json::from_str(&text).map_err(|e| IndexError::Corrupt(format!("{}: {e}", path.display())))
    }

    fn write_marker(&self, m: &Marker) -> Result<(), IndexError> {
        write_atomically(&self.root.join(MARKER), &serde_json::to_vec(m).expect("json"))
    }

    /// Opens (creating when missing) the index directory to rebuild it from
    /// `topic`, which may differ from the topic it was built from so far
    /// (after `denorm migrate`): the cutover records the new one.
    pub fn open_for_rebuild(root: &Path, topic: &str) -> Result<Self, IndexError> {
        match Self::open(root, topic) {
            Err(IndexError::WrongTopic { .. }) => Ok(EmbeddedIndex { root: root.to_path_buf(), topic: Some(topic.into()) }),
            other => other,
        }
    }

    /// Records the topic's partition count in the marker the first time,
    /// and refuses a different count afterwards (see [`Backend::bind_log`]).
    pub fn bind_log(&self, partitions: i32) -> Result<(), IndexError> {
        let mut m = self.marker()?;
        if let Some(topic) = self.topic.as_ref().filter(|t| **t != m.topic) {
            // A rebuild from another topic (after `denorm migrate`) cut over.
            return Err(IndexError::WrongTopic { path: self.root.display().to_string(), found: m.topic, expected: topic.clone() });
        }
        match m.partitions {
            Some(recorded) if recorded == partitions => Ok(()),
            Some(recorded) => Err(IndexError::LogMismatch(crate::logid::partitions_changed(recorded, partitions))),
            None => {
                m.partitions = Some(partitions);
                self.write_marker(&m)
            }
        }
    }

    /// The topic the index is built from (its marker).
    pub fn recorded_topic(&self) -> Result<String, IndexError> {
        Ok(self.marker()?.topic)
    }

    /// That topic's partition count, once a worker recorded it.
    pub fn recorded_partitions(&self) -> Result<Option<i32>, IndexError> {
        Ok(self.marker()?.partitions)
    }

    /// Records this handle's topic and `partitions` as the log the index is
    /// built from, replacing what was recorded (a rebuild's cutover: the new
    /// generation is built from the topic as it is now).
    pub fn rebind_log(&self, partitions: i32) -> Result<(), IndexError> {
        let mut m = self.marker()?;
        m.partitions = Some(partitions);
        if let Some(t) = &self.topic {
            m.topic = t.clone();
        }
        self.write_marker(&m)
    }

    /// How many of `generation`'s shards a writer holds right now (tried
    /// through tantivy's writer lock, released at once).
    pub fn writers_held(&self, generation: u64) -> Result<usize, IndexError> {
        let mut held = 0;
        let Ok(dirs) = std::fs::read_dir(self.generation_dir(generation)) else { return Ok(0) };
        for e in dirs {
            let dir = e?.path();
            let directory = tantivy::directory::MmapDirectory::open(&dir).map_err(|e| IndexError::Backend(e.to_string()))?;
            match tantivy::Directory::acquire_lock(&directory, &tantivy::directory::INDEX_WRITER_LOCK) {
                Ok(_lock) => {}
                Err(tantivy::directory::error::LockError::LockBusy) => held += 1,
                Err(e) => return Err(IndexError::Backend(format!("{}: {e}", dir.display()))),
            }
        }
        Ok(held)
    }

    /// Opens an index directory that must already exist (for searches).
    pub fn open_existing(root: &Path) -> Result<Self, IndexError> {
        if !root.join(MARKER).exists() {
            return Err(IndexError::Io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no denorm index at {} (run `denorm run` or `denorm demo` first, or pass --index)", root.display()),
            )));
        }
        Ok(EmbeddedIndex { root: root.to_path_buf(), topic: None })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The generation searches and live workers use: the number in
    /// `CURRENT`, 0 (the `shards` directory) when there is none. `denorm
    /// rebuild` builds the next generation beside it and switches `CURRENT`
    /// with one atomic rename.
    pub fn current_generation(&self) -> Result<u64, IndexError> {
        let path = self.root.join(CURRENT);
        match std::fs::read_to_string(&path) {
            Ok(text) => text.trim().parse().map_err(|e| IndexError::Corrupt(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Makes `generation` the one searches and live workers use.
    pub fn set_current_generation(&self, generation: u64) -> Result<(), IndexError> {
        write_atomically(&self.root.join(CURRENT), generation.to_string().as_bytes())
    }

    /// The directory of `generation`'s shards.
    pub fn generation_dir(&self, generation: u64) -> PathBuf {
        match generation {
            0 => self.root.join("shards"),
            g => self.root.join("generations").join(g.to_string()),
        }
    }

    /// Every generation with a directory, in order.
    pub fn generations(&self) -> Result<Vec<u64>, IndexError> {
        let mut out = vec![];
        if self.root.join("shards").is_dir() {
            out.push(0);
        }
        if let Ok(dirs) = std::fs::read_dir(self.root.join("generations")) {
            for e in dirs {
                if let Some(g) = e?.file_name().to_str().and_then(|n| n.parse().ok()) {
                    out.push(g);
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    fn shard_dir(&self, generation: u64, partition: i32) -> PathBuf {
        self.generation_dir(generation).join(format!("p{partition:04}"))
    }

    /// Opens the writer of `partition`'s shard in the current generation.
    /// Fails with [`IndexError::Locked`] while another process or thread
    /// owns it.
    pub fn open_shard(&self, partition: i32, memory_budget: usize) -> Result<EmbeddedShard, IndexError> {
        self.open_shard_in(self.current_generation()?, partition, memory_budget)
    }

    /// [`EmbeddedIndex::open_shard`] in `generation`.
    pub fn open_shard_in(&self, generation: u64, partition: i32, memory_budget: usize) -> Result<EmbeddedShard, IndexError> {
        let dir = self.shard_dir(generation, partition);
        std::fs::create_dir_all(&dir)?;
        let (schema, fields) = schema();
        let directory = tantivy::directory::MmapDirectory::open(&dir).map_err(|e| IndexError::Backend(e.to_string()))?;
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
        let payload = index.load_metas()?.payload.and_then(|p| serde_json::from_str::<CommitPayload>(&p).ok());
        let applied = payload.as_ref().map(CommitPayload::checkpoint);
        let (parked, received) = payload.map(|p| (p.parked, p.received)).unwrap_or_default();
        Ok(EmbeddedShard {
            name: format!("p{partition}"),
            siblings: Siblings { generation_dir: self.generation_dir(generation), partition, readers: HashMap::new() },
            generation,
            writer,
            reader,
            f: fields,
            overlay: HashMap::new(),
            pos_columns: HashMap::new(),
            dirty: false,
            fan_out_pending: false,
            marked: applied,
            applied,
            parked_marked: parked.clone(),
            parked,
            received_marked: received.clone(),
            received,
            fan_out_commit_every: DEFAULT_FAN_OUT_COMMIT_EVERY,
        })
    }

    /// A read-only view of every shard of the current generation, as
    /// committed so far.
    pub fn search(&self) -> Result<EmbeddedSearch, IndexError> {
        let mut shards = Vec::new();
        for (_, dir) in committed_shards(&self.generation_dir(self.current_generation()?))? {
            let index = Index::open_in_dir(&dir)?;
            let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?;
            shards.push((index, reader));
        }
        Ok(EmbeddedSearch { shards, f: schema().1 })
    }
}

impl EmbeddedIndex {
    /// Documents that more than one partition's shard of the current
    /// generation holds, as committed: `("kind:id", partitions)`. A
    /// document has one owner key, so this is an owner change written
    /// without its explicit form (docs/cross-key.md), or a move caught
    /// between its two sides. Reads every shard's `doc_key` terms once,
    /// merged in order, and checks the few found in several shards for a
    /// live document (deleted documents keep their terms until a merge).
    pub fn held_by_several_partitions(&self) -> Result<Vec<(String, Vec<i32>)>, IndexError> {
        use std::cmp::Reverse;
        let f = schema().1;
        let mut shards: Vec<(i32, Searcher)> = Vec::new();
        for (partition, dir) in committed_shards(&self.generation_dir(self.current_generation()?))? {
            shards.push((partition, open_reader(&dir)?.searcher()));
        }
        let mut inverted = Vec::new();
        for (i, (_, searcher)) in shards.iter().enumerate() {
            for segment in searcher.segment_readers() {
                inverted.push((i, segment.inverted_index(f.doc_key)?));
            }
        }
        let mut streams = Vec::with_capacity(inverted.len());
        for (i, ii) in &inverted {
            streams.push((*i, ii.terms().stream()?));
        }
        let mut heap = std::collections::BinaryHeap::new();
        for (k, (_, stream)) in streams.iter_mut().enumerate() {
            if stream.advance() {
                heap.push(Reverse((stream.key().to_vec(), k)));
            }
        }
        let mut out = Vec::new();
        while let Some(Reverse((key, k))) = heap.pop() {
            let mut holders = vec![streams[k].0];
            let mut next = vec![k];
            while heap.peek().is_some_and(|Reverse((other, _))| *other == key) {
                let Reverse((_, j)) = heap.pop().expect("peeked");
                holders.push(streams[j].0);
                next.push(j);
            }
            for j in next {
                if streams[j].1.advance() {
                    heap.push(Reverse((streams[j].1.key().to_vec(), j)));
                }
            }
            holders.sort_unstable();
            holders.dedup();
            if holders.len() < 2 {
                continue;
            }
            let key = String::from_utf8_lossy(&key).into_owned();
            let query = TermQuery::new(Term::from_field_text(f.doc_key, &key), IndexRecordOption::Basic);
            let mut live = Vec::new();
            for i in holders {
                if shards[i].1.search(&query, &Count)? > 0 {
                    live.push(shards[i].0);
                }
            }
            if live.len() > 1 {
                live.sort_unstable();
                out.push((key, live));
            }
        }
        Ok(out)
    }

    /// The checkpoint of each partition's shard, as of its last commit
    /// (shards never committed are left out).
    pub fn checkpoints(&self) -> Result<std::collections::BTreeMap<i32, Checkpoint>, IndexError> {
        self.checkpoints_in(self.current_generation()?)
    }

    /// [`EmbeddedIndex::checkpoints`] of `generation` (empty when it has no
    /// shards yet).
    pub fn checkpoints_in(&self, generation: u64) -> Result<std::collections::BTreeMap<i32, Checkpoint>, IndexError> {
        let mut out = std::collections::BTreeMap::new();
        for (p, dir) in committed_shards(&self.generation_dir(generation))? {
            if let Some(c) = shard_checkpoint(&dir)? {
                out.insert(p, c);
            }
        }
        Ok(out)
    }

    /// [`EmbeddedIndex::checkpoints_in`] of `partitions` only (what a
    /// waiting take-over polls).
    pub fn checkpoints_of(&self, generation: u64, partitions: &[i32]) -> Result<HashMap<i32, Checkpoint>, IndexError> {
        let mut out = HashMap::new();
        for &p in partitions {
            let dir = self.shard_dir(generation, p);
            if dir.join("meta.json").exists() {
                if let Some(c) = shard_checkpoint(&dir)? {
                    out.insert(p, c);
                }
            }
        }
        Ok(out)
    }
}

/// Bare tantivy with the shards' schema and no pipeline (no log, overlay,
/// position guards or checkpoints): the baselines `denorm bench` compares
/// the pipeline with.
pub mod raw {
    use super::*;

    const PAGE: usize = 1000;

    fn open(dir: &Path, memory_budget: usize) -> Result<(Index, IndexWriter, Fields), IndexError> {
        std::fs::create_dir_all(dir)?;
        let (schema, f) = schema();
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
            writer.add_document(f.to_tantivy(&d))?;
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
            if let Doc::File(mut d) = f.from_tantivy(&store.get(doc)?)? {
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
}

/// [`EmbeddedIndex`] as a [`Backend`] with a fixed writer memory budget.
#[derive(Debug, Clone)]
pub struct EmbeddedBackend {
    pub index: EmbeddedIndex,
    pub memory_budget: usize,
    /// A fan-out commits its progress after this many rewritten documents
    /// (see [`EmbeddedShard::set_fan_out_commit_every`]).
    pub fan_out_commit_every: u64,
    /// Bound of a shard's segment merges (see
    /// [`EmbeddedShard::set_merge_max_docs`]).
    pub merge_max_docs: u32,
    /// Writes go to this generation (a rebuild's) instead of the current one.
    pub pinned: Option<u64>,
}

impl EmbeddedBackend {
    pub fn new(index: EmbeddedIndex, memory_budget: usize) -> Self {
        EmbeddedBackend {
            index,
            memory_budget,
            fan_out_commit_every: DEFAULT_FAN_OUT_COMMIT_EVERY,
            merge_max_docs: DEFAULT_MERGE_MAX_DOCS,
            pinned: None,
        }
    }
}

/// Documents a fan-out rewrites between two commits of its progress.
pub const DEFAULT_FAN_OUT_COMMIT_EVERY: u64 = 50_000;

/// Default bound of a shard's segment merges, in documents (see
/// [`EmbeddedShard::set_merge_max_docs`]).
pub const DEFAULT_MERGE_MAX_DOCS: u32 = 100_000;

impl Backend for EmbeddedBackend {
    fn bind_log(&self, partitions: i32) -> Result<(), IndexError> {
        match self.pinned {
            // A rebuild's generation: the log it is built from is recorded at
            // its cutover.
            Some(_) => Ok(()),
            None => self.index.bind_log(partitions),
        }
    }
    fn checkpoints(&self, partitions: &[i32]) -> Result<HashMap<i32, Checkpoint>, IndexError> {
        self.index.checkpoints_of(self.generation()?, partitions)
    }
    fn generation(&self) -> Result<u64, IndexError> {
        match self.pinned {
            Some(g) => Ok(g),
            None => self.index.current_generation(),
        }
    }
    fn open_shard(&self, partition: i32) -> Result<Box<dyn Shard + Send>, IndexError> {
        let mut shard = self.index.open_shard_in(self.generation()?, partition, self.memory_budget)?;
        shard.set_fan_out_commit_every(self.fan_out_commit_every);
        shard.set_merge_max_docs(self.merge_max_docs);
        Ok(Box::new(shard))
    }
    fn search(&self) -> Result<Box<dyn SearchIndex>, IndexError> {
        Ok(Box::new(self.index.search()?))
    }
}

/// Readers of the other shards of a generation, opened when first needed.
struct Siblings {
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
    marked: Option<Checkpoint>,
    applied: Option<Checkpoint>,
    parked_marked: Parking,
    parked: Parking,
    received_marked: Received,
    received: Received,
    /// Rewritten documents between two commits of a fan-out's progress.
    fan_out_commit_every: u64,
}

/// An uncommitted single-document write of an [`EmbeddedShard`].
#[derive(Debug)]
struct Pending {
    /// The new version (`None`: deleted).
    doc: Option<Doc>,
    /// A version committed before must be deleted first.
    replaces: bool,
}

impl EmbeddedShard {
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
        if self.fan_out_pending {
            self.commit()?;
        }
        let searcher = self.reader.searcher();
        find(&searcher, &self.f.key_term(kind, id))?.map(|t| self.f.from_tantivy(&t)).transpose()
    }

    fn position(&mut self, kind: Kind, id: &str) -> Result<Option<u64>, IndexError> {
        if let Some(p) = self.overlay.get(&(kind, id.to_string())) {
            return Ok(p.doc.as_ref().map(Doc::pos));
        }
        if self.fan_out_pending {
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

    fn mark_applied(&mut self, at: Checkpoint) {
        self.marked = Some(at);
    }

    fn checkpoint(&self) -> Option<Checkpoint> {
        self.applied
    }

    fn generation(&self) -> u64 {
        self.generation
    }

    fn parking(&mut self) -> &mut Parking {
        &mut self.parked_marked
    }

    fn received(&mut self) -> &mut Received {
        &mut self.received_marked
    }

    fn commit(&mut self) -> Result<(), IndexError> {
        if !self.dirty && self.marked == self.applied && self.parked_marked == self.parked && self.received_marked == self.received {
            return Ok(());
        }
        if let Some(ids) = crate::faults::active("index.reject-commit") {
            if let Some((_, id)) = self.overlay.keys().find(|(_, id)| ids.lines().any(|l| l.trim() == id)) {
                return Err(IndexError::Rejected(format!("injected fault index.reject-commit: document {id}")));
            }
        }
        self.flush_overlay()?;
        let mut prepared = self.writer.prepare_commit()?;
        if let Some(at) = self.marked {
            let payload = CommitPayload {
                applied: at.offset,
                fingerprint: at.fingerprint,
                parked: self.parked_marked.clone(),
                received: self.received_marked.clone(),
            };
            prepared.set_payload(&serde_json::to_string(&payload).expect("json"));
        }
        prepared.commit()?;
        self.reader.reload()?;
        let live: std::collections::HashSet<_> = self.reader.searcher().segment_readers().iter().map(|s| s.segment_id()).collect();
        self.pos_columns.retain(|id, _| live.contains(id));
        self.overlay.clear();
        self.dirty = false;
        self.fan_out_pending = false;
        self.applied = self.marked;
        self.parked = self.parked_marked.clone();
        self.received = self.received_marked.clone();
        Ok(())
    }
}

/// Read-only view over every shard.
pub struct EmbeddedSearch {
    shards: Vec<(Index, IndexReader)>,
    f: Fields,
}

impl EmbeddedSearch {
    fn parse(&self, index: &Index, fields: Vec<Field>, text: &str) -> Result<Box<dyn Query>, IndexError> {
        QueryParser::for_index(index, fields)
            .parse_query(text)
            .map_err(|e| IndexError::Backend(format!("invalid query {text:?}: {e}")))
    }

    fn file_query(&self, index: &Index, q: &FileQuery) -> Result<Box<dyn Query>, IndexError> {
        let f = &self.f;
        let mut must = vec![(Occur::Must, f.term(f.kind, "file"))];
        if let Some(d) = &q.dir {
            must.push((Occur::Must, f.term(f.path, d)));
        }
        if let Some(d) = &q.under {
            must.push((Occur::Must, f.term(f.path_tree, d)));
        }
        if let Some(t) = &q.text {
            must.push((Occur::Must, self.parse(index, vec![f.contents], t)?));
        }
        Ok(Box::new(BooleanQuery::new(must)))
    }

    fn post_query(&self, index: &Index, q: &PostQuery) -> Result<Box<dyn Query>, IndexError> {
        let f = &self.f;
        let mut must = vec![(Occur::Must, f.term(f.kind, "post"))];
        if let Some(t) = &q.text {
            must.push((Occur::Must, self.parse(index, vec![f.title, f.body], t)?));
        }
        if let Some(a) = &q.author {
            must.push((Occur::Must, self.parse(index, vec![f.user_name], a)?));
        }
        Ok(Box::new(BooleanQuery::new(must)))
    }

    /// Best `limit` (0: all, unordered) matches over every shard.
    fn matches(
        &self,
        build: &dyn Fn(&Index) -> Result<Box<dyn Query>, IndexError>,
        limit: usize,
        out: &mut dyn FnMut(f32, Doc),
    ) -> Result<(), IndexError> {
        if limit == 0 {
            for (index, reader) in &self.shards {
                let q = build(index)?;
                stream(&reader.searcher(), q.as_ref(), &mut |store, doc| {
                    out(0.0, self.f.from_tantivy(&store.get(doc)?)?);
                    Ok(())
                })?;
            }
            return Ok(());
        }
        let mut hits: Vec<(f32, Doc)> = Vec::new();
        for (index, reader) in &self.shards {
            let searcher = reader.searcher();
            let q = build(index)?;
            for (score, addr) in searcher.search(q.as_ref(), &TopDocs::with_limit(limit))? {
                hits.push((score, self.f.from_tantivy(&searcher.doc(addr)?)?));
            }
        }
        hits.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (score, doc) in hits.into_iter().take(limit) {
            out(score, doc);
        }
        Ok(())
    }

    /// Sees what was committed since this view was opened (shards created
    /// since are not added).
    pub fn reload(&self) -> Result<(), IndexError> {
        for (_, reader) in &self.shards {
            reader.reload()?;
        }
        Ok(())
    }

    /// Whether the document is in the view.
    pub fn contains(&self, kind: Kind, id: &str) -> Result<bool, IndexError> {
        let term = self.f.key_term(kind, id);
        for (_, reader) in &self.shards {
            if find(&reader.searcher(), &term)?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn count(&self, build: &dyn Fn(&Index) -> Result<Box<dyn Query>, IndexError>) -> Result<usize, IndexError> {
        let mut n = 0;
        for (index, reader) in &self.shards {
            n += reader.searcher().search(build(index)?.as_ref(), &Count)?;
        }
        Ok(n)
    }
}

impl SearchIndex for EmbeddedSearch {
    fn files(&self, q: &FileQuery, limit: usize, out: &mut dyn FnMut(FileDoc)) -> Result<(), IndexError> {
        self.matches(&|i| self.file_query(i, q), limit, &mut |_, d| {
            if let Doc::File(f) = d {
                out(f)
            }
        })
    }

    fn posts(&self, q: &PostQuery, limit: usize, out: &mut dyn FnMut(PostDoc)) -> Result<(), IndexError> {
        self.matches(&|i| self.post_query(i, q), limit, &mut |_, d| {
            if let Doc::Post(p) = d {
                out(p)
            }
        })
    }

    fn posts_by_author(&self, q: &PostQuery, limit: usize, per_author: usize) -> Result<Vec<AuthorGroup>, IndexError> {
        let build = |i: &Index| self.post_query(i, q);
        let all = self.count(&build)?;
        let mut groups: HashMap<String, AuthorGroup> = HashMap::new();
        // Every match, best first: an author's first hit is its best.
        self.matches(&build, all.max(1), &mut |score, d| {
            let Doc::Post(p) = d else { return };
            let g = groups.entry(p.user.name.clone()).or_insert_with(|| AuthorGroup { author: p.user.name.clone(), best_score: score, posts: Vec::new() });
            if g.posts.len() < per_author {
                g.posts.push(p);
            }
        })?;
        let mut out: Vec<AuthorGroup> = groups.into_values().collect();
        out.sort_by(|a, b| b.best_score.total_cmp(&a.best_score).then_with(|| a.author.cmp(&b.author)));
        if limit > 0 {
            out.truncate(limit);
        }
        Ok(out)
    }

    fn dump(&self, out: &mut dyn FnMut(Doc)) -> Result<(), IndexError> {
        for (_, reader) in &self.shards {
            stream(&reader.searcher(), &AllQuery, &mut |store, doc| {
                out(self.f.from_tantivy(&store.get(doc)?)?);
                Ok(())
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::{apply, FanOut};
    use crate::command::Command;

    fn upsert(id: &str, p: &str) -> Command {
        Command::UpsertFile { id: id.into(), path: p.into(), contents: format!("hello {id}"), previous_path: None }
    }

    #[test]
    fn merges_never_produce_more_than_the_bound_and_take_at_least_two_segments() {
        use tantivy::indexer::MergePolicy;
        let index = Index::create_in_ram(schema().0);
        // Many small segments (one level for tantivy's policy), a few
        // large ones, and one over the bound.
        let sizes = [9_000u32; 30].iter().chain(&[40_000, 45_000, 48_000, 150_000]).copied().collect::<Vec<_>>();
        let metas: Vec<_> = sizes.iter().map(|&n| index.new_segment_meta(tantivy::index::SegmentId::generate_random(), n)).collect();
        let docs: HashMap<_, _> = metas.iter().map(|m| (m.id(), m.num_docs())).collect();
        let unbounded = tantivy::indexer::LogMergePolicy::default().compute_merge_candidates(&metas);
        assert!(unbounded.iter().any(|c| c.0.iter().map(|id| docs[id]).sum::<u32>() > 100_000), "the case must exceed the bound without it");
        let candidates = BoundedMergePolicy::new(100_000).compute_merge_candidates(&metas);
        assert!(!candidates.is_empty());
        let mut seen = std::collections::HashSet::new();
        for c in &candidates {
            assert!(c.0.len() >= 2, "{c:?}");
            assert!(c.0.iter().map(|id| docs[id]).sum::<u32>() <= 100_000, "{c:?}");
            assert!(c.0.iter().all(|id| seen.insert(*id)), "a segment in two merges");
        }
        // The small segments are all merged, in merges of 11 (99,000 documents).
        assert_eq!(candidates.iter().map(|c| c.0.len()).sum::<usize>(), 30);
        assert!(merge_policy(0).compute_merge_candidates(&metas).iter().any(|c| c.0.len() == 30));
    }

    #[test]
    fn shard_applies_commits_and_searches() {
        let dir = tempfile::tempdir().unwrap();
        let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
        let mut shard = idx.open_shard(0, 20_000_000).unwrap();
        let log = [
            upsert("a", "/c/p/es/README.txt"),
            upsert("b", "/c/p/x.txt"),
            Command::RenamePath { from: "/c/p".into(), to: "/c/w".into() },
            upsert("c", "/c/w/new.txt"),
        ];
        for (pos, c) in log.iter().enumerate() {
            apply(&mut shard, c, pos as u64, FanOut::pages_of(1)).unwrap();
            shard.mark_applied(Checkpoint::new(pos as u64, 0));
        }
        shard.commit().unwrap();
        assert_eq!(shard.applied(), Some(3));
        let s = idx.search().unwrap();
        let mut under = Vec::new();
        s.files(&FileQuery { under: Some("/c/w".into()), ..Default::default() }, 0, &mut |f| under.push(f.full_path())).unwrap();
        under.sort();
        assert_eq!(under, vec!["/c/w/es/README.txt", "/c/w/new.txt", "/c/w/x.txt"]);
        let mut text = Vec::new();
        s.files(&FileQuery { text: Some("hello".into()), dir: Some("/c/w/es".into()), ..Default::default() }, 5, &mut |f| text.push(f.id)).unwrap();
        assert_eq!(text, vec!["a"]);
        drop(shard);
        assert_eq!(idx.open_shard(0, 20_000_000).unwrap().applied(), Some(3));
    }

    #[test]
    fn positions_come_from_the_overlay_then_the_index_and_every_id_stays_unique() {
        let dir = tempfile::tempdir().unwrap();
        let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
        let mut shard = idx.open_shard(0, 20_000_000).unwrap();
        let del = |id: &str| Command::DeleteFile { id: id.into(), path: "/c/x.txt".into() };
        // Committed: a (pos 0), b (pos 1).
        apply(&mut shard, &upsert("a", "/c/a.txt"), 0, FanOut::pages_of(10)).unwrap();
        apply(&mut shard, &upsert("b", "/c/b.txt"), 1, FanOut::pages_of(10)).unwrap();
        shard.commit().unwrap();
        assert_eq!(shard.position(Kind::File, "a").unwrap(), Some(0));
        assert_eq!(shard.position(Kind::File, "zz").unwrap(), None);
        // One batch: a replaced twice, b deleted then created again, c
        // created then replaced, and a stale write of a that must not land.
        let batch = [(upsert("a", "/c/a2.txt"), 2), (upsert("a", "/c/a3.txt"), 3), (del("b"), 4), (upsert("b", "/c/b2.txt"), 5), (upsert("c", "/c/c.txt"), 6), (upsert("c", "/c/c2.txt"), 7)];
        for (c, pos) in &batch {
            assert_eq!(apply(&mut shard, c, *pos, FanOut::pages_of(10)).unwrap(), 1, "{c:?}");
        }
        assert_eq!(apply(&mut shard, &upsert("a", "/c/stale.txt"), 1, FanOut::pages_of(10)).unwrap(), 0);
        assert_eq!(shard.position(Kind::File, "b").unwrap(), Some(5));
        shard.commit().unwrap();
        let mut docs = Vec::new();
        idx.search().unwrap().dump(&mut |d| docs.push((d.id().to_string(), d.pos()))).unwrap();
        docs.sort();
        assert_eq!(docs, vec![("a".into(), 3), ("b".into(), 5), ("c".into(), 7)]);
        for (id, pos) in [("a", 3), ("b", 5), ("c", 7)] {
            assert_eq!(shard.position(Kind::File, id).unwrap(), Some(pos), "{id}");
        }
    }

    #[test]
    fn second_writer_of_a_shard_is_locked_out() {
        let dir = tempfile::tempdir().unwrap();
        let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
        let _owner = idx.open_shard(3, 20_000_000).unwrap();
        assert!(matches!(idx.open_shard(3, 20_000_000), Err(IndexError::Locked(_))));
    }

    #[test]
    fn concurrent_opens_of_a_new_index_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let p = dir.path().to_path_buf();
                std::thread::spawn(move || EmbeddedIndex::open(&p, "t").map(|_| ()))
            })
            .collect();
        for h in handles {
            h.join().unwrap().unwrap();
        }
    }

    #[test]
    fn refuses_an_index_of_another_topic() {
        let dir = tempfile::tempdir().unwrap();
        EmbeddedIndex::open(dir.path(), "a").unwrap();
        assert!(matches!(EmbeddedIndex::open(dir.path(), "b"), Err(IndexError::WrongTopic { .. })));
    }

    #[test]
    fn uncommitted_work_is_invisible_and_lost_on_crash() {
        let dir = tempfile::tempdir().unwrap();
        let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
        let mut shard = idx.open_shard(0, 20_000_000).unwrap();
        apply(&mut shard, &upsert("a", "/c/a.txt"), 0, FanOut::pages_of(10)).unwrap();
        shard.mark_applied(Checkpoint::new(0, 0));
        shard.commit().unwrap();
        apply(&mut shard, &Command::RenamePath { from: "/c/a.txt".into(), to: "/c/b.txt".into() }, 1, FanOut::pages_of(10)).unwrap();
        drop(shard); // no commit: as if the process died
        let mut paths = Vec::new();
        idx.search().unwrap().files(&FileQuery::default(), 0, &mut |f| paths.push(f.full_path())).unwrap();
        assert_eq!(paths, vec!["/c/a.txt"]);
        assert_eq!(idx.open_shard(0, 20_000_000).unwrap().applied(), Some(0));
    }

    /// A process killed while committing can leave files of the commit it
    /// never finished (here a segment's deletes, written before the new
    /// `meta.json`). Redoing the same commands gives the same file names, so
    /// the next owner must clear them first: this stalled a partition for
    /// good in the randomized test ("FileAlreadyExists ... .del" on every
    /// retry).
    #[test]
    fn files_of_a_commit_a_crash_cut_short_do_not_block_redoing_it() {
        let dir = tempfile::tempdir().unwrap();
        let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
        let meta = idx.shard_dir(0, 0).join("meta.json");
        let mut shard = idx.open_shard(0, 20_000_000).unwrap();
        apply(&mut shard, &upsert("a", "/c/a.txt"), 0, FanOut::pages_of(10)).unwrap();
        apply(&mut shard, &upsert("b", "/c/b.txt"), 1, FanOut::pages_of(10)).unwrap();
        shard.mark_applied(Checkpoint::new(1, 0));
        shard.commit().unwrap();
        drop(shard);
        let before = std::fs::read(&meta).unwrap();
        let del_files = || std::fs::read_dir(idx.shard_dir(0, 0)).unwrap().filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "del")).count();
        assert_eq!(del_files(), 0);
        // Replacing a deletes it in the committed segment: a .del file.
        let redo = |shard: &mut EmbeddedShard| -> Result<(), IndexError> {
            apply(shard, &upsert("a", "/c/a2.txt"), 2, FanOut::pages_of(10))?;
            shard.mark_applied(Checkpoint::new(2, 0));
            shard.commit()
        };
        // Opened afresh, as the next owner of the shard opens it: the same
        // commands then give the same file names.
        let mut shard = idx.open_shard(0, 20_000_000).unwrap();
        redo(&mut shard).unwrap();
        drop(shard);
        assert_eq!(del_files(), 1, "the commit wrote a segment's deletes");
        // As if killed before the new meta.json was in place: the files it
        // wrote stay (and tantivy's list of its files names them).
        std::fs::write(&meta, &before).unwrap();
        let mut shard = idx.open_shard(0, 20_000_000).unwrap();
        assert_eq!(shard.applied(), Some(1));
        assert_eq!(del_files(), 0, "opening the shard deleted the files of the commit cut short");
        redo(&mut shard).expect("the same commit again, over the files of the one cut short");
        drop(shard);
        let mut paths = Vec::new();
        idx.search().unwrap().files(&FileQuery::default(), 0, &mut |f| paths.push(f.full_path())).unwrap();
        paths.sort();
        assert_eq!(paths, vec!["/c/a2.txt", "/c/b.txt"]);
    }

    /// A fan-out commits its progress every few documents; a crash after
    /// that leaves the rename part-way at the previous command's position,
    /// and redelivering the rename finishes it with nothing lost or doubled.
    #[test]
    fn a_fan_out_commits_its_progress_and_redelivery_after_a_crash_finishes_it() {
        let dir = tempfile::tempdir().unwrap();
        let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
        let all_paths = || {
            let mut paths = Vec::new();
            idx.search().unwrap().files(&FileQuery::default(), 0, &mut |f| paths.push(f.full_path())).unwrap();
            paths.sort();
            paths
        };
        let mut shard = idx.open_shard(0, 20_000_000).unwrap();
        shard.set_fan_out_commit_every(10);
        for i in 0..95u64 {
            apply(&mut shard, &upsert(&format!("f{i}"), &format!("/c/old/f{i}.txt")), i, FanOut::pages_of(7)).unwrap();
            shard.mark_applied(Checkpoint::new(i, 0));
        }
        shard.commit().unwrap();
        let rename = Command::RenamePath { from: "/c/old".into(), to: "/c/new".into() };
        assert_eq!(apply(&mut shard, &rename, 95, FanOut::pages_of(7)).unwrap(), 95);
        drop(shard); // the process dies before the rename's own commit
        let midway = all_paths();
        let moved = midway.iter().filter(|p| p.starts_with("/c/new/")).count();
        assert_eq!(midway.len(), 95, "no file lost or doubled mid-way");
        assert!((10..95).contains(&moved), "progress was committed part-way ({moved} of 95 moved)");
        let mut shard = idx.open_shard(0, 20_000_000).unwrap();
        assert_eq!(shard.applied(), Some(94), "progress is committed at the previous command's position");
        // Redelivery of the rename.
        apply(&mut shard, &rename, 95, FanOut::pages_of(7)).unwrap();
        shard.mark_applied(Checkpoint::new(95, 0));
        shard.commit().unwrap();
        let want: Vec<String> = {
            let mut w: Vec<String> = (0..95).map(|i| format!("/c/new/f{i}.txt")).collect();
            w.sort();
            w
        };
        assert_eq!(all_paths(), want);
    }
}
