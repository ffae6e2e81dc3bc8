//! Index setup: one concrete index per document kind behind an alias
//! (`denorm-files` -> `denorm-files-000001`), so that a rebuild can switch
//! the alias atomically (see [`super::generations`]). Startup creates what is missing and refuses a
//! mapping that conflicts with the one denorm needs.

use elasticsearch::indices::IndicesGetMappingParts;
use elasticsearch::Elasticsearch;
use serde_json::{json, Value};

use super::mapping::{conflicts, mapping, meta_index_body, settings_conflicts, tombstone_fields};
use super::meta::{get_meta, put_meta_if};
use super::names::{self, alias, meta_id};
use super::placement::Placement;
use super::{generations, json_or_status, ElasticError};
use crate::domain::Domain;
use crate::index::recorded_model::{self, Decision};
use crate::index::{IndexError, Kind};

/// The oldest Elasticsearch denorm runs against: the maintained 7.x
/// release. (Its scans need point in time in `_shard_doc` order, 7.12 and
/// later; bulk's `require_alias`, 7.10.)
pub const MIN_VERSION: (u64, u64) = (7, 17);

/// Reads the cluster's version (`GET /`) and refuses what denorm cannot
/// run against: Elasticsearch older than [`MIN_VERSION`], and OpenSearch.
/// A major version above 8 is accepted with a warning (not verified).
pub async fn check_version(client: &Elasticsearch) -> Result<String, ElasticError> {
    let r = client.info().send().await?;
    let v = json_or_status("reading the cluster's version (GET /)", r).await?;
    let number = v["version"]["number"].as_str().unwrap_or_default().to_string();
    let supported = format!("denorm supports Elasticsearch {}.{} and 8.x", MIN_VERSION.0, MIN_VERSION.1);
    if v["version"]["distribution"].as_str() == Some("opensearch") {
        return Err(ElasticError::Config(format!("the cluster is OpenSearch {number}; {supported}")));
    }
    let mut parts = number.split('.').map(|p| p.parse::<u64>().ok());
    let (major, minor) = match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor),
        _ => return Err(ElasticError::Config(format!("the cluster reported no version (GET / answered {v}); {supported}"))),
    };
    if (major, minor) < MIN_VERSION {
        return Err(ElasticError::Config(format!("Elasticsearch {number} is too old: {supported} (point-in-time scans in _shard_doc order, require_alias on bulk)")));
    }
    if major > 8 {
        tracing::warn!(version = %number, "Elasticsearch {major}: denorm's requests are verified against the 8.x API only");
    }
    Ok(number)
}

/// What a worker needs on `<prefix>-*`: documents read and written,
/// aliases and mappings read, and `maintenance` for the refresh before a
/// fan-out's scan (without it every rename would be refused with 403).
pub const WORKER_PRIVILEGES: &[&str] = &["read", "write", "view_index_metadata", "maintenance"];

/// What creating indexes and moving aliases needs on `<prefix>-*` (the
/// first start against an empty cluster, and `denorm rebuild`).
pub const MANAGE_PRIVILEGES: &[&str] = &["manage"];

/// Cluster privilege for `GET /` (the version check).
pub const CLUSTER_PRIVILEGES: &[&str] = &["monitor"];

