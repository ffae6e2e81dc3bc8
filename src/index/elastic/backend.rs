//! The Elasticsearch backend's connection and the state its shard writers
//! share: the client, the index prefix, the bulk limits, the runtime, and
//! caches (the current generation, the last refreshes, the log's partition
//! count); the [`crate::index::Backend`] operations on it. Its shard
//! writers are in [`super::shard`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use elasticsearch::{CreateParts, Elasticsearch, MgetParts};
use serde_json::json;
use tokio::runtime::Handle;

use super::bulk::{BulkLimits, RetryPolicy};
use super::meta::{self, checkpoints_from_mget, get_source};
use super::names::{self, OWNER_FIELD};
use super::shard::ElasticShard;
use super::{generations, json_or_status, ElasticError};
use crate::index::progress::{Progress, ProgressBook};
use crate::index::{Backend, Checkpoint, IndexError, SearchIndex, Shard};

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
            generation_cache: Default::default(),
            refreshed: Default::default(),
            log_partitions: Default::default(),
            write_first: WriteFirst::default(),
            conflicts: None,
        }
    }

    /// A command of `partition` named a document another partition holds:
    /// counted, logged, and recorded for a rebuild.
    pub(super) fn owner_conflict(&self, kind: crate::index::Kind, id: &str, held_by: &dyn std::fmt::Display, partition: i32, what: &str) {
        metrics::counter!(crate::metrics::OWNER_CONFLICTS_TOTAL).increment(1);
        tracing::warn!(kind = kind.as_str(), id, held_by_partition = %held_by, partition, "{what}");
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

    /// The meta document of the last `denorm verify`.
    pub(super) fn read_verified(&self) -> Result<Option<crate::index::Verified>, crate::index::IndexError> {
        let got = self.runtime.block_on(super::meta::get_meta(&self.client, &self.prefix, names::VERIFIED))?;
        got.map(|v| serde_json::from_value(v).map_err(|e| crate::index::IndexError::Corrupt(format!("meta document {}: {e}", names::VERIFIED)))).transpose()
    }

    pub(super) fn write_verified(&self, v: &crate::index::Verified) -> Result<(), crate::index::IndexError> {
        let body = serde_json::to_value(v).map_err(|e| crate::index::IndexError::Backend(e.to_string()))?;
        Ok(self.runtime.block_on(super::meta::put_meta(&self.client, &self.prefix, names::VERIFIED, body))?)
    }
}

impl Backend for ElasticBackend {
    /// The meta document `log` holds the topic and its partition count; it
    /// is created once (`op_type=create`: of two workers starting together
    /// one creates it, the other reads it) and compared afterwards.
    fn bind_log(&self, partitions: i32) -> Result<(), IndexError> {
        self.log_partitions.store(partitions, Ordering::Relaxed);
        if self.pinned.is_some() {
            // A rebuild's generation: its log is recorded at its cutover.
            return Ok(());
        }
        let index = self.meta_index();
        let id = names::meta_id(self.generation()?, "log");
        loop {
            if let Some((v, _)) = self.runtime.block_on(get_source(&self.client, &index, &id))? {
                let topic = v["topic"].as_str().unwrap_or_default();
                if topic != self.topic {
                    return Err(IndexError::WrongTopic { path: self.prefix.clone(), found: topic.into(), expected: self.topic.clone() });
                }
                return match v["partitions"].as_i64() {
                    Some(n) if n == i64::from(partitions) => Ok(()),
                    Some(n) => Err(IndexError::partitions_changed(n as i32, partitions)),
                    None => Err(IndexError::Corrupt(format!("{index}/{id} has no partition count: {v}"))),
                };
            }
            let body = json!({"topic": self.topic, "partitions": partitions});
            let r = self
                .runtime
                .block_on(self.client.create(CreateParts::IndexId(&index, &id)).body(body).send())
                .map_err(ElasticError::from)?;
            if r.status_code().as_u16() == 409 {
                continue; // another worker created it first: read theirs
            }
            self.runtime.block_on(json_or_status("recording the topic's partition count", r))?;
            return Ok(());
        }
    }

