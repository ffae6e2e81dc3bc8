//! Index generations, what `denorm rebuild` builds and switches between:
//! one implementation per backend. A generation is a complete index built
//! from the log; exactly one is current (read by searches, written by live
//! workers), and a rebuild builds the next one beside it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::elastic::{backend::ElasticBackend, bulk_load, generations, meta, names, placement, ElasticError};
use super::embedded::{EmbeddedBackend, EmbeddedIndex};
use super::{Backend, Checkpoint, IndexError, Kind};
use crate::retry::Polled;

/// The rebuild in progress (`<index>/REBUILD`, or the meta document
/// `rebuild` on Elasticsearch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// The generation being built.
    pub generation: u64,
    /// The consumer group of the rebuild's worker.
    pub group: String,
    /// The topic it is built from, and its partition count (absent in
    /// states written before they were recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<i32>,
    /// Documents the rebuild's writers could not write because another
    /// key's partition held them ([`Generations::owner_conflicts`]), kept
    /// across a resumed run; at most [`State::CONFLICTS_KEPT`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_conflicts: Vec<String>,
    /// How many there were in all.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub owner_conflicts_total: usize,
    /// How many processes build it (`rebuild --members`); 1 when absent.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub members: u32,
    /// Set when every partition had caught up: the end offsets of the
    /// partitions as of that check. Each member then stops its worker and
    /// reports it; a resumed member that finds it set builds nothing more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_at: Option<Vec<i64>>,
    /// Which stop this is: a stop withdrawn (a member's work turned out not
    /// durable) is followed by another, with the next epoch.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub epoch: u64,
}

impl Default for State {
    fn default() -> Self {
        State { generation: 0, group: String::new(), topic: None, partitions: None, owner_conflicts: Vec::new(), owner_conflicts_total: 0, members: 1, stop_at: None, epoch: 0 }
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// What a member of a rebuild (`rebuild --members N --member I`) reports
/// to the member that cuts over (member 0), in the index beside the state:
/// `<index>/REBUILD-MEMBER-I`, or the meta document `rebuild-member-I`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberReport {
    pub generation: u64,
    pub member: u32,
    /// The state's epoch this report is of.
    pub epoch: u64,
    /// Its worker stopped (committed, released its writers) for that
    /// epoch's stop.
    pub stopped: bool,
    /// Per partition its worker read, the offset it had read to (past
    /// transaction markers, which no checkpoint covers).
    pub positions: BTreeMap<i32, i64>,
    /// Documents its writers could not write for another partition's
    /// holding them (see [`Generations::owner_conflicts`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_conflicts: Vec<String>,
}

impl State {
    pub const CONFLICTS_KEPT: usize = 100;