/// Asks the cluster whether the user has `needed` on `<prefix>-*` (and
/// [`CLUSTER_PRIVILEGES`]) with `_security/user/_has_privileges`, and
/// refuses, naming what is missing, if not. A cluster without security
/// (the API answers an error other than 401) is not checked.
pub async fn check_privileges(client: &Elasticsearch, prefix: &str, needed: &[&str]) -> Result<(), ElasticError> {
    let pattern = format!("{prefix}-*");
    let body = json!({"cluster": CLUSTER_PRIVILEGES, "index": [{"names": [pattern], "privileges": needed}]});
    let r = client.security().has_privileges(elasticsearch::security::SecurityHasPrivilegesParts::None).body(body).send().await?;
    let status = r.status_code().as_u16();
    if !(200..300).contains(&status) {
        let text = r.text().await.unwrap_or_default();
        if status == 401 {
            return Err(super::status_error("checking the user's privileges", status, &text));
        }
        tracing::info!(status, "privileges not checked (security is off, or the API is unavailable)");
        return Ok(());
    }
    let v: Value = r.json().await?;
    if v["has_all_requested"] == json!(true) {
        return Ok(());
    }
    let mut missing = Vec::new();
    for (name, granted) in v["cluster"].as_object().into_iter().flatten() {
        if granted != &json!(true) {
            missing.push(format!("cluster privilege {name}"));
        }
    }
    for (names, privileges) in v["index"].as_object().into_iter().flatten() {
        for (name, granted) in privileges.as_object().into_iter().flatten() {
            if granted != &json!(true) {
                missing.push(format!("{name} on {names}"));
            }
        }
    }
    Err(ElasticError::Config(format!(
        "the Elasticsearch user {} lacks {} (the README's \"Running against Elasticsearch\" has the roles denorm needs)",
        v["username"].as_str().unwrap_or("?"),
        missing.join(", ")
    )))
}

/// What startup found missing and must create or add (each needs the
/// `manage` privilege, [`MANAGE_PRIVILEGES`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Missing {
    /// Kinds whose first generation (index and aliases) does not exist.
    pub indexes: Vec<Kind>,
    /// Kinds whose current generation lacks its write alias: (kind, generation).
    pub write_aliases: Vec<(Kind, u64)>,
    /// Concrete indexes lacking bookkeeping fields, with those fields.
    pub fields: Vec<(String, Vec<&'static str>)>,
    /// Whether the meta index does not exist.
    pub meta: bool,
}

impl Missing {
    pub fn is_empty(&self) -> bool {
        self == &Missing::default()
    }
}

