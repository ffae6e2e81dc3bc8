//! One tenant's own indexes on Elasticsearch as [`Generations`], for
//! `denorm rebuild --tenant` (see docs/tenants.md, "Rebuilding one
//! tenant").
//!
//! A "generation" here is a **revision** of the tenant's own indexes in
//! the current shared generation `g`: revision 0 is
//! `<prefix>-t-<tenant>-files-<g+1>`, revision `r` the same name with
//! `-r<r>`. The placement document of `g` records which one is current.
//! A rebuild of revision `r` writes through `<prefix>-t-<tenant>-files-g<g>-r<r>`
//! with checkpoints of its own (`t-<tenant>-r<r>-p<N>`), while the live
//! workers go on writing the current revision through
//! `<prefix>-t-<tenant>-files-g<g>`. Its cutover:
//!
//! 1. [`TenantGenerations::fence`] takes the live write aliases off the
//!    current revision: a live worker's next write of the tenant fails as
//!    "index gone" and is retried (its partition waits, the tenant's
//!    commands unapplied), so nothing more of the tenant reaches the old
//!    revision;
//! 2. the rebuild applies the log up to its end as read after the fence,
//!    which holds every command whose effects the old revision has;
//! 3. [`Generations::cut_over`], one `_aliases` request: the live write
//!    aliases, the read alias and the tenant's alias go to the new
//!    revision. The live workers' retries reopen their shards at their
//!    checkpoints and apply the tenant's commands again from there, after
//!    the rebuild's: position guards make what was applied twice a no-op.

use std::collections::BTreeMap;
use std::sync::Arc;

use elasticsearch::indices::IndicesDeleteParts;
use serde_json::{json, Value};

use super::elastic::names::{self, dedicated_concrete, dedicated_write_alias};
use super::elastic::placement::{self, Placement};
use super::elastic::{backend::ElasticBackend, generations, json_or_status, meta, ElasticError};
use super::generations::Generations;
use super::Kind;
use super::{Backend, Checkpoint, IndexError};

/// Rounds of [`TenantGenerations::delete_in_shared`] while documents
/// change under it.
const DELETE_ROUNDS: usize = 3;

/// What one round of [`TenantGenerations::delete_in_shared`] did, from
/// the `_delete_by_query` answer.
#[derive(Debug, PartialEq, Eq)]
enum Deletion {
    /// Every match deleted (this many).
    Done(u64),
    /// Some matches changed between the snapshot and their delete.
    Again { deleted: u64, conflicts: u64 },
    /// Some deletes failed (the answer's `failures`).
    Failed(String),
}

fn deletion(answer: &Value) -> Deletion {
    let deleted = answer["deleted"].as_u64().unwrap_or(0);
    match (answer["failures"].as_array(), answer["version_conflicts"].as_u64().unwrap_or(0)) {
        (Some(f), _) if !f.is_empty() => Deletion::Failed(format!("{} failed: {}", f.len(), answer["failures"])),
        (_, 0) => Deletion::Done(deleted),
        (_, conflicts) => Deletion::Again { deleted, conflicts },
    }
}

/// Refreshes the indexes `names` (all of them there): what was written
/// becomes searchable, and what a `_delete_by_query` sees.
async fn refresh(client: &elasticsearch::Elasticsearch, names: &[String], what: &str) -> Result<(), ElasticError> {
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let r = client.indices().refresh(elasticsearch::indices::IndicesRefreshParts::Index(&refs)).send().await?;
    super::elastic::complete_json(what, r).await.map(drop)
}

/// A tenant's own indexes, revision by revision.
pub struct TenantGenerations {
    /// The live backend (the current shared generation).
    pub backend: ElasticBackend,
    pub tenant: String,
    /// The shared generation whose tenant's own indexes are rebuilt.
    pub shared: u64,
    /// The tenant is in the shared indexes, and its rebuild moves it into
    /// indexes of its own (or is moving it: fenced, not cut over).
    pub entering: bool,
    /// The tenant's rebuild moves it from its own indexes into the shared
    /// ones (`--to-shared`, or a move begun).
    pub leaving: bool,
}

