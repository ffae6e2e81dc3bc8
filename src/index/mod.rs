//! Index backends. A backend stores the three document kinds of DESIGN.md
//! section 2 per *shard* (one shard per topic partition: every document a
//! command can touch lives in the shard of that command's partition).
//!
//! The [`Shard`] trait is what the command logic in `apply/` drives; the
//! [`SearchIndex`] trait is what `denorm search` and the model checks read.

mod backend;
pub mod elastic;
pub mod embedded;
pub mod filter;
pub mod generations;
pub mod group;
pub mod memory;
pub mod model_doc;
pub mod open;
pub mod progress;
mod read;
pub mod recorded_model;
pub mod tenant_generations;

pub use backend::{verified_record, Backend, Verified, VERIFIED_PARTIAL_RECORD, VERIFIED_RECORD};
pub use model_doc::{CopyTarget, ModelDoc, ModelKind, ModelScan};
pub use read::{dump_order, AuthorGroup, FileQuery, PostQuery, Recorded, SearchIndex};

use serde::Serialize;

use crate::command::{path, tenant};

/// The document kinds: the compiled-in ones, and a declared model's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    File,
    User,
    Post,
    Model(ModelKind),
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::User => "user",
            Kind::Post => "post",
            Kind::Model(k) => k.as_str(),
        }
    }
}

/// A file document. `path` is the directory (exact); the tree of ancestors
/// is derived from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileDoc {
    pub id: String,
    pub name: String,
    pub path: String,
    pub contents: String,
    #[serde(skip)]
    pub pos: u64,
}

impl FileDoc {
    /// Builds the document of the file at full path `full`.
    pub fn at(id: &str, full: &str, contents: &str, pos: u64) -> Self {
        let (dir, name) = path::split(full);
        FileDoc { id: id.into(), name: name.into(), path: dir.into(), contents: contents.into(), pos }
    }

    pub fn full_path(&self) -> String {
        if path::is_root(&self.path) {
            format!("{}{}", self.path, self.name)
        } else {
            format!("{}/{}", self.path, self.name)
        }
    }

    /// `path.tree`: every ancestor of `path` and `path` itself.
    pub fn tree(&self) -> Vec<String> {
        path::tree(&self.path)
    }

