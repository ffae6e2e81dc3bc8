//! Index generations on Elasticsearch (see `denorm rebuild`).
//!
//! Generation `g` of a document kind is the concrete index
//! `<prefix>-<kind>-<g+1, six digits>` (generation 0 is `denorm-files-000001`,
//! the index a first start creates). Two kinds of alias point at it:
//!
//! - the **read alias** `<prefix>-<kind>` (searches), on the current
//!   generation only. Which index it points at *is* the current generation;
//!   a cutover moves the three read aliases with one `_aliases` request;
//! - the generation's **write alias** `<prefix>-<kind>-g<g>`, through which
//!   every shard writer of that generation reads and writes with
//!   `require_alias`. The cutover removes the old generation's write aliases
//!   in the same request, so a live writer that has not noticed the cutover
//!   yet fails at its next request (a retryable "generation gone") instead
//!   of writing to an index nobody reads, and a deleted old generation can
//!   never be recreated by Elasticsearch's automatic index creation.
//!
//! The meta documents of generation `g` (`<prefix>-meta`) are `log`, `p<N>`
//! and `rebuild` for generation 0 and `g<g>-log`, `g<g>-p<N>` after it.

use elasticsearch::indices::{IndicesCreateParts, IndicesDeleteParts, IndicesGetAliasParts, IndicesPutAliasParts, IndicesRefreshParts};
use elasticsearch::Elasticsearch;
use serde_json::{json, Value};

use super::mapping::create_body;
use super::meta::delete_meta;
use super::names::{self, alias, concrete, dedicated_concrete, generation_of, meta_id, write_alias};
use super::placement::Placement;
use super::{json_or_status, ElasticError};
use crate::index::Kind;

/// The concrete indexes `name` (an index, or a pattern of index names)
/// resolves to, each with all its aliases (`GET /<name>/_alias`); empty
/// when there is none.
async fn aliases_of(client: &Elasticsearch, name: &str) -> Result<Value, ElasticError> {
    let r = client.indices().get_alias(IndicesGetAliasParts::Index(&[name])).send().await?;
    match json_or_status(&format!("reading the aliases of {name}"), r).await {
        Err(ElasticError::Gone(_)) => Ok(json!({})),
        other => other,
    }
}

/// The concrete indexes the alias `alias` is on (`GET /_alias/<alias>`:
/// the form every server of the Elasticsearch API answers; noida-db
/// answers `GET /<alias>/_alias` with 404). An alias that does not exist
/// (404 `alias [..] missing`) is on none.
pub async fn indexes_of_alias(client: &Elasticsearch, alias: &str) -> Result<Vec<String>, ElasticError> {
    let r = client.indices().get_alias(IndicesGetAliasParts::Name(&[alias])).send().await?;
    let status = r.status_code().as_u16();
    let what = format!("finding the index of alias {alias}");
    if status == 404 {
        let body = r.text().await.unwrap_or_default();
        return match serde_json::from_str::<Value>(&body) {
            // Elasticsearch: {"error": "alias [x] missing", "status": 404}.
            Ok(v) if v["error"].is_string() => Ok(Vec::new()),
            _ => Err(super::status_error(&what, status, &body)),
        };
    }
    let v = json_or_status(&what, r).await?;
    Ok(v.as_object().into_iter().flatten().filter(|(_, a)| a["aliases"].get(alias).is_some()).map(|(index, _)| index.clone()).collect())
}

/// The generation the read alias of `kind` points at (`None` before the
/// first start).
pub(super) async fn read_generation(client: &Elasticsearch, prefix: &str, kind: Kind) -> Result<Option<(u64, String)>, ElasticError> {
    let read = alias(prefix, kind);
    // The read alias is on the tenants' own indexes too (see
    // [`super::placement`]): the generation is the shared index's.
    let indexes: Vec<String> = indexes_of_alias(client, &read).await?.into_iter().filter(|i| !names::is_tenants_own(i)).collect();
    match indexes.as_slice() {
        [] => Ok(None),
        [index] => {
            let g = generation_of(prefix, kind, index).ok_or_else(|| ElasticError::Config(format!("alias {read} points at {index}, which is not an index denorm created ({read}-NNNNNN)")))?;
            Ok(Some((g, index.clone())))
        }
        more => Err(ElasticError::Config(format!("alias {read} points at more than one index: {}", more.join(", ")))),
    }
}