    /// Records `found`, every document this run of the rebuild could not
    /// write for another partition's holding it, on top of `before` found by
    /// earlier runs; whether the state changed.
    pub fn record_conflicts(&mut self, found: &[String], before: usize) -> bool {
        // Never fewer than recorded: a member's report that a restart
        // emptied takes nothing back.
        let total = (before + found.len()).max(self.owner_conflicts_total);
        let mut changed = total != self.owner_conflicts_total;
        self.owner_conflicts_total = total;
        for d in found {
            if self.owner_conflicts.len() >= Self::CONFLICTS_KEPT {
                break;
            }
            if !self.owner_conflicts.contains(d) {
                self.owner_conflicts.push(d.clone());
                changed = true;
            }
        }
        changed
    }
}

/// What a rebuild needs of an index's generations; one implementation per
/// backend.
pub trait Generations: Send + Sync {
    /// The generation searches and live workers use.
    fn current(&self) -> Result<u64, IndexError>;
    /// Every generation that exists, in order.
    fn list(&self) -> Result<Vec<u64>, IndexError>;
    /// A record of the rebuild kept with the index (see
    /// [`Backend::record`]): `rebuild` its state, `rebuild-member-I` a
    /// member's report.
    fn record(&self, name: &str) -> Result<Option<serde_json::Value>, IndexError>;
    /// Writes a record whole (a torn one would stop every rebuild).
    fn save_record(&self, name: &str, v: serde_json::Value) -> Result<(), IndexError>;
    fn clear_record(&self, name: &str) -> Result<(), IndexError>;
    fn state(&self) -> Result<Option<State>, IndexError> {
        self.record(STATE)?.map(|v| serde_json::from_value(v).map_err(|e| IndexError::Corrupt(format!("reading the rebuild's state: {e}")))).transpose()
    }
    fn save_state(&self, s: &State) -> Result<(), IndexError> {
        self.save_record(STATE, serde_json::to_value(s).map_err(|e| IndexError::Corrupt(format!("writing the rebuild's state: {e}")))?)
    }
    fn clear_state(&self) -> Result<(), IndexError> {
        self.clear_record(STATE)
    }
    /// Member `member`'s report, if it wrote one.
    fn member_report(&self, member: u32) -> Result<Option<MemberReport>, IndexError> {
        let name = member_record(member);
        self.record(&name)?.map(|v| serde_json::from_value(v).map_err(|e| IndexError::Corrupt(format!("reading the record {name}: {e}")))).transpose()
    }
    fn save_member_report(&self, r: &MemberReport) -> Result<(), IndexError> {
        self.save_record(&member_record(r.member), serde_json::to_value(r).map_err(|e| IndexError::Corrupt(format!("writing a member's report: {e}")))?)
    }
    fn clear_member_report(&self, member: u32) -> Result<(), IndexError> {
        self.clear_record(&member_record(member))
    }
    /// The topic the current generation was built from.
    fn recorded_topic(&self) -> Result<String, IndexError>;
    /// The partition count of that topic when the current generation was
    /// built (`None`: not recorded yet, no worker has run).
    fn recorded_partitions(&self) -> Result<Option<i32>, IndexError>;
    /// The checkpoints of generation `g`'s shards (of `partitions`).
    fn checkpoints_in(&self, g: u64, partitions: i32) -> Result<BTreeMap<i32, Checkpoint>, IndexError>;
    /// Makes generation `g` ready to be written (created when missing),
    /// recording the model its writers hold ([`Generations::writer`]); one
    /// recorded already (a resumed rebuild) must be that model.
    fn prepare(&self, g: u64) -> Result<(), IndexError>;
    /// What generation `g` records of its model
    /// ([`crate::index::recorded_model::record_of`]; `None`: the compiled-in
    /// kinds alone).
    fn model_record(&self, g: u64) -> Result<Option<serde_json::Value>, IndexError>;
    /// A backend whose shard writers work on generation `g`.
    fn writer(&self, g: u64) -> Arc<dyn Backend>;
    /// Records the log `to` was built from (this topic, `partitions`), makes
    /// it searchable and switches searches and live workers to it.
    fn cut_over(&self, from: u64, to: u64, partitions: i32) -> Result<(), IndexError>;
    /// Deletes generation `g` once nothing writes to it.
    fn remove(&self, g: u64, partitions: i32) -> Result<(), IndexError>;
    /// The documents the writers of [`Generations::writer`] could not write
    /// because another key's partition held them, as `kind/id`: where
    /// partitions share documents, which writer comes first decides (an
    /// owner change without its explicit form), and a replay may decide
    /// otherwise than the live run. None where shards are separate.
    fn owner_conflicts(&self) -> Vec<String> {
        Vec::new()
    }
    /// The tenants whose own indexes a rebuild of one tenant
    /// (`rebuild --tenant`) is rebuilding now: a rebuild of every tenant
    /// waits for them. None where tenants have no indexes of their own.
    fn tenant_rebuilds(&self) -> Result<Vec<String>, IndexError> {
        Ok(Vec::new())
    }
}

/// The record of the rebuild's state (`<index>/REBUILD`, the meta
/// document `rebuild`).
const STATE: &str = "rebuild";

/// The name the record `name` of a rebuild of `tenant`'s own indexes
/// (`rebuild --tenant`) is kept under: the rebuild's own (`rebuild`,
/// `rebuild-member-I`) beside a rebuild of every tenant's; the others
/// (the workers' settings) are the index's.
pub fn tenant_record(tenant: &str, name: &str) -> String {
    match name.starts_with(STATE) {
        true => format!("t-{tenant}-{name}"),
        false => name.to_string(),
    }
}

/// The record of a member's report.
fn member_record(member: u32) -> String {
    format!("{STATE}-member-{member}")
}

/// The embedded index's record of generation `g`'s model.
fn model_record_name(g: u64) -> String {
    format!("model-g{g}")
}

/// Generations of the embedded index (`<index>/CURRENT`, `generations/N/`).
pub struct EmbeddedGenerations {
    pub index: EmbeddedIndex,
    /// Indexing memory budget of each shard writer.
    pub budget: usize,
}

impl Generations for EmbeddedGenerations {
    fn current(&self) -> Result<u64, IndexError> {
        self.index.current_generation()
    }
    fn list(&self) -> Result<Vec<u64>, IndexError> {
        self.index.generations()
    }
    fn record(&self, name: &str) -> Result<Option<serde_json::Value>, IndexError> {
        self.index.record(name)
    }
    fn save_record(&self, name: &str, v: serde_json::Value) -> Result<(), IndexError> {
        self.index.save_record(name, &v)
    }
    fn clear_record(&self, name: &str) -> Result<(), IndexError> {
        self.index.clear_record(name)
    }
    fn recorded_topic(&self) -> Result<String, IndexError> {
        self.index.recorded_topic()
    }
    fn recorded_partitions(&self) -> Result<Option<i32>, IndexError> {
        self.index.recorded_partitions()
    }
    fn checkpoints_in(&self, g: u64, _partitions: i32) -> Result<BTreeMap<i32, Checkpoint>, IndexError> {
        self.index.checkpoints_in(g)
    }
    /// Shard directories are created as they are opened; until one is, a
    /// record of the generation's model is what a rebuild given up left.
    fn prepare(&self, g: u64) -> Result<(), IndexError> {
        if !self.index.generation_dir(g).exists() {
            self.index.clear_record(&model_record_name(g))?;
        }
        self.index.check_model(g, true)
    }
    fn model_record(&self, g: u64) -> Result<Option<serde_json::Value>, IndexError> {
        self.index.record(&model_record_name(g))
    }
    fn writer(&self, g: u64) -> Arc<dyn Backend> {
        let mut backend = EmbeddedBackend::new(self.index.clone(), self.budget);
        backend.pinned = Some(g);
        Arc::new(backend)
    }
    fn cut_over(&self, _from: u64, to: u64, partitions: i32) -> Result<(), IndexError> {
        // The generation and its log (after `denorm migrate`, the new
        // topic) in one step.
        self.index.cut_over_to(to, partitions)
    }
    /// Waits (at most 60 s) until no writer holds any of `g`'s shards: live
    /// workers release them as they follow the cutover.
    fn remove(&self, g: u64, _partitions: i32) -> Result<(), IndexError> {
        let dir = self.index.generation_dir(g);
        let polled = crate::retry::poll_until(Duration::from_secs(60), Duration::from_millis(200), || match self.index.writers_held(g) {
            Ok(0) => Polled::Done(Ok(())),
            Ok(n) => {
                info!(generation = g, writers = n, "waiting for live workers to leave the old generation");
                Polled::NotYet(n)
            }
            Err(e) => Polled::Done(Err(e)),
        });
        match polled {
            Ok(done) => done?,
            Err(n) => {
                warn!(generation = g, writers = n.unwrap_or_default(), dir = %dir.display(), "old generation still written to after 60 s: kept (delete it once every worker has moved)");
                return Ok(());
            }
        }
        std::fs::remove_dir_all(&dir).map_err(|e| IndexError::Io(std::io::Error::new(e.kind(), format!("deleting {}: {e}", dir.display()))))?;
        self.index.clear_record(&model_record_name(g))?;
        info!(generation = g, "old generation deleted");
        Ok(())
    }
}

/// Generations on Elasticsearch (see [`generations`]: concrete indexes
/// behind aliases).
pub struct ElasticGenerations {
    pub backend: ElasticBackend,
}

impl ElasticGenerations {
    pub fn new(mut backend: ElasticBackend) -> Self {
        backend.conflicts.get_or_insert_with(Default::default);
        ElasticGenerations { backend }
    }
}

impl ElasticGenerations {
    fn block<T>(&self, f: impl std::future::Future<Output = Result<T, ElasticError>>) -> Result<T, IndexError> {
        Ok(self.backend.runtime.block_on(f)?)
    }

