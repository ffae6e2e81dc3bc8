//! The dependents of many owners read in one search
//! ([`Shard::prefetch_scans`]): a window of profile changes asks for all
//! their posts with one terms query, and each change's scan then takes its
//! owner's share instead of a search of its own
//! ([`ElasticShard::small_scan`]). What this writer writes after the search
//! is read again by GET, as after any search ([`super::recent`]).
//!
//! [`Shard::prefetch_scans`]: crate::index::Shard::prefetch_scans

use std::collections::HashMap;

use super::docs::{dependents_query, hits, Hit};
use super::names::TENANT_FIELD;
use super::recent::ahead_slot;
use super::shard::ElasticShard;
use crate::command::tenant;
use crate::index::{IndexError, Kind, ModelScan, Scan};

/// Owners whose dependents one search asks for.
pub(super) const OWNERS_PER_SEARCH: usize = 256;

/// Hits one search returns at most (Elasticsearch's default
/// `index.max_result_window`). A search that fills it may have been cut:
/// its owners are searched on their own.
pub(super) const DEPENDENTS_PER_SEARCH: usize = 10_000;

/// What one search of many owners' dependents asks: the index, the tenant
/// and the kind it reads, and the field of a dependent that names its
/// owner (a post's `user.id`, a model's copy's `via`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Group {
    index: String,
    tenant: Option<String>,
    kind: Kind,
    via: String,
}

impl ElasticShard {
    /// [`Shard::prefetch_scans`](crate::index::Shard::prefetch_scans):
    /// the owners of `scans` are expected, and their dependents read.
    pub(super) fn expect_scans(&mut self, scans: &[Scan]) -> Result<(), IndexError> {
        self.coming.expect(scans);
        let coming: Vec<Scan> = self.coming.scans().cloned().collect();
        self.read_dependents_ahead(&coming)
    }

    /// Before `scan` runs: if its owner was expected and what was read
    /// ahead for it is gone (a refresh since), it and the owners still to
    /// come are read again together. A failure leaves `scan` to search on
    /// its own.
    pub(super) fn before_scan(&mut self, scan: &Scan) {
        let Some(slot) = ahead_slot(scan) else { return };
        let expected = self.coming.arrived(&slot);
        if !expected || self.recent.has_ahead(&slot) || self.coming.is_empty() {
            return;
        }
        let mut scans = vec![scan.clone()];
        scans.extend(self.coming.scans().take(OWNERS_PER_SEARCH - 1).cloned());
        if let Err(error) = self.read_dependents_ahead(&scans) {
            tracing::debug!(partition = self.partition, %error, "reading the coming owners' dependents again failed: each searches on its own");
        }
    }

    /// What a search of `scan`'s owner's dependents with others' asks, and
    /// the owner as its dependents name it (unscoped).
    fn group_of(&self, scan: &Scan) -> Option<(Group, String)> {
        match scan {
            Scan::PostsOfUserNotNamed { user_id, .. } => {
                let group = Group { index: self.target(Kind::Post, user_id), tenant: tenant::of(user_id).map(str::to_string), kind: Kind::Post, via: "user.id".into() };
                Some((group, tenant::unscoped(user_id).to_string()))
            }
            Scan::Model(m @ ModelScan::Dependents { owner, target, .. }) => {
                let kind = Kind::Model(target.kind);
                let group = Group { index: self.target(kind, m.key()), tenant: m.tenant().map(str::to_string), kind, via: target.via.clone() };
                Some((group, owner.clone()))
            }
            _ => None,
        }
    }

    /// The dependents of the owners of `scans` not read ahead yet, one
    /// search per [`Group`] and [`OWNERS_PER_SEARCH`] owners. Nothing
    /// while a scan could not rely on what this writer knows it wrote (the
    /// next fan-out refreshes first, and searches then).
    fn read_dependents_ahead(&mut self, scans: &[Scan]) -> Result<(), IndexError> {
        if !self.scans_recent() {
            return Ok(());
        }
        // Each owner once (its value and its slot), by what searches it.
        let mut groups: HashMap<Group, Vec<(String, String)>> = HashMap::new();
        for scan in scans {
            let Some(slot) = ahead_slot(scan) else { continue };
            if self.recent.has_ahead(&slot) {
                continue;
            }
            let Some((group, owner)) = self.group_of(scan) else { continue };
            let owners = groups.entry(group).or_default();
            if !owners.iter().any(|(_, s)| *s == slot) {
                owners.push((owner, slot));
            }
        }
        for (group, owners) in groups {
            for chunk in owners.chunks(OWNERS_PER_SEARCH) {
                // A single owner costs one search either way.
                if chunk.len() < 2 {
                    continue;
                }
                self.search_dependents(&group, chunk)?;
            }
        }
        Ok(())
    }