impl TenantGenerations {
    /// The tenant's own indexes in the current generation; refused when
    /// the generation holds another model than the backend's, when the
    /// tenant has none (it is in the shared indexes) and the configuration
    /// does not name it, or when it is to move `to_shared` and cannot.
    pub fn new(mut backend: ElasticBackend, tenant: &str, to_shared: bool) -> Result<Self, IndexError> {
        crate::command::tenant::validate(tenant).map_err(|e| IndexError::Rejected(e.to_string()))?;
        backend.conflicts.get_or_insert_with(Default::default);
        let shared = backend.generation()?;
        let mut this = TenantGenerations { backend, tenant: tenant.to_string(), shared, entering: false, leaving: false };
        let held = this.model_record(shared)?;
        if !super::recorded_model::holds(held.as_ref(), this.backend.model) {
            use super::recorded_model::{named, record_of};
            return Err(IndexError::Rejected(format!(
                "generation {shared} holds {}, not {}: a tenant's rebuild keeps its generation's model, so run it with that model's --model, or without --model for the compiled-in kinds alone (a change of model rebuilds every tenant: `denorm rebuild --change-model`)",
                named(held.as_ref()),
                named(this.backend.model.map(record_of).as_ref())
            )));
        }
        let placed = this.placement()?;
        this.entering = placed.is_entering(tenant);
        this.leaving = placed.is_leaving(tenant);
        // A move into the shared indexes stopped after its record has its
        // state left: run again, it cleans up.
        let moved_out = !placed.is_dedicated(Some(tenant)) && this.state()?.is_some() && !this.backend.configured.is_dedicated(Some(tenant));
        if to_shared && !this.leaving && !moved_out {
            let refused = if !placed.is_dedicated(Some(tenant)) {
                format!("tenant {tenant} is in the shared indexes of generation {shared} already")
            } else if this.entering {
                format!("tenant {tenant} is moving into indexes of its own: finish that move first (`denorm rebuild --tenant {tenant}`), or give it up (add --abandon)")
            } else if this.backend.configured.is_dedicated(Some(tenant)) {
                format!("DENORM_ES_DEDICATED_TENANTS names tenant {tenant}: take it out first, or the next `denorm rebuild` moves it back into indexes of its own")
            } else {
                String::new()
            };
            if !refused.is_empty() {
                return Err(IndexError::Rejected(refused));
            }
            this.leaving = true;
        }
        if !placed.is_dedicated(Some(tenant)) && !moved_out {
            if !this.backend.configured.is_dedicated(Some(tenant)) {
                return Err(IndexError::Rejected(format!(
                    "tenant {tenant} is in the shared indexes of generation {shared}: a rebuild of one tenant replaces its own indexes, or moves it into indexes of its own when DENORM_ES_DEDICATED_TENANTS names it. Name it there to move it, or rebuild every tenant (`denorm rebuild`)"
                )));
            }
            this.entering = true;
        }
        Ok(this)
    }

    fn block<T>(&self, f: impl std::future::Future<Output = Result<T, ElasticError>>) -> Result<T, IndexError> {
        Ok(self.backend.runtime.block_on(f)?)
    }

    /// The kinds the tenant's indexes hold: the generation's, whose model
    /// the backend was opened with ([`TenantGenerations::new`] checks).
    fn kinds(&self) -> Vec<Kind> {
        self.backend.kinds()
    }

    /// The shared generation's placement, as recorded now.
    fn placement(&self) -> Result<Placement, IndexError> {
        self.block(placement::read(&self.backend.client, &self.backend.prefix, self.shared))
    }

    /// Where revision `rev`'s rebuild keeps its shards' checkpoints.
    fn scope(&self, rev: u64) -> String {
        format!("t-{}-r{rev}-", self.tenant)
    }

    fn rev(g: u64) -> u32 {
        u32::try_from(g).unwrap_or(u32::MAX)
    }