/// What the read alias of `kind` points at: the current generation (`None`
/// before the first start) and whether that generation's write alias exists.
pub async fn current_of(client: &Elasticsearch, prefix: &str, kind: Kind) -> Result<Option<(u64, bool)>, ElasticError> {
    let Some((g, index)) = read_generation(client, prefix, kind).await? else { return Ok(None) };
    let found = aliases_of(client, &index).await?;
    Ok(Some((g, found[&index]["aliases"].get(write_alias(prefix, kind, g)).is_some())))
}

/// The current generation: the one the read alias of files points at (0
/// before the first start).
pub async fn current(client: &Elasticsearch, prefix: &str) -> Result<u64, ElasticError> {
    Ok(read_generation(client, prefix, Kind::File).await?.map_or(0, |(g, _)| g))
}

/// Every generation with a concrete index of files, in order.
pub async fn list(client: &Elasticsearch, prefix: &str) -> Result<Vec<u64>, ElasticError> {
    let found = aliases_of(client, &format!("{}-*", alias(prefix, Kind::File))).await?;
    let mut out: Vec<u64> = found.as_object().into_iter().flatten().filter_map(|(index, _)| generation_of(prefix, Kind::File, index)).collect();
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Creates the concrete index of `kind` in generation `g`; one that exists
/// already (a resumed rebuild, another worker starting) is left as it is.
/// Whether this call created it.
pub async fn create(client: &Elasticsearch, prefix: &str, kind: Kind, g: u64, with_read_alias: bool) -> Result<bool, ElasticError> {
    let index = concrete(prefix, kind, g);
    let created = create_index(client, &index, create_body(prefix, kind, g, with_read_alias)).await?;
    if created {
        tracing::info!(index = %index, generation = g, "created index");
    }
    Ok(created)
}

/// Creates the tenants' own indexes of generation `g`, of each of `kinds`
/// (those that exist are left as they are).
pub async fn create_dedicated(client: &Elasticsearch, prefix: &str, g: u64, placement: &Placement, with_read_aliases: bool, kinds: &[Kind]) -> Result<(), ElasticError> {
    for t in placement.dedicated() {
        for &kind in kinds {
            let index = dedicated_concrete(prefix, t, kind, g, placement.revision(t));
            if create_index(client, &index, super::placement::create_body(prefix, t, kind, g, with_read_aliases)).await? {
                tracing::info!(index = %index, tenant = t, generation = g, "created a tenant's own index");
            }
        }
    }
    Ok(())
}

/// Creates `index` with `body`: `true` when created, `false` when it
/// existed already (`resource_already_exists_exception`).
pub async fn create_index(client: &Elasticsearch, index: &str, body: Value) -> Result<bool, ElasticError> {
    let r = client.indices().create(IndicesCreateParts::Index(index)).body(body).send().await?;
    let status = r.status_code().as_u16();
    if status == 400 {
        let text = r.text().await.unwrap_or_default();
        if text.contains("resource_already_exists_exception") {
            return Ok(false);
        }
        return Err(super::status_error(&format!("creating index {index}"), status, &text));
    }
    json_or_status(&format!("creating index {index}"), r).await?;
    Ok(true)
}

/// Adds generation `g`'s write alias of `kind` (indexes created before
/// write aliases existed).
pub async fn add_write_alias(client: &Elasticsearch, prefix: &str, kind: Kind, g: u64) -> Result<(), ElasticError> {
    let (index, name) = (concrete(prefix, kind, g), write_alias(prefix, kind, g));
    let r = client.indices().put_alias(IndicesPutAliasParts::IndexName(&[&index], &name)).send().await?;
    json_or_status(&format!("adding alias {name} to {index}"), r).await?;
    Ok(())
}

/// Makes every write to generation `g` (placed as `placement`) of each of
/// `kinds` searchable.
/// The shared indexes' write aliases must exist (after a cutover they do
/// not: the writer follows the new generation). A tenant's own may be
/// missing while a rebuild of that tenant fences the live writers off
/// them (see `crate::index::tenant_generations`): nothing of that tenant
/// is written then, and the other tenants' commits are published.
pub async fn refresh(client: &Elasticsearch, prefix: &str, g: u64, placement: &Placement, kinds: &[Kind]) -> Result<(), ElasticError> {
    let (shared, own): (Vec<String>, Vec<String>) = placement.write_aliases(prefix, g, kinds).into_iter().partition(|a| !names::is_tenants_own(a));
    for (names, fenced) in [(shared, false), (own, true)] {
        if names.is_empty() {
            continue;
        }
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let r = client.indices().refresh(IndicesRefreshParts::Index(&refs)).ignore_unavailable(fenced).send().await?;
        super::complete_json(&format!("refreshing generation {g}"), r).await?;
    }
    Ok(())
}

/// The kinds of two generations, `from` and `to`: which both have, which
/// only `from` has (its model's kinds that `to`'s model dropped), and
/// which only `to` has.
pub struct CutoverKinds<'a> {
    pub from: &'a [Kind],
    pub to: &'a [Kind],
}