    /// One multi-get of the partitions' meta documents.
    fn checkpoints(&self, partitions: &[i32]) -> Result<HashMap<i32, Checkpoint>, IndexError> {
        let g = self.generation()?;
        let ids: Vec<String> = partitions.iter().map(|p| names::meta_id(g, &format!("p{p}"))).collect();
        let index = self.meta_index();
        let r = self
            .runtime
            .block_on(self.client.mget(MgetParts::Index(&index)).body(json!({ "ids": ids })).send())
            .map_err(ElasticError::from)?;
        if r.status_code().as_u16() == 404 {
            return Ok(HashMap::new()); // no meta index yet: nothing applied
        }
        let v = self.runtime.block_on(json_or_status("reading the partitions' checkpoints", r))?;
        Ok(checkpoints_from_mget(partitions, &v)?)
    }

    /// The pinned generation, or the one the read alias points at (read
    /// again at most once per [`GENERATION_TTL`]).
    fn generation(&self) -> Result<u64, IndexError> {
        if let Some(g) = self.pinned {
            return Ok(g);
        }
        let mut cache = self.generation_cache.lock().expect("generation cache lock");
        if let Some((at, g)) = *cache {
            if at.elapsed() < GENERATION_TTL {
                return Ok(g);
            }
        }
        let g = self.runtime.block_on(generations::current(&self.client, &self.prefix))?;
        *cache = Some((Instant::now(), g));
        Ok(g)
    }

    /// Opens partition `partition`'s shard and claims it: its meta document
    /// is rewritten with the next owner epoch, conditionally on the version
    /// just read, and every later checkpoint write is conditional on the
    /// version this owner wrote. A previous owner still running (abandoned
    /// by a shutdown bound or a rebalance) can then no longer move the
    /// checkpoint or the parked keys: its next write finds another version
    /// and fails as fenced.
    fn open_shard(&self, partition: i32) -> Result<Box<dyn Shard + Send>, IndexError> {
        let generation = self.generation()?;
        let meta_id = names::meta_id(generation, &format!("p{partition}"));
        let mut attempts = 0;
        let (progress, owner, meta_version) = loop {
            let meta = self.runtime.block_on(get_source(&self.client, &self.meta_index(), &meta_id))?;
            let (mut body, version) = match meta {
                Some((v, version)) => {
                    let topic = v["topic"].as_str().unwrap_or_default();
                    if topic != self.topic {
                        return Err(IndexError::WrongTopic { path: self.prefix.clone(), found: topic.into(), expected: self.topic.clone() });
                    }
                    (v, Some(version))
                }
                None => (json!({"topic": self.topic}), None),
            };
            let owner = body[OWNER_FIELD].as_u64().unwrap_or(0) + 1;
            body[OWNER_FIELD] = json!(owner);
            if let Some(written) = self.runtime.block_on(meta::put_meta_if(&self.client, &self.prefix, &meta_id, body.clone(), version))? {
                break (Progress::from_json(&body), owner, written);
            }
            // Another opener claimed it between the read and the write.
            attempts += 1;
            if attempts >= 5 {
                return Err(IndexError::Fenced(format!("{meta_id}: other owners kept claiming it")));
            }
        };
        tracing::debug!(meta = %meta_id, owner, "claimed the partition's shard");
        Ok(Box::new(ElasticShard::new(self.clone(), partition, generation, meta_id, owner, meta_version, ProgressBook::new(progress))))
    }

    fn search(&self) -> Result<Box<dyn SearchIndex>, IndexError> {
        Ok(Box::new(super::search::ElasticSearch { client: self.client.clone(), prefix: self.prefix.clone(), runtime: self.runtime.clone(), generation: self.pinned }))
    }
    fn verified(&self) -> Result<Option<crate::index::Verified>, IndexError> {
        self.read_verified()
    }
    fn record_verified(&self, v: &crate::index::Verified) -> Result<(), IndexError> {
        self.write_verified(v)
    }
}