    fn update_aliases(&self, actions: Vec<Value>, what: &str) -> Result<(), IndexError> {
        let b = &self.backend;
        self.block(async {
            let r = b.client.indices().update_aliases().body(json!({ "actions": actions })).send().await?;
            json_or_status(what, r).await.map(drop)
        })
    }

    /// Whether the live workers are fenced off the tenant's indexes: its
    /// live write alias of files is on no index; for a tenant moving in
    /// from the shared indexes, the placement says it is and the live
    /// writer of every partition writes with that placement.
    pub fn fenced(&self, partitions: i32) -> Result<bool, IndexError> {
        if self.entering {
            let p = self.placement()?;
            return Ok(p.is_entering(&self.tenant) && self.unacknowledged(p.moves(), partitions)?.is_empty());
        }
        Ok(self.live_on()?.is_empty())
    }

    /// The partitions whose live writer has not said that it writes with a
    /// placement counting `moves` moves or more (see
    /// [`placement::acknowledged_id`]).
    /// One `_mget` of every partition's word (one answering with an error
    /// counts as behind, and is read again at the next call).
    pub fn unacknowledged(&self, moves: u64, partitions: i32) -> Result<Vec<i32>, IndexError> {
        let b = &self.backend;
        let index = names::meta_index(&b.prefix);
        let docs: Vec<(String, String)> = (0..partitions).map(|p| (index.clone(), placement::acknowledged_id(self.shared, p))).collect();
        let found = self.block(meta::mget_sources(&b.client, &docs))?;
        let taken = |f: &Option<Option<(Value, (i64, i64))>>| f.as_ref().and_then(Option::as_ref).and_then(|(v, _)| v["moves"].as_u64()).is_some_and(|m| m >= moves);
        Ok((0..partitions).zip(&found).filter(|(_, f)| !taken(f)).map(|(p, _)| p).collect())
    }

    /// The fence of a tenant moving in from the shared indexes into
    /// revision `rev` of its own: the placement records it as dedicated and
    /// entering (unless it does already). The placement's count of moves,
    /// which the live writers must take (`PLACE` control messages make
    /// those opened before reopen).
    pub fn fence_entering(&self, rev: u64) -> Result<u64, IndexError> {
        let t = self.tenant.as_str();
        let placed = self.update_placement(|p| (!p.is_entering(t)).then(|| p.entering(t, Self::rev(rev))))?;
        Ok(placed.moves())
    }

    /// Changes the shared generation's recorded placement (see
    /// [`placement::update`]).
    fn update_placement(&self, change: impl Fn(&Placement) -> Option<Placement>) -> Result<Placement, IndexError> {
        let b = &self.backend;
        self.block(placement::update(&b.client, &b.prefix, self.shared, change))
    }

    /// Gives a tenant moving in from the shared indexes back to them (a
    /// move given up after its fence): the live writers' next write of it
    /// fails, and their shards reopen with this placement.
    pub fn unfence_entering(&self) -> Result<(), IndexError> {
        let t = self.tenant.as_str();
        self.update_placement(|p| p.is_entering(t).then(|| p.not_entering(t, p.revision(t).saturating_sub(1)))).map(drop)
    }

    /// Whether the tenant's documents in the shared indexes are hidden
    /// there, left by its move into its own.
    pub fn hides_in_shared(&self) -> Result<bool, IndexError> {
        Ok(self.placement()?.is_hidden(&self.tenant))
    }

    /// After a move in from the shared indexes: deletes the tenant's
    /// documents there (hidden from searches since the cutover), then
    /// records that none is left.
    pub fn remove_from_shared(&self) -> Result<(), IndexError> {
        if !self.placement()?.is_hidden(&self.tenant) {
            return Ok(());
        }
        self.delete_in_shared()?;
        let t = self.tenant.as_str();
        self.update_placement(|p| p.is_hidden(t).then(|| p.unhidden(t))).map(drop)
    }

