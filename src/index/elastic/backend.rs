//! The Elasticsearch backend's connection and the state its shard writers
//! share: the client, the index prefix, the bulk limits, the runtime, and
//! caches (the current generation, the last refreshes, the log's partition
//! count). The [`crate::index::Backend`] operations on it are in
//! [`super::ops`], its shard writers in [`super::shard`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use elasticsearch::Elasticsearch;
use tokio::runtime::Handle;

use super::bulk::{BulkLimits, RetryPolicy};
use super::names;
use super::placement::Placement;

/// Elasticsearch as a [`Backend`].
#[derive(Clone)]
pub struct ElasticBackend {
    pub client: Elasticsearch,
    pub prefix: String,
    pub topic: String,
    pub limits: BulkLimits,
    pub policy: RetryPolicy,
    /// Runtime the blocking shard methods run their requests on.
    pub runtime: Handle,
    /// A rebuild's writer works on this generation, whatever is current.
    pub pinned: Option<u64>,
    /// The generation is being built (a rebuild's writers): nothing
    /// searches it before its cutover, which refreshes it, so its writes
    /// need no refresh to be searchable ([`crate::index::Shard::searchable`]);
    /// a fan-out's scan still refreshes what it must read.
    pub building: bool,
    /// The current generation as last read, and when: every partition asks
    /// every 100 ms, the cluster is asked at most once per [`GENERATION_TTL`].
    pub(super) generation_cache: Arc<Mutex<Option<(Instant, u64)>>>,
    /// When the last refresh of a generation by a writer of this backend
    /// began (see [`Shard::searchable`]).
    pub(super) refreshed: Arc<Mutex<HashMap<u64, Instant>>>,
    /// The log's partition count, once bound ([`Backend::bind_log`]; 0:
    /// not yet): what finds the partition an owner change's document
    /// leaves.
    pub(super) log_partitions: Arc<AtomicI32>,
    /// When upserts are written without reading their documents first.
    pub write_first: WriteFirst,
    /// Where a rebuild's writers record the documents a command of theirs
    /// could not write because another key's partition held them (an owner
    /// change without its explicit form: which writer comes first decides,
    /// live and in a replay alike), as `kind/id`.
    pub conflicts: Option<Arc<Mutex<std::collections::BTreeSet<String>>>>,
    /// The placement a generation created by this backend gets (a rebuild's
    /// [`crate::index::Generations::prepare`]): `DENORM_ES_DEDICATED_TENANTS`.
    pub configured: Placement,
    /// Each generation's placement as recorded, read once: its tenants
    /// never change. A tenant's revision does (`rebuild --tenant`), which
    /// the writers do not read: they write through aliases, which the
    /// tenant's cutover moves. What names indexes reads the placement
    /// afresh (searches, a cutover, deleting a generation).
    pub(super) placements: Arc<Mutex<HashMap<u64, Arc<Placement>>>>,
    /// Prefixed to the names of the partitions' meta documents (`p<N>`):
    /// a tenant's rebuild keeps its shards' checkpoints apart from the
    /// live ones of the same generation (empty: the live ones).
    pub meta_scope: String,
    /// The declared model whose kinds the indexes hold beside the
    /// compiled-in ones ([`names::kinds`]).
    pub model: Option<&'static crate::domain::Domain>,
}

/// When a shard writes an upsert as a create without reading the document
/// first ([`crate::index::Shard::upsert_position`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteFirst {
    /// Once the guard reads of a window of commands found nearly every
    /// document absent (a replay or rebuild into empty indexes), until the
    /// creates meet too many existing documents.
    #[default]
    WhenAbsent,
    /// Always (tests: every conflict path of the creates).
    Always,
    /// Never: every upsert reads its document.
    Never,
}

/// How long after a write its shard refreshes, unless another writer of the
/// same backend did meanwhile: Elasticsearch's default `refresh_interval`.
pub const SEARCHABLE_WITHIN: Duration = Duration::from_secs(1);

/// How long the current generation read from the read alias is reused.
pub const GENERATION_TTL: Duration = Duration::from_secs(1);