/// Checks the cluster's version and the user's privileges, reads what
/// exists (aliases, mappings, settings, the meta index) and refuses a
/// conflicting mapping, then creates what is missing. Only reads are made
/// until something is found missing: a worker holding the documented
/// `denorm_worker` role (no `manage`, no `create_index`) starts against
/// indexes that exist, and `_has_privileges` is asked for `manage` only
/// when startup will create or change something.
///
/// `meta_shards`: the primary shards of the meta index if it is created
/// now ([`super::config::ElasticConfig::meta_shards`]); an existing one
/// keeps its own, said in a warning when they differ. `configured`: the
/// placement of the first generation if it is created now (see
/// [`super::placement`]); an existing generation keeps its own, said in a
/// warning when they differ.
///
/// `model`: the declared model whose kinds get indexes of their own beside
/// the compiled-in ones, in the current generation (the tenants placed in
/// indexes of their own get theirs of them too).
pub async fn ensure(client: &Elasticsearch, prefix: &str, meta_shards: u32, configured: &Placement, model: Option<&'static Domain>) -> Result<(), ElasticError> {
    let version = check_version(client).await?;
    tracing::info!(%version, "elasticsearch version");
    check_privileges(client, prefix, WORKER_PRIVILEGES).await?;
    let missing = inspect(client, prefix, &names::kinds(model)).await?;
    if !missing.meta {
        // A warning only: a failure to read the settings is not the
        // startup's concern.
        let found = meta_shards_of(client, prefix).await.ok().flatten();
        if found.is_some_and(|n| n != meta_shards) {
            let index = names::meta_index(prefix);
            tracing::warn!(index = %index, found = ?found, asked = meta_shards, "the meta index exists with another number of primary shards than DENORM_ES_META_SHARDS asks: the setting applies when the meta index is created (docs/elasticsearch.md, \"The meta index's primary shards\", says how to split an existing one)");
        }
    }
    if missing.indexes.is_empty() {
        // A warning only, like the meta index's shards above.
        if let Ok(g) = generations::current(client, prefix).await {
            if let Some(line) = super::placement::read(client, prefix, g).await.ok().and_then(|found| super::placement::differs(configured, &found, g)) {
                tracing::warn!("{line}");
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    tracing::info!(?missing, "creating what is missing");
    check_privileges(client, prefix, MANAGE_PRIVILEGES).await?;
    create_missing(client, prefix, &missing, (meta_shards, configured)).await
}

/// What the current generation records of its model, decided for a
/// handle of `model` ([`recorded_model::decide`]): refused before anything
/// is created or read. `record`: a writer's, which records its model
/// ([`record_model`]) in a generation whose log no writer has bound yet.
pub async fn model_decision(client: &Elasticsearch, prefix: &str, model: Option<&Domain>, record: bool) -> Result<Decision, IndexError> {
    let g = generations::current(client, prefix).await?;
    let held = get_meta(client, prefix, &meta_id(g, names::MODEL)).await?;
    let written = held.is_none() && model.is_some() && get_meta(client, prefix, &meta_id(g, "log")).await?.is_some();
    recorded_model::decide(&format!("{prefix}-*"), g, held.as_ref(), model, written, record)
}

/// Records `model` as generation `g`'s ([`Decision::Record`] for the
/// current one, a rebuild's new one); a record another writer made first
/// must agree with it.
pub async fn record_model(client: &Elasticsearch, prefix: &str, g: u64, model: &Domain) -> Result<(), IndexError> {
    let id = meta_id(g, names::MODEL);
    if put_meta_if(client, prefix, &id, recorded_model::record_of(model), None).await?.is_none() {
        let held = get_meta(client, prefix, &id).await?;
        recorded_model::decide(&format!("{prefix}-*"), g, held.as_ref(), Some(model), false, false)?;
    }
    tracing::info!(model = %model.name, version = model.version, generation = g, "recorded the model the indexes hold");
    Ok(())
}

/// The primary shards of the meta index (through an alias of that name
/// too), `None` when its settings do not say.
pub async fn meta_shards_of(client: &Elasticsearch, prefix: &str) -> Result<Option<u32>, ElasticError> {
    let index = names::meta_index(prefix);
    let r = client.indices().get_settings(elasticsearch::indices::IndicesGetSettingsParts::Index(&[&index])).send().await?;
    let found = json_or_status(&format!("reading the settings of {index}"), r).await?;
    Ok(found.as_object().into_iter().flatten().find_map(|(_, s)| {
        let n = &s["settings"]["index"]["number_of_shards"];
        n.as_str().and_then(|v| v.parse().ok()).or_else(|| n.as_u64().and_then(|v| u32::try_from(v).ok()))
    }))
}

/// Reads what exists of `kinds` and what is missing; refuses conflicting
/// mappings and settings, and an index found without its read alias.
pub async fn inspect(client: &Elasticsearch, prefix: &str, kinds: &[Kind]) -> Result<Missing, ElasticError> {
    let mut missing = Missing::default();
    for &kind in kinds {
        let alias = alias(prefix, kind);
        let current = generations::current_of(client, prefix, kind).await?;
        let Some((g, has_write_alias)) = current else {
            missing.indexes.push(kind);
            continue;
        };
        if !has_write_alias {
            missing.write_aliases.push((kind, g));
        }
        let r = client.indices().get_mapping(IndicesGetMappingParts::Index(&[&alias])).send().await?;
        let found = json_or_status(&format!("reading the mapping of {alias}"), r).await?;
        let expected = mapping(kind);
        for (index, m) in found.as_object().into_iter().flatten() {
            let mappings = m.get("mappings").unwrap_or(&Value::Null);
            let (absent, other): (Vec<_>, Vec<_>) = conflicts(&expected, mappings).into_iter().partition(|(field, _, found)| found == "absent" && tombstone_fields().iter().any(|(f, _)| f == field));
            if let Some((field, expected, found)) = other.into_iter().next() {
                return Err(ElasticError::MappingConflict { index: index.clone(), field, expected, found });
            }
            if !absent.is_empty() {
                let fields = tombstone_fields().iter().map(|(f, _)| *f).filter(|f| absent.iter().any(|(m, _, _)| m == f)).collect();
                missing.fields.push((index.clone(), fields));
            }
        }
        if kind == Kind::File || matches!(kind, Kind::Model(_)) {
            // The path analyzer is defined in the index's settings.
            let r = client.indices().get_settings(elasticsearch::indices::IndicesGetSettingsParts::Index(&[&alias])).send().await?;
            let found = json_or_status(&format!("reading the settings of {alias}"), r).await?;
            for (index, s) in found.as_object().into_iter().flatten() {
                if let Some((field, expected, found)) = settings_conflicts(&s["settings"]["index"]).into_iter().next() {
                    return Err(ElasticError::MappingConflict { index: index.clone(), field, expected, found });
                }
            }
        }
    }
    let meta = names::meta_index(prefix);
    let r = client.indices().exists(elasticsearch::indices::IndicesExistsParts::Index(&[&meta])).send().await?;
    match r.status_code().as_u16() {
        200 => {}
        404 => missing.meta = true,
        status => return Err(super::status_error(&format!("checking whether {meta} exists"), status, &r.text().await.unwrap_or_default())),
    }
    Ok(missing)
}

/// Creates what [`inspect`] found missing. The meta index first, then a
/// first generation's placement (`configured`, or what another worker
/// starting together recorded) and the tenants' own indexes (of a
/// model's kinds added to the current generation too), then the shared
/// ones: once those exist, so does the rest.
async fn create_missing(client: &Elasticsearch, prefix: &str, missing: &Missing, (meta_shards, configured): (u32, &Placement)) -> Result<(), ElasticError> {
    if missing.meta {
        let index = names::meta_index(prefix);
        if generations::create_index(client, &index, meta_index_body(meta_shards)).await? {
            tracing::info!(index = %index, shards = meta_shards, "created the meta index");
        }
    }
    // A first generation, or a model's kinds added to the current one.
    let first = missing.indexes.iter().any(|k| !matches!(k, Kind::Model(_)));
    let g = if first { 0 } else { generations::current(client, prefix).await? };
    // The tenants' own indexes of the kinds the shared ones gain.
    let models: Vec<Kind> = missing.indexes.iter().copied().filter(|k| matches!(k, Kind::Model(_))).collect();
    if first {
        let placement = super::placement::record(client, prefix, 0, configured).await?;
        generations::create_dedicated(client, prefix, 0, &placement, true, &[&names::KINDS[..], &models].concat()).await?;
    } else if !models.is_empty() {
        generations::create_dedicated(client, prefix, g, &super::placement::read(client, prefix, g).await?, true, &models).await?;
    }
    for kind in &missing.indexes {
        let alias = alias(prefix, *kind);
        // Of workers starting together, one creates it (with its aliases,
        // in the same request).
        if generations::create(client, prefix, *kind, g, true).await? {
            tracing::info!(alias = %alias, "created the first generation behind its alias");
            continue;
        }
        // It was there already: created by another worker just now, or an
        // index that lost its aliases, which writes must not bypass.
        if generations::current_of(client, prefix, *kind).await?.is_none() {
            let index = names::concrete(prefix, *kind, g);
            return Err(ElasticError::Config(format!(
                "index {index} exists but the alias {alias} is not on it; add the aliases back ({alias} and {}) or delete the index",
                names::write_alias(prefix, *kind, g)
            )));
        }
    }
    for (kind, g) in &missing.write_aliases {
        generations::add_write_alias(client, prefix, *kind, *g).await?;
    }
    for (index, fields) in &missing.fields {
        // An index created before tombstones: adding fields to a mapping is
        // allowed, once, by a user who may manage it.
        let properties: serde_json::Map<String, Value> = tombstone_fields().into_iter().filter(|(f, _)| fields.contains(f)).map(|(f, m)| (f.to_string(), m)).collect();
        let r = client.indices().put_mapping(elasticsearch::indices::IndicesPutMappingParts::Index(&[index.as_str()])).body(json!({ "properties": properties })).send().await?;
        json_or_status(&format!("adding the bookkeeping fields to {index} (needs the manage privilege, once)"), r).await?;
        tracing::info!(index = %index, "added the bookkeeping fields (tombstones, writing partition) to the mapping");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_has_no_conflict_with_itself() {
        for k in [Kind::File, Kind::User, Kind::Post] {
            assert_eq!(conflicts(&mapping(k), &mapping(k)), vec![]);
        }
    }

    #[test]
    fn finds_wrong_types_analyzers_and_missing_fields() {
        let mut found = mapping(Kind::File);
        found["properties"]["path"]["type"] = json!("text");
        found["properties"]["path"]["fields"]["tree"]["analyzer"] = json!("standard");
        found["properties"].as_object_mut().unwrap().remove("denorm_pos");
        let c = conflicts(&mapping(Kind::File), &found);
        let fields: Vec<_> = c.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(fields, vec!["denorm_pos", "path"], "{c:?}");
        let mut found = mapping(Kind::Post);
        found["properties"]["user"]["properties"]["name"]["fields"]["raw"]["type"] = json!("text");
        assert_eq!(conflicts(&mapping(Kind::Post), &found)[0].0, "user.name.raw");
    }

    /// Review finding 11: every parameter denorm sets is compared, not only
    /// type and analyzer, and so are `dynamic` and the analyzer's settings.
    #[test]
    fn finds_differences_beyond_type_and_analyzer() {
        // The kind, a change of its expected mapping, the field named.
        type Case = (Kind, fn(&mut Value), &'static str);
        let cases: Vec<Case> = vec![
            (Kind::File, |m| m["properties"]["path"]["fields"]["tree"]["search_analyzer"] = json!("standard"), "path.tree"),
            (Kind::User, |m| m["properties"]["dob"]["format"] = json!("strict_date_optional_time"), "dob"),
            (Kind::File, |m| m["properties"]["id"]["ignore_above"] = json!(32), "id"),
            (Kind::File, |m| m["properties"]["contents"]["index"] = json!(false), "contents"),
            (Kind::Post, |m| m["dynamic"] = json!("true"), "(dynamic)"),
            (
                Kind::Post,
                |m| {
                    m.as_object_mut().unwrap().remove("dynamic");
                },
                "(dynamic)",
            ),
        ];
        for (kind, change, field) in cases {
            let mut found = mapping(kind);
            change(&mut found);
            let c = conflicts(&mapping(kind), &found);
            assert_eq!(c.first().map(|x| x.0.as_str()), Some(field), "{c:?}");
        }
        // The index settings as Elasticsearch returns them: strings.
        let ours = json!({"analysis": {"tokenizer": {"denorm_path_tree": {"type": "path_hierarchy", "delimiter": "/"}},
                                       "analyzer": {"denorm_path_tree": {"type": "custom", "tokenizer": "denorm_path_tree"}}},
                          "number_of_shards": "1", "provided_name": "denorm-files-000001"});
        assert!(settings_conflicts(&ours).is_empty(), "{:?}", settings_conflicts(&ours));
        // Issue 27 B9: what denorm does not set, but changes behaviour.
        let mut reversed = ours.clone();
        reversed["analysis"]["tokenizer"]["denorm_path_tree"]["reverse"] = json!("true");
        assert_eq!(settings_conflicts(&reversed)[0].0, "setting index.analysis.tokenizer.denorm_path_tree.reverse");
        let mut filtered = ours.clone();
        filtered["analysis"]["analyzer"]["denorm_path_tree"]["filter"] = json!(["lowercase"]);
        assert_eq!(settings_conflicts(&filtered)[0].0, "setting index.analysis.analyzer.denorm_path_tree.filter");
        for (change, field) in
            [(json!({"_source": {"enabled": false}}), "(_source)"), (json!({"_source": {"excludes": ["contents"]}}), "(_source)"), (json!({"_routing": {"required": true}}), "(_routing)")]
        {
            let mut found = mapping(Kind::File);
            for (k, v) in change.as_object().unwrap() {
                found[k] = v.clone();
            }
            let c = conflicts(&mapping(Kind::File), &found);
            assert_eq!(c.first().map(|x| x.0.as_str()), Some(field), "{c:?}");
        }
        let mut found = mapping(Kind::File);
        found["_source"] = json!({"enabled": true});
        assert!(conflicts(&mapping(Kind::File), &found).is_empty(), "_source enabled as by default is fine");
        let mut other = ours.clone();
        other["analysis"]["tokenizer"]["denorm_path_tree"]["delimiter"] = json!("\\");
        assert_eq!(settings_conflicts(&other)[0].0, "setting index.analysis.tokenizer.denorm_path_tree.delimiter");
        assert_eq!(settings_conflicts(&json!({}))[0].2, "absent");
    }
}