    /// Deletes the tenant's documents in the shared indexes. A
    /// `_delete_by_query` deletes what the last refresh shows: the indexes
    /// are refreshed first, or a write that landed just before (a killed
    /// rebuild's last bulk, a live writer's before its fence) is left, and
    /// one changed meanwhile (a version conflict) is deleted by a next
    /// round. No writer of the tenant writes there by then, so a conflict
    /// left after [`DELETE_ROUNDS`] is an error, not a document left.
    fn delete_in_shared(&self) -> Result<(), IndexError> {
        let b = &self.backend;
        let names: Vec<String> = self.kinds().iter().map(|k| names::concrete(&b.prefix, *k, self.shared)).collect();
        let t = self.tenant.as_str();
        let what = format!("deleting tenant {t}'s documents from the shared indexes");
        let mut deleted = 0;
        for _ in 0..DELETE_ROUNDS {
            let answer = self.block(async {
                refresh(&b.client, &names, "refreshing the shared indexes").await?;
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                let r = b
                    .client
                    .delete_by_query(elasticsearch::DeleteByQueryParts::Index(&refs))
                    .routing(&[t])
                    .conflicts(elasticsearch::params::Conflicts::Proceed)
                    .refresh(true)
                    .body(json!({"query": {"term": {names::TENANT_FIELD: t}}}))
                    .send()
                    .await?;
                json_or_status(&what, r).await
            })?;
            match deletion(&answer) {
                Deletion::Failed(failures) => return Err(ElasticError::Incomplete(format!("{what}: {failures}")).into()),
                Deletion::Done(n) => {
                    tracing::info!(tenant = t, deleted = deleted + n, "the tenant's documents in the shared indexes deleted");
                    return Ok(());
                }
                Deletion::Again { deleted: n, conflicts } => {
                    deleted += n;
                    tracing::warn!(tenant = t, conflicts, "documents of the tenant changed while they were deleted: deleting again");
                }
            }
        }
        Err(ElasticError::Incomplete(format!("{what}: documents still changing after {DELETE_ROUNDS} rounds (a writer of the tenant still running?)")).into())
    }

    /// Prepares a move into the shared indexes: the tenant's documents
    /// left there deleted (not once the move has begun: its rebuild's are
    /// there), the placement records it leaving, and the shared indexes get
    /// a read alias that hides it and the alias its rebuild writes through.
    fn prepare_leaving(&self, rev: u32) -> Result<(), IndexError> {
        let (b, t) = (&self.backend, self.tenant.as_str());
        if !self.placement()?.is_leaving(t) {
            self.delete_in_shared()?;
        }
        let placed = self.update_placement(|p| (!p.is_leaving(t)).then(|| p.leaving(t)))?;
        let mut actions = Vec::new();
        for kind in self.kinds() {
            let shared = names::concrete(&b.prefix, kind, self.shared);
            actions.push(placement::shared_read_action(&b.prefix, kind, self.shared, &placed.shared_read_alias()));
            actions.push(json!({"add": {"index": shared, "alias": placement::shared_rebuild_alias(&b.prefix, t, kind, self.shared, rev)}}));
        }
        self.update_aliases(actions, &format!("preparing tenant {t}'s move into the shared indexes"))
    }

    /// Gives up a move into the shared indexes (before its cutover): the
    /// tenant's documents its rebuild wrote there deleted, the aliases and
    /// the placement as before.
    pub fn give_up_leaving(&self, rev: u64) -> Result<(), IndexError> {
        let (b, t) = (&self.backend, self.tenant.as_str());
        self.delete_in_shared()?;
        let placed = self.update_placement(|p| p.is_leaving(t).then(|| p.not_leaving(t)))?;
        let mut actions = Vec::new();
        for kind in self.kinds() {
            let shared = names::concrete(&b.prefix, kind, self.shared);
            actions.push(placement::shared_read_action(&b.prefix, kind, self.shared, &placed.shared_read_alias()));
            let rebuild = placement::shared_rebuild_alias(&b.prefix, t, kind, self.shared, Self::rev(rev));
            if self.block(generations::indexes_of_alias(&b.client, &rebuild))?.contains(&shared) {
                actions.push(json!({"remove": {"index": shared, "alias": rebuild}}));
            }
        }
        self.update_aliases(actions, &format!("giving up tenant {t}'s move into the shared indexes"))
    }