impl CutoverKinds<'_> {
    fn has(kinds: &[Kind], kind: Kind) -> bool {
        kinds.iter().any(|k| names::kind_name(*k) == names::kind_name(kind))
    }
}

/// The actions of the cutover from generation `from` (placed as
/// `placed.0`) to `to` (placed as `placed.1`): every read alias moves, and
/// `from`'s write aliases go. `found`: the aliases of `from`'s shared
/// indexes, whose tenants' filtered aliases move too
/// ([`super::tenants::moved`]), unless the tenant has indexes of its own in
/// `to`, which carry its alias. A tenant whose own indexes `to` does not
/// keep gets its filtered alias on the shared ones. A kind only `from`
/// has loses its read alias (searches of it are refused as of a kind the
/// index does not have); a kind only `to` has gets one, and a filtered
/// alias for each tenant with one of files.
pub fn cutover_actions(prefix: &str, (from, to): (u64, u64), found: &Value, placed: (&Placement, &Placement), kinds: &CutoverKinds<'_>) -> Value {
    let (was, will) = placed;
    let mut actions = Vec::new();
    for &kind in kinds.from {
        actions.push(json!({ "remove": { "index": concrete(prefix, kind, from), "alias": alias(prefix, kind) } }));
        actions.push(json!({ "remove": { "index": concrete(prefix, kind, from), "alias": write_alias(prefix, kind, from) } }));
    }
    for &kind in kinds.to {
        let mut add = super::mapping::read_alias();
        add["index"] = json!(concrete(prefix, kind, to));
        add["alias"] = json!(alias(prefix, kind));
        actions.push(json!({ "add": add }));
        if CutoverKinds::has(kinds.from, kind) {
            let moved = super::tenants::moved(found, prefix, kind, &concrete(prefix, kind, from), &concrete(prefix, kind, to));
            let own: Vec<String> = will.dedicated().map(|t| super::tenants::alias_name(prefix, t, kind)).collect();
            actions.extend(moved.into_iter().filter(|a| a["add"]["alias"].as_str().is_none_or(|name| !own.contains(&name.to_string()))));
        } else {
            // A kind new in `to`: each tenant with a filtered alias of
            // files gets one of it.
            for t in super::tenants::aliased(found, prefix, &concrete(prefix, Kind::File, from)).into_iter().filter(|t| !will.is_dedicated(Some(t))) {
                actions.push(super::tenants::alias_action(&concrete(prefix, kind, to), &super::tenants::alias_name(prefix, &t, kind), &t));
            }
        }
        for t in was.dedicated().filter(|t| !will.is_dedicated(Some(t))) {
            actions.push(super::tenants::alias_action(&concrete(prefix, kind, to), &super::tenants::alias_name(prefix, t, kind), t));
        }
    }
    actions.extend(was.cutover_actions(will, prefix, (from, to), (kinds.from, kinds.to)));
    json!({ "actions": actions })
}