    /// The document as its tenant sees it: its id and path as the producer
    /// wrote them (see [`crate::command::tenant`]).
    pub fn unscoped(mut self) -> Self {
        self.id = tenant::unscoped(&self.id).to_string();
        self.path = tenant::unscoped(&self.path).to_string();
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UserDoc {
    pub id: String,
    pub name: String,
    pub email: String,
    pub dob: String,
    #[serde(skip)]
    pub pos: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Author {
    pub id: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PostDoc {
    pub id: String,
    pub title: String,
    pub body: String,
    pub user: Author,
    #[serde(skip)]
    pub pos: u64,
}

impl PostDoc {
    /// The post as its tenant sees it: its id and its user's as the
    /// producer wrote them.
    pub fn unscoped(mut self) -> Self {
        self.id = tenant::unscoped(&self.id).to_string();
        self.user.id = tenant::unscoped(&self.user.id).to_string();
        self
    }
}

/// Any document. `pos` is the log position (offset within the shard's
/// partition) of the command that last wrote it: the idempotence guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Doc {
    File(FileDoc),
    User(UserDoc),
    Post(PostDoc),
    Model(Box<ModelDoc>),
}

impl Doc {
    pub fn kind(&self) -> Kind {
        match self {
            Doc::File(_) => Kind::File,
            Doc::User(_) => Kind::User,
            Doc::Post(_) => Kind::Post,
            Doc::Model(d) => Kind::Model(d.kind),
        }
    }
    pub fn id(&self) -> &str {
        match self {
            Doc::File(d) => &d.id,
            Doc::User(d) => &d.id,
            Doc::Post(d) => &d.id,
            Doc::Model(d) => &d.id,
        }
    }
    pub fn pos(&self) -> u64 {
        match self {
            Doc::File(d) => d.pos,
            Doc::User(d) => d.pos,
            Doc::Post(d) => d.pos,
            Doc::Model(d) => d.pos,
        }
    }
    /// The key that orders its commands: a file's top-level directory, a
    /// user's id, a post's user id.
    pub fn key(&self) -> String {
        match self {
            Doc::File(f) => crate::command::path::top_level(&f.full_path()).to_string(),
            Doc::User(u) => u.id.clone(),
            Doc::Post(p) => p.user.id.clone(),
            Doc::Model(d) => d.key.clone(),
        }
    }
    /// The same document without its bookkeeping, for comparisons.
    pub fn without_pos(mut self) -> Doc {
        match &mut self {
            Doc::File(d) => d.pos = 0,
            Doc::User(d) => d.pos = 0,
            Doc::Post(d) => d.pos = 0,
            Doc::Model(d) => d.pos = 0,
        }
        self
    }
}

/// The documents a fan-out command reads, streamed in pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scan {
    /// Files whose full path is `path` or lies beneath the directory `path`.
    FilesWithin { path: String },
    /// Posts of `user_id` whose copied author name differs from `name`.
    PostsOfUserNotNamed { user_id: String, name: String },
    /// A declared model's fan-out.
    Model(ModelScan),
}

impl Scan {
    /// The key whose documents the scan reads: a renamed path's top-level
    /// directory, a profile's user id (a fan-out touches its key's
    /// documents only; what crosses keys is a barrier in the worker).
    pub fn key(&self) -> &str {
        match self {
            Scan::FilesWithin { path: p } => path::top_level(p),
            Scan::PostsOfUserNotNamed { user_id, .. } => user_id,
            Scan::Model(m) => m.key(),
        }
    }

    /// The scan's definition, used by the in-memory backend; the other
    /// backends translate it into their query language.
    pub fn matches(&self, doc: &Doc) -> bool {
        match (self, doc) {
            (Scan::FilesWithin { path: p }, Doc::File(f)) => path::is_within(&f.full_path(), p),
            (Scan::PostsOfUserNotNamed { user_id, name }, Doc::Post(d)) => &d.user.id == user_id && &d.user.name != name,
            (Scan::Model(m), Doc::Model(d)) => m.matches(d),
            _ => false,
        }
    }
}

/// Failures of an index backend.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("shard {0} is locked by another writer")]
    Locked(String),
    #[error("index i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("index error: {0}")]
    Backend(String),
    #[error("index at {path} belongs to topic {found:?}, not {expected:?}")]
    WrongTopic { path: String, found: String, expected: String },
    /// The index was built from another log than the topic holds now
    /// (recreated topic, added partitions): only a rebuild can fix it.
    #[error("{0}")]
    LogMismatch(String),
    #[error("stored document is malformed: {0}")]
    Corrupt(String),
    #[error("rejected by the index: {0}")]
    Rejected(String),
    /// Another owner has claimed this shard's partition since this writer
    /// opened it: this writer may no longer record progress. Retried like
    /// an unavailable index: an abandoned writer stops, and a worker that
    /// still owns the partition reopens the shard, claiming it again.
    #[error("fenced: {0}")]
    Fenced(String),
    /// A backend's own error, kept as the cause, with what it means
    /// (Elasticsearch: transient when unreachable, 429 or 5xx; permanent
    /// otherwise).
    #[error("{source}")]
    Failed {
        kind: crate::retry::Kind,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// What to tell the operator when the index and the log disagree.
pub const REBUILD_FIX: &str = "the index must be rebuilt from the topic (`denorm rebuild`, see \"Rebuilding an index\" in the README)";

impl IndexError {
    /// The message of a partition count that differs from the recorded one.
    pub fn partitions_changed(recorded: i32, now: i32) -> Self {
        IndexError::LogMismatch(format!(
            "the index was built from a topic of {recorded} partitions, the topic now has {now}: \
             adding partitions moves keys to other partitions, so per-key order and the shards' \
             contents no longer hold; {REBUILD_FIX}, into a new topic with `denorm migrate`"
        ))
    }

    /// The message of a checkpoint whose message is not in the log any more.
    pub fn log_changed(partition: i32, offset: u64, detail: &str) -> Self {
        IndexError::LogMismatch(format!(
            "partition {partition}: the index's checkpoint is offset {offset}, but {detail}: \
             the topic was recreated or rewritten since the index was built; {REBUILD_FIX}"
        ))
    }

    /// What the failure means for the command at hand (see
    /// [`crate::retry::Kind`]).
    pub fn kind(&self) -> crate::retry::Kind {
        use crate::retry::Kind;
        match self {
            IndexError::Locked(_) | IndexError::Io(_) | IndexError::Backend(_) | IndexError::Fenced(_) => Kind::Transient,
            IndexError::Failed { kind, .. } => *kind,
            IndexError::Rejected(_) | IndexError::Corrupt(_) => Kind::Permanent,
            IndexError::WrongTopic { .. } | IndexError::LogMismatch(_) => Kind::Fatal,
        }
    }

    /// Whether retrying the same operation later may succeed.
    pub fn is_retryable(&self) -> bool {
        self.kind() == crate::retry::Kind::Transient
    }
}

/// Where a taken-over document comes from (see [`Shard::take_over`]): the
/// key it leaves and, where the caller knows it (a cross-key move's chunk
/// names it), that key's partition; otherwise a backend that needs it
/// derives it from the key and the log's partition count.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    pub key: &'a str,
    pub partition: Option<i32>,
}

/// A document the commands ahead read ([`Shard::prefetch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub kind: Kind,
    pub id: String,
    /// Read only for an upsert's position guard
    /// ([`Shard::upsert_position`]), not for its contents.
    pub upsert: bool,
}

impl Wanted {
    pub fn contents(kind: Kind, id: &str) -> Self {
        Wanted { kind, id: id.to_string(), upsert: false }
    }