    /// Whether the live write alias of files is on revision `rev`: a
    /// cutover to it was made (its placement may not say so yet, when the
    /// rebuild stopped between the two).
    pub fn live_on_revision(&self, rev: u64) -> Result<bool, IndexError> {
        let b = &self.backend;
        if self.leaving {
            // Moving into the shared indexes: cut over once its filtered
            // alias is on them.
            let name = names::tenant_alias(&b.prefix, &self.tenant, Kind::File);
            return Ok(self.block(generations::indexes_of_alias(&b.client, &name))?.contains(&names::concrete(&b.prefix, Kind::File, self.shared)));
        }
        Ok(self.live_on()?.contains(&dedicated_concrete(&b.prefix, &self.tenant, Kind::File, self.shared, Self::rev(rev))))
    }

    /// The indexes the live write alias of files is on.
    fn live_on(&self) -> Result<Vec<String>, IndexError> {
        let b = &self.backend;
        let name = dedicated_write_alias(&b.prefix, &self.tenant, Kind::File, self.shared);
        self.block(generations::indexes_of_alias(&b.client, &name))
    }

    /// Records revision `rev` as the tenant's current one (the last step
    /// of a cutover).
    pub fn record_revision(&self, rev: u64) -> Result<(), IndexError> {
        let t = self.tenant.as_str();
        self.update_placement(|p| Some(if p.is_leaving(t) { p.left(t, Self::rev(rev)) } else { p.with_revision(t, Self::rev(rev)).entered(t) })).map(drop)
    }

    /// Takes the live write aliases off revision `rev` (step 1 above).
    pub fn fence(&self, rev: u64) -> Result<(), IndexError> {
        self.live_write_aliases("remove", rev, &format!("fencing the live writers of tenant {} off its indexes", self.tenant))
    }

    /// Puts the live write aliases back on revision `rev` (a rebuild given
    /// up after its fence).
    pub fn unfence(&self, rev: u64) -> Result<(), IndexError> {
        self.live_write_aliases("add", rev, &format!("giving the live writers of tenant {} its indexes back", self.tenant))
    }

    /// The live write aliases of revision `rev`'s indexes, each put or
    /// taken off (`action`) in one request.
    fn live_write_aliases(&self, action: &str, rev: u64, what: &str) -> Result<(), IndexError> {
        let (prefix, t, g) = (self.backend.prefix.as_str(), self.tenant.as_str(), self.shared);
        let actions = self.kinds().iter().map(|k| json!({ action: {"index": dedicated_concrete(prefix, t, *k, g, Self::rev(rev)), "alias": dedicated_write_alias(prefix, t, *k, g)} })).collect();
        self.update_aliases(actions, what)
    }

    /// Deletes the checkpoints revision `rev`'s rebuild kept.
    pub fn remove_checkpoints(&self, rev: u64, partitions: i32) -> Result<(), IndexError> {
        let b = self.backend.placed(self.shared, Placement::default(), &self.scope(rev));
        let ids: Vec<String> = (0..partitions).map(|p| b.partition_meta(self.shared, p)).collect();
        self.block(super::elastic::generations::remove_partition_meta(&b.client, &b.prefix, &ids))
    }

    /// The name a rebuild record of this tenant is kept under: its own,
    /// beside a whole rebuild's (other records, such as the workers'
    /// settings, are the index's).
    fn record_name(&self, name: &str) -> String {
        super::generations::tenant_record(&self.tenant, name)
    }
}