    fn meta(&self, id: &str) -> Result<Option<serde_json::Value>, IndexError> {
        let b = &self.backend;
        self.block(meta::get_meta(&b.client, &b.prefix, id))
    }

    fn block_index<T>(&self, f: impl std::future::Future<Output = Result<T, IndexError>>) -> Result<T, IndexError> {
        self.backend.runtime.block_on(f)
    }

    /// The kinds generation `g` holds: the compiled-in ones and those of
    /// the model it records, read from its record unless it is this
    /// handle's.
    fn kinds_of(&self, g: u64) -> Result<Vec<Kind>, IndexError> {
        let model = match self.model_record(g)? {
            None => None,
            Some(held) if crate::index::recorded_model::holds(Some(&held), self.backend.model) => self.backend.model,
            Some(held) => Some(crate::index::recorded_model::domain_of(g, &held)?),
        };
        Ok(names::kinds(model))
    }

    fn put_meta(&self, id: &str, body: serde_json::Value) -> Result<(), IndexError> {
        let b = &self.backend;
        self.block(meta::put_meta(&b.client, &b.prefix, id, body))
    }
}

impl Generations for ElasticGenerations {
    fn current(&self) -> Result<u64, IndexError> {
        self.block(generations::current(&self.backend.client, &self.backend.prefix))
    }
    fn list(&self) -> Result<Vec<u64>, IndexError> {
        self.block(generations::list(&self.backend.client, &self.backend.prefix))
    }
    fn record(&self, name: &str) -> Result<Option<serde_json::Value>, IndexError> {
        Backend::record(&self.backend, name)
    }
    fn save_record(&self, name: &str, v: serde_json::Value) -> Result<(), IndexError> {
        Backend::save_record(&self.backend, name, &v)
    }
    fn clear_record(&self, name: &str) -> Result<(), IndexError> {
        let b = &self.backend;
        self.block(meta::delete_meta(&b.client, &b.prefix, name))
    }
    fn recorded_topic(&self) -> Result<String, IndexError> {
        let log = self.meta(&names::meta_id(self.current()?, "log"))?;
        Ok(log.and_then(|v| v["topic"].as_str().map(String::from)).unwrap_or_else(|| self.backend.topic.clone()))
    }
    fn recorded_partitions(&self) -> Result<Option<i32>, IndexError> {
        let log = self.meta(&names::meta_id(self.current()?, "log"))?;
        Ok(log.and_then(|v| v["partitions"].as_i64()).map(|n| n as i32))
    }
    fn checkpoints_in(&self, g: u64, partitions: i32) -> Result<BTreeMap<i32, Checkpoint>, IndexError> {
        let all: Vec<i32> = (0..partitions).collect();
        Ok(self.writer(g).checkpoints(&all)?.into_iter().collect())
    }
    /// Creates the generation's indexes, on the bulk-load settings (see
    /// [`bulk_load`]) until [`Generations::cut_over`].
    ///
    /// Its placement is recorded first (`DENORM_ES_DEDICATED_TENANTS`, or
    /// the one a rebuild that did not finish recorded: said in a warning
    /// when they differ), and the tenants' own indexes are created before
    /// the shared ones.
    fn prepare(&self, g: u64) -> Result<(), IndexError> {
        let b = &self.backend;
        let placement = self.block(placement::record(&b.client, &b.prefix, g, &b.configured))?;
        if let Some(line) = placement::differs(&b.configured, &placement, g) {
            warn!("{line}");
        }
        let kinds = names::kinds(b.model);
        self.block(generations::create_dedicated(&b.client, &b.prefix, g, &placement, false, &kinds))?;
        for &kind in &kinds {
            self.block(generations::create(&b.client, &b.prefix, kind, g, false))?;
        }
        self.block(bulk_load::for_loading(&b.client, &b.prefix, g, &placement, &kinds))?;
        // After its indexes: a record of a generation whose indexes do not
        // exist would outlive a rebuild given up before it created them.
        match b.model {
            Some(d) => self.block_index(crate::index::elastic::setup::record_model(&b.client, &b.prefix, g, d)),
            None => match self.model_record(g)? {
                Some(held) => Err(IndexError::LogMismatch(format!(
                    "generation {g}, which a rebuild that did not finish was building, holds {}, not the compiled-in kinds alone: resume it with its --model, or `denorm rebuild --abandon` it",
                    crate::index::recorded_model::named(Some(&held))
                ))),
                None => Ok(()),
            },
        }
    }
    fn model_record(&self, g: u64) -> Result<Option<serde_json::Value>, IndexError> {
        self.meta(&names::meta_id(g, names::MODEL))
    }
    fn writer(&self, g: u64) -> Arc<dyn Backend> {
        let mut backend = self.backend.clone();
        backend.pinned = Some(g);
        backend.building = true;
        Arc::new(backend)
    }
    fn cut_over(&self, from: u64, to: u64, partitions: i32) -> Result<(), IndexError> {
        let b = &self.backend;
        // The live generation's refreshes and replicas, put back and
        // checked before anything searches the new one.
        // Read afresh: a tenant's rebuild may have changed a revision.
        let was = self.block(placement::read(&b.client, &b.prefix, from))?;
        let will = self.block(placement::read(&b.client, &b.prefix, to))?;
        let (kinds_from, kinds_to) = (self.kinds_of(from)?, self.kinds_of(to)?);
        let kinds = generations::CutoverKinds { from: &kinds_from, to: &kinds_to };
        self.block(bulk_load::restore(&b.client, &b.prefix, (from, to), &will, &kinds))?;
        self.put_meta(&names::meta_id(to, "log"), serde_json::json!({"topic": b.topic, "partitions": partitions}))?;
        self.block(generations::refresh(&b.client, &b.prefix, to, &will, &kinds_to))?;
        self.block(generations::cut_over(&b.client, &b.prefix, (from, to), (&was, &will), &kinds))
    }
    /// At once: the cutover removed `g`'s write aliases, so no writer can
    /// reach its indexes any more.
    fn owner_conflicts(&self) -> Vec<String> {
        self.backend.conflicts.as_ref().map(|c| c.lock().expect("conflicts lock").iter().cloned().collect()).unwrap_or_default()
    }
    fn tenant_rebuilds(&self) -> Result<Vec<String>, IndexError> {
        let b = &self.backend;
        let placement = self.block(placement::read(&b.client, &b.prefix, self.current()?))?;
        // A tenant's rebuild may be of a tenant with indexes of its own
        // now or before (a move into the shared indexes stopped after its
        // record), or of one the configuration names (a move into its own
        // stopped before its fence).
        let candidates: std::collections::BTreeSet<&str> = placement.tenants_placed().chain(b.configured.dedicated()).collect();
        let mut out = Vec::new();
        for t in candidates {
            if self.meta(&tenant_record(t, STATE))?.is_some() {
                out.push(t.to_string());
            }
        }
        Ok(out)
    }
    fn remove(&self, g: u64, partitions: i32) -> Result<(), IndexError> {
        let recorded = self.meta(&names::meta_id(g, "log"))?.and_then(|v| v["partitions"].as_i64());
        let partitions = recorded.map_or(partitions, |n| n as i32);
        let kinds = self.kinds_of(g)?;
        let b = &self.backend;
        self.block(generations::remove(&b.client, &b.prefix, g, partitions, &kinds))?;
        info!(generation = g, "old generation deleted");
        Ok(())
    }
}
