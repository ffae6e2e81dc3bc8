//! The [`Backend`] operations on [`ElasticBackend`]: the log's identity,
//! the partitions' checkpoints, the current generation, claiming a
//! partition's shard writer, and the read view.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use elasticsearch::{CreateParts, MgetParts};
use serde_json::json;

use super::backend::{ElasticBackend, GENERATION_TTL};
use super::meta::{self, get_source};
use super::names::{self, OWNER_FIELD};
use super::shard::ElasticShard;
use super::{generations, json_or_status, ElasticError};
use crate::index::progress::{Progress, ProgressBook};
use crate::index::{Backend, Checkpoint, IndexError, SearchIndex, Shard};

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
        self.runtime.block_on(super::setup::model_decision(&self.client, &self.prefix, self.model, false))?;
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
            let r = self.runtime.block_on(self.client.create(CreateParts::IndexId(&index, &id)).body(body).send()).map_err(ElasticError::from)?;
            if r.status_code().as_u16() == 409 {
                continue; // another worker created it first: read theirs
            }
            self.runtime.block_on(json_or_status("recording the topic's partition count", r))?;
            return Ok(());
        }
    }

    /// One multi-get of the partitions' meta documents.
    fn applied(&self, partitions: &[i32]) -> Result<HashMap<i32, crate::index::progress::Applied>, IndexError> {
        if partitions.is_empty() {
            // A multi-get of nothing is refused (400, "no documents to get").
            return Ok(HashMap::new());
        }
        let g = self.generation()?;
        let ids: Vec<String> = partitions.iter().map(|p| self.partition_meta(g, *p)).collect();
        let index = self.meta_index();
        let r = self.runtime.block_on(self.client.mget(MgetParts::Index(&index)).body(json!({ "ids": ids })).send()).map_err(ElasticError::from)?;
        if r.status_code().as_u16() == 404 {
            return Ok(HashMap::new()); // no meta index yet: nothing applied
        }
        let v = self.runtime.block_on(json_or_status("reading the partitions' checkpoints", r))?;
        Ok(meta::applied_from_mget(partitions, &v)?)
    }

    fn checkpoints(&self, partitions: &[i32]) -> Result<HashMap<i32, Checkpoint>, IndexError> {
        Ok(crate::index::progress::checkpoints(self.applied(partitions)?))
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
        let meta_id = self.partition_meta(generation, partition);
        let mut attempts = 0;
        let (progress, owner, meta_version, parked) = loop {
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
                self.runtime.block_on(super::parked::inline(&self.client, &self.prefix, &mut body))?;
                break (Progress::from_json(&body), owner, written, super::parked::Spill::opened(&body));
            }
            // Another opener claimed it between the read and the write.
            attempts += 1;
            if attempts >= 5 {
                return Err(IndexError::Fenced(format!("{meta_id}: other owners kept claiming it")));
            }
        };
        tracing::debug!(meta = %meta_id, owner, "claimed the partition's shard");
        let placement = if self.building { self.placement(generation)? } else { self.placement_taken_by(generation, partition, owner)? };
        Ok(Box::new(ElasticShard::new(self.clone(), partition, (generation, placement), (meta_id, parked), owner, meta_version, ProgressBook::new(progress))))
    }

    fn commits_are_shared(&self) -> bool {
        true
    }

    fn search(&self) -> Result<Box<dyn SearchIndex>, IndexError> {
        Ok(Box::new(super::search::ElasticSearch { client: self.client.clone(), prefix: self.prefix.clone(), runtime: self.runtime.clone(), generation: self.pinned, model: self.model }))
    }
    fn record(&self, name: &str) -> Result<Option<serde_json::Value>, IndexError> {
        Ok(self.runtime.block_on(super::meta::get_meta(&self.client, &self.prefix, name))?)
    }
    fn save_record(&self, name: &str, v: &serde_json::Value) -> Result<(), IndexError> {
        Ok(self.runtime.block_on(super::meta::put_meta(&self.client, &self.prefix, name, v.clone()))?)
    }
}