impl Generations for TenantGenerations {
    /// The tenant's current revision (a tenant moving in from the shared
    /// indexes: the one below the revision it is moving into).
    fn current(&self) -> Result<u64, IndexError> {
        let p = self.placement()?;
        Ok(u64::from(p.revision(&self.tenant)) - u64::from(p.is_entering(&self.tenant)))
    }
    fn list(&self) -> Result<Vec<u64>, IndexError> {
        let mut out = vec![self.current()?];
        out.extend(self.state()?.map(|s| s.generation));
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
    fn record(&self, name: &str) -> Result<Option<Value>, IndexError> {
        Backend::record(&self.backend, &self.record_name(name))
    }
    fn save_record(&self, name: &str, v: Value) -> Result<(), IndexError> {
        Backend::save_record(&self.backend, &self.record_name(name), &v)
    }
    fn clear_record(&self, name: &str) -> Result<(), IndexError> {
        let b = &self.backend;
        self.block(meta::delete_meta(&b.client, &b.prefix, &self.record_name(name)))
    }
    /// A tenant's revisions hold what their generation holds.
    fn model_record(&self, _revision: u64) -> Result<Option<Value>, IndexError> {
        let b = &self.backend;
        self.block(meta::get_meta(&b.client, &b.prefix, &names::meta_id(self.shared, names::MODEL)))
    }
    fn recorded_topic(&self) -> Result<String, IndexError> {
        let b = &self.backend;
        let log = self.block(meta::get_meta(&b.client, &b.prefix, &names::meta_id(self.shared, "log")))?;
        Ok(log.and_then(|v| v["topic"].as_str().map(String::from)).unwrap_or_else(|| b.topic.clone()))
    }
    fn recorded_partitions(&self) -> Result<Option<i32>, IndexError> {
        let b = &self.backend;
        let log = self.block(meta::get_meta(&b.client, &b.prefix, &names::meta_id(self.shared, "log")))?;
        Ok(log.and_then(|v| v["partitions"].as_i64()).map(|n| n as i32))
    }
    /// The current revision's are the live workers' (the shared
    /// generation's); a rebuilt revision's are its rebuild's.
    fn checkpoints_in(&self, g: u64, partitions: i32) -> Result<BTreeMap<i32, Checkpoint>, IndexError> {
        let all: Vec<i32> = (0..partitions).collect();
        let scope = if g == self.current()? { String::new() } else { self.scope(g) };
        let b = self.backend.placed(self.shared, Placement::default(), &scope);
        Ok(b.checkpoints(&all)?.into_iter().collect())
    }
    /// Creates revision `g`'s indexes, with the rebuild's write aliases only.
    fn prepare(&self, g: u64) -> Result<(), IndexError> {
        if self.leaving {
            return self.prepare_leaving(Self::rev(g));
        }
        let b = &self.backend;
        for kind in self.kinds() {
            let index = dedicated_concrete(&b.prefix, &self.tenant, kind, self.shared, Self::rev(g));
            let body = placement::rebuild_body(&b.prefix, &self.tenant, kind, self.shared, Self::rev(g));
            if self.block(generations::create_index(&b.client, &index, body))? {
                tracing::info!(index = %index, tenant = %self.tenant, "created a revision of a tenant's own index");
            }
        }
        Ok(())
    }
    fn writer(&self, g: u64) -> Arc<dyn Backend> {
        let placement = self.placement().unwrap_or_default().building(&self.tenant, Self::rev(g));
        let mut b = self.backend.placed(self.shared, placement, &self.scope(g));
        b.conflicts = self.backend.conflicts.clone();
        Arc::new(b)
    }
    /// Step 3 above (the live writers fenced first): one `_aliases`
    /// request, then the placement records revision `to`.
    fn cut_over(&self, from: u64, to: u64, _partitions: i32) -> Result<(), IndexError> {
        let b = &self.backend;
        let (prefix, t, g) = (b.prefix.as_str(), self.tenant.as_str(), self.shared);
        // What the rebuild wrote: the shared indexes for a tenant moving
        // into them.
        let all: Vec<String> = self.kinds().iter().map(|k| if self.leaving { names::concrete(prefix, *k, g) } else { dedicated_concrete(prefix, t, *k, g, Self::rev(to)) }).collect();
        self.block(refresh(&b.client, &all, "refreshing a tenant's rebuilt indexes"))?;
        let placed = self.placement()?;
        let actions = if placed.is_leaving(t) {
            placement::leaving_cutover_actions(prefix, t, g, (Self::rev(from), Self::rev(to)), &placed.left(t, Self::rev(to)).shared_read_alias(), &self.kinds())
        } else if placed.is_entering(t) {
            // The tenant's filtered aliases on the shared indexes, where
            // `denorm tenant alias` put them.
            let mut filtered = Vec::new();
            for kind in self.kinds() {
                let name = names::tenant_alias(prefix, t, kind);
                if self.block(generations::indexes_of_alias(&b.client, &name))?.contains(&names::concrete(prefix, kind, g)) {
                    filtered.push(name);
                }
            }
            placement::entering_cutover_actions(prefix, t, g, Self::rev(to), (&placed.entered(t).shared_read_alias(), &filtered), &self.kinds())
        } else {
            placement::revision_cutover_actions(prefix, t, g, (Self::rev(from), Self::rev(to)), &self.kinds())
        };
        self.update_aliases(actions, &format!("cutting tenant {t} over to revision {to} of its indexes"))?;
        if crate::faults::active("rebuild.tenant-aliases").is_some() {
            tracing::warn!("injected fault rebuild.tenant-aliases: aborting between the cutover's aliases and its record");
            std::process::abort();
        }
        self.record_revision(to)?;
        if crate::faults::active("rebuild.tenant-recorded").is_some() {
            tracing::warn!("injected fault rebuild.tenant-recorded: aborting between the cutover's record and the clean-up");
            std::process::abort();
        }
        Ok(())
    }
    /// Deletes revision `g`'s indexes and its rebuild's checkpoints.
    fn remove(&self, g: u64, partitions: i32) -> Result<(), IndexError> {
        let b = &self.backend;
        let names: Vec<String> = self.kinds().iter().map(|k| dedicated_concrete(&b.prefix, &self.tenant, *k, self.shared, Self::rev(g))).collect();
        self.block(async {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let r = b.client.indices().delete(IndicesDeleteParts::Index(&refs)).ignore_unavailable(true).send().await?;
            json_or_status(&format!("deleting revision {g} of tenant {}'s indexes", self.tenant), r).await.map(drop)
        })?;
        self.remove_checkpoints(g, partitions)?;
        tracing::info!(tenant = %self.tenant, revision = g, "a revision of a tenant's own indexes deleted");
        Ok(())
    }
    fn owner_conflicts(&self) -> Vec<String> {
        self.backend.conflicts.as_ref().map(|c| c.lock().expect("conflicts lock").iter().cloned().collect()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::{deletion, Deletion};
    use serde_json::json;

    /// `_delete_by_query` answers as Elasticsearch 8 documents them
    /// (`conflicts=proceed`: conflicts counted, not failures).
    fn answer(deleted: u64, conflicts: u64, failures: serde_json::Value) -> serde_json::Value {
        json!({"took": 147, "timed_out": false, "total": deleted + conflicts, "deleted": deleted, "batches": 1, "version_conflicts": conflicts, "noops": 0,
               "retries": {"bulk": 0, "search": 0}, "throttled_millis": 0, "requests_per_second": -1.0, "throttled_until_millis": 0, "failures": failures})
    }

    #[test]
    fn a_deletion_with_version_conflicts_is_run_again_and_one_with_failures_is_an_error() {
        assert_eq!(deletion(&answer(8, 0, json!([]))), Deletion::Done(8));
        assert_eq!(deletion(&answer(5, 3, json!([]))), Deletion::Again { deleted: 5, conflicts: 3 });
        let failed = json!([{"index": "denorm-files-000001", "id": "acme\u{1f}f0", "cause": {"type": "es_rejected_execution_exception"}, "status": 429}]);
        let Deletion::Failed(why) = deletion(&answer(7, 0, failed)) else { panic!("a failure is not a deletion done") };
        assert!(why.starts_with("1 failed") && why.contains("es_rejected_execution_exception"), "{why}");
    }
}