    pub fn upsert(kind: Kind, id: &str) -> Self {
        Wanted { kind, id: id.to_string(), upsert: true }
    }
}

/// The position guard: true when a document last written at `doc_pos` may
/// be written by the command at `pos` (the rules in [`crate::apply`] and
/// every backend's writes obey it).
pub fn newer(pos: u64, doc_pos: u64) -> bool {
    pos > doc_pos
}

/// Writes `doc` unless the shard holds a version at least as new. Returns
/// the number of documents written.
pub fn put_guarded<S: Shard + ?Sized>(shard: &mut S, doc: Doc) -> Result<u64, IndexError> {
    match shard.upsert_position(doc.kind(), doc.id())? {
        Some(existing) if !newer(doc.pos(), existing) => Ok(0),
        Some(_) => shard.put(doc).map(|_| 1),
        None => shard.create(doc).map(|_| 1),
    }
}

/// A fan-out's rule: a document's new version, or `None` to leave it.
pub type Rewrite<'a> = dyn FnMut(&Doc) -> Option<Doc> + 'a;

/// [`Shard::rewrite`] as [`Shard::rewrite_begin`] and its pages, one after
/// the other (for a backend whose pages are its fan-out).
pub fn rewrite_in_pages<S: Shard + ?Sized>(shard: &mut S, scan: &Scan, page_size: usize, rewrite: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<u64, IndexError> {
    let mut pages = shard.rewrite_begin(scan, page_size)?;
    let mut written = 0;
    loop {
        let (n, done) = shard.rewrite_page(&mut pages, rewrite)?;
        written += n;
        if done {
            return Ok(written);
        }
    }
}

/// One shard's writer: the operations the command logic needs.
///
/// Writes become durable and visible at [`Shard::commit`]. A backend may
/// commit earlier on its own (before a read that must see pending writes);
/// such a commit records the last position given to [`Shard::mark_applied`],
/// so a command interrupted after it is re-applied, which the position
/// guards in `apply/` make harmless.
pub trait Shard {
    /// The document `kind`/`id` including uncommitted writes of this shard.
    fn get(&mut self, kind: Kind, id: &str) -> Result<Option<Doc>, IndexError>;
    /// The log position of the document `kind`/`id` (what the position
    /// guards read), including uncommitted writes of this shard.
    fn position(&mut self, kind: Kind, id: &str) -> Result<Option<u64>, IndexError> {
        Ok(self.get(kind, id)?.map(|d| d.pos()))
    }
    /// The position guard of an upsert: the position of the document
    /// `kind`/`id`, which the caller creates when it is absent and replaces
    /// when older. A backend whose writes are conditional may answer absent
    /// without reading, when it expects the document to be (writing
    /// first): the create then fails where a version exists, and that
    /// conflict is decided by the positions, as for a version read before
    /// another writer's.
    fn upsert_position(&mut self, kind: Kind, id: &str) -> Result<Option<u64>, IndexError> {
        self.position(kind, id)
    }
    /// A hint: the commands about to be applied read these documents
    /// (`crate::apply::reads`). A backend whose reads are round trips
    /// (Elasticsearch) fetches them in one request; the reads that follow
    /// take them from there unless this shard wrote them since. Others
    /// ignore it.
    fn prefetch(&mut self, _docs: &[Wanted]) -> Result<(), IndexError> {
        Ok(())
    }
    /// A hint: the fan-outs about to run scan these
    /// ([`crate::apply::fan_out_scan`]). A backend whose scans are round
    /// trips (Elasticsearch) reads the dependents of many owners (a
    /// profile change's posts) in one request, which the scans that follow
    /// take instead of a search each. Others ignore it.
    fn prefetch_scans(&mut self, _scans: &[Scan]) -> Result<(), IndexError> {
        Ok(())
    }
    /// Whether [`Shard::prefetch`] does anything (the caller then spends
    /// the decoding of the commands ahead only where it pays).
    fn prefetches(&self) -> bool {
        false
    }
    /// Creates or replaces the document with the same kind and id.
    fn put(&mut self, doc: Doc) -> Result<(), IndexError>;
    /// Creates a document [`Shard::position`] has just found absent
    /// (a backend may skip replacing what is not there).
    fn create(&mut self, doc: Doc) -> Result<(), IndexError> {
        self.put(doc)
    }
    /// Writes a document a cross-key move or an owner change brings to
    /// this shard's partition from `from` (see `crate::moves`), unless this
    /// partition wrote a newer version. Where shards share documents
    /// (Elasticsearch), it also replaces the source partition's copy or
    /// tombstone, whatever its position, and nothing of a third partition's.
    /// Returns the number of documents written.
    fn take_over(&mut self, doc: Doc, from: &Origin) -> Result<u64, IndexError> {
        let _ = from;
        put_guarded(self, doc)
    }
    /// Another partition's shard that holds the document this one does
    /// not, where shards are separate (the embedded index): a delete naming
    /// the wrong key then misses it. `None` where they share documents
    /// ([`Shard::position`] reports those).
    fn held_elsewhere(&mut self, _kind: Kind, _id: &str) -> Result<Option<i32>, IndexError> {
        Ok(None)
    }
    /// Whether the partitions' shards share one set of documents
    /// (Elasticsearch: a take-over replaces the other partition's copy)
    /// rather than each holding its own (the embedded index).
    fn shares_documents(&self) -> bool {
        false
    }
    /// Deletes the document, for the command at log position `pos` (a
    /// backend that must resolve a conflicting write uses it to let the
    /// newer of the two win).
    fn delete(&mut self, kind: Kind, id: &str, pos: u64) -> Result<(), IndexError>;

    /// [`Shard::delete`] by the source of a cross-key move, of a document
    /// it handed to the destination: where shards share documents, the
    /// destination may have taken it over already, which is no conflict.
    fn delete_departed(&mut self, kind: Kind, id: &str, pos: u64) -> Result<(), IndexError> {
        self.delete(kind, id, pos)
    }
    /// Streams the documents matching `scan` in pages of `page_size` and
    /// replaces each one for which `rewrite` returns a new version. Returns
    /// the number of documents rewritten.
    fn rewrite(&mut self, scan: &Scan, page_size: usize, rewrite: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<u64, IndexError>;
    /// Whether a fan-out's scan of `scan` (in pages of `page_size`) sees
    /// this shard's writes not committed yet, so that the caller need not
    /// commit them first (see docs/architecture.md, "Fan-outs without a
    /// commit of their own"). `false`: the caller commits before
    /// [`Shard::rewrite_begin`] or [`Shard::rewrite`], so that a refusal of
    /// one of those writes is traced to its own command. Asked right
    /// before the fan-out begins: a backend may read the scan here.
    fn fan_out_reads_pending(&mut self, _scan: &Scan, _page_size: usize) -> bool {
        false
    }
    /// Whether what this shard holds uncommitted has grown to where it
    /// should be committed, whatever the caller's batch (fan-outs that
    /// join a batch instead of committing on their own add to it).
    fn wants_commit(&self) -> bool {
        false
    }
    /// Starts a fan-out that [`Shard::rewrite_page`] runs a page at a time,
    /// between other writes of this shard (key lanes: the other keys'
    /// commands are applied between its pages). Its scan reads a snapshot
    /// of what is committed now, with this shard's pending writes where
    /// [`Shard::fan_out_reads_pending`] says so (otherwise the caller
    /// commits what it wrote first), and is not disturbed by later writes
    /// or commits. A page never undoes a later write: a document written
    /// since the scan began (moved to another key, deleted) is passed over
    /// (Elasticsearch: the page's writes are conditional on the versions it
    /// read; embedded: a document's current position is compared with the
    /// snapshot's once a write came; review of lanes, F4). The default runs
    /// the whole rewrite as one page.
    fn rewrite_begin(&mut self, scan: &Scan, page_size: usize) -> Result<Pages, IndexError> {
        Ok(Pages::new(Cursor::Whole { scan: scan.clone(), page_size }))
    }
    /// Rewrites the next page of `pages` (see [`Shard::rewrite`] for
    /// `rewrite`). Returns the documents written and whether the scan is
    /// complete. Dropping `pages` before then abandons the fan-out: the
    /// pages written stay, each guarded by its position.
    fn rewrite_page(&mut self, pages: &mut Pages, rewrite: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<(u64, bool), IndexError> {
        match pages.take() {
            Cursor::Whole { scan, page_size } => Ok((self.rewrite(&scan, page_size, rewrite)?, true)),
            other => Err(other.mismatch()),
        }
    }
    /// The shard's progress: what its last commit recorded, and what the
    /// next one records ([`progress::ProgressBook`], the same for every
    /// backend).
    fn progress(&self) -> &progress::ProgressBook;
    fn progress_mut(&mut self) -> &mut progress::ProgressBook;
    /// Records that every command up to and including `at.offset` is applied.
    fn mark_applied(&mut self, at: Checkpoint) {
        self.progress_mut().mark_applied(at, progress::DoneAbove::default());
    }
    /// The last position durably applied (survives restarts), with the
    /// fingerprint of the message there.
    fn checkpoint(&self) -> Option<Checkpoint> {
        self.progress().checkpoint()
    }
    /// The index generation this shard belongs to (see `denorm rebuild`).
    fn generation(&self) -> u64 {
        0
    }
    /// Whether this writer writes with a placement of tenants of generation
    /// `generation` counting `moves` moves or more, or writes another
    /// generation (a `PLACE` control message: a tenant moved between
    /// placements, see docs/tenants.md). A writer that does not is
    /// reopened, reading the placement afresh. Backends without placements
    /// always do.
    fn placement_taken(&self, _generation: u64, _moves: u64) -> bool {
        true
    }
    /// The last offset durably applied.
    fn applied(&self) -> Option<u64> {
        self.checkpoint().map(|c| c.offset)
    }
    /// The keys parked behind an aborted command, as of the last
    /// [`Shard::mark_applied`]; changes are committed with the position.
    fn parking(&mut self) -> &mut progress::Parking {
        self.progress_mut().parking()
    }
    /// The cross-key moves this shard has received completely, as of the
    /// last [`Shard::mark_applied`]; committed with the position like
    /// [`Shard::parking`] (see [`progress::Received`]).
    fn received(&mut self) -> &mut progress::Received {
        self.progress_mut().received()
    }
    /// Makes every write so far durable, with the position last marked
    /// applied. After a failed commit the caller drops the shard and opens
    /// it again (the worker re-applies the batch).
    fn commit(&mut self) -> Result<(), IndexError>;
    /// Whether every write committed so far is searchable. The worker
    /// publishes a commit's offset (what the group's offsets, `lag` and
    /// `produce --wait` show) only once it is. `force`: make it so now
    /// (when stopping). An index whose commit is a refresh (embedded)
    /// always is.
    fn searchable(&mut self, _force: bool) -> Result<bool, IndexError> {
        Ok(true)
    }
}

/// A fan-out in progress ([`Shard::rewrite_begin`]): the backend's cursor
/// over the snapshot it scans, and whether that scan was read whole when
/// it began (a fan-out of one page, which the caller runs at once rather
/// than in a lane). Only the backends see the cursor.
pub struct Pages {
    cursor: Cursor,
    one_page: bool,
}

/// Each backend's cursor over a fan-out's scan, one type each: a backend
/// handed another's answers [`Cursor::mismatch`].
pub(crate) enum Cursor {
    /// A backend that runs a fan-out as one page (the default of
    /// [`Shard::rewrite_begin`]).
    Whole { scan: Scan, page_size: usize },
    /// The embedded index's scan of its snapshot and pending writes.
    Embedded(embedded::Cursor),
    /// Elasticsearch: a scan read whole when it began.
    ElasticWhole(elastic::EsWhole),
    /// Elasticsearch: a point-in-time scan, a page at a time.
    Elastic(Box<elastic::EsPages>),
    /// Taken out by the one page of a fan-out that ran it.
    Taken,
}

impl Cursor {
    /// The error of a backend handed a cursor it did not make.
    pub(crate) fn mismatch(&self) -> IndexError {
        let what = match self {
            Cursor::Whole { .. } => "a whole scan",
            Cursor::Embedded(_) => "the embedded index's",
            Cursor::ElasticWhole(_) | Cursor::Elastic(_) => "Elasticsearch's",
            Cursor::Taken => "a finished fan-out's",
        };
        IndexError::Backend(format!("a fan-out's pages of another backend: {what}"))
    }
}

impl Pages {
    pub(crate) fn new(cursor: Cursor) -> Self {
        Pages { cursor, one_page: false }
    }

    /// The pages of a scan read whole when it began.
    pub(crate) fn one(cursor: Cursor) -> Self {
        Pages { cursor, one_page: true }
    }

    /// Whether the scan was read whole when it began: its one page writes
    /// what remains of the fan-out.
    pub fn is_one_page(&self) -> bool {
        self.one_page
    }

    pub(crate) fn cursor(&mut self) -> &mut Cursor {
        &mut self.cursor
    }

    /// The cursor taken out (a fan-out run in one page).
    pub(crate) fn take(&mut self) -> Cursor {
        std::mem::replace(&mut self.cursor, Cursor::Taken)
    }
}

/// A shard's durable position in its partition's log: the last offset
/// applied, and a fingerprint of the message at that offset, by which a
/// worker recognises the log the shard was built from (see `crate::logid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    pub offset: u64,
    /// `None` in checkpoints written before fingerprints were recorded.
    pub fingerprint: Option<u64>,
}

impl Checkpoint {
    pub fn new(offset: u64, fingerprint: u64) -> Self {
        Checkpoint { offset, fingerprint: Some(fingerprint) }
    }
}