/// Switches searches and live workers from generation `from` to `to`: one
/// `_aliases` request, which Elasticsearch applies atomically.
pub async fn cut_over(client: &Elasticsearch, prefix: &str, (from, to): (u64, u64), placed: (&Placement, &Placement), kinds: &CutoverKinds<'_>) -> Result<(), ElasticError> {
    let mut found = json!({});
    for &kind in kinds.from {
        let index = concrete(prefix, kind, from);
        found[&index] = aliases_of(client, &index).await?[&index].clone();
    }
    let r = client.indices().update_aliases().body(cutover_actions(prefix, (from, to), &found, placed, kinds)).send().await?;
    let v = json_or_status(&format!("moving the aliases from generation {from} to {to}"), r).await?;
    if v["acknowledged"] != json!(true) {
        return Err(ElasticError::Transport(format!("the alias swap was not acknowledged: {v}")));
    }
    Ok(())
}

/// Deletes generation `g`: its concrete indexes of `kinds` (the tenants'
/// own among them) and its meta documents (`partitions` partition
/// checkpoints with the parked keys they name, the log binding, the
/// placement, the model).
pub async fn remove(client: &Elasticsearch, prefix: &str, g: u64, partitions: i32, kinds: &[Kind]) -> Result<(), ElasticError> {
    let names = super::placement::read(client, prefix, g).await?.all_indexes(prefix, g, kinds);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let r = client.indices().delete(IndicesDeleteParts::Index(&refs)).ignore_unavailable(true).send().await?;
    json_or_status(&format!("deleting generation {g}"), r).await?;
    let partition_meta: Vec<String> = (0..partitions).map(|p| meta_id(g, &format!("p{p}"))).collect();
    remove_partition_meta(client, prefix, &partition_meta).await?;
    for id in [meta_id(g, "log"), meta_id(g, super::names::SWEEP), meta_id(g, super::names::PLACEMENT), meta_id(g, super::names::MODEL)] {
        delete_meta(client, prefix, &id).await?;
    }
    Ok(())
}

/// Deletes partitions' meta documents (`ids`: their checkpoints) and the
/// fan-outs each parked.
pub async fn remove_partition_meta(client: &Elasticsearch, prefix: &str, ids: &[String]) -> Result<(), ElasticError> {
    for id in ids {
        super::parked::remove(client, prefix, id).await?;
        delete_meta(client, prefix, id).await?;
    }
    Ok(())
}

/// The kinds generation `g` holds: the compiled-in ones and those of the
/// model it records, read from its record.
pub async fn recorded_kinds(client: &Elasticsearch, prefix: &str, g: u64) -> Result<Vec<Kind>, ElasticError> {
    let model = match super::meta::get_meta(client, prefix, &meta_id(g, names::MODEL)).await? {
        Some(held) => Some(crate::index::recorded_model::domain_of(g, &held).map_err(|e| ElasticError::Config(e.to_string()))?),
        None => None,
    };
    Ok(names::kinds(model))
}

