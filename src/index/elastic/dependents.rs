//! The dependents of many owners read in one search
//! ([`Shard::prefetch_scans`]): a window of profile changes asks for all
//! their posts with one terms query, and each change's scan then takes its
//! owner's share instead of a search of its own
//! ([`ElasticShard::small_scan`]). What this writer writes after the search
//! is read again by GET, as after any search ([`super::recent`]).
//!
//! [`Shard::prefetch_scans`]: crate::index::Shard::prefetch_scans

use std::collections::HashMap;

use super::docs::{dependents_query, from_source, hits, Hit};
use super::shard::ElasticShard;
use crate::command::tenant;
use crate::index::{Doc, IndexError, Kind, Scan};

/// Owners whose dependents one search asks for.
pub(super) const OWNERS_PER_SEARCH: usize = 256;

/// Hits one search returns at most (Elasticsearch's default
/// `index.max_result_window`). A search that fills it may have been cut:
/// its owners are searched on their own.
pub(super) const DEPENDENTS_PER_SEARCH: usize = 10_000;

impl ElasticShard {
    /// [`Shard::prefetch_scans`](crate::index::Shard::prefetch_scans):
    /// the owners of `scans` are expected, and their dependents read.
    pub(super) fn expect_scans(&mut self, scans: &[Scan]) -> Result<(), IndexError> {
        self.coming.expect(scans);
        let owners = self.coming.owners().to_vec();
        self.read_dependents_ahead(&owners)
    }

    /// Before `scan` runs: if its owner was expected and what was read
    /// ahead for it is gone (a refresh since), it and the owners still to
    /// come are read again together. A failure leaves `scan` to search on
    /// its own.
    pub(super) fn before_scan(&mut self, scan: &Scan) {
        let Scan::PostsOfUserNotNamed { user_id, .. } = scan else { return };
        let expected = self.coming.arrived(user_id);
        if !expected || self.recent.has_ahead(user_id) || self.coming.owners().is_empty() {
            return;
        }
        let mut owners = vec![user_id.clone()];
        owners.extend(self.coming.owners().iter().take(OWNERS_PER_SEARCH - 1).cloned());
        if let Err(error) = self.read_dependents_ahead(&owners) {
            tracing::debug!(partition = self.partition, %error, "reading the coming owners' dependents again failed: each searches on its own");
        }
    }

    /// The dependents of `owners` (scoped user ids) not read ahead yet,
    /// one search per tenant's index and [`OWNERS_PER_SEARCH`] owners.
    /// Nothing while a scan could not rely on what this writer knows it
    /// wrote (the next fan-out refreshes first, and searches then).
    fn read_dependents_ahead(&mut self, owners: &[String]) -> Result<(), IndexError> {
        if !self.scans_recent() {
            return Ok(());
        }
        // Each owner once, by the index and tenant its dependents are in.
        let mut groups: HashMap<(String, Option<String>), Vec<String>> = HashMap::new();
        for owner in owners {
            if self.recent.has_ahead(owner) {
                continue;
            }
            let group = groups.entry((self.target(Kind::Post, owner), tenant::of(owner).map(str::to_string))).or_default();
            if !group.contains(owner) {
                group.push(owner.clone());
            }
        }
        for ((index, tenant), owners) in groups {
            for chunk in owners.chunks(OWNERS_PER_SEARCH) {
                // A single owner costs one search either way.
                if chunk.len() < 2 {
                    continue;
                }
                self.search_dependents(&index, tenant.as_deref(), chunk)?;
            }
        }
        Ok(())
    }

    /// One search of the dependents of `owners` (scoped ids of `tenant`),
    /// recorded by owner unless it may have been cut.
    fn search_dependents(&mut self, index: &str, tenant: Option<&str>, owners: &[String]) -> Result<(), IndexError> {
        let unscoped: Vec<&str> = owners.iter().map(|o| tenant::unscoped(o)).collect();
        let body = serde_json::json!({
            "query": dependents_query(tenant, &unscoped),
            "size": DEPENDENTS_PER_SEARCH,
            "seq_no_primary_term": true,
            "track_total_hits": false,
        });
        let started = std::time::Instant::now();
        let b = self.b.clone();
        let v = b.runtime.block_on(async {
            let r = b.client.search(elasticsearch::SearchParts::Index(&[index])).allow_partial_search_results(false).body(body).send().await?;
            super::complete_json("a search of many owners' dependents", r).await
        })?;
        let found = hits(&v);
        let (owners_n, hits_n) = (owners.len(), found.len());
        tracing::debug!(partition = self.partition, owners = owners_n, hits = hits_n, ms = started.elapsed().as_millis() as u64, "owners' dependents read ahead");
        if found.len() >= DEPENDENTS_PER_SEARCH {
            tracing::debug!(partition = self.partition, owners = owners_n, "many owners' dependents fill a search: each owner's are searched on its own");
            return Ok(());
        }
        for (owner, hits) in group_by_owner(owners, found) {
            self.recent.read_ahead(owner, hits);
        }
        Ok(())
    }
}

/// The hits of a search of `owners`' dependents, by owner: each owner's
/// list, empty when it has none. A hit of no owner asked for (written
/// behind the pipeline's back) is left out: the owner's own scan would
/// not have found it either.
pub(super) fn group_by_owner(owners: &[String], found: Vec<Hit>) -> HashMap<String, Vec<Hit>> {
    let mut by_owner: HashMap<String, Vec<Hit>> = owners.iter().map(|o| (o.clone(), Vec::new())).collect();
    for hit in found {
        if let Doc::Post(p) = from_source(Kind::Post, &hit.source) {
            if let Some(list) = by_owner.get_mut(&p.user.id) {
                list.push(hit);
            }
        }
    }
    by_owner
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hit(id: &str, source: serde_json::Value) -> Hit {
        Hit { id: id.into(), seq: Some((1, 1)), source, score: 1.0 }
    }

    fn acme(id: &str) -> String {
        tenant::scope(Some("acme"), id)
    }

    #[test]
    fn hits_are_grouped_by_their_owner_in_its_tenant_and_every_owner_asked_for_has_a_list() {
        let owners = vec![acme("u1"), acme("u2"), acme("u3")];
        let post = |id: &str, user: &str| hit(&acme(id), json!({"id": id, "user": {"id": user, "name": "N"}, "tenant": "acme"}));
        let found = vec![post("p1", "u1"), post("p2", "u2"), post("p3", "u1"), post("p4", "u9")];
        let by = group_by_owner(&owners, found);
        let ids = |o: &str| by[&acme(o)].iter().map(|h| h.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids("u1"), [acme("p1"), acme("p3")]);
        assert_eq!(ids("u2"), [acme("p2")]);
        assert!(ids("u3").is_empty(), "an owner without dependents is known to have none");
        assert_eq!(by.len(), 3, "a hit of an owner not asked for is left out");
        // The default tenant's owner is not another tenant's of the same id.
        let by = group_by_owner(&["u1".to_string()], vec![post("p1", "u1")]);
        assert!(by["u1"].is_empty());
    }
}