impl ElasticBackend {
    /// A backend with the default bulk limits and retry policy.
    pub fn new(client: Elasticsearch, prefix: &str, topic: &str, runtime: Handle) -> Self {
        ElasticBackend {
            client,
            prefix: prefix.into(),
            topic: topic.into(),
            limits: BulkLimits::default(),
            policy: RetryPolicy::default(),
            runtime,
            pinned: None,
            building: false,
            generation_cache: Default::default(),
            refreshed: Default::default(),
            log_partitions: Default::default(),
            write_first: WriteFirst::default(),
            conflicts: None,
            configured: Placement::default(),
            placements: Default::default(),
            meta_scope: String::new(),
            model: None,
        }
    }

    /// The kinds this backend's indexes hold.
    pub fn kinds(&self) -> Vec<crate::index::Kind> {
        names::kinds(self.model)
    }

    /// This backend writing generation `g` as placed by `placement` (a
    /// tenant's rebuild), with its checkpoints under `meta_scope`.
    pub fn placed(&self, g: u64, placement: Placement, meta_scope: &str) -> Self {
        let mut b = self.clone();
        b.pinned = Some(g);
        b.building = true;
        b.placements = Arc::new(Mutex::new(HashMap::from([(g, Arc::new(placement))])));
        b.meta_scope = meta_scope.to_string();
        b
    }

    /// The name of partition `partition`'s meta document in generation `g`.
    pub fn partition_meta(&self, g: u64, partition: i32) -> String {
        names::meta_id(g, &format!("{}p{partition}", self.meta_scope))
    }

    /// Generation `g`'s placement (see [`super::placement`]).
    pub fn placement(&self, g: u64) -> Result<Arc<Placement>, crate::index::IndexError> {
        if let Some(p) = self.placements.lock().expect("placements lock").get(&g) {
            return Ok(p.clone());
        }
        let p = Arc::new(self.runtime.block_on(super::placement::read(&self.client, &self.prefix, g))?);
        self.placements.lock().expect("placements lock").insert(g, p.clone());
        Ok(p)
    }

    /// Generation `g`'s placement read afresh by the live writer of
    /// `partition` (claimed as owner epoch `owner`) as it opens its shard:
    /// once a tenant has moved between placements, the writer says in the
    /// index which placement it writes with, which the move waits for
    /// (see `crate::index::tenant_generations`).
    pub(super) fn placement_taken_by(&self, g: u64, partition: i32, owner: u64) -> Result<Arc<Placement>, crate::index::IndexError> {
        let p = Arc::new(self.runtime.block_on(super::placement::read(&self.client, &self.prefix, g))?);
        self.placements.lock().expect("placements lock").insert(g, p.clone());
        if p.moves() > 0 {
            let id = super::placement::acknowledged_id(g, partition);
            self.runtime.block_on(super::meta::put_meta(&self.client, &self.prefix, &id, serde_json::json!({"moves": p.moves(), "owner": owner})))?;
        }
        Ok(p)
    }

    /// A command of `partition` named a document another partition holds:
    /// counted, logged, and recorded for a rebuild.
    pub(super) fn owner_conflict(&self, kind: crate::index::Kind, id: &str, held_by: &dyn std::fmt::Display, partition: i32, what: &str) {
        metrics::counter!(crate::metrics::OWNER_CONFLICTS_TOTAL).increment(1);
        tracing::warn!(kind = kind.as_str(), id = %crate::command::tenant::Shown(id), held_by_partition = %held_by, partition, "{what}");
        if let Some(c) = &self.conflicts {
            c.lock().expect("conflicts lock").insert(format!("{}/{id}", kind.as_str()));
        }
    }

    /// The partition of `key` in the bound log (`None`: not bound).
    pub(super) fn partition_of(&self, key: &str) -> Option<i32> {
        match self.log_partitions.load(Ordering::Relaxed) {
            0 => None,
            n => Some(crate::command::partitioner::partition_of(key, n)),
        }
    }

    /// Whether a refresh of generation `g` began at or after `at`.
    pub(super) fn refreshed_since(&self, g: u64, at: Instant) -> bool {
        self.refreshed.lock().expect("refreshed lock").get(&g).is_some_and(|r| *r >= at)
    }

    /// Records a completed refresh of generation `g` that began at `started`.
    pub(super) fn record_refresh(&self, g: u64, started: Instant) {
        let mut r = self.refreshed.lock().expect("refreshed lock");
        let e = r.entry(g).or_insert(started);
        *e = (*e).max(started);
    }

    pub(super) fn meta_index(&self) -> String {
        names::meta_index(&self.prefix)
    }
}