/// Puts `tenant`'s filtered aliases on the current generation's indexes,
/// of every kind it holds (again: an alias that exists is replaced).
/// Returns their names. A tenant with indexes of its own has them
/// already.
pub async fn add_tenant_aliases(client: &Elasticsearch, prefix: &str, tenant: &str) -> Result<Vec<String>, ElasticError> {
    crate::command::tenant::validate(tenant).map_err(|e| ElasticError::Config(e.to_string()))?;
    let g = current(client, prefix).await?;
    let kinds = recorded_kinds(client, prefix, g).await?;
    if super::placement::read(client, prefix, g).await?.is_dedicated(Some(tenant)) {
        return Ok(kinds.iter().map(|k| super::tenants::alias_name(prefix, tenant, *k)).collect());
    }
    let mut actions = Vec::new();
    let mut names = Vec::new();
    for kind in kinds {
        let index = match read_generation(client, prefix, kind).await? {
            Some((g, _)) => concrete(prefix, kind, g),
            None => return Err(ElasticError::Config(format!("alias {} does not exist yet: start a worker first, which creates the indexes", alias(prefix, kind)))),
        };
        let name = super::tenants::alias_name(prefix, tenant, kind);
        actions.push(super::tenants::alias_action(&index, &name, tenant));
        names.push(name);
    }
    let r = client.indices().update_aliases().body(json!({"actions": actions})).send().await?;
    json_or_status(&format!("adding the aliases of tenant {tenant}"), r).await?;
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_a_generation() {
        assert_eq!(concrete("denorm", Kind::File, 0), "denorm-files-000001");
        assert_eq!(concrete("denorm", Kind::Post, 11), "denorm-posts-000012");
        assert_eq!(write_alias("denorm", Kind::User, 2), "denorm-users-g2");
        assert_eq!(meta_id(0, "p3"), "p3");
        assert_eq!(meta_id(4, "log"), "g4-log");
        assert_eq!(generation_of("denorm", Kind::File, "denorm-files-000012"), Some(11));
        assert_eq!(generation_of("denorm", Kind::File, "denorm-files-g1"), None);
        assert_eq!(generation_of("denorm", Kind::File, "denorm-files-000000"), None);
        assert_eq!(generation_of("denorm", Kind::File, "denorm-filesx-000001"), None);
        assert_eq!(generation_of("denorm", Kind::File, "denorm-users-000001"), None);
    }

    /// A change of model into one with more kinds: each new kind gets its
    /// read alias, and a filtered alias for every tenant that has one of
    /// files, or leaves its own indexes; a tenant in indexes of its own
    /// gets its own aliases on them instead.
    #[test]
    fn a_cutover_into_a_model_gives_its_new_kinds_the_read_alias_and_each_tenants_filtered_alias() {
        let d = crate::domain::tests::shop().interned();
        let with_model = names::kinds(Some(d));
        let found = json!({"denorm-files-000001": {"aliases": {"denorm-files": {}, "denorm-t-acme-files": {"filter": {}}, "denorm-t-initech-files": {"filter": {}}}}});
        let (was, will) = (Placement::new(["globex", "hooli"]), Placement::new(["hooli", "initech"]));
        let v = cutover_actions("denorm", (0, 1), &found, (&was, &will), &CutoverKinds { from: &names::KINDS, to: &with_model });
        let on_order: Vec<String> = v["actions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a.get("add"))
            .filter(|a| a["index"] == "denorm-order-000002")
            .map(|a| format!("{} {}", a["alias"].as_str().unwrap(), a["routing"].as_str().unwrap_or("-")))
            .collect();
        assert_eq!(on_order, ["denorm-order -", "denorm-t-acme-order acme", "denorm-t-globex-order globex"]);
        let own: Vec<&Value> = v["actions"].as_array().unwrap().iter().filter(|a| a["add"]["index"] == "denorm-t-hooli-order-000002").collect();
        assert_eq!(own.len(), 2, "the generation's read alias and hooli's own: {own:?}");
        assert!(v["actions"].as_array().unwrap().iter().all(|a| a["add"]["index"] != "denorm-t-globex-order-000002"), "globex's own indexes are not in generation 1");
    }
}