    /// One search of the dependents of `owners` (each its value and its
    /// slot), recorded by slot unless it may have been cut.
    fn search_dependents(&mut self, group: &Group, owners: &[(String, String)]) -> Result<(), IndexError> {
        let values: Vec<&str> = owners.iter().map(|(o, _)| o.as_str()).collect();
        let body = serde_json::json!({
            "query": dependents_query(group.tenant.as_deref(), &group.via, &values),
            "size": DEPENDENTS_PER_SEARCH,
            "seq_no_primary_term": true,
            "track_total_hits": false,
        });
        let started = std::time::Instant::now();
        let b = self.b.clone();
        let v = b.runtime.block_on(async {
            let r = b.client.search(elasticsearch::SearchParts::Index(&[&group.index])).allow_partial_search_results(false).body(body).send().await?;
            super::complete_json("a search of many owners' dependents", r).await
        })?;
        let found = hits(&v);
        let (owners_n, hits_n) = (owners.len(), found.len());
        tracing::debug!(partition = self.partition, owners = owners_n, hits = hits_n, ms = started.elapsed().as_millis() as u64, "owners' dependents read ahead");
        if found.len() >= DEPENDENTS_PER_SEARCH {
            tracing::debug!(partition = self.partition, owners = owners_n, "many owners' dependents fill a search: each owner's are searched on its own");
            return Ok(());
        }
        for (slot, hits) in group_by_owner(group, owners, found) {
            self.recent.read_ahead(slot, hits);
        }
        Ok(())
    }
}

/// The hits of a search of `owners`' dependents (each its value and its
/// slot), by slot: each owner's list, empty when it has none. A hit of no
/// owner asked for, or of another tenant (written behind the pipeline's
/// back), is left out: the owner's own scan would not have found it
/// either.
pub(super) fn group_by_owner(group: &Group, owners: &[(String, String)], found: Vec<Hit>) -> HashMap<String, Vec<Hit>> {
    let slot_of: HashMap<&str, &str> = owners.iter().map(|(o, s)| (o.as_str(), s.as_str())).collect();
    let mut by_owner: HashMap<String, Vec<Hit>> = owners.iter().map(|(_, s)| (s.clone(), Vec::new())).collect();
    for hit in found {
        let names = group.via.split('.').try_fold(&hit.source, |v, part| v.get(part)).and_then(|v| v.as_str());
        let tenant = hit.source.get(TENANT_FIELD).and_then(|t| t.as_str());
        if let (Some(slot), true) = (names.and_then(|o| slot_of.get(o)), tenant == group.tenant.as_deref()) {
            by_owner.get_mut(*slot).expect("every owner has a list").push(hit);
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
        let group = |tenant: Option<&str>| Group { index: "i".into(), tenant: tenant.map(str::to_string), kind: Kind::Post, via: "user.id".into() };
        let owners: Vec<(String, String)> = ["u1", "u2", "u3"].iter().map(|u| (u.to_string(), acme(u))).collect();
        let post = |id: &str, user: &str| hit(&acme(id), json!({"id": id, "user": {"id": user, "name": "N"}, "tenant": "acme"}));
        let found = vec![post("p1", "u1"), post("p2", "u2"), post("p3", "u1"), post("p4", "u9")];
        let by = group_by_owner(&group(Some("acme")), &owners, found);
        let ids = |o: &str| by[&acme(o)].iter().map(|h| h.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids("u1"), [acme("p1"), acme("p3")]);
        assert_eq!(ids("u2"), [acme("p2")]);
        assert!(ids("u3").is_empty(), "an owner without dependents is known to have none");
        assert_eq!(by.len(), 3, "a hit of an owner not asked for is left out");
        // The default tenant's owner is not another tenant's of the same id.
        let by = group_by_owner(&group(None), &[("u1".to_string(), "u1".to_string())], vec![post("p1", "u1")]);
        assert!(by["u1"].is_empty());
        // A model's dependents name their owner in a field of their own.
        let orders = Group { via: "customer_id".into(), ..group(None) };
        let order = |id: &str, c: &str| hit(id, json!({"id": id, "customer_id": c}));
        let by = group_by_owner(&orders, &[("c1".to_string(), "s1".to_string())], vec![order("o1", "c1"), order("o2", "c2")]);
        assert_eq!(by["s1"].iter().map(|h| h.id.as_str()).collect::<Vec<_>>(), ["o1"]);
    }
}
